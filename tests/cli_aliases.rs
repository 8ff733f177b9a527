//! llama.cpp's option names on `pocketmoe-serve` and `pocketmoe run` (issue 17 item 3), and the
//! synth error for an unknown architecture, through the built binaries: options are accepted
//! when parsing goes on to the next failure (a missing model file: exit 1, not clap's exit 2),
//! `-ngl` prints the one-line note of how it was mapped, and --help names the aliases.
use std::process::{Command, Output};

fn serve(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pocketmoe-serve"))
        .args(args)
        .env_remove("POCKETMOE_API_KEY")
        .output()
        .expect("running pocketmoe-serve")
}

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(args)
        .output()
        .expect("running pocketmoe")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

const MISSING: &str = "/nonexistent/pocketmoe-cli-aliases.gguf";

/// Parsed fine, then failed on the missing model (exit 1 with our error, not a usage error).
fn accepted(o: &Output, what: &str) -> String {
    let (_, err) = text(o);
    assert_eq!(o.status.code(), Some(1), "{what}: {err}");
    assert!(err.contains(MISSING), "{what}: {err}");
    assert!(!err.contains("unexpected argument"), "{what}: {err}");
    err
}

#[test]
fn serve_takes_llama_server_names() {
    let short = [
        "-m",
        MISSING,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "-c",
        "512",
        "-t",
        "2",
        "-np",
        "3",
        "-a",
        "name",
        "--api-key",
        "k",
    ];
    let err = accepted(&serve(&[&short[..], &["-ngl", "0"]].concat()), "short");
    assert!(
        err.contains("note: -ngl 0: running on the CPU"),
        "one-line note for -ngl 0: {err}"
    );
    let long = [
        "--model",
        MISSING,
        "--ctx-size",
        "512",
        "--threads",
        "2",
        "--parallel",
        "3",
        "--alias",
        "name",
        "--n-gpu-layers",
        "99",
        "--port",
        "0",
    ];
    let err = accepted(&serve(&long), "long");
    // On this machine either GPU 0 or, without CUDA, the CPU; either way one note says which.
    let note = err
        .lines()
        .find(|l| l.starts_with("note: -ngl 99: "))
        .unwrap_or_else(|| panic!("no -ngl note: {err}"));
    assert!(
        note.contains("running on GPU 0") || note.contains("running on the CPU"),
        "{note}"
    );
    for (args, what) in [
        (
            &["-np=2", "--gpu-layers", "all"][..],
            "-np=2 --gpu-layers all",
        ),
        (&["--ctx", "512", "-ngl", "auto"][..], "--ctx, -ngl auto"),
    ] {
        accepted(
            &serve(&[&["-m", MISSING, "--port", "0"][..], args].concat()),
            what,
        );
    }
    // -ngl and --gpu are exclusive; a bad -ngl value says what it takes.
    let o = serve(&["-m", MISSING, "-ngl", "1", "--gpu", "0"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    let o = serve(&["-m", MISSING, "-ngl", "lots"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("auto or all"), "{err}");
}

#[test]
fn serve_help_names_the_aliases() {
    let o = serve(&["--help"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for want in [
        "-c, --ctx <CTX>",
        "--ctx-size",
        "-t, --threads",
        "-a, --alias",
        "-np",
        "--parallel",
        "--n-gpu-layers",
        "-ngl",
        "--gpu-layers",
        "--host",
        "--port",
        "--api-key",
        "--parse-special-in-content",
        "/v1/models",
    ] {
        assert!(out.contains(want), "--help lacks {want:?}:\n{out}");
    }
}

#[test]
fn run_takes_llama_cli_names() {
    let args = [
        "run", "-m", MISSING, "-p", "hi", "-n", "4", "-c", "64", "-t", "1", "-ngl", "0",
    ];
    accepted(&cli(&args), "run short");
    let args = [
        "run",
        "-m",
        MISSING,
        "-p",
        "hi",
        "--ctx-size",
        "64",
        "--threads",
        "1",
        "--n-gpu-layers",
        "99",
    ];
    accepted(&cli(&args), "run long");
    let o = cli(&["run", "-m", MISSING, "-p", "hi", "-ngl", "9", "--cpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    let (out, _) = text(&cli(&["run", "--help"]));
    for want in [
        "-c, --ctx",
        "--ctx-size",
        "-t, --threads",
        "--n-gpu-layers",
        "-ngl",
    ] {
        assert!(out.contains(want), "run --help lacks {want:?}:\n{out}");
    }
}

#[test]
fn synth_unknown_arch_lists_the_supported_ones() {
    let out =
        std::env::temp_dir().join(format!("pocketmoe-cli-aliases-{}.gguf", std::process::id()));
    let o = cli(&["synth", "--arch", "mixtral", "-o", out.to_str().unwrap()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!out.exists());
    for arch in pocketmoe::synth::presets::archs() {
        assert!(err.contains(&arch), "{arch} not listed: {err}");
    }
    for want in [
        "qwen3moe",
        "gpt-oss",
        "deepseek2",
        "llama",
        "mixtral -> llama",
        "--arch llama",
    ] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
    assert!(!err.contains("available: )"), "{err}");
    // Any unknown name gets the list and the Mixtral hint.
    let o = cli(&["synth", "--arch", "nope", "-o", out.to_str().unwrap()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("qwen3moe, ") && err.contains("mixtral -> llama"),
        "{err}"
    );
    // A known architecture with an unknown preset still lists its presets.
    let o = cli(&[
        "synth",
        "--arch",
        "llama",
        "--preset",
        "nope",
        "-o",
        out.to_str().unwrap(),
    ]);
    let (_, err) = text(&o);
    assert!(err.contains("mixtral-8x7b"), "{err}");
}

#[test]
fn llama_flags_are_rewritten_only_where_they_are_options() {
    use pocketmoe::cli::{llama_flags, SERVE_LLAMA_FLAGS};
    let args = ["serve", "-np", "4", "-ngl=99", "-npx", "-ngl2", "--", "-np"]
        .map(std::ffi::OsString::from);
    let got: Vec<String> = llama_flags(args, SERVE_LLAMA_FLAGS)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    assert_eq!(
        got,
        [
            "serve",
            "--parallel",
            "4",
            "--n-gpu-layers=99",
            "-npx",
            "-ngl2",
            "--",
            "-np"
        ]
    );
}
