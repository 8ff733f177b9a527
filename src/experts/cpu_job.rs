//! One CPU-channel job on the worker: the graph of a layer's experts over a job's shape (built at
//! the shape's first job, its weights the host store's bytes in place) and the router-weighted
//! sums of their outputs, on the worker thread (docs/design.md §4.5).
use super::{CpuModel, Job, JobTimes};
use crate::experts::mats::ExpertMat;
use crate::ggml::{Backend, Context, GgmlError, GgmlType, OwnedGraph, Tensor};
use crate::graph::blocks::moe::{expert_ffn, expert_outputs, ExpertAct, ExpertTensors, FfnDims};
use std::collections::HashMap;
use std::time::Instant;

/// Runs `job` on its shape's graph (built at the shape's first job; the cache is cleared past
/// [`MAX_GRAPHS`] shapes, which only a server's changing batch sizes reach); with `ggml_sums`,
/// the graph weights and sums the experts (see [`build_graph`]).
pub(super) fn run_job(
    backend: &Backend,
    model: &CpuModel,
    graphs: &mut HashMap<(usize, usize, usize), OwnedGraph>,
    job: &Job,
    ggml_sums: bool,
) -> Result<(Vec<f32>, JobTimes), GgmlError> {
    let t0 = Instant::now();
    let nt = job.picks.len();
    // mul_mat_id takes the same number of experts per token: shorter lists are padded with an
    // expert the job reads anyway, left out of the host's sums (at weight 0 in the ggml form).
    let kc = job.picks.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let pad = job.picks.iter().flatten().next().map_or(0, |p| p.0);
    let (mut id_data, mut w_data) = (Vec::with_capacity(kc * nt), Vec::with_capacity(kc * nt));
    for tok in &job.picks {
        for j in 0..kc {
            let (e, w) = tok.get(j).copied().unwrap_or((pad, 0.0));
            id_data.push(e as i32);
            w_data.push(w);
        }
    }
    let key = (job.il, kc, nt);
    if !graphs.contains_key(&key) {
        if graphs.len() >= MAX_GRAPHS {
            graphs.clear();
        }
        let g = build_graph(backend, model, job.il, job.act, kc, nt, ggml_sums)?;
        graphs.insert(key, g);
    }
    let g = &graphs[&key];
    g.tensor("x").write_f32(&job.x)?;
    g.tensor("ids").write_i32(&id_data)?;
    if ggml_sums {
        g.tensor("wt").write_f32(&w_data)?;
    }
    let t1 = Instant::now();
    backend.compute(&g.graph())?;
    let out = g.tensor("out").read_f32()?;
    let out = if ggml_sums {
        out
    } else {
        weighted_sums(&out, &job.picks, model.n_embd, kc)
    };
    let times = JobTimes {
        prep: (t1 - t0).as_secs_f64(),
        compute: t1.elapsed().as_secs_f64(),
        ..JobTimes::default()
    };
    Ok((out, times))
}

/// Per token, its experts' outputs ([n_embd, kc, nt], the graph's) summed at their router
/// weights, [n_embd * nt]; the padding (experts past a token's own) is left out. The same f32
/// operations in the same order as the GPU graph's `mul` and adds (`expert_ffn`): each product
/// rounded, then added left to right.
fn weighted_sums(experts: &[f32], picks: &[Vec<(u32, f32)>], n_embd: usize, kc: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n_embd * picks.len()];
    for (t, (tok, acc)) in picks.iter().zip(out.chunks_exact_mut(n_embd)).enumerate() {
        for (j, &(_, w)) in tok.iter().enumerate() {
            let e = &experts[(t * kc + j) * n_embd..][..n_embd];
            if j == 0 {
                acc.iter_mut().zip(e).for_each(|(a, &v)| *a = v * w);
            } else {
                acc.iter_mut().zip(e).for_each(|(a, &v)| *a += v * w);
            }
        }
    }
    out
}

/// Graph shapes the worker keeps (decode: layers x experts-per-token counts, a few KiB each).
const MAX_GRAPHS: usize = 1024;

/// Layer `il`'s experts over `kc` experts per token for `nt` tokens, allocated on `backend`, its
/// weights the host store's bytes in place, its biases written: inputs "x" [n_embd, nt], "ids"
/// [kc, nt]; output "out", each expert's output [n_embd, kc, nt] (summed on the host,
/// [`weighted_sums`]). With `summed`, the whole expert FFN as the GPU graph has it (input "wt"
/// [1, kc, nt], output "out" [n_embd, nt]), which the channel ran before 2026-12-06: kept for
/// `pocketmoe bench --cpu-jobs` to time against.
pub(super) fn build_graph(
    backend: &Backend,
    model: &CpuModel,
    il: usize,
    act: ExpertAct,
    kc: usize,
    nt: usize,
    summed: bool,
) -> Result<OwnedGraph, GgmlError> {
    let layer = model.layers[il]
        .as_ref()
        .expect("CPU job for an offloaded layer");
    OwnedGraph::build(Context::new(64, 64)?, 64, |ctx, graph| {
        let mut w: [Option<Tensor<'_>>; 3] = [None; 3];
        let mut biases: [Option<Tensor<'_>>; 3] = [None; 3];
        for m in ExpertMat::ALL {
            if let Some(b) = &layer.biases[m.index()] {
                biases[m.index()] = Some(
                    ctx.new_tensor(b.ty, &b.ne)?
                        .set_name(&format!("blk.{il}.{}.bias", m.name())),
                );
            }
            let Some(sm) = &layer.mats[m.index()] else {
                continue;
            };
            let t = ctx
                .new_tensor(sm.ty, &sm.ne)?
                .set_name(&format!("blk.{il}.{}.weight", m.name()));
            // SAFETY: the store outlives every job and graph: `Offload`'s `Drop` drops the
            // channel, which joins this worker (and drops its graphs), before the store is
            // freed; the range is exactly the store tensor's bytes.
            let buf = unsafe { ctx.wrap_host_memory(sm.addr, sm.bytes)? };
            buf.place(t, 0)?;
            w[m.index()] = Some(t);
        }
        let (n_embd, kc, nt) = (model.n_embd as i64, kc as i64, nt as i64);
        let x = ctx.new_tensor(GgmlType::F32, &[n_embd, nt])?.set_name("x");
        let ids = ctx.new_tensor(GgmlType::I32, &[kc, nt])?.set_name("ids");
        let t = ExpertTensors { w, biases };
        let dims = FfnDims { n_embd, k: kc, nt };
        // Named as the GPU graph's nodes are (`pocketmoe bench --cpu-jobs` times them by name).
        let out = if summed {
            let wt = ctx.new_tensor(GgmlType::F32, &[1, kc, nt])?.set_name("wt");
            expert_ffn(ctx, &t, x, dims, [ids; 3], ids, wt, act, &|y, n| {
                y.set_name(n)
            })
        } else {
            expert_outputs(ctx, &t, x, dims, [ids; 3], ids, act, &|y, n| y.set_name(n))
        };
        graph.build_forward(out.set_name("out"));
        ctx.alloc_tensors(backend)?;
        for (b, hb) in biases.iter().zip(&layer.biases) {
            if let (Some(b), Some(hb)) = (b, hb) {
                b.write_bytes_at(0, &hb.data)?;
            }
        }
        let keep = ["x", "ids", "out", "wt"];
        Ok(keep[..3 + usize::from(summed)]
            .iter()
            .map(|s| s.to_string())
            .collect())
    })
}

#[cfg(test)]
mod tests {
    use super::weighted_sums;

    /// A token with fewer picks than the job's widest is padded in the graph with an expert it
    /// did not pick: the host sum must leave that output out (here NaN, so a padded slot that
    /// leaked in would show), and weigh each real pick by its own router weight, in pick order.
    #[test]
    fn weighted_sums_weigh_each_pick_and_leave_the_padding_out() {
        let n_embd = 3;
        // [n_embd, kc = 2, nt = 2]: token 0's two experts, token 1's one and its padding.
        let experts = [
            1.0,
            2.0,
            3.0, // token 0, pick 0
            10.0,
            20.0,
            30.0, // token 0, pick 1
            -4.0,
            0.5,
            8.0, // token 1, pick 0
            f32::NAN,
            f32::NAN,
            f32::NAN, // token 1, padding
        ];
        let picks = vec![vec![(7, 0.25), (2, 0.75)], vec![(5, 2.0)]];
        let out = weighted_sums(&experts, &picks, n_embd, 2);
        let want = [
            1.0 * 0.25 + 10.0 * 0.75,
            2.0 * 0.25 + 20.0 * 0.75,
            3.0 * 0.25 + 30.0 * 0.75,
            -8.0,
            1.0,
            16.0,
        ];
        assert_eq!(out, want);
    }
}
