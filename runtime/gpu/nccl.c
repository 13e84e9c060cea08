/* nccl.c: the collectives of the cuda device, with NCCL.
 * Reads: the plan's PI_COLL instructions and the mesh's groups (mesh.c).
 * Writes: the collectives' outputs in the device slab.
 * Key idea: one NCCL communicator per group of the mesh, bootstrapped over the
 * group's host communicator (MPI: the unique id is broadcast from member 0).
 * NCCL moves contiguous chunks; a gather or scatter along a dim other than the
 * first goes through the scratch with 2D copies (gpumap.h), as the CPU
 * backend's pack and unpack do. Every collective runs on the communication
 * stream after an event that marks the compute before it, and records an event
 * that compute waits for where it first touches the collective's tensors. */
#include "runtime/gpu/cuda_impl.h"

#include <stdio.h>
#include <string.h>

#include "runtime/gpu/gpumap.h"

#define NCCL(name, ...)                                                                            \
    do {                                                                                           \
        ncclResult_t r_ = name(__VA_ARGS__);                                                       \
        if (r_ != ncclSuccess)                                                                     \
            return plan_errorf(err, n, "%s: %s", #name, ncclGetErrorString(r_));                   \
    } while (0)
#define CUDA(name, ...)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = name(__VA_ARGS__);                                                        \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail(e_, #name, err, n);                                                   \
    } while (0)

int rt_cuda_group(CudaDevice *d, int slot, RtComm *c, char *err, size_t n)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (slot < 0 || slot >= RT_MAX_GROUPS)
        return plan_errorf(err, n, "group slot %d out of range", slot);
    if (d->nccl[slot])
        return 0;
    if (rt_comm_rank(c) == 0)
        NCCL(ncclGetUniqueId, &id);
    if (rt_comm_broadcast(c, &id, sizeof id, 0, err, n))
        return -1;
    NCCL(ncclCommInitRank, &d->nccl[slot], rt_comm_size(c), id, rt_comm_rank(c));
    return 0;
}

void nccl_close(CudaDevice *d)
{
    for (int i = 0; i < RT_MAX_GROUPS; i++)
        if (d->nccl[i])
            ncclCommDestroy(d->nccl[i]);
}

static int nccl_type(PlanDType t, ncclDataType_t *out)
{
    switch (t) {
    case PD_F32:
        *out = ncclFloat32;
        return 0;
    case PD_F64:
        *out = ncclFloat64;
        return 0;
    case PD_BF16:
        *out = ncclBfloat16;
        return 0;
    case PD_F16:
        *out = ncclFloat16;
        return 0;
    case PD_I32:
        *out = ncclInt32;
        return 0;
    default:
        return -1;
    }
}

static void geometry(const PlanTensor *t, int dim, size_t *pre, size_t *post)
{
    *pre = *post = 1;
    for (int d = 0; d < dim; d++)
        *pre *= (size_t)t->shape[d];
    for (int d = dim + 1; d < t->rank; d++)
        *post *= (size_t)t->shape[d];
}

static int copy2d(CudaDevice *d, char *dst, const char *src, RtCopy2D c, char *err, size_t n)
{
    CUDA(cudaMemcpy2DAsync, dst + c.dst_off, c.dst_pitch, src + c.src_off, c.src_pitch, c.width,
         c.height, cudaMemcpyDeviceToDevice, d->comm);
    return 0;
}

/* Sums (or maxima) of (in, out) pairs: one group call for a bucket. */
static int all_reduce(CudaDevice *d, const PlanInstr *in, ncclComm_t c, ncclRedOp_t op,
                      ncclDataType_t t, char *err, size_t n)
{
    size_t elem = plan_dtype_size(d->p->tensors[in->args[0]].dtype);
    NCCL(ncclGroupStart);
    for (int a = 0; a + 1 < in->nargs; a += 2) {
        ncclResult_t r = ncclAllReduce(cuda_tensor(d, in->args[a]), cuda_tensor(d, in->args[a + 1]),
                                       d->p->tensors[in->args[a]].bytes / elem, t, op, c, d->comm);
        if (r != ncclSuccess) {
            ncclGroupEnd();
            return plan_errorf(err, n, "ncclAllReduce: %s", ncclGetErrorString(r));
        }
    }
    NCCL(ncclGroupEnd);
    return 0;
}

/* out [pre][size*chunk][post] from every member's in [pre][chunk][post]. */
static int all_gather(CudaDevice *d, const PlanInstr *in, ncclComm_t c, char *err, size_t n)
{
    const PlanTensor *a = &d->p->tensors[in->args[0]];
    char *x = cuda_tensor(d, in->args[0]), *y = cuda_tensor(d, in->args[1]);
    size_t pre, post, elem = plan_dtype_size(a->dtype), chunk = (size_t)a->shape[in->coll.dim];
    int size = 0;
    NCCL(ncclCommCount, c, &size);
    geometry(a, in->coll.dim, &pre, &post);
    if (pre == 1) {
        NCCL(ncclAllGather, x, y, a->bytes, ncclChar, c, d->comm);
        return 0;
    }
    NCCL(ncclAllGather, x, d->scratch, a->bytes, ncclChar, c, d->comm);
    for (int r = 0; r < size; r++)
        if (copy2d(
                d, y, d->scratch + (size_t)r * a->bytes,
                rt_along_copy(pre, chunk, (size_t)size * chunk, post, elem, (size_t)r * chunk, 1),
                err, n))
            return -1;
    return 0;
}

/* out [pre][chunk][post] = the sum of block r (this member's) of every in. */
static int reduce_scatter(CudaDevice *d, const PlanInstr *in, ncclComm_t c, ncclDataType_t t,
                          char *err, size_t n)
{
    const PlanTensor *b = &d->p->tensors[in->args[1]];
    char *x = cuda_tensor(d, in->args[0]), *y = cuda_tensor(d, in->args[1]);
    size_t pre, post, elem = plan_dtype_size(b->dtype), chunk = (size_t)b->shape[in->coll.dim];
    int size = 0;
    NCCL(ncclCommCount, c, &size);
    geometry(b, in->coll.dim, &pre, &post);
    if (pre > 1) {
        for (int r = 0; r < size; r++)
            if (copy2d(d, d->scratch + (size_t)r * b->bytes, x,
                       rt_along_copy(pre, chunk, (size_t)size * chunk, post, elem,
                                     (size_t)r * chunk, 0),
                       err, n))
                return -1;
        x = d->scratch;
    }
    NCCL(ncclReduceScatter, x, y, b->bytes / elem, t, ncclSum, c, d->comm);
    return 0;
}

/* in split along dim2 into size blocks, block j to member j; out the blocks
 * received, along dim. Packed in the scratch, exchanged with grouped send/recv. */
static int all_to_all(CudaDevice *d, const PlanInstr *in, ncclComm_t c, char *err, size_t n)
{
    const PlanColl *co = &in->coll;
    const PlanTensor *a = &d->p->tensors[in->args[0]], *b = &d->p->tensors[in->args[1]];
    char *x = cuda_tensor(d, in->args[0]), *y = cuda_tensor(d, in->args[1]);
    char *send = d->scratch, *recv = d->scratch + a->bytes;
    size_t elem = plan_dtype_size(a->dtype), pre, post;
    int size = 0;
    NCCL(ncclCommCount, c, &size);
    size_t block = a->bytes / (size_t)size, q = (size_t)a->shape[co->dim2] / (size_t)size;
    geometry(a, co->dim2, &pre, &post);
    for (int j = 0; j < size; j++)
        if (copy2d(d, send + (size_t)j * block, x,
                   rt_along_copy(pre, q, (size_t)a->shape[co->dim2], post, elem, (size_t)j * q, 0),
                   err, n))
            return -1;
    NCCL(ncclGroupStart);
    for (int j = 0; j < size; j++) {
        ncclResult_t r = ncclSend(send + (size_t)j * block, block, ncclChar, j, c, d->comm);
        if (r == ncclSuccess)
            r = ncclRecv(recv + (size_t)j * block, block, ncclChar, j, c, d->comm);
        if (r != ncclSuccess) {
            ncclGroupEnd();
            return plan_errorf(err, n, "ncclSend/ncclRecv: %s", ncclGetErrorString(r));
        }
    }
    NCCL(ncclGroupEnd);
    size_t k = (size_t)b->shape[co->dim] / (size_t)size;
    geometry(b, co->dim, &pre, &post);
    for (int j = 0; j < size; j++)
        if (copy2d(d, y, recv + (size_t)j * block,
                   rt_along_copy(pre, k, (size_t)b->shape[co->dim], post, elem, (size_t)j * k, 1),
                   err, n))
            return -1;
    return 0;
}

static int slice(CudaDevice *d, const PlanInstr *in, int64_t blk, char *err, size_t n)
{
    const PlanTensor *a = &d->p->tensors[in->args[0]], *b = &d->p->tensors[in->args[1]];
    size_t pre, post, k = (size_t)b->shape[in->coll.dim];
    geometry(b, in->coll.dim, &pre, &post);
    return copy2d(d, cuda_tensor(d, in->args[1]), cuda_tensor(d, in->args[0]),
                  rt_along_copy(pre, k, (size_t)a->shape[in->coll.dim], post,
                                plan_dtype_size(a->dtype), (size_t)blk * k, 0),
                  err, n);
}

static int dispatch(CudaDevice *d, const PlanInstr *in, ncclComm_t c, int64_t blk, char *err,
                    size_t n)
{
    const PlanTensor *a = &d->p->tensors[in->args[0]];
    ncclDataType_t t;
    if (nccl_type(a->dtype, &t))
        return plan_errorf(err, n, "%s of %s: not an NCCL type", plan_coll_name(in->coll.op),
                           plan_dtype_name(a->dtype));
    if (in->coll.op != PC_SLICE && !c)
        return plan_errorf(err, n, "%s: no NCCL communicator for its group (rt_attach)",
                           plan_coll_name(in->coll.op));
    switch (in->coll.op) {
    case PC_ALL_REDUCE:
        return all_reduce(d, in, c, ncclSum, t, err, n);
    case PC_ALL_REDUCE_MAX:
        return all_reduce(d, in, c, ncclMax, t, err, n);
    case PC_ALL_GATHER:
        return all_gather(d, in, c, err, n);
    case PC_REDUCE_SCATTER:
        return reduce_scatter(d, in, c, t, err, n);
    case PC_ALL_TO_ALL:
        return all_to_all(d, in, c, err, n);
    case PC_SLICE:
        return slice(d, in, blk, err, n);
    case PC_SEND:
        NCCL(ncclSend, cuda_tensor(d, in->args[0]), a->bytes, ncclChar, in->coll.peer, c, d->comm);
        return 0;
    case PC_RECV:
        NCCL(ncclRecv, cuda_tensor(d, in->args[0]), a->bytes, ncclChar, in->coll.peer, c, d->comm);
        return 0;
    default:
        return plan_errorf(err, n, "unknown collective %d", (int)in->coll.op);
    }
}

int rt_cuda_coll(CudaDevice *d, int i, int slot, int64_t blk, char *err, size_t n)
{
    const PlanInstr *in = &d->p->instrs[i];
    ncclComm_t c = slot >= 0 && slot < RT_MAX_GROUPS ? d->nccl[slot] : NULL;
    CUDA(cudaEventRecord, d->before[i], d->compute);
    CUDA(cudaStreamWaitEvent, d->comm, d->before[i], 0);
    if (dispatch(d, in, c, blk, err, n))
        return -1;
    CUDA(cudaEventRecord, d->done[i], d->comm);
    d->pending[d->npending++] = i;
    return 0;
}
