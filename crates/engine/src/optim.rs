//! AdamW with decoupled weight decay and global L2-norm gradient clipping.

use crate::Result;
use crate::model::ParamSpec;
use duet_device::{AdamWStep, DType, Device, DeviceExt};

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

/// Per-parameter first and second moments, on the device.
pub struct AdamW<D: Device> {
    cfg: AdamWConfig,
    m: Vec<D::Buffer>,
    v: Vec<D::Buffer>,
    decay: Vec<bool>,
    norm: D::Buffer,
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
}

impl<D: Device> AdamW<D> {
    pub fn new(dev: &D, cfg: AdamWConfig, specs: &[ParamSpec]) -> Result<Self> {
        let mut m = Vec::with_capacity(specs.len());
        let mut v = Vec::with_capacity(specs.len());
        for s in specs {
            m.push(dev.alloc(DType::F32, s.numel())?);
            v.push(dev.alloc(DType::F32, s.numel())?);
        }
        Ok(Self {
            cfg,
            m,
            v,
            decay: specs.iter().map(|s| s.decay).collect(),
            norm: dev.alloc(DType::F32, 1)?,
            step: 0,
        })
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

    /// Global L2 norm of `grads` (one host read).
    pub fn grad_norm(&mut self, dev: &D, grads: &[D::Buffer]) -> Result<f32> {
        dev.fill(&mut self.norm, 0.0)?;
        for g in grads {
            dev.sum_squares(g, &mut self.norm, 0)?;
        }
        let sq: Vec<f32> = dev.download(&self.norm)?;
        Ok(sq[0].sqrt())
    }

    /// Clips and applies one AdamW update with learning rate `lr`.
    pub fn step(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        grads: &[D::Buffer],
        lr: f32,
    ) -> Result<StepStats> {
        let grad_norm = self.grad_norm(dev, grads)?;
        // PyTorch's clip_grad_norm_: coefficient max_norm / (norm + 1e-6), applied when < 1.
        let coef = self.cfg.grad_clip / (grad_norm + 1e-6);
        let clip_scale = if self.cfg.grad_clip > 0.0 && coef < 1.0 {
            coef
        } else {
            1.0
        };
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
                grad_scale: clip_scale,
            };
            dev.adamw(p, g, &mut self.m[i], &mut self.v[i], &step, None)?;
        }
        Ok(StepStats {
            grad_norm,
            clip_scale,
        })
    }
}
