//! Implementations of the `pocketmoe` subcommands (the binary only parses arguments).
pub mod bench;
pub mod inspect;
pub mod run;
pub mod synth;

/// A progress bar over bytes, on stderr (hidden when stderr is not a terminal).
pub fn byte_progress(total: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// `--cache-type`: the KV cache's element type, as llama.cpp's `-ctk`/`-ctv` (one for both).
pub fn parse_cache_type(s: &str) -> Result<crate::ggml::GgmlType, String> {
    match s.to_ascii_lowercase().as_str() {
        "f16" => Ok(crate::ggml::GgmlType::F16),
        "q8_0" => Ok(crate::ggml::GgmlType::Q8_0),
        other => Err(format!("cache type {other:?}: f16 or q8_0")),
    }
}

use crate::engine::Engine;
use crate::ggml::llama::LlamaContext;

/// Something that turns tokens into next-token logits: our engine, or libllama (the reference),
/// so `run --reference` and `bench` drive both the same way.
pub trait Decoder {
    /// Starts a fresh sequence with `tokens`; returns the last position's logits.
    fn prefill(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>>;
    /// Appends one token; returns its logits.
    fn step(&mut self, token: u32) -> anyhow::Result<Vec<f32>>;
}

impl Decoder for Engine {
    fn prefill(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        self.reset();
        Ok(self.forward_last(tokens)?)
    }
    fn step(&mut self, token: u32) -> anyhow::Result<Vec<f32>> {
        Ok(self.forward_last(&[token])?)
    }
}

/// libllama behind [`Decoder`].
pub struct LlamaDecoder<'m> {
    pub ctx: LlamaContext<'m>,
    pub n_past: usize,
}

impl Decoder for LlamaDecoder<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        self.ctx.clear();
        let t: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        let l = self.ctx.eval_last(&t, 0)?;
        self.n_past = tokens.len();
        Ok(l)
    }
    fn step(&mut self, token: u32) -> anyhow::Result<Vec<f32>> {
        let l = self.ctx.eval_last(&[token as i32], self.n_past)?;
        self.n_past += 1;
        Ok(l)
    }
}
