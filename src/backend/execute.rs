//! Executing a planned output tensor on a backend: decoded jobs, SVDQuant
//! weights assembled from pieces of jobs, casts, and tensors made whole on
//! the host. The methods live here, beside the backends, so that the plan
//! stays data.

use std::borrow::Cow;
use std::ops::Range;

use super::gpu::GpuDecoder;
use super::Backend;
use crate::checkpoint::TensorRef;
use crate::error::{Error, Result, ResultExt, Rule};
use crate::numerics::OutDtype;
use crate::output::assembly::Assembly;
use crate::output::blocks::Blocks;
use crate::output::fold::Fold;
use crate::output::{cast_layout, Output, Source};

impl Output<'_> {
    /// Decodes rows `rows` (see [`Output::row_layout`]) into `out`.
    pub fn decode_rows(
        &self,
        backend: &dyn Backend,
        rows: Range<usize>,
        out: &mut [u8],
    ) -> Result<()> {
        pollster::block_on(self.decode_rows_async(backend, rows, out))
    }

    /// [`Output::decode_rows`], awaited (what a browser runs).
    pub async fn decode_rows_async(
        &self,
        backend: &dyn Backend,
        rows: Range<usize>,
        out: &mut [u8],
    ) -> Result<()> {
        self.check_loaded()?;
        let r = match &self.source {
            Source::Decode(job) => backend.decode_rows_async(job, rows, out).await,
            Source::Assemble(a) => assembled_rows(a, backend, rows, out).await,
            Source::Fold(f) => folded_rows(f, backend, rows, out).await,
            Source::Blocks(b) => blocks_rows(b, backend, rows, out).await,
            Source::Cast(t, to) => cast_rows(t, *to, rows, out),
            _ => Err(Error::bare(
                Rule::Argument,
                "decode_rows: not a tensor decoded by rows",
            )),
        };
        r.with_tensor(&self.name)
    }

    /// The whole tensor's bytes (decoded with `backend` when it is decoded).
    pub fn bytes(&self, backend: &dyn Backend) -> Result<Cow<'_, [u8]>> {
        pollster::block_on(self.bytes_async(backend))
    }

    /// [`Output::bytes`], awaited.
    pub async fn bytes_async(&self, backend: &dyn Backend) -> Result<Cow<'_, [u8]>> {
        self.check_loaded()?;
        match &self.source {
            Source::Copy(t) => Ok(Cow::Borrowed(t.stored())),
            Source::Bytes(b) => Ok(Cow::Borrowed(b)),
            Source::Bias(b) => Ok(Cow::Owned(b.bytes())),
            Source::Rearrange(r) => Ok(Cow::Owned(r.bytes()?)),
            Source::Decode(_)
            | Source::Assemble(_)
            | Source::Cast(..)
            | Source::Fold(_)
            | Source::Blocks(_) => {
                let rows = self.row_layout().map_or(0, |(rows, _)| rows);
                let mut out = vec![0u8; self.byte_len()];
                self.decode_rows_async(backend, 0..rows, &mut out).await?;
                Ok(Cow::Owned(out))
            }
        }
    }

    /// Fails unless every stored tensor it reads has its bytes at hand.
    fn check_loaded(&self) -> Result<()> {
        match self.inputs().iter().find(|t| !t.is_loaded()) {
            Some(t) => Err(t.error(Rule::Internal, "bytes not read yet")),
            None => Ok(()),
        }
    }
}

impl Output<'_> {
    /// The tensor in a new buffer on `decoder`'s device, laid out as
    /// [`GpuDecoder::decode_to_buffer`] says. A decoded module is decoded
    /// there without a round trip; anything else (an SVDQuant weight put
    /// together from pieces, whose pieces the GPU decodes, a bias, a copy) is
    /// made on the host and uploaded.
    pub fn to_buffer(&self, decoder: &GpuDecoder) -> Result<wgpu::Buffer> {
        match &self.source {
            Source::Decode(job) => decoder.decode_to_buffer(job),
            _ => decoder.upload(&self.bytes(decoder)?),
        }
    }
}

/// Decodes output rows `rows` of a tensor of blocks (or floats) into `out`:
/// straight from its job, or, where its values move by a constant or it is
/// a float tensor, through f32 values rounded once at the end.
async fn blocks_rows(
    b: &Blocks<'_>,
    backend: &dyn Backend,
    rows: Range<usize>,
    out: &mut [u8],
) -> Result<()> {
    use rayon::prelude::*;
    crate::backend::check_span(b.rows, b.cols * b.out.size(), &rows, out)?;
    let bytes = b.rows_bytes(rows.clone())?;
    let n = rows.len();
    if b.shift.is_none() {
        if let Some(job) = b.job(&bytes, b.out) {
            return backend.decode_rows_async(&job?, 0..n, out).await;
        }
    }
    // `out` holds n · cols elements: the size was checked above.
    let mut values = vec![0f32; n * b.cols];
    match b.job(&bytes, OutDtype::F32) {
        Some(job) => {
            let dst = bytemuck::cast_slice_mut(&mut values);
            backend.decode_rows_async(&job?, 0..n, dst).await?;
        }
        None => {
            let (size, read) = crate::numerics::float_reader(b.tensor.dtype)
                .ok_or_else(|| b.tensor.error(Rule::Internal, "not a float tensor"))?;
            values
                .par_chunks_mut(b.cols.max(1))
                .zip(bytes.par_chunks(b.cols.max(1) * size))
                .for_each(|(v, src)| {
                    v.iter_mut()
                        .zip(src.chunks_exact(size))
                        .for_each(|(v, c)| *v = read(c))
                });
        }
    }
    let to = b.out;
    let shift = b.shift;
    values
        .par_chunks(b.cols.max(1))
        .zip(out.par_chunks_mut(b.cols.max(1) * to.size()))
        .for_each(|(v, o)| {
            for (&x, o) in v.iter().zip(o.chunks_exact_mut(to.size())) {
                // Never `x + 0.0`, which would turn −0 into +0.
                to.encode(shift.map_or(x, |s| x + s), o);
            }
        });
    Ok(())
}

/// Decodes rows `rows` of an assembled weight into `out` (`rows.len() · cols
/// · size` bytes): each band's pieces side by side.
async fn assembled_rows(
    a: &Assembly<'_>,
    backend: &dyn Backend,
    rows: Range<usize>,
    out: &mut [u8],
) -> Result<()> {
    let size = a.out.size();
    let row_bytes = a.cols * size;
    crate::backend::check_span(a.stack.rows(), row_bytes, &rows, out)?;
    let mut tmp = Vec::new();
    let mut done = 0;
    for band in &a.stack.slice(rows).bands {
        let dst = &mut out[done * row_bytes..(done + band.rows) * row_bytes];
        if let [p] = band.parts.as_slice() {
            // The common case: one job spans the width.
            backend
                .decode_rows_async(&p.job, p.row..p.row + band.rows, dst)
                .await?;
        } else {
            let n = band.parts.len();
            let mut col = 0;
            for (k, p) in band.parts.iter().enumerate() {
                let w = p.job.dims.cols * size;
                tmp.resize(band.rows * w, 0);
                backend
                    .decode_rows_async(&p.job, p.row..p.row + band.rows, &mut tmp)
                    .await?;
                for (src, row) in tmp.chunks_exact(w).zip(dst.chunks_exact_mut(row_bytes)) {
                    if a.interleaved {
                        // Element c of part k is column c·n + k.
                        let at = row[k * size..].chunks_mut(n * size);
                        for (v, to) in src.chunks_exact(size).zip(at) {
                            to[..size].copy_from_slice(v);
                        }
                    } else {
                        row[col..col + w].copy_from_slice(src);
                    }
                }
                col += w;
            }
        }
        done += band.rows;
    }
    Ok(())
}

/// Decodes rows `rows` of a folded weight into `out`: the bands of rows
/// they fall in, decoded and folded, of which `rows` are kept.
async fn folded_rows(
    f: &Fold<'_>,
    backend: &dyn Backend,
    rows: Range<usize>,
    out: &mut [u8],
) -> Result<()> {
    let (total, cols) = f.dims();
    let row_bytes = cols * f.out.size();
    crate::backend::check_span(total, row_bytes, &rows, out)?;
    if rows.is_empty() {
        return Ok(());
    }
    let band = f.band();
    let (b0, b1) = (
        rows.start / band * band,
        rows.end.next_multiple_of(band).min(total),
    );
    let mut wq = vec![0u8; (b1 - b0) * cols * f.job.out.size()];
    backend.decode_rows_async(&f.job, b0..b1, &mut wq).await?;
    if (b0, b1) == (rows.start, rows.end) {
        f.fold(&wq, out);
    } else {
        let mut all = vec![0u8; (b1 - b0) * row_bytes];
        f.fold(&wq, &mut all);
        let at = (rows.start - b0) * row_bytes;
        out.copy_from_slice(&all[at..at + rows.len() * row_bytes]);
    }
    Ok(())
}

/// Converts rows `rows` of `t` (split by its first dimension) to `to`.
fn cast_rows(t: &TensorRef<'_>, to: OutDtype, rows: Range<usize>, out: &mut [u8]) -> Result<()> {
    use rayon::prelude::*;
    let (total, row_bytes) = cast_layout(t, to);
    crate::backend::check_span(total, row_bytes, &rows, out)?;
    let per_row = row_bytes / to.size();
    let size = t.dtype.bitsize() / 8;
    let src = &t.stored()[rows.start * per_row * size..rows.end * per_row * size];
    // Spread over threads in pieces of whole elements.
    const PIECE: usize = 1 << 16;
    src.par_chunks(PIECE * size)
        .zip(out.par_chunks_mut(PIECE * to.size()))
        .for_each(|(s, o)| crate::numerics::cast(t.dtype, s, to, o));
    Ok(())
}
