//! A GGUF model written as transformers loads it ([`super`]):
//! every tensor under its Hugging Face name and in the dtype asked for,
//! llama's Q and K rows un-interleaved, Gemma's norms moved back by one,
//! stacks of experts one tensor per expert; tensors transformers does not
//! load dropped; `config.json` and `generation_config.json` made from the
//! metadata. Under `--keep-names` none of this runs.

use super::{self as hf, Heads, Target};
use crate::checkpoint::{Checkpoint, Gguf};
use crate::error::{Error, Result, Rule};
use crate::numerics::OutDtype;
use crate::output::blocks::{Blocks, RowOrder};
use crate::output::{Output, Source};

/// The model in Hugging Face form.
pub(crate) struct Converted<'a> {
    /// Its tensors.
    pub(crate) outputs: Vec<Output<'a>>,
    /// GGUF tensors transformers does not load whose values the config
    /// states (the rope factors): used up, as a scale is.
    pub(crate) consumed: Vec<String>,
    /// GGUF tensors transformers does not load and nothing else states:
    /// not written (HF-001).
    pub(crate) unplaced: Vec<String>,
    /// What the config cannot state.
    pub(crate) warnings: Vec<crate::error::Warning>,
    /// (GGUF name, Hugging Face name) of each tensor written.
    pub(crate) renamed: Vec<(String, String)>,
    /// The files made from the metadata (`config.json`, …): (name, bytes).
    pub(crate) files: Vec<(String, Vec<u8>)>,
}

/// `stored`, the GGUF tensors as planned under their own names, in
/// Hugging Face form, every tensor in `dtype`.
pub(crate) fn convert<'a>(
    ckpt: &'a Checkpoint,
    gguf: &Gguf,
    stored: &[Output<'a>],
    dtype: OutDtype,
) -> Result<Converted<'a>> {
    let arch = hf::arch(gguf)?;
    let heads = |key: &str| -> Result<usize> {
        let full = format!("{}.attention.{key}", arch.gguf);
        let v = gguf
            .get(&full)
            .or_else(|| gguf.get(&format!("{}.attention.head_count", arch.gguf)));
        v.and_then(|v| v.as_u64())
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| Error::new(Rule::Gguf, ckpt.display_path(), format!("{full} is not a positive whole number: Q and K rows cannot be put back in order")))
    };
    let mut c = Converted {
        outputs: Vec::new(),
        consumed: Vec::new(),
        unplaced: Vec::new(),
        warnings: Vec::new(),
        renamed: Vec::new(),
        files: Vec::new(),
    };
    for o in stored {
        let Some(target) = arch.target(&o.name) else {
            match hf::rope::TENSORS.contains(&o.name.as_str()) {
                true => c.consumed.push(o.name.clone()),
                false => c.unplaced.push(o.name.clone()),
            }
            continue;
        };
        if o.shape.len() != target.rank {
            let detail = format!(
                "{} dimensions {:?}; as {} it has {}",
                o.shape.len(),
                o.shape,
                target.name,
                target.rank
            );
            return Err(Error::tensor(
                Rule::GgufValue,
                ckpt.display_path(),
                &o.name,
                detail,
            ));
        }
        let Some(mut b) = rows_of(o, dtype) else {
            // Not a float or block tensor (an integer one): renamed only.
            c.outputs.push(Output {
                name: target.name,
                shard: o.shard,
                shape: o.shape.clone(),
                dtype: o.dtype,
                source: match &o.source {
                    Source::Copy(t) => Source::Copy(*t),
                    _ => {
                        return Err(Error::tensor(
                            Rule::Internal,
                            ckpt.display_path(),
                            &o.name,
                            "not a GGUF tensor",
                        ))
                    }
                },
                scheme: o.scheme.clone(),
            });
            c.renamed
                .push((o.name.clone(), c.outputs[c.outputs.len() - 1].name.clone()));
            continue;
        };
        let Target {
            name,
            halves,
            plus_one,
            ..
        } = target;
        if let Some(which) = halves {
            let n = heads(match which {
                Heads::Query => "head_count",
                Heads::KeyValue => "head_count_kv",
            })?;
            if b.rows % (2 * n) != 0 {
                let detail = format!(
                    "{} rows do not split into {n} heads of rotary pairs",
                    b.rows
                );
                return Err(Error::tensor(
                    Rule::GgufTensor,
                    ckpt.display_path(),
                    &o.name,
                    detail,
                ));
            }
            b.order.halves = Some(n);
        }
        if plus_one {
            b.shift = Some(-1.0);
        }
        let mut shape = o.shape.clone();
        if name.ends_with("shared_expert_gate.weight") && shape.len() == 1 {
            // transformers' Linear(H, 1) holds it as [1, H].
            shape.insert(0, 1);
        }
        let out = |name: String, shape: Vec<usize>, source| Output {
            name,
            shard: o.shard,
            shape,
            dtype: dtype.safetensors(),
            source,
            scheme: o.scheme.clone(),
        };
        if !name.contains("{E}") {
            c.renamed.push((o.name.clone(), name.clone()));
            c.outputs.push(out(name, shape, Source::Blocks(b)));
            continue;
        }
        let &[experts, rows, cols] = shape.as_slice() else {
            let detail = format!("a stack of experts is [experts, rows, cols], not {shape:?}");
            return Err(Error::tensor(
                Rule::GgufTensor,
                ckpt.display_path(),
                &o.name,
                detail,
            ));
        };
        for e in 0..experts {
            let one = Blocks {
                rows,
                order: RowOrder {
                    first: e * rows,
                    halves: None,
                },
                ..b.clone()
            };
            let expert = name.replace("{E}", &e.to_string());
            c.renamed.push((o.name.clone(), expert.clone()));
            c.outputs
                .push(out(expert, vec![rows, cols], Source::Blocks(one)));
        }
    }
    let tied = arch.always_tied || !gguf.tensors.contains_key("output.weight");
    let factors =
        |name: &str| -> Result<Option<Vec<f32>>> { ckpt.get(name).map(|t| t.floats()).transpose() };
    let (config, warnings) = hf::config::config(gguf, arch, tied, dtype, &factors)
        .map_err(|e| e.with_file(ckpt.display_path()))?;
    c.warnings = warnings;
    let generation = hf::config::generation_config(&config);
    // As transformers writes them: keys sorted, indented by two, a newline
    // at the end.
    for (name, v) in [
        ("config.json", &config),
        ("generation_config.json", &generation),
    ] {
        let mut text = crate::json::file(name, v)?;
        text.push(b'\n');
        c.files.push((name.to_string(), text));
    }
    let tokenizer = crate::hf::tokenizer::hf_files(&gguf.metadata, arch.gguf);
    c.files
        .extend(tokenizer.map_err(|e| e.with_file(ckpt.display_path()))?);
    Ok(c)
}

/// The rows of a GGUF tensor as planned under its own name (its blocks, or
/// a float tensor copied or cast), decoded to `dtype`; `None` for others.
fn rows_of<'a>(o: &Output<'a>, dtype: OutDtype) -> Option<Blocks<'a>> {
    match &o.source {
        Source::Blocks(b) => Some(Blocks {
            out: dtype,
            ..b.clone()
        }),
        Source::Copy(t) | Source::Cast(t, _) => {
            let (size, _) = crate::numerics::float_reader(t.dtype)?;
            let cols = t.shape.last().copied().unwrap_or(1);
            Some(Blocks {
                tensor: *t,
                rows: t.shape.iter().rev().skip(1).product(),
                cols,
                row_bytes: cols * size,
                out: dtype,
                map: None,
                order: RowOrder::default(),
                shift: None,
            })
        }
        _ => None,
    }
}
