//! The Hub's HTTP: one blocking client, redirects followed by hand (a
//! mirror may answer with an absolute one, a CDN with a relative one),
//! transient faults retried a bounded number of times, refusals read from
//! the Hub's `X-Error-Code`.

use std::path::Path;
use std::time::Duration;

use ureq::http::{Response, StatusCode};
use ureq::Body;

use crate::error::{Error, Result, Rule};

/// Attempts per request, and the pause before the first retry (doubled each time).
pub(crate) const ATTEMPTS: u32 = 5;
pub(crate) const BACKOFF: Duration = Duration::from_millis(250);
/// Redirects followed before giving up.
const REDIRECTS: usize = 8;

/// A client for one endpoint (`HF_ENDPOINT`).
pub(crate) struct Client {
    agent: ureq::Agent,
    /// `https://huggingface.co`, without a trailing slash.
    pub(crate) endpoint: String,
    /// `HF_TOKEN`: sent to the endpoint's own host only, never shown.
    token: Option<String>,
}

impl Client {
    pub(crate) fn new(endpoint: String, token: Option<String>) -> Client {
        let agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(20)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_recv_body(None)
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("wgpu-dequant/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Client {
            agent,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        }
    }

    /// `url` with `method` (HEAD or GET) and an optional `Range`, retried
    /// on faults of the connection and on 429/5xx answers; `what` names the
    /// file for errors. Redirects are returned, not followed.
    pub(crate) fn send(
        &self,
        head: bool,
        url: &str,
        range: Option<&str>,
        what: &Path,
    ) -> Result<Response<Body>> {
        let mut pause = BACKOFF;
        let mut attempt = 1;
        loop {
            let mut req = if head {
                self.agent.head(url)
            } else {
                self.agent.get(url)
            };
            if let Some(r) = range {
                req = req.header("Range", r);
            }
            if let Some(token) = self.token.as_deref().filter(|_| self.same_host(url)) {
                req = req.header("Authorization", format!("Bearer {token}"));
            }
            let transient = match req.call() {
                Ok(resp) if !retried(resp.status()) => return Ok(resp),
                Ok(resp) => format!("the server answered {}", resp.status()),
                Err(e) if attempt >= ATTEMPTS => {
                    return Err(
                        Error::new(Rule::Io, what, format!("cannot reach {}", host(url)))
                            .caused_by(e),
                    )
                }
                Err(e) => e.to_string(),
            };
            if attempt >= ATTEMPTS {
                return Err(Error::new(
                    Rule::Io,
                    what,
                    format!("{transient} after {ATTEMPTS} attempts"),
                ));
            }
            std::thread::sleep(pause);
            pause *= 2;
            attempt += 1;
        }
    }

    /// Follows redirects from `url` (asking each for `range`) until an answer that is not one, or
    /// (`stop`) until a redirect `stop` accepts, which is returned with
    /// the URL it answered.
    pub(crate) fn follow(
        &self,
        head: bool,
        url: &str,
        range: Option<&str>,
        what: &Path,
        stop: impl Fn(&Response<Body>) -> bool,
    ) -> Result<(String, Response<Body>)> {
        let mut url = url.to_string();
        for _ in 0..REDIRECTS {
            // A server may only send us on to another HTTP(S) server.
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(Error::new(
                    Rule::Hub,
                    what,
                    format!("the Hub sent us to {url}, which is not an HTTP(S) address"),
                ));
            }
            let resp = self.send(head, &url, range, what)?;
            if !resp.status().is_redirection() || stop(&resp) {
                return Ok((url, resp));
            }
            let to = header(&resp, "location").ok_or_else(|| {
                Error::new(
                    Rule::Hub,
                    what,
                    "the Hub redirected to nowhere (no Location)",
                )
            })?;
            url = join(&url, to);
        }
        Err(Error::new(
            Rule::Hub,
            what,
            format!("more than {REDIRECTS} redirects"),
        ))
    }

    fn same_host(&self, url: &str) -> bool {
        host(url) == host(&self.endpoint)
    }
}

fn retried(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// A header's value as text.
pub(crate) fn header<'r>(resp: &'r Response<Body>, name: &str) -> Option<&'r str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// `scheme://host[:port]` of `url`.
fn host(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    let end = url[after..].find('/').map_or(url.len(), |i| after + i);
    &url[..end]
}

/// `to` (absolute, or relative to `base`'s host or folder) as a URL.
pub(crate) fn join(base: &str, to: &str) -> String {
    if to.contains("://") {
        to.to_string()
    } else if to.starts_with('/') {
        format!("{}{to}", host(base))
    } else {
        let dir = base.rfind('/').map_or(base, |i| &base[..=i]);
        format!("{dir}{to}")
    }
}

/// Why the Hub refused `what` (a 4xx answer), in one line.
pub(crate) fn refusal(resp: &Response<Body>, repo: &str, what: &Path) -> Error {
    let status = resp.status();
    let detail = match (status.as_u16(), header(resp, "x-error-code")) {
        (401, _) => format!("{repo} needs a token (a gated or private repository): set HF_TOKEN"),
        (403, _) => {
            format!("{repo}: access refused (accept its terms on the Hub, or check HF_TOKEN)")
        }
        (_, Some("RepoNotFound")) => {
            format!("no repository {repo} (or it is private: set HF_TOKEN)")
        }
        (_, Some("RevisionNotFound")) => format!("{repo} has no such revision"),
        (_, Some("EntryNotFound")) => format!("{repo} has no such file"),
        (404, _) => format!("{repo}: not found"),
        (s, _) => format!("{repo}: the Hub answered {s}"),
    };
    Error::new(Rule::Hub, what, detail)
}

/// An `ETag` without `W/` or quotes.
pub(crate) fn etag(value: &str) -> String {
    value
        .trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

/// The first byte of `bytes A-B/N`.
pub(crate) fn content_range_start(value: &str) -> Option<u64> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    rest.split('-').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve_against_the_url() {
        assert_eq!(join("http://h:1/a/b/c", "/x/y"), "http://h:1/x/y");
        assert_eq!(join("http://h:1/a/b/c", "d"), "http://h:1/a/b/d");
        assert_eq!(join("http://h:1/a", "https://cdn/z"), "https://cdn/z");
        assert_eq!(etag("W/\"abc\""), "abc");
    }
}
