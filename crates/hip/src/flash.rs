//! Which inner product flash attention runs on a device ([`FlashInner`]), chosen when it opens
//! from the knobs and the GPU, and the kernels' tile rows; the kernels are launched by
//! ops/attention.rs, whose module documentation describes both inner products.

use duet_device::{DType, DeviceError, Result};

/// Which inner product the flash-attention kernels use, or none (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlashInner {
    /// `DUET_HIP_NO_FLASH`: no flash attention (its capabilities list none).
    Off,
    /// The portable inner product (the default).
    Portable,
    /// `DUET_HIP_FLASH_MFMA`: MFMA products (gfx90a / gfx942 / gfx950, wave64).
    Mfma,
}

/// Architectures whose MFMA entry points kernels-hip/flash_attention.hip defines.
const MFMA_ARCHS: [&str; 3] = ["gfx90a", "gfx942", "gfx950"];

impl FlashInner {
    /// The choice for a device of `arch` (gcnArchName without features) and wavefront size
    /// `warp`, from the two knobs; asking for MFMA where there is none is an error naming why.
    pub(crate) fn choose(no_flash: bool, mfma: bool, arch: &str, warp: i32) -> Result<Self> {
        match (no_flash, mfma) {
            (true, true) => Err(DeviceError::InvalidArgument(
                "DUET_HIP_NO_FLASH and DUET_HIP_FLASH_MFMA are both set: choose one".into(),
            )),
            (true, false) => Ok(Self::Off),
            (false, false) => Ok(Self::Portable),
            (false, true) if MFMA_ARCHS.contains(&arch) && warp == 64 => Ok(Self::Mfma),
            (false, true) => Err(DeviceError::InvalidArgument(format!(
                "DUET_HIP_FLASH_MFMA needs a wave64 CDNA GPU ({}); this device is {arch} with \
                 wavefront {warp}: unset it to run the portable flash attention",
                MFMA_ARCHS.join(", ")
            ))),
        }
    }

    /// The entry points' name prefix.
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            Self::Mfma => "flash_attention_mfma_",
            Self::Portable | Self::Off => "flash_attention_",
        }
    }

    /// For `duet info`.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Off => "off (DUET_HIP_NO_FLASH): attention composed of the unfused ops",
            Self::Portable => {
                "portable inner product, bf16/f16, head size 64/128 (DUET_HIP_FLASH_MFMA=1: MFMA \
                 products, opt-in until run on AMD hardware)"
            }
            Self::Mfma => {
                "MFMA products (DUET_HIP_FLASH_MFMA; not yet run on AMD hardware), bf16/f16, \
                 head size 64/128"
            }
        }
    }

    /// The (activation dtype, head size) pairs flash attention runs for.
    pub(crate) fn pairs(self) -> Vec<(DType, usize)> {
        if self == Self::Off {
            return Vec::new();
        }
        [DType::BF16, DType::F16]
            .into_iter()
            .flat_map(|d| FLASH_HS.into_iter().map(move |hs| (d, hs)))
            .collect()
    }
}

/// Head sizes with kernels (their tiles are in flash_attention.hip's `FaTile`).
const FLASH_HS: [usize; 2] = [64, 128];

/// Rows a block owns (queries of the forward and dQ kernels, keys of the dK/dV kernel): the
/// kernels' `FaTile<HS>::BR`.
pub(crate) fn flash_rows(hs: usize) -> usize {
    if hs == 64 { 64 } else { 32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mfma_only_on_wave64_cdna_and_never_with_no_flash() {
        assert_eq!(
            FlashInner::choose(false, false, "gfx1100", 32).unwrap(),
            FlashInner::Portable
        );
        assert_eq!(
            FlashInner::choose(true, false, "gfx942", 64).unwrap(),
            FlashInner::Off
        );
        for arch in MFMA_ARCHS {
            assert_eq!(
                FlashInner::choose(false, true, arch, 64).unwrap(),
                FlashInner::Mfma
            );
        }
        // The HIP-on-CUDA platform reports gfx942 with wavefront 32: no MFMA there.
        let e = FlashInner::choose(false, true, "gfx942", 32)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("DUET_HIP_FLASH_MFMA") && e.contains("wavefront 32"),
            "{e}"
        );
        assert!(FlashInner::choose(false, true, "gfx1100", 32).is_err());
        assert!(FlashInner::choose(true, true, "gfx942", 64).is_err());
        assert!(FlashInner::Off.pairs().is_empty());
        assert_eq!(FlashInner::Portable.pairs(), FlashInner::Mfma.pairs());
        assert_eq!(
            FlashInner::Portable.pairs(),
            vec![
                (DType::BF16, 64),
                (DType::BF16, 128),
                (DType::F16, 64),
                (DType::F16, 128)
            ]
        );
    }

    #[test]
    fn block_rows_match_the_kernel_tiles() {
        let src = include_str!("../../../kernels-hip/flash_attention.hip");
        for hs in FLASH_HS {
            let line = format!(
                "template <> struct FaTile<{hs}> {{ static constexpr int BR = {}, ",
                flash_rows(hs)
            );
            assert!(src.contains(&line), "{line}");
        }
    }
}
