//! The decode kernels' shader module: its WGSL source, put together from
//! the fragments in `shaders/decode/` (one concern each, none too long to
//! read), and the bindings every kernel variant shares.

use super::layout;

/// The decode module's source: the fragments in their order (protocol.wgsl
/// says what each holds). Composed here and nowhere else; the products
/// (matmul/) append their own files to it. `concat!` of `include_str!`s
/// keeps it one `&'static str` built at compile time, on the web too.
pub(super) const SHADER: &str = concat!(
    include_str!("../../../shaders/decode/protocol.wgsl"),
    include_str!("../../../shaders/decode/numbers.wgsl"),
    include_str!("../../../shaders/decode/reads.wgsl"),
    include_str!("../../../shaders/decode/generic.wgsl"),
    include_str!("../../../shaders/decode/fast.wgsl"),
    include_str!("../../../shaders/decode/tile.wgsl"),
);

/// The decode kernels' module, from which every variant's pipeline is built.
pub(super) fn module(device: &wgpu::Device) -> wgpu::ShaderModule {
    device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("wgpu-dequant shaders/decode"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    })
}

/// The bindings of the decode module's group 0 (protocol.wgsl's).
pub(super) const PARAMS: u32 = 0;
pub(super) const SRC: u32 = 1;
pub(super) const DST: u32 = 2;

/// The one group every kernel variant binds. Stated once rather than
/// derived from each pipeline: every variant shares it, bind groups need no
/// pipeline, and a shader whose bindings drift from it fails when its
/// pipeline is built.
pub(super) fn bind_group_layout(device: &wgpu::Device) -> wgpu::BindGroupLayout {
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("wgpu-dequant bindings"),
        entries: &[
            // `p`: the chunk's layout::Params, rewritten before each dispatch.
            buffer(
                PARAMS,
                wgpu::BufferBindingType::Uniform,
                std::mem::size_of::<layout::Params>() as u64,
            ),
            // `src`: everything the chunk reads (code, zero-point and scale
            // bytes, tables, g_idx) as one word array, laid out by layout::plan.
            buffer(SRC, wgpu::BufferBindingType::Storage { read_only: true }, 4),
            // `dst`: output words, from the slot's own buffer or from an
            // aligned offset into the app's (Params::out_base skips the rest).
            buffer(
                DST,
                wgpu::BufferBindingType::Storage { read_only: false },
                4,
            ),
        ],
    })
}

/// A compute kernel's buffer binding of at least `min_size` bytes.
pub(super) fn buffer(
    binding: u32,
    ty: wgpu::BufferBindingType,
    min_size: u64,
) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: std::num::NonZeroU64::new(min_size),
        },
        count: None,
    }
}
