//! Implements [`EmbeddingOps`] for the CPU: token + position embedding and its deterministic
//! backward.

use super::{par_chunks_f32, read, rows_per_task};
use crate::CpuDevice;
use crate::buffer::CpuBuffer;
use duet_device::{
    Buffer, Checked, DeviceError, EmbeddingBackward, EmbeddingForward, EmbeddingOps, Result,
};
use rayon::prelude::*;

struct Dims {
    vocab: usize,
}

/// The token ids against the vocabulary implied by the table (`table.len() / c`; the sizes were
/// checked by the op's `Check`), on the host, before anything is written.
fn check_tokens(op: &'static str, tokens: &CpuBuffer, table: &CpuBuffer, c: usize) -> Result<Dims> {
    let vocab = table.len() / c;
    let toks = tokens.i32s(op)?;
    if let Some((i, &tok)) = toks
        .iter()
        .enumerate()
        .find(|&(_, &tok)| tok < 0 || tok as usize >= vocab)
    {
        return Err(DeviceError::InvalidArgument(format!(
            "{op}: token {tok} at position {i} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(Dims { vocab })
}

impl EmbeddingOps for CpuDevice {
    fn embedding_forward(&self, args: Checked<EmbeddingForward<'_, Self::Buffer>>) -> Result<()> {
        let EmbeddingForward {
            tokens,
            wte,
            wpe,
            out,
            b: _,
            t,
            c,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "embedding_forward";
            check_tokens(OP, tokens, wte, c)?;
            let (wte_v, wpe_v) = (wte.act(OP)?, wpe.act(OP)?);
            let toks = tokens.i32s(OP)?;
            par_chunks_f32(out.act_mut(OP)?, false, rows_per_task(c) * c, |start, o| {
                let (mut s1, mut s2) = (Vec::new(), Vec::new());
                for (k, orow) in o.chunks_mut(c).enumerate() {
                    let bt = start / c + k;
                    let tok = toks[bt] as usize;
                    let w = read(wte_v, tok * c, c, &mut s1);
                    let p = read(wpe_v, (bt % t) * c, c, &mut s2);
                    for ((o, &w), &p) in orow.iter_mut().zip(w).zip(p) {
                        *o = w + p;
                    }
                }
            });
            Ok(())
        })
    }

    /// Gradients of the embedding. `dwpe` rows are independent sums over the batch (in batch
    /// order); `dwte` is updated one vocabulary row per task, adding the rows of `dout` whose token
    /// is that row in position order (found with a counting sort), so no two tasks touch the same
    /// row and the summation order is fixed.
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
        self.run(|| {
            const OP: &str = "embedding_backward";
            let Dims { vocab } = check_tokens(OP, tokens, dwte, c)?;
            let dv = dout.act(OP)?;
            let toks = tokens.i32s(OP)?;

            // Position gradients: dwpe[p] += Σ_b dout[b, p] in batch order.
            let mut dwpe_v = dwpe.act_mut(OP)?;
            par_chunks_f32(dwpe_v.slice_mut(0, t * c), true, c, |start, row| {
                let pos = start / c;
                let mut s = Vec::new();
                for bi in 0..b {
                    let g = read(dv, (bi * t + pos) * c, c, &mut s);
                    for (r, &g) in row.iter_mut().zip(g) {
                        *r += g;
                    }
                }
            });

            // Token gradients: group positions by token (stable, so in position order).
            let mut starts = vec![0usize; vocab + 1];
            for &tok in toks {
                starts[tok as usize + 1] += 1;
            }
            for v in 0..vocab {
                starts[v + 1] += starts[v];
            }
            let mut fill = starts.clone();
            let mut positions = vec![0usize; toks.len()];
            for (i, &tok) in toks.iter().enumerate() {
                positions[fill[tok as usize]] = i;
                fill[tok as usize] += 1;
            }
            dwte.act_mut(OP)?
                .into_chunks(c)
                .into_par_iter()
                .enumerate()
                .with_min_len(64)
                .filter(|(v, _)| starts[*v] != starts[*v + 1])
                .for_each(|(v, mut row)| {
                    let mut s = Vec::new();
                    row.with_f32_local(true, |row| {
                        for &p in &positions[starts[v]..starts[v + 1]] {
                            let g = read(dv, p * c, c, &mut s);
                            for (r, &g) in row.iter_mut().zip(g) {
                                *r += g;
                            }
                        }
                    });
                });
            Ok(())
        })
    }
}
