// hip-on-cuda: libhiprtc over nvcc with HIP's NVIDIA-platform headers. A TEST DOUBLE (../README.md).
//
// hiprtcCompileProgram writes the program and its headers to a temporary folder and compiles
// it with nvcc (-cubin for the GPU's own sm_XY, -D__HIP_PLATFORM_NVIDIA__, the pruned HIP headers
// in <root>/include), so the kernel sources run unchanged. hiprtc's options are translated one by
// one to nvcc's; an option without a translation fails the compile with
// HIPRTC_ERROR_INVALID_OPTION and a line naming it. The code is a cubin, which the HIP runtime
// stand-in's hipModuleLoadData hands to cuModuleLoadData.
#include <hip/hip_version.h>
#include <hip/hiprtc.h>

#include "common.h"

#include <sys/wait.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#if HIP_VERSION_MAJOR >= 7
using Strs = const char* const*;
#else
using Strs = const char**;
#endif

struct _hiprtcProgram {
    std::string source;
    std::string name;
    std::vector<std::pair<std::string, std::string>> headers;  // (include name, text)
    std::string log;
    std::vector<char> code;
};

namespace fs = std::filesystem;

namespace {

std::string quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) {
        if (c == '\'')
            out += "'\\''";
        else
            out += c;
    }
    return out + "'";
}

std::string nvcc_path() {
    if (const char* v = getenv("HIP_ON_CUDA_NVCC"); v && *v) return v;
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
        if (const char* v = getenv(var); v && *v) {
            std::string p = std::string(v) + "/bin/nvcc";
            if (fs::exists(p)) return p;
        }
    }
    if (fs::exists("/usr/local/cuda/bin/nvcc")) return "/usr/local/cuda/bin/nvcc";
    return "nvcc";
}

// sm_XY of the calling thread's current device ($HIP_ON_CUDA_NV_ARCH overrides).
bool nv_arch(std::string* arch, std::string* why) {
    if (const char* v = getenv("HIP_ON_CUDA_NV_ARCH"); v && *v) {
        *arch = v;
        return true;
    }
    const hoc::Driver* d = hoc::driver(why);
    if (!d) return false;
    CUdevice dev = 0;
    int major = 0, minor = 0;
    if (hoc::current_device("hiprtcCompileProgram", &dev) != CUDA_SUCCESS ||
        d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) ||
        d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) {
        *why = "the CUDA device's compute capability could not be read";
        return false;
    }
    *arch = "sm_" + std::to_string(major) + std::to_string(minor);
    return true;
}

// One hiprtc option -> nvcc arguments; false (with `why`) for an option without a translation.
bool translate(const std::string& o, std::vector<std::string>* out, std::string* why) {
    auto starts = [&](const char* p) { return o.rfind(p, 0) == 0; };
    if (starts("--offload-arch=") || starts("--gpu-architecture=")) {
        // The AMD target: the code is built for the NVIDIA GPU instead (its arch is checked by
        // the HIP runtime stand-in's gcnArchName, not here).
        return true;
    }
    if (starts("-D") || starts("-U") || starts("-I")) {
        out->push_back(o);
        return true;
    }
    if (o == "-O0" || o == "-O1" || o == "-O2" || o == "-O3") {
        out->push_back(o);  // host-side level; device code is always optimised by ptxas
        return true;
    }
    if (starts("-std=")) {
        out->push_back(o);
        return true;
    }
    if (o == "-ffp-contract=off") {
        out->push_back("--fmad=false");
        return true;
    }
    if (o == "-ffp-contract=fast" || o == "-ffp-contract=on") {
        out->push_back("--fmad=true");
        return true;
    }
    if (o == "-fhip-fp32-correctly-rounded-divide-sqrt") {
        out->push_back("-prec-div=true");
        out->push_back("-prec-sqrt=true");
        return true;
    }
    if (o == "-fno-hip-fp32-correctly-rounded-divide-sqrt") {
        out->push_back("-prec-div=false");
        out->push_back("-prec-sqrt=false");
        return true;
    }
    if (o == "-fno-gpu-flush-denormals-to-zero") {
        out->push_back("-ftz=false");
        return true;
    }
    if (o == "-fgpu-flush-denormals-to-zero") {
        out->push_back("-ftz=true");
        return true;
    }
    *why = "option '" + o + "' has no nvcc translation in the stand-in";
    return false;
}

bool run(const std::string& cmd, std::string* output, int* status) {
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return false;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return true;
}

}  // namespace

HOC_API const char* hiprtcGetErrorString(hiprtcResult r) {
    switch (r) {
        case HIPRTC_SUCCESS: return "HIPRTC_SUCCESS";
        case HIPRTC_ERROR_OUT_OF_MEMORY: return "HIPRTC_ERROR_OUT_OF_MEMORY";
        case HIPRTC_ERROR_PROGRAM_CREATION_FAILURE: return "HIPRTC_ERROR_PROGRAM_CREATION_FAILURE";
        case HIPRTC_ERROR_INVALID_INPUT: return "HIPRTC_ERROR_INVALID_INPUT";
        case HIPRTC_ERROR_INVALID_PROGRAM: return "HIPRTC_ERROR_INVALID_PROGRAM";
        case HIPRTC_ERROR_INVALID_OPTION: return "HIPRTC_ERROR_INVALID_OPTION";
        case HIPRTC_ERROR_COMPILATION: return "HIPRTC_ERROR_COMPILATION";
        case HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE";
        case HIPRTC_ERROR_INTERNAL_ERROR: return "HIPRTC_ERROR_INTERNAL_ERROR";
        case HIPRTC_ERROR_LINKING: return "HIPRTC_ERROR_LINKING";
        default: return "HIPRTC_ERROR_UNKNOWN";
    }
}

HOC_API hiprtcResult hiprtcVersion(int* major, int* minor) {
    if (!major || !minor) return HIPRTC_ERROR_INVALID_INPUT;
    *major = HIP_VERSION_MAJOR;
    *minor = HIP_VERSION_MINOR;
    return HIPRTC_SUCCESS;
}

HOC_API hiprtcResult hiprtcCreateProgram(hiprtcProgram* prog, const char* src, const char* name,
                                         int num_headers, Strs headers, Strs include_names) {
    if (!prog || !src || num_headers < 0) return HIPRTC_ERROR_INVALID_INPUT;
    if (num_headers > 0 && (!headers || !include_names)) return HIPRTC_ERROR_INVALID_INPUT;
    auto* p = new _hiprtcProgram;
    p->source = src;
    p->name = (name && *name) ? name : "program.hip";
    for (int i = 0; i < num_headers; i++) {
        if (!headers[i] || !include_names[i]) {
            delete p;
            return HIPRTC_ERROR_INVALID_INPUT;
        }
        p->headers.emplace_back(include_names[i], headers[i]);
    }
    *prog = p;
    return HIPRTC_SUCCESS;
}

HOC_API hiprtcResult hiprtcDestroyProgram(hiprtcProgram* prog) {
    if (!prog || !*prog) return HIPRTC_ERROR_INVALID_PROGRAM;
    delete *prog;
    *prog = nullptr;
    return HIPRTC_SUCCESS;
}

HOC_API hiprtcResult hiprtcCompileProgram(hiprtcProgram prog, int num_options, Strs options) {
    if (!prog) return HIPRTC_ERROR_INVALID_PROGRAM;
    if (num_options < 0 || (num_options > 0 && !options)) return HIPRTC_ERROR_INVALID_INPUT;
    prog->log.clear();
    prog->code.clear();
    std::vector<std::string> args;
    for (int i = 0; i < num_options; i++) {
        std::string why;
        if (!options[i] || !translate(options[i], &args, &why)) {
            prog->log = "hip-on-cuda: hiprtcCompileProgram: " + why + "\n";
            hoc::fail("hiprtcCompileProgram", "%s", why.c_str());
            return HIPRTC_ERROR_INVALID_OPTION;
        }
    }
    std::string arch, why;
    if (!nv_arch(&arch, &why)) {
        prog->log = "hip-on-cuda: hiprtcCompileProgram: no CUDA device to compile for: " + why + "\n";
        return HIPRTC_ERROR_COMPILATION;
    }
    std::string include = hoc::root_dir() + "/include";
    if (!fs::exists(include + "/hip/hip_runtime.h")) {
        prog->log = "hip-on-cuda: hiprtcCompileProgram: " + include +
                    "/hip/hip_runtime.h not found (the stand-in root needs HIP's NVIDIA-platform "
                    "headers, see crates/hip/testing/hip-on-cuda/README.md)\n";
        hoc::fail("hiprtcCompileProgram", "%s", prog->log.c_str());
        return HIPRTC_ERROR_COMPILATION;
    }
    char tmpl[] = "/tmp/hip-on-cuda-rtc-XXXXXX";
    if (!mkdtemp(tmpl)) return HIPRTC_ERROR_INTERNAL_ERROR;
    fs::path dir = tmpl;
    std::error_code ec;
    for (auto& [inc, text] : prog->headers) {
        fs::path hp = dir / inc;
        fs::create_directories(hp.parent_path(), ec);
        std::ofstream(hp, std::ios::binary) << text;
    }
    std::string base = fs::path(prog->name).filename().string();
    fs::path srcp = dir / (base + ".cu");
    std::ofstream(srcp, std::ios::binary) << prog->source;
    fs::path out = dir / "code.cubin";
    std::ostringstream cmd;
    cmd << quote(nvcc_path()) << " -cubin -x cu -arch=" << arch
        << " -D__HIP_PLATFORM_NVIDIA__ -I" << quote(include) << " -I" << quote(dir.string())
        << " -diag-suppress 2810,940 -Xcompiler -w";
    for (auto& a : args) cmd << " " << quote(a);
    cmd << " -o " << quote(out.string()) << " " << quote(srcp.string());
    std::string output;
    int status = 0;
    bool ran = run(cmd.str(), &output, &status);
    hiprtcResult result = HIPRTC_SUCCESS;
    if (!ran || status != 0) {
        prog->log = "hip-on-cuda: " + cmd.str() + "\n" + output +
                    (ran ? "" : "hip-on-cuda: nvcc could not be started\n");
        result = HIPRTC_ERROR_COMPILATION;
    } else {
        prog->log = output;
        std::ifstream in(out, std::ios::binary);
        prog->code.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        if (prog->code.empty()) {
            prog->log += "hip-on-cuda: nvcc wrote no code object\n";
            result = HIPRTC_ERROR_COMPILATION;
        }
    }
    fs::remove_all(dir, ec);
    return result;
}

HOC_API hiprtcResult hiprtcGetProgramLogSize(hiprtcProgram prog, size_t* size) {
    if (!prog) return HIPRTC_ERROR_INVALID_PROGRAM;
    if (!size) return HIPRTC_ERROR_INVALID_INPUT;
    *size = prog->log.size() + 1;
    return HIPRTC_SUCCESS;
}

HOC_API hiprtcResult hiprtcGetProgramLog(hiprtcProgram prog, char* log) {
    if (!prog) return HIPRTC_ERROR_INVALID_PROGRAM;
    if (!log) return HIPRTC_ERROR_INVALID_INPUT;
    std::copy(prog->log.begin(), prog->log.end(), log);
    log[prog->log.size()] = 0;
    return HIPRTC_SUCCESS;
}

HOC_API hiprtcResult hiprtcGetCodeSize(hiprtcProgram prog, size_t* size) {
    if (!prog) return HIPRTC_ERROR_INVALID_PROGRAM;
    if (!size) return HIPRTC_ERROR_INVALID_INPUT;
    *size = prog->code.size();
    return HIPRTC_SUCCESS;
}

HOC_API hiprtcResult hiprtcGetCode(hiprtcProgram prog, char* code) {
    if (!prog) return HIPRTC_ERROR_INVALID_PROGRAM;
    if (!code) return HIPRTC_ERROR_INVALID_INPUT;
    std::copy(prog->code.begin(), prog->code.end(), code);
    return HIPRTC_SUCCESS;
}
