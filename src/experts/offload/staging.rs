//! Prefill through the staging area: every used expert copied in, from its slot when cached;
//! in large micro-batches the next layer's experts staged ahead.
use super::*;

/// Prefill micro-batches with at least this many expert picks per expert use practically every
/// expert ((1 - k/n)^(picks) ~ e^-4 unused), so the next layer's are staged whole, ahead.
const STAGE_AHEAD_PICKS: usize = 4;

impl Offload {
    /// A staging stop at layer `il`: copies the `used` experts into the staging area (unless
    /// they were staged ahead) and waits for them; a large micro-batch then stages the next
    /// offloaded layer ahead.
    pub(super) fn stage_used(
        &mut self,
        il: usize,
        used: &[u32],
        n_tokens: usize,
    ) -> Result<(), GgmlError> {
        let local = self.local_share(il);
        let addrs = self.addrs_of(il, local);
        let now = self.step;
        let d = self.layer_device(il);
        let xfer = self.parts[d].xfer.as_mut();
        let layer = self.layers[il].as_mut().expect("offloaded layer");
        let st = &mut self.stats.layers[il];
        let mut h2d = 0u64;
        let ahead = layer.staged_ahead == Some(now);
        for &e in used {
            // (Under expert parallelism, an expert cached on another device is copied in from
            // the host store: a miss here.)
            let cached = layer.slot(e).filter(|_| layer.owner(e) == local);
            if cached.is_some() {
                st.hits += 1;
            } else {
                st.misses += 1;
                st.copies += u64::from(!ahead);
            }
            if ahead {
                // Already copied in while the previous layer ran.
                continue;
            }
            h2d += stage_expert(xfer, &addrs, e, cached)?;
        }
        st.h2d_bytes += h2d;
        self.stats.h2d_bytes += h2d;
        let t0 = std::time::Instant::now();
        xfer.wait()?;
        self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
        if n_tokens * self.k >= STAGE_AHEAD_PICKS * self.n_expert {
            self.stage_ahead(il)?;
        }
        Ok(())
    }

    /// During a large prefill micro-batch, after layer `il`'s experts are staged: queues copies
    /// of *every* expert of the next offloaded layer into its staging area (the other one of the
    /// two), from its slot when cached, without waiting — they overlap this layer's expert
    /// matmuls and the next layer's attention. The next layer's staging stop waits for them.
    pub(super) fn stage_ahead(&mut self, il: usize) -> Result<(), GgmlError> {
        let Some(next) = self.next_offloaded(il) else {
            return Ok(());
        };
        let local = self.local_share(next);
        let addrs = self.addrs_of(next, local);
        let now = self.step;
        let d = self.layer_device(next);
        let xfer = self.parts[d].xfer.as_mut();
        let layer = self.layers[next].as_mut().expect("offloaded layer");
        let mut h2d = 0u64;
        let mut copied = 0u64;
        for e in 0..self.n_expert as u32 {
            let cached = layer.slot(e).filter(|_| layer.owner(e) == local);
            copied += u64::from(cached.is_none());
            h2d += stage_expert(xfer, &addrs, e, cached)?;
        }
        layer.staged_ahead = Some(now);
        self.stats.layers[next].copies += copied;
        self.stats.layers[next].h2d_bytes += h2d;
        self.stats.h2d_bytes += h2d;
        Ok(())
    }
}

/// Queues the copy of expert `e` into its place in the staging area: from slot `cached` when the
/// cache on the staging area's device holds it (device to device), else from the host store
/// (under expert parallelism also an expert another device caches). Returns the bytes that cross PCIe.
fn stage_expert(
    xfer: &mut dyn Transfer,
    addrs: &LayerAddrs,
    e: u32,
    cached: Option<u32>,
) -> Result<u64, GgmlError> {
    let mut h2d = 0;
    for (_, a) in addrs.mats() {
        let src = match cached {
            Some(s) => a.in_slot(s),
            None => {
                h2d += a.expert_bytes as u64;
                a.in_store(e)
            }
        };
        xfer.copy(a.in_staging(e), src, a.expert_bytes)?;
    }
    Ok(h2d)
}
