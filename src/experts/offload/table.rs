//! Table form (docs/design.md §4.4b): a decode graph gathers each pick's slot id and residency
//! from a per-layer table on the device instead of reading control the host wrote at the stop,
//! and computes a hit flag: the step's base plus its resident picks. A gated step waits after
//! that flag for the flag itself (`Transfer::close_word`): where every pick is resident the GPU
//! opens its own gate and runs on while the host reads the stop; where one is not, the host
//! plans the misses and opens the gate as before. The host keeps the tables in step with the
//! cache: a layer's table is copied whole (slot ids, then residency) where it changed.
//!
//! Invariants:
//! - Residency 1 in a table only for an expert whose bytes are in its slot or on their way:
//!   a prefetch copies the next layer's table (victims gone, its experts resident) before its
//!   bytes, and the stop that prefetches opens the next stop's gathers behind the table and
//!   that stop's experts (`Tickets::experts`, which its flag's gate also waits for) behind the
//!   bytes. So a victim whose slot is being overwritten is never counted, and a stop whose
//!   picks include a prefetched expert passes on the device and waits there for its bytes.
//!   With `POCKETMOE_TABLE_PREFETCH=landed` ([`prefetched_resident`]) the table is copied
//!   twice instead, its experts resident only in the second copy, after their bytes, and both
//!   tickets open between the two; the second may land while the graph gathers: slot ids land
//!   before residency, and the graph reads residency first.
//! - Flags only grow: the base rises by [`BASE_STEP`] (more than any micro-batch's picks) every
//!   gated step, so a flag left from an earlier step never passes a later wait; near f32's
//!   exact integers the base starts again at [`BASE_STEP`] with every flag zeroed.
//! - The ring's snapshots are read by copies queued during one step: the copy stream is idle
//!   before the next step reuses them.
use super::*;

/// Micro-batches of at most this many tokens decode in table form: every pick's slot id then
/// feeds ggml-cuda's per-token mat-vec kernels (beyond 8 tokens its grouped kernels need a
/// token's picks in distinct slots, which a table cannot give the CPU channel's picks).
const TABLE_TOKENS: usize = 8;

/// What a table-form step adds to the hit flags' base.
const BASE_STEP: f32 = 256.0;

/// f32 represents every integer up to this exactly.
const F32_EXACT: f32 = 16_777_216.0;

/// Whether a table counts an expert being prefetched resident as soon as its slot is assigned
/// (the default: the stop that uses it passes on the device, and its experts wait on the device
/// for the bytes, `Open::Word`'s ticket), or only once its bytes landed
/// (`POCKETMOE_TABLE_PREFETCH=landed`: a stop gathering before then takes the host's path, but
/// the experts of a stop whose picks were all resident never wait for a prefetch); read once,
/// for an A/B on the device.
pub(super) fn prefetched_resident() -> bool {
    static EARLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EARLY.get_or_init(|| {
        std::env::var("POCKETMOE_TABLE_PREFETCH").map_or(true, |v| v.trim() != "landed")
    })
}

/// Table form's host state: the page-locked ring its copies are made from (`zero` bytes of
/// zeros first, then this step's copies from `at` on), each layer's table as last queued (and
/// its cache's residency stamp then, where it was queued as the cache held it), the
/// hit flags' base, and whether the step in flight is in table form.
pub(super) struct Tables {
    ring: usize,
    ring_len: usize,
    zero: usize,
    at: usize,
    last: Vec<Vec<u8>>,
    last_version: Vec<Option<u64>>,
    base: f32,
    pub(super) step: bool,
}

impl Tables {
    /// For `n_moe` offloaded layers of `n_layer` and `n_expert` experts, zeros as long as a CPU
    /// result (`zero_floats`), and a step's copies: at most three per layer (a prefetch's two
    /// and a stop's), each in one or two pieces.
    pub(super) fn new(
        store: &Context,
        backend: &Rc<Backend>,
        n_layer: usize,
        n_moe: usize,
        zero_floats: usize,
        n_expert: usize,
    ) -> Result<Self, GgmlError> {
        let zero = (4 * zero_floats.max(1)).next_multiple_of(64);
        let ring_len = zero + 4 * n_moe * (8 * n_expert).next_multiple_of(64) + 256;
        let buf = store.new_buffer(backend, Memory::Host, ring_len)?;
        buf.clear(0);
        Ok(Self {
            ring: buf.base_addr(),
            ring_len,
            zero,
            at: zero,
            // The device's tables start zeroed (every expert slot 0, not resident).
            last: vec![vec![0u8; 8 * n_expert]; n_layer],
            last_version: vec![None; n_layer],
            base: 0.0,
            step: false,
        })
    }
}

impl Tables {
    /// The hit flags' base this step.
    pub(super) fn base(&self) -> f32 {
        self.base
    }
}

impl Offload {
    /// Whether a graph of `n_tokens` runs its slot-mode layers in table form: where a step of
    /// its size may ([`Offload::table_fits`]) and the form is asked for
    /// (`OffloadOptions::table`: always, or where the duel's arm for the step says so, chosen
    /// before its graph is built: [`Offload::begin_form`]).
    pub fn table_form(&self, n_tokens: usize) -> bool {
        self.table_fits(n_tokens)
            && match self.opts.table {
                TableForm::Off => false,
                TableForm::Always => true,
                TableForm::Auto => self.duels.pending().is_some_and(|a| a.table),
            }
    }

    /// Whether a step of `n_tokens` may run in table form: it may run gated (one device, one
    /// share, gating wanted), up to 8 tokens.
    pub(super) fn table_fits(&self, n_tokens: usize) -> bool {
        self.gating_wanted()
            && self.parts.len() == 1
            && self.shares == 1
            && (1..=TABLE_TOKENS).contains(&n_tokens)
            && ((n_tokens * self.k) as f32) < BASE_STEP
            && self.n_slots() > 0
            && self.mode(n_tokens) == Mode::Slots
    }

    /// Layer `il`'s expert table: slot ids (i32 [1, n_expert]) and residency (f32, 1 or 0).
    pub fn table(&self, il: usize) -> (Tensor<'_>, Tensor<'_>) {
        let p = self.part(il);
        let get = |w: &str| {
            p.dev
                .get(&p.dev_idx, &name(il, w))
                .unwrap_or_else(|| panic!("layer {il} has no expert table ({w})"))
        };
        (get("tab"), get("on"))
    }

    /// Layer `il`'s hit flag, f32 [1, 1]: the word a gated stop's experts wait for. A tensor of
    /// its own, not a graph output: the allocator may give a graph output memory that earlier
    /// nodes of the same step used, and a wait queued ahead of the flag's node would read
    /// their values (half of all f32 bit patterns pass a cyclic comparison with the target).
    pub fn hit_flag(&self, il: usize) -> Tensor<'_> {
        let p = self.part(il);
        p.dev
            .get(&p.dev_idx, &name(il, "hit"))
            .unwrap_or_else(|| panic!("layer {il} has no hit flag"))
    }

    /// The hit flags' base this step, f32 [1].
    pub fn hit_base(&self) -> Tensor<'_> {
        let p = &self.parts[0];
        p.dev
            .get(&p.dev_idx, "off.hit_base")
            .expect("the hit flags' base")
    }

    /// The flag a gated stop of `picks` picks reaches when all are resident, this step.
    pub(super) fn hit_target(&self, picks: usize) -> u32 {
        (self.tab.base + picks as f32).to_bits()
    }

    /// How many of the picks `sel` layer `il`'s cache holds.
    pub(super) fn cached_picks(&self, il: usize, sel: &[u32]) -> usize {
        let layer = self.layers[il].as_ref().expect("offloaded layer");
        sel.iter().filter(|&&e| layer.slot(e).is_some()).count()
    }

    /// Whether a gated stop's hit flag `got`, read back, reached `target` (the GPU ran on). The
    /// flag counts the picks the table held when the stop gathered, which is what layer `il`'s
    /// cache held then (`cached` of `picks`, counted before the stop changed it): all of them
    /// where the table counts prefetched experts resident, at most them where it does not. Any
    /// other count is a table out of step with the cache: an error naming the layer, rather
    /// than experts computed from the wrong slots.
    pub(super) fn hit_read(
        &self,
        il: usize,
        got: u32,
        target: u32,
        cached: usize,
        picks: usize,
    ) -> Result<bool, GgmlError> {
        let counted = f32::from_bits(got) - self.tab.base;
        let cached = cached as f32;
        let agrees = match prefetched_resident() {
            true => counted == cached,
            false => counted <= cached,
        };
        if !agrees {
            return Err(GgmlError::Tensor {
                name: format!("expert table of layer {il}"),
                msg: format!(
                    "the device counted {counted} of {picks} picks resident, the cache holds {cached}"
                ),
            });
        }
        Ok(super::gates::reached(got, target))
    }

    /// Layer `il`'s table as its cache holds it, `off` counted not resident: slot ids, then
    /// residency (a non-resident expert points at slot 0, weight 0).
    fn table_bytes(&self, il: usize, off: &[u32]) -> Vec<u8> {
        let layer = self.layers[il].as_ref().expect("offloaded layer");
        let cache = &layer.caches[0];
        let slots: Vec<Option<u32>> = (0..self.n_expert as u32)
            .map(|e| cache.slot(e).filter(|_| !off.contains(&e)))
            .collect();
        let mut b = Vec::with_capacity(8 * self.n_expert);
        for s in &slots {
            b.extend_from_slice(&(s.unwrap_or(0) as i32).to_ne_bytes());
        }
        for s in &slots {
            b.extend_from_slice(&(if s.is_some() { 1.0f32 } else { 0.0 }).to_ne_bytes());
        }
        b
    }

    /// Queues a copy of layer `il`'s table (`off` not resident) where it differs from the last
    /// one queued: on the copy stream, or (`compute`: the eval-hook path's stop, whose writes
    /// go before the graph's next nodes) on the compute stream.
    pub(super) fn flush_table(
        &mut self,
        il: usize,
        off: &[u32],
        compute: bool,
    ) -> Result<(), GgmlError> {
        // Unchanged since the last copy of it as the cache held it: nothing to build.
        let version = self.layers[il].as_ref().map(|l| l.caches[0].version());
        let whole = off.is_empty().then_some(version).flatten();
        if whole.is_some() && self.tab.last_version[il] == whole {
            return Ok(());
        }
        let bytes = self.table_bytes(il, off);
        if self.tab.last[il] == bytes {
            self.tab.last_version[il] = whole;
            return Ok(());
        }
        let at = self.ring_put(&bytes)?;
        let half = bytes.len() / 2;
        let (tab, on) = self.table(il);
        let (tab_at, on_at) = (tab.data_addr(), on.data_addr());
        if compute {
            let backend = self.part(il).backend.clone();
            // SAFETY: [at, at + 2 half) lies in the live page-locked ring, unchanged until the
            // step ends (the module's invariant); each write lies inside its tensor.
            unsafe {
                tab.write_async(&backend, 0, at, half)?;
                on.write_async(&backend, 0, at + half, half)?;
            }
        } else {
            // Two copies, in this order: a graph may gather the table while they land (a
            // prefetch's second copy), and reads residency first, so an expert it reads
            // resident has its slot id in place.
            let x = self.xfer(il);
            x.copy(tab_at, at, half)?;
            x.copy(on_at, at + half, half)?;
        }
        self.tab.last[il] = bytes;
        self.tab.last_version[il] = whole;
        Ok(())
    }

    /// Copies `bytes` into the next free room of the page-locked ring; returns its address.
    fn ring_put(&mut self, bytes: &[u8]) -> Result<usize, GgmlError> {
        let at = self.tab.ring + self.tab.at;
        let end = self.tab.at + bytes.len().next_multiple_of(64);
        if end > self.tab.ring_len {
            return Err(GgmlError::Tensor {
                name: "expert table ring".into(),
                msg: format!(
                    "a step's table copies need more than its {} B",
                    self.tab.ring_len
                ),
            });
        }
        // SAFETY: [at, at + len) lies in the live ring (checked), not read by a pending copy
        // (the module's invariant).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) };
        self.tab.at = end;
        Ok(at)
    }

    /// Starts a table-form step: the ring reused (the copy stream idle), every layer's table
    /// brought in step with its cache (steps of other forms change the cache without it), and
    /// for a `gated` step the flags' base raised and the CPU results left by earlier steps
    /// zeroed (a stop whose picks all hit adds its layer's without the host). All on the copy
    /// stream: a gated step's first gate opens after them.
    pub(super) fn begin_table_step(
        &mut self,
        nodes: &GraphNodes,
        gated: bool,
    ) -> Result<(), GgmlError> {
        tracing::trace!(gated, "table step: waiting for the copy stream");
        self.xfer(0).wait()?;
        self.tab.at = self.tab.zero;
        self.tab.step = true;
        let moe: Vec<usize> = (0..self.layers.len())
            .filter(|&il| self.is_offloaded(il))
            .collect();
        if gated {
            self.stats.table_steps += 1;
            self.tab.base += BASE_STEP;
            if self.tab.base + 2.0 * BASE_STEP >= F32_EXACT {
                self.tab.base = BASE_STEP;
                for (_, n) in &nodes.routing {
                    if let Some(h) = n.hit {
                        let zeros = self.tab.ring;
                        self.xfer(0).copy(h.flag, zeros, 4)?;
                    }
                }
            }
            let at = self.ring_put(&self.tab.base.to_ne_bytes())?;
            let base = self.hit_base().data_addr();
            self.xfer(0).copy(base, at, 4)?;
            for &il in &moe {
                if std::mem::take(&mut self.cpu_dirty[il]) {
                    let (dst, len) = (self.ctl_cpu(il).data_addr(), self.ctl_cpu(il).n_bytes());
                    assert!(len <= self.tab.zero, "the ring's zeros cover a CPU result");
                    let zeros = self.tab.ring;
                    self.xfer(0).copy(dst, zeros, len)?;
                }
            }
        }
        for il in moe {
            self.flush_table(il, &[], false)?;
        }
        Ok(())
    }
}
