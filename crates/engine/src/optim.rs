//! AdamW with decoupled weight decay and global L2-norm gradient clipping, FP32 master weights
//! for mixed precision, and loss-scale handling.
//!
//! In mixed precision the model holds low-precision working copies of (some of) its weights;
//! the optimizer then keeps the FP32 master weights of those tensors and the fused AdamW kernel
//! updates the master and writes the working copy in the same pass (`param_copy`). Tensors the
//! model keeps in f32 are updated in place.
//!
//! With a loss scale, the gradients arrive multiplied by it: the unscaling (`1/scale`) is folded
//! into AdamW's `grad_scale` together with the clipping factor, and the global gradient norm —
//! computed anyway for clipping — doubles as the inf/NaN check: a non-finite norm skips the step
//! (the [`LossScaler`] then halves a dynamic scale).

use crate::model::{Fp8WeightCodes, ParamSpec};
use crate::precision::LossScaler;
use crate::{EngineError, Result};
use duet_device::{
    AdamWClipStep, AdamWClipped, AdamWClippedFp8, AdamWStep, AdamWTensor, AdamWUpdate, Buffer,
    Collective, DType, Device, DeviceExt, ReduceOp, SumSquares, SumSquaresMany,
};

/// Optimizer hyper-parameters that do not change during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Clip the global gradient norm to this value (0 disables).
    pub grad_clip: f32,
}

/// What the gradient norm decides before an update: clipping, loss-scale unscaling, or a skip.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UpdatePlan {
    pub stats: StepStats,
    /// AdamW's `grad_scale`: the clipping factor divided by the loss scale.
    pub grad_scale: f32,
}

impl AdamWConfig {
    /// Decides the update from the global norm of the (loss-scaled) gradients: an inf/NaN norm
    /// under a loss scaler skips the step (the scaler adjusts its scale), else PyTorch's
    /// `clip_grad_norm_` factor and the unscaling give AdamW's gradient factor.
    pub fn plan(&self, raw_norm: f32, scaler: Option<&mut LossScaler>) -> UpdatePlan {
        let loss_scale = scaler.as_ref().map_or(1.0, |s| s.scale());
        let grad_norm = (raw_norm as f64 / loss_scale as f64) as f32;
        if let Some(s) = scaler
            && s.update(raw_norm.is_finite())
        {
            return UpdatePlan {
                stats: StepStats {
                    grad_norm,
                    clip_scale: 1.0,
                    skipped: true,
                    loss_scale,
                },
                grad_scale: 0.0,
            };
        }
        // PyTorch's clip_grad_norm_: coefficient max_norm / (norm + 1e-6), applied when < 1.
        let coef = self.grad_clip / (grad_norm + 1e-6);
        let clip_scale = if self.grad_clip > 0.0 && coef < 1.0 {
            coef
        } else {
            1.0
        };
        let grad_scale = if loss_scale == 1.0 {
            clip_scale
        } else {
            (clip_scale as f64 / loss_scale as f64) as f32
        };
        UpdatePlan {
            stats: StepStats {
                grad_norm,
                clip_scale,
                skipped: false,
                loss_scale,
            },
            grad_scale,
        }
    }
}

/// Per-parameter first and second moments, on the device.
pub struct AdamW<D: Device> {
    cfg: AdamWConfig,
    m: Vec<D::Buffer>,
    v: Vec<D::Buffer>,
    /// FP32 master weights of the tensors whose working copy is not f32.
    master: Vec<Option<D::Buffer>>,
    decay: Vec<bool>,
    /// Each tensor's real size (its buffers may hold padded rows past it: `ParamSpec::pad_rows`).
    numels: Vec<usize>,
    /// The sum of squares of the gradients, then (device path) lr and the bias corrections:
    /// [`duet_device::ADAMW_SCALARS`] f32.
    norm: D::Buffer,
    /// lr and bias corrections of the prepared device step.
    scalars: [f32; 3],
    /// Number of updates applied so far.
    step: u64,
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f32,
    /// Factor the gradients were multiplied by (1 when not clipped).
    pub clip_scale: f32,
    /// The step was skipped because a gradient was inf/NaN.
    pub skipped: bool,
    /// The loss scale the gradients carried (1 without loss scaling).
    pub loss_scale: f32,
}

impl<D: Device> AdamW<D> {
    pub fn new(dev: &D, cfg: AdamWConfig, specs: &[ParamSpec]) -> Result<Self> {
        let mut m = Vec::with_capacity(specs.len());
        let mut v = Vec::with_capacity(specs.len());
        for s in specs {
            m.push(dev.alloc(DType::F32, s.device_numel())?);
            v.push(dev.alloc(DType::F32, s.device_numel())?);
        }
        Ok(Self {
            cfg,
            m,
            v,
            master: specs.iter().map(|_| None).collect(),
            decay: specs.iter().map(|s| s.decay).collect(),
            numels: specs.iter().map(|s| s.numel()).collect(),
            norm: dev.alloc(DType::F32, duet_device::ADAMW_SCALARS)?,
            scalars: [0.0; 3],
            step: 0,
        })
    }

    /// An optimizer for a model whose working weights `params` may be low precision: every
    /// tensor that is not f32 gets an FP32 master copy initialised from `weights` (host f32, the
    /// full-precision values the working copy was rounded from).
    pub fn with_masters(
        dev: &D,
        cfg: AdamWConfig,
        specs: &[ParamSpec],
        params: &[D::Buffer],
        weights: &[Vec<f32>],
    ) -> Result<Self> {
        let mut opt = Self::new(dev, cfg, specs)?;
        if params.len() != specs.len() || weights.len() != specs.len() {
            return Err(EngineError::Config(format!(
                "optimizer: {} specs, {} parameters, {} weight tensors",
                specs.len(),
                params.len(),
                weights.len()
            )));
        }
        for (i, p) in params.iter().enumerate() {
            if p.dtype() != DType::F32 {
                // Allocated zeroed at the device's size; a padded tensor's rows stay zero.
                let mut m = dev.alloc(DType::F32, specs[i].device_numel())?;
                dev.upload(&weights[i], &mut m, 0)?;
                opt.master[i] = Some(m);
            }
        }
        Ok(opt)
    }

    /// The FP32 master copy of parameter `i`, if it has one.
    pub fn master(&self, i: usize) -> Option<&D::Buffer> {
        self.master[i].as_ref()
    }

    /// Full-precision weights: the master copies where they exist, else `params` (real sizes:
    /// padded rows dropped).
    pub fn master_weights(&self, dev: &D, params: &[D::Buffer]) -> Result<Vec<Vec<f32>>> {
        params
            .iter()
            .zip(&self.master)
            .zip(&self.numels)
            .map(|((p, m), &n)| {
                let mut w = dev.download_f32(m.as_ref().unwrap_or(p))?;
                w.truncate(n);
                Ok(w)
            })
            .collect()
    }

    /// Replaces the master copies (after loading weights); tensors without one are ignored.
    pub fn set_master_weights(&mut self, dev: &D, weights: &[Vec<f32>]) -> Result<()> {
        for (m, w) in self.master.iter_mut().zip(weights) {
            if let Some(m) = m {
                dev.upload(w, m, 0)?;
            }
        }
        Ok(())
    }

    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    pub fn moments(&self) -> (&[D::Buffer], &[D::Buffer]) {
        (&self.m, &self.v)
    }

    pub fn moments_mut(&mut self) -> (&mut [D::Buffer], &mut [D::Buffer]) {
        (&mut self.m, &mut self.v)
    }

    pub fn set_steps_taken(&mut self, step: u64) {
        self.step = step;
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.cfg
    }

    /// Global L2 norm of `grads` (one host read).
    pub fn grad_norm(&mut self, dev: &D, grads: &[D::Buffer]) -> Result<f32> {
        self.grad_norm_reduced(dev, grads, None)
    }

    /// [`AdamW::grad_norm`] averaged over the ranks of `comm` (data parallelism: every rank
    /// holds the same all-reduced gradients, and the average makes sure every rank takes the
    /// same clipping and loss-scaling decision even if a backend's all-reduce differed).
    fn grad_norm_reduced(
        &mut self,
        dev: &D,
        grads: &[D::Buffer],
        comm: Option<&dyn Collective<D>>,
    ) -> Result<f32> {
        dev.fill(&mut self.norm, 0.0)?;
        for g in grads {
            dev.exec(SumSquares {
                x: g,
                out: &mut self.norm,
                slot: 0,
            })?;
        }
        if let Some(c) = comm {
            c.all_reduce(&mut self.norm, ReduceOp::Avg)?;
            c.wait()?;
        }
        let sq: Vec<f32> = dev.download(&self.norm)?;
        Ok(sq[0].sqrt())
    }

    /// The update without a loss scaler (nothing can be skipped): the norm, the clipping
    /// factor and the update stay on the device (one multi-tensor launch each where the backend
    /// fuses them); the norm is read back for the report only after the update is queued.
    fn step_on_device(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        grads: &[D::Buffer],
        lr: f32,
        comm: Option<&dyn Collective<D>>,
    ) -> Result<StepStats> {
        self.prepare_device_step(dev, lr)?;
        self.queue_device_step(dev, params, grads, comm)?;
        self.device_step_stats(dev)
    }

    /// First part of an update without a loss scaler: counts the step and uploads its learning
    /// rate and bias corrections (and a zero norm accumulator) to the device. What
    /// [`AdamW::queue_device_step`] then queues reads them from there, so that part is the same
    /// for every step (it can be recorded once and replayed).
    pub fn prepare_device_step(&mut self, dev: &D, lr: f32) -> Result<()> {
        self.step += 1;
        let (bc1, bc2) = AdamWStep::bias_corrections(self.cfg.beta1, self.cfg.beta2, self.step);
        self.scalars = [lr, bc1, bc2];
        dev.upload(&[0.0, lr, bc1, bc2], &mut self.norm, 0)?;
        Ok(())
    }

    /// Second part: the global gradient norm and the clipped update, queued on the device
    /// (gradients already all-reduced over `comm`'s ranks, whose norms are averaged).
    pub fn queue_device_step(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        grads: &[D::Buffer],
        comm: Option<&dyn Collective<D>>,
    ) -> Result<()> {
        self.check_lengths(params, grads)?;
        dev.in_range("optimizer", || {
            self.queue_update(dev, params, grads, comm, None)
        })
    }

    /// [`AdamW::queue_device_step`] (one rank) that also writes an FP8 model's weight codes
    /// ([`duet_device::Fp8Ops::adamw_clipped_fp8`], after the model's scaling update), as
    /// [`crate::model::Gpt::update_params_with_fp8_codes`] hands them over; with `None` it is
    /// `queue_device_step`.
    pub fn queue_device_step_fp8(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        grads: &[D::Buffer],
        codes: Option<Fp8WeightCodes<'_, D::Buffer>>,
    ) -> Result<()> {
        self.check_lengths(params, grads)?;
        dev.in_range("optimizer", || {
            self.queue_update(dev, params, grads, None, codes)
        })
    }

    fn check_lengths(&self, params: &[D::Buffer], grads: &[D::Buffer]) -> Result<()> {
        if params.len() != grads.len() || params.len() != self.m.len() {
            return Err(EngineError::Config(format!(
                "optimizer: {} parameters, {} gradients, {} moment tensors",
                params.len(),
                grads.len(),
                self.m.len()
            )));
        }
        Ok(())
    }

    /// [`AdamW::queue_device_step`] after its checks (inside the profiler range).
    fn queue_update(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        grads: &[D::Buffer],
        comm: Option<&dyn Collective<D>>,
        codes: Option<Fp8WeightCodes<'_, D::Buffer>>,
    ) -> Result<()> {
        let refs: Vec<&D::Buffer> = grads.iter().collect();
        dev.exec(SumSquaresMany {
            xs: &refs,
            out: &mut self.norm,
            slot: 0,
        })?;
        if let Some(c) = comm {
            c.all_reduce(&mut self.norm, ReduceOp::Avg)?;
            c.wait()?;
            // Averaging may round the per-step values the ranks agree on: put them back.
            dev.upload(&self.scalars, &mut self.norm, 1)?;
        }
        let cfg = self.cfg;
        let mut tensors = Vec::with_capacity(params.len());
        for ((((p, g), m), v), (master, &decay)) in params
            .iter_mut()
            .zip(grads)
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
            .zip(self.master.iter_mut().zip(&self.decay))
        {
            let (param, copy) = match master {
                Some(mb) => (mb, Some(p)),
                None => (p, None),
            };
            tensors.push(AdamWTensor {
                param,
                grad: g,
                m,
                v,
                copy,
                weight_decay: if decay { cfg.weight_decay } else { 0.0 },
            });
        }
        let step = AdamWClipStep {
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            max_norm: cfg.grad_clip,
            loss_scale: 1.0,
        };
        match codes {
            Some(mut c) => dev.exec(AdamWClippedFp8 {
                tensors: &mut tensors,
                step: &step,
                scalars: &self.norm,
                outs: &mut c.outs,
                scale: c.scale,
                amax: c.amax,
            })?,
            None => dev.exec(AdamWClipped {
                tensors: &mut tensors,
                step: &step,
                scalars: &self.norm,
            })?,
        }
        Ok(())
    }

    /// Last part: reads the gradient norm back (waits for the device) for the step's report.
    pub fn device_step_stats(&self, dev: &D) -> Result<StepStats> {
        let sq: Vec<f32> = dev.download_range(&self.norm, 0, 1)?;
        Ok(self.cfg.plan(sq[0].sqrt(), None).stats)
    }

    /// Clips and applies one AdamW update with learning rate `lr`.
    pub fn step(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        grads: &[D::Buffer],
        lr: f32,
    ) -> Result<StepStats> {
        self.step_scaled(dev, params, grads, lr, None)
    }

    /// [`AdamW::step`] for gradients multiplied by `scaler`'s loss scale: the norm is unscaled
    /// before clipping, `1/scale` is folded into AdamW's gradient factor, and a non-finite norm
    /// skips the update (the scaler decides the next scale).
    pub fn step_scaled(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        grads: &[D::Buffer],
        lr: f32,
        scaler: Option<&mut LossScaler>,
    ) -> Result<StepStats> {
        self.step_reduced(dev, params, grads, lr, scaler, None)
    }

    /// [`AdamW::step_scaled`] on gradients already all-reduced over the ranks of `comm`
    /// (replicated data parallelism): the norm is agreed between the ranks first.
    pub fn step_reduced(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        grads: &[D::Buffer],
        lr: f32,
        scaler: Option<&mut LossScaler>,
        comm: Option<&dyn Collective<D>>,
    ) -> Result<StepStats> {
        if scaler.is_none() {
            return self.step_on_device(dev, params, grads, lr, comm);
        }
        let raw_norm = self.grad_norm_reduced(dev, grads, comm)?;
        let plan = self.cfg.plan(raw_norm, scaler);
        if plan.stats.skipped {
            return Ok(plan.stats);
        }
        let (clip_scale, loss_scale, grad_norm, grad_scale) = (
            plan.stats.clip_scale,
            plan.stats.loss_scale,
            plan.stats.grad_norm,
            plan.grad_scale,
        );
        self.step += 1;
        let (bc1, bc2) = AdamWStep::bias_corrections(self.cfg.beta1, self.cfg.beta2, self.step);
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            let step = AdamWStep {
                lr,
                beta1: self.cfg.beta1,
                beta2: self.cfg.beta2,
                eps: self.cfg.eps,
                weight_decay: if self.decay[i] {
                    self.cfg.weight_decay
                } else {
                    0.0
                },
                bias_correction1: bc1,
                bias_correction2: bc2,
                grad_scale,
            };
            match &mut self.master[i] {
                Some(master) => dev.exec(AdamWUpdate {
                    param: master,
                    grad: g,
                    m: &mut self.m[i],
                    v: &mut self.v[i],
                    step: &step,
                    param_copy: Some(p),
                })?,
                None => dev.exec(AdamWUpdate {
                    param: p,
                    grad: g,
                    m: &mut self.m[i],
                    v: &mut self.v[i],
                    step: &step,
                    param_copy: None,
                })?,
            }
        }
        Ok(StepStats {
            grad_norm,
            clip_scale,
            skipped: false,
            loss_scale,
        })
    }

    /// The device step's scalars ([`duet_device::ADAMW_SCALARS`] f32): element 0 holds the
    /// gradients' sum of squares once [`AdamW::queue_device_step`] has run, which
    /// [`AdamW::device_step_stats`] reads back. For copying it aside without a host
    /// synchronisation.
    pub fn step_scalars(&self) -> &D::Buffer {
        &self.norm
    }
}
