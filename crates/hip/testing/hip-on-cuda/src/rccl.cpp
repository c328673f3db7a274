// hip-on-cuda: librccl over NCCL (libnccl.so.2). A TEST DOUBLE (../README.md).
//
// RCCL is NCCL's API: each function forwards to NCCL's of the same name, with the stream (a
// CUstream here) passed through. Data types and reduction operations are translated by name
// (those both libraries have); the rest are refused with a line naming them. Multi-rank runs
// need several GPUs; on one GPU this is exercised at world size 1.
#include <hip/hip_runtime_api.h>
#include <rccl/rccl.h>

#include "common.h"

#include <dlfcn.h>
#include <mutex>
#include <string>

using hoc::fail;

namespace {

// NCCL's own values (nccl.h), which the RCCL enums are translated to.
enum NcclType { N_INT8 = 0, N_UINT8 = 1, N_INT32 = 2, N_UINT32 = 3, N_INT64 = 4, N_UINT64 = 5,
                N_FLOAT16 = 6, N_FLOAT32 = 7, N_FLOAT64 = 8, N_BFLOAT16 = 9 };
enum NcclOp { N_SUM = 0, N_PROD = 1, N_MAX = 2, N_MIN = 3, N_AVG = 4 };

using GetVersionFn = ncclResult_t (*)(int*);
using GetUniqueIdFn = ncclResult_t (*)(ncclUniqueId*);
using CommInitRankFn = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int);
using CommDestroyFn = ncclResult_t (*)(ncclComm_t);
using ErrorStringFn = const char* (*)(ncclResult_t);
using AllReduceFn = ncclResult_t (*)(const void*, void*, size_t, int, int, ncclComm_t, void*);
using ReduceScatterFn = ncclResult_t (*)(const void*, void*, size_t, int, int, ncclComm_t, void*);
using AllGatherFn = ncclResult_t (*)(const void*, void*, size_t, int, ncclComm_t, void*);

struct Nccl {
    GetVersionFn get_version;
    GetUniqueIdFn get_unique_id;
    CommInitRankFn comm_init_rank;
    CommDestroyFn comm_destroy;
    ErrorStringFn error_string;
    AllReduceFn all_reduce;
    ReduceScatterFn reduce_scatter;
    AllGatherFn all_gather;
};

Nccl g_nccl;
bool g_ok = false;
std::once_flag g_once;

const Nccl* nccl() {
    std::call_once(g_once, [] {
        void* h = nullptr;
        for (const char* n : {"libnccl.so.2", "libnccl.so"}) {
            h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
            if (h) break;
        }
        if (!h) {
            fail("rccl", "NCCL (libnccl.so.2) could not be opened: %s", dlerror());
            return;
        }
        bool ok = true;
        auto get = [&](const char* name) {
            void* p = dlsym(h, name);
            if (!p) {
                fail("rccl", "libnccl.so.2 does not export %s", name);
                ok = false;
            }
            return p;
        };
        g_nccl.get_version = reinterpret_cast<GetVersionFn>(get("ncclGetVersion"));
        g_nccl.get_unique_id = reinterpret_cast<GetUniqueIdFn>(get("ncclGetUniqueId"));
        g_nccl.comm_init_rank = reinterpret_cast<CommInitRankFn>(get("ncclCommInitRank"));
        g_nccl.comm_destroy = reinterpret_cast<CommDestroyFn>(get("ncclCommDestroy"));
        g_nccl.error_string = reinterpret_cast<ErrorStringFn>(get("ncclGetErrorString"));
        g_nccl.all_reduce = reinterpret_cast<AllReduceFn>(get("ncclAllReduce"));
        g_nccl.reduce_scatter = reinterpret_cast<ReduceScatterFn>(get("ncclReduceScatter"));
        g_nccl.all_gather = reinterpret_cast<AllGatherFn>(get("ncclAllGather"));
        g_ok = ok;
    });
    return g_ok ? &g_nccl : nullptr;
}

int type(const char* fn, ncclDataType_t t) {
    switch (t) {
        case ncclInt8: return N_INT8;
        case ncclUint8: return N_UINT8;
        case ncclInt32: return N_INT32;
        case ncclUint32: return N_UINT32;
        case ncclInt64: return N_INT64;
        case ncclUint64: return N_UINT64;
        case ncclFloat16: return N_FLOAT16;
        case ncclFloat32: return N_FLOAT32;
        case ncclFloat64: return N_FLOAT64;
        case ncclBfloat16: return N_BFLOAT16;
        default:
            fail(fn, "data type %d is not implemented by the stand-in", static_cast<int>(t));
            return -1;
    }
}

int op(const char* fn, ncclRedOp_t o) {
    switch (o) {
        case ncclSum: return N_SUM;
        case ncclProd: return N_PROD;
        case ncclMax: return N_MAX;
        case ncclMin: return N_MIN;
        case ncclAvg: return N_AVG;
        default:
            fail(fn, "reduction %d is not implemented by the stand-in", static_cast<int>(o));
            return -1;
    }
}

// The same CUDA context the HIP runtime stand-in made current (or device 0's).
bool ready(const char* fn) {
    CUdevice dev;
    return nccl() && hoc::current_device(fn, &dev) == CUDA_SUCCESS;
}

}  // namespace

HOC_API ncclResult_t ncclGetVersion(int* version) {
    const Nccl* n = nccl();
    return n ? n->get_version(version) : ncclSystemError;
}

HOC_API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    const Nccl* n = nccl();
    return n ? n->get_unique_id(id) : ncclSystemError;
}

HOC_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (!ready("ncclCommInitRank")) return ncclSystemError;
    return nccl()->comm_init_rank(comm, nranks, id, rank);
}

HOC_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    const Nccl* n = nccl();
    return n ? n->comm_destroy(comm) : ncclSystemError;
}

HOC_API const char* ncclGetErrorString(ncclResult_t r) {
    const Nccl* n = nccl();
    return n ? n->error_string(r) : "NCCL (libnccl.so.2) is not available to the RCCL stand-in";
}

HOC_API ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t dt,
                                   ncclRedOp_t o, ncclComm_t comm, hipStream_t stream) {
    const char* fn = "ncclAllReduce";
    int t = type(fn, dt), r = op(fn, o);
    if (t < 0 || r < 0) return ncclInvalidArgument;
    if (!ready(fn)) return ncclSystemError;
    return nccl()->all_reduce(send, recv, count, t, r, comm, stream);
}

HOC_API ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t dt,
                                       ncclRedOp_t o, ncclComm_t comm, hipStream_t stream) {
    const char* fn = "ncclReduceScatter";
    int t = type(fn, dt), r = op(fn, o);
    if (t < 0 || r < 0) return ncclInvalidArgument;
    if (!ready(fn)) return ncclSystemError;
    return nccl()->reduce_scatter(send, recv, count, t, r, comm, stream);
}

HOC_API ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t dt,
                                   ncclComm_t comm, hipStream_t stream) {
    const char* fn = "ncclAllGather";
    int t = type(fn, dt);
    if (t < 0) return ncclInvalidArgument;
    if (!ready(fn)) return ncclSystemError;
    return nccl()->all_gather(send, recv, count, t, comm, stream);
}
