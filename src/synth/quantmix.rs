//! Quantisation mixes like llama.cpp's `llama-quantize` presets: which ggml type each tensor of a
//! synthetic model gets. Mirrors `src/llama-quant.cpp` closely enough that file sizes and the
//! kernels exercised match real GGUFs of the same name:
//! - 1-D tensors (norms, biases, sinks, `exp_probs_b`) and the router stay F32;
//! - `q4_k_m`: Q4_K, with Q6_K for `output`, and for `attn_v`/`ffn_down*` on the "more bits"
//!   layers (first and last eighth, every third in between);
//! - `q8_0`: Q8_0 everywhere; `iq2_xxs`: IQ2_XXS routed experts, Q4_K elsewhere, Q6_K output;
//!   `mxfp4`: MXFP4 routed experts (gpt-oss's native format), Q8_0 elsewhere;
//! - `dsv4-seed`: the mix of the GGUF PocketMoE's first backend ran DeepSeek-V4-Flash from
//!   (issue 14): routed experts' gate/up IQ2_XXS and down Q2_K, everything else (attention,
//!   shared experts, embedding, output, hyper-connections) Q8_0;
//! - a row length that is not a whole number of blocks falls back like llama.cpp does
//!   (Q4_K -> Q5_0, Q6_K/IQ2_XXS -> Q8_0, then F16).
use crate::ggml::GgmlType;
use crate::model::Role;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMix {
    Q4KM,
    Q8_0,
    IQ2XXS,
    MXFP4,
    Dsv4Seed,
    F16,
}

impl QuantMix {
    pub const ALL: [(&'static str, QuantMix); 6] = [
        ("q4_k_m", QuantMix::Q4KM),
        ("q8_0", QuantMix::Q8_0),
        ("iq2_xxs", QuantMix::IQ2XXS),
        ("mxfp4", QuantMix::MXFP4),
        ("dsv4-seed", QuantMix::Dsv4Seed),
        ("f16", QuantMix::F16),
    ];

    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s))
            .map(|&(_, q)| q)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                format!("unknown quant mix {s:?} (choose from {})", names.join(", "))
            })
    }

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, q)| *q == self)
            .map(|(n, _)| *n)
            .expect("listed")
    }

    /// llama.cpp's `general.file_type` for the mix (`LLAMA_FTYPE_*`).
    pub fn file_type(self) -> u32 {
        match self {
            QuantMix::F16 => 1,
            QuantMix::Q8_0 => 7,
            QuantMix::Q4KM => 15,
            // Most of the file is IQ2_XXS (gate and up of every expert), as in `iq2_xxs`.
            QuantMix::IQ2XXS | QuantMix::Dsv4Seed => 19,
            QuantMix::MXFP4 => 38,
        }
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`.
fn more_bits(il: usize, n: usize) -> bool {
    il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2
}

fn fallback(ty: GgmlType, ne0: u64) -> GgmlType {
    let chain: &[GgmlType] = if ty == GgmlType::Q4_K {
        &[
            GgmlType::Q4_K,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::F16,
        ]
    } else {
        &[ty, GgmlType::Q8_0, GgmlType::F16]
    };
    chain
        .iter()
        .copied()
        .find(|t| ne0.is_multiple_of(t.block_size() as u64))
        .unwrap_or(GgmlType::F32)
}

/// The type of tensor `name` (role, shape, block `il` of `n_layer`) under `mix`.
pub fn tensor_type(
    mix: QuantMix,
    name: &str,
    role: Role,
    shape: &[u64],
    il: Option<usize>,
    n_layer: usize,
) -> GgmlType {
    // DeepSeek-V4's token-id -> expert-id routing table: integers, never quantised.
    if name.ends_with("ffn_gate_tid2eid.weight") {
        return GgmlType::I32;
    }
    let is_matrix = shape.iter().filter(|&&d| d > 1).count() >= 2;
    if !is_matrix || role == Role::Router || role == Role::Norm || name.ends_with(".bias") {
        return GgmlType::F32;
    }
    let more = il.is_some_and(|i| more_bits(i, n_layer));
    let wants_more = name.contains("attn_v.") || name.contains("ffn_down");
    let ty = match mix {
        QuantMix::F16 => GgmlType::F16,
        QuantMix::Q8_0 => GgmlType::Q8_0,
        QuantMix::Q4KM => match role {
            Role::Output => GgmlType::Q6_K,
            _ if wants_more && more => GgmlType::Q6_K,
            _ => GgmlType::Q4_K,
        },
        QuantMix::IQ2XXS => match role {
            Role::Output => GgmlType::Q6_K,
            Role::RoutedExperts => GgmlType::IQ2_XXS,
            _ => GgmlType::Q4_K,
        },
        QuantMix::MXFP4 => match role {
            Role::RoutedExperts => GgmlType::MXFP4,
            _ => GgmlType::Q8_0,
        },
        QuantMix::Dsv4Seed => match role {
            Role::RoutedExperts if name.contains("ffn_down") => GgmlType::Q2_K,
            Role::RoutedExperts => GgmlType::IQ2_XXS,
            _ => GgmlType::Q8_0,
        },
    };
    fallback(ty, shape[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_follows_llama_quantize() {
        let t =
            |name, role, shape: &[u64], il| tensor_type(QuantMix::Q4KM, name, role, shape, il, 48);
        assert_eq!(
            t("output.weight", Role::Output, &[2048, 151936], None),
            GgmlType::Q6_K
        );
        assert_eq!(
            t(
                "blk.0.ffn_down_exps.weight",
                Role::RoutedExperts,
                &[768, 2048, 128],
                Some(0)
            ),
            GgmlType::Q6_K
        );
        assert_eq!(
            t(
                "blk.7.ffn_down_exps.weight",
                Role::RoutedExperts,
                &[768, 2048, 128],
                Some(7)
            ),
            GgmlType::Q4_K
        );
        assert_eq!(
            t(
                "blk.7.ffn_up_exps.weight",
                Role::RoutedExperts,
                &[2048, 768, 128],
                Some(0)
            ),
            GgmlType::Q4_K
        );
        assert_eq!(
            t(
                "blk.7.ffn_gate_inp.weight",
                Role::Router,
                &[2048, 128],
                Some(7)
            ),
            GgmlType::F32
        );
        assert_eq!(
            t("blk.7.attn_norm.weight", Role::Norm, &[2048], Some(7)),
            GgmlType::F32
        );
        // 1408 is not a multiple of 256: Q4_K falls back to Q5_0.
        assert_eq!(
            t(
                "blk.7.ffn_up_exps.weight",
                Role::RoutedExperts,
                &[1408, 2048, 64],
                Some(7)
            ),
            GgmlType::Q5_0
        );
        assert_eq!(
            tensor_type(
                QuantMix::MXFP4,
                "blk.1.ffn_up_exps.weight",
                Role::RoutedExperts,
                &[2880, 2880, 32],
                Some(1),
                24
            ),
            GgmlType::MXFP4
        );
        assert!(QuantMix::parse("Q4_K_M").is_ok() && QuantMix::parse("q3").is_err());
    }

    /// The seed's mix on DeepSeek-V4-Flash's shapes: each role its type, integers untouched.
    #[test]
    fn dsv4_seed_gives_each_role_its_type() {
        let t = |name, role, shape: &[u64]| {
            tensor_type(QuantMix::Dsv4Seed, name, role, shape, Some(5), 43)
        };
        let experts = Role::RoutedExperts;
        for (name, role, shape, want) in [
            (
                "blk.5.ffn_gate_exps.weight",
                experts,
                &[4096, 2048, 256][..],
                GgmlType::IQ2_XXS,
            ),
            (
                "blk.5.ffn_up_exps.weight",
                experts,
                &[4096, 2048, 256],
                GgmlType::IQ2_XXS,
            ),
            (
                "blk.5.ffn_down_exps.weight",
                experts,
                &[2048, 4096, 256],
                GgmlType::Q2_K,
            ),
            (
                "blk.5.attn_q_b.weight",
                Role::Attention,
                &[1024, 32768],
                GgmlType::Q8_0,
            ),
            (
                "blk.5.attn_kv.weight",
                Role::Attention,
                &[4096, 512],
                GgmlType::Q8_0,
            ),
            (
                "blk.5.ffn_gate_shexp.weight",
                Role::SharedExperts,
                &[4096, 2048],
                GgmlType::Q8_0,
            ),
            (
                "blk.5.ffn_down_shexp.weight",
                Role::SharedExperts,
                &[2048, 4096],
                GgmlType::Q8_0,
            ),
            (
                "output.weight",
                Role::Output,
                &[4096, 129280],
                GgmlType::Q8_0,
            ),
            (
                "token_embd.weight",
                Role::Embedding,
                &[4096, 129280],
                GgmlType::Q8_0,
            ),
            (
                "blk.5.hc_attn_fn.weight",
                Role::Other,
                &[16384, 24],
                GgmlType::Q8_0,
            ),
            (
                "blk.5.ffn_gate_inp.weight",
                Role::Router,
                &[4096, 256],
                GgmlType::F32,
            ),
            (
                "blk.5.attn_sinks.weight",
                Role::Attention,
                &[64],
                GgmlType::F32,
            ),
            (
                "blk.5.exp_probs_b.bias",
                Role::Router,
                &[256],
                GgmlType::F32,
            ),
            (
                "blk.0.ffn_gate_tid2eid.weight",
                Role::Router,
                &[6, 129280],
                GgmlType::I32,
            ),
        ] {
            assert_eq!(t(name, role, shape), want, "{name}");
        }
        assert_eq!(QuantMix::parse("dsv4-seed"), Ok(QuantMix::Dsv4Seed));
    }
}
