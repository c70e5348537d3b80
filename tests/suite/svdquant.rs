//! SVDQuant checkpoints (diffuse_compressor) dequantized to the dense
//! original model, on synthetic checkpoints made by a test-side producer.
//!
//! The producer (module `svdq` below) writes `model.safetensors` (with the
//! `quantization_config` metadata) and the `model.config.yaml` sidecar from
//! logical tensors. For the `nunchaku_packed` layout it packs them into tile
//! order itself, enumerating the stored order of Nunchaku's index formulas (it
//! never calls the crate's `tiles` module, src/formats/svdquant/tiles.rs). The expected dense weights are
//! computed in f64 from the logical tensors with the formulas of
//! docs/formats.md#svdquant and compared within 1e-5 of each tensor's largest magnitude.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use crate::common::{bin, caught, gpu_test, Rng, Tensor};
use serde_json::{json, Value};
use svdq::{Ckpt, Layout, Outs, Prec, Sidecar, Target};
use wgpu_dequant::{Checkpoint, DtypeChoice, Names, OutDtype, Plan, Rule};

mod svdq {
    //! The producer of synthetic SVDQuant checkpoints and the reading side.

    use std::borrow::Cow;
    use std::collections::BTreeMap;
    use std::path::Path;

    use serde_json::{json, Value};
    use wgpu_dequant::backend::Cpu;
    use wgpu_dequant::{Backend, Checkpoint, DtypeChoice, Error, OutDtype, Plan};

    use crate::common::producer::{e2m1_ref, e4m3_ref};
    use crate::common::{caught, safetensors_bytes, Rng, Tensor};

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Prec {
        Int4,
        Fp4,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Layout {
        Logical,
        Packed,
    }

    /// A random bf16-exact value ±(1 + m/128)·2^e, e in `lo..=hi`.
    pub fn bf16v(rng: &mut Rng, lo: i32, hi: i32, signed: bool) -> f32 {
        let e = lo + rng.below((hi - lo + 1) as u64) as i32;
        let m = 1.0 + rng.below(128) as f32 / 128.0;
        let s = if signed && rng.below(2) == 1 {
            -1.0
        } else {
            1.0
        };
        s * m * 2f32.powi(e)
    }

    /// A random positive normal E4M3 byte, 2^-3 ≤ value < 2^4.
    pub fn e4m3_pos(rng: &mut Rng) -> u8 {
        let e = 4 + rng.below(7) as u8;
        let m = rng.below(8) as u8;
        (e << 3) | m
    }

    /// E4M3 byte of 1.0.
    pub const E4M3_ONE: u8 = 0x38;

    /// The value of a 4-bit code.
    pub fn code_value(prec: Prec, code: u8) -> f64 {
        match prec {
            Prec::Int4 if code >= 8 => code as f64 - 16.0,
            Prec::Int4 => code as f64,
            Prec::Fp4 => e2m1_ref(code) as f64,
        }
    }

    /// One target, as logical tensors.
    #[derive(Clone, Debug)]
    pub struct Target {
        pub name: String,
        pub modules: Vec<String>,
        pub roles: Vec<String>,
        pub prec: Prec,
        pub layout: Layout,
        pub group: usize,
        pub rows: usize,
        pub cols: usize,
        pub rank: usize,
        /// `[rows, cols]` codes 0..16.
        pub codes: Vec<u8>,
        /// int4: `[rows, groups]` bf16-exact group scales.
        pub scales: Vec<f32>,
        /// fp4: `[rows, groups]` E4M3 micro scales.
        pub micro: Vec<u8>,
        pub wcscales: Option<Vec<f32>>,
        pub wtscale: Option<f32>,
        /// `[cols]`.
        pub smooth: Vec<f32>,
        /// `[cols, rank]` as stored (packed: already divided by smooth).
        pub down: Vec<f32>,
        /// `[rows, rank]`.
        pub up: Vec<f32>,
        pub bias: Option<Vec<f32>>,
        /// Merged over the target's config entry.
        pub extra: Value,
    }

    impl Target {
        /// Every tensor random (fp4: with per-row `wcscales`, no `wtscale`).
        #[allow(clippy::too_many_arguments)]
        pub fn random(
            name: &str,
            prec: Prec,
            layout: Layout,
            rows: usize,
            cols: usize,
            group: usize,
            rank: usize,
            rng: &mut Rng,
        ) -> Target {
            assert_eq!(cols % group, 0, "test bug: {name}");
            let groups = cols / group;
            Target {
                name: name.into(),
                modules: vec![name.into()],
                roles: Vec::new(),
                prec,
                layout,
                group,
                rows,
                cols,
                rank,
                codes: (0..rows * cols).map(|_| rng.below(16) as u8).collect(),
                scales: (0..rows * groups)
                    .map(|_| bf16v(rng, -6, -3, false))
                    .collect(),
                micro: (0..rows * groups).map(|_| e4m3_pos(rng)).collect(),
                wcscales: (prec == Prec::Fp4)
                    .then(|| (0..rows).map(|_| bf16v(rng, -4, -1, false)).collect()),
                wtscale: None,
                smooth: (0..cols).map(|_| bf16v(rng, -1, 1, false)).collect(),
                down: (0..cols * rank).map(|_| bf16v(rng, -5, -2, true)).collect(),
                up: (0..rows * rank).map(|_| bf16v(rng, -5, -2, true)).collect(),
                bias: Some((0..rows).map(|_| bf16v(rng, -3, 1, true)).collect()),
                extra: json!({}),
            }
        }

        /// Everything but the codes made trivial: unit scales, no outer
        /// scales, unit smoothing, a zero low-rank branch, no bias.
        pub fn trivial(mut self) -> Target {
            self.scales.iter_mut().for_each(|s| *s = 1.0);
            self.micro.iter_mut().for_each(|s| *s = E4M3_ONE);
            self.wcscales = None;
            self.wtscale = None;
            self.smooth.iter_mut().for_each(|s| *s = 1.0);
            self.down.iter_mut().for_each(|s| *s = 0.0);
            self.up.iter_mut().for_each(|s| *s = 0.0);
            self.bias = None;
            self
        }

        pub fn groups(&self) -> usize {
            self.cols / self.group
        }

        /// Modules (and roles) of a fused target.
        pub fn fused(mut self, modules: &[&str], roles: &[&str]) -> Target {
            self.modules = modules.iter().map(|s| s.to_string()).collect();
            self.roles = roles.iter().map(|s| s.to_string()).collect();
            self
        }

        /// scale[n, g] = wscales[g, n] (· wcscales[n]) (· wtscale).
        pub fn scale(&self, n: usize, g: usize) -> f64 {
            let i = n * self.groups() + g;
            let mut s = match self.prec {
                Prec::Int4 => self.scales[i] as f64,
                Prec::Fp4 => e4m3_ref(self.micro[i]) as f64,
            };
            if let Some(wc) = &self.wcscales {
                s *= wc[n] as f64;
            }
            if let Some(wt) = self.wtscale {
                s *= wt as f64;
            }
            s
        }

        pub fn deq(&self, n: usize, k: usize) -> f64 {
            code_value(self.prec, self.codes[n * self.cols + k]) * self.scale(n, k / self.group)
        }

        pub fn low_rank(&self, n: usize, k: usize) -> f64 {
            (0..self.rank)
                .map(|j| self.up[n * self.rank + j] as f64 * self.down[k * self.rank + j] as f64)
                .sum()
        }

        /// The dense weight `[rows, cols]`:
        /// logical `(deq + up·downᵀ) / smooth`, packed `deq / smooth + up·downᵀ`.
        pub fn dense(&self) -> Vec<f64> {
            let mut w = Vec::with_capacity(self.rows * self.cols);
            for n in 0..self.rows {
                for k in 0..self.cols {
                    let s = self.smooth[k] as f64;
                    w.push(match self.layout {
                        Layout::Logical => (self.deq(n, k) + self.low_rank(n, k)) / s,
                        Layout::Packed => self.deq(n, k) / s + self.low_rank(n, k),
                    });
                }
            }
            w
        }

        /// Σ_k of the weight an activation shift multiplies, per row: the
        /// whole weight (logical), the smoothed residual alone (packed).
        pub fn shift_sums(&self) -> Vec<f64> {
            let w = self.dense();
            (0..self.rows)
                .map(|n| {
                    (0..self.cols)
                        .map(|k| match self.layout {
                            Layout::Logical => w[n * self.cols + k],
                            Layout::Packed => self.deq(n, k) / self.smooth[k] as f64,
                        })
                        .sum()
                })
                .collect()
        }

        /// The stored bias, zeros without one.
        pub fn bias_or_zero(&self) -> Vec<f64> {
            match &self.bias {
                Some(b) => b.iter().map(|&x| x as f64).collect(),
                None => vec![0.0; self.rows],
            }
        }

        /// The config entry.
        pub fn json(&self) -> Value {
            let packed = self.layout == Layout::Packed;
            let mut v = json!({
                "name": self.name,
                "export_name": self.name,
                "modules": self.modules,
                "roles": self.roles,
                "precision": match self.prec { Prec::Int4 => "int4", Prec::Fp4 => "fp4" },
                "group_size": self.group,
                "bias": "auto",
                "export_bias": "auto",
                "weight_layout": {"name": if packed { "svdq" } else { "naive_svdq" }},
                "weight_scale_layout": match self.prec {
                    Prec::Int4 => "effective",
                    Prec::Fp4 => "nvfp4_deepcompressor",
                },
                "runtime_tensor_layout": if packed { "nunchaku_packed" } else { "logical" },
                "gptq": {"enabled": false},
                "activation_quant": {"enabled": false},
            });
            merge(&mut v, &self.extra);
            v
        }

        /// The stored tensors.
        pub fn tensors(&self) -> Vec<Tensor> {
            let p = &self.name;
            let (n, k, r, g) = (self.rows, self.cols, self.rank, self.groups());
            let packed = self.layout == Layout::Packed;
            let mut out = Vec::new();
            let qweight = if packed {
                pack_qweight(&self.codes, n, k)
            } else {
                (0..n * k / 2)
                    .map(|i| self.codes[2 * i] | (self.codes[2 * i + 1] << 4))
                    .collect()
            };
            out.push(Tensor::u8(
                format!("{p}.qweight"),
                "I8",
                &[n, k / 2],
                &qweight,
            ));
            match (self.prec, packed) {
                (Prec::Int4, false) => {
                    let t: Vec<f32> = (0..g * n)
                        .map(|i| self.scales[(i % n) * g + i / n])
                        .collect();
                    out.push(Tensor::bf16(format!("{p}.wscales"), &[g, n], &t));
                }
                (Prec::Fp4, false) => {
                    let t: Vec<u8> = (0..g * n)
                        .map(|i| self.micro[(i % n) * g + i / n])
                        .collect();
                    out.push(Tensor::u8(format!("{p}.wscales"), "F8_E4M3", &[g, n], &t));
                }
                (Prec::Int4, true) => {
                    let gp = g.div_ceil(2) * 2;
                    let v = pack_group_scales(&self.scales, n, g, gp, 1000.0);
                    out.push(Tensor::bf16(format!("{p}.wscales"), &[gp, n], &v));
                }
                (Prec::Fp4, true) => {
                    let gp = g.div_ceil(4) * 4;
                    let v = pack_micro_scales(&self.micro, n, g, gp, 0x70);
                    out.push(Tensor::u8(format!("{p}.wscales"), "F8_E4M3", &[gp, n], &v));
                }
            }
            let vector = |v: &[f32]| -> Vec<f32> {
                if packed {
                    pack_group_scales(v, v.len(), 1, 1, 0.0)
                } else {
                    v.to_vec()
                }
            };
            if let Some(wc) = &self.wcscales {
                out.push(Tensor::bf16(format!("{p}.wcscales"), &[n], &vector(wc)));
            }
            if let Some(wt) = self.wtscale {
                out.push(Tensor::bf16(format!("{p}.wtscale"), &[1], &[wt]));
            }
            out.push(Tensor::bf16(
                format!("{p}.smooth_factor"),
                &[k],
                &vector(&self.smooth),
            ));
            let (down, up) = if packed {
                (pack_down(&self.down, k, r), pack_up(&self.up, n, r))
            } else {
                (self.down.clone(), self.up.clone())
            };
            out.push(Tensor::bf16(format!("{p}.proj_down"), &[k, r], &down));
            out.push(Tensor::bf16(format!("{p}.proj_up"), &[n, r], &up));
            if let Some(b) = &self.bias {
                out.push(Tensor::bf16(format!("{p}.bias"), &[n], &vector(b)));
            }
            out
        }
    }

    /// `over` merged into `base` (objects key by key, anything else replaced).
    pub fn merge(base: &mut Value, over: &Value) {
        match (base, over) {
            (Value::Object(b), Value::Object(o)) => {
                for (key, v) in o {
                    match b.get_mut(key) {
                        Some(bv) if bv.is_object() && v.is_object() => merge(bv, v),
                        _ => {
                            b.insert(key.clone(), v.clone());
                        }
                    }
                }
            }
            (b, o) => *b = o.clone(),
        }
    }

    // -----------------------------------------------------------------------
    // Nunchaku tile order, forward: each loop nest enumerates the stored
    // tensor in order, its loop variables being the digits of Nunchaku's
    // index formula, outermost first.
    // -----------------------------------------------------------------------

    /// qweight words: word = (((((t·K/64 + kt)·8 + a)·8 + y)·4 + x)·2 + b)·2 + h
    /// with n = 128t + 16a + 8b + y, k = 64kt + 32h + 8x + j, nibble j.
    pub fn pack_qweight(codes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(rows * cols / 2);
        for t in 0..rows / 128 {
            for kt in 0..cols / 64 {
                for a in 0..8 {
                    for y in 0..8 {
                        for x in 0..4 {
                            for b in 0..2 {
                                for h in 0..2 {
                                    let n = 128 * t + 16 * a + 8 * b + y;
                                    let mut word = 0u32;
                                    for j in 0..8 {
                                        let k = 64 * kt + 32 * h + 8 * x + j;
                                        word |= (codes[n * cols + k] as u32) << (4 * j);
                                    }
                                    out.extend_from_slice(&word.to_le_bytes());
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(out.len(), rows * cols / 2);
        out
    }

    /// Group scales `[rows, groups]` (groups padded to `padded` with `pad`):
    /// index = (t·G + g)·128 + 16a + 4q + 2b + d, n = 128t + 16a + 8b + 2q + d.
    /// Vectors are `groups = padded = 1`.
    pub fn pack_group_scales(
        v: &[f32],
        rows: usize,
        groups: usize,
        padded: usize,
        pad: f32,
    ) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows * padded);
        for t in 0..rows / 128 {
            for g in 0..padded {
                for a in 0..8 {
                    for q in 0..4 {
                        for b in 0..2 {
                            for d in 0..2 {
                                let n = 128 * t + 16 * a + 8 * b + 2 * q + d;
                                out.push(if g < groups { v[n * groups + g] } else { pad });
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(out.len(), rows * padded);
        out
    }

    /// fp4 micro scales `[rows, groups]` (padded to `padded`):
    /// index = ((((t·G/4 + h)·8 + y)·4 + x)·4 + s)·4 + f,
    /// n = 128t + 32s + 8x + y, g = 4h + f.
    pub fn pack_micro_scales(
        v: &[u8],
        rows: usize,
        groups: usize,
        padded: usize,
        pad: u8,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(rows * padded);
        for t in 0..rows / 128 {
            for h in 0..padded / 4 {
                for y in 0..8 {
                    for x in 0..4 {
                        for s in 0..4 {
                            for f in 0..4 {
                                let n = 128 * t + 32 * s + 8 * x + y;
                                let g = 4 * h + f;
                                out.push(if g < groups { v[n * groups + g] } else { pad });
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(out.len(), rows * padded);
        out
    }

    /// One 16×16 block in stored order: `at(i, j)` for
    /// i = 8·i1 + i0, j = 8·j2 + 2·j1 + j0, in the order i0, j1, i1, j2, j0.
    fn block(out: &mut Vec<f32>, at: impl Fn(usize, usize) -> f32) {
        for i0 in 0..8 {
            for j1 in 0..4 {
                for i1 in 0..2 {
                    for j2 in 0..2 {
                        for j0 in 0..2 {
                            out.push(at(8 * i1 + i0, 8 * j2 + 2 * j1 + j0));
                        }
                    }
                }
            }
        }
    }

    /// `proj_down` `[cols, rank]`: blocks of the `[rank, cols]` matrix
    /// (i = rank index, j = column), column blocks outermost.
    pub fn pack_down(down: &[f32], cols: usize, rank: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(cols * rank);
        for kb in 0..cols / 16 {
            for rb in 0..rank / 16 {
                block(&mut out, |i, j| down[(16 * kb + j) * rank + 16 * rb + i]);
            }
        }
        out
    }

    /// `proj_up` `[rows, rank]`: blocks of itself (i = row, j = rank index),
    /// row blocks outermost.
    pub fn pack_up(up: &[f32], rows: usize, rank: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows * rank);
        for nb in 0..rows / 16 {
            for rb in 0..rank / 16 {
                block(&mut out, |i, j| up[(16 * nb + i) * rank + 16 * rb + j]);
            }
        }
        out
    }

    // -----------------------------------------------------------------------
    // The checkpoint.
    // -----------------------------------------------------------------------

    /// What to write as `model.config.yaml`.
    pub enum Sidecar {
        Json(Value),
        Raw(Vec<u8>),
        Absent,
    }

    pub struct Ckpt {
        pub targets: Vec<Target>,
        pub patches: Vec<Value>,
        pub shifts: BTreeMap<String, f64>,
        /// Unquantized tensors stored beside the targets.
        pub others: Vec<Tensor>,
    }

    impl Ckpt {
        pub fn new(targets: Vec<Target>) -> Ckpt {
            Ckpt {
                targets,
                patches: Vec::new(),
                shifts: BTreeMap::new(),
                others: Vec::new(),
            }
        }

        pub fn patch(mut self, kind: &str, module: &str, splits: Value) -> Ckpt {
            self.patches
                .push(json!({"type": kind, "module": module, "args": {"splits": splits}}));
            self
        }

        pub fn shift(mut self, module: &str, s: f64) -> Ckpt {
            self.shifts.insert(module.into(), s);
            self
        }

        /// `quantization_config`, as in the safetensors metadata.
        pub fn quantization_config(&self) -> Value {
            let t = &self.targets[0];
            let rank = self.targets.iter().map(|t| t.rank).max().unwrap_or(16);
            let (dtype, scale_dtypes) = match t.prec {
                Prec::Int4 => ("int4", json!([null])),
                Prec::Fp4 => ("fp4_e2m1_all", json!([null, "sfp8_e4m3_nan"])),
            };
            json!({
                "method": "svdquant",
                "rank": rank,
                "weight": {"dtype": dtype, "group_size": t.group, "scale_dtypes": scale_dtypes},
                "gptq": {
                    "enabled": false, "damp_percentage": 0.01, "block_size": 128,
                    "num_inv_tries": 250, "hessian_block_size": 512,
                },
                "activation": {
                    "dtype": "int4", "enabled": false, "group_size": 64, "scale_dtypes": [null],
                },
            })
        }

        /// The sidecar config.
        pub fn sidecar(&self) -> Value {
            let mut v = self.quantization_config();
            merge(
                &mut v,
                &json!({
                    "targets": self.targets.iter().map(Target::json).collect::<Vec<_>>(),
                    "structural_patches": self.patches,
                    "calibration": {"activation_shifts": self.shifts},
                    "runtime_manifest_diagnostics": {"emitted": false, "reasons": []},
                    "quantization": {"compute_device": null, "offload_model": false},
                    "artifact_cache": {},
                }),
            );
            v
        }

        pub fn tensors(&self) -> Vec<Tensor> {
            let mut all: Vec<Tensor> = self.others.clone();
            for t in &self.targets {
                all.extend(t.tensors());
            }
            all
        }

        pub fn write(&self, dir: &Path) {
            self.write_with(dir, &self.tensors(), Sidecar::Json(self.sidecar()));
        }

        /// `tensors` (with the metadata) and `sidecar` in `dir`.
        pub fn write_with(&self, dir: &Path, tensors: &[Tensor], sidecar: Sidecar) {
            std::fs::create_dir_all(dir).unwrap();
            let meta: BTreeMap<String, String> = [(
                "quantization_config".to_string(),
                self.quantization_config().to_string(),
            )]
            .into();
            std::fs::write(
                dir.join("model.safetensors"),
                safetensors_bytes(tensors, Some(&meta)),
            )
            .unwrap();
            let side = dir.join("model.config.yaml");
            match sidecar {
                Sidecar::Json(v) => {
                    std::fs::write(&side, serde_json::to_vec_pretty(&v).unwrap()).unwrap()
                }
                Sidecar::Raw(b) => std::fs::write(&side, b).unwrap(),
                Sidecar::Absent => {}
            }
        }
    }

    // -----------------------------------------------------------------------
    // Reading the library's answer.
    // -----------------------------------------------------------------------

    /// One output tensor: dtype, shape, bytes.
    pub struct Out {
        pub dtype: String,
        pub shape: Vec<usize>,
        pub bytes: Vec<u8>,
    }

    pub type Outs = BTreeMap<String, Out>;

    /// f32 values of an F32 output.
    pub fn f32s(o: &Out) -> Vec<f32> {
        assert_eq!(o.dtype, "F32");
        o.bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Plans `dir` for `out` and decodes every output with `backends`
    /// (one map per backend); the errors when anything refuses it. A panic
    /// fails the test.
    pub fn decode_on(
        dir: &Path,
        out: OutDtype,
        backends: &[&dyn Backend],
    ) -> Result<Vec<Outs>, Vec<Error>> {
        let r = caught(|| -> Result<Vec<Outs>, Vec<Error>> {
            let ckpt = Checkpoint::open(dir).map_err(|e| vec![e])?;
            let mut plan = Plan::build(&ckpt, DtypeChoice::Fixed(out), wgpu_dequant::Names::Hub)
                .map_err(|e| vec![e])?;
            if !plan.errors.is_empty() {
                return Err(std::mem::take(&mut plan.errors));
            }
            backends
                .iter()
                .map(|b| {
                    plan.outputs
                        .iter()
                        .map(|o| {
                            let bytes: Cow<'_, [u8]> = o.bytes(*b).map_err(|e| vec![e])?;
                            Ok((
                                o.name.clone(),
                                Out {
                                    dtype: format!("{:?}", o.dtype),
                                    shape: o.shape.clone(),
                                    bytes: bytes.into_owned(),
                                },
                            ))
                        })
                        .collect::<Result<Outs, Vec<Error>>>()
                })
                .collect()
        });
        match r {
            Ok(r) => r,
            Err(p) => panic!("{}: the library panicked: {p}", dir.display()),
        }
    }

    /// The f32 outputs of `dir` on the CPU; the errors when refused.
    pub fn try_decode(dir: &Path) -> Result<Outs, Vec<Error>> {
        decode_on(dir, OutDtype::F32, &[&Cpu::new()]).map(|mut v| v.remove(0))
    }

    /// The f32 outputs of `dir` on the CPU; fails the test when refused.
    pub fn decode(dir: &Path) -> Outs {
        try_decode(dir).unwrap_or_else(|errs| {
            let list: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
            panic!("{}: refused:\n{}", dir.display(), list.join("\n"))
        })
    }
}

// ---------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------

/// Asserts output `name` has `shape` and values within 1e-5 of `want`'s
/// largest magnitude.
fn close(ctx: &str, got: &Outs, name: &str, shape: &[usize], want: &[f64]) {
    let o = got.get(name).unwrap_or_else(|| {
        panic!(
            "{ctx}: no output {name}; outputs: {:?}",
            got.keys().collect::<Vec<_>>()
        )
    });
    assert_eq!(o.shape, shape, "{ctx}: {name} shape");
    let v = svdq::f32s(o);
    assert_eq!(v.len(), want.len(), "{ctx}: {name} length (test bug?)");
    let max = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let tol = 1e-5 * max.max(1e-30);
    let bad: Vec<usize> = (0..v.len())
        .filter(|&i| (v[i] as f64 - want[i]).abs() > tol)
        .collect();
    if let Some(&i) = bad.first() {
        panic!(
            "{ctx}: {name}: {} of {} elements off by more than {tol:e}; first at {i}: got {}, want {}",
            bad.len(),
            v.len(),
            v[i],
            want[i]
        );
    }
}

/// The largest |a − b| relative to b's largest magnitude: used to show that
/// a wrong reading of the rule under test would have failed `close`.
fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    let max = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
        / max
}

fn assert_distinguishes(ctx: &str, wrong: &[f64], want: &[f64]) {
    assert!(
        rel_diff(wrong, want) > 1e-3,
        "test bug: {ctx}: the wrong reading gives the same values, so this test could not fail"
    );
}

/// Asserts that `dir` is refused with `rule` by an error whose message
/// contains every one of `needles`.
fn refused(ctx: &str, dir: &Path, rule: Rule, needles: &[&str]) {
    let errs = match svdq::try_decode(dir) {
        Ok(outs) => panic!(
            "{ctx}: accepted; outputs {:?}",
            outs.keys().collect::<Vec<_>>()
        ),
        Err(e) => e,
    };
    let texts: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert!(
        errs.iter().any(|e| {
            let t = e.to_string();
            e.rule == rule && needles.iter().all(|n| t.contains(n))
        }),
        "{ctx}: want [{rule}] naming {needles:?}; got:\n{}",
        texts.join("\n")
    );
}

fn rows(w: &[f64], cols: usize, r: Range<usize>) -> Vec<f64> {
    w[r.start * cols..r.end * cols].to_vec()
}

/// Matrices with `rows` rows side by side.
fn hcat(parts: &[(&[f64], usize)], rows: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for n in 0..rows {
        for (m, cols) in parts {
            out.extend_from_slice(&m[n * cols..(n + 1) * cols]);
        }
    }
    out
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Writes `ck` to a fresh directory and decodes it.
fn write_decode(ck: &Ckpt) -> (tempfile::TempDir, Outs) {
    let dir = tmp();
    ck.write(dir.path());
    let got = svdq::decode(dir.path());
    (dir, got)
}

/// A single-target checkpoint decoded; the weight (and bias, when the
/// target has one) checked against the formula.
fn check_single(ctx: &str, t: &Target) -> Outs {
    let (_d, got) = write_decode(&Ckpt::new(vec![t.clone()]));
    close(
        ctx,
        &got,
        &format!("{}.weight", t.name),
        &[t.rows, t.cols],
        &t.dense(),
    );
    match &t.bias {
        Some(b) => close(ctx, &got, &format!("{}.bias", t.name), &[t.rows], &f64s(b)),
        None => assert!(
            !got.contains_key(&format!("{}.bias", t.name)),
            "{ctx}: a bias out of nothing"
        ),
    }
    got
}

// ---------------------------------------------------------------------------
// 1. Nibble order and signed int4 codes
// ---------------------------------------------------------------------------

/// Codes where the two nibbles of each byte always differ and every code
/// appears, so a nibble swap or an unsigned reading shows.
fn asymmetric_codes(rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut c = Vec::with_capacity(rows * cols);
    for i in 0..rows * cols / 2 {
        let lo = if i < 16 { i as u8 } else { rng.below(16) as u8 };
        let hi = (lo + 1 + rng.below(15) as u8) % 16;
        c.extend([lo, hi]);
    }
    c
}

#[test]
fn logical_qweight_low_nibble_is_even_column_and_int4_is_signed() {
    let mut rng = Rng::new(0x5eed_0001);
    let (n, k) = (192, 128);
    let mut t =
        Target::random("m.lin", Prec::Int4, Layout::Logical, n, k, 64, 16, &mut rng).trivial();
    t.codes = asymmetric_codes(n, k, &mut rng);
    let want = t.dense();
    // The rule is what makes these values: swapped nibbles or unsigned
    // codes would give others.
    let swapped: Vec<f64> = (0..n * k)
        .map(|i| svdq::code_value(Prec::Int4, t.codes[i ^ 1]))
        .collect();
    let unsigned: Vec<f64> = t.codes.iter().map(|&c| c as f64).collect();
    assert_distinguishes("nibble swap", &swapped, &want);
    assert_distinguishes("unsigned int4", &unsigned, &want);
    assert!(want.contains(&-8.0) && want.contains(&7.0) && want.contains(&-1.0));
    check_single("int4 logical nibbles", &t);

    // fp4 codes are E2M1 indices (bit 3 the sign), same nibble order.
    let mut f =
        Target::random("m.fp", Prec::Fp4, Layout::Logical, n, k, 16, 16, &mut rng).trivial();
    f.codes = asymmetric_codes(n, k, &mut rng);
    check_single("fp4 logical nibbles", &f);
}

// ---------------------------------------------------------------------------
// 2. Transposed group scales
// ---------------------------------------------------------------------------

#[test]
fn logical_wscales_are_stored_transposed() {
    let mut rng = Rng::new(0x5eed_0002);
    // N = 192, K/G = 2: a [N, K/G] reading has another shape and other values.
    let mut t = Target::random(
        "m.lin",
        Prec::Int4,
        Layout::Logical,
        192,
        128,
        64,
        16,
        &mut rng,
    )
    .trivial();
    t.scales = (0..192 * 2)
        .map(|_| svdq::bf16v(&mut rng, -6, 2, false))
        .collect();
    t.codes = (0..192 * 128).map(|_| 1 + rng.below(7) as u8).collect();
    check_single("int4 transposed scales", &t);

    // Scales stored untransposed ([N, K/G]) do not fit: refused, not misread.
    let dir = tmp();
    let ck = Ckpt::new(vec![t.clone()]);
    let mut tensors = ck.tensors();
    let ws = tensors
        .iter_mut()
        .find(|x| x.name == "m.lin.wscales")
        .unwrap();
    ws.shape = vec![192, 2];
    ws.data = Tensor::bf16("", &[192, 2], &t.scales).data;
    ck.write_with(dir.path(), &tensors, Sidecar::Json(ck.sidecar()));
    refused(
        "untransposed wscales",
        dir.path(),
        Rule::TensorShape,
        &["m.lin.wscales"],
    );

    // fp4 micro scales too.
    let mut f = Target::random(
        "m.fp",
        Prec::Fp4,
        Layout::Logical,
        192,
        128,
        16,
        16,
        &mut rng,
    )
    .trivial();
    f.micro = (0..192 * 8).map(|_| svdq::e4m3_pos(&mut rng)).collect();
    f.codes = (0..192 * 128).map(|_| 1 + rng.below(7) as u8).collect();
    check_single("fp4 transposed scales", &f);
}

// ---------------------------------------------------------------------------
// 3. Nunchaku tile order, one formula at a time
// ---------------------------------------------------------------------------

#[test]
fn packed_qweight_word_and_nibble_order() {
    let mut rng = Rng::new(0x5eed_0003);
    for prec in [Prec::Int4, Prec::Fp4] {
        let g = if prec == Prec::Int4 { 64 } else { 16 };
        let mut t =
            Target::random("m.lin", prec, Layout::Packed, 256, 256, g, 16, &mut rng).trivial();
        t.codes = asymmetric_codes(256, 256, &mut rng);
        check_single(&format!("{prec:?} packed qweight"), &t);
    }
    // Three 128-column tiles (six 64-column word groups), one row tile.
    let mut t = Target::random(
        "m.lin",
        Prec::Int4,
        Layout::Packed,
        128,
        384,
        64,
        16,
        &mut rng,
    )
    .trivial();
    t.codes = asymmetric_codes(128, 384, &mut rng);
    check_single("Int4 packed qweight, K = 384", &t);
}

#[test]
fn packed_int4_group_scales_with_groups_padded_to_even() {
    let mut rng = Rng::new(0x5eed_0004);
    // K = 384, G = 128: 3 groups, stored as 4 (the padding holds 1000).
    let mut t = Target::random(
        "m.lin",
        Prec::Int4,
        Layout::Packed,
        256,
        384,
        128,
        16,
        &mut rng,
    )
    .trivial();
    assert_eq!(t.groups(), 3);
    t.codes = vec![1; 256 * 384];
    t.scales = (0..256 * 3)
        .map(|_| svdq::bf16v(&mut rng, -6, 2, false))
        .collect();
    let got = check_single("packed int4 group scales (3 → 4)", &t);
    assert_eq!(
        got["m.lin.weight"].shape,
        vec![256, 384],
        "padding is not part of the weight"
    );
    // Even group counts need no padding.
    let mut t = Target::random(
        "m.lin",
        Prec::Int4,
        Layout::Packed,
        128,
        256,
        64,
        16,
        &mut rng,
    )
    .trivial();
    t.codes = vec![15; 128 * 256];
    t.scales = (0..128 * 4)
        .map(|_| svdq::bf16v(&mut rng, -6, 2, false))
        .collect();
    check_single("packed int4 group scales (4)", &t);
}

#[test]
fn packed_vectors_bias_smooth_factor_and_wcscales() {
    let mut rng = Rng::new(0x5eed_0005);
    // smooth_factor (length K) alone.
    let mut t = Target::random(
        "m.lin",
        Prec::Int4,
        Layout::Packed,
        128,
        256,
        64,
        16,
        &mut rng,
    )
    .trivial();
    t.codes = vec![1; 128 * 256];
    t.smooth = (0..256)
        .map(|_| svdq::bf16v(&mut rng, -2, 2, false))
        .collect();
    check_single("packed smooth_factor", &t);

    // bias (length N) alone.
    let mut t = Target::random(
        "m.lin",
        Prec::Int4,
        Layout::Packed,
        256,
        128,
        64,
        16,
        &mut rng,
    )
    .trivial();
    t.bias = Some(
        (0..256)
            .map(|_| svdq::bf16v(&mut rng, -3, 3, true))
            .collect(),
    );
    check_single("packed bias", &t);

    // wcscales (length N) alone.
    let mut t = Target::random(
        "m.lin",
        Prec::Fp4,
        Layout::Packed,
        256,
        128,
        16,
        16,
        &mut rng,
    )
    .trivial();
    t.codes = vec![2; 256 * 128]; // E2M1 1.0
    t.wcscales = Some(
        (0..256)
            .map(|_| svdq::bf16v(&mut rng, -4, 3, false))
            .collect(),
    );
    check_single("packed wcscales", &t);
}

#[test]
fn packed_fp4_micro_scales_with_groups_padded_to_four() {
    let mut rng = Rng::new(0x5eed_0006);
    // K = 384, G = 64: 6 groups, stored as 8 (the padding holds 128).
    let mut t = Target::random(
        "m.lin",
        Prec::Fp4,
        Layout::Packed,
        256,
        384,
        64,
        16,
        &mut rng,
    )
    .trivial();
    assert_eq!(t.groups(), 6);
    t.codes = vec![2; 256 * 384];
    t.micro = (0..256 * 6).map(|_| svdq::e4m3_pos(&mut rng)).collect();
    check_single("packed fp4 micro scales (6 → 8)", &t);
    // The usual group 16: K/16 groups, a multiple of 4 already.
    let mut t = Target::random(
        "m.lin",
        Prec::Fp4,
        Layout::Packed,
        128,
        256,
        16,
        16,
        &mut rng,
    )
    .trivial();
    t.codes = vec![10; 128 * 256]; // −1.0
    t.micro = (0..128 * 16).map(|_| svdq::e4m3_pos(&mut rng)).collect();
    check_single("packed fp4 micro scales (16)", &t);
}

/// `m[x, j] = 1 when x == j`: a selection matrix, so the product shows the
/// other factor as it is.
fn selection(len: usize, rank: usize) -> Vec<f32> {
    (0..len * rank)
        .map(|i| if i / rank == i % rank { 1.0 } else { 0.0 })
        .collect()
}

#[test]
fn packed_proj_down_block_order() {
    let mut rng = Rng::new(0x5eed_0007);
    let (n, k, r) = (256, 256, 32);
    let mut t =
        Target::random("m.lin", Prec::Int4, Layout::Packed, n, k, 64, r, &mut rng).trivial();
    t.codes = vec![0; n * k];
    t.up = selection(n, r);
    t.down = (0..k * r)
        .map(|_| svdq::bf16v(&mut rng, -4, 2, true))
        .collect();
    // W[n, k] = down[k, n] for n < r: proj_down read back verbatim.
    let want = t.dense();
    assert_eq!(want[5 * k + 7], t.down[7 * r + 5] as f64);
    check_single("packed proj_down", &t);
}

#[test]
fn packed_proj_up_block_order() {
    let mut rng = Rng::new(0x5eed_0008);
    let (n, k, r) = (256, 256, 32);
    let mut t =
        Target::random("m.lin", Prec::Int4, Layout::Packed, n, k, 64, r, &mut rng).trivial();
    t.codes = vec![0; n * k];
    t.down = selection(k, r);
    t.up = (0..n * r)
        .map(|_| svdq::bf16v(&mut rng, -4, 2, true))
        .collect();
    // W[n, k] = up[n, k] for k < r.
    let want = t.dense();
    assert_eq!(want[9 * k + 3], t.up[9 * r + 3] as f64);
    check_single("packed proj_up", &t);
}

#[test]
fn logical_and_packed_formulas_with_every_tensor_random() {
    let mut rng = Rng::new(0x5eed_0009);
    // Logical: (deq + up·downᵀ) / smooth.
    let t = Target::random(
        "m.lin",
        Prec::Int4,
        Layout::Logical,
        192,
        128,
        64,
        16,
        &mut rng,
    );
    let mut as_packed = t.clone();
    as_packed.layout = Layout::Packed;
    assert_distinguishes("logical read as packed", &as_packed.dense(), &t.dense());
    check_single("logical int4 formula", &t);
    let t = Target::random(
        "m.fp",
        Prec::Fp4,
        Layout::Logical,
        192,
        128,
        16,
        32,
        &mut rng,
    );
    check_single("logical fp4 formula", &t);

    // Packed: deq / smooth + up·downᵀ (proj_down already divided by smooth).
    for (prec, g, r) in [(Prec::Int4, 64, 32), (Prec::Fp4, 16, 16)] {
        let mut t = Target::random("m.lin", prec, Layout::Packed, 256, 256, g, r, &mut rng);
        t.wtscale = Some(0.75);
        let mut as_logical = t.clone();
        as_logical.layout = Layout::Logical;
        assert_distinguishes("packed read as logical", &as_logical.dense(), &t.dense());
        check_single(&format!("packed {prec:?} formula"), &t);
    }
}

// ---------------------------------------------------------------------------
// 4. fp4 outer scales
// ---------------------------------------------------------------------------

#[test]
fn fp4_wcscales_per_row_and_wtscale_per_tensor_both_multiply() {
    let mut rng = Rng::new(0x5eed_000a);
    for layout in [Layout::Packed, Layout::Logical] {
        let (n, k) = if layout == Layout::Packed {
            (256, 128)
        } else {
            (192, 64)
        };
        let mut t = Target::random("m.lin", Prec::Fp4, layout, n, k, 16, 16, &mut rng);
        t.wcscales = Some(
            (0..n)
                .map(|_| svdq::bf16v(&mut rng, -3, 3, false))
                .collect(),
        );
        t.wtscale = Some(0.1875);
        let want = t.dense();
        let mut no_wc = t.clone();
        no_wc.wcscales = None;
        let mut no_wt = t.clone();
        no_wt.wtscale = None;
        assert_distinguishes("without wcscales", &no_wc.dense(), &want);
        assert_distinguishes("without wtscale", &no_wt.dense(), &want);
        check_single(&format!("{layout:?} fp4 outer scales"), &t);
    }
}

// ---------------------------------------------------------------------------
// 5. Fused targets
// ---------------------------------------------------------------------------

const QKV: [&str; 3] = ["a.to_q", "a.to_k", "a.to_v"];

fn fused_target(rows: usize, layout: Layout, rng: &mut Rng) -> Target {
    let (prec, g, k) = match layout {
        Layout::Logical => (Prec::Int4, 64, 128),
        Layout::Packed => (Prec::Fp4, 16, 128),
    };
    Target::random("a.qkv", prec, layout, rows, k, g, 16, rng).fused(&QKV, &["q", "k", "v"])
}

fn check_split(ctx: &str, got: &Outs, t: &Target, split: &[usize]) {
    let w = t.dense();
    let b = t.bias_or_zero();
    let mut top = 0;
    for (m, &n) in QKV.iter().zip(split) {
        close(
            ctx,
            got,
            &format!("{m}.weight"),
            &[n, t.cols],
            &rows(&w, t.cols, top..top + n),
        );
        close(ctx, got, &format!("{m}.bias"), &[n], &b[top..top + n]);
        top += n;
    }
    let names: Vec<&String> = got.keys().collect();
    assert_eq!(
        names.len(),
        6,
        "{ctx}: only the three modules' weights and biases: {names:?}"
    );
}

#[test]
fn fused_target_splits_into_its_modules_by_rows() {
    let mut rng = Rng::new(0x5eed_000b);
    let t = fused_target(192, Layout::Logical, &mut rng);
    let (_d, got) = write_decode(&Ckpt::new(vec![t.clone()]));
    check_split("logical qkv", &got, &t, &[64, 64, 64]);
    assert!(!got.contains_key("a.qkv.weight"));

    let t = fused_target(384, Layout::Packed, &mut rng);
    let (_d, got) = write_decode(&Ckpt::new(vec![t.clone()]));
    check_split("packed qkv", &got, &t, &[128, 128, 128]);
}

#[test]
fn fused_target_uneven_rows_need_outer_scale_splits() {
    let mut rng = Rng::new(0x5eed_000c);
    // 200 rows among 3 modules, no recorded split: refused.
    let t = fused_target(200, Layout::Logical, &mut rng);
    let dir = tmp();
    Ckpt::new(vec![t.clone()]).write(dir.path());
    refused("uneven qkv", dir.path(), Rule::Config, &["a.qkv"]);

    // With weight_layout.outer_scale_splits the split is the recorded one.
    let mut t = t;
    t.extra = json!({"weight_layout": {"outer_scale_splits": [64, 64, 72]}});
    let (_d, got) = write_decode(&Ckpt::new(vec![t.clone()]));
    check_split("qkv with outer_scale_splits", &got, &t, &[64, 64, 72]);

    // Splits that do not add up to the rows are refused too.
    t.extra = json!({"weight_layout": {"outer_scale_splits": [64, 64, 64]}});
    let dir = tmp();
    Ckpt::new(vec![t]).write(dir.path());
    refused(
        "outer_scale_splits short",
        dir.path(),
        Rule::Config,
        &["outer_scale_splits"],
    );
}

// ---------------------------------------------------------------------------
// 6. Structural patches
// ---------------------------------------------------------------------------

fn lin(name: &str, rows: usize, cols: usize, rng: &mut Rng) -> Target {
    Target::random(name, Prec::Int4, Layout::Logical, rows, cols, 64, 16, rng)
}

#[test]
fn patch_split_linear_output_concatenates_rows_and_biases() {
    let mut rng = Rng::new(0x5eed_000d);
    let a = lin("b.0.mlp.linears.0", 64, 128, &mut rng);
    let mut b = lin("b.0.mlp.linears.1", 128, 128, &mut rng);
    let ck =
        Ckpt::new(vec![a.clone(), b.clone()]).patch("split_linear_output", "b.*.mlp", json!([64]));
    let (_d, got) = write_decode(&ck);
    let w = [a.dense(), b.dense()].concat();
    close(
        "split_linear_output",
        &got,
        "b.0.mlp.weight",
        &[192, 128],
        &w,
    );
    let bias = [a.bias_or_zero(), b.bias_or_zero()].concat();
    close("split_linear_output", &got, "b.0.mlp.bias", &[192], &bias);
    assert_eq!(got.len(), 2, "{:?}", got.keys().collect::<Vec<_>>());

    // A child without a bias contributes zeros.
    b.bias = None;
    let ck =
        Ckpt::new(vec![a.clone(), b.clone()]).patch("split_linear_output", "b.*.mlp", json!([64]));
    let (_d, got) = write_decode(&ck);
    let bias = [a.bias_or_zero(), vec![0.0; 128]].concat();
    close(
        "split_linear_output, one bias",
        &got,
        "b.0.mlp.bias",
        &[192],
        &bias,
    );
}

#[test]
fn patch_split_linear_concatenates_columns_bias_from_last_child() {
    let mut rng = Rng::new(0x5eed_000e);
    for layout in [Layout::Logical, Layout::Packed] {
        let (prec, g) = match layout {
            Layout::Logical => (Prec::Int4, 64),
            Layout::Packed => (Prec::Fp4, 16),
        };
        let mut a = Target::random(
            "b.0.proj_out.linears.0",
            prec,
            layout,
            128,
            128,
            g,
            16,
            &mut rng,
        );
        a.bias = None;
        let c = Target::random(
            "b.0.proj_out.linears.1",
            prec,
            layout,
            128,
            256,
            g,
            16,
            &mut rng,
        );
        // out_features (128) resolves to the first split, 256 remain.
        let ck = Ckpt::new(vec![a.clone(), c.clone()]).patch(
            "split_linear",
            "b.*.proj_out",
            json!(["out_features"]),
        );
        let (_d, got) = write_decode(&ck);
        let ctx = format!("{layout:?} split_linear");
        let w = hcat(&[(&a.dense(), 128), (&c.dense(), 256)], 128);
        close(&ctx, &got, "b.0.proj_out.weight", &[128, 384], &w);
        close(&ctx, &got, "b.0.proj_out.bias", &[128], &c.bias_or_zero());
        assert_eq!(got.len(), 2, "{ctx}: {:?}", got.keys().collect::<Vec<_>>());
    }
}

#[test]
fn patch_split_conv_gives_a_1x1_conv_weight() {
    let mut rng = Rng::new(0x5eed_000f);
    let mut a = lin("b.0.conv.convs.0", 64, 128, &mut rng);
    a.bias = None;
    let c = lin("b.0.conv.convs.1", 64, 192, &mut rng);
    let ck = Ckpt::new(vec![a.clone(), c.clone()]).patch("split_conv", "b.*.conv", json!([128]));
    let (_d, got) = write_decode(&ck);
    let w = hcat(&[(&a.dense(), 128), (&c.dense(), 192)], 64);
    close("split_conv", &got, "b.0.conv.weight", &[64, 320, 1, 1], &w);
    close(
        "split_conv",
        &got,
        "b.0.conv.bias",
        &[64],
        &c.bias_or_zero(),
    );
    assert_eq!(got.len(), 2, "{:?}", got.keys().collect::<Vec<_>>());
}

#[test]
fn patch_splits_contradicting_the_children_are_refused() {
    let mut rng = Rng::new(0x5eed_0010);
    let a = lin("b.0.mlp.linears.0", 64, 128, &mut rng);
    let b = lin("b.0.mlp.linears.1", 128, 128, &mut rng);
    let dir = tmp();
    Ckpt::new(vec![a.clone(), b.clone()])
        .patch("split_linear_output", "b.*.mlp", json!([100]))
        .write(dir.path());
    refused(
        "split_linear_output [100] over 64 + 128 rows",
        dir.path(),
        Rule::Config,
        &["structural_patches[0]", "b.0.mlp"],
    );
    // split_linear over columns: in_features is everything, not 128 + 128.
    let c = lin("b.0.out.linears.0", 64, 128, &mut rng);
    let d = lin("b.0.out.linears.1", 64, 128, &mut rng);
    let dir = tmp();
    Ckpt::new(vec![c, d])
        .patch("split_linear", "b.*.out", json!(["in_features"]))
        .write(dir.path());
    refused(
        "split_linear [in_features] over 128 + 128 columns",
        dir.path(),
        Rule::Config,
        &["structural_patches[0]", "b.0.out"],
    );
}

// ---------------------------------------------------------------------------
// 7. Activation shifts
// ---------------------------------------------------------------------------

#[test]
fn shift_folds_the_whole_weight_into_the_bias_for_logical() {
    let mut rng = Rng::new(0x5eed_0011);
    let t = lin("m.lin", 192, 128, &mut rng);
    let s = 0.25;
    let ck = Ckpt::new(vec![t.clone()]).shift("m.lin", s);
    let (_d, got) = write_decode(&ck);
    let b = t.bias_or_zero();
    let sums = t.shift_sums();
    let want: Vec<f64> = (0..192).map(|n| b[n] + s * sums[n]).collect();
    // What the packed rule (no low-rank term) would give instead.
    let mut other = t.clone();
    other.layout = Layout::Packed;
    let wrong: Vec<f64> = other
        .shift_sums()
        .iter()
        .zip(&b)
        .map(|(x, b)| b + s * x)
        .collect();
    assert_distinguishes("logical shift without low rank", &wrong, &want);
    assert_distinguishes("no shift", &b, &want);
    close("logical shift", &got, "m.lin.bias", &[192], &want);
    close(
        "logical shift",
        &got,
        "m.lin.weight",
        &[192, 128],
        &t.dense(),
    );

    // On one module of a fused target: only its rows move.
    let f = fused_target(192, Layout::Logical, &mut rng);
    let ck = Ckpt::new(vec![f.clone()]).shift("a.to_k", -1.5);
    let (_d, got) = write_decode(&ck);
    let (b, sums) = (f.bias_or_zero(), f.shift_sums());
    close("fused shift", &got, "a.to_q.bias", &[64], &b[..64]);
    let k: Vec<f64> = (64..128).map(|n| b[n] - 1.5 * sums[n]).collect();
    close("fused shift", &got, "a.to_k.bias", &[64], &k);
    close("fused shift", &got, "a.to_v.bias", &[64], &b[128..]);
}

#[test]
fn shift_uses_the_residual_alone_for_packed() {
    let mut rng = Rng::new(0x5eed_0012);
    for (prec, g) in [(Prec::Int4, 64), (Prec::Fp4, 16)] {
        let mut t = Target::random("m.lin", prec, Layout::Packed, 256, 256, g, 32, &mut rng);
        // A large low-rank branch, so including it would show.
        t.up = (0..256 * 32)
            .map(|_| svdq::bf16v(&mut rng, -2, 0, false))
            .collect();
        t.down = (0..256 * 32)
            .map(|_| svdq::bf16v(&mut rng, -2, 0, false))
            .collect();
        let s = 0.5;
        let ck = Ckpt::new(vec![t.clone()]).shift("m.lin", s);
        let (_d, got) = write_decode(&ck);
        let b = t.bias_or_zero();
        let want: Vec<f64> = t
            .shift_sums()
            .iter()
            .zip(&b)
            .map(|(x, b)| b + s * x)
            .collect();
        let w = t.dense();
        let whole: Vec<f64> = (0..256)
            .map(|n| b[n] + s * w[n * 256..(n + 1) * 256].iter().sum::<f64>())
            .collect();
        assert_distinguishes("packed shift with low rank", &whole, &want);
        let ctx = format!("packed {prec:?} shift");
        close(&ctx, &got, "m.lin.bias", &[256], &want);
        close(&ctx, &got, "m.lin.weight", &[256, 256], &w);
    }
}

#[test]
fn shift_on_a_module_without_bias_creates_one() {
    let mut rng = Rng::new(0x5eed_0013);
    let mut t = lin("m.lin", 192, 128, &mut rng);
    t.bias = None;
    let (_d, got) = write_decode(&Ckpt::new(vec![t.clone()]));
    assert!(!got.contains_key("m.lin.bias"), "no shift, no bias");
    let (_d, got) = write_decode(&Ckpt::new(vec![t.clone()]).shift("m.lin", 0.75));
    let want: Vec<f64> = t.shift_sums().iter().map(|x| 0.75 * x).collect();
    close("shift without bias", &got, "m.lin.bias", &[192], &want);

    // Packed too.
    let mut p = Target::random(
        "m.pk",
        Prec::Fp4,
        Layout::Packed,
        128,
        128,
        16,
        16,
        &mut rng,
    );
    p.bias = None;
    let (_d, got) = write_decode(&Ckpt::new(vec![p.clone()]).shift("m.pk", -0.5));
    let want: Vec<f64> = p.shift_sums().iter().map(|x| -0.5 * x).collect();
    close(
        "packed shift without bias",
        &got,
        "m.pk.bias",
        &[128],
        &want,
    );
}

#[test]
fn shift_naming_an_unknown_module_is_refused() {
    let mut rng = Rng::new(0x5eed_0014);
    let t = lin("m.lin", 192, 128, &mut rng);
    let dir = tmp();
    Ckpt::new(vec![t])
        .shift("m.nothing", 0.25)
        .write(dir.path());
    refused("unknown shift", dir.path(), Rule::Config, &["m.nothing"]);
}

// ---------------------------------------------------------------------------
// 8. Malformed sidecars and contradicting tensors
// ---------------------------------------------------------------------------

/// A small valid checkpoint: a fused logical target, a patch, a shift.
fn base_ckpt(rng: &mut Rng) -> Ckpt {
    let f = fused_target(192, Layout::Logical, rng);
    let a = lin("b.0.mlp.linears.0", 64, 128, rng);
    let b = lin("b.0.mlp.linears.1", 64, 128, rng);
    Ckpt::new(vec![f, a, b])
        .patch("split_linear_output", "b.*.mlp", json!([64]))
        .shift("a.to_k", 0.25)
}

type Edit = fn(&mut Value);

#[test]
fn malformed_sidecars_are_refused_naming_the_field() {
    let mut rng = Rng::new(0x5eed_0015);
    let ck = base_ckpt(&mut rng);
    // The base is fine.
    let dir = tmp();
    ck.write(dir.path());
    svdq::decode(dir.path());

    let cases: &[(&str, Edit, Rule, &[&str])] = &[
        (
            "no targets",
            |v| {
                v.as_object_mut().unwrap().remove("targets");
            },
            Rule::Config,
            &["targets"],
        ),
        ("rank 0", |v| v["rank"] = json!(0), Rule::Config, &["rank"]),
        (
            "rank -4",
            |v| v["rank"] = json!(-4),
            Rule::Config,
            &["rank"],
        ),
        (
            "rank 1.5",
            |v| v["rank"] = json!(1.5),
            Rule::Config,
            &["rank"],
        ),
        (
            "rank \"16\"",
            |v| v["rank"] = json!("16"),
            Rule::Config,
            &["rank"],
        ),
        (
            "target without modules",
            |v| {
                v["targets"][0].as_object_mut().unwrap().remove("modules");
            },
            Rule::Config,
            &["modules"],
        ),
        (
            "two roles for three modules",
            |v| v["targets"][0]["roles"] = json!(["q", "k"]),
            Rule::Config,
            &["roles"],
        ),
        (
            "runtime_tensor_layout tiled",
            |v| v["targets"][1]["runtime_tensor_layout"] = json!("tiled"),
            Rule::Config,
            &["runtime_tensor_layout"],
        ),
        (
            "runtime_tensor_layout a number",
            |v| v["targets"][1]["runtime_tensor_layout"] = json!(3),
            Rule::Config,
            &["runtime_tensor_layout"],
        ),
        (
            "patch without args.splits",
            |v| v["structural_patches"][0]["args"] = json!({}),
            Rule::Config,
            &["splits"],
        ),
        (
            "patch without args",
            |v| {
                v["structural_patches"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("args");
            },
            Rule::Config,
            &["args"],
        ),
        (
            "activation shift a string",
            |v| v["calibration"]["activation_shifts"]["a.to_k"] = json!("0.25"),
            Rule::Config,
            &["activation_shifts", "a.to_k"],
        ),
        (
            "activation shift null",
            |v| v["calibration"]["activation_shifts"]["a.to_k"] = Value::Null,
            Rule::Config,
            &["activation_shifts", "a.to_k"],
        ),
        (
            "precision int8",
            |v| v["targets"][0]["precision"] = json!("int8"),
            Rule::Unsupported,
            &["precision", "int8"],
        ),
        (
            "patch type shift_linear",
            |v| v["structural_patches"][0]["type"] = json!("shift_linear"),
            Rule::Unsupported,
            &["type", "shift_linear"],
        ),
        (
            "weight_layout awq_w4a16",
            |v| v["targets"][1]["weight_layout"]["name"] = json!("awq_w4a16"),
            Rule::Unsupported,
            &["weight_layout", "awq_w4a16"],
        ),
    ];
    for (what, edit, rule, needles) in cases {
        let mut side = ck.sidecar();
        edit(&mut side);
        let dir = tmp();
        ck.write_with(dir.path(), &ck.tensors(), Sidecar::Json(side));
        refused(what, dir.path(), *rule, needles);
    }

    // Not JSON at all.
    let dir = tmp();
    ck.write_with(
        dir.path(),
        &ck.tensors(),
        Sidecar::Raw(b"method: svdquant\nrank: 16\n".to_vec()),
    );
    refused(
        "sidecar not JSON",
        dir.path(),
        Rule::Config,
        &["model.config.yaml"],
    );

    // The metadata says svdquant, but the sidecar is missing.
    let dir = tmp();
    ck.write_with(dir.path(), &ck.tensors(), Sidecar::Absent);
    refused(
        "metadata without sidecar",
        dir.path(),
        Rule::Config,
        &["model.config.yaml"],
    );
}

#[test]
fn tensors_contradicting_the_config_are_refused() {
    let mut rng = Rng::new(0x5eed_0016);
    let ck = base_ckpt(&mut rng);

    // qweight with K = 96 columns, group_size 64.
    let mut tensors = ck.tensors();
    let q = tensors
        .iter_mut()
        .find(|t| t.name == "b.0.mlp.linears.0.qweight")
        .unwrap();
    q.shape = vec![64, 48];
    q.data.truncate(64 * 48);
    let dir = tmp();
    ck.write_with(dir.path(), &tensors, Sidecar::Json(ck.sidecar()));
    refused(
        "K not a multiple of group_size",
        dir.path(),
        Rule::TensorShape,
        &["b.0.mlp.linears.0.qweight"],
    );

    // No proj_up.
    let tensors: Vec<Tensor> = ck
        .tensors()
        .into_iter()
        .filter(|t| t.name != "a.qkv.proj_up")
        .collect();
    let dir = tmp();
    ck.write_with(dir.path(), &tensors, Sidecar::Json(ck.sidecar()));
    refused(
        "missing proj_up",
        dir.path(),
        Rule::MissingTensor,
        &["a.qkv.proj_up"],
    );
}

// ---------------------------------------------------------------------------
// 9. GPU and CPU agree
// ---------------------------------------------------------------------------

/// Synthetic checkpoints exercising everything: (logical int4, packed fp4),
/// each with a fused target, split_linear_output and split_linear patches
/// and shifts.
fn full_ckpts(rng: &mut Rng) -> Vec<Ckpt> {
    let mut out = Vec::new();
    for (prec, layout, g) in [
        (Prec::Int4, Layout::Logical, 64),
        (Prec::Fp4, Layout::Packed, 16),
    ] {
        let t = |name: &str, n: usize, k: usize, rng: &mut Rng| {
            let mut t = Target::random(name, prec, layout, n, k, g, 16, rng);
            if layout == Layout::Packed && !name.ends_with("qkv") {
                t.wtscale = Some(0.625);
            }
            t
        };
        let qkv = t("a.qkv", 384, 128, rng).fused(&QKV, &["q", "k", "v"]);
        let mlp0 = t("a.mlp.linears.0", 128, 128, rng);
        let mlp1 = t("a.mlp.linears.1", 256, 128, rng);
        let mut out0 = t("a.out.linears.0", 128, 128, rng);
        out0.bias = None;
        let out1 = t("a.out.linears.1", 128, 256, rng);
        let mut ff = t("a.ff", 128, 256, rng);
        ff.bias = None;
        let mut ck = Ckpt::new(vec![qkv, mlp0, mlp1, out0, out1, ff])
            .patch("split_linear_output", "a.mlp", json!([128]))
            .patch("split_linear", "a.out", json!(["out_features"]))
            .shift("a.to_v", 0.25)
            .shift("a.mlp.linears.1", -0.5)
            .shift("a.out.linears.0", 1.25)
            .shift("a.ff", 0.5);
        ck.others
            .push(Tensor::f32("a.norm.weight", &[128], &[1.5; 128]));
        out.push(ck);
    }
    out
}

#[test]
fn gpu_outputs_equal_cpu_outputs_byte_for_byte() {
    gpu_test(|adapter| {
        let gpu = match caught(|| wgpu_dequant::backend::gpu::Gpu::open(&adapter)) {
            Ok(Ok(g)) => g,
            Ok(Err(e)) => panic!("cannot open the GPU: {e}"),
            Err(p) => panic!("opening the GPU panicked: {p}"),
        };
        let cpu = wgpu_dequant::backend::Cpu::new();
        let mut rng = Rng::new(0x5eed_0017);
        for (i, ck) in full_ckpts(&mut rng).iter().enumerate() {
            let dir = tmp();
            ck.write(dir.path());
            for out in [OutDtype::F32, OutDtype::Bf16] {
                let both = svdq::decode_on(dir.path(), out, &[&cpu, &gpu]).unwrap_or_else(|e| {
                    panic!("checkpoint {i}: refused: {}", e[0]);
                });
                let (c, g) = (&both[0], &both[1]);
                assert_eq!(
                    c.keys().collect::<Vec<_>>(),
                    g.keys().collect::<Vec<_>>(),
                    "checkpoint {i} {out}: names"
                );
                assert!(c.len() >= 10, "checkpoint {i}: {:?}", c.keys());
                for (name, co) in c {
                    let go = &g[name];
                    assert_eq!(co.shape, go.shape, "checkpoint {i} {out}: {name} shape");
                    if let Some(at) = co.bytes.iter().zip(&go.bytes).position(|(a, b)| a != b) {
                        panic!("checkpoint {i} {out}: {name}: GPU bytes differ from the CPU's from byte {at}");
                    }
                    assert_eq!(
                        co.bytes.len(),
                        go.bytes.len(),
                        "checkpoint {i} {out}: {name}"
                    );
                }
            }
        }
    });
}

/// The full checkpoints decode to what the rules say (so the GPU test
/// compares right answers).
#[test]
fn full_checkpoints_match_the_rules() {
    let mut rng = Rng::new(0x5eed_0017);
    for (i, ck) in full_ckpts(&mut rng).iter().enumerate() {
        let (_d, got) = write_decode(ck);
        let ctx = format!("full checkpoint {i}");
        let t = |name: &str| ck.targets.iter().find(|t| t.name == name).unwrap();
        let shifted = |t: &Target, s: f64| -> Vec<f64> {
            t.shift_sums()
                .iter()
                .zip(t.bias_or_zero())
                .map(|(x, b)| b + s * x)
                .collect()
        };
        let qkv = t("a.qkv");
        let (w, b) = (qkv.dense(), qkv.bias_or_zero());
        let vb = shifted(qkv, 0.25);
        for (j, m) in QKV.iter().enumerate() {
            let r = 128 * j..128 * (j + 1);
            close(
                &ctx,
                &got,
                &format!("{m}.weight"),
                &[128, 128],
                &rows(&w, 128, r.clone()),
            );
            let want = if j == 2 { &vb[r] } else { &b[r] };
            close(&ctx, &got, &format!("{m}.bias"), &[128], want);
        }
        let (m0, m1) = (t("a.mlp.linears.0"), t("a.mlp.linears.1"));
        close(
            &ctx,
            &got,
            "a.mlp.weight",
            &[384, 128],
            &[m0.dense(), m1.dense()].concat(),
        );
        let mb = [m0.bias_or_zero(), shifted(m1, -0.5)].concat();
        close(&ctx, &got, "a.mlp.bias", &[384], &mb);
        let (o0, o1) = (t("a.out.linears.0"), t("a.out.linears.1"));
        let ow = hcat(&[(&o0.dense(), 128), (&o1.dense(), 256)], 128);
        close(&ctx, &got, "a.out.weight", &[128, 384], &ow);
        // Outputs add up: the shifted first child's correction joins the
        // last child's bias.
        let ob: Vec<f64> = shifted(o0, 1.25)
            .iter()
            .zip(o1.bias_or_zero())
            .map(|(a, b)| a + b)
            .collect();
        close(&ctx, &got, "a.out.bias", &[128], &ob);
        let ff = t("a.ff");
        close(&ctx, &got, "a.ff.weight", &[128, 256], &ff.dense());
        close(&ctx, &got, "a.ff.bias", &[128], &shifted(ff, 0.5));
        assert_eq!(svdq::f32s(&got["a.norm.weight"]), vec![1.5; 128]);
        assert_eq!(got.len(), 13, "{ctx}: {:?}", got.keys().collect::<Vec<_>>());
    }
}

// ---------------------------------------------------------------------------
// 10. The CLI
// ---------------------------------------------------------------------------

/// The `__metadata__` of a safetensors file.
fn header_metadata(path: &Path) -> BTreeMap<String, Value> {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    h.get("__metadata__")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

#[test]
fn cli_dequantize_writes_the_original_modules() {
    let mut rng = Rng::new(0x5eed_0018);
    let mut ck = base_ckpt(&mut rng);
    let norm = Tensor::bf16("a.norm.weight", &[128], &[0.5; 128]);
    let emb = Tensor::f32("emb.weight", &[4, 8], &[0.25; 32]);
    ck.others = vec![norm.clone(), emb.clone()];
    let src = tmp();
    ck.write(src.path());
    std::fs::write(src.path().join("tokenizer.json"), b"{}").unwrap();
    let out = tmp();
    let dst = out.path().join("dense");
    let o = std::process::Command::new(bin())
        .args(["dequantize", src.path().to_str().unwrap(), "-o"])
        .arg(&dst)
        .args(["--dtype", "f32", "--backend", "cpu", "-q"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "dequantize failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let files: Vec<String> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !files.iter().any(|f| f.ends_with(".config.yaml")),
        "the sidecar is not copied: {files:?}"
    );
    assert!(files.contains(&"tokenizer.json".to_string()), "{files:?}");
    let st = dst.join("model.safetensors");
    assert!(st.is_file(), "{files:?}");
    let meta = header_metadata(&st);
    assert!(
        !meta.contains_key("quantization_config"),
        "quantization_config left in the metadata: {meta:?}"
    );

    let got = crate::common::read_tensors(&st);
    let names: Vec<&str> = got.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "a.norm.weight",
            "a.to_k.bias",
            "a.to_k.weight",
            "a.to_q.bias",
            "a.to_q.weight",
            "a.to_v.bias",
            "a.to_v.weight",
            "b.0.mlp.bias",
            "b.0.mlp.weight",
            "emb.weight",
        ]
    );
    // --dtype f32 is the whole checkpoint's: copies are widened exactly.
    for c in [&norm, &emb] {
        let (dt, shape, bytes) = &got[&c.name];
        let widened: Vec<u8> = crate::common::producer::stored_floats(c)
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            (dt.as_str(), shape, bytes),
            ("F32", &c.shape, &widened),
            "{} copied as f32",
            c.name
        );
    }
    // Values: through the same reader as the library tests.
    let outs: Outs = got
        .iter()
        .map(|(n, (dt, shape, bytes))| {
            (
                n.clone(),
                svdq::Out {
                    dtype: dt.clone(),
                    shape: shape.clone(),
                    bytes: bytes.clone(),
                },
            )
        })
        .collect();
    let f = &ck.targets[0];
    let w = f.dense();
    close(
        "cli",
        &outs,
        "a.to_q.weight",
        &[64, 128],
        &rows(&w, 128, 0..64),
    );
    let (a, b) = (&ck.targets[1], &ck.targets[2]);
    close(
        "cli",
        &outs,
        "b.0.mlp.weight",
        &[128, 128],
        &[a.dense(), b.dense()].concat(),
    );
    let sums = f.shift_sums();
    let kb: Vec<f64> = (64..128)
        .map(|n| f.bias_or_zero()[n] + 0.25 * sums[n])
        .collect();
    close("cli", &outs, "a.to_k.bias", &[64], &kb);
}

/// The library entry points agree with the CLI's (a plan has no errors, its
/// outputs are sorted and carry the decoded shapes).
#[test]
fn plan_lists_the_dense_modules() {
    let mut rng = Rng::new(0x5eed_0019);
    let ck = base_ckpt(&mut rng);
    let dir = tmp();
    ck.write(dir.path());
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let plan = Plan::build(&ckpt, DtypeChoice::Fixed(OutDtype::F32), Names::Hub).unwrap();
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    let got: Vec<(&str, &[usize])> = plan
        .outputs
        .iter()
        .map(|o| (o.name.as_str(), o.shape.as_slice()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a.to_k.bias", &[64][..]),
            ("a.to_k.weight", &[64, 128][..]),
            ("a.to_q.bias", &[64][..]),
            ("a.to_q.weight", &[64, 128][..]),
            ("a.to_v.bias", &[64][..]),
            ("a.to_v.weight", &[64, 128][..]),
            ("b.0.mlp.bias", &[128][..]),
            ("b.0.mlp.weight", &[128, 128][..]),
        ]
    );
}
