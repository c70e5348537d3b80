//! wgpu-dequant in a browser: the library's `Dequantize::stream` over the
//! `File`s (or bytes) a page hands in, and the dense files handed back as
//! `Blob`s. Backend choice, fallback and planning are the library's; this
//! file only translates between JavaScript and Rust.
//!
//! ```js
//! import init, { dequantize, inspect, adapterInfo } from './pkg/wgpu_dequant.js';
//! await init();
//! const out = await dequantize(files, { dtype: 'auto', backend: 'auto', onProgress });
//! ```
#![cfg(target_arch = "wasm32")]

use std::ops::Range;

use js_sys::{Array, Function, Map, Object, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::Blob;
use wgpu_dequant::stream::{self, Part};
use wgpu_dequant::{BackendChoice, Dequantize, DtypeChoice, Error, GpuDecoder, Note, Rule};

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

fn string_option(options: &JsValue, key: &str, default: &str) -> Result<String, JsValue> {
    let v = option(options, key);
    if v.is_undefined() || v.is_null() {
        return Ok(default.to_string());
    }
    v.as_string()
        .ok_or_else(|| js_error(&argument(format!("options.{key}: a string"))))
}

/// Dequantizes the checkpoint in `files` to the files the CLI writes:
/// a `Map` of file name → `Blob`.
#[wasm_bindgen]
pub async fn dequantize(files: JsValue, options: JsValue) -> Result<Map, JsValue> {
    let files = Files::from_js(&files)?;
    let dtype: DtypeChoice = string_option(&options, "dtype", "auto")?
        .parse()
        .map_err(|e| js_error(&e))?;
    let backend: BackendChoice = string_option(&options, "backend", "auto")?
        .parse()
        .map_err(|e| js_error(&e))?;
    let on_progress = option(&options, "onProgress").dyn_into::<Function>().ok();
    let note = |note: Note<'_>| {
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
    let out: Vec<(String, Array)> = Vec::new();
    let out = std::cell::RefCell::new(out);
    let failed = std::cell::RefCell::new(None);
    let emit = |name: &str, part: Part| {
        let blob = match part {
            Part::Bytes(bytes) => {
                let array = Array::of1(&Uint8Array::from(&bytes[..]));
                Blob::new_with_u8_array_sequence(&array)
            }
            Part::Stored { file, range } => match files.get(&file) {
                Some(s) => s
                    .part(range)
                    .and_then(|p| Blob::new_with_blob_sequence(&Array::of1(&p))),
                None => Err(js_error(&Error::new(Rule::Io, &file, "not handed in"))),
            },
            Part::File(file) => match files.get(&file) {
                Some(s) => s
                    .part(0..s.len())
                    .and_then(|p| Blob::new_with_blob_sequence(&Array::of1(&p))),
                None => Err(js_error(&Error::new(Rule::Io, &file, "not handed in"))),
            },
        };
        match blob {
            Ok(blob) => {
                let mut out = out.borrow_mut();
                match out.iter().position(|(n, _)| n == name) {
                    Some(i) => {
                        out[i].1.push(&blob);
                    }
                    None => out.push((name.to_string(), Array::of1(&blob))),
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
        map.set(&name.into(), &Blob::new_with_blob_sequence(&parts)?.into());
    }
    Ok(map)
}

/// What `inspect --json` prints for the checkpoint in `files`.
#[wasm_bindgen]
pub async fn inspect(files: JsValue) -> Result<JsValue, JsValue> {
    let files = Files::from_js(&files)?;
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
