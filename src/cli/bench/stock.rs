//! Stock `llama-bench` beside the in-process baseline (issue 13): the llama.cpp a user builds, run
//! at exactly the settings the in-process search chose, so every ratio can be checked against the
//! real opponent in the same sitting.
//!
//! `pocketmoe bench --llama-bench PATH` runs, for each llama.cpp setting that ran, the binary at
//! `PATH` with the same placement and knobs (`-ngl`, `--n-cpu-moe`, `-ub`, `-b`, `-t`, `-r`, the
//! same pp/tg sizes and depths; `-sm none -mg G` for one GPU), reads its `-o json` output and adds
//! a setting of engine [`ENGINE`]. The comparison then takes llama.cpp's fastest figure from
//! either (the conservative ratio), and shows in-process vs stock at the same setting.
//!
//! Stock reports no VRAM; its placement is the in-process one's, so it fits exactly when that
//! setting fits.
use super::measure::{Measurement, Test};
use super::report::{Setting, Status};
use anyhow::{bail, Context as _, Result};
use serde::Deserialize;
use std::path::Path;
use std::process::Command;

/// The engine name of stock llama-bench's settings.
pub const ENGINE: &str = "llama.cpp (stock)";

/// One result of `llama-bench -o json`.
#[derive(Debug, Deserialize)]
struct Record {
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    avg_ts: f64,
    stddev_ts: f64,
    #[serde(default)]
    samples_ts: Vec<f64>,
}

/// What stock needs to reproduce one in-process setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knobs {
    pub gpu: Option<usize>,
    pub n_layer: usize,
    pub threads: usize,
    pub reps: usize,
}

/// llama-bench's arguments for `setting` (after `-m MODEL`), running the tests it ran.
pub fn args(setting: &Setting, k: &Knobs) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |x: &str, y: String| {
        a.push(x.into());
        a.push(y);
    };
    match k.gpu {
        None => push("-ngl", "0".into()),
        Some(g) => {
            push("-ngl", "99".into());
            push("-sm", "none".into());
            push("-mg", g.to_string());
            let n = setting.n_cpu_moe.unwrap_or(0).min(k.n_layer);
            if n > 0 {
                push("--n-cpu-moe", n.to_string());
            }
        }
    }
    push("-ub", setting.n_ubatch.to_string());
    // As the in-process context: the logical batch is at least 2048 (llama-bench's default).
    push("-b", setting.n_ubatch.max(2048).to_string());
    push("-t", k.threads.to_string());
    push("-r", k.reps.to_string());
    let list = |f: &dyn Fn(&Measurement) -> usize, keep: &dyn Fn(&Measurement) -> bool| {
        let mut v: Vec<usize> = setting.results.iter().filter(|m| keep(m)).map(f).collect();
        v.sort_unstable();
        v.dedup();
        if v.is_empty() {
            "0".to_string()
        } else {
            v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
        }
    };
    push("-p", list(&|m| m.n_prompt, &|m| m.n_prompt > 0));
    push("-n", list(&|m| m.n_gen, &|m| m.n_prompt == 0));
    push("-d", list(&|m| m.depth, &|_| true));
    push("-o", "json".into());
    a
}

/// Parses `llama-bench -o json` into measurements named as ours.
pub fn parse(json: &str) -> Result<Vec<Measurement>> {
    let recs: Vec<Record> =
        serde_json::from_str(json.trim()).context("reading llama-bench's JSON output")?;
    Ok(recs
        .into_iter()
        .map(|r| {
            let t = Test {
                n_prompt: r.n_prompt,
                n_gen: if r.n_prompt > 0 { 0 } else { r.n_gen },
                depth: r.n_depth,
            };
            Measurement {
                test: t.name(),
                n_prompt: t.n_prompt,
                n_gen: t.n_gen,
                depth: t.depth,
                tok_s: r.samples_ts,
                mean: r.avg_ts,
                std: r.stddev_ts,
                offload: None,
            }
        })
        .collect())
}

/// Runs stock llama-bench at every in-process llama.cpp setting that ran; one stock setting each
/// (a failed run is reported as such, never dropped).
pub fn run(exe: &Path, model: &Path, inproc: &[Setting], k: &Knobs) -> Vec<Setting> {
    inproc
        .iter()
        .filter(|s| s.engine == "llama.cpp" && s.status == Status::Ran && !s.results.is_empty())
        .map(|s| {
            let a = args(s, k);
            eprintln!(
                "llama.cpp (stock): {} -m {} {}",
                exe.display(),
                model.display(),
                a.join(" ")
            );
            let mut out = Setting {
                engine: ENGINE.into(),
                vram_bytes: None,
                host_rss_bytes: 0,
                results: Vec::new(),
                ..s.clone()
            };
            match run_one(exe, model, &a) {
                Ok(r) => out.results = r,
                Err(e) => {
                    out.fits = false;
                    out.status = Status::Failed(format!("{e:#}"));
                }
            }
            out
        })
        .collect()
}

fn run_one(exe: &Path, model: &Path, a: &[String]) -> Result<Vec<Measurement>> {
    let mut cmd = Command::new(exe);
    cmd.arg("-m").arg(model).args(a);
    // As the user runs it: without the ggml-cuda switches our backend set in this process.
    for var in crate::ggml::cuda_env_set_by_us() {
        cmd.env_remove(var);
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", exe.display(), out.status);
    }
    parse(&String::from_utf8_lossy(&out.stdout)).with_context(|| format!("from {}", exe.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: usize, n: usize, d: usize) -> Measurement {
        let t = Test {
            n_prompt: p,
            n_gen: n,
            depth: d,
        };
        Measurement {
            test: t.name(),
            n_prompt: p,
            n_gen: n,
            depth: d,
            tok_s: vec![],
            mean: 1.0,
            std: 0.0,
            offload: None,
        }
    }

    #[test]
    fn stock_runs_the_same_placement_and_tests() {
        let s = Setting {
            engine: "llama.cpp".into(),
            budget: Some(8 << 30),
            label: "-ngl 99 --n-cpu-moe 30 -ub 512".into(),
            n_cpu_moe: Some(30),
            n_ubatch: 512,
            vram_bytes: Some(1),
            host_rss_bytes: 1,
            fits: true,
            status: Status::Ran,
            results: vec![
                m(4096, 0, 0),
                m(0, 128, 0),
                m(4096, 0, 8192),
                m(0, 128, 8192),
            ],
        };
        let k = Knobs {
            gpu: Some(0),
            n_layer: 48,
            threads: 16,
            reps: 3,
        };
        let a = args(&s, &k).join(" ");
        assert_eq!(
            a,
            "-ngl 99 -sm none -mg 0 --n-cpu-moe 30 -ub 512 -b 2048 -t 16 -r 3 \
             -p 4096 -n 128 -d 0,8192 -o json"
        );
        // A pp-only setting asks for no tg test; all on the GPU passes no --n-cpu-moe.
        let pp = Setting {
            n_cpu_moe: Some(0),
            n_ubatch: 4096,
            results: vec![m(4096, 0, 0)],
            ..s
        };
        let a = args(&pp, &k).join(" ");
        assert!(
            a.contains("-ub 4096 -b 4096") && a.contains("-p 4096 -n 0 -d 0"),
            "{a}"
        );
        assert!(!a.contains("n-cpu-moe"), "{a}");
    }

    #[test]
    fn parses_llama_bench_json_into_our_test_names() {
        // The shape llama-bench 0.28 prints with -o json (fields we do not read elided).
        let json = r#"[
          {"build_commit": "x", "n_prompt": 4096, "n_gen": 0, "n_depth": 8192,
           "avg_ts": 2500.5, "stddev_ts": 12.5, "samples_ts": [2490.0, 2511.0]},
          {"build_commit": "x", "n_prompt": 0, "n_gen": 128, "n_depth": 0,
           "avg_ts": 57.0, "stddev_ts": 1.0, "samples_ts": [56.0, 58.0]}
        ]"#;
        let r = parse(json).unwrap();
        assert_eq!(r[0].test, "pp4096 @ d8192");
        assert_eq!(r[1].test, "tg128");
        assert_eq!((r[1].mean, r[1].std, r[1].tok_s.len()), (57.0, 1.0, 2));
        assert!(parse("llama-bench: error").is_err());
    }
}
