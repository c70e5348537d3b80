// The browser package in a real browser: headless Chromium (WebGPU on its
// SwiftShader adapter: Dawn + Tint, not wgpu) dequantizes every fixture
// through the JS API on 'gpu' and 'cpu' and must give the CLI's files, byte
// for byte, and so must a Hub id read from a mock Hub on another origin;
// malformed checkpoints must be refused with the CLI's rule and line;
// products with packed weights (openLinears: safetensors packs, GGUF files
// read piece by piece, routed experts) must be within the bound of the
// CLI's dense weights, and each routed row its expert's own bits; the
// page must run the bundled sample and fill its table, a picked folder, a
// typed Hub id and a picked GGUF file.
//
// Usage: node web/test/browser.mjs  (after web/build.sh and a build of the
// CLI; WGPU_DEQUANT_BIN names the CLI, target/debug/wgpu-dequant by default;
// SCREENSHOT names where the page's screenshot goes, target/web-page.png by
// default, web/screenshot.png to regenerate docs/browser.md's).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import puppeteer from 'puppeteer-core';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const cli = process.env.WGPU_DEQUANT_BIN || path.join(root, 'target/debug/wgpu-dequant');
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
// The package's module as the pages import it: the npm package installed
// into a project (web/test.sh), or the built one.
const pkg = process.env.WGPU_DEQUANT_MODULE || '/web/pkg/wgpu_dequant.js';
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'wgpu-dequant-web-'));
let failures = 0;

function check(ok, what) {
  if (ok) {
    console.log(`ok   ${what}`);
  } else {
    failures++;
    console.log(`FAIL ${what}`);
  }
}

// Dense files by name, sorted; the model card aside: a Hub run's names its
// repository, and the CLI's of the same files in a folder names none.
const sorted = (o) => o && Object.fromEntries(Object.entries(o).filter(([f]) => f !== 'README.md').sort());
const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex');
const filesOf = (dir) => fs.readdirSync(dir).filter((f) => fs.statSync(path.join(dir, f)).isFile()).sort();

// What the CLI does with `dir`: { files: name -> sha256 } or { error: line }.
function runCli(dir, dtype) {
  const out = fs.mkdtempSync(path.join(scratch, 'cli-'));
  const dense = path.join(out, 'dense');
  const r = spawnSync(cli, ['dequantize', dir, '-o', dense, '--backend', 'cpu', '--dtype', dtype, '-q']);
  if (r.error) throw r.error;
  if (r.status !== 0) return { error: r.stderr.toString().trim() };
  const files = {};
  // The record a finished run leaves in a directory is not the checkpoint's.
  for (const f of filesOf(dense).filter((f) => !f.startsWith('.wgpu-dequant-done'))) files[f] = sha256(fs.readFileSync(path.join(dense, f)));
  fs.rmSync(out, { recursive: true, force: true });
  return { files };
}

// Static files: the repository at /, the scratch folder at /scratch/.
const types = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm', '.json': 'application/json' };
const server = http.createServer((req, res) => {
  const url = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  const file = url.startsWith('/scratch/') ? path.join(scratch, url.slice(9)) : path.join(root, url);
  const inside = file.startsWith(root + path.sep) || file.startsWith(scratch + path.sep);
  if (!inside || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { 'content-type': types[path.extname(file)] || 'application/octet-stream' });
  fs.createReadStream(file).pipe(res);
});
await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
const base = `http://127.0.0.1:${server.address().port}`;

// A mock of the Hub on another origin (so that CORS is what lets the page
// read it): the revision API, resolve (a redirect to the CDN for
// safetensors), and the CDN, which honours Range. It serves the sharded
// fixture as org/sharded.
const hubDir = path.join(root, 'tests/fixtures/sharded-nvfp4a16/model');
const hubRepo = 'org/sharded';
const commit = 'c0ffee'.padEnd(40, '0');
const hubFiles = Object.fromEntries(filesOf(hubDir).map((f) => {
  const bytes = fs.readFileSync(path.join(hubDir, f));
  return [f, { bytes, sha: sha256(bytes) }];
}));
const hubLog = [];
const cors = { 'access-control-allow-origin': '*', 'access-control-expose-headers': 'content-range, content-length' };
function send(res, bytes, range) {
  const r = range && /^bytes=(\d+)-(\d*)$/.exec(range);
  if (!r) {
    res.writeHead(200, { ...cors, 'content-length': bytes.length }).end(bytes);
    return;
  }
  const a = Number(r[1]);
  const b = r[2] ? Math.min(Number(r[2]), bytes.length - 1) : bytes.length - 1;
  res.writeHead(206, { ...cors, 'content-range': `bytes ${a}-${b}/${bytes.length}`, 'content-length': b - a + 1 })
    .end(bytes.subarray(a, b + 1));
}
const hub = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  hubLog.push({ method: req.method, path: url.pathname, range: req.headers.range });
  if (req.method === 'OPTIONS') {
    res.writeHead(204, { ...cors, 'access-control-allow-headers': 'range, authorization' }).end();
    return;
  }
  if (url.pathname === `/api/models/${hubRepo}/revision/main`) {
    const siblings = Object.entries(hubFiles).map(([n, f]) => ({ rfilename: n, size: f.bytes.length }));
    res.writeHead(200, { ...cors, 'content-type': 'application/json' })
      .end(JSON.stringify({ id: hubRepo, sha: commit, siblings }));
    return;
  }
  const resolve = url.pathname.match(/^\/org\/sharded\/resolve\/([^/]+)\/(.+)$/);
  const named = resolve && resolve[1] === commit && hubFiles[decodeURIComponent(resolve[2])];
  if (named) {
    if (resolve[2].endsWith('.safetensors')) res.writeHead(302, { ...cors, location: `/cdn/${named.sha}` }).end();
    else send(res, named.bytes, req.headers.range);
    return;
  }
  const cdn = url.pathname.match(/^\/cdn\/([0-9a-f]{64})$/);
  const blob = cdn && Object.values(hubFiles).find((f) => f.sha === cdn[1]);
  if (blob) {
    send(res, blob.bytes, req.headers.range);
    return;
  }
  res.writeHead(404, { ...cors, 'x-error-code': 'RepoNotFound' }).end();
});
await new Promise((ok) => hub.listen(0, '127.0.0.1', ok));
const hubBase = `http://127.0.0.1:${hub.address().port}`;

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: ['--no-sandbox', '--enable-unsafe-webgpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});

try {
  const page = await browser.newPage();
  page.on('pageerror', (e) => console.log(`page error: ${e.message}`));
  await page.goto(`${base}/web/blank.html`);
  await page.evaluate(async (pkg) => {
    const m = await import(pkg);
    await m.default();
    window.wd = m;
  }, pkg);
  console.log(`the package: ${pkg}`);
  const info = await page.evaluate(() => window.wd.adapterInfo());
  check(info !== null, `a WebGPU adapter: ${JSON.stringify(info)}`);

  // Runs the JS API on the files under `url` (a folder served here).
  const inBrowser = (url, names, options) => page.evaluate(async (url, names, options) => {
    const files = new Map();
    for (const n of names) files.set(n, await (await fetch(url + n)).blob());
    const hex = (b) => [...new Uint8Array(b)].map((x) => x.toString(16).padStart(2, '0')).join('');
    try {
      const out = await window.wd.dequantize(files, options);
      const got = {};
      for (const [name, blob] of out) got[name] = hex(await crypto.subtle.digest('SHA-256', await blob.arrayBuffer()));
      return { files: got };
    } catch (e) {
      return { error: e.message, rule: e.rule };
    }
  }, url, names, options);

  // Every fixture on WebGPU: the CLI's files. Then, by turns, the wasm CPU
  // path (the native one, tested at length there: here its 32-bit build)
  // or f32 on WebGPU (which differs from the model's dtype only in the
  // shaders' last step): each fixture two runs, each kind half of them.
  const fixtures = fs.readdirSync(path.join(root, 'tests/fixtures')).sort()
    .filter((name) => fs.existsSync(path.join(root, 'tests/fixtures', name, 'model')));
  for (const [i, name] of fixtures.entries()) {
    const dir = path.join(root, 'tests/fixtures', name, 'model');
    const runs = i % 2 === 0 ? [['auto', 'gpu'], ['auto', 'cpu']] : [['auto', 'gpu'], ['f32', 'gpu']];
    for (const dtype of ['auto', 'f32'].filter((d) => runs.some(([r]) => r === d))) {
      const want = runCli(dir, dtype);
      check(want.files, `cli ${name} ${dtype}`);
      for (const backend of runs.filter(([r]) => r === dtype).map(([, b]) => b)) {
        const got = await inBrowser(`/tests/fixtures/${name}/model/`, filesOf(dir), { dtype, backend });
        const same = JSON.stringify(sorted(got.files)) === JSON.stringify(sorted(want.files));
        check(same, `${name} ${dtype} on ${backend}: the CLI's files${same ? '' : `\n  got  ${JSON.stringify(got)}\n  want ${JSON.stringify(want)}`}`);
      }
    }
  }

  // GGUF files (one alone, a split pair): the CLI's files, the transformers
  // form (names, configs, tokenizer), on both backends.
  for (const name of ['hf-llama', 'hf-gemma3', 'hf-qwen3-split']) {
    const dir = path.join(root, 'tests/gguf', name, 'model');
    const want = runCli(dir, 'bf16');
    check(want.files, `cli ${name}`);
    for (const backend of ['gpu', 'cpu']) {
      const got = await inBrowser(`/tests/gguf/${name}/model/`, filesOf(dir), { dtype: 'bf16', backend });
      const same = JSON.stringify(sorted(got.files)) === JSON.stringify(sorted(want.files));
      check(same, `${name} on ${backend}: the CLI's files${same ? '' : `\n  got  ${JSON.stringify(got)}\n  want ${JSON.stringify(want)}`}`);
    }
  }

  // Products with packed weights: every quantized Linear of a few fixtures
  // (int4 with zero points, NVFP4 over two shards, MXFP4, FP8 blocks, GPTQ
  // with act-order, AutoAWQ, GPT-OSS's experts one at a time, 2:4 sparse
  // FP8, ModelOpt INT4-AWQ, bitsandbytes FP4 with blocks across rows) uploaded to
  // WebGPU and multiplied there and on the wasm CPU, Float32Arrays in and
  // out: within K·2⁻²⁴·Σ|w·x| (and the bias's rounding) of an f64 product
  // of the CLI's dense weight, the same bits twice on the GPU; read from
  // the mock Hub, the same bits.
  // Files handed in as Blobs whose slices are counted: what the package
  // reads of them (a whole file never, for GGUF's).
  const products = (source, options, names) => page.evaluate(async (source, options, names) => {
    let files = source;
    const out = { products: [], refused: [], slices: [], sizes: [] };
    if (names) {
      class Counted extends Blob {
        slice(start, end, type) {
          out.slices.push(end - start);
          return super.slice(start, end, type);
        }
      }
      files = new Map();
      for (const n of names) {
        const blob = new Counted([await (await fetch(source + n)).blob()]);
        out.sizes.push(blob.size);
        files.set(n, blob);
      }
    }
    let seed = 12345;
    const random = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648 - 0.5; };
    try {
      const linears = await window.wd.openLinears(files, options);
      for (const t of linears.quantized()) {
        // A 3-D stack: each of its experts.
        const experts = t.shape.length === 3 ? [...Array(t.shape[0]).keys()] : [undefined];
        for (const expert of experts) {
          let w;
          try {
            w = await linears.upload(t.name, expert);
          } catch (e) {
            out.refused.push(`${t.name} ${expert} ${e.rule}`);
            continue;
          }
          for (const m of [1, 5]) {
            const x = Float32Array.from({ length: m * w.k }, random);
            const gpu = await w.matmul(x, m);
            const again = await w.matmul(x, m);
            const cpu = await linears.matmulCpu(t.name, x, m, expert);
            const same = gpu.every((v, i) => Object.is(v, again[i]));
            out.products.push({ name: t.name, expert, shape: [...t.shape], m, n: w.n, k: w.k, gpuBytes: w.gpuBytes,
              x: [...x], gpu: [...gpu], cpu: [...cpu], same });
          }
        }
      }
    } catch (e) {
      out.error = `${e.rule} ${e.message}`;
    }
    return out;
  }, source, options, names);
  // The tensors of the dense checkpoint the CLI writes of `dir`, as numbers.
  const denseOf = (dir) => {
    const out = fs.mkdtempSync(path.join(scratch, 'dense-'));
    const r = spawnSync(cli, ['dequantize', dir, '-o', path.join(out, 'd'), '--backend', 'cpu', '-q']);
    if (r.status !== 0) throw new Error(r.stderr.toString());
    const tensors = {};
    for (const f of filesOf(path.join(out, 'd')).filter((f) => f.endsWith('.safetensors'))) {
      const b = fs.readFileSync(path.join(out, 'd', f));
      const n = Number(b.readBigUInt64LE(0));
      const header = JSON.parse(b.subarray(8, 8 + n).toString());
      for (const [name, t] of Object.entries(header)) {
        if (name === '__metadata__') continue;
        const bytes = b.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
        const read = { BF16: [2, (o) => { const u = Buffer.alloc(4); u.writeUInt16LE(bytes.readUInt16LE(o), 2); return u.readFloatLE(0); }],
          F16: [2, (o) => f16(bytes.readUInt16LE(o))], F32: [4, (o) => bytes.readFloatLE(o)] }[t.dtype];
        if (read) tensors[name] = Array.from({ length: bytes.length / read[0] }, (_, i) => read[1](i * read[0]));
      }
    }
    fs.rmSync(out, { recursive: true, force: true });
    return tensors;
  };
  const f16 = (h) => {
    const e = (h >> 10) & 31;
    const v = e === 0 ? (h & 1023) * 2 ** -24 : e === 31 ? ((h & 1023) ? NaN : Infinity) : (1 + (h & 1023) / 1024) * 2 ** (e - 15);
    return h & 0x8000 ? -v : v;
  };
  // How far each of `p`'s results is outside its bound (none: []).
  const outside = (p, dense, got) => {
    const full = dense[p.name];
    let w = (j, c) => full[j * p.k + c];
    let bias = dense[p.name.replace(/\.weight$/, '.bias')];
    if (p.expert !== undefined) {
      // Expert e of a stack: dense [E, in, out] (GPT-OSS: x·W[e]) or [E, out, in].
      const base = p.expert * p.n * p.k;
      w = p.shape[1] === p.k ? (j, c) => full[base + c * p.n + j] : (j, c) => full[base + j * p.k + c];
      const b = dense[`${p.name}_bias`];
      bias = b && b.slice(p.expert * p.n, (p.expert + 1) * p.n);
    }
    const bad = [];
    for (let i = 0; i < p.m; i++) {
      for (let j = 0; j < p.n; j++) {
        let dot = 0;
        let abs = 0;
        for (let c = 0; c < p.k; c++) {
          const t = w(j, c) * p.x[i * p.k + c];
          dot += t;
          abs += Math.abs(t);
        }
        const y = dot + (bias ? bias[j] : 0);
        const bound = p.k * abs * 2 ** -24 + Math.abs(y) * 2 ** -24 + 2 ** -126;
        const v = got[i * p.n + j];
        if (!(Math.abs(v - y) <= bound)) bad.push(`y[${i},${j}] = ${v}, f64 ${y}, bound ${bound}`);
      }
    }
    return bad;
  };
  for (const name of ['w4a16-asym-g128', 'sharded-nvfp4a16', 'mxfp4a16', 'fp8-block-bf16', 'gptq-w4-g128-actorder', 'awq-gemm-w4-g128', 'gpt-oss-mxfp4',
    'ct-sparse24-fp8', 'modelopt-int4-awq', 'bnb-fp4-bf16', 'mlx-affine-4bit-g64']) {
    const dir = path.join(root, 'tests/fixtures', name, 'model');
    const got = await products(`/tests/fixtures/${name}/model/`, {}, filesOf(dir));
    const dense = denseOf(dir);
    const bad = got.products.flatMap((p) => [...outside(p, dense, p.gpu).map((b) => `gpu ${p.name} m=${p.m} ${b}`),
      ...outside(p, dense, p.cpu).map((b) => `cpu ${p.name} m=${p.m} ${b}`)]);
    const packed = got.products.every((p) => p.gpuBytes > 0 && p.gpuBytes < 2 * p.n * p.k);
    check(!got.error && got.products.length > 0 && got.refused.length === 0 && packed && bad.length === 0 && got.products.every((p) => p.same),
      `${name}: ${got.products.length / 2} Linears multiplied on WebGPU and the CPU within the bound${got.error || ''} ${got.refused} ${bad.slice(0, 3)}`);
    if (name === 'sharded-nvfp4a16') {
      hubLog.length = 0;
      const hubGot = await products(hubRepo, { endpoint: hubBase });
      const whole = hubLog.filter((h) => h.path.startsWith('/cdn/') && !h.range);
      const same = JSON.stringify(hubGot.products.map((p) => p.gpu)) === JSON.stringify(got.products.map((p) => p.gpu));
      check(!hubGot.error && same && whole.length === 0, `${hubRepo} from the Hub: the same products, shards read by range only ${hubGot.error || ''}`);
    }
  }

  // GGUF files, read piece by piece (no slice of a whole file): every
  // quantized weight, under its dense name, multiplied as above within the
  // bound of the CLI's dense weight, on WebGPU and the wasm CPU.
  for (const name of ['hf-llama', 'hf-qwen3moe']) {
    const dir = path.join(root, 'tests/gguf', name, 'model');
    const got = await products(`/tests/gguf/${name}/model/`, {}, filesOf(dir));
    const dense = denseOf(dir);
    const bad = got.products.flatMap((p) => [...outside(p, dense, p.gpu).map((b) => `gpu ${p.name} m=${p.m} ${b}`),
      ...outside(p, dense, p.cpu).map((b) => `cpu ${p.name} m=${p.m} ${b}`)]);
    const listed = got.products.every((p) => p.name in dense);
    const piecewise = got.slices.length > 0 && Math.max(...got.slices) < got.sizes[0];
    check(!got.error && got.products.length > 0 && got.refused.length === 0 && listed && piecewise && bad.length === 0
      && got.products.every((p) => p.same),
    `${name}: ${got.products.length / 2} GGUF weights multiplied on WebGPU and the CPU within the bound, read in ${got.slices.length} slices${got.error || ''} ${got.refused} ${bad.slice(0, 3)}`);
  }

  // Routed experts in one call: every stack listed with its experts, and
  // one stack of GGUF's qwen3moe (`*_exps`) and of GPT-OSS (3-D, with a
  // bias) multiplied for 8 rows over 4 experts, some repeated: each row's
  // result the bits its expert's own product gives it, on WebGPU (a stack
  // uploaded, and one uploaded for the call) and the CPU. (Every stack of
  // every MoE fixture is held to it natively.)
  const routed = (source, names, which) => page.evaluate(async (source, names, which) => {
    const files = new Map();
    for (const n of names) files.set(n, await (await fetch(source + n)).blob());
    let seed = 4242;
    const random = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648 - 0.5; };
    const bits = (v) => [...new Uint32Array(Float32Array.from(v).buffer)].join();
    const out = { stacks: [], bad: [], rows: 0 };
    try {
      const linears = await window.wd.openLinears(files, {});
      for (const [stack, experts] of linears.expertStacks()) {
        out.stacks.push(`${stack} ${experts.length}`);
        if (stack !== which) continue;
        const ids = Uint32Array.from([3, 1, 3, 0, 1, 2, 3, 0], (e) => e % experts.length);
        const w = await linears.uploadExperts(stack);
        const x = Float32Array.from({ length: ids.length * w.k }, random);
        const gpu = await w.matmulExperts(x, ids);
        const once = await linears.matmulExperts(stack, x, ids);
        const cpu = await linears.matmulCpuExperts(stack, x, ids);
        if (w.experts !== experts.length || bits(once) !== bits(gpu)) out.bad.push(`${stack}: ${w.experts} experts, once ${bits(once) === bits(gpu)}`);
        const alone = new Map();
        for (let r = 0; r < ids.length; r++) {
          const e = ids[r];
          // A 3-D stack's experts are NAME[e]; the others weights of their own.
          const [name, expert] = experts[e].endsWith(']') ? [stack, e] : [experts[e], undefined];
          if (!alone.has(e)) alone.set(e, await linears.upload(name, expert));
          const xr = x.subarray(r * w.k, (r + 1) * w.k);
          const row = (y) => y.subarray(r * w.n, (r + 1) * w.n);
          const gpuAlone = await alone.get(e).matmul(xr, 1);
          const cpuAlone = await linears.matmulCpu(name, xr, 1, expert);
          if (bits(row(gpu)) !== bits(gpuAlone)) out.bad.push(`${stack} row ${r} expert ${e} on WebGPU`);
          if (bits(row(cpu)) !== bits(cpuAlone)) out.bad.push(`${stack} row ${r} expert ${e} on the CPU`);
          out.rows++;
        }
      }
      try {
        await linears.matmulCpuExperts(out.stacks[0].split(' ')[0], new Float32Array(4), [0, 1]);
      } catch (e) {
        out.refused = e.rule;
      }
    } catch (e) {
      out.error = `${e.rule} ${e.message}`;
    }
    return out;
  }, source, names, which);
  for (const [cases, name, stack, experts] of [['tests/gguf', 'hf-qwen3moe', 'model.layers.0.mlp.experts.*.gate_proj.weight', 4],
    ['tests/fixtures', 'gpt-oss-mxfp4', 'model.layers.0.mlp.experts.gate_up_proj', 8]]) {
    const dir = path.join(root, cases, name, 'model');
    const got = await routed(`/${cases}/${name}/model/`, filesOf(dir), stack);
    check(!got.error && got.stacks.includes(`${stack} ${experts}`) && got.rows === 8 && got.bad.length === 0 && got.refused === 'ARG-001',
      `${name}: matmulExperts over ${got.stacks.length} stacks, ${got.rows} rows their experts' own bits${got.error || ''} ${got.bad.slice(0, 3)}`);
  }

  // Malformed checkpoints: refused with the CLI's rule and line.
  const broken = (name, from, edit) => {
    const dir = path.join(scratch, name);
    fs.cpSync(path.join(root, 'tests/fixtures', from, 'model'), dir, { recursive: true });
    edit(dir);
    return dir;
  };
  const rewrite = (file, f) => fs.writeFileSync(file, f(fs.readFileSync(file)));
  const cases = [
    broken('truncated', 'w4a16-g128', (d) => rewrite(path.join(d, 'model.safetensors'), (b) => b.subarray(0, b.length - 1))),
    broken('header-too-long', 'w4a16-g128', (d) => rewrite(path.join(d, 'model.safetensors'), (b) => { const c = Buffer.from(b); c.writeBigUInt64LE(BigInt(b.length) * 2n, 0); return c; })),
    broken('config-not-json', 'w4a16-g128', (d) => fs.writeFileSync(path.join(d, 'config.json'), '{"quantization_config": ')),
    broken('num-bits-a-string', 'w4a16-g128', (d) => rewrite(path.join(d, 'config.json'), (b) => b.toString().replace('"num_bits": 4', '"num_bits": "4"'))),
    broken('index-names-a-missing-shard', 'sharded-nvfp4a16', (d) => fs.rmSync(path.join(d, 'model-00002-of-00002.safetensors'))),
    broken('unknown-format', 'nvfp4a16', (d) => rewrite(path.join(d, 'config.json'), (b) => b.toString().replaceAll('"nvfp4-pack-quantized"', '"float-quantized-2099"'))),
  ];
  for (const dir of cases) {
    const want = runCli(dir, 'auto');
    const line = (want.error || '').replace(/^error: /, '');
    const rule = /\[([A-Z]+-\d+)\]/.exec(line)?.[1];
    check(rule, `cli refuses ${path.basename(dir)}: ${line}`);
    for (const backend of ['gpu', 'cpu']) {
      const got = await inBrowser(`/scratch/${path.basename(dir)}/`, filesOf(dir), { backend });
      // The CLI names files by path, the browser by name: the rest is the same.
      const tail = (s) => (s || '').slice((s || '').indexOf('['));
      check(got.rule === rule && tail(got.error) === tail(line),
        `${path.basename(dir)} on ${backend}: ${got.error}`);
    }
  }

  // inspect gives the object `inspect --json` prints (the path aside).
  const sample = path.join(root, 'assets/sample-w4a16');
  const cliReport = JSON.parse(spawnSync(cli, ['inspect', sample, '--json']).stdout.toString());
  const report = await page.evaluate(async (names) => {
    const files = new Map();
    for (const n of names) files.set(n, await (await fetch(`/assets/sample-w4a16/${n}`)).blob());
    return window.wd.inspect(files);
  }, filesOf(sample));
  // The path and the free space where the output would go are the
  // command's alone (a page has no folder to write into).
  for (const r of [cliReport, report]) { delete r.path; delete r.free_bytes; }
  check(JSON.stringify(report) === JSON.stringify(cliReport), 'inspect: the report inspect --json prints');

  // A Hub id: read from the mock Hub (another origin) by range, the CLI's
  // files on both backends; inspect's report; an unknown repository and
  // what is no id are refused with the CLI's rules.
  const wantHub = runCli(hubDir, 'auto');
  const fromHub = (source, options) => page.evaluate(async (source, options) => {
    const hex = (b) => [...new Uint8Array(b)].map((x) => x.toString(16).padStart(2, '0')).join('');
    try {
      const out = await window.wd.dequantize(source, options);
      const got = {};
      for (const [name, blob] of out) got[name] = hex(await crypto.subtle.digest('SHA-256', await blob.arrayBuffer()));
      return { files: got };
    } catch (e) {
      return { error: e.message, rule: e.rule };
    }
  }, source, options);
  for (const backend of ['gpu', 'cpu']) {
    hubLog.length = 0;
    const got = await fromHub(hubRepo, { endpoint: hubBase, backend });
    const same = JSON.stringify(sorted(got.files)) === JSON.stringify(sorted(wantHub.files));
    check(same, `${hubRepo} from the Hub on ${backend}: the CLI's files${same ? '' : `\n  got  ${JSON.stringify(got)}\n  want ${JSON.stringify(wantHub)}`}`);
    const whole = hubLog.filter((h) => h.path.startsWith('/cdn/') && !h.range);
    check(hubLog.some((h) => h.range) && whole.length === 0, `  its shards read by range only (${whole.length} whole)`);
  }
  const hubReport = await page.evaluate((id, endpoint) => window.wd.inspect(id, { endpoint }), hubRepo, hubBase);
  const cliHubReport = JSON.parse(spawnSync(cli, ['inspect', hubDir, '--json']).stdout.toString());
  check(hubReport.path === undefined || hubReport.path.includes(hubRepo), `inspect names the repository: ${hubReport.path}`);
  for (const r of [hubReport, cliHubReport]) { delete r.path; delete r.free_bytes; }
  check(JSON.stringify(hubReport) === JSON.stringify(cliHubReport), 'inspect of a Hub id: the report inspect --json prints');
  const missing = await fromHub('org/missing', { endpoint: hubBase });
  check(missing.rule === 'HUB-001', `an unknown repository: ${missing.error}`);
  const notId = await fromHub('not/an/id', {});
  check(notId.rule === 'ARG-001', `not a Hub id: ${notId.error}`);

  // The page: run the sample, see the table fill in, offer the files.
  await page.setViewport({ width: 1180, height: 900 });
  await page.goto(`${base}/web/index.html`);
  await page.waitForSelector('body[data-state="ready"]', { timeout: 60000 });
  await page.click('#sample');
  await page.waitForSelector('body[data-state="done"], body[data-state="failed"]', { timeout: 120000 });
  const state = await page.evaluate(() => ({
    state: document.body.dataset.state,
    rows: document.querySelectorAll('#rows tr').length,
    done: document.querySelectorAll('#rows td.done').length,
    ranOn: document.getElementById('ranon').textContent,
    links: [...document.querySelectorAll('#files a')].map((a) => a.download),
    error: document.getElementById('error').textContent,
  }));
  check(state.state === 'done', `the page ran the sample ${state.error}`);
  check(state.rows > 0 && state.done === state.rows, `its table filled in: ${state.done} of ${state.rows} rows`);
  check(state.ranOn.startsWith('WebGPU'), `it ran on WebGPU: ${state.ranOn}`);
  const want = runCli(sample, 'auto');
  check(JSON.stringify(state.links.sort()) === JSON.stringify(Object.keys(want.files).sort()), `it offers the CLI's files: ${state.links}`);
  // A folder chosen with the picker: the sharded fixture, on the CPU.
  const sharded = path.join(root, 'tests/fixtures/sharded-nvfp4a16/model');
  await page.select('#backend', 'cpu');
  await page.evaluate(() => { window.lastOutput = null; });
  const input = await page.$('#folder');
  // What the picker hands a page for a chosen folder (a webkitdirectory input).
  await input.uploadFile(sharded);
  await page.waitForFunction(() => window.lastOutput || document.body.dataset.state === 'failed', { timeout: 120000 });
  const picked = await page.evaluate(async () => {
    const hex = (b) => [...new Uint8Array(b)].map((x) => x.toString(16).padStart(2, '0')).join('');
    const got = {};
    for (const [name, blob] of window.lastOutput) got[name] = hex(await crypto.subtle.digest('SHA-256', await blob.arrayBuffer()));
    return { state: document.body.dataset.state, ranOn: document.getElementById('ranon').textContent, files: got };
  });
  const wantSharded = runCli(sharded, 'auto');
  check(picked.state === 'done' && picked.ranOn.startsWith('CPU')
    && JSON.stringify(sorted(picked.files)) === JSON.stringify(sorted(wantSharded.files)),
  `a picked folder on the CPU: the CLI's files (${picked.state}, ${picked.ranOn})`);
  // A Hub id typed into the page (its Hub the mock: ?endpoint=).
  await page.goto(`${base}/web/index.html?endpoint=${encodeURIComponent(hubBase)}`);
  await page.waitForSelector('body[data-state="ready"]', { timeout: 60000 });
  await page.evaluate(() => { window.lastOutput = null; });
  await page.type('#hubid', hubRepo);
  await page.click('#hubrun');
  await page.waitForFunction(() => window.lastOutput || document.body.dataset.state === 'failed', { timeout: 120000 });
  const typed = await page.evaluate(async () => {
    const hex = (b) => [...new Uint8Array(b)].map((x) => x.toString(16).padStart(2, '0')).join('');
    const got = {};
    for (const [name, blob] of window.lastOutput || []) got[name] = hex(await crypto.subtle.digest('SHA-256', await blob.arrayBuffer()));
    return { state: document.body.dataset.state, error: document.getElementById('error').textContent, files: got };
  });
  check(typed.state === 'done' && JSON.stringify(sorted(typed.files)) === JSON.stringify(sorted(wantHub.files)),
    `a Hub id in the page: the CLI's files (${typed.state} ${typed.error})`);
  await page.select('#backend', 'auto');
  // The sample is fetched before its run starts: "done" must be its own.
  await page.evaluate(() => { document.body.dataset.state = 'ready'; });
  await page.click('#sample');
  await page.waitForSelector('body[data-state="done"]', { timeout: 120000 });

  // A GGUF model picked with "Choose .gguf files…" on a fresh page: the
  // table lists transformers' names, and the page offers the CLI's files.
  // Its screenshot is docs/browser.md's (SCREENSHOT=web/screenshot.png
  // web/test.sh writes it there; by default it goes under target/).
  const gguf = path.join(root, 'tests/gguf/gguf-q4_k-llama/model/model.gguf');
  await page.goto(`${base}/web/index.html`);
  await page.waitForSelector('body[data-state="ready"]', { timeout: 60000 });
  await page.waitForFunction(() => !document.getElementById('adapter').textContent.startsWith('looking'), { timeout: 60000 });
  await page.evaluate(() => { window.lastOutput = null; });
  await (await page.$('#gguf')).uploadFile(gguf);
  await page.waitForSelector('body[data-state="done"], body[data-state="failed"]', { timeout: 120000 });
  const ggufPage = await page.evaluate(() => ({
    state: document.body.dataset.state,
    format: document.getElementById('format').textContent,
    rows: document.querySelectorAll('#rows tr').length,
    done: document.querySelectorAll('#rows td.done').length,
    links: [...document.querySelectorAll('#files a')].map((a) => a.download),
    error: document.getElementById('error').textContent,
  }));
  const wantGguf = runCli(gguf, 'auto');
  check(ggufPage.state === 'done' && ggufPage.format.startsWith('gguf') && ggufPage.rows > 0
    && ggufPage.done === ggufPage.rows
    && JSON.stringify(ggufPage.links.sort()) === JSON.stringify(Object.keys(wantGguf.files).sort()),
  `a GGUF file picked in the page: its table and the CLI's files (${ggufPage.state} ${ggufPage.format} ${ggufPage.error})`);

  const shot = process.env.SCREENSHOT || path.join(root, 'target/web-page.png');
  await page.screenshot({ path: shot, fullPage: true });
  console.log(`screenshot: ${shot}`);
  // A browser without WebGPU (no --enable-unsafe-webgpu on Linux): 'gpu'
  // is a clear GPU-001, 'auto' decodes on the CPU, says so, and gives the
  // same files.
  const plain = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run', '--disable-quic', '--disable-features=WebGPU'],
  });
  try {
    const p = await plain.newPage();
    await p.goto(`${base}/web/blank.html`);
    const got = await p.evaluate(async (names, pkg) => {
      const m = await import(pkg);
      await m.default();
      const files = new Map();
      for (const n of names) files.set(n, await (await fetch(`/assets/sample-w4a16/${n}`)).blob());
      const hex = (b) => [...new Uint8Array(b)].map((x) => x.toString(16).padStart(2, '0')).join('');
      const out = { info: await m.adapterInfo() };
      try {
        await m.dequantize(files, { backend: 'gpu' });
        out.gpu = 'decoded';
      } catch (e) {
        out.gpu = e.message;
        out.gpuRule = e.rule;
      }
      const notes = [];
      const dense = await m.dequantize(files, { backend: 'auto', onProgress: (d, t, detail) => { if (detail?.note) notes.push(detail.note); } });
      out.notes = notes;
      out.files = {};
      for (const [name, blob] of dense) out.files[name] = hex(await crypto.subtle.digest('SHA-256', await blob.arrayBuffer()));
      // A GGUF file with a tensor transformers' model has no place for:
      // onWarning hears it; strict refuses the run.
      const gguf = new Map([['unplaced.gguf', await (await fetch('/tests/gguf/configs/unplaced.gguf')).blob()]]);
      out.warnings = [];
      await m.dequantize(gguf, { backend: 'cpu', onWarning: (w) => out.warnings.push(w) });
      try {
        await m.dequantize(gguf, { backend: 'cpu', strict: true });
        out.strict = 'made';
      } catch (e) {
        out.strict = e.rule;
      }
      return out;
    }, filesOf(sample), pkg);
    check(got.info === null, `no WebGPU: adapterInfo() is null (${JSON.stringify(got.info)})`);
    check(got.gpuRule === 'GPU-001', `no WebGPU: backend 'gpu' is refused: ${got.gpu}`);
    check(got.notes.length === 1 && JSON.stringify(sorted(got.files)) === JSON.stringify(sorted(want.files)),
      `no WebGPU: 'auto' decodes on the CPU to the CLI's files, with a note: ${got.notes}`);
    check(got.warnings.length === 1 && got.warnings[0].rule === 'HF-001'
      && got.warnings[0].tensor === 'blk.0.attn_sinks.weight' && got.warnings[0].message.includes('[HF-001]'),
      `onWarning hears the plan's warning: ${JSON.stringify(got.warnings)}`);
    check(got.strict === 'HF-001', `strict: true refuses a run with a warning: ${got.strict}`);
  } finally {
    await plain.close();
  }
} finally {
  await browser.close();
  server.close();
  hub.close();
  fs.rmSync(scratch, { recursive: true, force: true });
}
console.log(failures ? `${failures} failed` : 'all passed');
process.exit(failures ? 1 : 0);
