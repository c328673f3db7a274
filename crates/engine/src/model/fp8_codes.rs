use super::Gpt;
use super::params::{BlockParam, param_index};
use crate::config::ModelConfig;
use crate::fp8::{Fp8State, Operand, OperandReport};
use crate::{EngineError, Result};
use duet_device::{AdamWFp8Out, Device, DeviceExt, Fp8QuantJob, QuantizeFp8Many};

/// The linear layers of a block, in FP8 metadata order.
pub(super) const LINEARS: [(BlockParam, &str); 4] = [
    (BlockParam::AttnW, "attn.c_attn"),
    (BlockParam::ProjW, "attn.c_proj"),
    (BlockParam::FcW, "mlp.c_fc"),
    (BlockParam::FcProjW, "mlp.c_proj"),
];

/// The FP8 id of layer `l`'s linear layer whose weight is `w`: its place in the table of
/// linears, layer by layer ([`LINEARS`]). Its scaling slots ([`Fp8State::slot`]) and code
/// buffers follow from it.
pub(super) fn linear_id(l: usize, w: BlockParam) -> usize {
    let kind = LINEARS
        .iter()
        .position(|&(p, _)| p == w)
        .unwrap_or_else(|| panic!("{w:?} is not a linear layer's weight"));
    l * LINEARS.len() + kind
}

/// The FP8 weight codes an optimizer update writes ([`Gpt::update_params_with_fp8_codes`],
/// [`crate::optim::AdamW::queue_device_step_fp8`]).
pub struct Fp8WeightCodes<'a, B> {
    /// One per linear layer's weight matrix.
    pub outs: Vec<AdamWFp8Out<'a, B>>,
    pub scale: &'a B,
    pub amax: &'a mut B,
}

/// Where the FP8 weight codes stand. Delayed scaling quantises the weights of a step with the
/// scales set after the previous step, so the optimizer can write them
/// ([`Gpt::update_params_with_fp8_codes`]) and the next forward pass skip the quantisation. The
/// amax slots of the weights must then hold what the separate path would have recorded: the
/// max over every quantisation of the weights since the last scaling update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fp8Codes {
    /// `w8` and `w8t` are the codes of the current weights at the current scales, their amaxes
    /// recorded: the forward pass does not quantise the weights.
    pub(super) fresh: bool,
    /// Those amaxes were recorded by the optimizer for a forward pass that has not run yet (the
    /// separate path records them when that pass quantises).
    pub(super) unclaimed: bool,
    /// Unclaimed amaxes of weights that have since changed: the weights' slots are zeroed
    /// before anything records into them or reads them.
    pub(super) reset: bool,
}

impl Fp8Codes {
    /// After the optimizer wrote them.
    pub(crate) const WRITTEN: Self = Self {
        fresh: true,
        unclaimed: true,
        reset: false,
    };
    /// After a forward pass quantised the weights (or used the optimizer's codes).
    const QUANTISED: Self = Self {
        fresh: true,
        unclaimed: false,
        reset: false,
    };

    /// The weights change: the codes no longer match, and unclaimed amaxes no longer belong.
    fn stale(&mut self) {
        self.reset |= self.unclaimed;
        self.fresh = false;
        self.unclaimed = false;
    }
}

/// FP8 copies of the linear layers' operands and their scaling metadata.
pub(super) struct Fp8Bufs<D: Device> {
    pub(super) state: Fp8State<D>,
    /// What `w8`, `w8t` and the weights' amax slots hold (see [`Fp8Codes`]).
    pub(super) codes: Fp8Codes,
    /// Per kind of linear layer: the input (used by the forward GEMM only, so reused by every
    /// layer). Per linear layer (`4·layer + kind`): the input's transpose (kept for the weight
    /// gradient), the weight and its transpose (for the input gradient), all quantised at the
    /// start of the forward pass in one call.
    pub(super) x8: Vec<D::Buffer>,
    pub(super) x8t: Vec<D::Buffer>,
    pub(super) w8: Vec<D::Buffer>,
    pub(super) w8t: Vec<D::Buffer>,
    /// Per kind of linear layer: the output gradient and its transpose (reused by every layer).
    pub(super) dy8: Vec<D::Buffer>,
    pub(super) dy8t: Vec<D::Buffer>,
    /// Receives the amaxes of a checkpointed segment's recomputation, so the recompute neither
    /// records an amax twice nor touches the scaling history.
    pub(super) amax_discard: D::Buffer,
}

/// Whether parameter `i` (in [`param_specs`] order) is a linear layer's weight matrix.
pub(super) fn is_linear_weight(cfg: &ModelConfig, i: usize) -> bool {
    (2..2 + cfg.layers * BlockParam::ALL.len()).contains(&i) && {
        let p = BlockParam::ALL[(i - 2) % BlockParam::ALL.len()];
        LINEARS.iter().any(|&(w, _)| w == p)
    }
}

/// Every linear layer's weight codes (`w8`, `w8t`: the codes and
/// transposed codes), each with its weight's index in [`param_specs`] order, its shape and its
/// slot of the FP8 scales and amaxes: what the optimizer writes
/// ([`Gpt::update_params_with_fp8_codes`]) or the forward pass quantises.
pub(super) fn weight_code_outs<'a, D: Device>(
    cfg: &ModelConfig,
    w8: &'a mut [D::Buffer],
    w8t: &'a mut [D::Buffer],
) -> Vec<AdamWFp8Out<'a, D::Buffer>> {
    w8.iter_mut()
        .zip(w8t.iter_mut())
        .enumerate()
        .map(|(id, (w8, w8t))| {
            let (l, kind) = (id / LINEARS.len(), id % LINEARS.len());
            let (cols, rows) = linear_dims(cfg, kind);
            AdamWFp8Out {
                tensor: param_index(l, LINEARS[kind].0),
                dst: w8,
                dst_t: Some(w8t),
                rows,
                cols,
                slot: Fp8State::<D>::slot(id, Operand::Weight),
            }
        })
        .collect()
}

/// `(in_features, out_features)` of linear kind `k` (see [`LINEARS`]).
pub(super) fn linear_dims(cfg: &ModelConfig, k: usize) -> (usize, usize) {
    // The weight is `[out_features, in_features]`.
    let shape = LINEARS[k].0.shape(cfg.d_model, cfg.ffn);
    (shape[1], shape[0])
}

impl<D: Device> Gpt<D> {
    /// FP8 only: folds the amaxes recorded since the last call into the histories and sets the
    /// scales the next step uses. A no-op in other precisions.
    pub fn fp8_update(&mut self) -> Result<()> {
        // Amaxes the optimizer recorded for a forward pass that did not run are not folded in.
        self.forget_fp8_codes()?;
        if let Some(q) = &mut self.fp8 {
            q.state.update(&*self.dev)?;
        }
        Ok(())
    }

    /// Whether the model runs its linear layers in FP8.
    pub fn fp8_enabled(&self) -> bool {
        self.fp8.is_some()
    }

    /// FP8 only: every operand's scale and amax history (what a checkpoint needs to resume
    /// delayed scaling exactly), in metadata order (layer, linear, operand).
    pub fn fp8_state(&self) -> Result<Option<Vec<crate::fp8::OperandScaling>>> {
        self.fp8
            .as_ref()
            .map(|q| q.state.export(&*self.dev))
            .transpose()
    }

    /// FP8 only: restores [`Gpt::fp8_state`]; an error in other precisions or for a different
    /// model shape or format.
    pub fn set_fp8_state(&mut self, ops: &[crate::fp8::OperandScaling]) -> Result<()> {
        match &mut self.fp8 {
            Some(q) => {
                q.state.import(&*self.dev, ops)?;
                self.forget_fp8_codes()
            }
            None => Err(EngineError::Config(format!(
                "the model runs in {}, it has no FP8 state",
                self.precision
            ))),
        }
    }

    /// FP8 only: a recorded training step (which ends with [`Gpt::fp8_update`]) was replayed,
    /// so the scales and amax histories moved on the device without the host queueing the
    /// update; the next report or export reads them back.
    pub(crate) fn fp8_note_replayed_update(&mut self) {
        if let Some(q) = &mut self.fp8 {
            q.state.note_replayed_update();
        }
    }

    /// FP8 scaling updates queued or replayed since the host last read the state back (0 in
    /// other precisions).
    pub(crate) fn fp8_pending_updates(&mut self) -> usize {
        self.fp8.as_mut().map_or(0, |q| q.state.pending_updates())
    }

    /// Puts back [`Gpt::fp8_pending_updates`] after queued work that never ran.
    pub(crate) fn set_fp8_pending_updates(&mut self, n: usize) {
        if let Some(q) = &mut self.fp8 {
            q.state.set_pending_updates(n);
        }
    }

    /// FP8 only: per layer and operand, the current scale and the first `entries` amax-history
    /// entries (most recent first).
    pub fn fp8_report(&self, entries: usize) -> Result<Option<Vec<OperandReport>>> {
        self.fp8
            .as_ref()
            .map(|q| q.state.report(&*self.dev, entries))
            .transpose()
    }

    /// The weights may change: the FP8 weight codes no longer match them (the next forward
    /// pass quantises them).
    pub(super) fn stale_fp8_codes(&mut self) {
        if let Some(q) = &mut self.fp8 {
            q.codes.stale();
        }
    }

    /// The scales change: the weight codes no longer match them, and amaxes the optimizer
    /// recorded for a forward pass that has not run are zeroed (the next forward pass
    /// quantises the weights and records them again).
    pub(super) fn forget_fp8_codes(&mut self) -> Result<()> {
        self.stale_fp8_codes();
        self.apply_fp8_amax_reset()?;
        if let Some(q) = &mut self.fp8 {
            q.codes = Fp8Codes::default();
        }
        Ok(())
    }

    /// Zeroes the weights' amax slots if [`Fp8Codes::reset`] says so (a small upload per
    /// linear layer; only after the weights were replaced between an update that wrote the
    /// codes and the forward pass).
    pub(super) fn apply_fp8_amax_reset(&mut self) -> Result<()> {
        let Some(q) = self.fp8.as_mut().filter(|q| q.codes.reset) else {
            return Ok(());
        };
        for id in 0..q.w8.len() {
            let slot = Fp8State::<D>::slot(id, Operand::Weight);
            self.dev.upload(&[0.0f32], &mut q.state.amax, slot)?;
        }
        q.codes.reset = false;
        Ok(())
    }

    /// Runs `update` (an optimizer step) on the parameters and gradients, handing it, in FP8,
    /// the weight codes to write: each linear layer's weight matrix (its index in
    /// [`param_specs`] order), its codes and transposed codes, and its slot of the scales and
    /// amaxes ([`duet_device::Fp8Ops::adamw_clipped_fp8`]). Call it after [`Gpt::fp8_update`]:
    /// the codes then take the scales the next step quantises with, and the amaxes land in the
    /// slots that update just reset, so the next forward pass, which skips the weight
    /// quantisation when `update` succeeded, computes exactly what it would have. In other
    /// precisions `update` gets `None`.
    pub fn update_params_with_fp8_codes(
        &mut self,
        update: impl FnOnce(
            &mut [D::Buffer],
            &[D::Buffer],
            Option<Fp8WeightCodes<'_, D::Buffer>>,
        ) -> Result<()>,
    ) -> Result<()> {
        self.stale_fp8_codes();
        self.apply_fp8_amax_reset()?;
        let cfg = &self.cfg;
        let codes = self.fp8.as_mut().map(|q| Fp8WeightCodes {
            outs: weight_code_outs::<D>(cfg, &mut q.w8, &mut q.w8t),
            scale: &q.state.scale,
            amax: &mut q.state.amax,
        });
        update(&mut self.params, &self.grads, codes)?;
        if let Some(q) = &mut self.fp8 {
            q.codes = Fp8Codes::WRITTEN;
        }
        Ok(())
    }

    /// FP8: whether the weight codes match the current weights and scales (written by the last
    /// update, [`Gpt::update_params_with_fp8_codes`], or by a forward pass since), so that the
    /// next forward pass does not quantise the weights.
    pub fn fp8_codes_fresh(&self) -> bool {
        self.fp8.as_ref().is_some_and(|q| q.codes.fresh)
    }

    /// Where the FP8 weight codes stand, for a caller that records a step (recording runs
    /// nothing, so it puts back what they were) or replays one (which leaves them as the
    /// recorded step did).
    pub(crate) fn fp8_codes(&self) -> Fp8Codes {
        self.fp8.as_ref().map(|q| q.codes).unwrap_or_default()
    }

    pub(crate) fn set_fp8_codes(&mut self, codes: Fp8Codes) {
        if let Some(q) = &mut self.fp8 {
            q.codes = codes;
        }
    }

    /// FP8: quantises the weights now unless their codes are fresh (as the next forward pass
    /// would), so that a step recorded or replayed afterwards needs no quantisation and no
    /// upload inside it.
    pub(crate) fn ensure_fp8_codes(&mut self) -> Result<()> {
        self.quantize_fp8_weights()
    }

    /// FP8 only: the device amaxes recorded since the last [`Gpt::fp8_update`] (data
    /// parallelism reduces them over the ranks first).
    pub fn fp8_amax_mut(&mut self) -> Option<&mut D::Buffer> {
        self.fp8.as_mut().map(|q| &mut q.state.amax)
    }

    /// FP8 only: the amaxes recorded since the last [`Gpt::fp8_update`], per operand slot
    /// (`3·linear + operand`, operands input, weight, output gradient).
    pub fn fp8_recorded_amax(&self) -> Result<Option<Vec<f32>>> {
        let Some(q) = &self.fp8 else {
            return Ok(None);
        };
        let mut amax: Vec<f32> = self.dev.download(&q.state.amax)?;
        if q.codes.unclaimed || q.codes.reset {
            // Recorded by the optimizer for a forward pass that has not run (or no longer
            // belonging to the weights): not recorded yet as far as the scaling is concerned.
            for id in 0..q.w8.len() {
                amax[Fp8State::<D>::slot(id, Operand::Weight)] = 0.0;
            }
        }
        Ok(Some(amax))
    }

    /// FP8 only: clears the amaxes recorded since the last update (for inspection and tests).
    pub fn fp8_clear_recorded_amax(&mut self) -> Result<()> {
        if let Some(q) = &mut self.fp8 {
            // The next forward pass records the weights' amaxes again.
            q.codes = Fp8Codes::default();
            self.dev.fill(&mut q.state.amax, 0.0)?;
        }
        Ok(())
    }

    /// FP8: every linear layer's weight quantised (and transposed, for the input gradient) in one
    /// call, recording the weights' amaxes, unless the optimizer already wrote those codes
    /// (`codes_fresh`); the checkpointed segments' recomputation reuses the codes (the weights
    /// have not changed), so it quantises no weight again.
    pub(super) fn quantize_fp8_weights(&mut self) -> Result<()> {
        if let Some(q) = self.fp8.as_mut().filter(|q| q.codes.fresh) {
            // This pass is the one the optimizer recorded the amaxes for.
            q.codes.unclaimed = false;
            return Ok(());
        }
        self.apply_fp8_amax_reset()?;
        let Some(q) = self.fp8.as_mut() else {
            return Ok(());
        };
        let mut jobs: Vec<Fp8QuantJob<'_, D::Buffer>> =
            weight_code_outs::<D>(&self.cfg, &mut q.w8, &mut q.w8t)
                .into_iter()
                .map(|o| Fp8QuantJob {
                    src: &self.params[o.tensor],
                    dst: o.dst,
                    dst_t: o.dst_t,
                    rows: o.rows,
                    cols: o.cols,
                    slot: o.slot,
                })
                .collect();
        let st = &mut q.state;
        self.dev.exec(QuantizeFp8Many {
            jobs: &mut jobs,
            scale: &st.scale,
            amax: &mut st.amax,
        })?;
        q.codes = Fp8Codes::QUANTISED;
        Ok(())
    }
}
