#!/usr/bin/env bash
# The crate as crates.io would get it: `cargo package` (the include list of
# Cargo.toml: no fixtures, no test data), under crates.io's 10 MB limit,
# then `cargo install` from the unpacked .crate, offline, as a user's
# `cargo install wgpu-dequant` builds it, and the installed tool run on the
# sample: the same files as the workspace's build.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo package --locked --quiet --no-verify --allow-dirty -p wgpu-dequant
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
crate=target/package/wgpu-dequant-$version.crate
size=$(wc -c <"$crate")
if ((size > 10 * 1000 * 1000)); then
    echo "crate-test: $crate is $size bytes, over crates.io's 10 MB" >&2
    exit 1
fi
if cargo package --locked --quiet --allow-dirty -p wgpu-dequant --list | grep -E '^(tests|fuzz|bindings|web)/'; then
    echo "crate-test: the package holds the files above, which the include list should leave out" >&2
    exit 1
fi
# What the release workflow's `cargo publish` checks besides packing (the
# manifest's metadata, every dependency a registry one), short of the
# upload. It reads the index as `cargo package` above does; the package
# is built below, from the .crate.
cargo publish --dry-run --locked --quiet --no-verify --allow-dirty -p wgpu-dequant
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
tar -xzf "$crate" -C "$out"
# Unoptimized (the sample is small, and the build minutes shorter). The
# workspace's target folder keeps the dependencies compiled; the unpacked
# files are newer than its build of this crate, which cargo would take for
# theirs otherwise (its fingerprints name files relative to the package).
find "$out/wgpu-dequant-$version" -type f -exec touch {} +
CARGO_TARGET_DIR=$PWD/target cargo install --quiet --offline --locked --debug \
    --path "$out/wgpu-dequant-$version" --root "$out/root"
"$out/root/bin/wgpu-dequant" dequantize assets/sample-w4a16 -o "$out/installed" -q
cargo build --locked --quiet
target/debug/wgpu-dequant dequantize assets/sample-w4a16 -o "$out/workspace" -q
for f in "$out"/workspace/*; do
    cmp "$f" "$out/installed/$(basename "$f")"
done
echo "crate-test: $crate ($size bytes) installs and decodes the sample as the workspace does" >&2
