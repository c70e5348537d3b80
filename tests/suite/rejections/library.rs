//! One test per way a checkpoint can be wrong: each builds a small valid
//! checkpoint, breaks exactly one thing, and checks through the library that
//! the rejection names the rule, the file and the tensor on one line, that
//! `dequantize` refuses with the same rule and leaves no output behind, and
//! that nothing panics.

use std::path::{Path, PathBuf};

use crate::common::{
    caught, ct_config, dequantize_err, hf_quant_config, raw_safetensors, safetensors_bytes,
    snapshot, write_checkpoint, write_json, write_safetensors, Rng, Tensor, CPU_AUTO, SHARD1,
    SHARD2,
};
use serde_json::{json, Value};
use wgpu_dequant::{dequantize, Checkpoint, DtypeChoice, Error, Names, Plan, Rule};

/// The quantized module of every small checkpoint below.
const M: &str = "model.layers.0.mlp.down_proj";
/// A tensor every checkpoint carries unquantized.
const NORM: &str = "model.norm.weight";
const INDEX: &str = "model.safetensors.index.json";

fn module_param(param: &str) -> String {
    format!("{M}.{param}")
}

// ---------------------------------------------------------------------------
// Valid starting points
// ---------------------------------------------------------------------------

/// Weights of a 4-bit symmetric group-8 pack-quantized scheme.
fn pack_weights() -> Value {
    json!({
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 8,
        "symmetric": true, "dynamic": false, "actorder": null,
    })
}

/// `pack_weights()` with `key` set to `value`.
fn pack_weights_with(key: &str, value: Value) -> Value {
    let mut w = pack_weights();
    w[key] = value;
    w
}

/// A 4×16 int4 module, group 8: packed [4, 2] int32, scale [4, 2], shape [4, 16].
fn pack_tensors() -> Vec<Tensor> {
    vec![
        Tensor::bf16(NORM, &[16], &[1.0; 16]),
        Tensor::u32_words(
            module_param("weight_packed"),
            &[4, 2],
            &[
                0x7654_3210,
                0xfedc_ba98,
                0x0123_4567,
                0x89ab_cdef,
                0x8888_8888,
                0x0f0f_0f0f,
                0xffff_ffff,
                0x0000_0000,
            ],
        ),
        Tensor::bf16(
            module_param("weight_scale"),
            &[4, 2],
            &[0.5, 1.0, 2.0, 0.25, 1.0, 1.0, 0.5, 4.0],
        ),
        Tensor::i64(module_param("weight_shape"), &[2], &[4, 16]),
    ]
}

/// The asymmetric variant: a zero point packed along rows ([ceil(4·4/32), 2]).
fn asym_tensors() -> Vec<Tensor> {
    let mut t = pack_tensors();
    t.push(Tensor::u32_words(
        module_param("weight_zero_point"),
        &[1, 2],
        &[0x8888, 0x7979],
    ));
    t
}

fn asym_weights() -> Value {
    pack_weights_with("symmetric", json!(false))
}

fn pack_ckpt(dir: &Path, tensors: &[Tensor], weights: Value) {
    write_checkpoint(dir, tensors, ct_config("pack-quantized", weights, "0.19.0"));
}

/// compressed-tensors NVFP4: packed [4, 8] uint8, e4m3 scale [4, 1] (group 16), global scale.
fn nvfp4_tensors() -> Vec<Tensor> {
    vec![
        Tensor::bf16(NORM, &[16], &[1.0; 16]),
        Tensor::u8(
            module_param("weight_packed"),
            "U8",
            &[4, 8],
            &(0..32u8).map(|i| i.wrapping_mul(37)).collect::<Vec<_>>(),
        ),
        Tensor::u8(
            module_param("weight_scale"),
            "F8_E4M3",
            &[4, 1],
            &[0x38, 0x40, 0x30, 0x38],
        ),
        Tensor::f32(module_param("weight_global_scale"), &[1], &[2.0]),
    ]
}

fn nvfp4_ckpt(dir: &Path, tensors: &[Tensor]) {
    let weights = json!({
        "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
        "symmetric": true, "dynamic": false,
    });
    write_checkpoint(
        dir,
        tensors,
        ct_config("nvfp4-pack-quantized", weights, "0.19.0"),
    );
}

/// ModelOpt NVFP4: uint8 weight [4, 8], e4m3 scale [4, 1], scalar weight_scale_2.
fn modelopt_tensors() -> Vec<Tensor> {
    vec![
        Tensor::bf16(NORM, &[16], &[1.0; 16]),
        Tensor::u8(
            module_param("weight"),
            "U8",
            &[4, 8],
            &(0..32u8).map(|i| i.wrapping_mul(53)).collect::<Vec<_>>(),
        ),
        Tensor::u8(
            module_param("weight_scale"),
            "F8_E4M3",
            &[4, 1],
            &[0x38, 0x40, 0x30, 0x38],
        ),
        Tensor::f32(module_param("weight_scale_2"), &[], &[0.5]),
        Tensor::f32(module_param("input_scale"), &[], &[1.0]),
    ]
}

fn modelopt_ckpt(dir: &Path, tensors: &[Tensor], algo: &str) {
    write_checkpoint(dir, tensors, Value::Null);
    write_json(&dir.join("hf_quant_config.json"), &hf_quant_config(algo));
}

/// The single-file starting points.
#[derive(Debug, Clone, Copy)]
enum Base {
    /// Symmetric pack-quantized.
    Pack,
    /// Asymmetric pack-quantized.
    Asym,
    /// compressed-tensors NVFP4.
    Nvfp4,
    /// ModelOpt NVFP4.
    Modelopt,
}

impl Base {
    const ALL: [Base; 4] = [Base::Pack, Base::Asym, Base::Nvfp4, Base::Modelopt];

    fn name(self) -> &'static str {
        match self {
            Base::Pack => "pack",
            Base::Asym => "asym",
            Base::Nvfp4 => "nvfp4",
            Base::Modelopt => "modelopt",
        }
    }

    /// The valid tensors.
    fn tensors(self) -> Vec<Tensor> {
        match self {
            Base::Pack => pack_tensors(),
            Base::Asym => asym_tensors(),
            Base::Nvfp4 => nvfp4_tensors(),
            Base::Modelopt => modelopt_tensors(),
        }
    }

    /// Writes a checkpoint of this kind holding `tensors` into `dir`.
    fn write(self, dir: &Path, tensors: &[Tensor]) {
        match self {
            Base::Pack => pack_ckpt(dir, tensors, pack_weights()),
            Base::Asym => pack_ckpt(dir, tensors, asym_weights()),
            Base::Nvfp4 => nvfp4_ckpt(dir, tensors),
            Base::Modelopt => modelopt_ckpt(dir, tensors, "NVFP4"),
        }
    }

    /// Writes the valid checkpoint into `dir`.
    fn build(self, dir: &Path) {
        self.write(dir, &self.tensors());
    }
}

/// A two-shard pack-quantized checkpoint: NORM in shard 1, the module in
/// shard 2, and the index that says so. Returns the weight map to edit.
fn sharded_ckpt(dir: &Path) -> serde_json::Map<String, Value> {
    let tensors = pack_tensors();
    write_checkpoint(
        dir,
        &[],
        ct_config("pack-quantized", pack_weights(), "0.19.0"),
    );
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let (first, second): (Vec<Tensor>, Vec<Tensor>) =
        tensors.into_iter().partition(|t| t.name == NORM);
    write_safetensors(&dir.join(SHARD1), &first);
    write_safetensors(&dir.join(SHARD2), &second);
    let mut map = serde_json::Map::new();
    for t in &first {
        map.insert(t.name.clone(), SHARD1.into());
    }
    for t in &second {
        map.insert(t.name.clone(), SHARD2.into());
    }
    write_index(dir, &map);
    map
}

fn write_index(dir: &Path, map: &serde_json::Map<String, Value>) {
    write_json(
        &dir.join(INDEX),
        &json!({"metadata": {"total_size": 0}, "weight_map": map}),
    );
}

/// Replaces the tensor of the same name.
fn replace(tensors: &mut [Tensor], t: Tensor) {
    let slot = tensors
        .iter_mut()
        .find(|x| x.name == t.name)
        .unwrap_or_else(|| panic!("no tensor {}", t.name));
    *slot = t;
}

fn remove(tensors: &mut Vec<Tensor>, name: &str) {
    let before = tensors.len();
    tensors.retain(|t| t.name != name);
    assert_eq!(tensors.len() + 1, before, "no tensor {name}");
}

/// A fresh temporary directory (kept while the first value lives) and the
/// checkpoint path `ckpt` inside it.
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    (tmp, dir)
}

// ---------------------------------------------------------------------------
// Running the library without letting a panic through
// ---------------------------------------------------------------------------

/// Where the library refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// `Checkpoint::open`.
    Open,
    /// `Plan::build` returned `Err` (a whole-checkpoint fault).
    Build,
    /// `Plan::build` succeeded with findings in `plan.errors`; `plan.check()` fails.
    Plan,
}

/// Opens and plans `path` and returns where and why it was refused, with
/// the number of module findings. Fails the test when it is accepted or
/// when the library panics.
fn reject(path: &Path) -> (Stage, Error, usize) {
    let r = caught(|| {
        let ckpt = Checkpoint::open(path).map_err(|e| (Stage::Open, e, 0))?;
        let plan =
            Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub).map_err(|e| (Stage::Build, e, 0))?;
        let n = plan.errors.len();
        if n > 0 {
            // `check` reports the first finding.
            let first = &plan.errors[0];
            let checked = plan.check().expect_err("plan.errors is not empty");
            assert_eq!(checked.rule, first.rule);
            assert_eq!(checked.file, first.file);
            assert_eq!(checked.tensor, first.tensor);
            return Err((Stage::Plan, checked, n));
        }
        Ok(plan.outputs.len())
    });
    match r {
        Err(p) => panic!("the library panicked on {}: {}", path.display(), p),
        Ok(Ok(n)) => panic!(
            "{} was accepted ({n} outputs), but it is broken",
            path.display()
        ),
        Ok(Err(found)) => found,
    }
}

/// Checks the one-line message: `FILE: TENSOR: [RULE] detail`.
fn check_message(e: &Error, rule: Rule) {
    let msg = e.to_string();
    assert!(
        !msg.contains('\n') && !msg.contains('\r'),
        "message is not one line: {msg:?}"
    );
    assert!(
        msg.contains(&format!("[{}]", rule.id())),
        "message does not name {}: {msg}",
        rule.id()
    );
    assert!(
        msg.starts_with(&e.file.as_ref().unwrap().display().to_string()),
        "message does not start with the file: {msg}"
    );
    if let Some(t) = &e.tensor {
        assert!(msg.contains(t.as_str()), "message does not name {t}: {msg}");
    }
}

/// What a rejection must say.
struct Want<'a> {
    stage: Stage,
    rule: Rule,
    /// Acceptable files (the first is the one expected by default).
    files: &'a [PathBuf],
    /// The tensor (or module) named; `None` when none should be.
    tensor: Option<&'a str>,
}

/// Asserts that `path` is refused as `want` says, by open/build/check and by
/// `dequantize`. Returns the error for further checks.
fn expect(path: &Path, want: Want<'_>) -> Error {
    let (stage, e, n) = reject(path);
    assert_eq!(
        (stage, e.rule),
        (want.stage, want.rule),
        "wrong stage or rule for {}: {e}",
        path.display()
    );
    if stage == Stage::Plan {
        assert_eq!(n, 1, "one thing is broken, so one finding: {e}");
    }
    assert!(
        e.file.as_ref().is_some_and(|f| want.files.contains(f)),
        "error names file {}, expected one of {:?}: {e}",
        e.file.as_ref().unwrap().display(),
        want.files
    );
    assert_eq!(e.tensor.as_deref(), want.tensor, "tensor named by: {e}");
    check_message(&e, want.rule);

    let d = dequantize_err(path);
    assert_eq!(d.rule, want.rule, "dequantize: {d}");
    assert_eq!(d.file, e.file, "dequantize: {d}");
    assert_eq!(d.tensor, e.tensor, "dequantize: {d}");
    check_message(&d, want.rule);
    e
}

/// `expect` with one acceptable file, `dir/file`.
fn expect_in(dir: &Path, stage: Stage, rule: Rule, file: &str, tensor: Option<&str>) -> Error {
    expect(
        dir,
        Want {
            stage,
            rule,
            files: &[dir.join(file)],
            tensor,
        },
    )
}

/// Asserts the library neither panics nor misbehaves on `path`: it refuses
/// with a one-line message or, when it accepts, dequantizes.
fn no_panic(path: &Path, what: &str) {
    let r = caught(|| -> Result<(), Error> {
        let ckpt = Checkpoint::open(path)?;
        let plan = Plan::build(&ckpt, DtypeChoice::Auto, Names::Hub)?;
        for e in &plan.errors {
            check_message(e, e.rule);
        }
        plan.check()
    });
    match r {
        Err(p) => panic!("library panicked on {what}: {p}"),
        Ok(Err(e)) => check_message(&e, e.rule),
        Ok(Ok(())) => {
            let tmp = tempfile::tempdir().unwrap();
            let out = tmp.path().join("dense");
            match caught(|| dequantize(path, &out, &CPU_AUTO)) {
                Err(p) => panic!("dequantize panicked on {what}: {p}"),
                Ok(Err(e)) => {
                    check_message(&e, e.rule);
                    assert!(!out.exists(), "{what}: failed ({e}) but left output");
                }
                Ok(Ok(_)) => {}
            }
        }
    }
}

fn accepted(path: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    let s = dequantize(path, &out, &CPU_AUTO).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((s.decoded, s.copied), (1, 1), "{s:?}");
}

// ---------------------------------------------------------------------------
// The starting points are valid
// ---------------------------------------------------------------------------

#[test]
fn starting_points_are_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    for base in Base::ALL {
        base.build(&d.join(base.name()));
    }
    sharded_ckpt(&d.join("sharded"));
    for name in ["pack", "asym", "nvfp4", "modelopt", "sharded"] {
        accepted(&d.join(name));
    }
    let mut g = pack_tensors();
    g.push(Tensor::i32(
        module_param("weight_g_idx"),
        &[16],
        &(0..16).map(|c| c % 2).collect::<Vec<_>>(),
    ));
    pack_ckpt(&d.join("g_idx"), &g, pack_weights());
    accepted(&d.join("g_idx"));
}

// ---------------------------------------------------------------------------
// Container (ST-001)
// ---------------------------------------------------------------------------

/// A valid pack-quantized checkpoint whose model.safetensors is then
/// rewritten by `edit`: refused on open as a container fault of that file.
fn expect_container(edit: impl FnOnce(Vec<u8>) -> Vec<u8>) -> Error {
    let (_tmp, dir) = scratch();
    pack_ckpt(&dir, &pack_tensors(), pack_weights());
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, edit(bytes)).unwrap();
    expect_in(
        &dir,
        Stage::Open,
        Rule::Container,
        "model.safetensors",
        None,
    )
}

#[test]
fn truncated_file_is_container_error() {
    let full = safetensors_bytes(&pack_tensors(), None);
    for cut in [4, 7, 8, 12, full.len() / 2, full.len() - 1] {
        expect_container(|mut b| {
            b.truncate(cut);
            b
        });
    }
}

#[test]
fn empty_file_is_container_error() {
    expect_container(|_| Vec::new());
}

#[test]
fn header_length_beyond_file_is_container_error() {
    for n in [None, Some(u64::MAX), Some(1 << 40), Some(99_999_999)] {
        expect_container(|mut b| {
            // Default: one byte more than the file holds after the length.
            let n = n.unwrap_or(b.len() as u64 - 7);
            b[..8].copy_from_slice(&n.to_le_bytes());
            b
        });
    }
}

#[test]
fn invalid_header_json_is_container_error() {
    expect_container(|mut b| {
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        for (i, x) in b[8..8 + n].iter_mut().enumerate() {
            *x = if i == 0 { b'{' } else { b'x' };
        }
        b
    });
}

#[test]
fn header_that_is_not_an_object_of_tensors_is_container_error() {
    expect_container(|_| {
        raw_safetensors(
            &json!({"a": {"dtype": "NOPE", "shape": [1], "data_offsets": [0, 1]}}),
            &[0],
        )
    });
}

#[test]
fn trailing_bytes_not_covered_by_offsets_is_container_error() {
    expect_container(|mut b| {
        b.extend_from_slice(&[0; 4]);
        b
    });
}

#[test]
fn hole_between_offsets_is_container_error() {
    expect_container(|_| {
        let h = json!({
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},
        });
        raw_safetensors(&h, &[0; 20])
    });
}

#[test]
fn offsets_beyond_file_is_container_error() {
    expect_container(|_| {
        let h = json!({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}});
        raw_safetensors(&h, &[0; 8])
    });
}

#[test]
fn offsets_disagreeing_with_shape_is_container_error() {
    expect_container(|_| {
        let h = json!({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}});
        raw_safetensors(&h, &[0; 8])
    });
}

// ---------------------------------------------------------------------------
// Index (ST-002) and duplicates (TEN-005)
// ---------------------------------------------------------------------------

/// The sharded checkpoint in `dir` with its index mapping `tensor` to
/// `shard`: refused on open as an index fault naming `tensor`.
fn expect_index_entry(dir: &Path, tensor: &str, shard: &str) {
    let mut map = sharded_ckpt(dir);
    map.insert(tensor.into(), shard.into());
    write_index(dir, &map);
    expect_in(dir, Stage::Open, Rule::Index, INDEX, Some(tensor));
}

#[test]
fn index_naming_a_missing_shard_is_index_error() {
    let (_tmp, dir) = scratch();
    sharded_ckpt(&dir);
    std::fs::remove_file(dir.join(SHARD2)).unwrap();
    let index = dir.join(INDEX);
    // The fault is the index's; naming the missing shard itself is also fine.
    let (stage, e, _) = reject(&dir);
    assert_eq!(stage, Stage::Open, "{e}");
    assert_eq!(
        e.rule,
        Rule::Index,
        "an index naming a missing shard breaks ST-002, got: {e}"
    );
    assert!(
        e.file == Some(index.clone()) || e.file == Some(dir.join(SHARD2)),
        "names {}: {e}",
        e.file.as_ref().unwrap().display()
    );
    assert!(
        e.to_string().contains(SHARD2),
        "names the missing shard: {e}"
    );
    check_message(&e, Rule::Index);
    assert_eq!(dequantize_err(&dir).rule, Rule::Index);
}

#[test]
fn index_naming_a_tensor_the_shard_lacks_is_index_error() {
    let (_tmp, dir) = scratch();
    expect_index_entry(&dir, "model.layers.0.ghost.weight", SHARD1);
}

#[test]
fn index_placing_a_tensor_in_the_wrong_shard_is_index_error() {
    let (_tmp, dir) = scratch();
    expect_index_entry(&dir, NORM, SHARD2);
}

#[test]
fn index_shard_name_with_a_path_separator_is_index_error() {
    for bad in [
        "../x.safetensors",
        "sub/x.safetensors",
        "/tmp/x.safetensors",
        "..",
    ] {
        let (tmp, dir) = scratch();
        // A real file there, so only the name can be the fault.
        if bad == "../x.safetensors" {
            write_safetensors(
                &tmp.path().join("x.safetensors"),
                &[Tensor::bf16(NORM, &[1], &[1.0])],
            );
        }
        expect_index_entry(&dir, NORM, bad);
    }
}

#[test]
fn index_without_weight_map_is_index_error() {
    let (_tmp, dir) = scratch();
    sharded_ckpt(&dir);
    write_json(&dir.join(INDEX), &json!({"metadata": {}}));
    expect_in(&dir, Stage::Open, Rule::Index, INDEX, None);
}

#[test]
fn same_tensor_in_two_shards_is_duplicate() {
    let (_tmp, dir) = scratch();
    sharded_ckpt(&dir);
    let mut second = pack_tensors();
    second.retain(|t| t.name != NORM);
    second.push(Tensor::bf16(NORM, &[16], &[2.0; 16]));
    write_safetensors(&dir.join(SHARD2), &second);
    expect_in(&dir, Stage::Open, Rule::DuplicateTensor, SHARD2, Some(NORM));
}

#[test]
fn same_tensor_in_two_shards_without_index_is_duplicate() {
    let (_tmp, dir) = scratch();
    sharded_ckpt(&dir);
    std::fs::remove_file(dir.join(INDEX)).unwrap();
    write_safetensors(&dir.join(SHARD1), &pack_tensors());
    expect_in(
        &dir,
        Stage::Open,
        Rule::DuplicateTensor,
        SHARD2,
        Some(&module_param("weight_packed")),
    );
}

// ---------------------------------------------------------------------------
// Configs (CFG-001, CFG-002)
// ---------------------------------------------------------------------------

/// The pack-quantized checkpoint with its quantization_config changed by
/// `edit`: refused by `Plan::build` with `rule`, naming config.json.
fn expect_qc(edit: impl FnOnce(&mut Value), rule: Rule) -> Error {
    let (_tmp, dir) = scratch();
    let mut qc = ct_config("pack-quantized", pack_weights(), "0.19.0");
    edit(&mut qc);
    write_checkpoint(&dir, &pack_tensors(), qc);
    expect_in(&dir, Stage::Build, rule, "config.json", None)
}

#[test]
fn config_that_is_not_json_is_config_error() {
    let (_tmp, dir) = scratch();
    pack_ckpt(&dir, &pack_tensors(), pack_weights());
    std::fs::write(dir.join("config.json"), b"{\"quantization_config\": ").unwrap();
    expect_in(&dir, Stage::Open, Rule::Config, "config.json", None);
}

#[test]
fn config_too_large_to_read_is_config_error() {
    let (_tmp, dir) = scratch();
    pack_ckpt(&dir, &pack_tensors(), pack_weights());
    // Sparse: 65 MiB on paper, nothing on disk.
    let f = std::fs::File::create(dir.join("config.json")).unwrap();
    f.set_len(65 << 20).unwrap();
    expect_in(&dir, Stage::Open, Rule::Config, "config.json", None);
}

#[test]
fn hf_quant_config_that_is_not_json_is_config_error() {
    let (_tmp, dir) = scratch();
    modelopt_ckpt(&dir, &modelopt_tensors(), "NVFP4");
    std::fs::write(dir.join("hf_quant_config.json"), b"\xff\xfe not json").unwrap();
    expect_in(
        &dir,
        Stage::Open,
        Rule::Config,
        "hf_quant_config.json",
        None,
    );
}

#[test]
fn config_without_config_groups_is_config_error() {
    expect_qc(
        |qc| {
            qc.as_object_mut().unwrap().remove("config_groups");
        },
        Rule::Config,
    );
}

#[test]
fn config_group_without_num_bits_is_config_error() {
    let (_tmp, dir) = scratch();
    let mut w = pack_weights();
    w.as_object_mut().unwrap().remove("num_bits");
    pack_ckpt(&dir, &pack_tensors(), w);
    expect_in(&dir, Stage::Build, Rule::Config, "config.json", None);
}

#[test]
fn unknown_quant_method_is_unsupported() {
    // A name no format claims (a real one would land some day: "hqq" did).
    let e = expect_qc(
        |qc| qc["quant_method"] = json!("no-such-method"),
        Rule::Unsupported,
    );
    assert!(e.to_string().contains("no-such-method"), "{e}");
}

#[test]
fn quantized_tensors_without_config_json_is_config_error() {
    let (_tmp, dir) = scratch();
    std::fs::create_dir_all(&dir).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &pack_tensors());
    let w = module_param("weight_packed");
    expect(
        &dir,
        Want {
            stage: Stage::Build,
            rule: Rule::NoConfig,
            files: &[dir.clone(), dir.join("model.safetensors")],
            tensor: Some(&w),
        },
    );
}

#[test]
fn quantized_tensors_with_config_json_lacking_quantization_config_is_config_error() {
    let (_tmp, dir) = scratch();
    write_checkpoint(&dir, &pack_tensors(), Value::Null);
    let w = module_param("weight_packed");
    expect(
        &dir,
        Want {
            stage: Stage::Build,
            rule: Rule::NoConfig,
            files: &[
                dir.clone(),
                dir.join("model.safetensors"),
                dir.join("config.json"),
            ],
            tensor: Some(&w),
        },
    );
}

#[test]
fn bad_target_regex_is_one_line_config_error() {
    expect_qc(
        |qc| qc["config_groups"]["group_0"]["targets"] = json!(["re:("]),
        Rule::Config,
    );
}

#[test]
fn unsupported_format_marlin_24_is_unsupported() {
    let (_tmp, dir) = scratch();
    write_checkpoint(
        &dir,
        &pack_tensors(),
        ct_config("marlin-24", pack_weights(), "0.19.0"),
    );
    let e = expect_in(&dir, Stage::Plan, Rule::Unsupported, "config.json", Some(M));
    assert!(e.to_string().contains("marlin-24"), "{e}");
}

/// An algorithm ModelOpt writes that is not decoded yet (INT4 AWQ) is
/// refused by name, not as a malformed config.
#[test]
fn modelopt_unknown_algo_is_unsupported() {
    let (_tmp, dir) = scratch();
    modelopt_ckpt(&dir, &modelopt_tensors(), "W8A8_SQ_PER_CHANNEL");
    let e = expect_in(
        &dir,
        Stage::Build,
        Rule::Unsupported,
        "hf_quant_config.json",
        None,
    );
    assert!(e.to_string().contains("W8A8_SQ_PER_CHANNEL"), "{e}");
}

#[test]
fn modelopt_unknown_algo_in_config_json_is_unsupported() {
    let (_tmp, dir) = scratch();
    write_checkpoint(
        &dir,
        &modelopt_tensors(),
        json!({"quant_method": "modelopt", "quant_algo": "INT8_SQ"}),
    );
    expect_in(&dir, Stage::Build, Rule::Unsupported, "config.json", None);
}

#[test]
fn modelopt_without_quantization_object_is_config_error() {
    let (_tmp, dir) = scratch();
    modelopt_ckpt(&dir, &modelopt_tensors(), "NVFP4");
    write_json(
        &dir.join("hf_quant_config.json"),
        &json!({"producer": {"name": "modelopt"}}),
    );
    expect_in(
        &dir,
        Stage::Build,
        Rule::Config,
        "hf_quant_config.json",
        None,
    );
}

// ---------------------------------------------------------------------------
// CT-001, CT-004
// ---------------------------------------------------------------------------

/// A checkpoint written by `write`, expected to be refused for module M by
/// `rule`, naming `tensor` of model.safetensors.
fn expect_finding(write: impl FnOnce(&Path), rule: Rule, tensor: &str) -> Error {
    let (_tmp, dir) = scratch();
    write(&dir);
    expect_in(&dir, Stage::Plan, rule, "model.safetensors", Some(tensor))
}

/// A pack-quantized checkpoint with `tensors` and `weights`, expected to be
/// refused for module M by `rule`, naming `tensor` of model.safetensors.
fn expect_module(tensors: &[Tensor], weights: Value, rule: Rule, tensor: &str) -> Error {
    expect_finding(|dir| pack_ckpt(dir, tensors, weights), rule, tensor)
}

/// `base` with `t` in place of the tensor of the same name, expected to be
/// refused for module M by `rule`, naming that tensor of model.safetensors.
fn expect_replaced(base: Base, t: Tensor, rule: Rule) -> Error {
    let name = t.name.clone();
    let mut tensors = base.tensors();
    replace(&mut tensors, t);
    expect_finding(|dir| base.write(dir, &tensors), rule, &name)
}

#[test]
fn num_bits_0_breaks_ct001() {
    let w = pack_weights_with("num_bits", json!(0));
    expect_module(
        &pack_tensors(),
        w,
        Rule::Ct001,
        &module_param("weight_packed"),
    );
}

#[test]
fn num_bits_9_breaks_ct001() {
    let w = pack_weights_with("num_bits", json!(9));
    expect_module(
        &pack_tensors(),
        w,
        Rule::Ct001,
        &module_param("weight_packed"),
    );
}

#[test]
fn num_bits_huge_breaks_config_then_ct001() {
    // Larger than u32: refused while reading the config (CFG-001), not a panic.
    let (_tmp, dir) = scratch();
    let w = pack_weights_with("num_bits", json!(1u64 << 40));
    pack_ckpt(&dir, &pack_tensors(), w);
    let (_, e, _) = reject(&dir);
    assert_eq!(e.rule, Rule::Config, "{e}");
    check_message(&e, Rule::Config);
    // And one that fits u32 but not 1..=8.
    let w = pack_weights_with("num_bits", json!(32));
    expect_module(
        &pack_tensors(),
        w,
        Rule::Ct001,
        &module_param("weight_packed"),
    );
}

#[test]
fn weight_packed_stored_as_u8_breaks_ct001() {
    let words = pack_tensors()
        .into_iter()
        .find(|x| x.name == module_param("weight_packed"))
        .unwrap()
        .data;
    expect_replaced(
        Base::Pack,
        Tensor::u8(module_param("weight_packed"), "U8", &[4, 8], &words),
        Rule::Ct001,
    );
}

#[test]
fn packed_width_fitting_neither_layout_breaks_ct004() {
    // 16 four-bit fields take 2 words either way; 3 fits neither.
    let e = expect_replaced(
        Base::Pack,
        Tensor::u32_words(module_param("weight_packed"), &[4, 3], &[0; 12]),
        Rule::Ct004,
    );
    assert!(e.to_string().contains("neither"), "{e}");
}

#[test]
fn packed_width_too_small_breaks_ct004() {
    expect_replaced(
        Base::Pack,
        Tensor::u32_words(module_param("weight_packed"), &[4, 1], &[0; 4]),
        Rule::Ct004,
    );
}

#[test]
fn packed_rows_not_matching_weight_shape_breaks_ct004() {
    expect_replaced(
        Base::Pack,
        Tensor::u32_words(module_param("weight_packed"), &[3, 2], &[0; 6]),
        Rule::Ct004,
    );
}

#[test]
fn packed_rank_not_matching_weight_shape_breaks_ct004() {
    expect_replaced(
        Base::Pack,
        Tensor::u32_words(module_param("weight_packed"), &[1, 4, 2], &[0; 8]),
        Rule::Ct004,
    );
}

// ---------------------------------------------------------------------------
// Missing tensors (TEN-001)
// ---------------------------------------------------------------------------

/// `base` without `param` of module M. Missing tensors are not in any file:
/// the checkpoint (or the shard holding the module) is named.
fn expect_missing(base: Base, param: &str) {
    let (_tmp, dir) = scratch();
    let tensor = module_param(param);
    let mut t = base.tensors();
    remove(&mut t, &tensor);
    base.write(&dir, &t);
    expect(
        &dir,
        Want {
            stage: Stage::Plan,
            rule: Rule::MissingTensor,
            files: &[dir.to_path_buf(), dir.join("model.safetensors")],
            tensor: Some(&tensor),
        },
    );
}

#[test]
fn missing_weight_scale_is_missing_tensor() {
    expect_missing(Base::Pack, "weight_scale");
}

#[test]
fn missing_weight_shape_is_missing_tensor() {
    expect_missing(Base::Pack, "weight_shape");
}

#[test]
fn missing_weight_packed_is_missing_tensor() {
    expect_missing(Base::Pack, "weight_packed");
}

#[test]
fn missing_weight_global_scale_is_missing_tensor() {
    expect_missing(Base::Nvfp4, "weight_global_scale");
}

#[test]
fn missing_asymmetric_zero_point_is_missing_tensor() {
    expect_missing(Base::Asym, "weight_zero_point");
}

#[test]
fn missing_modelopt_weight_scale_is_missing_tensor() {
    expect_missing(Base::Modelopt, "weight_scale");
}

#[test]
fn missing_modelopt_weight_scale_2_is_missing_tensor() {
    expect_missing(Base::Modelopt, "weight_scale_2");
}

// ---------------------------------------------------------------------------
// Dtypes, shapes, values (TEN-002..004)
// ---------------------------------------------------------------------------

#[test]
fn scale_dtype_i32_is_tensor_dtype() {
    expect_replaced(
        Base::Pack,
        Tensor::i32(module_param("weight_scale"), &[4, 2], &[1; 8]),
        Rule::TensorDtype,
    );
}

#[test]
fn weight_shape_dtype_f32_is_tensor_dtype() {
    expect_replaced(
        Base::Pack,
        Tensor::f32(module_param("weight_shape"), &[2], &[4.0, 16.0]),
        Rule::TensorDtype,
    );
}

#[test]
fn nvfp4_scale_dtype_bf16_is_tensor_dtype() {
    expect_replaced(
        Base::Nvfp4,
        Tensor::bf16(module_param("weight_scale"), &[4, 1], &[1.0; 4]),
        Rule::TensorDtype,
    );
}

#[test]
fn global_scale_stored_as_bf16_is_tensor_dtype() {
    // TEN-002 is the dtype rule; a global scale of the wrong dtype breaks it,
    // not the shape rule.
    expect_replaced(
        Base::Nvfp4,
        Tensor::bf16(module_param("weight_global_scale"), &[1], &[2.0]),
        Rule::TensorDtype,
    );
}

#[test]
fn global_scale_with_two_values_is_tensor_shape() {
    expect_replaced(
        Base::Nvfp4,
        Tensor::f32(module_param("weight_global_scale"), &[2], &[2.0, 2.0]),
        Rule::TensorShape,
    );
}

#[test]
fn scale_with_too_many_groups_is_tensor_shape() {
    expect_replaced(
        Base::Pack,
        Tensor::bf16(module_param("weight_scale"), &[4, 3], &[1.0; 12]),
        Rule::TensorShape,
    );
}

#[test]
fn scale_transposed_is_tensor_shape() {
    // Right number of entries, groups on the wrong axis.
    expect_replaced(
        Base::Pack,
        Tensor::bf16(module_param("weight_scale"), &[2, 4], &[1.0; 8]),
        Rule::TensorShape,
    );
}

#[test]
fn per_channel_scale_for_group_strategy_is_tensor_shape() {
    expect_replaced(
        Base::Pack,
        Tensor::bf16(module_param("weight_scale"), &[4, 1], &[1.0; 4]),
        Rule::TensorShape,
    );
}

#[test]
fn modelopt_scale_shape_wrong_is_tensor_shape() {
    expect_replaced(
        Base::Modelopt,
        Tensor::u8(module_param("weight_scale"), "F8_E4M3", &[4, 2], &[0x38; 8]),
        Rule::TensorShape,
    );
}

#[test]
fn weight_shape_negative_is_tensor_value() {
    expect_replaced(
        Base::Pack,
        Tensor::i64(module_param("weight_shape"), &[2], &[-4, 16]),
        Rule::TensorValue,
    );
}

#[test]
fn weight_shape_zero_is_tensor_value() {
    expect_replaced(
        Base::Pack,
        Tensor::i64(module_param("weight_shape"), &[2], &[4, 0]),
        Rule::TensorValue,
    );
}

#[test]
fn weight_shape_huge_is_refused_without_allocating() {
    // 2^40 columns would be terabytes; the packed width (2 words, 16
    // columns) does not fit them (CT-004), found before anything is allocated.
    let (_tmp, dir) = scratch();
    let mut t = pack_tensors();
    replace(
        &mut t,
        Tensor::i64(module_param("weight_shape"), &[2], &[4, 1 << 40]),
    );
    pack_ckpt(&dir, &t, pack_weights());
    let (stage, e, _) = reject(&dir);
    assert_eq!(stage, Stage::Plan, "{e}");
    assert_eq!(e.rule, Rule::Ct004, "{e}");
    check_message(&e, Rule::Ct004);
    expect_replaced(
        Base::Pack,
        Tensor::i64(module_param("weight_shape"), &[2], &[i64::MAX, i64::MAX]),
        Rule::TensorValue,
    );
}

#[test]
fn weight_shape_of_rank_1_is_tensor_shape() {
    expect_replaced(
        Base::Pack,
        Tensor::i64(module_param("weight_shape"), &[1], &[64]),
        Rule::TensorShape,
    );
}

fn with_g_idx(values: &[i32]) -> Vec<Tensor> {
    let mut t = pack_tensors();
    t.push(Tensor::i32(module_param("weight_g_idx"), &[16], values));
    t
}

#[test]
fn g_idx_value_at_or_beyond_group_count_is_tensor_value() {
    let mut v: Vec<i32> = (0..16).map(|c| c / 8).collect();
    v[5] = 2; // two groups of 8: 0 and 1 only
    let e = expect_module(
        &with_g_idx(&v),
        pack_weights(),
        Rule::TensorValue,
        &module_param("weight_g_idx"),
    );
    assert!(e.to_string().contains("g_idx[5]"), "{e}");
}

#[test]
fn g_idx_negative_is_tensor_value() {
    let mut v: Vec<i32> = (0..16).map(|c| c / 8).collect();
    v[15] = -1;
    expect_module(
        &with_g_idx(&v),
        pack_weights(),
        Rule::TensorValue,
        &module_param("weight_g_idx"),
    );
}

#[test]
fn g_idx_wrong_length_is_tensor_shape() {
    let mut t = pack_tensors();
    t.push(Tensor::i32(module_param("weight_g_idx"), &[8], &[0; 8]));
    expect_module(
        &t,
        pack_weights(),
        Rule::TensorShape,
        &module_param("weight_g_idx"),
    );
}

#[test]
fn zero_point_shape_wrong_is_tensor_shape() {
    expect_replaced(
        Base::Asym,
        Tensor::u32_words(module_param("weight_zero_point"), &[1, 3], &[0x8888; 3]),
        Rule::TensorShape,
    );
}

// ---------------------------------------------------------------------------
// Output (OUT-001)
// ---------------------------------------------------------------------------

/// `dequantize(dir)` into `out`, which must be refused (`why` says why).
/// Fails the test on a panic.
fn dequantize_refused(dir: &Path, out: &Path, why: &str) -> Error {
    match caught(|| dequantize(dir, out, &CPU_AUTO)) {
        Err(p) => panic!("dequantize panicked: {p}"),
        Ok(r) => r.expect_err(why),
    }
}

#[test]
fn dequantize_into_non_empty_directory_is_output_error() {
    let (tmp, dir) = scratch();
    pack_ckpt(&dir, &pack_tensors(), pack_weights());
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"precious").unwrap();
    std::fs::create_dir(out.join("sub")).unwrap();
    let before = snapshot(&out);
    let e = dequantize_refused(&dir, &out, "refuses a non-empty directory");
    assert_eq!(e.rule, Rule::Output, "{e}");
    assert_eq!(e.file.as_deref(), Some(out.as_path()), "{e}");
    assert_eq!(e.tensor, None, "{e}");
    check_message(&e, Rule::Output);
    assert_eq!(snapshot(&out), before, "the directory was changed");
}

#[test]
fn dequantize_onto_a_file_is_io_error() {
    let (tmp, dir) = scratch();
    pack_ckpt(&dir, &pack_tensors(), pack_weights());
    let out = tmp.path().join("a-file");
    std::fs::write(&out, b"precious").unwrap();
    let e = dequantize_refused(&dir, &out, "refuses a file as output directory");
    assert_eq!(e.rule, Rule::Io, "{e}");
    assert_eq!(e.file.as_deref(), Some(out.as_path()), "{e}");
    check_message(&e, Rule::Io);
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
}

// ---------------------------------------------------------------------------
// No input panics
// ---------------------------------------------------------------------------

#[test]
fn no_truncation_panics() {
    for base in Base::ALL {
        let (_tmp, dir) = scratch();
        base.build(&dir);
        let file = dir.join("model.safetensors");
        let full = std::fs::read(&file).unwrap();
        for cut in 0..full.len() {
            std::fs::write(&file, &full[..cut]).unwrap();
            no_panic(&dir, &format!("{} cut to {cut} bytes", base.name()));
        }
    }
}

#[test]
fn no_byte_flip_panics() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    for base in Base::ALL {
        let (_tmp, dir) = scratch();
        base.build(&dir);
        let file = dir.join("model.safetensors");
        let full = std::fs::read(&file).unwrap();
        for pos in 0..full.len() {
            for v in [0u8, 0xff, full[pos] ^ 1, b'9', rng.below(256) as u8] {
                let mut b = full.clone();
                b[pos] = v;
                std::fs::write(&file, &b).unwrap();
                no_panic(&dir, &format!("{} byte {pos} set to {v:#04x}", base.name()));
            }
        }
    }
}

#[test]
fn no_hostile_header_panics() {
    let headers = [
        json!({}),
        json!([]),
        json!(null),
        json!({"a": {"dtype": "F32", "shape": [u64::MAX, 2], "data_offsets": [0, 8]}}),
        json!({"a": {"dtype": "F32", "shape": [1usize << 62, 1usize << 62], "data_offsets": [0, 0]}}),
        json!({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}),
        json!({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, u64::MAX]}}),
        json!({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}}),
        json!({"__metadata__": {"quantization_config": "svdquant"}}),
        json!({"__metadata__": {"x": 1}}),
        json!({(module_param("weight_packed")): {"dtype": "I32", "shape": [], "data_offsets": [0, 4]}}),
        json!({(module_param("weight_packed")): {"dtype": "I32", "shape": [0, 0], "data_offsets": [0, 0]}}),
    ];
    for (i, h) in headers.iter().enumerate() {
        let (_tmp, dir) = scratch();
        pack_ckpt(&dir, &pack_tensors(), pack_weights());
        std::fs::write(dir.join("model.safetensors"), raw_safetensors(h, &[0; 8])).unwrap();
        no_panic(&dir, &format!("header {i}: {h}"));
        std::fs::write(dir.join("model.safetensors"), raw_safetensors(h, &[])).unwrap();
        no_panic(&dir, &format!("header {i} without data: {h}"));
    }
}

#[test]
fn no_hostile_config_panics() {
    let weights = [
        json!({"num_bits": 4, "strategy": "group", "group_size": 0}),
        json!({"num_bits": 4, "strategy": "group"}),
        json!({"num_bits": 4, "strategy": "group", "group_size": u64::MAX}),
        json!({"num_bits": 4, "strategy": "group", "group_size": -8}),
        json!({"num_bits": 4, "strategy": "block", "block_structure": [0, 0]}),
        json!({"num_bits": 4, "strategy": "block", "block_structure": "0x8"}),
        json!({"num_bits": 4, "strategy": "block", "block_structure": [4, u64::MAX]}),
        json!({"num_bits": 4, "strategy": "token"}),
        json!({"num_bits": 4, "strategy": "channel"}),
        json!({"num_bits": 4, "strategy": "tensor"}),
        json!({"num_bits": 4, "strategy": "group", "group_size": 8, "type": "float"}),
        json!({"num_bits": 4, "strategy": "group", "group_size": 8, "symmetric": false}),
        json!({"num_bits": "4"}),
        json!("weights"),
        json!(null),
    ];
    for (i, w) in weights.iter().enumerate() {
        for format in [
            "pack-quantized",
            "nvfp4-pack-quantized",
            "int-quantized",
            "",
        ] {
            let (_tmp, dir) = scratch();
            pack_ckpt(&dir, &pack_tensors(), pack_weights());
            let qc = ct_config(format, w.clone(), "0.19.0");
            write_checkpoint(&dir, &pack_tensors(), qc);
            no_panic(&dir, &format!("weights {i} {w} as {format:?}"));
        }
    }
    let qcs = [
        json!({"quant_method": "compressed-tensors", "config_groups": []}),
        json!({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": "Linear", "weights": pack_weights(), "format": "pack-quantized"}}}),
        json!({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": pack_weights()}}}),
        json!({"quant_method": "compressed-tensors", "version": "x.y", "config_groups": {"g": {"targets": ["Linear"], "weights": pack_weights(), "format": "pack-quantized"}}}),
        json!({"quant_method": 7}),
        json!({"quant_method": "modelopt"}),
        json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "config_groups": {"g": {"weights": {"group_size": 0}}}}),
        json!("compressed-tensors"),
    ];
    for (i, qc) in qcs.iter().enumerate() {
        let (_tmp, dir) = scratch();
        write_checkpoint(&dir, &pack_tensors(), qc.clone());
        no_panic(&dir, &format!("quantization_config {i}: {qc}"));
    }
    for q in [
        json!({"quantization": {"quant_algo": "NVFP4", "group_size": 0}}),
        json!({"quantization": {"quant_algo": "NVFP4", "group_size": 3}}),
        json!({"quantization": {"quant_algo": "NVFP4", "group_size": u64::MAX}}),
        json!({"quantization": []}),
        json!([]),
    ] {
        let (_tmp, dir) = scratch();
        modelopt_ckpt(&dir, &modelopt_tensors(), "NVFP4");
        write_json(&dir.join("hf_quant_config.json"), &q);
        no_panic(&dir, &format!("hf_quant_config {q}"));
    }
}
