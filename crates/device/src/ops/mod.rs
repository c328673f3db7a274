//! One trait per op family. Each holds its argument types and, as default bodies, the
//! compositions that make every op work on every backend (a backend overrides what it has
//! natively and says so in its [`crate::Capabilities`]). A family whose defaults compose other
//! families names them as supertraits, so the fallback order reads off the trait headers:
//!
//! ```text
//! Runtime ─┬─ ElementwiseOps ─┬─ GemmOps ── AttentionOps
//!          │                  └─ NormOps
//!          ├─ EmbeddingOps, LossOps, OptimOps
//!          └─ Fp8Ops: NormOps + GemmOps + OptimOps
//! ```

pub mod attention;
pub mod elementwise;
pub mod embedding;
pub mod fp8;
pub mod gemm;
pub mod loss;
pub mod norm;
pub mod optim;
