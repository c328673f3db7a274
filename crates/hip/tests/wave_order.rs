//! Host-side emulation of the block reductions of kernels-hip/duet_hip.h on wavefronts of 32
//! and 64 lanes (wave64 hardware cannot run here): the order the kernels use (fixed 32-lane
//! groups, combined as kernels-cuda/common.cuh's `block_sum` combines warps) gives the same bits
//! at both sizes and equals CUDA's, while the order the kernels used before (a butterfly over
//! the whole wavefront, then the wave sums one after another) does not, so the test can fail.

use std::ops::Add;

/// `__shfl_xor(v, o, width)` for every thread of a block whose waves hold `wave` lanes: thread
/// `i` reads the value of thread `i ^ o` if that lies in the same `width`-lane segment of the
/// same wave (HIP's rule; a lane outside reads its own value).
fn shfl_xor<T: Copy>(v: &[T], o: usize, width: usize, wave: usize) -> Vec<T> {
    assert!(width <= wave && wave.is_power_of_two() && width.is_power_of_two());
    (0..v.len())
        .map(|i| {
            let (w0, lane) = (i / wave * wave, i % wave);
            let (seg, l) = (lane / width * width, lane % width);
            let src = w0 + seg + (l ^ o);
            if (l ^ o) < width && src < v.len() {
                v[src]
            } else {
                v[i]
            }
        })
        .collect()
}

/// A xor butterfly with offsets width/2 .. 1 (duet_warp_sum, CUDA's warp_sum).
fn butterfly<T: Copy + Add<Output = T>>(mut v: Vec<T>, width: usize, wave: usize) -> Vec<T> {
    let mut o = width / 2;
    while o > 0 {
        let s = shfl_xor(&v, o, width, wave);
        v = v.iter().zip(&s).map(|(&a, &b)| a + b).collect();
        o /= 2;
    }
    v
}

/// duet_block_sum as the kernels now compute it, on waves of `wave` lanes: 32-lane groups
/// (DUET_GROUP), group sums into sh, then lane l of every group reads sh[l] (0 past the last
/// group) and the 32-lane butterfly again. Returns every thread's result.
fn block_sum_groups<T: Copy + Add<Output = T> + Default>(v: &[T], wave: usize) -> Vec<T> {
    let g = butterfly(v.to_vec(), 32, wave);
    let ng = v.len() / 32;
    let sh: Vec<T> = (0..ng).map(|k| g[k * 32]).collect();
    let second: Vec<T> = (0..v.len())
        .map(|i| {
            if i % 32 < ng {
                sh[i % 32]
            } else {
                T::default()
            }
        })
        .collect();
    butterfly(second, 32, wave)
}

/// CUDA's block_sum (kernels-cuda/common.cuh): warps are 32 lanes.
fn cuda_block_sum<T: Copy + Add<Output = T> + Default>(v: &[T]) -> Vec<T> {
    let w = butterfly(v.to_vec(), 32, 32);
    let nw = v.len() / 32;
    let sh: Vec<T> = (0..nw).map(|k| w[k * 32]).collect();
    let second: Vec<T> = (0..v.len())
        .map(|i| {
            if i % 32 < nw {
                sh[i % 32]
            } else {
                T::default()
            }
        })
        .collect();
    butterfly(second, 32, 32)
}

/// The kernels' previous duet_block_sum: a butterfly over the whole wavefront (offsets
/// wave/2 .. 1), then thread 0's sum of the wave sums in wave order.
fn block_sum_old<T: Copy + Add<Output = T> + Default>(v: &[T], wave: usize) -> T {
    let w = butterfly(v.to_vec(), wave, wave);
    (0..v.len().div_ceil(wave)).fold(T::default(), |t, k| t + w[k * wave])
}

/// Deterministic inputs of mixed magnitude (so that the order of additions shows in the bits).
fn inputs(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let m = ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
            let e = ((s >> 20) % 24) as i32 - 12;
            m * 2f32.powi(e)
        })
        .collect()
}

fn bits32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn group_order_is_the_same_on_wave32_and_wave64_and_equals_cuda() {
    for block in [32usize, 64, 96, 256, 1024] {
        for seed in 0..50u64 {
            let v = inputs(seed * 7919 + block as u64, block);
            let w32 = block_sum_groups(&v, 32);
            let w64 = block_sum_groups(&v, 64);
            let cuda = cuda_block_sum(&v);
            assert_eq!(bits32(&w32), bits32(&w64), "block {block} seed {seed}");
            assert_eq!(bits32(&w32), bits32(&cuda), "block {block} seed {seed}");
            // Every thread gets the same bits.
            assert!(w64.iter().all(|x| x.to_bits() == w64[0].to_bits()));
        }
    }
    // The same in f64 (sum_squares): the emulation is generic over the element type.
    for seed in 0..50u64 {
        let v: Vec<f64> = inputs(seed, 256).iter().map(|&x| x as f64 * 1e-3).collect();
        let a: Vec<u64> = block_sum_groups(&v, 32)
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let b: Vec<u64> = block_sum_groups(&v, 64)
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let c: Vec<u64> = cuda_block_sum(&v).iter().map(|x| x.to_bits()).collect();
        assert_eq!(a, b);
        assert_eq!(a, c);
    }
}

#[test]
fn the_old_wave_sized_order_differs_between_wave32_and_wave64() {
    let mut differ = 0;
    for seed in 0..200u64 {
        let v = inputs(seed, 256);
        if block_sum_old(&v, 32).to_bits() != block_sum_old(&v, 64).to_bits() {
            differ += 1;
        }
    }
    // f32 addition is not associative: most inputs give different bits under the two orders.
    assert!(differ > 50, "only {differ} of 200 differ");
}

#[test]
fn the_kernels_reduce_in_32_lane_groups() {
    // Ties the emulation to the header: the reductions shuffle within DUET_GROUP = 32 lanes and
    // combine the group sums through the same butterfly, whatever DUET_WARP is.
    let h = include_str!("../../../kernels-hip/duet_hip.h");
    assert!(h.contains("#define DUET_GROUP 32"));
    for f in [
        "duet_warp_sum(float",
        "duet_warp_max(float",
        "duet_warp_sum_f64(double",
    ] {
        let body = &h[h.find(f).unwrap_or_else(|| panic!("{f} missing"))..];
        let body = &body[..body.find('}').unwrap()];
        assert!(
            body.contains("for (int o = 16; o > 0; o >>= 1)"),
            "{f}: {body}"
        );
        assert!(body.contains("__shfl_xor(v, o, DUET_GROUP)"), "{f}: {body}");
    }
    for f in [
        "duet_block_sum(float",
        "duet_block_max(float",
        "duet_block_sum_f64(double",
    ] {
        let body = &h[h.find(f).unwrap_or_else(|| panic!("{f} missing"))..];
        let body = &body[..body.find("\n}").unwrap()];
        assert!(
            body.contains("threadIdx.x & 31, g = threadIdx.x >> 5, ng = blockDim.x >> 5"),
            "{f}"
        );
        assert!(body.contains("lane < ng ? sh[lane] :"), "{f}");
        assert!(
            !body.contains("DUET_WARP"),
            "{f} depends on the wavefront size"
        );
    }
    // No kernel reduces over a wavefront-sized butterfly any more.
    for (name, src) in duet_hip::kernels::KernelModule::ALL
        .iter()
        .map(|m| (m.file(), m.source()))
        .chain([("duet_hip.h", h)])
    {
        let code: String = src
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        assert!(!code.contains("DUET_WARP / 2"), "{name}");
        assert!(!code.contains("% DUET_WARP"), "{name}");
    }
}
