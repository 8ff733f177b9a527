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
        "-c, --ctx-size <N>",
        "--ctx <CTX>",
        "--temp",
        "--cors-origins",
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

/// Every llama-server option of issue 29 parses (the run then fails on the missing model, exit
/// 1), the multi-letter short ones included (`-ctk q8_0`, `-fa on`), and the ones with no effect
/// here say so in a one-line note.
#[test]
fn serve_accepts_every_llama_server_flag() {
    let flags: &[&[&str]] = &[
        &["--temp", "0.7"],
        &["--temperature", "0.7"],
        &["--top-k", "20"],
        &["--top-p", "0.9"],
        &["--min-p", "0.1"],
        &["--repeat-penalty", "1.1"],
        &["--seed", "42"],
        &["-s", "-1"],
        &["-n", "64"],
        &["--n-predict", "-1"],
        &["-b", "2048"],
        &["-ub", "256"],
        &["--batch-size", "2048"],
        &["--ubatch-size", "256"],
        &["--jinja"],
        &["--no-jinja"],
        &["--chat-template", "chatml"],
        &["--reasoning-format", "none"],
        &["--metrics"],
        &["--slots"],
        &["--no-slots"],
        &["--slot-save-path", "/tmp"],
        &["--embedding"],
        &["--embeddings"],
        &["--pooling", "mean"],
        &["--reranking"],
        &["--rerank"],
        &["--spm-infill"],
        &["--cont-batching"],
        &["-fa", "on"],
        &["--flash-attn", "auto"],
        &["-fa", "off"],
        &["-ctk", "q8_0"],
        &["-ctv", "q8_0"],
        &["--cache-type-k", "f16"],
        &["--cache-type-v", "f16"],
        &["--kv-unified"],
        &["--swa-full"],
        &["--context-shift"],
        &["--lora", "/tmp/a.gguf"],
        &["--verbose"],
        &["-v"],
        &["--offline"],
        &["--cors-origins", "http://localhost:3000"],
        &["--no-ui"],
        &["--tags", "a,b"],
        &["-np", "2"],
        &["--parallel", "2"],
        &["-c", "1024"],
        &["--ctx-size", "1024"],
        &["-a", "x"],
        &["--alias", "x"],
        &["-t", "2"],
        &["--threads", "2"],
        &["-ngl", "0"],
        &["--n-gpu-layers", "0"],
        &["--n-cpu-moe", "4"],
        &["-ncmoe", "4"],
        &["--api-key", "k"],
        &["--host", "127.0.0.1"],
        &["--port", "0"],
        &["--mirostat", "2"],
        &["--typical", "0.9"],
        &["--samplers", "top_k;temperature"],
        &["--ignore-eos"],
        &["-sp"],
        &["--keep", "-1"],
        &["--log-file", "/tmp/x.log"],
        &["--no-perf"],
        &["--api-key-file", "/dev/null"],
    ];
    for f in flags {
        let args = [&["-m", MISSING, "--port", "0"][..], f].concat();
        accepted(&serve(&args), &f.join(" "));
    }
    // All at once (no two of them conflict), and the notes are one line each.
    let all: Vec<&str> = ["-m", MISSING]
        .into_iter()
        .chain(
            flags
                .iter()
                .filter(|f| !["-fa", "--cache-type-k", "--cache-type-v", "--slots"].contains(&f[0]))
                .flat_map(|f| f.iter().copied()),
        )
        .collect();
    let err = accepted(&serve(&all), "all together");
    for want in [
        "note: --jinja: no effect here",
        "note: --lora: ignored",
        "note: --reasoning-format none: ignored",
        "note: --n-cpu-moe/--cpu-moe: ignored",
        "note: -b/--batch-size: sets /infill's prefix/suffix budget only",
        "note: --reranking: replaces --pooling mean",
        "note: --kv-unified",
        "note: --mirostat: ignored",
    ] {
        assert!(
            err.lines().any(|l| l.starts_with(want)),
            "no {want:?}: {err}"
        );
    }
    // Embeddings are served (issue 29 item 6), and --ignore-eos is: no note for them.
    assert!(!err.contains("--embedding"), "{err}");
    assert!(!err.contains("--ignore-eos"), "{err}");
    for bad in ["avg", "sum"] {
        let o = serve(&[
            "-m",
            MISSING,
            "--port",
            "0",
            "--embedding",
            "--pooling",
            bad,
        ]);
        assert_eq!(o.status.code(), Some(2), "--pooling {bad}: {}", text(&o).1);
        assert!(text(&o).1.contains("--pooling"), "{}", text(&o).1);
    }
    let err = accepted(
        &serve(&["-m", MISSING, "--port", "0", "-fa", "off"]),
        "-fa off",
    );
    assert!(err.contains("note: -fa off: ignored"), "{err}");
    let err = accepted(
        &serve(&["-m", MISSING, "--port", "0", "-ctk", "q8_0", "-ctv", "f16"]),
        "-ctk q8_0 -ctv f16",
    );
    assert!(err.contains("K and V share one cache type here"), "{err}");
    // A bad value still gets clap's usage error, naming what the option takes.
    let o = serve(&["-m", MISSING, "--port", "0", "-fa", "maybe"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
}

/// `-hf` with the Hub unreachable: a clear error naming the repo, exit 1 — never the help screen
/// with exit 0, with or without -m (downloads themselves: tests/hub_download.rs).
#[test]
fn serve_hf_without_network_names_the_repo() {
    let cache = std::env::temp_dir().join(format!("pocketmoe-aliases-hf-{}", std::process::id()));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    for args in [
        &["-hf", "ggml-org/gemma-3-1b-it-GGUF"][..],
        &["-m", MISSING, "-hf", "ggml-org/gemma-3-1b-it-GGUF"][..],
        &[
            "--hf-repo",
            "ggml-org/gemma-3-1b-it-GGUF",
            "--hf-file",
            "x.gguf",
        ][..],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_pocketmoe-serve"))
            .args(args)
            .env("HF_ENDPOINT", &url)
            .env("LLAMA_CACHE", &cache)
            .env_remove("MODEL_ENDPOINT")
            .output()
            .unwrap();
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {out}{err}");
        assert!(err.contains("ggml-org/gemma-3-1b-it-GGUF"), "{err}");
        assert!(err.contains("cannot reach the Hugging Face Hub"), "{err}");
        assert!(!out.contains("Usage"), "{out}");
    }
    let o = serve(&["--model-url", "https://example.com/m.gguf"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("https://example.com/m.gguf") && err.contains("-hf USER/MODEL"),
        "{err}"
    );
    // Neither -m nor -hf: clap says -m is required.
    let o = serve(&["--port", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("--model"), "{}", text(&o).1);
}

/// llama-server's key and TLS options: --api-key-file is read (a missing file is named),
/// TLS options fail with the reason, and `--cors '*'` without a key warns.
#[test]
fn serve_keys_tls_and_open_cors() {
    let o = serve(&[
        "-m",
        MISSING,
        "--port",
        "0",
        "--api-key-file",
        "/nonexistent/keys.txt",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--api-key-file /nonexistent/keys.txt"),
        "{err}"
    );
    let keys = std::env::temp_dir().join(format!("pocketmoe-keys-{}", std::process::id()));
    std::fs::write(&keys, "k1\n\nk2\n").unwrap();
    accepted(
        &serve(&[
            "-m",
            MISSING,
            "--port",
            "0",
            "--api-key",
            "a,b",
            "--api-key-file",
            keys.to_str().unwrap(),
        ]),
        "--api-key-file",
    );
    let _ = std::fs::remove_file(&keys);
    let o = serve(&[
        "-m",
        MISSING,
        "--port",
        "0",
        "--ssl-key-file",
        "k.pem",
        "--ssl-cert-file",
        "c.pem",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("does not serve TLS"), "{err}");
    let err = accepted(
        &serve(&["-m", MISSING, "--port", "0", "--cors-origins", "*"]),
        "--cors *",
    );
    assert!(
        err.contains("warning: --cors '*' without --api-key"),
        "{err}"
    );
    let err = accepted(
        &serve(&[
            "-m",
            MISSING,
            "--port",
            "0",
            "--cors-origins",
            "*",
            "--api-key",
            "k",
        ]),
        "--cors * with a key",
    );
    assert!(!err.contains("warning: --cors"), "{err}");
}
