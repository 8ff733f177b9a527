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
use super::api::{Event, FinishReason, TokenLogprob};
use crate::engine::batch::{rows_for, BatchModel, PagePool, SeqChunk};
use crate::engine::embed::{Pooler, Pooling};
use crate::engine::sampling::{Sampler, SamplerParams};
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
    pub events: UnboundedSender<Event>,
}

pub enum Msg {
    /// Boxed: a job (with its grammar matcher) is ~1.5 KB, the other variant a few bytes.
    Job(Box<Job>),
    /// Stop: queued jobs end now, running ones after the grace period.
    Shutdown(Duration),
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
    pub offload: Mutex<Option<crate::experts::Stats>>,
    /// Per-slot state for `/slots`, published after each step (one short lock per step).
    pub slots: Mutex<Vec<super::api::SlotState>>,
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
    fn new(job: Job) -> Self {
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
        }
    }

    fn send(&self, e: Event) {
        let _ = self.job.events.send(e);
    }
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
    let mut pool = if cfg.pages_per_slot {
        PagePool::per_slot(rows, cfg.parallel)
    } else {
        PagePool::new(rows)
    };
    let mut waiting: VecDeque<Job> = VecDeque::new();
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
        let idle = slots.iter().all(Option::is_none) && waiting.is_empty();
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
            }
        }
        // Cancellations, and the end of the shutdown grace period.
        let over = deadline.is_some_and(|d| Instant::now() >= d);
        for slot in slots.iter_mut() {
            if slot.as_ref().is_some_and(|s| s.job.events.is_closed()) {
                vacate(slot, &mut pool, shared, None);
                shared.cancelled.fetch_add(1, Relaxed);
            } else if over {
                vacate(
                    slot,
                    &mut pool,
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
        // Admission, lowest free slot first (keeps the attended cache short).
        for slot in slots.iter_mut().filter(|s| s.is_none()) {
            let Some(job) = waiting.pop_front() else {
                break;
            };
            shared.queued.fetch_sub(1, Relaxed);
            shared
                .prompt_tokens
                .fetch_add(job.prompt.len() as u64, Relaxed);
            *slot = Some(Seq::new(job));
        }
        shared.active.store(slots.iter().flatten().count(), Relaxed);
        step(model, vocab, cfg, &mut slots, &mut pool, &mut rr, shared);
        publish(&slots, cfg, shared);
    }
    shared.active.store(0, Relaxed);
    publish(&slots, cfg, shared);
    shared.kv_tokens.store(0, Relaxed);
}

/// Publishes the slots' state for `/slots`.
fn publish(slots: &[Option<Seq>], cfg: Config, shared: &Shared) {
    let view = slots
        .iter()
        .enumerate()
        .map(|(id, s)| super::api::SlotState {
            id,
            is_processing: s.is_some(),
            n_ctx: cfg.slot_len,
            n_prompt_tokens: s.as_ref().map_or(0, |s| s.n_prompt),
            n_decoded: s.as_ref().map_or(0, |s| s.n_gen),
            n_cached: s.as_ref().map_or(0, |s| s.cached),
        })
        .collect();
    *shared.slots.lock().unwrap_or_else(|p| p.into_inner()) = view;
}

/// Frees `slot` (if occupied): the counters first, then `last` goes out.
fn vacate(slot: &mut Option<Seq>, pool: &mut PagePool, shared: &Shared, last: Option<Event>) {
    if let Some(mut s) = slot.take() {
        pool.release(&mut s.pages);
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
    pool: &mut PagePool,
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
        if !pool.cover(i, &mut s.pages, s.cached + take) {
            return fail(
                slots,
                &plan,
                pool,
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
        if let Some(rows) = pass(model, slots, &embd, pool, shared, true) {
            pool_rows(slots, &embd, rows, pool, shared);
        }
    }
    if plan.is_empty() {
        return;
    }
    let Some(logits) = pass(model, slots, &plan, pool, shared, false) else {
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
            vacate(slot, pool, shared, Some(e));
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
                vacate(slot, pool, shared, Some(Event::Done { reason, tail }));
            }
            Some(End::Fail(e)) => vacate(slot, pool, shared, Some(Event::Error(e))),
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
    pool: &mut PagePool,
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
                pool,
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
                pool,
                shared,
                &format!("the engine panicked: {msg}"),
            );
            return None;
        }
    };
    if let Some(stats) = model.offload_stats() {
        *shared.offload.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
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
    pool: &mut PagePool,
    shared: &Shared,
) {
    let mut rows = rows.into_iter();
    for &(i, take, _) in plan {
        let slot = &mut slots[i];
        let s = slot.as_mut().expect("planned slots are active");
        let got: Vec<Vec<f32>> = rows.by_ref().take(take).collect();
        if got.len() < take {
            let e = Event::Error("the engine returned too few hidden states".into());
            vacate(slot, pool, shared, Some(e));
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
            vacate(slot, pool, shared, Some(done));
        }
    }
}

/// Ends the requests of a failed step.
fn fail(
    slots: &mut [Option<Seq>],
    plan: &[(usize, usize, bool)],
    pool: &mut PagePool,
    shared: &Shared,
    msg: &str,
) {
    tracing::error!("{msg}");
    for &(i, _, _) in plan {
        vacate(
            &mut slots[i],
            pool,
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
    }

    impl Fake {
        /// A cache of exactly the rows the scheduler's pool needs.
        fn new(cfg: Config) -> Self {
            Self {
                rows: vec![None; rows_for(cfg.parallel, cfg.slot_len)],
                steps: Vec::new(),
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
                    Some(Event::Token { .. }) => {}
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
}
