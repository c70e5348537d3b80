//! Small GPTQ checkpoints written the way GPTQModel (and AutoRound's
//! auto_gptq export) packs them, decoded and compared byte for byte with
//! `(q − z[g]) · s[g]` computed here from the unpacked codes, true zero
//! points and scales (rounded once by the `half` crate). The packing is
//! GPTQModel's: each column (qweight) or row (qzeros) is one LSB-first
//! stream of b-bit fields cut into 32-bit words; its v2 → v1 writer stores
//! `z − 1` by one wrapping 32-bit subtraction per word at 2, 4 and 8 bits
//! (borrowing from the next field when z = 0) and field by field at 3 bits.

use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{BackendChoice, DtypeChoice, OutDtype};

use crate::common::producer::{check_output, decode, expect_decodes, gpu_equals_cpu, Want};
use crate::common::{
    gpu_test, read_dir_tensors, write_json, write_safetensors, write_two_shards, Rng, Tensor,
};

/// One module as a test writes it.
#[derive(Clone, Copy)]
struct Spec {
    bits: u32,
    /// Input rows per group; `None`: -1 (one group).
    group: Option<usize>,
    sym: bool,
    v1: bool,
    desc_act: bool,
    /// AutoRound's export: no `g_idx`.
    autoround: bool,
    inputs: usize,
    outputs: usize,
}

const BASE: Spec = Spec {
    bits: 4,
    group: Some(32),
    sym: true,
    v1: true,
    desc_act: false,
    autoround: false,
    inputs: 96,
    outputs: 64,
};

/// LSB-first b-bit fields cut into 32-bit words (GPTQModel's pack, 3-bit
/// runs of three words included).
fn stream_words(fields: &[u32], b: u32) -> Vec<u32> {
    let mut w = vec![0u32; (fields.len() * b as usize).div_ceil(32)];
    for (i, &f) in fields.iter().enumerate() {
        let bit = i * b as usize;
        w[bit / 32] |= f << (bit % 32);
        if bit % 32 + b as usize > 32 {
            w[bit / 32 + 1] |= f >> (32 - bit % 32);
        }
    }
    w
}

/// GPTQModel's v2 → v1 writer for one packed zero-point row.
fn to_v1(zeros: &[u32], b: u32) -> Vec<u32> {
    match b {
        3 => stream_words(
            &zeros
                .iter()
                .map(|z| z.wrapping_sub(1) & 7)
                .collect::<Vec<_>>(),
            3,
        ),
        _ => {
            let one = match b {
                2 => 0x5555_5555u32,
                4 => 0x1111_1111,
                _ => 0x0101_0101,
            };
            stream_words(zeros, b)
                .iter()
                .map(|w| w.wrapping_sub(one))
                .collect()
        }
    }
}

/// A random f16-exact scale, about a quarter of them negative.
fn scale(rng: &mut Rng) -> f32 {
    let e = rng.below(10) as i32 - 12;
    let m = 1.0 + rng.below(1024) as f32 / 1024.0;
    let s = m * 2f32.powi(e);
    if rng.below(4) == 0 {
        -s
    } else {
        s
    }
}

/// The stored tensors of `module` and the weight they decode to.
fn module(rng: &mut Rng, module: &str, s: Spec) -> (Vec<Tensor>, Want) {
    let (b, n_in, n_out) = (s.bits, s.inputs, s.outputs);
    let gs = s.group.unwrap_or(n_in);
    let groups = n_in.div_ceil(gs);
    // desc_act: GPTQ quantizes in permuted order; row perm[k] is in group k / gs.
    let mut g_idx: Vec<usize> = (0..n_in).map(|i| i / gs).collect();
    if s.desc_act {
        let mut perm: Vec<usize> = (0..n_in).collect();
        for i in (1..n_in).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (k, &p) in perm.iter().enumerate() {
            g_idx[p] = k / gs;
        }
    }
    let top = 1u32 << b;
    let q: Vec<Vec<u32>> = (0..n_in)
        .map(|_| (0..n_out).map(|_| rng.below(top as u64) as u32).collect())
        .collect();
    let z: Vec<Vec<u32>> = (0..groups)
        .map(|g| {
            (0..n_out)
                .map(|j| match (s.sym, g, j) {
                    (true, _, _) => top / 2,
                    // The borrow case beside the largest zero point.
                    (false, 0, 0) | (false, _, 5) => 0,
                    (false, 0, 1) => top - 1,
                    _ => rng.below(top as u64) as u32,
                })
                // AutoRound's writer stores clamp(z - 1, 0, 2^b - 1): a true
                // 0 comes back as 1, so it writes none here.
                .map(|z| if s.autoround && s.v1 { z.max(1) } else { z })
                .collect()
        })
        .collect();
    let sc: Vec<Vec<f32>> = (0..groups)
        .map(|_| (0..n_out).map(|_| scale(rng)).collect())
        .collect();

    let qweight: Vec<u32> = {
        let cols: Vec<Vec<u32>> = (0..n_out)
            .map(|j| stream_words(&(0..n_in).map(|i| q[i][j]).collect::<Vec<_>>(), b))
            .collect();
        (0..n_in * b as usize / 32)
            .flat_map(|r| cols.iter().map(move |c| c[r]))
            .collect()
    };
    let qzeros: Vec<u32> = z
        .iter()
        .flat_map(|row| {
            if s.v1 && s.autoround {
                // AutoRound's qlinear_torch_zp: field by field, no borrow.
                stream_words(&row.iter().map(|z| z - 1).collect::<Vec<_>>(), b)
            } else if s.v1 {
                to_v1(row, b)
            } else {
                stream_words(row, b)
            }
        })
        .collect();
    let width = qzeros.len() / groups;
    let mut tensors = vec![
        Tensor::u32_words(
            format!("{module}.qweight"),
            &[n_in * b as usize / 32, n_out],
            &qweight,
        ),
        Tensor::u32_words(format!("{module}.qzeros"), &[groups, width], &qzeros),
        Tensor::f16(format!("{module}.scales"), &[groups, n_out], &sc.concat()),
    ];
    if !s.autoround {
        let gi: Vec<i32> = g_idx.iter().map(|&g| g as i32).collect();
        tensors.push(Tensor::i32(format!("{module}.g_idx"), &[n_in], &gi));
    }
    let vals: Vec<f32> = (0..n_out)
        .flat_map(|j| {
            let (q, z, sc, g_idx) = (&q, &z, &sc, &g_idx);
            (0..n_in).map(move |i| {
                let g = g_idx[i];
                (q[i][j] as f32 - z[g][j] as f32) * sc[g][j]
            })
        })
        .collect();
    (tensors, Want::weight(module, vec![n_out, n_in], vals))
}

/// config.json's `quantization_config` for `s`.
fn quant_config(s: Spec) -> Value {
    let group = s.group.map_or(-1, |g| g as i64);
    if s.autoround {
        return json!({
            "quant_method": "auto-round",
            "packing_format": if s.v1 { "auto_round:auto_gptq" } else { "auto_round" },
            "bits": s.bits, "group_size": group, "sym": s.sym, "data_type": "int",
        });
    }
    json!({
        "quant_method": "gptq", "bits": s.bits, "group_size": group, "sym": s.sym,
        "desc_act": s.desc_act, "checkpoint_format": if s.v1 { "gptq" } else { "gptq_v2" },
        "pack_dtype": "int32", "meta": {"quantizer": ["gptqmodel:7.7.0"]},
    })
}

fn write_config(dir: &Path, s: Spec, dtype: &str) {
    write_json(
        &dir.join("config.json"),
        &json!({"architectures": ["LlamaForCausalLM"], "torch_dtype": dtype,
                "quantization_config": quant_config(s)}),
    );
}

/// Writes one checkpoint of `s` (two modules and an f16 norm), decodes it
/// to every dtype on the CPU, and checks the GPU's bytes against the CPU's.
fn run(ctx: &str, s: Spec, seed: u64) {
    let mut rng = Rng::new(seed);
    let (mut tensors, a) = module(&mut rng, "model.layers.0.mlp.up_proj", s);
    let (more, b) = module(&mut rng, "model.layers.0.self_attn.q_proj", s);
    tensors.extend(more);
    let norm = Tensor::f16("model.norm.weight", &[4], &[1.0, -0.5, 0.25, 2.0]);
    tensors.push(norm.clone());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path()).unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    write_config(dir.path(), s, "float16");
    let cpu = expect_decodes(ctx, dir.path(), &[a, b], &[norm]);
    gpu_test(|_| gpu_equals_cpu(ctx, dir.path(), &cpu));
}

#[test]
fn gptq_every_width_sym_v1() {
    for (k, bits) in [2u32, 3, 4, 8].into_iter().enumerate() {
        run(
            &format!("{bits}-bit sym v1"),
            Spec { bits, ..BASE },
            10 + k as u64,
        );
    }
}

/// Asymmetric v1 files whose true zero point is 0: GPTQModel's writer
/// borrowed from the next field, and the runtime's word addition carries it
/// back (a field-by-field +1 would leave the next field one short).
#[test]
fn gptq_asym_v1_borrow_every_width() {
    for (k, bits) in [2u32, 3, 4, 8].into_iter().enumerate() {
        let s = Spec {
            bits,
            sym: false,
            ..BASE
        };
        run(&format!("{bits}-bit asym v1"), s, 20 + k as u64);
    }
}

#[test]
fn gptq_v2_asym_group_minus_one_and_partial_group() {
    let v2 = Spec {
        sym: false,
        v1: false,
        ..BASE
    };
    run("v2 asym", v2, 30);
    run("v2 3-bit", Spec { bits: 3, ..v2 }, 31);
    run(
        "group -1",
        Spec {
            group: None,
            ..BASE
        },
        32,
    );
    // 96 inputs in groups of 64: the last group holds 32.
    run(
        "partial last group",
        Spec {
            group: Some(64),
            ..BASE
        },
        33,
    );
}

#[test]
fn gptq_desc_act_permuted_g_idx() {
    let s = Spec {
        desc_act: true,
        sym: false,
        ..BASE
    };
    run("desc_act", s, 40);
    run("desc_act 3-bit", Spec { bits: 3, ..s }, 41);
}

#[test]
fn autoround_gptq_export_without_g_idx() {
    let s = Spec {
        autoround: true,
        sym: false,
        group: Some(64),
        ..BASE
    };
    run("auto-round", s, 50);
    run("auto-round 3-bit", Spec { bits: 3, ..s }, 51);
    // `auto_round` packing: the zero points as they are, 0 included.
    run("auto-round raw zeros", Spec { v1: false, ..s }, 52);
    run(
        "auto-round raw zeros 3-bit",
        Spec {
            v1: false,
            bits: 3,
            ..s
        },
        53,
    );
}

/// A bf16 model keeps f16 scales; its default output is bf16, rounded once
/// from the exact f32 product.
#[test]
fn gptq_bf16_model_defaults_to_bf16() {
    let s = Spec { sym: false, ..BASE };
    let mut rng = Rng::new(60);
    let (tensors, want) = module(&mut rng, "model.layers.0.mlp.down_proj", s);
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    write_config(dir.path(), s, "bfloat16");
    let out = tempfile::tempdir().unwrap();
    let dense = out.path().join("dense");
    wgpu_dequant::dequantize(
        dir.path(),
        &dense,
        &wgpu_dequant::Options {
            dtype: DtypeChoice::Auto,
            backend: BackendChoice::Cpu,
        },
    )
    .unwrap();
    let got = read_dir_tensors(&dense);
    check_output("bf16 model", &got, OutDtype::Bf16, &[want], &[]);
}

/// A module's tensors in two shards (qweight in the first, the rest in the
/// second) decode as from one file.
#[test]
fn gptq_module_split_across_shards() {
    let mut rng = Rng::new(70);
    let (tensors, want) = module(&mut rng, "model.layers.0.mlp.gate_proj", BASE);
    let dir = tempfile::tempdir().unwrap();
    let (first, second): (Vec<Tensor>, Vec<Tensor>) = tensors
        .into_iter()
        .partition(|t| t.name.ends_with("qweight"));
    write_two_shards(dir.path(), &first, &second);
    write_config(dir.path(), BASE, "float16");
    let got = decode(dir.path(), OutDtype::F16);
    check_output("sharded", &got, OutDtype::F16, &[want], &[]);
}

/// The config's spellings: no `checkpoint_format`/`format` is v1, `format`
/// alone names it, AutoRound's method may be written `auto_round`; each
/// gives the fixture's bytes. `inspect`'s format line says what was read.
#[test]
fn gptq_config_spellings() {
    let fixture = crate::common::fixtures().join("gptq-w4-g128/model");
    let want = decode(&fixture, OutDtype::F16);
    type Edit = (&'static str, fn(&mut Value));
    let edits: [Edit; 3] = [
        ("no format keys", |qc| {
            let o = qc.as_object_mut().unwrap();
            o.remove("checkpoint_format");
            o.remove("format");
        }),
        ("format alone", |qc| {
            qc.as_object_mut().unwrap().remove("checkpoint_format");
        }),
        ("auto_round", |qc| {
            let o = qc.as_object_mut().unwrap();
            o.remove("checkpoint_format");
            o.remove("format");
            o.insert("quant_method".into(), json!("auto_round"));
            o.insert("packing_format".into(), json!("auto_round:auto_gptq"));
        }),
    ];
    for (ctx, edit) in edits {
        let tmp = tempfile::tempdir().unwrap();
        crate::common::copy_dir(&fixture, tmp.path());
        let path = tmp.path().join("config.json");
        let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut cfg["quantization_config"]);
        write_json(&path, &cfg);
        assert!(decode(tmp.path(), OutDtype::F16) == want, "{ctx}");
        let ckpt = wgpu_dequant::Checkpoint::open(tmp.path()).unwrap();
        let plan =
            wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub).unwrap();
        let line = plan.format.describe();
        assert!(line.contains("int4 group 128 sym v1"), "{ctx}: {line}");
        let lines = plan.format.report_lines().join("; ");
        assert!(lines.contains("z - 1"), "{ctx}: {lines}");
    }
}

/// `gptq-dynamic-mix` (tests/gptqmodel/make_dynamic_fixture.py): GPTQModel
/// 7.7's `dynamic` gives 8-bit group-32 modules, a desc_act group-32 one
/// and one left dense (`-:`) beside the base 4-bit group 128; its own
/// pack, v1 export, v1 → v2 load and `dequantize_weight` made the bytes.
const DYNAMIC: &str = "gptq-dynamic-mix";

fn dynamic_matches_gptqmodel(backend: BackendChoice) {
    crate::common::check_case(
        DYNAMIC,
        DtypeChoice::Auto,
        backend,
        "expected-f16.digests.json",
        false,
    );
    crate::common::check_case(
        DYNAMIC,
        DtypeChoice::Fixed(OutDtype::F32),
        backend,
        "expected-f32.digests.json",
        false,
    );
}

#[test]
fn gptq_dynamic_matches_gptqmodel_on_cpu() {
    dynamic_matches_gptqmodel(BackendChoice::Cpu);
}

#[test]
fn gptq_dynamic_matches_gptqmodel_on_gpu() {
    gpu_test(|_| dynamic_matches_gptqmodel(BackendChoice::Gpu));
}

/// Each module's scheme is the first matching rule's; inspect says so.
#[test]
fn gptq_dynamic_schemes_per_module() {
    let dir = crate::common::fixtures().join(DYNAMIC).join("model");
    let ckpt = wgpu_dequant::Checkpoint::open(&dir).unwrap();
    let plan =
        wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub).unwrap();
    let lines = plan.format.report_lines().join("; ");
    assert!(
        lines.contains("dynamic: 4 per-module rules (1 dense)"),
        "{lines}"
    );
    let plan_json: Value = serde_json::from_slice(
        &std::fs::read(crate::common::fixtures().join(DYNAMIC).join("plan.json")).unwrap(),
    )
    .unwrap();
    for (module, scheme) in plan_json.as_object().unwrap() {
        let name = format!("{module}.weight");
        let out = plan.outputs.iter().find(|o| o.name == name).unwrap();
        let want = match scheme.as_str().unwrap() {
            "dense (-:)" => None,
            "8-bit group 32" => Some("gptq int8 group 32 sym v1"),
            "4-bit group 32 desc_act" => Some("gptq int4 group 32 sym v1 desc_act"),
            "4-bit group 128" => Some("gptq int4 group 128 sym v1"),
            other => panic!("{module}: {other}"),
        };
        assert_eq!(out.scheme.as_deref(), want, "{module}");
    }
}

/// Malformed `dynamic` configs over the fixture's tensors: each refused by
/// its rule, nothing written.
#[test]
fn gptq_dynamic_malformed_refused() {
    use wgpu_dequant::Rule;
    let fixture = crate::common::fixtures().join(DYNAMIC).join("model");
    type Edit = (&'static str, Rule, Option<&'static str>, fn(&mut Value));
    let cases: [Edit; 6] = [
        ("a key that is not a regex", Rule::Config, None, |d| {
            d["model\\.layers\\.(0"] = json!({"bits": 8});
        }),
        ("bits 5", Rule::Unsupported, None, |d| {
            d["+:.*\\.mlp\\.down_proj"]["bits"] = json!(5);
        }),
        ("group_size 0", Rule::Config, None, |d| {
            d["+:.*\\.mlp\\.down_proj"]["group_size"] = json!(0);
        }),
        (
            "a -: module stored packed",
            Rule::Config,
            Some("model.layers.0.mlp.up_proj.qweight"),
            |d| {
                let mut m = serde_json::Map::new();
                m.insert("-:model\\.layers\\.0\\.mlp\\.up_proj".into(), json!({}));
                m.extend(d.as_object().unwrap().clone());
                *d = Value::Object(m);
            },
        ),
        (
            "qweight packed at 8 bits, the rule says 4",
            Rule::TensorShape,
            Some("model.layers.0.mlp.down_proj.qweight"),
            |d| {
                d["+:.*\\.mlp\\.down_proj"] = json!({"group_size": 32});
            },
        ),
        (
            "scales in groups of 32, the rule says 64",
            Rule::TensorShape,
            Some("model.layers.0.mlp.down_proj.scales"),
            |d| {
                d["+:.*\\.mlp\\.down_proj"]["group_size"] = json!(64);
            },
        ),
    ];
    for (what, rule, tensor, edit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        crate::common::copy_dir(&fixture, tmp.path());
        let path = tmp.path().join("config.json");
        let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut cfg["quantization_config"]["dynamic"]);
        write_json(&path, &cfg);
        let e = crate::common::dequantize_err(tmp.path());
        assert_eq!(e.rule, rule, "{what}: {e}");
        if let Some(t) = tensor {
            assert_eq!(e.tensor.as_deref(), Some(t), "{what}: {e}");
        }
        assert!(!e.to_string().contains('\n'), "{what}: {e}");
    }
}
