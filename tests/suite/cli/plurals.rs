//! Counts in the lines the command prints read as English: "1 tensor",
//! "1 shard", never "1 tensors".

use crate::common::cli::{ok, run, stderr, stdout};
use crate::common::{write_safetensors, Tensor};

#[test]
fn one_tensor_and_one_shard_are_singular() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("one");
    std::fs::create_dir(&model).unwrap();
    write_safetensors(
        &model.join("model.safetensors"),
        &[Tensor::f16("a.weight", &[2], &[1.0, 2.0])],
    );
    let o = run(&["inspect", model.to_str().unwrap()]);
    ok(&o, "inspect of a one-tensor checkpoint");
    let text = stdout(&o);
    assert!(text.contains("(1 shard)"), "{text}");
    assert!(text.contains("output      1 tensor: "), "{text}");
    assert!(text.contains("0 quantization tensors used up"), "{text}");
    // Job 1 of 2 gets no shard of one: its note counts them.
    let out = tmp.path().join("out");
    let o = run(&[
        "dequantize",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--part",
        "1/2",
        "--backend",
        "cpu",
    ]);
    ok(&o, "dequantize --part 1/2");
    let err = stderr(&o);
    assert!(err.contains("(1 shard in 2 parts)"), "{err}");
    for text in [&text, &err] {
        for wrong in ["1 tensors", "1 shards", "1 threads", "1 modules", "1 parts"] {
            assert!(!text.contains(wrong), "{wrong}: {text}");
        }
    }
}
