//! SVDQuant checkpoints written by diffuse_compressor: `model.safetensors`
//! (metadata `quantization_config`) with its `model.config.yaml` sidecar.
//!
//! Each target becomes one [`DecodeJob`] with a [`LowRank`] branch. The
//! dense model is then put back together: fused targets are split into their
//! modules by rows, structural patches are undone (children concatenated back
//! into the original module), and activation shifts are folded into biases.

mod config;
pub mod tiles;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use safetensors::Dtype;

pub use config::{Config, Patch, PatchKind, Precision, Reason, Split, TargetSpec, TensorLayout};

use super::{e2m1_values, expect_dtype, require};
use super::{Glob, Modules};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::job::{DecodeJob, Dims, Fields, Grid, LowRank, ValueKind, Values};
use crate::numerics::{self, OutDtype};
use crate::output::assembly::{Assembly, BiasSum, BiasTerm, Piece, Stack};
use crate::output::{Output, Source};

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "svdquant",
    producers: "diffuse_compressor",
    bits: &[4],
    modes: &["int4", "fp4"],
};

/// Tensors only a quantized target has; with its `bias` and what the
/// exporter may leave behind (`EXTRAS`), a dense checkpoint drops them.
const QUANT_PARAMS: &[&str] = &[
    "qweight",
    "wscales",
    "wcscales",
    "wtscale",
    "smooth_factor",
    "proj_down",
    "proj_up",
];
const EXTRAS: &[&str] = &[
    "smooth_factor_orig",
    "weight_range_scale",
    "weight_range_zero",
    "weight_range_min",
    "weight_range_max",
];

/// Reads the config of an SVDQuant checkpoint, when it is one: the sidecar,
/// or a shard's metadata naming `svdquant`.
pub fn detect(ckpt: &Checkpoint) -> Result<Option<Config>> {
    let mut meta = None;
    for shard in &ckpt.shards {
        let Some(text) = shard
            .header_metadata()
            .and_then(|m| m.get("quantization_config"))
        else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            Error::new(
                Rule::Config,
                &shard.path,
                "metadata quantization_config is not JSON",
            )
            .caused_by(e)
        })?;
        if v.get("method").and_then(|m| m.as_str()) == Some("svdquant") {
            meta = Some((shard.path.as_path(), v));
            break;
        }
    }
    let side = ckpt.svdquant_config.as_ref();
    if meta.is_none() && side.is_none() {
        return Ok(None);
    }
    Config::parse(
        meta.as_ref().map(|(p, v)| (*p, v)),
        side.map(|f| (f.path.as_path(), &f.value)),
    )
    .map(Some)
}

/// The model dtype: that of the first target's `proj_up` (bf16 by default).
pub fn default_dtype(cfg: &Config, ckpt: &Checkpoint) -> OutDtype {
    cfg.targets
        .iter()
        .find_map(
            |t| match ckpt.get(&format!("{}.proj_up", t.export_name))?.dtype {
                Dtype::F16 => Some(OutDtype::F16),
                Dtype::F32 => Some(OutDtype::F32),
                Dtype::BF16 => Some(OutDtype::Bf16),
                _ => None,
            },
        )
        .unwrap_or(OutDtype::Bf16)
}

fn shape_err(t: &TensorRef<'_>, want: String) -> Error {
    t.error(
        Rule::TensorShape,
        format!("shape {:?}, expected {want}", t.shape),
    )
}

/// A decoded target: its job and, when stored, its bias in logical order.
struct Decoded<'c> {
    job: Arc<DecodeJob<'c>>,
    bias: Option<Arc<[f32]>>,
    shard: usize,
}

/// Builds the job of one target.
fn target_job<'c>(ckpt: &'c Checkpoint, t: &TargetSpec, out: OutDtype) -> Result<Decoded<'c>> {
    let p = t.export_name.as_str();
    let packed = t.tensor_layout == TensorLayout::NunchakuPacked;
    let q = require(ckpt, p, "qweight")?;
    expect_dtype(&q, &[Dtype::I8, Dtype::U8])?;
    let [rows, half] = *q.shape else {
        return Err(shape_err(&q, "[N, K/2]".into()));
    };
    let cols = half * 2;
    if rows == 0 || cols == 0 {
        return Err(shape_err(&q, "a non-empty [N, K/2]".into()));
    }
    let g = t.group_size;
    if cols % g != 0 {
        return Err(q.error(
            Rule::TensorShape,
            format!("{cols} input columns are not a multiple of group_size {g}"),
        ));
    }
    if packed && (rows % 128 != 0 || cols % 128 != 0) {
        return Err(q.error(
            Rule::TensorShape,
            format!(
                "nunchaku_packed needs rows and columns in multiples of 128, not {rows}x{cols}"
            ),
        ));
    }
    let groups = cols / g;

    // Codes, row-major (the packed tile order undone on the host).
    let codes: crate::job::Bytes<'c> = if packed {
        tiles::unpack_qweight(q.data()?, rows, cols).into()
    } else {
        q.into()
    };
    let code_values = match t.precision {
        Precision::Int4 => (0..16)
            .map(|v| if v >= 8 { v as f32 - 16.0 } else { v as f32 })
            .collect(),
        Precision::Fp4 => e2m1_values(),
    };

    // Scales, folded on the host into one f32 per (row, group):
    // wscales · wcscales[row] · wtscale, as the reference multiplies them.
    let ws = require(ckpt, p, "wscales")?;
    let ws_values: Vec<f32> = match t.precision {
        Precision::Int4 => ws.floats()?,
        Precision::Fp4 => {
            expect_dtype(&ws, &[Dtype::F8_E4M3, Dtype::U8])?;
            ws.data()?.iter().map(|&b| numerics::e4m3(b)).collect()
        }
    };
    let stored_groups = match (packed, t.precision) {
        (false, _) => groups,
        (true, Precision::Int4) => groups.div_ceil(2) * 2,
        (true, Precision::Fp4) => groups.div_ceil(4) * 4,
    };
    let ws_ok = if packed {
        ws_values.len() == rows * stored_groups
    } else {
        ws.shape == [groups, rows]
    };
    if !ws_ok {
        return Err(shape_err(
            &ws,
            format!("[{stored_groups}, {rows}] (transposed group scales)"),
        ));
    }
    let vector = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
        let Some(v) = ckpt.get(&format!("{p}.{name}")) else {
            return Ok(None);
        };
        let f = v.floats()?;
        if f.len() != len || v.shape.len() > 1 {
            return Err(shape_err(&v, format!("[{len}]")));
        }
        // Packed vectors use the group-scale tile order with one group.
        Ok(Some(if packed {
            (0..len).map(|i| f[tiles::group_scale(i, 0, 1)]).collect()
        } else {
            f
        }))
    };
    let wc = vector("wcscales", rows)?;
    let wt = match ckpt.get(&format!("{p}.wtscale")) {
        None => None,
        Some(v) => {
            let f = v.floats()?;
            if f.len() != 1 {
                return Err(shape_err(&v, "[1]".into()));
            }
            Some(f[0])
        }
    };
    let mut scale = Vec::with_capacity(rows * groups * 4);
    for n in 0..rows {
        for gi in 0..groups {
            let at = match (packed, t.precision) {
                (false, _) => gi * rows + n,
                (true, Precision::Int4) => tiles::group_scale(n, gi, stored_groups),
                (true, Precision::Fp4) => tiles::micro_scale(n, gi, stored_groups),
            };
            let mut s = ws_values[at];
            if let Some(wc) = &wc {
                s *= wc[n];
            }
            if let Some(wt) = wt {
                s *= wt;
            }
            scale.extend_from_slice(&s.to_le_bytes());
        }
    }

    // The low-rank branch and smoothing.
    let smooth = vector("smooth_factor", cols)?.ok_or_else(|| missing(ckpt, p, "smooth_factor"))?;
    let down_t = require(ckpt, p, "proj_down")?;
    let up_t = require(ckpt, p, "proj_up")?;
    let rank = match (down_t.shape, up_t.shape) {
        ([k, r], [n, r2]) if *k == cols && *n == rows && r == r2 && *r > 0 => *r,
        _ => {
            return Err(up_t.error(
                Rule::TensorShape,
                format!(
                    "proj_down {:?} and proj_up {:?} do not fit [{cols}, r] and [{rows}, r]",
                    down_t.shape, up_t.shape
                ),
            ))
        }
    };
    if packed && rank % 16 != 0 {
        return Err(shape_err(
            &up_t,
            format!("a rank that is a multiple of 16, not {rank}"),
        ));
    }
    let (down_s, up_s) = (down_t.floats()?, up_t.floats()?);
    let (down, up): (Vec<f32>, Vec<f32>) = if packed {
        (
            (0..cols * rank)
                .map(|i| down_s[tiles::proj_down(i / rank, i % rank, rank)])
                .collect(),
            (0..rows * rank)
                .map(|i| up_s[tiles::proj_up(i / rank, i % rank, rank)])
                .collect(),
        )
    } else {
        (down_s, up_s)
    };
    let dims = Dims {
        slices: 1,
        rows,
        cols,
    };
    let scale = Values {
        data: scale.into(),
        kind: ValueKind::F32,
        grid: Grid {
            row_div: 1,
            col_div: g,
            row_stride: groups,
            slice_stride: 0,
        },
    };
    let low_rank = LowRank {
        period: 1,
        row_div: 1,
        rank,
        up: up.into(),
        down: down.into(),
        inv_smooth: smooth.iter().map(|s| 1.0 / s).collect(),
        smooth_first: packed,
            in_product: false,
    };
    let job = DecodeJob::new(
        dims,
        Fields::dense(codes, 4, half as u64 * 8),
        code_values,
        out,
    )
    .with_scale(scale)
    .with_low_rank(low_rank);
    Ok(Decoded {
        job: Arc::new(job),
        bias: vector("bias", rows)?.map(Into::into),
        shard: q.shard,
    })
}

fn missing(ckpt: &Checkpoint, prefix: &str, param: &str) -> Error {
    super::missing(ckpt, format!("{prefix}.{param}"), format!("target {prefix} has no {param}"))
}

/// A module of the dense model being put back together.
struct Node<'c> {
    weight: Stack<Piece<'c>>,
    cols: usize,
    /// Terms of the bias; `None` when nothing gives the module a bias.
    bias: Option<Stack<BiasTerm<'c>>>,
    conv: bool,
    shard: usize,
    scheme: String,
}

/// Rows of each module of a fused target.
fn module_rows(t: &TargetSpec, rows: usize, ckpt: &Checkpoint) -> Result<Vec<usize>> {
    let m = t.modules.len();
    if !t.outer_scale_splits.is_empty() {
        let sum = t
            .outer_scale_splits
            .iter()
            .try_fold(0usize, |a, &s| a.checked_add(s));
        if t.outer_scale_splits.len() == m && sum == Some(rows) {
            return Ok(t.outer_scale_splits.clone());
        }
        return Err(Error::tensor(
            Rule::Config,
            ckpt.display_path(),
            format!("{}.qweight", t.export_name),
            format!(
                "weight_layout.outer_scale_splits {:?} do not split {rows} rows among {m} modules",
                t.outer_scale_splits
            ),
        ));
    }
    if !rows.is_multiple_of(m) {
        return Err(Error::tensor(
            Rule::Config,
            ckpt.display_path(),
            format!("{}.qweight", t.export_name),
            format!("{rows} rows cannot be split evenly among {m} modules and the config records no split"),
        ));
    }
    Ok(vec![rows / m; m])
}

/// `pattern` matches `name` segment by dotted segment (a `*` stays inside
/// one), each segment a shell glob.
fn segment_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), name.split('.').collect());
    p.len() == n.len() && p.iter().zip(&n).all(|(p, n)| Glob::new(p).matches(n))
}

/// The sizes `splits` give along an axis of `total`, with the remainder as
/// a final split and empty splits dropped (diffuse_compressor's rule).
fn resolve_splits(
    splits: &[Split],
    total: usize,
    other: usize,
    kind: PatchKind,
) -> Option<Vec<usize>> {
    let mut sizes = Vec::new();
    for s in splits {
        sizes.push(match s {
            Split::Size(n) => *n,
            // The split axis is inputs for split_linear/split_conv, outputs otherwise.
            Split::Named(n) => {
                let along_inputs = kind != PatchKind::LinearOutput;
                let is_input = n.starts_with("in_");
                if is_input == along_inputs {
                    total
                } else {
                    other
                }
            }
        });
    }
    let used = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s))?;
    if used > total {
        return None;
    }
    if used < total {
        sizes.push(total - used);
    }
    sizes.retain(|&s| s > 0);
    Some(sizes)
}

/// Undoes one patch on `nodes`: every group of children `<P>.linears.<i>`
/// (or `.convs.<i>`) with `P` matching becomes module `P`.
fn undo_patch<'c>(
    patch: &Patch,
    index: usize,
    nodes: &mut BTreeMap<String, Node<'c>>,
    cfg: &Config,
) -> Result<usize> {
    let err = |detail: String| {
        Error::new(
            Rule::Config,
            &cfg.path,
            format!(
                "structural_patches[{index}] ({} {}): {detail}",
                patch.module,
                patch.kind.name()
            ),
        )
    };
    let infix = format!(".{}.", patch.kind.children());
    let mut groups: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
    for name in nodes.keys() {
        let Some(pos) = name.rfind(&infix) else {
            continue;
        };
        let (parent, i) = (&name[..pos], &name[pos + infix.len()..]);
        let Ok(i) = i.parse::<usize>() else { continue };
        if segment_match(&patch.module, parent) {
            groups
                .entry(parent.to_string())
                .or_default()
                .push((i, name.clone()));
        }
    }
    let undone = groups.len();
    for (parent, mut children) in groups {
        children.sort();
        if children.iter().enumerate().any(|(k, (i, _))| *i != k) {
            let got: Vec<usize> = children.iter().map(|(i, _)| *i).collect();
            return Err(err(format!(
                "children of {parent} are numbered {got:?}, not 0, 1, …"
            )));
        }
        if nodes.contains_key(&parent) {
            return Err(err(format!("{parent} exists both whole and split")));
        }
        let kids: Vec<Node<'c>> = children
            .iter()
            .filter_map(|(_, n)| nodes.remove(n))
            .collect();
        let rows: Vec<usize> = kids.iter().map(|k| k.weight.rows()).collect();
        let cols: Vec<usize> = kids.iter().map(|k| k.cols).collect();
        let by_rows = patch.kind == PatchKind::LinearOutput;
        let (sizes, total, other) = if by_rows {
            (rows.clone(), rows.iter().sum(), cols[0])
        } else {
            (cols.clone(), cols.iter().sum(), rows[0])
        };
        let want = resolve_splits(&patch.splits, total, other, patch.kind);
        if want.as_deref() != Some(sizes.as_slice()) {
            return Err(err(format!(
                "splits {:?} of {parent} give {want:?}, but its children have {} {sizes:?}",
                patch.splits,
                if by_rows { "rows" } else { "columns" }
            )));
        }
        let shard = kids[0].shard;
        let conv = patch.kind == PatchKind::Conv;
        let scheme = kids[0].scheme.clone();
        let any_bias = kids.iter().any(|k| k.bias.is_some());
        let node = if by_rows {
            if cols.iter().any(|&c| c != cols[0]) {
                return Err(err(format!(
                    "children of {parent} have different input widths {cols:?}"
                )));
            }
            let bias = any_bias.then(|| {
                Stack::vcat(
                    kids.iter()
                        .map(|k| {
                            k.bias
                                .clone()
                                .unwrap_or_else(|| Stack::band(k.weight.rows(), Vec::new()))
                        })
                        .collect(),
                )
            });
            Node {
                weight: Stack::vcat(kids.iter().map(|k| k.weight.clone()).collect()),
                cols: cols[0],
                bias,
                conv,
                shard,
                scheme,
            }
        } else {
            let weight =
                Stack::hcat(kids.iter().map(|k| k.weight.clone()).collect()).ok_or_else(|| {
                    err(format!(
                        "children of {parent} have different output rows {rows:?}"
                    ))
                })?;
            // Outputs add up, so do the children's bias terms (only the last
            // child stores a bias; shifted children add their corrections).
            let bias = if any_bias {
                Stack::hcat(kids.iter().filter_map(|k| k.bias.clone()).collect())
            } else {
                None
            };
            Node {
                weight,
                cols: total,
                bias,
                conv,
                shard,
                scheme,
            }
        };
        nodes.insert(parent, node);
    }
    Ok(undone)
}

/// The dense modules of an SVDQuant checkpoint: the original model's.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, out: OutDtype) -> Modules<'c> {
    let mut found = Modules::default();
    if let Err(e) = plan_all(cfg, ckpt, out, &mut found) {
        found.errors.push(e);
    }
    found
}

fn plan_all<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    out: OutDtype,
    found: &mut Modules<'c>,
) -> Result<()> {
    let mut nodes: BTreeMap<String, Node<'c>> = BTreeMap::new();
    let mut shifted: HashSet<&str> = HashSet::new();
    for t in &cfg.targets {
        for param in QUANT_PARAMS.iter().chain(&["bias"]).chain(EXTRAS) {
            let name = format!("{}.{param}", t.export_name);
            if ckpt.get(&name).is_some() {
                found.consumed.insert(name);
            }
        }
        let d = match target_job(ckpt, t, out) {
            Ok(d) => d,
            Err(e) => {
                found.errors.push(e);
                continue;
            }
        };
        let rows = d.job.dims.rows;
        let split = match module_rows(t, rows, ckpt) {
            Ok(s) => s,
            Err(e) => {
                found.errors.push(e);
                continue;
            }
        };
        let scheme = format!(
            "svdquant {} g{} rank {} {}",
            match t.precision {
                Precision::Int4 => "int4",
                Precision::Fp4 => "fp4 e4m3",
            },
            t.group_size,
            d.job.low_rank.as_ref().map_or(0, |l| l.rank),
            t.tensor_layout.name()
        );
        let mut top = 0;
        for (module, &n) in t.modules.iter().zip(&split) {
            let piece = Piece {
                job: d.job.clone(),
                row: top,
            };
            let shift = cfg
                .activation_shifts
                .get(module)
                .or_else(|| cfg.activation_shifts.get(&t.name));
            let mut terms = Vec::new();
            if let Some(b) = &d.bias {
                terms.push(BiasTerm::Stored {
                    values: b.clone(),
                    at: top,
                });
            }
            if let Some(&s) = shift {
                shifted.insert(if cfg.activation_shifts.contains_key(module) {
                    module.as_str()
                } else {
                    t.name.as_str()
                });
                terms.push(BiasTerm::Shift {
                    piece: piece.clone(),
                    shift: s,
                });
            }
            let node = Node {
                weight: Stack::band(n, vec![piece]),
                cols: d.job.dims.cols,
                bias: (!terms.is_empty()).then(|| Stack::band(n, terms)),
                conv: false,
                shard: d.shard,
                scheme: scheme.clone(),
            };
            if nodes.insert(module.clone(), node).is_some() {
                return Err(Error::new(
                    Rule::Config,
                    &cfg.path,
                    format!("module {module} is produced by two targets"),
                ));
            }
            top += n;
        }
    }
    if !found.errors.is_empty() {
        return Ok(());
    }
    if let Some(m) = cfg
        .activation_shifts
        .keys()
        .find(|m| !shifted.contains(m.as_str()))
    {
        return Err(Error::new(
            Rule::Config,
            &cfg.path,
            format!("calibration.activation_shifts names {m}, which no target produces"),
        ));
    }
    // Patches were applied in order; undo them last to first.
    for (i, patch) in cfg.patches.iter().enumerate().rev() {
        if undo_patch(patch, i, &mut nodes, cfg)? == 0 {
            found.warnings.push(crate::error::Warning::new(
                Rule::Config,
                format!("structural_patches[{i}]"),
                format!("{} matches no exported module; nothing to undo", patch.module),
            ));
        }
    }
    for (name, node) in nodes {
        for suffix in ["weight", "bias"] {
            let full = format!("{name}.{suffix}");
            if ckpt.get(&full).is_some() && !found.consumed.contains(&full) {
                return Err(Error::tensor(
                    Rule::Config,
                    ckpt.display_path(),
                    full,
                    "stored in the checkpoint and also reconstructed from a target",
                ));
            }
        }
        let rows = node.weight.rows();
        let mut shape = vec![rows, node.cols];
        if node.conv {
            shape.extend([1, 1]);
        }
        found.outputs.push(Output {
            name: format!("{name}.weight"),
            shard: node.shard,
            shape,
            dtype: out.safetensors(),
            source: Source::Assemble(Assembly {
                stack: node.weight,
                cols: node.cols,
                out,
                interleaved: false,
            }),
            scheme: Some(node.scheme.clone()),
        });
        if let Some(bias) = node.bias {
            found.outputs.push(Output {
                name: format!("{name}.bias"),
                shard: node.shard,
                shape: vec![rows],
                dtype: out.safetensors(),
                source: Source::Bias(BiasSum { stack: bias, out }),
                scheme: Some("svdquant bias".into()),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_one_segment_per_star() {
        assert!(segment_match("blocks.*.proj_out", "blocks.12.proj_out"));
        assert!(!segment_match("blocks.*.proj_out", "blocks.1.2.proj_out"));
        assert!(segment_match("blocks.*_x.y", "blocks.a_x.y"));
        assert!(!segment_match("blocks.*", "blocks"));
    }

    #[test]
    fn splits_resolve_with_remainder() {
        let named = |s: &str| Split::Named(s.into());
        // proj_out [128 out, 384 in] split by input at out_features.
        assert_eq!(
            resolve_splits(&[named("out_features")], 384, 128, PatchKind::Linear),
            Some(vec![128, 256])
        );
        assert_eq!(
            resolve_splits(&[Split::Size(128)], 384, 128, PatchKind::LinearOutput),
            Some(vec![128, 256])
        );
        assert_eq!(
            resolve_splits(
                &[Split::Size(100), Split::Size(28)],
                128,
                9,
                PatchKind::LinearOutput
            ),
            Some(vec![100, 28])
        );
        assert_eq!(
            resolve_splits(&[Split::Size(500)], 384, 1, PatchKind::Linear),
            None
        );
        assert_eq!(
            resolve_splits(
                &[named("in_channels"), Split::Size(0)],
                64,
                8,
                PatchKind::Conv
            ),
            Some(vec![64])
        );
    }
}
