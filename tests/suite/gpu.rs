//! The GPU backend gives the CPU backend's bytes: on every fixture, on
//! randomized jobs of every kind, through chunking, and for GPU-resident output.
//!
//! Without an adapter these tests pass vacuously and say so, unless
//! `WGPU_DEQUANT_REQUIRE_GPU=1` (set by CI), which turns a missing adapter
//! into a failure.

use crate::common::jobs::{for_random_jobs, normal, RandomJob, GRID_SIZES};
use crate::common::{adapter, check_case, fixtures, read_dir_tensors, Rng, CASES};
use wgpu_dequant::backend::gpu::{Gpu, GpuDecoder};
use wgpu_dequant::backend::{Backend, Cpu};
use wgpu_dequant::job::{DecodeJob, Dims, Fields, Grid, ValueKind, Values};
use wgpu_dequant::{dequantize, BackendChoice, DtypeChoice, Options, OutDtype};

#[test]
fn every_fixture_gpu_equals_cpu_and_digests() {
    if adapter().is_none() {
        return;
    }
    for case in CASES {
        for dtype in [OutDtype::Bf16, OutDtype::F16, OutDtype::F32] {
            let tmp = tempfile::tempdir().unwrap();
            let run = |backend, name: &str| {
                let out = tmp.path().join(name);
                let opts = Options {
                    dtype: DtypeChoice::Fixed(dtype),
                    backend,
                };
                dequantize(fixtures().join(case).join("model"), &out, &opts).unwrap();
                read_dir_tensors(&out)
            };
            let gpu = run(BackendChoice::Gpu, "gpu");
            let cpu = run(BackendChoice::Cpu, "cpu");
            assert_eq!(gpu, cpu, "{case} {dtype}: GPU and CPU differ");
        }
        // And straight against the producer's digests.
        check_case(
            case,
            DtypeChoice::Auto,
            BackendChoice::Gpu,
            "expected-bf16.digests.json",
            false,
        );
    }
}

/// Builds random storage, then the job over it, and checks GPU == CPU.
fn check_random(rng: &mut Rng, decoder: &GpuDecoder, d: Dims) {
    let r = RandomJob::new(rng, d, &GRID_SIZES);
    let (bits, padded, lane_bits, zero_mode, out) =
        (r.bits, r.padded, r.lane_bits, r.zero_mode, r.out);
    let job = r.job();
    let want = Cpu::new().decode(&job).unwrap();
    let mut got = vec![0u8; want.len()];
    decoder
        .decode_rows(&job, 0..d.total_rows(), &mut got)
        .unwrap();
    if got != want {
        let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        panic!("{d:?} bits {bits} padded {padded} lane_bits {lane_bits} zero {zero_mode} out {out}: first difference at byte {i}");
    }
    // A sub-range of rows, as the writer asks for.
    if d.total_rows() > 2 {
        let rows = 1..d.total_rows() - 1;
        let row_bytes = d.cols * out.size();
        let mut part = vec![0u8; rows.len() * row_bytes];
        decoder.decode_rows(&job, rows.clone(), &mut part).unwrap();
        assert_eq!(
            part,
            want[rows.start * row_bytes..rows.end * row_bytes],
            "{d:?}: row range"
        );
    }
}

#[test]
fn randomized_jobs_gpu_equals_cpu() {
    let Some(adapter) = adapter() else { return };
    let roomy = GpuDecoder::open(&adapter).unwrap();
    // Tiny limits: many chunks per job and 2-D dispatch grids. 16 KiB holds
    // the widest random row (300 columns with f32 scales, plain i32 zero
    // points, g_idx and both 256-entry tables), so every job can run.
    let cramped = GpuDecoder::open(&adapter).unwrap().with_limits(16 << 10, 2);
    for_random_jobs(300, &[300], |d, rng| check_random(rng, &roomy, d));
    for_random_jobs(150, &[300], |d, rng| check_random(rng, &cramped, d));
}

/// A 4-bit tensor whose f32 output (138 MB) is larger than one 128 MiB binding.
#[test]
fn output_larger_than_one_binding() {
    let Some(adapter) = adapter() else { return };
    let d = Dims {
        slices: 1,
        rows: 4224,
        cols: 8192,
    };
    let mut rng = Rng::new(7);
    let codes: Vec<u8> = (0..d.rows * d.cols / 2).map(|_| rng.next() as u8).collect();
    let scale: Vec<u8> = (0..d.rows * d.cols / 128)
        .flat_map(|_| ((normal(&mut rng, 8).to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let job = DecodeJob {
        dims: d,
        codes: Fields {
            data: (&codes[..]).into(),
            bits: 4,
            per_word: 0,
            lane_bits: d.cols as u64 * 4,
            word_bits: 32,
            slice_bits: (d.rows * d.cols) as u64 * 4,
        },
        code_values: (0..16).map(|v| v as f32 - 8.0).collect(),
        zero: None,
        scale: Some(Values {
            data: (&scale[..]).into(),
            kind: ValueKind::Bf16,
            grid: Grid {
                row_div: 1,
                col_div: 128,
                row_stride: d.cols / 128,
                slice_stride: 0,
            },
        }),
        g_idx: None,
        low_rank: None,
        out: OutDtype::F32,
    };
    assert!(job.out_bytes() > 128 << 20);
    let gpu = Gpu::open(&adapter).unwrap();
    let got = gpu.decode(&job).unwrap();
    let want = Cpu::new().decode(&job).unwrap();
    assert!(got == want, "GPU and CPU differ on the large tensor");
}

/// GPU-resident output: the buffer holds exactly the CPU bytes, also when it
/// is assembled from many chunks with an odd column count.
#[test]
fn decode_to_buffer_matches_cpu() {
    let Some(adapter) = adapter() else { return };
    let mut rng = Rng::new(99);
    let d = Dims {
        slices: 2,
        rows: 37,
        cols: 301,
    };
    let lane_words = (d.cols * 3).div_ceil(32);
    let codes: Vec<u8> = (0..d.slices * d.rows * lane_words * 4)
        .map(|_| rng.next() as u8)
        .collect();
    let scale: Vec<u8> = (0..d.slices * d.rows)
        .flat_map(|_| {
            half::f16::from_f32(normal(&mut rng, 6))
                .to_bits()
                .to_le_bytes()
        })
        .collect();
    for (limit, out) in [
        (1 << 30, OutDtype::Bf16),
        (4096, OutDtype::Bf16),
        (4096, OutDtype::F32),
        (2048, OutDtype::F16),
    ] {
        let job = DecodeJob {
            dims: d,
            codes: Fields {
                data: (&codes[..]).into(),
                bits: 3,
                per_word: 0,
                lane_bits: lane_words as u64 * 32,
                word_bits: 32,
                slice_bits: (d.rows * lane_words) as u64 * 32,
            },
            code_values: (0..8).map(|v| v as f32 - 4.0).collect(),
            zero: None,
            scale: Some(Values {
                data: (&scale[..]).into(),
                kind: ValueKind::F16,
                grid: Grid {
                    row_div: 1,
                    col_div: d.cols,
                    row_stride: 1,
                    slice_stride: d.rows,
                },
            }),
            g_idx: None,
            low_rank: None,
            out,
        };
        let decoder = GpuDecoder::open(&adapter)
            .unwrap()
            .with_limits(limit, 65535);
        let buffer = decoder.decode_to_buffer(&job).unwrap();
        let got = read_buffer(&decoder, &buffer);
        let want = Cpu::new().decode(&job).unwrap();
        assert_eq!(&got[..want.len()], &want[..], "limit {limit} {out}");
    }
}

fn read_buffer(decoder: &GpuDecoder, buffer: &wgpu::Buffer) -> Vec<u8> {
    let device = decoder.device();
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buffer, 0, &staging, 0, buffer.size());
    decoder.queue().submit([enc.finish()]);
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.unwrap());
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let bytes = staging.slice(..).get_mapped_range().unwrap().to_vec();
    staging.unmap();
    bytes
}

#[test]
fn explicit_gpu_backend_names_its_adapter() {
    let Some(adapter) = adapter() else { return };
    let gpu = Gpu::open(&adapter).unwrap();
    assert!(gpu.name().contains(&adapter.get_info().name));
}

/// Every shader in `shaders/` parses, validates, and translates with naga (the
/// translator wgpu itself runs) to what each native backend consumes: SPIR-V
/// for Vulkan, MSL for Metal, HLSL for DX12. The outputs are left in
/// `target/tmp/shaders/` for outside validators (CI runs `spirv-val` on the
/// SPIR-V: `.ci/portability`).
#[test]
fn shaders_translate_for_every_backend() {
    use naga::back::{hlsl, msl, spv};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("shaders");
    std::fs::create_dir_all(&out).unwrap();
    let mut translated = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "wgsl") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let source = std::fs::read_to_string(&path).unwrap();
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{name}.wgsl: {}", e.emit_to_string(&source)));
        // WebGPU's capabilities: what every backend must support.
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::default(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}.wgsl: {}", e.emit_to_string(&source)));

        let words = spv::write_vec(&module, &info, &spv::Options::default(), None)
            .unwrap_or_else(|e| panic!("{name}.wgsl to SPIR-V: {e}"));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(out.join(format!("{name}.spv")), bytes).unwrap();

        let (metal, _) = msl::write_string(
            &module,
            &info,
            &msl::Options::default(),
            &msl::PipelineOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{name}.wgsl to MSL: {e}"));
        std::fs::write(out.join(format!("{name}.metal")), metal).unwrap();

        let mut text = String::new();
        let options = hlsl::Options::default();
        let pipeline = hlsl::PipelineOptions::default();
        hlsl::Writer::new(&mut text, &options, &pipeline)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{name}.wgsl to HLSL: {e}"));
        std::fs::write(out.join(format!("{name}.hlsl")), text).unwrap();
        translated += 1;
    }
    assert!(translated > 0, "no shader found in {}", dir.display());
}
