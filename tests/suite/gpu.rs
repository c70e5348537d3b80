//! The GPU backend gives the CPU backend's bytes: on every fixture, on
//! randomized jobs of every kind, through chunking, and for GPU-resident output.
//!
//! Each test but the shader translation runs through `common::gpu_test`:
//! without an adapter it does not run, and is counted in the line the run
//! ends with; `WGPU_DEQUANT_REQUIRE_GPU=1` (set by CI) makes it fail instead.

use crate::common::jobs::{for_random_jobs, normal, RandomJob, GRID_SIZES, WHOLE_WORD_SIZES};
use crate::common::{auto_digests, check_case, fixtures, gpu_test, read_dir_tensors, Rng, CASES};
use wgpu_dequant::backend::gpu::{Dispatches, Gpu, GpuDecoder};
use wgpu_dequant::backend::{Backend, Cpu};
use wgpu_dequant::job::{DecodeJob, Dims, Fields, Grid, ValueKind, Values};
use wgpu_dequant::{dequantize, BackendChoice, DtypeChoice, Model, Options, OutDtype};

#[test]
fn every_fixture_gpu_equals_cpu_and_digests() {
    gpu_test(|_| {
        for case in CASES {
            // bf16 (the fixtures' own dtype) is checked below, against the digests.
            for dtype in [OutDtype::F16, OutDtype::F32] {
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
                auto_digests(case),
                false,
            );
        }
    });
}

/// Every fixture tensor by tensor on the GPU: the CPU's bytes, through the
/// fast kernels for every 4- and 8-bit format (SVDQuant's main term and
/// low-rank branch included), the tile kernel for the transposed ones
/// (AutoAWQ, GPT-OSS); the 3-bit packs and ModelOpt's INT4 AWQ take the
/// generic kernel.
#[test]
fn fixtures_take_the_fast_kernels() {
    gpu_test(|adapter| {
        let gpu = Gpu::open(&adapter).unwrap();
        let cases = CASES
            .iter()
            .copied()
            .chain(["svdq-int4-g64-logical", "svdq-fp4-g16-packed"]);
        for case in cases {
            let model =
                Model::open(fixtures().join(case).join("model"), DtypeChoice::Auto).unwrap();
            let before = gpu.decoder().dispatches();
            for t in model.tensors() {
                let got = model.decode_on(&t.name, &gpu).unwrap();
                let want = model.decode(&t.name, BackendChoice::Cpu).unwrap();
                assert!(got == want, "{case} {}: GPU and CPU differ", t.name);
            }
            let after = gpu.decoder().dispatches();
            let ran = (
                after.fast - before.fast,
                after.generic - before.generic,
                after.tiled - before.tiled,
            );
            // 3-bit packs, ModelOpt's INT4 AWQ (codes packed down the rows,
            // some with the pre-quant smoothing) and sparse codes (read
            // through a bitmask) take the generic kernel; packs along the
            // input dimension (AutoAWQ, GPT-OSS transposed, GPTQ strided)
            // the tile kernel.
            // BitNet's codes lie a byte apart, four rows to a byte.
            let generic =
                case.contains("w3a16") || case.contains("sparse") || case.starts_with("bitnet");
            if case.starts_with("autoround") && !case.contains("fp") {
                // AutoRound's GPTQ and AWQ packs take the tile kernel, its
                // 3-, 5-, 6- and 7-bit modules (none in the AWQ export) the
                // generic one (the 5-bit export has no other).
                let tile = !case.ends_with("w567-asym");
                assert!(
                    ran.0 == 0 && (ran.2 > 0) == tile && (ran.1 > 0) != case.contains("awq"),
                    "{case}: ran {ran:?}, wanted the tile kernel (and the generic one at 3, 5, 6, 7 bits)"
                );
            } else if case.starts_with("gemma") {
                // Gemma's fixture is all edges: odd widths (63 columns,
                // rows ending in padding fields) and int2 take the generic
                // kernel, o_proj's 112 int4 columns the fast one.
                assert!(
                    ran.0 > 0 && ran.1 > 0 && ran.2 == 0,
                    "{case}: ran {ran:?}, wanted the fast and the generic kernels"
                );
            } else if case.starts_with("vptq") || case.starts_with("aqlm") {
                let codebook = after.codebook - before.codebook;
                assert!(
                    ran == (0, 0, 0) && codebook > 0 && after.cpu == before.cpu,
                    "{case}: ran {ran:?}, {codebook} codebook calls, wanted the codebook kernel alone"
                );
            } else if generic || case.starts_with("modelopt") && case.ends_with("awq") {
                assert!(
                    ran.0 == 0 && ran.1 > 0 && ran.2 == 0,
                    "{case}: ran {ran:?}, wanted the generic kernel"
                );
            } else if case.starts_with("hqq") || case.starts_with("sinq") {
                // HQQ's (and SINQ's) packs put P rows in a byte, high bits
                // first, and 3bit_32 ten rows an int32 (lanes in parts):
                // the generic kernel; its 8-bit packs are plain bytes.
                assert!(
                    ran.1 > 0 && ran.2 == 0,
                    "{case}: ran {ran:?}, wanted the generic kernel"
                );
            } else if case.starts_with("awq")
                || case.starts_with("gpt-oss")
                || case.starts_with("gptq")
            {
                assert!(
                    ran.0 == 0 && ran.1 == 0 && ran.2 > 0,
                    "{case}: ran {ran:?}, wanted the tile kernel"
                );
            } else {
                assert!(
                    ran.0 > 0 && ran.1 == 0 && ran.2 == 0,
                    "{case}: ran {ran:?}, wanted the fast kernels"
                );
            }
        }
    });
}

/// The writer decoding one piece ahead on a second thread (what a hardware
/// GPU gets, here through the decoder itself, which always decodes ahead):
/// every fixture's files hold the CPU's bytes.
#[test]
fn writing_with_decode_ahead_gives_the_cpus_files() {
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        assert!(decoder.decodes_ahead());
        let tmp = tempfile::tempdir().unwrap();
        for case in CASES {
            let ckpt = wgpu_dequant::Checkpoint::open(fixtures().join(case).join("model")).unwrap();
            let plan =
                wgpu_dequant::Plan::build(&ckpt, DtypeChoice::Auto, wgpu_dequant::Names::Hub)
                    .unwrap();
            let (ahead, cpu) = (
                tmp.path().join(format!("{case}-gpu")),
                tmp.path().join(format!("{case}-cpu")),
            );
            wgpu_dequant::writer::write(&plan, &decoder, &ahead, |_| {}).unwrap();
            wgpu_dequant::writer::write(&plan, &Cpu::new(), &cpu, |_| {}).unwrap();
            assert!(read_dir_tensors(&ahead) == read_dir_tensors(&cpu), "{case}");
        }
    });
}

/// Checks GPU == CPU on the job of `r`, whole and on a range of rows.
fn check_job(r: &RandomJob, decoder: &GpuDecoder) {
    let job = r.job();
    let (d, out) = (job.dims, r.out);
    let want = Cpu::new().decode(&job).unwrap();
    let mut got = vec![0u8; want.len()];
    decoder
        .decode_rows(&job, 0..d.total_rows(), &mut got)
        .unwrap();
    if got != want {
        let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        panic!("{}: first difference at byte {i}", r.describe());
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

/// Random jobs of every kind, through whichever kernel takes them, and all
/// of them through the generic kernel alone.
#[test]
fn randomized_jobs_gpu_equals_cpu() {
    gpu_test(|adapter| {
        let roomy = GpuDecoder::open(&adapter).unwrap();
        // Tiny limits: many chunks per job and 2-D dispatch grids. 16 KiB holds
        // the widest random row (300 columns with f32 scales, plain i32 zero
        // points, g_idx and both 256-entry tables), so every job can run.
        let cramped = GpuDecoder::open(&adapter).unwrap().with_limits(16 << 10, 2);
        let generic = GpuDecoder::open(&adapter)
            .unwrap()
            .generic_only()
            .with_workgroup_size(64);
        for (decoder, cases) in [(&roomy, 300), (&cramped, 150), (&generic, 150)] {
            for_random_jobs(cases, &[300], |d, rng| {
                let mut r = match rng.below(6) {
                    0 => RandomJob::in_parts(rng, d, &GRID_SIZES),
                    _ => RandomJob::new(rng, d, &GRID_SIZES),
                };
                // A transposed chunk binds whole stored slices, more than 16 KiB
                // for the largest random ones.
                r.transposed &= !std::ptr::eq(decoder, &cramped);
                check_job(&r, decoder)
            });
        }
        let ran = generic.dispatches();
        assert!(ran.fast == 0 && ran.generic > 0, "generic_only ran {ran:?}");
        let ran = roomy.dispatches();
        assert!(ran.fast > 0 && ran.generic > 0, "random jobs ran {ran:?}");
    });
}

/// The fast kernels on random jobs aimed at them: the CPU's bytes, to host
/// memory and into a GPU buffer, and the kernel that ran is the one the job
/// calls for. Tiny limits put chunk
/// boundaries inside slices and rows inside 2-D dispatch grids.
#[test]
fn fast_kernels_equal_cpu_and_run_where_they_apply() {
    gpu_test(|adapter| {
        // Small workgroups: an 8-bit table takes several loads per invocation.
        let roomy = GpuDecoder::open(&adapter).unwrap().with_workgroup_size(32);
        let cramped = GpuDecoder::open(&adapter).unwrap().with_limits(4 << 10, 2);
        let (fast, generic) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        for decoder in [&roomy, &cramped] {
            for_random_jobs(200, &[8, 300], |d, rng| {
                let r = RandomJob::aimed_at_fast_kernels(rng, d);
                let before = decoder.dispatches();
                check_job(&r, decoder);
                // And resident: chunks written straight into one buffer, at
                // offsets no binding can start at.
                let job = r.job();
                let want = Cpu::new().decode(&job).unwrap();
                let buffer = decoder.decode_to_buffer(&job).unwrap();
                let got = decoder.read_back(&buffer).unwrap();
                assert!(
                    got[..want.len()] == want[..],
                    "{}: decode_to_buffer",
                    r.describe()
                );
                let after = decoder.dispatches();
                if routed_to_cpu(&job, before, after) {
                    return;
                }
                let ran = (after.fast - before.fast, after.generic - before.generic);
                if r.fast_eligible() {
                    assert!(
                        ran.0 > 0 && ran.1 == 0,
                        "{}: ran {ran:?}, wanted the fast kernel",
                        r.describe()
                    );
                    fast.set(fast.get() + 1);
                } else {
                    assert!(
                        ran.0 == 0 && ran.1 > 0,
                        "{}: ran {ran:?}, wanted the generic kernel",
                        r.describe()
                    );
                    generic.set(generic.get() + 1);
                }
            });
        }
        let (fast, generic) = (fast.get(), generic.get());
        assert!(fast > 200 && generic > 50, "fast {fast} generic {generic}");
    });
}

/// The tile kernel on random jobs aimed at it (transposed and strided,
/// partial tiles and words, 3-D, g_idx, zero points along columns): the
/// CPU's bytes, to host memory and into a GPU buffer, through the tile
/// kernel wherever it applies. Tight limits put chunk boundaries inside
/// slices and tiles into 2-D dispatch grids.
#[test]
fn tile_kernel_equals_cpu_and_runs_where_it_applies() {
    gpu_test(|adapter| {
        let roomy = GpuDecoder::open(&adapter).unwrap();
        let small_groups = GpuDecoder::open(&adapter).unwrap().with_workgroup_size(64);
        // 32 KiB holds a whole stored slice of any of these jobs (what a
        // transposed or strided chunk binds) but not its f32 output.
        let cramped = GpuDecoder::open(&adapter).unwrap().with_limits(32 << 10, 8);
        let (tiled, generic) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        for (decoder, sizes, cases) in [
            (&roomy, &GRID_SIZES, 150),
            (&small_groups, &GRID_SIZES, 60),
            (&cramped, &WHOLE_WORD_SIZES, 100),
        ] {
            for_random_jobs(cases, &[8, 300], |d, rng| {
                let r = RandomJob::aimed_at_tile_kernel(rng, d, sizes);
                let before = decoder.dispatches();
                check_job(&r, decoder);
                let job = r.job();
                let want = Cpu::new().decode(&job).unwrap();
                let buffer = decoder.decode_to_buffer(&job).unwrap();
                let got = decoder.read_back(&buffer).unwrap();
                assert!(
                    got[..want.len()] == want[..],
                    "{}: decode_to_buffer",
                    r.describe()
                );
                let after = decoder.dispatches();
                if routed_to_cpu(&job, before, after) {
                    return;
                }
                let ran = (
                    after.fast - before.fast,
                    after.generic - before.generic,
                    after.tiled - before.tiled,
                );
                if r.tile_eligible() {
                    assert!(
                        ran.0 == 0 && ran.1 == 0 && ran.2 > 0,
                        "{}: ran {ran:?}, wanted the tile kernel",
                        r.describe()
                    );
                    tiled.set(tiled.get() + 1);
                } else {
                    assert!(
                        ran.1 > 0 && ran.2 == 0,
                        "{}: ran {ran:?}, wanted the generic kernel",
                        r.describe()
                    );
                    generic.set(generic.get() + 1);
                }
            });
        }
        let (tiled, generic) = (tiled.get(), generic.get());
        assert!(
            tiled > 150 && generic > 20,
            "tiled {tiled} generic {generic}"
        );
    });
}

/// Whether `job` went to the CPU between `before` and `after`: only where
/// the device may flush subnormals (a hardware GPU) and the job could
/// compute one.
fn routed_to_cpu(job: &DecodeJob<'_>, before: Dispatches, after: Dispatches) -> bool {
    let routed = after.cpu > before.cpu;
    assert!(
        !routed || !job.stays_normal(0..job.dims.total_rows()),
        "a job that stays normal went to the CPU"
    );
    routed
}

/// Where a device may flush subnormals (forced here on any adapter), a job
/// that could compute one is decoded on the CPU and the others on the GPU,
/// with the CPU's bytes either way: an int4 job with one e8m0 scale of
/// 2^-127 (byte 0, an f32 subnormal) or 2^-126 (times a code of 1: too
/// close) goes to the CPU, with 2^-125 or 2^-100 to the GPU; random jobs
/// go where `DecodeJob::stays_normal` says, some each way.
#[test]
fn subnormals_are_decoded_on_the_cpu_where_the_device_may_flush() {
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap().flushing_subnormals();
        let decodes = |job: &DecodeJob<'_>| {
            let before = decoder.dispatches();
            let want = Cpu::new().decode(job).unwrap();
            let mut got = vec![0u8; want.len()];
            decoder
                .decode_rows(job, 0..job.dims.total_rows(), &mut got)
                .unwrap();
            let resident = decoder.decode_to_buffer(job).unwrap();
            let resident = decoder.read_back(&resident).unwrap();
            assert!(got == want && resident[..want.len()] == want[..]);
            let after = decoder.dispatches();
            let on_cpu = after.cpu - before.cpu;
            assert!(on_cpu == 0 || on_cpu == 2, "{on_cpu} of 2 calls on the CPU");
            on_cpu == 2
        };
        let d = Dims {
            slices: 1,
            rows: 4,
            cols: 256,
        };
        let (codes, _) = int4_storage(d);
        let e8m0: [f32; 256] = std::array::from_fn(|b| match b {
            0 => f32::from_bits(0x0040_0000),
            255 => f32::NAN,
            b => f32::from_bits((b as u32) << 23),
        });
        for (byte, cpu) in [(0u8, true), (1, true), (2, false), (27, false)] {
            let mut scales = [127u8; 8];
            scales[5] = byte;
            let mut job = int4_job(d, &codes, &[], OutDtype::Bf16);
            job.scale = Some(Values {
                data: scales.as_slice().into(),
                kind: ValueKind::Table(Box::new(e8m0)),
                grid: Grid {
                    row_div: 1,
                    col_div: 128,
                    row_stride: 2,
                    slice_stride: 0,
                },
            });
            assert_eq!(decodes(&job), cpu, "e8m0 scale byte {byte}");
        }
        let (cpu, gpu) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        for_random_jobs(150, &[300], |d, rng| {
            let r = RandomJob::new(rng, d, &GRID_SIZES);
            let job = r.job();
            let on_cpu = decodes(&job);
            assert_eq!(on_cpu, !job.stays_normal(0..d.total_rows()));
            let count = if on_cpu { &cpu } else { &gpu };
            count.set(count.get() + 1);
        });
        let (cpu, gpu) = (cpu.get(), gpu.get());
        assert!(
            cpu > 5 && gpu > 50,
            "random jobs: {cpu} on the CPU, {gpu} on the GPU"
        );
    });
}

/// Random int4 g128 storage for `d`: (codes, bf16 scales).
fn int4_storage(d: Dims) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng::new(7);
    let codes: Vec<u8> = (0..d.rows * d.cols / 2).map(|_| rng.next() as u8).collect();
    let scale: Vec<u8> = (0..d.rows * d.cols.div_ceil(128))
        .flat_map(|_| ((normal(&mut rng, 8).to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    (codes, scale)
}

/// The int4 g128 job over [`int4_storage`].
fn int4_job<'a>(d: Dims, codes: &'a [u8], scale: &'a [u8], out: OutDtype) -> DecodeJob<'a> {
    DecodeJob {
        dims: d,
        codes: Fields {
            data: codes.into(),
            bits: 4,
            per_word: 0,
            interleaved: false,
            lane_bits: d.cols as u64 * 4,
            word_bits: 32,
            slice_bits: (d.rows * d.cols) as u64 * 4,
            high_first: false,
            blocks: None,
            parts: None,
        },
        code_values: (0..16).map(|v| v as f32 - 8.0).collect(),
        zero: None,
        scale: Some(Values {
            data: scale.into(),
            kind: ValueKind::Bf16,
            grid: Grid {
                row_div: 1,
                col_div: 128,
                row_stride: d.cols.div_ceil(128),
                slice_stride: 0,
            },
        }),
        g_idx: None,
        low_rank: None,
        post_scale: None,
        offset: None,
        product: Default::default(),
        sparse: None,
        transposed: false,
        out,
        codebook: None,
    }
}

/// A 4-bit tensor whose f32 output (138 MB) is larger than one 128 MiB binding.
const LARGE: Dims = Dims {
    slices: 1,
    rows: 4224,
    cols: 8192,
};

/// [`LARGE`] decoded in several bindings.
#[test]
fn output_larger_than_one_binding() {
    gpu_test(|adapter| {
        let d = LARGE;
        let (codes, scale) = int4_storage(d);
        let job = int4_job(d, &codes, &scale, OutDtype::F32);
        assert!(job.out_bytes() > 128 << 20);
        let gpu = Gpu::open(&adapter).unwrap();
        let got = gpu.decode(&job).unwrap();
        let want = Cpu::new().decode(&job).unwrap();
        assert!(got == want, "GPU and CPU differ on the large tensor");
    });
}

/// On a device with WebGPU's default limits (what browsers on real GPUs
/// often give: 128 MiB per binding, 256 MiB per buffer) every kind of job
/// still gives the CPU's bytes, and a tensor larger than one buffer is
/// refused with an error of this call, not a device error.
#[test]
fn webgpu_default_limits() {
    gpu_test(|adapter| {
        let desc = wgpu::DeviceDescriptor {
            required_limits: wgpu::Limits::default(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
        let decoder = GpuDecoder::new(&device, &queue);
        assert_eq!(device.limits().max_storage_buffer_binding_size, 128 << 20);
        for_random_jobs(60, &[300], |d, rng| {
            check_job(&RandomJob::new(rng, d, &GRID_SIZES), &decoder);
            check_job(&RandomJob::aimed_at_fast_kernels(rng, d), &decoder);
        });
        let d = LARGE;
        let (codes, scale) = int4_storage(d);
        let job = int4_job(d, &codes, &scale, OutDtype::F32);
        let got = decoder.decode(&job).unwrap();
        assert!(got == Cpu::new().decode(&job).unwrap(), "the 138 MB tensor");
        let d = Dims { rows: 8200, ..d };
        let (codes, scale) = int4_storage(d);
        let job = int4_job(d, &codes, &scale, OutDtype::F32);
        assert!(job.out_bytes() as u64 > device.limits().max_buffer_size);
        let e = decoder.decode_to_buffer(&job).unwrap_err();
        assert_eq!(e.rule, wgpu_dequant::Rule::Gpu, "{e}");
        assert!(e.to_string().contains("one buffer"), "{e}");
    });
}

/// GPU-resident output: the buffer holds exactly the CPU bytes, also when it
/// is assembled from many chunks with an odd column count.
#[test]
fn decode_to_buffer_matches_cpu() {
    gpu_test(|adapter| {
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
                    interleaved: false,
                    lane_bits: lane_words as u64 * 32,
                    word_bits: 32,
                    slice_bits: (d.rows * lane_words) as u64 * 32,
                    high_first: false,
                    blocks: None,
                    parts: None,
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
                post_scale: None,
                offset: None,
                product: Default::default(),
                sparse: None,
                transposed: false,
                out,
                codebook: None,
            };
            let decoder = GpuDecoder::open(&adapter)
                .unwrap()
                .with_limits(limit, 65535);
            let buffer = decoder.decode_to_buffer(&job).unwrap();
            let got = decoder.read_back(&buffer).unwrap();
            let want = Cpu::new().decode(&job).unwrap();
            assert_eq!(&got[..want.len()], &want[..], "limit {limit} {out}");
        }
    });
}

#[test]
fn explicit_gpu_backend_names_its_adapter() {
    gpu_test(|adapter| {
        let gpu = Gpu::open(&adapter).unwrap();
        assert!(gpu.name().contains(&adapter.get_info().name));
    });
}

/// Every module the host builds from `shaders/` (the decode kernels'; the
/// products', with and without subgroups) parses, validates, and
/// translates with naga (the translator wgpu itself runs) to what each
/// native backend consumes: SPIR-V for Vulkan, MSL for Metal, HLSL for
/// DX12. The outputs are left in `target/tmp/shaders/` for outside
/// validators (CI runs `spirv-val` on the SPIR-V: `.ci/portability`).
#[test]
fn shaders_translate_for_every_backend() {
    use naga::back::{hlsl, msl, spv};
    use naga::valid::Capabilities;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("shaders");
    std::fs::create_dir_all(&out).unwrap();
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    // The decode module's fragments, in the order the host puts them
    // together (src/backend/gpu/shader.rs).
    let fragments = ["protocol", "numbers", "reads", "generic", "fast", "tile"];
    let decode_source = || {
        fragments
            .map(|f| read(&format!("decode/{f}.wgsl")))
            .concat()
    };
    // The products' fragments, in the order the host puts them together
    // (src/backend/gpu/matmul/mod.rs), after the decode module's.
    let matmul = ["gemv", "rows", "others"];
    let products = |entries: &str| {
        decode_source()
            + &matmul.map(|f| read(&format!("matmul/{f}.wgsl"))).concat()
            + &read(entries)
    };
    // (name, source, capabilities beyond WebGPU's, the entry points to build).
    let decode: &[&str] = &["main", "fast", "fast_t"];
    let gemv: &[&str] = &["gemv", "gemv_rows", "gemv_t", "gemv_dense"];
    let modules = [
        ("decode", decode_source(), Capabilities::default(), decode),
        (
            "matmul",
            products("no_subgroups.wgsl"),
            Capabilities::default(),
            gemv,
        ),
        (
            "matmul-subgroups",
            products("subgroups.wgsl"),
            Capabilities::SUBGROUP,
            gemv,
        ),
        // Routed experts' rows (src/backend/gpu/matmul/experts.rs).
        (
            "gather",
            read("gather.wgsl"),
            Capabilities::default(),
            &["copy_rows"],
        ),
        // Vector codebooks (src/backend/gpu/codebook.rs): the encodings,
        // then the kernel.
        (
            "codebook",
            read("decode/numbers.wgsl") + &read("codebook.wgsl"),
            Capabilities::default(),
            &["codebook"],
        ),
    ];
    // Every file is part of a module.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            [
                "decode",
                "matmul",
                "no_subgroups.wgsl",
                "subgroups.wgsl",
                "gather.wgsl",
                "codebook.wgsl"
            ]
            .contains(&file.as_str()),
            "shaders/{file} is in no module this test builds"
        );
    }
    for entry in std::fs::read_dir(dir.join("decode")).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            fragments.map(|f| format!("{f}.wgsl")).contains(&file),
            "shaders/decode/{file} is in no module this test builds"
        );
    }
    for entry in std::fs::read_dir(dir.join("matmul")).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            matmul.map(|f| format!("{f}.wgsl")).contains(&file),
            "shaders/matmul/{file} is in no module this test builds"
        );
    }
    for (name, source, capabilities, entries) in modules {
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&source)));
        // WebGPU's capabilities (what every backend must support), and
        // subgroups where the host uses them.
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), capabilities)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&source)));
        let subgroups = capabilities.contains(Capabilities::SUBGROUP);

        // Each entry point with each value of the override constants the
        // host sets (layout::Fast), as a pipeline would compile it. The
        // values are the shader's own named constants (a unit test in
        // layout/protocol.rs holds the host's enums to them), so a value
        // added there is compiled here too.
        let mut small = naga::back::PipelineConstants::default();
        small.insert("WG".to_string(), 64.0);
        let mut variants = vec![
            ("main".to_string(), naga::back::PipelineConstants::default()),
            ("main-wg64".to_string(), small),
            // Routed experts' copies of rows: no constants.
            (
                "copy_rows".to_string(),
                naga::back::PipelineConstants::default(),
            ),
            // The codebook kernel: no constants.
            (
                "codebook".to_string(),
                naga::back::PipelineConstants::default(),
            ),
        ];
        let sets = fast_variants(&module).into_iter().map(|set| ("fast", set));
        let sets = sets.chain(
            tile_variants(&module)
                .into_iter()
                .map(|set| ("fast_t", set)),
        );
        let sets = sets.chain(gemv_variants(&module).into_iter().map(|set| ("gemv", set)));
        // The same on a GPU: a row of W per 64 invocations, fetching one
        // or two words at a time.
        let sets = sets.chain(
            gemv_variants(&module)
                .into_iter()
                .enumerate()
                .map(|(i, set)| {
                    let row = |(k, v)| match k {
                        "GEMV_ROWS" => (k, 4),
                        "RB" => (k, 1),
                        _ => (k, v),
                    };
                    // Scales read once a row, or stepped word by word.
                    let fetch = [("UNROLL", [2, 1][i % 2]), ("RELOAD", [0, 1][i / 2 % 2])];
                    ("gemv_rows", set.into_iter().map(row).chain(fetch).collect())
                }),
        );
        let sets = sets.chain(
            gemv_t_variants(&module)
                .into_iter()
                .map(|set| ("gemv_t", set)),
        );
        // The bench's dense baseline, with one and eight rows of x, its
        // words read one or four at a time.
        let sets = sets.chain(
            [(1, 1), (8, 1), (1, 4), (8, 4)]
                .into_iter()
                .filter(|_| module.entry_points.iter().any(|e| e.name == "gemv_dense"))
                .map(|(mt, wide)| {
                    (
                        "gemv_dense",
                        vec![("WG", 256), ("GEMV_ROWS", 4), ("MT", mt), ("WIDE", wide)],
                    )
                }),
        );
        // With subgroups, each product also as a CPU adapter runs it: an
        // invocation a block of rows, x shared across the subgroup.
        let sets = sets.flat_map(|(entry, set)| {
            let rb = set.iter().find(|(k, _)| *k == "RB").map_or(1, |&(_, v)| v);
            let shared = [("WG", 64), ("GEMV_ROWS", 64 * rb), ("SHARE_X", 1)];
            let shared = (subgroups && entry.starts_with("gemv") && entry != "gemv_rows")
                .then(|| (entry, set.iter().copied().chain(shared).collect()));
            std::iter::once((entry, set)).chain(shared)
        });
        for (entry, set) in sets {
            let mut constants = naga::back::PipelineConstants::default();
            let mut variant = entry.to_string();
            for (k, v) in set {
                constants.insert(k.to_string(), v as f64);
                variant += &format!("-{}{v}", k.to_lowercase());
            }
            variants.push((variant, constants));
        }
        for (variant, constants) in &variants {
            let entry = variant.split('-').next().unwrap();
            if !entries.contains(&entry) || !module.entry_points.iter().any(|e| e.name == entry) {
                continue;
            }
            let stage = Some((naga::ShaderStage::Compute, entry));
            let (module, info) =
                naga::back::pipeline_constants::process_overrides(&module, &info, stage, constants)
                    .unwrap_or_else(|e| panic!("{name} {variant}: {e}"));
            let (module, info) = (module.as_ref(), info.as_ref());
            let file = format!("{name}.{variant}");

            // Subgroup operations need SPIR-V 1.3 (Vulkan 1.1).
            let options = spv::Options {
                lang_version: if subgroups {
                    (1, 3)
                } else {
                    spv::Options::default().lang_version
                },
                ..Default::default()
            };
            let words = spv::write_vec(module, info, &options, None)
                .unwrap_or_else(|e| panic!("{file} to SPIR-V: {e}"));
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            std::fs::write(out.join(format!("{file}.spv")), bytes).unwrap();

            // And MSL 2.1 and HLSL's shader model 6.
            let options = msl::Options {
                lang_version: if subgroups {
                    (2, 1)
                } else {
                    msl::Options::default().lang_version
                },
                ..Default::default()
            };
            let (metal, _) =
                msl::write_string(module, info, &options, &msl::PipelineOptions::default())
                    .unwrap_or_else(|e| panic!("{file} to MSL: {e}"));
            std::fs::write(out.join(format!("{file}.metal")), metal).unwrap();

            let mut text = String::new();
            let options = hlsl::Options {
                shader_model: if subgroups {
                    hlsl::ShaderModel::V6_0
                } else {
                    hlsl::Options::default().shader_model
                },
                ..Default::default()
            };
            let pipeline = hlsl::PipelineOptions::default();
            hlsl::Writer::new(&mut text, &options, &pipeline)
                .write(module, info, None)
                .unwrap_or_else(|e| panic!("{file} to HLSL: {e}"));
            std::fs::write(out.join(format!("{file}.hlsl")), text).unwrap();
        }
        let built = variants
            .iter()
            .filter(|(v, _)| entries.contains(&v.split('-').next().unwrap_or("")))
            .count();
        assert!(built > 0, "{name}: no entry point built");
    }
}

/// The shader's u32 constants by name.
fn shader_constants(module: &naga::Module) -> Vec<(String, u32)> {
    module
        .constants
        .iter()
        .filter_map(|(_, c)| match module.global_expressions[c.init] {
            naga::Expression::Literal(naga::Literal::U32(v)) => Some((c.name.clone()?, v)),
            _ => None,
        })
        .collect()
}

/// Override constants of the tile kernel (`fast_t`): every `BITS` with
/// every `PACK_*` (and the tile size the host gives it), `CODE_*` and
/// `OUT_*`, each with the other overrides at their usual values and varied
/// one at a time. None for a shader without `fast_t`.
fn tile_variants(module: &naga::Module) -> Vec<Vec<(&'static str, u32)>> {
    if !module.entry_points.iter().any(|e| e.name == "fast_t") {
        return Vec::new();
    }
    let constants = shader_constants(module);
    let prefixed = |prefix: &str| -> Vec<u32> {
        let values: Vec<u32> = constants
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|&(_, v)| v)
            .collect();
        assert!(!values.is_empty(), "no {prefix}* constant");
        values
    };
    let named = |name: &str| -> u32 {
        let found = constants.iter().find(|(n, _)| n == name);
        found.unwrap_or_else(|| panic!("no constant {name}")).1
    };
    // The tile kernel's zero points and options (layout::Tile::for_job).
    let extra: Vec<Vec<(&'static str, u32)>> = vec![
        vec![],
        vec![("ZERO", named("ZERO_PLAIN"))],
        vec![("ZERO", named("ZERO_PACKED_ALONG_COLS"))],
        vec![("ZERO", named("ZERO_PLAIN")), ("WORD_GROUPS", 0)],
        vec![("SCALED", 0)],
        vec![("INTERLEAVED", 1)],
        vec![("SHARED", 1)],
        vec![("ZERO", named("ZERO_PACKED_ALONG_COLS")), ("SHARED", 1)],
        vec![("COPY", 1)],
        vec![("WG", 64)],
    ];
    let mut all = Vec::new();
    for bits in [4, 8] {
        for pack in prefixed("PACK_") {
            // layout::Tile::runs.
            let (run, lanes, runs) = if pack == named("PACK_TRANSPOSED") {
                (32, 16, 16)
            } else {
                (16, 16, 16)
            };
            for code in prefixed("CODE_") {
                for out in prefixed("OUT_") {
                    let base = [
                        ("BITS", bits),
                        ("PACK", pack),
                        ("RUN", run),
                        ("TILE_LANES", lanes),
                        ("TILE_RUNS", runs),
                        ("CODE", code),
                        ("OUT", out),
                    ];
                    for e in &extra {
                        all.push(base.iter().chain(e).copied().collect());
                    }
                }
            }
        }
    }
    all
}

/// The products' kernel for the tile kernel's strided packs (`gemv_t`,
/// eight rows of x; transposed ones are rewritten for `gemv` at upload):
/// the tile sets of the codes those packs have (integers, E2M1) with no
/// zero point, plain ones per code and ones packed along columns, the
/// first also as the bench's read kernel (READ).
fn gemv_t_variants(module: &naga::Module) -> Vec<Vec<(&'static str, u32)>> {
    if !module.entry_points.iter().any(|e| e.name == "gemv_t") {
        return Vec::new();
    }
    let constants = shader_constants(module);
    let named = |name: &str| constants.iter().find(|(n, _)| n == name).unwrap().1;
    let codes = [named("CODE_OFFSET"), named("CODE_E2M1")];
    let mut all = Vec::new();
    for set in tile_variants(module) {
        // The host's geometry: two rows an invocation, x read as vec4s.
        if set
            .iter()
            .any(|&(k, v)| k == "PACK" && v == named("PACK_TRANSPOSED"))
        {
            continue;
        }
        let fixed = [
            ("WG", 256),
            ("GEMV_ROWS", 8),
            ("RB", 2),
            ("MT", 8),
            ("X4", 1),
        ];
        let extra: Vec<&str> = set[7..].iter().map(|(k, _)| *k).collect();
        let code = set.iter().find(|(k, _)| *k == "CODE").unwrap().1;
        if !codes.contains(&code) || !matches!(extra[..], [] | ["ZERO"] | ["ZERO", "WORD_GROUPS"]) {
            continue;
        }
        all.push(set.iter().copied().chain(fixed).collect());
        if extra.is_empty() {
            all.push(
                set.iter()
                    .copied()
                    .chain(fixed)
                    .chain([("READ", 1)])
                    .collect(),
            );
        }
    }
    all
}

/// Override constants of the fast kernels: every `BITS` with every `CODE_*`
/// and `OUT_*` constant of `module`, each with the other overrides at their
/// usual values and varied one at a time. None for a shader without `fast`.
/// The products' kernel (`gemv`, layout::Fast's constants without COPY or
/// LOW_RANK, which it refuses): every code and output with one and with
/// eight rows of x, and each zero point, the unscaled, high-first and
/// post-scaled kernels with eight; the plain ones with eight also as the
/// bench's read kernel (READ).
fn gemv_variants(module: &naga::Module) -> Vec<Vec<(&'static str, u32)>> {
    if !module.entry_points.iter().any(|e| e.name == "gemv") {
        return Vec::new();
    }
    // The host's geometry (two rows of W an invocation, x read as vec4s,
    // rows on whole words), and the one without any of it.
    let fixed = [
        ("WG", 256),
        ("GEMV_ROWS", 8),
        ("RB", 2),
        ("X4", 1),
        ("ALIGNED", 1),
    ];
    let mut all = vec![vec![("WG", 256), ("GEMV_ROWS", 4), ("MT", 8)]];
    // fast_variants' sets: BITS, CODE, OUT, then at most one extra.
    for set in fast_variants(module) {
        let refused = set
            .iter()
            .any(|(k, _)| matches!(*k, "COPY" | "LOW_RANK" | "WG"));
        let plain = set.len() == 3;
        // The extras on 4-bit codes through the code table (CODE 0) alone.
        let extras = set[0].1 == 4 && set[1].1 == 0;
        if refused || !(plain || extras) {
            continue;
        }
        for mt in if plain { vec![1, 8] } else { vec![8] } {
            all.push(
                set.iter()
                    .copied()
                    .chain(fixed)
                    .chain([("MT", mt)])
                    .collect(),
            );
            if plain && mt == 8 {
                let read = set
                    .iter()
                    .copied()
                    .chain(fixed)
                    .chain([("MT", mt), ("READ", 1)]);
                all.push(read.collect());
            }
        }
    }
    all
}

fn fast_variants(module: &naga::Module) -> Vec<Vec<(&'static str, u32)>> {
    if !module.entry_points.iter().any(|e| e.name == "fast") {
        return Vec::new();
    }
    let constants: Vec<(String, u32)> = module
        .constants
        .iter()
        .filter_map(|(_, c)| match module.global_expressions[c.init] {
            naga::Expression::Literal(naga::Literal::U32(v)) => Some((c.name.clone()?, v)),
            _ => None,
        })
        .collect();
    let prefixed = |prefix: &str| -> Vec<u32> {
        let values: Vec<u32> = constants
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|&(_, v)| v)
            .collect();
        assert!(!values.is_empty(), "no {prefix}* constant");
        values
    };
    let named = |name: &str| -> u32 {
        let found = constants.iter().find(|(n, _)| n == name);
        found.unwrap_or_else(|| panic!("no constant {name}")).1
    };
    // The fast kernel's zero points and low-rank orders (layout::Fast::for_job).
    let extra: Vec<Vec<(&'static str, u32)>> = vec![
        vec![],
        vec![("ZERO", named("ZERO_PACKED"))],
        vec![("ZERO", named("ZERO_PLAIN"))],
        vec![("SCALED", 0)],
        vec![("LOW_RANK", named("LOW_RANK_SMOOTH_LAST"))],
        vec![("LOW_RANK", named("LOW_RANK_SMOOTH_FIRST"))],
        vec![("HIGH_FIRST", 1)],
        vec![("POST", 1)],
        vec![("COPY", 1)],
        vec![("WG", 64)],
    ];
    let mut all = Vec::new();
    for bits in [4, 8] {
        for code in prefixed("CODE_") {
            for out in prefixed("OUT_") {
                let base = [("BITS", bits), ("CODE", code), ("OUT", out)];
                for e in &extra {
                    all.push(base.iter().chain(e).copied().collect());
                }
            }
        }
    }
    all
}

/// Codes inside blocks (GGUF's geometry, at random): the fast kernel's
/// bytes (where the geometry lets it read whole words) and the generic
/// kernel's are the CPU's, whole and on row ranges, in roomy and cramped
/// chunks.
#[test]
fn blocked_fields_gpu_equals_cpu() {
    gpu_test(|adapter| {
        let roomy = GpuDecoder::open(&adapter).unwrap();
        let cramped = GpuDecoder::open(&adapter).unwrap().with_limits(16 << 10, 2);
        for (decoder, cases) in [(&roomy, 300), (&cramped, 80)] {
            for_random_jobs(cases, &[40, 300], |d, rng| {
                check_job(&RandomJob::aimed_at_blocks(rng, d), decoder)
            });
        }
        let ran = roomy.dispatches();
        assert!(
            ran.fast > 0 && ran.generic > 0,
            "random blocked jobs ran {ran:?}"
        );
    });
}

/// Every code of every code kind the fast kernels decode by formula rather
/// than by table (4- and 8-bit offset binary, two's complement, E2M1 and
/// E4M3 with their subnormals, zeros and NaN), each in every position of
/// a word: the GPU's values are the CPU's table, byte for byte, in f32 and
/// bf16, through the fast kernel.
#[test]
fn every_code_by_formula_equals_the_cpu_table() {
    gpu_test(|adapter| {
        let decoder = GpuDecoder::open(&adapter).unwrap();
        type Table = fn(u8) -> f32;
        let kinds: [(&str, u32, Table); 6] = [
            ("int4 offset", 4, |k| k as f32 - 8.0),
            ("int4 two's complement", 4, |k| {
                ((k as i32) << 28 >> 28) as f32
            }),
            ("int8 offset", 8, |k| k as f32 - 128.0),
            ("int8 two's complement", 8, |k| k as i8 as f32),
            ("e2m1", 4, wgpu_dequant::numerics::e2m1),
            ("e4m3", 8, wgpu_dequant::numerics::e4m3),
        ];
        for (name, bits, value) in kinds {
            // Every byte in each of a word's four places: each code of a
            // 4-bit kind in all eight nibbles too.
            let d = Dims {
                slices: 1,
                rows: 4,
                cols: 256 * 8 / bits as usize,
            };
            let codes: Vec<u8> = (0..4u32)
                .flat_map(|r| (0..=255u8).map(move |b| b.rotate_left(r)))
                .collect();
            let scale: Vec<u8> = (0..d.rows).flat_map(|_| 0x3f80u16.to_le_bytes()).collect();
            for out in [OutDtype::F32, OutDtype::Bf16] {
                let job = DecodeJob {
                    dims: d,
                    codes: Fields {
                        data: codes.as_slice().into(),
                        bits,
                        per_word: 0,
                        interleaved: false,
                        lane_bits: d.cols as u64 * bits as u64,
                        word_bits: 32,
                        slice_bits: (d.rows * d.cols) as u64 * bits as u64,
                        high_first: false,
                        blocks: None,
                        parts: None,
                    },
                    code_values: (0..1u32 << bits).map(|k| value(k as u8)).collect(),
                    scale: Some(Values {
                        data: scale.as_slice().into(),
                        kind: ValueKind::Bf16,
                        grid: Grid {
                            row_div: 1,
                            col_div: d.cols,
                            row_stride: 1,
                            slice_stride: 0,
                        },
                    }),
                    ..int4_job(d, &codes, &scale, out)
                };
                let want = Cpu::new().decode(&job).unwrap();
                if out == OutDtype::F32 {
                    // The CPU writes the table itself (scale 1).
                    for (i, w) in want.chunks_exact(4).enumerate() {
                        let byte = codes[i * bits as usize / 8];
                        let code = match bits {
                            4 => (byte >> (4 * (i % 2))) & 15,
                            _ => byte,
                        };
                        let v = value(code);
                        let got = f32::from_le_bytes(w.try_into().unwrap());
                        assert!(
                            got.to_bits() == v.to_bits() || (got.is_nan() && v.is_nan()),
                            "{name} code {code}"
                        );
                    }
                }
                let before = decoder.dispatches();
                let mut got = vec![0u8; want.len()];
                decoder.decode_rows(&job, 0..d.rows, &mut got).unwrap();
                assert!(
                    got == want,
                    "{name} -> {out}: the GPU's values differ from the CPU's"
                );
                assert!(
                    decoder.dispatches().fast > before.fast,
                    "{name}: not the fast kernel"
                );
            }
        }
    });
}
