//! One forward pass through the offloaded experts: the scheduler stops after each offloaded
//! layer's router ([`StepHook`](super::StepHook) as ggml's eval callback); we read the selected expert ids (and
//! the next layer's predicted router logits), make the experts available (slot cache: admit
//! misses, queue their copies and the remapped ids on the compute stream; staging: copy every
//! used expert in, from its slot when cached), queue prefetches for the next layer on our copy
//! stream, and let the graph continue. A second stop joins the CPU channel's share, only in
//! layers that gave it work.
//!
//! Invariants:
//! - Slots: everything the layer's expert matmuls read (miss copies, ids, mask) is queued on
//!   the compute stream before they are, so it lands first without the host waiting.
//! - Prefetches run on the copy stream. The next stop reads its routing on a stream of its own
//!   (the host waits for that read only), then fences: the compute stream waits, on the device,
//!   for the prefetches before any later slot write or matmul.
//! - Staging: when `computed` returns, every staging copy of the layer has landed.
//!
//! This module holds the graph's side: the offloaded layers as the graph builder records them
//! ([`MoeNode`]) and the nodes the hook stops at ([`GraphNodes`]). The hook and the protocol it
//! runs are in `offload` (`hook`, `readback`, `slots`, `staging`, `planner`).
use super::options::Mode;
use crate::ggml::OwnedGraph;
use std::collections::HashMap;

/// An offloaded layer of a built graph, as the graph builder recorded it.
#[derive(Debug, Clone)]
pub struct MoeNode {
    pub il: usize,
    pub mode: Mode,
    /// Name of the node the hook stops after: the last of the routing nodes below.
    pub anchor: String,
    /// Name of the selected ids, i32 [k, n_tokens].
    pub selected: String,
    /// Name of their final weights, f32 [1, k, n_tokens].
    pub weights: String,
    /// Name of the FFN input, f32 [n_embd, n_tokens] (the CPU channel computes on it).
    pub input: String,
    /// Name of the prefetch prediction: the next offloaded layer's router logits on this
    /// layer's FFN input, f32 [n_expert, n_tokens].
    pub pred: Option<String>,
    /// Name of the GPU experts' sum when the CPU channel adds its share after it.
    pub gpu_out: Option<String>,
    /// Table form (`offload::table`): names of the picks' slot ids, their mask and the hit
    /// flag, computed after the anchor.
    pub hit: Option<[String; 3]>,
    pub act: crate::graph::blocks::ExpertAct,
}

/// [`MoeNode`]s of an allocated graph, keyed by the ids of the nodes the hook stops after.
pub struct GraphNodes {
    pub(super) by_anchor: HashMap<usize, (Stop, Resolved)>,
    /// The routing stops in the order the graph computes them: (node index, layer).
    pub(super) routing: Vec<(usize, Resolved)>,
    /// Per routing stop, the index of the node after which its layer's GPU experts are summed
    /// and its CPU share is added next (where the CPU channel may serve the layer).
    pub(super) gpu_outs: Vec<Option<usize>>,
    /// Table form: each routing stop's hit flag's node index, in the same order (empty when
    /// the graph is not in table form; a gated step needs it).
    pub(super) flags: Vec<usize>,
    /// Whether the graph may run gated (`offload::gated`): the engine allocated it with every
    /// input on the one GPU and the scheduler made no copies.
    pub gateable: bool,
    /// Steps this graph ran so far: a graph runs gated only from its third step on, after
    /// two through the eval hook have let ggml-cuda warm up and capture its pieces and grow its
    /// memory pool (whose growth may synchronise the device, which a gated step must not).
    pub runs: std::cell::Cell<u32>,
    /// Gated steps of this graph in a row (since its last step through the eval hook): while
    /// below [`CAPTURE_STEPS`], a gated step queues nothing ahead of the stop it serves
    /// (`offload::gated`): those are the steps in which ggml-cuda may capture the gated pieces as
    /// CUDA graphs (a piece runs directly at its first call with changed properties and is
    /// captured at the next), and a capture must not find compute queued behind a closed gate.
    pub gated_in_a_row: std::cell::Cell<u32>,
    /// Table form: a node other than its flag's that writes a hit flag's word, if any (see
    /// [`flag_sharer`]); the engine then runs the graph through the eval hook.
    pub shared_flag: Option<String>,
}

/// Gated steps in a row after which ggml-cuda has captured every gated piece: its warm-up runs
/// a piece directly once (its properties new or changed: the eval hook's pieces of the same graph
/// are cut elsewhere) and captures it at the next unchanged call
/// (`ggml_backend_cuda_graph_compute`, llama-cpp-sys-4 0.11.0).
pub const CAPTURE_STEPS: u32 = 2;

/// The first node of `g` other than a hit flag's own that writes memory overlapping the flag's
/// word (flags: the flags' node indices), named with the flag's. A gated step queues the wait
/// for a flag ahead of the node that computes it (`offload::gated`), so the word must hold
/// nothing but flags until then: a node that shares it (as the allocator may make a graph output
/// share memory earlier nodes used) could pass the wait early, and the experts behind it would
/// run before the host's copies landed.
fn flag_sharer(g: &OwnedGraph, flags: &[usize]) -> Option<String> {
    let graph = g.graph();
    let n = graph.n_nodes();
    flags.iter().find_map(|&f| {
        let flag = graph.node(f);
        let at = flag.data_addr();
        (0..n).filter(|&i| i != f).find_map(|i| {
            let t = graph.node(i);
            let (from, to) = (t.data_addr(), t.data_addr() + t.n_bytes());
            (from < at + 4 && at < to && from != 0)
                .then(|| format!("{} shares the word of {}", t.name(), flag.name()))
        })
    })
}

/// Where a layer stops: after its routing, or (CPU channel) after its GPU experts' sum.
#[derive(Clone, Copy, Debug)]
pub(super) enum Stop {
    Routing,
    GpuOut,
}

/// A table-form stop's gathered slot ids (i32 [k, n_tokens]), mask (f32, as many) and hit flag
/// (f32 [1]): device addresses of graph outputs.
#[derive(Clone, Copy)]
pub(super) struct HitAddrs {
    pub(super) ids: usize,
    pub(super) mask: usize,
    pub(super) flag: usize,
}

/// A stopping layer's nodes, resolved to addresses.
#[derive(Clone, Copy)]
pub(super) struct Resolved {
    pub(super) il: usize,
    pub(super) mode: Mode,
    pub(super) sel_addr: usize,
    /// Bytes between consecutive tokens' selected ids: the top-k is a view of the whole
    /// argsort (`ggml_argsort_top_k`), so each token's k ids start n_expert ids apart.
    pub(super) sel_row: usize,
    pub(super) w_addr: usize,
    pub(super) x_addr: usize,
    /// The prefetch prediction's address, when the graph computes one.
    pub(super) pred_addr: Option<usize>,
    /// Table form: where the picks' slot ids, their mask and the hit flag lie.
    pub(super) hit: Option<HitAddrs>,
    pub(super) act: crate::graph::blocks::ExpertAct,
}

impl GraphNodes {
    /// Resolves names to node ids and data addresses; call after the graph is allocated.
    pub fn resolve(nodes: &[MoeNode], g: &OwnedGraph) -> Self {
        let mut by_anchor = HashMap::new();
        for n in nodes {
            let r = Resolved {
                il: n.il,
                mode: n.mode,
                sel_addr: g.tensor(&n.selected).data_addr(),
                sel_row: g.tensor(&n.selected).nb()[1],
                w_addr: g.tensor(&n.weights).data_addr(),
                x_addr: g.tensor(&n.input).data_addr(),
                pred_addr: n.pred.as_ref().map(|p| g.tensor(p).data_addr()),
                hit: n.hit.as_ref().map(|[ids, mask, flag]| HitAddrs {
                    ids: g.tensor(ids).data_addr(),
                    mask: g.tensor(mask).data_addr(),
                    flag: g.tensor(flag).data_addr(),
                }),
                act: n.act,
            };
            by_anchor.insert(g.tensor(&n.anchor).id(), (Stop::Routing, r));
            if let Some(o) = &n.gpu_out {
                by_anchor.insert(g.tensor(o).id(), (Stop::GpuOut, r));
            }
        }
        let graph = g.graph();
        let routing: Vec<(usize, Resolved)> = (0..graph.n_nodes())
            .filter_map(|i| match by_anchor.get(&graph.node(i).id()) {
                Some((Stop::Routing, r)) => Some((i, *r)),
                _ => None,
            })
            .collect();
        // Per routing stop, the index of the node after which its layer's GPU experts are summed
        // and its CPU share is added next, if the graph has one.
        let outs: HashMap<usize, usize> = (0..graph.n_nodes())
            .filter_map(|i| match by_anchor.get(&graph.node(i).id()) {
                Some((Stop::GpuOut, r)) => Some((r.il, i)),
                _ => None,
            })
            .collect();
        let gpu_outs = routing
            .iter()
            .map(|(_, r)| outs.get(&r.il).copied())
            .collect();
        let flag_ids: HashMap<usize, ()> = nodes
            .iter()
            .filter_map(|n| Some((g.tensor(&n.hit.as_ref()?[2]).id(), ())))
            .collect();
        let flags: Vec<usize> = (0..graph.n_nodes())
            .filter(|&i| flag_ids.contains_key(&graph.node(i).id()))
            .collect();
        let shared_flag = flag_sharer(g, &flags);
        Self {
            by_anchor,
            flags,
            gpu_outs,
            routing,
            shared_flag,
            gateable: false,
            runs: std::cell::Cell::new(0),
            gated_in_a_row: std::cell::Cell::new(0),
        }
    }

    /// Node indices of the routing stops, in compute order.
    pub fn routing_stops(&self) -> impl Iterator<Item = usize> + '_ {
        self.routing.iter().map(|(i, _)| *i)
    }

    /// Whether the step stops at all (else the scheduler runs it without the eval callback,
    /// in one piece).
    pub fn has_stops(&self) -> bool {
        !self.by_anchor.is_empty()
    }
}
