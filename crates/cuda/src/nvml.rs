//! Clocks, power and temperature through NVML (libnvidia-ml, installed with the NVIDIA driver),
//! loaded at run time for [`duet_device::Runtime::telemetry`]. The GPU is found by its PCI bus id,
//! so NVML's device order (which need not be CUDA's) does not matter. Without the library, or
//! when a call fails, there is no telemetry; nothing else depends on it.
//!
//! Power: `nvmlDeviceGetPowerUsage` is a trailing average (about one second on Ampere and newer
//! GPUs), longer than a whole benchmark of a small model, so every reading of a 3 ms step would
//! repeat the same value. Where the driver answers the field `NVML_FI_DEV_POWER_INSTANT` (the
//! H200's does), the instantaneous power is read instead.

use duet_device::Telemetry;
use std::ffi::{CString, c_char, c_int, c_uint, c_ulonglong, c_void};

/// Environment variable naming the NVML library to load instead of libnvidia-ml.so.1
/// ([`duet_device::knobs::Knobs::nvml_lib`]).
pub use duet_device::knobs::NVML_LIB as NVML_LIB_ENV;

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type ByBusIdFn = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
type ClockFn = unsafe extern "C" fn(Device, c_int, *mut c_uint) -> c_int;
type UintFn = unsafe extern "C" fn(Device, *mut c_uint) -> c_int;
type TempFn = unsafe extern "C" fn(Device, c_int, *mut c_uint) -> c_int;
type ReasonsFn = unsafe extern "C" fn(Device, *mut c_ulonglong) -> c_int;
type FieldValuesFn = unsafe extern "C" fn(Device, c_int, *mut FieldValue) -> c_int;

/// nvmlFieldValue_t (nvml.h): the request (field id, scope) and the answer (its own return
/// code, the value's type and an 8-byte union).
#[repr(C)]
#[derive(Default)]
struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_int,
    nvml_return: c_int,
    value: u64,
}

// nvml.h's layout: 40 bytes, the value union at offset 32.
const _: () = assert!(
    std::mem::size_of::<FieldValue>() == 40 && std::mem::offset_of!(FieldValue, value) == 32
);

/// NVML_FI_DEV_POWER_INSTANT: the power now, milliwatts.
const FI_DEV_POWER_INSTANT: c_uint = 186;
/// NVML_POWER_SCOPE_GPU: the GPU's own power (the default scope; Grace Hopper's module power
/// is another).
const POWER_SCOPE_GPU: c_uint = 0;

const NVML_SUCCESS: c_int = 0;
/// nvmlClockType_t NVML_CLOCK_SM.
const CLOCK_SM: c_int = 1;
/// nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU.
const TEMPERATURE_GPU: c_int = 0;
/// nvmlClocksEventReasons (nvmlClocksThrottleReasons before CUDA 12.2): software power cap,
/// hardware power brake; software and hardware thermal slowdown.
const REASON_SW_POWER_CAP: u64 = 0x4;
const REASON_HW_POWER_BRAKE: u64 = 0x80;
const REASON_SW_THERMAL: u64 = 0x20;
const REASON_HW_THERMAL: u64 = 0x40;

pub(crate) struct Nvml {
    device: Device,
    clock: ClockFn,
    power: UintFn,
    power_limit: UintFn,
    temperature: TempFn,
    reasons: ReasonsFn,
    /// nvmlDeviceGetFieldValues, where the library has it and the GPU answers the
    /// instantaneous-power field (checked once, at load).
    field_values: Option<FieldValuesFn>,
    /// Keeps the functions above loaded.
    _lib: libloading::Library,
}

// SAFETY: an nvmlDevice_t is an opaque handle that NVML allows from any thread (NVML is
// thread-safe); the function pointers are plain code addresses.
unsafe impl Send for Nvml {}
// SAFETY: as above; every call only reads through the handle.
unsafe impl Sync for Nvml {}

impl Nvml {
    /// NVML for the GPU at PCI `domain:bus:device`, if the library loads, initialises and
    /// knows that GPU. (A malformed `DUET_*` variable has already failed the device's opening,
    /// so the knobs' error is not looked at again here.)
    pub(crate) fn load(domain: u32, bus: u32, device: u32) -> Option<Self> {
        let mut names: Vec<String> = duet_device::knobs::knobs()
            .ok()
            .and_then(|k| k.nvml_lib.as_ref())
            .map(|p| p.display().to_string())
            .into_iter()
            .collect();
        names.extend(["libnvidia-ml.so.1".into(), "libnvidia-ml.so".into()]);
        Self::load_from(&names, domain, bus, device)
    }

    /// [`Nvml::load`] from the first of `names` that loads and answers.
    fn load_from(names: &[String], domain: u32, bus: u32, device: u32) -> Option<Self> {
        let bus_id = CString::new(format!("{domain:x}:{bus:x}:{device:x}.0")).ok()?;
        names.iter().find_map(|n| {
            // SAFETY: loading a shared library runs its initialisers; libnvidia-ml's set up
            // its own state only.
            let lib = unsafe { libloading::Library::new(n.as_str()) }.ok()?;
            // SAFETY: these symbols have these C signatures in every NVML since CUDA 10
            // (nvml.h): nvmlReturn_t nvmlInit_v2(void);
            // nvmlDeviceGetHandleByPciBusId_v2(const char*, nvmlDevice_t*);
            // nvmlDeviceGetClockInfo(nvmlDevice_t, nvmlClockType_t, unsigned*);
            // nvmlDeviceGetPowerUsage / nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t, unsigned*);
            // nvmlDeviceGetTemperature(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned*);
            // nvmlDeviceGetCurrentClocksEventReasons (or its older name
            // nvmlDeviceGetCurrentClocksThrottleReasons)(nvmlDevice_t, unsigned long long*).
            // The enums are C ints.
            let (init, by_bus, clock, power, power_limit, temperature, reasons) = unsafe {
                (
                    *lib.get::<InitFn>(b"nvmlInit_v2\0").ok()?,
                    *lib.get::<ByBusIdFn>(b"nvmlDeviceGetHandleByPciBusId_v2\0")
                        .ok()?,
                    *lib.get::<ClockFn>(b"nvmlDeviceGetClockInfo\0").ok()?,
                    *lib.get::<UintFn>(b"nvmlDeviceGetPowerUsage\0").ok()?,
                    *lib.get::<UintFn>(b"nvmlDeviceGetEnforcedPowerLimit\0")
                        .ok()?,
                    *lib.get::<TempFn>(b"nvmlDeviceGetTemperature\0").ok()?,
                    *lib.get::<ReasonsFn>(b"nvmlDeviceGetCurrentClocksEventReasons\0")
                        .or_else(|_| {
                            lib.get::<ReasonsFn>(b"nvmlDeviceGetCurrentClocksThrottleReasons\0")
                        })
                        .ok()?,
                )
            };
            // SAFETY: nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t, int valuesCount,
            // nvmlFieldValue_t*) (nvml.h since CUDA 9); absent from older libraries.
            let field_values = unsafe { lib.get::<FieldValuesFn>(b"nvmlDeviceGetFieldValues\0") }
                .ok()
                .map(|f| *f);
            // SAFETY: no arguments; initialising twice is allowed (NVML counts references).
            if unsafe { init() } != NVML_SUCCESS {
                return None;
            }
            let mut handle: Device = std::ptr::null_mut();
            // SAFETY: a NUL-terminated bus id and an out-parameter for the handle.
            if unsafe { by_bus(bus_id.as_ptr(), &mut handle) } != NVML_SUCCESS || handle.is_null() {
                return None;
            }
            let mut nvml = Self {
                device: handle,
                clock,
                power,
                power_limit,
                temperature,
                reasons,
                field_values,
                _lib: lib,
            };
            if nvml.instant_power_mw().is_none() {
                nvml.field_values = None;
            }
            // Only a library that answers is kept.
            nvml.sample().map(|_| nvml)
        })
    }

    /// The instantaneous board power in milliwatts, where the library and the GPU give it.
    fn instant_power_mw(&self) -> Option<u64> {
        let f = self.field_values?;
        let mut v = FieldValue {
            field_id: FI_DEV_POWER_INSTANT,
            scope_id: POWER_SCOPE_GPU,
            ..FieldValue::default()
        };
        // SAFETY: a live device handle and one nvmlFieldValue_t (repr(C), nvml.h's layout)
        // whose fieldId is set; NVML writes the answer into it.
        let r = unsafe { f(self.device, 1, &mut v) };
        if r != NVML_SUCCESS || v.nvml_return != NVML_SUCCESS {
            return None;
        }
        // nvmlValueType_t: unsigned int (1), unsigned long (2), unsigned long long (3),
        // signed long long (4), signed int (5); the union's low bytes hold the narrower ones
        // (little-endian).
        match v.value_type {
            1 => Some(v.value & 0xffff_ffff),
            2 | 3 => Some(v.value),
            4 => u64::try_from(v.value as i64).ok(),
            5 => u64::try_from(v.value as u32 as i32).ok(),
            _ => None,
        }
    }

    /// One reading, or None if any call fails.
    pub(crate) fn sample(&self) -> Option<Telemetry> {
        let ok = |r: c_int| (r == NVML_SUCCESS).then_some(());
        let (mut clock, mut power, mut limit, mut temp, mut reasons) = (0, 0, 0, 0, 0);
        let instant = self.instant_power_mw();
        // SAFETY: a live device handle (from load) and out-parameters of the declared types.
        unsafe {
            ok((self.clock)(self.device, CLOCK_SM, &mut clock))?;
            if instant.is_none() {
                ok((self.power)(self.device, &mut power))?;
            }
            ok((self.power_limit)(self.device, &mut limit))?;
            ok((self.temperature)(self.device, TEMPERATURE_GPU, &mut temp))?;
            ok((self.reasons)(self.device, &mut reasons))?;
        }
        Some(Telemetry {
            sm_clock_mhz: clock,
            // NVML reports milliwatts.
            power_w: instant.unwrap_or(power as u64) as f64 / 1e3,
            power_instant: instant.is_some(),
            power_limit_w: limit as f64 / 1e3,
            temperature_c: temp,
            power_capped: reasons & (REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE) != 0,
            thermal_slowdown: reasons & (REASON_SW_THERMAL | REASON_HW_THERMAL) != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loader against a stand-in library with nvml.h's signatures (tests/fixtures/
    /// fake_nvml.c, built here with the system C compiler): the bus id format, the units, the
    /// reason bits, the older name of the reasons call, a GPU NVML does not know, and the
    /// instantaneous power where the GPU answers that field (else the average).
    #[test]
    fn reads_a_library_with_nvml_signatures() {
        let dir = std::env::temp_dir().join(format!("duet-fake-nvml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("fake_nvml.c");
        std::fs::write(&src, include_str!("../tests/fixtures/fake_nvml.c")).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let build = |name: &str, defines: &[&str]| -> Option<std::path::PathBuf> {
            let lib = dir.join(name);
            let status = match std::process::Command::new(&cc)
                .args(["-shared", "-fPIC", "-O1"])
                .args(defines)
                .arg("-o")
                .arg(&lib)
                .arg(&src)
                .status()
            {
                Ok(s) => s,
                // A machine with the test binary but no C compiler (the GPU machine): say so.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                Err(e) => panic!("{cc}: {e}"),
            };
            assert!(status.success(), "{cc} failed on {}", src.display());
            Some(lib)
        };
        let Some(average) = build("libfake_nvml.so", &[]) else {
            eprintln!("reads_a_library_with_nvml_signatures: skipped, no C compiler ({cc})");
            return;
        };
        let instant = build("libfake_nvml_instant.so", &["-DFAKE_INSTANT"]).expect("cc ran once");
        let older = build("libfake_nvml_older.so", &["-DNO_FIELD_VALUES"]).expect("cc ran once");
        let names = |lib: &std::path::Path| {
            [
                dir.join("missing.so").display().to_string(),
                lib.display().to_string(),
            ]
        };
        let nvml = Nvml::load_from(&names(&average), 0, 0x19, 0).expect("the stand-in loads");
        let t = nvml.sample().expect("a reading");
        assert_eq!(t.sm_clock_mhz, 1650);
        // The field is not supported: the average.
        assert_eq!(t.power_w, 699.5);
        assert!(!t.power_instant);
        assert_eq!(t.power_limit_w, 700.0);
        assert_eq!(t.temperature_c, 65);
        assert!(t.power_capped);
        assert!(!t.thermal_slowdown);
        // Another GPU: NVML does not know it, so there is no telemetry.
        assert!(Nvml::load_from(&names(&average), 0, 0x1a, 0).is_none());
        // A GPU that reports its power now: that reading, only the low 4 bytes of the union.
        let nvml = Nvml::load_from(&names(&instant), 0, 0x19, 0).expect("the stand-in loads");
        let t = nvml.sample().expect("a reading");
        assert_eq!(t.power_w, 512.25);
        assert!(t.power_instant);
        assert_eq!(t.sm_clock_mhz, 1650);
        // A library without nvmlDeviceGetFieldValues: the average.
        let nvml = Nvml::load_from(&names(&older), 0, 0x19, 0).expect("the stand-in loads");
        let t = nvml.sample().expect("a reading");
        assert_eq!(t.power_w, 699.5);
        assert!(!t.power_instant);
        std::fs::remove_dir_all(&dir).ok();
    }
}
