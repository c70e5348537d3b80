//! AQLM (`quant_method: "aqlm"`, Vahe1994/AQLM; ISTA-DASLab's `*-AQLM-*-hf`
//! checkpoints), read as transformers' `replace_with_aqlm_linear` builds
//! each `aqlm.QuantizedLinear` and decoded as aqlm 1.1.7's CPU path
//! (`dequantize_gemm`) computes the weight:
//! `_dequantize_weight(unpack_int_data(codes, log2 K), codebooks, scales)`.
//!
//! A module stores `codes` `[out/og, in/ig, M]` (`get_int_dtype(nbits)`:
//! int8 up to 8 bits, int16 up to 16; `pack_int_data` stores codes of
//! `2^(nbits-1)` or more negative and `unpack_int_data` reads them back
//! modulo `2^nbits`: the low `nbits` bits of the two's complement),
//! `codebooks` `[M, 2^nbits, og, ig]` and `scales` `[out/og, 1, 1, 1]`.
//! Weight tile `(i, j)` (`og × ig` elements) is
//! `(Σ_m codebooks[m, codes[i, j, m]]) · scales[i]`.
//!
//! The arithmetic is the dtype the model is loaded in (transformers casts
//! codebooks and scales to it): the output dtype here. `F.embedding_bag`
//! sums the codebooks in f32, in codebook order, and rounds once with
//! fbgemm's conversion (bf16: ties away from zero, [`Sum::EmbeddingBag`]);
//! the scale's product is one rounding in that dtype.

use std::collections::BTreeSet;
use std::path::PathBuf;

use safetensors::Dtype;

use super::{decoded_output, expect_dtype, plan_each, require, Modules, QuantConfig};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule, Warning};
use crate::job::{Codebook, DecodeJob, Dims, Fault, Grid, Region, Sum, Term, ValueKind, Values};
use crate::numerics::OutDtype;
use crate::output::Output;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "aqlm",
    producers: "AQLM (Vahe1994/AQLM, ISTA-DASLab)",
    bits: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
    modes: &[
        "additive codebooks (1..=8 summed) of out_group x in_group tiles",
        "a scale per output group",
    ],
};

/// The tensors a QuantizedLinear stores besides its bias.
const PARAMS: &[&str] = &["codes", "codebooks", "scales"];

/// An AQLM quantization config (transformers' `AqlmConfig`, its defaults).
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct Config {
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
    /// Columns of a tile.
    #[serde(default = "eight")]
    pub in_group_size: i64,
    /// Rows of a tile.
    #[serde(default = "one")]
    pub out_group_size: i64,
    /// Codebooks summed.
    #[serde(default = "one")]
    pub num_codebooks: i64,
    /// log2 of a codebook's entries.
    #[serde(default = "sixteen")]
    pub nbits_per_codebook: i64,
    /// Weights (or modules) left dense.
    #[serde(default)]
    pub linear_weights_not_to_quantize: Option<Vec<String>>,
}

fn eight() -> i64 {
    8
}
fn one() -> i64 {
    1
}
fn sixteen() -> i64 {
    16
}

impl Config {
    /// Reads config.json's `quantization_config`.
    pub fn parse(q: &QuantConfig<'_>) -> Result<Config> {
        let mut c: Config = q.read()?;
        c.path = q.path.to_path_buf();
        c.settings()?;
        Ok(c)
    }

    /// `(ig, og, M, nbits)`, each checked: groups positive, 1..=8
    /// codebooks (the codebook job sums at most 8), 1..=16 bits.
    fn settings(&self) -> Result<(usize, usize, usize, u32)> {
        let pos = |key: &str, v: i64| {
            usize::try_from(v).ok().filter(|&n| n > 0).ok_or_else(|| {
                Error::new(
                    Rule::Config,
                    &self.path,
                    format!("{key} {v}: a positive count is expected"),
                )
            })
        };
        let ig = pos("in_group_size", self.in_group_size)?;
        let og = pos("out_group_size", self.out_group_size)?;
        let m = pos("num_codebooks", self.num_codebooks)?;
        let nbits = pos("nbits_per_codebook", self.nbits_per_codebook)?;
        if m > crate::job::MAX_TERMS {
            return Err(Error::new(
                Rule::Unsupported,
                &self.path,
                format!(
                    "num_codebooks {m}: at most {} codebooks are summed",
                    crate::job::MAX_TERMS
                ),
            ));
        }
        if nbits > 16 {
            return Err(Error::new(
                Rule::Unsupported,
                &self.path,
                format!("nbits_per_codebook {nbits}: codebooks of at most 2^16 entries (int8 and int16 codes) are decoded"),
            ));
        }
        Ok((ig, og, m, nbits as u32))
    }

    /// inspect's format line.
    pub fn format_line(&self) -> String {
        format!(
            "aqlm additive codebooks {}x{} (tiles {}x{})",
            self.num_codebooks, self.nbits_per_codebook, self.out_group_size, self.in_group_size
        )
    }

    /// `inspect`'s lines: the settings.
    pub fn report_lines(&self) -> Vec<String> {
        let skip = self.linear_weights_not_to_quantize.as_deref().unwrap_or(&[]);
        vec![
            format!(
                "{} codebooks of 2^{} entries, out_group {}, in_group {}",
                self.num_codebooks,
                self.nbits_per_codebook,
                self.out_group_size,
                self.in_group_size
            ),
            format!("not quantized: {}", super::list_or_dash(skip)),
        ]
    }

    /// Whether `linear_weights_not_to_quantize` names `module` (or its
    /// weight): the module must then be stored dense.
    fn kept_dense(&self, module: &str) -> bool {
        let weight = format!("{module}.weight");
        self.linear_weights_not_to_quantize
            .iter()
            .flatten()
            .any(|k| *k == module || *k == weight)
    }
}

/// Every module storing `codes` or `codebooks`.
pub fn plan<'c>(cfg: &Config, ckpt: &'c Checkpoint, dtype: OutDtype) -> Modules<'c> {
    let stored: BTreeSet<&'c str> = super::modules_with(ckpt, "codes")
        .into_iter()
        .chain(super::modules_with(ckpt, "codebooks"))
        .collect();
    let build = |m: &str, _: &mut Vec<Warning>| plan_module(cfg, ckpt, m, dtype);
    plan_each(ckpt, stored, PARAMS, |_| None, build)
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

fn plan_module<'c>(
    cfg: &Config,
    ckpt: &'c Checkpoint,
    module: &str,
    out: OutDtype,
) -> Result<Output<'c>> {
    let (ig, og, m, nbits) = cfg.settings()?;
    let codes = require(ckpt, module, "codes")?;
    let books = require(ckpt, module, "codebooks")?;
    let scales = require(ckpt, module, "scales")?;
    if cfg.kept_dense(module) {
        return Err(codes.error(
            Rule::Disagree,
            format!("linear_weights_not_to_quantize names {module}, which stores AQLM codes"),
        ));
    }
    // aqlm.utils.get_int_dtype: the codes' width follows nbits.
    let (code_dtype, code_bits) = match nbits {
        0..=8 => (Dtype::I8, 8u64),
        _ => (Dtype::I16, 16u64),
    };
    if codes.dtype != code_dtype {
        return Err(codes.error(
            Rule::TensorDtype,
            format!(
                "dtype {}; codes of nbits_per_codebook {nbits} are {code_dtype} (aqlm's get_int_dtype)",
                codes.dtype
            ),
        ));
    }
    let (n_out, n_in) = match *codes.shape {
        [o, i, k] if k == m && o > 0 && i > 0 => (o, i),
        _ => {
            return Err(codes.error(
                Rule::TensorShape,
                format!(
                    "shape {:?}; codes are [out/out_group, in/in_group, num_codebooks {m}]",
                    codes.shape
                ),
            ))
        }
    };
    let overflow = || codes.error(Rule::TensorShape, "the weight's size overflows");
    let rows = n_out.checked_mul(og).ok_or_else(overflow)?;
    let cols = n_in.checked_mul(ig).ok_or_else(overflow)?;
    let k = 1usize << nbits;
    expect_dtype(&books, &[Dtype::F16, Dtype::BF16, Dtype::F32])?;
    expect_shape(
        &books,
        &[m, k, og, ig],
        "num_codebooks x 2^nbits_per_codebook x out_group_size x in_group_size",
    )?;
    if scales.dtype != books.dtype {
        return Err(scales.error(
            Rule::TensorDtype,
            format!(
                "dtype {}; {} is {} and aqlm computes in one dtype",
                scales.dtype, books.name, books.dtype
            ),
        ));
    }
    expect_shape(&scales, &[n_out, 1, 1, 1], "[out/out_group_size, 1, 1, 1]")?;
    // Loaded in the output dtype: codebooks and scales rounded to it.
    let arith = (out != OutDtype::F32).then_some(out);
    let to_out = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| out.round(x)).collect() };
    let table = to_out(books.floats()?);
    let scale_bytes: Vec<u8> = to_out(scales.floats()?)
        .into_iter()
        .flat_map(f32::to_le_bytes)
        .collect();
    let len = og * ig;
    let field = m as u64 * code_bits;
    let terms = (0..m)
        .map(|t| Term {
            data: codes.into(),
            bits: nbits,
            at: t as u64 * code_bits,
            row_bits: n_in as u64 * field,
            // Every tile column shares the codebooks.
            group: n_in,
            group_bits: 0,
            field_bits: field,
            base: t * k * len,
            book: k,
            entries: k,
        })
        .collect();
    let book = Codebook {
        table: table.into(),
        regions: vec![Region {
            start: 0,
            cols,
            tile_rows: og,
            tile_cols: ig,
            terms,
        }],
        col_map: None,
        arith,
        sum: Sum::EmbeddingBag,
    };
    if let Err(f) = book.check(rows, cols) {
        return Err(match f {
            Fault::Geometry(why) => books.error(Rule::TensorShape, why),
            Fault::Short { .. } => codes.error(
                Rule::TensorShape,
                "too few bytes for the codes its shape describes",
            ),
            Fault::Past { term, ti, tj, index, .. } => codes.error(
                Rule::TensorValue,
                format!("code {index} (codebook {term}, tile {ti}, {tj}) is past its codebook"),
            ),
        });
    }
    let dims = Dims {
        slices: 1,
        rows,
        cols,
    };
    let job = DecodeJob::with_codebook(dims, book, out).with_scale(Values {
        data: scale_bytes.into(),
        kind: ValueKind::F32,
        grid: Grid {
            row_div: og,
            col_div: cols,
            row_stride: 1,
            slice_stride: 0,
        },
    });
    Ok(decoded_output(
        module,
        codes.shard,
        vec![rows, cols],
        job,
        cfg.format_line(),
    ))
}
