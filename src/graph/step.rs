//! What a step needs besides its tokens, positions and cache rows: the architecture's own
//! per-step plan ([`ArchStep`]), made by the architecture from the step's sequences ([`Span`])
//! through its `KvLayout::seq_state` (`crate::arch`). The engine carries it without reading
//! it: it names the graph's shape ([`ArchStep::key`]), makes the graph's inputs
//! ([`ArchStep::inputs`]) and fills them ([`ArchStep::fill`]). Today only DeepSeek-V4's
//! compressors keep such state; DeepSeek-3.2's indexer keys are cache rows like K and V
//! (`KvLayout::extra`), which need no plan.
use super::dsv4::{self, CompInputs, CompPlan, Dsv4Inputs};
use crate::ggml::{Context, GgmlError, Tensor};

/// One sequence's run of tokens in a step: tokens `tok..tok + n` of the step, at positions
/// `pos..pos + n`, with state ring `ring` (the server's slot), and its cache pages
/// (`engine::batch`: position p in row `pages[p / 256] · 256 + p mod 256`; `None`: rows are
/// positions, the single-sequence engine).
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub tok: usize,
    pub pos: usize,
    pub n: usize,
    pub ring: usize,
    pub pages: Option<Vec<u32>>,
}

/// The single-sequence step: `n` tokens at positions `n_past..`, ring 0, rows = positions.
pub fn single(n_past: usize, n: usize) -> Vec<Span> {
    vec![Span {
        tok: 0,
        pos: n_past,
        n,
        ring: 0,
        pages: None,
    }]
}

/// An architecture's plan for one step (empty for an architecture that keeps no state of its
/// own per sequence).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArchStep {
    /// DeepSeek-V4: per compression ratio, (ratio, the compressor's plan, compressed rows
    /// attended).
    comp: Vec<(usize, CompPlan, usize)>,
}

impl ArchStep {
    /// DeepSeek-V4's compressor plans ([`dsv4::step_plans`]).
    pub fn compressors(comp: Vec<(usize, CompPlan, usize)>) -> Self {
        Self { comp }
    }

    /// What of the plan shapes the graph (a graph built for one key serves every step with
    /// it): per compression ratio, compressed rows made and compressed rows attended.
    pub fn key(&self) -> Vec<(usize, usize)> {
        self.comp
            .iter()
            .map(|(_, c, m)| (c.n_blocks(), *m))
            .collect()
    }

    /// The graph inputs of the plan for `n` tokens (what `BatchInputs::dsv4` carries); `keep`
    /// collects their names.
    pub fn inputs<'a>(
        &self,
        ctx: &'a Context,
        n: usize,
        keep: &mut Vec<String>,
    ) -> Result<Option<Dsv4Inputs<'a>>, GgmlError> {
        let mut out = None;
        for (r, p, n_comp) in &self.comp {
            let inp = CompInputs::create(ctx, *r, p, n, *n_comp, keep)?;
            let d = out.get_or_insert(Dsv4Inputs {
                csa: None,
                hca: None,
            });
            match r {
                4 => d.csa = Some(inp),
                _ => d.hca = Some(inp),
            }
        }
        Ok(out)
    }

    /// Writes the plan into the inputs of an allocated graph built for its key (`get` finds
    /// an input by name).
    pub fn fill<'g>(&self, get: impl Fn(&str) -> Tensor<'g>) -> Result<(), GgmlError> {
        for (r, plan, n_comp) in &self.comp {
            dsv4::fill(&get, *r, plan, *n_comp)?;
        }
        Ok(())
    }
}
