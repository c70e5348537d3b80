//! The output's `config.json`: the checkpoint's, rewritten for dense weights.

use serde_json::Value;

use crate::numerics::{DtypeChoice, OutDtype};

/// The checkpoint's `config.json` as the dense output's: without its
/// `quantization_config` (nor MLX's `quantization`, nor DeepSeek-V4's
/// top-level `expert_dtype`, which says how its experts were quantized),
/// and with its dtypes set to the one asked for.
pub(crate) fn dense_config(config: &Value, choice: DtypeChoice) -> Value {
    let mut v = config.clone();
    if let Some(obj) = v.as_object_mut() {
        if obj.remove("quantization_config").is_some() {
            obj.remove("expert_dtype");
        }
        obj.remove("quantization");
    }
    if let DtypeChoice::Fixed(to) = choice {
        set_config_dtype(&mut v, to);
    }
    v
}

/// Sets every dtype entry of a `config.json` (`torch_dtype`, `dtype`, also in
/// nested configs such as `text_config`) that names a floating dtype to `to`.
fn set_config_dtype(v: &mut Value, to: OutDtype) {
    let Some(obj) = v.as_object_mut() else {
        return;
    };
    for (key, value) in obj.iter_mut() {
        match value {
            Value::String(name)
                if (key == "torch_dtype" || key == "dtype")
                    && OutDtype::from_name(name).is_some() =>
            {
                *name = to.torch_name().to_string();
            }
            Value::Object(_) => set_config_dtype(value, to),
            _ => {}
        }
    }
}

/// A decoder's sizes as transformers' text configs name them, from
/// `config.json` (or its `text_config`): what its Linear and embedding
/// shapes follow from. Only `hidden_size` is required; a size whose keys
/// are missing (or that overflows) is `None`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// `hidden_size`.
    pub(crate) hidden: usize,
    /// `intermediate_size`.
    pub(crate) intermediate: Option<usize>,
    /// q_proj's rows: `num_attention_heads · head_dim`.
    pub(crate) q: Option<usize>,
    /// k_proj's and v_proj's rows: `num_key_value_heads · head_dim`.
    pub(crate) kv: Option<usize>,
    /// `vocab_size`.
    pub(crate) vocab: Option<usize>,
    /// Gemma 3n/4's per-layer embeddings: `vocab_size_per_layer_input` and
    /// `hidden_size_per_layer_input · num_hidden_layers`.
    pub(crate) per_layer: Option<(usize, usize)>,
    /// `hidden_size_per_layer_input`.
    pub(crate) per_layer_hidden: Option<usize>,
}

impl Sizes {
    /// The sizes `cfg` gives, as transformers defaults them:
    /// `head_dim` is `hidden_size / num_attention_heads` and
    /// `num_key_value_heads` is `num_attention_heads` when unset. `None`
    /// without `hidden_size`.
    pub(crate) fn of(cfg: &Value) -> Option<Sizes> {
        let get = |k: &str| {
            cfg.get(k)
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok())
        };
        let hidden = get("hidden_size")?;
        let heads = get("num_attention_heads").filter(|&h| h > 0);
        let head_dim = get("head_dim").or_else(|| heads.map(|h| hidden / h));
        let kv_heads = get("num_key_value_heads").or(heads);
        Some(Sizes {
            hidden,
            intermediate: get("intermediate_size"),
            q: heads.zip(head_dim).and_then(|(h, d)| h.checked_mul(d)),
            kv: kv_heads.zip(head_dim).and_then(|(h, d)| h.checked_mul(d)),
            vocab: get("vocab_size"),
            per_layer: get("vocab_size_per_layer_input").zip(
                get("hidden_size_per_layer_input")
                    .zip(get("num_hidden_layers"))
                    .and_then(|(h, l)| h.checked_mul(l)),
            ),
            per_layer_hidden: get("hidden_size_per_layer_input"),
        })
    }
}
