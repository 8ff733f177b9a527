//! Foundation smoke tests: ggml (through our safe layer) multiplies quantised matrices correctly,
//! on the CPU backend always and on CUDA in `--features cuda` builds (run on the device).
use pocketmoe::ggml::{quant, refquant, Backend, Context, GgmlType, Graph};
use pocketmoe::selfcheck::{self, Reference, MATVEC_NMSE_MAX, SMOKE_TYPES};
use pocketmoe::util::Rng;

/// Every smoke type on `backend`: W·x within the NMSE limit of the reference, and the comparison
/// is sharp enough to fail (the same output against a shifted reference is far off).
fn check_matvec_all_types(backend: &Backend) {
    for ty in SMOKE_TYPES {
        let c = selfcheck::matvec(backend, ty, 96, 1024, 11).unwrap();
        eprintln!(
            "{} {}: nmse {:.3e} (ref {:?})",
            c.backend, ty, c.nmse, c.reference
        );
        assert!(
            c.passed(),
            "{} {ty}: nmse {:.3e} > {MATVEC_NMSE_MAX:e}",
            c.backend,
            c.nmse
        );
        let expected_ref = if ty == GgmlType::IQ2_XXS {
            Reference::GgmlToFloat
        } else {
            Reference::Rust
        };
        assert_eq!(c.reference, expected_ref, "{ty}");
        let mut shifted = c.want.clone();
        shifted.rotate_left(1);
        let wrong = quant::nmse(&c.got, &shifted);
        assert!(
            wrong > 100.0 * MATVEC_NMSE_MAX,
            "{ty}: a wrong reference still matches (nmse {wrong:.3e})"
        );
    }
}

#[test]
fn cpu_quantized_matvec_matches_reference() {
    check_matvec_all_types(&Backend::cpu(2).unwrap());
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_quantized_matvec_matches_reference() {
    check_matvec_all_types(&Backend::cuda(0).expect("a CUDA build's tests need a GPU"));
}

/// Our pure-Rust dequantisers and ggml's `to_float` agree bit for bit on random blocks.
#[test]
fn rust_reference_dequant_equals_ggml() {
    let mut rng = Rng::new(3);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::MXFP4,
        GgmlType::F16,
    ] {
        let x = rng.normals(4 * 256, 0.5);
        let q = quant::quantize(ty, &x, 256, None).unwrap();
        let ours = refquant::dequantize(ty, &q).unwrap();
        let theirs = quant::dequantize(ty, &q, x.len()).unwrap();
        assert_eq!(ours, theirs, "{ty}: Rust reference and ggml disagree");
    }
}

/// Quantise/dequantise round trips lose what each format should lose, no more.
#[test]
fn quantize_round_trip_error_is_format_sized() {
    let mut rng = Rng::new(5);
    let x = rng.normals(8 * 512, 1.0);
    for (ty, max) in [
        (GgmlType::F16, 1e-6),
        (GgmlType::Q8_0, 1e-4),
        (GgmlType::Q6_K, 1e-3),
        (GgmlType::Q4_K, 1e-2),
        (GgmlType::MXFP4, 5e-2),
        (GgmlType::IQ2_XXS, 0.3),
    ] {
        let q = quant::quantize(ty, &x, 512, None).unwrap();
        assert_eq!(q.len() as u64, ty.row_size(512).unwrap() * 8);
        let back = quant::dequantize(ty, &q, x.len()).unwrap();
        let e = quant::nmse(&back, &x);
        assert!(e < max, "{ty}: round-trip nmse {e:.3e} >= {max:e}");
        assert!(
            e > 0.0 || ty == GgmlType::F16,
            "{ty}: lossless round trip is suspicious"
        );
    }
}

#[test]
fn bad_sizes_and_types_are_errors_not_panics() {
    assert!(GgmlType::from_id(9999).is_err());
    assert!(
        GgmlType::from_id(4).is_err(),
        "Q4_2 (id 4) was removed from ggml"
    );
    assert_eq!(GgmlType::from_name("q4_k"), Some(GgmlType::Q4_K));
    assert!(
        quant::quantize(GgmlType::Q4_K, &[0.0; 100], 100, None).is_err(),
        "100 is not a multiple of 256"
    );
    assert!(
        quant::quantize(GgmlType::Q8_0, &[0.0; 96], 64, None).is_err(),
        "not whole rows"
    );
    assert!(
        quant::quantize(GgmlType::IQ2_XXS, &[0.0; 256], 256, Some(&[1.0; 8])).is_err(),
        "imatrix length"
    );
    assert!(quant::dequantize(GgmlType::Q4_K, &[0u8; 100], 256).is_err());
    let ctx = Context::new(4, 8).unwrap();
    assert!(ctx.new_tensor(GgmlType::Q4_K, &[100, 2]).is_err());
    assert!(ctx.new_tensor(GgmlType::F32, &[0]).is_err());
    let t = ctx.new_tensor(GgmlType::F32, &[4]).unwrap();
    assert!(
        t.write_f32(&[1.0; 4]).is_err(),
        "write before allocation must be an error"
    );
    assert!(Backend::by_name("NOPE0").is_err());
    #[cfg(not(feature = "cuda"))]
    assert!(matches!(
        Backend::cuda(0),
        Err(pocketmoe::ggml::GgmlError::BuiltWithoutCuda)
    ));
}

/// MUL_MAT_ID (the routed-expert matmul) against a per-token reference, including adversarial
/// routing: every token to one expert, and experts nobody uses.
fn check_mul_mat_id(backend: &Backend) {
    let (k, n, n_expert, n_used, n_tokens) = (256usize, 32usize, 8usize, 2usize, 5usize);
    let mut rng = Rng::new(9);
    let w = rng.normals(n_expert * n * k, 0.05);
    let wq = quant::quantize(GgmlType::Q8_0, &w, k, None).unwrap();
    let wd = refquant::dequantize(GgmlType::Q8_0, &wq).unwrap();
    let x = rng.normals(k * n_tokens, 1.0);
    for ids in [
        vec![0, 5, 1, 5, 2, 5, 3, 5, 7, 5], // mixed, expert 5 everywhere, 4 and 6 unused
        vec![3; n_used * n_tokens],         // everything to one expert
    ] {
        let ctx = Context::new(8, 16).unwrap();
        let tw = ctx
            .new_tensor(GgmlType::Q8_0, &[k as i64, n as i64, n_expert as i64])
            .unwrap(); // [k, n, n_expert]
        let tx = ctx
            .new_tensor(GgmlType::F32, &[k as i64, 1, n_tokens as i64])
            .unwrap(); // [k, 1, n_tokens]
        let tid = ctx
            .new_tensor(GgmlType::I32, &[n_used as i64, n_tokens as i64])
            .unwrap(); // [n_used, n_tokens]
        let y = ctx.mul_mat_id(tw, tx, tid); // [n, n_used, n_tokens]
        assert_eq!(y.shape(), vec![n as i64, n_used as i64, n_tokens as i64]);
        let g = Graph::new(&ctx, 16);
        g.build_forward(y);
        ctx.alloc_tensors(backend).unwrap();
        tw.write_bytes(&wq).unwrap();
        tx.write_f32(&x).unwrap();
        tid.write_i32(&ids).unwrap();
        backend.compute(&g).unwrap();
        let got = y.read_f32().unwrap();
        let mut want = vec![0f32; n * n_used * n_tokens];
        for t in 0..n_tokens {
            for u in 0..n_used {
                let e = ids[t * n_used + u] as usize;
                for r in 0..n {
                    let row = &wd[(e * n + r) * k..(e * n + r + 1) * k];
                    let dot: f64 = row
                        .iter()
                        .zip(&x[t * k..(t + 1) * k])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    want[(t * n_used + u) * n + r] = dot as f32;
                }
            }
        }
        let e = quant::nmse(&got, &want);
        assert!(
            e < MATVEC_NMSE_MAX,
            "{}: mul_mat_id nmse {e:.3e} for ids {ids:?}",
            backend.name()
        );
    }
}

#[test]
fn cpu_mul_mat_id_matches_reference() {
    check_mul_mat_id(&Backend::cpu(2).unwrap());
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_mul_mat_id_matches_reference() {
    check_mul_mat_id(&Backend::cuda(0).unwrap());
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_remap_expert_ids_kernel() {
    let slot_of_expert = [2, -1, 0, -1, 1, -1, -1, 3];
    let ids = [0, 1, 2, 7, 4, 4, 5, 9, -3, 2];
    let (slots, misses) = extra_kernels::remap_expert_ids_host(&ids, &slot_of_expert).unwrap();
    let want: Vec<i32> = ids
        .iter()
        .map(|&i| {
            if (0..8).contains(&i) {
                slot_of_expert[i as usize]
            } else {
                -1
            }
        })
        .collect();
    assert_eq!(slots, want);
    assert_eq!(misses, want.iter().filter(|&&s| s < 0).count() as i32);
}
