//! The GPU kernels' figures: every layout decoded into a GPU buffer
//! (upload included), against a copy shader with the same geometry.

use super::cases::{case_name, InputPacked, Layout, Weight};
use super::gguf;
use super::report::Figure;
use super::timing::{best, best_of_turns};
use crate::backend::gpu::GpuDecoder;
use crate::error::{Error, Result, Rule};
use crate::job::DecodeJob;
use crate::numerics::OutDtype;

/// One run of the copy shader of `job`'s fast-kernel geometry (`job`
/// named `name`), waited for.
pub(super) fn copy_once(
    decoder: &GpuDecoder,
    job: &DecodeJob<'_>,
    name: &str,
    wait: &dyn Fn() -> Result<()>,
) -> Result<()> {
    let buf = decoder
        .copy_baseline(job)
        .ok_or_else(|| Error::bare(Rule::Gpu, format!("bench: no fast kernel for {name}")))??;
    wait()?;
    buf.destroy();
    Ok(())
}

/// `job` decoded into a GPU buffer (upload included) against the copy
/// shader of the same geometry, best of `runs` each, taken in turns; the
/// figure names the kernel that ran.
fn against_copy(
    decoder: &GpuDecoder,
    job: &DecodeJob<'_>,
    name: &str,
    runs: usize,
    wait: &dyn Fn() -> Result<()>,
) -> Result<Figure> {
    let before = decoder.dispatches();
    let times = best_of_turns(
        runs,
        || {
            let buf = decoder.decode_to_buffer(job)?;
            wait()?;
            buf.destroy();
            Ok(())
        },
        || copy_once(decoder, job, name, wait),
    )?;
    let kernel = kernel_name(before, decoder.dispatches());
    let copy = "copy shader, same geometry".into();
    Ok(Figure::timed(
        "gpu",
        (format!("{name} ({kernel})"), copy),
        job.out_bytes() as u64,
        times,
    ))
}

/// GPU decode of every layout into a GPU buffer (upload included) against
/// the copy shader with the fast kernel's geometry, which uploads the same
/// bytes, reads each code word and writes as many output words.
pub(crate) fn gpu_kernels(
    decoder: &GpuDecoder,
    rows: usize,
    cols: usize,
    runs: usize,
    only: &str,
) -> Result<Vec<Figure>> {
    let wait = || {
        decoder
            .device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::bare(Rule::Gpu, "bench: poll").caused_by(e))
    };
    let mut figures = Vec::new();
    for layout in Layout::ALL.into_iter().filter(|l| l.name().contains(only)) {
        let w = Weight::random(layout, rows, cols, 7);
        for out in [OutDtype::Bf16, OutDtype::F32] {
            let job = w.job(out);
            let figure = against_copy(decoder, &job, &case_name(layout, out), runs, &wait)?;
            let decode = figure.seconds;
            figures.push(figure);
            // A model decoded into GPU memory should cost about its upload.
            if out == OutDtype::Bf16 && matches!(layout, Layout::Int4 | Layout::Nvfp4) {
                let input = job.codes.data.len() + job.scale.as_ref().map_or(0, |s| s.data.len());
                let codes = &job.codes.data[..];
                let upload = best(runs, || {
                    let buf = decoder.upload(codes)?;
                    wait()?;
                    buf.destroy();
                    Ok(())
                })?;
                let what = format!("{}, resident, per input byte", case_name(layout, out));
                let baseline = "upload of the codes".into();
                figures.push(Figure::timed(
                    "gpu",
                    (what, baseline),
                    input as u64,
                    (decode, upload),
                ));
            }
        }
    }
    figures.extend(gpu_input_packed(decoder, rows, cols, runs, only, &wait)?);
    if cols.is_multiple_of(256) {
        figures.extend(gguf::gpu(decoder, (rows, cols), runs, only, &wait)?);
    }
    Ok(figures)
}

/// Which kernel ran between two [`GpuDecoder::dispatches`] readings.
pub(super) fn kernel_name(
    before: crate::backend::gpu::Dispatches,
    after: crate::backend::gpu::Dispatches,
) -> &'static str {
    if after.generic > before.generic {
        "generic kernel"
    } else if after.tiled > before.tiled {
        "tile kernel"
    } else {
        "fast kernel"
    }
}

/// GPU decode of the [`InputPacked`] layouts into a GPU buffer against the
/// copy shader of the same dispatch; none when `rows` is not a multiple of
/// 128.
fn gpu_input_packed(
    decoder: &GpuDecoder,
    rows: usize,
    cols: usize,
    runs: usize,
    only: &str,
    wait: &dyn Fn() -> Result<()>,
) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    if !rows.is_multiple_of(128) {
        return Ok(figures);
    }
    for layout in InputPacked::ALL
        .into_iter()
        .filter(|l| l.name().contains(only))
    {
        let storage = layout.storage(rows, cols);
        for out in [OutDtype::Bf16, OutDtype::F32] {
            let job = layout.job((rows, cols), &storage, out);
            let name = format!("{} -> {out}", layout.name());
            figures.push(against_copy(decoder, &job, &name, runs, &wait)?);
        }
    }
    Ok(figures)
}
