//! Implements [`Runtime`] for the CPU: allocation, host↔device copies, device copies, fills and
//! casts, synchronisation, memory statistics, info and capabilities (no graphs).

use crate::CpuDevice;
use crate::buffer::{CpuBuffer, Storage};
use crate::info;
use crate::ops::{ELEM_CHUNK, par_chunks_f32};
use duet_device::{
    Buffer, Capabilities, DType, DeviceInfo, Fp8Format, MemoryStats, Result, Runtime,
};
use half::{bf16, f16};
use rayon::prelude::*;

// Buffers are stored in native byte order and the trait's byte interface is little-endian.
#[cfg(target_endian = "big")]
compile_error!("duet-cpu assumes a little-endian host");

fn par_fill<T: Copy + Send + Sync>(v: &mut [T], x: T) {
    v.par_chunks_mut(ELEM_CHUNK).for_each(|c| c.fill(x));
}

impl Runtime for CpuDevice {
    type Buffer = CpuBuffer;
    type Graph = ();

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            backend: "cpu".into(),
            name: info::cpu_name(),
            arch: info::arch_summary(),
            total_memory: info::total_memory().unwrap_or(0),
            supports_bf16: true,
            supports_fp8: true,
            details: vec![
                ("threads".into(), self.threads.to_string()),
                ("gemm".into(), "gemm 0.19 (f32 accumulation)".into()),
                (
                    "fp8".into(),
                    "emulated (codecs, quantisation, GEMM on decoded values)".into(),
                ),
            ],
        }
    }

    fn capabilities(&self) -> &Capabilities {
        static CAPS: std::sync::OnceLock<Capabilities> = std::sync::OnceLock::new();
        CAPS.get_or_init(Capabilities::composed)
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CpuBuffer> {
        CpuBuffer::new(dtype, len, &self.mem)
    }

    fn upload_bytes(&self, src: &[u8], dst: &mut CpuBuffer, offset: usize) -> Result<()> {
        duet_device::args::validate_upload(dst, src.len(), offset)?;
        let size = dst.dtype().size_bytes();
        let start = offset * size;
        dst.storage.bytes_mut()[start..start + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn download_bytes(&self, src: &CpuBuffer, offset: usize, len: usize) -> Result<Vec<u8>> {
        duet_device::args::validate_download(src, offset, len)?;
        let size = src.dtype().size_bytes();
        Ok(src.storage.bytes()[offset * size..(offset + len) * size].to_vec())
    }

    fn copy(
        &self,
        src: &CpuBuffer,
        src_offset: usize,
        dst: &mut CpuBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.run(|| {
            duet_device::args::validate_copy(src, src_offset, dst, dst_offset, len)?;
            let size = src.dtype().size_bytes();
            let s = &src.storage.bytes()[src_offset * size..(src_offset + len) * size];
            let d = &mut dst.storage.bytes_mut()[dst_offset * size..(dst_offset + len) * size];
            d.par_chunks_mut(ELEM_CHUNK * 4)
                .zip(s.par_chunks(ELEM_CHUNK * 4))
                .for_each(|(d, s)| d.copy_from_slice(s));
            Ok(())
        })
    }

    fn fill(&self, dst: &mut CpuBuffer, value: f32) -> Result<()> {
        self.run(|| {
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
        })
    }

    fn cast(&self, src: &CpuBuffer, dst: &mut CpuBuffer, scale: f32) -> Result<()> {
        self.run(|| {
            const OP: &str = "cast";
            duet_device::args::validate_cast(src, dst)?;
            let s = src.any_float(OP)?;
            let d = dst.any_float_mut(OP)?;
            par_chunks_f32(d, false, ELEM_CHUNK, |start, out| {
                s.load(start, out);
                if scale != 1.0 {
                    for x in out.iter_mut() {
                        *x *= scale;
                    }
                }
            });
            Ok(())
        })
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            current: self.mem.current(),
            peak: self.mem.peak(),
            // The host's memory, which the model's memory plan is checked against.
            driver: duet_device::host_memory(),
        }
    }

    fn reset_peak_memory(&self) {
        self.mem.reset_peak();
    }
}
