//! GGUF reader tests: writer -> reader round trips of every value type (nested arrays, unicode
//! strings) and several tensor types at alignments 32 and 64; typed getters; split bundles
//! (opened from any shard, missing and inconsistent shards).
//!
//! Expected tensor sizes come from the block layouts of the GGUF/ggml spec (F32 4 bytes, F16 2,
//! Q8_0 34 bytes per 32, Q4_K 144 bytes per 256), not from the code under test.
use std::path::{Path, PathBuf};

use pocketmoe::ggml::GgmlType;
use pocketmoe::gguf::{
    split_path, FormatError, GgufArray, GgufError, GgufModel, GgufValue, GgufWriter, Metadata,
};
use pocketmoe::util::Rng;

/// A fresh, empty directory for one test.
fn test_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("gguf_reader")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Deterministic bytes for tensor `index` (seeded by `salt` too, so shards differ).
fn pattern(salt: u64, index: usize, buf: &mut [u8]) {
    let mut rng = Rng::new(salt * 1_000_003 + index as u64);
    for chunk in buf.chunks_mut(8) {
        let v = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

fn pattern_vec(salt: u64, index: usize, n: u64) -> Vec<u8> {
    let mut v = vec![0u8; n as usize];
    pattern(salt, index, &mut v);
    v
}

/// One value of every type, edge values, unicode, empty string/array, nested arrays.
fn all_values() -> Vec<(&'static str, GgufValue)> {
    use GgufValue as V;
    vec![
        ("general.architecture", V::Str("test-arch".into())),
        ("t.u8", V::U8(255)),
        ("t.i8", V::I8(-128)),
        ("t.u16", V::U16(65535)),
        ("t.i16", V::I16(-32768)),
        ("t.u32", V::U32(u32::MAX)),
        ("t.i32", V::I32(i32::MIN)),
        ("t.f32", V::F32(std::f32::consts::PI)),
        ("t.bool.true", V::Bool(true)),
        ("t.bool.false", V::Bool(false)),
        ("t.str", V::Str("héllo wörld 🦀 日本語 \u{0}nul".into())),
        ("t.str.empty", V::Str(String::new())),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f64", V::F64(-1.0e-300)),
        ("t.keyed.ünïcode.🔑", V::U8(1)),
        ("t.arr.u8", vec![0u8, 1, 255].into()),
        ("t.arr.i8", vec![-1i8, 0, 127].into()),
        ("t.arr.u16", vec![1u16, 65535].into()),
        ("t.arr.i16", vec![-2i16, 3].into()),
        ("t.arr.u32", vec![7u32, u32::MAX].into()),
        ("t.arr.i32", vec![-7i32, 0, 7].into()),
        ("t.arr.f32", vec![0.5f32, -2.25, 1e30].into()),
        ("t.arr.bool", vec![true, false, true].into()),
        ("t.arr.str", vec!["a", "", "ß∂ƒ", "🦀🦀"].into()),
        ("t.arr.u64", vec![u64::MAX, 0].into()),
        ("t.arr.i64", vec![i64::MIN, i64::MAX].into()),
        ("t.arr.f64", vec![f64::MAX, f64::MIN_POSITIVE].into()),
        ("t.arr.empty", GgufValue::Array(GgufArray::F32(vec![]))),
        (
            "t.arr.nested",
            vec![
                GgufArray::I32(vec![1, 2]),
                GgufArray::Str(vec!["x".into()]),
                GgufArray::Array(vec![GgufArray::Bool(vec![true]), GgufArray::U8(vec![])]),
                GgufArray::Array(vec![]),
            ]
            .into(),
        ),
    ]
}

/// (name, type, shape, expected bytes from the spec's block sizes)
fn tensor_specs() -> Vec<(&'static str, GgmlType, Vec<u64>, u64)> {
    vec![
        ("odd.f32", GgmlType::F32, vec![7], 7 * 4),
        ("blk.0.attn.f16", GgmlType::F16, vec![33, 3], 33 * 3 * 2),
        ("blk.0.ffn.q4_k", GgmlType::Q4_K, vec![256, 2], 2 * 144),
        (
            "blk.0.ffn_exps.q8_0",
            GgmlType::Q8_0,
            vec![64, 3, 2],
            2 * 34 * 6,
        ),
        (
            "blk.1.four_d.q8_0",
            GgmlType::Q8_0,
            vec![32, 1, 2, 3],
            34 * 6,
        ),
        ("blk.1.f32.big", GgmlType::F32, vec![1000, 3], 12000),
    ]
}

fn round_trip(alignment: Option<u32>) {
    let dir = test_dir(&format!("round_trip_{alignment:?}"));
    let path = dir.join("model.gguf");
    let mut w = match alignment {
        Some(a) => GgufWriter::new().with_alignment(a),
        None => GgufWriter::new(),
    };
    for (k, v) in all_values() {
        w.add_kv(k, v);
    }
    for (i, (name, ty, ne, size)) in tensor_specs().into_iter().enumerate() {
        assert_eq!(w.add_tensor(name, ty, &ne).unwrap(), i);
        assert_eq!(w.tensor_size(i), size, "{name}: writer size");
    }
    let written = w.write(&path, |i, buf| {
        pattern(1, i, buf);
        Ok(())
    });
    let written = written.unwrap();
    assert_eq!(written, std::fs::metadata(&path).unwrap().len());

    let m = GgufModel::open(&path).unwrap();
    let f = &m.shards()[0];
    let align = alignment.unwrap_or(32) as u64;
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), align);
    assert_eq!(f.data_offset() % align, 0);
    assert_eq!(m.file_size(), written);
    assert_eq!(m.paths(), vec![path.as_path()]);

    // Metadata: same keys in the same order, same values.
    let mut want: Vec<(String, GgufValue)> = all_values()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    if let Some(a) = alignment {
        want.insert(0, ("general.alignment".into(), GgufValue::U32(a)));
    }
    let got: Vec<(String, GgufValue)> = m
        .metadata()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(got, want);

    // Tensors: order, types, shapes, spec sizes, alignment, data.
    let specs = tensor_specs();
    assert_eq!(m.n_tensors(), specs.len());
    let mut covered = vec![false; written as usize];
    covered[..f.data_offset() as usize]
        .iter_mut()
        .for_each(|c| *c = true);
    for (i, (t, (name, ty, ne, size))) in m.tensors().zip(&specs).enumerate() {
        assert_eq!(t.name, *name);
        assert_eq!(t.ty, *ty, "{name}");
        assert_eq!(t.shape(), ne.as_slice(), "{name}");
        assert_eq!(t.n_dims as usize, ne.len());
        assert_eq!(&t.ne[ne.len()..], &[1, 1, 1, 1][ne.len()..]);
        assert_eq!(t.n_bytes, *size, "{name}");
        assert_eq!(t.shard, 0);
        assert_eq!((t.offset - f.data_offset()) % align, 0, "{name} misaligned");
        let data = m.tensor_data(t);
        assert_eq!(data, pattern_vec(1, i, *size).as_slice(), "{name} data");
        assert_eq!(m.tensor(name).unwrap(), t);
        let start = t.offset as usize;
        covered[start..start + data.len()]
            .iter_mut()
            .for_each(|c| *c = true);
    }
    // Everything else in the file (alignment padding) is zero; the file ends padded.
    let bytes = std::fs::read(&path).unwrap();
    let stray = (0..bytes.len()).find(|&i| !covered[i] && bytes[i] != 0);
    assert_eq!(stray, None, "nonzero padding byte");
    assert_eq!(
        written % align,
        0,
        "data section not padded to the alignment"
    );
    assert!(m.tensor("missing").is_none());
}

#[test]
fn round_trip_every_value_and_tensor_type_alignment_32() {
    round_trip(None);
}

#[test]
fn round_trip_every_value_and_tensor_type_alignment_64() {
    round_trip(Some(64));
}

#[test]
fn zero_tensor_file_round_trips() {
    let path = test_dir("zero_tensors").join("meta-only.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("general.name", "only metadata");
    w.write(&path, |_, _| Ok(())).unwrap();
    let m = GgufModel::open(&path).unwrap();
    assert_eq!(m.n_tensors(), 0);
    assert_eq!(m.get_str("general.name"), Some("only metadata"));
}

#[test]
fn typed_getters_widen_losslessly_only() {
    let path = test_dir("getters").join("g.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("u8", GgufValue::U8(200));
    w.add_kv("u16", GgufValue::U16(60000));
    w.add_kv("i32.pos", GgufValue::I32(5));
    w.add_kv("i32.neg", GgufValue::I32(-5));
    w.add_kv("u64.small", GgufValue::U64(42));
    w.add_kv("u64.big", GgufValue::U64(1 << 40));
    w.add_kv("f64", GgufValue::F64(0.1));
    w.add_kv("str", "text");
    w.add_kv("strs", vec!["a", "b"]);
    w.add_kv("i32s", vec![1i32, -2]);
    w.add_kv("f32s", vec![1.5f32]);
    w.add_kv("flag", true);
    w.write(&path, |_, _| Ok(())).unwrap();
    let m = GgufModel::open(&path).unwrap();
    assert_eq!(m.get_u32("u8"), Some(200));
    assert_eq!(m.get_u32("u16"), Some(60000));
    assert_eq!(m.get_u32("i32.pos"), Some(5));
    assert_eq!(m.get_u32("i32.neg"), None);
    assert_eq!(m.get_i32("i32.neg"), Some(-5));
    assert_eq!(m.get_u32("u64.small"), Some(42));
    assert_eq!(m.get_u32("u64.big"), None);
    assert_eq!(m.get_u64("u64.big"), Some(1 << 40));
    assert_eq!(m.get_f32("f64"), Some(0.1f32));
    assert_eq!(m.get_f64("f64"), Some(0.1));
    assert_eq!(m.get_f32("u16"), Some(60000.0));
    assert_eq!(m.get_u32("str"), None);
    assert_eq!(m.get_str("u8"), None);
    assert_eq!(m.get_str("str"), Some("text"));
    assert_eq!(m.get_bool("flag"), Some(true));
    assert_eq!(m.get_bool("u8"), None);
    assert_eq!(m.get_str_array("strs").unwrap(), ["a", "b"]);
    assert_eq!(m.get_i32_array("i32s").unwrap(), [1, -2]);
    assert_eq!(m.get_f32_array("f32s").unwrap(), [1.5]);
    assert_eq!(m.get_f32_array("i32s"), None);
    assert_eq!(m.get_array("i32s").unwrap().to_i64_vec().unwrap(), [1, -2]);

    let missing = m.require_u32("nope").unwrap_err().to_string();
    assert!(
        missing.contains("g.gguf") && missing.contains("\"nope\""),
        "{missing}"
    );
    assert!(
        missing.contains("missing (expected an integer in u32 range)"),
        "{missing}"
    );
    let wrong = m.require_u32("i32.neg").unwrap_err().to_string();
    let at = m.shards()[0].header().kv_offset("i32.neg").unwrap();
    assert!(
        wrong.contains(&format!("byte {at}: metadata key \"i32.neg\"")),
        "{wrong}"
    );
    assert!(
        wrong.contains("is i32 -5, expected an integer in u32 range"),
        "{wrong}"
    );
}

/// Writes a 3-shard bundle `<dir>/model-0000N-of-00003.gguf` (two tensors per shard, metadata
/// in the first); `tweak(shard, writer)` may change a shard before it is written.
fn write_bundle(dir: &Path, tweak: impl Fn(u32, &mut GgufWriter)) -> PathBuf {
    let prefix = dir.join("model");
    for shard in 0..3u32 {
        let mut w = GgufWriter::new();
        if shard == 0 {
            w.add_kv("general.architecture", "test-arch");
            w.add_kv("test.layers", GgufValue::U32(3));
        }
        w.add_kv("split.no", GgufValue::U16(shard as u16));
        w.add_kv("split.count", GgufValue::U16(3));
        w.add_kv("split.tensors.count", GgufValue::I32(6));
        w.add_tensor(&format!("blk.{shard}.a"), GgmlType::F32, &[5, 3])
            .unwrap();
        w.add_tensor(&format!("blk.{shard}.b"), GgmlType::Q8_0, &[64, 2])
            .unwrap();
        tweak(shard, &mut w);
        let fill = |i: usize, buf: &mut [u8]| {
            pattern(10 + shard as u64, i, buf);
            Ok(())
        };
        w.write(&split_path(&prefix, shard, 3), fill).unwrap();
    }
    split_path(&prefix, 0, 3)
}

#[test]
fn split_bundle_opens_from_any_shard_with_one_index() {
    let dir = test_dir("split_ok");
    let first = write_bundle(&dir, |_, _| {});
    assert!(first.ends_with("model-00001-of-00003.gguf"));
    let from_first = GgufModel::open(&first).unwrap();
    let middle = dir.join("model-00002-of-00003.gguf");
    let from_middle = GgufModel::open(&middle).unwrap();
    let from_last = GgufModel::open(&dir.join("model-00003-of-00003.gguf")).unwrap();
    for m in [&from_first, &from_middle, &from_last] {
        assert_eq!(m.paths(), from_first.paths());
        assert_eq!(m.paths().len(), 3);
        assert_eq!(m.n_tensors(), 6);
        let idx: Vec<_> = m.tensors().cloned().collect();
        assert_eq!(idx, from_first.tensors().cloned().collect::<Vec<_>>());
        // Metadata come from the first shard, whichever file was named.
        assert_eq!(m.get_str("general.architecture"), Some("test-arch"));
        assert_eq!(m.get_u32("split.no"), Some(0));
        let sizes: u64 = m
            .paths()
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert_eq!(m.file_size(), sizes);
    }
    for shard in 0..3u32 {
        for (i, suffix) in ["a", "b"].iter().enumerate() {
            let t = from_middle
                .tensor(&format!("blk.{shard}.{suffix}"))
                .unwrap();
            assert_eq!(t.shard, shard as usize);
            let want = pattern_vec(10 + shard as u64, i, t.n_bytes);
            assert_eq!(from_middle.tensor_data(t), want.as_slice(), "{}", t.name);
        }
    }
}

#[test]
fn split_bundle_missing_shard_names_the_file() {
    let dir = test_dir("split_missing");
    let first = write_bundle(&dir, |_, _| {});
    let gone = dir.join("model-00003-of-00003.gguf");
    std::fs::remove_file(&gone).unwrap();
    for opened in [first, dir.join("model-00002-of-00003.gguf")] {
        let e = GgufModel::open(&opened).unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::MissingShard {
                    no: 3,
                    count: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains(&gone.display().to_string()), "{msg}");
        assert!(msg.contains("shard 3 of 3 is missing"), "{msg}");
    }
}

fn split_error(name: &str, tweak: impl Fn(u32, &mut GgufWriter), open: &str) -> String {
    let dir = test_dir(name);
    write_bundle(&dir, tweak);
    let e = GgufModel::open(&dir.join(open)).unwrap_err();
    assert!(
        matches!(
            e.format_kind(),
            Some(FormatError::Split(_) | FormatError::DuplicateTensor { .. })
        ),
        "{e:?}"
    );
    e.to_string()
}

#[test]
fn split_bundle_inconsistent_shards_are_rejected() {
    let no = split_error(
        "split_bad_no",
        |s, w| {
            if s == 1 {
                w.add_kv("split.no", GgufValue::U16(0))
            }
        },
        "model-00001-of-00003.gguf",
    );
    assert!(no.contains("model-00002-of-00003.gguf: byte "), "{no}");
    assert!(
        no.contains("key \"split.no\": split bundle: is 0, but its file name says shard 2 of 3"),
        "{no}"
    );

    let count = split_error(
        "split_bad_count",
        |s, w| {
            if s == 2 {
                w.add_kv("split.count", GgufValue::U16(4))
            }
        },
        "model-00002-of-00003.gguf",
    );
    assert!(
        count.contains("model-00003-of-00003.gguf") && count.contains("\"split.count\""),
        "{count}"
    );

    let total = split_error(
        "split_bad_total",
        |_, w| w.add_kv("split.tensors.count", GgufValue::I32(7)),
        "model-00001-of-00003.gguf",
    );
    assert!(
        total.contains(
            "\"split.tensors.count\": split bundle: is 7 but the 3 shards hold 6 tensors"
        ),
        "{total}"
    );

    let dup = split_error(
        "split_dup_tensor",
        |s, w| {
            if s == 2 {
                w.add_tensor("blk.0.a", GgmlType::F32, &[4]).unwrap();
                w.add_kv("split.tensors.count", GgufValue::I32(7));
            } else {
                w.add_kv("split.tensors.count", GgufValue::I32(7));
            }
        },
        "model-00001-of-00003.gguf",
    );
    assert!(dup.contains("model-00003-of-00003.gguf: byte "), "{dup}");
    assert!(dup.contains("tensor info #2 \"blk.0.a\": duplicate tensor name (first defined by tensor info #0 in "), "{dup}");
    assert!(dup.contains("model-00001-of-00003.gguf)"), "{dup}");

    // A shard renamed so that the others cannot be found by name.
    let dir = test_dir("split_renamed");
    let first = write_bundle(&dir, |_, _| {});
    let renamed = dir.join("renamed.gguf");
    std::fs::rename(&first, &renamed).unwrap();
    let msg = GgufModel::open(&renamed).unwrap_err().to_string();
    assert!(
        msg.contains("renamed.gguf") && msg.contains("one of 3 shards"),
        "{msg}"
    );
}

#[test]
fn errors_stay_small() {
    // Results carry GgufError by value everywhere; keep it cheap to move.
    assert!(
        std::mem::size_of::<GgufError>() <= 120,
        "{}",
        std::mem::size_of::<GgufError>()
    );
}

#[test]
fn open_reports_io_errors_with_the_path() {
    let path = test_dir("io").join("does-not-exist.gguf");
    let msg = GgufModel::open(&path).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("{}: open: ", path.display())),
        "{msg}"
    );
}
