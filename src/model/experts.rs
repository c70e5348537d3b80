//! Routed experts: the stacks of experts of a checkpoint, each expert a
//! product of its own, and products whose rows go to different experts of
//! one stack (llama.cpp's `mul_mat_id`), on the CPU and uploaded whole for
//! [`GpuDecoder::record_matmul_experts`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use super::held::Held;
use super::{bias, held, linear, output, product_cpu, refuse, upload_linear, InBlocks, Linear};
use crate::backend::gpu::{rows_by_expert, GpuDecoder, PackedLinear};
use crate::error::Result;
use crate::job::DecodeJob;
use crate::output::{Output, Source};
use crate::plan::Plan;

/// Every stack of experts of `plan`, sorted by name, with its experts'
/// names in expert order: a 3-D stack's (GPT-OSS's `[E, in, out]`) as
/// `NAME[e]`, which one dense tensor holds; weights stored an expert each
/// (`<block>.experts.<e>.<rest>`: Mixtral's, Qwen-MoE's, mlx-lm's
/// `switch_mlp` cut into its experts) under the stack name
/// `<block>.experts.*.<rest>`, when their experts are 0 to E - 1 (GGUF's
/// `ffn_*_exps`, which its conversion cuts into experts so named).
pub(super) fn stacks(plan: &Plan<'_>) -> Vec<(String, Vec<String>)> {
    let mut stacks = Vec::new();
    let mut apart: BTreeMap<String, BTreeMap<usize, String>> = BTreeMap::new();
    for o in &plan.outputs {
        match (&o.source, o.shape.as_slice()) {
            (Source::Decode(job), &[e, _, _]) if job.dims.slices == e => {
                let names = (0..e).map(|e| format!("{}[{e}]", o.name)).collect();
                stacks.push((o.name.clone(), names));
            }
            (_, &[_, _]) if multiplied(o).is_some() => {
                if let Some((stack, e)) = stack_of(&o.name) {
                    apart.entry(stack).or_default().insert(e, o.name.clone());
                }
            }
            _ => {}
        }
    }
    for (stack, experts) in apart {
        if experts.keys().copied().eq(0..experts.len()) {
            stacks.push((stack, experts.into_values().collect()));
        }
    }
    stacks.sort();
    stacks
}

/// The weights a product with stack `stack` of `plan` reads: the 3-D
/// stack itself, or its experts stored apart (of those, only the ones
/// `ids` name when it is given).
pub(super) fn weights(plan: &Plan<'_>, stack: &str, ids: Option<&[u32]>) -> Result<Vec<String>> {
    let experts = count(plan, stack)?;
    if expert_name(stack, 0).is_none() {
        return Ok(vec![stack.to_string()]);
    }
    let routed = |e: &usize| ids.is_none_or(|ids| ids.contains(&(*e as u32)));
    let names = (0..experts).filter(routed);
    Ok(names.filter_map(|e| expert_name(stack, e)).collect())
}

/// `(<block>.experts.*.<rest>, e)` of an expert's weight `<block>.experts.<e>.<rest>`.
fn stack_of(name: &str) -> Option<(String, usize)> {
    let (block, tail) = name.rsplit_once(".experts.")?;
    let (index, rest) = tail.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let e = index.parse().ok()?;
    Some((format!("{block}.experts.*.{rest}"), e))
}

/// The name of expert `e` of a stack stored an expert each.
fn expert_name(stack: &str, e: usize) -> Option<String> {
    let (block, rest) = stack.split_once(".experts.*.")?;
    Some(format!("{block}.experts.{e}.{rest}"))
}

/// The quantized weight of a 2-D output the products take, and its rows:
/// decoded whole (a plan's job, a GGUF tensor's blocks), or rows of one
/// stacked job (an mlx-lm expert, `switch_mlp`'s).
fn multiplied<'p, 'c>(o: &'p Output<'c>) -> Option<(Held<'p, 'c>, Option<Range<usize>>)> {
    let Source::Assemble(a) = &o.source else {
        return Held::of(&o.source).map(|held| (held, None));
    };
    let [band] = a.stack.bands.as_slice() else {
        return None;
    };
    let [piece] = band.parts.as_slice() else {
        return None;
    };
    let job = &*piece.job;
    let whole = o.shape == [band.rows, a.cols] && job.dims.cols == a.cols;
    (whole && !a.interleaved && !job.transposed)
        .then_some((Held::Job(job), Some(piece.row..piece.row + band.rows)))
}

/// How many experts stack `stack` of `plan` has (ARG-001 when it is none).
fn count(plan: &Plan<'_>, stack: &str) -> Result<usize> {
    if let Ok(o) = output(plan, stack) {
        return match (&o.source, o.shape.as_slice()) {
            (Source::Decode(job), &[e, _, _]) if job.dims.slices == e => Ok(e),
            _ => Err(refuse(plan, stack, "is not a stack of experts")),
        };
    }
    let is_expert = |e| {
        expert_name(stack, e)
            .and_then(|name| output(plan, &name).ok())
            .is_some_and(|o| o.shape.len() == 2 && multiplied(o).is_some())
    };
    match (0..).find(|&e| !is_expert(e)) {
        Some(e) if e > 0 => Ok(e),
        _ => Err(refuse(
            plan,
            stack,
            "no stack of experts of that name (Model::expert_stacks lists them)",
        )),
    }
}

/// Expert `e` of a stack: its quantized weight, the weight (and expert of
/// it) its product is named by, and its rows of a stacked job, where it is
/// some. Its job is the caller's to map ([`Held::rows`], [`Held::job`]):
/// a GGUF tensor's is built from the rows it reads, which must outlive it.
struct Expert<'p, 'c> {
    held: Held<'p, 'c>,
    weight: (String, Option<usize>),
    rows: Option<Range<usize>>,
}

/// Expert `e` of stack `stack` of `plan`.
fn expert<'p, 'c>(plan: &'p Plan<'c>, stack: &str, e: usize) -> Result<Expert<'p, 'c>> {
    let Some(name) = expert_name(stack, e) else {
        let held = held(plan, stack)?;
        let weight = (stack.to_string(), Some(e));
        return Ok(Expert {
            held,
            weight,
            rows: None,
        });
    };
    let Some((held, rows)) = multiplied(output(plan, &name)?) else {
        return Err(refuse(plan, &name, "is not a quantized weight"));
    };
    Ok(Expert {
        held,
        weight: (name, None),
        rows,
    })
}

impl Expert<'_, '_> {
    /// Its product, whose job is `job` (its [`Held::job`]).
    fn linear<'a, 'c>(&self, plan: &Plan<'c>, job: &'a DecodeJob<'c>) -> Result<Linear<'a, 'c>> {
        let (name, e) = (&self.weight.0, self.weight.1);
        let Some(rows) = self.rows.clone() else {
            return linear(plan, (name, e), job);
        };
        let (n, k) = (rows.len(), job.dims.cols);
        Ok(Linear {
            job: Cow::Borrowed(job),
            rows,
            shape: (n, k),
            bias: bias(plan, name, n, 0..n)?,
        })
    }

    /// The name its errors give.
    fn name(&self) -> &str {
        &self.weight.0
    }
}

/// `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` on the CPU for the `m` rows of `x`:
/// each expert's rows gathered and multiplied as
/// [`super::Model::matmul_cpu`] multiplies them, so each row's result is
/// the one its expert gives it alone.
pub(super) fn matmul_cpu(
    plan: &Plan<'_>,
    stack: &str,
    x: &[f32],
    m: usize,
    ids: &[u32],
) -> Result<Vec<f32>> {
    let experts = count(plan, stack)?;
    let groups = rows_by_expert(ids, m, experts).map_err(|d| refuse(plan, stack, d))?;
    let mut y = Vec::new();
    let mut shape = None;
    for (e, rows) in groups {
        let x_e = expert(plan, stack, e)?;
        let name = x_e.name();
        // Its rows of x, once its shape is checked against expert 0's.
        let mut x_of = |(n, k): (usize, usize)| {
            if *shape.get_or_insert((n, k)) != (n, k) {
                return Err(refuse(
                    plan,
                    name,
                    "is not the shape of its stack's expert 0",
                ));
            }
            if m.checked_mul(k) != Some(x.len()) {
                let detail = format!("x holds {} values, not {m} rows of {k}", x.len());
                return Err(refuse(plan, stack, detail));
            }
            let xe: Vec<f32> = rows
                .iter()
                .flat_map(|&r| &x[r * k..(r + 1) * k])
                .copied()
                .collect();
            Ok(xe)
        };
        // Multiplied as matmul_cpu multiplies it: in its blocks where
        // they are GGUF's common types, else its job decoded.
        let in_blocks = x_e
            .rows
            .is_none()
            .then(|| InBlocks::of(plan, &x_e.held, (name, x_e.weight.1)));
        let (ye, n) = match in_blocks.flatten() {
            Some(w) => (
                w.product(plan, name, &x_of(w.shape)?, rows.len())?,
                w.shape.0,
            ),
            None => {
                let stored = x_e.held.rows()?;
                let job = x_e.held.job(stored.as_deref())?;
                let w = x_e.linear(plan, &job)?;
                let (xe, n) = (x_of(w.shape)?, w.shape.0);
                (product_cpu(plan, w, name, &xe, rows.len())?, n)
            }
        };
        y.resize(m * n, 0f32);
        for (&r, yr) in rows.iter().zip(ye.chunks_exact(n.max(1))) {
            y[r * n..(r + 1) * n].copy_from_slice(yr);
        }
    }
    Ok(y)
}

/// Every expert of stack `stack` of `plan` resident on `decoder`'s device
/// as its packs are stored, in one [`PackedLinear`].
pub(super) async fn upload(
    plan: &Plan<'_>,
    stack: &str,
    decoder: &GpuDecoder,
) -> Result<PackedLinear> {
    let experts = count(plan, stack)?;
    let mut packed = Vec::with_capacity(experts);
    for e in 0..experts {
        let x_e = expert(plan, stack, e)?;
        let stored = x_e.held.rows()?;
        let job = x_e.held.job(stored.as_deref())?;
        let w = x_e.linear(plan, &job)?;
        packed.push(upload_linear(plan, w, x_e.name(), decoder).await?);
    }
    PackedLinear::stack(packed, stack)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_experts_stored_apart() {
        let stack = "model.layers.0.mlp.experts.*.gate_proj.weight";
        let one = "model.layers.0.mlp.experts.12.gate_proj.weight";
        assert_eq!(stack_of(one), Some((stack.to_string(), 12)));
        assert_eq!(expert_name(stack, 12).as_deref(), Some(one));
        assert_eq!(stack_of("model.layers.0.mlp.experts.gate_up_proj"), None);
        assert_eq!(stack_of("a.experts.+1.w"), None);
        assert_eq!(
            expert_name("model.layers.0.mlp.experts.gate_up_proj", 1),
            None
        );
    }
}
