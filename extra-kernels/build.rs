//! Compiles the CUDA kernels in `kernels/` with nvcc when the `cuda` feature is on, and links
//! the CUDA runtime the crate's copy streams call (with no kernel to compile, directly, as `cc`
//! would).
//!
//! Architectures come from `CMAKE_CUDA_ARCHITECTURES` (the variable that also steers ggml-cuda's
//! build) in CMake syntax: `90`, `86-real`, `75-virtual`, `native`, `;`-separated. cudart is
//! linked the way ggml links it: shared when llama.cpp is built as shared libraries
//! (`LLAMA_BUILD_SHARED_LIBS=1`), static otherwise, so the program has one CUDA runtime.
use std::env;
use std::path::PathBuf;

const DEFAULT_ARCHS: &str = "75-virtual;80-virtual;86-real;89-real;90-real";

fn gencode(arch: &str) -> String {
    let (num, kind) = match arch.split_once('-') {
        Some((n, k)) => (n, k),
        None => (arch, "both"),
    };
    match kind {
        "real" => format!("-gencode=arch=compute_{num},code=sm_{num}"),
        "virtual" => format!("-gencode=arch=compute_{num},code=compute_{num}"),
        _ => format!("-gencode=arch=compute_{num},code=[sm_{num},compute_{num}]"),
    }
}

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=CMAKE_CUDA_ARCHITECTURES");
    println!("cargo:rerun-if-env-changed=LLAMA_BUILD_SHARED_LIBS");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let archs = env::var("CMAKE_CUDA_ARCHITECTURES").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let shared = env::var("LLAMA_BUILD_SHARED_LIBS").is_ok_and(|v| v == "1");
    let cuda_path = env::var("CUDA_PATH").ok().map(PathBuf::from);

    let mut build = cc::Build::new();
    build
        .cuda(true)
        .cudart(if shared { "shared" } else { "static" })
        .flag("-O3")
        .flag("-std=c++17");
    if let Some(root) = &cuda_path {
        // cc runs `nvcc` from PATH (and recognises it by that name); make CUDA_PATH's win.
        let path = env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![root.join("bin")];
        dirs.extend(env::split_paths(&path));
        env::set_var(
            "PATH",
            env::join_paths(dirs).expect("PATH entries are valid"),
        );
        println!(
            "cargo:rustc-link-search=native={}",
            root.join("lib").display()
        );
        println!(
            "cargo:rustc-link-search=native={}",
            root.join("lib64").display()
        );
    }
    for arch in archs.split(';').map(str::trim).filter(|a| !a.is_empty()) {
        if arch == "native" {
            build.flag("-arch=native");
        } else {
            build.flag(gencode(arch));
        }
    }
    let kernels: Vec<PathBuf> = std::fs::read_dir("kernels")
        .map(|dir| {
            dir.map(|e| e.expect("reading kernels/").path())
                .filter(|p| p.extension().is_some_and(|e| e == "cu"))
                .collect()
        })
        .unwrap_or_default();
    if kernels.is_empty() {
        // No kernel of our own today: link cudart as `cc` does for one (its library folder
        // beside nvcc, then `-l`), for the copy streams' runtime calls.
        if let Some(nvcc) = env::split_paths(&env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("nvcc"))
            .find(|p| p.is_file())
        {
            let lib = nvcc
                .parent()
                .expect("nvcc is in a folder")
                .join("../targets/x86_64-linux/lib");
            if lib.is_dir() {
                println!("cargo:rustc-link-search=native={}", lib.display());
            }
        }
        let lib = if shared { "cudart" } else { "cudart_static" };
        println!("cargo:rustc-link-lib={lib}");
        return;
    }
    build.files(&kernels);
    build.compile("pocketmoe_kernels");
}
