//! The llama.cpp baseline at its best settings for a VRAM budget (docs/design.md §5): all layers
//! on the GPU when they fit; otherwise routed experts in host memory, either all of them
//! (`-ot exps=CPU`) or those of the first N layers (`--n-cpu-moe N`) with the fewest N that fits;
//! micro-batches (`-ub`) 512/2048/4096 for prompt processing (op offload moves each host expert
//! to the GPU once per micro-batch, so larger ones amortise PCIe but cost compute-buffer VRAM).
//! A setting counts only if its measured peak VRAM fits the budget.
//!
//! The search is analytic, then verified, so it stays within a few model loads: a measurement of
//! setting (N, ub) gives `fixed(ub) = vram − experts on the GPU(N)` (weights outside the experts,
//! KV cache, compute buffers), and the per-layer expert bytes from the GGUF then give the fewest
//! N with `fixed(ub) + Σ_{l≥N} experts(l) ≤ budget`. That candidate is loaded and measured; an
//! overshoot moves N up, slack of a whole layer moves it down, at most [`MAX_TRIES`] times per
//! micro-batch. Contexts grow while they run (ggml-cuda's buffer pool): a context counts as
//! fitting with [`Sweep::reserve`] of headroom until a run has measured the growth, and a run whose
//! peak ends over the budget is reported as such and the search goes on with the growth learnt.
//! tg runs only at the smallest micro-batch (ub does not change decode); a larger ub runs only the
//! pp tests at least as long as it.
//!
//! It runs in a child process (`bench --baseline-child`), one per budget: libllama keeps CUDA
//! graph replay on there (our process turns it off, see `Backend::cuda`), and each budget starts
//! from a clean device.
use super::measure::{self, run_tests, LlamaSubject, Measurement, Test, VramPeak};
use super::report::{Setting, Status};
use crate::ggml::llama::{ContextOptions, CpuExperts, LlamaContext, LlamaModel, LoadOptions};
use crate::gguf::TensorInfo;
use anyhow::{Context as _, Result};
use std::path::PathBuf;

/// Measurements per micro-batch size before the search settles for what it has.
pub const MAX_TRIES: usize = 4;

/// Routed-expert bytes per layer, as llama.cpp's `exps` pattern selects them.
pub fn layer_expert_bytes(tensors: &[TensorInfo], n_layer: usize) -> Vec<u64> {
    let mut v = vec![0u64; n_layer];
    for t in tensors {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            continue;
        };
        let Some((il, tail)) = rest.split_once('.') else {
            continue;
        };
        let is_exps = ["ffn_up_", "ffn_down_", "ffn_gate_", "ffn_gate_up_"]
            .iter()
            .any(|p| {
                tail.strip_prefix(p)
                    .is_some_and(|s| s.starts_with("exps") || s.starts_with("chexps"))
            });
        if let (true, Ok(il)) = (is_exps, il.parse::<usize>()) {
            if il < n_layer {
                v[il] += t.n_bytes;
            }
        }
    }
    v
}

/// What the search loads and measures: a libllama model in the child, or a fake in tests.
pub trait Rig {
    /// Loads the model with the routed experts of the first `n_cpu` layers in host memory.
    fn load(&mut self, n_cpu: usize) -> Result<()>;
    /// Makes a context with micro-batch `ubatch` on the loaded model, measures its VRAM, asks
    /// `decide(vram)` which tests to run on it, runs them, and reports.
    fn try_ubatch(
        &mut self,
        ubatch: usize,
        decide: &mut dyn FnMut(u64) -> Vec<Test>,
    ) -> Result<Trial>;
    /// The label of a setting (`-ngl 99 --n-cpu-moe 18 -ub 512`).
    fn label(&self, n_cpu: usize, ubatch: usize) -> String;
}

/// One context tried.
pub struct Trial {
    pub vram: Option<u64>,
    pub host_rss: u64,
    pub results: Vec<Measurement>,
}

#[derive(Default, Clone, Debug)]
struct UbState {
    /// Bytes besides GPU-resident experts, from the last measurement (pool growth included).
    fixed: Option<u64>,
    /// Smallest N measured to fit; largest N measured over the budget.
    fit: Option<usize>,
    over: Option<usize>,
    /// `fit` before the last measurement (restored when a run outgrows the budget).
    prev_fit: Option<usize>,
    /// Growth of device memory while tests ran (ggml-cuda's buffer pool), worst seen; until
    /// a run is seen, [`Sweep::reserve`].
    pool: Option<u64>,
    /// VRAM when the last context was made.
    ctx_vram: u64,
    tries: usize,
    done: bool,
}

/// What to do next for one micro-batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Measure(usize),
    RunAt(usize),
    Done,
}

/// The search over n-cpu-moe for each micro-batch (see the module header).
pub struct Sweep<'a> {
    /// Expert bytes per layer.
    pub layers: &'a [u64],
    pub budget: u64,
    /// Where to start when nothing is measured: all on the GPU if the file fits the budget.
    pub model_bytes: u64,
    /// Device memory a context is expected to grow by while it runs (ggml-cuda's buffer pool),
    /// until a run has measured it: a context fits if its VRAM plus this fits.
    pub reserve: u64,
}

impl Sweep<'_> {
    fn gpu_experts(&self, n_cpu: usize) -> u64 {
        self.layers.iter().skip(n_cpu).sum()
    }

    /// Fewest CPU layers with `fixed + experts on the GPU <= budget` (None: not even all).
    pub fn fewest_cpu_layers(&self, fixed: u64) -> Option<usize> {
        (0..=self.layers.len()).find(|&n| fixed + self.gpu_experts(n) <= self.budget)
    }

    fn next(&self, s: &UbState) -> Next {
        let all = self.layers.len();
        if s.done {
            return Next::Done;
        }
        let settle = s.fit.map_or(Next::Done, Next::RunAt);
        if s.tries >= MAX_TRIES {
            return settle;
        }
        let lo = s.over.map_or(0, |o| o + 1);
        let hi = s.fit.map_or(all, |f| f.saturating_sub(1));
        if lo > hi || s.fit == Some(0) {
            return settle;
        }
        let want = match s.fixed {
            None if self.model_bytes <= self.budget => 0,
            None => all,
            Some(f) => self.fewest_cpu_layers(f).unwrap_or(all),
        };
        if s.fit.is_some_and(|f| want >= f) {
            return settle;
        }
        Next::Measure(want.clamp(lo, hi))
    }

    /// Runs the search on `rig` for micro-batch sizes `ubatches` (ascending) and `tests`;
    /// returns every setting tried.
    pub fn run(
        &self,
        rig: &mut dyn Rig,
        ubatches: &[usize],
        tests: &[Test],
        budget: Option<u64>,
    ) -> Vec<Setting> {
        let smallest = ubatches.first().copied().unwrap_or(512);
        let tests_at = |u: usize| -> Vec<Test> {
            tests
                .iter()
                .filter(|t| u == smallest || (t.is_pp() && t.n_prompt >= u))
                .copied()
                .collect()
        };
        let ubs: Vec<usize> = ubatches
            .iter()
            .copied()
            .filter(|&u| !tests_at(u).is_empty())
            .collect();
        let mut st = vec![UbState::default(); ubs.len()];
        let mut loaded: Option<usize> = None;
        let mut out = Vec::new();
        let target = |n: Next| match n {
            Next::Measure(x) | Next::RunAt(x) => Some(x),
            Next::Done => None,
        };
        loop {
            let nexts: Vec<Next> = st.iter().map(|s| self.next(s)).collect();
            let targets: Vec<usize> = nexts.iter().filter_map(|&n| target(n)).collect();
            let Some(&first) = targets.first() else {
                break;
            };
            let n = loaded.filter(|l| targets.contains(l)).unwrap_or(first);
            if loaded != Some(n) {
                loaded = None;
                if let Err(e) = rig.load(n) {
                    for (i, s) in st.iter_mut().enumerate() {
                        if target(nexts[i]) == Some(n) {
                            s.tries += 1;
                            s.over = s.over.max(Some(n));
                            if s.fit == Some(n) {
                                s.done = true;
                            }
                            out.push(self.setting(
                                rig,
                                n,
                                ubs[i],
                                budget,
                                None,
                                Status::Failed(format!("{e:#}")),
                            ));
                        }
                    }
                    continue;
                }
                loaded = Some(n);
            }
            for i in 0..ubs.len() {
                if target(self.next(&st[i])) != Some(n) {
                    continue;
                }
                let u = ubs[i];
                let mut ran = false;
                let trial = rig.try_ubatch(u, &mut |v| {
                    let s = &mut st[i];
                    s.tries += 1;
                    s.ctx_vram = v;
                    s.prev_fit = s.fit;
                    let v = v + s.pool.unwrap_or(self.reserve);
                    s.fixed = Some(v.saturating_sub(self.gpu_experts(n)));
                    if v <= self.budget {
                        s.fit = Some(s.fit.map_or(n, |f| f.min(n)));
                    } else {
                        s.over = s.over.max(Some(n));
                    }
                    if self.next(s) == Next::RunAt(n) && v <= self.budget {
                        s.done = true;
                        ran = true;
                        tests_at(u)
                    } else {
                        Vec::new()
                    }
                });
                let setting = match trial {
                    Err(e) => {
                        let s = &mut st[i];
                        if ran {
                            s.done = true;
                        } else {
                            s.tries += 1;
                            s.over = s.over.max(Some(n));
                        }
                        self.setting(rig, n, u, budget, None, Status::Failed(format!("{e:#}")))
                    }
                    Ok(t) => {
                        let fits = t.vram.is_none_or(|v| v <= self.budget);
                        if let (true, false, Some(peak)) = (ran, fits, t.vram) {
                            // The run outgrew the budget: learn the growth, search on.
                            let s = &mut st[i];
                            s.pool = s.pool.max(Some(peak.saturating_sub(s.ctx_vram)));
                            s.fixed = Some(peak.saturating_sub(self.gpu_experts(n)));
                            s.over = s.over.max(Some(n));
                            s.fit = s.prev_fit;
                            s.done = false;
                        }
                        let status = match (fits, ran) {
                            (true, true) => Status::Ran,
                            (true, false) => Status::Fits,
                            (false, _) => Status::OverBudget,
                        };
                        let mut s = self.setting(rig, n, u, budget, t.vram, status);
                        s.host_rss_bytes = t.host_rss;
                        s.fits = fits;
                        s.results = t.results;
                        s
                    }
                };
                eprintln!(
                    "llama.cpp: {}: VRAM {}, {:?}",
                    setting.label,
                    setting
                        .vram_bytes
                        .map_or("-".into(), crate::cli::inspect::human_bytes),
                    setting.status
                );
                out.push(setting);
            }
        }
        out
    }

    fn setting(
        &self,
        rig: &dyn Rig,
        n: usize,
        u: usize,
        budget: Option<u64>,
        vram: Option<u64>,
        status: Status,
    ) -> Setting {
        let all = self.layers.len();
        Setting {
            engine: "llama.cpp".into(),
            budget,
            label: rig.label(n, u),
            n_cpu_moe: Some(n.min(all)),
            n_ubatch: u,
            vram_bytes: vram,
            host_rss_bytes: 0,
            fits: false,
            status,
            results: Vec::new(),
        }
    }
}

/// libllama in this process: the real [`Rig`].
pub struct LlamaRig {
    pub path: PathBuf,
    pub gpu: Option<usize>,
    pub n_layer: usize,
    pub n_ctx: usize,
    pub threads: usize,
    pub reps: usize,
    /// CPU weights repacked into the CPU's extra buffer types (llama.cpp's default).
    pub repack: bool,
    model: Option<LlamaModel>,
    /// Device bytes in use before the loaded model.
    base: u64,
}

impl LlamaRig {
    pub fn new(
        path: PathBuf,
        gpu: Option<usize>,
        n_layer: usize,
        n_ctx: usize,
        threads: usize,
        reps: usize,
    ) -> Self {
        Self {
            path,
            gpu,
            n_layer,
            n_ctx,
            threads,
            reps,
            repack: true,
            model: None,
            base: 0,
        }
    }

    fn cpu_experts(&self, n_cpu: usize) -> CpuExperts {
        match n_cpu {
            _ if self.gpu.is_none() => CpuExperts::None,
            0 => CpuExperts::None,
            n if n >= self.n_layer => CpuExperts::All,
            n => CpuExperts::FirstLayers(n),
        }
    }
}

impl Rig for LlamaRig {
    fn load(&mut self, n_cpu: usize) -> Result<()> {
        self.model = None;
        self.base = measure::device_used(self.gpu).unwrap_or(0);
        let opts = LoadOptions {
            n_gpu_layers: if self.gpu.is_some() { -1 } else { 0 },
            main_gpu: self.gpu,
            cpu_experts: self.cpu_experts(n_cpu),
            extra_bufts: self.repack,
        };
        eprintln!(
            "llama.cpp: loading {}",
            self.label(n_cpu, 0).trim_end_matches(" -ub 0")
        );
        self.model = Some(LlamaModel::load_placed(&self.path, &opts)?);
        Ok(())
    }

    fn try_ubatch(
        &mut self,
        ubatch: usize,
        decide: &mut dyn FnMut(u64) -> Vec<Test>,
    ) -> Result<Trial> {
        let model = self.model.as_ref().context("no model loaded")?;
        let mut vram = VramPeak::from_base(self.gpu, self.base);
        measure::reset_peak_rss();
        let n_batch = ubatch.max(2048);
        let ctx = LlamaContext::with_options(
            model,
            &ContextOptions {
                n_ctx: self.n_ctx as u32,
                n_batch: n_batch as u32,
                n_ubatch: ubatch as u32,
                n_threads: self.threads as i32,
                op_offload: true,
                // As llama-bench; `POCKETMOE_BASELINE_THREADPOOL=0` measures the pre-issue-13
                // baseline (a thread start/join per CPU graph piece).
                threadpool: std::env::var("POCKETMOE_BASELINE_THREADPOOL").as_deref() != Ok("0"),
            },
        )?;
        let v = vram.sample();
        let tests = decide(v);
        let mut results = Vec::new();
        if !tests.is_empty() {
            let n_vocab = model.n_vocab() as u64;
            let mut subject = LlamaSubject {
                ctx,
                n_batch,
                n_past: 0,
            };
            results = run_tests(&mut subject, &tests, self.reps, n_vocab, &mut || {
                vram.sample();
            })?;
        }
        Ok(Trial {
            vram: vram.bytes(),
            host_rss: measure::peak_rss(),
            results,
        })
    }

    fn label(&self, n_cpu: usize, ubatch: usize) -> String {
        let place = match self.cpu_experts(n_cpu) {
            _ if self.gpu.is_none() && !self.repack => "-ngl 0 --no-repack".to_string(),
            _ if self.gpu.is_none() => "-ngl 0".to_string(),
            CpuExperts::None => "-ngl 99".to_string(),
            CpuExperts::All => "-ngl 99 -ot exps=CPU".to_string(),
            CpuExperts::FirstLayers(n) => format!("-ngl 99 --n-cpu-moe {n}"),
        };
        format!("{place} -ub {ubatch}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::measure::matrix;

    /// A device where VRAM = 1007 + ub + experts on the GPU; 48 layers of 100 bytes.
    /// A rig whose device memory for N CPU layers and micro-batch u is
    /// `1007 + u + 100 (48 - N)`, plus `partial` whenever some layers are on the CPU (the cost
    /// of a partial load), plus `growth` at the peak once tests have run (ggml-cuda's pool).
    struct Fake {
        loads: Vec<usize>,
        n: usize,
        runs: Vec<(usize, usize, usize)>,
        partial: u64,
        growth: u64,
    }
    impl Rig for Fake {
        fn load(&mut self, n_cpu: usize) -> Result<()> {
            self.loads.push(n_cpu);
            self.n = n_cpu;
            Ok(())
        }
        fn try_ubatch(
            &mut self,
            u: usize,
            decide: &mut dyn FnMut(u64) -> Vec<Test>,
        ) -> Result<Trial> {
            let partial = if self.n < 48 { self.partial } else { 0 };
            let v = 1007 + u as u64 + 100 * (48 - self.n as u64) + partial;
            let tests = decide(v);
            self.runs
                .extend(tests.iter().map(|t| (self.n, u, t.n_prompt)));
            let growth = if tests.is_empty() { 0 } else { self.growth };
            Ok(Trial {
                vram: Some(v + growth),
                host_rss: 1,
                results: Vec::new(),
            })
        }
        fn label(&self, n: usize, u: usize) -> String {
            format!("{n}/{u}")
        }
    }

    fn fake() -> Fake {
        Fake {
            loads: Vec::new(),
            n: 0,
            runs: Vec::new(),
            partial: 0,
            growth: 0,
        }
    }

    #[test]
    fn finds_the_fewest_cpu_layers_in_few_loads() {
        let layers = vec![100u64; 48];
        // Budget 6000: ub 512 -> N = 4, ub 2048 -> N = 19, ub 4096 -> N = 40.
        let sweep = Sweep {
            layers: &layers,
            budget: 6000,
            model_bytes: 9999,
            reserve: 0,
        };
        let tests = matrix(&[512, 4096], &[128], &[0]);
        let mut rig = fake();
        let tried = sweep.run(&mut rig, &[512, 2048, 4096], &tests, Some(6000));
        // Probe with all experts on the CPU, then one load per distinct answer.
        assert_eq!(rig.loads[0], 48);
        for &(n, u, _) in &rig.runs {
            let fixed = 1007 + u as u64;
            let fewest = (0..=48)
                .find(|&k| fixed + 100 * (48 - k as u64) <= 6000)
                .unwrap();
            assert_eq!(n, fewest, "ub {u}");
        }
        // ub 512 runs pp512, pp4096, tg128; 2048 and 4096 run pp4096 only.
        let mut got: Vec<(usize, usize)> = rig.runs.iter().map(|&(_, u, p)| (u, p)).collect();
        got.sort();
        assert_eq!(
            got,
            [
                (512, 0),
                (512, 512),
                (512, 4096),
                (2048, 4096),
                (4096, 4096)
            ]
        );
        assert_eq!(rig.loads, [48, 4, 19, 40]);
        assert!(tried
            .iter()
            .all(|s| s.fits == (s.vram_bytes.unwrap() <= 6000)));
        assert_eq!(tried.iter().filter(|s| s.status == Status::Ran).count(), 3);
    }

    #[test]
    fn all_on_gpu_when_it_fits_and_nothing_when_nothing_does() {
        let layers = vec![100u64; 48];
        let tests = matrix(&[512], &[128], &[0]);
        let sweep = Sweep {
            layers: &layers,
            budget: 1 << 20,
            model_bytes: 4800,
            reserve: 0,
        };
        let mut rig = fake();
        sweep.run(&mut rig, &[512, 2048], &tests, None);
        assert_eq!(rig.loads, [0]);
        assert_eq!(rig.runs.len(), 2);
        let sweep = Sweep {
            layers: &layers,
            budget: 500,
            model_bytes: 4800,
            reserve: 0,
        };
        let mut rig = fake();
        let tried = sweep.run(&mut rig, &[512], &tests, Some(500));
        assert!(rig.runs.is_empty());
        assert!(tried
            .iter()
            .all(|s| !s.fits && s.status == Status::OverBudget));
    }

    #[test]
    fn overshoot_moves_up() {
        // The probe says 4 CPU layers, but partial loads cost 250 more: N must rise to 6.
        let layers = vec![100u64; 48];
        let sweep = Sweep {
            layers: &layers,
            budget: 6000,
            model_bytes: 9999,
            reserve: 0,
        };
        let mut rig = Fake {
            partial: 250,
            ..fake()
        };
        sweep.run(&mut rig, &[512], &matrix(&[512], &[], &[0]), Some(6000));
        assert_eq!(rig.loads, [48, 4, 6]);
        assert_eq!(rig.runs, [(6, 512, 512)]);
    }

    #[test]
    fn growth_during_a_run_is_learnt() {
        // Running tests grows device memory by 300 (ggml-cuda's pool): the run at N = 4 ends
        // over the budget, and the search moves to N = 7, which fits with the growth.
        let layers = vec![100u64; 48];
        let sweep = Sweep {
            layers: &layers,
            budget: 6000,
            model_bytes: 9999,
            reserve: 0,
        };
        let mut rig = Fake {
            growth: 300,
            ..fake()
        };
        let tried = sweep.run(&mut rig, &[512], &matrix(&[512], &[], &[0]), Some(6000));
        assert_eq!(rig.loads, [48, 4, 7]);
        assert_eq!(rig.runs, [(4, 512, 512), (7, 512, 512)]);
        let last = tried.last().unwrap();
        assert!(last.fits && last.status == Status::Ran && last.n_cpu_moe == Some(7));
        assert_eq!(tried[1].status, Status::OverBudget);
    }

    #[test]
    fn expert_bytes_per_layer_follow_the_pattern() {
        let t = |name: &str, n_bytes| TensorInfo {
            name: name.into(),
            ty: crate::ggml::GgmlType::Q4_K,
            ne: [1, 1, 1, 1],
            n_dims: 1,
            offset: 0,
            n_bytes,
            shard: 0,
            info_offset: 0,
        };
        let v = layer_expert_bytes(
            &[
                t("blk.0.ffn_up_exps.weight", 10),
                t("blk.0.ffn_gate_inp.weight", 1000),
                t("blk.1.ffn_down_exps.weight", 20),
                t("blk.1.ffn_gate_up_exps.weight", 5),
                t("blk.1.ffn_up_shexp.weight", 1000),
                t("blk.2.ffn_gate_exps.bias", 3),
                t("output.weight", 1000),
            ],
            3,
        );
        assert_eq!(v, [10, 25, 3]);
    }
}
