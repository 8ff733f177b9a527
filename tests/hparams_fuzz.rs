//! Fuzzes the numeric metadata of the tiny synthesized models (every built architecture, plus
//! deepseek2's legacy-layout preset): each numeric or bool key of the file in turn is set to 0,
//! to -1 (the type's maximum for unsigned types, and -1 retyped as I32), to 2^31 (the type's
//! maximum where that does not fit), to NaN and +inf (float keys), and integers also to half and
//! one more than their value; bools are flipped. Each modified file goes through `pocketmoe run`
//! (CPU, a few tokens, greedy) in a child process with a memory limit and a timeout, and must
//! either be refused with `error: ...` naming the file and the key, or run and produce finite
//! logits at every step (read from the `POCKETMOE_TRACE` file, one logit sum per step). A panic,
//! abort, other signal, allocation failure or hang fails the test, naming the key and value.
//! `HPARAMS_FUZZ_VERBOSE=1` (with `--nocapture`) prints every case's outcome.
mod common;

use pocketmoe::gguf::{GgufModel, GgufValue};
use pocketmoe::synth::quantmix::QuantMix;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// (architecture, preset) of the fuzzed base files: every built architecture's `tiny`, plus
/// deepseek2's legacy layout.
fn models() -> Vec<(&'static str, &'static str)> {
    let mut m: Vec<_> = pocketmoe::arch::built()
        .map(|a| (a.spec.name, "tiny"))
        .collect();
    m.push(("deepseek2", "tiny-kvb"));
    m
}

/// A tiny model loads and decodes in well under a second; a case still running after this hangs.
const TIMEOUT: Duration = Duration::from_secs(20);

/// Address-space limit of each child: a tiny run needs < 256 MiB; an absurd size must fail
/// (as a load error), not allocate the CI machine's memory.
const MEM_LIMIT: u64 = 1 << 30;

/// One modified file to try.
struct Case {
    base: PathBuf,
    label: String,
    key: String,
    value: GgufValue,
}

/// The values `v`'s key is set to in turn (same GGUF type as the original): the boundary values,
/// plus, for integers, half and one more than the original (plausible sizes that disagree with
/// the tensors or with other keys: head/rotary/latent mismatches, odd rotary dims, ...), and for
/// unsigned ones also -1 as an I32 (a converter writing a signed type: a negative size must not
/// read as an absent key that takes its default).
fn mutations(v: &GgufValue) -> Vec<GgufValue> {
    use GgufValue as V;
    const P31: u64 = 1 << 31;
    let near = |x: u64| [x / 2, x.saturating_add(1)];
    let mut out = match v {
        V::U8(_) => vec![V::U8(0), V::U8(u8::MAX)],
        V::U16(_) => vec![V::U16(0), V::U16(u16::MAX)],
        V::U32(_) => vec![V::U32(0), V::U32(u32::MAX), V::U32(P31 as u32)],
        V::U64(_) => vec![V::U64(0), V::U64(u64::MAX), V::U64(P31)],
        V::I8(_) => vec![V::I8(0), V::I8(-1), V::I8(i8::MAX)],
        V::I16(_) => vec![V::I16(0), V::I16(-1), V::I16(i16::MAX)],
        V::I32(_) => vec![V::I32(0), V::I32(-1), V::I32(i32::MAX)],
        V::I64(_) => vec![V::I64(0), V::I64(-1), V::I64(P31 as i64)],
        V::F32(_) => [0.0f32, -1.0, P31 as f32, f32::NAN, f32::INFINITY]
            .map(V::F32)
            .to_vec(),
        V::F64(_) => [0.0, -1.0, P31 as f64, f64::NAN, f64::INFINITY]
            .map(V::F64)
            .to_vec(),
        V::Bool(b) => vec![V::Bool(!b)],
        V::Str(_) | V::Array(_) => Vec::new(),
    };
    if matches!(v, V::U8(_) | V::U16(_) | V::U32(_) | V::U64(_)) {
        out.push(V::I32(-1));
    }
    if let Some(x) = v.as_u64().filter(|&x| x > 1) {
        for y in near(x) {
            // Same type as the original: values that do not fit are left out.
            let m = match v {
                V::U8(_) => u8::try_from(y).ok().map(V::U8),
                V::U16(_) => u16::try_from(y).ok().map(V::U16),
                V::U32(_) => u32::try_from(y).ok().map(V::U32),
                V::U64(_) => Some(V::U64(y)),
                V::I8(_) => i8::try_from(y).ok().map(V::I8),
                V::I16(_) => i16::try_from(y).ok().map(V::I16),
                V::I32(_) => i32::try_from(y).ok().map(V::I32),
                V::I64(_) => i64::try_from(y).ok().map(V::I64),
                _ => None,
            };
            out.extend(m.filter(|m| !out.contains(m)));
        }
    }
    out
}

/// Runs `pocketmoe run` on `file`; `None` when the outcome is acceptable, else why not.
fn check(file: &Path, key: &str, dir: &Path, id: usize) -> Option<String> {
    let trace = dir.join(format!("case-{id}.trace"));
    let errf = dir.join(format!("case-{id}.stderr"));
    let _ = std::fs::remove_file(&trace);
    let stderr = std::fs::File::create(&errf).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pocketmoe"));
    cmd.args(["run", "-m"])
        .arg(file)
        .args(["-p", "Hello world", "-n", "3", "--ctx", "64"])
        // The CPU on every build: the memory cap below leaves CUDA no room to start.
        .args(["--cpu", "--threads", "1", "--temp", "0"])
        .env("POCKETMOE_TRACE", &trace)
        .env("RUST_BACKTRACE", "0")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // SAFETY: setrlimit is async-signal-safe and touches no state of the parent.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: MEM_LIMIT,
                rlim_max: MEM_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawning pocketmoe run");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let err = std::fs::read_to_string(&errf).unwrap_or_default();
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(4)..].join(" | ")
    };
    let Some(status) = status else {
        return Some(format!("hung: killed after {} s", TIMEOUT.as_secs()));
    };
    if let Some(sig) = status.signal() {
        return Some(format!("killed by signal {sig}: {}", tail(&err)));
    }
    match status.code() {
        Some(0) => {
            let text = std::fs::read_to_string(&trace).unwrap_or_default();
            let sums: Vec<f64> = text
                .lines()
                .filter_map(|l| l.split(" sum ").nth(1))
                .map(|s| s.trim().parse().unwrap_or(f64::NAN))
                .collect();
            if sums.is_empty() {
                return Some(format!("ran but wrote no logits: {}", tail(&err)));
            }
            let bad = sums.iter().position(|s| !s.is_finite());
            bad.map(|i| format!("ran but step {i}'s logits are not finite (sum {})", sums[i]))
        }
        Some(1) => {
            let msg = err
                .lines()
                .find(|l| l.starts_with("error:"))
                .unwrap_or_default();
            let name = file.file_name().unwrap().to_string_lossy();
            if msg.is_empty() {
                Some(format!("exit 1 without an error line: {}", tail(&err)))
            } else if !names(msg, key) || !msg.contains(&*name) {
                Some(format!(
                    "refused, but the error does not name the key and file: {msg}"
                ))
            } else {
                None
            }
        }
        c => Some(format!(
            "exit status {c:?} (a panic exits 101): {}",
            tail(&err)
        )),
    }
}

/// Whether `msg` names `key` itself (not only a longer key it starts, e.g. `key_length_swa`).
fn names(msg: &str, key: &str) -> bool {
    msg.match_indices(key).any(|(i, _)| {
        let next = msg[i + key.len()..].chars().next();
        next.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '.'))
    })
}

#[test]
fn mutated_numeric_metadata_is_refused_naming_the_key_or_runs_finite() {
    let t_start = Instant::now();
    let mut cases = Vec::new();
    let mut bases = Vec::new();
    for (arch, preset) in models() {
        let base = common::synth_preset("hparams_fuzz", arch, preset, QuantMix::Q8_0, 1.0, 3);
        let file = GgufModel::open(&base).unwrap();
        for (k, v) in file.metadata() {
            for value in mutations(v) {
                cases.push(Case {
                    base: base.clone(),
                    label: format!("{arch}/{preset}"),
                    key: k.clone(),
                    value,
                });
            }
        }
        bases.push(base);
    }
    // The unmodified files run (else every case below would be refused for another reason).
    let dir = bases[0].parent().unwrap().to_path_buf();
    for (i, b) in bases.iter().enumerate() {
        assert_eq!(check(b, "", &dir, 100_000 + i), None, "{}", b.display());
    }
    // HPARAMS_FUZZ_VERBOSE=1: every case's outcome (the error line, or "ran").
    let verbose = std::env::var_os("HPARAMS_FUZZ_VERBOSE").is_some();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut opened: Option<(PathBuf, GgufModel)> = None;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(c) = cases.get(i) else { break };
                    if opened.as_ref().is_none_or(|(p, _)| *p != c.base) {
                        opened = Some((c.base.clone(), GgufModel::open(&c.base).unwrap()));
                    }
                    let base = &opened.as_ref().unwrap().1;
                    let out = dir.join(format!("case-{i}.gguf"));
                    common::write_with_key(base, &c.key, &c.value, &out);
                    let verdict = check(&out, &c.key, &dir, i);
                    if verbose {
                        let v = &c.value;
                        let msg = std::fs::read_to_string(dir.join(format!("case-{i}.stderr")))
                            .unwrap_or_default();
                        let msg = msg
                            .lines()
                            .find(|l| l.starts_with("error:"))
                            .unwrap_or("ran");
                        eprintln!("{}: {} = {v:?}: {msg}", c.label, c.key);
                    }
                    if let Some(why) = verdict {
                        let v = &c.value;
                        let line = format!("{}: {} = {v:?}: {why}", c.label, c.key);
                        eprintln!("FAIL {line}");
                        failures.lock().unwrap().push(line);
                    }
                    for ext in ["gguf", "trace", "stderr"] {
                        let _ = std::fs::remove_file(dir.join(format!("case-{i}.{ext}")));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{} cases over {} files in {:.1} s, {} failed",
        cases.len(),
        bases.len(),
        t_start.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} metadata mutations neither refused naming the key nor ran with finite logits:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `{arch}.expert_gating_func = 4` (sqrt-softplus, which hparams accepts as llama.cpp does) on
/// every built architecture: never a hang, abort or panic — it runs where the architecture reads
/// the key (deepseek2, glm4moe, minimax-m2; before the router had sqrt-softplus it was refused
/// by name, and before that building the graph panicked) and is ignored where the graph fixes the
/// gating (qwen3moe, ...). That the logits are right is `tests/parity.rs`
/// `sqrt_softplus_gating_cpu_parity`.
#[test]
fn sqrt_softplus_gating_runs_or_is_ignored() {
    let mut failures = Vec::new();
    let mut dir = None;
    for (i, (arch, preset)) in models().into_iter().enumerate() {
        let base = common::synth_preset("hparams_gating", arch, preset, QuantMix::Q8_0, 1.0, 3);
        let d = base.parent().unwrap().to_path_buf();
        let key = format!("{arch}.expert_gating_func");
        let out = d.join(format!("gating-{i}.gguf"));
        common::write_with_key(
            &GgufModel::open(&base).unwrap(),
            &key,
            &GgufValue::U32(4),
            &out,
        );
        if let Some(why) = check(&out, &key, &d, 200_000 + i) {
            failures.push(format!("{arch}/{preset}: {key} = 4: {why}"));
        }
        dir = Some(d);
    }
    if let Some(d) = dir {
        let _ = std::fs::remove_dir_all(d);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
