//! File choice and name checks of `-hf` (llama.cpp's rules).
use super::*;

fn v(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn picks_as_llama_cpp() {
    let files = v(&[
        "README.md",
        "mmproj-m-Q4_K_M.gguf",
        "m-Q8_0.gguf",
        "m-Q4_K_M.gguf",
        "big/m-Q2_K-00002-of-00002.gguf",
        "big/m-Q2_K-00001-of-00002.gguf",
    ]);
    assert_eq!(pick_model(&files, ""), Some("m-Q4_K_M.gguf"));
    assert_eq!(pick_model(&files, "q8_0"), Some("m-Q8_0.gguf"));
    assert_eq!(
        pick_model(&files, "Q2_K"),
        Some("big/m-Q2_K-00001-of-00002.gguf")
    );
    assert_eq!(pick_model(&files, "IQ1_S"), None);
    assert_eq!(
        pick_model(&v(&["x-F16.gguf", "mmproj-F16.gguf"]), ""),
        Some("x-F16.gguf")
    );
    assert_eq!(
        parts(&files, "big/m-Q2_K-00001-of-00002.gguf"),
        v(&[
            "big/m-Q2_K-00001-of-00002.gguf",
            "big/m-Q2_K-00002-of-00002.gguf"
        ])
    );
}

#[test]
fn repo_ids_and_paths() {
    assert_eq!(
        split_repo_tag("a/b:Q8_0").unwrap(),
        ("a/b".into(), "Q8_0".into())
    );
    assert_eq!(split_repo_tag("a/b").unwrap(), ("a/b".into(), "".into()));
    for bad in ["a", "a/b/c", "../x", "a/.b", "a /b", ""] {
        assert!(split_repo_tag(bad).is_err(), "{bad}");
    }
    assert!(safe_path("a/b.gguf"));
    for bad in ["../x.gguf", "a/../../x", "/etc/x", "a\\b", "a//b"] {
        assert!(!safe_path(bad), "{bad}");
    }
}
