#!/usr/bin/env bash
# Builds the browser package: web/pkg/wgpu_dequant.js (+ .wasm).
#
# Uses rustup's wasm32 target when it is installed; otherwise Debian's
# rustc-web toolchain, which builds std for wasm32 from source (see docs/browser.md).
# `--install` installs that toolchain with apt-get; without it nothing is
# installed system-wide. wasm-bindgen-cli, pinned to the version in
# Cargo.lock, is installed under target/web-tools (project-local).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
for arg in "$@"; do
    case "$arg" in
        --install)
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                rustc-web cargo-web rust-web-src rust-web-llvm lld-22 >/dev/null
            ;;
        --dev) profile=dev ;;
        *) echo "usage: web/build.sh [--install] [--dev]" >&2; exit 2 ;;
    esac
done

target=wasm32-unknown-unknown
out_dir=$([ "$profile" = dev ] && echo debug || echo release)
if rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    export CARGO_TARGET_DIR=target/web
    cargo build --locked --profile "$profile" --target "$target" -p wgpu-dequant-web
elif [ -x /usr/bin/rustc ] && [ -d /usr/lib/rustlib/src/rust/library ]; then
    # Debian's compiler + std sources; rustup's proxies come first on PATH,
    # so name Debian's tools explicitly.
    export CARGO_TARGET_DIR=target/web-debian
    RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
        /usr/bin/cargo build --locked --profile "$profile" --target "$target" \
        -p wgpu-dequant-web -Zbuild-std=std,panic_abort
else
    echo "web/build.sh: no wasm32 toolchain. Either 'rustup target add $target'," >&2
    echo "or on Debian/Ubuntu run 'web/build.sh --install' (apt-get install rustc-web" >&2
    echo "cargo-web rust-web-src rust-web-llvm lld-22)." >&2
    exit 1
fi

version=$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
tools=target/web-tools
if ! "$tools/bin/wasm-bindgen" --version 2>/dev/null | grep -q " $version\$"; then
    echo "installing wasm-bindgen-cli $version into $tools" >&2
    # Unoptimized: it binds one module in seconds either way, and builds faster.
    cargo install --quiet --debug --root "$tools" wasm-bindgen-cli --version "$version"
fi
"$tools/bin/wasm-bindgen" --target web --out-dir web/pkg --out-name wgpu_dequant \
    "$CARGO_TARGET_DIR/$target/$out_dir/wgpu_dequant_web.wasm"
# The npm package: web/pkg as `npm pack web/pkg` packs it (`npm install
# wgpu-dequant`); its types are wasm-bindgen's .d.ts of the JS API.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' web/Cargo.toml | head -1)
cp LICENSE-MIT LICENSE-APACHE web/pkg/
# docs/browser.md without its screenshot, which stays in the repository.
sed '/screenshot\.png/d' docs/browser.md > web/pkg/README.md
sed "s/@VERSION@/$version/" web/package.template.json > web/pkg/package.json
ls -l web/pkg/wgpu_dequant.js web/pkg/wgpu_dequant.d.ts web/pkg/wgpu_dequant_bg.wasm
