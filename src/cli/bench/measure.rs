//! Timing one engine configuration the way llama-bench does: `pp N @ dD` = process N prompt
//! tokens after D tokens are already in the KV cache; `tg N @ dD` = generate N tokens one at a
//! time after D. For each depth the D tokens are processed once (untimed); before every run the
//! cache is cut back to D (llama-bench restores a saved state, which is the same thing). Each test
//! gets one warm-up run (pp: the whole prompt; tg: one token, as llama-bench), then `reps` timed
//! runs; tok/s is reported as mean ± sample standard deviation.
//!
//! Also the probes both engines are measured with: device memory in use (ggml's device query,
//! i.e. `cudaMemGetInfo`: total − free) and the host's peak resident set (`VmHWM`, reset through
//! `/proc/self/clear_refs` before each setting).
use crate::engine::Engine;
use crate::experts::Stats;
use crate::ggml::llama::LlamaContext;
use crate::util::Rng;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Something to benchmark: our engine or a libllama context.
pub trait Subject {
    /// Processes `tokens` after the current position.
    fn append(&mut self, tokens: &[u32]) -> Result<()>;
    /// Keeps only the first `n` positions.
    fn truncate(&mut self, n: usize);
    /// Offload counters (our engine with routed-expert offload only).
    fn offload_stats(&self) -> Option<Stats> {
        None
    }
}

impl Subject for Engine {
    fn append(&mut self, tokens: &[u32]) -> Result<()> {
        self.forward_last(tokens)?;
        Ok(())
    }
    fn truncate(&mut self, n: usize) {
        Engine::truncate(self, n);
    }
    fn offload_stats(&self) -> Option<Stats> {
        engine_offload_stats(self)
    }
}

/// The engine's offload statistics (`None` when the model is fully resident).
pub fn engine_offload_stats(eng: &Engine) -> Option<Stats> {
    eng.offload_stats()
}

/// A libllama context fed in chunks of its logical batch, as llama-bench's `test_prompt`.
pub struct LlamaSubject<'m> {
    pub ctx: LlamaContext<'m>,
    pub n_batch: usize,
    pub n_past: usize,
}

impl Subject for LlamaSubject<'_> {
    fn append(&mut self, tokens: &[u32]) -> Result<()> {
        for chunk in tokens.chunks(self.n_batch.max(1)) {
            let t: Vec<i32> = chunk.iter().map(|&x| x as i32).collect();
            self.ctx.eval_last(&t, self.n_past)?;
            self.n_past += chunk.len();
        }
        Ok(())
    }
    fn truncate(&mut self, n: usize) {
        self.ctx.truncate(n);
        self.n_past = self.n_past.min(n);
    }
}

/// One llama-bench test: `n_prompt` > 0 is pp, else tg of `n_gen` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Test {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
}

impl Test {
    /// llama-bench's name: `pp512`, `tg128 @ d8192`.
    pub fn name(&self) -> String {
        let base = if self.n_prompt > 0 {
            format!("pp{}", self.n_prompt)
        } else {
            format!("tg{}", self.n_gen)
        };
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }
    pub fn is_pp(&self) -> bool {
        self.n_prompt > 0
    }
    fn tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }
}

/// The tests of a run: every pp and tg size at every depth, depth-major.
pub fn matrix(prompts: &[usize], gens: &[usize], depths: &[usize]) -> Vec<Test> {
    let mut v = Vec::new();
    for &depth in depths {
        for &p in prompts.iter().filter(|&&p| p > 0) {
            v.push(Test {
                n_prompt: p,
                n_gen: 0,
                depth,
            });
        }
        for &n in gens.iter().filter(|&&n| n > 0) {
            v.push(Test {
                n_prompt: 0,
                n_gen: n,
                depth,
            });
        }
    }
    v
}

/// Context length that holds every test of `tests`.
pub fn n_ctx_for(tests: &[Test]) -> usize {
    tests
        .iter()
        .map(|t| t.depth + t.tokens())
        .max()
        .unwrap_or(0)
        + 16
}

/// Offload figures of one test's timed runs (our engine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offload {
    pub hit_rate: f64,
    /// Without the hits prefetches made (`Stats::cache_hit_rate`): what PCIe traffic follows.
    #[serde(default)]
    pub cache_hit_rate: f64,
    pub cpu_share: f64,
    pub h2d_bytes: u64,
    /// Host-to-device bytes per second of wall time.
    pub pcie_gbs: f64,
    /// Graph stops per token and host microseconds per stop (decode overhead).
    #[serde(default)]
    pub stops_per_token: f64,
    #[serde(default)]
    pub us_per_stop: f64,
}

/// The timed runs of one test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    pub tok_s: Vec<f64>,
    pub mean: f64,
    pub std: f64,
    pub offload: Option<Offload>,
}

/// Mean and sample standard deviation (0 for fewer than two samples).
pub fn mean_std(x: &[f64]) -> (f64, f64) {
    let n = x.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let m = x.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    (m, var.sqrt())
}

/// Runs `tests` on `s`. `after_test` is called after each test (to sample memory).
pub fn run_tests(
    s: &mut dyn Subject,
    tests: &[Test],
    reps: usize,
    n_vocab: u64,
    after_test: &mut dyn FnMut(),
) -> Result<Vec<Measurement>> {
    // The KV fill of the deepest test; the timed runs draw their own tokens.
    let deepest = tests.iter().map(|t| t.depth).max().unwrap_or(0);
    let mut rng = Rng::new(42);
    let tokens: Vec<u32> = (0..deepest)
        .map(|_| (rng.next_u64() % n_vocab.max(1)) as u32)
        .collect();
    let mut out = Vec::new();
    let mut filled = None;
    for t in tests {
        if filled != Some(t.depth) {
            s.truncate(0);
            s.append(&tokens[..t.depth])?;
            filled = Some(t.depth);
        }
        // Fresh random tokens for every run, as llama-bench draws them: replaying the same
        // tokens would let an expert cache learn exactly their routing (warm-up included).
        let mut run = |s: &mut dyn Subject, n_gen: usize| -> Result<f64> {
            s.truncate(t.depth);
            let n = if t.is_pp() { t.n_prompt } else { n_gen };
            let fresh: Vec<u32> = (0..n)
                .map(|_| (rng.next_u64() % n_vocab.max(1)) as u32)
                .collect();
            let t0 = Instant::now();
            if t.is_pp() {
                s.append(&fresh)?;
            } else {
                for tok in &fresh {
                    s.append(std::slice::from_ref(tok))?;
                }
            }
            Ok(t0.elapsed().as_secs_f64())
        };
        run(s, 1)?; // warm-up
        let before = s.offload_stats();
        let mut tok_s = Vec::with_capacity(reps);
        let mut wall = 0.0;
        for _ in 0..reps {
            let dt = run(s, t.n_gen)?;
            wall += dt;
            tok_s.push(t.tokens() as f64 / dt);
        }
        let offload = match (before, s.offload_stats()) {
            (Some(b), Some(a)) => {
                let d = a.since(&b);
                Some(Offload {
                    hit_rate: d.hit_rate(),
                    cache_hit_rate: d.cache_hit_rate(),
                    cpu_share: d.cpu_share(),
                    h2d_bytes: d.h2d_bytes,
                    pcie_gbs: d.h2d_bytes as f64 / wall.max(1e-9) / 1e9,
                    stops_per_token: d.stops as f64 / d.tokens.max(1) as f64,
                    us_per_stop: 1e6 * d.hook_s / d.stops.max(1) as f64,
                })
            }
            _ => None,
        };
        let (mean, std) = mean_std(&tok_s);
        eprintln!("  {:<16} {mean:>10.1} ± {std:.1} t/s", t.name());
        out.push(Measurement {
            test: t.name(),
            n_prompt: t.n_prompt,
            n_gen: t.n_gen,
            depth: t.depth,
            tok_s,
            mean,
            std,
            offload,
        });
        after_test();
    }
    s.truncate(0);
    Ok(out)
}

/// Bytes in use on GPU `gpu` (total − free, the whole device), or None without one.
pub fn device_used(gpu: Option<usize>) -> Option<u64> {
    let name = format!("CUDA{}", gpu?);
    crate::ggml::Device::all()
        .into_iter()
        .find(|d| d.name == name)
        .map(|d| d.memory_total.saturating_sub(d.memory_free) as u64)
}

/// Free bytes on GPU `gpu`.
pub fn device_free(gpu: usize) -> Option<u64> {
    let name = format!("CUDA{gpu}");
    crate::ggml::Device::all()
        .into_iter()
        .find(|d| d.name == name)
        .map(|d| d.memory_free as u64)
}

/// Peak VRAM of one setting: device use above what it was before the setting loaded.
pub struct VramPeak {
    gpu: Option<usize>,
    before: u64,
    pub peak: u64,
    /// Whether the device answered at least once.
    seen: bool,
}

impl VramPeak {
    /// Counts from the device's use now.
    pub fn start(gpu: Option<usize>) -> Self {
        Self::from_base(gpu, device_used(gpu).unwrap_or(0))
    }
    /// Counts from `before` bytes in use (sampled before the setting's model was loaded).
    pub fn from_base(gpu: Option<usize>, before: u64) -> Self {
        Self {
            gpu,
            before,
            peak: 0,
            seen: false,
        }
    }
    pub fn sample(&mut self) -> u64 {
        if let Some(u) = device_used(self.gpu) {
            self.peak = self.peak.max(u.saturating_sub(self.before));
            self.seen = true;
        }
        self.peak
    }
    /// The peak, where there is a device to measure.
    pub fn bytes(&self) -> Option<u64> {
        self.seen.then_some(self.peak)
    }
}

/// Resets the process's peak resident set (`VmHWM`); false where the kernel does not allow it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The process's peak resident set since the last reset, bytes (0 where unknown).
pub fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Host DRAM read bandwidth, bytes/s, with `threads` threads: each streams its share of a
/// `bytes` buffer (written once first, so its pages are real), best of 5 passes. What a
/// batch-1 CPU decode step can read at most: the CPU row's bound on this machine, not the
/// H200 host's 68 GB/s at 16 threads (on the 2-core dev box, 33-34 GB/s at 2, that doubled it).
pub fn host_read_bandwidth(threads: usize, bytes: usize) -> f64 {
    let words = (bytes / 8).max(1);
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads.max(1));
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t0 = Instant::now();
        let sum = std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks(chunk)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            parts
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best
}

/// Physical CPU cores (distinct physical id / core id pairs), else the logical count.
pub fn physical_cores() -> usize {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut cores = std::collections::HashSet::new();
    let mut phys = "";
    for line in info.lines() {
        let mut kv = line.splitn(2, ':').map(str::trim);
        match (kv.next(), kv.next()) {
            (Some("physical id"), Some(v)) => phys = v,
            (Some("core id"), Some(v)) => {
                cores.insert((phys.to_string(), v.to_string()));
            }
            _ => {}
        }
    }
    if cores.is_empty() {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        cores.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte rate a machine's DRAM can have: above 0.1 GB/s (a rate per word or per GB, or a
    /// pass timed as nothing, lands outside by orders of magnitude) and below 10 TB/s (no host
    /// reads faster; a 64 MiB buffer may sit partly in a large L3, hence not tighter). Timing
    /// alone cannot be held tighter on a loaded CI machine. More threads than words, and none,
    /// still measure.
    #[test]
    fn host_read_bandwidth_is_a_plausible_byte_rate() {
        for (threads, bytes) in [(2, 64 << 20), (1, 64 << 20), (0, 4096), (1024, 64)] {
            let bw = host_read_bandwidth(threads, bytes);
            let min = if bytes >= 1 << 20 { 0.1e9 } else { 0.0 };
            assert!(
                bw.is_finite() && bw > min && (bytes < 1 << 20 || bw < 10e12),
                "{threads} threads over {bytes} bytes: {bw} B/s"
            );
        }
    }

    #[test]
    fn names_and_matrix_follow_llama_bench() {
        let m = matrix(&[512, 4096], &[128], &[0, 8192]);
        let names: Vec<String> = m.iter().map(Test::name).collect();
        assert_eq!(
            names,
            [
                "pp512",
                "pp4096",
                "tg128",
                "pp512 @ d8192",
                "pp4096 @ d8192",
                "tg128 @ d8192"
            ]
        );
        assert_eq!(n_ctx_for(&m), 8192 + 4096 + 16);
    }

    #[test]
    fn sample_std() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((s - 1.0).abs() < 1e-12);
        assert_eq!(mean_std(&[5.0]), (5.0, 0.0));
    }

    /// A subject that only counts positions, to check depth handling.
    struct Count(usize, Vec<usize>);
    impl Subject for Count {
        fn append(&mut self, t: &[u32]) -> Result<()> {
            self.0 += t.len();
            self.1.push(self.0);
            Ok(())
        }
        fn truncate(&mut self, n: usize) {
            self.0 = self.0.min(n);
        }
    }

    #[test]
    fn every_run_starts_at_its_depth() {
        let mut c = Count(0, Vec::new());
        let tests = matrix(&[8], &[2], &[0, 5]);
        let r = run_tests(&mut c, &tests, 2, 100, &mut || {}).unwrap();
        assert_eq!(r.len(), 4);
        assert!(r.iter().all(|m| m.tok_s.len() == 2 && m.offload.is_none()));
        // depth 0: (empty fill) pp8 warm-up + 2 reps; tg2: warm-up 1 token, then 2 x 2 tokens;
        // depth 5: fill to 5, pp8 ends at 13 each time, tg ends at 6 / 7.
        assert_eq!(
            c.1,
            [0, 8, 8, 8, 1, 1, 2, 1, 2, 5, 13, 13, 13, 6, 6, 7, 6, 7]
        );
    }
}
