//! Routed experts in one call: `Model::expert_stacks` names every stack of
//! experts of the MoE fixtures (GPT-OSS's 3-D stacks, Mixtral's experts
//! stored apart, mlx-lm's `switch_mlp` cut into its experts, GGUF's
//! `*_exps` cut into its experts by the conversion) with its
//! experts in order, and `matmul_experts` (GPU) and `matmul_cpu_experts`
//! give each row of x the bits its expert's own product gives it.

use std::path::PathBuf;

use super::{assert_within, decoders, random_x, reference};
use crate::common::{fixtures, gpu_test, Rng};
use wgpu_dequant::{BackendChoice, DtypeChoice, GpuDecoder, Model, Rule};

/// The MoE checkpoints: GPT-OSS's, Mixtral's, mlx-lm's Qwen3-MoE and a
/// GGUF Qwen3-MoE (Q2_K and Q3_K experts).
pub(super) fn cases() -> [PathBuf; 4] {
    let ours = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    [
        fixtures().join("gpt-oss-mxfp4/model"),
        fixtures().join("mixtral-w4a16/model"),
        ours.join("tests/fixtures/mlx-qwen3-moe-4bit/model"),
        ours.join("tests/gguf/hf-qwen3moe/model/model.gguf"),
    ]
}

/// Expert ids of 8 rows over 4 experts (of `experts`), some repeated, in no order.
fn mixed_ids(experts: usize) -> Vec<u32> {
    [3u32, 1, 3, 0, 1, 2, 3, 0]
        .map(|e| e % experts as u32)
        .to_vec()
}

/// Expert `e` of `stack` (`name`: its name among `expert_stacks`'s) as its
/// own product: `(W[e] with rows the outputs, bias)`.
fn dense(model: &Model, stack: &str, name: &str, e: usize) -> (Vec<f32>, Option<Vec<f32>>) {
    match name.strip_suffix(&format!("[{e}]")) {
        Some(s) => {
            assert_eq!(s, stack);
            let shape = model.info(stack).unwrap().shape;
            let (rows, cols) = (shape[1], shape[2]);
            let all = model.decode_f32(stack, BackendChoice::Cpu).unwrap();
            let w = &all[e * rows * cols..(e + 1) * rows * cols];
            // GPT-OSS's `[E, in, out]`, multiplied as stored: `x·W[e]`.
            let w = (0..rows * cols)
                .map(|i| w[(i % rows) * cols + i / rows])
                .collect();
            let bias = model
                .decode_f32(&format!("{stack}_bias"), BackendChoice::Cpu)
                .ok()
                .map(|b| b[e * cols..(e + 1) * cols].to_vec());
            (w, bias)
        }
        None => {
            let w = model.decode_f32(name, BackendChoice::Cpu).unwrap();
            let bias = model
                .decode_f32(&name.replace(".weight", ".bias"), BackendChoice::Cpu)
                .ok();
            (w, bias)
        }
    }
}

/// Row `x` (one row) through expert `e` of `stack` alone, on the CPU and
/// on `decoder`: `upload_expert` for a 3-D stack, `upload_packed` for a
/// quantized weight of its own, else the stack with that one row.
fn alone(
    model: &Model,
    decoder: &GpuDecoder,
    (stack, name, e): (&str, &str, usize),
    x: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let quantized = model.quantized().any(|t| t.name == name);
    if name.ends_with(']') {
        let cpu = model.matmul_cpu_expert(stack, e, x, 1).unwrap();
        let w = model.upload_expert(stack, e, decoder).unwrap();
        (cpu, decoder.matmul(&w, x, 1).unwrap())
    } else if quantized {
        let cpu = model.matmul_cpu(name, x, 1).unwrap();
        let w = model.upload_packed(name, decoder).unwrap();
        (cpu, decoder.matmul(&w, x, 1).unwrap())
    } else {
        let cpu = model.matmul_cpu_experts(stack, x, 1, &[e as u32]).unwrap();
        let w = model.upload_experts(stack, decoder).unwrap();
        (cpu, decoder.matmul_experts(&w, x, 1, &[e as u32]).unwrap())
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn expert_stacks_name_every_stack_with_its_experts_in_order() {
    let want = [
        (
            "model.layers.0.mlp.experts.gate_up_proj",
            "model.layers.0.mlp.experts.gate_up_proj[1]",
            8,
        ),
        (
            "model.layers.0.block_sparse_moe.experts.*.w1.weight",
            "model.layers.0.block_sparse_moe.experts.1.w1.weight",
            4,
        ),
        (
            "model.layers.1.mlp.experts.*.down_proj.weight",
            "model.layers.1.mlp.experts.1.down_proj.weight",
            4,
        ),
        (
            "model.layers.0.mlp.experts.*.gate_proj.weight",
            "model.layers.0.mlp.experts.1.gate_proj.weight",
            4,
        ),
    ];
    for (dir, (stack, second, experts)) in cases().into_iter().zip(want) {
        let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
        let stacks = model.expert_stacks();
        let what = dir.display();
        let (_, names) = stacks
            .iter()
            .find(|(s, _)| s == stack)
            .unwrap_or_else(|| panic!("{what}: no {stack} among {stacks:?}"));
        assert_eq!(names.len(), experts, "{what}: {names:?}");
        assert_eq!(names[1], second, "{what}");
        for (s, names) in &stacks {
            for (e, name) in names.iter().enumerate() {
                let own = name.replace(&format!(".experts.{e}."), ".experts.*.");
                assert!(
                    own == *s || *name == format!("{s}[{e}]"),
                    "{what}: {s} {name}"
                );
            }
        }
        // Every layer's every projection, and nothing else.
        let layers = model
            .tensors()
            .filter(|t| t.name.ends_with("input_layernorm.weight"))
            .count();
        let projections = if stack.ends_with("gate_up_proj") {
            2
        } else {
            3
        };
        assert_eq!(stacks.len(), layers * projections, "{what}: {stacks:?}");
        let e = model
            .matmul_cpu_experts("model.layers.0.mlp.nothing.*.w", &[0.0], 1, &[0])
            .unwrap_err();
        assert_eq!(e.rule, Rule::Argument, "{e}");
    }
    // A checkpoint without experts has no stacks.
    let dense = Model::open(fixtures().join("w4a16-g128/model"), DtypeChoice::Auto).unwrap();
    assert!(dense.expert_stacks().is_empty());
}

#[test]
fn matmul_experts_gives_each_row_its_experts_product() {
    gpu_test(|adapter| {
        let decoders = decoders(&adapter);
        let mut rng = Rng::new(0x5EED_6E3F_0000_0065);
        for dir in cases() {
            let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
            let stacks = model.expert_stacks();
            // A layer's projections: every shape and way of storing them.
            for (stack, names) in stacks.iter().filter(|(s, _)| s.contains(".layers.0.")) {
                let what = format!("{} {stack}", dir.display());
                let ids = mixed_ids(names.len());
                let m = ids.len();
                let (w0, _) = dense(&model, stack, &names[0], 0);
                let k = k_of(&model, stack, &names[0]);
                let n = w0.len() / k;
                let x = random_x(&mut rng, m, k, 1.0);
                let cpu = model.matmul_cpu_experts(stack, &x, m, &ids).unwrap();
                let packs: Vec<_> = decoders
                    .iter()
                    .map(|d| model.upload_experts(stack, d).unwrap())
                    .collect();
                assert_eq!(
                    (packs[0].n, packs[0].k, packs[0].experts),
                    (n, k, names.len()),
                    "{what}"
                );
                let gpu: Vec<_> = decoders
                    .iter()
                    .zip(&packs)
                    .map(|(d, w)| d.matmul_experts(w, &x, m, &ids).unwrap())
                    .collect();
                for (r, &e) in ids.iter().enumerate() {
                    let e = e as usize;
                    let xr = &x[r * k..(r + 1) * k];
                    let (w, bias) = dense(&model, stack, &names[e], e);
                    let want = reference(&w, xr, bias.as_deref(), (1, n, k));
                    let row = |y: &[f32]| y[r * n..(r + 1) * n].to_vec();
                    let what = format!("{what} row {r} expert {e}");
                    assert_within(&row(&cpu), &want, &format!("{what} on the CPU"));
                    for (i, (d, y)) in decoders.iter().zip(&gpu).enumerate() {
                        let (cpu_alone, gpu_alone) = alone(&model, d, (stack, &names[e], e), xr);
                        assert_eq!(
                            bits(&row(&cpu)),
                            bits(&cpu_alone),
                            "{what}: CPU, not its own product's bits"
                        );
                        assert_within(&row(y), &want, &format!("{what} on GPU decoder {i}"));
                        assert_eq!(
                            bits(&row(y)),
                            bits(&gpu_alone),
                            "{what}: GPU decoder {i}, not its own product's bits"
                        );
                    }
                }
                // Refused, in one line naming what is wrong.
                let d = &decoders[0];
                let e = d
                    .matmul_experts(&packs[0], &x, m, &[names.len() as u32; 8])
                    .unwrap_err();
                assert!(
                    e.to_string()
                        .contains(&format!("has {} experts", names.len())),
                    "{e}"
                );
                let e = model
                    .matmul_cpu_experts(stack, &x, m, &ids[1..])
                    .unwrap_err();
                assert!(
                    e.to_string().contains(stack) && !e.to_string().contains('\n'),
                    "{e}"
                );
                let e = d.matmul(&packs[0], &x, m).unwrap_err();
                assert!(e.to_string().contains("record_matmul_experts"), "{e}");
            }
        }
        // One Linear is no stack.
        let model = Model::open(fixtures().join("w4a16-g128/model"), DtypeChoice::Auto).unwrap();
        let name = model.quantized().next().unwrap().name;
        let w = model.upload_packed(&name, &decoders[0]).unwrap();
        let e = decoders[0]
            .matmul_experts(&w, &vec![0.0; w.k], 1, &[0])
            .unwrap_err();
        assert!(e.to_string().contains("not a stack of experts"), "{e}");
        assert_eq!(
            model.upload_experts(&name, &decoders[0]).unwrap_err().rule,
            Rule::Argument
        );
    });
}

/// Inputs of expert 0 of `stack`.
fn k_of(model: &Model, stack: &str, name: &str) -> usize {
    match name.ends_with(']') {
        // `[E, in, out]`, multiplied as stored.
        true => model.info(stack).unwrap().shape[1],
        false => model.info(name).unwrap().shape[1],
    }
}

/// `Linears` over files read piece by piece (what the browser runs): the
/// Model's stacks, and each stack's products the Model's bits on the CPU
/// and the GPU; a CPU product reads only the experts its ids name, where
/// they are stored apart.
#[test]
fn linears_read_piece_by_piece_route_rows_as_the_model_does() {
    use crate::stream::DirFiles;
    use wgpu_dequant::Linears;
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        let mut rng = Rng::new(0x5EED_6E3F_0000_0066);
        for path in cases() {
            let model = Model::open(&path, DtypeChoice::Auto).unwrap();
            let dir = if path.is_file() {
                path.parent().unwrap().to_path_buf()
            } else {
                path.clone()
            };
            let files = DirFiles::new(&dir);
            let linears = pollster::block_on(Linears::open(&files, DtypeChoice::Auto)).unwrap();
            let stacks = model.expert_stacks();
            assert_eq!(linears.expert_stacks(), stacks.as_slice(), "{dir:?}");
            let (stack, names) = &stacks[0];
            let what = format!("{} {stack}", dir.display());
            let ids = mixed_ids(names.len());
            let m = ids.len();
            let k = k_of(&model, stack, &names[0]);
            let x = random_x(&mut rng, m, k, 1.0);
            let before: u64 = files.read.borrow().values().sum();
            let cpu = pollster::block_on(linears.matmul_cpu_experts(stack, &x, m, &[1; 8]));
            let one = files.read.borrow().values().sum::<u64>() - before;
            let want = model.matmul_cpu_experts(stack, &x, m, &[1; 8]).unwrap();
            assert_eq!(bits(&cpu.unwrap()), bits(&want), "{what}: expert 1");
            let cpu = pollster::block_on(linears.matmul_cpu_experts(stack, &x, m, &ids)).unwrap();
            let want = model.matmul_cpu_experts(stack, &x, m, &ids).unwrap();
            assert_eq!(bits(&cpu), bits(&want), "{what}: on the CPU");
            let before: u64 = files.read.borrow().values().sum();
            let w = pollster::block_on(linears.upload_experts(stack, &decoder)).unwrap();
            let all = files.read.borrow().values().sum::<u64>() - before;
            // Mixtral's experts are tensors of their own (the others'
            // share a stacked tensor).
            let apart = dir.ends_with("mixtral-w4a16/model");
            assert!(
                one > 0 && one <= all && (one < all || !apart),
                "{what}: {one} of {all} bytes"
            );
            let gpu = decoder.matmul_experts(&w, &x, m, &ids).unwrap();
            let own = model.upload_experts(stack, &decoder).unwrap();
            let want = decoder.matmul_experts(&own, &x, m, &ids).unwrap();
            assert_eq!(bits(&gpu), bits(&want), "{what}: on the GPU");
            let e = pollster::block_on(linears.upload_experts("model.nothing.*.w", &decoder));
            assert_eq!(e.unwrap_err().rule, Rule::Argument, "{what}");
        }
    });
}
