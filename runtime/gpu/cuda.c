/* cuda.c: the cuda device: memory, kernels, GEMMs, copies, streams and events.
 * Reads: a checked plan (its gpu_source, kernel launches, GEMMs and copies).
 * Writes: the slab on the device.
 * Key idea: as on the CPU, everything is resolved at open -- one cudaMalloc,
 * the cubin loaded and every kernel handle found, every launch's parameter
 * array, every GEMM's cuBLASLt descriptors and algorithm -- so queueing an
 * instruction allocates nothing and looks nothing up. Compute runs on one
 * stream, collectives on another (the pipeline's sends and recvs on a stream
 * per ordered pair of stages, nccl.c); an event orders each collective after
 * the compute before it, and compute waits for a collective only at the first
 * instruction that touches one of its tensors (docs/runtime.md). The driver
 * library is not linked: cudart loads it lazily, so a machine without a GPU
 * gets an error code, not a failed start. */
#include "runtime/gpu/cuda_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/gpu/gpumap.h"
#include "runtime/gpu/nvrtc.h"

#define WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt's; 32 MiB is what Hopper kernels ask for */
#define ROUND(x, a) (((x) + (a)-1) / (a) * (a))

int cuda_fail(cudaError_t e, const char *call, char *err, size_t n)
{
    return plan_errorf(err, n, "%s: %s", call, cudaGetErrorString(e));
}

/* A CUDA runtime call: on failure return -1 with "NAME: text". */
#define CUDA(name, ...)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = name(__VA_ARGS__);                                                        \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail(e_, #name, err, n);                                                   \
    } while (0)
#define LT(name, ...)                                                                              \
    do {                                                                                           \
        cublasStatus_t s_ = name(__VA_ARGS__);                                                     \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return plan_errorf(err, n, "%s: %s", #name, cublasLtGetStatusString(s_));              \
    } while (0)

int rt_cuda_count(char *err, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cuda_fail(e, "cudaGetDeviceCount", err, n);
        return 0;
    }
    if (count == 0)
        plan_errorf(err, n, "cudaGetDeviceCount: 0 devices");
    return count;
}

/* ---- open ---- */

static int alloc_memory(CudaDevice *d, char *err, size_t n)
{
    d->slab_bytes = ROUND(d->p->slab_bytes, 256);
    d->ws_bytes = WORKSPACE_BYTES;
    d->scratch_bytes = ROUND((size_t)plan_scratch_bytes(d->p, 1), 256);
    size_t total = d->slab_bytes + d->ws_bytes + d->scratch_bytes;
    CUDA(cudaMalloc, (void **)&d->mem, total);
    d->ws = d->mem + d->slab_bytes;
    d->scratch = d->ws + d->ws_bytes;
    CUDA(cudaMemset, d->mem, 0, d->slab_bytes);
    return 0;
}

static int load_kernels(CudaDevice *d, const char *cache_dir, char *err, size_t n)
{
    const Plan *p = d->p;
    if (p->nkernels == 0)
        return 0;
    if (!p->gpu_source || !*p->gpu_source)
        return plan_errorf(err, n,
                           "the plan has no CUDA kernels: rebuild it with a tcc that "
                           "renders them");
    int major = 0, minor = 0;
    CUDA(cudaDeviceGetAttribute, &major, cudaDevAttrComputeCapabilityMajor, d->ordinal);
    CUDA(cudaDeviceGetAttribute, &minor, cudaDevAttrComputeCapabilityMinor, d->ordinal);
    char arch[16], msg[400];
    snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
    RtCubin cubin = {0};
    if (rt_nvrtc_compile(p->gpu_source, arch, cache_dir ? cache_dir : "", &cubin, msg, sizeof msg))
        return plan_errorf(err, n, "NVRTC for %s: %s", arch, msg);
    cudaError_t e = cudaLibraryLoadData(&d->lib, cubin.image, NULL, NULL, 0, NULL, NULL, 0);
    rt_cubin_free(&cubin);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaLibraryLoadData", err, n);
    if (!(d->kernels = calloc((size_t)p->nkernels, sizeof *d->kernels)))
        return plan_errorf(err, n, "calloc: out of memory");
    for (int k = 0; k < p->nkernels; k++) {
        e = cudaLibraryGetKernel(&d->kernels[k], d->lib, p->kernels[k].name);
        if (e != cudaSuccess)
            return plan_errorf(err, n, "kernel %s: cudaLibraryGetKernel: %s", p->kernels[k].name,
                               cudaGetErrorString(e));
    }
    return 0;
}

/* Every instruction's device pointers and, for kernels, the parameter array
 * cudaLaunchKernel reads (one pointer to each device pointer). */
static int bind_params(CudaDevice *d, char *err, size_t n)
{
    const Plan *p = d->p;
    size_t total = 0, k = 0;
    for (int i = 0; i < p->ninstrs; i++)
        total += (size_t)p->instrs[i].nargs;
    d->dptr = calloc(total + 1, sizeof *d->dptr);
    d->params = calloc((size_t)p->ninstrs + 1, sizeof *d->params);
    void **pv = calloc(total + 1, sizeof *pv);
    if (!d->dptr || !d->params || !pv) {
        free(pv);
        return plan_errorf(err, n, "calloc: out of memory");
    }
    for (int i = 0; i < p->ninstrs; i++) {
        d->params[i] = pv + k;
        for (int j = 0; j < p->instrs[i].nargs; j++, k++) {
            d->dptr[k] = cuda_tensor(d, p->instrs[i].args[j]);
            pv[k] = &d->dptr[k];
        }
    }
    d->params[0] = pv; /* also with no instructions: rt_cuda_close frees it there */
    return 0;
}

static int lt_type(PlanDType t, cudaDataType_t *out)
{
    switch (t) {
    case PD_F32:
        *out = CUDA_R_32F;
        return 0;
    case PD_F64:
        *out = CUDA_R_64F;
        return 0;
    case PD_BF16:
        *out = CUDA_R_16BF;
        return 0;
    default:
        return -1;
    }
}

static int lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, const RtLtMatrix *m,
                     int64_t batch, char *err, size_t n)
{
    int32_t count = (int32_t)batch;
    int64_t stride = m->stride;
    LT(cublasLtMatrixLayoutCreate, l, t, (uint64_t)m->rows, (uint64_t)m->cols, m->ld);
    LT(cublasLtMatrixLayoutSetAttribute, *l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
       sizeof count);
    LT(cublasLtMatrixLayoutSetAttribute, *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
       sizeof stride);
    return 0;
}

/* The descriptor: compute 64F for f64, else 32F (bf16 operands accumulate in
 * f32); ops; the bias epilogue along cuBLASLt's rows (gpumap.h). */
static int lt_desc(CudaDevice *d, LtGemm *G, const PlanGemm *g, const RtLtGemm *lt,
                   cudaDataType_t ct, char *err, size_t n)
{
    int f64 = ct == CUDA_R_64F;
    cublasOperation_t ta = lt->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = lt->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescCreate, &G->desc, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
       f64 ? CUDA_R_64F : CUDA_R_32F);
    LT(cublasLtMatmulDescSetAttribute, G->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    LT(cublasLtMatmulDescSetAttribute, G->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (f64)
        G->alpha.d = g->alpha, G->beta.d = g->beta;
    else
        G->alpha.f = (float)g->alpha, G->beta.f = (float)g->beta;
    if (g->epilogue == PE_BIAS) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        void *bias = cuda_tensor(d, g->bias);
        LT(cublasLtMatmulDescSetAttribute, G->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
           sizeof epi);
        LT(cublasLtMatmulDescSetAttribute, G->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
           sizeof bias);
        LT(cublasLtMatmulDescSetAttribute, G->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct,
           sizeof ct);
    }
    return 0;
}

/* GEMM instruction i: descriptors, layouts and the heuristic's first algorithm. */
static int lt_gemm(CudaDevice *d, int i, char *err, size_t n)
{
    const Plan *p = d->p;
    const PlanGemm *g = &p->instrs[i].gemm;
    LtGemm *G = &d->gemms[i];
    RtLtGemm lt = rt_lt_gemm(g);
    cudaDataType_t ta, tb, tc;
    if (lt_type(p->tensors[lt.a.tensor].dtype, &ta) ||
        lt_type(p->tensors[lt.b.tensor].dtype, &tb) || lt_type(p->tensors[g->c].dtype, &tc))
        return plan_errorf(err, n, "GEMM of %s x %s -> %s: not a cuBLASLt type here",
                           plan_dtype_name(p->tensors[g->a].dtype),
                           plan_dtype_name(p->tensors[g->b].dtype),
                           plan_dtype_name(p->tensors[g->c].dtype));
    G->a = cuda_tensor(d, lt.a.tensor), G->b = cuda_tensor(d, lt.b.tensor);
    G->c = cuda_tensor(d, g->c);
    if (lt_desc(d, G, g, &lt, tc, err, n) || lt_layout(&G->la, ta, &lt.a, lt.batch, err, n) ||
        lt_layout(&G->lb, tb, &lt.b, lt.batch, err, n) ||
        lt_layout(&G->lc, tc, &lt.c, lt.batch, err, n))
        return -1;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t best;
    int found = 0;
    LT(cublasLtMatmulPreferenceCreate, &pref);
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &d->ws_bytes, sizeof d->ws_bytes);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(d->lt, G->desc, G->la, G->lb, G->lc, G->lc, pref, 1,
                                           &best, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS)
        return plan_errorf(err, n, "cublasLtMatmulAlgoGetHeuristic: %s",
                           cublasLtGetStatusString(s));
    if (found < 1)
        return plan_errorf(err, n,
                           "cublasLtMatmulAlgoGetHeuristic: no algorithm for m %" PRId64
                           " n %" PRId64 " k %" PRId64 " batch %" PRId64,
                           lt.m, lt.n, lt.k, lt.batch);
    G->algo = best.algo;
    return 0;
}

static int open_gemms(CudaDevice *d, char *err, size_t n)
{
    const Plan *p = d->p;
    char msg[400];
    LT(cublasLtCreate, &d->lt);
    if (!(d->gemms = calloc((size_t)p->ninstrs + 1, sizeof *d->gemms)))
        return plan_errorf(err, n, "calloc: out of memory");
    for (int i = 0; i < p->ninstrs; i++)
        if (p->instrs[i].kind == PI_GEMM && lt_gemm(d, i, msg, sizeof msg))
            return plan_errorf(err, n, "instrs[%d] (gemm): %s", i, msg);
    return 0;
}

/* The streams, and two events per collective. */
static int open_streams(CudaDevice *d, char *err, size_t n)
{
    const Plan *p = d->p;
    CUDA(cudaStreamCreateWithFlags, &d->compute, cudaStreamNonBlocking);
    CUDA(cudaStreamCreateWithFlags, &d->comm, cudaStreamNonBlocking);
    d->before = calloc((size_t)p->ninstrs + 1, sizeof *d->before);
    d->done = calloc((size_t)p->ninstrs + 1, sizeof *d->done);
    d->pending = calloc((size_t)p->ninstrs + 1, sizeof *d->pending);
    d->issued = calloc((size_t)p->ninstrs + 1, sizeof *d->issued);
    d->slot_of = calloc((size_t)p->ninstrs + 1, sizeof *d->slot_of);
    if (!d->before || !d->done || !d->pending || !d->issued || !d->slot_of)
        return plan_errorf(err, n, "calloc: out of memory");
    for (int i = 0; i < p->ninstrs; i++)
        d->slot_of[i] = -1;
    for (int k = 0; k < CUDA_MARKS; k++)
        CUDA(cudaEventCreateWithFlags, &d->marks[k], cudaEventDisableTiming);
    CUDA(cudaEventCreateWithFlags, &d->join, cudaEventDisableTiming);
    d->first_run = d->replay_from = -1;
    for (int i = 0; i < p->ninstrs; i++)
        if (p->instrs[i].kind == PI_COLL) {
            CUDA(cudaEventCreateWithFlags, &d->before[i], cudaEventDisableTiming);
            CUDA(cudaEventCreateWithFlags, &d->done[i], cudaEventDisableTiming);
        }
    return 0;
}

CudaDevice *rt_cuda_open(const Plan *p, int ordinal, const char *cache_dir, int graphs, char *err,
                         size_t n)
{
    CudaDevice *d = calloc(1, sizeof *d);
    if (!d) {
        plan_errorf(err, n, "calloc: out of memory");
        return NULL;
    }
    d->p = p, d->ordinal = ordinal, d->graphs = graphs;
    if (rt_comm_timeout(&d->timeout, err, n)) {
        free(d);
        return NULL;
    }
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) {
        plan_errorf(err, n, "cudaSetDevice(%d): %s", ordinal, cudaGetErrorString(e));
        free(d);
        return NULL;
    }
    if (alloc_memory(d, err, n) || load_kernels(d, cache_dir, err, n) || bind_params(d, err, n) ||
        open_gemms(d, err, n) || open_streams(d, err, n)) {
        rt_cuda_close(d);
        return NULL;
    }
    return d;
}

/* Teardown: best effort, every handle that was made (a failure here has no one to tell). */
void rt_cuda_close(CudaDevice *d)
{
    if (!d)
        return;
    if (d->stuck) /* the streams may never finish, and freeing device memory waits for them: the
                     driver reclaims it when the process ends */
        goto host;
    if (d->compute)
        cudaStreamSynchronize(d->compute);
    if (d->comm)
        cudaStreamSynchronize(d->comm);
    for (int k = 0; k < CUDA_MARKS; k++)
        if (d->marks[k])
            cudaEventDestroy(d->marks[k]);
    for (int k = 0; k < CUDA_GRAPHS; k++)
        if (d->walks[k].exec)
            cudaGraphExecDestroy(d->walks[k].exec);
    if (d->join)
        cudaEventDestroy(d->join);
    if (d->spin_flag)
        cudaFreeHost((void *)d->spin_flag);
    if (d->spin_lib)
        cudaLibraryUnload(d->spin_lib);
    for (int i = 0; d->gemms && i < d->p->ninstrs; i++) {
        LtGemm *G = &d->gemms[i];
        if (G->la)
            cublasLtMatrixLayoutDestroy(G->la);
        if (G->lb)
            cublasLtMatrixLayoutDestroy(G->lb);
        if (G->lc)
            cublasLtMatrixLayoutDestroy(G->lc);
        if (G->desc)
            cublasLtMatmulDescDestroy(G->desc);
    }
    for (int i = 0; d->before && i < d->p->ninstrs; i++) {
        if (d->before[i])
            cudaEventDestroy(d->before[i]);
        if (d->done[i])
            cudaEventDestroy(d->done[i]);
    }
    if (d->lt)
        cublasLtDestroy(d->lt);
    if (d->compute)
        cudaStreamDestroy(d->compute);
    if (d->comm)
        cudaStreamDestroy(d->comm);
    if (d->lib)
        cudaLibraryUnload(d->lib);
    if (d->mem)
        cudaFree(d->mem);
host:
    nccl_close(d); /* waits for the pipeline channels' streams first, unless stuck */
    if (d->params)
        free(d->params[0]);
    free(d->params), free(d->dptr), free(d->kernels), free(d->gemms);
    free(d->before), free(d->done), free(d->pending), free(d->issued), free(d->slot_of);
    free(d);
}

/* ---- transfers ---- */

int rt_cuda_put(CudaDevice *d, const char *host, uint64_t off, uint64_t bytes, char *err, size_t n)
{
    CUDA(cudaMemcpyAsync, d->mem + off, host + off, bytes, cudaMemcpyHostToDevice, d->compute);
    return 0;
}

/* A copy into pageable host memory holds the host until the stream has run
 * up to it: every stream is waited for first, under the watchdog, so that a
 * step that never ends is reported instead of hanging in the copy. */
int rt_cuda_get(CudaDevice *d, char *host, uint64_t off, uint64_t bytes, char *err, size_t n)
{
    if (rt_cuda_sync(d, err, n))
        return -1;
    CUDA(cudaMemcpyAsync, host + off, d->mem + off, bytes, cudaMemcpyDeviceToHost, d->compute);
    return 0;
}

/* ---- the watchdog ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 1 when stream s has finished its work, 0 when not, -1 on a failure. */
static int finished(cudaStream_t s, char *err, size_t n)
{
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaErrorNotReady)
        return 0;
    return e == cudaSuccess ? 1 : cuda_fail(e, "cudaStreamQuery", err, n);
}

/* 1 when every stream has finished, 0 when not, -1 on a failure. */
static int idle(CudaDevice *d, char *err, size_t n)
{
    int r = finished(d->comm, err, n);
    for (int k = 0; r == 1 && k < d->nchans; k++)
        if (d->chans[k].stream)
            r = finished(d->chans[k].stream, err, n);
    return r == 1 ? finished(d->compute, err, n) : r;
}

/* 1 when event e (recorded since the last wait) has not completed. */
static int unfinished(cudaEvent_t e)
{
    return cudaEventQuery(e) == cudaErrorNotReady;
}

/* A wait for the streams has lasted d->timeout: name the first collective
 * queued since the last wait that has not completed and who of its group has
 * not come, or else the compute instructions between the marks around the
 * first that has not; abort the NCCL communicators (their kernels end). The
 * device is stuck afterwards: every later wait fails at once. -1. */
static int watchdog(CudaDevice *d, char *err, size_t n)
{
    const Plan *p = d->p;
    char what[400], group[160], who[800];
    int c = -1, k = 0;
    d->stuck = 1;
    for (int j = 0; j < d->nissued && c < 0; j++)
        if (unfinished(d->done[d->issued[j]]))
            c = d->issued[j];
    if (d->replay_from >= 0) { /* one launch: the graph does not say which node */
        snprintf(what, sizeof what, "the CUDA graph of instrs[%d..%d]", d->replay_from,
                 d->replay_to - 1);
        snprintf(who, sizeof who, "%s", "a kernel, GEMM, copy or collective of it does not end "
                                        "(TCC_CUDA_GRAPHS=0 runs it instruction by instruction "
                                        "and names which)");
    } else if (c >= 0) {
        nccl_describe(d, c, group, sizeof group);
        nccl_absent(d, c, who, sizeof who);
        snprintf(what, sizeof what, "instrs[%d] (%s%s%s)", c,
                 plan_instr_label(p, c, (char[80]){0}, 80), group[0] ? " in " : "", group);
    } else {
        k = d->nmarks > CUDA_MARKS ? d->nmarks - CUDA_MARKS : 0; /* those still in the ring */
        while (k < d->nmarks && !unfinished(d->marks[k % CUDA_MARKS]))
            k++;
        int from = k ? d->mark_at[(k - 1) % CUDA_MARKS] + 1 : d->first_run;
        if (k < d->nmarks)
            snprintf(what, sizeof what, "a kernel, GEMM or copy of instrs[%d..%d]", from,
                     d->mark_at[k % CUDA_MARKS]);
        else
            snprintf(what, sizeof what, "a kernel, GEMM or copy from instrs[%d] on", from);
        snprintf(who, sizeof who, "%s", "it does not end (no collective is waited for)");
    }
    nccl_abort(d);
    if (d->spin_flag) /* TCC_TEST_GPU_HANG's kernel may end now */
        *d->spin_flag = 1;
    return plan_errorf(err, n,
                       "cuda:%d: waited %g s for the GPU (the watchdog, TCC_COMM_TIMEOUT or "
                       "--timeout): %s has not completed: %s",
                       d->ordinal, d->timeout, what, who);
}

/* Wait until event e has completed (NULL: every stream has finished),
 * polling: the first thousand polls only yield between them, later ones nap
 * 20 us. A wait of d->timeout fires the watchdog. */
static int watch(CudaDevice *d, cudaEvent_t e, char *err, size_t n)
{
    if (d->stuck)
        return plan_errorf(err, n, "cuda:%d: an earlier wait for the GPU timed out: nothing more "
                                   "runs on it",
                           d->ordinal);
    double t0 = 0;
    for (long polls = 0;; polls++) {
        cudaError_t q = e ? cudaEventQuery(e) : cudaSuccess;
        int r = !e ? idle(d, err, n)
                : q == cudaSuccess ? 1
                : q == cudaErrorNotReady ? 0
                : cuda_fail(q, "cudaEventQuery", err, n);
        if (r < 0)
            return -1;
        if (r)
            return 0;
        if (polls == 0)
            t0 = now_s();
        else if (now_s() - t0 >= d->timeout)
            return watchdog(d, err, n);
        struct timespec nap = {0, polls < 1000 ? 0 : 20 * 1000};
        nanosleep(&nap, NULL);
    }
}

int rt_cuda_sync(CudaDevice *d, char *err, size_t n)
{
    if (watch(d, NULL, err, n))
        return -1;
    d->npending = d->nissued = d->nmarks = d->since_mark = 0;
    d->first_run = d->replay_from = -1;
    return 0;
}

/* TCC_TEST_GPU_HANG's kernel: it spins until the host writes its flag. */
static const char spin_source[] =
    "extern \"C\" __global__ void tcc_spin(volatile int *flag)\n"
    "{\n"
    "    while (*flag == 0)\n"
    "        __nanosleep(1000);\n"
    "}\n";

int rt_cuda_hang(CudaDevice *d, char *err, size_t n)
{
    if (!d->spin) {
        int major = 0, minor = 0;
        char arch[16], msg[400];
        CUDA(cudaDeviceGetAttribute, &major, cudaDevAttrComputeCapabilityMajor, d->ordinal);
        CUDA(cudaDeviceGetAttribute, &minor, cudaDevAttrComputeCapabilityMinor, d->ordinal);
        snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
        RtCubin cubin = {0};
        if (rt_nvrtc_compile(spin_source, arch, NULL, &cubin, msg, sizeof msg))
            return plan_errorf(err, n, "TCC_TEST_GPU_HANG: NVRTC: %s", msg);
        cudaError_t e = cudaLibraryLoadData(&d->spin_lib, cubin.image, NULL, NULL, 0, NULL, NULL, 0);
        rt_cubin_free(&cubin);
        if (e != cudaSuccess)
            return cuda_fail(e, "cudaLibraryLoadData", err, n);
        CUDA(cudaLibraryGetKernel, &d->spin, d->spin_lib, "tcc_spin");
        CUDA(cudaHostAlloc, (void **)&d->spin_flag, sizeof(int), cudaHostAllocMapped);
    }
    void *flag;
    *d->spin_flag = 0;
    CUDA(cudaHostGetDevicePointer, &flag, (void *)d->spin_flag, 0);
    void *args[] = {&flag};
    dim3 one = {1, 1, 1};
    CUDA(cudaLaunchKernel, (const void *)d->spin, one, one, args, 0, d->compute);
    return 0;
}

/* ---- instructions ---- */

/* Compute waits for each pending collective that shares memory with instruction
 * i (it reads what the collective writes, or writes what it still reads). */
static int wait_for_colls(CudaDevice *d, int i, char *err, size_t n)
{
    int kept = 0;
    for (int j = 0; j < d->npending; j++) {
        int c = d->pending[j];
        if (rt_instr_touches(d->p, i, c))
            CUDA(cudaStreamWaitEvent, d->compute, d->done[c], 0);
        else
            d->pending[kept++] = c;
    }
    d->npending = kept;
    return 0;
}

static int run_gemm(CudaDevice *d, int i, char *err, size_t n)
{
    const LtGemm *G = &d->gemms[i];
    LT(cublasLtMatmul, d->lt, G->desc, &G->alpha, G->a, G->la, G->b, G->lb, &G->beta, G->c, G->lc,
       G->c, G->lc, &G->algo, d->ws, d->ws_bytes, d->compute);
    return 0;
}

/* Tensors may alias: the same bytes need nothing, a partial overlap goes
 * through the scratch (cudaMemcpy does not promise memmove). */
static int run_copy(CudaDevice *d, int i, char *err, size_t n)
{
    const PlanInstr *in = &d->p->instrs[i];
    const PlanTensor *dst = &d->p->tensors[in->args[0]], *src = &d->p->tensors[in->args[1]];
    char *to = cuda_tensor(d, in->args[0]), *from = cuda_tensor(d, in->args[1]);
    if (to == from)
        return 0;
    if (rt_tensors_overlap(dst, src)) {
        /* the scratch may still hold a collective's staging: wait for them all */
        for (int j = 0; j < d->npending; j++)
            CUDA(cudaStreamWaitEvent, d->compute, d->done[d->pending[j]], 0);
        d->npending = 0;
        CUDA(cudaMemcpyAsync, d->scratch, from, dst->bytes, cudaMemcpyDeviceToDevice, d->compute);
        from = d->scratch;
    }
    CUDA(cudaMemcpyAsync, to, from, dst->bytes, cudaMemcpyDeviceToDevice, d->compute);
    return 0;
}

static int run_kernel(CudaDevice *d, int i, char *err, size_t n)
{
    const PlanKernel *k = &d->p->kernels[d->p->instrs[i].kernel];
    if (k->grid == 0 && k->block == 0)
        return 0; /* no work items */
    if (k->grid < 1 || k->grid > INT32_MAX || k->block < 1 || k->block > 1024)
        return plan_errorf(err, n, "launch of %" PRId64 " blocks of %d threads: out of range",
                           k->grid, k->block);
    dim3 grid = {(unsigned)k->grid, 1, 1}, block = {(unsigned)k->block, 1, 1};
    CUDA(cudaLaunchKernel, (const void *)d->kernels[d->p->instrs[i].kernel], grid, block,
         d->params[i], 0, d->compute);
    return 0;
}

int rt_cuda_run(CudaDevice *d, int i, char *err, size_t n)
{
    int rc;
    if (d->npending && wait_for_colls(d, i, err, n))
        return -1;
    switch (d->p->instrs[i].kind) {
    case PI_KERNEL:
        rc = run_kernel(d, i, err, n);
        break;
    case PI_GEMM:
        rc = run_gemm(d, i, err, n);
        break;
    case PI_COPY:
        rc = run_copy(d, i, err, n);
        break;
    default:
        return plan_errorf(err, n, "not a compute instruction");
    }
    if (rc)
        return -1;
    if (d->capturing) /* nothing runs yet: no mark to wait for */
        return 0;
    if (d->first_run < 0)
        d->first_run = i;
    if (++d->since_mark == CUDA_MARK_EVERY) { /* for the watchdog */
        if (d->nmarks >= CUDA_AHEAD &&
            watch(d, d->marks[(d->nmarks - CUDA_AHEAD) % CUDA_MARKS], err, n))
            return -1;
        CUDA(cudaEventRecord, d->marks[d->nmarks % CUDA_MARKS], d->compute);
        d->mark_at[d->nmarks++ % CUDA_MARKS] = i;
        d->since_mark = 0;
    }
    return 0;
}

/* ---- CUDA graphs ---- */

/* The walk [from, to) (fwd: forward instructions only): its slot, a new one
 * when there is room, or NULL. */
static CudaWalk *walk_slot(CudaDevice *d, int from, int to, int fwd)
{
    for (int k = 0; k < CUDA_GRAPHS; k++) {
        CudaWalk *w = &d->walks[k];
        if (!w->used)
            *w = (CudaWalk){from, to, fwd, 1, 0, NULL};
        if (w->from == from && w->to == to && w->fwd == fwd)
            return w;
    }
    return NULL;
}

int rt_cuda_walk_begin(CudaDevice *d, int from, int to, int fwd, char *err, size_t n)
{
    CudaWalk *w = d->graphs && !d->stuck ? walk_slot(d, from, to, fwd) : NULL;
    if (!w || w->failed)
        return 0; /* no graph: no room for one, or its capture failed */
    /* the collectives still in flight from the work before: the graph starts after them */
    for (int j = 0; j < d->npending; j++)
        CUDA(cudaStreamWaitEvent, d->compute, d->done[d->pending[j]], 0);
    d->npending = 0;
    if (w->exec) {
        CUDA(cudaGraphLaunch, w->exec, d->compute);
        d->replay_from = from, d->replay_to = to;
        return 1;
    }
    CUDA(cudaStreamBeginCapture, d->compute, cudaStreamCaptureModeRelaxed);
    d->capturing = 1;
    return 0;
}

/* Inside a capture: every other stream that it forked (the collectives',
 * the pipeline channels') joins the compute stream again. */
static cudaError_t join_streams(CudaDevice *d, const char **call)
{
    cudaError_t e = cudaSuccess;
    *call = "cudaStreamIsCapturing";
    for (int k = -1; k < d->nchans && e == cudaSuccess; k++) {
        cudaStream_t s = k < 0 ? d->comm : d->chans[k].stream;
        enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        if (!s || (e = cudaStreamIsCapturing(s, &st)) != cudaSuccess ||
            st != cudaStreamCaptureStatusActive)
            continue;
        *call = "cudaEventRecord";
        if ((e = cudaEventRecord(d->join, s)) == cudaSuccess)
            *call = "cudaStreamWaitEvent", e = cudaStreamWaitEvent(d->compute, d->join, 0);
    }
    return e;
}

int rt_cuda_walk_end(CudaDevice *d, int from, int to, int fwd, int ok, char *err, size_t n)
{
    if (!d->capturing)
        return 0;
    CudaWalk *w = walk_slot(d, from, to, fwd);
    cudaGraph_t g = NULL;
    const char *call = "cudaStreamEndCapture";
    cudaError_t e = ok ? join_streams(d, &call) : cudaSuccess;
    cudaError_t end = cudaStreamEndCapture(d->compute, &g);
    d->capturing = 0;
    d->npending = d->nissued = 0; /* captured, not run */
    if (e == cudaSuccess)
        e = end, call = "cudaStreamEndCapture";
    if (e == cudaSuccess && ok)
        e = cudaGraphInstantiate(&w->exec, g, 0), call = "cudaGraphInstantiate";
    if (g)
        cudaGraphDestroy(g);
    if (!ok || e != cudaSuccess)
        w->failed = 1;
    if (!ok)
        return 1; /* the walk failed while captured: run it again, to fail where it fails */
    if (e != cudaSuccess) {
        w->exec = NULL;
        cudaGetLastError(); /* a capture's failure is not sticky: clear it */
        cuda_fail(e, call, err, n);
        return 1;
    }
    CUDA(cudaGraphLaunch, w->exec, d->compute);
    d->replay_from = from, d->replay_to = to;
    return 0;
}
