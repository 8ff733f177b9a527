//! [`LocalEngine`]: the real [`Engine`] — a GGUF model loaded on a dedicated thread that owns
//! it (the ggml engine is not `Send`), driven by the scheduler of `worker`. Request threads
//! render the chat template and tokenize (tokenizer and template are shared, read-only), check
//! the prompt against the context, and hand the job over a channel. Admission: a request is
//! taken while fewer than `parallel + max_queue` are in flight (decoding or waiting), so an
//! idle server serves even with `max_queue` 0; beyond that it gets 429.
//!
//! Invariants: the per-sequence context is `--ctx`; the KV cache holds `ctx × parallel` rows
//! rounded up to whole pages per sequence (`engine::batch::rows_for`);
//! `prompt + max_tokens <= ctx` for every job sent to the worker.
use super::api::{
    Engine, EngineInfo, GenRequest, Generation, Health, ModelCard, OutputFormat, Prompt,
    SlotAction, SlotState, StatsSnapshot,
};
use super::error::ApiError;
use super::grammar::Grammars;
use super::parse::prompt_opens_reasoning;
use super::worker::{self, Config, Job, Msg, Shared, SlotError};
use crate::engine::embed::{Pooling, RankHead};
use crate::engine::{Engine as Model, EngineOptions};
use crate::gguf::{GgufModel, Metadata};
use crate::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use anyhow::Context as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub model: PathBuf,
    /// `n_ctx` is the context of one sequence.
    pub engine: EngineOptions,
    pub parallel: usize,
    /// Requests that may wait for a slot (beyond the `parallel` decoding) before new ones get
    /// 429; 0: no waiting room, a request is served only when a slot is free.
    pub max_queue: usize,
    /// The model name clients use (default: the file name without `.gguf`).
    pub alias: Option<String>,
    /// Batch-invariant CPU kernels (`Engine::set_batch_invariant`): a request's tokens do not
    /// depend on what it is batched with.
    pub batch_invariant: bool,
    /// Parse control-token texts (`<|im_end|>`, ...) typed into chat message content as control
    /// tokens, as llama.cpp's server does; off: content is plain text and only the template's
    /// own markers are control tokens ([`Tokenizer::encode_chat`]).
    pub parse_special_in_content: bool,
    /// llama-server's `--chat-template`/`--chat-template-file`: replaces the GGUF's template.
    pub chat_template: Option<TemplateChoice>,
    /// llama-server's `--embedding`: serve `/v1/embeddings` and `/embedding(s)`.
    pub embedding: bool,
    /// `--pooling`; `None`: the model's (`{arch}.pooling_type`), else `none`, as llama-server.
    pub pooling: Option<Pooling>,
    /// llama-server's `--slot-prompt-similarity` (default 0.1; 0: least recently used slot).
    pub slot_similarity: f32,
}

/// The pooling embeddings get: `chosen`, else the GGUF's `{arch}.pooling_type`, else `none`
/// (llama.cpp's default for a model that sets none).
pub fn pooling_for(file: &GgufModel, chosen: Option<Pooling>) -> anyhow::Result<Pooling> {
    if let Some(p) = chosen {
        return Ok(p);
    }
    let arch = file.get_str("general.architecture").unwrap_or_default();
    let key = format!("{arch}.pooling_type");
    match file.get_u64(&key) {
        Some(v) => Pooling::from_gguf(v).map_err(|e| anyhow::anyhow!("{key}: {e}")),
        None => Ok(Pooling::None),
    }
}

/// A chat template chosen on the command line.
#[derive(Debug, Clone)]
pub enum TemplateChoice {
    /// Jinja source (`--chat-template-file`, or `--chat-template` with `{%`/`{{` in it).
    Source(String),
    /// A template the GGUF carries (`tokenizer.chat_template.NAME`), or `chatml`.
    Named(String),
}

/// ChatML, for `--chat-template chatml` on a model that does not carry one by that name.
const CHATML: &str = "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// Load progress and outcome, shared with the loading thread.
#[derive(Default)]
struct LoadState {
    done: AtomicU64,
    total: AtomicU64,
    outcome: Mutex<Option<Result<(), String>>>,
    shutting_down: std::sync::atomic::AtomicBool,
}

pub struct LocalEngine {
    card: ModelCard,
    tok: Arc<Tokenizer>,
    grammars: Grammars,
    template: Option<ChatTemplate>,
    tx: Mutex<Sender<Msg>>,
    shared: Arc<Shared>,
    state: Arc<LoadState>,
    max_queue: usize,
    parallel: usize,
    parse_special_in_content: bool,
    model_path: String,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Embeddings on (`--embedding`), pooled so.
    pooling: Option<Pooling>,
    /// `tokenizer.chat_template.rerank`, for `/rerank`'s prompts.
    rerank_template: Option<String>,
    /// With `--pooling rank`: the GGUF's classification head.
    rank_head: Option<Arc<RankHead>>,
}

impl LocalEngine {
    /// Reads the tokenizer and chat template, then loads the model on its own thread
    /// (`progress(done, total)` in weight bytes); [`Engine::health`] says when it is ready.
    pub fn start(
        opts: LocalOptions,
        progress: Box<dyn Fn(u64, u64) + Send>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(opts.parallel >= 1, "--parallel must be at least 1");
        anyhow::ensure!(opts.engine.n_ctx >= 2, "--ctx must be at least 2");
        anyhow::ensure!(
            opts.engine.n_ubatch >= opts.parallel,
            "--parallel {} is more than the {} tokens of a micro-batch",
            opts.parallel,
            opts.engine.n_ubatch
        );
        let file = GgufModel::open(&opts.model)
            .with_context(|| format!("reading {}", opts.model.display()))?;
        let tok = Arc::new(Tokenizer::from_gguf(&file)?);
        let template = match &opts.chat_template {
            Some(choice) => Some(Self::chosen_template(&file, choice)?),
            None => Self::gguf_template(&file)?,
        };
        let pooling = match opts.embedding {
            true => Some(pooling_for(&file, opts.pooling)?),
            false => None,
        };
        let fingerprint = super::slotfile::model_fingerprint(&file);
        let rank_head = match pooling {
            Some(Pooling::Rank) => Some(Arc::new(Self::rank_head_of(&file, &tok)?)),
            _ => None,
        };
        let rerank_template = file
            .get_str("tokenizer.chat_template.rerank")
            .map(str::to_string);
        drop(file);
        let stem = opts
            .model
            .file_stem()
            .map_or("model".to_string(), |s| s.to_string_lossy().into_owned());
        let file_name = opts
            .model
            .file_name()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned());
        let id = opts.alias.clone().unwrap_or_else(|| stem.clone());
        let card = ModelCard {
            aliases: [stem, file_name]
                .into_iter()
                .filter(|a| *a != id && !a.is_empty())
                .collect(),
            id,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            n_ctx: opts.engine.n_ctx,
            n_vocab: tok.n_vocab(),
            format: template.as_ref().map_or(OutputFormat::Plain, |t| {
                OutputFormat::from_template(t.source())
            }),
            has_chat_template: template.is_some(),
        };
        let shared = Arc::new(Shared::default());
        let state = Arc::new(LoadState::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let cfg = Config {
            parallel: opts.parallel,
            slot_len: opts.engine.n_ctx,
            n_batch: opts.engine.n_ubatch,
            pages_per_slot: opts.batch_invariant,
            fingerprint,
            similarity: opts.slot_similarity,
        };
        let thread = {
            let (shared, state, tok) = (shared.clone(), state.clone(), tok.clone());
            let mut eopts = opts.engine.clone();
            // Whole pages for every slot's whole context (the scheduler's page pool).
            eopts.n_ctx = crate::engine::batch::rows_for(opts.parallel, opts.engine.n_ctx);
            // Repacked CPU weights take a batch's rows four at a time: not batch-invariant.
            eopts.repack &= !opts.batch_invariant;
            let path = opts.model.clone();
            let batch_invariant = opts.batch_invariant;
            std::thread::Builder::new()
                .name("engine".into())
                .spawn(move || {
                    let report = |done, total| {
                        state.done.store(done, Relaxed);
                        state.total.store(total, Relaxed);
                        progress(done, total);
                    };
                    let mut model = match Model::load(&path, eopts, &report) {
                        Ok(m) => m,
                        Err(e) => {
                            *state.outcome.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(Err(e.to_string()));
                            return;
                        }
                    };
                    if batch_invariant && !model.set_batch_invariant(true) {
                        tracing::warn!("--batch-invariant: no CPU backend to switch");
                    }
                    *state.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ok(()));
                    worker::run(&mut model, &*tok, cfg, rx, &shared);
                })?
        };
        Ok(Self {
            card,
            grammars: Grammars::new(tok.clone()),
            tok,
            template,
            tx: Mutex::new(tx),
            shared,
            state,
            max_queue: opts.max_queue,
            parallel: opts.parallel,
            parse_special_in_content: opts.parse_special_in_content,
            model_path: opts.model.display().to_string(),
            thread: Mutex::new(Some(thread)),
            pooling,
            rerank_template,
            rank_head,
        })
    }

    /// The classification head for `--pooling rank`, after llama.cpp's checks of the
    /// vocabulary (a BOS token; an EOS or SEP token, or a rerank template): without them
    /// llama-server does not start either.
    fn rank_head_of(file: &GgufModel, tok: &Tokenizer) -> anyhow::Result<RankHead> {
        let what = "--pooling rank (reranking)";
        anyhow::ensure!(
            tok.bos().is_some(),
            "{what}: the vocabulary has no BOS token, which the reranking prompt starts with (llama.cpp refuses such a model too)"
        );
        let s = tok.special_tokens();
        anyhow::ensure!(
            s.eos.is_some()
                || s.sep.is_some()
                || file.get_str("tokenizer.chat_template.rerank").is_some(),
            "{what}: the vocabulary has no EOS or SEP token and the file no tokenizer.chat_template.rerank (llama.cpp refuses such a model too)"
        );
        let arch = file.get_str("general.architecture").unwrap_or_default();
        let key = format!("{arch}.embedding_length");
        let n_embd = file
            .get_u64(&key)
            .ok_or_else(|| anyhow::anyhow!("{what}: {key} is missing"))?;
        let head = RankHead::from_gguf(file, n_embd as usize)
            .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        if head.is_empty() {
            tracing::warn!(
                "{what}: the model has no classification head (no cls.weight, no cls.output.weight): \
                 its scores are the first component of the last position's hidden state, as \
                 llama-server computes them for such a model, not a trained relevance score"
            );
        }
        Ok(head)
    }

    /// The GGUF's default chat template; none (chat off) when it has no template at all.
    fn gguf_template(file: &GgufModel) -> anyhow::Result<Option<ChatTemplate>> {
        match ChatTemplate::from_gguf(file) {
            Ok(t) => Ok(Some(t)),
            Err(e) if file.get_str("tokenizer.chat_template").is_none() => {
                tracing::warn!("no chat template ({e}): /v1/chat/completions is off");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The template `--chat-template`/`--chat-template-file` names, with the GGUF's BOS/EOS.
    fn chosen_template(file: &GgufModel, choice: &TemplateChoice) -> anyhow::Result<ChatTemplate> {
        let source = match choice {
            TemplateChoice::Source(s) => s.clone(),
            TemplateChoice::Named(name) => {
                if ChatTemplate::names_in_gguf(file).contains(name) {
                    return Ok(ChatTemplate::from_gguf_named(file, name)?);
                }
                anyhow::ensure!(
                    name == "chatml",
                    "--chat-template {name}: not a template this model carries ({}) nor chatml; pass Jinja source, or --chat-template-file FILE",
                    ChatTemplate::names_in_gguf(file).join(", ")
                );
                CHATML.to_string()
            }
        };
        let t = crate::tokenizer::vocab::template_tokens(file)?;
        Ok(ChatTemplate::new("--chat-template", source, t.bos, t.eos)?
            .with_tokenizer_flags(t.add_bos, t.add_eos))
    }

    /// The chat prompt of `messages`, text and tokens. Message content is plain text unless
    /// --parse-special-in-content. Assistant prefill (as llama-server): when the generation
    /// prompt is asked for and the last message is the assistant's, the messages before it are
    /// rendered with the generation prompt and its content follows, unclosed, so the model
    /// continues it.
    fn render(
        &self,
        messages: &[ChatMessage],
        template_vars: serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>), ApiError> {
        let t = self
            .template
            .as_ref()
            .ok_or_else(|| ApiError::bad("the model has no chat template: use /v1/completions"))?;
        let prefill = match messages.split_last() {
            Some((last, rest))
                if add_generation_prompt && last.role == "assistant" && !rest.is_empty() =>
            {
                Some((last.text(), rest))
            }
            _ => None,
        };
        let (head, gen) = match prefill {
            Some((_, rest)) => (rest, true),
            None => (messages, add_generation_prompt),
        };
        let chat = self
            .tok
            .encode_chat(
                t,
                head,
                gen,
                serde_json::Value::Object(template_vars),
                self.parse_special_in_content,
            )
            .map_err(|e| ApiError::bad(format!("the chat template refused these messages: {e}")))?;
        let (mut text, mut tokens) = (chat.text, chat.tokens);
        if let Some((content, _)) = prefill {
            text.push_str(&content);
            tokens.extend(
                self.tok
                    .encode(&content, false, self.parse_special_in_content),
            );
        }
        Ok((text, tokens))
    }

    /// Err unless the model is loaded and the server is not shutting down.
    fn ready(&self) -> Result<(), ApiError> {
        match self.health() {
            Health::Ready => Ok(()),
            Health::Loading { fraction } => Err(ApiError::Loading {
                percent: fraction * 100.0,
            }),
            Health::Failed(e) => Err(ApiError::Internal(format!("the model failed to load: {e}"))),
            Health::ShuttingDown => Err(ApiError::ShuttingDown),
        }
    }

    /// Admits `job` if there is room for one more (a free slot, or a free place in the queue)
    /// and hands it to the engine thread.
    fn enqueue(&self, job: Job) -> Result<(), ApiError> {
        let in_flight = self.shared.in_flight.fetch_add(1, Relaxed);
        if in_flight >= self.parallel + self.max_queue {
            self.shared.end_job();
            return Err(ApiError::QueueFull {
                parallel: self.parallel,
                queued: self.shared.queued.load(Relaxed),
                limit: self.max_queue,
            });
        }
        self.shared.queued.fetch_add(1, Relaxed);
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Msg::Job(Box::new(job)));
        if sent.is_err() {
            self.shared.queued.fetch_sub(1, Relaxed);
            self.shared.end_job();
            return Err(ApiError::ShuttingDown);
        }
        Ok(())
    }

    fn context_error(msg: String, param: &str) -> ApiError {
        ApiError::Invalid {
            msg,
            param: Some(param.to_string()),
            code: Some("context_length_exceeded"),
        }
    }

    /// `/slots`: the state the engine thread published after its last step, or idle slots
    /// before the first.
    fn slot_states(&self) -> Vec<SlotState> {
        let published = self
            .shared
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if published.len() == self.parallel {
            return published;
        }
        (0..self.parallel)
            .map(|id| SlotState {
                id,
                n_ctx: self.card.n_ctx,
                ..SlotState::default()
            })
            .collect()
    }
}

impl Engine for LocalEngine {
    fn card(&self) -> &ModelCard {
        &self.card
    }

    fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<(u32, Vec<u8>)>, ApiError> {
        let ids = self.tok.encode(text, add_special, parse_special);
        Ok(ids
            .into_iter()
            .map(|id| (id, self.tok.token_to_piece(id)))
            .collect())
    }

    fn detokenize(&self, ids: &[u32]) -> Result<String, ApiError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.card.n_vocab) {
            return Err(ApiError::invalid(
                "tokens",
                format!(
                    "token id {id} is outside the vocabulary (0..{})",
                    self.card.n_vocab
                ),
            ));
        }
        // Control tokens as their text (llama-server's /detokenize), so text round-trips.
        Ok(String::from_utf8_lossy(&self.tok.detokenize(ids, false, true)).into_owned())
    }

    fn apply_template(
        &self,
        messages: Vec<ChatMessage>,
        template_vars: serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ApiError> {
        Ok(self
            .render(&messages, template_vars, add_generation_prompt)?
            .0)
    }

    fn info(&self) -> EngineInfo {
        EngineInfo {
            model_path: Some(self.model_path.clone()),
            chat_template: self.template.as_ref().map(|t| t.source().to_string()),
        }
    }

    fn health(&self) -> Health {
        if self.state.shutting_down.load(Relaxed) {
            return Health::ShuttingDown;
        }
        match &*self.state.outcome.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(Ok(())) => Health::Ready,
            Some(Err(e)) => Health::Failed(e.clone()),
            None => {
                let (d, t) = (
                    self.state.done.load(Relaxed),
                    self.state.total.load(Relaxed),
                );
                Health::Loading {
                    fraction: if t == 0 { 0.0 } else { d as f64 / t as f64 },
                }
            }
        }
    }

    fn submit(&self, req: GenRequest) -> Result<Generation, ApiError> {
        self.ready()?;
        let format = self.card.format;
        // The field a too-long prompt is blamed on.
        let prompt_param = match req.prompt {
            Prompt::Chat { .. } => "messages",
            Prompt::Text(_) | Prompt::Tokens(_) => "prompt",
        };
        let (prompt, opens_reasoning, special) = match req.prompt {
            Prompt::Chat {
                messages,
                template_vars,
            } => {
                let (text, toks) = self.render(&messages, template_vars, true)?;
                let open = prompt_opens_reasoning(format, &text);
                (toks, open, format.needs_special_tokens())
            }
            Prompt::Text(s) => (self.tok.encode(&s, true, true), false, false),
            Prompt::Tokens(t) => (t, false, false),
        };
        if prompt.is_empty() {
            return Err(ApiError::invalid(
                "prompt",
                "the prompt is empty: send some text",
            ));
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= self.card.n_vocab) {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "token id {id} is outside the vocabulary (0..{})",
                    self.card.n_vocab
                ),
            ));
        }
        let n_ctx = self.card.n_ctx;
        if prompt.len() >= n_ctx {
            return Err(ApiError::ContextExceeded {
                n_prompt_tokens: prompt.len(),
                n_ctx,
                param: prompt_param,
            });
        }
        let room = n_ctx - prompt.len();
        let max_tokens = match req.max_tokens {
            None => room,
            Some(m) if m > room && req.max_tokens_soft => room,
            Some(m) if m > room => {
                return Err(Self::context_error(
                    format!(
                        "the prompt ({} tokens) plus max_tokens ({m}) is more than the context of {n_ctx} tokens: ask for at most {room} tokens",
                        prompt.len()
                    ),
                    "max_tokens",
                ))
            }
            Some(m) => m,
        };
        if let Some(id) = req.id_slot.filter(|&id| id >= self.parallel) {
            return Err(ApiError::invalid(
                "id_slot",
                format!(
                    "id_slot {id}: the server has {} slots (0..{})",
                    self.parallel,
                    self.parallel - 1
                ),
            ));
        }
        // Compiled here, off the engine thread: a large schema may take a while.
        let grammar = match &req.constraint {
            Some(c) => Some(self.grammars.compile(c, format, opens_reasoning)?),
            None => None,
        };
        let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
        let n_prompt = prompt.len();
        self.enqueue(Job {
            prompt,
            sampling: req.sampling,
            max_tokens,
            logprobs: req.logprobs,
            logit_bias: if req.ignore_eos {
                let eog = self.tok.eog_ids().into_iter();
                let mut bias = req.logit_bias;
                bias.extend(eog.map(|id| (id, f32::NEG_INFINITY)));
                bias
            } else {
                req.logit_bias
            },
            special,
            token_ids: req.token_ids,
            grammar,
            embed: None,
            cache_prompt: req.cache_prompt,
            id_slot: req.id_slot,
            events: etx,
        })?;
        Ok(Generation {
            prompt_tokens: n_prompt,
            opens_reasoning,
            events: erx,
        })
    }

    fn pooling(&self) -> Option<Pooling> {
        self.pooling
    }

    fn rank_head(&self) -> Option<Arc<RankHead>> {
        self.rank_head.clone()
    }

    fn vocab(&self) -> Option<super::api::VocabInfo> {
        Some(super::api::VocabInfo {
            special: self.tok.special_tokens().clone(),
            add_bos: self.tok.add_bos(),
            add_eos: self.tok.add_eos(),
            add_sep: self.tok.add_sep(),
            rerank_template: self.rerank_template.clone(),
        })
    }

    fn embed(&self, tokens: Vec<u32>) -> Result<Generation, ApiError> {
        let Some(pooling) = self.pooling else {
            return Err(ApiError::NotSupported(super::api::NO_EMBEDDINGS.into()));
        };
        self.ready()?;
        if tokens.is_empty() {
            return Err(ApiError::invalid("input", "Input content cannot be empty"));
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= self.card.n_vocab) {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "token id {id} is outside the vocabulary (0..{})",
                    self.card.n_vocab
                ),
            ));
        }
        let n_ctx = self.card.n_ctx;
        if tokens.len() > n_ctx {
            return Err(ApiError::ContextExceeded {
                n_prompt_tokens: tokens.len(),
                n_ctx,
                param: "input",
            });
        }
        let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
        let n_prompt = tokens.len();
        self.enqueue(Job {
            prompt: tokens,
            sampling: Default::default(),
            max_tokens: 1,
            logprobs: None,
            logit_bias: Vec::new(),
            special: false,
            token_ids: false,
            grammar: None,
            embed: Some(pooling),
            cache_prompt: false,
            id_slot: None,
            events: etx,
        })?;
        Ok(Generation {
            prompt_tokens: n_prompt,
            opens_reasoning: false,
            events: erx,
        })
    }

    fn slot_action(&self, id: usize, action: SlotAction) -> Result<serde_json::Value, ApiError> {
        self.ready()?;
        if id >= self.parallel {
            return Err(ApiError::bad(format!(
                "Invalid slot ID {id}: the server has {} slots (0..{})",
                self.parallel,
                self.parallel - 1
            )));
        }
        let (reply, answer) = std::sync::mpsc::channel();
        self.tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Msg::Slot { id, action, reply })
            .map_err(|_| ApiError::ShuttingDown)?;
        match answer.recv() {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(SlotError::Bad(m))) => Err(ApiError::bad(m)),
            Ok(Err(SlotError::NotSupported(m))) => Err(ApiError::NotSupported(m)),
            Ok(Err(SlotError::Internal(m))) => Err(ApiError::Internal(m)),
            Err(_) => Err(ApiError::ShuttingDown),
        }
    }

    fn stats(&self) -> StatsSnapshot {
        let s = &self.shared;
        StatsSnapshot {
            queued: s.queued.load(Relaxed),
            active: s.active.load(Relaxed),
            parallel: self.parallel,
            prompt_tokens: s.prompt_tokens.load(Relaxed),
            generated_tokens: s.generated.load(Relaxed),
            steps: s.steps.load(Relaxed),
            batch_tokens: s.batch_tokens.load(Relaxed),
            recent_tok_s: s.recent_tok_s(),
            cancelled: s.cancelled.load(Relaxed),
            kv_tokens: s.kv_tokens.load(Relaxed),
            slots: self.slot_states(),
            experts: s.experts.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    fn shutdown(&self, grace: Duration) {
        self.state.shutting_down.store(true, Relaxed);
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Msg::Shutdown(grace));
    }

    /// Waits for the engine thread, unless the model is still loading (a load cannot be
    /// interrupted; the process may exit without it).
    fn join(&self) {
        if self
            .state
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
        {
            return;
        }
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}
