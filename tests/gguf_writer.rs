//! GGUF writer tests: parallel fill (once per tensor, exact sizes, several threads), progress,
//! failure handling (error names the tensor, no file left), validation of shapes and metadata,
//! key replacement, determinism (mmap output == in-memory output), overwriting, and a larger
//! file written and read back.
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pocketmoe::ggml::GgmlType;
use pocketmoe::gguf::{GgufArray, GgufError, GgufModel, GgufValue, GgufWriter, Metadata};

fn test_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("gguf_writer")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stamp(i: usize, buf: &mut [u8]) -> std::io::Result<()> {
    buf.iter_mut()
        .enumerate()
        .for_each(|(j, b)| *b = (i as u8).wrapping_mul(37) ^ (j as u8));
    Ok(())
}

/// 48 tensors of assorted types and sizes.
fn many_tensors() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", "test");
    let types = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K];
    for i in 0..48u64 {
        let ty = types[i as usize % 4];
        let ne0 = ty.block_size() as u64 * (1 + i % 3);
        w.add_tensor(&format!("blk.{i}.w"), ty, &[ne0, 1 + i % 5])
            .unwrap();
    }
    w
}

#[test]
fn fill_runs_once_per_tensor_with_exact_sizes_on_several_threads() {
    let path = test_dir("parallel").join("m.gguf");
    let w = many_tensors();
    let calls = Mutex::new(Vec::new());
    w.write(&path, |i, buf| {
        assert!(buf.iter().all(|&b| b == 0), "tensor {i}: buffer not zeroed");
        calls
            .lock()
            .unwrap()
            .push((i, buf.len() as u64, std::thread::current().id()));
        std::thread::sleep(std::time::Duration::from_millis(2));
        stamp(i, buf)
    })
    .unwrap();
    let calls = calls.into_inner().unwrap();
    let mut seen: Vec<usize> = calls.iter().map(|c| c.0).collect();
    seen.sort();
    assert_eq!(
        seen,
        (0..48).collect::<Vec<_>>(),
        "each tensor filled exactly once"
    );
    for &(i, len, _) in &calls {
        assert_eq!(len, w.tensor_size(i), "tensor {i}");
    }
    let threads: HashSet<_> = calls.iter().map(|c| c.2).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(threads.len() <= cores, "more fill threads than cores");
    if cores > 1 {
        assert!(threads.len() > 1, "fill ran on one thread of {cores} cores");
    }
    let m = GgufModel::open(&path).unwrap();
    for (i, t) in m.tensors().enumerate() {
        let mut want = vec![0u8; t.n_bytes as usize];
        stamp(i, &mut want).unwrap();
        assert_eq!(m.tensor_data(t), want.as_slice(), "{}", t.name);
    }
}

#[test]
fn progress_counts_every_data_byte_once() {
    let path = test_dir("progress").join("m.gguf");
    let w = many_tensors();
    let total: u64 = (0..w.n_tensors()).map(|i| w.tensor_size(i)).sum();
    let reports = Mutex::new(Vec::new());
    w.write_with_progress(
        &path,
        &|done, all| reports.lock().unwrap().push((done, all)),
        stamp,
    )
    .unwrap();
    let mut r = reports.into_inner().unwrap();
    assert_eq!(r.len(), w.n_tensors(), "one report per tensor");
    assert!(r.iter().all(|&(_, all)| all == total));
    r.sort();
    assert!(
        r.windows(2).all(|p| p[0].0 < p[1].0),
        "done values repeat: {r:?}"
    );
    assert_eq!(r.last().unwrap().0, total);
}

#[test]
fn fill_error_names_the_tensor_and_leaves_no_file() {
    let path = test_dir("fill_error").join("m.gguf");
    let w = many_tensors();
    let e = w
        .write(&path, |i, buf| {
            if i == 5 {
                return Err(std::io::Error::other("disk on fire"));
            }
            stamp(i, buf)
        })
        .unwrap_err();
    assert!(matches!(e, GgufError::Fill { index: 5, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(
        msg.contains("filling tensor #5 \"blk.5.w\": disk on fire"),
        "{msg}"
    );
    assert!(!path.exists(), "a failed write left {}", path.display());
}

#[test]
fn add_tensor_rejects_what_readers_cannot_read() {
    let mut w = GgufWriter::new();
    assert_eq!(w.add_tensor("ok", GgmlType::Q4_K, &[512, 2]).unwrap(), 0);
    assert_eq!(w.tensor_size(0), 2 * 2 * 144);
    let err = |w: &mut GgufWriter, name: &str, ty, ne: &[u64]| {
        w.add_tensor(name, ty, ne).unwrap_err().to_string()
    };
    let m = err(&mut w, "q", GgmlType::Q4_K, &[100]);
    assert_eq!(
        m,
        "GGUF writer: tensor \"q\": ne0 = 100 is not a multiple of q4_K's block size 256"
    );
    assert!(err(&mut w, "ok", GgmlType::F32, &[1]).contains("already added as tensor #0"));
    assert!(err(&mut w, "d0", GgmlType::F32, &[]).contains("0 dimensions [], must be 1..=4"));
    assert!(err(&mut w, "d5", GgmlType::F32, &[1; 5]).contains("5 dimensions"));
    assert!(err(&mut w, "z", GgmlType::F32, &[4, 0]).contains("ne[1] = 0 must be in 1..=i64::MAX"));
    assert!(err(&mut w, "big", GgmlType::F32, &[1 << 40, 1 << 40])
        .contains("more than i64::MAX elements"));
    assert!(err(&mut w, "bytes", GgmlType::F32, &[1 << 31, 1 << 31]).contains("overflows u64"));
    let long = "x".repeat(64);
    assert!(err(&mut w, &long, GgmlType::F32, &[1]).contains("name is 64 bytes, must be 1..=63"));
    assert!(err(&mut w, "", GgmlType::F32, &[1]).contains("name is 0 bytes"));
    assert!(err(&mut w, "a\0b", GgmlType::F32, &[1]).contains("name contains a NUL byte"));
    assert_eq!(
        w.add_tensor(&"y".repeat(63), GgmlType::F32, &[1]).unwrap(),
        1
    );
    assert_eq!(w.n_tensors(), 2);
}

#[test]
fn write_rejects_metadata_readers_would_reject() {
    let path = test_dir("bad_meta").join("m.gguf");
    let msg = |w: GgufWriter| w.write(&path, stamp).unwrap_err().to_string();
    let m = msg(GgufWriter::new().with_alignment(48));
    assert!(
        m.contains("key \"general.alignment\": is u32 48, must be a u32 power of two"),
        "{m}"
    );
    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", GgufValue::U64(64));
    assert!(msg(w).contains("is u64 64, must be a u32 power of two"));
    let mut w = GgufWriter::new();
    w.add_kv("", 1u8);
    assert!(msg(w).contains("key is empty"));
    let mut w = GgufWriter::new();
    w.add_kv("a\0b", 1u8);
    assert!(msg(w).contains("key \"a\\0b\": key contains a NUL byte"));
    let nest = |depth: usize| {
        let mut a = GgufArray::U8(vec![1]);
        for _ in 1..depth {
            a = GgufArray::Array(vec![a]);
        }
        GgufValue::Array(a)
    };
    let mut w = GgufWriter::new();
    w.add_kv("deep", nest(9));
    assert!(msg(w).contains("key \"deep\": arrays nested 9 deep, at most 8"));
    assert!(!path.exists());
    let mut w = GgufWriter::new();
    w.add_kv("deep", nest(8));
    w.write(&path, stamp).unwrap();
    assert_eq!(GgufModel::open(&path).unwrap().get("deep"), Some(&nest(8)));
}

#[test]
fn add_kv_replaces_a_value_in_place() {
    let path = test_dir("replace").join("m.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("a", 1u32);
    w.add_kv("b", "two");
    w.add_kv("a", "one");
    w.write(&path, stamp).unwrap();
    let m = GgufModel::open(&path).unwrap();
    let keys: Vec<&str> = m.metadata().keys().map(String::as_str).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(m.get_str("a"), Some("one"));
}

#[test]
fn file_output_equals_in_memory_output_and_overwrites() {
    let path = test_dir("determinism").join("m.gguf");
    std::fs::write(&path, vec![0xAB; 1 << 20]).unwrap();
    let w = many_tensors().with_alignment(128);
    let n = w.write(&path, stamp).unwrap();
    assert_eq!(n, w.file_size().unwrap());
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk.len() as u64, n, "old contents not truncated");
    assert!(
        on_disk == w.to_bytes(stamp).unwrap(),
        "mmap and in-memory outputs differ"
    );
    assert!(GgufModel::open(&path)
        .unwrap()
        .tensors()
        .all(|t| t.offset % 128 == 0));
}

#[test]
fn writes_and_reads_back_a_64_mib_file() {
    let path = test_dir("large").join("m.gguf");
    let mut w = GgufWriter::new();
    for i in 0..8 {
        w.add_tensor(
            &format!("blk.{i}.ffn_up_exps.weight"),
            GgmlType::Q8_0,
            &[4096, 1928, 1],
        )
        .unwrap();
    }
    let t = std::time::Instant::now();
    let n = w.write(&path, stamp).unwrap();
    let secs = t.elapsed().as_secs_f64();
    eprintln!("wrote {} MiB in {secs:.3} s", n >> 20);
    assert!(n > 64 << 20);
    let m = GgufModel::open(&path).unwrap();
    assert_eq!(m.file_size(), n);
    for (i, t) in m.tensors().enumerate() {
        let d = m.tensor_data(t);
        assert_eq!(d.len() as u64, 4096 / 32 * 34 * 1928);
        let mut want = vec![0u8; d.len()];
        stamp(i, &mut want).unwrap();
        assert!(d == want.as_slice(), "{}", t.name);
    }
}
