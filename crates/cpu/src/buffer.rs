//! Host-memory buffers, their allocation accounting, and f32 views over the float storages.

use duet_device::{Buffer, DType, DeviceError, Fp8Format, Result, check_float};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Elements per task in element-wise conversions; keeps tiny buffers on one thread.
pub(crate) const CONVERT_CHUNK: usize = 1 << 15;

/// Bytes in live buffers and their high-water mark, shared by a device and its buffers.
#[derive(Debug, Default)]
pub(crate) struct MemCounter {
    current: AtomicU64,
    peak: AtomicU64,
}

impl MemCounter {
    pub(crate) fn current(&self) -> u64 {
        self.current.load(Ordering::SeqCst)
    }

    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }

    pub(crate) fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::SeqCst);
    }

    fn add(&self, bytes: u64) {
        let now = self.current.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    fn sub(&self, bytes: u64) {
        self.current.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// Decrements the device's counter when the buffer it belongs to is dropped.
#[derive(Debug)]
struct MemGuard {
    counter: Arc<MemCounter>,
    bytes: u64,
}

impl Drop for MemGuard {
    fn drop(&mut self) {
        self.counter.sub(self.bytes);
    }
}

/// The typed contents of a [`CpuBuffer`]. FP8 buffers (and `U8`) hold raw codes.
#[derive(Debug)]
pub(crate) enum Storage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    Bytes(Vec<u8>),
}

/// A zero-filled vector, or `None` when the allocator refuses the request.
fn try_zeroed<T: Clone>(len: usize, zero: T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    v.resize(len, zero);
    Some(v)
}

impl Storage {
    fn zeroed(dtype: DType, len: usize) -> Option<Self> {
        Some(match dtype {
            DType::F32 => Storage::F32(try_zeroed(len, 0.0)?),
            DType::F16 => Storage::F16(try_zeroed(len, f16::ZERO)?),
            DType::BF16 => Storage::BF16(try_zeroed(len, bf16::ZERO)?),
            DType::I32 => Storage::I32(try_zeroed(len, 0)?),
            // Code 0 is +0.0 in every FP8 format.
            DType::U8 | DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3Fnuz | DType::F8E5M2Fnuz => {
                Storage::Bytes(try_zeroed(len, 0)?)
            }
        })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Storage::F32(v) => bytemuck::cast_slice(v),
            Storage::F16(v) => bytemuck::cast_slice(v),
            Storage::BF16(v) => bytemuck::cast_slice(v),
            Storage::I32(v) => bytemuck::cast_slice(v),
            Storage::Bytes(v) => v,
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Storage::F32(v) => bytemuck::cast_slice_mut(v),
            Storage::F16(v) => bytemuck::cast_slice_mut(v),
            Storage::BF16(v) => bytemuck::cast_slice_mut(v),
            Storage::I32(v) => bytemuck::cast_slice_mut(v),
            Storage::Bytes(v) => v,
        }
    }
}

/// A buffer in host memory owned by a [`crate::CpuDevice`].
pub struct CpuBuffer {
    dtype: DType,
    pub(crate) storage: Storage,
    _mem: MemGuard,
}

impl std::fmt::Debug for CpuBuffer {
    /// Dtype and length only: buffers can hold millions of elements.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("dtype", &self.dtype)
            .field("len", &self.len())
            .finish()
    }
}

impl Buffer for CpuBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn len(&self) -> usize {
        match &self.storage {
            Storage::F32(v) => v.len(),
            Storage::F16(v) => v.len(),
            Storage::BF16(v) => v.len(),
            Storage::I32(v) => v.len(),
            Storage::Bytes(v) => v.len(),
        }
    }
}

impl CpuBuffer {
    pub(crate) fn new(dtype: DType, len: usize, counter: &Arc<MemCounter>) -> Result<Self> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| DeviceError::InvalidArgument(format!("{len} × {dtype} overflows")))?;
        let storage = Storage::zeroed(dtype, len).ok_or_else(|| DeviceError::OutOfMemory {
            requested: bytes as u64,
            free: crate::info::available_memory().unwrap_or(0),
        })?;
        counter.add(bytes as u64);
        Ok(Self {
            dtype,
            storage,
            _mem: MemGuard {
                counter: Arc::clone(counter),
                bytes: bytes as u64,
            },
        })
    }

    /// The contents as f32, if this is an f32 buffer.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::F32(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn i32s(&self, op: &'static str) -> Result<&[i32]> {
        match &self.storage {
            Storage::I32(v) => Ok(v),
            _ => Err(DeviceError::DTypeMismatch {
                op,
                expected: DType::I32,
                got: self.dtype,
            }),
        }
    }

    pub(crate) fn f32s(&self, op: &'static str) -> Result<&[f32]> {
        match &self.storage {
            Storage::F32(v) => Ok(v),
            _ => Err(DeviceError::DTypeMismatch {
                op,
                expected: DType::F32,
                got: self.dtype,
            }),
        }
    }

    pub(crate) fn f32s_mut(&mut self, op: &'static str) -> Result<&mut [f32]> {
        let dtype = self.dtype;
        match &mut self.storage {
            Storage::F32(v) => Ok(v),
            _ => Err(DeviceError::DTypeMismatch {
                op,
                expected: DType::F32,
                got: dtype,
            }),
        }
    }

    /// An f32 view of an activation-type buffer (f32, f16, bf16); other dtypes are `Unsupported`.
    pub(crate) fn act(&self, op: &'static str) -> Result<FRef<'_>> {
        check_float(op, self)?;
        self.any_float(op)
    }

    /// Mutable counterpart of [`CpuBuffer::act`].
    pub(crate) fn act_mut(&mut self, op: &'static str) -> Result<FMut<'_>> {
        check_float(op, self)?;
        self.any_float_mut(op)
    }

    /// An f32 view of any float buffer, FP8 included.
    pub(crate) fn any_float(&self, op: &'static str) -> Result<FRef<'_>> {
        Ok(match &self.storage {
            Storage::F32(v) => FRef::F32(v),
            Storage::F16(v) => FRef::F16(v),
            Storage::BF16(v) => FRef::BF16(v),
            Storage::Bytes(v) => match Fp8Format::of(self.dtype) {
                Some(f) => FRef::Fp8(v, f),
                None => return Err(unsupported(op, self.dtype)),
            },
            Storage::I32(_) => return Err(unsupported(op, self.dtype)),
        })
    }

    /// Mutable counterpart of [`CpuBuffer::any_float`].
    pub(crate) fn any_float_mut(&mut self, op: &'static str) -> Result<FMut<'_>> {
        let dtype = self.dtype;
        Ok(match &mut self.storage {
            Storage::F32(v) => FMut::F32(v),
            Storage::F16(v) => FMut::F16(v),
            Storage::BF16(v) => FMut::BF16(v),
            Storage::Bytes(v) => match Fp8Format::of(dtype) {
                Some(f) => FMut::Fp8(v, f),
                None => return Err(unsupported(op, dtype)),
            },
            Storage::I32(_) => return Err(unsupported(op, dtype)),
        })
    }
}

pub(crate) fn unsupported(op: &str, dtype: DType) -> DeviceError {
    DeviceError::Unsupported {
        op: op.to_string(),
        dtype,
    }
}

/// Decoding table for one FP8 format (256 entries).
fn fp8_lut(f: Fp8Format) -> [f32; 256] {
    std::array::from_fn(|c| f.decode(c as u8))
}

/// A read-only view of float storage that loads ranges as f32.
#[derive(Clone, Copy, Debug)]
pub(crate) enum FRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    Fp8(&'a [u8], Fp8Format),
}

impl<'a> FRef<'a> {
    pub(crate) fn len(&self) -> usize {
        match self {
            FRef::F32(s) => s.len(),
            FRef::F16(s) => s.len(),
            FRef::BF16(s) => s.len(),
            FRef::Fp8(s, _) => s.len(),
        }
    }

    /// Sub-range `start..start + len`.
    pub(crate) fn slice(&self, start: usize, len: usize) -> FRef<'a> {
        let r = start..start + len;
        match *self {
            FRef::F32(s) => FRef::F32(&s[r]),
            FRef::F16(s) => FRef::F16(&s[r]),
            FRef::BF16(s) => FRef::BF16(&s[r]),
            FRef::Fp8(s, f) => FRef::Fp8(&s[r], f),
        }
    }

    /// Loads `out.len()` elements starting at `start`, converted to f32.
    pub(crate) fn load(&self, start: usize, out: &mut [f32]) {
        let r = start..start + out.len();
        match self {
            FRef::F32(s) => out.copy_from_slice(&s[r]),
            FRef::F16(s) => s[r].convert_to_f32_slice(out),
            FRef::BF16(s) => s[r].convert_to_f32_slice(out),
            FRef::Fp8(s, f) => {
                for (o, &c) in out.iter_mut().zip(&s[r]) {
                    *o = f.decode(c);
                }
            }
        }
    }

    /// The whole view as f32: borrowed for f32 storage, converted (in parallel) otherwise.
    pub(crate) fn to_f32(self) -> Cow<'a, [f32]> {
        match self {
            FRef::F32(s) => Cow::Borrowed(s),
            other => {
                let mut out = vec![0.0f32; other.len()];
                other.load_par(&mut out);
                Cow::Owned(out)
            }
        }
    }

    fn load_par(&self, out: &mut [f32]) {
        match self {
            FRef::Fp8(s, f) => {
                let lut = fp8_lut(*f);
                out.par_chunks_mut(CONVERT_CHUNK)
                    .zip(s.par_chunks(CONVERT_CHUNK))
                    .for_each(|(o, c)| {
                        for (o, &c) in o.iter_mut().zip(c) {
                            *o = lut[c as usize];
                        }
                    });
            }
            _ => out
                .par_chunks_mut(CONVERT_CHUNK)
                .enumerate()
                .for_each(|(i, o)| self.load(i * CONVERT_CHUNK, o)),
        }
    }
}

/// A mutable view of float storage that loads and stores ranges as f32.
#[derive(Debug)]
pub(crate) enum FMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
    Fp8(&'a mut [u8], Fp8Format),
}

impl<'a> FMut<'a> {
    pub(crate) fn len(&self) -> usize {
        match self {
            FMut::F32(s) => s.len(),
            FMut::F16(s) => s.len(),
            FMut::BF16(s) => s.len(),
            FMut::Fp8(s, _) => s.len(),
        }
    }

    pub(crate) fn as_ref(&self) -> FRef<'_> {
        match self {
            FMut::F32(s) => FRef::F32(s),
            FMut::F16(s) => FRef::F16(s),
            FMut::BF16(s) => FRef::BF16(s),
            FMut::Fp8(s, f) => FRef::Fp8(s, *f),
        }
    }

    pub(crate) fn load(&self, start: usize, out: &mut [f32]) {
        self.as_ref().load(start, out)
    }

    /// Stores `src` at `start`, rounding to the storage format (FP8 saturates).
    pub(crate) fn store(&mut self, start: usize, src: &[f32]) {
        let r = start..start + src.len();
        match self {
            FMut::F32(s) => s[r].copy_from_slice(src),
            FMut::F16(s) => s[r].convert_from_f32_slice(src),
            FMut::BF16(s) => s[r].convert_from_f32_slice(src),
            FMut::Fp8(s, f) => {
                for (o, &x) in s[r].iter_mut().zip(src) {
                    *o = f.encode(x);
                }
            }
        }
    }

    /// Splits into consecutive chunks of `size` elements (the last may be shorter).
    pub(crate) fn into_chunks(self, size: usize) -> Vec<FMut<'a>> {
        let size = size.max(1);
        match self {
            FMut::F32(s) => s.chunks_mut(size).map(FMut::F32).collect(),
            FMut::F16(s) => s.chunks_mut(size).map(FMut::F16).collect(),
            FMut::BF16(s) => s.chunks_mut(size).map(FMut::BF16).collect(),
            FMut::Fp8(s, f) => s.chunks_mut(size).map(|c| FMut::Fp8(c, f)).collect(),
        }
    }

    /// Sub-range `start..start + len`.
    pub(crate) fn slice_mut(&mut self, start: usize, len: usize) -> FMut<'_> {
        let r = start..start + len;
        match self {
            FMut::F32(s) => FMut::F32(&mut s[r]),
            FMut::F16(s) => FMut::F16(&mut s[r]),
            FMut::BF16(s) => FMut::BF16(&mut s[r]),
            FMut::Fp8(s, f) => FMut::Fp8(&mut s[r], *f),
        }
    }

    /// Stores all of `src` (same length as the view), converting in parallel.
    pub(crate) fn store_par(self, src: &[f32]) {
        debug_assert_eq!(src.len(), self.len());
        self.into_chunks(CONVERT_CHUNK)
            .into_par_iter()
            .zip(src.par_chunks(CONVERT_CHUNK))
            .for_each(|(mut d, s)| d.store(0, s));
    }

    /// Like [`FMut::with_f32`] but converts on the calling thread (for per-task chunks).
    pub(crate) fn with_f32_local<R>(&mut self, read: bool, f: impl FnOnce(&mut [f32]) -> R) -> R {
        match self {
            FMut::F32(s) => f(s),
            _ => {
                let mut scratch = vec![0.0f32; self.len()];
                if read {
                    self.load(0, &mut scratch);
                }
                let r = f(&mut scratch);
                self.store(0, &scratch);
                r
            }
        }
    }

    /// Runs `f` on the whole view as f32: in place for f32 storage, otherwise on a scratch copy
    /// (loaded first when `read` is set, zeros otherwise) that is stored back afterwards.
    pub(crate) fn with_f32<R>(&mut self, read: bool, f: impl FnOnce(&mut [f32]) -> R) -> R {
        match self {
            FMut::F32(s) => f(s),
            _ => {
                let mut scratch = vec![0.0f32; self.len()];
                if read {
                    self.as_ref().load_par(&mut scratch);
                }
                let r = f(&mut scratch);
                let n = self.len();
                self.slice_mut(0, n).store_par(&scratch);
                r
            }
        }
    }
}
