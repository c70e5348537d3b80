//! The rope scaling a GGUF file states, as the `rope_parameters` of
//! transformers' config: llama.cpp keeps Llama 3's scaling as per-dimension
//! factors (`rope_freqs`), Phi-3's LongRoPE as two factor lists
//! (`rope_factors_long`/`short`), and linear and YaRN scaling as
//! `ARCH.rope.scaling.*` keys. transformers' own GGUF loader reads none of
//! them; a config without them is another model past the original context.
//!
//! Where transformers has no parameters that give the file's rotation, its
//! default stays and a warning says why (HF-002).

use serde_json::{json, Map, Value};

use super::Arch;
use crate::error::Warning;
use crate::error::{Error, Result, Rule};
use crate::gguf::{Gguf, MetaValue};

/// Reads a GGUF tensor's values (`None` when the file has no such tensor).
pub(crate) type Factors<'f> = &'f dyn Fn(&str) -> Result<Option<Vec<f32>>>;

/// Meta's own Llama 3 values, and the original context transformers'
/// docstring gives for them (8192): what a file that states no original
/// context was made from.
const LLAMA3_CONTEXT: f64 = 8192.0;
const LLAMA3_LOW: f64 = 1.0;
const LLAMA3_HIGH: f64 = 4.0;

/// How close transformers' inverse frequencies must come to llama.cpp's
/// (relative), for a fit to count.
const TOLERANCE: f64 = 1e-5;

/// Sets the file's rope scaling into `c` (its `rope_parameters`, or their
/// `full_attention` entry where layers differ), with the warnings of what
/// cannot be stated. `rotary` is the rotary width (`head_dim` times the
/// partial factor).
pub(crate) fn scale(
    c: &mut Map<String, Value>,
    gguf: &Gguf,
    arch: &Arch,
    rotary: usize,
    factors: Factors<'_>,
) -> Result<Vec<Warning>> {
    let key = |k: &str| format!("{}.rope.scaling.{k}", arch.gguf);
    let mut warnings = Vec::new();
    let theta = rope_theta(c);
    let original = whole(gguf, &key("original_context_length"))?;
    let kind = match gguf.get(&key("type")) {
        None => None,
        Some(MetaValue::String(s)) => Some(s.as_str()),
        Some(v) => return Err(wrong_type(&key("type"), v, "a string")),
    };
    let mut params = Map::new();
    if let Some(freqs) = factors("rope_freqs.weight")? {
        check_len("rope_freqs.weight", &freqs, rotary)?;
        let context = original.map_or(LLAMA3_CONTEXT, |n| n as f64);
        match llama3(&freqs, theta, rotary, context) {
            Ok(p) => params = p,
            Err(why) => warnings.push(Warning::new(
                Rule::Unstated,
                "rope_freqs.weight",
                format!("per-dimension rope factors that no llama3 rope_parameters reproduce ({why}); config.json keeps rope_type default, so positions past the original context rotate differently than llama.cpp rotates them"),
            )),
        }
    }
    let (long, short) = (
        factors("rope_factors_long.weight")?,
        factors("rope_factors_short.weight")?,
    );
    if long.is_some() || short.is_some() {
        let (Some(long), Some(short)) = (long, short) else {
            return Err(Error::bare(
                Rule::GgufValue,
                "rope_factors_long.weight and rope_factors_short.weight: LongRoPE needs both, the file has one",
            ));
        };
        check_len("rope_factors_long.weight", &long, rotary)?;
        check_len("rope_factors_short.weight", &short, rotary)?;
        let original = original.ok_or_else(|| {
            Error::bare(
                Rule::GgufValue,
                format!(
                    "{}: LongRoPE factors without the original context they extend",
                    key("original_context_length")
                ),
            )
        })?;
        params.insert("rope_type".into(), json!("longrope"));
        params.insert("long_factor".into(), widened(&long));
        params.insert("short_factor".into(), widened(&short));
        params.insert("original_max_position_embeddings".into(), json!(original));
        if let Some(a) = positive(gguf, &key("attn_factor"))? {
            params.insert("attention_factor".into(), json!(a));
        }
        // Phi-3's config keeps it beside rope_parameters too, and
        // transformers takes that one first.
        c.insert("original_max_position_embeddings".into(), json!(original));
    } else if params.is_empty() {
        match kind {
            None | Some("none") => {}
            Some("linear") => {
                let factor = required(gguf, &key("factor"))?;
                params.insert("rope_type".into(), json!("linear"));
                params.insert("factor".into(), json!(factor));
            }
            Some("yarn") => {
                params.insert("rope_type".into(), json!("yarn"));
                params.insert("factor".into(), json!(required(gguf, &key("factor"))?));
                let original = original.ok_or_else(|| {
                    Error::bare(
                        Rule::GgufValue,
                        format!("{}: YaRN without the original context it extends", key("original_context_length")),
                    )
                })?;
                params.insert("original_max_position_embeddings".into(), json!(original));
                for (k, field) in [
                    ("yarn_attn_factor", "attention_factor"),
                    ("yarn_beta_fast", "beta_fast"),
                    ("yarn_beta_slow", "beta_slow"),
                ] {
                    if let Some(v) = positive(gguf, &key(k))? {
                        params.insert(field.into(), json!(v));
                    }
                }
                for k in ["yarn_ext_factor", "yarn_log_multiplier"] {
                    if gguf.get(&key(k)).is_some() {
                        warnings.push(Warning::new(
                            Rule::Unstated,
                            key(k),
                            "transformers' yarn rope_parameters have no such parameter; left out",
                        ));
                    }
                }
            }
            Some(other) => warnings.push(Warning::new(
                Rule::Unstated,
                key("type"),
                format!("rope scaling {other:?} without the tensors it needs, or of a kind transformers has no parameters for; config.json keeps rope_type default"),
            )),
        }
    }
    if params.is_empty() {
        return Ok(warnings);
    }
    if arch.model_type == "phi3" && params.get("rope_type") != Some(&json!("longrope")) {
        // Phi3Config takes default and longrope only.
        warnings.push(Warning::new(
            Rule::Unstated,
            key("type"),
            "Phi-3's config takes LongRoPE only; the file's rope scaling is left out",
        ));
        return Ok(warnings);
    }
    // Gemma 3 scales its full-attention layers only.
    if let Some(m) = full_attention(c) {
        m.extend(params);
    }
    Ok(warnings)
}

/// The rope parameters of the full-attention layers (Gemma's keep those of
/// their sliding-window layers apart), made with the class's default type
/// where the config has none.
pub(crate) fn full_attention(c: &mut Map<String, Value>) -> Option<&mut Map<String, Value>> {
    let rope = c
        .entry("rope_parameters")
        .or_insert_with(|| json!({"rope_type": "default"}));
    let rope = match rope.get("full_attention") {
        // Present, so indexing finds it rather than inserting.
        Some(_) => &mut rope["full_attention"],
        None => rope,
    };
    rope.as_object_mut()
}

/// `rope_parameters.rope_theta` as set from the file (or the class's).
fn rope_theta(c: &Map<String, Value>) -> f64 {
    let rope = c.get("rope_parameters");
    let at = rope.and_then(|r| r.get("full_attention")).or(rope);
    at.and_then(|r| r.get("rope_theta"))
        .and_then(Value::as_f64)
        .unwrap_or(10000.0)
}

/// f32 values as JSON numbers, widened exactly (as transformers' GGUF
/// reader widens them).
fn widened(v: &[f32]) -> Value {
    Value::Array(v.iter().map(|&x| json!(f64::from(x))).collect())
}

fn check_len(name: &str, v: &[f32], rotary: usize) -> Result<()> {
    if v.len() != rotary / 2 {
        return Err(Error::bare(
            Rule::GgufValue,
            format!(
                "{name}: {} factors, but a rotary width of {rotary} has {}",
                v.len(),
                rotary / 2
            ),
        ));
    }
    if let Some(x) = v.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        return Err(Error::bare(
            Rule::GgufValue,
            format!("{name}: a factor of {x}; rope factors are finite and positive"),
        ));
    }
    Ok(())
}

/// The tensors whose values this reads: the config states them, so they
/// are not written (`--keep-names` writes them).
pub(crate) const TENSORS: [&str; 3] = [
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "rope_factors_short.weight",
];

fn wrong_type(key: &str, v: &MetaValue, want: &str) -> Error {
    Error::bare(
        Rule::GgufValue,
        format!("{key} is {}, expected {want}", shown(v)),
    )
}

/// A metadata value for a message: short, whatever the file holds.
pub(crate) fn shown(v: &MetaValue) -> String {
    match v {
        MetaValue::Array(items) => format!("an array of {} values", items.len()),
        MetaValue::String(s) if s.chars().count() > 40 => {
            format!("the string {:?}…", s.chars().take(40).collect::<String>())
        }
        MetaValue::String(s) => format!("the string {s:?}"),
        MetaValue::Bool(b) => format!("the boolean {b}"),
        other => other.as_f64().map_or_else(String::new, |x| x.to_string()),
    }
}

/// A positive finite number under `key`, if the file has the key.
pub(crate) fn positive(gguf: &Gguf, key: &str) -> Result<Option<f64>> {
    gguf.get(key).map(|v| positive_value(key, v)).transpose()
}

/// The value `v` of `key`, when it is a positive finite number.
pub(crate) fn positive_value(key: &str, v: &MetaValue) -> Result<f64> {
    let x = v.as_f64().ok_or_else(|| wrong_type(key, v, "a number"))?;
    if !(x.is_finite() && x > 0.0) {
        return Err(Error::bare(
            Rule::GgufValue,
            format!("{key} is {x}; it must be finite and positive"),
        ));
    }
    Ok(x)
}

/// A positive whole number under `key`, if the file has the key.
fn whole(gguf: &Gguf, key: &str) -> Result<Option<u64>> {
    let Some(v) = gguf.get(key) else {
        return Ok(None);
    };
    match v.as_u64() {
        Some(n) if n > 0 => Ok(Some(n)),
        _ => Err(wrong_type(key, v, "a positive whole number")),
    }
}

fn required(gguf: &Gguf, key: &str) -> Result<f64> {
    positive(gguf, key)?.ok_or_else(|| {
        Error::bare(
            Rule::GgufValue,
            format!("{key} is missing for its scaling type"),
        )
    })
}

/// The llama3 `rope_parameters` whose inverse frequencies, as transformers
/// computes them, are llama.cpp's `θ^(-2i/d) / freqs[i]`, or why there are
/// none. llama.cpp's converter made `freqs` from `factor`, `low_freq_factor`,
/// `high_freq_factor` and the original context `L`: 1 where the wavelength
/// is below `L / high`, `factor` above `L / low`, and in between
/// `1 / ((1 − s) / factor + s)` with `s = (L / wavelength − low) / (high − low)`.
/// The factors fix `factor` and `low / L`, `high / L`; `L` is the file's
/// original context, else Llama 3's 8192.
fn llama3(
    freqs: &[f32],
    theta: f64,
    dim: usize,
    context: f64,
) -> std::result::Result<Map<String, Value>, String> {
    let inv: Vec<f64> = (0..freqs.len())
        .map(|i| 1.0 / theta.powf((2 * i) as f64 / dim as f64))
        .collect();
    let wavelen: Vec<f64> = inv.iter().map(|f| 2.0 * std::f64::consts::PI / f).collect();
    let f: Vec<f64> = freqs.iter().map(|&x| f64::from(x)).collect();
    let factor = f.iter().copied().fold(1.0, f64::max);
    let near = |a: f64, b: f64| (a - b).abs() <= TOLERANCE * b.abs();
    // Between the regions, each factor gives s, and s is linear in L / wavelength.
    let medium: Vec<(f64, f64)> = (0..f.len())
        .filter(|&i| !near(f[i], 1.0) && !near(f[i], factor))
        .map(|i| {
            let s = (1.0 / f[i] - 1.0 / factor) / (1.0 - 1.0 / factor);
            (context / wavelen[i], s)
        })
        .collect();
    let mut candidates = vec![(LLAMA3_LOW, LLAMA3_HIGH)];
    match (medium.first(), medium.last()) {
        (Some(&(x0, s0)), Some(&(x1, s1))) if medium.len() > 1 && x1 != x0 => {
            let slope = (s1 - s0) / (x1 - x0);
            let low = x0 - s0 / slope;
            candidates.push((low, low + 1.0 / slope));
        }
        (None, None) => {
            // No factor in between: any boundaries in the gap hold.
            let ones = (0..f.len())
                .filter(|&i| near(f[i], 1.0))
                .map(|i| wavelen[i]);
            let top = ones.fold(0.0, f64::max);
            let scaled = (0..f.len())
                .filter(|&i| !near(f[i], 1.0))
                .map(|i| wavelen[i]);
            let bottom = scaled.fold(f64::INFINITY, f64::min);
            if top > 0.0 && bottom.is_finite() && bottom > top {
                let (hi_w, lo_w) = (top + (bottom - top) / 3.0, top + 2.0 * (bottom - top) / 3.0);
                candidates.push((context / lo_w, context / hi_w));
            }
        }
        _ => {}
    }
    for (low, high) in candidates {
        if !(low.is_finite() && high.is_finite() && low > 0.0 && high > low) {
            continue;
        }
        let fits = (0..f.len()).all(|i| {
            let ours = transformers_llama3(inv[i], factor, low, high, context);
            near(ours, inv[i] / f[i])
        });
        if fits {
            let mut p = Map::new();
            p.insert("rope_type".into(), json!("llama3"));
            p.insert("factor".into(), json!(factor));
            p.insert("low_freq_factor".into(), json!(low));
            p.insert("high_freq_factor".into(), json!(high));
            p.insert(
                "original_max_position_embeddings".into(),
                json!(context as u64),
            );
            return Ok(p);
        }
    }
    Err(match medium.len() {
        0 | 1 => "factors with no smooth transition of llama3's shape".to_string(),
        n => format!("{n} factors between 1 and {factor} not on llama3's curve"),
    })
}

/// One inverse frequency as transformers' `_compute_llama3_parameters`
/// scales it.
pub(crate) fn transformers_llama3(inv: f64, factor: f64, low: f64, high: f64, context: f64) -> f64 {
    let (low_w, high_w) = (context / low, context / high);
    let wavelen = 2.0 * std::f64::consts::PI / inv;
    if wavelen < high_w {
        inv
    } else if wavelen > low_w {
        inv / factor
    } else {
        let s = (context / wavelen - low) / (high - low);
        (1.0 - s) * inv / factor + s * inv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's converter (`LlamaModel.generate_extra_tensors`).
    fn llama_cpp(
        theta: f64,
        dim: usize,
        factor: f64,
        low: f64,
        high: f64,
        context: f64,
    ) -> Vec<f32> {
        (0..dim / 2)
            .map(|i| {
                let freq = 1.0 / theta.powf((2 * i) as f64 / dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < context / high {
                    1.0
                } else if wavelen > context / low {
                    factor as f32
                } else {
                    let s = (context / wavelen - low) / (high - low);
                    (1.0 / ((1.0 - s) / factor + s)) as f32
                }
            })
            .collect()
    }

    #[test]
    fn llama3_factors_give_their_parameters_back() {
        for (theta, dim, factor, low, high, context) in [
            (500000.0, 64, 32.0, 1.0, 4.0, 8192.0),
            (500000.0, 128, 8.0, 1.0, 4.0, 8192.0),
            (500000.0, 128, 16.0, 2.0, 6.0, 8192.0),
            (10000.0, 64, 4.0, 1.0, 4.0, 4096.0),
        ] {
            let freqs = llama_cpp(theta, dim, factor, low, high, context);
            let p = llama3(&freqs, theta, dim, context).unwrap();
            assert_eq!(p["factor"], json!(factor));
            let (l, h) = (
                p["low_freq_factor"].as_f64().unwrap(),
                p["high_freq_factor"].as_f64().unwrap(),
            );
            for (i, &f) in freqs.iter().enumerate() {
                let inv = 1.0 / theta.powf((2 * i) as f64 / dim as f64);
                let ours = transformers_llama3(inv, factor, l, h, context);
                assert!(
                    (ours - inv / f64::from(f)).abs() <= 1e-5 * ours,
                    "{theta} {dim} {i}"
                );
            }
        }
    }

    #[test]
    fn a_ramp_is_no_llama3_scaling() {
        let ramp: Vec<f32> = (0..32).map(|i| 1.0 + 7.0 * i as f32 / 31.0).collect();
        assert!(llama3(&ramp, 10000.0, 64, 8192.0).is_err());
    }
}
