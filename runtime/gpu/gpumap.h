/* gpumap.h: private to the runtime: the pure arithmetic of the cuda device,
 * kept apart from the CUDA calls so that it is tested on any machine.
 * - rt_lt_gemm: a row-major PlanGemm as the column-major problem cuBLASLt
 *   solves. Row-major C (m x n) is column-major C^T, and C^T = op(B)^T op(A)^T,
 *   so cuBLASLt's A is the plan's B, its B the plan's A, its m the plan's n and
 *   its n the plan's m. A row-major matrix stored r x c is the column-major
 *   c x r matrix with the same leading dimension; an operand's op stays as it
 *   is (the plan's trans_b becomes cuBLASLt's transa). The bias of PE_BIAS runs
 *   along cuBLASLt's rows (its m = the plan's n), which is the plan's row of C:
 *   CUBLASLT_EPILOGUE_BIAS adds bias[i] to row i of the column-major D, i.e. to
 *   column i of every row of the row-major C, as PE_BIAS says.
 * - rt_along_copy: NCCL moves contiguous chunks; a block along a dim other
 *   than the first is a strided 2D copy (cudaMemcpy2DAsync's arguments).
 * - rt_instr_touches: whether two instructions share a byte of the slab, which
 *   decides where compute waits for a collective on the other stream.
 * - rt_p2p_pairs, rt_p2p_channel: the pipeline's channels. An NCCL send waits
 *   on its stream for the matching recv, so sends and recvs of both directions
 *   on one stream deadlock under 1F1B (stage 0 sends F(i+1) before it receives
 *   grad(i), stage 1 sends grad(i) before it receives F(i+1)). Each ordered
 *   (sender stage, receiver stage) pair gets its own channel (a 2-rank
 *   communicator and stream): the list of pairs is computed from the plan,
 *   which every device holds whole, so every member of the group walks the
 *   same list in the same order when it makes them. */
#ifndef TCC_GPUMAP_H
#define TCC_GPUMAP_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"

/* One operand of cuBLASLt: the column-major matrix as stored (before its op). */
typedef struct RtLtMatrix {
    int tensor; /* the plan tensor */
    int64_t rows, cols, ld, stride;
} RtLtMatrix;

typedef struct RtLtGemm {
    int trans_a, trans_b; /* cuBLASLt's ops of its A and B */
    int64_t m, n, k;      /* cuBLASLt's: op(A) m x k, op(B) k x n, D m x n */
    RtLtMatrix a, b, c;
    int64_t batch;
} RtLtGemm;

/* The column-major problem of the row-major g (see above). */
static inline RtLtGemm rt_lt_gemm(const PlanGemm *g)
{
    RtLtGemm lt = {.trans_a = g->trans_b,
                   .trans_b = g->trans_a,
                   .m = g->n,
                   .n = g->m,
                   .k = g->k,
                   .batch = g->batch};
    /* plan B stored k x n (row-major) is n x k column-major; transposed, n x k is k x n */
    lt.a =
        (RtLtMatrix){g->b, g->trans_b ? g->k : g->n, g->trans_b ? g->n : g->k, g->ldb, g->stride_b};
    lt.b =
        (RtLtMatrix){g->a, g->trans_a ? g->m : g->k, g->trans_a ? g->k : g->m, g->lda, g->stride_a};
    lt.c = (RtLtMatrix){g->c, g->n, g->m, g->ldc, g->stride_c};
    return lt;
}

/* A 2D copy: height rows of width bytes, row r from src + src_off + r * src_pitch
 * to dst + dst_off + r * dst_pitch. */
typedef struct RtCopy2D {
    size_t dst_off, dst_pitch, src_off, src_pitch, width, height;
} RtCopy2D;

/* The block [pre][k][post] at index start along the middle dim of a
 * [pre][full][post] array of elem-byte elements, to a contiguous buffer (put 0)
 * or from it into the array (put 1). Offsets are relative to the array and to
 * the buffer. */
static inline RtCopy2D rt_along_copy(size_t pre, size_t k, size_t full, size_t post, size_t elem,
                                     size_t start, int put)
{
    size_t run = k * post * elem, off = start * post * elem, pitch = full * post * elem;
    if (put)
        return (RtCopy2D){off, pitch, 0, run, run, pre};
    return (RtCopy2D){0, run, off, pitch, run, pre};
}

/* Whether tensors a and b share a byte of the slab (tensors may alias). */
static inline int rt_tensors_overlap(const PlanTensor *a, const PlanTensor *b)
{
    return a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

/* The tensors instruction i reads or writes into buf (at most 4 for a GEMM,
 * which names its operands in its PlanGemm, not in args); their count. */
static inline int rt_instr_tensors(const Plan *p, int i, const int **list, int buf[4])
{
    const PlanInstr *in = &p->instrs[i];
    int k = 0;
    if (in->kind != PI_GEMM) {
        *list = in->args;
        return in->nargs;
    }
    buf[k++] = in->gemm.a, buf[k++] = in->gemm.b, buf[k++] = in->gemm.c;
    if (in->gemm.epilogue == PE_BIAS)
        buf[k++] = in->gemm.bias;
    *list = buf;
    return k;
}

/* Whether instructions i and j share a byte of the slab. */
static inline int rt_instr_touches(const Plan *p, int i, int j)
{
    int bi[4], bj[4];
    const int *x, *y;
    int nx = rt_instr_tensors(p, i, &x, bi), ny = rt_instr_tensors(p, j, &y, bj);
    for (int a = 0; a < nx; a++)
        for (int b = 0; b < ny; b++)
            if (rt_tensors_overlap(&p->tensors[x[a]], &p->tensors[y[b]]))
                return 1;
    return 0;
}

/* An ordered pair of pipeline stages (members of the send/recv group): the
 * direction of one channel. */
typedef struct RtPair {
    int from, to;
} RtPair;

/* Whether instruction in is a send or recv over the group along axes (the
 * same axes in the same order: mesh.c keys its groups so). */
static inline int rt_p2p_of_group(const PlanInstr *in, const int8_t *axes, int naxes)
{
    if (in->kind != PI_COLL || (in->coll.op != PC_SEND && in->coll.op != PC_RECV) ||
        in->coll.naxes != naxes)
        return 0;
    for (int a = 0; a < naxes; a++)
        if (in->coll.axes[a] != axes[a])
            return 0;
    return 1;
}

/* The direction of send or recv in: a send goes from its stage to its peer, a
 * recv from its peer to its stage. */
static inline RtPair rt_p2p_pair(const PlanInstr *in)
{
    if (in->coll.op == PC_SEND)
        return (RtPair){in->stage, in->coll.peer};
    return (RtPair){in->coll.peer, in->stage};
}

/* The distinct pairs of the plan's sends and recvs over the group along axes,
 * in increasing (from, to) order, into out (room for p->ninstrs: each
 * instruction adds at most one); their count. */
static inline int rt_p2p_pairs(const Plan *p, const int8_t *axes, int naxes, RtPair *out)
{
    int np = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        if (!rt_p2p_of_group(&p->instrs[i], axes, naxes))
            continue;
        RtPair x = rt_p2p_pair(&p->instrs[i]);
        int k = 0;
        while (k < np && (out[k].from < x.from || (out[k].from == x.from && out[k].to < x.to)))
            k++;
        if (k < np && out[k].from == x.from && out[k].to == x.to)
            continue;
        for (int j = np; j > k; j--)
            out[j] = out[j - 1];
        out[k] = x, np++;
    }
    return np;
}

/* The channel (index into pairs, of the group along axes) that instruction i
 * uses; -1 when it is not a send or recv of that group or its pair is absent. */
static inline int rt_p2p_channel(const Plan *p, int i, const int8_t *axes, int naxes,
                                 const RtPair *pairs, int npairs)
{
    if (!rt_p2p_of_group(&p->instrs[i], axes, naxes))
        return -1;
    RtPair x = rt_p2p_pair(&p->instrs[i]);
    for (int k = 0; k < npairs; k++)
        if (pairs[k].from == x.from && pairs[k].to == x.to)
            return k;
    return -1;
}

#endif
