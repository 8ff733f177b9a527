//! The engine thread's scheduler: continuous batching of up to `parallel` sequences over one
//! shared KV cache, fed from a FIFO queue. Each sequence may hold up to `slot_len` positions;
//! its cache rows come in pages from one [`PagePool`] as it grows (lowest free page first) and
//! go back when it ends, so the rows attended stay close to the tokens actually held.
//!
//! Every step runs one forward pass holding one decode token of every generating sequence plus
//! prompt chunks of admitted sequences, up to `n_batch` tokens; the prefill budget goes round
//! robin over the sequences still reading their prompt, so a long prompt cannot stall the
//! others' decoding for more than one micro-batch. Fairness: first come, first admitted; every
//! admitted sequence advances every step.
//!
//! Prompt cache (llama-server's `cache_prompt`): when a sequence ends, its slot keeps the tokens
//! whose rows are written and their pages ([`Kept`]). A new request goes to the idle slot whose
//! kept tokens share the longest prefix with its prompt (at least `Config::similarity` of it;
//! else the least recently used idle slot), takes over the pages of that prefix and evaluates
//! only the rest; at least the prompt's last token is evaluated, for its logits. Cutting a
//! sequence back to a prefix is forgetting the rows above it, which is exact only where the
//! model's per-sequence state is its rows (`BatchModel::seq_layout`); DeepSeek-V4's compressor
//! state is not, so there nothing is kept. Slot actions (`Msg::Slot`: save, restore, erase)
//! run on this thread when their slot is idle, as llama-server defers them.
//!
//! Invariants: the thread never panics on a request (engine errors and panics in a step end the
//! requests of that step with an error event and the loop goes on); a request whose receiver is
//! gone (client disconnected, stop string reached) is dropped at the next step and its slot
//! reused; `Shared::queued` counts the jobs sent but not yet admitted or dropped,
//! `Shared::active` the occupied slots, `Shared::in_flight` both together (jobs sent and not
//! yet ended) and `Shared::kv_tokens` the cache rows the occupied slots hold. The pool has
//! whole pages for `parallel` sequences of `slot_len` positions, so covering a sequence never
//! fails while the model's `kv_rows` is at least [`rows_for`]`(parallel, slot_len)`. A slot's counters
//! drop before its last event is sent, so a client that has seen the end of its request never
//! finds it counted in `/metrics`.
use super::api::{Event, FinishReason, SlotAction, TokenLogprob};
use super::slotfile;
use crate::engine::batch::{rows_for, BatchModel, PagePool, SeqChunk, SeqLayout, KV_PAGE};
use crate::engine::embed::{Pooler, Pooling};
use crate::engine::sampling::{Sampler, SamplerParams};
use crate::engine::snapshot::{ExpertsSnapshot, SlotState};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// What the scheduler needs of a tokenizer.
pub trait Vocab {
    fn is_eog(&self, id: u32) -> bool;
    /// The bytes of `id`; control tokens are empty unless `special`.
    fn piece(&self, id: u32, special: bool) -> Vec<u8>;
}

impl Vocab for Tokenizer {
    fn is_eog(&self, id: u32) -> bool {
        Tokenizer::is_eog(self, id)
    }
    fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        Tokenizer::piece(self, id, special).to_vec()
    }
}

/// A request, tokenized and checked against the context.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplerParams,
    /// At least 1; `prompt.len() + max_tokens <= slot_len`.
    pub max_tokens: usize,
    pub logprobs: Option<usize>,
    pub logit_bias: Vec<(u32, f32)>,
    /// Render control tokens as text.
    pub special: bool,
    /// Send each token's id (`Event::Id`) before its text.
    pub token_ids: bool,
    /// The request's output constraint (`grammar`): masks the logits before each draw and
    /// advances with each drawn token.
    pub grammar: Option<llguidance::Matcher>,
    /// An embedding request, pooled so: the prompt is read (its final normed hidden states
    /// pooled) and the job ends with an [`Event::Embedding`] and a `Done`; nothing is generated.
    pub embed: Option<Pooling>,
    /// Reuse a prefix of the slot's kept cache (llama-server's `cache_prompt`).
    pub cache_prompt: bool,
    /// Run in this slot only (`< parallel`), waiting for it while it is busy.
    pub id_slot: Option<usize>,
    pub events: UnboundedSender<Event>,
}

pub enum Msg {
    /// Boxed: a job (with its grammar matcher) is ~1.5 KB, the other variant a few bytes.
    Job(Box<Job>),
    /// Stop: queued jobs end now, running ones after the grace period.
    Shutdown(Duration),
    /// A slot action, run when slot `id` (`< parallel`) is idle; the answer (llama-server's
    /// JSON) goes to `reply`.
    Slot {
        id: usize,
        action: SlotAction,
        reply: std::sync::mpsc::Sender<Result<serde_json::Value, SlotError>>,
    },
}

/// Why a slot action failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotError {
    /// The request's fault (a file that cannot be restored here, ...): a 400.
    Bad(String),
    /// The model cannot do it (its cache state is not rows): a 501.
    NotSupported(String),
    /// The server's fault (a write that failed, an engine error): a 500.
    Internal(String),
}

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub parallel: usize,
    /// Cache rows per sequence (its context length).
    pub slot_len: usize,
    /// Tokens per forward pass (>= parallel).
    pub n_batch: usize,
    /// Each slot takes cache pages from its own region ([`PagePool::per_slot`]): a sequence's
    /// rows always ascend, which batch-invariant serving needs to give exactly the result alone;
    /// attention then spans up to the highest busy slot's region. Otherwise one shared pool.
    pub pages_per_slot: bool,
    /// The model file's fingerprint ([`slotfile::model_fingerprint`]): slot files carry it,
    /// and only files with this one are restored.
    pub fingerprint: u64,
    /// llama-server's `--slot-prompt-similarity`: a request goes to the idle slot whose kept
    /// tokens share the longest prefix with its prompt when that prefix is at least this
    /// fraction of the prompt; otherwise (and with 0) to the least recently used idle slot.
    pub similarity: f32,
}

/// Counters the HTTP side reads.
#[derive(Default)]
pub struct Shared {
    pub queued: AtomicUsize,
    pub active: AtomicUsize,
    /// Jobs sent and not yet ended (queued or in a slot): what admission compares with
    /// `parallel + max_queue`. The sender increments it; the scheduler decrements it.
    pub in_flight: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    pub generated: AtomicU64,
    pub steps: AtomicU64,
    pub batch_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    /// KV-cache rows held by the occupied slots: the sum of their sequences' forwarded tokens.
    pub kv_tokens: AtomicU64,
    /// (when, tokens generated) of recent steps, for a tok/s gauge.
    pub recent: Mutex<VecDeque<(Instant, usize)>>,
    /// The expert cache's figures after the last step (`None` when the model offloads none).
    pub experts: Mutex<Option<ExpertsSnapshot>>,
    /// Per-slot state for `/slots`, published after each step (one short lock per step).
    pub slots: Mutex<Vec<SlotState>>,
}

/// The window of the tok/s gauge.
pub const RECENT: Duration = Duration::from_secs(10);

impl Shared {
    /// One job sent to the scheduler has ended (or was never sent).
    pub fn end_job(&self) {
        let _ = self
            .in_flight
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// Generated tokens per second over the last [`RECENT`].
    pub fn recent_tok_s(&self) -> f64 {
        let mut r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while r.front().is_some_and(|(t, _)| now - *t > RECENT) {
            r.pop_front();
        }
        let n: usize = r.iter().map(|x| x.1).sum();
        n as f64 / RECENT.as_secs_f64()
    }
}

struct Seq {
    job: Job,
    /// Its slot.
    slot: usize,
    /// Prompt and generated tokens; the last generated one is not in the cache yet.
    all: Vec<u32>,
    n_prompt: usize,
    cached: usize,
    /// Its KV-cache pages (from the scheduler's pool), covering at least `cached` positions.
    pages: Vec<u32>,
    n_gen: usize,
    sampler: Sampler,
    dec: StreamDecoder,
    /// An embedding job's pooled hidden states so far.
    pooler: Option<Pooler>,
}

impl Seq {
    fn new(job: Job, slot: usize) -> Self {
        let mut sampler = Sampler::new(job.sampling.clone());
        for &t in &job.prompt {
            sampler.accept(t);
        }
        Self {
            all: job.prompt.clone(),
            n_prompt: job.prompt.len(),
            cached: 0,
            pages: Vec::new(),
            n_gen: 0,
            sampler,
            dec: StreamDecoder::new(),
            pooler: job.embed.map(Pooler::new),
            job,
            slot,
        }
    }

    fn send(&self, e: Event) {
        let _ = self.job.events.send(e);
    }
}

/// What an idle slot keeps of its last sequence: its tokens whose cache rows are written (the
/// prompt and all generated tokens but the last) and the pages holding them.
#[derive(Default)]
struct Kept {
    tokens: Vec<u32>,
    pages: Vec<u32>,
    /// When the slot last took a job ([`Cache::clock`]): the least recently used idle slot is
    /// the one given to a job that matches no kept prefix.
    last_used: u64,
}

/// The cache pages, and what each idle slot keeps (its prompt cache).
///
/// Invariants: a slot's pages are either its sequence's (busy) or its `kept` ones (idle), never
/// both; a slot never holds more pages than its context needs, so the pool (whole pages for
/// every slot's whole context) always covers a growing sequence. Kept tokens always have their
/// rows written: `kept.tokens.len()` positions of `kept.pages`.
struct Cache {
    pool: PagePool,
    kept: Vec<Kept>,
    clock: u64,
    /// How the model's sequence state is laid out, or why a prefix cannot be reused (then no
    /// slot keeps anything, and slot files are refused).
    layout: Result<SeqLayout, String>,
}

impl Cache {
    /// Forgets slot `i`'s kept cache; returns how many tokens it held.
    fn erase(&mut self, i: usize) -> usize {
        let k = &mut self.kept[i];
        self.pool.release(&mut k.pages);
        std::mem::take(&mut k.tokens).len()
    }

    /// The idle slot `job` runs in: its `id_slot`; else the idle slot whose kept tokens share
    /// the longest prefix with its prompt, if that is at least `similarity` of the prompt
    /// (llama-server's selection by prompt similarity); else the least recently used idle slot
    /// (lowest first among equals). `None`: no slot for it yet.
    fn pick(&self, slots: &[Option<Seq>], job: &Job, similarity: f32) -> Option<usize> {
        let idle = |i: &usize| slots[*i].is_none();
        if let Some(i) = job.id_slot {
            return (i < slots.len() && slots[i].is_none()).then_some(i);
        }
        let reuse = job.cache_prompt && job.embed.is_none() && self.layout.is_ok();
        if reuse && similarity > 0.0 {
            let best = (0..slots.len())
                .filter(idle)
                .map(|i| (common_prefix(&self.kept[i].tokens, &job.prompt), i))
                .max_by_key(|&(n, i)| (n, std::cmp::Reverse(i)));
            if let Some((n, i)) = best {
                if n > 0 && n as f32 >= similarity * job.prompt.len() as f32 {
                    return Some(i);
                }
            }
        }
        (0..slots.len())
            .filter(idle)
            .min_by_key(|&i| (self.kept[i].last_used, i))
    }

    /// Gives slot `i`'s kept pages to `s` (a new sequence there) for the longest prefix of
    /// its prompt the slot kept, at most all of the prompt but its last token (which must be
    /// evaluated for its logits); the pages past that prefix go back to the pool. Returns the
    /// positions reused.
    fn hand_over(&mut self, i: usize, s: &mut Seq) -> usize {
        self.clock += 1;
        let reuse = s.job.cache_prompt && s.job.embed.is_none() && self.layout.is_ok();
        let k = &mut self.kept[i];
        k.last_used = self.clock;
        let n = if reuse {
            common_prefix(&k.tokens, &s.all).min(s.n_prompt.saturating_sub(1))
        } else {
            0
        };
        k.tokens.clear();
        let keep = n.div_ceil(KV_PAGE);
        let mut rest = k.pages.split_off(keep.min(k.pages.len()));
        self.pool.release(&mut rest);
        s.pages = std::mem::take(&mut k.pages);
        s.cached = n;
        n
    }
}

/// How many leading tokens `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Runs the scheduler until shut down (or every sender is gone) and idle.
pub fn run<M: BatchModel, V: Vocab>(
    model: &mut M,
    vocab: &V,
    cfg: Config,
    rx: Receiver<Msg>,
    shared: &Shared,
) {
    let mut slots: Vec<Option<Seq>> = (0..cfg.parallel).map(|_| None).collect();
    let rows = model.kv_rows().min(rows_for(cfg.parallel, cfg.slot_len));
    let pool = if cfg.pages_per_slot {
        PagePool::per_slot(rows, cfg.parallel)
    } else {
        PagePool::new(rows)
    };
    let layout = model.seq_layout();
    if let Err(e) = &layout {
        tracing::info!("no prompt cache: {e}");
    }
    let mut cache = Cache {
        pool,
        kept: (0..cfg.parallel).map(|_| Kept::default()).collect(),
        clock: 0,
        layout,
    };
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut actions: Vec<(usize, SlotAction, SlotReply)> = Vec::new();
    let mut deadline: Option<Instant> = None;
    let mut disconnected = false;
    let mut rr = 0usize;
    let shutting = |j: Job| {
        shared.queued.fetch_sub(1, Relaxed);
        shared.end_job();
        let _ = j
            .events
            .send(Event::Error("the server is shutting down".into()));
    };
    loop {
        // Intake: block only when there is nothing to do.
        let idle = slots.iter().all(Option::is_none) && waiting.is_empty() && actions.is_empty();
        if idle && (deadline.is_some() || disconnected) {
            break;
        }
        let mut msgs = Vec::new();
        if idle {
            match rx.recv() {
                Ok(m) => msgs.push(m),
                Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(m) => msgs.push(m),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        for m in msgs {
            match m {
                Msg::Job(j) if deadline.is_some() => shutting(*j),
                Msg::Job(j) => waiting.push_back(*j),
                Msg::Shutdown(grace) => {
                    deadline = Some(Instant::now() + grace);
                    waiting.drain(..).for_each(shutting);
                }
                Msg::Slot { id, action, reply } if id < slots.len() => {
                    actions.push((id, action, reply))
                }
                Msg::Slot { id, reply, .. } => {
                    let _ = reply.send(Err(SlotError::Bad(format!(
                        "Invalid slot ID {id}: the server has {} slots",
                        slots.len()
                    ))));
                }
            }
        }
        // Slot actions whose slot is idle (a busy slot's wait until its request ends, as
        // llama-server defers them).
        let mut i = 0;
        while i < actions.len() {
            if slots[actions[i].0].is_none() {
                let (id, action, reply) = actions.remove(i);
                let done = slot_action(model, cfg, &mut cache, id, action);
                // Published before the answer: a client that reads /slots right after an
                // erase or restore must find the slot's new state there.
                publish(&slots, &cache, cfg, shared);
                let _ = reply.send(done);
            } else {
                i += 1;
            }
        }
        // Cancellations, and the end of the shutdown grace period.
        let over = deadline.is_some_and(|d| Instant::now() >= d);
        for slot in slots.iter_mut() {
            if slot.as_ref().is_some_and(|s| s.job.events.is_closed()) {
                vacate(slot, &mut cache, shared, None);
                shared.cancelled.fetch_add(1, Relaxed);
            } else if over {
                vacate(
                    slot,
                    &mut cache,
                    shared,
                    Some(Event::Error(
                        "the server shut down before the request finished".into(),
                    )),
                );
            }
        }
        waiting.retain(|j| {
            let keep = !j.events.is_closed();
            if !keep {
                shared.queued.fetch_sub(1, Relaxed);
                shared.end_job();
                shared.cancelled.fetch_add(1, Relaxed);
            }
            keep
        });
        // Admission, first come first served, each job to the idle slot `Cache::pick` names;
        // a job asking for a busy slot (`id_slot`) waits without holding up the others.
        let mut k = 0;
        while k < waiting.len() && slots.iter().any(Option::is_none) {
            let Some(i) = cache.pick(&slots, &waiting[k], cfg.similarity) else {
                k += 1;
                continue;
            };
            let job = waiting.remove(k).expect("k < len");
            shared.queued.fetch_sub(1, Relaxed);
            let mut s = Seq::new(job, i);
            let reused = cache.hand_over(i, &mut s);
            // As llama-server's prompt-token counters: the tokens evaluated.
            shared
                .prompt_tokens
                .fetch_add((s.n_prompt - reused) as u64, Relaxed);
            shared.kv_tokens.fetch_add(reused as u64, Relaxed);
            s.send(Event::Started {
                slot: i,
                cached: reused,
            });
            slots[i] = Some(s);
        }
        shared.active.store(slots.iter().flatten().count(), Relaxed);
        step(model, vocab, cfg, &mut slots, &mut cache, &mut rr, shared);
        publish(&slots, &cache, cfg, shared);
    }
    for (_, _, reply) in actions {
        let _ = reply.send(Err(SlotError::Internal(
            "the server shut down before the slot was free".into(),
        )));
    }
    shared.active.store(0, Relaxed);
    publish(&slots, &cache, cfg, shared);
    shared.kv_tokens.store(0, Relaxed);
}

type SlotReply = std::sync::mpsc::Sender<Result<serde_json::Value, SlotError>>;

/// Runs `action` on idle slot `id`: llama-server's answer, or why not.
fn slot_action<M: BatchModel>(
    model: &mut M,
    cfg: Config,
    cache: &mut Cache,
    id: usize,
    action: SlotAction,
) -> Result<serde_json::Value, SlotError> {
    let t0 = Instant::now();
    let ms = || t0.elapsed().as_secs_f64() * 1e3;
    if let SlotAction::Erase = action {
        let n = cache.erase(id);
        return Ok(serde_json::json!({"id_slot": id, "n_erased": n}));
    }
    let layout = cache.layout.clone().map_err(SlotError::NotSupported)?;
    let expect = slotfile::Expect {
        model: cfg.fingerprint,
        layout: slotfile::layout_hash(&layout.desc),
        row_bytes: layout.row_bytes,
        max_tokens: cfg.slot_len,
        n_vocab: model.n_vocab(),
    };
    match action {
        SlotAction::Erase => unreachable!("answered above"),
        SlotAction::Save { path, filename } => {
            let k = &cache.kept[id];
            let state = model
                .read_seq(&k.pages, k.tokens.len())
                .map_err(|e| SlotError::Internal(format!("reading slot {id}'s cache: {e}")))?;
            let bytes = slotfile::encode(&expect, &k.tokens, &state);
            slotfile::write(&path, &bytes)
                .map_err(|e| SlotError::Internal(format!("writing slot file {filename}: {e}")))?;
            Ok(serde_json::json!({
                "id_slot": id,
                "filename": filename,
                "n_saved": k.tokens.len(),
                "n_written": bytes.len(),
                "timings": {"save_ms": ms()},
            }))
        }
        SlotAction::Restore { path, filename } => {
            let bytes = std::fs::read(&path)
                .map_err(|e| SlotError::Bad(format!("cannot read slot file {filename}: {e}")))?;
            let (tokens, state) =
                slotfile::decode(&filename, &bytes, &expect).map_err(SlotError::Bad)?;
            cache.erase(id);
            let k = &mut cache.kept[id];
            if !cache.pool.cover(id, &mut k.pages, tokens.len()) {
                return Err(SlotError::Internal(format!(
                    "no free cache page for slot {id}'s {} tokens",
                    tokens.len()
                )));
            }
            if let Err(e) = model.write_seq(&k.pages, tokens.len(), &state) {
                cache.erase(id);
                return Err(SlotError::Internal(format!(
                    "restoring slot file {filename}: {e}"
                )));
            }
            k.tokens = tokens;
            Ok(serde_json::json!({
                "id_slot": id,
                "filename": filename,
                "n_restored": k.tokens.len(),
                "n_read": bytes.len(),
                "timings": {"restore_ms": ms()},
            }))
        }
    }
}

/// Publishes the slots' state for `/slots`.
fn publish(slots: &[Option<Seq>], cache: &Cache, cfg: Config, shared: &Shared) {
    let view = slots
        .iter()
        .enumerate()
        .map(|(id, s)| SlotState {
            id,
            is_processing: s.is_some(),
            n_ctx: cfg.slot_len,
            n_prompt_tokens: s.as_ref().map_or(0, |s| s.n_prompt),
            n_decoded: s.as_ref().map_or(0, |s| s.n_gen),
            n_cached: s.as_ref().map_or(cache.kept[id].tokens.len(), |s| s.cached),
        })
        .collect();
    *shared.slots.lock().unwrap_or_else(|p| p.into_inner()) = view;
}

/// Frees `slot` (if occupied): the counters first, then `last` goes out. The slot keeps the
/// sequence's written tokens and their pages (its prompt cache) unless it ends with an error
/// (its rows may be incomplete) or was an embedding job, or the model cannot reuse a prefix.
fn vacate(slot: &mut Option<Seq>, cache: &mut Cache, shared: &Shared, last: Option<Event>) {
    if let Some(mut s) = slot.take() {
        let keep = cache.layout.is_ok()
            && s.pooler.is_none()
            && s.job.embed.is_none()
            && !matches!(last, Some(Event::Error(_)));
        let k = &mut cache.kept[s.slot];
        cache.pool.release(&mut k.pages);
        k.tokens.clear();
        if keep {
            s.all.truncate(s.cached);
            k.tokens = std::mem::take(&mut s.all);
            k.pages = std::mem::take(&mut s.pages);
        } else {
            cache.pool.release(&mut s.pages);
        }
        shared.active.fetch_sub(1, Relaxed);
        shared.kv_tokens.fetch_sub(s.cached as u64, Relaxed);
        shared.end_job();
        if let Some(e) = last {
            s.send(e);
        }
    }
}

/// One forward pass over the active sequences, then sampling for those that got logits.
fn step<M: BatchModel, V: Vocab>(
    model: &mut M,
    vocab: &V,
    cfg: Config,
    slots: &mut [Option<Seq>],
    cache: &mut Cache,
    rr: &mut usize,
    shared: &Shared,
) {
    // (slot, tokens taken, wants logits)
    let mut plan: Vec<(usize, usize, bool)> = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        if let Some(s) = s.as_ref().filter(|s| s.cached >= s.n_prompt) {
            plan.push((i, s.all.len() - s.cached, true));
        }
    }
    let mut budget = cfg.n_batch.saturating_sub(plan.len());
    let n = slots.len();
    for k in 0..n {
        let i = (*rr + k) % n;
        let Some(s) = slots[i].as_ref().filter(|s| s.cached < s.n_prompt) else {
            continue;
        };
        let take = (s.n_prompt - s.cached).min(budget);
        if take > 0 {
            plan.push((i, take, s.cached + take == s.n_prompt));
            budget -= take;
        }
    }
    *rr = (*rr + 1) % n.max(1);
    if plan.is_empty() {
        return;
    }
    // Pages for what this step adds (the pool holds enough for every slot's whole context).
    for &(i, take, _) in &plan {
        let s = slots[i].as_mut().expect("planned slots are active");
        if !cache.pool.cover(i, &mut s.pages, s.cached + take) {
            return fail(
                slots,
                &plan,
                cache,
                shared,
                "the KV cache has no free page left",
            );
        }
    }
    // Embedding jobs read their prompt in a pass of their own (hidden states, not logits).
    let (embd, plan): (Vec<_>, Vec<_>) = plan
        .into_iter()
        .partition(|&(i, _, _)| slots[i].as_ref().is_some_and(|s| s.pooler.is_some()));
    if !embd.is_empty() {
        if let Some(rows) = pass(model, slots, &embd, cache, shared, true) {
            pool_rows(slots, &embd, rows, cache, shared);
        }
    }
    if plan.is_empty() {
        return;
    }
    let Some(logits) = pass(model, slots, &plan, cache, shared, false) else {
        return;
    };
    let mut generated = 0;
    let mut rows = logits.into_iter();
    for &(i, take, wants) in &plan {
        let slot = &mut slots[i];
        let s = slot.as_mut().expect("planned slots are active");
        s.cached += take;
        shared.kv_tokens.fetch_add(take as u64, Relaxed);
        if !wants {
            continue;
        }
        let Some(l) = rows.next() else {
            let e = Event::Error("the engine returned too few logits".into());
            vacate(slot, cache, shared, Some(e));
            continue;
        };
        let before = s.n_gen;
        let finished = sample(s, l, vocab, cfg.slot_len);
        generated += s.n_gen - before; // an end-of-generation token is not counted
                                       // Counted before the request's end is sent: a client that reads /metrics right after
                                       // its response must find its tokens there.
        shared
            .generated
            .fetch_add((s.n_gen - before) as u64, Relaxed);
        match finished {
            None => {}
            Some(End::Finish(reason)) => {
                let tail = s.dec.finish();
                vacate(slot, cache, shared, Some(Event::Done { reason, tail }));
            }
            Some(End::Fail(e)) => vacate(slot, cache, shared, Some(Event::Error(e))),
        }
    }
    let mut r = shared.recent.lock().unwrap_or_else(|e| e.into_inner());
    r.push_back((Instant::now(), generated));
    if r.len() > 100_000 {
        r.pop_front();
    }
}

/// One forward pass over `plan`'s chunks: the logits of the chunks that want them, or (`embd`)
/// the final normed hidden state of every token. On failure the plan's requests end with the
/// error and `None` comes back.
fn pass<M: BatchModel>(
    model: &mut M,
    slots: &mut [Option<Seq>],
    plan: &[(usize, usize, bool)],
    cache: &mut Cache,
    shared: &Shared,
    embd: bool,
) -> Option<Vec<Vec<f32>>> {
    let result = {
        let chunks: Vec<SeqChunk<'_>> = plan
            .iter()
            .map(|&(i, take, logits)| {
                let s = slots[i].as_ref().expect("planned slots are active");
                SeqChunk {
                    pages: &s.pages,
                    pos: s.cached,
                    tokens: &s.all[s.cached..s.cached + take],
                    logits,
                    slot: i,
                }
            })
            .collect();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if embd {
                model.forward_batch_embd(&chunks)
            } else {
                model.forward_batch(&chunks)
            }
        }))
    };
    let out = match result {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            fail(
                slots,
                plan,
                cache,
                shared,
                &format!("the engine failed: {e}"),
            );
            return None;
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            fail(
                slots,
                plan,
                cache,
                shared,
                &format!("the engine panicked: {msg}"),
            );
            return None;
        }
    };
    if let Some(x) = model.experts_snapshot() {
        *shared.experts.lock().unwrap_or_else(|e| e.into_inner()) = Some(x);
    }
    shared.steps.fetch_add(1, Relaxed);
    let n_tokens: usize = plan.iter().map(|p| p.1).sum();
    shared.batch_tokens.fetch_add(n_tokens as u64, Relaxed);
    Some(out)
}

/// Hands each embedding job of `plan` its tokens' hidden states (`rows`, token by token in plan
/// order); a job whose prompt is all read ends with its embedding.
fn pool_rows(
    slots: &mut [Option<Seq>],
    plan: &[(usize, usize, bool)],
    rows: Vec<Vec<f32>>,
    cache: &mut Cache,
    shared: &Shared,
) {
    let mut rows = rows.into_iter();
    for &(i, take, _) in plan {
        let slot = &mut slots[i];
        let s = slot.as_mut().expect("planned slots are active");
        let got: Vec<Vec<f32>> = rows.by_ref().take(take).collect();
        if got.len() < take {
            let e = Event::Error("the engine returned too few hidden states".into());
            vacate(slot, cache, shared, Some(e));
            continue;
        }
        s.cached += take;
        shared.kv_tokens.fetch_add(take as u64, Relaxed);
        let Some(p) = s.pooler.as_mut() else {
            continue;
        };
        p.push(got);
        if s.cached == s.n_prompt {
            let embedding = s.pooler.take().map(Pooler::finish).unwrap_or_default();
            s.send(Event::Embedding(embedding));
            let done = Event::Done {
                reason: FinishReason::Stop,
                tail: String::new(),
            };
            vacate(slot, cache, shared, Some(done));
        }
    }
}

/// Ends the requests of a failed step.
fn fail(
    slots: &mut [Option<Seq>],
    plan: &[(usize, usize, bool)],
    cache: &mut Cache,
    shared: &Shared,
    msg: &str,
) {
    tracing::error!("{msg}");
    for &(i, _, _) in plan {
        vacate(
            &mut slots[i],
            cache,
            shared,
            Some(Event::Error(msg.to_string())),
        );
    }
}

/// How a sequence ends.
enum End {
    Finish(FinishReason),
    /// The constraint failed (an error event ends the request).
    Fail(String),
}

/// Samples the next token of `s` from `logits`, emits it, and says whether `s` is finished.
fn sample<V: Vocab>(s: &mut Seq, logits: Vec<f32>, vocab: &V, slot_len: usize) -> Option<End> {
    let masked;
    let logits_in = if s.job.logit_bias.is_empty() && s.job.grammar.is_none() {
        &logits
    } else {
        let mut l = logits.clone();
        for &(id, b) in &s.job.logit_bias {
            if let Some(x) = l.get_mut(id as usize) {
                *x += b;
            }
        }
        // After the bias: a bias cannot bring back a token the grammar forbids.
        if let Some(m) = s.job.grammar.as_mut() {
            if let Err(e) = mask(m, &mut l) {
                return Some(End::Fail(e));
            }
        }
        masked = l;
        &masked
    };
    let next = s.sampler.sample(logits_in);
    if let Some(m) = s.job.grammar.as_mut() {
        if !vocab.is_eog(next) {
            if let Err(e) = m.consume_token(next) {
                return Some(End::Fail(format!("the grammar refused a token: {e}")));
            }
        }
    }
    if vocab.is_eog(next) {
        return Some(End::Finish(FinishReason::Stop));
    }
    s.sampler.accept(next);
    s.all.push(next);
    s.n_gen += 1;
    if s.job.token_ids {
        s.send(Event::Id(next));
    }
    let bytes = vocab.piece(next, s.job.special);
    let text = s.dec.push(&bytes);
    let logprob = s
        .job
        .logprobs
        .map(|n| logprob(&logits, next, n, vocab, s.job.special));
    s.send(Event::Token { text, logprob });
    // The grammar is complete and allows nothing more: the output is finished.
    if s.job.grammar.as_ref().is_some_and(|m| m.is_stopped()) {
        return Some(End::Finish(FinishReason::Stop));
    }
    (s.n_gen >= s.job.max_tokens || s.all.len() > slot_len)
        .then_some(End::Finish(FinishReason::Length))
}

/// Sets the logits of the tokens `m` forbids now to -inf (ids past the trie's vocabulary, the
/// model's padding, included). End-of-generation tokens are allowed only where the grammar
/// accepts.
fn mask(m: &mut llguidance::Matcher, logits: &mut [f32]) -> Result<(), String> {
    let allowed = m
        .compute_mask()
        .map_err(|e| format!("the grammar failed: {e}"))?;
    let n = allowed.len().min(logits.len());
    let mut any = false;
    for (id, x) in logits.iter_mut().enumerate() {
        if id < n && allowed.is_allowed(id as u32) {
            any |= *x > f32::NEG_INFINITY;
        } else {
            *x = f32::NEG_INFINITY;
        }
    }
    if any {
        Ok(())
    } else {
        Err("the grammar allows no token here".into())
    }
}

/// Log-probability of `id` under the model's distribution (raw logits, temperature 1), with
/// the `n` most likely tokens.
fn logprob<V: Vocab>(logits: &[f32], id: u32, n: usize, vocab: &V, special: bool) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    let lp = |i: usize| logits.get(i).map_or(f32::NEG_INFINITY, |&x| x - lse);
    let mut top = Vec::new();
    if n > 0 {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = n.min(idx.len());
        let cmp = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        if k < idx.len() {
            idx.select_nth_unstable_by(k, cmp);
        }
        idx.truncate(k);
        idx.sort_by(cmp);
        top = idx
            .into_iter()
            .map(|i| (vocab.piece(i as u32, special), lp(i)))
            .collect();
    }
    TokenLogprob {
        bytes: vocab.piece(id, special),
        logprob: lp(id as usize),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;

    /// A model whose "KV cache" is the token of each row and whose logits point at a hash of
    /// the sequence's rows 0..=pos: any slip in slots, positions or rows changes the output.
    struct Fake {
        rows: Vec<Option<u32>>,
        steps: Vec<usize>,
        /// Whether a sequence's state is its rows (else: no prompt cache, as DeepSeek-V4).
        rows_state: bool,
        /// Slept in every pass (a slow model keeps a slot busy for a while).
        delay: Duration,
    }

    impl Fake {
        /// A cache of exactly the rows the scheduler's pool needs.
        fn new(cfg: Config) -> Self {
            Self {
                rows: vec![None; rows_for(cfg.parallel, cfg.slot_len)],
                steps: Vec::new(),
                rows_state: true,
                delay: Duration::ZERO,
            }
        }
    }

    const N_VOCAB: usize = 64;

    impl BatchModel for Fake {
        fn kv_rows(&self) -> usize {
            self.rows.len()
        }
        fn n_vocab(&self) -> usize {
            N_VOCAB
        }
        fn forward_batch(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
            let mut out = Vec::new();
            std::thread::sleep(self.delay);
            self.steps.push(chunks.iter().map(|c| c.tokens.len()).sum());
            for c in chunks {
                for (t, &id) in c.tokens.iter().enumerate() {
                    self.rows[c.row(c.pos + t)] = Some(id);
                }
                if c.logits {
                    let end = c.pos + c.tokens.len();
                    let mut h = 0xcbf29ce484222325u64;
                    for j in 0..end {
                        let id = self.rows[c.row(j)].expect("every row up to pos was written");
                        h = (h ^ id as u64).wrapping_mul(0x100000001b3);
                    }
                    let mut l = vec![0.0; N_VOCAB];
                    l[1 + (h % (N_VOCAB as u64 - 1)) as usize] = 1.0;
                    out.push(l);
                }
            }
            Ok(out)
        }
        fn seq_layout(&self) -> Result<SeqLayout, String> {
            match self.rows_state {
                true => Ok(SeqLayout {
                    row_bytes: 4,
                    desc: "fake token rows".into(),
                }),
                false => Err("the fake keeps state besides its rows".into()),
            }
        }
        fn read_seq(&self, pages: &[u32], n: usize) -> Result<Vec<u8>, EngineError> {
            let c = SeqChunk {
                pages,
                pos: 0,
                tokens: &[],
                logits: false,
                slot: 0,
            };
            Ok((0..n)
                .flat_map(|p| self.rows[c.row(p)].expect("a written row").to_le_bytes())
                .collect())
        }
        fn write_seq(&mut self, pages: &[u32], n: usize, data: &[u8]) -> Result<(), EngineError> {
            let c = SeqChunk {
                pages,
                pos: 0,
                tokens: &[],
                logits: false,
                slot: 0,
            };
            assert_eq!(data.len(), 4 * n);
            for (p, b) in data.chunks_exact(4).enumerate() {
                self.rows[c.row(p)] = Some(u32::from_le_bytes(b.try_into().unwrap()));
            }
            Ok(())
        }
    }

    struct Names;
    impl Vocab for Names {
        fn is_eog(&self, id: u32) -> bool {
            id == 0
        }
        fn piece(&self, id: u32, _special: bool) -> Vec<u8> {
            format!("<{id}>").into_bytes()
        }
    }

    fn job(i: u32, tx: UnboundedSender<Event>) -> Job {
        job_of(i, 3 + 5 * i, tx)
    }

    /// Job `i` with a prompt of `len` tokens.
    fn job_of(i: u32, len: u32, tx: UnboundedSender<Event>) -> Job {
        Job {
            prompt: (0..len).map(|t| 1 + (t * 7 + i) % 60).collect(),
            sampling: SamplerParams {
                temperature: 0.0,
                ..Default::default()
            },
            max_tokens: 4 + i as usize,
            logprobs: None,
            logit_bias: Vec::new(),
            special: false,
            token_ids: false,
            grammar: None,
            embed: None,
            cache_prompt: true,
            id_slot: None,
            events: tx,
        }
    }

    /// What `LocalEngine::submit` does: count the job, then send it.
    fn send(shared: &Shared, tx: &std::sync::mpsc::Sender<Msg>, j: Job) {
        shared.in_flight.fetch_add(1, Relaxed);
        shared.queued.fetch_add(1, Relaxed);
        tx.send(Msg::Job(Box::new(j))).unwrap();
    }

    /// Runs `jobs` (sent at once) through a scheduler; returns each job's text.
    fn serve(ids: &[u32], parallel: usize, n_batch: usize) -> (Vec<String>, Vec<usize>) {
        serve_len(ids, |i| 3 + 5 * i, 64, parallel, n_batch, false)
    }

    /// [`serve`] with job `i`'s prompt `len(i)` tokens long and contexts of `slot_len`.
    fn serve_len(
        ids: &[u32],
        len: impl Fn(u32) -> u32,
        slot_len: usize,
        parallel: usize,
        n_batch: usize,
        pages_per_slot: bool,
    ) -> (Vec<String>, Vec<usize>) {
        let cfg = Config {
            parallel,
            slot_len,
            n_batch,
            pages_per_slot,
            fingerprint: 1,
            similarity: 0.1,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let mut outs = Vec::new();
        let shared = Shared::default();
        for &i in ids {
            let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
            send(&shared, &tx, job_of(i, len(i), etx));
            outs.push(erx);
        }
        drop(tx);
        let mut model = Fake::new(cfg);
        run(&mut model, &Names, cfg, rx, &shared);
        assert_eq!(shared.queued.load(Relaxed), 0);
        assert_eq!(shared.in_flight.load(Relaxed), 0);
        let texts = outs
            .into_iter()
            .map(|mut rx| {
                let mut s = String::new();
                while let Ok(e) = rx.try_recv() {
                    match e {
                        Event::Token { text, .. } => s.push_str(&text),
                        Event::Id(_) => {}
                        Event::Done { .. } => s.push('|'),
                        Event::Error(e) => panic!("{e}"),
                        Event::Embedding(_) => panic!("an embedding for a generation"),
                        Event::Started { .. } => {}
                    }
                }
                s
            })
            .collect();
        (texts, model.steps)
    }

    #[test]
    fn batched_equals_alone_and_budget_holds() {
        let ids: Vec<u32> = (0..7).collect();
        let alone: Vec<String> = ids
            .iter()
            .map(|&i| serve(&[i], 1, 512).0.remove(0))
            .collect();
        // 3 slots for 7 jobs (slots are reused), and a 8-token budget that splits prompts.
        let (together, steps) = serve(&ids, 3, 8);
        assert_eq!(together, alone);
        assert!(
            alone.iter().all(|s| s.ends_with('|') && s.len() > 4),
            "{alone:?}"
        );
        assert!(steps.iter().all(|&n| n <= 8), "{steps:?}");
    }

    /// Prompts longer than a page, prefilled a few tokens at a time side by side: each
    /// sequence's pages interleave with the others' (e.g. [0, 3], [1, 4]) and pages of ended
    /// sequences are reused by later ones; any slip in the page bookkeeping changes a text.
    #[test]
    fn sequences_spread_over_interleaved_pages_equal_alone() {
        let len = |i: u32| 200 + 40 * i;
        let ids: Vec<u32> = (0..5).collect();
        let alone: Vec<String> = ids
            .iter()
            .map(|&i| serve_len(&[i], len, 600, 1, 4096, false).0.remove(0))
            .collect();
        for per_slot in [false, true] {
            let (together, _) = serve_len(&ids, len, 600, 3, 24, per_slot);
            assert_eq!(together, alone, "pages per slot: {per_slot}");
        }
    }

    #[test]
    fn dropped_receivers_free_their_slot() {
        let cfg = Config {
            parallel: 1,
            slot_len: 64,
            n_batch: 16,
            pages_per_slot: false,
            fingerprint: 1,
            similarity: 0.1,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = Shared::default();
        let (gone, gone_rx) = tokio::sync::mpsc::unbounded_channel();
        drop(gone_rx);
        let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
        for j in [job(3, gone), job(1, etx)] {
            send(&shared, &tx, j);
        }
        drop(tx);
        let mut model = Fake::new(cfg);
        run(&mut model, &Names, cfg, rx, &shared);
        assert_eq!(shared.cancelled.load(Relaxed), 1);
        let mut n = 0;
        while let Ok(e) = erx.try_recv() {
            n += 1;
            assert!(!matches!(e, Event::Error(_)), "{e:?}");
        }
        assert!(n >= 2, "the second job ran");
    }

    #[test]
    fn shutdown_ends_queued_jobs_with_an_error() {
        let cfg = Config {
            parallel: 1,
            slot_len: 64,
            n_batch: 16,
            pages_per_slot: false,
            fingerprint: 1,
            similarity: 0.1,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = Shared::default();
        let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
        send(&shared, &tx, job(2, etx));
        tx.send(Msg::Shutdown(Duration::from_secs(60))).unwrap();
        let mut model = Fake::new(cfg);
        run(&mut model, &Names, cfg, rx, &shared);
        assert_eq!(shared.queued.load(Relaxed), 0);
        assert_eq!(shared.in_flight.load(Relaxed), 0);
        assert!(matches!(erx.try_recv(), Ok(Event::Error(e)) if e.contains("shutting down")));
        assert!(model.steps.is_empty());
    }

    /// The scheduler idles (blocked on its channel) after a request ends; the counters must
    /// not keep the request: once its last event is out, `active` and `in_flight` are 0.
    #[test]
    fn counters_drop_before_the_last_event() {
        let cfg = Config {
            parallel: 2,
            slot_len: 64,
            n_batch: 16,
            pages_per_slot: false,
            fingerprint: 1,
            similarity: 0.1,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = std::sync::Arc::new(Shared::default());
        let worker = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut model = Fake::new(cfg);
                run(&mut model, &Names, cfg, rx, &shared);
            })
        };
        for round in 0..3 {
            let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
            send(&shared, &tx, job(round, etx));
            loop {
                match erx.blocking_recv() {
                    Some(Event::Token { .. } | Event::Started { .. }) => {}
                    Some(Event::Done { .. }) => break,
                    e => panic!("round {round}: {e:?}"),
                }
            }
            assert_eq!(shared.active.load(Relaxed), 0, "round {round}");
            assert_eq!(shared.in_flight.load(Relaxed), 0, "round {round}");
            assert_eq!(shared.queued.load(Relaxed), 0, "round {round}");
            assert_eq!(shared.kv_tokens.load(Relaxed), 0, "round {round}");
        }
        drop(tx);
        worker.join().unwrap();
    }

    /// A scheduler on its own thread over a [`Fake`], fed one request at a time.
    struct Live {
        tx: Option<std::sync::mpsc::Sender<Msg>>,
        shared: std::sync::Arc<Shared>,
        worker: Option<std::thread::JoinHandle<()>>,
    }

    /// What a request got: its slot, the prompt tokens reused, its text.
    #[derive(Debug, PartialEq)]
    struct Got {
        slot: usize,
        cached: usize,
        text: String,
    }

    impl Live {
        fn start(cfg: Config, rows_state: bool) -> Self {
            Self::slow(cfg, rows_state, Duration::ZERO)
        }

        fn slow(cfg: Config, rows_state: bool, delay: Duration) -> Self {
            let (tx, rx) = std::sync::mpsc::channel();
            let shared = std::sync::Arc::new(Shared::default());
            let worker = {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let mut model = Fake::new(cfg);
                    model.rows_state = rows_state;
                    model.delay = delay;
                    run(&mut model, &Names, cfg, rx, &shared);
                })
            };
            Live {
                tx: Some(tx),
                shared,
                worker: Some(worker),
            }
        }

        fn tx(&self) -> &std::sync::mpsc::Sender<Msg> {
            self.tx.as_ref().expect("running")
        }

        /// Runs `prompt` (greedy, 5 tokens) to its end.
        fn ask(&self, prompt: &[u32], cache_prompt: bool, id_slot: Option<usize>) -> Got {
            let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
            let mut j = job_of(0, 1, etx);
            j.prompt = prompt.to_vec();
            j.max_tokens = 5;
            j.cache_prompt = cache_prompt;
            j.id_slot = id_slot;
            send(&self.shared, self.tx(), j);
            let mut got = Got {
                slot: usize::MAX,
                cached: usize::MAX,
                text: String::new(),
            };
            loop {
                match erx.blocking_recv() {
                    Some(Event::Started { slot, cached }) => {
                        assert_eq!(got.slot, usize::MAX, "Started comes once, first");
                        (got.slot, got.cached) = (slot, cached);
                    }
                    Some(Event::Token { text, .. }) => got.text.push_str(&text),
                    Some(Event::Done { .. }) => break,
                    e => panic!("{e:?}"),
                }
            }
            got
        }

        fn slot(&self, id: usize, action: SlotAction) -> Result<serde_json::Value, SlotError> {
            let (reply, answer) = std::sync::mpsc::channel();
            self.tx().send(Msg::Slot { id, action, reply }).unwrap();
            answer.recv().unwrap()
        }
    }

    impl Drop for Live {
        fn drop(&mut self) {
            self.tx = None;
            if let Some(w) = self.worker.take() {
                let _ = w.join();
            }
        }
    }

    fn live_cfg(parallel: usize) -> Config {
        Config {
            parallel,
            slot_len: 1024,
            n_batch: 64,
            pages_per_slot: false,
            fingerprint: 1,
            similarity: 0.1,
        }
    }

    /// `n` tokens from `seed` (ids 1..61; 0 is the end token).
    fn toks(seed: u32, n: u32) -> Vec<u32> {
        (0..n)
            .map(|t| 1 + (t * 13 + seed * 7 + t / 5) % 60)
            .collect()
    }

    /// A prompt sharing a prefix of a slot's kept tokens evaluates only the rest, and its output
    /// is exactly a fresh server's (the fake's logits hash every row up to the position, so a
    /// stale, shifted or foreign row changes them). The prefix spans pages (300 > `KV_PAGE`).
    #[test]
    fn kept_prefix_is_reused_and_output_equals_fresh() {
        let p1 = toks(1, 300);
        let p2: Vec<u32> = p1[..280].iter().copied().chain(toks(9, 30)).collect();
        let fresh = |p: &[u32]| Live::start(live_cfg(2), true).ask(p, true, None);
        let live = Live::start(live_cfg(2), true);
        let a = live.ask(&p1, true, None);
        assert_eq!((a.slot, a.cached), (0, 0));
        let b = live.ask(&p2, true, None);
        assert_eq!(
            (b.slot, b.cached),
            (0, 280),
            "same slot, the shared prefix reused"
        );
        assert_eq!(b.text, fresh(&p2).text);
        assert_eq!(
            live.shared.prompt_tokens.load(Relaxed),
            300 + 30,
            "prompt tokens count what was evaluated"
        );
        // The same prompt again: all but its last token reused (it must give logits).
        let c = live.ask(&p2, true, None);
        assert_eq!((c.slot, c.cached, &c.text), (0, p2.len() - 1, &b.text));
        // The next chat turn: the prompt and the answer so far, then more; everything the slot
        // wrote is reused (the prompt and the answer's tokens but its last, never evaluated).
        let answer: Vec<u32> = c
            .text
            .trim_matches(|ch| ch == '<' || ch == '>')
            .split("><")
            .map(|t| t.parse().unwrap())
            .collect();
        let p3: Vec<u32> = p2
            .iter()
            .chain(&answer)
            .copied()
            .chain(toks(4, 7))
            .collect();
        let d = live.ask(&p3, true, None);
        assert_eq!(d.cached, p2.len() + answer.len() - 1);
        assert_eq!(d.text, fresh(&p3).text);
        // cache_prompt false: nothing reused, the same output.
        let e = live.ask(&p3, false, None);
        assert_eq!((e.cached, &e.text), (0, &d.text));
        assert_eq!(live.shared.kv_tokens.load(Relaxed), 0, "idle: no busy rows");
    }

    /// Slot selection as llama-server's: the idle slot with the longest shared prefix (at least
    /// `similarity` of the prompt), else the least recently used; `id_slot` pins a slot.
    #[test]
    fn slots_are_picked_by_prompt_similarity_then_lru() {
        let live = Live::start(live_cfg(2), true);
        let (pa, pb) = (toks(1, 40), toks(2, 40));
        assert_eq!(live.ask(&pa, true, None).slot, 0);
        assert_eq!(live.ask(&pb, true, None).slot, 1, "least recently used");
        let pa2: Vec<u32> = pa[..30].iter().copied().chain(toks(3, 10)).collect();
        assert_eq!(live.ask(&pa2, true, None), {
            let fresh = Live::start(live_cfg(2), true).ask(&pa2, true, None);
            Got {
                slot: 0,
                cached: 30,
                text: fresh.text,
            }
        });
        let pb2: Vec<u32> = pb[..35].iter().copied().chain(toks(5, 10)).collect();
        let g = live.ask(&pb2, true, None);
        assert_eq!((g.slot, g.cached), (1, 35));
        // Below the similarity threshold (2 of 40 tokens < 0.1): the least recently used slot.
        let pc: Vec<u32> = pa2[..2].iter().copied().chain(toks(6, 38)).collect();
        let g = live.ask(&pc, true, None);
        assert_eq!(
            (g.slot, g.cached),
            (0, 2),
            "LRU slot 0, which shares 2 tokens"
        );
        // Pinned: slot 1 (holding pb2) for a prompt sharing nothing with it.
        let g = live.ask(&pa2, true, Some(1));
        assert_eq!((g.slot, g.cached), (1, 0));
    }

    /// A model whose sequence state is not its rows (DeepSeek-V4) keeps nothing: every prompt
    /// is evaluated whole, and slot files are refused as not supported.
    #[test]
    fn no_prompt_cache_where_state_is_not_rows() {
        let live = Live::start(live_cfg(1), false);
        let p = toks(1, 50);
        let first = live.ask(&p, true, None);
        let again = live.ask(&p, true, None);
        assert_eq!((again.cached, &again.text), (0, &first.text));
        let dir = std::env::temp_dir().join(format!("pmoe-slot-nr-{}", std::process::id()));
        let save = SlotAction::Save {
            path: dir.join("x.bin"),
            filename: "x.bin".into(),
        };
        assert!(matches!(
            live.slot(0, save),
            Err(SlotError::NotSupported(_))
        ));
    }

    /// Save, erase, restore (into the same slot and into another): the restored prefix is
    /// reused and the output is a fresh server's; bad files are refused naming the file; an
    /// action on a busy slot waits for its request to end.
    #[test]
    fn slot_save_erase_restore() {
        let dir = std::env::temp_dir().join(format!("pmoe-slot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = |name: &str| (dir.join(name), name.to_string());
        let live = Live::start(live_cfg(2), true);
        let p1 = toks(1, 300);
        live.ask(&p1, true, None);
        let (path, filename) = at("s.bin");
        let v = live.slot(0, SlotAction::Save { path, filename }).unwrap();
        let kept = 300 + 4; // the prompt and the answer's tokens but the last
        assert_eq!(v["id_slot"], 0);
        assert_eq!(v["filename"], "s.bin");
        assert_eq!(v["n_saved"], kept);
        assert_eq!(v["n_written"], slotfile::HEADER + 8 * kept);
        assert!(v["timings"]["save_ms"].is_number());
        let v = live.slot(0, SlotAction::Erase).unwrap();
        assert_eq!(
            (v["id_slot"].clone(), v["n_erased"].clone()),
            (0.into(), kept.into())
        );
        let p2: Vec<u32> = p1[..290].iter().copied().chain(toks(7, 20)).collect();
        let erased = live.ask(&p2, true, Some(0));
        assert_eq!(erased.cached, 0, "erased: nothing to reuse");
        for slot in [0, 1] {
            let (path, filename) = at("s.bin");
            let v = live
                .slot(slot, SlotAction::Restore { path, filename })
                .unwrap();
            assert_eq!(v["n_restored"], kept);
            assert_eq!(v["n_read"], slotfile::HEADER + 8 * kept);
            let g = live.ask(&p2, true, Some(slot));
            assert_eq!((g.cached, &g.text), (290, &erased.text), "slot {slot}");
        }
        // A truncated file, garbage, a missing file, another model's file.
        let bytes = std::fs::read(dir.join("s.bin")).unwrap();
        std::fs::write(dir.join("cut.bin"), &bytes[..bytes.len() - 3]).unwrap();
        std::fs::write(dir.join("junk.bin"), [b'j'; 100]).unwrap();
        for (name, why) in [
            ("cut.bin", "truncated"),
            ("junk.bin", "magic"),
            ("none.bin", "cannot read"),
        ] {
            let (path, filename) = at(name);
            match live.slot(0, SlotAction::Restore { path, filename }) {
                Err(SlotError::Bad(m)) => {
                    assert!(m.contains(name) && m.contains(why), "{m}")
                }
                r => panic!("{name}: {r:?}"),
            }
        }
        let other = Live::start(
            Config {
                fingerprint: 2,
                ..live_cfg(1)
            },
            true,
        );
        let (path, filename) = at("s.bin");
        match other.slot(0, SlotAction::Restore { path, filename }) {
            Err(SlotError::Bad(m)) => assert!(m.contains("different model"), "{m}"),
            r => panic!("{r:?}"),
        }
        // A slot that is out of range.
        assert!(matches!(
            live.slot(2, SlotAction::Erase),
            Err(SlotError::Bad(_))
        ));
        // An action on a busy slot runs after its request ended (a model slow enough, 2 ms a
        // pass, that the request is still running when the action arrives).
        drop(live);
        let live = Live::slow(live_cfg(2), true, Duration::from_millis(2));
        let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
        let mut j = job_of(0, 1, etx);
        j.prompt = toks(3, 100);
        j.max_tokens = 200;
        j.id_slot = Some(1);
        send(&live.shared, live.tx(), j);
        assert!(matches!(
            erx.blocking_recv(),
            Some(Event::Started { slot: 1, .. })
        ));
        let v = live.slot(1, SlotAction::Erase).unwrap();
        assert_eq!(v["n_erased"], 100 + 199);
        let mut ended = false;
        while let Ok(e) = erx.try_recv() {
            ended |= matches!(e, Event::Done { .. });
        }
        assert!(ended, "the erase waited for the request's end");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
