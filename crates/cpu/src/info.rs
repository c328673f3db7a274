//! What the host CPU is: model name, SIMD features and RAM, read from /proc where available.

/// The "model name" line of /proc/cpuinfo (x86) or a fallback naming the architecture.
pub(crate) fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                let key = key.trim();
                (key == "model name" || key == "Model" || key == "cpu model")
                    .then(|| value.trim().to_string())
                    .filter(|v| !v.is_empty())
            })
        })
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

/// Total RAM in bytes (`MemTotal`, or the cgroup's limit when lower).
pub(crate) fn total_memory() -> Option<u64> {
    duet_device::host_memory().map(|(_, total)| total)
}

/// Host memory this process may still allocate (limits included: [`duet_device::host_memory`]),
/// for out-of-memory messages.
pub(crate) fn available_memory() -> Option<u64> {
    duet_device::host_memory().map(|(available, _)| available)
}

/// The architecture plus the SIMD extensions that matter for the GEMM kernels.
pub(crate) fn arch_summary() -> String {
    #[allow(unused_mut)]
    let mut features: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            features.push("sse4.2");
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            features.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            features.push("fma");
        }
        if std::arch::is_x86_feature_detected!("f16c") {
            features.push("f16c");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            features.push("avx512f");
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            features.push("neon");
        }
        if std::arch::is_aarch64_feature_detected!("fp16") {
            features.push("fp16");
        }
    }
    if features.is_empty() {
        std::env::consts::ARCH.to_string()
    } else {
        format!("{} ({})", std::env::consts::ARCH, features.join(", "))
    }
}
