//! Misuse is a typed error, never a wrong answer or a panic.

use duet_device::{
    BiasAdd, DType, Device, DeviceError, GeluBackward, GeluForward, LayerNormForward, Scale,
};

use super::*;

/// Integer and FP8 buffers where an op needs float activations are `Unsupported` or
/// `DTypeMismatch`; lengths that do not match the shape are `Shape`; nothing is written.
pub fn unsupported_dtypes_are_typed_errors<D: Device>(h: &Harness<D>) {
    let case = "unsupported_dtypes_are_typed_errors";
    let d = &h.dev;
    let typed = |r: duet_device::Result<()>, what: &str| match r {
        Err(DeviceError::Unsupported { .. }) | Err(DeviceError::DTypeMismatch { .. }) => {}
        other => panic!("{case}: {what}: expected Unsupported or DTypeMismatch, got {other:?}"),
    };
    let ints = d.alloc(DType::I32, 16).unwrap();
    let mut iout = d.alloc(DType::I32, 16).unwrap();
    typed(
        d.exec(GeluForward {
            x: &ints,
            out: &mut iout,
        }),
        "gelu_forward on i32",
    );
    let f8 = d.alloc(DType::F8E4M3, 16).unwrap();
    let mut f8o = d.alloc(DType::F8E4M3, 16).unwrap();
    typed(
        d.exec(GeluForward {
            x: &f8,
            out: &mut f8o,
        }),
        "gelu_forward on fp8",
    );
    let mut ib = d.alloc(DType::I32, 16).unwrap();
    typed(
        d.exec(Scale {
            x: &mut ib,
            alpha: 2.0,
        }),
        "scale on i32",
    );
    let f = put(d, DType::F32, &[1.0; 16]);
    let mut o = put(d, DType::F32, &[3.0; 16]);
    let bias = put(d, DType::F32, &[0.0; 3]);
    assert!(
        matches!(
            d.exec(BiasAdd {
                x: &mut o,
                bias: &bias,
                rows: 4,
                c: 4
            }),
            Err(DeviceError::Shape { .. })
        ),
        "{case}: bias_add with a bias of 3 for 4 columns"
    );
    let short = put(d, DType::F32, &[1.0; 15]);
    assert!(
        matches!(
            d.exec(GeluBackward {
                x: &f,
                dout: &short,
                dx: &mut o
            }),
            Err(DeviceError::Shape { .. })
        ),
        "{case}: gelu_backward with a short dout"
    );
    assert_eq!(
        get(d, "o", &o).f32(),
        vec![3.0; 16],
        "{case}: a refused call wrote its output"
    );
    let mut mean = d.alloc(DType::BF16, 4).unwrap();
    let mut rstd = d.alloc(DType::F32, 4).unwrap();
    let g = put(d, DType::F32, &[1.0; 4]);
    typed(
        d.exec(LayerNormForward {
            x: &f,
            gamma: &g,
            beta: &g,
            out: &mut o,
            mean: &mut mean,
            rstd: &mut rstd,
            n: 4,
            c: 4,
            eps: 1e-5,
        }),
        "layernorm_forward with bf16 mean",
    );
}
