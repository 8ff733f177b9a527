//! PocketMoE: run large Mixture-of-Experts GGUF models on GPUs too small to hold them.
//!
//! ggml (through `ggml-sys`, from the one llama.cpp build of `llama-cpp-sys-4`) does the quantised
//! math; this crate does the MoE-specific parts. See docs/usage.md's architecture section for the
//! layout, and docs/design.md for the physics, the offload design as built and the invariants.
pub mod arch;
pub mod cli;
pub mod engine;
pub mod experts;
pub mod ggml;
pub mod gguf;
pub mod graph;
pub mod hub;
pub mod model;
pub mod selfcheck;
pub mod server;
pub mod stackdump;
pub mod synth;
pub mod tokenizer;
pub mod util;

/// llama-server's build string, "b<build number>-<commit>", for ours (`build.rs`): the server's
/// `system_fingerprint`.
pub const BUILD_INFO: &str = concat!(
    "b",
    env!("POCKETMOE_BUILD_NUMBER"),
    "-",
    env!("POCKETMOE_BUILD_COMMIT")
);

/// Our version, the ggml we link, and the compiled backends (what `--version` prints after the name).
pub fn version() -> String {
    let v = ggml::version();
    let backends = if cfg!(feature = "cuda") {
        "cpu+cuda"
    } else {
        "cpu"
    };
    format!(
        "{} (ggml {v}, {}, backends: {backends})",
        env!("CARGO_PKG_VERSION"),
        ggml_sys::LLAMA_TREE
    )
}
