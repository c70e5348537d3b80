//! `Products`, what the C and Python packages hold: on the CPU and on the
//! GPU, each product the bits of the model's own call (`Model::matmul_cpu`,
//! `matmul_cpu_expert`, `matmul_cpu_experts`, and `GpuDecoder::matmul` /
//! `matmul_experts` of the weight or stack uploaded), `dims` the product's
//! shape, and a stack taken whole or ids that do not fit x refused in one
//! line naming what.

use super::experts::cases;
use super::random_x;
use crate::common::{gpu_test, Rng};
use wgpu_dequant::{BackendChoice, DtypeChoice, GpuDecoder, Model, Products, Rule};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Every MoE fixture through `Products` on `backend`, against the model's
/// own calls (`gpu`: the decoder they upload to).
fn products_are_the_models_own(backend: BackendChoice, gpu: Option<&GpuDecoder>) {
    let mut rng = Rng::new(0x9D0D_0C75);
    // 2-D weights and 3-D stacks multiplied.
    let mut seen = [0, 0];
    for dir in cases() {
        let what = dir.display().to_string();
        let p = Products::open(&dir, DtypeChoice::Auto, backend).unwrap();
        assert_eq!(p.gpu().is_some(), gpu.is_some(), "{what}");
        let model = Model::open(&dir, DtypeChoice::Auto).unwrap();
        let mut names: Vec<String> = model.quantized().map(|t| t.name).collect();
        names.sort();
        assert_eq!(p.quantized(), names, "{what}");
        // A 2-D weight (GPT-OSS's are all stacks).
        if let Some(name) = names
            .iter()
            .find(|n| model.info(n).unwrap().shape.len() == 2)
        {
            let (n, k) = p.dims(name, None).unwrap();
            assert_eq!(vec![n, k], model.info(name).unwrap().shape, "{what} {name}");
            let x = random_x(&mut rng, 3, k, 1.0);
            let want = match gpu {
                None => model.matmul_cpu(name, &x, 3).unwrap(),
                Some(d) => d
                    .matmul(&model.upload_packed(name, d).unwrap(), &x, 3)
                    .unwrap(),
            };
            let got = p.matmul(name, None, &x, 3).unwrap();
            assert_eq!(bits(&got), bits(&want), "{what} {name}");
            seen[0] += 1;
        }
        // A stack of experts: routed rows, and no rows.
        let (stack, experts) = &model.expert_stacks()[0];
        let ids: Vec<u32> = [1u32, 0, 1].map(|e| e % experts.len() as u32).to_vec();
        // x's width: a 3-D stack's inputs are its rows or its columns,
        // experts stored apart take their own columns; the one that multiplies.
        let k = (0..2)
            .map(|i| {
                model
                    .info(stack)
                    .map_or(0, |t| t.shape.get(1 + i).copied().unwrap_or(0))
            })
            .chain(
                experts
                    .iter()
                    .map(|e| model.info(e).map_or(0, |t| t.shape[1])),
            )
            .find(|&k| k > 0 && p.matmul_experts(stack, &vec![0.0; k], (1, k), &[0]).is_ok())
            .unwrap();
        let x = random_x(&mut rng, 3, k, 1.0);
        let want = match gpu {
            None => model.matmul_cpu_experts(stack, &x, 3, &ids).unwrap(),
            Some(d) => d
                .matmul_experts(&model.upload_experts(stack, d).unwrap(), &x, 3, &ids)
                .unwrap(),
        };
        let (y, n) = p.matmul_experts(stack, &x, (3, k), &ids).unwrap();
        assert_eq!(
            (bits(&y), n),
            (bits(&want), want.len() / 3),
            "{what} {stack}"
        );
        assert_eq!(
            p.matmul_experts(stack, &[], (0, k), &[]).unwrap(),
            (Vec::new(), n)
        );
        let e = p.matmul_experts(stack, &x, (3, k), &ids[1..]).unwrap_err();
        assert!(
            e.rule == Rule::Argument && e.to_string().contains(stack.as_str()),
            "{e}"
        );
        // A 3-D stack is multiplied an expert at a time.
        if let Some(whole) = names
            .iter()
            .find(|n| model.info(n).unwrap().shape.len() == 3)
        {
            let e = p.matmul(whole, None, &x, 3).unwrap_err();
            let line = e.to_string();
            assert!(
                line.contains(whole.as_str()) && line.contains("stack of") && !line.contains('\n'),
                "{line}"
            );
            let (n, k) = p.dims(whole, Some(1)).unwrap();
            let x = random_x(&mut rng, 2, k, 1.0);
            let want = match gpu {
                None => model.matmul_cpu_expert(whole, 1, &x, 2).unwrap(),
                Some(d) => d
                    .matmul(&model.upload_expert(whole, 1, d).unwrap(), &x, 2)
                    .unwrap(),
            };
            assert_eq!(want.len(), 2 * n, "{what} {whole}[1]");
            assert_eq!(
                bits(&p.matmul(whole, Some(1), &x, 2).unwrap()),
                bits(&want),
                "{what} {whole}[1]"
            );
        }
    }
}

#[test]
fn cpu_products_are_the_models_own() {
    products_are_the_models_own(BackendChoice::Cpu, None);
}

#[test]
fn gpu_products_are_the_models_own() {
    gpu_test(|_| {
        let d = GpuDecoder::for_backend(BackendChoice::Gpu)
            .unwrap()
            .unwrap();
        products_are_the_models_own(BackendChoice::Gpu, Some(&d));
    });
}
