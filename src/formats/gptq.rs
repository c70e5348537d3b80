//! GPTQ checkpoints (`quant_method: "gptq"`: GPTQModel, AutoGPTQ, optimum)
//! and AutoRound's integer exports (`quant_method: "auto-round"`), whose
//! `packing_format` names the layout: `auto_round:auto_gptq` (this GPTQ
//! layout, zero points stored `z − 1`), `auto_round` (the same layout, zero
//! points stored as they are: AutoRound's asymmetric default),
//! `auto_round:gptqmodel` (the same with `g_idx`: GPTQModel's v2) and
//! `auto_round:auto_awq` (AutoAWQ's GEMM layout: the AWQ format's job).
//! AutoRound's `extra_config` gives modules their own scheme or leaves them
//! dense (module gptq_dynamic). AutoRound's FP exports
//! (`auto_round:llm_compressor`: NVFP4, MXFP4, MXFP8;
//! `auto_round:llm_compressor_nvfp4_e5m3`: NVFP4 with E5M3 scales) store
//! compressed-tensors-style tensors and map onto the FP4 / FP8 jobs
//! (`fp_job`); their `extra_config` gives each module its own FP layout
//! (`Config::fp_module`) or leaves it dense.
//!
//! A quantized Linear `m` with `b`-bit codes (2, 3, 4 or 8; AutoRound also
//! 5, 6 and 7), `in` inputs,
//! `out` outputs and `G` groups stores:
//!
//! | tensor | dtype | shape | holds |
//! |---|---|---|---|
//! | `qweight` | int32 | `[in·b/32, out]` | codes q, packed down the input rows |
//! | `qzeros` | int32 | `[G, out·b/32]` | zero points, packed across the output columns |
//! | `scales` | f16 | `[G, out]` | one scale per group and output |
//! | `g_idx` | int32 | `[in]` | the group of each input row (in AutoRound's exports only with `auto_round:gptqmodel` packing) |
//!
//! Fields are LSB first: bits `[b·k, b·k+b)` of `qweight[r, j]` hold input
//! row `r·32/b + k` of output j; of `qzeros[g, c]`, output `c·32/b + k`. At 3
//! bits each run of three words is one little-endian 96-bit stream of 32
//! codes; at 5, 6 and 7 bits (AutoRound's `auto_round.utils.bit_packing`)
//! each run of `b` words one `32·b`-bit stream of 32 codes, fields
//! straddling words the same way: the whole column is one dense stream. The value is `(q − z[g]) · s[g]` with `g = g_idx[i]` (as stored:
//! with `desc_act` it is not monotone), else `i div group_size`, written
//! `[out, in]`.
//!
//! Version 1 files (`checkpoint_format`/`format` `"gptq"`, or none) store
//! `z − 1`. The runtime transformers runs (GPTQModel's
//! `convert_gptq_v1_to_v2_format_module`) adds the 1 back before decoding;
//! so does this module, the same way: at 2, 4 and 8 bits one wrapping 32-bit
//! addition of `0x55555555`, `0x11111111`, `0x01010101` to each packed word
//! (carries run into the next field, undoing the borrow of GPTQModel's
//! writer for a true zero point of 0); at 3 bits field by field, each
//! `(z + 1) mod 8` on its own. `gptq_v2` files store `z`. AutoRound's
//! `auto_round:auto_gptq` packing stores `clamp(z − 1, 0, 2^b − 1)` field by
//! field and its own dequantizer (`qlinear_torch_zp`) adds 1 to each field,
//! unwrapped (a stored all-ones field reads as `2^b`): so does this module
//! for that packing. The two readings agree on every field AutoRound
//! writes (its zero points are at most `2^b − 1`, stored at most `2^b − 2`);
//! a true zero point of 0 is stored as 0 and read back as 1 by both
//! AutoRound and this tool.
//!
//! The job is built in output orientation, untransposed: lane j (output row)
//! is word column j of `qweight`, a lane's words `out` words apart, so the
//! dense field stream of a lane is the column read down the rows (3-bit
//! fields cross words the same way). Scales and zero points, `G·out` entries
//! each, are rearranged on the host to `[out, G]` (the zero points unpacked
//! to integers) and read on the row/group grid.

use std::path::PathBuf;

use safetensors::Dtype;
use serde_json::Value;

use super::gptq_dynamic::{self, DynamicRule};
use super::{
    byte_table, check_extent, decoded_output, e2m1_values, expect_dtype, expect_shape, float_kind,
    fp4_codes, fp8_job,
    grid_values, matrix_dims, modules_with, only_setting, plan_each, require, scalar_f32, Modules,
    QuantConfig, ScaleLayout,
};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule, Warning};
use crate::job::{Bytes, DecodeJob, Dims, Fields, Grid, ValueKind, Values, ZeroPoint};
use crate::numerics::{self, OutDtype};
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "gptq",
    producers: "GPTQModel, AutoGPTQ, AutoRound",
    bits: &AUTOROUND_BITS,
    modes: &[
        "gptq (v1)",
        "gptq_v2",
        "auto-round (auto_gptq, auto_round, gptqmodel, auto_awq packing; llm_compressor NVFP4, MXFP4, MXFP8, NVFP4 E5M3)",
    ],
};

/// The code widths GPTQ packs this way.
pub const BITS: [u32; 4] = [2, 3, 4, 8];

/// The code widths AutoRound's GPTQ-style packings write: GPTQ's, and 5, 6
/// and 7 in the same bit stream (`auto_round.utils.bit_packing`: blocks of
/// 32 fields, `b` words each, fields straddling words).
pub const AUTOROUND_BITS: [u32; 7] = [2, 3, 4, 5, 6, 7, 8];

/// How `dynamic` (or `extra_config`) decides a module.
enum Resolved<'r> {
    /// No rule matches: the base scheme.
    Base,
    /// A `-:` rule (or an entry that leaves it dense): stored dense.
    Dense,
    /// This rule's overrides of the base scheme.
    By(&'r DynamicRule),
}

/// Who wrote the checkpoint (they share the tensor layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Producer {
    /// `quant_method: "gptq"`.
    Gptq,
    /// `quant_method: "auto-round"` (`auto_round:auto_gptq`, `auto_round`
    /// or `auto_round:auto_awq` packing).
    AutoRound,
}

/// How the codes are packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Packing {
    /// GPTQ's layout (`qweight` `[in·b/32, out]`).
    Gptq,
    /// AutoRound's `auto_round:gptqmodel`: GPTQ's layout with `g_idx`, zero
    /// points stored as they are (GPTQModel's v2; `qlinear_torch` built
    /// with `g_idx`).
    GptqModel,
    /// AutoAWQ's GEMM layout (`qweight` `[in, out/8]`), AutoRound's
    /// `auto_round:auto_awq`.
    Awq,
    /// AutoRound's NVFP4 (`data_type: "nv_fp"`, packing
    /// `auto_round:llm_compressor`): `weight_packed` E2M1 nibbles,
    /// `weight_scale` E4M3 per 16 columns, `weight_global_scale` f32.
    Nvfp4,
    /// AutoRound's MXFP4 (`data_type: "mx_fp"`, 4 bits): `weight_packed`
    /// E2M1 nibbles, `weight_scale` E8M0 per 32 columns.
    Mxfp4,
    /// AutoRound's MXFP8 (`data_type: "mx_fp"`, 8 bits): `weight` E4M3,
    /// `weight_scale` E8M0 per 32 columns.
    Mxfp8,
    /// AutoRound's NVFP4 with E5M3 scales (`data_type: "nvfp4_v2"`, packing
    /// `auto_round:llm_compressor_nvfp4_e5m3`): `weight_packed` E2M1
    /// nibbles, `weight_scale` unsigned E5M3 bytes per 16 columns, no
    /// global scale.
    Nvfp4E5m3,
}

/// A GPTQ quantization config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// Who wrote it.
    pub producer: Producer,
    /// Bits per code.
    pub bits: u32,
    /// Input rows per group; `None` (-1): one group.
    pub group_size: Option<usize>,
    /// Activation order (`g_idx` permuted).
    pub desc_act: bool,
    /// Symmetric: the zero point is the middle code.
    pub sym: bool,
    /// Zero points stored as `z − 1` (GPTQ v1, AutoRound's auto_gptq packing).
    pub v1: bool,
    /// The code layout.
    pub packing: Packing,
    /// `meta.quantizer` (who quantized, with versions).
    pub quantizer: Vec<String>,
    /// GPTQModel's `dynamic` rules, in the file's order, or AutoRound's
    /// `extra_config` entries, exact names first (applied by `for_module`).
    #[serde(skip)]
    pub(crate) dynamic: Vec<DynamicRule>,
    /// AutoRound's `block_name_to_quantize` prefixes, where it names them.
    #[serde(skip)]
    blocks: Option<Vec<String>>,
    /// AutoRound's base `data_type` (lowercase; FP exports' per-module
    /// schemes start from it).
    #[serde(skip)]
    data_type: String,
    /// AutoRound's `auto_round:llm_compressor_nvfp4_e5m3` packing.
    #[serde(skip)]
    e5m3_packing: bool,
}

#[derive(serde::Deserialize)]
struct Raw {
    bits: Option<u32>,
    group_size: Option<i64>,
    desc_act: Option<bool>,
    sym: Option<bool>,
    checkpoint_format: Option<String>,
    format: Option<String>,
    packing_format: Option<String>,
    data_type: Option<String>,
    pack_dtype: Option<String>,
    dynamic: Option<Value>,
    extra_config: Option<Value>,
    block_name_to_quantize: Option<Value>,
    meta: Option<Value>,
}

/// AutoRound's FP export (`packing_format: "auto_round:llm_compressor"`):
/// NVFP4 (`data_type: "nv_fp"`, 4 bits, group 16), MXFP4 and MXFP8
/// (`mx_fp`, 4 or 8 bits, group 32); `e5m3_packing`: packing
/// `auto_round:llm_compressor_nvfp4_e5m3`, NVFP4 with E5M3 scales
/// (`nvfp4_v2`), which the data type must agree with.
/// The activation settings (`act_bits` 4, `input_global_scale`) belong to
/// the activations, which a dense checkpoint does not quantize.
fn fp_config(q: &QuantConfig<'_>, raw: &Raw, e5m3_packing: bool) -> Result<Config> {
    let path = q.path;
    let unsupported = |what: String| Err(Error::new(Rule::Unsupported, path, what));
    let data_type = raw.data_type.as_deref().unwrap_or("int").to_ascii_lowercase();
    let bits = raw.bits.unwrap_or(4);
    let group_size = super::group_size(raw.group_size, path)?;
    let packing = fp_packing(
        path,
        "",
        &data_type,
        bits,
        group_size,
        raw.sym.unwrap_or(true),
        e5m3_packing,
    )?;
    if is_set(&raw.dynamic) {
        return unsupported("`dynamic` in an AutoRound FP (llm_compressor packing) config is not decoded".into());
    }
    if let Some(v) = ["super_bits", "super_group_size", "rotation_config"]
        .iter()
        .find_map(|k| q.value.get(*k).filter(|v| !v.is_null()).map(|v| (*k, v)))
    {
        return unsupported(format!("AutoRound config gives {} {}, which is not decoded", v.0, v.1));
    }
    let blocks = autoround_blocks(raw, path)?;
    let mut cfg = Config {
        path: path.to_path_buf(),
        producer: Producer::AutoRound,
        bits,
        group_size,
        desc_act: false,
        sym: true,
        v1: false,
        packing,
        quantizer: Vec::new(),
        dynamic: Vec::new(),
        blocks,
        data_type,
        e5m3_packing,
    };
    if let Some(e) = raw.extra_config.as_ref().filter(|_| is_set(&raw.extra_config)) {
        // Stored modules: an FP Linear keeps `weight_scale` (and
        // `weight_packed`, or an FP8 `weight`), a dense one `weight`.
        let mut modules = modules_with(q.ckpt, "weight_scale");
        modules.extend(modules_with(q.ckpt, "weight_packed"));
        modules.extend(modules_with(q.ckpt, "weight"));
        cfg.dynamic =
            gptq_dynamic::parse_extra_config(path, e, &modules, cfg.blocks.as_deref(), true)?;
        // Every entry's scheme, checked whatever it matches.
        for r in cfg.dynamic.iter().filter(|r| !r.dense) {
            cfg.fp_rule_packing(r)?;
        }
    }
    Ok(cfg)
}

/// The FP layout of a scheme in AutoRound's FP exports; `key`: the
/// `extra_config` entry it comes from ("" for the base config).
fn fp_packing(
    path: &std::path::Path,
    key: &str,
    data_type: &str,
    bits: u32,
    group_size: Option<usize>,
    sym: bool,
    e5m3_packing: bool,
) -> Result<Packing> {
    let at = if key.is_empty() {
        String::new()
    } else {
        format!("extra_config {key:?}: ")
    };
    let unsupported = |what: String| Err(Error::new(Rule::Unsupported, path, format!("{at}{what}")));
    if e5m3_packing != (data_type == "nvfp4_v2") {
        return Err(Error::new(
            Rule::Config,
            path,
            format!(
                "{at}packing_format {:?} and data_type {data_type:?} disagree (nvfp4_v2 is packed auto_round:llm_compressor_nvfp4_e5m3)",
                if e5m3_packing { "auto_round:llm_compressor_nvfp4_e5m3" } else { "auto_round:llm_compressor" }
            ),
        ));
    }
    let (packing, group) = match (data_type, bits) {
        ("nv_fp" | "nv_fp4", 4) => (Packing::Nvfp4, NVFP4_GROUP),
        ("nvfp4_v2", 4) => (Packing::Nvfp4E5m3, NVFP4_GROUP),
        ("mx_fp" | "mx_fp4", 4) => (Packing::Mxfp4, MX_GROUP),
        ("mx_fp" | "mx_fp8" | "mx_fp8e4m3", 8) => (Packing::Mxfp8, MX_GROUP),
        (t @ ("nv_fp" | "nv_fp4" | "nvfp4_v2" | "mx_fp" | "mx_fp4" | "mx_fp8" | "mx_fp8e4m3"), b) => {
            return unsupported(format!(
                "AutoRound data_type {t:?} at {b} bits is not decoded (only nv_fp and nvfp4_v2 at 4 bits, mx_fp at 4 and 8)"
            ))
        }
        ("int", b) if !key.is_empty() => {
            return unsupported(format!(
                "an int{b} module in AutoRound's FP export (its IntQuantLinear packing) is not decoded"
            ))
        }
        (other, _) => {
            return unsupported(format!(
                "AutoRound data_type {other:?} in packing auto_round:llm_compressor is not decoded (only nv_fp NVFP4, nvfp4_v2 and mx_fp MXFP4/MXFP8)"
            ))
        }
    };
    if group_size != Some(group) {
        return unsupported(format!(
            "AutoRound {data_type} group_size {} is not decoded ({data_type} scales groups of {group})",
            group_size.map_or(-1, |g| g as i64)
        ));
    }
    if !sym {
        return unsupported(format!(
            "AutoRound {data_type} with sym false is not decoded (FP codes have no zero point)"
        ));
    }
    Ok(packing)
}

/// AutoRound's `block_name_to_quantize` prefixes (a comma-separated
/// string or a list), where it names them.
fn autoround_blocks(raw: &Raw, path: &std::path::Path) -> Result<Option<Vec<String>>> {
    Ok(match &raw.block_name_to_quantize {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(
                s.split(',')
                    .map(|b| b.trim().to_string())
                    .filter(|b| !b.is_empty())
                    .collect(),
            ),
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|v| {
                        v.as_str().map(str::to_string).ok_or_else(|| {
                            Error::new(
                                Rule::Config,
                                path,
                                format!("block_name_to_quantize entry {v} is not a string"),
                            )
                        })
                    })
                    .collect::<Result<Vec<String>>>()?,
            ),
            Some(v) => {
                return Err(Error::new(
                    Rule::Config,
                    path,
                    format!("block_name_to_quantize {v} is not a string or a list of strings"),
                ))
            }
        })
}

/// Columns per NVFP4 scale.
const NVFP4_GROUP: usize = 16;

/// Columns per MX scale (the MX block).
const MX_GROUP: usize = 32;

/// Whether a config value is set to something (not absent, null or empty).
fn is_set(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

impl Config {
    /// Reads config.json's `quantization_config` of a `quant_method:
    /// "gptq"` checkpoint, or of AutoRound's (`"auto-round"`).
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let producer = match q.method {
            "gptq" => Producer::Gptq,
            _ => Producer::AutoRound,
        };
        let path = q.path;
        let raw: Raw = q.read()?;
        let unsupported = |what: String| Err(Error::new(Rule::Unsupported, path, what));
        let v1 = match producer {
            Producer::Gptq => {
                let named = |f: &Option<String>| f.as_deref().map(str::to_ascii_lowercase);
                let format = match (named(&raw.checkpoint_format), named(&raw.format)) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(Error::new(
                            Rule::Config,
                            path,
                            format!("checkpoint_format {a:?} and format {b:?} disagree"),
                        ))
                    }
                    (a, b) => a.or(b).unwrap_or_else(|| "gptq".into()),
                };
                match format.as_str() {
                    "gptq" => true,
                    "gptq_v2" => false,
                    "marlin" | "bitblas" | "qqq" | "gptq_p" => {
                        return unsupported(format!(
                            "GPTQ checkpoint_format {format:?} is a kernel-specific layout, not decoded (only gptq and gptq_v2)"
                        ))
                    }
                    other => {
                        return unsupported(format!(
                            "GPTQ checkpoint_format {other:?} is not decoded (only gptq and gptq_v2)"
                        ))
                    }
                }
            }
            Producer::AutoRound => {
                // AutoRound's loader reads a config without the key as
                // auto_gptq packing.
                let packing = raw
                    .packing_format
                    .as_deref()
                    .unwrap_or("auto_round:auto_gptq")
                    .to_ascii_lowercase();
                match packing.as_str() {
                    // qlinear_torch_zp: zero points stored z − 1.
                    "auto_round:auto_gptq" => true,
                    // qlinear_torch: zero points as they are.
                    "auto_round" => false,
                    // qlinear_torch with g_idx: zero points as they are.
                    "auto_round:gptqmodel" => false,
                    "auto_round:auto_awq" => false,
                    "auto_round:llm_compressor" => return fp_config(q, &raw, false),
                    "auto_round:llm_compressor_nvfp4_e5m3" => return fp_config(q, &raw, true),
                    other => {
                        return unsupported(format!(
                            "AutoRound packing_format {other:?} is not decoded (only auto_round:auto_gptq, auto_round, auto_round:gptqmodel, auto_round:auto_awq, auto_round:llm_compressor and auto_round:llm_compressor_nvfp4_e5m3)"
                        ))
                    }
                }
            }
        };
        let packing = match raw.packing_format.as_deref() {
            Some(p) if producer == Producer::AutoRound && p.eq_ignore_ascii_case("auto_round:auto_awq") => {
                Packing::Awq
            }
            Some(p) if producer == Producer::AutoRound && p.eq_ignore_ascii_case("auto_round:gptqmodel") => {
                Packing::GptqModel
            }
            _ => Packing::Gptq,
        };
        if producer == Producer::AutoRound {
            if let Value::Object(o) = q.value {
                gptq_dynamic::autoround_scheme(o)
                    .map_err(|e| Error::new(Rule::Unsupported, path, format!("AutoRound config {e}")))?;
            }
        }
        let blocks = match producer {
            Producer::Gptq => None,
            Producer::AutoRound => autoround_blocks(&raw, path)?,
        };
        let dynamic = match producer {
            Producer::Gptq => {
                if is_set(&raw.extra_config) {
                    return unsupported(
                        "`extra_config` in a GPTQ config is not decoded (GPTQModel's per-module schemes are `dynamic`)"
                            .into(),
                    );
                }
                match &raw.dynamic {
                    Some(d) if is_set(&raw.dynamic) => gptq_dynamic::parse(path, d)?,
                    _ => Vec::new(),
                }
            }
            Producer::AutoRound => {
                if is_set(&raw.dynamic) {
                    return unsupported("`dynamic` in an AutoRound config is not decoded".into());
                }
                match &raw.extra_config {
                    Some(e) if is_set(&raw.extra_config) => {
                        // Stored modules: a Linear keeps `weight` or `qweight`.
                        let mut modules = modules_with(q.ckpt, "qweight");
                        modules.extend(modules_with(q.ckpt, "weight"));
                        gptq_dynamic::parse_extra_config(path, e, &modules, blocks.as_deref(), false)?
                    }
                    _ => Vec::new(),
                }
            }
        };
        only_setting(path, "GPTQ pack_dtype", raw.pack_dtype.as_deref(), "int32")?;
        let bits = raw.bits.unwrap_or(4);
        match producer {
            Producer::Gptq if !BITS.contains(&bits) => {
                return unsupported(format!(
                    "GPTQ bits {bits} is not decoded (only 2, 3, 4 and 8)"
                ))
            }
            Producer::AutoRound if !AUTOROUND_BITS.contains(&bits) => {
                return unsupported(format!(
                    "AutoRound bits {bits} is not decoded (only 2 to 8)"
                ))
            }
            _ => {}
        }
        let group_size = super::group_size(raw.group_size, path)?;
        let quantizer = match raw.meta.as_ref().and_then(|m| m.get("quantizer")) {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        Ok(Config {
            path: path.to_path_buf(),
            producer,
            bits,
            group_size,
            desc_act: raw.desc_act.unwrap_or(false),
            sym: raw.sym.unwrap_or(true),
            v1,
            packing,
            quantizer,
            dynamic,
            blocks,
            data_type: raw.data_type.as_deref().unwrap_or("int").to_ascii_lowercase(),
            e5m3_packing: false,
        })
    }

    /// Whether `module` is inside AutoRound's quantized blocks (always when
    /// the config names none, and for GPTQModel).
    fn in_block(&self, module: &str) -> bool {
        self.blocks
            .as_ref()
            .is_none_or(|b| b.iter().any(|p| module.starts_with(p.as_str())))
    }

    /// The rule of `dynamic` (or `extra_config`) that decides `module`.
    fn rule(&self, module: &str) -> Result<Resolved<'_>> {
        let in_block = self.in_block(module);
        Ok(
            match gptq_dynamic::decide(&self.dynamic, &self.path, module, in_block)? {
                None => Resolved::Base,
                Some(rule) if rule.dense => Resolved::Dense,
                Some(rule) => Resolved::By(rule),
            },
        )
    }

    /// The base scheme, for a module no rule matches.
    fn base(&self) -> Config {
        Config {
            dynamic: Vec::new(),
            ..self.clone()
        }
    }

    /// The scheme of `module` once `dynamic` is applied: the first rule
    /// that matches overrides the base settings; `None` when it is a `-:`
    /// rule (the module is stored dense).
    pub(crate) fn for_module(&self, module: &str) -> Result<Option<Config>> {
        let rule = match self.rule(module)? {
            Resolved::Dense => return Ok(None),
            Resolved::Base => return Ok(Some(self.base())),
            Resolved::By(rule) => rule,
        };
        Ok(Some(Config {
            bits: rule.bits.unwrap_or(self.bits),
            group_size: rule.group_size.unwrap_or(self.group_size),
            desc_act: rule.desc_act.unwrap_or(self.desc_act),
            sym: rule.sym.unwrap_or(self.sym),
            dynamic: Vec::new(),
            ..self.clone()
        }))
    }

    /// The FP layout an FP export's `extra_config` entry gives (its
    /// settings over the base config's).
    fn fp_rule_packing(&self, r: &DynamicRule) -> Result<Packing> {
        fp_packing(
            &self.path,
            &r.key,
            r.data_type.as_deref().unwrap_or(&self.data_type),
            r.bits.unwrap_or(self.bits),
            r.group_size.unwrap_or(self.group_size),
            r.sym.unwrap_or(self.sym),
            self.e5m3_packing,
        )
    }

    /// An FP export's scheme of `module` once `extra_config` is applied;
    /// `None`: the entry leaves it dense.
    fn fp_module(&self, module: &str) -> Result<Option<Config>> {
        let rule = match self.rule(module)? {
            Resolved::Dense => return Ok(None),
            Resolved::Base => return Ok(Some(self.base())),
            Resolved::By(rule) => rule,
        };
        Ok(Some(Config {
            packing: self.fp_rule_packing(rule)?,
            bits: rule.bits.unwrap_or(self.bits),
            group_size: rule.group_size.unwrap_or(self.group_size),
            data_type: rule.data_type.clone().unwrap_or_else(|| self.data_type.clone()),
            dynamic: Vec::new(),
            ..self.clone()
        }))
    }

    /// `inspect`'s lines: zero-point convention, activation order, quantizer.
    pub fn report_lines(&self) -> Vec<String> {
        let zeros = match (self.packing, self.v1) {
            (Packing::Awq, _) => "zero points AWQ-packed (stored z)",
            (_, true) => "zero points v1 (stored z - 1)",
            (_, false) => "zero points v2 (stored z)",
        };
        let mut lines = vec![zeros.to_string(), format!("desc_act {}", self.desc_act)];
        if !self.quantizer.is_empty() {
            lines.push(format!("quantizer {}", self.quantizer.join(", ")));
        }
        if !self.dynamic.is_empty() {
            let dense = self.dynamic.iter().filter(|r| r.dense).count();
            lines.push(format!(
                "{}: {} per-module rules ({dense} dense)",
                self.rules_name(),
                self.dynamic.len()
            ));
        }
        lines
    }

    /// inspect's format line, and the scheme of each module:
    /// `gptq int4 group 128 sym v1`.
    pub fn format_line(&self) -> String {
        format!("{} {}", self.producer_name(), self.describe())
    }

    /// For people: `int4 group 128 sym v1` (AWQ packing: `int4 group 32
    /// asym`).
    pub fn describe(&self) -> String {
        match self.packing {
            Packing::Nvfp4 => return "nvfp4 fp4 e4m3-scale/global group 16".into(),
            Packing::Mxfp4 => return "mxfp4 fp4 e8m0-scale group 32".into(),
            Packing::Mxfp8 => return "mxfp8 fp8 e8m0-scale group 32".into(),
            Packing::Nvfp4E5m3 => return "nvfp4_v2 fp4 e5m3-scale group 16".into(),
            _ => {}
        }
        let scheme = format!(
            "int{} {} {}",
            self.bits,
            ScaleLayout::of_group(self.group_size).describe(),
            if self.sym { "sym" } else { "asym" },
        );
        if self.packing == Packing::Awq {
            return scheme;
        }
        format!(
            "{scheme} {}{}",
            if self.v1 { "v1" } else { "v2" },
            super::when(self.desc_act, " desc_act"),
        )
    }

    /// The format line's name: `gptq` or `auto-round (auto_gptq packing)`.
    pub fn producer_name(&self) -> &'static str {
        match (self.producer, self.packing, self.v1) {
            (Producer::Gptq, _, _) => "gptq",
            (Producer::AutoRound, Packing::Awq, _) => "auto-round (auto_awq packing)",
            (Producer::AutoRound, Packing::GptqModel, _) => "auto-round (gptqmodel packing)",
            (Producer::AutoRound, Packing::Nvfp4E5m3, _) => {
                "auto-round (llm_compressor_nvfp4_e5m3 packing)"
            }
            (Producer::AutoRound, Packing::Nvfp4 | Packing::Mxfp4 | Packing::Mxfp8, _) => {
                "auto-round (llm_compressor packing)"
            }
            (Producer::AutoRound, _, true) => "auto-round (auto_gptq packing)",
            (Producer::AutoRound, _, false) => "auto-round (auto_round packing)",
        }
    }

    /// The config key the per-module rules came from.
    fn rules_name(&self) -> &'static str {
        match self.producer {
            Producer::Gptq => "dynamic",
            Producer::AutoRound => "extra_config",
        }
    }
}

/// The decoded modules: every module with a `qweight`.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let mut found = if let Packing::Nvfp4 | Packing::Nvfp4E5m3 | Packing::Mxfp4 | Packing::Mxfp8 =
        cfg.packing
    {
        // Each module's layout is its scheme's (`extra_config` may mix
        // NVFP4, MXFP4 and MXFP8): every module with FP tensors.
        let mut modules = modules_with(ckpt, "weight_packed");
        modules.extend(modules_with(ckpt, "weight_scale"));
        modules.sort_unstable();
        modules.dedup();
        plan_each(
            ckpt,
            modules,
            &["weight_packed", "weight_scale", "weight_global_scale", "weight"],
            |_| None,
            |m, _| {
                let Some(mc) = cfg.fp_module(m)? else {
                    return Err(dense_but_packed(cfg, ckpt, m));
                };
                let (job, shard) = fp_job(mc.packing, ckpt, m, dtype)?;
                let shape = vec![job.dims.rows, job.dims.cols];
                Ok::<Output<'c>, Error>(decoded_output(m, shard, shape, job, mc.format_line()))
            },
        )
    } else {
        plan_each(
        ckpt,
        modules_with(ckpt, "qweight"),
        &["qweight", "qzeros", "scales", "g_idx"],
        |_| None,
        |m, _| {
            let Some(cfg) = cfg.for_module(m)? else {
                return Err(dense_but_packed(cfg, ckpt, m));
            };
            let (job, shard) = match cfg.packing {
                Packing::Gptq | Packing::GptqModel => module_job(&cfg, ckpt, m, dtype)?,
                Packing::Awq => awq_job(&cfg, ckpt, m, dtype)?,
                Packing::Nvfp4 | Packing::Nvfp4E5m3 | Packing::Mxfp4 | Packing::Mxfp8 => {
                    fp_job(cfg.packing, ckpt, m, dtype)?
                }
            };
            let shape = vec![job.dims.rows, job.dims.cols];
            Ok::<Output<'c>, Error>(decoded_output(m, shard, shape, job, cfg.format_line()))
        },
    )
    };
    // An `extra_config` entry that names a module to quantize which is
    // stored dense (auto-round 0.16.1's layer-by-layer AWQ packing leaves
    // `lm_head` so): copied as stored, which AutoRound's loader would not
    // load.
    for r in cfg.dynamic.iter().filter(|r| r.is_exact() && !r.dense) {
        if ckpt.get(&format!("{}.qweight", r.key)).is_none()
            && ckpt.get(&format!("{}.weight_scale", r.key)).is_none()
            && ckpt.get(&format!("{}.weight", r.key)).is_some()
        {
            found.warnings.push(Warning::new(
                Rule::Disagree,
                &r.key,
                "extra_config gives it a quantized scheme, but it is stored dense; copied as stored",
            ));
        }
    }
    found
}

/// An AutoRound FP module. NVFP4: `weight_packed` U8 `[out, in/2]` (E2M1
/// nibbles, low first), `weight_scale` F8_E4M3 `[out, in/16]`,
/// `weight_global_scale` F32 `[1]`; AutoRound's `NVFP4QuantLinear`
/// computes `(q · g⁻¹) · s` in f32 with `g⁻¹ = 1/g` (0 where g is 0): the
/// reciprocal goes into the code table, so the job's one f32 product with
/// the E4M3 scale is the second multiply. MXFP4 (`weight_packed`) and
/// MXFP8 (`weight` F8_E4M3): `weight_scale` U8 E8M0 `[out, in/32]`;
/// `MXQuantLinearBase.dequant_mx_tensor` multiplies `q · 2^(e − 127)` in
/// f32. Each value is rounded once to the output.
fn fp_job<'c>(
    packing: Packing,
    ckpt: &'c Checkpoint,
    module: &str,
    out: OutDtype,
) -> Result<(DecodeJob<'c>, usize)> {
    let weight = match packing {
        Packing::Mxfp8 => "weight",
        _ => "weight_packed",
    };
    let w = require(ckpt, module, weight)?;
    let scale_t = require(ckpt, module, "weight_scale")?;
    if packing == Packing::Mxfp8 {
        expect_dtype(&w, &[Dtype::F8_E4M3])?;
        expect_dtype(&scale_t, &[Dtype::U8])?;
        let (rows, cols) = matrix_dims(&w, "a [out, in] matrix is expected")?;
        let dims = Dims {
            slices: 1,
            rows,
            cols,
        };
        let scale = grid_values(
            scale_t,
            byte_table(numerics::e8m0),
            ScaleLayout::Group(MX_GROUP),
            dims,
        )?;
        return Ok((fp8_job(&w, dims, out).with_scale(scale), w.shard));
    }
    expect_dtype(&w, &[Dtype::U8])?;
    let (rows, width) = matrix_dims(&w, "a [out, in/2] matrix is expected")?;
    let dims = Dims {
        slices: 1,
        rows,
        cols: width.saturating_mul(2),
    };
    let codes = fp4_codes(&w, dims)?;
    let (values, table, group) = if packing == Packing::Nvfp4 {
        expect_dtype(&scale_t, &[Dtype::F8_E4M3])?;
        let global_t = require(ckpt, module, "weight_global_scale")?;
        let global = scalar_f32(&global_t)?;
        if !global.is_finite() {
            return Err(global_t.error(
                Rule::TensorValue,
                format!("global scale {global} is not finite"),
            ));
        }
        let inv = if global == 0.0 { 0.0 } else { 1.0 / global };
        let values: Vec<f32> = (0..16u8).map(|c| numerics::e2m1(c) * inv).collect();
        (values, byte_table(numerics::e4m3), NVFP4_GROUP)
    } else if packing == Packing::Nvfp4E5m3 {
        expect_dtype(&scale_t, &[Dtype::U8])?;
        (e2m1_values(), byte_table(ue5m3), NVFP4_GROUP)
    } else {
        expect_dtype(&scale_t, &[Dtype::U8])?;
        (e2m1_values(), byte_table(numerics::e8m0), MX_GROUP)
    };
    let scale = grid_values(scale_t, table, ScaleLayout::Group(group), dims)?;
    Ok((DecodeJob::new(dims, codes, values, out).with_scale(scale), w.shard))
}

/// An unsigned E5M3 byte as auto-round's `e5m3_to_float_tensor` reads it:
/// 0x00 is 0, exponent 0 subnormal (`m/8 · 2^−14`), `0xFF` NaN, otherwise
/// `(1 + m/8) · 2^(e − 15)`. Every value is exact in f32.
fn ue5m3(b: u8) -> f32 {
    let e = i32::from(b >> 3);
    let m = f32::from(b & 7);
    match (e, b & 7) {
        (31, 7) => f32::NAN,
        (0, _) => m / 8.0 * 2f32.powi(-14),
        _ => (1.0 + m / 8.0) * 2f32.powi(e - 15),
    }
}

/// A module a `-:` rule (an `extra_config` entry of bits 16) says is
/// stored dense has a `qweight`: GPTQModel (AutoRound) would load it as a
/// plain Linear and find no `weight`.
fn dense_but_packed(cfg: &Config, ckpt: &Checkpoint, module: &str) -> Error {
    let rule = gptq_dynamic::decide(&cfg.dynamic, &cfg.path, module, cfg.in_block(module))
        .ok()
        .flatten()
        .map_or(String::new(), |r| r.key.clone());
    let why = format!(
        "{} rule {rule:?} says this module is stored dense (not quantized), but it is packed",
        cfg.rules_name()
    );
    let packed = ["qweight", "weight_packed", "weight_scale"]
        .iter()
        .find_map(|p| ckpt.get(&format!("{module}.{p}")));
    match packed {
        Some(q) => q.error(Rule::Config, why),
        None => Error::new(Rule::Config, &cfg.path, format!("{module}: {why}")),
    }
}

/// The 32-bit words of an int32 tensor.
fn words(t: &TensorRef<'_>) -> Result<Vec<u32>> {
    Ok(t.data()?
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Field `i` (b bits, LSB first, may cross words) of a dense word stream;
/// bits past the end read as 0.
fn field(words: &[u32], bits: u32, i: usize) -> u32 {
    let bit = i * bits as usize;
    let (w, off) = (bit / 32, (bit % 32) as u32);
    let lo = words.get(w).map_or(0, |x| x >> off);
    let hi = if off + bits > 32 {
        words.get(w + 1).map_or(0, |x| x << (32 - off))
    } else {
        0
    };
    (lo | hi) & ((1 << bits) - 1)
}

/// AutoRound's `auto_round:auto_awq` packing: the AWQ format's job, with
/// the module's group size; AutoRound always stores the zero points.
fn awq_job<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    module: &str,
    dtype: OutDtype,
) -> Result<(DecodeJob<'c>, usize)> {
    if cfg.bits != super::awq::BITS {
        let at = require(ckpt, module, "qweight")?;
        return Err(at.error(
            Rule::Unsupported,
            format!(
                "AutoRound auto_awq packing at {} bits is not decoded (only 4)",
                cfg.bits
            ),
        ));
    }
    let awq = super::awq::Config {
        path: cfg.path.clone(),
        group_size: cfg.group_size,
        zero_point: true,
        modules_to_not_convert: Vec::new(),
    };
    super::awq::module_job(&awq, ckpt, module, dtype)
}

/// The true zero points of one group (one `qzeros` row) for `out` outputs:
/// v1 words corrected as GPTQModel's `convert_gptq_v1_to_v2_format_module`
/// does (see the module docs), or field by field, each + 1 unwrapped, as
/// AutoRound's `qlinear_torch_zp` does (`field_wise`); v2 words as stored.
fn group_zeros(row: &[u32], bits: u32, v1: bool, field_wise: bool, out: usize) -> Vec<u32> {
    let mask = (1u32 << bits) - 1;
    let add = match bits {
        2 => Some(0x5555_5555u32),
        4 => Some(0x1111_1111),
        8 => Some(0x0101_0101),
        _ => None,
    };
    match (v1, add) {
        (true, _) if field_wise => (0..out).map(|j| field(row, bits, j) + 1).collect(),
        (true, Some(c)) => {
            let fixed: Vec<u32> = row.iter().map(|w| w.wrapping_add(c)).collect();
            (0..out).map(|j| field(&fixed, bits, j)).collect()
        }
        (true, None) => (0..out)
            .map(|j| (field(row, bits, j) + 1) & mask)
            .collect(),
        (false, _) => (0..out).map(|j| field(row, bits, j)).collect(),
    }
}

/// The job of one module, `[out, in]`, and the shard its `qweight` is in.
fn module_job<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    module: &str,
    dtype: OutDtype,
) -> Result<(DecodeJob<'c>, usize)> {
    let b = cfg.bits as usize;
    let q = require(ckpt, module, "qweight")?;
    expect_dtype(&q, &[Dtype::I32])?;
    let (rows, out) = matrix_dims(&q, "GPTQ qweight is [in*bits/32, out]")?;
    let g_idx_t = ckpt.get(&format!("{module}.g_idx"));
    // The input count: g_idx's length, else what the packed rows hold.
    let inputs = match &g_idx_t {
        Some(t) => {
            expect_dtype(t, &[Dtype::I32, Dtype::I64])?;
            match *t.shape {
                [n] if n > 0 => n,
                _ => {
                    return Err(t.error(
                        Rule::TensorShape,
                        format!("shape {:?}; g_idx is [in], one group per input", t.shape),
                    ))
                }
            }
        }
        None => rows.saturating_mul(32) / b,
    };
    if inputs.checked_mul(b).map(|x| (x % 32, x / 32)) != Some((0, rows)) {
        let why = if g_idx_t.is_some() {
            format!("{inputs} inputs (g_idx's length)")
        } else {
            format!("{rows} rows")
        };
        return Err(q.error(
            Rule::TensorShape,
            format!(
                "shape {:?} does not hold {}-bit codes of {why}: qweight is [in*{b}/32, out] with in*{b} a multiple of 32",
                q.shape, b
            ),
        ));
    }
    let group = cfg.group_size.unwrap_or(inputs).min(inputs);
    let groups = inputs.div_ceil(group);
    let entries = groups * out;

    let s = require(ckpt, module, "scales")?;
    let kind = float_kind(&s)?;
    expect_shape(
        &s,
        &[groups, out],
        format_args!(
            "the scales of a {out}x{inputs} GPTQ weight in groups of {group} are [{groups}, {out}]"
        ),
    )?;

    let g_idx = match &g_idx_t {
        Some(t) => {
            let vals = t.ints()?;
            let g = vals
                .iter()
                .enumerate()
                .map(|(i, &g)| match u32::try_from(g) {
                    Ok(g) if (g as usize) < groups => Ok(g),
                    _ => Err(t.error(
                        Rule::TensorValue,
                        format!("g_idx[{i}] = {g} is outside 0..{groups}"),
                    )),
                })
                .collect::<Result<Vec<u32>>>()?;
            // g_idx = i div group_size is the plain group grid.
            let plain = g.iter().enumerate().all(|(i, &x)| x as usize == i / group);
            (!plain).then_some(g)
        }
        None => None,
    };

    // Scales rearranged to [out, G].
    let size = kind.size();
    let stored = s.data()?;
    let mut scales = vec![0u8; entries * size];
    for g in 0..groups {
        for j in 0..out {
            let from = (g * out + j) * size;
            let to = (j * groups + g) * size;
            scales[to..to + size].copy_from_slice(&stored[from..from + size]);
        }
    }
    let grid = Grid {
        row_div: 1,
        col_div: group,
        row_stride: groups,
        slice_stride: entries,
    };

    // Zero points unpacked to [out, G] integers.
    let width = (out * b).div_ceil(32);
    let zeros: Vec<u32> = match ckpt.get(&format!("{module}.qzeros")) {
        Some(z) => {
            expect_dtype(&z, &[Dtype::I32])?;
            expect_shape(
                &z,
                &[groups, width],
                format_args!("the {b}-bit zero points of {out} outputs in {groups} groups are [{groups}, {width}]"),
            )?;
            let w = words(&z)?;
            let mut zeros = vec![0u32; entries];
            for (g, row) in w.chunks_exact(width).enumerate() {
                let field_wise = cfg.producer == Producer::AutoRound;
                for (j, zj) in group_zeros(row, cfg.bits, cfg.v1, field_wise, out)
                    .into_iter()
                    .enumerate()
                {
                    zeros[j * groups + g] = zj;
                }
            }
            zeros
        }
        // A symmetric scheme's zero point is the middle code.
        None if cfg.sym => vec![1 << (cfg.bits - 1); entries],
        None => {
            require(ckpt, module, "qzeros")?;
            Vec::new()
        }
    };
    let zeros: Vec<u8> = zeros.iter().flat_map(|z| z.to_le_bytes()).collect();

    let dims = Dims {
        slices: 1,
        rows: out,
        cols: inputs,
    };
    let codes = Fields::dense(q, cfg.bits, 32).with_word_bits(32 * out as u64);
    check_extent(&q, &codes, 1, out, inputs)?;
    let code_values = (0..1u32 << cfg.bits).map(|c| c as f32).collect::<Vec<f32>>();
    let job = DecodeJob::new(dims, codes, code_values, dtype)
        .with_scale(Values {
            data: Bytes::from(scales),
            kind,
            grid,
        })
        .with_zero(ZeroPoint::Plain(Values {
            data: Bytes::from(zeros),
            kind: ValueKind::I32,
            grid,
        }))
        .with_g_idx(g_idx);
    Ok((job, q.shard))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every E5M3 byte reads as auto-round 0.16.1's `e5m3_to_float_tensor`
    /// reads it: the sha256 of its 256 f32 values (little-endian), and a few
    /// of them.
    #[test]
    fn ue5m3_is_autorounds_table() {
        use sha2::{Digest, Sha256};
        let bytes: Vec<u8> = (0..=255u8).flat_map(|b| ue5m3(b).to_le_bytes()).collect();
        let hex: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "c0bfcd164f069816b06dfac48bb282b465760b55080c35c3ab5d0a1aebc06124");
        assert_eq!(ue5m3(1), 7.629_394_5e-6);
        assert_eq!(ue5m3(0x78), 1.0);
        assert_eq!(ue5m3(0xFE), 114_688.0);
        assert!(ue5m3(0xFF).is_nan());
    }

    /// A true zero point of 0 stored by GPTQModel's writer (one 32-bit
    /// subtraction, borrowing from the next field) comes back as 0 and the
    /// next field keeps its value; a field-by-field +1 would not.
    #[test]
    fn v1_words_carry_like_the_runtime() {
        // True zeros [0, 5, 8, 8, 8, 8, 8, 8] at 4 bits.
        let truth = 0x8888_8850u32;
        let stored = truth.wrapping_sub(0x1111_1111);
        assert_eq!(stored & 0xff, 0x3f, "the writer borrowed");
        let z = group_zeros(&[stored], 4, true, false, 8);
        assert_eq!(z, [0, 5, 8, 8, 8, 8, 8, 8]);
        assert_eq!(group_zeros(&[truth], 4, false, false, 8), z);
    }

    /// 3-bit v1 zero points shift field by field, wrapping each on its own,
    /// including the fields that straddle words (10 and 21).
    #[test]
    fn v1_three_bit_fields_shift_alone() {
        let stored: Vec<u32> = vec![u32::MAX; 3]; // every field 7
        assert_eq!(group_zeros(&stored, 3, true, false, 32), vec![0; 32]);
        let mut words = [0u32; 3];
        for k in 0..32u32 {
            let v = k % 7; // stored z - 1 in 0..7
            let bit = 3 * k;
            words[(bit / 32) as usize] |= v << (bit % 32);
            if bit % 32 > 29 {
                words[(bit / 32) as usize + 1] |= v >> (32 - bit % 32);
            }
        }
        let z = group_zeros(&words, 3, true, false, 32);
        assert_eq!(z, (0..32).map(|k| k % 7 + 1).collect::<Vec<u32>>());
    }

    /// AutoRound's `qlinear_torch_zp` adds 1 to each field on its own,
    /// unwrapped: an all-ones field (never written by AutoRound, which
    /// clamps z − 1 to 2^b − 1) reads as 2^b and leaves its neighbour alone.
    #[test]
    fn autoround_zero_points_field_by_field() {
        let stored = 0x0000_00f3u32; // fields 3, 15, 0, ...
        let z = group_zeros(&[stored], 4, true, true, 8);
        assert_eq!(z, [4, 16, 1, 1, 1, 1, 1, 1]);
        let z3 = group_zeros(&[u32::MAX; 3], 3, true, true, 32);
        assert_eq!(z3, vec![8; 32]);
    }

    /// At 5, 6 and 7 bits AutoRound stores `z − 1` masked, unclamped: a
    /// true zero point of 0 is all ones, read back as `2^b`; fields
    /// straddle words (field 6 of 5 bits: bits 30..35).
    #[test]
    fn autoround_wide_zero_points_straddle_words() {
        for b in [5u32, 6, 7] {
            let z = group_zeros(&vec![u32::MAX; b as usize], b, true, true, 32);
            assert_eq!(z, vec![1 << b; 32], "{b} bits");
        }
        // Field 6 at 5 bits = 0b10101: bits 30, 31 of word 0, 32..35 next.
        let words = [0b01u32 << 30, 0b101];
        assert_eq!(field(&words, 5, 6), 0b10101);
        assert_eq!(group_zeros(&words, 5, false, true, 7)[6], 0b10101);
    }
}
