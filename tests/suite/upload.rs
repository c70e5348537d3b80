//! A dense output is ready for `hf upload OUT`: what huggingface_hub's
//! `upload_folder` would send holds no record of ours and no file that
//! describes the quantization, and its `README.md` is a model card that
//! says `library_name: transformers` and where the weights came from.
//!
//! `upload_folder` lists `folder_path.glob("**/*")` (files only, as POSIX
//! paths relative to the folder) and drops those that `fnmatchcase` with
//! any of `DEFAULT_IGNORE_PATTERNS` (huggingface_hub 2.4.0,
//! `huggingface_hub/utils/_paths.py`, `filter_repo_objects`, called
//! from `HfApi._prepare_upload_folder_additions` in `hf_api.py`); `hf
//! upload` with no `--exclude` adds nothing to them. [`uploaded`] does the
//! same.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::cli::{ok, stderr};
use crate::common::hub::{Faults, MockHub};
use crate::common::{bin, copy_dir, fixtures};

/// huggingface_hub's `DEFAULT_IGNORE_PATTERNS`, as it states them.
const DEFAULT_IGNORE_PATTERNS: &[&str] = &[
    ".git",
    ".git/*",
    "*/.git",
    "**/.git/**",
    ".cache/huggingface",
    ".cache/huggingface/*",
    "*/.cache/huggingface",
    "**/.cache/huggingface/**",
];

/// Files that describe a quantization (the producers' own).
const QUANTIZATION_FILES: &[&str] = &[
    "recipe.yaml",
    "recipe.yml",
    "quantize_config.json",
    "quant_config.json",
    "quantization_config.json",
    "hf_quant_config.json",
    "quanto_qmap.json",
];

/// Python's `fnmatch.fnmatchcase` for patterns of `*`, `?` and plain
/// characters (all `DEFAULT_IGNORE_PATTERNS` use): `*` matches any run of
/// characters, `/` included.
fn fnmatchcase(name: &str, pattern: &str) -> bool {
    fn go(n: &[u8], p: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| go(&n[i..], rest)),
            Some((b'?', rest)) => !n.is_empty() && go(&n[1..], rest),
            Some((c, rest)) => n.first() == Some(c) && go(&n[1..], rest),
        }
    }
    go(name.as_bytes(), pattern.as_bytes())
}

/// Every file under `dir`, as a POSIX path relative to it.
fn all_files(dir: &Path, under: &str, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = format!("{under}{}", e.file_name().to_string_lossy());
        if e.path().is_dir() {
            all_files(&e.path(), &format!("{name}/"), out);
        } else {
            out.push(name);
        }
    }
}

/// What `hf upload` sends of `dir`, sorted.
fn uploaded(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    all_files(dir, "", &mut files);
    files.retain(|f| !DEFAULT_IGNORE_PATTERNS.iter().any(|p| fnmatchcase(f, p)));
    files.sort();
    files
}

fn dequantize(input: &Path, out: &Path, more: &[&str]) -> std::process::Output {
    let mut args = vec![
        "dequantize",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
    ];
    args.extend(more);
    Command::new(bin()).args(&args).output().unwrap()
}

/// The front matter of a model card, as its lines.
fn front_matter(card: &str) -> Vec<String> {
    let mut lines = card.lines();
    assert_eq!(lines.next(), Some("---"), "no front matter:\n{card}");
    lines
        .take_while(|l| *l != "---")
        .map(String::from)
        .collect()
}

#[test]
fn the_filter_is_huggingface_hubs() {
    // fnmatch's `*` crosses `/`: these are what the patterns are for.
    for ignored in [
        ".git/config",
        ".cache/huggingface/wgpu-dequant-done.json",
        ".cache/huggingface/upload/model.safetensors.metadata",
        "sub/.cache/huggingface/x",
    ] {
        assert!(
            DEFAULT_IGNORE_PATTERNS
                .iter()
                .any(|p| fnmatchcase(ignored, p)),
            "{ignored}"
        );
    }
    for sent in [
        ".wgpu-dequant-done.json",
        ".cache/other/x",
        "README.md",
        ".gitattributes",
    ] {
        assert!(
            !DEFAULT_IGNORE_PATTERNS.iter().any(|p| fnmatchcase(sent, p)),
            "{sent}"
        );
    }
}

#[test]
fn outputs_upload_no_record_and_no_quantization_recipe() {
    let tmp = tempfile::tempdir().unwrap();
    for (fixture, format) in [
        ("mlx-affine-4bit-g64", "mlx"),
        ("w4a16-g128", "compressed-tensors"),
        ("gptq-w4-g128", "gptq"),
        ("modelopt-nvfp4", "modelopt"),
    ] {
        let input = fixtures().join(fixture).join("model");
        let out = tmp.path().join(fixture);
        ok(&dequantize(&input, &out, &["--quiet"]), fixture);
        let sent = uploaded(&out);
        for f in &sent {
            assert!(
                !f.contains("wgpu-dequant"),
                "{fixture}: {f} would be uploaded: {sent:?}"
            );
            assert!(
                !QUANTIZATION_FILES.contains(&f.as_str()),
                "{fixture}: {f} would be uploaded: {sent:?}"
            );
        }
        assert!(
            sent.iter().any(|f| f == "config.json"),
            "{fixture}: {sent:?}"
        );
        assert!(
            sent.iter().any(|f| f.ends_with(".safetensors")),
            "{fixture}: {sent:?}"
        );
        let card = std::fs::read_to_string(out.join("README.md")).unwrap();
        let front = front_matter(&card);
        assert!(
            front.contains(&"library_name: transformers".to_string()),
            "{fixture}: {card}"
        );
        assert!(
            !front.iter().any(|l| l.contains("mlx")),
            "{fixture}: {card}"
        );
        let body = card.rsplit("---\n").next().unwrap().trim();
        assert_eq!(body.lines().count(), 1, "{fixture}: {card}");
        assert!(
            body.contains("made from a local checkpoint")
                && body.contains(format)
                && body.contains("wgpu-dequant"),
            "{fixture}: {body}"
        );

        // The record is still where `--resume` finds it.
        let o = dequantize(&input, &out, &["--resume"]);
        ok(&o, &format!("{fixture} --resume"));
        assert!(
            stderr(&o).contains("nothing left to do"),
            "{fixture}: {}",
            stderr(&o)
        );
    }
}

/// A copy of `fixture`'s checkpoint in `dir`, with `card` as its README.md.
fn with_card(fixture: &str, dir: &Path, card: &str) -> PathBuf {
    let model = dir.join("model");
    copy_dir(&fixtures().join(fixture).join("model"), &model);
    std::fs::write(model.join("README.md"), card).unwrap();
    model
}

#[test]
fn the_card_keeps_the_license_and_drops_format_tags() {
    let tmp = tempfile::tempdir().unwrap();
    let card = "---\n\
        license: other\n\
        license_name: my-license\n\
        license_link: LICENSE\n\
        library_name: mlx\n\
        base_model: org/original\n\
        language:\n- en\n\
        pipeline_tag: text-generation\n\
        tags: [mlx, 4-bit, chat, int4, q4_k_m, compressed-tensors]\n\
        model-index:\n- name: quantized\n  results: []\n\
        ---\n\n# A quantized model\n\nLoad it with mlx-lm.\n";
    let model = with_card("mlx-affine-4bit-g64", tmp.path(), card);
    let out = tmp.path().join("out");
    ok(&dequantize(&model, &out, &["--quiet"]), "dequantize");
    let got = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert_eq!(
        front_matter(&got),
        [
            "base_model: org/original",
            "library_name: transformers",
            "license: other",
            "license_name: my-license",
            "license_link: LICENSE",
            "language:",
            "- en",
            "pipeline_tag: text-generation",
            "tags:",
            "- chat",
        ],
        "{got}"
    );
    assert!(
        !got.contains("mlx-lm") && !got.contains("quantized"),
        "{got}"
    );
}

#[test]
fn a_hub_runs_card_names_the_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let model = with_card(
        "w4a16-g128",
        tmp.path(),
        "---\nlicense: apache-2.0\ntags:\n- w4a16\n- llmcompressor\n---\n",
    );
    let repo = "org/tiny-w4a16";
    let hub = MockHub::serve(repo, &model, Faults::default());
    let out = tmp.path().join("out");
    let args = [
        "dequantize",
        repo,
        "-o",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
        "--quiet",
    ];
    ok(
        &crate::hub::cli(&hub, &tmp.path().join("cache"), &args, &[]),
        "from the Hub",
    );
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert_eq!(
        front_matter(&card),
        [
            "base_model: org/tiny-w4a16",
            "library_name: transformers",
            "license: apache-2.0"
        ],
        "{card}"
    );
    assert!(
        card.contains(&format!(
            "made from [{repo}](https://huggingface.co/{repo}) at {}",
            hub.commit
        )),
        "{card}"
    );
    let sent = uploaded(&out);
    assert!(
        !sent
            .iter()
            .any(|f| f == "recipe.yaml" || f.contains("wgpu-dequant")),
        "{sent:?}"
    );
}
