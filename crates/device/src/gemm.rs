use crate::{DeviceError, Result};

/// A (batched) row-major GEMM: for each batch index `i`,
/// `C_i[m × n] = alpha · op(A_i) · op(B_i) + beta · C_i`, where `op(A_i)` is `m × k` and
/// `op(B_i)` is `k × n`.
///
/// Storage is row-major: A is stored `m × k` (`lda ≥ k`) or, with `trans_a`, `k × m` (`lda ≥ m`);
/// B is stored `k × n` (`ldb ≥ n`) or, with `trans_b`, `n × k` (`ldb ≥ k`); C is `m × n`
/// (`ldc ≥ n`). `a_offset` etc. are element offsets of batch 0; `stride_*` the element distance
/// between batches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmDesc {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub alpha: f32,
    pub beta: f32,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub a_offset: usize,
    pub b_offset: usize,
    pub c_offset: usize,
    /// FP8 GEMMs only: accumulate in the tensor cores' fast mode (cuBLASLt's `FAST_ACCUM`, no
    /// periodic promotion to FP32 accumulators) where the backend has it; others ignore it and
    /// accumulate as usual.
    pub fp8_fast_accum: bool,
}

impl GemmDesc {
    /// A single dense GEMM with tight leading dimensions.
    pub fn new(trans_a: bool, trans_b: bool, m: usize, n: usize, k: usize) -> Self {
        Self {
            trans_a,
            trans_b,
            m,
            n,
            k,
            lda: if trans_a { m } else { k },
            ldb: if trans_b { k } else { n },
            ldc: n,
            alpha: 1.0,
            beta: 0.0,
            batch: 1,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            a_offset: 0,
            b_offset: 0,
            c_offset: 0,
            fp8_fast_accum: false,
        }
    }

    /// A strided-batched GEMM of `batch` tightly packed matrices.
    pub fn batched(
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        batch: usize,
    ) -> Self {
        Self {
            batch,
            ..Self::new(trans_a, trans_b, m, n, k)
        }
    }

    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    pub fn beta(mut self, beta: f32) -> Self {
        self.beta = beta;
        self
    }

    /// See [`GemmDesc::fp8_fast_accum`].
    pub fn fp8_fast_accum(mut self, fast: bool) -> Self {
        self.fp8_fast_accum = fast;
        self
    }

    /// Rows and columns of A (and B) as stored.
    pub fn a_stored(&self) -> (usize, usize) {
        if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        }
    }

    pub fn b_stored(&self) -> (usize, usize) {
        if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        }
    }

    /// Validates leading dimensions and that every batch fits in buffers of the given lengths.
    pub fn validate(&self, a_len: usize, b_len: usize, c_len: usize) -> Result<()> {
        let err = |detail: String| Err(DeviceError::Shape { op: "gemm", detail });
        if self.batch == 0 || self.m == 0 || self.n == 0 {
            return Ok(());
        }
        let (ar, ac) = self.a_stored();
        let (br, bc) = self.b_stored();
        if self.lda < ac || self.ldb < bc || self.ldc < self.n {
            return err(format!(
                "leading dimensions too small: lda {} (need {ac}), ldb {} (need {bc}), ldc {} (need {})",
                self.lda, self.ldb, self.ldc, self.n
            ));
        }
        let extent = |rows: usize, cols: usize, ld: usize, stride: usize, off: usize| {
            if rows == 0 || cols == 0 {
                return off;
            }
            off + (self.batch - 1) * stride + (rows - 1) * ld + cols
        };
        let need_a = extent(ar, ac, self.lda, self.stride_a, self.a_offset);
        let need_b = extent(br, bc, self.ldb, self.stride_b, self.b_offset);
        let need_c = extent(self.m, self.n, self.ldc, self.stride_c, self.c_offset);
        if need_a > a_len || need_b > b_len || need_c > c_len {
            return err(format!(
                "{}x{}x{} (batch {}) needs A {need_a}, B {need_b}, C {need_c} elements; buffers hold {a_len}, {b_len}, {c_len}",
                self.m, self.n, self.k, self.batch
            ));
        }
        Ok(())
    }
}
