//! Our GGUF reader and writer against the reference, ggml's own parser (`gguf_init_from_file` /
//! `gguf_init_from_buffer` of the linked llama.cpp, via `pocketmoe::ggml::gguf_ref`):
//! - files from our writer are read by ggml with the same version, alignment, data offset,
//!   keys, value types, strings, integers, tensor names, types, shapes, offsets, sizes and bytes;
//! - on the malformed corpus, ggml rejects every file except the few where we are stricter;
//! - differential fuzzing: on mutations of a valid file, whenever we accept, ggml accepts and
//!   sees the same index, and whenever ggml accepts but we reject, the reason is one of our
//!   documented extra checks.
use std::path::{Path, PathBuf};

use pocketmoe::ggml::gguf_ref::{self as ggml_ref, GgmlGguf};
use pocketmoe::ggml::GgmlType;
use pocketmoe::gguf::{FormatError, GgufError, GgufHeader, GgufModel, GgufValue, GgufWriter};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;

fn test_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("gguf_ggml_ref")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fill(i: usize, buf: &mut [u8]) -> std::io::Result<()> {
    buf.iter_mut()
        .enumerate()
        .for_each(|(j, b)| *b = (j.wrapping_mul(7) ^ (i * 131)) as u8);
    Ok(())
}

/// Everything ggml's reader supports: all scalar types, arrays of each (no nested arrays).
fn writer(alignment: Option<u32>) -> GgufWriter {
    let mut w = match alignment {
        Some(a) => GgufWriter::new().with_alignment(a),
        None => GgufWriter::new(),
    };
    w.add_kv("general.architecture", "qwen3moe");
    w.add_kv("general.name", "ünïcode näme 🦀");
    w.add_kv("qwen3moe.block_count", GgufValue::U32(2));
    w.add_kv("t.u8", GgufValue::U8(200));
    w.add_kv("t.i8", GgufValue::I8(-100));
    w.add_kv("t.u16", GgufValue::U16(50000));
    w.add_kv("t.i16", GgufValue::I16(-20000));
    w.add_kv("t.i32", GgufValue::I32(-7));
    w.add_kv("t.f32", GgufValue::F32(0.25));
    w.add_kv("t.bool", true);
    w.add_kv("t.u64", GgufValue::U64(u64::MAX - 1));
    w.add_kv("t.i64", GgufValue::I64(i64::MIN + 1));
    w.add_kv("t.f64", GgufValue::F64(1e100));
    w.add_kv("tokenizer.ggml.tokens", vec!["<s>", "</s>", "", "日本"]);
    w.add_kv("tokenizer.ggml.scores", vec![0.0f32, -1.5]);
    w.add_kv("tokenizer.ggml.token_type", vec![1i32, 3, 1, 1]);
    w.add_kv("t.bools", vec![true, false]);
    w.add_kv("t.u64s", vec![1u64, 2, 3]);
    w.add_kv("t.empty", Vec::<u32>::new());
    let tensors: [(&str, GgmlType, &[u64]); 6] = [
        ("token_embd.weight", GgmlType::Q8_0, &[64, 10]),
        ("blk.0.attn_norm.weight", GgmlType::F32, &[13]),
        ("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, &[256, 3, 4]),
        ("blk.0.ffn_down_exps.weight", GgmlType::MXFP4, &[64, 5, 4]),
        ("blk.0.attn_q.weight", GgmlType::F16, &[31, 2, 1, 3]),
        ("output.weight", GgmlType::IQ2_XXS, &[256, 2]),
    ];
    for (name, ty, ne) in tensors {
        w.add_tensor(name, ty, ne).unwrap();
    }
    w
}

/// What ggml's C API shows of a string: it hands out NUL-terminated copies, so text after an
/// embedded NUL (valid GGUF, and kept by both parsers) is not visible through it.
fn c_view(s: &str) -> &str {
    s.split('\0').next().unwrap_or("")
}

/// ggml's view must equal ours in every field both report.
fn assert_same_index(ours: &GgufHeader, g: &GgmlGguf) {
    assert_eq!(g.version, ours.version());
    assert_eq!(g.alignment, ours.alignment());
    assert_eq!(g.data_offset, ours.data_offset());
    assert_eq!(g.kvs.len(), ours.metadata().len(), "n_kv");
    let views = |v: &[String]| v.iter().map(|s| c_view(s).to_string()).collect::<Vec<_>>();
    for (kv, (key, v)) in g.kvs.iter().zip(ours.metadata()) {
        assert_eq!(kv.key, c_view(key));
        assert_eq!(kv.ty, v.value_type() as u32, "{key:?}: type");
        match v {
            GgufValue::Str(s) => assert_eq!(kv.strings, [c_view(s)], "{key:?}"),
            GgufValue::Array(a) => {
                assert_eq!(kv.array, Some((a.elem_type() as u32, a.len())), "{key:?}");
                if let Some(strs) = a.as_strs() {
                    assert_eq!(kv.strings, views(strs), "{key:?}");
                }
            }
            v => assert_eq!(kv.int, v.as_i128(), "{key:?}"),
        }
    }
    assert_eq!(g.tensors.len(), ours.tensors().len(), "n_tensors");
    for (gt, t) in g.tensors.iter().zip(ours.tensors()) {
        assert_eq!(gt.name, c_view(&t.name));
        assert_eq!(gt.ty, t.ty.id(), "{:?}", t.name);
        assert_eq!(gt.ne.map(|n| n as u64), t.ne, "{:?}", t.name);
        assert_eq!(gt.offset, t.offset - ours.data_offset(), "{:?}", t.name);
        assert_eq!(gt.n_bytes, t.n_bytes, "{:?}", t.name);
    }
}

fn ggml_reads_our_file(alignment: Option<u32>) {
    let path = test_dir(&format!("writer_{alignment:?}")).join("m.gguf");
    writer(alignment).write(&path, fill).unwrap();
    let ours = GgufModel::open(&path).unwrap();
    let g = ggml_ref::read_file(&path).expect("ggml rejected our writer's output");
    assert_same_index(ours.shards()[0].header(), &g);
    assert_eq!(g.tensors.len(), 6);
    assert_eq!(g.kvs.len(), 19 + usize::from(alignment.is_some()));
    // ggml loads the data itself: same bytes at the same places.
    let data = ggml_ref::read_file_data(&path).expect("ggml could not load the data");
    assert_eq!(data.len(), 6);
    for (name, bytes) in data {
        assert_eq!(
            ours.tensor_bytes(&name).unwrap(),
            bytes.as_slice(),
            "{name}"
        );
    }
}

#[test]
fn ggml_reads_our_writer_output_alignment_32() {
    ggml_reads_our_file(None);
}

#[test]
fn ggml_reads_our_writer_output_alignment_64() {
    ggml_reads_our_file(Some(64));
}

#[test]
fn ggml_reads_our_tensorless_file() {
    let path = test_dir("tensorless").join("m.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("general.name", "x");
    w.write(&path, fill).unwrap();
    let ours = GgufModel::open(&path).unwrap();
    assert_same_index(
        ours.shards()[0].header(),
        &ggml_ref::read_file(&path).unwrap(),
    );
}

/// Corpus files ggml's parser accepts although we reject them: it does not check tensor data
/// against the file size without loading it, bools for 0/1, or UTF-8.
const GGML_ACCEPTS: &[&str] = &[
    "bool__value_2",
    "past_the_end__truncated_data",
    "utf-8__key",
    "utf-8__string_value",
    "utf-8__tensor_name",
];

#[test]
fn ggml_rejects_the_corpus_except_where_we_are_stricter() {
    ggml_ref::quiet_logs();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/gguf");
    let mut seen = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_str().unwrap().to_string();
        assert!(GgufModel::open(&p).is_err(), "{name}");
        let accepted = ggml_ref::read_file(&p).is_some();
        assert_eq!(
            accepted,
            GGML_ACCEPTS.contains(&name.as_str()),
            "{name}: ggml accepted = {accepted}"
        );
        seen += 1;
    }
    assert!(seen >= 30);
}

fn base() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", "fuzz");
    w.add_kv("a.flag", true);
    w.add_kv("a.count", GgufValue::U32(7));
    w.add_kv("a.tokens", vec!["x", "yz"]);
    w.add_kv("a.scores", vec![1.0f32, 2.0]);
    w.add_tensor("t.q8", GgmlType::Q8_0, &[32, 2]).unwrap();
    w.add_tensor("t.f32", GgmlType::F32, &[5]).unwrap();
    w.add_tensor("t.q4k", GgmlType::Q4_K, &[256]).unwrap();
    w.to_bytes(fill).unwrap()
}

/// Whether the tensors are stored back to back in index order (what ggml's reader requires).
fn contiguous(h: &GgufHeader) -> bool {
    let mut next = h.data_offset();
    h.tensors().iter().all(|t| {
        let ok = t.offset == next;
        next = t.offset + t.n_bytes.next_multiple_of(h.alignment());
        ok
    })
}

/// Checks where we are deliberately stricter than ggml.
fn stricter_than_ggml(kind: &FormatError) -> bool {
    matches!(
        kind,
        FormatError::PastEnd { .. }
            | FormatError::BadBool(_)
            | FormatError::InvalidUtf8 { .. }
            | FormatError::ZeroDim { .. }
            | FormatError::BadNDims(0)
    )
}

fn differential(bytes: &[u8]) -> Result<(), TestCaseError> {
    let ours = GgufHeader::parse(Path::new("diff.gguf"), bytes);
    let theirs = ggml_ref::read_buffer(bytes);
    match (&ours, &theirs) {
        (Ok(h), _) if h.metadata().values().any(|v| v.depth() > 1) || !contiguous(h) => {}
        (Ok(h), Some(g)) => assert_same_index(h, g),
        (Ok(_), None) => prop_assert!(false, "we accept, ggml rejects"),
        (Err(GgufError::Format { kind, .. }), Some(_)) => {
            prop_assert!(
                stricter_than_ggml(kind),
                "ggml accepts, we reject: {:?}",
                ours.err()
            )
        }
        (Err(_), _) => {}
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 1500, failure_persistence: None, ..Config::default() })]

    #[test]
    fn differential_fuzz_against_ggml(
        edits in prop::collection::vec((any::<Index>(), any::<u8>()), 1..6),
        cut in prop::option::of(any::<Index>()),
    ) {
        ggml_ref::quiet_logs();
        let mut b = base();
        for (at, v) in edits {
            let i = at.index(b.len());
            b[i] = v;
        }
        if let Some(cut) = cut {
            b.truncate(cut.index(b.len()));
        }
        differential(&b)?;
    }
}

#[test]
fn differential_base_agrees() {
    let b = base();
    let h = GgufHeader::parse(Path::new("base.gguf"), &b).unwrap();
    assert!(contiguous(&h));
    assert_same_index(&h, &ggml_ref::read_buffer(&b).unwrap());
}
