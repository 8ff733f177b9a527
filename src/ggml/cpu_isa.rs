//! Which CPU kernels this build's ggml-cpu was compiled for, and whether this host can run them.
//!
//! llama-cpp-sys-4 builds one ggml-cpu, for the CPU that builds it by default (`-march=native`
//! less AMX, `.cargo/config.toml`, as llama.cpp's own CMake build does), AVX-512
//! F/VBMI/VNNI/BF16 without AMX (ggml's `zen4` set) in the device build (`scripts/build-cuda.sh`,
//! through its C flags; why no AMX is said there). ggml's own runtime-dispatched variants
//! (`GGML_BACKEND_DL` + `GGML_CPU_ALL_VARIANTS`) would move ggml-cpu into a dlopen'ed module that
//! our code, which calls the CPU backend directly, cannot link against; so the variant is chosen
//! at build time, named here like ggml's variants, and checked against the host at start-up
//! instead of dying on an illegal instruction.

/// One instruction-set extension: ggml's name, whether ggml-cpu was compiled with it, and the
/// `/proc/cpuinfo` flag that says the host has it.
struct Ext {
    name: &'static str,
    compiled: unsafe extern "C" fn() -> std::os::raw::c_int,
    cpuinfo: &'static str,
}

fn exts() -> [Ext; 10] {
    use ggml_sys as s;
    let e = |name, compiled, cpuinfo| Ext {
        name,
        compiled,
        cpuinfo,
    };
    [
        e("AVX2", s::ggml_cpu_has_avx2 as _, "avx2"),
        e("FMA", s::ggml_cpu_has_fma as _, "fma"),
        e("F16C", s::ggml_cpu_has_f16c as _, "f16c"),
        e("BMI2", s::ggml_cpu_has_bmi2 as _, "bmi2"),
        e("AVX_VNNI", s::ggml_cpu_has_avx_vnni as _, "avx_vnni"),
        e("AVX512", s::ggml_cpu_has_avx512 as _, "avx512f"),
        e(
            "AVX512_VBMI",
            s::ggml_cpu_has_avx512_vbmi as _,
            "avx512vbmi",
        ),
        e(
            "AVX512_VNNI",
            s::ggml_cpu_has_avx512_vnni as _,
            "avx512_vnni",
        ),
        e(
            "AVX512_BF16",
            s::ggml_cpu_has_avx512_bf16 as _,
            "avx512_bf16",
        ),
        e("AMX_INT8", s::ggml_cpu_has_amx_int8 as _, "amx_int8"),
    ]
}

/// The compiled CPU kernels, as ggml names its variants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuVariant {
    /// ggml's variant name for this extension set (`haswell`, `icelake`, `sapphirerapids`, ...).
    pub name: &'static str,
    /// The extensions compiled in.
    pub compiled: Vec<&'static str>,
    /// Compiled-in extensions this host lacks (None: the host's flags could not be read).
    pub missing_on_host: Option<Vec<&'static str>>,
}

/// ggml's variant name (`ggml/src/CMakeLists.txt`, `GGML_CPU_ALL_VARIANTS`) for a set of
/// extensions: the most capable variant whose list it contains.
pub fn variant_name(has: &dyn Fn(&str) -> bool) -> &'static str {
    let all = |xs: &[&str]| xs.iter().all(|x| has(x));
    if all(&[
        "AVX512",
        "AVX512_VBMI",
        "AVX512_VNNI",
        "AVX512_BF16",
        "AMX_INT8",
    ]) {
        "sapphirerapids"
    } else if all(&["AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"]) {
        "zen4"
    } else if all(&["AVX512", "AVX512_VNNI", "AVX512_BF16"]) {
        "cooperlake"
    } else if all(&["AVX512", "AVX512_VBMI", "AVX512_VNNI"]) {
        "icelake"
    } else if all(&["AVX512", "AVX512_VNNI"]) {
        "cascadelake"
    } else if all(&["AVX512", "AVX512_VBMI"]) {
        "cannonlake"
    } else if all(&["AVX512"]) {
        "skylakex"
    } else if all(&["AVX2", "AVX_VNNI"]) {
        "alderlake"
    } else if all(&["AVX2", "FMA", "F16C", "BMI2"]) {
        "haswell"
    } else {
        "x64"
    }
}

/// The CPU flags of this host (`/proc/cpuinfo`), or None where there is no such file.
fn host_flags() -> Option<Vec<String>> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("flags"))?;
    Some(
        line.split_once(':')?
            .1
            .split_whitespace()
            .map(str::to_string)
            .collect(),
    )
}

/// This build's CPU kernels and what the host lacks of them.
pub fn cpu_variant() -> CpuVariant {
    let exts = exts();
    // SAFETY: plain queries of compile-time constants.
    let compiled: Vec<&'static str> = exts
        .iter()
        .filter(|e| unsafe { (e.compiled)() } != 0)
        .map(|e| e.name)
        .collect();
    let name = variant_name(&|x| compiled.contains(&x));
    let missing_on_host = host_flags().map(|flags| {
        exts.iter()
            .filter(|e| compiled.contains(&e.name) && !flags.iter().any(|f| f == e.cpuinfo))
            .map(|e| e.name)
            .collect()
    });
    CpuVariant {
        name,
        compiled,
        missing_on_host,
    }
}

impl std::fmt::Display for CpuVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.compiled.join(" "))
    }
}

/// An error naming what this host lacks, when the build's CPU kernels use instructions it does
/// not have (they would die on an illegal instruction at the first CPU matmul).
pub fn check_host() -> Result<(), String> {
    let v = cpu_variant();
    match &v.missing_on_host {
        Some(m) if !m.is_empty() => Err(format!(
            "this build's CPU kernels are ggml's `{}` variant and use {}, which this CPU does not \
             have; rebuild for this host (scripts/build-cuda.sh: CPU_VARIANT=haswell, or a plain \
             `cargo build --release`)",
            v.name,
            m.join(", ")
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_follow_ggml() {
        let set = |xs: &'static [&'static str]| move |x: &str| xs.contains(&x);
        assert_eq!(
            variant_name(&set(&["AVX2", "FMA", "F16C", "BMI2"])),
            "haswell"
        );
        assert_eq!(
            variant_name(&set(&[
                "AVX2",
                "FMA",
                "F16C",
                "BMI2",
                "AVX512",
                "AVX512_VBMI",
                "AVX512_VNNI",
                "AVX512_BF16",
                "AMX_INT8"
            ])),
            "sapphirerapids"
        );
        assert_eq!(
            variant_name(&set(&["AVX2", "AVX512", "AVX512_VBMI", "AVX512_VNNI"])),
            "icelake"
        );
        assert_eq!(variant_name(&set(&["AVX2"])), "x64");
    }

    #[test]
    fn this_build_runs_here() {
        // CI builds for the machine it runs on (at least AVX2): the check must pass there, and
        // the build must have the AVX2 kernels the CPU expert channel relies on.
        let v = cpu_variant();
        assert!(check_host().is_ok(), "{v:?}");
        #[cfg(target_arch = "x86_64")]
        assert!(v.compiled.contains(&"AVX2"), "{v:?}");
    }
}
