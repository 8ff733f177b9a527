//! Helpers shared by integration tests.
use std::path::{Path, PathBuf};

/// Test fixtures from registry packages (vocab-only GGUFs and chat templates from the
/// llama-cpp-python sdist), fetched once by scripts/fetch-fixtures.sh into target/fixtures.
pub fn fixtures() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fetch-fixtures.sh"))
        .arg(root.join("target/fixtures"))
        .output()
        .expect("running scripts/fetch-fixtures.sh");
    assert!(
        out.status.success(),
        "fetch-fixtures failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join("target/fixtures")
}
