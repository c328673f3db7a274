//! [`Device`]: every op family over one runtime.

use crate::*;

/// A compute device: the [`Runtime`] (memory, copies, a stream, graphs, timing) and every op
/// family. Implemented for every type that implements the family traits, so a backend never
/// writes it; generic code writes `D: Device` and calls any op.
///
/// **One fallback style.** Every op that a sequence of other ops can express has a default body
/// composed of them (allocating temporaries where the composition needs them), so it works on
/// every backend from day one and the conformance suite checks a backend's override against
/// it. A backend overrides what it has natively and says so in its [`Capabilities`], which
/// callers read once to plan around the native paths (the engine sizes its memory plan for
/// native flash attention or for its own composed attention, and fuses GEMM epilogues only
/// where they are native: a composed default allocates per call).
///
/// Every op takes its named arguments as [`Checked`]: [`Check::check`] (the contract's shape,
/// length and dtype rules in [`args`]) runs before any backend touches memory, and problems are
/// [`DeviceError`]s; [`Runtime::exec`] checks and dispatches in one call. Buffers
/// passed as outputs (`&mut`) must not alias inputs; Rust's borrow rules enforce that for
/// distinct buffers.
pub trait Device:
    Runtime
    + ElementwiseOps
    + GemmOps
    + EmbeddingOps
    + NormOps
    + AttentionOps
    + LossOps
    + OptimOps
    + Fp8Ops
{
}

impl<D> Device for D where
    D: Runtime
        + ElementwiseOps
        + GemmOps
        + EmbeddingOps
        + NormOps
        + AttentionOps
        + LossOps
        + OptimOps
        + Fp8Ops
{
}
