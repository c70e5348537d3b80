#!/usr/bin/env bash
# Installs the C library (install.sh, into a scratch prefix), then compiles
# the examples and the tests with the system's C compiler through
# pkg-config, as an app would, and runs them.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Unoptimized: the fixtures are small, and the build is minutes shorter.
bindings/c/install.sh --prefix "$out/prefix" --dev
git diff --exit-code bindings/c/include/wgpu_dequant.h ||
    { echo "bindings/c/include/wgpu_dequant.h is out of date: commit the generated one" >&2; exit 1; }
export PKG_CONFIG_PATH=$out/prefix/lib/pkgconfig
libdir=$(pkg-config --variable=libdir wgpu-dequant)
for src in examples/sample examples/matmul tests/test tests/linears; do
    # shellcheck disable=SC2046 # pkg-config's flags are words
    cc -std=c11 -Wall -Wextra -Werror "bindings/c/$src.c" -o "$out/$(basename $src)" \
        $(pkg-config --cflags --libs wgpu-dequant) -Wl,-rpath,"$libdir"
done
"$out/sample" assets/sample-w4a16
"$out/matmul" assets/sample-w4a16
"$out/matmul" tests/gguf/hf-llama/model/model.gguf
"$out/test" assets/sample-w4a16 tests/gguf/hf-llama/model/model.gguf "$out"
"$out/linears" assets/sample-w4a16 tests/fixtures/gpt-oss-mxfp4/model
