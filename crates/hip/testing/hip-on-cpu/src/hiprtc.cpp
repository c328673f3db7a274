// hip-on-cpu: libhiprtc over the host C++ compiler. A TEST DOUBLE (../README.md).
//
// hiprtcCompileProgram compiles the program unchanged as host C++ against kernel_lang.h (the HIP
// kernel-language subset duet's kernels use; <root>/include/hip-on-cpu) with -nostdinc, so a
// kernel using anything else fails to compile and the log names it:
//   1. preprocess (g++ -E, kernel_lang.h force-included, __HIPCC_RTC__ and the wavefront-size
//      macros defined as a real hiprtc would for a target of the platform's wave size);
//   2. find the kernels: kernel_lang.h turns __global__ and __launch_bounds__(n) into markers;
//   3. compile the preprocessed program plus, per kernel, an entry taking the argument array of
//      hipModuleLaunchKernel and a table (name, entry, parameter sizes, launch bound) into a
//      shared object.
// hiprtc's options are translated one by one; an option without a translation fails the compile
// with HIPRTC_ERROR_INVALID_OPTION and a line naming it. The code object is the shared object
// behind a small header (core.h, kCodeMagic), which the runtime stand-in dlopens.
#include <hip/hip_version.h>
#include <hip/hiprtc.h>

#include "core.h"

#include <sys/wait.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
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
using hoc::fail;

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

struct Translated {
    std::vector<std::string> args;  // for the compiler
    int duet_warp = 0;              // -DDUET_WARP=<n>, recorded in the code object
};

// One hiprtc option -> compiler arguments; false (with `why`) for an option without one.
bool translate(const std::string& o, Translated* t, std::string* why) {
    auto starts = [&](const char* p) { return o.rfind(p, 0) == 0; };
    if (starts("--offload-arch=") || starts("--gpu-architecture=")) {
        return true;  // the target is this CPU (the runtime reports the gcnArchName)
    }
    if (starts("-DDUET_WARP=")) t->duet_warp = atoi(o.c_str() + 12);
    if (starts("-D") || starts("-U") || starts("-I")) {
        t->args.push_back(o);
        return true;
    }
    if (o == "-O0" || o == "-O1" || o == "-O2" || o == "-O3") {
        return true;  // the platform's own level (HIP_ON_CPU_OPT): results do not depend on it
    }
    if (starts("-std=")) {
        t->args.push_back(o);
        return true;
    }
    if (o == "-ffp-contract=off" || o == "-ffp-contract=on" || o == "-ffp-contract=fast") {
        t->args.push_back(o);
        return true;
    }
    if (o == "-fhip-fp32-correctly-rounded-divide-sqrt" || o == "-fno-gpu-flush-denormals-to-zero") {
        return true;  // the CPU's IEEE division and square root, denormals kept: what they ask for
    }
    *why = "option '" + o + "' has no translation in the HIP-on-CPU stand-in (the CPU computes "
           "IEEE f32 with denormals and correctly rounded division and square root only)";
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

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct KernelDecl {
    std::string name;
    std::string bound;  // the __launch_bounds__ argument text, or empty
};

bool is_ident(char c) { return isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The kernels of the preprocessed program: each `__hoc_global__ <type> [__hoc_launch_bounds__(n)]
// <name> (`.
std::vector<KernelDecl> find_kernels(const std::string& s, std::string* why) {
    std::vector<KernelDecl> out;
    const std::string marker = "__hoc_global__";
    size_t pos = 0;
    while ((pos = s.find(marker, pos)) != std::string::npos) {
        pos += marker.size();
        size_t paren = s.find('(', pos);
        if (paren == std::string::npos) break;
        std::string head = s.substr(pos, paren - pos);
        KernelDecl k;
        const std::string lb = "__hoc_launch_bounds__";
        size_t at = head.find(lb);
        size_t name_end = paren;
        if (at != std::string::npos) {
            // The bound's parentheses, then the name and its '('.
            size_t open = pos + at + lb.size();
            while (open < s.size() && isspace(static_cast<unsigned char>(s[open]))) open++;
            int depth = 0;
            size_t close = open;
            for (; close < s.size(); close++) {
                if (s[close] == '(') depth++;
                if (s[close] == ')' && --depth == 0) break;
            }
            k.bound = s.substr(open + 1, close - open - 1);
            name_end = s.find('(', close + 1);
            if (name_end == std::string::npos) break;
        }
        size_t e = name_end;
        while (e > pos && isspace(static_cast<unsigned char>(s[e - 1]))) e--;
        size_t b = e;
        while (b > pos && is_ident(s[b - 1])) b--;
        k.name = s.substr(b, e - b);
        if (k.name.empty()) {
            *why = "a __global__ function whose name could not be read";
            return {};
        }
        out.push_back(k);
        pos = name_end;
    }
    return out;
}

const char* const kEntryTemplates = R"(
// ---- hip-on-cpu: kernel entries and table (generated by the hiprtc stand-in)
template <unsigned... I> struct HocSeq {};
template <unsigned N, unsigned... I> struct HocMake : HocMake<N - 1, N - 1, I...> {};
template <unsigned... I> struct HocMake<0, I...> { typedef HocSeq<I...> type; };
template <class... A, unsigned... I>
static inline void hoc_call(void (*f)(A...), void** a, HocSeq<I...>) {
    f(*reinterpret_cast<A*>(a[I])...);
}
template <class... A> static inline void hoc_invoke(void (*f)(A...), void** a) {
    hoc_call(f, a, typename HocMake<sizeof...(A)>::type());
}
template <class... A> static constexpr unsigned hoc_nparams(void (*)(A...)) { return sizeof...(A); }
template <class... A> struct HocSizes { static const unsigned v[sizeof...(A) + 1]; };
template <class... A> const unsigned HocSizes<A...>::v[sizeof...(A) + 1] = {sizeof(A)..., 0u};
template <class... A> static const unsigned* hoc_sizes(void (*)(A...)) { return HocSizes<A...>::v; }
)";

// The symbols the compiler reported as unknown ("'X' was not declared", "no matching function
// for call to 'X(...)'", "'X' has not been declared", unknown attributes).
std::set<std::string> unknown_symbols(const std::string& log) {
    std::set<std::string> out;
    static const std::regex pats[] = {
        std::regex("'([A-Za-z_][A-Za-z0-9_]*)' was not declared in this scope"),
        std::regex("'([A-Za-z_][A-Za-z0-9_]*)' has not been declared"),
        std::regex("no matching function for call to '([A-Za-z_][A-Za-z0-9_]*)\\("),
        std::regex("'([A-Za-z_][A-Za-z0-9_]*)' attribute directive ignored"),
        std::regex("'([A-Za-z_][A-Za-z0-9_]*)' does not name a type"),
    };
    for (const auto& re : pats)
        for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
            out.insert((*it)[1].str());
    return out;
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
    if (!hoc::settings().error.empty()) {
        prog->log = "hip-on-cpu: " + hoc::settings().error + "\n";
        return HIPRTC_ERROR_INTERNAL_ERROR;
    }
    Translated tr;
    for (int i = 0; i < num_options; i++) {
        std::string why;
        if (!options[i] || !translate(options[i], &tr, &why)) {
            prog->log = "hip-on-cpu: hiprtcCompileProgram: " + why + "\n";
            fail("hiprtcCompileProgram", "%s", why.c_str());
            return HIPRTC_ERROR_INVALID_OPTION;
        }
    }
    const std::string lang = hoc::root_dir() + "/include/hip-on-cpu";
    if (!fs::exists(lang + "/kernel_lang.h")) {
        prog->log = "hip-on-cpu: " + lang + "/kernel_lang.h not found (a stand-in root has it, "
                    "crates/hip/testing/hip-on-cpu/build.sh)\n";
        return HIPRTC_ERROR_COMPILATION;
    }
    char tmpl[] = "/tmp/hip-on-cpu-rtc-XXXXXX";
    if (!mkdtemp(tmpl)) return HIPRTC_ERROR_INTERNAL_ERROR;
    fs::path dir = tmpl;
    std::error_code ec;
    for (auto& [inc, text] : prog->headers) {
        fs::path hp = dir / inc;
        fs::create_directories(hp.parent_path(), ec);
        std::ofstream(hp, std::ios::binary) << text;
    }
    const std::string base = fs::path(prog->name).filename().string();
    const fs::path srcp = dir / base;
    std::ofstream(srcp, std::ios::binary) << prog->source;
    const hoc::Settings& st = hoc::settings();
    const std::string W = std::to_string(st.wave);
    std::string user;
    for (auto& a : tr.args) user += " " + quote(a);
    auto done = [&](hiprtcResult r) {
        fs::remove_all(dir, ec);
        return r;
    };
    // 1. Preprocess.
    const fs::path ii = dir / "program.ii";
    std::ostringstream pre;
    pre << "LC_ALL=C " << quote(st.cxx) << " -E -x c++ -nostdinc -std=c++17 -D__HIPCC_RTC__=1 -D__HIP__=1"
        << " -D__HIP_DEVICE_COMPILE__=1 -D__HIP_PLATFORM_AMD__=1 -D__AMDGCN_WAVEFRONT_SIZE__=" << W
        << " -D__AMDGCN_WAVEFRONT_SIZE=" << W << " -I" << quote(lang) << " -I" << quote(dir.string())
        << " -include kernel_lang.h" << user << " -o " << quote(ii.string()) << " " << quote(srcp.string());
    std::string out;
    int status = 0;
    if (!run(pre.str(), &out, &status) || status != 0) {
        prog->log = "hip-on-cpu: " + pre.str() + "\n" + out;
        return done(HIPRTC_ERROR_COMPILATION);
    }
    // 2. The kernels.
    std::string why;
    std::vector<KernelDecl> kernels = find_kernels(read_file(ii), &why);
    if (!why.empty()) {
        prog->log = "hip-on-cpu: " + base + ": " + why + "\n";
        return done(HIPRTC_ERROR_COMPILATION);
    }
    // 3. The shared object.
    const fs::path final_src = dir / "module.cpp";
    {
        std::ofstream f(final_src, std::ios::binary);
        f << "#define __hoc_global__\n#define __hoc_launch_bounds__(...)\n#include \"program.ii\"\n"
          << kEntryTemplates;
        for (size_t i = 0; i < kernels.size(); i++)
            f << "static void hoc_entry_" << i << "(void** a) { hoc_invoke(&" << kernels[i].name
              << ", a); }\n";
        f << "extern \"C\" __attribute__((visibility(\"default\"))) const HocKernel hoc_kernels[] = {\n";
        for (size_t i = 0; i < kernels.size(); i++) {
            const auto& k = kernels[i];
            f << "  {\"" << k.name << "\", hoc_entry_" << i << ", hoc_nparams(&" << k.name << "), hoc_sizes(&"
              << k.name << "), " << (k.bound.empty() ? "0u" : "(unsigned)(" + k.bound + ")") << "},\n";
        }
        if (kernels.empty()) f << "  {\"\", 0, 0, 0, 0},\n";
        f << "};\nextern \"C\" __attribute__((visibility(\"default\"))) const unsigned hoc_kernel_count = "
          << kernels.size() << ";\n"
          << "extern \"C\" __attribute__((visibility(\"default\"))) const unsigned hoc_abi_version = "
          << HOC_ABI_VERSION << ";\n";
    }
    const fs::path so = dir / "module.so";
    std::ostringstream cc;
    cc << "LC_ALL=C " << quote(st.cxx) << " -x c++ -nostdinc -std=c++17 " << st.opt
       << " -shared -fPIC -fvisibility=hidden -fno-exceptions -fno-rtti -fno-fast-math -w"
       << " -Wl,-z,defs -I" << quote(lang) << " -I" << quote(dir.string());
    for (auto& a : tr.args)
        if (a.rfind("-std=", 0) == 0 || a.rfind("-ffp-contract", 0) == 0) cc << " " << quote(a);
    cc << " -o " << quote(so.string()) << " " << quote(final_src.string()) << " -lm";
    out.clear();
    if (!run(cc.str(), &out, &status) || status != 0) {
        std::string names;
        for (const std::string& s : unknown_symbols(out)) names += (names.empty() ? "" : ", ") + s;
        prog->log = "hip-on-cpu: " + cc.str() + "\n" + out;
        if (!names.empty())
            prog->log += "hip-on-cpu: " + base + " uses what the HIP-on-CPU kernel language does not "
                         "implement (kernel_lang.h): " + names + "\n";
        return done(HIPRTC_ERROR_COMPILATION);
    }
    const std::string sobytes = read_file(so);
    std::string header = "source=" + base + "\nwave=" + W + "\nbuild=" + st.cxx + " " + st.opt + "\n";
    if (tr.duet_warp) header += "duet_warp=" + std::to_string(tr.duet_warp) + "\n";
    header += "kernels=" + std::to_string(kernels.size()) + "\n";
    const uint32_t hlen = static_cast<uint32_t>(header.size());
    const uint64_t slen = sobytes.size();
    prog->code.assign(hoc::kCodeMagic, hoc::kCodeMagic + 8);
    prog->code.insert(prog->code.end(), reinterpret_cast<const char*>(&hlen), reinterpret_cast<const char*>(&hlen) + 4);
    prog->code.insert(prog->code.end(), header.begin(), header.end());
    prog->code.insert(prog->code.end(), reinterpret_cast<const char*>(&slen), reinterpret_cast<const char*>(&slen) + 8);
    prog->code.insert(prog->code.end(), sobytes.begin(), sobytes.end());
    prog->log = out;
    return done(HIPRTC_SUCCESS);
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
