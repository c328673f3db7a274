//! How the fast LayerNorm kernels split a row (kernels-cuda/layernorm.cu `layernorm_fwd_*`,
//! `layernorm_bwd_*`, and kernels-hip/layernorm.hip's port of the forward): the row is held in
//! registers by a group of `g` 32-lane groups, each thread owning `m` vectors of the row. The
//! plan fixes the summation order, so the CUDA and HIP backends share it to compute the same
//! bits. A function of the shape and dtypes only (whole allocations are 16-byte aligned).

use duet_device::DType;

/// Vectors per thread the fast kernels are instantiated for.
pub const LN_M: [usize; 6] = [1, 2, 3, 4, 6, 8];
/// Most 16-byte vectors per thread of the vectorised forward (64 bf16/f16 or 32 f32 elements):
/// rows up to 2048 bf16 elements get one warp each, whose reductions need no block barrier.
pub const LN_FWD_MAX_VECTORS: usize = 8;
/// Warps per block of the fast forward (at most; `⌊8 / g⌋` row groups of `g` warps).
pub const LN_WARPS: usize = 8;
/// Warps per block of the fused backward (at most; `⌊4 / g⌋` row groups of `g` warps).
pub const LN_BWD_WARPS: usize = 4;
/// Most chunks (partial rows) of the fused backward.
pub const LN_MAX_CHUNKS: usize = 512;

/// How the fast LayerNorm kernels split a row of `c` elements.
/// The fused LayerNorm + FP8 quantisations (crates/cuda and crates/hip ops/fp8.rs) use the forward's plan too, so their
/// row statistics follow the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// 16-byte vectors (`c` a multiple of the vector width, buffers 16-byte aligned), else
    /// single elements.
    pub vec: bool,
    /// Warps per row (1..=8).
    pub g: usize,
    /// Vectors per thread (one of [`LN_M`]).
    pub m: usize,
}

impl Plan {
    /// Kernel name of this plan: `layernorm_{fwd|bwd}_<act>_<param>_<v|s><m>`.
    pub fn kernel(&self, pass: &str, sa: &str, sp: &str) -> String {
        let v = if self.vec { 'v' } else { 's' };
        format!("layernorm_{pass}_{sa}_{sp}_{v}{}", self.m)
    }

    /// Elements per thread for rows of `act` (vectors of 16 bytes, or single elements).
    pub fn elements(&self, act: DType) -> usize {
        if self.vec {
            self.m * (16 / act.size_bytes())
        } else {
            self.m
        }
    }

    /// Row groups per block and threads per block, for blocks of at most `warps` warps.
    pub fn block(&self, warps: usize) -> (usize, u32) {
        let groups = warps / self.g;
        (groups, (groups * self.g * 32) as u32)
    }
}

/// The split of a row for the fast kernels, or `None` when the row is too wide for them.
/// Among the group sizes (forward up to 8 warps, backward up to 4) whose threads need at most
/// the instantiated vectors each (forward: [`LN_FWD_MAX_VECTORS`] vectors of 16 bytes;
/// backward: 3; single elements: 6), picks the one with the fewest thread slots, then
/// the fewest warps per row.
pub fn plan(c: usize, act: DType, aligned: bool, backward: bool) -> Option<Plan> {
    let pack = 16 / act.size_bytes();
    let vec = aligned && c.is_multiple_of(pack);
    let (width, max_m) = match (vec, backward) {
        (false, _) => (1, 6),
        (true, true) => (pack, 3),
        (true, false) => (pack, LN_FWD_MAX_VECTORS),
    };
    let nv = c / width;
    let mut best: Option<(usize, Plan)> = None;
    let max_g = if backward { LN_BWD_WARPS } else { LN_WARPS };
    for g in 1..=max_g {
        let per = nv.div_ceil(32 * g);
        let Some(&m) = LN_M.iter().find(|&&m| m >= per && m <= max_m) else {
            continue;
        };
        let slots = 32 * g * per;
        if best.is_none_or(|(s, _)| slots < s) {
            best = Some((slots, Plan { vec, g, m }));
        }
    }
    best.map(|(_, p)| p)
}

/// Whether every address is 16-byte aligned (always true for whole allocations): the vectorised
/// plans need it of each buffer they touch.
pub fn aligned16(addrs: &[u64]) -> bool {
    addrs.iter().all(|p| p.is_multiple_of(16))
}

/// Rows per chunk of the fused backward: a multiple of 4 (every row group gets the same number
/// of rows), at least 4, and at most [`LN_MAX_CHUNKS`] chunks. A function of `n` only.
pub fn ln_rows_per_chunk(n: usize) -> usize {
    n.div_ceil(LN_MAX_CHUNKS).max(4).next_multiple_of(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let p = |c, act, bwd| plan(c, act, true, bwd);
        let v = |g, m| Some(Plan { vec: true, g, m });
        let s = |g, m| Some(Plan { vec: false, g, m });
        assert_eq!(p(768, DType::BF16, false), v(1, 3));
        assert_eq!(p(768, DType::BF16, true), v(1, 3));
        assert_eq!(p(1024, DType::BF16, false), v(1, 4));
        assert_eq!(p(2048, DType::BF16, false), v(1, 8));
        assert_eq!(p(4096, DType::BF16, false), v(2, 8));
        assert_eq!(p(2048, DType::BF16, true), v(4, 2));
        assert_eq!(p(768, DType::F32, false), v(1, 6));
        assert_eq!(p(768, DType::F32, true), v(2, 3));
        assert_eq!(p(1, DType::F32, true), s(1, 1));
        assert_eq!(p(7, DType::BF16, false), s(1, 1));
        assert_eq!(p(100, DType::BF16, true), s(1, 4));
        assert_eq!(p(100, DType::F32, true), v(1, 1));
        assert_eq!(plan(768, DType::BF16, false, true), s(4, 6));
        assert_eq!(p(3072, DType::BF16, true), v(4, 3));
        assert_eq!(p(3080, DType::BF16, true), None);
        assert_eq!(p(6144, DType::BF16, false), v(3, 8));
        assert_eq!(p(6152, DType::BF16, false), v(5, 6));
        assert_eq!(p(16384, DType::BF16, false), v(8, 8));
        assert_eq!(p(16392, DType::BF16, false), None);
        assert_eq!(p(769, DType::F16, true), None);
        assert_eq!(p(1537, DType::F16, false), None);
        assert_eq!(ln_rows_per_chunk(1), 4);
        assert_eq!(ln_rows_per_chunk(8192), 16);
        assert_eq!(ln_rows_per_chunk(1 << 20), 2048);
        for n in [1usize, 7, 8, 9, 100, 2049, 8192, 70000, 1 << 22] {
            assert!(n.div_ceil(ln_rows_per_chunk(n)) <= LN_MAX_CHUNKS);
        }
    }
}
