/* Input of bindgen for duet-hip's generated bindings (HIP runtime + hiprtc, C API only).
 * The committed bindings come from ROCm 6.4.3's headers (Debian unstable libamdhip64-dev 6.4.3-5,
 * as scripts/rocm-check.sh unpacks them); the allowlists in crates/hip/build.rs keep to calls and
 * enums whose ABI is identical in ROCm 6.x and 7.x (7.2.4's headers are compared in CI: they only
 * add enum values and make hiprtcCreateProgram/CompileProgram's string arrays `const`). */
#define __HIP_PLATFORM_AMD__ 1
#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>
