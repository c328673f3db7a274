//! GEMMs: every transpose combination, dtype pair, odd shapes, strided batches; epilogues.

use super::*;
use crate::reference;
use duet_device::{
    Add, BiasAdd, BiasBackward, DType, Device, DeviceError, Epilogue, GeluBackward, GeluForward,
    Gemm, GemmDesc, GemmEpilogue,
};

fn run_gemm<E: Device>(
    e: &E,
    desc: &GemmDesc,
    ab: DType,
    cdt: DType,
    a: &[f32],
    b: &[f32],
    c0: &[f32],
) -> Vec<Tensor> {
    let ba = put(e, ab, a);
    let bb = put(e, ab, b);
    let mut bc = put(e, cdt, c0);
    e.exec(Gemm {
        desc,
        a: &ba,
        b: &bb,
        c: &mut bc,
    })
    .expect("gemm");
    vec![get(e, "c", &bc)]
}

/// All four transpose combinations × (f32, f16, bf16 operands; C of their dtype or f32) × odd
/// and aligned shapes × batched GEMMs with padded leading dimensions, strides and offsets
/// (what lies between the matrices must stay as it was) × alpha and beta (negative, alpha 0,
/// beta above 1 among them). beta = 0 ignores C (NaN-prefilled there).
pub fn gemm_transposes_dtypes_strides<D: Device>(h: &Harness<D>) {
    let case = "gemm_transposes_dtypes_strides";
    let mut r = h.rng(case);
    let combos = [
        (DType::F32, DType::F32, Tol::REDUCTION),
        (DType::F16, DType::F16, Tol::GEMM16),
        (DType::F16, DType::F32, Tol::rel(1e-3)),
        (DType::BF16, DType::BF16, Tol::GEMM16),
        (DType::BF16, DType::F32, Tol::rel(1e-3)),
    ];
    for (ab, cdt, tol) in combos {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for &(m, n, k, batch, padded, alpha_beta) in &[
                (33usize, 17usize, 29usize, 1usize, false, None),
                (64, 96, 128, 1, false, None),
                (130, 96, 70, 1, false, None),
                (1, 1, 1, 1, false, None),
                (7, 5, 3, 3, true, None),
                (40, 24, 64, 4, true, None),
                (9, 11, 6, 1, false, Some((-2.0f32, 0.25f32))),
                (9, 11, 6, 1, false, Some((0.0, 3.0))),
                (9, 11, 6, 2, false, Some((1.5, -1.0))),
            ] {
                let (alpha, beta) =
                    alpha_beta.unwrap_or((r.uniform(0.5, 1.5), if padded { 0.5 } else { 0.0 }));
                let mut desc = GemmDesc::batched(ta, tb, m, n, k, batch)
                    .alpha(alpha)
                    .beta(beta);
                if padded {
                    desc.lda += 3;
                    desc.ldb += 1;
                    desc.ldc += 2;
                    let (ar, _) = desc.a_stored();
                    let (br, _) = desc.b_stored();
                    desc.stride_a = ar * desc.lda + 5;
                    desc.stride_b = br * desc.ldb + 2;
                    desc.stride_c = m * desc.ldc + 3;
                    desc.a_offset = 11;
                    desc.b_offset = 4;
                    desc.c_offset = 9;
                }
                let a = r.vec(desc.a_offset + batch * desc.stride_a, -1.0, 1.0);
                let b = r.vec(desc.b_offset + batch * desc.stride_b, -1.0, 1.0);
                let c0 = if desc.beta == 0.0 && !padded {
                    vec![f32::NAN; m * n]
                } else {
                    r.vec(desc.c_offset + batch * desc.stride_c, -1.0, 1.0)
                };
                let what = format!(
                    "{case} {ab}->{cdt} ta={ta} tb={tb} {m}x{n}x{k} batch {batch} padded {padded} alpha {alpha} beta {beta}"
                );
                let got = run_gemm(&h.dev, &desc, ab, cdt, &a, &b, &c0);
                h.verify(
                    &what,
                    &got,
                    |c| run_gemm(c, &desc, ab, cdt, &a, &b, &c0),
                    || {
                        let mut c = rounded64(cdt, &c0);
                        reference::gemm(&desc, &rounded64(ab, &a), &rounded64(ab, &b), &mut c);
                        vec![want("c", cdt, c)]
                    },
                    &[tol],
                );
            }
        }
    }
}

/// Mismatched operand dtypes, short buffers and bad descriptors are typed errors.
pub fn gemm_errors<D: Device>(h: &Harness<D>) {
    let d = &h.dev;
    let desc = GemmDesc::new(false, false, 4, 4, 4);
    let a = d.alloc(DType::F32, 16).unwrap();
    let bh = d.alloc(DType::F16, 16).unwrap();
    let mut c = d.alloc(DType::F32, 16).unwrap();
    assert!(
        d.exec(Gemm {
            desc: &desc,
            a: &a,
            b: &bh,
            c: &mut c
        })
        .is_err(),
        "gemm_errors: mixed A/B dtypes"
    );
    let short = d.alloc(DType::F32, 15).unwrap();
    assert!(
        matches!(
            d.exec(Gemm {
                desc: &desc,
                a: &a,
                b: &short,
                c: &mut c
            }),
            Err(DeviceError::Shape { .. })
        ),
        "gemm_errors: short B"
    );
    let mut bad = desc;
    bad.lda = 3;
    assert!(
        d.exec(Gemm {
            desc: &bad,
            a: &a,
            b: &a,
            c: &mut c
        })
        .is_err(),
        "gemm_errors: lda < k"
    );
    let ints = d.alloc(DType::I32, 16).unwrap();
    let mut ci = d.alloc(DType::I32, 16).unwrap();
    assert!(
        d.exec(Gemm {
            desc: &desc,
            a: &ints,
            b: &ints,
            c: &mut ci
        })
        .is_err(),
        "gemm_errors: i32 GEMM"
    );
}

/// Every GEMM epilogue equals its plain composition (gemm, bias_add, add, gelu, gelu_backward,
/// bias_backward) on the same device, for every activation dtype — natively fused where the
/// backend's capabilities say so, else through the trait's composed default: bias (f32 and
/// activation-dtype biases, overwrite and accumulate), bias + residual (the residual
/// untouched), bias + GELU keeping the pre-activation, GELU backward, and the weight gradient
/// with its bias gradient; misuse is an error.
pub fn gemm_epilogue_matches_composition<D: Device>(h: &Harness<D>) {
    let case = "gemm_epilogue_matches_composition";
    let d = &h.dev;
    let mut r = h.rng(case);
    for dt in FLOATS {
        let native = d.capabilities().gemm_epilogue(dt);
        let tol = match dt {
            DType::BF16 => Tol::rel(2e-2),
            DType::F16 => Tol::rel(1e-2),
            // The composition is the reference's own sequence; a native f32 path rounds once.
            _ if !native => Tol::Bits,
            _ => Tol::rel(1e-5),
        };
        let (n, k, m) = (96, 64, 136);
        let x = put(d, dt, &r.vec(n * k, -1.0, 1.0));
        let w = put(d, dt, &r.vec(m * k, -0.2, 0.2));
        for bias_dt in [DType::F32, dt] {
            let what = format!("{case} {dt} bias {bias_dt}");
            let bias = put(d, bias_dt, &r.vec(m, -0.5, 0.5));
            for beta in [0.0f32, 1.0] {
                let desc = GemmDesc::new(false, true, n, m, k).beta(beta);
                let init = r.vec(n * m, -1.0, 1.0);
                let mut plain = put(d, dt, &init);
                d.exec(Gemm {
                    desc: &desc,
                    a: &x,
                    b: &w,
                    c: &mut plain,
                })
                .unwrap();
                d.exec(BiasAdd {
                    x: &mut plain,
                    bias: &bias,
                    rows: n,
                    c: m,
                })
                .unwrap();
                let mut fused = put(d, dt, &init);
                d.exec(GemmEpilogue {
                    desc: &desc,
                    a: &x,
                    b: &w,
                    c: &mut fused,
                    epilogue: Epilogue::Bias(&bias),
                })
                .unwrap();
                h.same_buf(
                    &format!("{what} bias beta {beta}"),
                    "c",
                    &fused,
                    &plain,
                    tol,
                );
            }
            if bias_dt == DType::F32 && dt != DType::F32 {
                // 16-bit inputs, f32 C (the bias epilogue allows it).
                let desc = GemmDesc::new(false, true, n, m, k).beta(1.0);
                let init = r.vec(n * m, -1.0, 1.0);
                let mut plain = put(d, DType::F32, &init);
                d.exec(Gemm {
                    desc: &desc,
                    a: &x,
                    b: &w,
                    c: &mut plain,
                })
                .unwrap();
                d.exec(BiasAdd {
                    x: &mut plain,
                    bias: &bias,
                    rows: n,
                    c: m,
                })
                .unwrap();
                let mut fused = put(d, DType::F32, &init);
                d.exec(GemmEpilogue {
                    desc: &desc,
                    a: &x,
                    b: &w,
                    c: &mut fused,
                    epilogue: Epilogue::Bias(&bias),
                })
                .unwrap();
                h.same_buf(
                    &format!("{what} bias, f32 C"),
                    "c",
                    &fused,
                    &plain,
                    Tol::rel(1e-3),
                );
            }
            if bias_dt == dt {
                let desc = GemmDesc::new(false, true, n, m, k);
                let res = r.vec(n * m, -1.0, 1.0);
                let residual = put(d, dt, &res);
                let mut plain = nan(d, dt, n * m);
                d.exec(Gemm {
                    desc: &desc,
                    a: &x,
                    b: &w,
                    c: &mut plain,
                })
                .unwrap();
                d.exec(BiasAdd {
                    x: &mut plain,
                    bias: &bias,
                    rows: n,
                    c: m,
                })
                .unwrap();
                let mut sum = nan(d, dt, n * m);
                d.exec(Add {
                    a: &plain,
                    b: &residual,
                    out: &mut sum,
                })
                .unwrap();
                let mut fused = nan(d, dt, n * m);
                d.exec(GemmEpilogue {
                    desc: &desc,
                    a: &x,
                    b: &w,
                    c: &mut fused,
                    epilogue: Epilogue::BiasResidual {
                        bias: &bias,
                        residual: &residual,
                    },
                })
                .unwrap();
                h.same_buf(&format!("{what} bias + residual"), "c", &fused, &sum, tol);
                assert_eq!(
                    get(d, "residual", &residual).bytes,
                    encode(dt, &res),
                    "{what}: residual changed"
                );
            }
            let desc = GemmDesc::new(false, true, n, m, k);
            let mut ppre = nan(d, dt, n * m);
            d.exec(Gemm {
                desc: &desc,
                a: &x,
                b: &w,
                c: &mut ppre,
            })
            .unwrap();
            d.exec(BiasAdd {
                x: &mut ppre,
                bias: &bias,
                rows: n,
                c: m,
            })
            .unwrap();
            let mut py = nan(d, dt, n * m);
            d.exec(GeluForward {
                x: &ppre,
                out: &mut py,
            })
            .unwrap();
            let mut fpre = nan(d, dt, n * m);
            let mut fy = nan(d, dt, n * m);
            d.exec(GemmEpilogue {
                desc: &desc,
                a: &x,
                b: &w,
                c: &mut fy,
                epilogue: Epilogue::BiasGelu {
                    bias: &bias,
                    pre: &mut fpre,
                },
            })
            .unwrap();
            h.same(
                &format!("{what} bias + gelu"),
                &[get(d, "pre", &fpre), get(d, "out", &fy)],
                &[get(d, "pre", &ppre), get(d, "out", &py)],
                &[tol, tol],
            );
        }
        // GELU backward: dpre = (dy · W) ⊙ gelu'(pre).
        let dy = put(d, dt, &r.vec(n * m, -1.0, 1.0));
        let pre = put(d, dt, &r.vec(n * k, -3.0, 3.0));
        let desc = GemmDesc::new(false, false, n, k, m);
        let mut prod = nan(d, dt, n * k);
        d.exec(Gemm {
            desc: &desc,
            a: &dy,
            b: &w,
            c: &mut prod,
        })
        .unwrap();
        let mut pdx = nan(d, dt, n * k);
        d.exec(GeluBackward {
            x: &pre,
            dout: &prod,
            dx: &mut pdx,
        })
        .unwrap();
        let mut fdx = nan(d, dt, n * k);
        d.exec(GemmEpilogue {
            desc: &desc,
            a: &dy,
            b: &w,
            c: &mut fdx,
            epilogue: Epilogue::DGelu { pre: &pre },
        })
        .unwrap();
        h.same_buf(&format!("{case} {dt} dgelu"), "dx", &fdx, &pdx, tol);
        // The bias gradient (f32, overwritten) with the weight gradient: accumulated into f32;
        // and in the 16-bit dtype, written (the training step's case), where a library that
        // writes the bias gradient in the weight gradient's dtype (CUDA's fallback,
        // crates/cuda/src/ops/gemm.rs) stays within that rounding.
        let mut pdb = put(d, DType::F32, &vec![0.0; m]);
        d.exec(BiasBackward {
            dout: &dy,
            dbias: &mut pdb,
            rows: n,
            c: m,
        })
        .unwrap();
        for (dw_dt, beta, dw_tol, what) in [
            (
                DType::F32,
                1.0,
                Tol::rel(1e-3),
                "weight and bias gradients".to_string(),
            ),
            (
                dt,
                0.0,
                tol,
                format!("weight gradient in {dt} and bias gradient"),
            ),
        ] {
            let wdesc = GemmDesc::new(true, false, m, k, n).beta(beta);
            let dw0 = if beta == 0.0 {
                vec![f32::NAN; m * k]
            } else {
                r.vec(m * k, -1.0, 1.0)
            };
            let mut pdw = put(d, dw_dt, &dw0);
            d.exec(Gemm {
                desc: &wdesc,
                a: &dy,
                b: &x,
                c: &mut pdw,
            })
            .unwrap();
            let mut fdw = put(d, dw_dt, &dw0);
            let mut fdb = nan(d, DType::F32, m);
            d.exec(GemmEpilogue {
                desc: &wdesc,
                a: &dy,
                b: &x,
                c: &mut fdw,
                epilogue: Epilogue::BiasGradA { dbias: &mut fdb },
            })
            .unwrap();
            h.same(
                &format!("{case} {dt} {what}"),
                &[get(d, "dw", &fdw), get(d, "db", &fdb)],
                &[get(d, "dw", &pdw), get(d, "db", &pdb)],
                &[dw_tol, dw_tol],
            );
        }
        let bad = GemmDesc::new(false, false, n, k, m).beta(1.0);
        assert!(
            d.exec(GemmEpilogue {
                desc: &bad,
                a: &dy,
                b: &w,
                c: &mut fdx,
                epilogue: Epilogue::DGelu { pre: &pre }
            })
            .is_err(),
            "{case}: DGelu with beta 1 is refused"
        );
    }
}
