//! Fuzzing the slice parser (`GgufHeader::parse`) with proptest: random byte mutations,
//! overwrites with boundary values, truncations and splices of a small valid file, and random
//! bytes with and without a valid preamble. Properties: the parser returns (never panics, never
//! hangs); an error names the file and a byte offset inside the input; a parsed header's tensors
//! are aligned, sized as their shape says, inside the input and pairwise disjoint. Memory:
//! counts that claim most of a large input allocate almost nothing before they fail (measured
//! with a per-thread counting allocator).
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use pocketmoe::ggml::GgmlType;
use pocketmoe::gguf::{GgufArray, GgufError, GgufHeader, GgufValue, GgufWriter};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;

const CASES: u32 = 2000;

/// Counts live and peak heap bytes of the current thread (the parser is single-threaded).
struct CountingAlloc;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // try_with: allocations during thread teardown are not counted.
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add_signed(delta);
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

// SAFETY: forwards to the system allocator unchanged; the bookkeeping uses const-initialised
// thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize));
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Peak heap bytes this thread allocated (beyond what was live before) while running `f`.
fn peak_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    (r, PEAK.with(Cell::get) - base)
}

fn config() -> Config {
    Config {
        cases: CASES,
        // No regression files: the test must not write into the source tree.
        failure_persistence: None,
        ..Config::default()
    }
}

/// A small valid file with every structure the parser has: scalars, strings, arrays of
/// numbers/bools/strings, a nested array, and three tensors (one block-quantised).
fn base() -> Vec<u8> {
    let mut w = GgufWriter::new().with_alignment(32);
    w.add_kv("general.architecture", "fuzz");
    w.add_kv("f.u8", GgufValue::U8(3));
    w.add_kv("f.f64", GgufValue::F64(2.5));
    w.add_kv("f.flag", false);
    w.add_kv("f.tokens", vec!["<s>", "</s>", "ab", "ünï"]);
    w.add_kv("f.scores", vec![0.0f32, -1.0, -2.0, -3.0]);
    w.add_kv("f.bools", vec![true, false]);
    w.add_kv(
        "f.nested",
        vec![
            GgufArray::U16(vec![1, 2]),
            GgufArray::Array(vec![GgufArray::I64(vec![-1])]),
        ],
    );
    w.add_tensor("token_embd.weight", GgmlType::F16, &[16, 4])
        .unwrap();
    w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, &[256, 1, 2])
        .unwrap();
    w.add_tensor("output_norm.weight", GgmlType::F32, &[16])
        .unwrap();
    w.to_bytes(|i, buf| {
        buf.iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = (i + j) as u8);
        Ok(())
    })
    .unwrap()
}

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    match GgufHeader::parse(Path::new("fuzz.gguf"), bytes) {
        Err(GgufError::Format {
            path,
            offset,
            field,
            kind,
        }) => {
            prop_assert_eq!(path, Path::new("fuzz.gguf"));
            prop_assert!(
                offset <= bytes.len() as u64,
                "offset {} past the input",
                offset
            );
            prop_assert!(!field.is_empty());
            let msg = GgufError::Format {
                path: "fuzz.gguf".into(),
                offset,
                field,
                kind,
            }
            .to_string();
            prop_assert!(
                msg.starts_with(&format!("fuzz.gguf: byte {offset}: ")),
                "{}",
                msg
            );
        }
        Err(other) => prop_assert!(false, "not a format error: {other}"),
        Ok(h) => {
            prop_assert!(h.alignment().is_power_of_two());
            let mut ranges = Vec::new();
            for t in h.tensors() {
                let end = t.offset.checked_add(t.n_bytes);
                prop_assert!(
                    end.is_some_and(|e| e <= bytes.len() as u64),
                    "{:?} outside input",
                    t
                );
                prop_assert!(t.offset >= h.data_offset());
                prop_assert_eq!((t.offset - h.data_offset()) % h.alignment(), 0);
                let rows: u64 = t.ne[1..].iter().product();
                prop_assert_eq!(Some(t.n_bytes), t.ty.row_size(t.ne[0]).map(|r| r * rows));
                prop_assert!(t.n_bytes > 0 && (1..=4).contains(&t.n_dims));
                prop_assert_eq!(h.tensor(&t.name), Some(t));
                ranges.push((t.offset, t.offset + t.n_bytes));
            }
            ranges.sort_unstable();
            prop_assert!(
                ranges.windows(2).all(|w| w[0].1 <= w[1].0),
                "overlap {:?}",
                ranges
            );
        }
    }
    Ok(())
}

/// Values that make length and count fields interesting.
fn boundary_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(13),
        Just(32),
        Just(63),
        Just(64),
        Just(u32::MAX as u64),
        Just(1 << 32),
        Just(i64::MAX as u64),
        Just(1 << 63),
        Just(u64::MAX),
        0u64..2048,
        any::<u64>(),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn byte_mutations_and_truncation_never_panic(
        edits in prop::collection::vec((any::<Index>(), any::<u8>()), 1..8),
        cut in prop::option::of(any::<Index>()),
    ) {
        let mut b = base();
        for (at, v) in edits {
            let i = at.index(b.len());
            b[i] = v;
        }
        if let Some(cut) = cut {
            b.truncate(cut.index(b.len()));
        }
        check(&b)?;
    }

    #[test]
    fn boundary_values_in_fields_never_panic(
        at in any::<Index>(),
        v in boundary_u64(),
        wide in any::<bool>(),
    ) {
        let mut b = base();
        // Fields are 4 or 8 bytes; any start position (aligned or not) is fair game.
        let width = if wide { 8 } else { 4 };
        let i = at.index(b.len() - width + 1);
        b[i..i + width].copy_from_slice(&v.to_le_bytes()[..width]);
        check(&b)?;
    }

    #[test]
    fn splices_never_panic(
        from in any::<Index>(),
        len in 0usize..64,
        to in any::<Index>(),
        delete in any::<bool>(),
    ) {
        let base = base();
        let start = from.index(base.len());
        let end = (start + len).min(base.len());
        let mut b = base.clone();
        if delete {
            b.drain(start..end);
        } else {
            let at = to.index(b.len());
            let piece = base[start..end].to_vec();
            b.splice(at..at, piece);
        }
        check(&b)?;
    }

    #[test]
    fn random_bytes_never_panic(
        preamble in any::<bool>(),
        counts in (0u64..4, 0u64..4),
        tail in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut b = Vec::new();
        if preamble {
            b.extend_from_slice(b"GGUF");
            b.extend_from_slice(&3u32.to_le_bytes());
            b.extend_from_slice(&counts.0.to_le_bytes());
            b.extend_from_slice(&counts.1.to_le_bytes());
        }
        b.extend_from_slice(&tail);
        check(&b)?;
    }
}

#[test]
fn base_file_parses() {
    let b = base();
    let h = GgufHeader::parse(Path::new("base.gguf"), &b).unwrap();
    assert_eq!(h.tensors().len(), 3);
    assert_eq!(h.metadata().len(), 9);
    check(&b).unwrap();
}

/// Counts that claim far more than the input holds are rejected before anything is allocated
/// for them, and quickly (no loop over the claimed count).
#[test]
fn huge_claimed_counts_fail_fast() {
    let mut b = base();
    b[8..16].copy_from_slice(&(u64::MAX / 64).to_le_bytes());
    let t = std::time::Instant::now();
    for _ in 0..1000 {
        assert!(GgufHeader::parse(Path::new("x.gguf"), &b).is_err());
    }
    assert!(t.elapsed().as_millis() < 500, "took {:?}", t.elapsed());
}

/// A 16 MiB input whose counts claim nearly all of it (as a corrupt header in a large model
/// would): each parse fails on the first entry, having allocated almost nothing.
#[test]
fn claimed_counts_do_not_drive_allocation() {
    let size = 16usize << 20;
    let header = |n_tensors: u64, n_kv: u64| {
        let mut b = vec![0u8; size];
        b[..4].copy_from_slice(b"GGUF");
        b[4..8].copy_from_slice(&3u32.to_le_bytes());
        b[8..16].copy_from_slice(&n_tensors.to_le_bytes());
        b[16..24].copy_from_slice(&n_kv.to_le_bytes());
        b
    };
    let room = (size - 24) as u64;
    // Tensor infos: zeros read as an empty name, then n_dims 0 (an error).
    let tensors = header(room / 32, 0);
    // Key-value pairs: key "k", then a string array claiming room/8 strings whose first
    // length is 0xFF.. (past the end).
    let mut kvs = header(0, room / 14);
    let mut at = 24;
    for part in [
        &1u64.to_le_bytes()[..],
        b"k",
        &9u32.to_le_bytes(),
        &8u32.to_le_bytes(),
    ] {
        kvs[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    kvs[at..at + 8].copy_from_slice(&((room - 64) / 8).to_le_bytes());
    kvs[at + 8..].fill(0xFF);
    for (what, b) in [("n_tensors", tensors), ("string array", kvs)] {
        let (r, peak) = peak_alloc(|| GgufHeader::parse(Path::new("big.gguf"), &b));
        let msg = r.unwrap_err().to_string();
        eprintln!("{what}: peak {peak} bytes: {msg}");
        assert!(
            peak < 1 << 20,
            "{what}: parse allocated {peak} bytes for a {size}-byte input"
        );
    }
}
