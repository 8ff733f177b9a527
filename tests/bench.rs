//! `pocketmoe bench` end to end on the CPU with a tiny synthetic Qwen3-MoE: both engines run
//! (ours in the process, llama.cpp in its child), and the output has the promised shape — the
//! markdown columns and one row per test, the JSON fields, a PNG plot. Speed is not checked.
mod common;

use pocketmoe::cli::bench::report::{COLUMNS, SETTING_COLUMNS};
use pocketmoe::synth::{self, quantmix::QuantMix, SynthOptions};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The tiny preset in a folder of its own per test (`tag`): each test removes its folder at the
/// end, while the others run in parallel.
fn tiny(tag: &str) -> PathBuf {
    let dir = common::process_dir(&format!("pocketmoe-bench-{tag}"));
    let out = dir.join("qwen3moe.gguf");
    let opts = SynthOptions {
        arch: "qwen3moe".into(),
        preset: "tiny".into(),
        quant: QuantMix::Q4KM,
        routing_skew: 2.8,
        seed: 5,
        out: out.clone(),
    };
    synth::synth(&opts, &|_, _| {}).unwrap();
    out
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_string())
        .collect()
}

/// `mean ± sd` with both numbers positive / non-negative.
fn is_rate(cell: &str) -> bool {
    let Some((m, s)) = cell.split_once(" ± ") else {
        return false;
    };
    matches!((m.parse::<f64>(), s.parse::<f64>()), (Ok(m), Ok(s)) if m > 0.0 && s >= 0.0)
}

#[test]
fn both_engines_table_json_and_plot() {
    let model = tiny("table");
    let dir = model.parent().unwrap();
    let (json, png) = (dir.join("bench.json"), dir.join("bench.png"));
    let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["bench", "-m"])
        .arg(&model)
        .args(["-p", "32,64", "-n", "8", "--depth", "0,32", "--reps", "2"])
        .args(["--ubatch", "32,64", "--threads", "2", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&png)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The comparison table: its header, then one row per test, both engines measured.
    let lines: Vec<&str> = stdout.lines().collect();
    let head = lines
        .iter()
        .position(|l| cells(l) == COLUMNS)
        .unwrap_or_else(|| panic!("no comparison header in\n{stdout}"));
    let tests = [
        "pp32",
        "pp64",
        "tg8",
        "pp32 @ d32",
        "pp64 @ d32",
        "tg8 @ d32",
    ];
    for (i, t) in tests.iter().enumerate() {
        let c = cells(lines[head + 2 + i]);
        assert_eq!(c.len(), COLUMNS.len(), "{c:?}");
        assert_eq!((c[0].as_str(), c[1].as_str()), ("resident", *t));
        assert!(is_rate(&c[2]) && is_rate(&c[3]), "rates: {c:?}");
        assert!(c[4].ends_with('x'), "ratio: {c:?}");
        assert!(c[5].starts_with("-ngl 0 -ub "), "setting: {c:?}");
    }
    // The settings table: ours, and llama.cpp at both micro-batches.
    let head2 = lines
        .iter()
        .position(|l| cells(l) == SETTING_COLUMNS)
        .expect("settings header");
    let settings: Vec<Vec<String>> = lines[head2 + 2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .map(|l| cells(l))
        .collect();
    for label in ["pocketmoe -ub 2048", "-ngl 0 -ub 32", "-ngl 0 -ub 64"] {
        assert!(
            settings.iter().any(|s| s[2] == label && s[5] == "ran"),
            "{label} not run: {settings:?}"
        );
    }

    // JSON: the same rows with numbers, and every setting with its samples.
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["device"], "CPU");
    assert_eq!(v["reps"], 2);
    for k in [
        "model",
        "file_bytes",
        "threads",
        "bandwidths",
        "settings",
        "rows",
    ] {
        assert!(!v[k].is_null(), "JSON lacks {k}");
    }
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), tests.len());
    for (r, t) in rows.iter().zip(tests) {
        assert_eq!(r["test"], t);
        assert!(r["budget"].is_null());
        for k in ["ours_tok_s", "llama_tok_s", "ratio"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{t}: {k} = {}", r[k]);
        }
        // On the CPU, decode has a bound (host bandwidth); prefill does not.
        assert_eq!(r["bound_tok_s"].is_number(), t.starts_with("tg"), "{t}");
        for k in [
            "ours_std",
            "llama_std",
            "llama_setting",
            "ours_vram_bytes",
            "llama_vram_bytes",
            "ours_rss_bytes",
            "llama_rss_bytes",
            "hit_rate",
            "cache_hit_rate",
            "pcie_gbs",
            "stall_ms_per_token",
            "bound_fraction",
            "depth",
            "n_prompt",
            "n_gen",
        ] {
            assert!(r.get(k).is_some(), "row lacks {k}");
        }
    }
    for s in v["settings"].as_array().unwrap() {
        assert!(s["engine"] == "pocketmoe" || s["engine"] == "llama.cpp");
        assert_eq!(s["status"], "ran", "{s}");
        assert!(s["host_rss_bytes"].as_u64().unwrap() > 0);
        for m in s["results"].as_array().unwrap() {
            assert_eq!(m["tok_s"].as_array().unwrap().len(), 2);
            assert!(m["mean"].as_f64().unwrap() > 0.0);
        }
    }

    // The plot: a PNG of 1400 x (360 per test size + 50).
    let b = std::fs::read(&png).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&b[12..16], b"IHDR");
    let be = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!((be(16), be(20)), (1400, 3 * 360 + 50));
    assert_eq!(&b[b.len() - 8..b.len() - 4], b"IEND");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn budgets_need_a_gpu() {
    let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["bench", "-m", "/nonexistent.gguf", "--gpu-mem", "8GiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--gpu-mem budgets need --gpu"));
}

/// `--cpu-jobs`: the CPU channel's job profile instead of pp/tg — a job row per thread count and
/// job size (1, 2, 4, 8 experts, as many as the tiny model has), a line fit per thread count,
/// and the job graph's nodes by name: the channel's form (experts only, summed on the host) and
/// the ggml-summed form it is timed against. A zero thread count is refused by name.
#[test]
fn cpu_jobs_profile_the_cpu_channel() {
    let model = tiny("cpu-jobs");
    let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["bench", "-m", model.to_str().unwrap(), "--cpu-jobs", "1,2"])
        .args(["--reps", "20"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<String>> = text
        .lines()
        .filter(|l| l.starts_with("| 1 |") || l.starts_with("| 2 |"))
        .map(cells)
        .collect();
    use pocketmoe::gguf::Metadata as _;
    let n_expert = pocketmoe::gguf::GgufModel::open(&model)
        .unwrap()
        .get_u32("qwen3moe.expert_count")
        .unwrap() as usize;
    let ks: Vec<usize> = [1, 2, 4, 8]
        .into_iter()
        .filter(|&k| k <= n_expert)
        .collect();
    for t in ["1", "2"] {
        let jobs: Vec<&Vec<String>> = rows.iter().filter(|r| r[0] == t && r.len() == 9).collect();
        let sizes: Vec<usize> = jobs.iter().map(|r| r[3].parse().unwrap()).collect();
        assert_eq!(sizes, ks, "job rows of {t} threads:\n{text}");
        for r in &jobs {
            let us: Vec<f64> = r[4..].iter().map(|c| c.parse().unwrap()).collect();
            assert!(
                us[0] > 0.0 && us.iter().all(|x| x.is_finite() && *x >= 0.0),
                "{r:?}"
            );
        }
        assert!(
            rows.iter().any(|r| r[0] == t && r.len() == 4),
            "no fit for {t}:\n{text}"
        );
        let nodes: Vec<&Vec<String>> = rows.iter().filter(|r| r[0] == t && r.len() == 3).collect();
        assert_eq!(nodes.len(), 3, "node rows of {t} threads:\n{text}");
        // The channel's graph ends at the experts' outputs ("out", the down projection).
        assert!(
            nodes[..2].iter().all(|r| r[2].contains("ffn_moe_gate")
                && r[2].contains("ffn_moe_up")
                && r[2].contains("out ")
                && !r[2].contains("ffn_moe_weighted")),
            "{text}"
        );
        assert!(
            nodes[2][1].contains("ggml sums") && nodes[2][2].contains("ffn_moe_weighted"),
            "{text}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["bench", "-m", model.to_str().unwrap(), "--cpu-jobs", "4,0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cpu-jobs 0"), "{err}");
    let _ = std::fs::remove_dir_all(model.parent().unwrap());
}

/// Several GPUs: ours splits over them, but the in-process llama.cpp baseline runs on one GPU,
/// so it is refused by name rather than compared with a one-GPU llama.cpp.
#[test]
fn several_gpus_need_no_baseline() {
    let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["bench", "-m", "/nonexistent.gguf", "--gpu", "0,1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--gpu 0,1") && err.contains("--no-baseline") && err.contains("-sm layer"),
        "{err}"
    );
}

/// A setting our engine cannot run (GPU 99: no such device on a CUDA build, no CUDA on a CPU one)
/// still prints the table, and the exit status says it failed, naming the engine and its error.
#[test]
fn a_failed_setting_is_a_nonzero_exit() {
    let model = tiny("fail");
    let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["bench", "-m"])
        .arg(&model)
        .args([
            "--gpu",
            "99",
            "-p",
            "8",
            "-n",
            "0",
            "--reps",
            "1",
            "--no-baseline",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "exit 0: {stdout}\n{stderr}");
    assert!(stdout.contains("| pocketmoe |"), "no table: {stdout}");
    assert!(
        stderr.contains("setting(s) failed") && stderr.contains("pocketmoe"),
        "{stderr}"
    );
    std::fs::remove_dir_all(model.parent().unwrap()).ok();
}

/// A stand-in for stock `llama-bench` (`--llama-bench`): records its arguments and answers every
/// requested test with `rate` tok/s in llama-bench's `-o json` shape.
fn fake_llama_bench(dir: &std::path::Path, rate: f64) -> PathBuf {
    let exe = dir.join(format!("fake-llama-bench-{rate}"));
    let script = format!(
        r#"#!/usr/bin/env bash
[ -n "$PROBE" ] && exit 0
echo "$@" >> "{log}"
while [ $# -gt 0 ]; do
  case "$1" in -p) P="$2";; -n) N="$2";; -d) D="$2";; esac; shift
done
out=""
for d in ${{D//,/ }}; do
  for p in ${{P//,/ }}; do [ "$p" = 0 ] || out="$out{{\"n_prompt\": $p, \"n_gen\": 0, \"n_depth\": $d, \"avg_ts\": {rate}, \"stddev_ts\": 1.0, \"samples_ts\": [{rate}]}},"; done
  for n in ${{N//,/ }}; do [ "$n" = 0 ] || out="$out{{\"n_prompt\": 0, \"n_gen\": $n, \"n_depth\": $d, \"avg_ts\": {rate}, \"stddev_ts\": 1.0, \"samples_ts\": [{rate}]}},"; done
done
echo "[${{out%,}}]"
"#,
        log = dir.join("fake-llama-bench.args").display()
    );
    std::fs::write(&exe, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    runnable(&exe);
    exe
}

/// Waits until a script just written can be executed. While another test thread forks a child,
/// the child briefly holds every descriptor of this process, the script's write descriptor
/// included, and exec'ing the script meanwhile fails with ETXTBSY; once one exec succeeds, no
/// writable descriptor is left to inherit.
fn runnable(exe: &std::path::Path) {
    for _ in 0..200 {
        match Command::new(exe).env("PROBE", "1").output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            _ => return,
        }
    }
    panic!("{} stayed busy (ETXTBSY)", exe.display());
}

/// `pocketmoe bench` on the CPU with llama.cpp's micro-batch 32, 2 threads, `tests` and stock
/// llama-bench at `stock`.
fn bench_with_stock(
    model: &std::path::Path,
    tests: &[&str],
    stock: &std::path::Path,
    json: &std::path::Path,
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["bench", "-m"])
        .arg(model)
        .args(tests)
        .args(["--ubatch", "32", "--threads", "2", "--llama-bench"])
        .arg(stock)
        .arg("--json")
        .arg(json)
        .output()
        .unwrap()
}

/// `--llama-bench`: stock runs at exactly the settings the in-process search ran (same
/// micro-batch, threads, repetitions, tests), both figures are shown side by side, and the
/// comparison takes the faster llama.cpp (here the stand-in's absurd 1e6 tok/s), marked stock.
#[test]
fn stock_llama_bench_runs_beside_the_baseline_and_the_faster_counts() {
    let model = tiny("stock");
    let dir = model.parent().unwrap().to_path_buf();
    let json = dir.join("bench.json");
    let fake = fake_llama_bench(&dir, 1e6);
    let out = bench_with_stock(
        &model,
        &["-p", "32", "-n", "8", "--reps", "2"],
        &fake,
        &json,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let args = std::fs::read_to_string(dir.join("fake-llama-bench.args")).unwrap();
    let m = model.display().to_string();
    assert_eq!(
        args.trim(),
        format!("-m {m} -ngl 0 -ub 32 -b 2048 -t 2 -r 2 -p 32 -n 8 -d 0 -o json"),
        "stock must run the in-process setting's knobs and tests"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for r in v["rows"].as_array().unwrap() {
        assert_eq!(r["stock_tok_s"].as_f64(), Some(1e6), "{r}");
        assert_eq!(r["llama_tok_s"].as_f64(), Some(1e6), "{r}");
        let inproc = r["inproc_tok_s"].as_f64().unwrap();
        assert!(inproc > 0.0 && inproc < 1e6, "{r}");
        assert_eq!(r["llama_setting"], "-ngl 0 -ub 32 (stock)");
        // Stock measures no memory: the row shows the in-process run's at the same setting.
        assert!(r["llama_rss_bytes"].as_u64().unwrap() > 0, "{r}");
        let ours = r["ours_tok_s"].as_f64().unwrap();
        assert!(
            (r["ratio"].as_f64().unwrap() - ours / 1e6).abs() < 1e-12,
            "{r}"
        );
    }
    let lines: Vec<&str> = stdout.lines().collect();
    let head = lines.iter().position(|l| cells(l) == COLUMNS).unwrap();
    let c = cells(lines[head + 2]);
    assert!(c[6].contains(" / 1000000.0 ("), "in-process / stock: {c:?}");

    // A stock binary that fails is reported as failed; the comparison falls back to in-process.
    let broken = dir.join("broken-llama-bench");
    std::fs::write(&broken, "#!/bin/sh\nexit 3\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    runnable(&broken);
    let out = bench_with_stock(
        &model,
        &["-p", "0", "-n", "4", "--reps", "1"],
        &broken,
        &json,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let stock = v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["engine"] == "llama.cpp (stock)")
        .expect("a stock setting");
    assert!(
        stock["status"]["failed"]
            .as_str()
            .unwrap()
            .contains("exit status: 3"),
        "{stock}"
    );
    let r = &v["rows"][0];
    assert!(
        r["stock_tok_s"].is_null() && r["llama_tok_s"] == r["inproc_tok_s"],
        "{r}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
