//! Dense tensor names where an architecture's own checkpoints name a tensor
//! differently from the quantized file.
//!
//! llmcompressor linearizes MoE experts before it quantizes them, so a
//! quantized Mixtral stores `block_sparse_moe.experts.N.{gate,up,down}_proj`.
//! transformers' Mixtral-style loaders only know the hub names
//! (`w1`, `w3`, `w2`, which they fuse into `experts.gate_up_proj` and
//! `experts.down_proj`): under the stored names every expert would be
//! missing and randomly initialised. One table, keyed by `model_type`:
//!
//! | model_type | stored | dense |
//! |---|---|---|
//! | `mixtral`, `minimax`, `minimax_m2` | `block_sparse_moe.experts.N.gate_proj` | `block_sparse_moe.experts.N.w1` |
//! | | `block_sparse_moe.experts.N.up_proj` | `block_sparse_moe.experts.N.w3` |
//! | | `block_sparse_moe.experts.N.down_proj` | `block_sparse_moe.experts.N.w2` |
//!
//! Qwen2-style MoE (Qwen2/3-MoE, DeepSeek-V2/V3, GLM-4-MoE, …) keeps
//! `gate_proj`/`up_proj`/`down_proj` on the hub too: nothing to map.

/// Model types whose hub checkpoints name experts `w1`/`w3`/`w2`.
pub(crate) const MIXTRAL_STYLE: &[&str] = &["mixtral", "minimax", "minimax_m2"];

/// `(stored, hub)` names of one expert projection.
const EXPERT_NAMES: &[(&str, &str)] =
    &[("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")];

/// The hub name of tensor `name` in a `model_type` checkpoint, when it
/// differs from the stored one.
pub(crate) fn hub_name(model_type: &str, name: &str) -> Option<String> {
    if !MIXTRAL_STYLE.contains(&model_type) {
        return None;
    }
    const MOE: &str = "block_sparse_moe.experts.";
    let at = name.find(MOE)? + MOE.len();
    let (head, rest) = name.split_at(at);
    let (expert, rest) = rest.split_once('.')?;
    if expert.is_empty() || !expert.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (proj, tail) = rest.split_once('.').unwrap_or((rest, ""));
    let hub = EXPERT_NAMES.iter().find(|(s, _)| *s == proj)?.1;
    let tail = if tail.is_empty() {
        String::new()
    } else {
        format!(".{tail}")
    };
    Some(format!("{head}{expert}.{hub}{tail}"))
}

/// The `model_type` of a config.json (a multimodal config's `text_config`
/// when the top level has none).
pub(crate) fn model_type(config: &serde_json::Value) -> Option<&str> {
    config
        .get("model_type")
        .or_else(|| config.get("text_config")?.get("model_type"))
        .and_then(serde_json::Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::hub_name;

    #[test]
    fn mixtral_experts_take_hub_names() {
        let m = "model.layers.3.block_sparse_moe.experts.17";
        for (stored, hub) in [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")] {
            assert_eq!(
                hub_name("mixtral", &format!("{m}.{stored}.weight")),
                Some(format!("{m}.{hub}.weight"))
            );
        }
        for keep in [
            "model.layers.3.block_sparse_moe.gate.weight",
            "model.layers.3.block_sparse_moe.experts.17.w1.weight",
            "model.layers.3.mlp.experts.17.gate_proj.weight",
            "model.layers.3.block_sparse_moe.experts.x.gate_proj.weight",
            "model.layers.3.self_attn.q_proj.weight",
        ] {
            assert_eq!(hub_name("mixtral", keep), None, "{keep}");
        }
        assert_eq!(
            hub_name("qwen3_moe", &format!("{m}.gate_proj.weight")),
            None,
            "Qwen-style names are the hub's"
        );
    }
}
