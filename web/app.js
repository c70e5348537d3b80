// The page: pick or drop a checkpoint folder (or run the bundled sample, or
// name a Hub repository), show its report, decode it with the package, and
// offer the dense files. `?endpoint=URL` reads the Hub from a mirror.
import init, { dequantize, inspect, adapterInfo } from './pkg/wgpu_dequant.js';

const SAMPLE = { dir: '../assets/sample-w4a16/', files: ['config.json', 'model.safetensors', 'recipe.yaml'] };
const $ = (id) => document.getElementById(id);
const endpoint = new URLSearchParams(location.search).get('endpoint') || undefined;
let busy = false;

function fmtBytes(n) {
  const units = ['B', 'KB', 'MB', 'GB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function cell(tr, text, cls) {
  const td = tr.insertCell();
  if (cls) td.className = cls;
  td.textContent = text;
  return td;
}

function showReport(name, report) {
  $('summary').hidden = false;
  $('tensors').hidden = false;
  $('ckpt').textContent = `${name} (${report.shards.join(', ')})`;
  $('format').textContent = report.summary;
  $('error').hidden = true;
  $('files').replaceChildren();
  $('bar').value = 0;
  $('stats').textContent = '–';
  const rows = new Map();
  const body = $('rows');
  body.replaceChildren();
  for (const t of report.tensors) {
    const tr = body.insertRow();
    cell(tr, t.name, 'name');
    cell(tr, `[${t.shape.join(', ')}]`);
    cell(tr, t.dtype.toLowerCase());
    const how = cell(tr, '');
    const tag = document.createElement('span');
    tag.className = `tag ${t.action}`;
    tag.textContent = t.scheme_text ? `${t.action} · ${t.scheme_text}` : t.action;
    how.append(tag);
    cell(tr, t.file);
    rows.set(t.name, cell(tr, '…', 'state wait'));
  }
  return rows;
}

// `files`: a Map of name → File, or a Hub id (a string).
async function run(name, files) {
  if (busy) return;
  busy = true;
  document.querySelectorAll('button, select, input').forEach((e) => { e.disabled = true; });
  const dtype = $('dtype').value;
  const backend = $('backend').value;
  const hub = typeof files === 'string' ? { endpoint } : {};
  document.body.dataset.state = 'running';
  try {
    const report = await inspect(files, hub);
    const rows = showReport(name, report);
    const info = backend === 'cpu' ? null : await adapterInfo();
    $('ranon').textContent = info ? `WebGPU: ${info.name} (${info.deviceType.toLowerCase()} adapter)` : 'CPU (wasm)';
    const started = performance.now();
    let done = 0;
    const out = await dequantize(files, {
      ...hub,
      dtype,
      backend,
      onProgress: (doneBytes, totalBytes, detail) => {
        if (detail?.note) {
          $('ranon').textContent = `CPU (wasm): ${detail.note}`;
          return;
        }
        done = doneBytes;
        $('bar').max = totalBytes || 1;
        $('bar').value = doneBytes;
        const td = rows.get(detail?.tensor);
        if (td) { td.textContent = '✓'; td.className = 'state done'; }
      },
    });
    const secs = (performance.now() - started) / 1000;
    $('stats').textContent = `${fmtBytes(done)} in ${secs.toFixed(2)} s (${(done / 1e9 / Math.max(secs, 1e-9)).toFixed(3)} GB/s), ${out.size} files`;
    for (const [file, blob] of out) {
      const a = document.createElement('a');
      a.href = URL.createObjectURL(blob);
      a.download = file;
      a.textContent = `${file} (${fmtBytes(blob.size)})`;
      $('files').append(a);
    }
    window.lastOutput = out;
    document.body.dataset.state = 'done';
  } catch (e) {
    $('summary').hidden = false;
    $('error').hidden = false;
    $('error').textContent = `error: ${e.message}`;
    document.body.dataset.state = 'failed';
  } finally {
    busy = false;
    document.querySelectorAll('button, select, input').forEach((e) => { e.disabled = false; });
  }
}

async function sampleFiles() {
  const files = new Map();
  for (const f of SAMPLE.files) {
    const r = await fetch(SAMPLE.dir + f);
    if (!r.ok) throw new Error(`${f}: ${r.status}`);
    files.set(f, await r.blob());
  }
  return files;
}

// Files of a dropped folder (entries API), by name inside it.
async function droppedFiles(items) {
  const files = new Map();
  const walk = async (entry) => {
    if (entry.isFile) {
      files.set(entry.name, await new Promise((ok, fail) => entry.file(ok, fail)));
    } else if (entry.isDirectory) {
      const reader = entry.createReader();
      for (;;) {
        const batch = await new Promise((ok, fail) => reader.readEntries(ok, fail));
        if (!batch.length) break;
        for (const e of batch) if (e.isFile) await walk(e);
      }
    }
  };
  let name = 'dropped files';
  for (const item of items) {
    const entry = item.webkitGetAsEntry?.();
    if (entry) { if (entry.isDirectory) name = entry.name; await walk(entry); }
  }
  return [name, files];
}

await init();
adapterInfo().then((info) => {
  $('adapter').textContent = info ? `WebGPU adapter: ${info.name}` : 'no WebGPU here: the CPU (wasm) decodes';
  $('adapter').className = info ? 'done' : 'wait';
});
$('sample').onclick = async () => run('assets/sample-w4a16', await sampleFiles());
$('hubform').onsubmit = (ev) => {
  ev.preventDefault();
  const id = $('hubid').value.trim();
  if (id) run(id, id);
};
$('folder').onchange = (ev) => {
  const list = [...ev.target.files];
  if (!list.length) return;
  const files = new Map(list.map((f) => [f.name, f]));
  run(list[0].webkitRelativePath.split('/')[0] || 'folder', files);
};
// A GGUF model's file (or a split one's parts), picked alone.
$('gguf').onchange = (ev) => {
  const list = [...ev.target.files];
  if (list.length) run(list[0].name, new Map(list.map((f) => [f.name, f])));
};
const drop = $('drop');
drop.ondragover = (ev) => { ev.preventDefault(); drop.classList.add('over'); };
drop.ondragleave = () => drop.classList.remove('over');
drop.ondrop = async (ev) => {
  ev.preventDefault();
  drop.classList.remove('over');
  const [name, files] = await droppedFiles([...ev.dataTransfer.items]);
  run(name, files);
};
document.body.dataset.state = 'ready';
