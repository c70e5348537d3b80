#!/usr/bin/env bash
# The GPU report: builds this tool, runs its GPU tests on the machine's
# adapter (WGPU_DEQUANT_REQUIRE_GPU=1: no adapter is a failure), measures
# decoding (`bench --backend gpu`) and products with packed weights
# (`bench --gemv`) on the standard shapes, and writes OUT/gpu-report.json
# (every figure, with the device, the commit and the date) and
# OUT/gpu-report.md (the tables for docs). Needs cargo and python3.
#
#   scripts/gpu-report.sh [OUT]          # a GPU: release build, standard shapes
#   scripts/gpu-report.sh --quick [OUT]  # CI's software adapter: the test build, small shapes
set -euo pipefail
cd "$(dirname "$0")/.."

quick=false
if [ "${1:-}" = "--quick" ]; then
    quick=true
    shift
fi
out=${1:-target/gpu-report}
mkdir -p "$out"
export WGPU_DEQUANT_REQUIRE_GPU=1
# Mesa's device-select layer probes X and Wayland otherwise (see docs/cli.md,
# "Backends").
export NODEVICE_SELECT=1

if $quick; then
    # CI ran the whole suite on the adapter already: three of the GPU
    # module's byte-identity tests (seconds, not its minutes) stand for the
    # rest here, and weights small enough to be measured warm (one copy).
    profile=(); bin=target/debug/wgpu-dequant
    tests=(gpu::decode_to_buffer_matches_cpu gpu::every_code_by_formula gpu::output_larger_than_one_binding)
    decode=(--rows 512 --cols 512 --runs 1)
    gemv=(--gemv-shape 256x256 --gemv-m 1 --gemv-m 16 --runs 1)
else
    # Every module whose tests run on the adapter: decoding, products,
    # the formats' fixtures.
    profile=(--release); bin=target/release/wgpu-dequant; tests=(gpu:: matmul:: fixtures:: gguf::)
    decode=(--rows 4096 --cols 4096 --runs 5)
    gemv=(--runs 5)
fi

started=$(date +%s)
step() { echo "gpu-report: $1 ($(($(date +%s) - started)) s)" >&2; }

step "building"
cargo build --locked --quiet "${profile[@]}" --features bench --bin wgpu-dequant
step "GPU tests"
cargo test --locked --quiet "${profile[@]}" --test suite -- "${tests[@]}" 2>&1 | tail -3 >&2
step "decoding"
"$bin" bench --backend gpu --json "${decode[@]}" > "$out/decode.jsonl"
step "products"
"$bin" bench --backend gpu --gemv --json "${gemv[@]}" > "$out/gemv.jsonl"
step "writing $out/gpu-report.json and .md"

python3 - "$out" "$quick" <<'PY'
import json, subprocess, sys, datetime
from pathlib import Path

out, quick = Path(sys.argv[1]), sys.argv[2] == "true"
read = lambda name: [json.loads(l) for l in (out / name).read_text().splitlines() if l.strip()]
decode, gemv = read("decode.jsonl"), read("gemv.jsonl")
devices = sorted({f.get("device", "") for f in decode + gemv} - {""})
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
report = {
    "date": datetime.date.today().isoformat(),
    "commit": commit,
    "device": devices[0] if len(devices) == 1 else devices,
    "quick": quick,
    "decode": decode,
    "gemv": gemv,
}
(out / "gpu-report.json").write_text(json.dumps(report, indent=1) + "\n")

lines = [f"GPU report, {report['date']}, commit {commit}, {', '.join(devices) or 'no GPU'}"
         + (" (quick: small shapes)" if quick else ""), "",
         "| decoding | GB/s | baseline | GB/s | ratio |", "|---|---|---|---|---|"]
for f in decode:
    lines.append(f"| {f['case']} | {f['gbps']:.3g} | {f['baseline']} | {f['baseline_gbps']:.3g} | {f['ratio']:.2f} |")
lines += ["", "| product | m | GB/s | baseline | GB/s | ratio | a dispatch, µs |", "|---|---|---|---|---|---|---|"]
for f in gemv:
    lines.append(f"| {f['case']} | {f['m']} | {f['gbps']:.3g} | {f['baseline']} | {f['baseline_gbps']:.3g} | {f['ratio']:.2f} | {f.get('dispatch_us', 0):.1f} |")
(out / "gpu-report.md").write_text("\n".join(lines) + "\n")
print(f"{len(decode)} decoding and {len(gemv)} product figures on {', '.join(devices)}")
PY
step "done"
