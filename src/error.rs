//! The one error type: every rejection names the file, the tensor and the rule it broke.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A rule a checkpoint (or a request) must follow. Each has a stable id that
/// scripts can match on; `CT-*` ids are the seed's, the others are ours.
///
/// CT-002 (stored fields are the code plus 2^(b-1)) and CT-003 (fields cross
/// int32 words) describe how packs are read; no bytes can break them, so they
/// have no variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum Rule {
    /// CT-001: pack-quantized `num_bits` is in 1..=8 and the packed carrier is int32.
    Ct001,
    /// CT-004: `weight_shape` is the logical shape; the packed width must fit it.
    Ct004,
    /// CT-005: ModelOpt → compressed-tensors conversion: a uint8 `weight` with
    /// its `weight_scale` and `weight_scale_2` becomes `weight_packed`,
    /// `weight_scale`, `weight_global_scale = 1/weight_scale_2` (and
    /// `input_global_scale = 1/input_scale`); anything else cannot be converted.
    Ct005,
    /// SP-001: a sparse module's bitmask, kept values and row offsets agree
    /// (2:4 keeps exactly 2 of every 4 columns).
    Sparse,
    /// IO-001: a file could not be read or written.
    Io,
    /// ST-001: a safetensors container is malformed (header, offsets, sizes).
    Container,
    /// ST-002: `model.safetensors.index.json` is malformed or names a missing shard or tensor.
    Index,
    /// GGUF-001: a GGUF file's header is malformed (magic, version, byte
    /// order, counts, strings, arrays, value types, metadata keys,
    /// alignment).
    Gguf,
    /// GGUF-002: a GGUF tensor is malformed (dimensions, ggml type, rows of
    /// whole blocks, a data offset misaligned, outside the file or
    /// overlapping another, a name given twice).
    GgufTensor,
    /// GGUF-003: the parts of a split GGUF model disagree (numbering,
    /// counts, a tensor in two parts).
    GgufSplit,
    /// GGUF-004: a GGUF metadata value is impossible for the model it
    /// describes (a non-finite or non-positive epsilon or rope theta, a
    /// count the tensors disagree with, a value of the wrong type, a tensor
    /// of a rank its layer cannot have).
    GgufValue,
    /// CFG-001: a sidecar config (`config.json`, `hf_quant_config.json`) is malformed.
    Config,
    /// CFG-003: the tensors are quantized but the config that says how to
    /// decode them (`config.json` with its quantization) is not there.
    NoConfig,
    /// CFG-004: the config and the stored tensors disagree (a module the
    /// config leaves unquantized is stored quantized); the tensors win.
    Disagree,
    /// HF-001: a stored tensor the written model has no place for is not
    /// written (`--keep-names` writes it).
    Unplaced,
    /// HF-002: the written `config.json` cannot state a property of the
    /// model (a rope scaling transformers has no parameters for);
    /// transformers' default is written in its place.
    Unstated,
    /// CFG-002: the checkpoint uses a format or scheme this tool does not decode.
    Unsupported,
    /// TEN-001: a tensor the format requires is missing.
    MissingTensor,
    /// TEN-002: a tensor has a dtype the format does not allow.
    TensorDtype,
    /// TEN-003: a tensor's shape disagrees with the logical shape and scheme.
    TensorShape,
    /// TEN-004: a tensor's values are out of range (`weight_shape`, `g_idx`).
    TensorValue,
    /// TEN-005: the same tensor name appears in two shards.
    DuplicateTensor,
    /// HUB-001: the Hugging Face Hub (or the mirror `HF_ENDPOINT` names)
    /// has no such repository, revision or file, wants a token, or answered
    /// what no Hub answers; or `HF_HUB_OFFLINE` is set and the cache lacks it.
    Hub,
    /// HUB-002: a download's bytes are not the size and SHA-256 the Hub states.
    Integrity,
    /// OUT-001: the output location is not usable (exists and is not empty, or is the input).
    Output,
    /// ARG-001: a command-line or API argument is invalid.
    Argument,
    /// GPU-001: the GPU backend cannot run (no adapter, a device error, a
    /// tensor beyond the adapter's limits).
    Gpu,
    /// CANCEL-001: a caller asked the run to stop (a cancel, a signal).
    Cancelled,
    /// BUG-001: this tool broke its own invariant (a thread panicked, a
    /// state that cannot happen); the input is not at fault.
    Internal,
}

impl Rule {
    /// The stable id printed in messages, e.g. `CT-004`.
    pub fn id(self) -> &'static str {
        match self {
            Rule::Ct001 => "CT-001",
            Rule::Ct004 => "CT-004",
            Rule::Ct005 => "CT-005",
            Rule::Sparse => "SP-001",
            Rule::Io => "IO-001",
            Rule::Container => "ST-001",
            Rule::Index => "ST-002",
            Rule::Gguf => "GGUF-001",
            Rule::GgufTensor => "GGUF-002",
            Rule::GgufSplit => "GGUF-003",
            Rule::GgufValue => "GGUF-004",
            Rule::Config => "CFG-001",
            Rule::NoConfig => "CFG-003",
            Rule::Disagree => "CFG-004",
            Rule::Unplaced => "HF-001",
            Rule::Unstated => "HF-002",
            Rule::Unsupported => "CFG-002",
            Rule::MissingTensor => "TEN-001",
            Rule::TensorDtype => "TEN-002",
            Rule::TensorShape => "TEN-003",
            Rule::TensorValue => "TEN-004",
            Rule::DuplicateTensor => "TEN-005",
            Rule::Hub => "HUB-001",
            Rule::Integrity => "HUB-002",
            Rule::Output => "OUT-001",
            Rule::Argument => "ARG-001",
            Rule::Gpu => "GPU-001",
            Rule::Cancelled => "CANCEL-001",
            Rule::Internal => "BUG-001",
        }
    }
}

impl Rule {
    /// The command line's exit status for a failure under this rule:
    /// 2 for a bad argument, 3 for input that breaks a format rule (the
    /// checkpoint is at fault), 1 for everything else (I/O, the output
    /// location, the GPU, a cancelled run, a bug of ours).
    pub fn exit_code(self) -> u8 {
        match self {
            Rule::Argument => 2,
            // Cancelled and Internal were IO-001 before they had ids of their
            // own: they keep its status, which the bindings map.
            Rule::Io | Rule::Output | Rule::Gpu | Rule::Cancelled | Rule::Internal => 1,
            // Like a path that does not exist, or a read that failed.
            Rule::Hub | Rule::Integrity => 1,
            _ => 3,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// What an [`Error`] can be caused by: the I/O, JSON, safetensors or GPU
/// error underneath, as handed to [`Error::caused_by`].
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a checkpoint was refused or an operation failed.
///
/// Displayed on one line: `FILE: TENSOR: [RULE] what is wrong: cause`, the
/// file and tensor when there are ones.
///
/// Cloning shares the cause: a plan hands out its first finding and keeps
/// it, and a cause (an `io::Error`) cannot itself be cloned.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Error {
    /// The rule that was broken.
    pub rule: Rule,
    /// The file the fault is in (or the output path for output faults);
    /// `None` for faults of no file (an argument, the GPU).
    pub file: Option<PathBuf>,
    /// The tensor concerned, when there is one.
    pub tensor: Option<String>,
    /// What is wrong, in a few words.
    pub detail: String,
    /// The error underneath, when there is one, kept with its type (downcast
    /// it, or [`std::error::Error::source`], to look inside).
    pub cause: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if let Some(t) = &self.tensor {
            // A name read from a file may hold anything: its line breaks
            // escaped keep the message one line (the rest is kept, so the
            // name can be searched for).
            for c in t.chars() {
                match c {
                    '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{85}' | '\u{2028}' | '\u{2029}' => {
                        write!(f, "{}", c.escape_default())?
                    }
                    c => write!(f, "{c}")?,
                }
            }
            f.write_str(": ")?;
        }
        // One line, whatever the detail holds: scripts read these line by line.
        let detail: Vec<&str> = self.detail.split_whitespace().collect();
        write!(f, "[{}] {}", self.rule, detail.join(" "))?;
        if let Some(e) = &self.cause {
            let cause = e.to_string();
            let cause: Vec<&str> = cause.split_whitespace().collect();
            write!(f, ": {}", cause.join(" "))?;
        }
        Ok(())
    }
}

// By hand rather than thiserror's `#[source]`: an `Arc<dyn Error>` is an
// error itself, and the derive would hand out the `Arc`, which does not
// downcast to the `io::Error` inside it.
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let cause: &(dyn std::error::Error + Send + Sync + 'static) = self.cause.as_deref()?;
        Some(cause)
    }
}

impl Error {
    /// A rule violation in `file`, not tied to one tensor.
    pub fn new(rule: Rule, file: impl AsRef<Path>, detail: impl Into<String>) -> Self {
        Error {
            file: Some(file.as_ref().to_path_buf()),
            ..Error::bare(rule, detail)
        }
    }

    /// A fault of no file: an argument, the GPU.
    pub fn bare(rule: Rule, detail: impl Into<String>) -> Self {
        Error {
            rule,
            file: None,
            tensor: None,
            detail: detail.into(),
            cause: None,
        }
    }

    /// A rule violation by tensor `tensor` of `file`.
    pub fn tensor(
        rule: Rule,
        file: impl AsRef<Path>,
        tensor: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Error {
            tensor: Some(tensor.into()),
            ..Error::new(rule, file, detail)
        }
    }

    /// An I/O failure on `file` while doing `what`.
    pub fn io(file: impl AsRef<Path>, what: &str, cause: std::io::Error) -> Self {
        Error::new(Rule::Io, file, what).caused_by(cause)
    }

    /// This error, caused by `cause`.
    pub fn caused_by(self, cause: impl Into<Cause>) -> Self {
        Error {
            cause: Some(Arc::from(cause.into())),
            ..self
        }
    }

    /// This error, in `file` unless it names a file already: the innermost
    /// code that knows the file wins.
    pub fn with_file(mut self, file: impl AsRef<Path>) -> Self {
        self.file.get_or_insert_with(|| file.as_ref().to_path_buf());
        self
    }

    /// This error, about tensor `tensor` unless it names one already.
    pub fn with_tensor(mut self, tensor: impl Into<String>) -> Self {
        self.tensor.get_or_insert_with(|| tensor.into());
        self
    }
}

/// Turns another crate's error into ours, keeping it as the cause, in the
/// manner of `anyhow`'s and candle's `.context()`:
/// `fs::read(p).context(Rule::Io, "cannot read").with_file(p)`.
pub(crate) trait Context<T> {
    /// The error, as a fault under `rule` described by `detail` (of no
    /// file yet: see [`ResultExt::with_file`]), caused by the error.
    fn context(self, rule: Rule, detail: impl Into<String>) -> Result<T>;
}

impl<T, E: Into<Cause>> Context<T> for std::result::Result<T, E> {
    fn context(self, rule: Rule, detail: impl Into<String>) -> Result<T> {
        self.map_err(|e| Error::bare(rule, detail).caused_by(e))
    }
}

/// Fills in where an [`Error`] happened, for code that knows the file or
/// tensor better than the code that failed.
pub(crate) trait ResultExt<T> {
    /// [`Error::with_file`] on the error.
    fn with_file(self, file: impl AsRef<Path>) -> Result<T>;
    /// [`Error::with_tensor`] on the error.
    fn with_tensor(self, tensor: impl Into<String>) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn with_file(self, file: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| e.with_file(file))
    }

    fn with_tensor(self, tensor: impl Into<String>) -> Result<T> {
        self.map_err(|e| e.with_tensor(tensor))
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A rule finding that does not stop decoding: something dropped, guessed
/// or changed on the way to the dense model. Every run that does the work
/// tells it (`warning: FILE: TENSOR: [RULE] …`), and `--strict` refuses it
/// ([`Warning::refusal`]).
///
/// Serialized as `{"rule", "file", "tensor", "message", "subject",
/// "detail"}`: `message` is the whole line, `subject` and `detail` the
/// tensor and the text alone (as `inspect --json` has always had them).
#[derive(Debug, Clone)]
pub struct Warning {
    /// The rule the finding is about.
    pub rule: Rule,
    /// The file concerned (the checkpoint, once planned).
    pub file: Option<PathBuf>,
    /// The tensor or module concerned.
    pub subject: String,
    /// What was noticed.
    pub detail: String,
}

impl Warning {
    /// A finding of `rule` about `subject` (the file is the plan's).
    pub fn new(rule: Rule, subject: impl Into<String>, detail: impl Into<String>) -> Warning {
        Warning {
            rule,
            file: None,
            subject: subject.into(),
            detail: detail.into(),
        }
    }

    /// The one-line message, as an error of the same finding reads.
    pub fn message(&self) -> String {
        self.as_error().to_string()
    }

    /// The refusal `--strict` makes of it.
    pub fn refusal(&self) -> Error {
        let mut e = self.as_error();
        e.detail += " (--strict refuses what a run would drop, guess or change)";
        e
    }

    fn as_error(&self) -> Error {
        let mut e = Error::bare(self.rule, self.detail.clone());
        e.file = self.file.clone();
        e.tensor = Some(self.subject.clone());
        e
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_error().fmt(f)
    }
}

impl serde::Serialize for Warning {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("Warning", 6)?;
        m.serialize_field("rule", self.rule.id())?;
        m.serialize_field("file", &self.file.as_ref().map(|f| f.display().to_string()))?;
        m.serialize_field("tensor", &self.subject)?;
        m.serialize_field("message", &self.message())?;
        m.serialize_field("subject", &self.subject)?;
        m.serialize_field("detail", &self.detail)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn caused() -> Error {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such\nfile");
        Error::tensor(Rule::Io, "a/b.safetensors", "w", "cannot   read").caused_by(io)
    }

    /// A clone shares the cause, and `source()` hands out the cause itself,
    /// so it downcasts to its own type.
    #[test]
    fn clone_keeps_the_cause() {
        let e = caused();
        let c = e.clone();
        let (Some(a), Some(b)) = (&e.cause, &c.cause) else {
            panic!("the cause was lost");
        };
        assert!(Arc::ptr_eq(a, b));
        let io = c.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );
        assert_eq!(c.to_string(), e.to_string());
    }

    /// A caused error prints on one line, cause last, whitespace collapsed.
    #[test]
    fn caused_error_is_one_line() {
        assert_eq!(
            caused().to_string(),
            "a/b.safetensors: w: [IO-001] cannot read: no such file"
        );
    }

    /// A plan's first finding, handed out with its cause, reads as it did
    /// when the cause's words were copied into the detail.
    #[test]
    fn shared_cause_prints_as_the_flattened_one() {
        let e = caused();
        let cause = e
            .cause
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let flat = Error::tensor(
            e.rule,
            "a/b.safetensors",
            "w",
            format!("{}: {cause}", e.detail),
        );
        assert_eq!(e.clone().to_string(), flat.to_string());
    }

    #[test]
    fn new_rules_have_ids_and_exit_codes() {
        assert_eq!(Rule::Cancelled.id(), "CANCEL-001");
        assert_eq!(Rule::Internal.id(), "BUG-001");
        assert_eq!(Rule::Cancelled.exit_code(), 1);
        assert_eq!(Rule::Internal.exit_code(), 1);
        // The statuses the bindings map stay.
        assert_eq!(Rule::Argument.exit_code(), 2);
        assert_eq!(Rule::Io.exit_code(), 1);
        assert_eq!(Rule::Ct004.exit_code(), 3);
        assert_eq!(
            Error::bare(Rule::Cancelled, "cancelled; nothing was written").to_string(),
            "[CANCEL-001] cancelled; nothing was written"
        );
    }

    /// `with_file` and `with_tensor` fill in only what is missing; `context`
    /// keeps the error it wraps as the cause.
    #[test]
    fn context_helpers() {
        let e = caused().with_file("other").with_tensor("v");
        assert_eq!(e.file.as_deref(), Some(Path::new("a/b.safetensors")));
        assert_eq!(e.tensor.as_deref(), Some("w"));
        let r: Result<()> = Err(std::io::Error::other("disk full"))
            .context(Rule::Io, "cannot write")
            .with_file("out")
            .with_tensor("t");
        let e = r.unwrap_err();
        assert_eq!(e.to_string(), "out: t: [IO-001] cannot write: disk full");
        assert!(e.source().is_some_and(|s| s.is::<std::io::Error>()));
    }
}
