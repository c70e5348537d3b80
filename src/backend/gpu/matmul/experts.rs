//! Routed experts in one call (llama.cpp's `mul_mat_id`): a stack's
//! experts resident together in one [`PackedLinear`], and
//! `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` for rows that go to different experts,
//! recorded into one encoder. The rows of x are gathered on the device
//! into one buffer, expert by expert, each expert's run multiplied by its
//! packs with the products' own kernels into the same rows of another,
//! and those scattered into their rows of y (shaders/gather.wgsl): a
//! row's result has the bits [`GpuDecoder::record_matmul`] gives it with
//! its expert alone.

use super::super::shader::buffer;
use super::{check_io, PackedLinear, Product};
use crate::backend::gpu::GpuDecoder;
use crate::error::{Error, Result, Rule};

const GATHER: &str = include_str!("../../../../shaders/gather.wgsl");

/// gather.wgsl's `Gather`.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GatherParams {
    len: u32,
    rows: u32,
    first: u32,
    scatter: u32,
}

/// Workgroups a copy of rows takes along a row, at most: each invocation
/// copies every `64·GROUPS`-th word of its row past them.
const GROUPS: u32 = 64;

/// gather.wgsl's pipeline and bindings.
pub(super) struct Gather {
    layout: wgpu::BindGroupLayout,
    pipeline: wgpu::ComputePipeline,
}

impl Gather {
    fn new(device: &wgpu::Device) -> Gather {
        let storage = |read_only| wgpu::BufferBindingType::Storage { read_only };
        let params = std::mem::size_of::<GatherParams>() as u64;
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("wgpu-dequant gather bindings"),
            entries: &[
                buffer(0, wgpu::BufferBindingType::Uniform, params),
                buffer(1, storage(true), 4),
                buffer(2, storage(true), 4),
                buffer(3, storage(false), 4),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("wgpu-dequant gather pipeline layout"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("wgpu-dequant shaders/gather.wgsl"),
            source: wgpu::ShaderSource::Wgsl(GATHER.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("wgpu-dequant copy_rows"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("copy_rows"),
            compilation_options: Default::default(),
            cache: None,
        });
        Gather { layout, pipeline }
    }
}

/// The rows of `ids` (one expert of `experts` for each of `m` rows) that
/// go to each expert, in expert order, experts without rows left out; the
/// reason when `ids` are not that.
pub(crate) fn rows_by_expert(
    ids: &[u32],
    m: usize,
    experts: usize,
) -> std::result::Result<Vec<(usize, Vec<usize>)>, String> {
    if ids.len() != m {
        return Err(format!("{} expert ids for {m} rows of x", ids.len()));
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= experts) {
        return Err(format!("has {experts} experts, not {}", id as u64 + 1));
    }
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by_key(|&r| ids[r]);
    Ok(order
        .chunk_by(|&a, &b| ids[a] == ids[b])
        .map(|rows| (ids[rows[0]] as usize, rows.to_vec()))
        .collect())
}

impl PackedLinear {
    /// `experts`, each `[n, k]`, as one stack (`what`: its name, for errors).
    pub(crate) fn stack(experts: Vec<PackedLinear>, what: &str) -> Result<PackedLinear> {
        let refuse = |detail: &str| Err(Error::new(Rule::Argument, what, detail.to_string()));
        let Some(first) = experts.first() else {
            return refuse("a stack of no experts");
        };
        let (n, k) = (first.n, first.k);
        if experts
            .iter()
            .any(|e| (e.n, e.k) != (n, k) || e.experts > 0)
        {
            return refuse("its experts are not all Linears of one shape");
        }
        Ok(PackedLinear {
            n,
            k,
            experts: experts.len(),
            parts: Vec::new(),
            bytes: experts.iter().map(|e| e.bytes).sum(),
            stack: experts,
        })
    }
}

impl GpuDecoder {
    /// Records `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` into `encoder` for the
    /// `ids.len()` rows of `x` (`[m, w.k]` f32) into `y` (`[m, w.n]`),
    /// `W[e]` expert `e` of stack `w` ([`crate::Model::upload_experts`]):
    /// each expert's rows gathered on the device, multiplied by it as
    /// [`GpuDecoder::record_matmul`] multiplies them (so each row's result
    /// is the one its expert gives it alone) and scattered into y. The
    /// buffers as [`GpuDecoder::record_matmul`] takes them.
    pub fn record_matmul_experts(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        w: &PackedLinear,
        x: &wgpu::Buffer,
        ids: &[u32],
        y: &wgpu::Buffer,
    ) -> Result<()> {
        let bare =
            |detail: String| Error::bare(Rule::Argument, format!("matmul_experts: {detail}"));
        if w.experts == 0 {
            return Err(bare(
                "not a stack of experts: record_matmul multiplies by it".into(),
            ));
        }
        let m = u32::try_from(ids.len()).map_err(|_| bare("too many rows of x".into()))?;
        check_io(w, (x, y, m))?;
        let groups = rows_by_expert(ids, ids.len(), w.experts).map_err(bare)?;
        if m == 0 || w.n == 0 || w.k == 0 {
            return Ok(());
        }
        let max = self.limits.max_groups_per_dim;
        if m > max {
            return Err(gpu_rows(m, max));
        }
        let gather = self.gemv.gather.get_or_init(|| Gather::new(&self.device));
        // Every row's index, expert by expert: each expert's a run.
        let order: Vec<u32> = groups
            .iter()
            .flat_map(|(_, rows)| rows.iter().map(|&r| r as u32))
            .collect();
        let idx = self.storage(
            "wgpu-dequant experts' rows",
            4 * m as u64,
            wgpu::BufferUsages::COPY_DST,
        );
        self.queue
            .write_buffer(&idx, 0, bytemuck::cast_slice(&order));
        // Every row of x gathered once in expert order, each expert's run
        // multiplied into the same rows of one y, scattered once: three
        // buffers and two copies a call, whatever the experts (a dispatch
        // and a buffer an expert each cost about a small product's time on
        // llvmpipe).
        let xe = self.storage(
            "wgpu-dequant experts' x",
            4 * m as u64 * w.k as u64,
            wgpu::BufferUsages::empty(),
        );
        let ye = self.storage(
            "wgpu-dequant experts' y",
            4 * m as u64 * w.n as u64,
            wgpu::BufferUsages::empty(),
        );
        let copy = |encoder: &mut wgpu::CommandEncoder,
                    (src, dst): (&wgpu::Buffer, &wgpu::Buffer),
                    len: usize,
                    scatter: bool| {
            let params = GatherParams {
                len: len as u32,
                rows: m,
                first: 0,
                scatter: scatter as u32,
            };
            let params = self.uniform("wgpu-dequant gather params", bytemuck::bytes_of(&params));
            let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("wgpu-dequant gather bindings"),
                layout: &gather.layout,
                entries: &[
                    entry(0, &params),
                    entry(1, &idx),
                    entry(2, src),
                    entry(3, dst),
                ],
            });
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgpu-dequant gather"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&gather.pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups((len as u32).div_ceil(64).min(GROUPS), m, 1);
        };
        copy(encoder, (x, &xe), w.k, false);
        let mut first = 0;
        for (e, rows) in &groups {
            let me = rows.len() as u32;
            let io = (&xe, &ye, me);
            self.record_product_at(encoder, &w.stack[*e], io, Product::Decoded, first)?;
            first += me;
        }
        copy(encoder, (&ye, y), w.n, true);
        Ok(())
    }

    /// `y[r] = x[r]·W[ids[r]]ᵀ (+ bias)` for the `m` rows of `x`
    /// (`[m, w.k]`), read back: [`GpuDecoder::record_matmul_experts`] for
    /// tests and simple apps, blocking.
    pub fn matmul_experts(
        &self,
        w: &PackedLinear,
        x: &[f32],
        m: usize,
        ids: &[u32],
    ) -> Result<Vec<f32>> {
        if ids.len() != m {
            let detail = format!("matmul_experts: {} expert ids for {m} rows of x", ids.len());
            return Err(Error::bare(Rule::Argument, detail));
        }
        pollster::block_on(self.matmul_experts_async(w, x, ids))
    }

    /// [`GpuDecoder::matmul_experts`] for the `ids.len()` rows of `x`,
    /// awaited (in a browser).
    pub async fn matmul_experts_async(
        &self,
        w: &PackedLinear,
        x: &[f32],
        ids: &[u32],
    ) -> Result<Vec<f32>> {
        let record = |encoder: &mut _, xs: &_, ys: &_, _| {
            self.record_matmul_experts(encoder, w, xs, ids, ys)
        };
        self.read_back_product(w, x, ids.len(), record).await
    }
}

/// Binding `binding`: all of `buffer`.
fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}

/// Rows of x past a device's workgroups a dimension.
fn gpu_rows(m: u32, max: u32) -> Error {
    super::gpu_err(format!(
        "matmul_experts: {m} rows of x exceed this device's {max} workgroups a dimension"
    ))
}

#[cfg(test)]
mod tests {
    use super::rows_by_expert;

    #[test]
    fn rows_grouped_by_expert_in_order() {
        let groups = rows_by_expert(&[3, 1, 3, 0, 1, 3], 6, 4).unwrap();
        assert_eq!(
            groups,
            vec![(0, vec![3]), (1, vec![1, 4]), (3, vec![0, 2, 5])]
        );
        assert!(rows_by_expert(&[4], 1, 4)
            .unwrap_err()
            .contains("has 4 experts, not 5"));
        assert!(rows_by_expert(&[0], 2, 4).is_err());
    }
}
