//! Validation once, carried by a type.
//!
//! Every op takes one named argument struct (`LayerNormForward`, `Gemm`, `CrossEntropyPadded`,
//! … beside its family trait in [`crate::ops`]). The family trait's method takes it as
//! [`Checked`]`<Args>`, and [`Check::check`] (the contract's shape, length and dtype rules from
//! [`crate::args`]) is the only way to build one, so a backend never receives arguments that
//! skipped the checks and never repeats them; it adds only what is its own (the dtypes its
//! kernels cover, launch limits, data-dependent checks such as token ids).
//!
//! Call sites name what they pass and go through [`Runtime::exec`], which checks and dispatches:
//!
//! ```ignore
//! dev.exec(LayerNormForward { x: &x, gamma: &g, beta: &b, out: &mut y, mean: &mut mu,
//!                             rstd: &mut rs, n, c, eps: 1e-5 })?;
//! ```
//!
//! or, equivalently, `dev.layernorm_forward(LayerNormForward { … }.check()?)`.

use crate::{Result, Runtime};
use std::ops::Deref;

/// Op arguments that passed their op's checks. Only [`Check::check`] builds one (the
/// constructor is private to this crate), so holding a `Checked<A>` proves the checks ran.
pub struct Checked<A>(A);

impl<A> Checked<A> {
    /// Wraps arguments that `check` has just validated. Crate-private on purpose.
    pub(crate) fn new(args: A) -> Self {
        Checked(args)
    }

    /// The checked arguments, to destructure in a backend.
    pub fn into_inner(self) -> A {
        self.0
    }
}

impl<A> Deref for Checked<A> {
    type Target = A;
    fn deref(&self) -> &A {
        &self.0
    }
}

/// An op's argument struct: `check` validates it against the contract (today's messages and
/// error kinds) and is the one way to get the [`Checked`] value the op's method takes.
pub trait Check: Sized {
    fn check(self) -> Result<Checked<Self>>;
}

/// Which family method runs an argument struct on device `D` (implemented for every op's
/// arguments by `op_impls!`, next to the family trait). [`Runtime::exec`] uses it.
pub trait Op<D: Runtime>: Check {
    fn call(device: &D, args: Checked<Self>) -> Result<()>;
}

/// `Op` for each argument struct of a family: `Args<'a, ..> => method`.
macro_rules! op_impls {
    ($family:ident: $($args:ident<$($lt:lifetime),+> => $method:ident),+ $(,)?) => {$(
        impl<$($lt,)+ D: $family> $crate::checked::Op<D> for $args<$($lt,)+ D::Buffer> {
            fn call(device: &D, args: $crate::checked::Checked<Self>) -> $crate::Result<()> {
                device.$method(args)
            }
        }
    )+};
}
pub(crate) use op_impls;
