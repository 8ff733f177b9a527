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

#[cfg(feature = "cuda-api")]
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
    #[cfg(not(feature = "cuda-api"))]
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

#[cfg(feature = "cuda-api")]
#[test]
fn cuda_mul_mat_id_matches_reference() {
    check_mul_mat_id(&Backend::cuda(0).unwrap());
}

/// DeepSeek-V4's hyper-connection ops (`ggml_dsv4_hc_{comb,pre,post}`, which libllama's deepseek4
/// graph uses by default and ours will call) against a host reference of their documented
/// definitions, on random inputs: the Sinkhorn mixing matrix, the streams' weighted sum and the
/// new streams. The port (docs/deepseek4-port.md) relies on exactly these semantics (which index
/// is dst, which src; where eps goes). Bound: 2e-6 relative, about ten f32 roundings of these
/// short sums; Sinkhorn converges, so one normalisation round fewer moves the mixing matrix by
/// 4e-3 relative at 3 rounds (measured; 5e-5 at 5, which is why the test runs 3).
fn check_hyper_connections(backend: &Backend) {
    let (hc, n, nt, n_iter, eps) = (4usize, 64usize, 3usize, 3i32, 1e-6f32);
    let mix = (2 + hc) * hc;
    let mut rng = Rng::new(21);
    let mixes = rng.normals(mix * nt, 1.0);
    let scale = rng.normals(3, 0.5);
    let base = rng.normals(mix, 0.5);
    let x = rng.normals(n * hc * nt, 1.0);
    let w = rng.normals(hc * nt, 1.0);
    let y = rng.normals(n * nt, 1.0);
    let post = rng.normals(hc * nt, 1.0);

    let ctx = Context::new(16, 16).unwrap();
    let t = |ne: &[i64]| ctx.new_tensor(GgmlType::F32, ne).unwrap();
    let (tm, ts, tb) = (t(&[mix as i64, nt as i64]), t(&[3]), t(&[mix as i64]));
    let comb = ctx.dsv4_hc_comb(tm, ts, tb, eps, n_iter);
    let (tx, tw) = (
        t(&[n as i64, hc as i64, nt as i64]),
        t(&[hc as i64, nt as i64]),
    );
    let pre = ctx.dsv4_hc_pre(tx, tw);
    let (ty, tp) = (t(&[n as i64, nt as i64]), t(&[hc as i64, nt as i64]));
    let out = ctx.dsv4_hc_post(ty, tx, tp, comb);
    assert_eq!(comb.shape(), vec![hc as i64, hc as i64, nt as i64]);
    assert_eq!(pre.shape(), vec![n as i64, nt as i64]);
    assert_eq!(out.shape(), vec![n as i64, hc as i64, nt as i64]);
    let g = Graph::new(&ctx, 16);
    g.build_forward(comb);
    g.build_forward(pre);
    g.build_forward(out);
    ctx.alloc_tensors(backend).unwrap();
    for (tt, v) in [
        (tm, &mixes),
        (ts, &scale),
        (tb, &base),
        (tx, &x),
        (tw, &w),
        (ty, &y),
        (tp, &post),
    ] {
        tt.write_f32(v).unwrap();
    }
    backend.compute(&g).unwrap();

    // comb[t][dst][src], in f64.
    let mut want_comb = vec![0f64; hc * hc * nt];
    for tk in 0..nt {
        let mut c = vec![vec![0f64; hc]; hc]; // c[dst][src]
        for (d, row) in c.iter_mut().enumerate() {
            for (s_, v) in row.iter_mut().enumerate() {
                let i = 2 * hc + d + hc * s_;
                *v = mixes[tk * mix + i] as f64 * scale[2] as f64 + base[i] as f64;
            }
        }
        // Softmax over dst (for each src), then + eps.
        for s_ in 0..hc {
            let m = (0..hc).map(|d| c[d][s_]).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = (0..hc).map(|d| (c[d][s_] - m).exp()).sum();
            for row in c.iter_mut() {
                row[s_] = (row[s_] - m).exp() / z + eps as f64;
            }
        }
        let norm_src = |c: &mut Vec<Vec<f64>>| {
            for row in c.iter_mut() {
                let z: f64 = row.iter().sum::<f64>() + eps as f64;
                row.iter_mut().for_each(|v| *v /= z);
            }
        };
        let norm_dst = |c: &mut Vec<Vec<f64>>| {
            for s_ in 0..hc {
                let z: f64 = (0..hc).map(|d| c[d][s_]).sum::<f64>() + eps as f64;
                c.iter_mut().for_each(|row| row[s_] /= z);
            }
        };
        norm_src(&mut c);
        for _ in 1..n_iter {
            norm_dst(&mut c);
            norm_src(&mut c);
        }
        for (d, row) in c.iter().enumerate() {
            for (s_, v) in row.iter().enumerate() {
                want_comb[(tk * hc + s_) * hc + d] = *v;
            }
        }
    }
    let got_comb = comb.read_f32().unwrap();
    let mut want_pre = vec![0f64; n * nt];
    let mut want_out = vec![0f64; n * hc * nt];
    for tk in 0..nt {
        for i in 0..n {
            want_pre[tk * n + i] = (0..hc)
                .map(|h| x[(tk * hc + h) * n + i] as f64 * w[tk * hc + h] as f64)
                .sum();
            for d in 0..hc {
                let mut v = y[tk * n + i] as f64 * post[tk * hc + d] as f64;
                for s_ in 0..hc {
                    v +=
                        x[(tk * hc + s_) * n + i] as f64 * got_comb[(tk * hc + s_) * hc + d] as f64;
                }
                want_out[(tk * hc + d) * n + i] = v;
            }
        }
    }
    let close = |what: &str, got: &[f32], want: &[f64]| {
        for (k, (&a, &b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a as f64 - b).abs() <= 2e-6 * b.abs().max(1.0),
                "{}: {what}[{k}] = {a}, reference {b}",
                backend.name()
            );
        }
    };
    close("hc_comb", &got_comb, &want_comb);
    close("hc_pre", &pre.read_f32().unwrap(), &want_pre);
    close("hc_post", &out.read_f32().unwrap(), &want_out);
}

#[test]
fn cpu_hyper_connection_ops_match_their_definition() {
    check_hyper_connections(&Backend::cpu(2).unwrap());
}

#[cfg(feature = "cuda-api")]
#[test]
fn cuda_hyper_connection_ops_match_their_definition() {
    check_hyper_connections(&Backend::cuda(0).unwrap());
}

/// Table form's lookup kernel (extra-kernels/kernels/table_lookup.cu, `POCKETMOE_TABLE_KERNEL=1`)
/// against its definition, queued on ggml-cuda's own stream as a gated step queues it: each
/// pick's slot id and residency from the layer's table, the flag the step's base plus the
/// resident picks (exact: integers below 2^24), a pick outside the table a miss at slot 0. Two
/// launches with other picks and another base: the second's flag and rows are its own.
#[cfg(feature = "cuda-api")]
#[test]
fn cuda_table_lookup_matches_its_definition() {
    let backend = Backend::cuda(0).expect("a CUDA build's tests need a GPU");
    // ggml-cuda makes its stream at first use.
    backend.synchronize();
    let stream = backend
        .cuda_stream()
        .expect("ggml-cuda's compute stream, read from its backend context");
    let (n_expert, n) = (128usize, 24usize); // 3 tokens x 8 picks
    let ctx = Context::new(8, 16).unwrap();
    let t = |ty, len: usize| ctx.new_tensor(ty, &[len as i64]).unwrap();
    let (picks, tab, on) = (
        t(GgmlType::I32, n),
        t(GgmlType::I32, n_expert),
        t(GgmlType::F32, n_expert),
    );
    let (ids, mask, base, flag) = (
        t(GgmlType::I32, n),
        t(GgmlType::F32, n),
        t(GgmlType::F32, 1),
        t(GgmlType::F32, 1),
    );
    ctx.alloc_tensors(&backend).unwrap();
    let slot: Vec<i32> = (0..n_expert as i32).map(|e| (e * 7) % 50).collect();
    let res: Vec<f32> = (0..n_expert)
        .map(|e| if e % 3 == 0 { 1.0 } else { 0.0 })
        .collect();
    tab.write_i32(&slot).unwrap();
    on.write_f32(&res).unwrap();
    let mut rng = Rng::new(5);
    for (round, b) in [(0, 4096.0f32), (1, 8192.0)] {
        let mut p: Vec<i32> = (0..n)
            .map(|_| (rng.next_u64() % n_expert as u64) as i32)
            .collect();
        p[round] = n_expert as i32 + 5; // outside the table
        picks.write_i32(&p).unwrap();
        base.write_f32(&[b]).unwrap();
        flag.write_f32(&[-1.0]).unwrap();
        let l = extra_kernels::Lookup {
            picks: picks.data_addr(),
            n,
            n_expert,
            tab: tab.data_addr(),
            on: on.data_addr(),
            ids: ids.data_addr(),
            mask: mask.data_addr(),
            base: base.data_addr(),
            flag: flag.data_addr(),
        };
        // SAFETY: every address is a live tensor of this backend's device, untouched until the
        // synchronisation below.
        unsafe { extra_kernels::table_lookup(stream, &l) }.unwrap();
        backend.synchronize();
        let inside = |e: i32| (0..n_expert as i32).contains(&e);
        let want_ids: Vec<i32> = p
            .iter()
            .map(|&e| if inside(e) { slot[e as usize] } else { 0 })
            .collect();
        let want_mask: Vec<f32> = p
            .iter()
            .map(|&e| if inside(e) { res[e as usize] } else { 0.0 })
            .collect();
        let got_ids: Vec<i32> = bytemuck::cast_slice(&ids.read_bytes().unwrap()).to_vec();
        assert_eq!(got_ids, want_ids, "round {round}: slot ids");
        assert_eq!(
            mask.read_f32().unwrap(),
            want_mask,
            "round {round}: residency"
        );
        let want_flag = b + want_mask.iter().sum::<f32>();
        assert_eq!(
            flag.read_f32().unwrap(),
            [want_flag],
            "round {round}: hit flag"
        );
    }
}
