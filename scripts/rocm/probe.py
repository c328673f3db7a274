#!/usr/bin/env python3
"""Compares duet's hand-written ROCm constants and struct layouts with the real headers.

    scripts/rocm/probe.py --include DIR [--layout FILE] [--work DIR] [--cxx g++]

The constants are read from the Rust sources (every `const NAME: T = VALUE;` in the files of
SOURCES), so constants added there are checked too; each is mapped to its C name (the same name
unless C_NAME says otherwise) and printed by a C++ probe compiled against the headers in DIR
(`$ROCM_PATH/include` or an unpacked -dev package tree). `--layout FILE` adds `EXPR VALUE` lines
(`sizeof(T)` / `offsetof(T,field)`, from `rocm_check layout`). One probe per header; a header that is
not there (RCCL on ROCm 6.4) is a SKIP line, one that the probe does not compile with is a failure. Exit 1 if any
value differs, or if a constant has no C counterpart here (add it to C_NAME or SKIP_NAMES).
"""

import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# file -> (the header it is checked against, extra headers)
SOURCES = {
    "crates/hip/src/rocblas/sys.rs": ("rocblas/rocblas.h", []),
    "crates/hip/src/hipblaslt/sys.rs": ("hipblaslt/hipblaslt.h", []),
    "crates/hip/src/rccl.rs": ("rccl/rccl.h", ["hip/hip_runtime_api.h"]),
    "crates/hip/src/hip/result.rs": ("hip/hip_runtime_api.h", []),
}

# Rust name -> C expression, where they differ.
C_NAME = {
    "NCCL_SUCCESS": "ncclSuccess",
    "NCCL_UINT8": "ncclUint8",
    "NCCL_INT32": "ncclInt32",
    "NCCL_FLOAT16": "ncclFloat16",
    "NCCL_FLOAT32": "ncclFloat32",
    "NCCL_BFLOAT16": "ncclBfloat16",
    "NCCL_SUM": "ncclSum",
    "NCCL_MAX": "ncclMax",
    "NCCL_AVG": "ncclAvg",
    "HIP_EVENT_DISABLE_TIMING": "hipEventDisableTiming",
    "HIP_STREAM_NON_BLOCKING": "hipStreamNonBlocking",
    "HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL": "hipStreamCaptureModeThreadLocal",
    "HIP_EVENT_DEFAULT": "hipEventDefault",
    "ARCH_OFFSET_R0600": "offsetof(hipDeviceProp_tR0600, gcnArchName)",
    "ARCH_OFFSET_R0000": "offsetof(hipDeviceProp_tR0000, gcnArchName)",
}
# Rust constants that must be at least the C value (buffers sized for a struct).
AT_LEAST = {
    "PROPS_BUF": "sizeof(hipDeviceProp_tR0600)",
}
# Checks whose C side may be absent from a header version, with why that is fine.
OPTIONAL = {
    "ARCH_OFFSET_R0000": "only used when hipGetDevicePropertiesR0600 is not exported (ROCm 6/7 export it)",
}
# Rust constants with no C counterpart.
SKIP_NAMES = set()

# layout expression prefix -> header
LAYOUT_HEADER = {
    "hipblasLt": "hipblaslt/hipblaslt.h",
    "nccl": "rccl/rccl.h",
    "hipDeviceProp": "hip/hip_runtime_api.h",
}

CONST_RE = re.compile(
    r"^\s*(?:pub(?:\([a-z]+\))?\s+)?const\s+([A-Za-z_][A-Za-z0-9_]*)\s*:\s*[^=]+=\s*(0x[0-9a-fA-F_]+|\d[\d_]*)\s*;",
    re.M,
)


def rust_consts(path):
    text = open(os.path.join(REPO, path)).read()
    text = re.sub(r"#\[cfg\(test\)\].*", "", text, flags=re.S)
    out = []
    for m in CONST_RE.finditer(text):
        out.append((m.group(1), int(m.group(2).replace("_", ""), 0)))
    return out


def compile_and_run(header, extra, exprs, include, stem, cxx):
    """Returns ({index: value}, {index: first error}) for the expressions that compile."""
    src = ["#define __HIP_PLATFORM_AMD__ 1", "#include <cstddef>", "#include <cstdio>"]
    src += [f"#include <{h}>" for h in extra + [header]]
    src.append("int main() {")
    first = len(src) + 1  # line number of the first printf
    for i, expr in enumerate(exprs):
        src.append(f'  std::printf("{i} %lld\\n", (long long)({expr}));')
    src.append("  return 0; }")
    with open(stem + ".cpp", "w") as f:
        f.write("\n".join(src) + "\n")
    cc = subprocess.run(
        [cxx, "-std=c++17", "-w", "-I", include, stem + ".cpp", "-o", stem],
        capture_output=True,
        text=True,
    )
    if cc.returncode != 0:
        bad = {}
        for line in cc.stderr.splitlines():
            m = re.match(re.escape(stem) + r"\.cpp:(\d+):\d+: error: (.*)", line)
            if m and 0 <= int(m.group(1)) - first < len(exprs):
                bad.setdefault(int(m.group(1)) - first, m.group(2))
        if not bad:
            raise RuntimeError(" | ".join(l for l in cc.stderr.splitlines() if "error" in l)[:600])
        return None, bad
    run = subprocess.run([stem], capture_output=True, text=True, check=True)
    vals = {}
    for line in run.stdout.splitlines():
        i, v = line.split()
        vals[int(i)] = int(v)
    return vals, {}


def probe(header, extra, checks, include, work, cxx):
    """checks: list of (label, C expression, rust value, op). Returns (ok, lines)."""
    os.makedirs(work, exist_ok=True)
    stem = os.path.join(work, header.replace("/", "_").replace(".h", ""))
    idx = list(range(len(checks)))
    errors = {}
    try:
        vals, bad = compile_and_run(header, extra, [checks[i][1] for i in idx], include, stem, cxx)
        if vals is None:
            errors = {idx[j]: e for j, e in bad.items()}
            idx = [i for i in idx if i not in errors]
            vals, bad = compile_and_run(
                header, extra, [checks[i][1] for i in idx], include, stem, cxx
            )
            if vals is None:
                raise RuntimeError(str(bad))
        vals = {idx[j]: v for j, v in vals.items()}
    except (RuntimeError, subprocess.CalledProcessError) as e:
        return False, [f"FAIL {header}: the probe does not compile or run: {e}"]
    ok = True
    lines = []
    for i, (label, expr, rust, op) in enumerate(checks):
        if i in errors:
            if label in OPTIONAL:
                lines.append(f"note {header}: {label}: {expr} not in this header ({errors[i]}); {OPTIONAL[label]}")
            else:
                ok = False
                lines.append(f"DIFF {header}: {label}: {expr} not in this header ({errors[i]})")
            continue
        c = vals.get(i)
        good = c is not None and (rust >= c if op == ">=" else rust == c)
        ok &= good
        rel = ">=" if op == ">=" else "="
        lines.append(
            f"{'ok  ' if good else 'DIFF'} {header}: {label} rust {rust} {rel} C {expr} {c}"
        )
    return ok, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--include", required=True)
    ap.add_argument("--layout")
    ap.add_argument("--work", default="/tmp/duet-rocm-probe")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    a = ap.parse_args()

    groups = {}
    unmapped = []
    for path, (header, extra) in SOURCES.items():
        for name, value in rust_consts(path):
            if name in SKIP_NAMES:
                continue
            if name in AT_LEAST:
                check = (name, AT_LEAST[name], value, ">=")
            else:
                check = (name, C_NAME.get(name, name), value, "==")
            groups.setdefault((header, tuple(extra)), []).append(check)
    if a.layout:
        for line in open(a.layout):
            parts = line.split()
            if len(parts) != 2:
                continue
            expr, value = parts[0], int(parts[1])
            inner = expr.split("(", 1)[1]
            header = next((h for p, h in LAYOUT_HEADER.items() if inner.startswith(p)), None)
            if header is None:
                unmapped.append(expr)
                continue
            extra = ["hip/hip_runtime_api.h"] if header.startswith("rccl") else []
            groups.setdefault((header, tuple(extra)), []).append(
                (expr, expr.replace(",", ", "), value, "==")
            )
    ok = True
    for (header, extra), checks in groups.items():
        if not os.path.exists(os.path.join(a.include, header)):
            print(f"SKIP {header}: not in {a.include} ({len(checks)} checks not run)")
            continue
        good, lines = probe(header, list(extra), checks, a.include, a.work, a.cxx)
        for l in lines:
            print(l)
        if good is False:
            ok = False
    for u in unmapped:
        print(f"DIFF no header known for layout entry {u}")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
