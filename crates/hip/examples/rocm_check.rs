//! Offline checks of duet's HIP backend against a real ROCm install, without a GPU (used by
//! scripts/rocm-check.sh, inside a Debian root holding ROCm 6.4 or 7.2).
//!
//! ```text
//! cargo run -p duet-hip --release --example rocm_check -- compile [--out DIR] ARCH...
//! cargo run -p duet-hip --release --example rocm_check -- symbols
//! cargo run -p duet-hip --release --example rocm_check -- layout
//! ```
//!
//! - `compile`: every `kernels-hip` module through duet's own hiprtc path
//!   ([`duet_hip::kernels::compile_module`] with [`duet_hip::kernels::options`], libhiprtc found by [`duet_hip::loader`], so
//!   `ROCM_PATH` or the dynamic loader's path), for each target ID given, with the kernel cache
//!   pointed at an empty folder. Prints one line per kernel with the registers and memory its code
//!   object's AMDGPU metadata note records (`amdhsa.kernels`: `.vgpr_count`, `.agpr_count`,
//!   `.sgpr_count`, `.group_segment_fixed_size` (LDS), `.private_segment_fixed_size` (scratch),
//!   spills). A target the compiler rejects for a trivial kernel too is reported as
//!   `UNKNOWN-TARGET` and skipped; a module that fails to compile for a known target is `FAIL`
//!   and makes the exit status 1.
//! - `symbols`: opens each library duet loads (libamdhip64, libhiprtc, librocblas, libhipblaslt,
//!   librccl) through duet's loader and resolves every symbol of the tables the backend declares
//!   (the same lists the backend checks at load time, read from the code, so additions are picked
//!   up). A library that is not installed is a `SKIP` line; a missing symbol is `MISSING` and exit 1.
//! - `layout`: the sizes and field offsets of duet's hand-written `#[repr(C)]` structs, as
//!   `NAME VALUE` lines, for the C probe to compare against the real headers.
//!
//! The ELF and MessagePack readers are minimal and local (no new dependency in Cargo.lock): they
//! read only ELF64 little-endian section headers, notes and the MessagePack types the metadata
//! uses.

use duet_hip::hiprtc::result::RtcApi;
use duet_hip::hiprtc::safe::{CompileFailure, compile};
use duet_hip::kernels::{KernelModule, compile_module, options};
use duet_hip::loader;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("compile") => cmd_compile(&args[1..]),
        Some("symbols") => cmd_symbols(),
        Some("layout") => cmd_layout(),
        Some("symbol-list") => cmd_symbol_list(),
        _ => Err(
            "usage: rocm_check compile [--out DIR] ARCH... | symbols | symbol-list | layout".into(),
        ),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------- compile

fn cmd_compile(args: &[String]) -> Result<bool, String> {
    let mut out: Option<PathBuf> = None;
    let mut archs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--out" {
            out = Some(it.next().ok_or("--out needs a folder")?.into());
        } else {
            archs.push(a.clone());
        }
    }
    if archs.is_empty() {
        return Err("no target given".into());
    }
    // An empty kernel cache, so every module is compiled here and now.
    let cache = std::env::temp_dir().join(format!("duet-rocm-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    // SAFETY: single-threaded at this point; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("DUET_HIP_CACHE", &cache) };
    let rtc = RtcApi::load().map_err(|e| e.to_string())?;
    let (maj, min) = rtc.version().map_err(|e| e.to_string())?;
    println!("hiprtc: {} (hiprtcVersion {maj}.{min})", rtc.name);
    let mut ok = true;
    println!(
        "{:<26} {:<18} {:<44} {:>5} {:>5} {:>5} {:>6} {:>7} {:>6}",
        "target", "module", "kernel", "vgpr", "agpr", "sgpr", "lds", "scratch", "spills"
    );
    for arch in &archs {
        // A trivial kernel tells an unknown target from a kernel that does not compile. The
        // `probe` lines let a caller tell a compiler crash on the trivial kernel (an unknown
        // target on ROCm 6.4's hiprtc aborts the process) from one on a real module.
        println!("probe {arch}");
        let probe = compile(
            &rtc,
            "probe.hip",
            "extern \"C\" __global__ void duet_probe(int* p) { if (p) *p = 1; }\n",
            &[],
            &duet_hip::kernels::options(arch, 64),
        );
        if let Err(e) = probe {
            let log = match e {
                CompileFailure::Source(l) => l,
                CompileFailure::Api(e) => e.to_string(),
            };
            let first = log
                .lines()
                .find(|l| l.contains("error") || l.contains("unknown") || l.contains("nvalid"))
                .or_else(|| log.lines().find(|l| !l.trim().is_empty()))
                .unwrap_or("(empty compiler log)")
                .trim()
                .to_string();
            println!("UNKNOWN-TARGET {arch}: hiprtc rejects a trivial kernel: {first}");
            continue;
        }
        println!("probe-ok {arch}");
        for m in KernelModule::ALL {
            let t0 = std::time::Instant::now();
            let code = match compile_module(&rtc, m, &options(arch, 64)) {
                Ok(c) => c,
                Err(e) => {
                    println!("FAIL {arch} {}: {e}", m.file());
                    ok = false;
                    continue;
                }
            };
            let dt = t0.elapsed().as_secs_f64();
            if let Some(dir) = &out {
                let safe: String = arch
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect();
                let _ = std::fs::create_dir_all(dir);
                let _ = std::fs::write(
                    dir.join(format!("{}.{safe}.co", m.file().trim_end_matches(".hip"))),
                    &code,
                );
            }
            match kernel_metadata(&code) {
                Ok(kernels) => {
                    for k in &kernels {
                        println!(
                            "{:<26} {:<18} {:<44} {:>5} {:>5} {:>5} {:>6} {:>7} {:>6}",
                            arch,
                            m.file(),
                            k.name,
                            k.vgpr,
                            k.agpr,
                            k.sgpr,
                            k.lds,
                            k.scratch,
                            k.vgpr_spill + k.sgpr_spill
                        );
                    }
                    println!(
                        "ok {arch} {}: {} kernels, {} bytes, {dt:.1} s",
                        m.file(),
                        kernels.len(),
                        code.len()
                    );
                }
                Err(e) => {
                    println!("FAIL {arch} {}: code object unreadable: {e}", m.file());
                    ok = false;
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&cache);
    // Keep libhiprtc loaded until the process ends, as the backend does (unloading ROCm 6.4's
    // libraries ends in a crash at exit: shared/docs/hip-notes.md section 8).
    std::mem::forget(rtc);
    Ok(ok)
}

/// What the metadata note says of one kernel.
#[derive(Debug, Default)]
struct KernelInfo {
    name: String,
    vgpr: u64,
    agpr: u64,
    sgpr: u64,
    lds: u64,
    scratch: u64,
    vgpr_spill: u64,
    sgpr_spill: u64,
}

/// The `amdhsa.kernels` entries of a code object (an AMDGPU ELF, or a clang offload bundle
/// holding one).
fn kernel_metadata(code: &[u8]) -> Result<Vec<KernelInfo>, String> {
    let elf = unbundle(code)?;
    let note = amdgpu_metadata_note(elf)?;
    let (doc, _) = msgpack(note, 0)?;
    let kernels = doc
        .get("amdhsa.kernels")
        .ok_or("no amdhsa.kernels in the metadata")?;
    let Mp::Array(list) = kernels else {
        return Err("amdhsa.kernels is not an array".into());
    };
    let mut out = Vec::new();
    for k in list {
        let n = |key: &str| k.get(key).and_then(Mp::as_u64).unwrap_or(0);
        out.push(KernelInfo {
            name: match k.get(".name") {
                Some(Mp::Str(s)) => s.clone(),
                _ => "?".into(),
            },
            vgpr: n(".vgpr_count"),
            agpr: n(".agpr_count"),
            sgpr: n(".sgpr_count"),
            lds: n(".group_segment_fixed_size"),
            scratch: n(".private_segment_fixed_size"),
            vgpr_spill: n(".vgpr_spill_count"),
            sgpr_spill: n(".sgpr_spill_count"),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn rd(b: &[u8], off: usize, n: usize) -> Result<u64, String> {
    let s = b
        .get(off..off + n)
        .ok_or_else(|| format!("truncated at {off}+{n}"))?;
    let mut v = 0u64;
    for (i, &x) in s.iter().enumerate() {
        v |= (x as u64) << (8 * i);
    }
    Ok(v)
}

/// The AMDGPU ELF inside a `__CLANG_OFFLOAD_BUNDLE__` (uncompressed), or `code` itself.
fn unbundle(code: &[u8]) -> Result<&[u8], String> {
    const MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
    if code.starts_with(b"\x7fELF") {
        return Ok(code);
    }
    if code.starts_with(b"CCOB") {
        return Err("compressed offload bundle (CCOB) not supported".into());
    }
    if !code.starts_with(MAGIC) {
        return Err("neither an ELF nor an offload bundle".into());
    }
    let n = rd(code, MAGIC.len(), 8)? as usize;
    let mut p = MAGIC.len() + 8;
    for _ in 0..n {
        let off = rd(code, p, 8)? as usize;
        let size = rd(code, p + 8, 8)? as usize;
        let idlen = rd(code, p + 16, 8)? as usize;
        let id = code.get(p + 24..p + 24 + idlen).ok_or("truncated bundle")?;
        p += 24 + idlen;
        if id.windows(6).any(|w| w == b"amdgcn") && size > 0 {
            return code
                .get(off..off + size)
                .ok_or("truncated bundle entry".into());
        }
    }
    Err("no amdgcn entry in the offload bundle".into())
}

/// The descriptor of the `AMDGPU` note of type 32 (`NT_AMDGPU_METADATA`, MessagePack).
fn amdgpu_metadata_note(elf: &[u8]) -> Result<&[u8], String> {
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not an ELF64 little-endian file".into());
    }
    let shoff = rd(elf, 0x28, 8)? as usize;
    let shentsize = rd(elf, 0x3a, 2)? as usize;
    let shnum = rd(elf, 0x3c, 2)? as usize;
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        if rd(elf, sh + 4, 4)? != 7 {
            continue; // SHT_NOTE
        }
        let off = rd(elf, sh + 0x18, 8)? as usize;
        let size = rd(elf, sh + 0x20, 8)? as usize;
        let mut p = off;
        let align = |x: usize| (x + 3) & !3;
        while p + 12 <= off + size {
            let namesz = rd(elf, p, 4)? as usize;
            let descsz = rd(elf, p + 4, 4)? as usize;
            let ty = rd(elf, p + 8, 4)?;
            let name = elf.get(p + 12..p + 12 + namesz).ok_or("truncated note")?;
            let desc_at = p + 12 + align(namesz);
            if ty == 32 && name.starts_with(b"AMDGPU") {
                return elf
                    .get(desc_at..desc_at + descsz)
                    .ok_or("truncated note".into());
            }
            p = desc_at + align(descsz);
        }
    }
    Err("no NT_AMDGPU_METADATA note".into())
}

/// A MessagePack value (the subset the AMDGPU metadata uses, plus the rest of the scalar types).
#[derive(Debug)]
enum Mp {
    Nil,
    Bool,
    Int(i128),
    Float,
    Str(String),
    Bin,
    Array(Vec<Mp>),
    Map(BTreeMap<String, Mp>),
}

impl Mp {
    fn get(&self, key: &str) -> Option<&Mp> {
        match self {
            Mp::Map(m) => m.get(key),
            _ => None,
        }
    }
    fn as_u64(&self) -> Option<u64> {
        match self {
            Mp::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
}

/// Decodes one value at `p`; returns it and the offset after it.
fn msgpack(b: &[u8], p: usize) -> Result<(Mp, usize), String> {
    let t = *b.get(p).ok_or("truncated msgpack")?;
    let be = |off: usize, n: usize| -> Result<u64, String> {
        let s = b.get(off..off + n).ok_or("truncated msgpack")?;
        Ok(s.iter().fold(0u64, |v, &x| (v << 8) | x as u64))
    };
    let bytes = |off: usize, n: usize| -> Result<&[u8], String> {
        b.get(off..off + n)
            .ok_or_else(|| "truncated msgpack".to_string())
    };
    let str_at = |off: usize, n: usize| -> Result<(Mp, usize), String> {
        Ok((
            Mp::Str(String::from_utf8_lossy(bytes(off, n)?).into_owned()),
            off + n,
        ))
    };
    let array = |mut q: usize, n: usize| -> Result<(Mp, usize), String> {
        let mut v = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let (x, nq) = msgpack(b, q)?;
            v.push(x);
            q = nq;
        }
        Ok((Mp::Array(v), q))
    };
    let map = |mut q: usize, n: usize| -> Result<(Mp, usize), String> {
        let mut m = BTreeMap::new();
        for _ in 0..n {
            let (k, nq) = msgpack(b, q)?;
            let (v, nq) = msgpack(b, nq)?;
            let key = match k {
                Mp::Str(s) => s,
                other => format!("{other:?}"),
            };
            m.insert(key, v);
            q = nq;
        }
        Ok((Mp::Map(m), q))
    };
    Ok(match t {
        0x00..=0x7f => (Mp::Int(t as i128), p + 1),
        0x80..=0x8f => map(p + 1, (t & 0x0f) as usize)?,
        0x90..=0x9f => array(p + 1, (t & 0x0f) as usize)?,
        0xa0..=0xbf => str_at(p + 1, (t & 0x1f) as usize)?,
        0xc0 => (Mp::Nil, p + 1),
        0xc2 | 0xc3 => (Mp::Bool, p + 1),
        0xc4..=0xc6 => {
            let w = 1 << (t - 0xc4);
            let n = be(p + 1, w)? as usize;
            bytes(p + 1 + w, n)?;
            (Mp::Bin, p + 1 + w + n)
        }
        0xca => (Mp::Float, p + 5),
        0xcb => (Mp::Float, p + 9),
        0xcc..=0xcf => {
            let w = 1 << (t - 0xcc);
            (Mp::Int(be(p + 1, w)? as i128), p + 1 + w)
        }
        0xd0..=0xd3 => {
            let w = 1usize << (t - 0xd0);
            let v = be(p + 1, w)?;
            let shift = 64 - 8 * w as u32;
            (Mp::Int((((v << shift) as i64) >> shift) as i128), p + 1 + w)
        }
        0xd9..=0xdb => {
            let w = 1 << (t - 0xd9);
            let n = be(p + 1, w)? as usize;
            str_at(p + 1 + w, n)?
        }
        0xdc | 0xdd => {
            let w = if t == 0xdc { 2 } else { 4 };
            array(p + 1 + w, be(p + 1, w)? as usize)?
        }
        0xde | 0xdf => {
            let w = if t == 0xde { 2 } else { 4 };
            map(p + 1 + w, be(p + 1, w)? as usize)?
        }
        0xe0..=0xff => (Mp::Int((t as i8) as i128), p + 1),
        other => return Err(format!("msgpack type 0x{other:02x} not supported")),
    })
}

// ---------------------------------------------------------------- symbols

/// Every symbol duet loads from any ROCm library (the tables `symbols` checks, the optional entry
/// points included), one per line: what the hip-on-cuda stand-ins must export, and no more.
fn cmd_symbol_list() -> Result<bool, String> {
    use duet_hip::hipblaslt::sys::HipblasLtLib;
    use duet_hip::rccl::{HipSyncLib, RcclLib};
    use duet_hip::rocblas::sys::RocblasLib;
    let mut all: Vec<&str> = duet_hip::hip::result::required_symbols();
    all.extend(duet_hip::hip::result::HOST_SYMBOLS);
    all.extend(duet_hip::hip::result::GRAPH_SYMBOLS);
    all.extend(["hipGetDevicePropertiesR0600", "hipGetDeviceProperties"]);
    all.extend(HipSyncLib::SYMBOLS);
    all.extend(duet_hip::hiprtc::result::required_symbols());
    all.extend(RocblasLib::SYMBOLS);
    all.extend(HipblasLtLib::SYMBOLS);
    all.push("hipblasLtGetVersion");
    all.extend(RcclLib::SYMBOLS);
    all.sort_unstable();
    all.dedup();
    for s in all {
        println!("{s}");
    }
    Ok(true)
}

fn cmd_symbols() -> Result<bool, String> {
    use duet_hip::hipblaslt::sys::HipblasLtLib;
    use duet_hip::rccl::{HipSyncLib, RcclLib};
    use duet_hip::rocblas::sys::RocblasLib;
    let hip_rt = duet_hip::hip::result::required_symbols();
    let rtc = duet_hip::hiprtc::result::required_symbols();
    // (library, the table's name, its symbols, required)
    let tables: Vec<(&loader::LibSpec, &str, Vec<&str>, bool)> = vec![
        (
            &loader::AMDHIP64,
            "hip runtime (hip_functions.txt)",
            hip_rt,
            true,
        ),
        (
            &loader::AMDHIP64,
            "staging and graph entry points (declared by hand)",
            duet_hip::hip::result::HOST_SYMBOLS
                .iter()
                .chain(&duet_hip::hip::result::GRAPH_SYMBOLS)
                .copied()
                .collect(),
            true,
        ),
        (
            &loader::AMDHIP64,
            "device properties (optional entry points)",
            vec!["hipGetDevicePropertiesR0600", "hipGetDeviceProperties"],
            false,
        ),
        (
            &loader::AMDHIP64,
            "rccl's HipSyncLib",
            HipSyncLib::SYMBOLS.to_vec(),
            true,
        ),
        (&loader::HIPRTC, "hiprtc (hiprtc_functions.txt)", rtc, true),
        (
            &loader::ROCBLAS,
            "RocblasLib",
            RocblasLib::SYMBOLS.to_vec(),
            true,
        ),
        (
            &loader::HIPBLASLT,
            "HipblasLtLib",
            HipblasLtLib::SYMBOLS.to_vec(),
            true,
        ),
        (
            &duet_hip::rccl::RCCL,
            "RcclLib",
            RcclLib::SYMBOLS.to_vec(),
            true,
        ),
    ];
    let mut ok = true;
    for (spec, table, names, required) in tables {
        let opened = match loader::open(spec) {
            Ok(o) => o,
            Err(tried) => {
                println!(
                    "SKIP {}: not installed in this root ({} names tried, last: {})",
                    spec.stem,
                    tried.len(),
                    tried.last().map(String::as_str).unwrap_or("")
                );
                continue;
            }
        };
        let path = opened.name.clone();
        let missing = loader::missing_symbols(&opened.lib, &names);
        if missing.is_empty() {
            println!(
                "ok {} [{table}]: {} symbols resolve in {path}",
                spec.stem,
                names.len()
            );
        } else if required {
            println!(
                "MISSING {} [{table}] in {path}: {}",
                spec.stem,
                missing.join(" ")
            );
            ok = false;
        } else {
            println!(
                "note {} [{table}] in {path}: not exported: {}",
                spec.stem,
                missing.join(" ")
            );
        }
    }
    // What the backend itself reports (versions) through its own loading code.
    if let Ok(v) = duet_hip::rccl::rccl_version() {
        println!("rccl version (ncclGetVersion): {v}");
    }
    Ok(ok)
}

// ---------------------------------------------------------------- layout

fn cmd_layout() -> Result<bool, String> {
    use duet_hip::hipblaslt::sys::{hipblasLtMatmulAlgo_t, hipblasLtMatmulHeuristicResult_t};
    use duet_hip::rccl::NcclUniqueId;
    use std::mem::{offset_of, size_of};
    type H = hipblasLtMatmulHeuristicResult_t;
    let rows: [(&str, usize); 8] = [
        (
            "sizeof(hipblasLtMatmulAlgo_t)",
            size_of::<hipblasLtMatmulAlgo_t>(),
        ),
        (
            "offsetof(hipblasLtMatmulAlgo_t,max_workspace_bytes)",
            offset_of!(hipblasLtMatmulAlgo_t, max_workspace_bytes),
        ),
        ("sizeof(hipblasLtMatmulHeuristicResult_t)", size_of::<H>()),
        (
            "offsetof(hipblasLtMatmulHeuristicResult_t,workspaceSize)",
            offset_of!(H, workspace_size),
        ),
        (
            "offsetof(hipblasLtMatmulHeuristicResult_t,state)",
            offset_of!(H, state),
        ),
        (
            "offsetof(hipblasLtMatmulHeuristicResult_t,wavesCount)",
            offset_of!(H, waves_count),
        ),
        (
            "offsetof(hipblasLtMatmulHeuristicResult_t,reserved)",
            offset_of!(H, reserved),
        ),
        ("sizeof(ncclUniqueId)", size_of::<NcclUniqueId>()),
    ];
    for (n, v) in rows {
        println!("{n} {v}");
    }
    Ok(true)
}
