#!/usr/bin/env bash
# Builds the C library and installs it where pkg-config finds it:
#
#   bindings/c/install.sh [--prefix DIR] [--dev]
#
#   DIR/lib/libwgpu_dequant_c.{so,a}   (.dylib on macOS)
#   DIR/include/wgpu_dequant.h
#   DIR/lib/pkgconfig/wgpu-dequant.pc
#
# then `cc app.c $(pkg-config --cflags --libs wgpu-dequant)` (with
# PKG_CONFIG_PATH=DIR/lib/pkgconfig where DIR is not a system prefix).
# The prefix defaults to /usr/local; --dev builds unoptimized.
set -euo pipefail
cd "$(dirname "$0")/../.."

prefix=/usr/local
profile=release
while (($#)); do
    case "$1" in
        --prefix) prefix=${2:?--prefix needs a directory}; shift ;;
        --dev) profile=dev ;;
        *) echo "usage: bindings/c/install.sh [--prefix DIR] [--dev]" >&2; exit 2 ;;
    esac
    shift
done

cargo build --locked --quiet --profile "$profile" -p wgpu-dequant-c
built=target/$([ "$profile" = dev ] && echo debug || echo release)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' bindings/c/Cargo.toml | head -1)
case "$(uname -s)" in
    Darwin) shared=libwgpu_dequant_c.dylib ;;
    *) shared=libwgpu_dequant_c.so ;;
esac

install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 644 bindings/c/include/wgpu_dequant.h "$prefix/include/"
install -m 755 "$built/$shared" "$prefix/lib/"
install -m 644 "$built/libwgpu_dequant_c.a" "$prefix/lib/"
# Libs.private: what the static library needs from the system, for
# `pkg-config --static` (rustc's --print native-static-libs on Linux).
cat > "$prefix/lib/pkgconfig/wgpu-dequant.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: wgpu-dequant
Description: Decode quantized checkpoints to dense bf16/f16/f32 on any GPU or the CPU (C ABI)
Version: $version
Libs: -L\${libdir} -lwgpu_dequant_c
Libs.private: -ldl -lgcc_s -lutil -lrt -lpthread -lm -lc
Cflags: -I\${includedir}
EOF
echo "installed wgpu-dequant $version into $prefix (pkg-config: $prefix/lib/pkgconfig/wgpu-dequant.pc)" >&2
