//! Weight placement (`engine::weights`): offloading to a GPU, the token embedding lives in host
//! memory, looked up on the CPU, with a device copy only when the output head is tied to it. Two
//! CPU backends stand in for the GPU and the host here; the GPU run itself is covered by the
//! device workflow (`scripts/device-run.sh tests`).
mod common;
use pocketmoe::engine::weights::{Weights, WeightsError, TOKEN_EMBD};
use pocketmoe::engine::{Device, Engine, EngineOptions};
use pocketmoe::ggml::Backend;
use pocketmoe::gguf::GgufModel;
use pocketmoe::synth::quantmix::QuantMix;

use common::{without_output, write_without};

#[test]
fn token_embedding_goes_to_the_host_part_and_a_tied_head_keeps_a_device_copy() {
    let mut saw_tied = false;
    let mut saw_untied = false;
    for arch in pocketmoe::arch::built().map(|a| a.spec.name) {
        let untied = common::synth_tiny("weights", arch, QuantMix::Q8_0, 1.0, 3);
        for path in [without_output(&untied), untied] {
            let file = GgufModel::open(&path).unwrap();
            let total: u64 = file.tensors().map(|t| t.n_bytes).sum();
            let embd = file
                .tensors()
                .find(|t| t.name == TOKEN_EMBD)
                .unwrap()
                .clone();
            let tied = !file.tensors().any(|t| t.name == "output.weight");
            saw_tied |= tied;
            saw_untied |= !tied;

            let (_, hp) = pocketmoe::arch::hparams(&file).unwrap();
            let (main, host) = (Backend::cpu(1).unwrap(), Backend::cpu(1).unwrap());
            let w = Weights::load(&file, &hp, &main, Some(&host), &|_| true, &|_, _| {}).unwrap();
            assert_eq!(w.host_bytes(), embd.n_bytes, "{arch}: host part");
            let on_main = if tied { total } else { total - embd.n_bytes };
            assert_eq!(w.bytes(), on_main, "{arch}: main part (tied: {tied})");
            let lookup = w.embedding().unwrap();
            assert_eq!(
                lookup.read_bytes().unwrap(),
                file.tensor_data(&embd),
                "{arch}: host copy's bytes"
            );
            // `get` serves the head: the device copy where there is one.
            let head_table = w.get(TOKEN_EMBD).unwrap();
            assert_eq!(
                head_table.data_addr() != lookup.data_addr(),
                tied,
                "{arch}: a tied head reads its own device copy, an untied model has one copy"
            );
            // The typed handles the graphs read: the lookup's copy, and the head's.
            let io = w.layers().io();
            assert_eq!(w.t(io.embd).data_addr(), lookup.data_addr(), "{arch}");
            let head = w.get("output.weight").unwrap_or(head_table);
            assert_eq!(w.t(io.head).data_addr(), head.data_addr(), "{arch}: head");

            // Without a host backend everything is on the main one.
            let w = Weights::load(&file, &hp, &main, None, &|_| true, &|_, _| {}).unwrap();
            assert_eq!(
                (w.bytes(), w.host_bytes()),
                (total, 0),
                "{arch}: no host part"
            );
            assert_eq!(
                w.embedding().unwrap().data_addr(),
                w.get(TOKEN_EMBD).unwrap().data_addr()
            );
        }
    }
    assert!(
        saw_untied && saw_tied,
        "untied {saw_untied}, tied {saw_tied}"
    );
}

/// A file without a tensor the graph needs fails to load with an error naming the tensor, never
/// a panic while a graph is built. Declaring the weights resolves each block's tensors into typed
/// structs (`graph::layers`): every tensor the architecture's table requires in a decode block
/// (the last, a routed one in every tiny preset) and every required global one but `output`,
/// dropped in turn,
/// is refused there by name (`WeightsError::Missing`), validation bypassed. Through the engine,
/// validation (`model::validate`) refuses the file first, naming the tensor and the file.
#[test]
fn a_missing_tensor_is_a_load_error_naming_it() {
    for arch in pocketmoe::arch::built().map(|a| a.spec.name) {
        let path = common::synth_tiny("weights", arch, QuantMix::Q8_0, 1.0, 3);
        let file = GgufModel::open(&path).unwrap();
        let (_, hp) = pocketmoe::arch::hparams(&file).unwrap();
        let il = hp.n_layer_decode() - 1;
        assert!(hp.is_moe_layer(il), "{arch}: block {il} routed");
        let names: Vec<String> = hp
            .arch
            .expected_tensors(&hp)
            .filter(|(_, spec, b)| {
                matches!(b, None | Some(_) if b.is_none_or(|b| b == il))
                    && hp.arch.required_in(spec, &hp, *b)
                    // The head falls back to the embedding (tied); validation requires it.
                    && spec.name != "output.weight"
            })
            .map(|(name, _, _)| name)
            .collect();
        assert!(names.iter().any(|n| n.starts_with(&format!("blk.{il}."))));
        let out = path.with_extension("missing.gguf");
        for name in &names {
            write_without(&path, name, &out);
            let f = GgufModel::open(&out).unwrap();
            match Weights::declare(&f, &hp, false, &|_| true) {
                Err(e @ WeightsError::Missing { .. }) => assert!(
                    e.to_string().contains(&format!("missing tensor {name},")),
                    "{arch}: {e}"
                ),
                Err(e) => panic!("{arch} without {name}: {e}"),
                Ok(_) => panic!("{arch}: weights declared without {name}"),
            }
        }

        let router = format!("blk.{il}.ffn_gate_inp.weight");
        write_without(&path, &router, &out);
        let opts = EngineOptions {
            device: Device::Cpu,
            n_ctx: 64,
            n_threads: 1,
            ..Default::default()
        };
        let err = Engine::load(&out, opts, &|_, _| {}).err().expect("refused");
        let msg = err.to_string();
        assert!(
            msg.contains(&router) && msg.contains(&out.display().to_string()),
            "{arch}: {msg}"
        );
        std::fs::remove_file(&out).unwrap();
    }
}
