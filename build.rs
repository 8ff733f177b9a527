//! Our build number and commit, as llama.cpp's build-info gives its own (`git rev-list --count
//! HEAD`, `git rev-parse --short HEAD`; 0 and "unknown" outside a git checkout): the server's
//! `system_fingerprint`, "b<number>-<commit>" as llama-server's.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(o.stdout).ok()?.trim().to_string();
    (o.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let number = git(&["rev-list", "--count", "HEAD"]).unwrap_or_else(|| "0".into());
    let commit = git(&["rev-parse", "--short=7", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=POCKETMOE_BUILD_NUMBER={number}");
    println!("cargo:rustc-env=POCKETMOE_BUILD_COMMIT={commit}");
    // A new commit moves HEAD's reflog (the worktree's own, in a linked worktree).
    for p in ["HEAD", "logs/HEAD"] {
        if let Some(path) = git(&["rev-parse", "--git-path", p]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
