//! GGUF files (llama.cpp, gguf-py): the container, memory-mapped, split
//! files (`NAME-00001-of-00003.gguf`) joined. A checkpoint reads a model
//! through it ([`Gguf`]); the formats decode its blocks.

mod parse;
pub mod pick;
mod types;

use std::fmt;
use std::path::{Path, PathBuf};

pub(crate) use parse::prefix as parse_prefix;
pub use types::GgmlType;

use crate::error::{Error, Result, Rule};

/// A metadata value, of one of GGUF's value types (the variants are
/// named after them).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
#[allow(missing_docs)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(MetaArray),
}

impl MetaValue {
    /// The value as an unsigned integer, when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a real number, when it is a number of any type
    /// (64-bit integers rounded to the nearest f64).
    pub fn as_f64(&self) -> Option<f64> {
        Some(match *self {
            MetaValue::U8(x) => x.into(),
            MetaValue::I8(x) => x.into(),
            MetaValue::U16(x) => x.into(),
            MetaValue::I16(x) => x.into(),
            MetaValue::U32(x) => x.into(),
            MetaValue::I32(x) => x.into(),
            MetaValue::U64(x) => x as f64,
            MetaValue::I64(x) => x as f64,
            MetaValue::F32(x) => x.into(),
            MetaValue::F64(x) => x,
            _ => return None,
        })
    }

    /// The value as text, when it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// A metadata array, held as compactly as the file holds it: numbers as a
/// vector of their type, strings in one buffer. (A vector of
/// [`MetaValue`]s takes 32 bytes or more per item: a file's array of a
/// hundred million bytes would take gigabytes.) GGUF arrays hold items of
/// one type, which the variant names.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Strings),
    /// Arrays of arrays.
    Array(Vec<MetaArray>),
}

/// Strings held in one buffer, each known by where it ends.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Strings {
    text: String,
    ends: Vec<usize>,
}

impl Strings {
    /// Room for `n` strings.
    pub fn with_capacity(n: usize) -> Strings {
        Strings {
            text: String::new(),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends `s`.
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    /// How many strings it holds.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The `i`th string.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..end)
    }

    /// Every string, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl<'a> FromIterator<&'a str> for Strings {
    fn from_iter<I: IntoIterator<Item = &'a str>>(items: I) -> Strings {
        let mut s = Strings::default();
        for item in items {
            s.push(item);
        }
        s
    }
}

impl MetaArray {
    /// How many items it holds.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::F64(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
        }
    }

    /// Whether it holds no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`th item, as a value of its own.
    pub fn get(&self, i: usize) -> Option<MetaValue> {
        Some(match self {
            MetaArray::U8(v) => MetaValue::U8(*v.get(i)?),
            MetaArray::I8(v) => MetaValue::I8(*v.get(i)?),
            MetaArray::U16(v) => MetaValue::U16(*v.get(i)?),
            MetaArray::I16(v) => MetaValue::I16(*v.get(i)?),
            MetaArray::U32(v) => MetaValue::U32(*v.get(i)?),
            MetaArray::I32(v) => MetaValue::I32(*v.get(i)?),
            MetaArray::U64(v) => MetaValue::U64(*v.get(i)?),
            MetaArray::I64(v) => MetaValue::I64(*v.get(i)?),
            MetaArray::F32(v) => MetaValue::F32(*v.get(i)?),
            MetaArray::F64(v) => MetaValue::F64(*v.get(i)?),
            MetaArray::Bool(v) => MetaValue::Bool(*v.get(i)?),
            MetaArray::String(v) => MetaValue::String(v.get(i)?.to_owned()),
            MetaArray::Array(v) => MetaValue::Array(v.get(i)?.clone()),
        })
    }

    /// Every item, each as a value of its own (made as it is reached).
    pub fn iter(&self) -> impl Iterator<Item = MetaValue> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

/// As a list of its items, as the values they are.
impl serde::Serialize for MetaArray {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for item in self.iter() {
            seq.serialize_element(&item)?;
        }
        seq.end()
    }
}

/// Short: an array shows its length and its first items only.
impl fmt::Display for MetaValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::U8(v) => write!(f, "{v}"),
            MetaValue::I8(v) => write!(f, "{v}"),
            MetaValue::U16(v) => write!(f, "{v}"),
            MetaValue::I16(v) => write!(f, "{v}"),
            MetaValue::U32(v) => write!(f, "{v}"),
            MetaValue::I32(v) => write!(f, "{v}"),
            MetaValue::U64(v) => write!(f, "{v}"),
            MetaValue::I64(v) => write!(f, "{v}"),
            MetaValue::F32(v) => write!(f, "{v}"),
            MetaValue::F64(v) => write!(f, "{v}"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::String(s) if s.chars().count() > 60 => {
                write!(
                    f,
                    "{:?}… ({} bytes)",
                    s.chars().take(60).collect::<String>(),
                    s.len()
                )
            }
            MetaValue::String(s) => write!(f, "{s:?}"),
            MetaValue::Array(items) => {
                write!(f, "[{} items", items.len())?;
                for (i, v) in items.iter().take(3).enumerate() {
                    write!(f, "{}{v}", if i == 0 { ": " } else { ", " })?;
                }
                f.write_str(if items.len() > 3 { ", …]" } else { "]" })
            }
        }
    }
}

/// What a GGUF model holds besides its tensors' bytes (a checkpoint's
/// account of it).
#[derive(Debug)]
pub struct Gguf {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Its metadata (the first file's).
    pub metadata: Vec<(String, MetaValue)>,
    /// Each tensor's ggml type and logical shape (row-major).
    pub tensors: std::collections::BTreeMap<String, (GgmlType, Vec<usize>)>,
}

impl Gguf {
    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// One tensor of a GGUF model.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Tensor {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its shape, row-major (GGUF stores the innermost dimension first).
    pub shape: Vec<usize>,
    /// Its type.
    #[serde(rename = "type")]
    pub ty: GgmlType,
    /// Where its bytes start in its file.
    #[serde(skip)]
    pub offset: u64,
    /// How many bytes it holds.
    pub size: u64,
    /// Which of the model's files holds it.
    pub file: usize,
}

/// One file of a GGUF model.
#[derive(Debug)]
pub struct File {
    /// Its path.
    pub path: PathBuf,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Its data section's alignment.
    pub alignment: u64,
    /// Where its data section starts.
    pub data_start: u64,
    /// Its bytes.
    map: memmap2::Mmap,
}

impl File {
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Its memory map, for a checkpoint to hold.
    pub(crate) fn into_map(self) -> memmap2::Mmap {
        self.map
    }
}

/// A GGUF model: one file, or the parts of a split one joined.
#[derive(Debug)]
pub struct Model {
    /// Its files, in split order.
    pub files: Vec<File>,
    /// The first file's metadata (a split's later parts repeat little).
    pub metadata: Vec<(String, MetaValue)>,
    /// Every tensor, in file order.
    pub tensors: Vec<Tensor>,
}

/// `NAME-00002-of-00003.gguf` → (`NAME`, 2, 3).
fn split_name(file: &str) -> Option<(&str, u32, u32)> {
    let stem = file.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(no) && digits(count)).then_some(())?;
    Some((prefix, no.parse().ok()?, count.parse().ok()?))
}

/// The GGUF file `path` names: a `.gguf` file, or the one GGUF model of a
/// folder (its first part, when split) that holds no safetensors; `None`
/// when `path` is not GGUF, or a folder holds several models
/// ([`find_in`] says which).
pub fn find(path: &Path) -> Option<PathBuf> {
    find_in(path, None).ok().flatten()
}

/// [`find`], with `file` (`--gguf-file`) naming one model of a folder
/// that holds several; a folder holding several and no `file` is refused
/// with one line listing them, and so is a `file` that names none.
pub fn find_in(path: &Path, file: Option<&str>) -> Result<Option<PathBuf>> {
    let chosen = pick::Pick {
        file,
        ..pick::Pick::default()
    };
    find_picked(path, chosen)
}

/// [`find_in`] with any [`pick::Pick`]: a `DIR:QUANT`'s tag picks by
/// quantization, as a Hub id's does.
pub(crate) fn find_picked(path: &Path, chosen: pick::Pick<'_>) -> Result<Option<PathBuf>> {
    let asked = match (chosen.tag, chosen.file) {
        (Some(tag), _) => Some(format!("the tag :{tag}")),
        (None, Some(file)) => Some(format!("--gguf-file {file}")),
        (None, None) => None,
    };
    if path.is_file() {
        if let Some(asked) = asked {
            let detail = format!("{asked} is for a folder or a Hub id, and this is a file");
            return Err(Error::new(Rule::Argument, path, detail));
        }
        return Ok(path
            .extension()
            .is_some_and(|e| e == "gguf")
            .then(|| path.to_path_buf()));
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return Ok(None);
    };
    let names: Vec<String> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    if asked.is_none() && names.iter().any(|n| n.ends_with(".safetensors")) {
        return Ok(None);
    }
    let found = pick::candidates(names.iter().map(String::as_str));
    if asked.is_none() && found.is_empty() {
        return Ok(None);
    }
    match pick::choose(&found, chosen) {
        Ok(model) => Ok(Some(path.join(&model.first))),
        Err(detail) => Err(Error::new(Rule::Argument, path, detail)),
    }
}

/// `DIR:QUANT`: the folder and the tag of `path`, which does not exist,
/// when the part before its last `:` is a folder here and the rest a
/// quantization tag. Only a `:` after the last path separator counts (a
/// Windows drive's `C:` does not).
pub(crate) fn tagged_dir(path: &Path) -> Option<(&Path, &str)> {
    let text = path.to_str()?;
    let (dir, tag) = text.rsplit_once(':')?;
    let after_separators = !tag.contains(std::path::is_separator);
    let drive = cfg!(windows) && dir.len() == 1;
    let tag_ok = (1..=64).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    let dir = Path::new(dir);
    (after_separators && !drive && tag_ok && dir.is_dir()).then_some((dir, tag))
}

impl Model {
    /// Opens the GGUF file at `path` and, when it is a part of a split
    /// model (any part), all its parts beside it.
    pub fn open(path: impl AsRef<Path>) -> Result<Model> {
        let path = path.as_ref();
        let (files, metadata, tensors) = join(path, open_file)?;
        Ok(Model {
            files,
            metadata,
            tensors,
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(MetaValue::as_str)
    }

    /// The stored bytes of `t`.
    pub fn bytes(&self, t: &Tensor) -> &[u8] {
        // open() checked every tensor's range against its file.
        &self.files[t.file].bytes()[t.offset as usize..(t.offset + t.size) as usize]
    }
}

/// A model's files (each as its reader holds it), metadata and tensors.
type Joined<F> = (Vec<F>, Vec<(String, MetaValue)>, Vec<Tensor>);

/// The model of which `path` is a file (any part of a split one): each part read by
/// `open` (a file mapped here, or a header read by range requests), split
/// parts found beside the first by name and checked against `split.*`.
fn join<F>(
    path: &Path,
    mut open: impl FnMut(&Path) -> Result<(F, parse::Header)>,
) -> Result<Joined<F>> {
    let (first, header) = open(path)?;
    let (mut files, metadata, mut tensors) = (vec![first], header.metadata, header.tensors);
    let split = |key: &str| {
        metadata
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.as_u64())
    };
    let count = split("split.count").unwrap_or(1);
    if count <= 1 {
        return Ok((files, metadata, tensors));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A later part stands for the whole model: it is read from its first.
    if let Some((prefix, no, n)) = split_name(&name) {
        if no != 1 && n as u64 == count {
            let first = path.with_file_name(format!("{prefix}-00001-of-{n:05}.gguf"));
            return join(&first, open);
        }
    }
    let Some((prefix, 1, n)) = split_name(&name).filter(|&(_, _, n)| n as u64 == count) else {
        let detail =
            format!("split.count is {count}: open the first part, NAME-00001-of-{count:05}.gguf");
        return Err(Error::new(Rule::GgufSplit, path, detail));
    };
    // Names seen so far, so that each part's tensors are checked against
    // the earlier parts' in linear time.
    let mut names: std::collections::HashSet<String> =
        tensors.iter().map(|t| t.name.clone()).collect();
    for no in 2..=n {
        let part = path.with_file_name(format!("{prefix}-{no:05}-of-{n:05}.gguf"));
        let (file, header) = open(&part)?;
        let no_of = header
            .metadata
            .iter()
            .find(|(k, _)| k == "split.no")
            .and_then(|(_, v)| v.as_u64());
        if no_of != Some(no as u64 - 1) {
            let detail = format!(
                "split.no is {no_of:?}, not {} (the file name's part {no})",
                no - 1
            );
            return Err(Error::new(Rule::GgufSplit, &part, detail));
        }
        let index = files.len();
        files.push(file);
        for mut t in header.tensors {
            if !names.insert(t.name.clone()) {
                return Err(Error::tensor(
                    Rule::GgufSplit,
                    &part,
                    &t.name,
                    "is in two parts of the split model",
                ));
            }
            t.file = index;
            tensors.push(t);
        }
    }
    if let Some(want) = split("split.tensors.count").filter(|&w| w != tensors.len() as u64) {
        let detail = format!(
            "split.tensors.count is {want}, and its {n} parts hold {}",
            tensors.len()
        );
        return Err(Error::new(Rule::GgufSplit, path, detail));
    }
    Ok((files, metadata, tensors))
}

/// A GGUF header read alone (by range requests, or from a browser's
/// `File`) is read as a prefix of its file growing from this many bytes,
/// four times larger at each step (a Llama 3 file's, with its 128k-token
/// vocabulary, is about 8 MB: five reads).
const HEADER_STEP: u64 = 64 << 10;
/// A GGUF header longer than this is refused rather than read.
const MAX_HEADER: u64 = 1 << 30;

/// How much of the GGUF file `shown` (`size` bytes) to have read next,
/// when its first `read` bytes (0 at first) did not hold its header.
pub(crate) fn header_prefix(read: u64, size: u64, shown: &Path) -> Result<u64> {
    if read >= size || read >= MAX_HEADER {
        let detail = format!(
            "its header does not end within its first {read} bytes (of {size}); not read further"
        );
        return Err(Error::new(Rule::Gguf, shown, detail));
    }
    Ok(read.saturating_mul(4).max(HEADER_STEP).min(size))
}

/// One file of a GGUF model read by its header alone (a Hub file read by
/// range requests): no tensor bytes are held.
#[derive(Debug)]
pub(crate) struct HeaderFile {
    /// How it is named (in errors, and as a shard's path).
    pub(crate) path: PathBuf,
    /// GGUF version (2 or 3).
    pub(crate) version: u32,
}

/// A GGUF model's headers: its files, the first one's metadata and every
/// tensor, as [`Model`] has them, without the bytes.
#[derive(Debug)]
pub(crate) struct Headers {
    pub(crate) files: Vec<HeaderFile>,
    pub(crate) metadata: Vec<(String, MetaValue)>,
    pub(crate) tensors: Vec<Tensor>,
}

impl Headers {
    /// The model whose first part is `path`, each part's header given by
    /// `header` (the parts of a split one are the first's siblings by name).
    pub(crate) fn read(
        path: &Path,
        mut header: impl FnMut(&Path) -> Result<parse::Header>,
    ) -> Result<Headers> {
        let (files, metadata, tensors) = join(path, |p| {
            let h = header(p)?;
            let file = HeaderFile {
                path: p.to_path_buf(),
                version: h.version,
            };
            Ok((file, h))
        })?;
        Ok(Headers {
            files,
            metadata,
            tensors,
        })
    }
}

/// Maps and reads the file at `path`.
fn open_file(path: &Path) -> Result<(File, parse::Header)> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    // SAFETY: the map is read-only; a file changed underneath while it is
    // read is outside what any reader of a memory-mapped file can promise.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::io(path, "cannot map", e))?;
    let header = parse::header(&map, path)?;
    let file = File {
        path: path.to_path_buf(),
        version: header.version,
        alignment: header.alignment,
        data_start: header.data_start,
        map,
    };
    Ok((file, header))
}

#[cfg(test)]
mod tests {
    use super::{split_name, tagged_dir};
    use std::path::Path;

    #[test]
    fn a_tag_follows_a_folder_after_its_last_separator() {
        let root = env!("CARGO_MANIFEST_DIR");
        let tagged = |text: String| {
            tagged_dir(Path::new(&text)).map(|(d, t)| (d.to_path_buf(), t.to_string()))
        };
        assert_eq!(
            tagged(format!("{root}/src:Q4_K_M")),
            Some((Path::new(root).join("src"), "Q4_K_M".to_string()))
        );
        for not in [
            format!("{root}/src:Q4/x"),
            format!("{root}/src:"),
            format!("{root}/src:a b"),
            format!("{root}/no-such-folder:Q4_K_M"),
            format!("{root}/Cargo.toml:Q4_K_M"),
        ] {
            assert_eq!(tagged(not.clone()), None, "{not}");
        }
    }

    #[test]
    fn split_names() {
        assert_eq!(split_name("m-00002-of-00003.gguf"), Some(("m", 2, 3)));
        assert_eq!(split_name("a-b-00001-of-00002.gguf"), Some(("a-b", 1, 2)));
        assert_eq!(split_name("m.gguf"), None);
        assert_eq!(split_name("m-2-of-3.gguf"), None);
    }
}
