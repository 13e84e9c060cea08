/* nccl.c: the collectives of the cuda device, with NCCL.
 * Reads: the plan's PI_COLL instructions and the mesh's groups (mesh.c).
 * Writes: the collectives' outputs in the device slab.
 * Key idea: one NCCL communicator per group of the mesh, bootstrapped over the
 * group's host communicator (MPI: the unique id is broadcast from member 0).
 * NCCL moves contiguous chunks; a gather or scatter along a dim other than the
 * first goes through the scratch with 2D copies (gpumap.h), as the CPU
 * backend's pack and unpack do. Every collective runs on the communication
 * stream after an event that marks the compute before it, and records an event
 * that compute waits for where it first touches the collective's tensors.
 * Sends and recvs are the exception: an NCCL send waits on its stream for the
 * matching recv, so the pipeline's messages go over channels, one per ordered
 * pair of stages, each a 2-rank communicator with a stream of its own (made at
 * attach, in the order of the plan's pairs, gpumap.h). A send blocked in one
 * direction then holds up no recv in the other; the events are the same. */
#include "runtime/gpu/cuda_impl.h"

#include <stdio.h>
#include <stdlib.h>
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

typedef struct IdMsg {
    int ok;
    ncclUniqueId id;
} IdMsg;

int rt_cuda_group(CudaDevice *d, int slot, RtComm *c, char *err, size_t n)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (slot < 0 || slot >= RT_MAX_GROUPS)
        return plan_errorf(err, n, "group slot %d out of range", slot);
    if (d->nccl[slot])
        return 0;
    /* The id travels with whether member 0 could make it: a member that
     * fails still sends, so the others report it instead of waiting forever. */
    IdMsg m = {1, id};
    ncclResult_t made = ncclSuccess;
    if (rt_comm_rank(c) == 0 && (made = ncclGetUniqueId(&m.id)) != ncclSuccess)
        m.ok = 0;
    if (rt_comm_broadcast(c, &m, sizeof m, 0, err, n))
        return -1;
    if (!m.ok)
        return plan_errorf(err, n, "ncclGetUniqueId%s: %s", rt_comm_rank(c) ? " (on member 0)" : "",
                           made != ncclSuccess ? ncclGetErrorString(made) : "failed");
    NCCL(ncclCommInitRank, &d->nccl[slot], rt_comm_size(c), m.id, rt_comm_rank(c));
    d->host[slot] = c;
    return 0;
}

/* The host exchange of a channel's unique id: sent once per pair at attach,
 * before any step, so it cannot meet a message of the plan. */
#define CHANNEL_TAG 32767

/* Channel ch, of which this device (member me of c) is the sender or the
 * receiver: the sender makes the unique id and sends it over c (buffered);
 * ncclCommInitRank returns once both have called it. */
static int open_channel(CudaChannel *ch, int me, RtComm *c, char *err, size_t n)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int sender = me == ch->from;
    if (ch->from == ch->to)
        return plan_errorf(err, n, "a send from stage %d to itself", ch->from);
    IdMsg m = {1, id};
    ncclResult_t made = ncclSuccess;
    if (sender) {
        if ((made = ncclGetUniqueId(&m.id)) != ncclSuccess)
            m.ok = 0; /* sent all the same: the receiver reports it instead of waiting */
        if (rt_comm_send(c, &m, sizeof m, ch->to, CHANNEL_TAG, err, n))
            return -1;
    } else if (rt_comm_recv(c, &m, sizeof m, ch->from, CHANNEL_TAG, err, n)) {
        return -1;
    }
    if (!m.ok)
        return plan_errorf(err, n, "ncclGetUniqueId%s: %s", sender ? "" : " (on the sending stage)",
                           made != ncclSuccess ? ncclGetErrorString(made) : "failed");
    NCCL(ncclCommInitRank, &ch->comm, 2, m.id, sender ? 0 : 1);
    CUDA(cudaStreamCreateWithFlags, &ch->stream, cudaStreamNonBlocking);
    return 0;
}

/* Every member walks the same list of pairs (the plan is the same everywhere)
 * and opens those it is part of. No two members wait for each other on
 * different pairs: the first pair not yet open has both its members at it,
 * since every pair before it is open. */
int rt_cuda_channels(CudaDevice *d, const int8_t *axes, int naxes, RtComm *c, char *err, size_t n)
{
    const Plan *p = d->p;
    RtPair *pairs = malloc(((size_t)p->ninstrs + 1) * sizeof *pairs);
    if (!pairs)
        return plan_errorf(err, n, "malloc: out of memory");
    int np = rt_p2p_pairs(p, axes, naxes, pairs), base = d->nchans, me = rt_comm_rank(c);
    if (np == 0) {
        free(pairs);
        return 0;
    }
    CudaChannel *chans = realloc(d->chans, (size_t)(base + np) * sizeof *chans);
    if (chans)
        d->chans = chans;
    if (!d->chan_of && chans && (d->chan_of = malloc(((size_t)p->ninstrs + 1) * sizeof(int))))
        for (int i = 0; i < p->ninstrs; i++)
            d->chan_of[i] = -1;
    if (!chans || !d->chan_of) {
        free(pairs);
        return plan_errorf(err, n, "malloc: out of memory");
    }
    for (int k = 0; k < np; k++)
        chans[base + k] = (CudaChannel){pairs[k].from, pairs[k].to, NULL, NULL};
    d->nchans = base + np;
    for (int i = 0; i < p->ninstrs; i++) {
        int k = rt_p2p_channel(p, i, axes, naxes, pairs, np);
        if (k >= 0)
            d->chan_of[i] = base + k;
    }
    free(pairs);
    for (int k = base; k < d->nchans; k++) {
        char msg[300];
        if ((chans[k].from == me || chans[k].to == me) &&
            open_channel(&chans[k], me, c, msg, sizeof msg))
            return plan_errorf(err, n, "pipeline channel %d->%d: %s", chans[k].from, chans[k].to,
                               msg);
    }
    return 0;
}

int nccl_sync_channels(CudaDevice *d, char *err, size_t n)
{
    for (int k = 0; k < d->nchans; k++)
        if (d->chans[k].stream)
            CUDA(cudaStreamSynchronize, d->chans[k].stream);
    return 0;
}

void nccl_close(CudaDevice *d)
{
    for (int k = 0; k < d->nchans && !d->stuck; k++)
        if (d->chans[k].stream)
            cudaStreamSynchronize(d->chans[k].stream);
    for (int i = 0; i < RT_MAX_GROUPS; i++)
        if (d->nccl[i])
            ncclCommDestroy(d->nccl[i]);
    for (int k = 0; k < d->nchans; k++) {
        if (d->chans[k].comm)
            ncclCommDestroy(d->chans[k].comm);
        if (d->chans[k].stream)
            cudaStreamDestroy(d->chans[k].stream);
    }
    free(d->chans), free(d->chan_of);
}

void nccl_abort(CudaDevice *d)
{
    for (int i = 0; i < RT_MAX_GROUPS; i++)
        if (d->nccl[i]) {
            ncclCommAbort(d->nccl[i]);
            d->nccl[i] = NULL;
        }
    for (int k = 0; k < d->nchans; k++)
        if (d->chans[k].comm) {
            ncclCommAbort(d->chans[k].comm);
            d->chans[k].comm = NULL;
        }
}

void nccl_describe(const CudaDevice *d, int i, char *out, size_t n)
{
    int slot = d->slot_of ? d->slot_of[i] : -1;
    const PlanInstr *in = &d->p->instrs[i];
    if (in->coll.op == PC_SEND || in->coll.op == PC_RECV)
        snprintf(out, n, "%s stage %d", in->coll.op == PC_SEND ? "to" : "from", in->coll.peer);
    else if (slot >= 0 && d->host[slot])
        rt_comm_describe(d->host[slot], out, n);
    else
        snprintf(out, n, "%s", "");
}

/* A member that waits for the same collective on its GPU times out too, and
 * comes to the same barrier over the host communicator: the barrier completes
 * when every member is there (NCCL itself is stuck), and otherwise its own
 * watchdog names the members that have not come and where they are. */
void nccl_absent(CudaDevice *d, int i, char *out, size_t n)
{
    const PlanInstr *in = &d->p->instrs[i];
    int slot = d->slot_of ? d->slot_of[i] : -1;
    char msg[700];
    if (in->coll.op == PC_SEND || in->coll.op == PC_RECV) {
        snprintf(out, n, "stage %d has not %s it, or NCCL is stuck", in->coll.peer,
                 in->coll.op == PC_SEND ? "received" : "sent");
    } else if (slot < 0 || !d->host[slot]) {
        snprintf(out, n, "%s", "no host communicator to ask the members");
    } else if (rt_comm_barrier(d->host[slot], msg, sizeof msg) == 0) {
        snprintf(out, n, "%s",
                 "every member of the group waits for it on its GPU: NCCL does not complete it");
    } else {
        const char *absent = strstr(msg, "not arrived:");
        snprintf(out, n, "asked the members: %s", absent ? absent : msg);
    }
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
    default:
        return plan_errorf(err, n, "unknown collective %d", (int)in->coll.op);
    }
}

/* Send or recv i on its channel's communicator, where the sender is rank 0
 * and the receiver rank 1. */
static int p2p(CudaDevice *d, const PlanInstr *in, const CudaChannel *ch, char *err, size_t n)
{
    char *buf = cuda_tensor(d, in->args[0]);
    size_t bytes = d->p->tensors[in->args[0]].bytes;
    if (in->coll.op == PC_SEND)
        NCCL(ncclSend, buf, bytes, ncclChar, 1, ch->comm, ch->stream);
    else
        NCCL(ncclRecv, buf, bytes, ncclChar, 0, ch->comm, ch->stream);
    return 0;
}

/* Whether a collective may stage its data in the scratch (gathers and
 * scatters along a dim other than the first, all_to_all): any of those kinds. */
static int uses_scratch(const PlanInstr *in)
{
    return in->coll.op == PC_ALL_GATHER || in->coll.op == PC_REDUCE_SCATTER ||
           in->coll.op == PC_ALL_TO_ALL;
}

int rt_cuda_coll(CudaDevice *d, int i, int slot, int64_t blk, char *err, size_t n)
{
    const PlanInstr *in = &d->p->instrs[i];
    ncclComm_t c = slot >= 0 && slot < RT_MAX_GROUPS ? d->nccl[slot] : NULL;
    const CudaChannel *ch = NULL;
    cudaStream_t s = d->comm;
    if (in->coll.op == PC_SEND || in->coll.op == PC_RECV) {
        int k = d->chan_of ? d->chan_of[i] : -1;
        if (k < 0 || !d->chans[k].comm)
            return plan_errorf(err, n, "%s %s stage %d: no NCCL channel for it (rt_attach)",
                               plan_coll_name(in->coll.op), in->coll.op == PC_SEND ? "to" : "from",
                               in->coll.peer);
        ch = &d->chans[k], s = ch->stream;
    }
    CUDA(cudaEventRecord, d->before[i], d->compute);
    CUDA(cudaStreamWaitEvent, s, d->before[i], 0);
    /* Collectives still in flight on any stream that share memory with this one
     * (a received tensor gathered next, without a kernel in between), or that
     * use the scratch as this one may: this one waits for them. They stay
     * pending for compute. */
    for (int j = 0; j < d->npending; j++)
        if (rt_instr_touches(d->p, i, d->pending[j]) ||
            (uses_scratch(in) && uses_scratch(&d->p->instrs[d->pending[j]])))
            CUDA(cudaStreamWaitEvent, s, d->done[d->pending[j]], 0);
    if (ch ? p2p(d, in, ch, err, n) : dispatch(d, in, c, blk, err, n))
        return -1;
    CUDA(cudaEventRecord, d->done[i], s);
    d->pending[d->npending++] = i;
    d->slot_of[i] = slot;
    if (d->nissued < d->p->ninstrs) /* a loop plan's replays past that are not listed */
        d->issued[d->nissued++] = i;
    return 0;
}
