//! [`EmbeddingOps`] for [`CudaDevice`]: token and position embeddings (kernels-cuda/embedding.cu).
//!
//! The backward is deterministic without floating-point atomics: a stable radix sort of the
//! positions by token (one 8-bit pass for a vocabulary below 256, two below 65536; O(n) work per
//! pass), the runs of equal tokens, then one warp per (run, column chunk) adding the run's rows in
//! position order to a zeroed accumulator that is added to `dwte` once — the summation order of the
//! previous implementation, so the results are bit-identical to it. The position gradient is a
//! column sum. Launches: 1–2 per pass, 0–2 for the runs, 1 for the token rows, 2 for the column
//! sum.

use super::prelude::*;

/// Keys per sort block (kernels-cuda/embedding.cu: EMB_TILE = EMB_SORT_THREADS · EMB_ITEMS).
const EMB_TILE: usize = 8192;
/// Threads per sort block.
const EMB_SORT_THREADS: u32 = 1024;
/// Buckets per radix pass (8-bit digits).
const EMB_RADIX: usize = 256;
/// Warps per block of embedding_backward_wte (one run each).
const WTE_WARPS: usize = 8;

impl EmbeddingOps for CudaDevice {
    fn embedding_forward(&self, args: Checked<EmbeddingForward<'_, Self::Buffer>>) -> Result<()> {
        let EmbeddingForward {
            tokens,
            wte,
            wpe,
            out,
            b,
            t,
            c,
        } = args.into_inner();
        const OP: &str = "embedding_forward";
        let vocab = wte.len() / c;
        let act = out.dtype();
        let sa = float_suffix(OP, act)?;
        // The kernels take the tables in the activations' dtype or in f32, both in one.
        let sp = wide_suffix(OP, act, "wte", wte.dtype())?;
        check_dtype(OP, wpe, wte.dtype())?;
        let bt = b * t;
        if bt == 0 {
            return Ok(());
        }
        let vocab = dim(OP, "vocab", vocab)?;
        let f = self.func(
            KernelModule::Embedding,
            &format!("embedding_forward_{sa}_{sp}"),
        )?;
        let block = (c.div_ceil(32) * 32).clamp(32, 256) as u32;
        // SAFETY: embedding_forward(const int*, const P*, const P*, A*, int t, int c, int vocab,
        // unsigned*): tokens hold b·t ids, each row reads wte[tok·c..] (tok checked < vocab in
        // the kernel) and wpe[(r % t)·c..] (wpe ≥ t·c), writes out[r·c..] (out = b·t·c).
        unsafe {
            self.launcher(&f)
                .grid((grid_dim(OP, bt)?, 1, 1))
                .block((block, 1, 1))
                .arg_buf(tokens)
                .arg_buf(wte)
                .arg_buf(wpe)
                .arg_buf(out)
                .arg_i32(dim(OP, "t", t)?)
                .arg_i32(dim(OP, "c", c)?)
                .arg_i32(vocab)
                .arg_ptr(self.err_word.ptr())
                .launch()
        }
    }

    fn embedding_backward(&self, args: Checked<EmbeddingBackward<'_, Self::Buffer>>) -> Result<()> {
        let EmbeddingBackward {
            tokens,
            dout,
            dwte,
            dwpe,
            b,
            t,
            c,
        } = args.into_inner();
        const OP: &str = "embedding_backward";
        let vocab_len = dwte.len() / c;
        let act = dout.dtype();
        let sa = float_suffix(OP, act)?;
        // The kernels take the gradient tables in the activations' dtype or in f32, both in one.
        let sg = wide_suffix(OP, act, "dwte", dwte.dtype())?;
        check_dtype(OP, dwpe, dwte.dtype())?;
        let (bt, tc) = (b * t, t * c);
        if bt == 0 {
            return Ok(());
        }
        let n = dim(OP, "b·t", bt)?;
        let vocab = dim(OP, "vocab", vocab_len)?;
        let ci = dim(OP, "c", c)?;

        // Sort plan: 8-bit digits of keys ≤ vocab (invalid ids become `vocab`), EMB_TILE keys
        // per block.
        let passes = (u32::BITS - (vocab as u32).leading_zeros()).div_ceil(8) as usize;
        let tiles = bt.div_ceil(EMB_TILE);
        let num_tiles = dim(OP, "sort tiles", tiles)?;
        let sort_grid = (grid_dim(OP, tiles)?, 1, 1);

        // Scratch layout (i32/u32 arrays, byte offsets): two key/value ping-pong pairs of n
        // each, the digit histogram (256 per tile), the run counts per tile, and the runs
        // (their count, n + 1 starts including the end of the last run, n tokens). The
        // area is sized for the dwpe column sum as well, which reuses it afterwards (stream
        // order), so that call does not reallocate.
        let n_bytes = align_up(bt * 4);
        let off_vals_a = n_bytes;
        let off_keys_b = 2 * n_bytes;
        let off_vals_b = 3 * n_bytes;
        let off_hist = 4 * n_bytes;
        let off_counts = off_hist + align_up(EMB_RADIX * tiles * 4);
        let off_count = off_counts + align_up(tiles * 4);
        let off_start = off_count + align_up(4);
        // The token-row kernel reads the run arrays up to WTE_WARPS - 1 entries past the last
        // possible run (whole blocks of warps), so they get that much slack.
        let off_tok = off_start + align_up((bt + 1 + WTE_WARPS) * 4);
        let sort_bytes = off_tok + align_up((bt + WTE_WARPS) * 4);
        let colsum_bytes = b.div_ceil(rows_per_chunk(b)) * tc * 4;
        let mut scratch = lock(&self.scratch, OP)?;
        let base = scratch.get(
            &self.ctx,
            &self.stream,
            sort_bytes.max(colsum_bytes),
            &self.mem,
        )?;
        let at = |off: usize| base + off as u64;
        let (keys, vals) = ([at(0), at(off_keys_b)], [at(off_vals_a), at(off_vals_b)]);
        let (hist, counts) = (at(off_hist), at(off_counts));
        let (run_count, run_start, run_tok) = (at(off_count), at(off_start), at(off_tok));

        let count_k = self.func(KernelModule::Embedding, "embedding_sort_count")?;
        let scatter_k = self.func(KernelModule::Embedding, "embedding_sort_scatter")?;
        let single_pass = passes == 1;
        for p in 0..passes {
            let first = p == 0;
            let (keys_in, vals_in) = if first {
                (tokens.ptr(), 0)
            } else {
                (keys[(p - 1) % 2], vals[(p - 1) % 2])
            };
            let shift = 8 * p as i32;
            if tiles > 1 {
                // SAFETY: embedding_sort_count(const int*, int n, int shift, int first,
                // int vocab, unsigned* hist, int num_tiles): reads n keys, writes
                // 256·num_tiles counts (the hist area).
                unsafe {
                    self.launcher(&count_k)
                        .grid(sort_grid)
                        .block((EMB_SORT_THREADS, 1, 1))
                        .arg_ptr(keys_in)
                        .arg_i32(n)
                        .arg_i32(shift)
                        .arg_i32(i32::from(first))
                        .arg_i32(vocab)
                        .arg_ptr(hist)
                        .arg_i32(num_tiles)
                        .launch()?;
                }
            }
            // A single pass writes the runs itself and needs no sorted keys.
            let keys_out = if single_pass { 0 } else { keys[p % 2] };
            // SAFETY: embedding_sort_scatter(const int* keys_in, const int* vals_in,
            // int* keys_out, int* vals_out, int n, int shift, int first, int vocab,
            // const unsigned* hist, int num_tiles, int emit_runs, int* run_count,
            // int* run_start, int* run_tok, unsigned* err): reads n keys (and values after the
            // first pass), writes a permutation of them (n each), the runs (≤ vocab + 1 < n + 1
            // words) only when emit_runs.
            unsafe {
                self.launcher(&scatter_k)
                    .grid(sort_grid)
                    .block((EMB_SORT_THREADS, 1, 1))
                    .arg_ptr(keys_in)
                    .arg_ptr(vals_in)
                    .arg_ptr(keys_out)
                    .arg_ptr(vals[p % 2])
                    .arg_i32(n)
                    .arg_i32(shift)
                    .arg_i32(i32::from(first))
                    .arg_i32(vocab)
                    .arg_ptr(hist)
                    .arg_i32(num_tiles)
                    .arg_i32(i32::from(single_pass))
                    .arg_ptr(run_count)
                    .arg_ptr(run_start)
                    .arg_ptr(run_tok)
                    .arg_ptr(self.err_word.ptr())
                    .launch()?;
            }
        }
        let last = (passes - 1) % 2;
        if !single_pass {
            if tiles > 1 {
                let f = self.func(KernelModule::Embedding, "embedding_runs_count")?;
                // SAFETY: embedding_runs_count(const int* keys, int n, int vocab,
                // unsigned* counts): reads n sorted keys, writes num_tiles counts.
                unsafe {
                    self.launcher(&f)
                        .grid(sort_grid)
                        .block((EMB_SORT_THREADS, 1, 1))
                        .arg_ptr(keys[last])
                        .arg_i32(n)
                        .arg_i32(vocab)
                        .arg_ptr(counts)
                        .launch()?;
                }
            }
            // SAFETY: embedding_runs_write(const int* keys, int n, int vocab, int num_tiles,
            // const unsigned* counts, int* run_count, int* run_start, int* run_tok): reads n
            // sorted keys and num_tiles counts, writes 1 + (≤ n + 1) + (≤ n) words.
            unsafe {
                self.kernel(KernelModule::Embedding, "embedding_runs_write")?
                    .grid(sort_grid)
                    .block((EMB_SORT_THREADS, 1, 1))
                    .arg_ptr(keys[last])
                    .arg_i32(n)
                    .arg_i32(vocab)
                    .arg_i32(num_tiles)
                    .arg_ptr(counts)
                    .arg_ptr(run_count)
                    .arg_ptr(run_start)
                    .arg_ptr(run_tok)
                    .launch()?;
            }
        }

        // Token rows: one warp per (run, column group); at most min(n, vocab) runs. Long runs
        // (few tokens) get one 32·VEC-column chunk per warp and 32 rows in flight, short runs
        // four chunks and 4 rows; the choice (from the mean run length) only affects speed, the
        // summation order is the same.
        let elem = act.size_bytes() as u64;
        let vec = if c.is_multiple_of(2) && dout.ptr().is_multiple_of(2 * elem) {
            2
        } else {
            1
        };
        let max_runs = bt.min(vocab_len);
        let (kind, ch) = if bt / max_runs >= 8 {
            ("long", 1)
        } else {
            ("short", 4)
        };
        let wte_k = self.func(
            KernelModule::Embedding,
            &format!("embedding_backward_wte_v{vec}_{kind}_{sa}_{sg}"),
        )?;
        let chunks = c.div_ceil(32 * vec);
        let groups = chunks.div_ceil(ch).min(65535);
        // SAFETY: embedding_backward_wte_vV_K(const int* run_count, const int* run_start,
        // const int* run_tok, const int* sorted, const A* dout, G* dwte, int c, int chunks):
        // reads the runs (indices < 8·grid.x + 1 ≤ n + 1 + WTE_WARPS) and the sorted positions
        // (< n) written above, dout rows < n, and updates dwte rows < vocab (the run tokens
        // are valid ids); columns < c.
        unsafe {
            self.launcher(&wte_k)
                .grid((
                    grid_dim(OP, max_runs.div_ceil(WTE_WARPS))?,
                    grid_dim(OP, groups)?,
                    1,
                ))
                .block((32 * WTE_WARPS as u32, 1, 1))
                .arg_ptr(run_count)
                .arg_ptr(run_start)
                .arg_ptr(run_tok)
                .arg_ptr(vals[last])
                .arg_buf(dout)
                .arg_buf(dwte)
                .arg_i32(ci)
                .arg_i32(dim(OP, "column chunks", chunks)?)
                .launch()?;
        }
        // dwpe[t, :] += Σ_b dout[b, t, :]: a column sum of dout seen as b × (t·c), in the same
        // scratch area (the sort output is no longer needed, stream order).
        // SAFETY: dout holds b × (t·c) elements, dwpe at least t·c.
        unsafe {
            self.column_sum(
                OP,
                &mut scratch,
                dout.ptr(),
                act,
                dwpe.ptr(),
                dwpe.dtype(),
                b,
                tc,
            )
        }
    }
}
