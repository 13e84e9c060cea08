/* cuda_impl.h: private to runtime/gpu: the CudaDevice that cuda.c (memory,
 * kernels, GEMMs, copies, streams) and nccl.c (collectives) share. */
#ifndef TCC_CUDA_IMPL_H
#define TCC_CUDA_IMPL_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "runtime/exec.h"
#include "runtime/gpu/cuda.h"

typedef struct LtGemm { /* a GEMM instruction, resolved at open */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    union {
        float f;
        double d;
    } alpha, beta;
    char *a, *b, *c; /* device pointers: cuBLASLt's A (the plan's B), B, C */
} LtGemm;

/* A pipeline channel: the sends of one ordered pair of stages (gpumap.h), on a
 * 2-rank communicator (the sender is rank 0, the receiver rank 1) and a stream
 * of their own. comm and stream are NULL where this device is neither. */
typedef struct CudaChannel {
    int from, to; /* stages: member indices of the send/recv group */
    ncclComm_t comm;
    cudaStream_t stream;
} CudaChannel;

struct CudaDevice {
    const Plan *p;
    int ordinal;
    char *mem; /* the one cudaMalloc: slab, then workspace, then scratch */
    size_t slab_bytes, ws_bytes, scratch_bytes;
    char *ws, *scratch;
    cudaStream_t compute, comm;
    cudaLibrary_t lib;
    cudaKernel_t *kernels; /* by plan kernel */
    char **dptr;           /* every instruction's argument pointers on the device, back to back */
    void ***params;        /* by instruction: cudaLaunchKernel's args (pointers into dptr) */
    cublasLtHandle_t lt;
    LtGemm *gemms;              /* by instruction (only the PI_GEMMs are set) */
    cudaEvent_t *before, *done; /* by instruction: compute before a collective, its end */
    int *pending;               /* collectives not yet waited for by compute, npending of them */
    int npending;
    ncclComm_t nccl[RT_MAX_GROUPS]; /* by group slot (mesh.c) */
    CudaChannel *chans;             /* the pipeline channels, nchans of them */
    int nchans;
    int *chan_of; /* by instruction: its channel (sends and recvs), else -1; NULL: none */
};

/* The device pointer of tensor t. */
static inline char *cuda_tensor(const CudaDevice *d, int t)
{
    return d->mem + d->p->tensors[t].offset;
}

int cuda_fail(cudaError_t e, const char *call, char *err, size_t n);
/* Wait for every channel's stream (0, or -1 with the first failure). */
int nccl_sync_channels(CudaDevice *d, char *err, size_t n);
/* ncclCommDestroy of every communicator; the channels' streams destroyed. */
void nccl_close(CudaDevice *d);

#endif
