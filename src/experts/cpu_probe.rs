//! `pocketmoe bench --cpu-jobs`: where one CPU-channel job's time goes on this host (issue 30:
//! the fixed part of a job and its rate per expert decide how many of a decode stop's misses the
//! channel can take; on the H200's host, 2026-12-06, 16 us + 35 us an expert at 15 threads, the
//! job bound by DRAM, docs/design.md §4.5).
//!
//! Per thread count it times, on the file's own experts (read in place from the file's map, as
//! the channel reads the host store): ggml's pool alone (a graph of one trivial node and one of
//! [`CHAIN`]: the kick-off and a barrier), jobs of 1, 2, 4 and 8 experts through the channel as
//! decode sends them (fresh experts every job, so they come from DRAM as a step's misses do: a
//! job reads the next experts of the next of up to [`LAYERS`] layers), a least-squares line
//! through them (the fixed cost and the rate), and the job graph's nodes one call each.
use super::job::build_graph;
use super::*;
use crate::ggml::Context;
use crate::gguf::GgufModel;
use std::fmt::Write as _;

/// Layers whose experts the jobs take turns reading: with Qwen3-30B-A3B's 128 experts of 2.6
/// MiB, 12 layers are ~4 GiB, 40x a 105 MiB last-level cache.
const LAYERS: usize = 12;
/// Nodes of the pool-only chain graph.
const CHAIN: usize = 9;
/// Experts a job, the line's points.
const KS: [usize; 4] = [1, 2, 4, 8];

/// The CPU channel's view of `file`'s routed experts (no biases: the probe times the matrices),
/// the layers that have them, of `n_layer`.
fn model_of(file: &GgufModel, n_embd: usize, n_layer: usize) -> (CpuModel, Vec<usize>) {
    let layers: Vec<Option<CpuLayer>> = (0..n_layer)
        .map(|il| {
            let mats = ExpertMat::ALL.map(|m| {
                let t = file.tensor(&format!("blk.{il}.{}.weight", m.name()))?;
                (t.n_dims == 3).then(|| StoreMat {
                    ty: t.ty,
                    ne: [t.ne[0] as i64, t.ne[1] as i64, t.ne[2] as i64],
                    addr: file.tensor_data(t).as_ptr() as usize,
                    bytes: t.n_bytes as usize,
                })
            });
            (mats[0].is_some() && mats[2].is_some()).then_some(CpuLayer {
                mats,
                biases: Default::default(),
            })
        })
        .collect();
    let with: Vec<usize> = (0..n_layer).filter(|&il| layers[il].is_some()).collect();
    (CpuModel { n_embd, layers }, with)
}

/// Where the next job's experts come from: layer after layer, k experts on in each.
struct Fresh {
    layers: Vec<usize>,
    n_expert: u32,
    job: usize,
}

impl Fresh {
    fn next(&mut self, k: usize) -> (usize, Vec<Vec<(u32, f32)>>) {
        let il = self.layers[self.job % self.layers.len()];
        let first = (self.job / self.layers.len() * k) as u32;
        self.job += 1;
        let picks = (0..k as u32)
            .map(|j| ((first + j) % self.n_expert, 1.0 / k as f32))
            .collect();
        (il, vec![picks])
    }
}

/// [`crate::util::median`] of a sample, NaN for none.
fn median(mut v: Vec<f64>) -> f64 {
    crate::util::median(&mut v).unwrap_or(f64::NAN)
}

/// Median us of `reps` runs of `f` after two warm-ups.
fn time_us(reps: usize, mut f: impl FnMut() -> Result<(), GgmlError>) -> Result<f64, GgmlError> {
    let mut v = Vec::with_capacity(reps);
    for i in 0..reps + 2 {
        let t0 = Instant::now();
        f()?;
        if i >= 2 {
            v.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(v))
}

/// The pool alone: (kick-off of a one-node graph, each further node's barrier), us.
fn pool_cost(backend: &Backend, n_embd: usize, reps: usize) -> Result<(f64, f64), GgmlError> {
    let chain = |n: usize| {
        OwnedGraph::build(
            Context::new(CHAIN + 2, CHAIN + 2)?,
            CHAIN + 2,
            |ctx, graph| {
                let x = ctx
                    .new_tensor(GgmlType::F32, &[n_embd as i64])?
                    .set_name("x");
                let mut y = x;
                for _ in 0..n {
                    y = ctx.scale(y, 1.0);
                }
                graph.build_forward(y);
                ctx.alloc_tensors(backend)?;
                Ok::<_, GgmlError>(vec!["x".into()])
            },
        )
    };
    let (one, many) = (chain(1)?, chain(CHAIN)?);
    one.tensor("x").write_f32(&vec![1.0; n_embd])?;
    many.tensor("x").write_f32(&vec![1.0; n_embd])?;
    let t1 = time_us(reps, || backend.compute(&one.graph()))?;
    let tn = time_us(reps, || backend.compute(&many.graph()))?;
    Ok((t1, (tn - t1) / (CHAIN - 1) as f64))
}

/// Reads one byte of every page of the layers' experts, so that no job pays the map's faults.
fn prefault(model: &CpuModel, layers: &[usize]) -> u64 {
    let mut sum = 0u64;
    for m in layers.iter().filter_map(|&il| model.layers[il].as_ref()) {
        for sm in m.mats.iter().flatten() {
            for off in (0..sm.bytes).step_by(4096) {
                // SAFETY: within the tensor's bytes in the file's map, alive for the probe.
                sum += u64::from(unsafe { std::ptr::read_volatile((sm.addr + off) as *const u8) });
            }
        }
    }
    sum
}

/// The report (markdown) for `threads` (each > 0), `reps` jobs a point.
pub fn profile(
    file: &GgufModel,
    n_embd: usize,
    n_layer: usize,
    threads: &[usize],
    reps: usize,
) -> Result<String, GgmlError> {
    let (model, with) = model_of(file, n_embd, n_layer);
    let Some(first) = with.first().and_then(|&il| model.layers[il].as_ref()) else {
        return Err(GgmlError::Tensor {
            name: "blk.N.ffn_{up,down}_exps.weight".into(),
            msg: "no layer of this file has routed experts to time".into(),
        });
    };
    let n_expert = first.mats[0].map_or(1, |m| m.ne[2]).max(1) as u32;
    let expert_bytes: usize =
        first.mats.iter().flatten().map(|m| m.bytes).sum::<usize>() / n_expert as usize;
    let layers: Vec<usize> = with.iter().copied().take(LAYERS).collect();
    std::hint::black_box(prefault(&model, &layers));
    let act = ExpertAct::Swiglu;
    let mut fresh = Fresh {
        layers: layers.clone(),
        n_expert,
        job: 0,
    };
    let x: Vec<f32> = (0..n_embd).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "CPU channel jobs on this file's experts ({:.2} MiB an expert, {n_expert} a layer, \
         {} layers taking turns, fresh experts every job; hand-overs spin where the threads \
         leave one of the {cores} cores), medians of {reps} jobs, us:\n",
        expert_bytes as f64 / 1048576.0,
        layers.len()
    );
    let _ = writeln!(
        out,
        "| threads | pool kick-off | a barrier | experts | job (start -> result) | hand-over | \
         prep | compute | result waited |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    let mut fits = String::new();
    let mut nodes = String::new();
    for &nt in threads {
        // As the channel beside a GPU step: hand-overs and the pool spin where a core is left
        // for the thread that starts the jobs (`Offload::load`).
        let spin = cores > nt;
        let (kick, barrier) = pool_cost(&Backend::cpu_polling(nt, spin)?, n_embd, reps.max(50))?;
        let mut ch = CpuChannel::new(model.clone(), nt, spin)?;
        let mut pts = Vec::new();
        for k in KS.into_iter().filter(|&k| k <= n_expert as usize) {
            let mut rows: Vec<(f64, JobTimes)> = Vec::new();
            for i in 0..reps + 3 {
                let (il, picks) = fresh.next(k);
                let t0 = Instant::now();
                ch.start(il, act, x.clone(), picks);
                let (_, t) = ch.finish().map_err(|msg| GgmlError::Tensor {
                    name: "CPU channel".into(),
                    msg,
                })?;
                if i >= 3 {
                    rows.push((t0.elapsed().as_secs_f64() * 1e6, t));
                }
            }
            let m = |f: fn(&JobTimes) -> f64| median(rows.iter().map(|r| f(&r.1) * 1e6).collect());
            let wall = median(rows.iter().map(|r| r.0).collect());
            pts.push((k as f64, wall));
            let _ = writeln!(
                out,
                "| {nt} | {kick:.1} | {barrier:.2} | {k} | {wall:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                m(|t| t.handover),
                m(|t| t.prep),
                m(|t| t.compute),
                m(|t| t.back)
            );
        }
        let (fixed, per) = line(&pts);
        let rate = if per > 0.0 {
            format!("{:.1}", expert_bytes as f64 / per / 1e3)
        } else {
            "-".into() // no rise with the experts: the jobs' noise hides it
        };
        let _ = writeln!(fits, "| {nt} | {fixed:.1} | {per:.1} | {rate} |");
        drop(ch);
        nodes.push_str(&node_costs(&model, &mut fresh, act, (nt, spin), &x, reps)?);
    }
    let _ = writeln!(
        out,
        "\nA line through the jobs (start -> result = fixed + experts x per expert):\n\n\
         | threads | fixed, us | per expert, us | GB/s |\n| --- | --- | --- | --- |\n{fits}"
    );
    let _ = writeln!(
        out,
        "The job graph's nodes, one compute call each (so each includes a pool kick-off), us:\n\n\
         | threads | experts | nodes |\n| --- | --- | --- |\n{nodes}"
    );
    Ok(out)
}

/// Least squares through (x, y): (intercept, slope).
fn line(p: &[(f64, f64)]) -> (f64, f64) {
    let n = p.len() as f64;
    let (sx, sy) = p.iter().fold((0.0, 0.0), |a, q| (a.0 + q.0, a.1 + q.1));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = p.iter().map(|q| (q.0 - mx).powi(2)).sum();
    let sxy: f64 = p.iter().map(|q| (q.0 - mx) * (q.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - slope * mx, slope)
}

/// One table row per job graph (1 and 8 experts, or all of a layer's where fewer; and 8 in the
/// form the channel ran before 2026-12-06, weighted and summed by ggml): each node computed on
/// its own, median us, by name.
fn node_costs(
    model: &CpuModel,
    fresh: &mut Fresh,
    act: ExpertAct,
    (nt, spin): (usize, bool),
    x: &[f32],
    reps: usize,
) -> Result<String, GgmlError> {
    let backend = Backend::cpu_polling(nt, spin)?;
    let mut s = String::new();
    let most = KS[KS.len() - 1].min(fresh.n_expert as usize);
    for (k, summed) in [(1usize, false), (most, false), (most, true)] {
        let il0 = fresh.next(k).0;
        let n_expert = fresh.n_expert as usize;
        let g = build_graph(&backend, model, il0, act, k, 1, summed)?;
        let graph = g.graph();
        // The nodes that compute (views cost nothing: ggml skips them).
        let work: Vec<usize> = (0..graph.n_nodes())
            .filter(|&i| !graph.node(i).is_view_op())
            .collect();
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); work.len()];
        for r in 0..reps {
            // The graph is layer il0's: the next k of its experts every round.
            let ids: Vec<i32> = (0..k).map(|j| ((r * k + j) % n_expert) as i32).collect();
            g.tensor("x").write_f32(x)?;
            g.tensor("ids").write_i32(&ids)?;
            if summed {
                g.tensor("wt").write_f32(&vec![1.0 / k as f32; k])?;
            }
            for (&i, v) in work.iter().zip(per.iter_mut()) {
                let t0 = Instant::now();
                backend.compute_nodes_async(&graph, i, i + 1)?;
                backend.synchronize();
                v.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        let cells: Vec<String> = per
            .into_iter()
            .zip(&work)
            .map(|(v, &i)| {
                let name = graph.node(i).name();
                let name = if name.is_empty() {
                    format!("#{i}")
                } else {
                    name
                };
                format!("{name} {:.1}", median(v))
            })
            .collect();
        let form = if summed { " (ggml sums)" } else { "" };
        let _ = writeln!(s, "| {nt} | {k}{form} | {} |", cells.join(", "));
    }
    Ok(s)
}
