//! Generates bindings for the ggml headers that llama-cpp-sys-2 installed with its build.
//!
//! llama-cpp-sys-2 (`links = "llama"`) exports `DEP_LLAMA_GGML_CMAKE_DIR` = `<prefix>/lib/cmake`;
//! its headers sit in `<prefix>/include`. Binding those headers, rather than a second copy, keeps
//! the declarations and the linked library from the same build. Linking is llama-cpp-sys-2's job.
use std::env;
use std::path::PathBuf;

fn main() {
    let cmake_dir = env::var("DEP_LLAMA_GGML_CMAKE_DIR").expect(
        "llama-cpp-sys-2 did not export DEP_LLAMA_GGML_CMAKE_DIR (its ggml install is missing)",
    );
    let prefix = PathBuf::from(&cmake_dir).join("../..");
    let include = prefix.join("include");
    assert!(
        include.join("ggml.h").is_file(),
        "ggml.h not found under {} (from DEP_LLAMA_GGML_CMAKE_DIR={cmake_dir})",
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
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        builder = builder.clang_arg("-DPOCKETMOE_CUDA");
    }
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    builder
        .generate()
        .expect("bindgen failed on the ggml headers")
        .write_to_file(&out)
        .expect("could not write ggml bindings");
}
