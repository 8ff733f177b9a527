//! Generates bindings for the ggml headers of the one llama.cpp tree that llama-cpp-sys-4 builds.
//!
//! llama-cpp-sys-4 (`links = "llama"`) exports no metadata to its dependents, so the headers are
//! found in its source package: `<cargo registry>/llama-cpp-sys-4-<PIN>/llama.cpp/ggml/include`.
//! Its patches touch only libllama and common (never ggml), so these are the declarations of the
//! ggml it compiles and links. `POCKETMOE_GGML_INCLUDE` overrides the search (vendored sources).
//! Linking is llama-cpp-sys-4's job.
use std::env;
use std::path::PathBuf;

/// The pinned llama-cpp-sys-4 version; must equal ggml-sys/Cargo.toml's `=` requirement (checked).
const PIN: &str = "0.11.0";

fn check_pin() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("Cargo.toml");
    println!("cargo:rerun-if-changed={}", manifest.display());
    let text = std::fs::read_to_string(&manifest).expect("read ggml-sys/Cargo.toml");
    let want = format!("llama-cpp-sys-4 = {{ version = \"={PIN}\"");
    assert!(
        text.contains(&want),
        "ggml-sys/build.rs PIN = {PIN} but ggml-sys/Cargo.toml does not pin llama-cpp-sys-4 =\
         {PIN}: move both together (docs/design.md §5.1, 'Moving the pin')"
    );
}

fn find_include() -> PathBuf {
    println!("cargo:rerun-if-env-changed=POCKETMOE_GGML_INCLUDE");
    if let Some(dir) = env::var_os("POCKETMOE_GGML_INCLUDE") {
        return PathBuf::from(dir);
    }
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("neither CARGO_HOME nor HOME is set: cannot find the cargo registry");
    let registry = cargo_home.join("registry").join("src");
    let pkg = format!("llama-cpp-sys-4-{PIN}");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&registry)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", registry.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(&pkg).join("llama.cpp/ggml/include"))
        .filter(|p| p.join("ggml.h").is_file())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "{pkg}/llama.cpp/ggml/include/ggml.h not found under {} (set POCKETMOE_GGML_INCLUDE \
             to the ggml/include of that package's source)",
            registry.display()
        )
    })
}

/// The architecture names (`general.architecture`) libllama of this tree knows, read from its
/// `src/llama-arch.cpp` (`{ LLM_ARCH_X, "name" }` rows), as `LLAMA_ARCH_NAMES` in `OUT_DIR`: what
/// lets a refusal say "llama.cpp runs this, we do not" instead of "unknown".
fn write_arch_names(include: &std::path::Path) {
    let src = include.join("../../src/llama-arch.cpp");
    println!("cargo:rerun-if-changed={}", src.display());
    let text = std::fs::read_to_string(&src)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", src.display()));
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("{ LLM_ARCH_")?;
            let q0 = rest.find('"')? + 1;
            let q1 = rest[q0..].find('"')? + q0;
            // CLIP is a placeholder of llama-quantize's, not a model llama.cpp runs.
            (!rest.starts_with("UNKNOWN") && !rest.starts_with("CLIP"))
                .then(|| rest[q0..q1].to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    assert!(
        names.len() > 50 && names.iter().any(|n| n == "qwen3moe"),
        "{} did not list llama.cpp's architectures as expected ({} names)",
        src.display(),
        names.len()
    );
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("llama_arch_names.rs");
    let body: String = names.iter().map(|n| format!("    {n:?},\n")).collect();
    std::fs::write(
        out,
        format!("/// Architectures libllama of this tree loads.\npub const LLAMA_ARCH_NAMES: &[&str] = &[\n{body}];\n"),
    )
    .expect("write llama_arch_names.rs");
}

fn main() {
    check_pin();
    // What `pocketmoe --version` names as the tree (ggml's own build-commit string is whatever
    // git repository the copied sources sit in, i.e. ours).
    println!("cargo:rustc-env=POCKETMOE_LLAMA_TREE=llama-cpp-sys-4 {PIN}");
    let include = find_include();
    write_arch_names(&include);
    assert!(
        include.join("ggml.h").is_file(),
        "ggml.h not found under {}",
        include.display()
    );
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:include={}", include.display());

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("ggml_.*|gguf_.*")
        .allowlist_type("ggml_.*|gguf_.*")
        .allowlist_var("GGML_.*|GGUF_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    if env::var_os("CARGO_FEATURE_CUDA_API").is_some() {
        builder = builder.clang_arg("-DPOCKETMOE_CUDA");
    }
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    builder
        .generate()
        .expect("bindgen failed on the ggml headers")
        .write_to_file(&out)
        .expect("could not write ggml bindings");
}
