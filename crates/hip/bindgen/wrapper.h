/* Input of bindgen for duet-hip's generated bindings (HIP runtime + hiprtc, C API only).
 * Generated from the headers of the installed HIP (Debian 12: libamdhip64-dev 5.2.3); the
 * allowlists in crates/hip/build.rs keep to calls and enums whose ABI is identical in ROCm 5.2, 6.x
 * and 7.x (see shared/docs/hip-notes.md). */
#define __HIP_PLATFORM_AMD__ 1
#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>
