#!/usr/bin/env bash
# Builds the package into a fresh virtual environment (pip install, as a
# user would) and runs its pytest suite against the CLI's bytes.
# The wheel is built unoptimized here: the fixtures are small, and a
# release build of wgpu takes minutes longer. `pip install ./bindings/python`
# alone builds the optimized one.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=target/py-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check \
    --config-settings=build-args="--profile dev" ./bindings/python
"$venv/bin/pip" install --quiet --disable-pip-version-check numpy ml_dtypes pytest
cargo build --locked --quiet
WGPU_DEQUANT_BIN=$PWD/target/debug/wgpu-dequant "$venv/bin/python" -m pytest -q bindings/python/tests
