/* buckets.c: gradient buckets. Reads every stage's program (gen->instrs,
 * stage after stage); writes it again with the backward's gradient
 * all-reduces merged into few large ones.
 * Key idea: a gradient's all-reduce whose result nothing reads before the
 * optimizer can wait; such all-reduces of one group and dtype share one
 * collective, run when its bucket is full or just before the optimizer,
 * and a bucket never spans stages. */
#include "kgen.h"

#include <string.h>

/* ---- gradient buckets ---- */

/* Data parallelism reduces each gradient once, after the last microbatch: many
 * small all-reduces. Those of the backward pass whose results nothing reads
 * before the optimizer are merged, per group and dtype, into buckets of up to
 * CG_BUCKET_BYTES (one collective each: fewer, larger messages), each run when
 * it is full or, at the latest, just before the optimizer. */
#define CG_BUCKET_BYTES (25u << 20)

typedef struct Bucket {
    PlanInstr in;  /* the merged all-reduce: args in0, out0, in1, out1, ... */
    uint64_t bytes;
    int cap;
} Bucket;

static int same_group(const PlanColl *a, const PlanColl *b)
{
    return a->naxes == b->naxes && !memcmp(a->axes, b->axes, (size_t)a->naxes);
}

/* By tensor: the first instruction that reads it (a collective's outputs are
 * writes), or n. A gradient's all-reduce writes a fresh tensor, so its first
 * reader anywhere is its first reader after the all-reduce. */
static int *first_readers(const Gen *gen)
{
    int n = gen->instrs.len;
    int *first = arena_alloc(gen->a, sizeof(int) * (size_t)(gen->tensors.len + 1));
    for (int t = 0; t < gen->tensors.len; t++)
        first[t] = n;
    for (int i = n - 1; i >= 0; i--) {
        const PlanInstr *in = &gen->instrs.data[i];
        for (int a = 0; a < in->nargs; a++)
            if (!(in->kind == PI_COLL && a % 2))
                first[in->args[a]] = i;
        if (in->kind == PI_GEMM)
            first[in->gemm.a] = first[in->gemm.b] = first[in->gemm.c] = i;
        if (in->kind == PI_GEMM && in->gemm.epilogue == PE_BIAS)
            first[in->gemm.bias] = i;
    }
    return first;
}

static void bucket_add(Gen *gen, Bucket *b, const PlanInstr *in)
{
    if (b->in.nargs + 2 > b->cap) {
        b->cap = b->cap ? 2 * b->cap : 16;
        int *args = arena_alloc(gen->a, sizeof(int) * (size_t)b->cap);
        if (b->in.nargs)
            memcpy(args, b->in.args, sizeof(int) * (size_t)b->in.nargs);
        b->in.args = args;
    }
    if (!b->in.nargs) {
        int *args = b->in.args;
        b->in = *in;
        b->in.args = args;
        b->in.nargs = 0;
        b->in.coll.bytes = 0;
        b->in.layer = -1;
    }
    b->in.args[b->in.nargs++] = in->args[0];
    b->in.args[b->in.nargs++] = in->args[1];
    b->in.tick = in->tick; /* flushed when full: at its last member */
    b->in.coll.bytes += in->coll.bytes;
    b->bytes += gen->tensors.data[in->args[0]].bytes;
}

static void bucket_flush(Gen *gen, Bucket *b, PlanInstr *out, int *n)
{
    if (b->in.nargs)
        out[(*n)++] = b->in;
    b->in.nargs = 0;
    b->in.args = NULL; /* the flushed instruction keeps its array */
    b->cap = 0;
    b->bytes = 0;
}

/* Instructions [lo, hi) (one stage's program) into out at *m. */
static void bucket_gradients(Gen *gen, const int *first, int lo, int hi, PlanInstr *out, int *mp)
{
    int n = hi, m = *mp, opt = hi;
    for (int i = hi - 1; i >= lo; i--)
        if (gen->instrs.data[i].phase == PH_BWD) {
            opt = i + 1;
            break;
        }
    Bucket *bk = arena_alloc(gen->a, sizeof(Bucket) * (size_t)(hi - lo + 1));
    int nb = 0;
    memset(bk, 0, sizeof(Bucket) * (size_t)(hi - lo + 1));
    for (int i = lo; i < n; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        if (i == opt)
            for (int k = 0; k < nb; k++) {
                bk[k].in.tick = in->tick; /* where it runs: the optimizer's piece */
                bucket_flush(gen, &bk[k], out, &m);
            }
        int member = in->kind == PI_COLL && in->coll.op == PC_ALL_REDUCE && in->phase == PH_BWD &&
                     in->nargs == 2 && first[in->args[1]] >= opt &&
                     (!gen->loop || in->when == PW_LAST); /* the loop: once, the sums complete */
        if (!member) {
            out[m++] = *in;
            continue;
        }
        PlanDType dt = gen->tensors.data[in->args[0]].dtype;
        int k = 0;
        while (k < nb && !(bk[k].in.nargs && same_group(&bk[k].in.coll, &in->coll) &&
                           gen->tensors.data[bk[k].in.args[0]].dtype == dt))
            k++;
        if (k == nb) { /* a new (or an emptied) bucket */
            for (k = 0; k < nb && bk[k].in.nargs; k++)
                ;
            nb += k == nb;
        }
        bucket_add(gen, &bk[k], in);
        if (bk[k].bytes >= CG_BUCKET_BYTES)
            bucket_flush(gen, &bk[k], out, &m);
    }
    for (int k = 0; k < nb; k++)
        bucket_flush(gen, &bk[k], out, &m);
    *mp = m;
}

/* Every stage's program bucketed on its own: a bucket never spans stages. */
void cg_bucket_all(Gen *gen)
{
    int n = gen->instrs.len, m = 0;
    int *first = first_readers(gen);
    PlanInstr *out = arena_alloc(gen->a, sizeof(PlanInstr) * (size_t)(n + 1));
    for (int lo = 0, hi; lo < n; lo = hi) {
        for (hi = lo + 1; hi < n && gen->instrs.data[hi].stage == gen->instrs.data[lo].stage; hi++)
            ;
        bucket_gradients(gen, first, lo, hi, out, &m);
    }
    gen->instrs.len = 0;
    for (int i = 0; i < m; i++)
        VEC_PUSH(gen->a, gen->instrs, out[i]);
}
