//! wgpu-dequant in a browser: the library's `Dequantize::stream` over the
//! `File`s (or bytes) a page hands in, or over a Hugging Face Hub
//! repository read with `fetch` (its revision pinned to a commit, byte
//! ranges of its files), and the dense files handed back as `Blob`s; and
//! `Linears`' products with packed weights on the page's WebGPU
//! device, `Float32Array`s in and out.
//! Backend choice, fallback, planning and the Hub's protocol are the
//! library's; this file only translates between JavaScript and Rust.
//!
//! ```js
//! import init, { dequantize, inspect, adapterInfo } from './pkg/wgpu_dequant.js';
//! await init();
//! const out = await dequantize(files, { dtype: 'auto', backend: 'auto', onProgress });
//! const hub = await dequantize('org/name', { revision: 'main', token, endpoint });
//!
//! // Products with packed weights: W stays packed in GPUBuffers.
//! const linears = await openLinears(files, { dtype: 'auto' });
//! const w = await linears.upload(linears.quantized()[0].name);
//! const y = await w.matmul(x, m);              // Float32Array [m, w.n]
//! const yCpu = await linears.matmulCpu(w.name, x, m);
//!
//! // Routed experts: row r of x by expert ids[r] of a stack, in one call.
//! const [stack] = linears.expertStacks().keys();
//! const s = await linears.uploadExperts(stack);
//! const ye = await s.matmulExperts(x, ids);    // Float32Array [ids.length, s.n]
//! const yeCpu = await linears.matmulCpuExperts(stack, x, ids);
//! ```
#![cfg(target_arch = "wasm32")]

use std::ops::Range;
use std::rc::Rc;

use js_sys::{Array, Function, Map, Object, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, JsFuture};
use web_sys::{Blob, Headers, Request, RequestInit, Response};
use wgpu_dequant::repo::{self, RepoId, Revision};
use wgpu_dequant::stream::{self, Part};
use wgpu_dequant::{
    BackendChoice, Dequantize, DtypeChoice, Error, GpuDecoder, Note, PackedLinear, Rule,
};

/// One file handed in: a `Blob` (a `File` is one), read slice by slice, or bytes.
enum Source {
    Blob(Blob),
    Bytes(Uint8Array),
}

impl Source {
    fn len(&self) -> u64 {
        match self {
            Source::Blob(b) => b.size() as u64,
            Source::Bytes(b) => b.length() as u64,
        }
    }

    /// Bytes `range` as a part of a new `Blob`, without reading them.
    fn part(&self, range: Range<u64>) -> Result<JsValue, JsValue> {
        Ok(match self {
            Source::Blob(b) => b
                .slice_with_f64_and_f64(range.start as f64, range.end as f64)?
                .into(),
            Source::Bytes(b) => b.subarray(range.start as u32, range.end as u32).into(),
        })
    }
}

/// The files of a checkpoint: a `Map` or a plain object, file name →
/// `Blob`/`File`, `Uint8Array` or `ArrayBuffer`.
struct Files(Vec<(String, Source)>);

impl Files {
    fn from_js(files: &JsValue) -> Result<Files, JsValue> {
        let entries: Array = if files.is_instance_of::<Map>() {
            Array::from(&Map::from(files.clone()).entries().into())
        } else if files.is_object() {
            Object::entries(&Object::from(files.clone()))
        } else {
            return Err(js_error(&argument(
                "files: a Map or an object of name → File",
            )));
        };
        let mut out = Vec::new();
        for entry in entries.iter() {
            let entry = Array::from(&entry);
            let name = entry.get(0).as_string().unwrap_or_default();
            let value = entry.get(1);
            let source = if value.is_instance_of::<Blob>() {
                Source::Blob(value.into())
            } else if value.is_instance_of::<Uint8Array>() {
                Source::Bytes(value.into())
            } else if value.is_instance_of::<js_sys::ArrayBuffer>() {
                Source::Bytes(Uint8Array::new(&value))
            } else {
                let what = format!("files: {name} is not a File, Blob, Uint8Array or ArrayBuffer");
                return Err(js_error(&argument(what)));
            };
            // A folder picker names files by their path inside the folder.
            let name = name.rsplit('/').next().unwrap_or_default().to_string();
            out.push((name, source));
        }
        Ok(Files(out))
    }

    fn get(&self, name: &str) -> Option<&Source> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }
}

impl stream::Files for Files {
    fn list(&self) -> Vec<(String, u64)> {
        self.0.iter().map(|(n, s)| (n.clone(), s.len())).collect()
    }

    async fn read(&self, name: &str, range: Range<u64>) -> wgpu_dequant::Result<Vec<u8>> {
        let io = |detail: String| Error::new(Rule::Io, name, detail);
        let source = self.get(name).ok_or_else(|| io("not handed in".into()))?;
        match source {
            Source::Blob(b) => {
                let slice = b
                    .slice_with_f64_and_f64(range.start as f64, range.end as f64)
                    .map_err(|e| io(format!("cannot slice: {e:?}")))?;
                let buffer = JsFuture::from(slice.array_buffer())
                    .await
                    .map_err(|e| io(format!("cannot read: {e:?}")))?;
                Ok(Uint8Array::new(&buffer).to_vec())
            }
            Source::Bytes(b) => Ok(b.subarray(range.start as u32, range.end as u32).to_vec()),
        }
    }
}

/// A repository on the Hub (or a mirror at `endpoint`), pinned to the
/// commit its revision is, read by `fetch` (the Hub answers with CORS).
struct HubFiles {
    endpoint: String,
    token: Option<String>,
    revision: Revision,
}

impl HubFiles {
    /// The repository `id` names (`ORG/NAME[@REV]`), with `options`'
    /// `revision`, `endpoint` and `token`.
    async fn open(id: &str, options: &JsValue) -> Result<HubFiles, JsValue> {
        let named = RepoId::parse(id).ok_or_else(|| {
            js_error(&argument(format!(
                "{id}: not a Hub id (ORG/NAME or ORG/NAME@REVISION)"
            )))
        })?;
        let revision = optional_string(options, "revision")?;
        let endpoint =
            optional_string(options, "endpoint")?.unwrap_or_else(|| repo::ENDPOINT.into());
        let token = optional_string(options, "token")?;
        let id = named.at(revision.as_deref());
        let shown = id.to_string();
        let answer = fetch(&id.revision_url(&endpoint), None, token.as_deref(), &shown)
            .await
            .map_err(|e| js_error(&e))?;
        let revision = Revision::parse(id, &answer).map_err(|e| js_error(&e))?;
        Ok(HubFiles {
            endpoint,
            token,
            revision,
        })
    }

    /// Bytes `range` of `file`, fetched.
    async fn range(&self, file: &str, range: Range<u64>) -> wgpu_dequant::Result<Vec<u8>> {
        let url = self.revision.file_url(&self.endpoint, file);
        let shown = format!("{}/{file}", self.revision.pinned());
        fetch(&url, Some(range), self.token.as_deref(), &shown).await
    }
}

impl stream::Files for HubFiles {
    fn name(&self) -> Option<String> {
        Some(self.revision.pinned())
    }

    fn list(&self) -> Vec<(String, u64)> {
        // The revision answer (asked with its blobs) sizes every file.
        let files = self.revision.files.iter();
        files
            .filter_map(|(n, size)| Some((n.clone(), (*size)?)))
            .collect()
    }

    async fn read(&self, name: &str, range: Range<u64>) -> wgpu_dequant::Result<Vec<u8>> {
        self.range(name, range).await
    }
}

/// `url`'s bytes (`range` of them, asked with a `Range` header), by the
/// page's `fetch`; failures named after `shown`, with the Hub's rules.
async fn fetch(
    url: &str,
    range: Option<Range<u64>>,
    token: Option<&str>,
    shown: &str,
) -> wgpu_dequant::Result<Vec<u8>> {
    let failed = |rule: Rule, detail: String| Error::new(rule, shown, detail);
    let js = |what: &str| {
        let what = what.to_string();
        move |e: JsValue| failed(Rule::Io, format!("{what}: {e:?}"))
    };
    let headers = Headers::new().map_err(js("cannot ask"))?;
    if let Some(r) = &range {
        let asked = format!("bytes={}-{}", r.start, r.end.saturating_sub(1));
        headers.set("Range", &asked).map_err(js("cannot ask"))?;
    }
    if let Some(t) = token {
        headers
            .set("Authorization", &format!("Bearer {t}"))
            .map_err(js("cannot ask"))?;
    }
    let init = RequestInit::new();
    init.set_method("GET");
    init.set_headers(&headers);
    let request = Request::new_with_str_and_init(url, &init).map_err(js("cannot ask"))?;
    // The window's fetch, or a worker's.
    let fetch: Function = Reflect::get(&js_sys::global(), &"fetch".into())
        .and_then(|f| f.dyn_into().map_err(JsValue::from))
        .map_err(js("no fetch here"))?;
    let promise: js_sys::Promise = fetch
        .call1(&JsValue::NULL, &request)
        .and_then(|p| p.dyn_into().map_err(JsValue::from))
        .map_err(js("cannot reach the Hub"))?;
    let response: Response = JsFuture::from(promise)
        .await
        .and_then(|r| r.dyn_into().map_err(JsValue::from))
        .map_err(js("cannot reach the Hub"))?;
    let status = response.status();
    if !response.ok() {
        let detail = match status {
            401 | 403 => "the Hub refuses it (gated or private: pass a token)".to_string(),
            404 => "the Hub has no such repository, revision or file".to_string(),
            s => format!("the Hub answered {s}"),
        };
        return Err(failed(Rule::Hub, detail));
    }
    let body = response
        .array_buffer()
        .map_err(js("cannot read the Hub's answer"))?;
    let body = JsFuture::from(body)
        .await
        .map_err(js("cannot read the Hub's answer"))?;
    let bytes = Uint8Array::new(&body);
    let Some(r) = range else {
        return Ok(bytes.to_vec());
    };
    let want = r.end - r.start;
    let (at, len) = match status {
        // The range itself.
        206 => (0, bytes.length() as u64),
        // The whole file: the server ignored the range.
        _ => (r.start, (bytes.length() as u64).saturating_sub(r.start)),
    };
    if len < want {
        let detail = format!("the Hub sent {len} of the {want} bytes asked for");
        return Err(failed(Rule::Hub, detail));
    }
    Ok(bytes.subarray(at as u32, (at + want) as u32).to_vec())
}

/// What a page hands in: the files of a checkpoint, or a Hub id.
enum Input {
    Files(Files),
    Hub(HubFiles),
}

impl Input {
    /// `source`: a `Map` or object of files, or a Hub id (a string).
    async fn from_js(source: &JsValue, options: &JsValue) -> Result<Input, JsValue> {
        match source.as_string() {
            Some(id) => Ok(Input::Hub(HubFiles::open(&id, options).await?)),
            None => Ok(Input::Files(Files::from_js(source)?)),
        }
    }
}

impl stream::Files for Input {
    fn name(&self) -> Option<String> {
        match self {
            Input::Files(f) => f.name(),
            Input::Hub(h) => h.name(),
        }
    }

    fn list(&self) -> Vec<(String, u64)> {
        match self {
            Input::Files(f) => f.list(),
            Input::Hub(h) => h.list(),
        }
    }

    async fn read(&self, name: &str, range: Range<u64>) -> wgpu_dequant::Result<Vec<u8>> {
        match self {
            Input::Files(f) => f.read(name, range).await,
            Input::Hub(h) => h.read(name, range).await,
        }
    }
}

/// A part of an output file: a `Blob` made now, or a range of a Hub
/// file, fetched once the decoding is over (the parts come in order,
/// synchronously).
enum OutPart {
    Blob(JsValue),
    Hub(String, Range<u64>),
}

fn argument(detail: impl Into<String>) -> Error {
    Error::bare(Rule::Argument, detail)
}

/// A JS `Error` whose message is the CLI's line (after `error: `), with the
/// rule id in `rule`.
fn js_error(e: &Error) -> JsValue {
    let err = js_sys::Error::new(&e.to_string());
    let _ = Reflect::set(&err, &"rule".into(), &e.rule.id().into());
    err.into()
}

fn option(options: &JsValue, key: &str) -> JsValue {
    if options.is_object() {
        Reflect::get(options, &key.into()).unwrap_or(JsValue::UNDEFINED)
    } else {
        JsValue::UNDEFINED
    }
}

fn optional_string(options: &JsValue, key: &str) -> Result<Option<String>, JsValue> {
    let v = option(options, key);
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    v.as_string()
        .map(Some)
        .ok_or_else(|| js_error(&argument(format!("options.{key}: a string"))))
}

fn string_option(options: &JsValue, key: &str, default: &str) -> Result<String, JsValue> {
    Ok(optional_string(options, key)?.unwrap_or_else(|| default.to_string()))
}

/// Dequantizes the checkpoint in `files` (or the Hub repository that
/// string names, with `options.revision`, `.endpoint`, `.token`) to the
/// files the CLI writes: a `Map` of file name → `Blob`.
#[wasm_bindgen]
pub async fn dequantize(files: JsValue, options: JsValue) -> Result<Map, JsValue> {
    let files = Input::from_js(&files, &options).await?;
    let dtype: DtypeChoice = string_option(&options, "dtype", "auto")?
        .parse()
        .map_err(|e| js_error(&e))?;
    let backend: BackendChoice = string_option(&options, "backend", "auto")?
        .parse()
        .map_err(|e| js_error(&e))?;
    let on_progress = option(&options, "onProgress").dyn_into::<Function>().ok();
    let on_warning = option(&options, "onWarning").dyn_into::<Function>().ok();
    let strict = match option(&options, "strict") {
        v if v.is_undefined() || v.is_null() => false,
        v => v
            .as_bool()
            .ok_or_else(|| js_error(&argument("options.strict: a boolean")))?,
    };
    let note = |note: Note<'_>| {
        if let Note::Warning(w) = note {
            web_sys::console::warn_1(&format!("wgpu-dequant: warning: {w}").into());
            if let Some(f) = &on_warning {
                let detail = Object::new();
                let _ = Reflect::set(&detail, &"rule".into(), &w.rule.id().into());
                let _ = Reflect::set(&detail, &"tensor".into(), &w.subject.as_str().into());
                let _ = Reflect::set(&detail, &"message".into(), &w.message().into());
                let _ = f.call1(&JsValue::NULL, &detail);
            }
            return;
        }
        let Note::Text(text) = note else { return };
        web_sys::console::info_1(&format!("wgpu-dequant: {text}").into());
        if let Some(f) = &on_progress {
            let detail = Object::new();
            let _ = Reflect::set(&detail, &"note".into(), &text.into());
            let _ = f.call3(
                &JsValue::NULL,
                &JsValue::UNDEFINED,
                &JsValue::UNDEFINED,
                &detail,
            );
        }
    };
    // Each part becomes a Blob at once, so the browser may keep it out of
    // this tab's memory; the files are Blobs of those.
    let out: Vec<(String, Vec<OutPart>)> = Vec::new();
    let out = std::cell::RefCell::new(out);
    let failed = std::cell::RefCell::new(None);
    let stored = |file: &str, range: Option<Range<u64>>| -> Result<OutPart, JsValue> {
        match &files {
            Input::Files(f) => {
                let s = f
                    .get(file)
                    .ok_or_else(|| js_error(&Error::new(Rule::Io, file, "not handed in")))?;
                let p = s.part(range.unwrap_or(0..s.len()))?;
                Ok(OutPart::Blob(
                    Blob::new_with_blob_sequence(&Array::of1(&p))?.into(),
                ))
            }
            Input::Hub(h) => {
                let size = stream::Files::list(h).into_iter().find(|(n, _)| n == file);
                let range = range.or(size.map(|(_, s)| 0..s));
                let range = range.ok_or_else(|| {
                    js_error(&Error::new(
                        Rule::Hub,
                        file,
                        "the Hub states no size for it",
                    ))
                })?;
                Ok(OutPart::Hub(file.to_string(), range))
            }
        }
    };
    let emit = |name: &str, part: Part| {
        let made = match part {
            Part::Bytes(bytes) => {
                let array = Array::of1(&Uint8Array::from(&bytes[..]));
                Blob::new_with_u8_array_sequence(&array).map(|b| OutPart::Blob(b.into()))
            }
            Part::Stored { file, range } => stored(&file, Some(range)),
            Part::File(file) => stored(&file, None),
        };
        match made {
            Ok(part) => {
                let mut out = out.borrow_mut();
                match out.iter().position(|(n, _)| n == name) {
                    Some(i) => out[i].1.push(part),
                    None => out.push((name.to_string(), vec![part])),
                }
            }
            Err(e) => {
                failed.borrow_mut().get_or_insert(e);
            }
        }
    };
    let progress = |p: &wgpu_dequant::Progress<'_>| {
        if let Some(f) = &on_progress {
            let detail = Object::new();
            let _ = Reflect::set(&detail, &"tensor".into(), &p.tensor.into());
            let (done, total) = (p.done_bytes as f64, p.total_bytes as f64);
            let _ = f.call3(&JsValue::NULL, &done.into(), &total.into(), &detail);
        }
    };
    Dequantize::new()
        .dtype(dtype)
        .backend(backend)
        .strict(strict)
        .on_note(note)
        .on_progress(progress)
        .stream(&files, emit)
        .await
        .map_err(|e| js_error(&e))?;
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    let map = Map::new();
    for (name, parts) in out.into_inner() {
        let blobs = Array::new();
        for part in parts {
            match part {
                OutPart::Blob(b) => blobs.push(&b),
                OutPart::Hub(file, range) => {
                    let Input::Hub(h) = &files else {
                        return Err(js_error(&Error::bare(
                            Rule::Internal,
                            "a Hub part of local files",
                        )));
                    };
                    let bytes = h.range(&file, range).await.map_err(|e| js_error(&e))?;
                    let array = Array::of1(&Uint8Array::from(&bytes[..]));
                    blobs.push(&Blob::new_with_u8_array_sequence(&array)?.into())
                }
            };
        }
        map.set(&name.into(), &Blob::new_with_blob_sequence(&blobs)?.into());
    }
    Ok(map)
}

/// What `inspect --json` prints for the checkpoint in `files` (or the Hub
/// repository that string names, with `options` as for `dequantize`).
#[wasm_bindgen]
pub async fn inspect(files: JsValue, options: JsValue) -> Result<JsValue, JsValue> {
    let files = Input::from_js(&files, &options).await?;
    let report = stream::inspect(&files).await.map_err(|e| js_error(&e))?;
    let text = serde_json::to_string(&report).map_err(|e| JsError::new(&e.to_string()))?;
    js_sys::JSON::parse(&text)
}

/// The WebGPU adapter `backend: 'gpu'` would run on, or `null`: what wgpu
/// reports, with the browser's own description of it (`GPUAdapterInfo`).
#[wasm_bindgen(js_name = adapterInfo)]
pub async fn adapter_info() -> Result<JsValue, JsValue> {
    let Some(adapter) = GpuDecoder::adapter().await else {
        return Ok(JsValue::NULL);
    };
    let info = adapter.get_info();
    let limits = adapter.limits();
    let browser = browser_adapter_info().await.unwrap_or(JsValue::UNDEFINED);
    let field = |key: &str| {
        Reflect::get(&browser, &key.into())
            .ok()
            .and_then(|v| v.as_string())
            .unwrap_or_default()
    };
    let (vendor, architecture, description) =
        (field("vendor"), field("architecture"), field("description"));
    let name = [
        info.name.as_str(),
        &description,
        &format!("{vendor} {architecture}"),
    ]
    .into_iter()
    .map(str::trim)
    .find(|n| !n.is_empty())
    .unwrap_or("WebGPU adapter")
    .to_string();
    let text = serde_json::json!({
        "name": name,
        "vendor": vendor,
        "architecture": architecture,
        "description": description,
        "deviceType": format!("{:?}", info.device_type),
        "backend": format!("{:?}", info.backend),
        "maxStorageBufferBindingSize": limits.max_storage_buffer_binding_size,
        "maxBufferSize": limits.max_buffer_size,
    })
    .to_string();
    js_sys::JSON::parse(&text)
}

/// `(await navigator.gpu.requestAdapter()).info`: wgpu leaves the names of
/// a browser's adapter empty.
async fn browser_adapter_info() -> Option<JsValue> {
    let gpu = Reflect::get(&js_sys::global(), &"navigator".into())
        .and_then(|n| Reflect::get(&n, &"gpu".into()))
        .ok()?;
    let request: Function = Reflect::get(&gpu, &"requestAdapter".into())
        .ok()?
        .dyn_into()
        .ok()?;
    let promise: js_sys::Promise = request.call0(&gpu).ok()?.dyn_into().ok()?;
    let adapter = JsFuture::from(promise).await.ok()?;
    Reflect::get(&adapter, &"info".into()).ok()
}

/// The quantized Linears of a checkpoint (`openLinears`), for products
/// with packed weights: each read from its files only while it is
/// uploaded or multiplied.
#[wasm_bindgen]
pub struct Linears(Rc<wgpu_dequant::Linears<Input>>);

/// Opens the checkpoint in `files` (or the Hub repository that string
/// names, with `options` as for `dequantize`) for products with its
/// quantized Linears; `options.dtype` is the dense weight's, as for
/// `dequantize`.
#[wasm_bindgen(js_name = openLinears)]
pub async fn open_linears(files: JsValue, options: JsValue) -> Result<Linears, JsValue> {
    let files = Input::from_js(&files, &options).await?;
    let dtype: DtypeChoice = string_option(&options, "dtype", "auto")?
        .parse()
        .map_err(|e| js_error(&e))?;
    let linears = wgpu_dequant::Linears::open(files, dtype)
        .await
        .map_err(|e| js_error(&e))?;
    Ok(Linears(Rc::new(linears)))
}

thread_local! {
    /// The WebGPU device products run on, opened on the first upload.
    static DECODER: std::cell::RefCell<Option<Rc<GpuDecoder>>> = Default::default();
}

/// The decoder on this page's WebGPU adapter, opened once.
async fn decoder() -> Result<Rc<GpuDecoder>, JsValue> {
    if let Some(d) = DECODER.with_borrow(Option::clone) {
        return Ok(d);
    }
    let adapter = GpuDecoder::adapter().await.ok_or_else(|| {
        js_error(&Error::bare(
            Rule::Gpu,
            "this browser has no WebGPU adapter: use matmulCpu",
        ))
    })?;
    let opened = GpuDecoder::open_async(&adapter)
        .await
        .map_err(|e| js_error(&e))?;
    // Another call may have opened one meanwhile: the first stays.
    Ok(DECODER.with_borrow_mut(|slot| slot.get_or_insert(Rc::new(opened)).clone()))
}

#[wasm_bindgen]
impl Linears {
    /// The quantized weights: `[{ name, dtype, shape }]`, sorted by name.
    pub fn quantized(&self) -> Array {
        self.0
            .quantized()
            .iter()
            .map(|t| {
                let o = Object::new();
                let _ = Reflect::set(&o, &"name".into(), &t.name.as_str().into());
                let _ = Reflect::set(&o, &"dtype".into(), &t.dtype.to_string().into());
                let shape: Array = t.shape.iter().map(|&d| JsValue::from(d as f64)).collect();
                let _ = Reflect::set(&o, &"shape".into(), &shape);
                JsValue::from(o)
            })
            .collect()
    }

    /// A `Promise` of weight `name` resident on the page's WebGPU device
    /// as its packs are stored (a `PackedLinear`); the dense weight is
    /// never made. For a 3-D stack of experts, `expert` picks one: the
    /// product the model computes with it (`Model::upload_expert`).
    pub fn upload(&self, name: String, expert: Option<u32>) -> js_sys::Promise {
        let linears = self.0.clone();
        future_to_promise(async move {
            let decoder = decoder().await?;
            let w = match expert {
                Some(e) => linears.upload_expert(&name, e as usize, &decoder).await,
                None => linears.upload_packed(&name, &decoder).await,
            };
            let w = Rc::new(w.map_err(|e| js_error(&e))?);
            Ok(Packed { name, w, decoder }.into())
        })
    }

    /// Every stack of experts: a `Map` from its name to its experts'
    /// names in expert order (`Model::expert_stacks`): a 3-D stack by its
    /// dense name, its experts `NAME[e]`; experts stored a weight each
    /// (Mixtral's, Qwen-MoE's, mlx-lm's, GGUF's `*_exps`) as
    /// `<block>.experts.*.<rest>`, their own names in order.
    #[wasm_bindgen(js_name = expertStacks)]
    pub fn expert_stacks(&self) -> Map {
        let map = Map::new();
        for (stack, names) in self.0.expert_stacks() {
            let names: Array = names.iter().map(|n| JsValue::from(n.as_str())).collect();
            map.set(&stack.as_str().into(), &names);
        }
        map
    }

    /// A `Promise` of every expert of stack `stack` (a name `expertStacks`
    /// gives) resident on the page's WebGPU device as its packs are
    /// stored, in one `PackedLinear` for `matmulExperts`
    /// (`Model::upload_experts`).
    #[wasm_bindgen(js_name = uploadExperts)]
    pub fn upload_experts(&self, stack: String) -> js_sys::Promise {
        let linears = self.0.clone();
        future_to_promise(async move {
            let decoder = decoder().await?;
            let w = linears.upload_experts(&stack, &decoder).await;
            let w = Rc::new(w.map_err(|e| js_error(&e))?);
            Ok(Packed {
                name: stack,
                w,
                decoder,
            }
            .into())
        })
    }

    /// A `Promise` of `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` on the page's
    /// WebGPU device, `W[e]` expert `e` of stack `stack`, for the
    /// `ids.length` rows of `x`: the stack uploaded for this call
    /// (`uploadExperts` keeps it) and multiplied in one submission.
    #[wasm_bindgen(js_name = matmulExperts)]
    pub fn matmul_experts(&self, stack: String, x: Vec<f32>, ids: Vec<u32>) -> js_sys::Promise {
        let linears = self.0.clone();
        future_to_promise(async move {
            let decoder = decoder().await?;
            let y = async {
                let w = linears.upload_experts(&stack, &decoder).await?;
                decoder.matmul_experts_async(&w, &x, &ids).await
            };
            let y = y.await.map_err(|e| js_error(&e))?;
            Ok(js_sys::Float32Array::from(&y[..]).into())
        })
    }

    /// `matmulExperts` on the CPU: each row's result the one
    /// `matmulCpu` gives it with its expert alone
    /// (`Model::matmul_cpu_experts`).
    #[wasm_bindgen(js_name = matmulCpuExperts)]
    pub fn matmul_cpu_experts(&self, stack: String, x: Vec<f32>, ids: Vec<u32>) -> js_sys::Promise {
        let linears = self.0.clone();
        values(async move {
            let m = ids.len();
            linears.matmul_cpu_experts(&stack, &x, m, &ids).await
        })
    }

    /// A `Promise` of `y = x·Wᵀ (+ bias)` on the CPU for weight `name`
    /// (or expert `expert` of it) and the `m` rows of `x` (a
    /// `Float32Array`): a `Float32Array`.
    #[wasm_bindgen(js_name = matmulCpu)]
    pub fn matmul_cpu(
        &self,
        name: String,
        x: Vec<f32>,
        m: usize,
        expert: Option<u32>,
    ) -> js_sys::Promise {
        let linears = self.0.clone();
        values(async move {
            match expert {
                Some(e) => linears.matmul_cpu_expert(&name, e as usize, &x, m).await,
                None => linears.matmul_cpu(&name, &x, m).await,
            }
        })
    }
}

/// A `Promise` of the values `y` gives, as a `Float32Array`.
fn values(
    y: impl std::future::Future<Output = wgpu_dequant::Result<Vec<f32>>> + 'static,
) -> js_sys::Promise {
    future_to_promise(async move {
        let y = y.await.map_err(|e| js_error(&e))?;
        Ok(js_sys::Float32Array::from(&y[..]).into())
    })
}

/// A quantized Linear's packs in `GPUBuffer`s (`Linears.upload`).
#[wasm_bindgen(js_name = PackedLinear)]
pub struct Packed {
    name: String,
    w: Rc<PackedLinear>,
    decoder: Rc<GpuDecoder>,
}

#[wasm_bindgen(js_class = PackedLinear)]
impl Packed {
    /// The weight's name.
    #[wasm_bindgen(getter)]
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// Outputs: W's rows.
    #[wasm_bindgen(getter)]
    pub fn n(&self) -> usize {
        self.w.n
    }

    /// Inputs: W's columns, the length of a row of x.
    #[wasm_bindgen(getter)]
    pub fn k(&self) -> usize {
        self.w.k
    }

    /// Experts it holds (`uploadExperts`), 0 for one Linear.
    #[wasm_bindgen(getter)]
    pub fn experts(&self) -> usize {
        self.w.experts
    }

    /// Bytes it holds on the GPU.
    #[wasm_bindgen(getter, js_name = gpuBytes)]
    pub fn gpu_bytes(&self) -> f64 {
        self.w.gpu_bytes() as f64
    }

    /// A `Promise` of `y = x·Wᵀ (+ bias)` on the GPU for the `m` rows of
    /// `x` (a `Float32Array`): a `Float32Array` of `m` rows of `n`.
    pub fn matmul(&self, x: Vec<f32>, m: usize) -> js_sys::Promise {
        let (w, decoder) = (self.w.clone(), self.decoder.clone());
        values(async move { decoder.matmul_async(&w, &x, m).await })
    }

    /// A `Promise` of `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` on the GPU for the
    /// `ids.length` rows of `x`, `W[e]` expert `e` of this stack
    /// (`uploadExperts`), in one submission: each expert's rows gathered
    /// on the device, each row's result the bits its expert alone gives it.
    #[wasm_bindgen(js_name = matmulExperts)]
    pub fn matmul_experts(&self, x: Vec<f32>, ids: Vec<u32>) -> js_sys::Promise {
        let (w, decoder) = (self.w.clone(), self.decoder.clone());
        values(async move { decoder.matmul_experts_async(&w, &x, &ids).await })
    }
}
