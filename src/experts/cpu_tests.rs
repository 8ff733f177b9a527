//! Dropping an [`Offload`] with a CPU job in flight (a step that failed half-way leaves one):
//! the job must finish before the host store it reads is freed.
use super::super::offload::{Offload, OffloadOptions};
use super::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shared by the test, the worker's jobs and a [`StoreFreed`] in the offload.
#[derive(Default)]
pub struct Probe {
    /// Each job sleeps this long before it reads the store, ms.
    delay_ms: AtomicU64,
    store_freed: AtomicBool,
    events: Mutex<Vec<&'static str>>,
}

impl Probe {
    fn log(&self, e: &'static str) {
        self.events.lock().unwrap().push(e);
    }

    /// Before a job: sleeps, then whether the store is still there to read (a job that
    /// finds it freed logs that and reads nothing, so the failing case does not crash).
    pub(in crate::experts) fn before_job(&self) -> bool {
        std::thread::sleep(Duration::from_millis(self.delay_ms.load(Ordering::SeqCst)));
        let alive = !self.store_freed.load(Ordering::SeqCst);
        if !alive {
            self.log("job found the store freed");
        }
        alive
    }

    pub(in crate::experts) fn after_job(&self) {
        self.log("job done");
    }
}

/// Declared right before `Offload::store`, so that, field by field, it drops just before
/// the store is freed: marks the store freed.
#[derive(Default)]
pub struct StoreFreed(pub Option<Arc<Probe>>);

impl Drop for StoreFreed {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.store_freed.store(true, Ordering::SeqCst);
            p.log("store freed");
        }
    }
}

#[test]
fn dropping_an_offload_with_a_cpu_job_in_flight_finishes_the_job_before_freeing_the_store() {
    let dir = std::env::temp_dir().join(format!("pocketmoe-cpu-drop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen3moe.gguf");
    let so = crate::synth::SynthOptions {
        arch: "qwen3moe".into(),
        preset: "tiny".into(),
        quant: crate::synth::quantmix::QuantMix::Q8_0,
        routing_skew: 1.0,
        seed: 1,
        out: path.clone(),
    };
    crate::synth::synth(&so, &|_, _| {}).unwrap();
    let file = crate::gguf::GgufModel::open(&path).unwrap();
    let hp =
        crate::model::Hparams::from_meta(&crate::arch::qwen3moe::QWEN3MOE.spec, &file).unwrap();
    let backend = std::rc::Rc::new(Backend::cpu(1).unwrap());
    let opts = OffloadOptions {
        expert_parallel: false,
        policy: Default::default(),
        max_slot_tokens: 1,
        n_ubatch: 1,
        prefetch: false,
        cpu_threads: 1,
        bandwidths: None,
        balance: true,
        cpu_spin: false,
        slack_control: false,
        gated: crate::experts::Gated::Off,
        table: crate::experts::TableForm::Off,
        late_copies: false,
        resident_below: 0,
        gated_split: false,
    };
    let mut off = Offload::load(
        &file,
        &hp,
        std::slice::from_ref(&backend),
        &|_| 0,
        opts,
        &|_, _| {},
    )
    .unwrap();
    drop(file);
    let probe = Arc::new(Probe::default());
    let (store_freed, cpu_ok, cpu) = off.test_parts();
    *store_freed = StoreFreed(Some(probe.clone()));
    let il = (0..hp.n_layer as usize).find(|&il| cpu_ok[il]).unwrap();
    let n_embd = hp.n_embd as usize;
    let cpu = cpu.expect("a CPU channel");
    cpu.probe = Some(probe.clone());
    let job = |c: &mut CpuChannel| {
        c.start(
            il,
            ExpertAct::Swiglu,
            vec![0.25; n_embd],
            vec![vec![(0, 0.5), (1, 0.5)]],
        );
    };
    // The channel works: one job, joined.
    job(cpu);
    assert_eq!(cpu.finish().unwrap().0.len(), n_embd);
    assert_eq!(*probe.events.lock().unwrap(), ["job done"]);
    probe.events.lock().unwrap().clear();

    // A job in flight (it sleeps before reading the store), then the offload is dropped.
    probe.delay_ms.store(300, Ordering::SeqCst);
    job(cpu);
    drop(off);
    // Without the join the worker is still asleep here: give it time to log what it finds.
    let t0 = Instant::now();
    while probe.events.lock().unwrap().len() < 2 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        *probe.events.lock().unwrap(),
        ["job done", "store freed"],
        "the job in flight must finish before the store is freed"
    );
}
