#!/usr/bin/env bash
# Builds the C library (and its header), then compiles the example and the
# test with the system's C compiler against them and runs both.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --locked --quiet -p wgpu-dequant-c
git diff --exit-code bindings/c/include/wgpu_dequant.h ||
    { echo "bindings/c/include/wgpu_dequant.h is out of date: commit the generated one" >&2; exit 1; }
lib=$PWD/target/debug
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for src in examples/sample tests/test; do
    cc -std=c11 -Wall -Wextra -Werror -I bindings/c/include "bindings/c/$src.c" \
        -L "$lib" -lwgpu_dequant_c -Wl,-rpath,"$lib" -o "$out/$(basename $src)"
done
"$out/sample" assets/sample-w4a16
"$out/test" assets/sample-w4a16 tests/gguf/hf-llama/model/model.gguf "$out"
