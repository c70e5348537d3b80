//! The producer's side of the synthetic checkpoints: the stored number
//! formats read from their definitions (E4M3, E2M1), compressed-tensors'
//! `pack_to_int32` (dense and 0.17.x padded), scale layouts as the producer
//! lays them out, and the expected output bytes (one round-to-nearest-even
//! step by the `half` crate), with the byte-for-byte check of what the
//! library wrote. Nothing here calls the crate's own decoding helpers.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{json, Value};
use wgpu_dequant::{dequantize, BackendChoice, DtypeChoice, Options, OutDtype};

use super::{caught, read_dir_tensors, Rng, Tensor};

/// Every output dtype.
pub const OUTS: [OutDtype; 3] = [OutDtype::Bf16, OutDtype::F16, OutDtype::F32];

/// Tensors read back: name → (dtype, shape, bytes).
pub type Tensors = BTreeMap<String, (String, Vec<usize>, Vec<u8>)>;

// ---------------------------------------------------------------------------
// Reference numerics
// ---------------------------------------------------------------------------

/// Rounds each f32 once to `out` (RNE, by `half`) and lays out little-endian
/// bytes; NaN is written as the canonical quiet NaN of the dtype.
pub fn encode(out: OutDtype, vals: &[f32]) -> Vec<u8> {
    vals.iter()
        .flat_map(|&x| -> Vec<u8> {
            match out {
                OutDtype::Bf16 if x.is_nan() => 0x7FC0u16.to_le_bytes().to_vec(),
                OutDtype::F16 if x.is_nan() => 0x7E00u16.to_le_bytes().to_vec(),
                OutDtype::F32 if x.is_nan() => 0x7FC0_0000u32.to_le_bytes().to_vec(),
                OutDtype::Bf16 => half::bf16::from_f32(x).to_bits().to_le_bytes().to_vec(),
                OutDtype::F16 => half::f16::from_f32(x).to_bits().to_le_bytes().to_vec(),
                OutDtype::F32 => x.to_bits().to_le_bytes().to_vec(),
            }
        })
        .collect()
}

pub fn dtype_name(out: OutDtype) -> &'static str {
    match out {
        OutDtype::Bf16 => "BF16",
        OutDtype::F16 => "F16",
        OutDtype::F32 => "F32",
    }
}

pub fn out_size(out: OutDtype) -> usize {
    match out {
        OutDtype::F32 => 4,
        _ => 2,
    }
}

/// FP8 E4M3 (fn) from its definition: bias 7, subnormals m/8 · 2^−6,
/// 0x7F and 0xFF are NaN.
pub fn e4m3_ref(b: u8) -> f32 {
    if b & 0x7F == 0x7F {
        return f32::NAN;
    }
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0xF) as i32;
    let mant = (b & 7) as f32;
    let mag = if e == 0 {
        mant / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + mant / 8.0) * 2f32.powi(e - 7)
    };
    sign * mag
}

/// A random E4M3 byte that is not NaN.
pub fn e4m3_byte(rng: &mut Rng) -> u8 {
    loop {
        let b = rng.below(256) as u8;
        if b & 0x7F != 0x7F {
            return b;
        }
    }
}

/// FP4 E2M1: bit 3 is the sign, code 0b1000 is −0.
pub fn e2m1_ref(code: u8) -> f32 {
    const MAG: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let m = MAG[(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// compressed-tensors `pack_to_int32` of one lane of unsigned fields.
/// Dense (≥ 0.18): field i at bit i·b, crossing words. Padded (0.17.x):
/// 32 div b fields per word, none crossing.
pub fn pack_fields(fields: &[u32], b: u32, legacy: bool) -> Vec<u32> {
    let n = fields.len();
    if legacy {
        let pw = (32 / b) as usize;
        let mut w = vec![0u32; n.div_ceil(pw)];
        for (i, &f) in fields.iter().enumerate() {
            assert!(f < 1 << b);
            w[i / pw] |= f << ((i % pw) as u32 * b);
        }
        w
    } else {
        let mut w = vec![0u32; (n * b as usize).div_ceil(32)];
        for (i, &f) in fields.iter().enumerate() {
            assert!(f < 1 << b);
            let bit = i * b as usize;
            let (wi, off) = (bit / 32, (bit % 32) as u32);
            w[wi] |= f << off;
            if off + b > 32 {
                w[wi + 1] |= f >> (32 - off);
            }
        }
        w
    }
}

/// Words `pack_fields` makes of `n` fields of `b` bits.
pub fn words_for(n: usize, b: u32, legacy: bool) -> usize {
    if legacy {
        n.div_ceil((32 / b) as usize)
    } else {
        (n * b as usize).div_ceil(32)
    }
}

// ---------------------------------------------------------------------------
// Scale layouts (producer's view)
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
pub enum ScaleScheme {
    Tensor,
    Channel,
    Group(usize),
    Block(usize, usize),
}

impl ScaleScheme {
    pub fn strategy(self) -> &'static str {
        match self {
            ScaleScheme::Tensor => "tensor",
            ScaleScheme::Channel => "channel",
            ScaleScheme::Group(_) => "group",
            ScaleScheme::Block(..) => "block",
        }
    }

    /// Columns per group of the group strategy.
    pub fn group_size(self) -> Option<usize> {
        match self {
            ScaleScheme::Group(g) => Some(g),
            _ => None,
        }
    }

    /// Entries per row of the scale tensor.
    pub fn ncols(self, cols: usize) -> usize {
        match self {
            ScaleScheme::Tensor | ScaleScheme::Channel => 1,
            ScaleScheme::Group(g) => cols.div_ceil(g),
            ScaleScheme::Block(_, bw) => cols.div_ceil(bw),
        }
    }

    /// Rows of the scale tensor.
    pub fn nrows(self, rows: usize) -> usize {
        match self {
            ScaleScheme::Tensor => 1,
            ScaleScheme::Channel | ScaleScheme::Group(_) => rows,
            ScaleScheme::Block(bh, _) => rows.div_ceil(bh),
        }
    }

    pub fn entries(self, slices: usize, rows: usize, cols: usize) -> usize {
        match self {
            ScaleScheme::Tensor => 1,
            _ => slices * self.nrows(rows) * self.ncols(cols),
        }
    }

    pub fn shape(self, experts: Option<usize>, rows: usize, cols: usize) -> Vec<usize> {
        match self {
            ScaleScheme::Tensor => vec![1],
            _ => experts
                .into_iter()
                .chain([self.nrows(rows), self.ncols(cols)])
                .collect(),
        }
    }

    /// Entry of element (s, r, c); `gidx` (when not empty) maps columns to
    /// groups.
    pub fn index(
        self,
        rows: usize,
        cols: usize,
        s: usize,
        r: usize,
        c: usize,
        gidx: &[usize],
    ) -> usize {
        let (nr, nc) = (self.nrows(rows), self.ncols(cols));
        match self {
            ScaleScheme::Tensor => 0,
            ScaleScheme::Channel => s * rows + r,
            ScaleScheme::Group(g) => {
                let grp = if gidx.is_empty() { c / g } else { gidx[c] };
                s * nr * nc + r * nc + grp
            }
            ScaleScheme::Block(bh, bw) => s * nr * nc + (r / bh) * nc + c / bw,
        }
    }

    /// The `weights` entry of a config group.
    pub fn weights(self, bits: u32, kind: &str, symmetric: bool, actorder: bool) -> Value {
        json!({
            "num_bits": bits,
            "type": kind,
            "strategy": self.strategy(),
            "group_size": self.group_size(),
            "block_structure": match self { ScaleScheme::Block(h, w) => json!([h, w]), _ => Value::Null },
            "symmetric": symmetric,
            "dynamic": false,
            "actorder": if actorder { json!("group") } else { Value::Null },
            "observer": "minmax",
        })
    }
}

// ---------------------------------------------------------------------------
// Decoding and comparing
// ---------------------------------------------------------------------------

/// A decoded tensor the test expects: its exact f32 values before rounding.
pub struct Want {
    pub name: String,
    pub shape: Vec<usize>,
    pub vals: Vec<f32>,
}

impl Want {
    /// The decoded `{module}.weight`.
    pub fn weight(module: &str, shape: Vec<usize>, vals: Vec<f32>) -> Want {
        Want {
            name: format!("{module}.weight"),
            shape,
            vals,
        }
    }
}

/// Decodes `input` to `out` on `backend` and reads every output tensor back.
/// Fails the test when the library refuses or panics.
pub fn decode_with(input: &Path, out: OutDtype, backend: BackendChoice) -> Tensors {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("dense");
    let options = Options {
        dtype: DtypeChoice::Fixed(out),
        backend,
    };
    match caught(|| dequantize(input, &dst, &options)) {
        Err(p) => panic!("{}: dequantize panicked: {}", input.display(), p),
        Ok(Err(e)) => panic!("{}: dequantize failed: {e}", input.display()),
        Ok(Ok(_)) => read_dir_tensors(&dst),
    }
}

/// The GPU decodes `input` in each of [`OUTS`] to `cpu`, the CPU's outputs
/// in that order. Call it inside `gpu_test`.
pub fn gpu_equals_cpu(ctx: &str, input: &Path, cpu: &[Tensors]) {
    for (out, cpu) in OUTS.into_iter().zip(cpu) {
        let gpu = decode_with(input, out, BackendChoice::Gpu);
        assert!(
            &gpu == cpu,
            "{ctx} -> {out}: GPU bytes differ from the CPU's"
        );
    }
}

/// The GPU gives the CPU's bytes on `input` in each of [`OUTS`]. Call it
/// inside `gpu_test`.
pub fn gpu_gives_the_cpus_bytes(ctx: &str, input: &Path) {
    let cpu = OUTS.map(|out| decode_with(input, out, BackendChoice::Cpu));
    gpu_equals_cpu(ctx, input, &cpu);
}

/// `decode_with` on the CPU.
pub fn decode(input: &Path, out: OutDtype) -> Tensors {
    decode_with(input, out, BackendChoice::Cpu)
}

/// Asserts `got == want`, elements of `elem` bytes; a difference is reported
/// with its count and the first differing element (with its exact value when
/// `vals` is given).
pub fn compare_bytes(
    ctx: &str,
    name: &str,
    elem: usize,
    got: &[u8],
    want: &[u8],
    vals: Option<&[f32]>,
) {
    assert_eq!(got.len(), want.len(), "{ctx}: {name}: byte length");
    if got == want {
        return;
    }
    let bad: Vec<usize> = (0..got.len() / elem)
        .filter(|&i| got[i * elem..(i + 1) * elem] != want[i * elem..(i + 1) * elem])
        .collect();
    let i = bad[0];
    let hex = |b: &[u8]| {
        b.iter()
            .rev()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    panic!(
        "{ctx}: {name}: {} of {} elements differ; first at element {i}: got 0x{}, want 0x{}{}",
        bad.len(),
        got.len() / elem,
        hex(&got[i * elem..(i + 1) * elem]),
        hex(&want[i * elem..(i + 1) * elem]),
        vals.map(|v| format!(
            " (exact f32 value {:e}, bits {:#010x})",
            v[i],
            v[i].to_bits()
        ))
        .unwrap_or_default()
    );
}

/// Checks that the output holds exactly `wants` (decoded to `out`) and
/// `copies` (unchanged).
pub fn check_output(ctx: &str, got: &Tensors, out: OutDtype, wants: &[Want], copies: &[Tensor]) {
    let want_names: BTreeSet<&str> = wants
        .iter()
        .map(|w| w.name.as_str())
        .chain(copies.iter().map(|c| c.name.as_str()))
        .collect();
    let got_names: BTreeSet<&str> = got.keys().map(String::as_str).collect();
    assert_eq!(got_names, want_names, "{ctx}: output tensor names");
    for w in wants {
        let (dt, shape, bytes) = &got[&w.name];
        assert_eq!(dt, dtype_name(out), "{ctx}: {} dtype", w.name);
        assert_eq!(shape, &w.shape, "{ctx}: {} shape", w.name);
        assert_eq!(
            w.vals.len(),
            w.shape.iter().product::<usize>(),
            "test bug: {}",
            w.name
        );
        compare_bytes(
            ctx,
            &w.name,
            out_size(out),
            bytes,
            &encode(out, &w.vals),
            Some(&w.vals),
        );
    }
    // A fixed dtype converts copied float tensors of other dtypes too; the
    // rest stay as stored, byte for byte.
    for c in copies {
        let (dt, shape, bytes) = &got[&c.name];
        assert_eq!(shape, &c.shape, "{ctx}: {} shape", c.name);
        match stored_floats(c).filter(|_| c.dtype != dtype_name(out)) {
            Some(vals) => {
                assert_eq!(dt, dtype_name(out), "{ctx}: {} dtype", c.name);
                let want = encode(out, &vals);
                compare_bytes(ctx, &c.name, out_size(out), bytes, &want, Some(&vals));
            }
            None => {
                assert_eq!(dt, c.dtype, "{ctx}: {} dtype", c.name);
                compare_bytes(ctx, &c.name, 1, bytes, &c.data, None);
            }
        }
    }
}

/// The values of a stored BF16/F16/F32 tensor, widened exactly.
pub fn stored_floats(t: &Tensor) -> Option<Vec<f32>> {
    let d = &t.data;
    match t.dtype {
        "BF16" => Some(
            d.chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        "F16" => Some(
            d.chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        "F32" => Some(
            d.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => None,
    }
}

/// Decodes `dir` to every output dtype on the CPU and checks each result;
/// returns the outputs.
pub fn expect_decodes(ctx: &str, dir: &Path, wants: &[Want], copies: &[Tensor]) -> Vec<Tensors> {
    OUTS.iter()
        .map(|&out| {
            let got = decode(dir, out);
            check_output(&format!("{ctx} -> {out}"), &got, out, wants, copies);
            got
        })
        .collect()
}
