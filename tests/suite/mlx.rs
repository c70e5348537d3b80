//! MLX checkpoints (mlx-lm): the fixtures MLX wrote give `mx.dequantize`'s
//! bytes on both backends, synthetic ones of every width, group, model
//! dtype and mode the arithmetic MLX computes (`T(T(s·q) + b)` rounded
//! twice; the fp modes' code and scale each cast to T and multiplied in
//! T), and malformed ones are refused with their rule.

use std::path::Path;

use serde_json::{json, Value};

use crate::common::{
    check_case, fixtures, gpu_test, read_dir_tensors, write_json, write_safetensors, Rng, Tensor,
};
use wgpu_dequant::backend::gpu::Gpu;
use wgpu_dequant::backend::{way, Way};
use wgpu_dequant::numerics::{e2m1, e4m3, e8m0, OutDtype};
use wgpu_dequant::{dequantize, BackendChoice, DtypeChoice, Model, Options, Rule};

const CASES: &[&str] = &["mlx-affine-4bit-g64", "mlx-3bit-g64", "mlx-mxfp4"];

#[test]
fn fixtures_give_mlx_bytes_on_the_cpu() {
    for case in CASES {
        check_case(
            case,
            DtypeChoice::Auto,
            BackendChoice::Cpu,
            "expected-bf16.digests.json",
            false,
        );
        let f32 = DtypeChoice::Fixed(OutDtype::F32);
        check_case(
            case,
            f32,
            BackendChoice::Cpu,
            "expected-f32.digests.json",
            false,
        );
    }
}

/// On the GPU too, the affine ones (their biases added last) through the
/// generic kernel, and in f16 the CPU's bytes.
#[test]
fn fixtures_give_mlx_bytes_on_the_gpu() {
    gpu_test(|adapter| {
        for case in CASES {
            check_case(
                case,
                DtypeChoice::Auto,
                BackendChoice::Gpu,
                "expected-bf16.digests.json",
                false,
            );
            let f32 = DtypeChoice::Fixed(OutDtype::F32);
            check_case(
                case,
                f32,
                BackendChoice::Gpu,
                "expected-f32.digests.json",
                false,
            );
            let model = fixtures().join(case).join("model");
            assert_eq!(
                decoded(&model, OutDtype::F16, BackendChoice::Gpu),
                decoded(&model, OutDtype::F16, BackendChoice::Cpu),
                "{case} f16"
            );
        }
        let gpu = Gpu::open(&adapter).unwrap();
        let model = Model::open(fixtures().join("mlx-3bit-g64/model"), DtypeChoice::Auto).unwrap();
        let before = gpu.decoder().dispatches().generic;
        for t in model.tensors().filter(|t| t.name.ends_with("proj.weight")) {
            assert!(
                model.decode_on(&t.name, &gpu).unwrap()
                    == model.decode(&t.name, BackendChoice::Cpu).unwrap(),
                "{}",
                t.name
            );
        }
        assert!(
            gpu.decoder().dispatches().generic > before,
            "the generic kernel did not run"
        );
    });
}

/// The dense tensors of `model` decoded to `dtype` by `backend`.
fn decoded(
    model: &Path,
    dtype: OutDtype,
    backend: BackendChoice,
) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let opts = Options {
        dtype: DtypeChoice::Fixed(dtype),
        backend,
    };
    dequantize(model, &out, &opts).unwrap();
    read_dir_tensors(&out)
}

/// One synthetic module: its scheme and what MLX would store.
struct Module {
    name: String,
    bits: u32,
    group: usize,
    mode: &'static str,
    /// `[slices, rows, cols]`.
    dims: [usize; 3],
    codes: Vec<u32>,
    /// Per group: (scale, bias) as stored values (already in T, or bytes).
    scales: Vec<f32>,
    biases: Vec<f32>,
    scale_bytes: Vec<u8>,
    /// nvfp4's global scale, one per slice (none: empty).
    global: Vec<f32>,
}

/// The safetensors name of `t`.
fn st_name(t: OutDtype) -> &'static str {
    match t {
        OutDtype::Bf16 => "BF16",
        OutDtype::F16 => "F16",
        OutDtype::F32 => "F32",
    }
}

/// The safetensors dtype and bytes of T-exact values.
fn stored(t: OutDtype, v: &[f32]) -> (&'static str, Vec<u8>) {
    let mut bytes = vec![0u8; v.len() * t.size()];
    for (x, o) in v.iter().zip(bytes.chunks_mut(t.size())) {
        t.encode(*x, o);
    }
    (st_name(t), bytes)
}

impl Module {
    fn new(
        rng: &mut Rng,
        name: &str,
        (bits, group, mode): (u32, usize, &'static str),
        dims: [usize; 3],
        t: OutDtype,
    ) -> Module {
        let [s, r, c] = dims;
        let groups = s * r * c / group;
        let fp = mode != "affine";
        let codes = (0..s * r * c)
            .map(|_| loop {
                let q = rng.below(1 << bits) as u32;
                // No NaN codes: MLX's quantizer writes none.
                if !(mode == "mxfp8" && q & 0x7F == 0x7F) {
                    break q;
                }
            })
            .collect();
        // Scales of either sign and a spread of magnitudes, rounded to T;
        // E8M0 bytes around 2^0 (0 and 254 included), E4M3 bytes not NaN.
        let scales = (0..groups)
            .map(|_| {
                t.round((rng.below(2000) as f32 - 1000.0) * 2f32.powi(-(rng.below(20) as i32) - 4))
            })
            .collect();
        let biases = (0..groups)
            .map(|_| t.round((rng.below(2000) as f32 - 1000.0) / 997.0))
            .collect();
        let scale_bytes = (0..groups)
            .map(|i| match (mode, i % 7) {
                ("nvfp4", _) => (rng.below(0x7E) as u8) | (rng.below(2) as u8) << 7,
                (_, 0) => 0,
                (_, 1) => 254,
                _ => 110 + rng.below(30) as u8,
            })
            .collect();
        Module {
            name: name.into(),
            bits,
            group,
            mode,
            dims,
            codes,
            scales: if fp { vec![] } else { scales },
            biases: if fp { vec![] } else { biases },
            scale_bytes,
            global: vec![],
        }
    }

    /// The same with a global scale per slice (nvfp4), of spread magnitudes.
    fn with_global(mut self, rng: &mut Rng) -> Module {
        self.global = (0..self.dims[0])
            .map(|_| (1 + rng.below(5000)) as f32 * 2f32.powi(rng.below(12) as i32 - 8))
            .collect();
        self
    }

    /// The stored tensors: codes as one LSB-first stream per row.
    fn tensors(&self, t: OutDtype) -> Vec<Tensor> {
        let [s, r, c] = self.dims;
        let words = c * self.bits as usize / 32;
        let mut w = vec![0u32; s * r * words];
        for (row, codes) in self.codes.chunks(c).enumerate() {
            for (i, &q) in codes.iter().enumerate() {
                let bit = i * self.bits as usize;
                let word = row * words + bit / 32;
                w[word] |= q << (bit % 32);
                if bit % 32 + self.bits as usize > 32 {
                    w[word + 1] |= q >> (32 - bit % 32);
                }
            }
        }
        let shape = |last: usize| {
            if s > 1 {
                vec![s, r, last]
            } else {
                vec![r, last]
            }
        };
        let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut v = vec![Tensor::new(
            format!("{}.weight", self.name),
            "U32",
            &shape(words),
            bytes,
        )];
        let g = shape(c / self.group);
        if self.mode == "affine" {
            let (dt, b) = stored(t, &self.scales);
            v.push(Tensor::new(format!("{}.scales", self.name), dt, &g, b));
            let (dt, b) = stored(t, &self.biases);
            v.push(Tensor::new(format!("{}.biases", self.name), dt, &g, b));
        } else {
            v.push(Tensor::new(
                format!("{}.scales", self.name),
                "U8",
                &g,
                self.scale_bytes.clone(),
            ));
        }
        if !self.global.is_empty() {
            let b = self.global.iter().flat_map(|x| x.to_le_bytes()).collect();
            let name = format!("{}.global_scale", self.name);
            v.push(Tensor::new(name, "F32", &[s], b));
        }
        v
    }

    /// What MLX computes, as `out`'s bytes: in T = `out` for the model's
    /// own dtype, and f32 arithmetic for f32.
    fn expected(&self, out: OutDtype) -> Vec<u8> {
        let c = self.dims[2];
        let mut bytes = vec![0u8; self.codes.len() * out.size()];
        for (i, (&q, o)) in self
            .codes
            .iter()
            .zip(bytes.chunks_mut(out.size()))
            .enumerate()
        {
            let g = (i / c) * (c / self.group) + (i % c) / self.group;
            let v = match self.mode {
                "affine" => out.round(out.round(self.scales[g] * q as f32) + self.biases[g]),
                // In f32, whatever the output, rounded once.
                "nvfp4" if !self.global.is_empty() => {
                    let gs = self.global[i / (c * self.dims[1])] / 2688.0;
                    out.round(e2m1(q as u8) * (e4m3(self.scale_bytes[g]) * gs))
                }
                mode => {
                    let b = self.scale_bytes[g];
                    let (code, scale) = match mode {
                        "mxfp8" => (e4m3(q as u8), e8m0_mlx(b)),
                        "nvfp4" => (e2m1(q as u8), e4m3(b)),
                        _ => (e2m1(q as u8), e8m0_mlx(b)),
                    };
                    out.round(out.round(code) * out.round(scale))
                }
            };
            out.encode(v, o);
        }
        bytes
    }
}

fn e8m0_mlx(b: u8) -> f32 {
    if b == 255 {
        f32::INFINITY
    } else {
        e8m0(b)
    }
}

/// A model of dtype `t` with a module of every scheme (each its own entry
/// in the config), a stacked `[E, out, in]` one, a module left dense
/// (`false`), and a norm.
fn synthetic(dir: &Path, t: OutDtype, seed: u64) -> Vec<Module> {
    let mut rng = Rng::new(seed);
    let schemes: &[(u32, usize, &str)] = &[
        (2, 32, "affine"),
        (3, 64, "affine"),
        (4, 128, "affine"),
        (5, 32, "affine"),
        (6, 64, "affine"),
        (8, 128, "affine"),
        (4, 32, "mxfp4"),
        (4, 16, "nvfp4"),
        (8, 32, "mxfp8"),
    ];
    let mut modules: Vec<Module> = schemes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            Module::new(
                &mut rng,
                &format!("model.layers.{i}.mlp.down_proj"),
                s,
                [1, 24, 256],
                t,
            )
        })
        .collect();
    modules.push(Module::new(
        &mut rng,
        "model.layers.9.mlp.stacked",
        (4, 64, "affine"),
        [3, 8, 128],
        t,
    ));
    let global = Module::new(
        &mut rng,
        "model.layers.11.mlp.stacked",
        (4, 16, "nvfp4"),
        [4, 8, 64],
        t,
    );
    modules.push(global.with_global(&mut rng));
    let mut tensors: Vec<Tensor> = modules.iter().flat_map(|m| m.tensors(t)).collect();
    let (dt, b) = stored(t, &[1.0; 256]);
    tensors.push(Tensor::new("model.norm.weight", dt, &[256], b.clone()));
    let (dt, b) = stored(t, &vec![0.5; 16 * 256]);
    tensors.push(Tensor::new(
        "model.layers.10.mlp.up_proj.weight",
        dt,
        &[16, 256],
        b,
    ));
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    let mut q = json!({"group_size": 64, "bits": 4});
    for m in &modules {
        let entry = match m.mode {
            "affine" if m.group == 64 && m.bits == 4 => continue,
            // An entry without a mode is affine.
            "affine" => json!({"group_size": m.group, "bits": m.bits}),
            _ if !m.global.is_empty() => {
                json!({"group_size": m.group, "bits": m.bits, "mode": m.mode, "global_scale": true})
            }
            mode => json!({"group_size": m.group, "bits": m.bits, "mode": mode}),
        };
        q[&m.name] = entry;
    }
    q["model.layers.10.mlp.up_proj"] = json!(false);
    let torch = match t {
        OutDtype::Bf16 => "bfloat16",
        OutDtype::F16 => "float16",
        OutDtype::F32 => "float32",
    };
    write_json(
        &dir.join("config.json"),
        &json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": torch, "quantization": q, "quantization_config": q}),
    );
    modules
}

/// Every width, group, mode and model dtype, mixed per module: MLX's
/// arithmetic in the model's dtype and in f32, byte for byte; `config.json`
/// loses both quantization blocks; the module left dense is copied.
#[test]
fn synthetic_checkpoints_decode_as_mlx_computes() {
    let tmp = tempfile::tempdir().unwrap();
    for (k, t) in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32]
        .into_iter()
        .enumerate()
    {
        let dir = tmp.path().join(format!("in-{t}"));
        std::fs::create_dir_all(&dir).unwrap();
        let modules = synthetic(&dir, t, 0x4D4C_5800 + k as u64);
        for out in [t, OutDtype::F32] {
            let got = decoded(&dir, out, BackendChoice::Cpu);
            for m in &modules {
                let name = format!("{}.weight", m.name);
                let (dt, shape, bytes) = got.get(&name).unwrap_or_else(|| panic!("{name} missing"));
                assert_eq!(dt, st_name(out), "{name}");
                let [s, r, c] = m.dims;
                assert_eq!(
                    shape,
                    &if s > 1 { vec![s, r, c] } else { vec![r, c] },
                    "{name}"
                );
                let want = m.expected(out);
                let differ = bytes
                    .chunks(out.size())
                    .zip(want.chunks(out.size()))
                    .filter(|(a, b)| a != b)
                    .count();
                assert_eq!(
                    differ, 0,
                    "{t} model, {out} out: {name} ({} {}-bit g{}): {differ} elements differ",
                    m.mode, m.bits, m.group
                );
            }
            assert!(got.contains_key("model.layers.10.mlp.up_proj.weight"));
            assert!(
                !got.keys().any(|k| k.ends_with("global_scale")),
                "a global scale written"
            );
        }
        // Through the CPU's tables (the offsets in them) wherever a group
        // holds more elements than its table.
        let ckpt = wgpu_dequant::Checkpoint::open(&dir).unwrap();
        let plan =
            wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub).unwrap();
        for m in &modules {
            let name = format!("{}.weight", m.name);
            let o = plan.outputs.iter().find(|o| o.name == name).unwrap();
            let wgpu_dequant::plan::Source::Decode(job) = &o.source else {
                panic!("{name} is not decoded");
            };
            // (A global scale makes each entry's scale its own: no byte tables.)
            if (2 << m.bits) <= m.group || m.bits == 4 && m.mode != "affine" && m.global.is_empty()
            {
                assert_eq!(way(job), Way::Rows, "{name}");
            }
        }
        let out = tmp.path().join(format!("out-{t}"));
        let opts = Options {
            dtype: DtypeChoice::Auto,
            backend: BackendChoice::Cpu,
        };
        dequantize(&dir, &out, &opts).unwrap();
        let config: Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        assert!(
            config.get("quantization").is_none() && config.get("quantization_config").is_none(),
            "{config}"
        );
    }
}

/// The same checkpoints on the GPU: the CPU's bytes, in every dtype.
#[test]
fn synthetic_checkpoints_gpu_equals_cpu() {
    gpu_test(|_| {
        let tmp = tempfile::tempdir().unwrap();
        for (k, t) in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32]
            .into_iter()
            .enumerate()
        {
            let dir = tmp.path().join(format!("in-{t}"));
            std::fs::create_dir_all(&dir).unwrap();
            synthetic(&dir, t, 0x4D4C_5800 + k as u64);
            for out in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
                assert!(
                    decoded(&dir, out, BackendChoice::Gpu)
                        == decoded(&dir, out, BackendChoice::Cpu),
                    "{t} model, {out} out"
                );
            }
        }
    });
}

/// Malformed MLX checkpoints: each refused with its rule, naming the
/// tensor or the config entry; none decoded, nothing panics.
#[test]
fn malformed_checkpoints_are_refused_with_their_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    std::fs::create_dir_all(&base).unwrap();
    synthetic(&base, OutDtype::Bf16, 7);
    let config: Value =
        serde_json::from_slice(&std::fs::read(base.join("config.json")).unwrap()).unwrap();
    let names = ["U32", "U8", "BF16", "F16", "F32"];
    let tensors: Vec<Tensor> = crate::common::read_tensors(&base.join("model.safetensors"))
        .into_iter()
        .map(|(name, (dt, shape, data))| {
            let dt = names.into_iter().find(|n| *n == dt).unwrap();
            Tensor::new(name, dt, &shape, data)
        })
        .collect();
    let m = "model.layers.2.mlp.down_proj";
    let g = "model.layers.11.mlp.stacked";
    type Change = Box<dyn Fn(&mut Value, &mut Vec<Tensor>)>;
    let retype = |name: String, dtype: &'static str, shape: Option<Vec<usize>>| -> Change {
        Box::new(move |_, ts| {
            let t = ts.iter_mut().find(|t| t.name == name).unwrap();
            t.dtype = dtype;
            if let Some(s) = &shape {
                t.shape = s.clone();
            }
            // Bytes for the new shape and dtype.
            let size = match dtype {
                "U8" => 1,
                "BF16" | "F16" => 2,
                _ => 4,
            };
            t.data
                .resize(t.shape.iter().product::<usize>() * size, 0x11);
        })
    };
    let cases: Vec<(&str, Change, Rule, &str)> = vec![
        (
            "packed width",
            retype(format!("{m}.weight"), "U32", Some(vec![24, 40])),
            Rule::TensorShape,
            "weight",
        ),
        (
            "scales of another shape",
            retype(format!("{m}.scales"), "BF16", Some(vec![12, 2])),
            Rule::TensorShape,
            "scales",
        ),
        (
            "U8 scales in affine mode",
            retype(format!("{m}.scales"), "U8", None),
            Rule::TensorDtype,
            "scales",
        ),
        (
            "biases of another dtype",
            retype(format!("{m}.biases"), "F16", None),
            Rule::TensorDtype,
            "biases",
        ),
        (
            "a weight not U32",
            retype(format!("{m}.weight"), "I32", None),
            Rule::TensorDtype,
            "weight",
        ),
        (
            "no biases",
            Box::new(move |_, ts| ts.retain(|t| t.name != format!("{m}.biases"))),
            Rule::MissingTensor,
            "biases",
        ),
        (
            "an unknown mode",
            Box::new(move |c, _| c["quantization"][m]["mode"] = json!("int7")),
            Rule::Config,
            "mode",
        ),
        (
            "bits MLX does not write",
            Box::new(move |c, _| c["quantization"][m]["bits"] = json!(7)),
            Rule::Unsupported,
            "7-bit",
        ),
        (
            "a group MLX does not write",
            Box::new(move |c, _| c["quantization"][m]["group_size"] = json!(48)),
            Rule::Unsupported,
            "group 48",
        ),
        (
            "an entry whose group does not fit",
            Box::new(move |c, _| c["quantization"][m]["group_size"] = json!(64)),
            Rule::TensorShape,
            "weight",
        ),
        (
            "a module stored quantized but listed dense",
            Box::new(move |c, _| c["quantization"][m] = json!(false)),
            Rule::Config,
            "false",
        ),
        (
            "biases in an fp mode",
            Box::new(|_, ts| {
                let b = ts
                    .iter()
                    .find(|t| t.name == "model.layers.0.mlp.down_proj.biases")
                    .unwrap()
                    .clone();
                ts.push(Tensor {
                    name: "model.layers.6.mlp.down_proj.biases".into(),
                    ..b
                });
            }),
            Rule::Config,
            "biases",
        ),
        (
            "a global scale not one per expert",
            retype(format!("{g}.global_scale"), "F32", Some(vec![3])),
            Rule::TensorShape,
            "global_scale",
        ),
        (
            "a global scale of the wrong dtype",
            retype(format!("{g}.global_scale"), "BF16", None),
            Rule::TensorDtype,
            "global_scale",
        ),
        (
            "a global scale outside nvfp4",
            Box::new(move |_, ts| {
                let v = 1f32.to_le_bytes().to_vec();
                ts.push(Tensor::new(format!("{m}.global_scale"), "F32", &[1], v));
            }),
            Rule::Config,
            "global_scale",
        ),
    ];
    for (what, change, rule, names) in cases {
        let dir = tmp.path().join(what.replace(' ', "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut c, mut ts) = (config.clone(), tensors.clone());
        change(&mut c, &mut ts);
        c["quantization_config"] = c["quantization"].clone();
        write_json(&dir.join("config.json"), &c);
        write_safetensors(&dir.join("model.safetensors"), &ts);
        let e = dequantize(&dir, tmp.path().join("out"), &Options::default()).expect_err(what);
        assert_eq!(e.rule, rule, "{what}: {e}");
        assert!(e.to_string().contains(names), "{what}: {e}");
        let found = wgpu_dequant::validate(&dir);
        assert!(!found.errors.is_empty(), "{what}: validate found nothing");
    }
}

/// The fuzz target `config` in small, on every run, over MLX's own files:
/// config.json and the weights with random bytes overwritten are refused
/// in one line or decoded, never a panic.
#[test]
fn mutated_mlx_checkpoints_never_panic() {
    use crate::common::{caught, copy_dir};
    let mut rng = Rng::new(41);
    for (case, file) in [
        ("mlx-3bit-g64", "config.json"),
        ("mlx-mxfp4", "config.json"),
        ("mlx-3bit-g64", "model.safetensors"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(&fixtures().join(case).join("model"), tmp.path());
        let valid = std::fs::read(tmp.path().join(file)).unwrap();
        let (mut refused, mut decoded) = (0, 0);
        for _ in 0..100 {
            let bytes = match file {
                "config.json" => rng.mutate(&valid),
                // A byte of the header, or of the data (codes, scales and
                // biases of any value).
                _ => {
                    let mut b = valid.clone();
                    let header = 8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
                    let at = match rng.below(2) {
                        0 => rng.below(header as u64) as usize,
                        _ => header + rng.below((b.len() - header) as u64) as usize,
                    };
                    b[at] = rng.next() as u8;
                    b
                }
            };
            std::fs::write(tmp.path().join(file), &bytes).unwrap();
            let out = caught(|| -> Result<(), wgpu_dequant::Error> {
                let model = Model::open(tmp.path(), DtypeChoice::Auto)?;
                for t in model.tensors() {
                    model.decode(&t.name, BackendChoice::Cpu)?;
                }
                Ok(())
            });
            match out {
                Err(p) => panic!("{case} {file}: panicked: {p}"),
                Ok(Err(e)) => {
                    assert!(!e.to_string().contains('\n'), "{e}");
                    refused += 1;
                }
                Ok(Ok(())) => decoded += 1,
            }
        }
        assert!(
            refused > 5 && decoded > 5,
            "{case} {file}: refused {refused}, decoded {decoded}"
        );
    }
}

/// mlx-lm's stacked experts (`switch_mlp`, `[E, out, in]`) are written one
/// tensor per expert under the names the original checkpoint had (every
/// key, none more), with `mlx_lm convert --dequantize`'s bytes, on both
/// backends; `--keep-names` keeps MLX's stacks, the experts' bytes one
/// after another.
#[test]
fn qwen3_moe_experts_take_the_original_names() {
    let case = "mlx-qwen3-moe-4bit";
    check_case(
        case,
        DtypeChoice::Auto,
        BackendChoice::Cpu,
        "expected-bf16.digests.json",
        false,
    );
    gpu_test(|_| {
        check_case(
            case,
            DtypeChoice::Auto,
            BackendChoice::Gpu,
            "expected-bf16.digests.json",
            false,
        )
    });
    let model = fixtures().join(case).join("model");
    let tmp = tempfile::tempdir().unwrap();
    let (split, kept) = (tmp.path().join("split"), tmp.path().join("kept"));
    wgpu_dequant::Dequantize::new()
        .backend(BackendChoice::Cpu)
        .run(&model, &split)
        .unwrap();
    wgpu_dequant::Dequantize::new()
        .backend(BackendChoice::Cpu)
        .keep_names(true)
        .run(&model, &kept)
        .unwrap();
    let (split, kept) = (read_dir_tensors(&split), read_dir_tensors(&kept));
    let mut stacks = 0;
    for (name, (dt, shape, bytes)) in &kept {
        let Some((block, proj)) = name
            .strip_suffix(".weight")
            .and_then(|n| n.split_once(".switch_mlp."))
        else {
            assert_eq!(
                split.get(name),
                Some(&(dt.clone(), shape.clone(), bytes.clone())),
                "{name}"
            );
            continue;
        };
        stacks += 1;
        let experts: Vec<u8> = (0..shape[0])
            .flat_map(|e| {
                split[&format!("{block}.experts.{e}.{proj}.weight")]
                    .2
                    .clone()
            })
            .collect();
        assert!(experts == *bytes, "{name}: not its experts' bytes");
    }
    assert_eq!(stacks, 6);
}

/// MLX's GPT-OSS (`mlx-gpt-oss-mxfp4`: the `gpt-oss-mxfp4` fixture's one
/// layer twice, through `mlx_lm convert -q --q-mode mxfp4`, which keeps its
/// MXFP4 experts as they were): written in transformers' layout, the
/// experts are that native checkpoint's dense ones byte for byte, and the
/// keys are its output's (layer 0 twice), on both backends; `--keep-names`
/// keeps MLX's split projections.
#[test]
fn gpt_oss_experts_take_transformers_layout() {
    let native = decoded(
        &fixtures().join("gpt-oss-mxfp4/model"),
        OutDtype::Bf16,
        BackendChoice::Cpu,
    );
    let model = fixtures().join("mlx-gpt-oss-mxfp4/model");
    let mlx = decoded(&model, OutDtype::Bf16, BackendChoice::Cpu);
    let mut want: Vec<String> = native
        .keys()
        .flat_map(|k| [k.clone(), k.replace("layers.0.", "layers.1.")])
        .collect();
    want.sort();
    want.dedup();
    assert_eq!(mlx.keys().cloned().collect::<Vec<_>>(), want);
    let mut experts = 0;
    for (name, t) in mlx.iter().filter(|(n, _)| n.contains(".experts.")) {
        let stored = name.replace("layers.1.", "layers.0.");
        assert!(native[&stored] == *t, "{name}: not the native checkpoint's");
        experts += 1;
    }
    assert_eq!(experts, 8);
    gpu_test(|_| assert!(decoded(&model, OutDtype::Bf16, BackendChoice::Gpu) == mlx));
    let tmp = tempfile::tempdir().unwrap();
    wgpu_dequant::Dequantize::new()
        .backend(BackendChoice::Cpu)
        .keep_names(true)
        .run(&model, tmp.path().join("kept"))
        .unwrap();
    let kept = read_dir_tensors(&tmp.path().join("kept"));
    for p in ["gate_proj", "up_proj", "down_proj"] {
        for what in ["weight", "bias"] {
            let name = format!("model.layers.0.mlp.experts.{p}.{what}");
            assert!(kept.contains_key(&name), "{name} not kept");
        }
    }
    assert!(!kept.keys().any(|k| k.contains("gate_up_proj")));
}

/// An mlx-community id from the Hub: the files a local run writes.
#[test]
fn mlx_community_ids_come_from_the_hub() {
    use crate::common::hub::{Faults, MockHub};
    let model = fixtures().join("mlx-3bit-g64").join("model");
    let hub = MockHub::serve("mlx-community/tiny-3bit", &model, Faults::default());
    let tmp = tempfile::tempdir().unwrap();
    let (local, remote) = (tmp.path().join("local"), tmp.path().join("remote"));
    wgpu_dequant::Dequantize::new()
        .backend(BackendChoice::Cpu)
        .run(&model, &local)
        .unwrap();
    let args = [
        "dequantize",
        "mlx-community/tiny-3bit",
        "-o",
        remote.to_str().unwrap(),
        "--backend",
        "cpu",
        "--quiet",
    ];
    crate::common::cli::ok(
        &crate::hub::cli(&hub, &tmp.path().join("cache"), &args, &[]),
        "from the Hub",
    );
    // The model cards differ: the Hub run's names its repository.
    let but_card = |dir: &Path| {
        let mut files = crate::common::snapshot(dir);
        files.retain(|(name, _)| name != "README.md");
        files
    };
    assert_eq!(but_card(&remote), but_card(&local));
}
