#!/usr/bin/env bash
# Packs the Python package as it is published (maturin: a source
# distribution, and from it the abi3 wheel pip builds), installs the wheel
# into a fresh virtual environment, as a user would, and runs the pytest
# suite against the CLI's bytes.
# The wheel is built unoptimized here: the fixtures are small, and a
# release build of wgpu takes minutes longer. pip installing the sdist
# alone builds the optimized one.
set -euo pipefail
cd "$(dirname "$0")/../.."
pip=(install --quiet --disable-pip-version-check)
dist=target/py-dist
tools=target/py-tools
venv=target/py-venv
rm -rf "$dist" "$venv"
[ -x "$tools/bin/maturin" ] || { python3 -m venv "$tools" && "$tools/bin/pip" "${pip[@]}" "maturin>=1.5,<2"; }
"$tools/bin/maturin" sdist --manifest-path bindings/python/Cargo.toml --out "$dist"
sdist=("$dist"/wgpu_dequant-*.tar.gz)
# pip builds the wheel from the sdist alone, in its own folder; the
# workspace's target folder keeps the dependencies compiled between runs.
CARGO_TARGET_DIR=$PWD/target "$tools/bin/pip" wheel --quiet --disable-pip-version-check --no-deps \
    --config-settings=build-args="--profile dev" --wheel-dir "$dist" "${sdist[0]}"
wheel=("$dist"/wgpu_dequant-*-cp38-abi3-*.whl)
[ -f "${wheel[0]}" ] || { echo "bindings/python/test.sh: no abi3 wheel in $dist" >&2; ls "$dist" >&2; exit 1; }
python3 -m venv "$venv"
"$venv/bin/pip" "${pip[@]}" "${wheel[0]}[test]"
cargo build --locked --quiet
WGPU_DEQUANT_BIN=$PWD/target/debug/wgpu-dequant "$venv/bin/python" -m pytest -q bindings/python/tests
