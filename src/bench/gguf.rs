//! GGUF's common types as `dequantize` decodes them: the
//! scales of each run of rows computed on the host, the codes read where
//! they lie in the blocks by the backend, against the straight int4 job of
//! the same shape (CPU) and the copy shader of the same pieces (GPU), in
//! the same run.

use super::cases::{case_name, Layout, Weight};
use super::cpu::line_aligned;
use super::gpu::{copy_once, kernel_name};
use super::report::Figure;
use super::timing::best_of_turns;
use crate::backend::gpu::GpuDecoder;
use crate::backend::{Backend, Cpu};
use crate::error::{Error, Result, Rule};
use crate::formats::gguf::map_of;
use crate::gguf::GgmlType;
use crate::job::Dims;
use crate::numerics::OutDtype;
// Output bytes mapped and decoded at a time: the writer's pieces.
use crate::writer::PIECE_BYTES;

/// The types measured on the CPU.
const TYPES: [GgmlType; 2] = [GgmlType::Q4_K, GgmlType::Q6_K];

/// The types measured on the GPU: the common ones, which its fast kernel
/// reads in their blocks.
const GPU_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// Random blocks of `ty` for `rows × cols`, their f16 scales (at each
/// block's `d`, and `dmin` where there is one) about 0.01.
pub(super) fn blocks(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (block, size) = (ty.block().0 as usize, ty.block().1 as usize);
    let mut rng = fastrand::Rng::with_seed(51);
    let mut v = vec![0u8; rows * cols / block * size];
    rng.fill(&mut v);
    // The f16 `d` (and `dmin`) of each block.
    let scales: &[usize] = match ty {
        GgmlType::Q6_K => &[208],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        _ => &[0],
    };
    let d = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    for b in v.chunks_exact_mut(size) {
        for &at in scales {
            b[at..at + 2].copy_from_slice(&d);
        }
    }
    v
}

/// Maps (the scales) and decodes every row of `data` with `decode`, a
/// piece at a time.
fn pieces(
    ty: GgmlType,
    data: &[u8],
    (rows, cols): (usize, usize),
    out: OutDtype,
    mut decode: impl FnMut(&crate::job::DecodeJob<'_>, usize) -> Result<()>,
) -> Result<()> {
    let map = map_of(ty).ok_or_else(|| Error::bare(Rule::Internal, "bench: no map"))?;
    let row_bytes = data.len() / rows;
    let per = (PIECE_BYTES / (cols * out.size())).max(1);
    for start in (0..rows).step_by(per) {
        let n = per.min(rows - start);
        let dims = Dims {
            slices: 1,
            rows: n,
            cols,
        };
        let job = map(&data[start * row_bytes..(start + n) * row_bytes], dims, out)?;
        decode(&job, start * cols * out.size())?;
    }
    Ok(())
}

/// The CPU figures: each type against the straight int4 job of its shape.
pub(crate) fn cpu(rows: usize, cols: usize, runs: usize, only: &str) -> Result<Vec<Figure>> {
    let cpu = Cpu::new();
    let mut figures = Vec::new();
    for ty in TYPES
        .into_iter()
        .filter(|t| format!("gguf {t}").contains(only))
    {
        let data = blocks(ty, rows, cols);
        let base = Weight::random(Layout::Int4, rows, cols, 7);
        for out in [OutDtype::Bf16, OutDtype::F32] {
            let bytes = rows * cols * out.size();
            let (mut buf, skew) = line_aligned(bytes);
            let dst = std::cell::RefCell::new(&mut buf[skew..skew + bytes]);
            let base_job = base.job(out);
            let times = best_of_turns(
                runs,
                || {
                    pieces(ty, &data, (rows, cols), out, |job, at| {
                        let n = job.out_bytes();
                        cpu.decode_rows(job, 0..job.dims.rows, &mut dst.borrow_mut()[at..at + n])
                    })
                },
                || cpu.decode_rows(&base_job, 0..rows, &mut dst.borrow_mut()),
            )?;
            let what = format!("gguf {ty} → {out}, scales mapped a piece at a time");
            let straight = format!("straight {}", case_name(Layout::Int4, out));
            figures.push(Figure::timed("cpu", (what, straight), bytes as u64, times));
        }
    }
    Ok(figures)
}

/// The GPU figures: each common type (its scales mapped on the host, its
/// codes read in the blocks, decoded into GPU buffers) against the copy
/// shader of the same pieces, mapped the same way (the same uploads, reads
/// and writes, the same geometry, no decoding), in turns.
pub(crate) fn gpu(
    decoder: &GpuDecoder,
    (rows, cols): (usize, usize),
    runs: usize,
    only: &str,
    wait: &dyn Fn() -> Result<()>,
) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    for ty in GPU_TYPES
        .into_iter()
        .filter(|t| format!("gguf {t}").contains(only))
    {
        let data = blocks(ty, rows, cols);
        let out = OutDtype::Bf16;
        let name = format!("gguf {ty}");
        let run = |copy: bool| {
            pieces(ty, &data, (rows, cols), out, |job, _| {
                if copy {
                    return copy_once(decoder, job, &name, wait);
                }
                let buf = decoder.decode_to_buffer(job)?;
                wait()?;
                buf.destroy();
                Ok(())
            })
        };
        let before = decoder.dispatches();
        let times = best_of_turns(runs, || run(false), || run(true))?;
        let what = format!(
            "gguf {ty} → {out}, scales mapped on the host a piece at a time ({})",
            kernel_name(before, decoder.dispatches())
        );
        let copy = "copy shader of the same pieces, same geometry".into();
        figures.push(Figure::timed(
            "gpu",
            (what, copy),
            (rows * cols * out.size()) as u64,
            times,
        ));
    }
    Ok(figures)
}
