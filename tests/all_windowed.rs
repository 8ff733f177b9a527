//! A model whose every block is sliding-window: a one-block gpt-oss file (gpt-oss windows the
//! even blocks, so its only block is windowed). Its graph reads the windowed mask only, so the
//! full causal mask input is never allocated; writing it anyway failed with
//! "attn_inp_kq_mask has no buffer" (issue 27). Both the single-sequence path and the batched
//! one (`forward_batch`, the server's) must run, and the logits must equal libllama's.
mod common;
use common::max_abs_diff;
use pocketmoe::engine::batch::{BatchModel, SeqChunk, KV_PAGE};
use pocketmoe::engine::{Engine, EngineOptions};
use pocketmoe::ggml::llama::{LlamaContext, LlamaModel};
use pocketmoe::synth::quantmix::QuantMix;

#[test]
fn one_block_gpt_oss_with_every_block_windowed_runs_and_matches_libllama() {
    let path = common::synth_preset("all-windowed", "gpt-oss", "tiny:1", QuantMix::Q8_0, 1.0, 7);
    let opts = EngineOptions {
        n_ctx: 2 * KV_PAGE,
        n_threads: 2,
        n_seq: 2,
        ..Default::default()
    };
    let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();
    assert_eq!(
        eng.hp.swa.layers,
        vec![true],
        "the file must have one block, windowed"
    );
    let window = eng.hp.swa.window as usize;
    // Past the window, so that the windowed mask hides rows the full one would show.
    let prompt: Vec<u32> = (0..window as u32 + 9)
        .map(|j| (j * 37 + 11) % 900)
        .collect();

    let ours = eng.forward(&prompt).expect("single-sequence forward");
    let lm = LlamaModel::load(&path, 0).unwrap();
    let mut lctx = LlamaContext::new(&lm, 2 * KV_PAGE as u32, 2).unwrap();
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let theirs = lctx.logits_all(&ids).unwrap();
    assert_eq!(ours.len(), theirs.len());
    for (pos, (o, t)) in ours.iter().zip(&theirs).enumerate() {
        // The CPU runs the same kernels on the same bits in both engines: bit-exact.
        assert_eq!(max_abs_diff(o, t), 0.0, "prompt position {pos}");
    }

    // The batched path (the server's) writes its masks separately: two sequences together.
    let pages = [[0u32], [1u32]];
    let chunks: Vec<SeqChunk> = (0..2)
        .map(|i| SeqChunk {
            pages: &pages[i],
            pos: 0,
            tokens: &prompt[..prompt.len() - i],
            logits: true,
            slot: i,
        })
        .collect();
    let batched = eng.forward_batch(&chunks).expect("batched forward");
    assert_eq!(batched.len(), 2);
    assert!(batched.iter().all(|l| l.iter().all(|x| x.is_finite())));
}
