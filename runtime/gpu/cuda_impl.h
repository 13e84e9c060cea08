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
/* The watchdog's marks on the compute stream: one after every CUDA_MARK_EVERY
 * compute instructions, in a ring of CUDA_MARKS. Before a mark is recorded,
 * the one CUDA_AHEAD marks before it must have completed (a watched wait): the
 * host stays at most that far ahead of the GPU, and never blocks in a launch
 * whose queue is full where the watchdog cannot see it. */
#define CUDA_MARK_EVERY 16
#define CUDA_MARKS 64
#define CUDA_AHEAD 32

/* A walk of instructions captured into a CUDA graph (rt_cuda_walk_begin):
 * the instructions [from, to), forward ones only with fwd; exec NULL when
 * not captured yet or when its capture failed (failed: the walk then runs
 * instruction by instruction from then on). */
#define CUDA_GRAPHS 4
typedef struct CudaWalk {
    int from, to, fwd, used, failed;
    cudaGraphExec_t exec;
} CudaWalk;

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
    /* the watchdog (rt_cuda_sync) */
    double timeout;               /* seconds a wait for the streams may last (rt_comm_timeout) */
    RtComm *host[RT_MAX_GROUPS];  /* by group slot: its host communicator (rt_cuda_group) */
    int *slot_of;                 /* by instruction: a collective's group slot, -1: none */
    int *issued, nissued;         /* the collectives queued since the last wait, in order */
    cudaEvent_t marks[CUDA_MARKS]; /* the ring of compute marks: mark m in slot m % CUDA_MARKS */
    int mark_at[CUDA_MARKS];      /* the compute instruction each mark follows */
    int nmarks, since_mark, first_run; /* marks since the last wait; first_run: the first
                                          compute instruction since then */
    int stuck;                    /* a wait timed out: the streams may never finish */
    /* CUDA graphs (rt_cuda_walk_begin): the walks captured, the one being captured */
    int graphs;                   /* 1: walks are captured and replayed (TCC_CUDA_GRAPHS) */
    CudaWalk walks[CUDA_GRAPHS];
    int capturing;                /* a capture is open on the compute stream: no host waits */
    int replay_from, replay_to;   /* the walk replayed since the last wait (-1: none) */
    cudaEvent_t join;             /* the other streams' end, for the compute stream's */
    cudaLibrary_t spin_lib;       /* TCC_TEST_GPU_HANG's kernel, its flag in mapped host memory */
    cudaKernel_t spin;
    volatile int *spin_flag;
};

/* The device pointer of tensor t. */
static inline char *cuda_tensor(const CudaDevice *d, int t)
{
    return d->mem + d->p->tensors[t].offset;
}

int cuda_fail(cudaError_t e, const char *call, char *err, size_t n);
/* Wait for every channel's stream (0, or -1 with the first failure). */
int nccl_sync_channels(CudaDevice *d, char *err, size_t n);
/* ncclCommDestroy of every communicator; the channels' streams destroyed.
 * After a wait that timed out (d->stuck): nothing waited for. */
void nccl_close(CudaDevice *d);
/* ncclCommAbort of every communicator (the watchdog: a collective that never
 * completes); they are gone afterwards. */
void nccl_abort(CudaDevice *d);
/* The instruction's group in words ("group dp (ranks 0 2)"), "" when none. */
void nccl_describe(const CudaDevice *d, int i, char *out, size_t n);
/* The watchdog, when the first collective that has not completed is i: who
 * of its group has not come (asked over the host communicator), into out. */
void nccl_absent(CudaDevice *d, int i, char *out, size_t n);

#endif
