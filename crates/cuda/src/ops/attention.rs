//! [`AttentionOps`] for [`CudaDevice`]: head permutations, causal softmax, fused attention.
//!
//! Fused causal attention (kernels-cuda/flash_attention.cu): see
//! [`duet_device::AttentionOps::flash_attention_forward`].
//!
//! Two versions of the kernels; version 2 is the default, version 1 runs when the environment
//! variable `DUET_FLASH_V1` is true (`1`, `true`, `yes`, `on`; read once per process, see
//! [`duet_device::knobs`]), or on a thread that called
//! [`CudaDevice::flash_attention_v1_on_this_thread`] (tests, benchmarks).
//!
//! Version 1. Forward: one kernel, a block per 64 queries of one head, looping over the key
//! tiles up to the diagonal with an online softmax; it writes `out` and the per-row
//! log-sum-exp `lse`. Backward: `rowdot` computes `D_i = Σ_c dO·O` per query row into backend
//! scratch, then `backward_dkv` (a block per 64 keys, looping over the query tiles from the
//! diagonal on) writes dK and dV, and `backward_dq` (a block per 64 queries, looping over the
//! key tiles up to the diagonal) writes dQ, each recomputing the probabilities from Q, K and
//! `lse`.
//!
//! Version 2. Forward (`forward2`): a block per 128 queries, each of the 4 warps owning 32 rows,
//! so each K/V fragment read from shared memory feeds two tensor-core products; key tiles of 64
//! (hs 64) or 32 (hs 128) rows. Backward: `backward_dq2` computes D for its own query rows in
//! its prologue (no `rowdot` launch) and writes it for `backward_dkv`, which runs after it.
//!
//! Version 3 backward (the default with version 2's forward for head size 128, while its dS
//! buffer stays within [`DS_MAX_BYTES`]): `rowdot` computes D, then `backward_dkv3` writes dK and dV and also stores
//! dSᵀ (bf16/f16, as it enters dK's product) into backend scratch, a `tp × tp` matrix per head
//! (`tp` = t rounded up to 64, only the tiles on and below the diagonal written), then
//! `backward_dq3` (a block per 64 queries) computes dQ = scale · dS·K from it: one product
//! instead of recomputing S, P and dP (three), for 2 bytes of dS written and read per score.
//! On the H200 (flash_bench, b=32, t=256) it takes 206 against version 2's 225 µs at nh=16,
//! hs=128, and 90.6 against 89.2 µs at nh=12, hs=64, where the saved products are the smaller
//! share: head size 64 keeps version 2's backward. A thread that called
//! [`CudaDevice::flash_backward_v3_on_this_thread`] picks either for every head size.
//!
//! Version 4 backward (the default for head size 64 from [`V4_MIN_T`] tokens on, with version
//! 2's forward): version 2's backward with each warp owning 32 rows instead of 16
//! (`backward_dq4`: a block per 128 queries, key tiles of 32; `backward_dkv4`: a block per 128
//! keys, query tiles of 32), so each fragment read from shared memory feeds two tensor-core
//! products. The same products in the same order per element: the results are version 2's. A
//! thread that called [`CudaDevice::flash_backward_v4_on_this_thread`] picks either.
//!
//! Every output element is written by exactly one thread with a fixed summation order: no
//! atomics, results are bit-identical run to run (for a given version).

use super::prelude::*;
use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUfunction_attribute;
use duet_device::composed;
use std::cell::Cell;

/// Threads per block of the attention kernels (4 warps of 16 rows each).
const THREADS: u32 = 128;
/// Query rows per block of the forward and dQ kernels, key rows per block of the dK/dV kernel.
const TILE: usize = 64;
/// Query rows per block of the version-2 forward kernel.
const TILE2: usize = 128;
/// Threads per block of the `rowdot` kernel.
const ROWDOT_BLOCK: u32 = 256;

/// Largest dSᵀ buffer (bytes) of the version-3 backward; longer sequences run version 2's.
const DS_MAX_BYTES: usize = 512 << 20;
/// Smallest head size whose default backward is version 3 (see the module documentation).
const V3_MIN_HS: usize = 128;
/// Query and key rows per block of the version-3 dQ kernel (its dSᵀ tiles are 64 × 64).
const TILE3: usize = 64;
/// Query rows per block of the version-4 dQ kernel, key rows per block of its dK/dV kernel.
const TILE4: usize = 128;
/// The head size version 4's backward is built for (its 32-row accumulators fit the registers).
const V4_HS: usize = 64;
/// Shortest sequence whose default backward is version 4: its 128-row blocks leave too few
/// blocks per head below (H100, flash_bench: t 256 0.92×, t 1024 1.07× version 2's time).
const V4_MIN_T: usize = 512;

thread_local! {
    /// Per-thread override of the kernel version (`Some(true)`: version 1).
    static V1_ON_THREAD: Cell<Option<bool>> = const { Cell::new(None) };
    /// Per-thread override of the version-3 backward (`Some(false)`: version 2's).
    static V3_ON_THREAD: Cell<Option<bool>> = const { Cell::new(None) };
    /// Per-thread override of the version-4 backward (`Some(false)`: version 2's).
    static V4_ON_THREAD: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether the attention calls made on this thread use the version-1 kernels: the thread's
/// override, else `DUET_FLASH_V1` ([`duet_device::knobs::Knobs::flash_v1`]).
fn use_v1() -> Result<bool> {
    match V1_ON_THREAD.with(Cell::get) {
        Some(v1) => Ok(v1),
        None => Ok(duet_device::knobs::device_knobs()?.flash_v1),
    }
}

/// The kernel variant for a head size: its name part and the dynamic shared memory (bytes) of
/// the forward, dK/dV and dQ kernels. Must match the tile sizes in flash_attention.cu.
struct Variant {
    name: &'static str,
    hs: usize,
    smem_forward: u32,
    smem_forward2: u32,
    smem_dkv: u32,
    smem_dq: u32,
    smem_dq3: u32,
    /// Version 4's dQ and dK/dV kernels (0 where the head size has none).
    smem_dq4: u32,
    smem_dkv4: u32,
}

/// Bytes of one `rows × hs` tile of a 16-bit type.
const fn tile_bytes(rows: usize, hs: usize) -> u32 {
    (rows * hs * 2) as u32
}

/// The forward kernel keeps Q (64 rows) and two stages of K and V (64 rows each); dK/dV keeps
/// K, V (64 rows) and two stages of Q, dO (BQ rows) plus lse and D (f32, BQ each); dQ keeps Q,
/// dO (64 rows) and two stages of K, V (BK rows). BQ = BK = 64 for hs = 64, 32 for hs = 128.
/// The version-2 forward keeps Q (128 rows) and two stages of K and V (`inner` rows: its key
/// tile is 64 rows for hs = 64, 32 for hs = 128); the version-2 dQ kernel has dQ's layout.
const fn variant(name: &'static str, hs: usize, inner: usize) -> Variant {
    Variant {
        name,
        hs,
        smem_forward: tile_bytes(TILE, hs) + 4 * tile_bytes(TILE, hs),
        smem_forward2: tile_bytes(TILE2, hs) + 4 * tile_bytes(inner, hs),
        smem_dkv: 2 * tile_bytes(TILE, hs) + 4 * tile_bytes(inner, hs) + (4 * inner * 4) as u32,
        smem_dq: 2 * tile_bytes(TILE, hs) + 4 * tile_bytes(inner, hs),
        smem_dq3: 2 * tile_bytes(TILE3, hs) + 2 * tile_bytes(TILE3, TILE3),
        // Version 4 (hs 64): Q, dO (128 rows) and two stages of K, V (32 rows); K, V (128 rows)
        // and two stages of Q, dO (32 rows) plus lse and D (f32, 32 each).
        smem_dq4: if hs == V4_HS {
            2 * tile_bytes(TILE4, hs) + 4 * tile_bytes(32, hs)
        } else {
            0
        },
        smem_dkv4: if hs == V4_HS {
            2 * tile_bytes(TILE4, hs) + 4 * tile_bytes(32, hs) + (4 * 32 * 4) as u32
        } else {
            0
        },
    }
}

const VARIANTS: [Variant; 2] = [variant("hs64", 64, 64), variant("hs128", 128, 32)];

fn variant_for(hs: usize) -> Option<&'static Variant> {
    VARIANTS.iter().find(|v| v.hs == hs)
}

fn dtype_sfx(d: DType) -> Option<&'static str> {
    match d {
        DType::BF16 => Some("bf16"),
        DType::F16 => Some("f16"),
        _ => None,
    }
}

impl CudaDevice {
    /// Selects the attention kernels for the calls made on the calling thread: `Some(true)`
    /// version 1, `Some(false)` version 2, `None` the process default (version 2 unless
    /// `DUET_FLASH_V1` is set). For A/B tests and benchmarks; both versions compute the same
    /// function (not bit-identical to each other).
    pub fn flash_attention_v1_on_this_thread(v1: Option<bool>) {
        V1_ON_THREAD.with(|c| c.set(v1));
    }

    /// Selects the backward kernels of version 2 for the calls made on the calling thread:
    /// `Some(true)` version 3 (where its dS buffer fits), `Some(false)` version 2's, `None` the
    /// default (version 3 for head size 128, version 2's for 64). For A/B tests and benchmarks; the two compute the same function
    /// (dQ not bit-identical: version 3 takes dS from the dK/dV kernel's products).
    pub fn flash_backward_v3_on_this_thread(v3: Option<bool>) {
        V3_ON_THREAD.with(|c| c.set(v3));
    }

    /// Selects version 2's backward in its version-4 form (32 rows per warp; head size 64)
    /// for the calls made on the calling thread: `Some(true)` version 4, `Some(false)` version
    /// 2's, `None` the default (version 4 for head size 64 from [`V4_MIN_T`] tokens on). Both
    /// give the same results. For A/B tests and benchmarks; version 3 (where selected) and
    /// version 1 take precedence.
    pub fn flash_backward_v4_on_this_thread(v4: Option<bool>) {
        V4_ON_THREAD.with(|c| c.set(v4));
    }

    /// Every (dtype, head size) pair a flash kernel variant runs on this GPU.
    pub(crate) fn flash_pairs(&self) -> Vec<(DType, usize)> {
        [DType::BF16, DType::F16]
            .into_iter()
            .flat_map(|d| VARIANTS.iter().map(move |v| (d, v.hs)))
            .filter(|&(d, hs)| self.flash_supported(d, hs))
            .collect()
    }

    pub(crate) fn flash_supported(&self, dtype: DType, hs: usize) -> bool {
        self.flash_variant(dtype, hs).is_ok()
    }

    /// The variant for (`dtype`, `hs`), or why there is none. Needs sm_80 or newer (mma.sync
    /// bf16/f16, ldmatrix, cp.async) and enough opt-in shared memory per block.
    fn flash_variant(
        &self,
        dtype: DType,
        hs: usize,
    ) -> std::result::Result<(&'static Variant, &'static str), String> {
        let sfx = dtype_sfx(dtype).ok_or_else(|| format!("dtype {dtype} (bf16 or f16 only)"))?;
        let v = variant_for(hs).ok_or_else(|| format!("head size {hs} (64 or 128 only)"))?;
        if self.cc < 80 {
            return Err(format!(
                "compute capability {}.{} (needs 8.0 or newer)",
                self.cc / 10,
                self.cc % 10
            ));
        }
        let need = v
            .smem_forward
            .max(v.smem_forward2)
            .max(v.smem_dkv)
            .max(v.smem_dq)
            .max(v.smem_dq3)
            .max(v.smem_dq4)
            .max(v.smem_dkv4);
        let have = self.smem_optin as u32;
        if have < need {
            return Err(format!(
                "{have} bytes of shared memory per block (needs {need})"
            ));
        }
        Ok((v, sfx))
    }

    fn flash_check(
        &self,
        op: &'static str,
        dtype: DType,
        hs: usize,
    ) -> Result<(&'static Variant, &'static str)> {
        self.flash_variant(dtype, hs)
            .map_err(|why| DeviceError::Unsupported {
                op: format!("{op}: {why}"),
                dtype,
            })
    }

    /// Looks up `name` and allows it `smem` bytes of dynamic shared memory.
    fn flash_func(&self, name: &str, smem: u32) -> Result<CudaFunction> {
        let f = self.func(KernelModule::FlashAttention, name)?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(drv("cuFuncSetAttribute"))?;
        Ok(f)
    }
}

impl AttentionOps for CudaDevice {
    fn split_heads(&self, args: Checked<SplitHeads<'_, Self::Buffer>>) -> Result<()> {
        let SplitHeads {
            qkv,
            q,
            k,
            v,
            b,
            t,
            nh,
            hs,
        } = args.into_inner();
        const OP: &str = "split_heads";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        // SAFETY: split_heads(const T*, T*, T*, T*, int b, int t, int nh, int hs): qkv holds
        // 3·b·t·nh·hs elements, q/k/v b·t·nh·hs each (checked); gridDim.y = 3 selects the output.
        unsafe { self.permute_heads(OP, "split_heads", qkv.dtype(), &h, 3, &[qkv, q, k, v]) }
    }

    fn split_heads_backward(
        &self,
        args: Checked<SplitHeadsBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SplitHeadsBackward {
            dq,
            dk,
            dv,
            dqkv,
            b,
            t,
            nh,
            hs,
        } = args.into_inner();
        const OP: &str = "split_heads_backward";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        let bufs = [dq, dk, dv, &*dqkv];
        // SAFETY: split_heads_backward(const T*, const T*, const T*, T*, int b, int t, int nh,
        // int hs): sizes as in split_heads (checked).
        unsafe { self.permute_heads(OP, "split_heads_backward", dqkv.dtype(), &h, 3, &bufs) }
    }

    fn merge_heads(&self, args: Checked<MergeHeads<'_, Self::Buffer>>) -> Result<()> {
        let MergeHeads {
            y,
            out,
            b,
            t,
            nh,
            hs,
            backward,
        } = args.into_inner();
        const OP: &str = "merge_heads";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        let kernel = if backward {
            "merge_heads_backward"
        } else {
            "merge_heads"
        };
        // SAFETY: merge_heads[_backward](const T*, T*, int b, int t, int nh, int hs): both hold
        // b·t·nh·hs elements (checked).
        unsafe { self.permute_heads(OP, kernel, y.dtype(), &h, 1, &[y, out]) }
    }

    fn softmax_causal_forward(
        &self,
        args: Checked<SoftmaxCausalForward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SoftmaxCausalForward {
            scores,
            probs,
            batch: rows,
            t,
            scale,
        } = args.into_inner();
        const OP: &str = "softmax_causal_forward";
        let desc = SoftmaxDesc::new(OP, rows, t)?;
        let total = desc.total;
        let s = float_suffix(OP, scores.dtype())?;
        // The kernels write probs in the scores' dtype.
        check_dtype(OP, probs, scores.dtype())?;
        if total == 0 {
            return Ok(());
        }
        // SAFETY: softmax_causal_forward(const T*, T*, u64 rows·t, int t, float): one warp per
        // line < rows·t, each touching t elements of buffers holding rows·t·t (checked).
        unsafe { self.softmax_rows(OP, s, rows, t, scale, &[scores, probs]) }
    }

    fn softmax_causal_backward(
        &self,
        args: Checked<SoftmaxCausalBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SoftmaxCausalBackward {
            probs,
            dprobs,
            dscores,
            batch: rows,
            t,
            scale,
        } = args.into_inner();
        const OP: &str = "softmax_causal_backward";
        let desc = SoftmaxDesc::new(OP, rows, t)?;
        let total = desc.total;
        let s = float_suffix(OP, probs.dtype())?;
        // The kernels take all three in one dtype.
        same_dtype(OP, probs.dtype(), &[dprobs, dscores])?;
        if total == 0 {
            return Ok(());
        }
        // SAFETY: softmax_causal_backward(const T*, const T*, T*, u64, int, float): as forward.
        unsafe { self.softmax_rows(OP, s, rows, t, scale, &[probs, dprobs, dscores]) }
    }

    fn flash_attention_forward(
        &self,
        args: Checked<FlashAttentionForward<'_, Self::Buffer>>,
    ) -> Result<()> {
        if !self
            .capabilities()
            .flash_attention(args.qkv.dtype(), args.hs)
        {
            return composed::flash_attention_forward(self, args);
        }
        let FlashAttentionForward {
            qkv,
            out,
            lse,
            b,
            t,
            nh,
            hs,
            scale,
        } = args.into_inner();
        const OP: &str = "flash_attention_forward";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        let n = h.n;
        let (v, sfx) = self.flash_check(OP, qkv.dtype(), hs)?;
        if n == 0 {
            return Ok(());
        }
        let heads = grid_dim(OP, b * nh)?;
        let (kernel, tile, smem) = if use_v1()? {
            ("forward", TILE, v.smem_forward)
        } else {
            ("forward2", TILE2, v.smem_forward2)
        };
        let tiles = tile_count(OP, t, tile)?;
        let f = self.flash_func(&format!("flash_attention_{kernel}_{}_{sfx}", v.name), smem)?;
        // SAFETY: flash_attention_forward / forward2(const T* qkv, T* out, float* lse, int t,
        // int nh, float scale): qkv holds b·t·3·nh·hs elements, out b·t·nh·hs, lse b·nh·t
        // (checked); the grid covers b·nh heads × ⌈t/tile⌉ query tiles (tile = the kernel's
        // 64 or 128 rows) and rows past t are neither read nor written; the dynamic shared
        // memory is the size the kernel's tiles need.
        unsafe {
            self.launcher(&f)
                .grid((heads, tiles, 1))
                .block((THREADS, 1, 1))
                .shared_mem(smem)
                .arg_buf(qkv)
                .arg_buf(out)
                .arg_buf(lse)
                .arg_i32(dim(OP, "t", t)?)
                .arg_i32(dim(OP, "nh", nh)?)
                .arg_f32(scale)
                .launch()
        }
    }

    fn flash_attention_backward(
        &self,
        args: Checked<FlashAttentionBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        if !self
            .capabilities()
            .flash_attention(args.qkv.dtype(), args.hs)
        {
            return composed::flash_attention_backward(self, args);
        }
        let FlashAttentionBackward {
            qkv,
            out,
            dout,
            lse,
            dqkv,
            b,
            t,
            nh,
            hs,
            scale,
        } = args.into_inner();
        const OP: &str = "flash_attention_backward";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        let (n, rows) = (h.n, b * nh * t);
        let (v, sfx) = self.flash_check(OP, qkv.dtype(), hs)?;
        if n == 0 {
            return Ok(());
        }
        let heads = grid_dim(OP, b * nh)?;
        let tiles = tile_count(OP, t, TILE)?;
        let (t32, nh32) = (dim(OP, "t", t)?, dim(OP, "nh", nh)?);
        let tp = t.next_multiple_of(TILE3);
        let v3 = !use_v1()? && V3_ON_THREAD.with(Cell::get).unwrap_or(hs >= V3_MIN_HS);
        if let Some(ds_bytes) = tp
            .checked_mul(tp)
            .and_then(|x| x.checked_mul(2 * b * nh))
            .filter(|&bytes| v3 && bytes <= DS_MAX_BYTES)
        {
            return self.flash_backward_v3(
                (qkv, out, dout, lse, dqkv),
                v,
                sfx,
                (heads, rows, t, hs, t32, nh32),
                (tp, ds_bytes),
                scale,
            );
        }
        if !use_v1()? {
            // Version 2's backward, or its version-4 form (32 rows per warp) for head size 64.
            let v4 = hs == V4_HS && V4_ON_THREAD.with(Cell::get).unwrap_or(t >= V4_MIN_T);
            let (dq, dkv, smem_dq, smem_dkv, tiles) = if v4 {
                let tiles = tile_count(OP, t, TILE4)?;
                ("dq4", "dkv4", v.smem_dq4, v.smem_dkv4, tiles)
            } else {
                ("dq2", "dkv", v.smem_dq, v.smem_dkv, tiles)
            };
            let fkv = self.flash_func(
                &format!("flash_attention_backward_{dkv}_{}_{sfx}", v.name),
                smem_dkv,
            )?;
            let fq = self.flash_func(
                &format!("flash_attention_backward_{dq}_{}_{sfx}", v.name),
                smem_dq,
            )?;
            let mut scratch = lock(&self.scratch, OP)?;
            let d = scratch.get(&self.ctx, &self.stream, rows * 4, &self.mem)?;
            // SAFETY: backward_dq2 / dq4(const T* qkv, const T* out, const T* dout,
            // const float* lse, float* d, T* dqkv, int t, int nh, float scale): qkv and dqkv
            // hold b·t·3·nh·hs elements, out and dout b·t·nh·hs, lse b·nh·t (checked), `d`
            // b·nh·t f32 (scratch just sized); one block per head and query tile (64 or 128
            // rows, the kernel's), writing d for and the q part of its rows before t only; the
            // dynamic shared memory is the size the kernel's tiles need.
            unsafe {
                self.launcher(&fq)
                    .grid((heads, tiles, 1))
                    .block((THREADS, 1, 1))
                    .shared_mem(smem_dq)
                    .arg_buf(qkv)
                    .arg_buf(out)
                    .arg_buf(dout)
                    .arg_buf(lse)
                    .arg_ptr(d)
                    .arg_buf(dqkv)
                    .arg_i32(t32)
                    .arg_i32(nh32)
                    .arg_f32(scale)
                    .launch()?;
            }
            // SAFETY: backward_dkv / dkv4(const T* qkv, const T* dout, const float* lse,
            // const float* d, T* dqkv, int t, int nh, float scale): sizes as above; `d` was
            // written for every row before t by backward_dq2 / dq4 earlier on the same stream;
            // one block per head and key tile (64 or 128 rows, the kernel's), writing only the
            // k and v parts of its rows before t.
            return unsafe {
                self.launcher(&fkv)
                    .grid((heads, tiles, 1))
                    .block((THREADS, 1, 1))
                    .shared_mem(smem_dkv)
                    .arg_buf(qkv)
                    .arg_buf(dout)
                    .arg_buf(lse)
                    .arg_ptr(d)
                    .arg_buf(dqkv)
                    .arg_i32(t32)
                    .arg_i32(nh32)
                    .arg_f32(scale)
                    .launch()
            };
        }
        let fkv = self.flash_func(
            &format!("flash_attention_backward_dkv_{}_{sfx}", v.name),
            v.smem_dkv,
        )?;
        let fq = self.flash_func(
            &format!("flash_attention_backward_dq_{}_{sfx}", v.name),
            v.smem_dq,
        )?;
        let mut scratch = lock(&self.scratch, OP)?;
        let d = scratch.get(&self.ctx, &self.stream, rows * 4, &self.mem)?;
        self.flash_rowdot(v, sfx, out, dout, d, (rows, t32, nh32, hs))?;
        let args = [
            Arg::U64(qkv.ptr()),
            Arg::U64(dout.ptr()),
            Arg::U64(lse.ptr()),
            Arg::U64(d),
            Arg::U64(dqkv.ptr()),
            Arg::I32(t32),
            Arg::I32(nh32),
            Arg::F32(scale),
        ];
        // SAFETY: backward_dkv(const T* qkv, const T* dout, const float* lse, const float* d,
        // T* dqkv, int t, int nh, float scale): qkv and dqkv hold b·t·3·nh·hs elements, dout
        // b·t·nh·hs, lse and d b·nh·t (checked / sized above); one block per head and 64-key
        // tile, writing only the k and v parts of its rows before t.
        unsafe {
            self.launcher(&fkv)
                .grid((heads, tiles, 1))
                .block((THREADS, 1, 1))
                .shared_mem(v.smem_dkv)
                .args(&args)
                .launch()?
        };
        // SAFETY: backward_dq has the same parameters and sizes; one block per head and
        // 64-query tile, writing only the q part of its rows before t.
        unsafe {
            self.launcher(&fq)
                .grid((heads, tiles, 1))
                .block((THREADS, 1, 1))
                .shared_mem(v.smem_dq)
                .args(&args)
                .launch()
        }
    }
}

impl CudaDevice {
    /// `rowdot`: D = Σ_c dO·O for each of the `rows` query rows (b·nh·t) into `d` (device
    /// address of `rows` f32 the caller holds in the scratch). `out` and `dout` are checked by
    /// the caller to hold rows·hs elements.
    fn flash_rowdot(
        &self,
        v: &Variant,
        sfx: &str,
        out: &CudaBuffer,
        dout: &CudaBuffer,
        d: u64,
        (rows, t32, nh32, hs): (usize, i32, i32, usize),
    ) -> Result<()> {
        const OP: &str = "flash_attention_backward";
        let fr = self.func(
            KernelModule::FlashAttention,
            &format!("flash_attention_rowdot_{}_{sfx}", v.name),
        )?;
        let threads = checked_product(OP, &[rows, hs / 8])?;
        let blocks = grid_dim(OP, threads.div_ceil(ROWDOT_BLOCK as usize))?;
        // SAFETY: rowdot(const T* out, const T* dout, float* d, u64 rows, int t, int nh): out
        // and dout hold rows·hs elements, `d` rows f32 (see above); hs/8 threads per row,
        // threads past the last row only join the shuffles.
        unsafe {
            self.launcher(&fr)
                .grid((blocks, 1, 1))
                .block((ROWDOT_BLOCK, 1, 1))
                .arg_buf(out)
                .arg_buf(dout)
                .arg_ptr(d)
                .arg_u64(rows as u64)
                .arg_i32(t32)
                .arg_i32(nh32)
                .launch()
        }
    }

    /// The version-3 backward (see the module documentation): rowdot, dkv3, dq3. Operands and
    /// sizes checked by the caller: `heads` = b·nh, `rows` = b·nh·t, `t32`/`nh32` t and nh as
    /// kernel ints, `tp` = t rounded up to 64, `ds_bytes` = b·nh·tp²·2.
    #[allow(clippy::type_complexity)]
    fn flash_backward_v3(
        &self,
        (qkv, out, dout, lse, dqkv): (
            &CudaBuffer,
            &CudaBuffer,
            &CudaBuffer,
            &CudaBuffer,
            &mut CudaBuffer,
        ),
        v: &Variant,
        sfx: &str,
        (heads, rows, t, hs, t32, nh32): (u32, usize, usize, usize, i32, i32),
        (tp, ds_bytes): (usize, usize),
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "flash_attention_backward";
        let tp32 = dim(OP, "tp", tp)?;
        let fkv = self.flash_func(
            &format!("flash_attention_backward_dkv3_{}_{sfx}", v.name),
            v.smem_dkv,
        )?;
        let fq = self.flash_func(
            &format!("flash_attention_backward_dq3_{}_{sfx}", v.name),
            v.smem_dq3,
        )?;
        let ds_off = align_up(rows * 4);
        let mut scratch = lock(&self.scratch, OP)?;
        let d = scratch.get(&self.ctx, &self.stream, ds_off + ds_bytes, &self.mem)?;
        let ds = d + ds_off as u64;
        self.flash_rowdot(v, sfx, out, dout, d, (rows, t32, nh32, hs))?;
        let kv_tiles = tile_count(OP, t, TILE)?;
        // SAFETY: backward_dkv3(const T* qkv, const T* dout, const float* lse, const float* d,
        // T* dqkv, int t, int nh, float scale, T* ds, int tp): qkv and dqkv hold b·t·3·nh·hs
        // elements, dout b·t·nh·hs, lse b·nh·t (checked by the caller), d b·nh·t f32 written by
        // rowdot above on the same stream, ds b·nh·tp·tp elements of T (the scratch after d,
        // 256-byte aligned); one block per head and 64-key tile, writing the k and v parts of
        // its rows before t and its dSᵀ rows before t for query columns below tp.
        unsafe {
            self.launcher(&fkv)
                .grid((heads, kv_tiles, 1))
                .block((THREADS, 1, 1))
                .shared_mem(v.smem_dkv)
                .arg_buf(qkv)
                .arg_buf(dout)
                .arg_buf(lse)
                .arg_ptr(d)
                .arg_buf(dqkv)
                .arg_i32(t32)
                .arg_i32(nh32)
                .arg_f32(scale)
                .arg_ptr(ds)
                .arg_i32(tp32)
                .launch()?;
        }
        let q_tiles = tile_count(OP, t, TILE3)?;
        // SAFETY: backward_dq3(const T* qkv, const T* ds, T* dqkv, int t, int nh, int tp,
        // float scale): sizes as above; it reads the dSᵀ tiles on and below the diagonal that
        // dkv3 wrote earlier on the same stream (rows ≥ t zero-filled on load, columns ≥ t only
        // feed rows that are not stored); one block per head and 64-query tile, writing only
        // the q part of its rows before t.
        unsafe {
            self.launcher(&fq)
                .grid((heads, q_tiles, 1))
                .block((THREADS, 1, 1))
                .shared_mem(v.smem_dq3)
                .arg_buf(qkv)
                .arg_ptr(ds)
                .arg_buf(dqkv)
                .arg_i32(t32)
                .arg_i32(nh32)
                .arg_i32(tp32)
                .arg_f32(scale)
                .launch()
        }
    }
}

/// Number of `tile`-row tiles covering `t` rows (gridDim.y).
fn tile_count(op: &'static str, t: usize, tile: usize) -> Result<u32> {
    let tiles = t.div_ceil(tile);
    u32::try_from(tiles)
        .ok()
        .filter(|&n| n <= 65535)
        .ok_or_else(|| too_large(op, "t / tile (grid rows)", tiles))
}

impl CudaDevice {
    /// Launches the head permutation `<kernel>_<T>` (attention.cu) of `dtype` elements, `h.n`
    /// per head tensor, in a grid-stride loop (16-byte packs where `hs` is whole packs, else
    /// single elements) with `ys` blocks along y: the pointer parameters `bufs`, then
    /// `int b, int t, int nh, int hs` of `h`. Nothing for `h.n == 0`.
    ///
    /// # Safety
    /// `bufs` must be the kernel's pointer parameters in order, each holding every element the
    /// kernel touches for `h` and `ys`.
    unsafe fn permute_heads(
        &self,
        op: &'static str,
        kernel: &str,
        dtype: DType,
        h: &HeadsDesc,
        ys: u32,
        bufs: &[&CudaBuffer],
    ) -> Result<()> {
        // The kernels move f32, f16 and bf16 elements.
        let s = float_suffix(op, dtype)?;
        if h.n == 0 {
            return Ok(());
        }
        let pack = 16 / dtype.size_bytes();
        let units = if h.hs.is_multiple_of(pack) {
            h.n / pack
        } else {
            h.n
        };
        let f = self.func(KernelModule::Attention, &format!("{kernel}_{s}"))?;
        let launch = self
            .launcher(&f)
            .grid((self.grid_1d(units).0, ys, 1))
            .block((EW_BLOCK, 1, 1));
        let launch = bufs.iter().fold(launch, |l, b| l.arg_buf(b));
        // SAFETY: the pointer parameters are the caller's (see `# Safety`); the four ints
        // follow in the kernel's order.
        unsafe {
            launch
                .arg_i32(dim(op, "b", h.b)?)
                .arg_i32(dim(op, "t", h.t)?)
                .arg_i32(dim(op, "nh", h.nh)?)
                .arg_i32(dim(op, "hs", h.hs)?)
                .launch()
        }
    }

    /// Launches the causal softmax kernel `<op>_<s>` (softmax.cu) over `rows · t` lines of `t`
    /// elements, one warp per line: the pointer parameters `bufs`, then
    /// `u64 rows·t, int t, float scale`.
    ///
    /// # Safety
    /// `bufs` must be the kernel's pointer parameters in order, each holding `rows · t · t`
    /// elements of the kernel's dtype.
    unsafe fn softmax_rows(
        &self,
        op: &'static str,
        s: &str,
        rows: usize,
        t: usize,
        scale: f32,
        bufs: &[&CudaBuffer],
    ) -> Result<()> {
        let lines = rows * t;
        let launch = self
            .kernel(KernelModule::Softmax, &format!("{op}_{s}"))?
            .grid(rows_grid(op, lines)?)
            .block((ROW_BLOCK, 1, 1));
        let launch = bufs.iter().fold(launch, |l, b| l.arg_buf(b));
        // SAFETY: the pointer parameters are the caller's (see `# Safety`); the line count, t
        // and the scale follow in the kernel's order.
        unsafe {
            launch
                .arg_u64(lines as u64)
                .arg_i32(dim(op, "t", t)?)
                .arg_f32(scale)
                .launch()
        }
    }
}
