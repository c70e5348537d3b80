//! A mock Hugging Face Hub on 127.0.0.1, serving one folder as a model
//! repository by the routes the Hub's clients use:
//!
//! - `GET /api/models/{repo}/revision/{rev}`: `sha` and `siblings` (with
//!   `size` and `lfs`, as `?blobs=true` asks);
//! - `HEAD`/`GET /{repo}/resolve/{rev}/{file}`: `.safetensors` files are
//!   LFS files, answered with a 302 to `/cdn/{sha256}` carrying
//!   `X-Repo-Commit`, `X-Linked-Etag` and `X-Linked-Size`; others with a
//!   200 and an `ETag`;
//! - `GET /cdn/{sha256}`: honours `Range` with a 206 and `Content-Range`;
//! - 404s with `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`,
//!   `EntryNotFound`), 401 for a gated repository without its token.
//!
//! Faults are switched on per server ([`Faults`]); every request is logged.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::sha256_hex;

/// What the server does wrong, on purpose.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Only this token (`Authorization: Bearer …`) is let in.
    pub gated: Option<String>,
    /// Redirects to the CDN as absolute URLs (as mirrors do).
    pub absolute: bool,
    /// 206 answers without `Content-Range` (as some mirrors do).
    pub no_content_range: bool,
    /// The first answer with more than this many bytes of this file is cut there.
    pub cut: Option<(String, usize)>,
    /// This file's stated SHA-256 is wrong.
    pub wrong_sha: Option<String>,
    /// A folder whose size (its files, recursively) is measured at every
    /// request: the client's cache, to see how much it holds at once.
    pub watch: Option<std::path::PathBuf>,
    /// Large files redirect here (`Location`) instead of to the CDN.
    pub redirect_to: Option<String>,
    /// This file's CDN answers state a `Content-Length` twice what they send.
    pub long_length: Option<String>,
    /// Whole-file CDN answers send their body in pieces this long apart.
    pub slow: Option<std::time::Duration>,
}

/// One request: method, path, and the bytes of body sent.
#[derive(Debug, Clone)]
pub struct Hit {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub sent: usize,
}

struct File {
    bytes: Vec<u8>,
    sha: String,
    lfs: bool,
}

struct State {
    repo: String,
    commit: String,
    files: BTreeMap<String, File>,
    faults: Faults,
    log: Vec<Hit>,
    cut_done: bool,
    /// The most bytes `Faults::watch` held at a request.
    peak: u64,
}

/// A running mock Hub; it stops with the test process.
pub struct MockHub {
    pub endpoint: String,
    pub commit: String,
    state: Arc<Mutex<State>>,
}

impl MockHub {
    /// Serves the files of `dir` as repository `repo` (`ORG/NAME`).
    pub fn serve(repo: &str, dir: &Path, faults: Faults) -> MockHub {
        MockHub::serve_files(repo, dir, false, faults)
    }

    /// Serves the files of `dir` and of its folders (`SUB/NAME` in the
    /// listing, as the Hub lists a repository's folders).
    pub fn serve_tree(repo: &str, dir: &Path, faults: Faults) -> MockHub {
        MockHub::serve_files(repo, dir, true, faults)
    }

    fn serve_files(repo: &str, dir: &Path, tree: bool, faults: Faults) -> MockHub {
        let mut files = BTreeMap::new();
        let mut dirs = vec![(dir.to_path_buf(), String::new())];
        while let Some((at, under)) = dirs.pop() {
            for e in std::fs::read_dir(&at).unwrap() {
                let path = e.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let name = match under.as_str() {
                    "" => name,
                    _ => format!("{under}/{name}"),
                };
                if path.is_file() {
                    let bytes = std::fs::read(&path).unwrap();
                    let lfs = name.ends_with(".safetensors") || name.ends_with(".gguf");
                    let sha = sha256_hex(&bytes);
                    files.insert(name, File { bytes, sha, lfs });
                } else if tree && path.is_dir() {
                    dirs.push((path, name));
                }
            }
        }
        let commit = sha256_hex(repo.as_bytes())[..40].to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            repo: repo.to_string(),
            commit: commit.clone(),
            files,
            faults,
            log: Vec::new(),
            cut_done: false,
            peak: 0,
        }));
        let (shared, base) = (state.clone(), endpoint.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (state, base) = (shared.clone(), base.clone());
                std::thread::spawn(move || {
                    let _ = answer(stream, &state, &base);
                });
            }
        });
        MockHub {
            endpoint,
            commit,
            state,
        }
    }

    pub fn log(&self) -> Vec<Hit> {
        self.state.lock().unwrap().log.clone()
    }

    /// Bytes of file bodies sent from the CDN route.
    pub fn cdn_bytes(&self) -> usize {
        self.log()
            .iter()
            .filter(|h| h.path.starts_with("/cdn/"))
            .map(|h| h.sent)
            .sum()
    }

    pub fn set_faults(&self, faults: Faults) {
        let mut s = self.state.lock().unwrap();
        s.faults = faults;
        s.cut_done = false;
    }

    /// The most bytes the watched folder held at a request.
    pub fn peak(&self) -> u64 {
        self.state.lock().unwrap().peak
    }

    /// The SHA-256 of a served file.
    pub fn sha(&self, file: &str) -> String {
        self.state.lock().unwrap().files[file].sha.clone()
    }
}

/// Bytes of the regular files under `dir` (links not followed).
pub fn folder_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => folder_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Cut the connection after this many body bytes.
    cut: Option<usize>,
    /// The `Content-Length` stated, when not the body's.
    length: Option<usize>,
}

fn reply(status: u16) -> Reply {
    Reply {
        status,
        headers: Vec::new(),
        body: Vec::new(),
        cut: None,
        length: None,
    }
}

fn not_found(code: &str) -> Reply {
    let mut r = reply(404);
    r.headers.push(("X-Error-Code".into(), code.into()));
    r.body = format!("{{\"error\":\"{code}\"}}").into_bytes();
    r
}

fn answer(stream: TcpStream, state: &Mutex<State>, base: &str) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    let mut s = state.lock().unwrap();
    let slow = s
        .faults
        .slow
        .filter(|_| range.is_none() && target.starts_with("/cdn/"));
    if let Some(dir) = s.faults.watch.clone() {
        s.peak = s.peak.max(folder_bytes(&dir));
    }
    let r = route(&mut s, &method, &target, &headers, base);
    let sent = if method == "HEAD" {
        0
    } else {
        r.cut.unwrap_or(r.body.len()).min(r.body.len())
    };
    s.log.push(Hit {
        method: method.clone(),
        path: target.clone(),
        range,
        sent,
    });
    drop(s);
    let mut out = stream;
    let mut head = format!(
        "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        r.status,
        r.length.unwrap_or(r.body.len())
    );
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    if method != "HEAD" {
        match slow {
            // Ten pieces, a pause before each.
            Some(pause) => {
                for piece in r.body[..sent].chunks(sent.div_ceil(10).max(1)) {
                    std::thread::sleep(pause);
                    out.write_all(piece)?;
                    out.flush()?;
                }
            }
            None => out.write_all(&r.body[..sent])?,
        }
    }
    out.flush()?;
    if r.cut.is_some() {
        out.shutdown(std::net::Shutdown::Both)?;
    }
    let _ = reader.read(&mut [0u8; 1]);
    Ok(())
}

fn route(
    s: &mut State,
    method: &str,
    target: &str,
    headers: &BTreeMap<String, String>,
    base: &str,
) -> Reply {
    let path = target.split('?').next().unwrap_or("");
    let authorized = match &s.faults.gated {
        Some(token) => headers.get("authorization") == Some(&format!("Bearer {token}")),
        None => true,
    };
    if let Some(sha) = path.strip_prefix("/cdn/") {
        let Some((name, f)) = s.files.iter().find(|(_, f)| f.sha == sha) else {
            return not_found("EntryNotFound");
        };
        let mut r = reply(200);
        let mut body = f.bytes.clone();
        if let Some(range) = headers.get("range").and_then(|v| v.strip_prefix("bytes=")) {
            let (a, b) = range.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b: usize = if b.is_empty() {
                body.len() - 1
            } else {
                b.parse::<usize>().unwrap().min(body.len() - 1)
            };
            if !s.faults.no_content_range {
                r.headers.push((
                    "Content-Range".into(),
                    format!("bytes {a}-{b}/{}", body.len()),
                ));
            }
            r.status = 206;
            body = body[a..=b].to_vec();
        }
        if let Some((file, after)) = s.faults.cut.clone() {
            if &file == name && !s.cut_done && method == "GET" && body.len() > after {
                s.cut_done = true;
                r.cut = Some(after);
            }
        }
        if s.faults.long_length.as_ref() == Some(name) {
            r.length = Some(2 * body.len());
            r.cut = Some(body.len());
        }
        r.body = body;
        return r;
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, rev)) = rest.split_once("/revision/") else {
            return not_found("RepoNotFound");
        };
        if repo != s.repo {
            return not_found("RepoNotFound");
        }
        if !authorized {
            return reply(401);
        }
        if rev != "main" && rev != s.commit {
            return not_found("RevisionNotFound");
        }
        let siblings: Vec<serde_json::Value> = s
            .files
            .iter()
            .map(|(n, f)| {
                let mut v = serde_json::json!({"rfilename": n, "size": f.bytes.len()});
                if f.lfs {
                    v["lfs"] = serde_json::json!({"sha256": f.sha, "size": f.bytes.len()});
                }
                v
            })
            .collect();
        let mut r = reply(200);
        r.body = serde_json::to_vec(
            &serde_json::json!({"id": s.repo, "sha": s.commit, "siblings": siblings}),
        )
        .unwrap();
        return r;
    }
    let prefix = format!("/{}/resolve/", s.repo);
    let Some(rest) = path.strip_prefix(&prefix) else {
        return not_found("RepoNotFound");
    };
    if !authorized {
        return reply(401);
    }
    let Some((rev, file)) = rest.split_once('/') else {
        return not_found("EntryNotFound");
    };
    if rev != "main" && rev != s.commit {
        return not_found("RevisionNotFound");
    }
    let Some(f) = s.files.get(file) else {
        return not_found("EntryNotFound");
    };
    let mut r = reply(200);
    r.headers.push(("X-Repo-Commit".into(), s.commit.clone()));
    if f.lfs {
        let stated = if s.faults.wrong_sha.as_deref() == Some(file) {
            "0".repeat(64)
        } else {
            f.sha.clone()
        };
        let to = format!("/cdn/{}", f.sha);
        let to = match &s.faults.redirect_to {
            Some(to) => to.clone(),
            None if s.faults.absolute => format!("{base}{to}"),
            None => to,
        };
        r.status = 302;
        r.headers.push(("Location".into(), to));
        r.headers
            .push(("X-Linked-Etag".into(), format!("\"{stated}\"")));
        r.headers
            .push(("X-Linked-Size".into(), f.bytes.len().to_string()));
    } else {
        r.headers
            .push(("ETag".into(), format!("\"{}\"", &f.sha[..40])));
        r.body = f.bytes.clone();
    }
    r
}
