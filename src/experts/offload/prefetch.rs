//! FATE prefetch (docs/design.md §4.6): at a stop, the next offloaded layer's predicted experts
//! that are not resident are copied into their share's slots on the copy stream, as many as the
//! miss balance leaves to the copy engine (`planner::prefetch_budget`).
use super::addrs::LayerAddrs;
use super::*;
use crate::experts::stats::LayerStats;

/// A factor on the prefetch budget: 1, or `POCKETMOE_PREFETCH_SCALE` (0 to 1; 0 prefetches
/// nothing, leaving every predicted miss to its stop's split), read once, for an A/B on the
/// device of how much of the copy engine prefetches should take.
fn prefetch_scale() -> f64 {
    static SCALE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *SCALE.get_or_init(|| {
        std::env::var("POCKETMOE_PREFETCH_SCALE")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|x: &f64| x.is_finite())
            .unwrap_or(1.0)
            .clamp(0.0, 1.0)
    })
}

impl Offload {
    /// After layer `il`'s experts are queued: takes the next offloaded layer's predicted router
    /// logits `pred` [n_expert, n_tokens] (computed by the graph on this layer's FFN input),
    /// and queues copies of the predicted experts that are not resident on the copy stream.
    /// Not waited for: the copies overlap this layer's expert matmuls and the next layer's
    /// attention; the next stop fences them before its slot writes and matmuls.
    pub(super) fn prefetch_after(&mut self, il: usize, pred: &[f32]) -> Result<(), GgmlError> {
        match self.plan_prefetch(il, pred, None)? {
            // Not gated: no ticket to open.
            Some(p) => self.queue_prefetch(p).map(|_| ()),
            None => Ok(()),
        }
    }

    /// The first half of [`Offload::prefetch_after`]: admits the predicted experts it will copy
    /// (evicting others), and in table form (`table`) queues the next layer's table without the
    /// victims, those experts resident (or not: [`table::prefetched_resident`]); then, gated
    /// (`pre`: the next stop's tickets), opens the next stop's gathers behind it (its experts
    /// too where they need not wait for the bytes). Their copies wait for
    /// [`Offload::queue_prefetch`], so that a gated stop queues its own misses' first.
    pub(super) fn plan_prefetch(
        &mut self,
        il: usize,
        pred: &[f32],
        pre: Option<Pre>,
    ) -> Result<Option<Prefetch>, GgmlError> {
        let next = self.next_offloaded(il).filter(|_| !pred.is_empty());
        let Some(next) = next else {
            self.open_pre(il, pre.map(|p| p.experts))?;
            return Ok(None);
        };
        let shares = self.shares;
        let now = self.step;
        let k = self.k;
        let layer = self.layers[next].as_ref().expect("offloaded layer");
        let predicted = predicted_experts(pred, self.n_expert, k);
        let cands: Vec<u32> = predicted
            .iter()
            .copied()
            .filter(|&e| layer.slot(e).is_none())
            .collect();
        // The rest of the predicted misses are left to the CPU channel at `next`'s stop.
        let scale = prefetch_scale() * self.duels.prefetch();
        let budget = (self.prefetch_budget(next, &cands) as f64 * scale).round() as usize;
        let layer = self.layers[next].as_mut().expect("offloaded layer");
        let mut fetched = Vec::new();
        let mut full = vec![false; shares];
        for &e in &cands {
            if fetched.len() == budget {
                break;
            }
            let s = layer.owner(e);
            if full[s] {
                continue;
            }
            // Evict only experts not predicted; stop when the share's cache has none left to
            // give.
            let Some((slot, _)) = layer.caches[s].admit(e, &|r| predicted.contains(&r), now) else {
                full[s] = true;
                continue;
            };
            fetched.push((s, slot, e));
        }
        super::trace::with(|r, _| (r.cands, r.prefetched) = (cands.len(), fetched.len()));
        let early = table::prefetched_resident();
        if self.tab.step {
            let coming: Vec<u32> = match early {
                true => Vec::new(),
                false => fetched.iter().map(|&(_, _, e)| e).collect(),
            };
            self.flush_table(next, &coming, false)?;
        }
        // Early, the next stop's experts wait for the bytes: their ticket opens after them. With
        // nothing fetched there are no bytes to wait for, and the ticket opens now: else the
        // next stop's experts waited for this stop's whole protocol (its hit flag read back
        // included) even where every pick of both layers was resident, which stalls the GPU
        // wherever the host runs late (H100, 2026-12-07: most stops fetch nothing at
        // calibrated routing, 12 GiB).
        let wait = early && !fetched.is_empty();
        self.open_pre(il, pre.map(|p| if wait { p.gathers } else { p.experts }))?;
        Ok(Some(Prefetch {
            next,
            fetched,
            predicted,
            landed: pre.filter(|_| wait).map(|p| p.experts),
        }))
    }

    /// The second half of [`Offload::prefetch_after`]: queues the planned copies on the copy
    /// stream and, in table form, the next layer's table with their experts after them. Returns
    /// the ticket to open behind them (gated, where the table counted them resident before:
    /// the next stop's experts'), which the stop opens once it has opened its own gate: one
    /// opened behind these copies would wait for them.
    pub(super) fn queue_prefetch(&mut self, p: Prefetch) -> Result<Option<u64>, GgmlError> {
        let Prefetch {
            next,
            fetched,
            predicted,
            landed,
        } = p;
        let shares = self.shares;
        let addrs: Vec<LayerAddrs> = (0..shares).map(|s| self.addrs_of(next, s)).collect();
        let devs: Vec<usize> = (0..shares).map(|s| self.share_device(next, s)).collect();
        let mut h2d = vec![0u64; shares];
        for &(s, slot, e) in &fetched {
            let xfer = self.parts[devs[s]].xfer.as_mut();
            for (_, a) in addrs[s].mats() {
                xfer.copy(a.in_slot(slot), a.in_store(e), a.expert_bytes)?;
                h2d[s] += a.expert_bytes as u64;
            }
        }
        if self.tab.step {
            self.flush_table(next, &[], false)?;
        }
        let fetched: Vec<u32> = fetched.iter().map(|&(_, _, e)| e).collect();
        let layer = self.layers[next].as_mut().expect("offloaded layer");
        let st = &mut self.stats.layers[next];
        st.prefetched += fetched.len() as u64;
        st.copies += fetched.len() as u64;
        let mut by = LayerStats::per_share(shares);
        for &e in &fetched {
            if let Some(b) = by.get_mut(layer.owner(e)) {
                b.prefetched += 1;
            }
        }
        layer.prefetched = fetched;
        layer.predicted = predicted;
        self.book_copies(next, &devs, &h2d, by);
        Ok(landed)
    }

    /// Opens the gate to `pre` (if any) once the copies queued so far have landed.
    pub(super) fn open_pre(&mut self, il: usize, pre: Option<u64>) -> Result<(), GgmlError> {
        match pre {
            Some(t) => gates::Open::Ticket(t).open_behind_copies(self.xfer(il)),
            None => Ok(()),
        }
    }
}

/// A prefetch planned ([`Offload::plan_prefetch`]) and not yet queued: layer `next`'s experts
/// to copy (share, slot, expert), every expert predicted for it, and the ticket to open once
/// their bytes have landed (gated, where the table counts them resident before).
pub(super) struct Prefetch {
    next: usize,
    fetched: Vec<(usize, u32, u32)>,
    predicted: Vec<u32>,
    landed: Option<u64>,
}

/// A gated stop's tickets for the next stop, which its prefetch opens ([`gates::Tickets`]).
#[derive(Clone, Copy)]
pub(super) struct Pre {
    pub(super) gathers: u64,
    pub(super) experts: u64,
}
