//! `bench --gemv` on the CPU: `Model::matmul_cpu` at m = 1 with GGUF
//! weights, against a multi-threaded read of the same packed bytes (what
//! the GPU's read kernel is to its products: memory bandwidth).

use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;

use super::report::Figure;
use super::timing::best_in_turns;
use crate::error::{Error, Result, Rule};
use crate::gguf::GgmlType;
use crate::{DtypeChoice, Model};

/// The types timed: the common 4-bit and 8-bit ones.
const TYPES: [GgmlType; 2] = [GgmlType::Q4_K, GgmlType::Q8_0];

/// About how long one timing runs, in seconds: a product at m = 1 takes
/// about a millisecond, less than the clock's noise on a shared machine.
const SPAN: f64 = 0.05;

/// Bytes of weights the timings cycle through, at least: four times a
/// server CPU's last-level cache (32 MiB on the VM's EPYC), so that each
/// product and each read takes its bytes from memory, as a model's layers
/// do one token after another.
const COLD: usize = 128 << 20;

/// `Model::matmul_cpu` at m = 1 with Q4_K and Q8_0 weights of each shape
/// (random blocks; copies of them as the down projections of the layers of
/// a llama GGUF file written to a temporary directory, [`COLD`] bytes in
/// all, each product with the next layer's) against a read of the same
/// packed bytes (as many copies, the next one each time) by as many
/// threads, in turns.
pub(crate) fn cpu_gemv(shapes: &[(usize, usize)], runs: usize, only: &str) -> Result<Vec<Figure>> {
    let dir = Scratch::new()?;
    let mut figures = Vec::new();
    for &(n, k) in shapes {
        for ty in TYPES {
            let name = format!("matmul_cpu gguf {ty}");
            if !name.contains(only) || !k.is_multiple_of(ty.block().0 as usize) {
                continue;
            }
            let data = super::gguf::blocks(ty, n, k);
            let layers = COLD.div_ceil(data.len().max(1)).clamp(1, 64);
            write_gguf(&dir.0.join("model.gguf"), ty, (n, k), &data, layers)?;
            let model = Model::open(&dir.0, DtypeChoice::Auto)?;
            let weights: Vec<String> = (0..layers)
                .map(|l| format!("model.layers.{l}.mlp.down_proj.weight"))
                .collect();
            let copies = data.repeat(layers);
            let mut rng = fastrand::Rng::with_seed(13);
            let x: Vec<f32> = (0..k).map(|_| rng.f32() - 0.5).collect();
            let threads = rayon::current_num_threads().max(1);
            let chunk = (data.len() / threads / 4).max(1 << 16);
            // Every layer's pages read once before the clock runs.
            for w in &weights {
                model.matmul_cpu(w, &x, 1)?;
            }
            let mut next = 0;
            let mut ours = Repeated::new(|| {
                next += 1;
                model.matmul_cpu(&weights[next % layers], &x, 1).map(drop)
            })?;
            let mut copy = copies.chunks(data.len().max(1)).cycle();
            let mut read = Repeated::new(|| {
                let bytes = copy.next().unwrap_or_default();
                std::hint::black_box(read_words(bytes, chunk));
                Ok(())
            })?;
            let [ours, read] =
                best_in_turns(runs, [&mut || ours.seconds(), &mut || read.seconds()])?;
            figures.push(Figure {
                backend: "cpu",
                what: format!("{name} {n}x{k}"),
                baseline: format!(
                    "read of the same bytes, {}",
                    crate::plural::plural(threads, "thread")
                ),
                bytes: data.len() as u64,
                seconds: ours,
                baseline_seconds: read,
                m: Some(1),
                baseline_bytes: None,
                dispatch_seconds: None,
            });
        }
    }
    Ok(figures)
}

/// Every 8-byte word of `data` folded into one number, `chunk` bytes a
/// task on rayon's threads: the loads cannot be dropped.
fn read_words(data: &[u8], chunk: usize) -> u64 {
    data.par_chunks(chunk)
        .map(|c| {
            let words = c.chunks_exact(8);
            let tail = words.remainder().iter().fold(0u64, |a, &b| a ^ b as u64);
            words.fold(tail, |a, w| {
                a.wrapping_add(u64::from_le_bytes([
                    w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
                ]))
            })
        })
        .reduce(|| 0, u64::wrapping_add)
}

/// An operation timed as many times in a row as take about [`SPAN`].
struct Repeated<F> {
    f: F,
    reps: usize,
}

impl<F: FnMut() -> Result<()>> Repeated<F> {
    /// `f`, its repetitions sized after a first call.
    fn new(mut f: F) -> Result<Repeated<F>> {
        let t = Instant::now();
        f()?;
        let once = t.elapsed().as_secs_f64().max(1e-6);
        let reps = ((SPAN / once).ceil() as usize).clamp(1, 10_000);
        Ok(Repeated { f, reps })
    }

    /// Seconds a call takes: the repetitions' time over their count.
    fn seconds(&mut self) -> Result<f64> {
        let t = Instant::now();
        for _ in 0..self.reps {
            (self.f)()?;
        }
        Ok(t.elapsed().as_secs_f64() / self.reps as f64)
    }
}

/// A directory of its own under the system's temporary one, removed when
/// dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("wgpu-dequant-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::new(Rule::Io, &dir, "cannot create").caused_by(e))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A GGUF file at `path` of `layers` llama layers whose down projections
/// (`[n, k]`) are each `data`, blocks of `ty`.
fn write_gguf(
    path: &Path,
    ty: GgmlType,
    (n, k): (usize, usize),
    data: &[u8],
    layers: usize,
) -> Result<()> {
    let string = |s: &str| {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend(s.as_bytes());
        v
    };
    let kvs: [(&str, u32, Vec<u8>); 3] = [
        ("general.architecture", 8, string("llama")),
        ("general.alignment", 4, 32u32.to_le_bytes().to_vec()),
        (
            "llama.block_count",
            4,
            (layers as u32).to_le_bytes().to_vec(),
        ),
    ];
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((layers as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (key, kind, value) in kvs {
        b.extend(string(key));
        b.extend(kind.to_le_bytes());
        b.extend(value);
    }
    // Each tensor: its name, its dimensions innermost first, type, offset.
    let padded = data.len().next_multiple_of(32);
    for l in 0..layers {
        b.extend(string(&format!("blk.{l}.ffn_down.weight")));
        b.extend(2u32.to_le_bytes());
        b.extend((k as u64).to_le_bytes());
        b.extend((n as u64).to_le_bytes());
        b.extend((ty as u32).to_le_bytes());
        b.extend(((l * padded) as u64).to_le_bytes());
    }
    for _ in 0..layers {
        b.resize(b.len().next_multiple_of(32), 0);
        b.extend(data);
    }
    std::fs::write(path, b).map_err(|e| Error::new(Rule::Io, path, "cannot write").caused_by(e))
}
