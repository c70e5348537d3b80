//! MoE releases come out as checkpoints their architecture's loader takes:
//! every output name is one of the names transformers' own dense
//! checkpoints use (a table per architecture below), with their shapes, and
//! every expert is there. (`tests/transformers/check_load.py` loads them in
//! transformers itself; see docs/formats.md, "MoE releases".)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::cli::{ok, read_json, run};
use crate::common::{fixtures, read_dir_tensors};

/// The dense keys of an architecture, layer and expert numbers written `N`.
fn dense_keys(model_type: &str) -> BTreeSet<&'static str> {
    let common = [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.N.input_layernorm.weight",
        "model.layers.N.post_attention_layernorm.weight",
        "model.layers.N.self_attn.q_proj.weight",
        "model.layers.N.self_attn.k_proj.weight",
        "model.layers.N.self_attn.v_proj.weight",
        "model.layers.N.self_attn.o_proj.weight",
    ];
    let own: &[&str] = match model_type {
        "mixtral" => &[
            "model.layers.N.block_sparse_moe.gate.weight",
            "model.layers.N.block_sparse_moe.experts.N.w1.weight",
            "model.layers.N.block_sparse_moe.experts.N.w2.weight",
            "model.layers.N.block_sparse_moe.experts.N.w3.weight",
        ],
        "gpt_oss" => &[
            "model.layers.N.self_attn.q_proj.bias",
            "model.layers.N.self_attn.k_proj.bias",
            "model.layers.N.self_attn.v_proj.bias",
            "model.layers.N.self_attn.o_proj.bias",
            "model.layers.N.self_attn.sinks",
            "model.layers.N.mlp.router.weight",
            "model.layers.N.mlp.router.bias",
            "model.layers.N.mlp.experts.gate_up_proj",
            "model.layers.N.mlp.experts.gate_up_proj_bias",
            "model.layers.N.mlp.experts.down_proj",
            "model.layers.N.mlp.experts.down_proj_bias",
        ],
        other => panic!("no key table for {other}"),
    };
    common.into_iter().chain(own.iter().copied()).collect()
}

/// `name` with every all-digit component (a layer, an expert) written `N`.
fn pattern(name: &str) -> String {
    name.split('.')
        .map(|c| {
            if !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()) {
                "N"
            } else {
                c
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Names of `dir`'s tensors that are not among the architecture's keys.
fn unknown_keys(dir: &Path, model_type: &str) -> Vec<String> {
    let keys = dense_keys(model_type);
    read_dir_tensors(dir)
        .into_keys()
        .filter(|n| !keys.contains(pattern(n).as_str()))
        .collect()
}

fn dequantize(case: &str, out: &Path, extra: &[&str]) {
    let model = fixtures().join(case).join("model");
    let mut args = vec![
        "dequantize",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    ok(&run(&args), case);
}

/// A Mixtral quantized by llmcompressor (linearized expert names) comes out
/// under the hub names, every expert complete with its shapes; with
/// `--keep-names`, under the stored names, which the table refuses.
#[test]
fn mixtral_experts_get_the_names_its_loader_expects() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    dequantize("mixtral-w4a16", &out, &[]);
    assert_eq!(unknown_keys(&out, "mixtral"), Vec::<String>::new());
    let cfg = read_json(&fixtures().join("mixtral-w4a16/model/config.json"));
    let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
    let (hidden, inter) = (n("hidden_size"), n("intermediate_size"));
    let tensors = read_dir_tensors(&out);
    let mut experts: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
    for (name, (_, shape, _)) in &tensors {
        let Some(rest) = name.strip_prefix("model.layers.") else {
            continue;
        };
        let parts: Vec<&str> = rest.split('.').collect();
        if let ["0" | "1" | "2" | "3" | "4", "block_sparse_moe", "experts", e, w, "weight"] =
            parts[..]
        {
            let want = if w == "w2" {
                [hidden, inter]
            } else {
                [inter, hidden]
            };
            assert_eq!(shape, &want, "{name}");
            experts
                .entry((parts[0].parse().unwrap(), e.parse().unwrap()))
                .or_default()
                .insert(w.to_string());
        }
    }
    let layers = n("num_hidden_layers");
    assert_eq!(
        experts.len(),
        layers * n("num_local_experts"),
        "{experts:?}"
    );
    assert!(experts.values().all(|ws| ws.len() == 3), "{experts:?}");

    let kept = tmp.path().join("kept");
    dequantize("mixtral-w4a16", &kept, &["--keep-names"]);
    let unknown = unknown_keys(&kept, "mixtral");
    assert_eq!(unknown.len(), 3 * experts.len(), "{unknown:?}");
    assert!(unknown.iter().all(|n| n.contains("_proj.weight")));
}

/// GPT-OSS's MXFP4 experts come out as transformers' dense GPT-OSS holds
/// them: `gate_up_proj` `[E, H, 2I]`, `down_proj` `[E, I, H]`.
#[test]
fn gpt_oss_experts_are_transformers_dense_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dense");
    dequantize("gpt-oss-mxfp4", &out, &[]);
    assert_eq!(unknown_keys(&out, "gpt_oss"), Vec::<String>::new());
    let cfg = read_json(&fixtures().join("gpt-oss-mxfp4/model/config.json"));
    let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
    let (e, h, i) = (
        n("num_local_experts"),
        n("hidden_size"),
        n("intermediate_size"),
    );
    let tensors = read_dir_tensors(&out);
    for layer in 0..n("num_hidden_layers") {
        let p = format!("model.layers.{layer}.mlp.experts");
        assert_eq!(tensors[&format!("{p}.gate_up_proj")].1, [e, h, 2 * i]);
        assert_eq!(tensors[&format!("{p}.down_proj")].1, [e, i, h]);
    }
    let config = read_json(&out.join("config.json"));
    assert!(config.get("quantization_config").is_none());
    // inspect says nothing is renamed here.
    let o = run(&[
        "inspect",
        fixtures().join("gpt-oss-mxfp4/model").to_str().unwrap(),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["renamed"], serde_json::json!([]));
    assert_eq!(v["format"]["kind"], "gpt-oss");
}

/// `inspect` says which names are mapped.
#[test]
fn inspect_reports_the_renamed_experts() {
    let model = fixtures().join("mixtral-w4a16/model");
    let o = run(&["inspect", model.to_str().unwrap(), "--json"]);
    ok(&o, "inspect --json");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let renamed = v["renamed"].as_array().unwrap();
    assert_eq!(renamed.len(), 12);
    assert!(renamed.iter().any(|r| r["stored"]
        == "model.layers.0.block_sparse_moe.experts.0.up_proj.weight"
        && r["written"] == "model.layers.0.block_sparse_moe.experts.0.w3.weight"));
    let o = run(&["inspect", model.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("names ") && text.contains("--keep-names"),
        "{text}"
    );
}
