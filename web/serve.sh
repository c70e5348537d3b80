#!/usr/bin/env bash
# Serves the page on http://127.0.0.1:${1:-8000}/web/ (module scripts and
# fetch do not work from file://). The repository root is served so that the
# page can fetch the bundled sample from assets/.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-8000}
[ -f web/pkg/wgpu_dequant.js ] || { echo "build the package first: web/build.sh" >&2; exit 1; }
echo "open http://127.0.0.1:$port/web/"
exec python3 -m http.server "$port" --bind 127.0.0.1
