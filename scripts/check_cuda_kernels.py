#!/usr/bin/env python3
"""Compile every kernels-cuda/*.cu with NVRTC for the given GPU architectures.

Used by scripts/check-cuda-kernels.sh (which provides NVRTC from the nvidia-cuda-nvrtc wheel).
The sources are prepared exactly as the CUDA backend prepares them at run time: the line
`#include "common.cuh"` is replaced by the text of kernels-cuda/common.cuh (whose
`#include "duet_math.h"` line is replaced by kernels-shared/duet_math.h), and the same options
are passed (`--std=c++17 --gpu-architecture=sm_XY`). Exits non-zero if any file fails for any
architecture.
"""
import argparse
import ctypes
import glob
import os
import re
import sys

INCLUDE_LINE = '#include "common.cuh"'
MATH_INCLUDE_LINE = '#include "duet_math.h"'
# Keep in sync with crates/cuda/src/kernels.rs (NVRTC_OPTIONS).
BASE_OPTIONS = ["--std=c++17"]


def load_nvrtc(lib_dir):
    names = sorted(glob.glob(os.path.join(lib_dir, "libnvrtc.so*")))
    names = [n for n in names if "builtins" not in n]
    if not names:
        sys.exit(f"check-cuda-kernels: no libnvrtc.so* in {lib_dir}")
    # NVRTC dlopens libnvrtc-builtins by its soname at compile time; loading it first by full
    # path lets that lookup find it without LD_LIBRARY_PATH.
    for b in sorted(glob.glob(os.path.join(lib_dir, "libnvrtc-builtins.so*"))):
        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(names[0]), names[0]


def check(nvrtc, rc, what):
    if rc != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: {nvrtc.nvrtcGetErrorString(rc).decode()}")


def compile_one(nvrtc, name, src, options):
    prog = ctypes.c_void_p()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None), "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        log = ctypes.create_string_buffer(size.value)
        check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        log = log.value.decode(errors="replace").strip()
        if rc != 0:
            return False, log, 0, 0
        check(nvrtc, nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        entries = len(re.findall(r"^\.visible \.entry ", ptx.value.decode(errors="replace"), re.M))
        check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        return True, log, entries, size.value
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", required=True, help="folder with *.cu and common.cuh")
    ap.add_argument("--nvrtc-lib-dir", required=True)
    ap.add_argument("--include-dir", action="append", default=[])
    ap.add_argument("--arch", action="append", default=[])
    args = ap.parse_args()
    archs = args.arch or ["sm_80", "sm_89", "sm_90"]

    nvrtc, path = load_nvrtc(args.nvrtc_lib_dir)
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(nvrtc, nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    print(f"NVRTC {major.value}.{minor.value} from {path}")

    with open(os.path.join(args.kernels, "common.cuh")) as f:
        common = f.read()
    # The shared math (kernels-shared/duet_math.h beside the kernels folder), pasted in for its
    # include line as the backend does.
    with open(os.path.join(args.kernels, "..", "kernels-shared", "duet_math.h")) as f:
        math = f.read()
    lines = common.split("\n")
    at = [i for i, l in enumerate(lines) if l.strip() == MATH_INCLUDE_LINE]
    if len(at) != 1:
        sys.exit(f"check-cuda-kernels: common.cuh includes duet_math.h {len(at)} times")
    lines[at[0]] = math
    common = "\n".join(lines)
    files = sorted(glob.glob(os.path.join(args.kernels, "*.cu")))
    if not files:
        sys.exit(f"check-cuda-kernels: no .cu files in {args.kernels}")
    failures = 0
    for path in files:
        name = os.path.basename(path)
        with open(path) as f:
            src = f.read()
        if INCLUDE_LINE not in src:
            print(f"FAIL {name}: does not include common.cuh")
            failures += 1
            continue
        src = src.replace(INCLUDE_LINE, common, 1)
        for arch in archs:
            opts = BASE_OPTIONS + [f"--gpu-architecture={arch}"] + [f"--include-path={d}" for d in args.include_dir]
            ok, log, entries, cubin = compile_one(nvrtc, name, src, opts)
            if ok:
                print(f"ok   {name:<20} {arch}  {entries:3d} kernels  cubin {cubin / 1024:7.1f} KiB")
                if log:
                    print("     warnings:\n     " + log.replace("\n", "\n     "))
            else:
                failures += 1
                print(f"FAIL {name:<20} {arch}  options: {' '.join(opts)}\n{log}")
    if failures:
        print(f"check-cuda-kernels: {failures} compilation(s) failed")
        return 1
    print(f"check-cuda-kernels: {len(files)} files x {len(archs)} architectures compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
