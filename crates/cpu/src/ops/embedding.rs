//! Token + position embedding and its deterministic backward.

use super::{par_chunks_f32, read, rows_per_task, shape_err};
use crate::buffer::CpuBuffer;
use duet_device::{Buffer, DeviceError, Result, check_len, check_min_len};
use rayon::prelude::*;

struct Dims {
    vocab: usize,
}

/// Shared validation: sizes, the vocabulary implied by the table, and every token id.
fn validate(
    op: &'static str,
    tokens: &CpuBuffer,
    table: &CpuBuffer,
    pos_table: &CpuBuffer,
    b: usize,
    t: usize,
    c: usize,
) -> Result<Dims> {
    let bt = b
        .checked_mul(t)
        .ok_or_else(|| shape_err(op, "b × t overflows"))?;
    bt.checked_mul(c)
        .and(t.checked_mul(c))
        .ok_or_else(|| shape_err(op, "b × t × c overflows"))?;
    let toks = tokens.i32s(op)?;
    check_len(op, "tokens", tokens, bt)?;
    if c == 0 {
        return Err(shape_err(op, "c must be positive"));
    }
    if !table.len().is_multiple_of(c) || table.is_empty() {
        return Err(shape_err(
            op,
            format!(
                "token table has {} elements, not a positive multiple of c = {c}",
                table.len()
            ),
        ));
    }
    check_min_len(op, "position table", pos_table, t * c)?;
    let vocab = table.len() / c;
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

#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    tokens: &CpuBuffer,
    wte: &CpuBuffer,
    wpe: &CpuBuffer,
    out: &mut CpuBuffer,
    b: usize,
    t: usize,
    c: usize,
) -> Result<()> {
    const OP: &str = "embedding_forward";
    let (wte_v, wpe_v) = (wte.act(OP)?, wpe.act(OP)?);
    validate(OP, tokens, wte, wpe, b, t, c)?;
    check_len(OP, "out", out, b * t * c)?;
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
}

/// Gradients of the embedding. `dwpe` rows are independent sums over the batch (in batch
/// order); `dwte` is updated one vocabulary row per task, adding the rows of `dout` whose token
/// is that row in position order (found with a counting sort), so no two tasks touch the same
/// row and the summation order is fixed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    tokens: &CpuBuffer,
    dout: &CpuBuffer,
    dwte: &mut CpuBuffer,
    dwpe: &mut CpuBuffer,
    b: usize,
    t: usize,
    c: usize,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    let dv = dout.act(OP)?;
    dwte.act(OP)?;
    dwpe.act(OP)?;
    let Dims { vocab } = validate(OP, tokens, dwte, dwpe, b, t, c)?;
    check_len(OP, "dout", dout, b * t * c)?;
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
}
