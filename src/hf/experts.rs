//! MoE experts stored as one stacked tensor (mlx-lm's
//! `<block>.switch_mlp.{gate,up,down}_proj` of shape `[E, out, in]`),
//! written one tensor per expert under the names transformers loads:
//! `<block>.experts.<e>.{gate,up,down}_proj.weight` (Qwen2/3-MoE,
//! DeepSeek-style; Mixtral-style ones then take their hub names,
//! [`super::names`]). Each expert's tensor is rows of the one stacked job,
//! decoded where it is written; `--keep-names` keeps the stack.

use std::sync::Arc;

use crate::numerics::OutDtype;
use crate::output::assembly::{Assembly, Piece, Stack};
use crate::output::rearrange::Rearrange;
use crate::output::{Output, Source};

/// The projections a stack holds.
const PROJECTIONS: &[&str] = &["gate_proj", "up_proj", "down_proj"];

/// `(block, projection)` of a stacked expert weight's name.
fn stacked(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_suffix(".weight")?;
    let (block, proj) = rest.rsplit_once(".switch_mlp.")?;
    PROJECTIONS.contains(&proj).then_some((block, proj))
}

/// Replaces every decoded stack of experts in `outputs` by one output per
/// expert.
pub(crate) fn unstack(outputs: &mut Vec<Output<'_>>) {
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
        for x in 0..e {
            let piece = Piece {
                job: job.clone(),
                row: x * rows,
            };
            outputs.push(Output {
                name: format!("{block}.experts.{x}.{proj}.weight"),
                shard: o.shard,
                shape: vec![rows, cols],
                dtype: o.dtype,
                source: Source::Assemble(Assembly {
                    stack: Stack::band(rows, vec![piece]),
                    cols,
                    out,
                    interleaved: false,
                }),
                scheme: o.scheme.clone(),
            });
        }
    }
}

/// GPT-OSS as mlx-lm stores it (`gpt_oss.py`'s `sanitize`): per block
/// `<block>.experts.{gate,up,down}_proj.weight` `[E, out, in]` and `.bias`
/// `[E, out]`, gate and up taken apart from the fused projection.
/// transformers' `GptOssExperts` multiplies `x·W`: `gate_up_proj`
/// `[E, H, 2I]` (gate and up in turn along its columns),
/// `gate_up_proj_bias` `[E, 2I]`, `down_proj` `[E, I, H]`,
/// `down_proj_bias` `[E, H]`. This writes those: the jobs transposed, the
/// gate's and up's columns interleaved as they are written.
pub(crate) fn fuse_gpt_oss<'a>(outputs: &mut Vec<Output<'a>>) {
    const GATE: &str = ".experts.gate_proj.weight";
    let blocks: Vec<String> = outputs
        .iter()
        .filter_map(|o| o.name.strip_suffix(GATE).map(str::to_string))
        .collect();
    for block in blocks {
        let name = |p: &str, what: &str| format!("{block}.experts.{p}.{what}");
        let job = |outputs: &[Output<'a>], n: &str| {
            outputs
                .iter()
                .find(|o| o.name == n && o.shape.len() == 3)
                .and_then(|o| match &o.source {
                    Source::Decode(job) if job.dims.slices == o.shape[0] => Some((**job).clone()),
                    _ => None,
                })
        };
        let (Some(gate), Some(up), Some(down)) = (
            job(outputs, &name("gate_proj", "weight")),
            job(outputs, &name("up_proj", "weight")),
            job(outputs, &name("down_proj", "weight")),
        ) else {
            continue;
        };
        if gate.dims != up.dims || gate.out != up.out {
            continue;
        }
        let taken: Vec<String> = ["gate_proj", "up_proj", "down_proj"]
            .iter()
            .flat_map(|p| [name(p, "weight"), name(p, "bias")])
            .collect();
        let (removed, kept): (Vec<_>, Vec<_>) = std::mem::take(outputs)
            .into_iter()
            .partition(|o| taken.contains(&o.name));
        *outputs = kept;
        let find = |n: &str| removed.iter().find(|o| o.name == n);
        let Some(first) = find(&name("gate_proj", "weight")) else {
            continue;
        };
        let (shard, dtype, scheme) = (first.shard, first.dtype, first.scheme.clone());
        let (e, hidden, inter) = (gate.dims.slices, gate.dims.cols, gate.dims.rows);
        let out = gate.out;
        let pieces = [gate, up].map(|j| Piece {
            job: Arc::new(j.transpose()),
            row: 0,
        });
        let mut made = vec![
            Output {
                name: format!("{block}.experts.gate_up_proj"),
                shard,
                shape: vec![e, hidden, 2 * inter],
                dtype,
                source: Source::Assemble(Assembly {
                    stack: Stack::band(e * hidden, pieces.into()),
                    cols: 2 * inter,
                    out,
                    interleaved: true,
                }),
                scheme: scheme.map(|s| format!("{s}, transposed, gate and up interleaved")),
            },
            Output {
                name: format!("{block}.experts.down_proj"),
                shard,
                shape: vec![e, down.dims.cols, down.dims.rows],
                dtype,
                scheme: find(&name("down_proj", "weight"))
                    .and_then(|o| o.scheme.clone())
                    .map(|s| format!("{s}, transposed")),
                source: Source::Decode(Box::new(down.transpose())),
            },
        ];
        // The stored outputs remade; any other stays as it was.
        let mut used: Vec<String> = ["gate_proj", "up_proj", "down_proj"]
            .iter()
            .map(|p| name(p, "weight"))
            .collect();
        // The biases, as stored or cast: gate's and up's in turn.
        let bias = |p: &str| {
            find(&name(p, "bias")).and_then(|o| match o.source {
                Source::Copy(t) => Some((o, t, Source::Copy(t))),
                Source::Cast(t, to) => Some((o, t, Source::Cast(t, to))),
                _ => None,
            })
        };
        if let (Some((g, gt, gs)), Some((_, ut, _))) = (bias("gate_proj"), bias("up_proj")) {
            let to = match gs {
                Source::Cast(_, to) => Some(to),
                _ => [OutDtype::Bf16, OutDtype::F16, OutDtype::F32]
                    .into_iter()
                    .find(|d| d.safetensors() == gt.dtype),
            };
            if let (Some(to), true) = (to, gt.shape == ut.shape && gt.dtype == ut.dtype) {
                let interleave = Rearrange::Interleave {
                    parts: vec![gt, ut],
                    to,
                };
                made.push(Output {
                    name: format!("{block}.experts.gate_up_proj_bias"),
                    shard: g.shard,
                    shape: interleave.shape(),
                    dtype: to.safetensors(),
                    source: Source::Rearrange(interleave),
                    scheme: None,
                });
                used.extend([name("gate_proj", "bias"), name("up_proj", "bias")]);
            }
        }
        if let Some((d, _, source)) = bias("down_proj") {
            made.push(Output {
                name: format!("{block}.experts.down_proj_bias"),
                shard: d.shard,
                shape: d.shape.clone(),
                dtype: d.dtype,
                source,
                scheme: None,
            });
            used.push(name("down_proj", "bias"));
        }
        outputs.extend(removed.into_iter().filter(|o| !used.contains(&o.name)));
        outputs.extend(made);
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
