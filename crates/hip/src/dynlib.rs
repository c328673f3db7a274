//! `dyn_api!`: declares a table of C functions resolved from a `libloading::Library`, for the
//! hand-written bindings of libraries without Debian headers (rocBLAS, hipBLASLt). Every symbol
//! is checked before any is stored, so a table exists only when all its functions resolved, and
//! a missing one is reported by name ([`crate::error::HipError::MissingSymbols`]).

macro_rules! dyn_api {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( pub fn $f:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) -> $ret:ty ; )*
        }
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub struct $name {
            _lib: ::libloading::Library,
            $( pub $f: unsafe extern "C" fn( $( $ty ),* ) -> $ret, )*
        }

        #[allow(non_snake_case)]
        impl $name {
            /// Every symbol of the table.
            pub const SYMBOLS: &'static [&'static str] = &[ $( stringify!($f) ),* ];

            /// Resolves every function of the table from `lib` (opened as `lib_name`).
            ///
            /// # Safety
            /// `lib` must export each symbol with exactly the signature declared here.
            pub unsafe fn load(
                lib: ::libloading::Library,
                lib_name: &str,
            ) -> Result<Self, crate::error::HipError> {
                crate::loader::check_symbols(&lib, lib_name, Self::SYMBOLS)?;
                let missing = |f: &str| crate::error::HipError::MissingSymbols {
                    library: lib_name.to_string(),
                    missing: vec![f.to_string()],
                };
                $(
                    // SAFETY: the caller guarantees the signature; the pointer is stored next to
                    // the library handle, which keeps the code mapped while the table lives.
                    let $f = unsafe {
                        *lib.get::<unsafe extern "C" fn( $( $ty ),* ) -> $ret>(
                            concat!(stringify!($f), "\0").as_bytes(),
                        )
                        .map_err(|_| missing(stringify!($f)))?
                    };
                )*
                Ok(Self { _lib: lib, $( $f ),* })
            }
        }
    };
}

pub(crate) use dyn_api;
