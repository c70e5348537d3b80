//! GGUF (llama.cpp, gguf-py): a quantized tensor's blocks carry their own
//! scales. Each run of rows decoded is mapped on the host
//! ([`crate::output::blocks`]) into one job: an f32 scale per group and,
//! where the type has one, an f32 offset per group, added after the
//! product; codes through the type's code table, read by the backends
//! where they lie in the blocks ([`crate::job::InBlocks`]: one plane of
//! whole fields, or two for the 5- and 6-bit types), or, for the
//! codebook and base-3 types, mapped too (4 bits where the run's codes
//! fit, else a byte). The
//! values are gguf-py's (`gguf.quants.dequantize`, what transformers
//! computes): f16 block scales widened to f32, sub-block scales multiplied
//! in f32 (`d · sc`, `dmin · m`), then `f32(scale · q) + offset`, rounded
//! once to the output dtype. Float tensors (F32, F16, BF16) are copied.

pub(crate) mod dot;
mod grids;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use rayon::prelude::*;

use super::Modules;
use crate::checkpoint::{Checkpoint, Gguf};
use crate::error::{Error, Result, Rule};
use crate::gguf::GgmlType;
use crate::job::{Bytes, DecodeJob, Dims, Fields, Grid, InBlocks, Plane, ValueKind, Values};
use crate::numerics::{f16_to_f32, OutDtype};
use crate::output::blocks::{Blocks, MapBlocks};
use crate::output::{Output, Source};
use crate::plural::plural;

/// What this format module reads (`wgpu-dequant formats`).
pub const SUPPORT: super::Support = super::Support {
    name: "gguf",
    producers: "llama.cpp, gguf-py",
    bits: &[1, 2, 3, 4, 5, 6, 8],
    modes: &["ggml block types (see gguf_types)"],
};

/// A GGUF model's description.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// GGUF version.
    pub version: u32,
    /// `general.architecture`.
    pub architecture: Option<String>,
    /// Tensors and their stored bytes per ggml type.
    pub types: Vec<TypeCount>,
    /// Every metadata key and its value.
    pub metadata: Metadata,
}

/// A GGUF model's metadata in file order: each key's value for people
/// (shortened: a list shows its length and first items) and as a JSON
/// value. Serializes as an object of key and value, where a list of more
/// than [`Metadata::LIST_ITEMS`] items is `{"length": n, "first": [its
/// first items]}` (a vocabulary would make megabytes of a report).
#[derive(Debug, Clone, Default)]
pub struct Metadata(Vec<(String, String, serde_json::Value)>);

impl Metadata {
    /// The most items a list is given whole.
    pub const LIST_ITEMS: usize = 64;

    /// The metadata `pairs`, key and value.
    pub fn of(pairs: &[(String, crate::gguf::MetaValue)]) -> Metadata {
        let json = |v: &crate::gguf::MetaValue| match v {
            crate::gguf::MetaValue::Array(a) if a.len() > Self::LIST_ITEMS => {
                let first: Vec<serde_json::Value> = a.iter().take(8).map(|item| serde_json::to_value(item).unwrap_or_default()).collect();
                serde_json::json!({"length": a.len(), "first": first})
            }
            v => serde_json::to_value(v).unwrap_or_default(),
        };
        Metadata(pairs.iter().map(|(k, v)| (k.clone(), v.to_string(), json(v))).collect())
    }

    /// Each key and its value for people.
    pub fn lines(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.0.iter().map(|(k, text, _)| (k.as_str(), text.as_str()))
    }
}

impl serde::Serialize for Metadata {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, _, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// Tensors and bytes of one type.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TypeCount {
    /// The type.
    #[serde(rename = "type")]
    pub ty: GgmlType,
    /// How many tensors have it.
    pub tensors: usize,
    /// Their stored bytes.
    pub bytes: u64,
}

impl Config {
    /// The description of `ckpt`'s model `gguf`.
    pub fn of(ckpt: &Checkpoint, gguf: &Gguf) -> Config {
        let mut types: BTreeMap<GgmlType, (usize, u64)> = BTreeMap::new();
        for (name, (ty, _)) in &gguf.tensors {
            let e = types.entry(*ty).or_default();
            e.0 += 1;
            e.1 += ckpt.get(name).map_or(0, |t| t.len() as u64);
        }
        Config {
            version: gguf.version,
            architecture: gguf.get("general.architecture").and_then(|v| v.as_str()).map(str::to_string),
            types: types
                .into_iter()
                .map(|(ty, (tensors, bytes))| TypeCount { ty, tensors, bytes })
                .collect(),
            metadata: Metadata::of(&gguf.metadata),
        }
    }

    /// inspect's format line.
    pub fn format_line(&self) -> String {
        let types: Vec<String> = self.types.iter().map(|t| format!("{} {}", t.tensors, t.ty)).collect();
        let arch = self.architecture.as_deref().unwrap_or("(no architecture)");
        format!("gguf v{} {arch} ({})", self.version, types.join(", "))
    }

    /// `inspect`'s lines: bytes per type, then the metadata.
    pub fn report_lines(&self) -> Vec<String> {
        let types = self.types.iter().map(|t| format!("{}: {}, {} bytes", t.ty, plural(t.tensors, "tensor"), t.bytes));
        let metadata = self.metadata.lines().map(|(k, v)| format!("{k} = {v}"));
        types.chain(metadata).collect()
    }
}

/// The quantized tensors of `ckpt`, each decoded by runs of rows; a type
/// not decoded yet is an error of its tensor. The [`Config`] is a summary
/// for `inspect`: the tensors are read from the GGUF file itself.
pub fn plan<'c>(_: &Config, ckpt: &'c Checkpoint, out: OutDtype) -> Modules<'c> {
    let mut found = Modules::default();
    let Some(gguf) = &ckpt.gguf else {
        return found;
    };
    for (name, (ty, shape)) in &gguf.tensors {
        let Some(t) = ckpt.get(name) else {
            continue;
        };
        if t.dtype != safetensors::Dtype::U8 || !is_quantized(*ty) {
            continue;
        }
        found.consumed.insert(name.clone());
        let Some(map) = map_of(*ty) else {
            let detail = format!("ggml type {ty} is not decoded (gguf-py 0.19 cannot either)");
            found.errors.push(t.error(Rule::Unsupported, detail));
            continue;
        };
        let cols = shape.last().copied().unwrap_or(0);
        let rows = shape.iter().rev().skip(1).product();
        found.outputs.push(Output {
            name: name.clone(),
            shard: t.shard,
            shape: shape.clone(),
            dtype: out.safetensors(),
            source: Source::Blocks(Blocks {
                tensor: t,
                rows,
                cols,
                row_bytes: t.shape.last().copied().unwrap_or(0),
                out,
                map: Some(map),
                order: Default::default(),
                shift: None,
            }),
            scheme: Some(format!("gguf {ty}")),
        });
    }
    found
}

/// The bits a weight of type `ty` takes, whole (its block's bits per
/// element rounded down: Q4_K's 4.5 is 4), and how many elements share a
/// scale (none for the float types).
pub(crate) fn bits_and_group(ty: GgmlType) -> (u32, Option<usize>) {
    let (elements, bytes) = ty.block();
    (bytes * 8 / elements.max(1), kind(ty).map(|k| k.group))
}

/// Whether a type is stored in blocks (not a plain number type).
fn is_quantized(ty: GgmlType) -> bool {
    ty.block().0 > 1
}

/// The map of the types decoded.
pub(crate) fn map_of(ty: GgmlType) -> Option<MapBlocks> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => map::<{ T::Q4_0 as u32 }>,
        T::Q4_1 => map::<{ T::Q4_1 as u32 }>,
        T::Q5_0 => map::<{ T::Q5_0 as u32 }>,
        T::Q5_1 => map::<{ T::Q5_1 as u32 }>,
        T::Q8_0 => map::<{ T::Q8_0 as u32 }>,
        T::Q2_K => map::<{ T::Q2_K as u32 }>,
        T::Q3_K => map::<{ T::Q3_K as u32 }>,
        T::Q4_K => map::<{ T::Q4_K as u32 }>,
        T::Q5_K => map::<{ T::Q5_K as u32 }>,
        T::Q6_K => map::<{ T::Q6_K as u32 }>,
        T::IQ4_NL => map::<{ T::IQ4_NL as u32 }>,
        T::IQ4_XS => map::<{ T::IQ4_XS as u32 }>,
        T::TQ1_0 => map::<{ T::TQ1_0 as u32 }>,
        T::TQ2_0 => map::<{ T::TQ2_0 as u32 }>,
        T::MXFP4 => map::<{ T::MXFP4 as u32 }>,
        T::NVFP4 => map::<{ T::NVFP4 as u32 }>,
        T::IQ2_XXS => map::<{ T::IQ2_XXS as u32 }>,
        T::IQ2_XS => map::<{ T::IQ2_XS as u32 }>,
        T::IQ2_S => map::<{ T::IQ2_S as u32 }>,
        T::IQ3_XXS => map::<{ T::IQ3_XXS as u32 }>,
        T::IQ3_S => map::<{ T::IQ3_S as u32 }>,
        T::IQ1_S => map::<{ T::IQ1_S as u32 }>,
        T::IQ1_M => map::<{ T::IQ1_M as u32 }>,
        T::Q1_0 => map::<{ T::Q1_0 as u32 }>,
        T::Q2_0 => map::<{ T::Q2_0 as u32 }>,
        _ => return None,
    })
}

/// One block decoded: a code per element, a scale and an offset per group.
struct Block<'o> {
    /// Empty where the codes are read in place.
    codes: &'o mut [u8],
    scales: &'o mut [f32],
    /// Empty where the type has none.
    offsets: &'o mut [f32],
}

/// How a type's blocks read: elements per scale group, the code table
/// (code `k` stands for `table(k)`), whether it has offsets, where its
/// codes lie when they are whole fields read in place (the low plane and
/// the high one), and the decoder of one block: its scales and offsets,
/// and its codes when they are not read in place.
struct Kind {
    group: usize,
    table: fn(u32) -> f32,
    offsets: bool,
    planes: Option<(Plane, Option<Plane>)>,
    block: fn(&[u8], Block<'_>),
}

/// A plane of `bits`-wide codes from byte `at` of a block, in runs of
/// `span` bytes ([`Plane`]).
const fn plane(at: u32, bits: u32, span: u32) -> Plane {
    Plane { at, bits, span }
}

fn f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// gguf-py's `Q4_K.get_scale_min`: eight 6-bit scales and mins.
fn scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        m[j] = s[4 + j] & 0x3F;
        sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
        m[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
    }
    (sc, m)
}

/// Q4_K and Q5_K's scales `d · sc` and offsets `−(dmin · m)`.
fn k_scales(b: &[u8], out: &mut Block<'_>) {
    let (d, dmin) = (f16(b, 0), f16(b, 2));
    let (sc, m) = scale_min(&b[4..16]);
    for j in 0..8 {
        out.scales[j] = d * sc[j] as f32;
        out.offsets[j] = -(dmin * m[j] as f32);
    }
}

/// IQ4_NL and IQ4_XS's non-linear code values.
const IQ4: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4 and NVFP4's E2M1 code values, doubled (ggml's kvalues; the
/// scales are halved to match).
const E2M1X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `e8m0_to_fp32_half`: 2^(e − 128), subnormal for e < 2.
fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 { 0x0020_0000 << e } else { (e as u32 - 1) << 23 })
}

/// gguf-py's `NVFP4.ue4m3_to_fp32`: unsigned E4M3 (bit 7 ignored), halved;
/// 0 and 0x7F are 0.
fn ue4m3_half(x: u8) -> f32 {
    let (exp, man) = ((x >> 3) & 0xF, (x & 7) as f32);
    let raw = match exp {
        0 => man * 2f32.powi(-9),
        e => (1.0 + man / 8.0) * 2f32.powi(e as i32 - 7),
    };
    if x == 0 || x == 0x7F {
        0.0
    } else {
        raw * 0.5
    }
}

/// A codebook grid unpacked as gguf-py's `init_grid` does: entry `r`'s
/// element `p` is `grid_map` index `g[r · per + p]`.
fn unpack(hex: &[u8], bits: u32) -> Vec<u8> {
    let digit = |c: u8| if c > 0x40 { c.wrapping_add(9) & 0x0F } else { c & 0x0F };
    let per_byte = 8 / bits;
    let step = 8 / per_byte;
    hex.chunks_exact(2)
        .flat_map(|p| {
            let b = (digit(p[0]) << 4) | digit(p[1]);
            (0..per_byte).map(move |k| (b >> (k * step)) & ((1 << bits) - 1))
        })
        .collect()
}

/// The grids, unpacked once.
struct Grids {
    iq2xxs: Vec<u8>,
    iq2xs: Vec<u8>,
    iq2s: Vec<u8>,
    iq3xxs: Vec<u8>,
    iq3s: Vec<u8>,
    iq1s: Vec<u8>,
}

fn grids() -> &'static Grids {
    static GRIDS: OnceLock<Grids> = OnceLock::new();
    GRIDS.get_or_init(|| Grids {
        iq2xxs: unpack(grids::IQ2_XXS, 2),
        iq2xs: unpack(grids::IQ2_XS, 2),
        iq2s: unpack(grids::IQ2_S, 2),
        iq3xxs: unpack(grids::IQ3_XXS, 3),
        iq3s: unpack(grids::IQ3_S, 3),
        iq1s: unpack(grids::IQ1_S, 2),
    })
}

/// A grid value (index `k mod n` of `map`), negated for codes `n` and up:
/// the IQ codes are a grid index plus `n` for a set sign bit.
fn signed(map: &[f32], k: u32) -> f32 {
    let n = map.len() as u32;
    match map.get((k % n) as usize) {
        Some(&v) if k >= n => -v,
        Some(&v) => v,
        None => 0.0,
    }
}

const IQ2_MAP: [f32; 3] = [8.0, 25.0, 43.0];
const IQ3XXS_MAP: [f32; 8] = [4.0, 12.0, 20.0, 28.0, 36.0, 44.0, 52.0, 62.0];
const IQ3S_MAP: [f32; 8] = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0];

/// IQ1's code `k`: grid value −1, 0 or 1 (`k mod 3`) plus its group's
/// delta, +0.125, or −0.125 for codes 3 and up (exact in f32).
fn iq1(k: u32) -> f32 {
    let delta = if k >= 3 { -0.125f32 } else { 0.125 };
    (k % 3) as f32 - 1.0 + delta
}

/// gguf-py's `ksigns`: seven sign bits and their parity as the eighth.
fn ksigns(i: u32) -> u8 {
    (i as u8 & 0x7F) | (((i & 0x7F).count_ones() as u8 & 1) << 7)
}

/// The codes of `per` elements from grid entry `entry` of `grid` (`n`
/// map values), sign bits `signs` (bit p for element p), at `codes`.
fn grid_codes(grid: &[u8], per: usize, entry: usize, n: u8, signs: u8, codes: &mut [u8]) {
    for (p, c) in codes.iter_mut().enumerate().take(per) {
        *c = grid[entry * per + p] + n * ((signs >> p) & 1);
    }
}

fn kind(ty: GgmlType) -> Option<Kind> {
    use GgmlType as T;
    // Codes read in place, one plane or two; the block decoder gives the
    // scales and offsets only.
    let one = |p| Some((p, None));
    let two = |low, high| Some((low, Some(high)));
    let k = |group, table, offsets, planes, block| Some(Kind { group, table, offsets, planes, block });
    // Codes mapped by the block decoder too.
    let m = |group, table, offsets, block| k(group, table, offsets, None, block);
    match ty {
        T::Q8_0 => k(32, |c| c as u8 as i8 as f32, false, one(plane(2, 8, 1)), |b, o| {
            o.scales[0] = f16(b, 0);
        }),
        // The nibbles of Q4_0 and its kind: byte j's low one is element j,
        // its high one element j + 16.
        T::Q4_0 => k(32, |c| c as f32 - 8.0, false, one(plane(2, 4, 16)), |b, o| {
            o.scales[0] = f16(b, 0);
        }),
        T::Q4_1 => k(32, |c| c as f32, true, one(plane(4, 4, 16)), |b, o| {
            (o.scales[0], o.offsets[0]) = (f16(b, 0), f16(b, 2));
        }),
        // Fifth bits: bit j of a 32-bit mask is element j's.
        T::Q5_0 => k(32, |c| c as f32 - 16.0, false, two(plane(6, 4, 16), plane(2, 1, 1)), |b, o| {
            o.scales[0] = f16(b, 0);
        }),
        T::Q5_1 => k(32, |c| c as f32, true, two(plane(8, 4, 16), plane(4, 1, 1)), |b, o| {
            (o.scales[0], o.offsets[0]) = (f16(b, 0), f16(b, 2));
        }),
        // The K-quants: in each 128 (2-bit) or 64 (4-bit) elements, 32
        // bytes' lowest fields, then their next ones.
        T::Q2_K => k(16, |c| c as f32, true, one(plane(16, 2, 32)), |b, o| {
            // scales [16], qs [64], d, dmin.
            let (d, dmin) = (f16(b, 80), f16(b, 82));
            for ((s, m), &sm) in o.scales.iter_mut().zip(o.offsets.iter_mut()).zip(&b[..16]) {
                *s = d * (sm & 0x0F) as f32;
                *m = -(dmin * (sm >> 4) as f32);
            }
        }),
        // hmask [32] (the third bit: the offset of 4 applies where it is
        // clear), qs [64], scales [12], d.
        T::Q3_K => k(16, |c| c as f32 - 4.0, false, two(plane(32, 2, 32), plane(0, 1, 32)), |b, o| {
            let d = f16(b, 108);
            let s = &b[96..108];
            for g in 0..16 {
                let low = (s[g % 8] >> (4 * (g / 8))) & 0x0F;
                let high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
                o.scales[g] = d * ((low | (high << 4)) as i8 - 32) as f32;
            }
        }),
        T::Q4_K => k(32, |c| c as f32, true, one(plane(16, 4, 32)), |b, mut o| k_scales(b, &mut o)),
        T::Q5_K => k(32, |c| c as f32, true, two(plane(48, 4, 32), plane(16, 1, 32)), |b, mut o| {
            k_scales(b, &mut o)
        }),
        // ql [128] (low nibbles, 64 bytes to 128 elements), qh [64],
        // scales [16] int8, d.
        T::Q6_K => k(16, |c| c as f32 - 32.0, false, two(plane(0, 4, 64), plane(128, 2, 32)), |b, o| {
            let d = f16(b, 208);
            for g in 0..16 {
                o.scales[g] = d * b[192 + g] as i8 as f32;
            }
        }),
        T::IQ4_NL => k(32, |c| IQ4[c as usize & 15] as f32, false, one(plane(2, 4, 16)), |b, o| {
            o.scales[0] = f16(b, 0);
        }),
        // d, scales_h u16, scales_l [4], qs [128] (16 bytes to 32 elements).
        T::IQ4_XS => k(32, |c| IQ4[c as usize & 15] as f32, false, one(plane(8, 4, 16)), |b, o| {
            let d = f16(b, 0);
            let high = u16::from_le_bytes([b[2], b[3]]);
            for (j, s) in o.scales.iter_mut().enumerate() {
                let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
                let h = ((high >> (2 * j)) & 3) as u8;
                *s = d * ((low | (h << 4)) as i8 - 32) as f32;
            }
        }),
        T::TQ1_0 => m(256, |c| c as f32 - 1.0, false, |b, o| {
            // qs [48] in base 3, five digits a byte (then four), qh [4], d.
            o.scales[0] = f16(b, 52);
            let digit = |x: u8, k: u32| ((((x as u32 * 3u32.pow(k)) & 0xFF) * 3) >> 8) as u8;
            for (e, c) in o.codes.iter_mut().enumerate() {
                *c = match e {
                    0..160 => digit(b[e % 32], (e / 32) as u32),
                    160..240 => digit(b[32 + (e - 160) % 16], ((e - 160) / 16) as u32),
                    _ => digit(b[48 + (e - 240) % 4], ((e - 240) / 4) as u32),
                };
            }
        }),
        // qs [64], d.
        T::TQ2_0 => k(256, |c| c as f32 - 1.0, false, one(plane(0, 2, 32)), |b, o| {
            o.scales[0] = f16(b, 64);
        }),
        // PrismML's Bonsai types (ggml's `dequantize_row_q1_0/q2_0`): d,
        // then fields LSB first, element j in byte j / (8 / bits). A sign
        // bit, 1 for +d and 0 for −d (d · ±1 is ±d exactly); Q2_0's codes
        // 0..3 are −1, 0, +1, +2 times d.
        T::Q1_0 => k(128, |c| if c & 1 == 1 { 1.0 } else { -1.0 }, false, one(plane(2, 1, 1)), |b, o| {
            o.scales[0] = f16(b, 0);
        }),
        T::Q2_0 => k(64, |c| c as f32 - 1.0, false, one(plane(2, 2, 1)), |b, o| {
            o.scales[0] = f16(b, 0);
        }),
        T::MXFP4 => k(32, |c| E2M1X2[c as usize & 15] as f32, false, one(plane(1, 4, 16)), |b, o| {
            o.scales[0] = e8m0_half(b[0]);
        }),
        // Four ue4m3 scales, then 8 bytes a group: low nibbles first.
        T::NVFP4 => k(16, |c| E2M1X2[c as usize & 15] as f32, false, one(plane(4, 4, 8)), |b, o| {
            for (s, &x) in o.scales.iter_mut().zip(&b[..4]) {
                *s = ue4m3_half(x);
            }
        }),
        T::IQ2_XXS => m(32, |c| signed(&IQ2_MAP, c), false, |b, o| {
            // d, then per 32: four grid indices (a byte each), then the
            // scale (top 4 bits) and four 7-bit sign indices.
            let d = f16(b, 0);
            let g = &grids().iq2xxs;
            for k in 0..8 {
                let at = 2 + 8 * k;
                let aux = u32::from_le_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]);
                o.scales[k] = d * (0.5 + (aux >> 28) as f32) * 0.25;
                for j in 0..4 {
                    let signs = ksigns((aux >> (7 * j)) & 0x7F);
                    let c = &mut o.codes[32 * k + 8 * j..32 * k + 8 * j + 8];
                    grid_codes(g, 8, b[at + j] as usize, 3, signs, c);
                }
            }
        }),
        T::IQ2_XS => m(16, |c| signed(&IQ2_MAP, c), false, |b, o| {
            // d, 32 u16 (9-bit grid index, 7-bit sign index), 8 bytes of
            // 4-bit scales (one per 16).
            let d = f16(b, 0);
            let g = &grids().iq2xs;
            for (sc, s) in o.scales.iter_mut().enumerate() {
                *s = d * (0.5 + ((b[66 + sc / 2] >> (4 * (sc % 2))) & 0x0F) as f32) * 0.25;
            }
            for i in 0..32 {
                let q = u16::from_le_bytes([b[2 + 2 * i], b[3 + 2 * i]]);
                let c = &mut o.codes[8 * i..8 * i + 8];
                grid_codes(g, 8, (q & 511) as usize, 3, ksigns((q >> 9) as u32), c);
            }
        }),
        T::IQ2_S => m(16, |c| signed(&IQ2_MAP, c), false, |b, o| {
            // d, qs [32], signs [32], qh [8], scales [8].
            let d = f16(b, 0);
            let g = &grids().iq2s;
            for (sc, s) in o.scales.iter_mut().enumerate() {
                *s = d * (0.5 + ((b[74 + sc / 2] >> (4 * (sc % 2))) & 0x0F) as f32) * 0.25;
            }
            for i in 0..32 {
                let high = ((b[66 + i / 4] >> (2 * (i % 4))) & 3) as usize;
                let c = &mut o.codes[8 * i..8 * i + 8];
                grid_codes(g, 8, b[2 + i] as usize | (high << 8), 3, b[34 + i], c);
            }
        }),
        T::IQ3_XXS => m(32, |c| signed(&IQ3XXS_MAP, c), false, |b, o| {
            // d, qs [64] (a grid entry of 4 a byte), 8 u32 of scale and signs.
            let d = f16(b, 0);
            let g = &grids().iq3xxs;
            for k in 0..8 {
                let at = 66 + 4 * k;
                let aux = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                o.scales[k] = d * (0.5 + (aux >> 28) as f32) * 0.5;
                for j in 0..4 {
                    let signs = ksigns((aux >> (7 * j)) & 0x7F);
                    for h in 0..2 {
                        let e = 32 * k + 8 * j as usize + 4 * h;
                        let c = &mut o.codes[e..e + 4];
                        grid_codes(g, 4, b[2 + e / 4] as usize, 8, signs >> (4 * h), c);
                    }
                }
            }
        }),
        T::IQ3_S => m(32, |c| signed(&IQ3S_MAP, c), false, |b, o| {
            // d, qs [64], qh [8], signs [32], scales [4].
            let d = f16(b, 0);
            let g = &grids().iq3s;
            for (sc, s) in o.scales.iter_mut().enumerate() {
                *s = d * (1 + 2 * ((b[106 + sc / 2] >> (4 * (sc % 2))) & 0x0F)) as f32;
            }
            for i in 0..64 {
                let high = ((b[66 + i / 8] >> (i % 8)) & 1) as usize;
                let signs = b[74 + i / 2] >> (4 * (i % 2));
                let c = &mut o.codes[4 * i..4 * i + 4];
                grid_codes(g, 4, b[2 + i] as usize | (high << 8), 8, signs, c);
            }
        }),
        T::IQ1_S => m(32, iq1, false, |b, o| {
            // d, qs [32], qh: 8 u16 (3-bit scale, delta sign, 4 × 3 high
            // index bits).
            let d = f16(b, 0);
            let g = &grids().iq1s;
            for k in 0..8 {
                let qh = u16::from_le_bytes([b[34 + 2 * k], b[35 + 2 * k]]);
                o.scales[k] = d * (2 * ((qh >> 12) & 7) + 1) as f32;
                let neg = (qh >> 15) as u8;
                for t in 0..4 {
                    let i = 4 * k + t;
                    let entry = b[2 + i] as usize | ((((qh >> (3 * t)) & 7) as usize) << 8);
                    for (p, c) in o.codes[8 * i..8 * i + 8].iter_mut().enumerate() {
                        *c = g[8 * entry + p] + 3 * neg;
                    }
                }
            }
        }),
        T::IQ1_M => m(16, iq1, false, |b, o| {
            // qs [32], qh [16] (two nibbles: 3 high index bits, delta sign),
            // scales: 4 u16 of 3-bit scales, d in their top nibbles.
            let sc: [u16; 4] = std::array::from_fn(|t| u16::from_le_bytes([b[48 + 2 * t], b[49 + 2 * t]]));
            let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
            let d = f16_to_f32(bits);
            for (j, s) in o.scales.iter_mut().enumerate() {
                *s = d * (2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1) as f32;
            }
            let g = &grids().iq1s;
            for i in 0..32 {
                let nib = (b[32 + i / 2] >> (4 * (i % 2))) & 0x0F;
                let entry = b[i] as usize | (((nib & 7) as usize) << 8);
                let neg = (nib >> 3) & 1;
                for (p, c) in o.codes[8 * i..8 * i + 8].iter_mut().enumerate() {
                    *c = g[8 * entry + p] + 3 * neg;
                }
            }
        }),
        _ => None,
    }
}

/// The job of whole rows `bytes` of type `ID` (a [`MapBlocks`]): the
/// scales and offsets of every block on the host; the codes read in place
/// from `bytes` where the type's are whole fields, else mapped too.
fn map<const ID: u32>(bytes: &[u8], dims: Dims, out: OutDtype) -> Result<DecodeJob<'_>> {
    let internal = |d: &str| Error::bare(Rule::Internal, format!("gguf: {d}"));
    let ty = GgmlType::from_id(ID).ok_or_else(|| internal("an unknown type"))?;
    let kind = kind(ty).ok_or_else(|| internal("a type without a map"))?;
    let (block, block_bytes) = (ty.block().0 as usize, ty.block().1 as usize);
    let elements = dims.rows * dims.cols;
    if !dims.cols.is_multiple_of(block) || bytes.len() != elements / block * block_bytes {
        return Err(internal("rows that are not whole blocks"));
    }
    let per_block = block / kind.group;
    let mut codes = vec![0u8; if kind.planes.is_some() { 0 } else { elements }];
    let mut spare = SPARE.take();
    let (mut scales, mut offsets) = (std::mem::take(&mut spare.scales), std::mem::take(&mut spare.offsets));
    scales.resize(elements / kind.group, 0.0);
    offsets.resize(if kind.offsets { scales.len() } else { 0 }, 0.0);
    // Blocks decoded by many threads, TASK blocks a task (codes and
    // offsets empty where the type has none).
    const TASK: usize = 64;
    let mut tasks = Vec::with_capacity(bytes.len().div_ceil(TASK * block_bytes));
    let (mut c_rest, mut o_rest) = (&mut codes[..], &mut offsets[..]);
    for (b, s) in bytes.chunks(TASK * block_bytes).zip(scales.chunks_mut(TASK * per_block)) {
        let n = b.len() / block_bytes;
        let (cn, on) = ((n * block).min(c_rest.len()), (n * per_block).min(o_rest.len()));
        let (c, rest) = std::mem::take(&mut c_rest).split_at_mut(cn);
        c_rest = rest;
        let (o, rest) = std::mem::take(&mut o_rest).split_at_mut(on);
        o_rest = rest;
        tasks.push((b, s, c, o));
    }
    tasks.into_par_iter().for_each(|(b, s, c, o)| {
        for (i, (b, s)) in b.chunks_exact(block_bytes).zip(s.chunks_exact_mut(per_block)).enumerate() {
            let codes = c.get_mut(i * block..(i + 1) * block).unwrap_or_default();
            let offsets = o.get_mut(i * per_block..(i + 1) * per_block).unwrap_or_default();
            (kind.block)(b, Block { codes, scales: s, offsets });
        }
    });
    let groups = dims.cols / kind.group;
    let grid = Grid {
        row_div: 1,
        col_div: kind.group,
        row_stride: groups,
        slice_stride: dims.rows * groups,
    };
    let mut values = |v: &[f32]| Values {
        data: Bytes::Owned(grid_bytes(v, &mut spare.grids)),
        kind: ValueKind::F32,
        grid,
    };
    let row_bits = (dims.cols / block * block_bytes) as u64 * 8;
    let codes = match kind.planes {
        Some((low, high)) => {
            let blocks = InBlocks {
                len: block as u32,
                bytes: block_bytes as u32,
                low,
                high,
            };
            Fields::in_blocks(bytes, blocks, row_bits)
        }
        // Codes below 16 go two to a byte, low nibble first: the CPU's
        // per-group tables and the GPU's fast kernels take 4-bit codes.
        None if codes.iter().all(|&c| c < 16) => {
            let nibbles: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p.get(1).copied().unwrap_or(0) << 4)).collect();
            Fields::dense(Bytes::Owned(Arc::from(nibbles)), 4, (dims.cols as u64 * 4).div_ceil(8) * 8)
        }
        None => Fields::dense(Bytes::Owned(Arc::from(codes)), 8, dims.cols as u64 * 8),
    };
    let table: Vec<f32> = (0..1 << codes.bits).map(kind.table).collect();
    let job = DecodeJob::new(dims, codes, table, out).with_scale(values(&scales));
    let job = match kind.offsets {
        true => job.with_offset(values(&offsets)),
        false => job,
    };
    (spare.scales, spare.offsets) = (scales, offsets);
    SPARE.set(spare);
    Ok(job)
}

/// Buffers a thread's maps reuse, so that a run of pieces does not fault
/// fresh pages in (and hand them back) each time: the scales and offsets
/// being computed, and grids of earlier pieces.
#[derive(Default)]
struct Spare {
    scales: Vec<f32>,
    offsets: Vec<f32>,
    grids: Vec<Arc<[u8]>>,
}

thread_local!(static SPARE: std::cell::Cell<Spare> = std::cell::Cell::default());

/// Grids kept for reuse at most, per thread.
const SPARE_GRIDS: usize = 4;

/// `v`'s bytes as a grid: written into a spare grid of that size that no
/// job holds any more, or a new one, kept for later.
fn grid_bytes(v: &[f32], spare: &mut Vec<Arc<[u8]>>) -> Arc<[u8]> {
    let src: &[u8] = bytemuck::cast_slice(v);
    for g in spare.iter_mut().filter(|g| g.len() == src.len()) {
        if let Some(bytes) = Arc::get_mut(g) {
            bytes.copy_from_slice(src);
            return g.clone();
        }
    }
    let g: Arc<[u8]> = Arc::from(src);
    if spare.len() == SPARE_GRIDS {
        spare.remove(0);
    }
    spare.push(g.clone());
    g
}
