//! The weights each block's graph reads, by type: resolved once when the weights are declared
//! ([`Layers::resolve`], from [`Weights::declare`](super::weights::Weights::declare)), so graph
//! code never looks a tensor up by name and a tensor a block needs but the file lacks is a load
//! error naming it, not a panic while building a graph.
//!
//! The kind of each part of a block (GQA, MLA or DeepSeek-V4 attention; a dense or a routed FFN;
//! shared experts; DeepSeek-3.2's indexer; DeepSeek-V4's compressors) is what the architecture's
//! tensor table lists for that block ([`Resolver::listed`]): the table's block predicates are
//! the hyper-parameter rules the graph follows. Within a kind, the tensors the graph always reads
//! are required (a [`WeightsError::Missing`] naming the tensor when absent) and the others
//! (biases, q/k norms, sinks, ...) `Option`s, used where the file has them, absent only where the
//! table allows it.
//!
//! A graph asking a block for a kind it does not have (GQA of an MLA block) is a bug of that
//! graph, and panics saying so. The routed experts' matrices are `None` when another store holds
//! them (offloading); only the resident path reads them.
//!
//! Only the decode blocks (`0..n_layer_decode`) are resolved: no graph runs the MTP blocks.
use super::weights::{Resolver, WeightsError, W};

type R<T> = Result<T, WeightsError>;

/// Every tensor the graphs read.
#[derive(Debug)]
pub struct Layers {
    pub io: Io,
    /// One per decode block.
    pub blocks: Vec<Block>,
}

/// The model's input and output.
#[derive(Debug)]
pub struct Io {
    /// `token_embd`, the copy the lookup by id reads (the host copy where there is one).
    pub embd: W,
    pub output_norm: W,
    /// `output`, or the device copy of `token_embd` when the head is tied to it.
    pub head: W,
    /// DeepSeek-V4's collapse of the streams before the head (`output_hc_*`).
    pub hc_head: Option<Hc>,
}

/// One decode block.
#[derive(Debug)]
pub struct Block {
    /// Its index (for messages).
    pub il: usize,
    pub attn_norm: W,
    /// The pre-FFN norm: `ffn_norm`, or `post_attention_norm` where the table names it so.
    pub ffn_norm: W,
    pub attn: Attn,
    pub ffn: Ffn,
    /// DeepSeek-V4's hyper-connection mixes around the attention and the FFN.
    pub hc: Option<[Hc; 2]>,
}

/// A hyper-connection mix (`hc_{site}_{fn,scale,base}`, or `output_hc_*`).
#[derive(Debug, Clone, Copy)]
pub struct Hc {
    pub f: W,
    pub scale: W,
    pub base: W,
}

/// A projection and its optional bias.
#[derive(Debug, Clone, Copy)]
pub struct Proj {
    pub w: W,
    pub b: Option<W>,
}

#[derive(Debug)]
pub enum Attn {
    Gqa(Gqa),
    Mla(Mla),
    Dsv4(Dsv4Attn),
}

/// Grouped-query attention (`blocks::attention`).
#[derive(Debug)]
pub struct Gqa {
    pub q: Proj,
    pub k: Proj,
    pub v: Proj,
    pub output: Proj,
    pub q_norm: Option<W>,
    pub k_norm: Option<W>,
    pub sinks: Option<W>,
}

/// Multi-head latent attention (`blocks::mla`).
#[derive(Debug)]
pub struct Mla {
    pub q: MlaQ,
    pub kv_a_mqa: W,
    pub kv_a_norm: W,
    pub kv: MlaKv,
    pub output: W,
    /// DeepSeek-3.2's lightning indexer.
    pub indexer: Option<Dsa>,
}

/// MLA's query: low-rank (`attn_q_a`, its norm, `attn_q_b`) or one matrix (`attn_q`).
#[derive(Debug)]
pub enum MlaQ {
    LowRank { a: W, a_norm: W, b: W },
    Full(W),
}

/// MLA's key/value decompression: absorbed (`attn_k_b`, `attn_v_b`) or fused (`attn_kv_b`).
#[derive(Debug)]
pub enum MlaKv {
    Absorbed { k_b: W, v_b: W },
    Decompressed { kv_b: W },
}

/// DeepSeek-3.2's indexer (`blocks::dsa`).
#[derive(Debug)]
pub struct Dsa {
    pub q_b: W,
    pub k: W,
    pub k_norm: W,
    pub k_norm_bias: W,
    pub proj: W,
}

/// DeepSeek-V4's attention (`blocks::dsv4`).
#[derive(Debug)]
pub struct Dsv4Attn {
    pub q_a: W,
    pub q_a_norm: W,
    pub q_b: W,
    pub kv: W,
    pub kv_a_norm: W,
    pub sinks: W,
    pub output_a: W,
    pub output_b: W,
    pub comp: Dsv4Comp,
}

/// A DeepSeek-V4 compressor's weights (`{attn,indexer}_compressor_{kv,gate,ape,norm}`).
#[derive(Debug, Clone, Copy)]
pub struct CompW {
    pub kv: W,
    pub gate: W,
    pub ape: W,
    pub norm: W,
}

/// What a DeepSeek-V4 block compresses: nothing (window only), every 128 positions, or every 4
/// with the lightning indexer choosing among the compressed rows.
#[derive(Debug)]
pub enum Dsv4Comp {
    None,
    Hca(CompW),
    Csa {
        comp: CompW,
        lid: CompW,
        /// The indexer's query projection and per-head weights.
        q_b: W,
        proj: W,
    },
}

/// A block's FFN.
#[derive(Debug)]
pub enum Ffn {
    Dense(Swiglu),
    Moe(Moe),
}

/// A SwiGLU FFN (`ffn_{up,gate,down}`, or the shared experts' `*_shexp`).
#[derive(Debug, Clone, Copy)]
pub struct Swiglu {
    pub up: W,
    pub gate: W,
    pub down: W,
}

/// A routed-expert FFN (`blocks::moe`), with the block's shared experts.
#[derive(Debug)]
pub struct Moe {
    /// `ffn_gate_inp.weight`.
    pub router: W,
    pub router_bias: Option<W>,
    /// `exp_probs_b.bias`: the selection bias.
    pub probs_bias: Option<W>,
    /// The expert matrices; `None` when another store holds them (offloaded).
    pub exps: Option<Exps>,
    /// Per-expert biases (up, gate, down), resident in every mode.
    pub exps_bias: [Option<W>; 3],
    /// DeepSeek-V4's hash blocks' token-id -> experts table (`ffn_gate_tid2eid`).
    pub tid2eid: Option<W>,
    pub shared: Option<Shared>,
}

/// The routed experts' matrices.
#[derive(Debug, Clone, Copy)]
pub struct Exps {
    pub up: W,
    pub gate: Option<W>,
    pub down: W,
}

/// Shared experts, gated per token by `sigmoid(gate_inp·x)` where the file has `ffn_gate_inp_shexp`
/// (Qwen2-MoE).
#[derive(Debug, Clone, Copy)]
pub struct Shared {
    pub ffn: Swiglu,
    pub gate_inp: Option<W>,
}

impl Layers {
    /// The typed weights of every decode block and of the input/output, from `r`'s weights.
    pub fn resolve(r: &mut Resolver<'_>) -> R<Self> {
        let io = Io::resolve(r)?;
        let blocks = (0..r.hp.n_layer_decode())
            .map(|il| Block::resolve(r, il))
            .collect::<R<_>>()?;
        Ok(Self { io, blocks })
    }

    /// The input/output weights.
    pub fn io(&self) -> &Io {
        &self.io
    }

    /// Block `il`'s weights.
    pub fn block(&self, il: usize) -> &Block {
        &self.blocks[il]
    }
}

impl Io {
    fn resolve(r: &mut Resolver<'_>) -> R<Self> {
        let embd = r.embedding().ok_or_else(|| WeightsError::Missing {
            name: super::weights::TOKEN_EMBD.to_string(),
            what: "the token embedding lookup".to_string(),
        })?;
        let output_norm = r.global_req("output_norm.weight", "the output head")?;
        // `output`, or the embedding (tied; validation refuses a file without `output` where the
        // architecture requires one, the graph runs either).
        let head = match r.global("output.weight") {
            Some(h) => h,
            None => r.global_req(super::weights::TOKEN_EMBD, "the output head (tied)")?,
        };
        let hc_head = if r
            .hp
            .arch
            .tensor_specs()
            .any(|t| t.name == "output_hc_fn.weight")
        {
            let what = "the output head's stream collapse";
            Some(Hc {
                f: r.global_req("output_hc_fn.weight", what)?,
                scale: r.global_req("output_hc_scale.weight", what)?,
                base: r.global_req("output_hc_base.weight", what)?,
            })
        } else {
            None
        };
        Ok(Self {
            embd,
            output_norm,
            head,
            hc_head,
        })
    }
}

impl Proj {
    fn resolve(r: &mut Resolver<'_>, il: usize, name: &str, what: &str) -> R<Self> {
        Ok(Self {
            w: r.req(il, &format!("{name}.weight"), what)?,
            b: r.opt(il, &format!("{name}.bias"), what)?,
        })
    }
}

impl Hc {
    fn resolve(r: &mut Resolver<'_>, il: usize, site: &str) -> R<Self> {
        let what = format!("{site} hyper-connection");
        Ok(Self {
            f: r.req(il, &format!("hc_{site}_fn.weight"), &what)?,
            scale: r.req(il, &format!("hc_{site}_scale.weight"), &what)?,
            base: r.req(il, &format!("hc_{site}_base.weight"), &what)?,
        })
    }
}

impl Block {
    fn resolve(r: &mut Resolver<'_>, il: usize) -> R<Self> {
        let attn_norm = r.req(il, "attn_norm.weight", "attention norm")?;
        let ffn_norm = if r.listed(il, "post_attention_norm.weight") {
            "post_attention_norm.weight"
        } else {
            "ffn_norm.weight"
        };
        let ffn_norm = r.req(il, ffn_norm, "pre-FFN norm")?;
        let attn = if r.listed(il, "attn_output_a.weight") {
            Attn::Dsv4(Dsv4Attn::resolve(r, il)?)
        } else if r.listed(il, "attn_kv_a_mqa.weight") {
            Attn::Mla(Mla::resolve(r, il)?)
        } else {
            Attn::Gqa(Gqa::resolve(r, il)?)
        };
        let ffn = if r.listed(il, "ffn_gate_inp.weight") {
            Ffn::Moe(Moe::resolve(r, il)?)
        } else {
            Ffn::Dense(Swiglu::resolve(r, il, "", "dense FFN")?)
        };
        let hc = if r.listed(il, "hc_attn_fn.weight") {
            Some([Hc::resolve(r, il, "attn")?, Hc::resolve(r, il, "ffn")?])
        } else {
            None
        };
        Ok(Self {
            il,
            attn_norm,
            ffn_norm,
            attn,
            ffn,
            hc,
        })
    }
}

/// The typed parts by kind (a graph asking for a kind the table does not give the block panics).
impl Block {
    fn kind_bug(&self, kind: &str) -> ! {
        panic!(
            "block {} has no {kind} in its architecture's table; the graph asks for it",
            self.il
        )
    }

    pub fn gqa(&self) -> &Gqa {
        match &self.attn {
            Attn::Gqa(a) => a,
            _ => self.kind_bug("GQA attention"),
        }
    }

    pub fn mla(&self) -> &Mla {
        match &self.attn {
            Attn::Mla(a) => a,
            _ => self.kind_bug("MLA attention"),
        }
    }

    pub fn dsv4(&self) -> &Dsv4Attn {
        match &self.attn {
            Attn::Dsv4(a) => a,
            _ => self.kind_bug("DeepSeek-V4 attention"),
        }
    }

    pub fn moe(&self) -> &Moe {
        match &self.ffn {
            Ffn::Moe(m) => m,
            Ffn::Dense(_) => self.kind_bug("routed experts"),
        }
    }

    /// The hyper-connection mixes (attention, FFN).
    pub fn hc(&self) -> &[Hc; 2] {
        self.hc
            .as_ref()
            .unwrap_or_else(|| self.kind_bug("hyper-connections"))
    }
}

impl Gqa {
    fn resolve(r: &mut Resolver<'_>, il: usize) -> R<Self> {
        let what = "attention";
        Ok(Self {
            q: Proj::resolve(r, il, "attn_q", what)?,
            k: Proj::resolve(r, il, "attn_k", what)?,
            v: Proj::resolve(r, il, "attn_v", what)?,
            output: Proj::resolve(r, il, "attn_output", what)?,
            q_norm: r.opt(il, "attn_q_norm.weight", what)?,
            k_norm: r.opt(il, "attn_k_norm.weight", what)?,
            sinks: r.opt(il, "attn_sinks.weight", what)?,
        })
    }
}

impl Mla {
    fn resolve(r: &mut Resolver<'_>, il: usize) -> R<Self> {
        let what = "MLA attention";
        let q = if r.listed(il, "attn_q_a.weight") {
            MlaQ::LowRank {
                a: r.req(il, "attn_q_a.weight", what)?,
                a_norm: r.req(il, "attn_q_a_norm.weight", what)?,
                b: r.req(il, "attn_q_b.weight", what)?,
            }
        } else {
            MlaQ::Full(r.req(il, "attn_q.weight", what)?)
        };
        let kv = if r.hp.is_mla() {
            MlaKv::Absorbed {
                k_b: r.req(il, "attn_k_b.weight", what)?,
                v_b: r.req(il, "attn_v_b.weight", what)?,
            }
        } else {
            MlaKv::Decompressed {
                kv_b: r.req(il, "attn_kv_b.weight", what)?,
            }
        };
        let indexer = if r.listed(il, "indexer.attn_k.weight") {
            let what = "sparse-attention indexer";
            Some(Dsa {
                q_b: r.req(il, "indexer.attn_q_b.weight", what)?,
                k: r.req(il, "indexer.attn_k.weight", what)?,
                k_norm: r.req(il, "indexer.k_norm.weight", what)?,
                k_norm_bias: r.req(il, "indexer.k_norm.bias", what)?,
                proj: r.req(il, "indexer.proj.weight", what)?,
            })
        } else {
            None
        };
        Ok(Self {
            q,
            kv_a_mqa: r.req(il, "attn_kv_a_mqa.weight", what)?,
            kv_a_norm: r.req(il, "attn_kv_a_norm.weight", what)?,
            kv,
            output: r.req(il, "attn_output.weight", what)?,
            indexer,
        })
    }
}

impl CompW {
    fn resolve(r: &mut Resolver<'_>, il: usize, prefix: &str, what: &str) -> R<Self> {
        Ok(Self {
            kv: r.req(il, &format!("{prefix}_compressor_kv.weight"), what)?,
            gate: r.req(il, &format!("{prefix}_compressor_gate.weight"), what)?,
            ape: r.req(il, &format!("{prefix}_compressor_ape.weight"), what)?,
            norm: r.req(il, &format!("{prefix}_compressor_norm.weight"), what)?,
        })
    }
}

impl Dsv4Attn {
    fn resolve(r: &mut Resolver<'_>, il: usize) -> R<Self> {
        let what = "attention";
        let comp = if r.listed(il, "indexer_compressor_kv.weight") {
            let lid = "lightning indexer";
            Dsv4Comp::Csa {
                comp: CompW::resolve(r, il, "attn", "KV compressor")?,
                lid: CompW::resolve(r, il, "indexer", lid)?,
                q_b: r.req(il, "indexer.attn_q_b.weight", lid)?,
                proj: r.req(il, "indexer.proj.weight", lid)?,
            }
        } else if r.listed(il, "attn_compressor_kv.weight") {
            Dsv4Comp::Hca(CompW::resolve(r, il, "attn", "KV compressor")?)
        } else {
            Dsv4Comp::None
        };
        Ok(Self {
            q_a: r.req(il, "attn_q_a.weight", what)?,
            q_a_norm: r.req(il, "attn_q_a_norm.weight", what)?,
            q_b: r.req(il, "attn_q_b.weight", what)?,
            kv: r.req(il, "attn_kv.weight", what)?,
            kv_a_norm: r.req(il, "attn_kv_a_norm.weight", what)?,
            sinks: r.req(il, "attn_sinks.weight", what)?,
            output_a: r.req(il, "attn_output_a.weight", what)?,
            output_b: r.req(il, "attn_output_b.weight", what)?,
            comp,
        })
    }
}

impl Swiglu {
    fn resolve(r: &mut Resolver<'_>, il: usize, suffix: &str, what: &str) -> R<Self> {
        Ok(Self {
            up: r.req(il, &format!("ffn_up{suffix}.weight"), what)?,
            gate: r.req(il, &format!("ffn_gate{suffix}.weight"), what)?,
            down: r.req(il, &format!("ffn_down{suffix}.weight"), what)?,
        })
    }
}

impl Moe {
    fn resolve(r: &mut Resolver<'_>, il: usize) -> R<Self> {
        let what = "routed experts";
        // The matrices are in the weights unless another store holds them (offloading).
        let exps = if r.kept(il, "ffn_up_exps.weight") {
            Some(Exps {
                up: r.req(il, "ffn_up_exps.weight", what)?,
                gate: r.opt(il, "ffn_gate_exps.weight", what)?,
                down: r.req(il, "ffn_down_exps.weight", what)?,
            })
        } else {
            None
        };
        let shared = if r.listed(il, "ffn_up_shexp.weight") {
            Some(Shared {
                ffn: Swiglu::resolve(r, il, "_shexp", "shared experts")?,
                gate_inp: if r.listed(il, "ffn_gate_inp_shexp.weight") {
                    Some(r.req(il, "ffn_gate_inp_shexp.weight", "shared experts' gate")?)
                } else {
                    None
                },
            })
        } else {
            None
        };
        let mut exps_bias = [None; 3];
        for (b, m) in exps_bias.iter_mut().zip(["up", "gate", "down"]) {
            *b = r.opt(il, &format!("ffn_{m}_exps.bias"), what)?;
        }
        let tid2eid = if r.listed(il, "ffn_gate_tid2eid.weight") {
            Some(r.req(il, "ffn_gate_tid2eid.weight", "hash routing")?)
        } else {
            None
        };
        Ok(Self {
            router: r.req(il, "ffn_gate_inp.weight", "router")?,
            router_bias: r.opt(il, "ffn_gate_inp.bias", "router")?,
            probs_bias: r.opt(il, "exp_probs_b.bias", "router")?,
            exps,
            exps_bias,
            tid2eid,
            shared,
        })
    }
}
