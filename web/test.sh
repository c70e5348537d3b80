#!/usr/bin/env bash
# The browser tests: builds the package (web/build.sh) and the CLI, packs
# the package (`npm pack`), installs the tarball into an empty project as a
# user would (`npm install ./wgpu-dequant-VERSION.tgz`), checks what `npm
# publish` would upload, and drives headless Chromium
# through web/test/browser.mjs, which imports the package from there.
# Needs Chromium (Debian: apt-get install chromium) and Node.js with npm.
# The test takes a screenshot of the page, into target/web-page.png;
# SCREENSHOT=web/screenshot.png puts it where docs/browser.md shows it.
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

# The packed package, installed into an empty project (no network: it has
# no dependencies).
app=target/npm-app
rm -rf "$app" && mkdir -p "$app"
tarball=$(cd web/pkg && npm pack --silent --pack-destination "$PWD/../../$app")
(cd "$app" && npm init -y >/dev/null &&
    npm install --no-audit --no-fund --loglevel=error --offline "./$tarball")
# What the release workflow's `npm publish` would upload, without the
# registry: the same package, with its wasm.
published=$(cd web/pkg && npm publish --dry-run --offline --json 2>/dev/null)
grep -q '"path": "wgpu_dequant_bg.wasm"' <<<"$published" ||
    { echo "web/test.sh: npm publish --dry-run would not upload wgpu_dequant_bg.wasm" >&2; exit 1; }
for f in package.json wgpu_dequant.js wgpu_dequant.d.ts wgpu_dequant_bg.wasm README.md LICENSE-MIT; do
    [ -f "$app/node_modules/wgpu-dequant/$f" ] || { echo "web/test.sh: the npm package lacks $f" >&2; exit 1; }
done
grep -q "export function dequantize" "$app/node_modules/wgpu-dequant/wgpu_dequant.d.ts" ||
    { echo "web/test.sh: wgpu_dequant.d.ts does not declare dequantize" >&2; exit 1; }
# Where `import "wgpu-dequant"` leads from the project (its `exports`), as
# a path the test's server serves.
module=$(cd "$app" && node --input-type=module -e \
    'console.log(new URL(import.meta.resolve("wgpu-dequant")).pathname)')
WGPU_DEQUANT_MODULE=/${module#"$PWD/"} CHROMIUM=$chromium node web/test/browser.mjs
