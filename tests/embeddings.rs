//! Embedding parity with libllama (same GGUF, same ggml, CPU): libllama's context with
//! `embeddings = true` and each `pooling_type` against `Engine::forward_embd` (the final normed
//! hidden state of every position) pooled by `engine::embed::Pooler`.
//!
//! - `none`, `cls`, `last` must be bit-exact: they are rows of the same `result_norm` tensor,
//!   computed by the same kernels on the same bits in the same order as the logits, which are
//!   bit-exact on the CPU (tests/parity.rs), and both engines copy the rows as they are.
//! - `mean` may differ in the last bits: libllama averages in its graph with an f32 matmul
//!   against a column of 1/n (SIMD partial sums in ggml's order), we sum in f64 on the host and
//!   divide once. Each result is within a few f32 ulps of the exact mean, so the bound is
//!   relative: max |difference| <= 1e-5 x max |x| and cosine >= 1 - 1e-9 (measured: printed
//!   below); a wrong row, a missing position or a per-position scale off by one in the count
//!   moves the mean by far more (a 20-position mean with one row dropped is off by ~5%).
mod common;
use common::{cosine, max_abs_diff};
use pocketmoe::engine::embed::{Pooler, Pooling};
use pocketmoe::ggml::llama::{LlamaContext, LlamaModel};
use pocketmoe::synth::quantmix::QuantMix;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. 12345 tokens of text!";

/// Our pooled embedding of `tokens` and libllama's, for each pooling type, on `arch`'s tiny
/// preset.
fn check(arch: &str) {
    let path = common::synth_tiny("embeddings", arch, QuantMix::Q8_0, 1.0, 11);
    let lm = LlamaModel::load(&path, 0).unwrap();
    let prompt = lm.tokenize(PROMPT, true, false).unwrap();
    let ids: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    let mut eng = common::cpu_engine(&path, 256);
    let rows = eng.forward_embd(&ids).unwrap();
    assert_eq!(
        rows.len(),
        ids.len(),
        "{arch}: one hidden state per position"
    );
    assert_eq!(rows[0].len(), eng.hp.n_embd as usize, "{arch}: n_embd wide");
    // The hidden states are what the head reads: the logits' rows differ per position.
    assert_ne!(rows[0], rows[1], "{arch}: positions differ");
    for (code, pooling) in [
        (0, Pooling::None),
        (1, Pooling::Mean),
        (2, Pooling::Cls),
        (3, Pooling::Last),
    ] {
        let mut ctx = LlamaContext::new_embeddings(&lm, 256, 2, code).unwrap();
        let theirs = ctx.embeddings(&prompt).unwrap();
        let mut p = Pooler::new(pooling);
        // Pushed in two pieces, as micro-batches come.
        p.push(rows[..7].to_vec());
        p.push(rows[7..].to_vec());
        let ours = p.finish();
        let what = format!("{arch} pooling {}", pooling.name());
        assert_eq!(ours.len(), theirs.len(), "{what}: vector count");
        let (mut min_cos, mut max_diff, mut max_abs) = (f64::INFINITY, 0f32, 0f32);
        for (o, t) in ours.iter().zip(&theirs) {
            assert_eq!(o.len(), t.len(), "{what}: width");
            min_cos = min_cos.min(cosine(o, t));
            max_diff = max_diff.max(max_abs_diff(o, t));
            max_abs = t.iter().fold(max_abs, |m, x| m.max(x.abs()));
        }
        eprintln!(
            "{what}: {} vector(s), min cosine {min_cos:.12}, max |diff| {max_diff:e} (max |x| {max_abs})",
            ours.len()
        );
        if pooling == Pooling::Mean {
            assert!(
                max_diff <= 1e-5 * max_abs && min_cos >= 1.0 - 1e-9,
                "{what}: max |diff| {max_diff:e}, cosine {min_cos}"
            );
        } else {
            assert_eq!(max_diff, 0.0, "{what}: not bit-exact on the CPU");
        }
    }
}

#[test]
fn cpu_embeddings_match_libllama_qwen3moe() {
    check("qwen3moe");
}

/// A model with attention sinks and a sliding window (gpt-oss) and one with MLA attention
/// (deepseek2): the hidden state is taken where each architecture's output norm is. Not
/// deepseek4: libllama of this tree aborts reading its embeddings (`GGML_ASSERT(offset + size
/// <= ggml_nbytes(tensor))` in `llama_decode` with `embeddings = true`), so there is no oracle;
/// our path is the same `output_head` after its hyper-connection head.
#[test]
fn cpu_embeddings_match_libllama_other_archs() {
    for arch in ["gpt-oss", "deepseek2"] {
        check(arch);
    }
}

/// Across micro-batches the hidden states are the whole sequence's: a prompt forwarded in
/// pieces gives (to the kernels' batch-shape rounding) the rows of the whole prompt at once.
#[test]
fn embeddings_across_micro_batches() {
    let path = common::synth_tiny("embeddings", "qwen3moe", QuantMix::Q8_0, 1.0, 11);
    let ids: Vec<u32> = (1..40).map(|t| t * 7 % 150 + 1).collect();
    let whole = common::cpu_engine(&path, 256).forward_embd(&ids).unwrap();
    let mut eng = common::cpu_engine(&path, 256);
    let mut pieces = eng.forward_embd(&ids[..13]).unwrap();
    pieces.extend(eng.forward_embd(&ids[13..]).unwrap());
    assert_eq!(pieces.len(), whole.len());
    for (i, (a, b)) in pieces.iter().zip(&whole).enumerate() {
        let c = cosine(a, b);
        assert!(c > 0.9999, "position {i}: cosine {c}");
    }
}

/// Rank pooling (`--reranking`) against libllama's, on a model without a classification head:
/// libllama builds no `cls*` tensors for these architectures (its loader would refuse a
/// qwen3moe file carrying them as extra tensors), so its rank score is the first component of
/// the last position's normed hidden state (`build_pooling` takes the last row for causal
/// attention; `llama_get_embeddings_seq` then holds `n_cls_out` = 1 float). Ours, the
/// last-row pooler and the empty head, must give the same float bit for bit on the CPU, for
/// the reason `last` is bit-exact above. The head itself is checked in
/// tests/server_rerank.rs against an f64 computation.
#[test]
fn cpu_rank_matches_libllama() {
    use pocketmoe::engine::embed::RankHead;
    let path = common::synth_tiny("embeddings", "qwen3moe", QuantMix::Q8_0, 1.0, 11);
    let lm = LlamaModel::load(&path, 0).unwrap();
    let prompt = lm.tokenize(PROMPT, true, false).unwrap();
    let ids: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    let mut eng = common::cpu_engine(&path, 256);
    let rows = eng.forward_embd(&ids).unwrap();
    let mut p = Pooler::new(Pooling::Rank);
    p.push(rows[..5].to_vec());
    p.push(rows[5..].to_vec());
    let pooled = p.finish();
    assert_eq!(pooled.len(), 1);
    let head = RankHead::from_gguf(
        &pocketmoe::gguf::GgufModel::open(&path).unwrap(),
        eng.hp.n_embd as usize,
    )
    .unwrap();
    assert!(
        head.is_empty(),
        "the synth model has no classification head"
    );
    let ours = head.scores(&pooled[0]);
    let mut ctx = LlamaContext::new_embeddings(&lm, 256, 2, 4).unwrap();
    let theirs = ctx.embeddings(&prompt).unwrap();
    assert_eq!(theirs.len(), 1, "one result per sequence");
    assert_eq!(theirs[0].len(), 1, "n_cls_out = 1 score");
    eprintln!("rank score: ours {}, libllama {}", ours[0], theirs[0][0]);
    assert_eq!(
        ours[0].to_bits(),
        theirs[0][0].to_bits(),
        "rank score: ours {} vs libllama {}",
        ours[0],
        theirs[0][0]
    );
}
