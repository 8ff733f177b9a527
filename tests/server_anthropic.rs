//! The `anthropic` Python client (pinned, installed into a venv under the target dir, from the
//! machine's wheel directory or PyPI) against `pocketmoe-serve`'s `/v1/messages` on the tiny
//! synth model: `tests/server/anthropic_client.py` (issue 29 item 7). The client sends its key
//! as `x-api-key`, which the server takes as llama-server does.
mod common;

use pocketmoe::synth::quantmix::QuantMix;
use std::path::{Path, PathBuf};
use std::process::Command;

const ANTHROPIC_VERSION: &str = "1.13.0";
const KEY: &str = "anthropic-key";

fn python() -> PathBuf {
    common::pip_venv("anthropic", ANTHROPIC_VERSION)
}

#[test]
fn anthropic_client_messages() {
    let model = common::synth_tiny("server-anthropic", "qwen3moe", QuantMix::Q8_0, 1.0, 5);
    let args: Vec<std::ffi::OsString> = vec![
        "-m".into(),
        model.into(),
        "--port".into(),
        "0".into(),
        "-t".into(),
        "2".into(),
        "--api-key".into(),
        KEY.into(),
    ];
    let (mut child, addr) = common::spawn_serve(&args);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/server/anthropic_client.py");
    let out = Command::new(python())
        .arg(script)
        .arg(format!("http://{addr}"))
        .arg(KEY)
        .output()
        .expect("running the Python client");
    let _ = child.kill();
    let _ = child.wait();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "anthropic_client.py failed:\n{so}\n{se}"
    );
    assert!(so.contains("anthropic: ok"), "{so}");
}
