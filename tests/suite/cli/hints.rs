//! Paths that are not a checkpoint as given, and the one line each gets:
//! PyTorch pickles, a file of a checkpoint instead of its folder, a folder
//! without weights, a folder of several GGUF models picked by `DIR:QUANT`.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::cli::{failed, ok, run, stderr, stdout};
use crate::common::{copy_dir, fixtures};

/// The GGUF cases' folder.
fn gguf_cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf")
}

/// `wgpu-dequant inspect PATH`.
fn inspect(path: &Path) -> Output {
    run(&["inspect", path.to_str().unwrap()])
}

/// Asserts `o` failed with exit status `code` and one stderr line naming
/// each of `words`.
fn refused(o: &Output, code: i32, words: &[&str]) {
    failed(o, &words.join(" "));
    assert_eq!(o.status.code(), Some(code), "{}", stderr(o));
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "{err}");
    for w in words {
        assert!(err.contains(w), "no {w:?} in: {err}");
    }
}

/// The README's sample checkpoint, copied to `tmp/model`.
fn sample(tmp: &Path) -> PathBuf {
    let model = tmp.join("model");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-w4a16"),
        &model,
    );
    model
}

#[test]
fn pytorch_pickles_are_named_with_how_to_resave() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("torch");
    std::fs::create_dir(&dir).unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-w4a16/config.json");
    std::fs::copy(config, dir.join("config.json")).unwrap();
    // A zip's magic: what torch.save writes first.
    std::fs::write(dir.join("pytorch_model.bin"), b"PK\x03\x04").unwrap();
    let resave = "save_pretrained(safe_serialization=True)";
    for path in [dir.clone(), dir.join("pytorch_model.bin")] {
        refused(
            &inspect(&path),
            3,
            &["pytorch_model.bin", "CFG-002", "PyTorch pickle", resave],
        );
    }
    for name in ["weights.pt", "weights.PTH"] {
        let file = tmp.path().join(name);
        std::fs::write(&file, b"\x80\x02").unwrap();
        refused(&inspect(&file), 3, &[name, "CFG-002", resave]);
    }
}

#[test]
fn a_file_of_a_checkpoint_points_to_its_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let model = sample(tmp.path());
    let folder = format!("pass the folder {}", model.display());
    for name in ["config.json", "recipe.yaml", "tokenizer.json", "README.md"] {
        let file = model.join(name);
        if !file.exists() {
            std::fs::write(&file, b"{\"version\": \"1.0\"}").unwrap();
        }
        refused(&inspect(&file), 2, &[name, "ARG-001", &folder]);
    }
    // The index stands for its checkpoint: it opens the folder.
    let sharded = fixtures().join("sharded-nvfp4a16/model");
    let o = inspect(&sharded.join("model.safetensors.index.json"));
    ok(&o, "inspect of an index file");
    assert_eq!(report(&o), report(&inspect(&sharded)));
}

#[test]
fn a_folder_without_weights_says_what_it_looks_for() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let want = ["empty", "ST-001", "no .safetensors or .gguf file"];
    refused(&inspect(&empty), 3, &want);
    std::fs::write(empty.join("config.json"), b"{}").unwrap();
    refused(&inspect(&empty), 3, &want);
}

#[test]
fn a_local_folder_of_gguf_models_is_picked_by_its_tag() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ggufs");
    std::fs::create_dir(&dir).unwrap();
    for (case, name) in [
        ("gguf-q4_k-llama", "Tiny-Q4_K.gguf"),
        ("gguf-iq2_xxs-llama", "Tiny-IQ2_XXS.gguf"),
    ] {
        let model = gguf_cases().join(case).join("model/model.gguf");
        std::fs::copy(model, dir.join(name)).unwrap();
    }
    refused(
        &inspect(&dir),
        2,
        &["Tiny-Q4_K.gguf", "Tiny-IQ2_XXS.gguf", ":QUANT"],
    );
    let tagged = |tag: &str| PathBuf::from(format!("{}:{tag}", dir.display()));
    for (tag, file, ty) in [
        ("Q4_K", "Tiny-Q4_K.gguf", "Q4_K"),
        ("iq2_xxs", "Tiny-IQ2_XXS.gguf", "IQ2_XXS"),
    ] {
        let o = inspect(&tagged(tag));
        ok(&o, &format!("inspect DIR:{tag}"));
        let text = stdout(&o);
        assert!(text.contains(file) && text.contains(ty), "{tag}: {text}");
        // The same model as the file itself.
        assert_eq!(text, stdout(&inspect(&dir.join(file))), "{tag}");
    }
    refused(
        &inspect(&tagged("Q8_0")),
        2,
        &["the tag :Q8_0 names no GGUF model", "Tiny-Q4_K.gguf"],
    );
    // A tag beside --gguf-file: two picks.
    let o = run(&[
        "inspect",
        tagged("Q4_K").to_str().unwrap(),
        "--gguf-file",
        "Tiny-IQ2_XXS.gguf",
    ]);
    refused(&o, 2, &["both pick a model"]);
}

#[test]
fn any_part_of_a_split_gguf_opens_the_whole_model() {
    let dir = gguf_cases().join("gguf-types-split/model");
    let whole = inspect(&dir.join("model-00001-of-00007.gguf"));
    ok(&whole, "inspect of the first part");
    for part in ["model-00002-of-00007.gguf", "model-00007-of-00007.gguf"] {
        let o = inspect(&dir.join(part));
        ok(&o, &format!("inspect {part}"));
        assert_eq!(report(&o), report(&whole), "{part}");
    }
}

/// inspect's report but for the free disk space, which other work on the
/// machine changes between two runs.
fn report(o: &Output) -> String {
    let out = stdout(o);
    let kept: Vec<&str> = out.lines().filter(|l| !l.starts_with("free ")).collect();
    assert!(
        kept.len() < out.lines().count(),
        "no free space line in {out}"
    );
    kept.join("\n")
}
