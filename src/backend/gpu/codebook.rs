//! The codebook kernel (shaders/codebook.wgsl): jobs whose values are
//! vectors gathered from a [`Codebook`] table. One `src` buffer a call
//! holds the description, the table, the column map, the scale's and the
//! offset's entries and the index bytes, uploaded once; the rows are then
//! decoded in dispatches of at most a binding's worth of output.

use std::ops::Range;
use std::sync::OnceLock;

use bytemuck::{Pod, Zeroable};

use super::{gpu_err, GpuDecoder};
use crate::error::Result;
use crate::job::{Codebook, DecodeJob, Sum, Values, MAX_TERMS};
use crate::numerics::OutDtype;

/// The module: the encodings, then the kernel.
const SOURCE: &str = concat!(
    include_str!("../../../shaders/decode/numbers.wgsl"),
    include_str!("../../../shaders/codebook.wgsl"),
);

/// Invocations per workgroup (`@workgroup_size` in the shader).
const WORKGROUP: u32 = 64;
/// Header words before the regions (`H_REGION0`).
const HEADER: usize = 16;
/// Words of a term (`TERM_WORDS`).
const TERM_WORDS: usize = 10;
/// Words of a region (`REGION_WORDS`).
const REGION_WORDS: usize = 8 + MAX_TERMS * TERM_WORDS;
/// No such part (`NONE`).
const NONE: u32 = u32::MAX;

/// `CbParams` in the shader.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct Params {
    first_row: u32,
    words: u32,
    stride: u32,
    zero_bits: u32,
    elements: u32,
    pad: [u32; 3],
}

/// The kernel's bind group layout and pipeline, built on first use.
pub(super) struct Kernel {
    built: OnceLock<(wgpu::BindGroupLayout, wgpu::ComputePipeline)>,
}

impl Kernel {
    pub(super) fn new() -> Kernel {
        Kernel {
            built: OnceLock::new(),
        }
    }

    fn get(&self, device: &wgpu::Device) -> &(wgpu::BindGroupLayout, wgpu::ComputePipeline) {
        self.built.get_or_init(|| {
            use super::shader::buffer;
            use wgpu::BufferBindingType as B;
            let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("wgpu-dequant codebook bindings"),
                entries: &[
                    buffer(0, B::Uniform, std::mem::size_of::<Params>() as u64),
                    buffer(1, B::Storage { read_only: true }, 4),
                    buffer(2, B::Storage { read_only: false }, 4),
                ],
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("wgpu-dequant codebook pipeline layout"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("wgpu-dequant shaders/codebook"),
                source: wgpu::ShaderSource::Wgsl(SOURCE.into()),
            });
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("wgpu-dequant codebook"),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("codebook"),
                compilation_options: Default::default(),
                cache: None,
            });
            (layout, pipeline)
        })
    }
}

fn out_kind(d: OutDtype) -> u32 {
    match d {
        OutDtype::F32 => 0,
        OutDtype::Bf16 => 1,
        OutDtype::F16 => 2,
    }
}

/// The words of `src` for `job`, or `None` where the kernel does not take
/// it (slices, g_idx, positions past u32) or `cb` could compute an f32
/// subnormal on a device that flushes them (`flushes`: values under 2^-50).
fn src_words(job: &DecodeJob<'_>, cb: &Codebook<'_>, flushes: bool) -> Option<Vec<u32>> {
    let rows = job.dims.rows;
    if job.dims.slices != 1 || job.g_idx.is_some() || job.transposed || cb.regions.is_empty() {
        return None;
    }
    // A device that may flush f32 subnormals gets the job only where none
    // can arise: every value 0, not finite, or at least 2^-50 in magnitude
    // makes every sum or difference (a multiple of 2^-73) and every
    // product (2^-123 or more) normal.
    let normal = |x: f32| x == 0.0 || !x.is_finite() || x.abs() >= 2f32.powi(-50);
    let values_normal = |v: &Option<Values<'_>>| {
        v.as_ref().is_none_or(|v| {
            entries(v, rows, job.dims.cols).is_some_and(|n| (0..n).all(|i| normal(v.get(i))))
        })
    };
    if flushes
        && !(cb.table.iter().all(|&x| normal(x))
            && values_normal(&job.scale)
            && values_normal(&job.offset))
    {
        return None;
    }
    let u = |x: usize| u32::try_from(x).ok();
    let u64_ = |x: u64| u32::try_from(x).ok();
    let mut w = vec![0u32; HEADER + cb.regions.len() * REGION_WORDS];
    w[0] = u(job.dims.cols)?;
    w[1] = out_kind(job.out);
    w[2] = cb.arith.map_or(0, out_kind);
    w[14] = match cb.sum {
        Sum::Stepwise => 0,
        Sum::EmbeddingBag => 1,
    };
    w[5] = u(cb.regions.len())?;
    w[4] = u(w.len())?;
    w.extend(cb.table.iter().map(|x| x.to_bits()));
    w[3] = match &cb.col_map {
        None => NONE,
        Some(m) => {
            let at = u(w.len())?;
            w.extend(m.iter().copied());
            at
        }
    };
    for (h, values) in [(6usize, &job.scale), (10, &job.offset)] {
        w[h] = NONE;
        let Some(v) = values else { continue };
        let g = v.grid;
        // Entries the output's (row, col) reach: rows · cols at most.
        let n = entries(v, rows, job.dims.cols)?;
        w[h] = u(w.len())?;
        w[h + 1] = u(g.row_div.max(1))?;
        w[h + 2] = u(g.row_stride)?;
        w[h + 3] = u(g.col_div.max(1))?;
        w.extend((0..n).map(|i| v.get(i).to_bits()));
    }
    // Index bytes, each distinct tensor once, from a word boundary.
    let mut placed: Vec<(*const u8, usize, u32)> = Vec::new();
    for (ri, r) in cb.regions.iter().enumerate() {
        let rb = HEADER + ri * REGION_WORDS;
        if r.terms.len() > MAX_TERMS {
            return None;
        }
        let (tiles_r, tiles_c) = r.tiles(rows);
        w[rb] = u(r.start)?;
        w[rb + 1] = u(r.cols)?;
        w[rb + 2] = u(r.tile_rows)?;
        w[rb + 3] = u(r.tile_cols)?;
        w[rb + 4] = u(r.terms.len())?;
        for (ti, t) in r.terms.iter().enumerate() {
            let tb = rb + 8 + ti * TERM_WORDS;
            let data: &[u8] = &t.data;
            let key = (data.as_ptr(), data.len());
            let at = match placed.iter().find(|p| (p.0, p.1) == key) {
                Some(p) => p.2,
                None => {
                    let at = u(w.len())?;
                    w.extend(data.chunks(4).map(|c| {
                        let mut b = [0u8; 4];
                        b[..c.len()].copy_from_slice(c);
                        u32::from_le_bytes(b)
                    }));
                    // A word past the end: the shader may read it for a
                    // field that ends in the last word.
                    w.push(0);
                    placed.push((key.0, key.1, at));
                    at
                }
            };
            // Every position the shader computes fits u32.
            u64_(t.end_bit(tiles_r, tiles_c)?)?;
            let groups = tiles_c.div_ceil(t.group.max(1));
            let last = t.base as u64
                + ((groups as u64) * t.book as u64 + t.entries as u64)
                    * (r.tile_rows * r.tile_cols) as u64;
            u64_(last)?;
            w[tb] = at;
            w[tb + 1] = t.bits;
            w[tb + 2] = u64_(t.at)?;
            w[tb + 3] = u64_(t.row_bits)?;
            w[tb + 4] = u(t.group)?;
            w[tb + 5] = u64_(t.group_bits)?;
            w[tb + 6] = u64_(t.field_bits)?;
            w[tb + 7] = u(t.base)?;
            w[tb + 8] = u(t.book)?;
        }
    }
    Some(w)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Entries of `v`'s grid that outputs of `rows × cols` read (one slice).
fn entries(v: &Values<'_>, rows: usize, cols: usize) -> Option<usize> {
    let g = v.grid;
    let last_row = (rows.checked_sub(1)?) / g.row_div.max(1);
    let last_col = (cols.checked_sub(1)?) / g.col_div.max(1);
    last_row
        .checked_mul(g.row_stride)?
        .checked_add(last_col)?
        .checked_add(1)
}

impl GpuDecoder {
    /// Rows `rows` of codebook job `job` in a new buffer of
    /// [`OUTPUT_USAGE`](super::OUTPUT_USAGE) on this device; `None` where the
    /// kernel does not take the job (the CPU decodes it), a GPU-001 error
    /// where it does not fit the device's bindings.
    pub(super) async fn codebook_buffer(
        &self,
        job: &DecodeJob<'_>,
        cb: &Codebook<'_>,
        rows: Range<usize>,
    ) -> Result<Option<wgpu::Buffer>> {
        let Some(words) = src_words(job, cb, self.flushes) else {
            return Ok(None);
        };
        let src_bytes = words.len() as u64 * 4;
        let cols = job.dims.cols;
        let size = job.out.size();
        let out_bytes = (rows.len() * cols * size) as u64;
        let cap = self.limits.max_binding;
        // A dispatch's rows: within a binding, each dispatch's output from
        // an aligned offset (so whole words).
        let row_bytes = (cols * size) as u64;
        let align = self.limits.offset_align.max(4);
        let unit = align / gcd(row_bytes.max(1), align);
        let step = ((cap / row_bytes.max(1)) / unit * unit) as usize;
        if src_bytes > cap || step == 0 {
            return Err(gpu_err(format!(
                "a codebook job needs {src_bytes} bytes of description, table and indices in one binding and a row of {row_bytes} output bytes, beyond this device's {cap}-byte bindings"
            )));
        }
        let dest = self.output_buffer(out_bytes)?;
        self.dispatched[4].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (layout, pipeline) = self.codebook.get(&self.device);
        let buffer = self
            .scoped(async {
                let src = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgpu-dequant codebook src"),
                    size: src_bytes.max(4),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                self.queue
                    .write_buffer(&src, 0, bytemuck::cast_slice(&words));
                let mut first = rows.start;
                while first < rows.end {
                    let last = (first + step).min(rows.end);
                    let elements = (last - first) * cols;
                    let at = ((first - rows.start) * cols * size) as u64;
                    let bytes = (elements * size) as u64;
                    let out_words = bytes.div_ceil(4);
                    let groups = out_words.div_ceil(WORKGROUP as u64);
                    let max = self.limits.max_groups_per_dim.max(1) as u64;
                    let (gx, gy) = (groups.min(max), groups.div_ceil(max));
                    let params = Params {
                        first_row: u32::try_from(first).map_err(|_| gpu_err("row past u32"))?,
                        words: u32::try_from(out_words)
                            .map_err(|_| gpu_err("output past u32 words"))?,
                        stride: (gx * WORKGROUP as u64) as u32,
                        zero_bits: 0,
                        elements: u32::try_from(elements)
                            .map_err(|_| gpu_err("output past u32 elements"))?,
                        pad: [0; 3],
                    };
                    let uniform = self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("wgpu-dequant codebook params"),
                        size: std::mem::size_of::<Params>() as u64,
                        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    });
                    self.queue
                        .write_buffer(&uniform, 0, bytemuck::bytes_of(&params));
                    let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("wgpu-dequant codebook bindings"),
                        layout,
                        entries: &[
                            wgpu::BindGroupEntry {
                                binding: 0,
                                resource: uniform.as_entire_binding(),
                            },
                            wgpu::BindGroupEntry {
                                binding: 1,
                                resource: src.as_entire_binding(),
                            },
                            wgpu::BindGroupEntry {
                                binding: 2,
                                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                    buffer: &dest,
                                    offset: at,
                                    size: std::num::NonZeroU64::new(out_words * 4),
                                }),
                            },
                        ],
                    });
                    let mut encoder = self.encoder("wgpu-dequant codebook");
                    {
                        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some("wgpu-dequant codebook"),
                            timestamp_writes: None,
                        });
                        pass.set_pipeline(pipeline);
                        pass.set_bind_group(0, &bind, &[]);
                        pass.dispatch_workgroups(gx as u32, gy as u32, 1);
                    }
                    self.queue.submit([encoder.finish()]);
                    first = last;
                }
                Ok(dest)
            })
            .await?;
        Ok(Some(buffer))
    }
}
