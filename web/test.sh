#!/usr/bin/env bash
# The browser tests: builds the package (web/build.sh) and the CLI, then
# drives headless Chromium through web/test/browser.mjs. Needs Chromium
# (Debian: apt-get install chromium) and Node.js with npm.
set -euo pipefail
cd "$(dirname "$0")/.."
chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
    echo "web/test.sh: no Chromium at $chromium (apt-get install chromium, or set CHROMIUM)" >&2
    exit 1
fi
# Unoptimized: these fixtures are small, and the build is minutes shorter.
web/build.sh --dev
cargo build --locked --quiet
(cd web && npm ci --no-audit --no-fund --loglevel=error)
CHROMIUM=$chromium node web/test/browser.mjs
