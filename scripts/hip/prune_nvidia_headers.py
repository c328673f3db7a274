#!/usr/bin/env python3
"""Makes a copy of HIP's NVIDIA-platform headers usable with a newer CUDA toolkit.

HIP's `hip/nvidia_detail/nvidia_hip_runtime_api.h` wraps every CUDA runtime call in an
`inline static` host function. The Debian 12 copy (HIP 5.2) still wraps CUDA APIs that CUDA 12/13
removed or changed (texture references, `cudaDeviceProp::clockRate`, the old graph-edge calls,
...), and those wrappers fail to compile even when nothing calls them. This script compiles a
probe that includes <hip/hip_runtime.h> with nvcc, and deletes the top-level wrapper function
around each reported error line, repeating until the probe compiles. Only host-API wrappers that
the probe's errors point at are removed; the kernel-language part of the headers (__global__,
__shfl_xor, the launch macros) is left untouched, and every removal is printed.

usage: prune_nvidia_headers.py HIP_INCLUDE_COPY [NVCC_ARGS...]
"""
import os
import re
import subprocess
import sys
import tempfile

START = re.compile(r"^(template\s*<|inline\b|static\b|__HIP_DEPRECATED|__host__|hipError_t\b)")


def function_span(lines, err):
    """0-based [start, end] of the top-level definition holding line `err` (0-based)."""
    start = None
    for i in range(err, -1, -1):
        if START.match(lines[i]):
            start = i
            if i > 0 and lines[i - 1].startswith("template"):
                start = i - 1
            break
        if i != err and lines[i].rstrip() == "}":
            break
    if start is None:
        return None
    for j in range(err, len(lines)):
        if lines[j].rstrip() == "}":
            return start, j
    return None


def main():
    root = sys.argv[1]
    nvcc_args = sys.argv[2:]
    probe = tempfile.NamedTemporaryFile("w", suffix=".cu", delete=False)
    probe.write("#include <hip/hip_runtime.h>\n#include <hip/hip_fp16.h>\n__global__ void k(float* x) { x[0] = __shfl_xor(x[0], 1); }\n")
    probe.close()
    removed = 0
    for _ in range(20):
        cmd = ["nvcc", "-x", "cu", "-std=c++17", "-D__HIP_PLATFORM_NVIDIA__", "-I", root,
               *nvcc_args, "-c", probe.name, "-o", os.devnull]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode == 0:
            print(f"nvidia_detail headers compile with this nvcc ({removed} wrappers removed)")
            return 0
        errors = {}
        for m in re.finditer(r"^(\S+?)\((\d+)\): error", res.stdout + res.stderr, re.M):
            errors.setdefault(m.group(1), set()).add(int(m.group(2)) - 1)
        if not errors:
            sys.stderr.write(res.stdout + res.stderr)
            return 1
        progress = False
        for path, errs in errors.items():
            if not os.path.abspath(path).startswith(os.path.abspath(root)):
                sys.stderr.write(f"error outside the HIP headers: {path}\n" + res.stderr)
                return 1
            with open(path) as f:
                lines = f.read().split("\n")
            spans = sorted({s for e in errs if (s := function_span(lines, e))}, reverse=True)
            for start, end in spans:
                name = re.search(r"(\w+)\s*\(", " ".join(lines[start:end + 1]))
                print(f"removed {os.path.basename(path)}:{start + 1}-{end + 1} "
                      f"({name.group(1) if name else '?'})")
                # Keep preprocessor lines so #if/#endif stay balanced.
                lines[start:end + 1] = [l for l in lines[start:end + 1] if l.lstrip().startswith("#")]
                removed += 1
                progress = True
            with open(path, "w") as f:
                f.write("\n".join(lines))
        if not progress:
            sys.stderr.write(res.stdout + res.stderr)
            return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
