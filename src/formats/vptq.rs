//! VPTQ (`quant_method: "vptq"`, microsoft/VPTQ; the VPTQ-community
//! checkpoints), read as transformers' `replace_with_vptq_linear` builds
//! each `VQuantLinear` (indices always packed) and decoded as vptq 0.0.5's
//! `vptq.ops.quant_gemm.dequant` computes the weight.
//!
//! A module stores `centroids.weight` `[C, K·v]` (C groups of columns, each
//! with a codebook of K vectors of v output rows), `indices` int32 `[C,
//! ceil(out/v), ceil(G·b/32)]` (for each group, vector row and column, a
//! field of `b = index_bits + res_bits` bits, LSB first, rows padded to
//! whole words: the main index in the low `index_bits`, the residual index
//! above it), and optionally `res_centroids.weight` `[C, R·v]` (a residual
//! codebook whose vector is added, rounded in the model's dtype),
//! `outlier_centroids.weight` `[1, Ko·vo]` and `outlier_indices` int16 `[1,
//! ceil(out/vo), O]` (the first O columns, unpacked, no residual), `perm`
//! int16 `[in]` (column `c` of the weight is stored column
//! `argsort(perm)[c]`), and `weight_scale`, `weight_bias` `[in]` (`w · s +
//! b`, each step rounded in the model's dtype). Rows past `out` (padding
//! to whole vectors) are dropped.
//!
//! vptq's `unpack_index_tensor` masks the residual index with
//! `index_bits`' mask, not `res_bits`': with `res_bits > index_bits` the
//! high residual bits are dropped, here as there. Its pad arithmetic
//! (`(words·32) mod (G·b)`) only equals the real padding while a row holds
//! less than twice `G·b` bits; other rows are refused.

use std::collections::BTreeMap;
use std::path::PathBuf;

use safetensors::Dtype;
use serde_json::Value;

use super::{decoded_output, expect_dtype, plan_each, require, Modules, QuantConfig};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule, Warning};
use crate::job::{
    Codebook, DecodeJob, Dims, Fault, Grid, Region, Sum, Term, ValueKind, Values,
};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "vptq",
    producers: "VPTQ (microsoft/VPTQ, VPTQ-community)",
    bits: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
    modes: &[
        "vector codebooks along the outputs, one a column group",
        "residual codebook",
        "outlier columns",
        "perm",
        "weight_scale/weight_bias",
    ],
};

/// The tensors a VQuantLinear stores besides its bias.
const PARAMS: &[&str] = &[
    "centroids.weight",
    "indices",
    "res_centroids.weight",
    "outlier_centroids.weight",
    "outlier_indices",
    "perm",
    "weight_scale",
    "weight_bias",
];

/// One layer's entry of `config_for_layers` (transformers' `VptqLayerConfig`).
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct Layer {
    /// `[outlier, main]` vector lengths.
    pub vector_lens: [i64; 2],
    /// `[outlier, main]` codebook sizes.
    pub num_centroids: [i64; 2],
    /// `[outlier, main]` residual codebook sizes (-1: none).
    pub num_res_centroids: [i64; 2],
    /// Column groups (codebooks).
    pub group_num: i64,
    /// Columns of a group.
    pub group_size: i64,
    /// Outlier columns in front.
    #[serde(default)]
    pub outlier_size: i64,
    /// Indices stored as fp16 (fine-tuning only).
    #[serde(default)]
    pub indices_as_float: bool,
    /// `weight_scale`/`weight_bias`.
    #[serde(default = "yes")]
    pub enable_norm: bool,
    /// `perm`.
    #[serde(default = "yes")]
    pub enable_perm: bool,
    /// Always true for transformers.
    #[serde(default = "yes")]
    pub is_indice_packed: bool,
    /// Inputs, when stated.
    #[serde(default)]
    pub in_features: Option<i64>,
    /// Outputs, when stated.
    #[serde(default)]
    pub out_features: Option<i64>,
}

fn yes() -> bool {
    true
}

/// A VPTQ quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// Each quantized module's settings.
    pub layers: BTreeMap<String, Layer>,
}

#[derive(serde::Deserialize)]
struct Raw {
    #[serde(default)]
    config_for_layers: BTreeMap<String, Value>,
    #[serde(default)]
    shared_layer_config: BTreeMap<String, Value>,
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let raw: Raw = q.read()?;
        let path = q.path;
        if !raw.shared_layer_config.is_empty() {
            return Err(Error::new(
                Rule::Unsupported,
                path,
                "shared_layer_config: transformers looks its entries up by the second part of each module name, vptq's own loader by the last; only config_for_layers is read",
            ));
        }
        let mut layers = BTreeMap::new();
        for (module, v) in raw.config_for_layers {
            let at = format!("config_for_layers.{module}");
            let layer: Layer = serde_path_to_error::deserialize(&v).map_err(|e| {
                Error::new(Rule::Config, path, format!("{at}.{}: {}", e.path(), e.inner()))
            })?;
            if !layer.is_indice_packed {
                return Err(Error::new(
                    Rule::Config,
                    path,
                    format!("{at}.is_indice_packed false: transformers' VptqLayerConfig requires packed indices"),
                ));
            }
            if layer.indices_as_float {
                return Err(Error::new(
                    Rule::Unsupported,
                    path,
                    format!("{at}.indices_as_float: indices stored as fp16 (a fine-tuning layout) are not decoded"),
                ));
            }
            layers.insert(module, layer);
        }
        Ok(Config {
            path: path.to_path_buf(),
            layers,
        })
    }

    /// inspect's format line.
    pub fn format_line(&self) -> String {
        format!(
            "vptq vector codebooks ({} quantized modules)",
            self.layers.len()
        )
    }

    /// `inspect`'s lines: each distinct setting.
    pub fn report_lines(&self) -> Vec<String> {
        self.layers
            .iter()
            .map(|(m, l)| {
                format!(
                    "{m}: v {} K {} residual {} groups {} outliers {} (v {} K {}) perm {} norm {}",
                    l.vector_lens[1],
                    l.num_centroids[1],
                    l.num_res_centroids[1],
                    l.group_num,
                    l.outlier_size,
                    l.vector_lens[0],
                    l.num_centroids[0],
                    l.enable_perm,
                    l.enable_norm
                )
            })
            .collect()
    }
}

/// Every module `config_for_layers` names; one that stores VPTQ tensors
/// without an entry there, or an entry without them, is refused.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let stored: std::collections::BTreeSet<&'c str> = super::modules_with(ckpt, "centroids.weight")
        .into_iter()
        .chain(super::modules_with(ckpt, "indices"))
        .collect();
    let named = stored.iter().copied().filter(|m| cfg.layers.contains_key(*m));
    let build = |m: &str, _: &mut Vec<Warning>| match cfg.layers.get(m) {
        Some(l) => plan_module(cfg, l, ckpt, m, dtype),
        None => Err(Error::new(Rule::Internal, &cfg.path, format!("{m}: no layer config"))),
    };
    let mut found = plan_each(ckpt, named, PARAMS, |_| None, build);
    for m in stored.iter().filter(|m| !cfg.layers.contains_key(**m)) {
        found.errors.push(Error::tensor(
            Rule::Disagree,
            ckpt.display_path(),
            format!("{m}.indices"),
            format!("module {m} stores VPTQ indices but config_for_layers does not name it"),
        ));
    }
    for m in cfg.layers.keys().filter(|m| !stored.contains(m.as_str())) {
        found.errors.push(super::missing(
            ckpt,
            format!("{m}.centroids.weight"),
            format!("config_for_layers names {m}, which stores no VPTQ codebook"),
        ));
    }
    found
}

/// A positive count from the config, or a config error naming it.
fn count(cfg: &Config, module: &str, key: &str, v: i64) -> Result<usize> {
    usize::try_from(v).ok().filter(|&n| n > 0).ok_or_else(|| {
        Error::new(
            Rule::Config,
            &cfg.path,
            format!("config_for_layers.{module}.{key} {v}: a positive count is expected"),
        )
    })
}

/// log2 of a codebook size that is a power of two (1..=16 bits): vptq's
/// layer sizes its packs with `int(log2(K))`, its unpack with
/// `ceil(log2(K))`, which agree only then.
fn index_bits(cfg: &Config, module: &str, key: &str, k: usize) -> Result<u32> {
    match k.is_power_of_two() && (2..=1 << 16).contains(&k) {
        true => Ok(k.trailing_zeros()),
        false => Err(Error::new(
            Rule::Unsupported,
            &cfg.path,
            format!("config_for_layers.{module}.{key} {k}: codebook sizes of a power of two from 2 to 65536 are decoded (vptq packs with int(log2 K) bits and unpacks with ceil(log2 K))"),
        )),
    }
}

fn expect_shape(t: &TensorRef<'_>, want: &[usize], what: &str) -> Result<()> {
    if *t.shape != *want {
        return Err(t.error(
            Rule::TensorShape,
            format!("shape {:?}; {what} is {want:?}", t.shape),
        ));
    }
    Ok(())
}

/// The arithmetic dtype of a float tensor.
fn float_kind(t: &TensorRef<'_>) -> Result<(ValueKind, Option<OutDtype>)> {
    Ok(match t.dtype {
        Dtype::F16 => (ValueKind::F16, Some(OutDtype::F16)),
        Dtype::BF16 => (ValueKind::Bf16, Some(OutDtype::Bf16)),
        Dtype::F32 => (ValueKind::F32, None),
        _ => {
            return Err(t.error(
                Rule::TensorDtype,
                format!("dtype {}, expected F16, BF16 or F32", t.dtype),
            ))
        }
    })
}

fn same_dtype(t: &TensorRef<'_>, like: &TensorRef<'_>) -> Result<()> {
    expect_dtype(t, &[like.dtype]).map_err(|_| {
        t.error(
            Rule::TensorDtype,
            format!(
                "dtype {}; {} is {} and vptq computes in one dtype",
                t.dtype, like.name, like.dtype
            ),
        )
    })
}

fn plan_module<'c>(
    cfg: &Config,
    l: &Layer,
    ckpt: &'c Checkpoint,
    module: &str,
    out: OutDtype,
) -> Result<Output<'c>> {
    let c = require(ckpt, module, "centroids.weight")?;
    let idx = require(ckpt, module, "indices")?;
    let (_, arith) = float_kind(&c)?;
    let v = count(cfg, module, "vector_lens[1]", l.vector_lens[1])?;
    let k = count(cfg, module, "num_centroids[1]", l.num_centroids[1])?;
    let groups = count(cfg, module, "group_num", l.group_num)?;
    let gs = count(cfg, module, "group_size", l.group_size)?;
    let ib = index_bits(cfg, module, "num_centroids[1]", k)?;
    let res = (l.num_res_centroids[1] > 0)
        .then(|| count(cfg, module, "num_res_centroids[1]", l.num_res_centroids[1]))
        .transpose()?;
    let rb = match res {
        Some(r) => index_bits(cfg, module, "num_res_centroids[1]", r)?,
        None => 0,
    };
    let outlier = l.vector_lens[0] > 1 && l.num_centroids[0] > 0;
    if outlier && l.num_res_centroids[0] != -1 {
        return Err(Error::new(
            Rule::Unsupported,
            &cfg.path,
            format!("config_for_layers.{module}.num_res_centroids[0] {}: vptq has no residual codebook for outliers", l.num_res_centroids[0]),
        ));
    }
    let osz = if outlier {
        count(cfg, module, "outlier_size", l.outlier_size)?
    } else {
        0
    };
    // The weight's shape: rows from the config (vptq's out_features),
    // columns the outliers and the groups.
    let main_cols = groups
        .checked_mul(gs)
        .ok_or_else(|| Error::new(Rule::Config, &cfg.path, format!("config_for_layers.{module}: group_num · group_size overflows")))?;
    let cols = main_cols + osz;
    let rows = match l.out_features {
        Some(o) => count(cfg, module, "out_features", o)?,
        None => {
            return Err(Error::new(
                Rule::Config,
                &cfg.path,
                format!("config_for_layers.{module}.out_features: missing"),
            ))
        }
    };
    if let Some(i) = l.in_features {
        if usize::try_from(i).ok() != Some(cols) {
            return Err(Error::new(
                Rule::Config,
                &cfg.path,
                format!("config_for_layers.{module}: in_features {i} is not outlier_size + group_num · group_size = {cols}"),
            ));
        }
    }
    let n_idx = rows.div_ceil(v);
    let total = ib + rb;
    let row_bits = gs as u64 * total as u64;
    let words = row_bits.div_ceil(32);
    if words * 32 != row_bits && words * 32 >= 2 * row_bits {
        return Err(Error::new(
            Rule::Unsupported,
            &cfg.path,
            format!("config_for_layers.{module}: a packed row of {gs} fields of {total} bits ({row_bits} bits in {words} words) is one vptq's unpack cuts at the wrong bit ((words·32) mod {row_bits})"),
        ));
    }
    expect_shape(&c, &[groups, k * v], "group_num x num_centroids·vector_len")?;
    expect_dtype(&idx, &[Dtype::I32])?;
    expect_shape(&idx, &[groups, n_idx, words as usize], "group_num x ceil(out/v) x packed words")?;
    let mut table: Vec<f32> = c.floats()?;
    let main = Term {
        data: idx.into(),
        bits: ib,
        at: 0,
        row_bits: words * 32,
        group: gs,
        group_bits: n_idx as u64 * words * 32,
        field_bits: total as u64,
        base: 0,
        book: k,
        entries: k,
    };
    let mut terms = vec![main.clone()];
    if let Some(r) = res {
        let rc = require(ckpt, module, "res_centroids.weight")?;
        same_dtype(&rc, &c)?;
        expect_shape(&rc, &[groups, r * v], "group_num x num_res_centroids·vector_len")?;
        let base = table.len();
        table.extend(rc.floats()?);
        // unpack_index_tensor: `(packed >> index_bits) & ((1 << index_bits) - 1)`.
        terms.push(Term {
            bits: rb.min(ib),
            at: ib as u64,
            base,
            book: r,
            entries: r,
            ..main
        });
    }
    let mut regions = Vec::new();
    if outlier {
        let ov = count(cfg, module, "vector_lens[0]", l.vector_lens[0])?;
        let ok = count(cfg, module, "num_centroids[0]", l.num_centroids[0])?;
        let oc = require(ckpt, module, "outlier_centroids.weight")?;
        let oi = require(ckpt, module, "outlier_indices")?;
        same_dtype(&oc, &c)?;
        expect_shape(&oc, &[1, ok * ov], "1 x num_centroids[0]·vector_lens[0]")?;
        expect_dtype(&oi, &[Dtype::I16])?;
        let o_n = rows.div_ceil(ov);
        expect_shape(&oi, &[1, o_n, osz], "1 x ceil(out/vector_lens[0]) x outlier_size")?;
        // Read now (a streamed checkpoint loads them first): every index
        // is checked against the codebook.
        oi.data()?;
        let base = table.len();
        table.extend(oc.floats()?);
        regions.push(Region {
            start: 0,
            cols: osz,
            tile_rows: ov,
            tile_cols: 1,
            terms: vec![Term {
                data: oi.into(),
                bits: 16,
                at: 0,
                row_bits: osz as u64 * 16,
                group: osz,
                group_bits: 0,
                field_bits: 16,
                base,
                book: 0,
                entries: ok,
            }],
        });
    }
    regions.push(Region {
        start: osz,
        cols: main_cols,
        tile_rows: v,
        tile_cols: 1,
        terms,
    });
    let col_map = match l.enable_perm {
        false => None,
        true => Some(inverse_perm(&require(ckpt, module, "perm")?, cols)?),
    };
    let dims = Dims {
        slices: 1,
        rows,
        cols,
    };
    let book = Codebook {
        table: table.into(),
        regions,
        col_map,
        arith,
        sum: Sum::Stepwise,
    };
    if let Err(f) = book.check(rows, cols) {
        return Err(fault(ckpt, module, osz > 0, f));
    }
    let mut job = DecodeJob::with_codebook(dims, book, out);
    if l.enable_norm {
        // Per column of the weight, after perm.
        let grid = Grid {
            row_div: rows,
            col_div: 1,
            row_stride: 0,
            slice_stride: 0,
        };
        for (name, scale) in [("weight_scale", true), ("weight_bias", false)] {
            let t = require(ckpt, module, name)?;
            same_dtype(&t, &c)?;
            expect_shape(&t, &[cols], "in_features")?;
            let values = Values {
                data: t.into(),
                kind: float_kind(&t)?.0,
                grid,
            };
            job = match scale {
                true => job.with_scale(values),
                false => job.with_offset(values),
            };
        }
    }
    Ok(decoded_output(
        module,
        c.shard,
        vec![rows, cols],
        job,
        cfg.format_line(),
    ))
}

/// `argsort(perm)`: the stored column of each weight column, from an
/// int16 `perm` read as uint16, which must be a permutation of the columns.
fn inverse_perm(perm: &TensorRef<'_>, cols: usize) -> Result<std::sync::Arc<[u32]>> {
    expect_dtype(perm, &[Dtype::I16])?;
    expect_shape(perm, &[cols], "in_features")?;
    let mut inv = vec![u32::MAX; cols];
    for (s, b) in perm.data()?.chunks_exact(2).enumerate() {
        let c = u16::from_le_bytes([b[0], b[1]]) as usize;
        match inv.get_mut(c) {
            Some(slot) if *slot == u32::MAX => *slot = s as u32,
            _ => {
                return Err(perm.error(
                    Rule::TensorValue,
                    format!("entry {s} is {c}: perm must hold each column 0..{cols} once"),
                ))
            }
        }
    }
    Ok(inv.into())
}

/// A codebook fault as the rule it breaks, naming the tensor.
fn fault(ckpt: &Checkpoint, module: &str, outliers: bool, f: Fault) -> Error {
    let tensor = |region: usize| match (outliers, region) {
        (true, 0) => format!("{module}.outlier_indices"),
        _ => format!("{module}.indices"),
    };
    match f {
        Fault::Geometry(why) => Error::tensor(Rule::TensorShape, ckpt.display_path(), format!("{module}.centroids.weight"), why),
        Fault::Short { region, .. } => Error::tensor(
            Rule::TensorShape,
            ckpt.display_path(),
            tensor(region),
            "too few bytes for the indices the config describes",
        ),
        Fault::Past {
            region,
            term,
            ti,
            tj,
            index,
        } => Error::tensor(
            Rule::TensorValue,
            ckpt.display_path(),
            tensor(region),
            format!("index {index} (codebook {term}, vector row {ti}, column {tj}) is past its codebook"),
        ),
    }
}
