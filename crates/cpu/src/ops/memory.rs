//! Host↔device copies, device copies and fills.

use super::ELEM_CHUNK;
use crate::buffer::{CpuBuffer, Storage};
use duet_device::{Buffer, Fp8Format, Result};
use half::{bf16, f16};
use rayon::prelude::*;

// Buffers are stored in native byte order and the trait's byte interface is little-endian.
#[cfg(target_endian = "big")]
compile_error!("duet-cpu assumes a little-endian host");

pub(crate) fn upload_bytes(src: &[u8], dst: &mut CpuBuffer, offset: usize) -> Result<()> {
    duet_device::args::validate_upload(dst, src.len(), offset)?;
    let size = dst.dtype().size_bytes();
    let start = offset * size;
    dst.storage.bytes_mut()[start..start + src.len()].copy_from_slice(src);
    Ok(())
}

pub(crate) fn download_bytes(src: &CpuBuffer, offset: usize, len: usize) -> Result<Vec<u8>> {
    duet_device::args::validate_download(src, offset, len)?;
    let size = src.dtype().size_bytes();
    Ok(src.storage.bytes()[offset * size..(offset + len) * size].to_vec())
}

pub(crate) fn copy(
    src: &CpuBuffer,
    src_offset: usize,
    dst: &mut CpuBuffer,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    duet_device::args::validate_copy(src, src_offset, dst, dst_offset, len)?;
    let size = src.dtype().size_bytes();
    let s = &src.storage.bytes()[src_offset * size..(src_offset + len) * size];
    let d = &mut dst.storage.bytes_mut()[dst_offset * size..(dst_offset + len) * size];
    d.par_chunks_mut(ELEM_CHUNK * 4)
        .zip(s.par_chunks(ELEM_CHUNK * 4))
        .for_each(|(d, s)| d.copy_from_slice(s));
    Ok(())
}

fn par_fill<T: Copy + Send + Sync>(v: &mut [T], x: T) {
    v.par_chunks_mut(ELEM_CHUNK).for_each(|c| c.fill(x));
}

pub(crate) fn fill(dst: &mut CpuBuffer, value: f32) -> Result<()> {
    let dtype = dst.dtype();
    match &mut dst.storage {
        Storage::F32(v) => par_fill(v, value),
        Storage::F16(v) => par_fill(v, f16::from_f32(value)),
        Storage::BF16(v) => par_fill(v, bf16::from_f32(value)),
        Storage::I32(v) => par_fill(v, duet_device::args::fill_i32(value)?),
        Storage::Bytes(v) => {
            let code = match Fp8Format::of(dtype) {
                Some(f) => f.encode(value),
                None => duet_device::args::fill_u8(value)?,
            };
            par_fill(v, code)
        }
    }
    Ok(())
}
