//! The GGUF container (v2 and v3, little-endian), read from its bytes with
//! every count, length, offset and dimension checked before use: a count
//! never sizes an allocation (each element read takes at least a byte of
//! the file, so a false count runs out of bytes), nesting is bounded, and
//! tensors must lie inside the file, aligned, one after another. Every
//! check is linear in the header's length: duplicates are found by hash
//! set, not by comparing each name with every earlier one.

use std::collections::HashSet;
use std::path::Path;

use super::{GgmlType, MetaArray, MetaValue, Strings, Tensor};
use crate::error::{Error, Result, Rule};

/// The first four bytes.
const MAGIC: &[u8; 4] = b"GGUF";
/// `general.alignment` when a file sets none.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays of arrays deeper than this are refused (no writer nests at all).
const MAX_DEPTH: u32 = 4;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;

/// A GGUF file's header: version, metadata and tensor infos, tensor
/// offsets made absolute.
#[derive(Debug)]
pub(crate) struct Header {
    pub(super) version: u32,
    pub(super) metadata: Vec<(String, MetaValue)>,
    pub(super) tensors: Vec<Tensor>,
    pub(super) alignment: u64,
    /// Where the data section starts.
    pub(super) data_start: u64,
}

struct Cursor<'b> {
    /// The file's bytes, or its first ones ([`prefix`]).
    bytes: &'b [u8],
    at: usize,
    path: &'b Path,
    /// The file's length (more than `bytes` holds when reading a prefix).
    file_len: u64,
    /// Set when a read ran past the prefix but not past the file.
    short: bool,
}

impl<'b> Cursor<'b> {
    fn fail(&self, detail: impl Into<String>) -> Error {
        Error::new(Rule::Gguf, self.path, detail)
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'b [u8]> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            let in_file = self.file_len.saturating_sub(self.at as u64);
            if n <= in_file {
                // Past the prefix read so far, not past the file: read more.
                self.short = true;
            }
            return Err(self.fail(format!(
                "{what} at byte {} needs {n} bytes, and the file has {left} left",
                self.at
            )));
        }
        let s = &self.bytes[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    /// Refuses `count` items of at least `min` bytes each when the file
    /// has fewer bytes left than they take (GGUF-001), before anything is
    /// sized by it; returns how many items the bytes at hand could hold, a
    /// safe capacity to reserve (never more than the count itself).
    fn count(&self, count: u64, min: u64, what: &str) -> Result<usize> {
        let in_file = self.file_len.saturating_sub(self.at as u64);
        let need = u128::from(count) * u128::from(min);
        if need > u128::from(in_file) {
            return Err(self.fail(format!(
                "{what} is {count}, which needs at least {need} bytes ({min} an item), and the file has {in_file} left at byte {}",
                self.at
            )));
        }
        let at_hand = (self.bytes.len() - self.at) as u64 / min;
        Ok(count.min(at_hand) as usize)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let at = self.at;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.fail(format!("{what} at byte {at} is not UTF-8")))
    }

    /// The `count` items of type `elem` of an array at nesting `depth`,
    /// held compactly ([`MetaArray`]): memory about the bytes they take in
    /// the file, reserved only once the file is known to hold them.
    fn items(&mut self, elem: u32, count: u64, key: &str, depth: u32) -> Result<MetaArray> {
        // The fewest bytes an item takes: a string its 8-byte length, an
        // array its type and length.
        let min = match elem {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            9 => 12,
            _ => 8,
        };
        let cap = self.count(count, min, &format!("{key}: the array's length"))?;
        macro_rules! numbers {
            ($variant:ident, $t:ty) => {{
                const N: usize = std::mem::size_of::<$t>();
                // count * N fits: count() checked it against the file.
                let bytes = self.take(count * N as u64, key)?;
                let v = bytes
                    .chunks_exact(N)
                    .map(|c| <$t>::from_le_bytes(std::array::from_fn(|i| c[i])))
                    .collect();
                MetaArray::$variant(v)
            }};
        }
        Ok(match elem {
            0 => numbers!(U8, u8),
            1 => numbers!(I8, i8),
            2 => numbers!(U16, u16),
            3 => numbers!(I16, i16),
            4 => numbers!(U32, u32),
            5 => numbers!(I32, i32),
            6 => numbers!(F32, f32),
            7 => {
                let at = self.at;
                let bytes = self.take(count, key)?;
                if let Some(i) = bytes.iter().position(|&b| b > 1) {
                    let (pos, b) = (at + i, bytes[i]);
                    return Err(
                        self.fail(format!("{key}: bool byte {b} at byte {pos}, not 0 or 1"))
                    );
                }
                MetaArray::Bool(bytes.iter().map(|&b| b == 1).collect())
            }
            8 => {
                let mut strings = Strings::with_capacity(cap);
                for _ in 0..count {
                    let len = self.u64(key)?;
                    let at = self.at;
                    let bytes = self.take(len, key)?;
                    let s = std::str::from_utf8(bytes)
                        .map_err(|_| self.fail(format!("{key} at byte {at} is not UTF-8")))?;
                    strings.push(s);
                }
                MetaArray::String(strings)
            }
            9 => {
                if depth + 1 >= MAX_DEPTH {
                    return Err(self.fail(format!("{key}: arrays nested deeper than {MAX_DEPTH}")));
                }
                let mut arrays = Vec::with_capacity(cap);
                for _ in 0..count {
                    let elem = self.u32(key)?;
                    let count = self.u64(key)?;
                    arrays.push(self.items(elem, count, key, depth + 1)?);
                }
                MetaArray::Array(arrays)
            }
            10 => numbers!(U64, u64),
            11 => numbers!(I64, i64),
            12 => numbers!(F64, f64),
            t => return Err(self.fail(format!("{key}: unknown value type {t}"))),
        })
    }

    /// A metadata value of type number `ty`.
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(key)?[0]),
            1 => MetaValue::I8(self.array::<1>(key)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => MetaValue::U32(self.u32(key)?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(self.fail(format!("{key}: bool byte {b}, not 0 or 1"))),
            },
            8 => MetaValue::String(self.string(key)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.fail(format!("{key}: arrays nested deeper than {MAX_DEPTH}")));
                }
                let elem = self.u32(key)?;
                let count = self.u64(key)?;
                MetaValue::Array(self.items(elem, count, key, depth)?)
            }
            10 => MetaValue::U64(self.u64(key)?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            t => return Err(self.fail(format!("{key}: unknown value type {t}"))),
        })
    }
}

/// Reads the header of the GGUF file `bytes` (at `path`, for messages).
pub(super) fn header(bytes: &[u8], path: &Path) -> Result<Header> {
    let mut c = Cursor {
        bytes,
        at: 0,
        path,
        file_len: bytes.len() as u64,
        short: false,
    };
    read(&mut c)
}

/// Reads the header of a GGUF file of `file_len` bytes from its first
/// bytes `prefix` (a file read by range requests): `None` when the header
/// runs past them, so that more must be read. Every check is the whole
/// file's: tensors must lie inside its `file_len` bytes.
pub(crate) fn prefix(prefix: &[u8], file_len: u64, path: &Path) -> Result<Option<Header>> {
    let mut c = Cursor {
        bytes: prefix,
        at: 0,
        path,
        file_len: file_len.max(prefix.len() as u64),
        short: false,
    };
    match read(&mut c) {
        Ok(header) => Ok(Some(header)),
        Err(_) if c.short => Ok(None),
        Err(e) => Err(e),
    }
}

fn read(c: &mut Cursor<'_>) -> Result<Header> {
    let path = c.path;
    let magic: [u8; 4] = c.array("the magic")?;
    if &magic != MAGIC {
        return Err(c.fail(format!(
            "starts with {magic:02x?}, not GGUF's magic \"GGUF\""
        )));
    }
    let raw = c.array::<4>("the version")?;
    let version = u32::from_le_bytes(raw);
    if matches!(u32::from_be_bytes(raw), 2 | 3) && version > 3 {
        return Err(c.fail("a big-endian GGUF file: this tool reads little-endian ones"));
    }
    match version {
        2 | 3 => {}
        1 => return Err(c.fail("GGUF version 1 (32-bit counts, before August 2023): not read")),
        v => {
            return Err(c.fail(format!(
                "GGUF version {v}: this tool reads versions 2 and 3"
            )))
        }
    }
    let tensor_count = c.u64("the tensor count")?;
    let kv_count = c.u64("the metadata count")?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes,
    // a tensor info at least 8 (name length) + 4 + 8 (one dimension) + 4 + 8.
    let kv_cap = c.count(kv_count, 13, "the metadata count")?;
    let mut metadata: Vec<(String, MetaValue)> = Vec::with_capacity(kv_cap);
    let mut keys: HashSet<String> = HashSet::with_capacity(kv_cap);
    for _ in 0..kv_count {
        let key = c.string("a metadata key")?;
        if !keys.insert(key.clone()) {
            return Err(c.fail(format!("metadata key {key} appears twice")));
        }
        let ty = c.u32(&key)?;
        let value = c.value(ty, &key, 0)?;
        metadata.push((key, value));
    }
    drop(keys);
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) if a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            return Err(c.fail(format!(
                "general.alignment is {v}, not a power of two (u32)"
            )))
        }
    };
    let tensor_cap = c.count(tensor_count, 32, "the tensor count")?;
    let mut tensors: Vec<Tensor> = Vec::with_capacity(tensor_cap);
    let mut names: HashSet<String> = HashSet::with_capacity(tensor_cap);
    for _ in 0..tensor_count {
        let name = c.string("a tensor name")?;
        let fail =
            |c: &Cursor<'_>, detail: String| Error::tensor(Rule::GgufTensor, c.path, &name, detail);
        let n_dims = c.u32(&name)?;
        if !(1..=MAX_DIMS).contains(&n_dims) {
            return Err(fail(
                c,
                format!("{n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}"),
            ));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(c.u64(&name)?);
        }
        if ne.contains(&0) {
            return Err(fail(c, format!("dimensions {ne:?} hold a zero")));
        }
        let id = c.u32(&name)?;
        let Some(ty) = GgmlType::from_id(id) else {
            return Err(fail(c, format!("type {id} is no ggml type")));
        };
        let offset = c.u64(&name)?;
        let elements = ne.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        let row = ne[0];
        let rows = elements.map(|e| e / row);
        let size = ty
            .row_bytes(row)
            .zip(rows)
            .and_then(|(b, r)| b.checked_mul(r));
        let Some(size) = size else {
            let (block, _) = ty.block();
            return Err(fail(
                c,
                format!("{ty} rows of {row} elements: not whole blocks of {block} (or too many)"),
            ));
        };
        if !offset.is_multiple_of(alignment) {
            return Err(fail(
                c,
                format!("data offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(fail(c, "appears twice".to_string()));
        }
        tensors.push(Tensor {
            // Row-major, the outermost dimension first.
            shape: ne.iter().rev().map(|&d| d as usize).collect(),
            name,
            ty,
            offset,
            size,
            file: 0,
        });
    }
    let data_start = (c.at as u64).next_multiple_of(alignment);
    let file_len = c.file_len;
    // Inside the file, and one after another.
    let mut order: Vec<&mut Tensor> = tensors.iter_mut().collect();
    order.sort_by_key(|t| t.offset);
    let mut end = data_start;
    // The tensor before, where it is of a type forks number otherwise.
    let mut forked: Option<(String, GgmlType)> = None;
    for t in order {
        let start = data_start.checked_add(t.offset);
        let stop = start.and_then(|s| s.checked_add(t.size));
        match (start, stop) {
            (Some(s), Some(e)) if e <= file_len && s >= end => {
                if let Some((name, ty)) = forked.take() {
                    fork_bytes(path, &name, ty, s - end, alignment)?;
                }
                t.offset = s;
                end = e;
                forked = forks_differ(t.ty).then(|| (t.name.clone(), t.ty));
            }
            (Some(s), Some(e)) if e <= file_len => {
                let detail = format!(
                    "data at bytes {s}..{e} overlaps the tensor before it (which ends at {end})"
                );
                return Err(Error::tensor(Rule::GgufTensor, path, &t.name, detail));
            }
            _ => {
                let detail = format!(
                    "{} bytes at data offset {} run past the end of the file ({file_len} bytes, data from {data_start})",
                    t.size, t.offset
                );
                return Err(Error::tensor(Rule::GgufTensor, path, &t.name, detail));
            }
        }
    }
    if let Some((name, ty)) = forked {
        fork_bytes(path, &name, ty, file_len - end, alignment)?;
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

/// Types whose number forks give to other layouts (PrismML's fork, whose
/// 2-bit type is 128 elements in 34 bytes): their bytes are checked.
fn forks_differ(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q1_0 | GgmlType::Q2_0)
}

/// A tensor of such a type must fill the bytes up to the next tensor (or
/// the end of the file) but for the padding to the alignment, as llama.cpp
/// and gguf-py write them: more bytes are another layout under its number.
fn fork_bytes(path: &Path, name: &str, ty: GgmlType, gap: u64, alignment: u64) -> Result<()> {
    if gap < alignment {
        return Ok(());
    }
    let (block, bytes) = ty.block();
    let detail = format!(
        "{gap} bytes follow its {ty} data ({block} elements in {bytes} bytes a block, as llama.cpp numbers type {}): another layout under that number (a fork's)",
        ty as u32
    );
    Err(Error::tensor(Rule::GgufTensor, path, name, detail))
}
