//! A GGUF model as transformers loads it (`from_pretrained(…, gguf_file=…)`,
//! transformers 5.25): each architecture's tensor names, the layout fixes
//! its loader applies, and the `config.json` it builds from the metadata.
//! One table row per architecture; a new one is a new row.

pub(crate) mod config;
mod convert;
pub(crate) mod rope;

pub(crate) use convert::convert;

use crate::error::{Error, Result, Rule};
use crate::gguf::Gguf;

/// What transformers makes of one GGUF architecture.
#[derive(Debug)]
pub(crate) struct Arch {
    /// `general.architecture`.
    pub(crate) gguf: &'static str,
    /// transformers' `model_type`.
    pub(crate) model_type: &'static str,
    /// The model class `architectures` names.
    pub(crate) class: &'static str,
    /// The tensors outside the layers: GGUF name and Hugging Face name,
    /// both before `.weight` or `.bias`.
    pub(crate) top: &'static [(&'static str, &'static str)],
    /// Where the layers go: `model.layers.` (then `N.`).
    pub(crate) layers: &'static str,
    /// A layer's tensors: the GGUF name after `blk.N.` (before `.weight`
    /// or `.bias`) and the Hugging Face one after `{layers}N.`; `{E}`
    /// stands for the expert of a stack (`ffn_*_exps`, `[E, rows, cols]`),
    /// written one tensor per expert.
    pub(crate) layer: &'static [(&'static str, &'static str)],
    /// Q and K rows stored rotary-interleaved per head, as llama.cpp's
    /// converter permutes them for llama: un-interleaved on load.
    pub(crate) rotary_halves: bool,
    /// Norm weights stored as `w + 1` (Gemma's convention): loaded as
    /// `f32(w + 1) − 1`.
    pub(crate) norm_plus_one: bool,
    /// Metadata keys (after `ARCH.`) and the config fields they set.
    pub(crate) config: &'static [(&'static str, &'static str)],
    /// Config fields set from which tensors the file has: (field, pieces
    /// of tensor names, the value when some tensor's name holds a piece).
    pub(crate) from_tensors: &'static [(&'static str, &'static [&'static str], bool)],
    /// `tie_word_embeddings` is true even with an `output.weight` (which is
    /// then still written as `lm_head`).
    pub(crate) always_tied: bool,
}

/// Tensors outside the layers, as most architectures name them.
const TOP: &[(&str, &str)] = &[
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
];

/// Attention as llama names it.
const ATTENTION: [(&str, &str); 6] = [
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
];

/// A norm before attention and one before the MLP.
const NORMS: [(&str, &str); 2] = [
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
];

/// A dense MLP.
const MLP: [(&str, &str); 3] = [
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// A layer table: the `before` entries (its norms), llama's
/// [`ATTENTION`] (without its Q/K norms after `no_qk_norm`), then the
/// `after` entries (its MLP), in that order.
macro_rules! layer {
    (no_qk_norm [$($before:expr),* $(,)?], [$($after:expr),* $(,)?] $(,)?) => {{
        const L: &[(&str, &str)] = &[
            $($before,)*
            ATTENTION[0], ATTENTION[1], ATTENTION[2], ATTENTION[3],
            $($after),*
        ];
        L
    }};
    ([$($before:expr),* $(,)?], [$($after:expr),* $(,)?] $(,)?) => {
        layer!(no_qk_norm [$($before),*], [ATTENTION[4], ATTENTION[5], $($after),*])
    };
}

/// Llama-style layers: two norms, attention, a dense MLP.
const LLAMA: &[(&str, &str)] = layer!([NORMS[0], NORMS[1]], [MLP[0], MLP[1], MLP[2]]);

/// Qwen-style MoE layers: a router, stacked experts, and Qwen2-MoE's
/// shared expert with its gate.
const MOE: &[(&str, &str)] = layer!(
    [NORMS[0], NORMS[1]],
    [
        ("ffn_gate_inp", "mlp.gate"),
        ("ffn_gate_exps", "mlp.experts.{E}.gate_proj"),
        ("ffn_up_exps", "mlp.experts.{E}.up_proj"),
        ("ffn_down_exps", "mlp.experts.{E}.down_proj"),
        ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
        ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
        ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
        ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
    ],
);

/// Phi-3: fused QKV and fused gate-and-up, kept fused.
const PHI3: &[(&str, &str)] = &[
    NORMS[0],
    NORMS[1],
    ("attn_qkv", "self_attn.qkv_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_up", "mlp.gate_up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// Gemma 2 and 3: four norms around attention and the MLP.
const GEMMA: &[(&str, &str)] = layer!(
    [
        ("attn_norm", "input_layernorm"),
        ("post_attention_norm", "post_attention_layernorm"),
        ("ffn_norm", "pre_feedforward_layernorm"),
        ("post_ffw_norm", "post_feedforward_layernorm"),
    ],
    [MLP[0], MLP[1], MLP[2]],
);

/// StarCoder 2: LayerNorms, biases everywhere, a two-matrix MLP.
const STARCODER2: &[(&str, &str)] = layer!(
    no_qk_norm [NORMS[0], NORMS[1]],
    [("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj")],
);

/// StableLM: llama's names without Q/K norms (its per-head
/// `q_layernorm.norms.N` has no GGUF counterpart transformers maps).
const STABLELM: &[(&str, &str)] = layer!(
    no_qk_norm [NORMS[0], NORMS[1]],
    [MLP[0], MLP[1], MLP[2]],
);

/// Nemotron: llama's attention, an MLP of up and down only.
const NEMOTRON: &[(&str, &str)] = layer!(
    no_qk_norm [NORMS[0], NORMS[1]],
    [MLP[1], MLP[2]],
);

/// Falcon (as `FalconConfig`'s defaults build it: one norm, parallel
/// attention): fused QKV kept fused, under `transformer.`.
const FALCON_TOP: &[(&str, &str)] = &[
    ("token_embd", "transformer.word_embeddings"),
    ("output_norm", "transformer.ln_f"),
    ("output", "lm_head"),
];
const FALCON: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_qkv", "self_attention.query_key_value"),
    ("attn_output", "self_attention.dense"),
    ("ffn_up", "mlp.dense_h_to_4h"),
    ("ffn_down", "mlp.dense_4h_to_h"),
];

/// The config fields every architecture below reads (transformers'
/// `GGUF_CONFIG_MAPPING`; `head_dim` only where listed per architecture).
const COMMON: &[(&str, &str)] = &[
    ("context_length", "max_position_embeddings"),
    ("block_count", "num_hidden_layers"),
    ("feed_forward_length", "intermediate_size"),
    ("embedding_length", "hidden_size"),
    ("rope.freq_base", "rope_theta"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
    ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ("vocab_size", "vocab_size"),
];

/// The config fields an architecture reads: [`COMMON`]'s (or those at the
/// indices listed after `common`), then its own.
macro_rules! fields {
    (common [$($at:literal),*]; $($extra:expr),* $(,)?) => {{
        const F: &[(&str, &str)] = &[$(COMMON[$at],)* $($extra),*];
        F
    }};
    ($($extra:expr),* $(,)?) => {
        fields!(common [0, 1, 2, 3, 4, 5, 6, 7, 8]; $($extra),*)
    };
}

/// StarCoder 2 reads neither rope.freq_base nor vocab_size.
const STARCODER2_CONFIG: &[(&str, &str)] = fields!(
    common [0, 1, 2, 3, 5, 6];
    ("attention.layer_norm_epsilon", "norm_epsilon"),
);

/// StableLM reads no rope.freq_base (nor rope.dimension_count).
const STABLELM_CONFIG: &[(&str, &str)] = fields!(
    common [0, 1, 2, 3, 5, 6, 8];
    ("attention.layer_norm_epsilon", "layer_norm_eps"),
);

/// Nemotron: the RMS key names its (LayerNorm) epsilon.
const NEMOTRON_CONFIG: &[(&str, &str)] = fields!(
    common [0, 1, 2, 3, 4, 5, 6, 8];
    ("attention.layer_norm_rms_epsilon", "norm_eps"),
);

/// Gemma 2 and 3's config fields: the common ones, head_dim and the
/// sliding window.
const GEMMA_CONFIG: &[(&str, &str)] = fields!(
    ("attention.key_length", "head_dim"),
    ("attention.sliding_window", "sliding_window"),
);

/// What a row of [`ARCHS`] leaves out: llama's tensor names outside the
/// layers and where the layers go, the common config fields, nothing
/// permuted or offset, nothing read from the tensors. Every row names its
/// own `gguf`, `model_type`, `class` and `layer`.
const BASE: Arch = Arch {
    gguf: "",
    model_type: "",
    class: "",
    top: TOP,
    layers: "model.layers.",
    layer: &[],
    rotary_halves: false,
    norm_plus_one: false,
    config: fields!(),
    from_tensors: &[],
    always_tied: false,
};

/// The architectures converted.
pub(crate) const ARCHS: &[Arch] = &[
    Arch {
        gguf: "llama",
        model_type: "llama",
        class: "LlamaForCausalLM",
        layer: LLAMA,
        rotary_halves: true,
        // transformers reads a rotary width as llama's head_dim.
        config: fields!(("rope.dimension_count", "head_dim")),
        ..BASE
    },
    Arch {
        gguf: "qwen2",
        model_type: "qwen2",
        class: "Qwen2ForCausalLM",
        layer: LLAMA,
        ..BASE
    },
    Arch {
        gguf: "qwen3",
        model_type: "qwen3",
        class: "Qwen3ForCausalLM",
        layer: LLAMA,
        // No head_dim: Qwen3Config's default (128) applies, as in transformers.
        config: fields!(),
        ..BASE
    },
    Arch {
        gguf: "qwen2moe",
        model_type: "qwen2_moe",
        class: "Qwen2MoeForCausalLM",
        layer: MOE,
        config: fields!(
            ("expert_count", "num_experts"),
            ("expert_used_count", "num_experts_per_tok")
        ),
        ..BASE
    },
    Arch {
        gguf: "qwen3moe",
        model_type: "qwen3_moe",
        class: "Qwen3MoeForCausalLM",
        layer: MOE,
        config: fields!(
            ("attention.key_length", "head_dim"),
            ("expert_count", "num_experts"),
            ("expert_used_count", "num_experts_per_tok"),
        ),
        ..BASE
    },
    Arch {
        gguf: "phi3",
        model_type: "phi3",
        class: "Phi3ForCausalLM",
        layer: PHI3,
        ..BASE
    },
    Arch {
        gguf: "gemma2",
        model_type: "gemma2",
        class: "Gemma2ForCausalLM",
        layer: GEMMA,
        norm_plus_one: true,
        config: GEMMA_CONFIG,
        ..BASE
    },
    Arch {
        gguf: "gemma3",
        model_type: "gemma3_text",
        class: "Gemma3ForCausalLM",
        layer: GEMMA,
        norm_plus_one: true,
        config: GEMMA_CONFIG,
        ..BASE
    },
    Arch {
        gguf: "starcoder2",
        model_type: "starcoder2",
        class: "Starcoder2ForCausalLM",
        layer: STARCODER2,
        config: STARCODER2_CONFIG,
        ..BASE
    },
    Arch {
        gguf: "stablelm",
        model_type: "stablelm",
        class: "StableLmForCausalLM",
        layer: STABLELM,
        config: STABLELM_CONFIG,
        // transformers looks at the tensors: biases on Q/K/V, and a second
        // norm only where the residual is not parallel.
        from_tensors: &[
            (
                "use_qkv_bias",
                &["attn_q.bias", "attn_k.bias", "attn_v.bias"],
                true,
            ),
            ("use_parallel_residual", &["ffn_norm"], false),
        ],
        ..BASE
    },
    Arch {
        gguf: "falcon",
        model_type: "falcon",
        class: "FalconForCausalLM",
        top: FALCON_TOP,
        layers: "transformer.h.",
        layer: FALCON,
        // One of transformers' listed exceptions.
        always_tied: true,
        ..BASE
    },
    Arch {
        gguf: "nemotron",
        model_type: "nemotron",
        class: "NemotronForCausalLM",
        layer: NEMOTRON,
        // layernorm1p: llama.cpp stores w + 1, as Gemma's.
        norm_plus_one: true,
        config: NEMOTRON_CONFIG,
        ..BASE
    },
];

/// The row of `gguf`'s architecture; one that transformers cannot load
/// (or that needs more than names) is refused, named.
pub(crate) fn arch(gguf: &Gguf) -> Result<&'static Arch> {
    let name = gguf
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| {
            Error::bare(
                Rule::Gguf,
                "general.architecture is missing: which model this is cannot be told",
            )
        })?;
    ARCHS.iter().find(|a| a.gguf == name).ok_or_else(|| {
        let known: Vec<&str> = ARCHS.iter().map(|a| a.gguf).collect();
        Error::bare(
            Rule::Unsupported,
            format!(
                "GGUF architecture {name:?} has no Hugging Face layout here (converted: {}); --keep-names writes its tensors under their GGUF names",
                known.join(", ")
            ),
        )
    })
}

/// Where one GGUF tensor goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// Its Hugging Face name; `{E}` where a stack of experts is split.
    pub(crate) name: String,
    /// Its rows are Q's or K's, of this many heads, to un-interleave.
    pub(crate) halves: Option<Heads>,
    /// A norm stored as `w + 1`.
    pub(crate) plus_one: bool,
    /// The dimensions the GGUF tensor has: 1 for norms, biases and
    /// Qwen2-MoE's shared-expert gate, 3 for a stack of experts, else 2.
    pub(crate) rank: usize,
}

/// Which head count a rotary tensor has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heads {
    /// Q's: `attention.head_count`.
    Query,
    /// K's: `attention.head_count_kv`.
    KeyValue,
}

impl Arch {
    /// Where GGUF tensor `name` goes; `None` for one transformers does not
    /// load (`rope_freqs`, …).
    pub(crate) fn target(&self, name: &str) -> Option<Target> {
        let (stem, suffix) = name.rsplit_once('.')?;
        if suffix != "weight" && suffix != "bias" {
            return None;
        }
        let (hf, part) = match stem.strip_prefix("blk.") {
            Some(rest) => {
                let (layer, part) = rest.split_once('.')?;
                if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let (_, hf) = self.layer.iter().find(|(g, _)| *g == part)?;
                (format!("{}{layer}.{hf}", self.layers), part)
            }
            None => {
                let (_, hf) = self.top.iter().find(|(g, _)| *g == stem)?;
                (hf.to_string(), stem)
            }
        };
        let halves = match part {
            "attn_q" if self.rotary_halves && suffix == "weight" => Some(Heads::Query),
            "attn_k" if self.rotary_halves && suffix == "weight" => Some(Heads::KeyValue),
            _ => None,
        };
        let rank = match () {
            _ if hf.contains("{E}") => 3,
            _ if suffix == "bias" || part.ends_with("norm") || part == "ffn_gate_inp_shexp" => 1,
            _ => 2,
        };
        Some(Target {
            name: format!("{hf}.{suffix}"),
            halves,
            plus_one: self.norm_plus_one && part.ends_with("norm") && suffix == "weight",
            rank,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(name: &str) -> &'static Arch {
        ARCHS.iter().find(|a| a.gguf == name).unwrap()
    }

    #[test]
    fn names_follow_each_architecture() {
        let llama = arch("llama");
        let t = llama.target("blk.3.attn_q.weight").unwrap();
        assert_eq!(t.name, "model.layers.3.self_attn.q_proj.weight");
        assert_eq!(t.halves, Some(Heads::Query));
        assert_eq!(
            llama.target("blk.3.attn_k.weight").unwrap().halves,
            Some(Heads::KeyValue)
        );
        assert_eq!(llama.target("rope_freqs.weight"), None);
        assert_eq!(llama.target("blk.x.attn_q.weight"), None);
        let qwen2 = arch("qwen2");
        let b = qwen2.target("blk.1.attn_q.bias").unwrap();
        assert_eq!(
            (b.name.as_str(), b.halves),
            ("model.layers.1.self_attn.q_proj.bias", None)
        );
        let gemma = arch("gemma3");
        let n = gemma.target("blk.0.ffn_norm.weight").unwrap();
        assert_eq!(n.name, "model.layers.0.pre_feedforward_layernorm.weight");
        assert!(n.plus_one);
        assert!(gemma.target("output_norm.weight").unwrap().plus_one);
        assert!(!gemma.target("blk.0.attn_q.weight").unwrap().plus_one);
        let falcon = arch("falcon");
        assert_eq!(falcon.target("blk.0.attn_norm_2.weight"), None);
        let nemotron = arch("nemotron");
        assert!(nemotron.target("blk.0.ffn_norm.weight").unwrap().plus_one);
        assert!(!nemotron.target("blk.0.ffn_norm.bias").unwrap().plus_one);
        assert_eq!(nemotron.target("blk.0.ffn_gate.weight"), None);
        assert_eq!(arch("stablelm").target("blk.0.attn_q_norm.weight"), None);
        // (architecture, GGUF name, Hugging Face name)
        let names = [
            (
                "llama",
                "blk.0.ffn_norm.weight",
                "model.layers.0.post_attention_layernorm.weight",
            ),
            ("llama", "output.weight", "lm_head.weight"),
            (
                "qwen3moe",
                "blk.2.ffn_up_exps.weight",
                "model.layers.2.mlp.experts.{E}.up_proj.weight",
            ),
            (
                "phi3",
                "blk.0.ffn_up.weight",
                "model.layers.0.mlp.gate_up_proj.weight",
            ),
            (
                "falcon",
                "blk.1.attn_qkv.weight",
                "transformer.h.1.self_attention.query_key_value.weight",
            ),
            ("falcon", "output_norm.bias", "transformer.ln_f.bias"),
            (
                "starcoder2",
                "blk.0.ffn_up.bias",
                "model.layers.0.mlp.c_fc.bias",
            ),
        ];
        for (a, gguf, hf) in names {
            assert_eq!(arch(a).target(gguf).unwrap().name, hf, "{a} {gguf}");
        }
    }
}
