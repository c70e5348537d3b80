//! MoE experts stored as one stacked tensor (mlx-lm's
//! `<block>.switch_mlp.{gate,up,down}_proj` of shape `[E, out, in]`),
//! written one tensor per expert under the names transformers loads:
//! `<block>.experts.<e>.{gate,up,down}_proj.weight` (Qwen2/3-MoE,
//! DeepSeek-style; Mixtral-style ones then take their hub names,
//! [`crate::names`]). Each expert's tensor is rows of the one stacked job,
//! decoded where it is written; `--keep-names` keeps the stack.

use std::sync::Arc;

use crate::output::assembly::{Assembly, Piece, Stack};
use crate::output::{Output, Source};

/// The projections a stack holds.
const PROJECTIONS: &[&str] = &["gate_proj", "up_proj", "down_proj"];

/// `(block, projection)` of a stacked expert weight's name.
fn stacked(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_suffix(".weight")?;
    let (block, proj) = rest.rsplit_once(".switch_mlp.")?;
    PROJECTIONS.contains(&proj).then_some((block, proj))
}

/// One stack split into its experts: the stack's name and its experts'.
#[derive(Debug, Clone)]
pub(crate) struct Unstacked {
    /// The stored (stacked) tensor's name.
    pub(crate) stored: String,
    /// Its experts' names, in expert order.
    pub(crate) experts: Vec<String>,
}

/// Replaces every decoded stack of experts in `outputs` by one output per
/// expert; returns what was split.
pub(super) fn unstack(outputs: &mut Vec<Output<'_>>) -> Vec<Unstacked> {
    let mut split = Vec::new();
    let mut i = 0;
    while i < outputs.len() {
        let o = &outputs[i];
        let one = match (&o.source, stacked(&o.name), o.shape.as_slice()) {
            (Source::Decode(job), Some(_), &[e, rows, cols]) if e > 1 && job.dims.slices == e => {
                Some((e, rows, cols))
            }
            _ => None,
        };
        let Some((e, rows, cols)) = one else {
            i += 1;
            continue;
        };
        let o = outputs.swap_remove(i);
        let Some((block, proj)) = stacked(&o.name) else {
            continue;
        };
        let Source::Decode(job) = o.source else {
            continue;
        };
        let out = job.out;
        let job = Arc::new(*job);
        let names: Vec<String> = (0..e).map(|x| format!("{block}.experts.{x}.{proj}.weight")).collect();
        for (x, name) in names.iter().enumerate() {
            let piece = Piece {
                job: job.clone(),
                row: x * rows,
            };
            outputs.push(Output {
                name: name.clone(),
                shard: o.shard,
                shape: vec![rows, cols],
                dtype: o.dtype,
                source: Source::Assemble(Assembly {
                    stack: Stack::band(rows, vec![piece]),
                    cols,
                    out,
                }),
                scheme: o.scheme.clone(),
            });
        }
        split.push(Unstacked {
            stored: o.name,
            experts: names,
        });
    }
    split
}

/// Puts the stacks `split` back in place of their experts' outputs.
pub(super) fn restack(outputs: &mut Vec<Output<'_>>, split: Vec<Unstacked>) {
    for u in split {
        let mut job = None;
        let mut first = None;
        outputs.retain(|o| {
            if !u.experts.contains(&o.name) {
                return true;
            }
            if let (Source::Assemble(a), None) = (&o.source, &job) {
                job = a.stack.bands.first().and_then(|b| b.parts.first()).map(|p| p.job.clone());
                first = Some((o.shard, o.dtype, o.scheme.clone(), o.shape.clone()));
            }
            false
        });
        let (Some(job), Some((shard, dtype, scheme, shape))) = (job, first) else {
            continue;
        };
        let mut shape = shape;
        shape.insert(0, u.experts.len());
        outputs.push(Output {
            name: u.stored,
            shard,
            shape,
            dtype,
            source: Source::Decode(Box::new(Arc::unwrap_or_clone(job))),
            scheme,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::stacked;

    #[test]
    fn only_switch_mlp_projections_are_stacks() {
        assert_eq!(
            stacked("model.layers.3.mlp.switch_mlp.gate_proj.weight"),
            Some(("model.layers.3.mlp", "gate_proj"))
        );
        for not in [
            "model.layers.3.mlp.switch_mlp.gate_proj.scales",
            "model.layers.3.mlp.gate.weight",
            "model.layers.3.mlp.experts.0.gate_proj.weight",
            "model.layers.3.mlp.switch_mlp.router.weight",
        ] {
            assert_eq!(stacked(not), None, "{not}");
        }
    }
}
