//! The slot table of one layer's expert cache: which expert each GPU slot holds, and the policy
//! that picks victims. Pure bookkeeping (no memory is touched here), so the cache logic is tested
//! on recorded routing traces without a GPU.
//!
//! Invariants: `slot_of[e] == Some(s)` iff `expert_in[s] == Some(e)`; an expert needed by the
//! current step is never evicted during that step.
use super::policy::{Policy, PolicyKind};

pub struct LayerCache {
    slot_of: Vec<Option<u32>>,
    expert_in: Vec<Option<u32>>,
    policy: Box<dyn Policy>,
    /// A stamp of the residency, new at every admission and eviction, never repeated in the
    /// process (by any cache, a new one included).
    version: u64,
}

impl LayerCache {
    pub fn new(il: usize, n_expert: usize, n_slots: usize, kind: &PolicyKind) -> Self {
        Self {
            slot_of: vec![None; n_expert],
            expert_in: vec![None; n_slots],
            policy: kind.make(il, n_expert),
            version: next_version(),
        }
    }

    /// The residency's stamp: equal stamps, equal residency (the same cache, unchanged).
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn n_slots(&self) -> usize {
        self.expert_in.len()
    }

    /// The slot holding expert `e`, if resident.
    pub fn slot(&self, e: u32) -> Option<u32> {
        self.slot_of[e as usize]
    }

    /// Slots holding no expert.
    pub fn n_free(&self) -> usize {
        self.expert_in.iter().filter(|e| e.is_none()).count()
    }

    /// The expert slot `s` holds, if any.
    pub fn expert_in(&self, s: u32) -> Option<u32> {
        self.expert_in.get(s as usize).copied().flatten()
    }

    /// Frees one slot: evicts the policy's victim among residents for which `pinned` is false.
    /// Returns the evicted expert, or `None` when every resident is pinned.
    pub fn free_one(&mut self, pinned: &dyn Fn(u32) -> bool, now: u64) -> Option<u32> {
        let candidates: Vec<u32> = self
            .expert_in
            .iter()
            .flatten()
            .copied()
            .filter(|&r| !pinned(r))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let v = self.policy.victim(&candidates, now);
        self.evict(v);
        Some(v)
    }

    /// Records a use of `e` at step `now` (call for hits and misses alike).
    pub fn touch(&mut self, e: u32, now: u64) {
        self.policy.touch(e, now);
    }

    /// Gives expert `e` (not resident) a slot: a free one, else the policy's victim among
    /// residents for which `pinned` is false. Returns the slot and the evicted expert, or `None`
    /// when every slot is pinned.
    pub fn admit(
        &mut self,
        e: u32,
        pinned: &dyn Fn(u32) -> bool,
        now: u64,
    ) -> Option<(u32, Option<u32>)> {
        debug_assert!(
            self.slot_of[e as usize].is_none(),
            "expert {e} already resident"
        );
        // No free slot: free the victim's (then the only free one).
        let evicted = match self.expert_in.iter().any(Option::is_none) {
            true => None,
            false => Some(self.free_one(pinned, now)?),
        };
        let slot = self
            .expert_in
            .iter()
            .position(Option::is_none)
            .expect("a free slot") as u32;
        self.expert_in[slot as usize] = Some(e);
        self.slot_of[e as usize] = Some(slot);
        self.version = next_version();
        Some((slot, evicted))
    }

    /// Forgets expert `e` (e.g. a prefetch that was cancelled).
    pub fn evict(&mut self, e: u32) {
        if let Some(s) = self.slot_of[e as usize].take() {
            self.expert_in[s as usize] = None;
            self.version = next_version();
        }
    }
}

/// A residency stamp no cache has had.
fn next_version() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Hits and misses of one layer's cache over a trace of steps (each step: the distinct experts
/// it uses, all needed at once).
pub fn simulate(
    kind: &PolicyKind,
    n_expert: usize,
    n_slots: usize,
    trace: &[Vec<u32>],
) -> (u64, u64) {
    let mut c = LayerCache::new(0, n_expert, n_slots, kind);
    let (mut hits, mut misses) = (0, 0);
    for (now, step) in trace.iter().enumerate() {
        let now = now as u64;
        for &e in step {
            if c.slot(e).is_some() {
                hits += 1;
            } else {
                misses += 1;
                c.admit(e, &|r| step.contains(&r), now)
                    .expect("trace steps fit the cache");
            }
        }
        for &e in step {
            c.touch(e, now);
        }
    }
    (hits, misses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_per_step(v: &[u32]) -> Vec<Vec<u32>> {
        v.iter().map(|&e| vec![e]).collect()
    }

    // Trace 0 1 0 2 1 0 with two slots, worked by hand:
    // LRU: miss miss hit miss(evict 1) miss(evict 0) miss(evict 2) -> 1 hit, 5 misses.
    // LFU: miss miss hit(0 used twice) miss(evict 1: used once) miss(evict 2: once, vs 0 twice)
    //      hit -> 2 hits, 4 misses.
    // LFRU half-life 1 (score halves every step): at step 3 scores 0: 1.25*0.5=0.625, 1: 0.25
    //      -> evict 1; step 4: 0: 0.3125, 2: 0.5 -> evict 0; step 5: 2: 0.25, 1: 0.5625 -> evict
    //      2 -> 1 hit, 5 misses (recency wins, like LRU).
    const TRACE: [u32; 6] = [0, 1, 0, 2, 1, 0];

    #[test]
    fn lru_on_a_hand_worked_trace() {
        assert_eq!(
            simulate(&PolicyKind::Lru, 4, 2, &one_per_step(&TRACE)),
            (1, 5)
        );
    }

    #[test]
    fn lfu_on_a_hand_worked_trace() {
        assert_eq!(
            simulate(&PolicyKind::Lfu, 4, 2, &one_per_step(&TRACE)),
            (2, 4)
        );
    }

    #[test]
    fn lfru_spans_lru_to_lfu_with_its_half_life() {
        let t = one_per_step(&TRACE);
        let short = PolicyKind::Lfru { half_life: 1.0 };
        let long = PolicyKind::Lfru { half_life: 1e6 };
        assert_eq!(simulate(&short, 4, 2, &t), (1, 5));
        assert_eq!(simulate(&long, 4, 2, &t), (2, 4));
    }

    #[test]
    fn static_keeps_its_hot_set() {
        // Hot {0}: LRU would evict 0 at step 3 (trace 0 1 2 0), static evicts 1 instead.
        let t = one_per_step(&[0, 1, 2, 0]);
        let hot = PolicyKind::Static { hot: vec![vec![0]] };
        assert_eq!(simulate(&PolicyKind::Lru, 4, 2, &t), (0, 4));
        assert_eq!(simulate(&hot, 4, 2, &t), (1, 3));
    }

    #[test]
    fn experts_needed_this_step_are_never_evicted() {
        let mut c = LayerCache::new(0, 8, 2, &PolicyKind::Lru);
        let step = [3u32, 5];
        for &e in &step {
            c.admit(e, &|r| step.contains(&r), 0).unwrap();
        }
        // A third expert in the same step finds no slot rather than evicting 3 or 5.
        assert!(c.admit(6, &|r| step.contains(&r), 0).is_none());
        assert_eq!((c.slot(3), c.slot(5)), (Some(0), Some(1)));
        // Next step, 5 is unpinned and goes.
        assert_eq!(c.admit(6, &|r| r == 3, 1), Some((1, Some(5))));
        assert_eq!(c.slot(5), None);
    }

    /// The expert tables skip a copy when the stamp is the one they last copied
    /// (`offload::table`): a residency change must give a new stamp, a use must not, and a new
    /// cache (the slots reallocated) must not repeat an old one's.
    #[test]
    fn residency_stamps_change_with_residency_only() {
        let mut c = LayerCache::new(0, 8, 1, &PolicyKind::Lru);
        let mut seen = vec![c.version()];
        c.admit(3, &|_| false, 0).unwrap();
        seen.push(c.version());
        c.touch(3, 1);
        assert_eq!(c.version(), seen[1], "a use changed the stamp");
        c.admit(4, &|_| false, 2).unwrap(); // evicts 3
        seen.push(c.version());
        c.evict(4);
        seen.push(c.version());
        c.evict(4); // not resident: nothing changes
        assert_eq!(c.version(), seen[3]);
        seen.push(LayerCache::new(0, 8, 1, &PolicyKind::Lru).version());
        let n = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n, "a stamp repeated");
    }

    #[test]
    fn policy_names_parse() {
        assert_eq!(PolicyKind::parse("lru"), Ok(PolicyKind::Lru));
        assert_eq!(
            PolicyKind::parse("lfru:4"),
            Ok(PolicyKind::Lfru { half_life: 4.0 })
        );
        assert!(PolicyKind::parse("lfru:-1").is_err());
        assert!(PolicyKind::parse("fifo").unwrap_err().contains("fifo"));
    }
}
