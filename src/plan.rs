//! The plan: what each output tensor is and where its bytes come from, known
//! before anything is decoded.

use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;
use std::path::PathBuf;

use safetensors::Dtype;

use crate::assemble::{Assembly, BiasSum};
use crate::backend::Backend;
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::{Error, Result, Rule};
use crate::formats::{self, Format};
use crate::job::{Bytes, DecodeJob, ZeroPoint};
use crate::numerics::OutDtype;

/// The output dtype the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DtypeChoice {
    /// The checkpoint's own dtype (`torch_dtype`/`dtype`), else its scales' dtype.
    #[default]
    Auto,
    /// This dtype.
    Fixed(OutDtype),
}

/// Where an output tensor's bytes come from.
#[derive(Debug)]
pub enum Source<'a> {
    /// A tensor copied as it is stored.
    Copy(TensorRef<'a>),
    /// A floating point tensor copied in another dtype (`--dtype`).
    Cast(TensorRef<'a>, OutDtype),
    /// A quantized module decoded to dense.
    Decode(Box<DecodeJob<'a>>),
    /// Bytes computed on the host while planning (converted scales).
    Bytes(Vec<u8>),
    /// A dense weight put together from rows of several jobs (SVDQuant).
    Assemble(Assembly<'a>),
    /// A bias computed on the host when written (SVDQuant activation shifts).
    Bias(BiasSum<'a>),
}

/// One tensor of the dense output.
#[derive(Debug)]
pub struct Output<'a> {
    /// Output tensor name.
    pub name: String,
    /// Index of the input shard whose output file receives it.
    pub shard: usize,
    /// Output shape.
    pub shape: Vec<usize>,
    /// Output dtype.
    pub dtype: Dtype,
    /// Where the bytes come from.
    pub source: Source<'a>,
    /// The scheme it was decoded with, for people (`None` for copies).
    pub scheme: Option<String>,
}

impl Output<'_> {
    /// Size of the output tensor in bytes.
    pub fn byte_len(&self) -> usize {
        match &self.source {
            Source::Copy(t) => t.data.len(),
            Source::Cast(t, to) => t.elements() * to.size(),
            Source::Decode(job) => job.out_bytes(),
            Source::Bytes(b) => b.len(),
            Source::Assemble(a) => a.stack.rows() * a.cols * a.out.size(),
            Source::Bias(b) => b.stack.rows() * b.out.size(),
        }
    }

    /// Rows and bytes per row of a tensor that is decoded row by row (and so
    /// can be streamed in bounded chunks); `None` for tensors made whole.
    pub fn row_layout(&self) -> Option<(usize, usize)> {
        match &self.source {
            Source::Decode(job) => Some((job.dims.total_rows(), job.dims.cols * job.out.size())),
            Source::Assemble(a) => Some((a.stack.rows(), a.cols * a.out.size())),
            Source::Cast(t, to) => {
                let (rows, cols) = match t.shape.split_first() {
                    Some((&rows, rest)) => (rows, rest.iter().product()),
                    None => (1, 1),
                };
                Some((rows, cols * to.size()))
            }
            _ => None,
        }
    }

    /// Decodes rows `rows` (see [`Output::row_layout`]) into `out`.
    pub fn decode_rows(
        &self,
        backend: &dyn Backend,
        rows: Range<usize>,
        out: &mut [u8],
    ) -> Result<()> {
        let r = match &self.source {
            Source::Decode(job) => backend.decode_rows(job, rows, out),
            Source::Assemble(a) => a.decode_rows(backend, rows, out),
            Source::Cast(t, to) => cast_rows(t, *to, rows, out),
            _ => Err(Error::new(
                Rule::Argument,
                "decode_rows",
                "not a tensor decoded by rows",
            )),
        };
        r.map_err(|e| Error {
            tensor: e.tensor.or_else(|| Some(self.name.clone())),
            ..e
        })
    }

    /// The stored bytes this tensor is made from (scales and tables made on
    /// the host are not listed).
    pub fn inputs(&self) -> Vec<&[u8]> {
        fn of_job<'j>(job: &'j DecodeJob<'_>, v: &mut Vec<&'j [u8]>) {
            let mut add = |b: &'j Bytes<'_>| {
                if let Bytes::Mapped(m) = b {
                    v.push(m);
                }
            };
            add(&job.codes.data);
            if let Some(s) = &job.scale {
                add(&s.data);
            }
            match &job.zero {
                Some(ZeroPoint::Packed { fields }) => add(&fields.data),
                Some(ZeroPoint::Plain(z)) => add(&z.data),
                None => {}
            }
        }
        let mut v = Vec::new();
        match &self.source {
            Source::Copy(t) | Source::Cast(t, _) => v.push(t.data),
            Source::Decode(job) => of_job(job, &mut v),
            Source::Assemble(a) => {
                for band in &a.stack.bands {
                    for p in &band.parts {
                        of_job(&p.job, &mut v);
                    }
                }
            }
            Source::Bytes(_) | Source::Bias(_) => {}
        }
        v
    }

    /// The whole tensor's bytes (decoded with `backend` when it is decoded).
    pub fn bytes(&self, backend: &dyn Backend) -> Result<Cow<'_, [u8]>> {
        match &self.source {
            Source::Copy(t) => Ok(Cow::Borrowed(t.data)),
            Source::Bytes(b) => Ok(Cow::Borrowed(b)),
            Source::Bias(b) => Ok(Cow::Owned(b.bytes())),
            Source::Decode(_) | Source::Assemble(_) | Source::Cast(..) => {
                let rows = self.row_layout().map_or(0, |(rows, _)| rows);
                let mut out = vec![0u8; self.byte_len()];
                self.decode_rows(backend, 0..rows, &mut out)?;
                Ok(Cow::Owned(out))
            }
        }
    }
}

/// Converts rows `rows` of `t` (split by its first dimension) to `to`.
fn cast_rows(t: &TensorRef<'_>, to: OutDtype, rows: Range<usize>, out: &mut [u8]) -> Result<()> {
    use rayon::prelude::*;
    let elements = t.elements();
    let per_row = match t.shape.first() {
        Some(&n) if n > 0 => elements / n,
        _ => elements,
    };
    let total = if t.shape.is_empty() { 1 } else { t.shape[0] };
    crate::backend::check_span(total, per_row * to.size(), &rows, out)?;
    let size = t.dtype.bitsize() / 8;
    let src = &t.data[rows.start * per_row * size..rows.end * per_row * size];
    // Spread over threads in pieces of whole elements.
    const PIECE: usize = 1 << 16;
    src.par_chunks(PIECE * size)
        .zip(out.par_chunks_mut(PIECE * to.size()))
        .for_each(|(s, o)| crate::numerics::cast(t.dtype, s, to, o));
    Ok(())
}

/// Sets every dtype entry of a `config.json` (`torch_dtype`, `dtype`, also in
/// nested configs such as `text_config`) that names a floating dtype to `to`.
fn set_config_dtype(v: &mut serde_json::Value, to: OutDtype) {
    let Some(obj) = v.as_object_mut() else {
        return;
    };
    for (key, value) in obj.iter_mut() {
        match value {
            serde_json::Value::String(name)
                if (key == "torch_dtype" || key == "dtype")
                    && OutDtype::from_name(name).is_some() =>
            {
                *name = to.torch_name().to_string();
            }
            serde_json::Value::Object(_) => set_config_dtype(value, to),
            _ => {}
        }
    }
}

/// A rule finding that does not stop decoding.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Warning {
    /// The tensor or module concerned.
    pub subject: String,
    /// What was noticed.
    pub detail: String,
}

/// Everything `dequantize` will do, in output order.
pub struct Plan<'a> {
    /// The checkpoint planned from.
    pub checkpoint: &'a Checkpoint,
    /// What was asked for: `Auto` keeps copied tensors as stored.
    pub dtype_choice: DtypeChoice,
    /// The detected format and its configuration.
    pub format: Format,
    /// Output dtype of decoded tensors.
    pub dtype: OutDtype,
    /// Output tensors, sorted by name.
    pub outputs: Vec<Output<'a>>,
    /// Input tensors that have no place in a dense checkpoint (scales, shapes,
    /// activation scales), sorted.
    pub dropped: Vec<String>,
    /// Modules that cannot be decoded, with the rule each breaks.
    pub errors: Vec<Error>,
    /// Findings that do not stop decoding.
    pub warnings: Vec<Warning>,
    /// The `config.json` to write, when the input has one.
    pub config: Option<serde_json::Value>,
    /// The input's other files copied to the output (tokenizer, generation
    /// config, …): (path, file name). Quantization sidecars are not among them.
    pub side_files: Vec<(PathBuf, String)>,
}

impl<'a> Plan<'a> {
    /// Plans the dense output of `ckpt`. Faults that concern the whole
    /// checkpoint (an unreadable config) are returned as `Err`; faults of one
    /// module are collected in [`Plan::errors`] so `validate` can list them all.
    pub fn build(ckpt: &'a Checkpoint, dtype: DtypeChoice) -> Result<Plan<'a>> {
        let format = formats::detect(ckpt)?;
        let dtype_choice = dtype;
        let dtype = match dtype {
            DtypeChoice::Fixed(d) => d,
            DtypeChoice::Auto => formats::default_dtype(ckpt, &format),
        };
        let mut plan = Plan {
            checkpoint: ckpt,
            dtype_choice,
            format,
            dtype,
            outputs: Vec::new(),
            dropped: Vec::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
            config: ckpt.config.as_ref().map(|c| {
                let mut v = c.value.clone();
                if let Some(obj) = v.as_object_mut() {
                    obj.remove("quantization_config");
                }
                if let DtypeChoice::Fixed(to) = dtype_choice {
                    set_config_dtype(&mut v, to);
                }
                v
            }),
            side_files: Vec::new(),
        };
        let mut consumed: HashSet<String> = HashSet::new();
        formats::plan_modules(&mut plan, &mut consumed);

        let produced: HashSet<String> = plan.outputs.iter().map(|o| o.name.clone()).collect();
        for name in ckpt.names() {
            if produced.contains(name) {
                // Decoded in place: int8/fp8 modules keep the name `<m>.weight`.
                continue;
            }
            if consumed.contains(name) {
                plan.dropped.push(name.to_string());
                continue;
            }
            let last = name.rsplit('.').next().unwrap_or(name);
            if formats::WEIGHT_QUANT_PARAMS.contains(&last) {
                plan.errors.push(Error::tensor(
                    Rule::Config,
                    ckpt.display_path(),
                    name,
                    format!(
                        "a quantization parameter, but its module is not decoded under {}",
                        plan.format.describe()
                    ),
                ));
                continue;
            }
            if let Some(t) = ckpt.get(name) {
                // A fixed --dtype means the whole checkpoint, copies included.
                let (dtype, source) = match dtype_choice {
                    DtypeChoice::Fixed(to)
                        if crate::numerics::is_castable(t.dtype) && t.dtype != to.safetensors() =>
                    {
                        (to.safetensors(), Source::Cast(t, to))
                    }
                    _ => (t.dtype, Source::Copy(t)),
                };
                plan.outputs.push(Output {
                    name: name.to_string(),
                    shard: t.shard,
                    shape: t.shape.to_vec(),
                    dtype,
                    source,
                    scheme: None,
                });
            }
        }
        plan.outputs.sort_by(|a, b| a.name.cmp(&b.name));
        // Quantization sidecars are not copied; a side file linking out of
        // the checkpoint would be: a finding.
        if !ckpt.single_file {
            let sidecars: Vec<String> = ["hf_quant_config.json".to_string()]
                .into_iter()
                .chain(
                    ckpt.svdquant_config
                        .as_ref()
                        .and_then(|f| f.path.file_name().map(|n| n.to_string_lossy().into_owned())),
                )
                .collect();
            match ckpt.side_files(&sidecars) {
                Ok(files) => plan.side_files = files,
                Err(e) => plan.errors.push(e),
            }
        }
        Ok(plan)
    }

    /// Number of decoded tensors.
    pub fn decoded(&self) -> usize {
        self.outputs
            .iter()
            .filter(|o| matches!(o.source, Source::Decode(_)))
            .count()
    }

    /// Fails with the first module error, if any.
    pub fn check(&self) -> Result<()> {
        match self.errors.first() {
            None => Ok(()),
            Some(e) => Err(Error {
                rule: e.rule,
                file: e.file.clone(),
                tensor: e.tensor.clone(),
                detail: if self.errors.len() > 1 {
                    format!(
                        "{} (and {} more findings; run `validate`)",
                        e.detail,
                        self.errors.len() - 1
                    )
                } else {
                    e.detail.clone()
                },
                source: None,
            }),
        }
    }
}
