/* test_cuda_map.c: the pure arithmetic of the cuda device (runtime/gpu/gpumap.h),
 * checked on the CPU: a row-major PlanGemm mapped to cuBLASLt's column-major
 * problem and then computed with cuBLASLt's semantics by a naive loop must give
 * the row-major product; the 2D copies around NCCL's contiguous chunks must
 * give the layouts of all_gather, reduce_scatter and all_to_all that comm.h
 * defines, along every dim; compute must wait for a collective exactly where
 * the two share a byte of the slab (a GEMM's operands and bias included); the
 * pipeline's channels (one per ordered pair of stages) come out distinct and
 * ordered, pair each send with its recv, and keep 1F1B from the deadlock that
 * one communication stream per device runs into (a model of rendezvous sends
 * on streams, over plans built from the real schedules).
 * Data: fresh random numbers (seed in the failure message). Bounds: the GEMM
 * runs in float64 in both orders, each result a sum of k products, so it is
 * within k * 2^-52 * sum|a b| of the reference; copies move bits and are exact. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base.h"
#include "passes/passes.h"
#include "runtime/gpu/gpumap.h"

static unsigned seed_now(void)
{
    return (unsigned)time(NULL) ^ (unsigned)clock();
}

static double urand(unsigned *s)
{
    return (double)rand_r(s) / RAND_MAX * 2 - 1;
}

/* What cuBLASLt computes: D = alpha op(A) op(B) (+ bias[i] on row i), column-major,
 * batch times with strided offsets. */
static void lt_compute(const RtLtGemm *lt, double alpha, const double *A, const double *B,
                       double *D, const double *bias)
{
    for (int64_t z = 0; z < lt->batch; z++) {
        const double *a = A + z * lt->a.stride, *b = B + z * lt->b.stride;
        double *d = D + z * lt->c.stride;
        for (int64_t i = 0; i < lt->m; i++)
            for (int64_t j = 0; j < lt->n; j++) {
                double s = 0;
                for (int64_t p = 0; p < lt->k; p++) {
                    double x = lt->trans_a ? a[p + i * lt->a.ld] : a[i + p * lt->a.ld];
                    double y = lt->trans_b ? b[j + p * lt->b.ld] : b[p + j * lt->b.ld];
                    s += x * y;
                }
                d[i + j * lt->c.ld] = alpha * s + (bias ? bias[i] : 0);
            }
    }
}

/* One random row-major problem (padded leading dims, shared or strided batch
 * operands) through the mapping, against the row-major definition. */
static void check_gemm(int ta, int tb, int64_t batch, int shared_b, int bias, unsigned seed)
{
    unsigned s = seed;
    int64_t m = 1 + rand_r(&s) % 7, n = 1 + rand_r(&s) % 7, k = 1 + rand_r(&s) % 9;
    PlanGemm g = {.a = 0,
                  .b = 1,
                  .c = 2,
                  .trans_a = ta,
                  .trans_b = tb,
                  .m = m,
                  .n = n,
                  .k = k,
                  .batch = batch,
                  .alpha = 1.5,
                  .epilogue = bias ? PE_BIAS : PE_NONE};
    g.lda = (ta ? m : k) + rand_r(&s) % 3;
    g.ldb = (tb ? k : n) + rand_r(&s) % 3;
    g.ldc = n + rand_r(&s) % 3;
    g.stride_a = g.lda * (ta ? k : m);
    g.stride_b = shared_b ? 0 : g.ldb * (tb ? n : k);
    g.stride_c = g.ldc * m;
    size_t na = (size_t)(g.stride_a * batch),
           nb = (size_t)(shared_b ? g.ldb * (tb ? n : k) : g.stride_b * batch);
    size_t nc = (size_t)(g.stride_c * batch);
    double *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = calloc(nc, sizeof *C);
    double *bv = malloc((size_t)n * sizeof *bv);
    for (size_t i = 0; i < na; i++)
        A[i] = urand(&s);
    for (size_t i = 0; i < nb; i++)
        B[i] = urand(&s);
    for (int64_t i = 0; i < n; i++)
        bv[i] = urand(&s);
    RtLtGemm lt = rt_lt_gemm(&g);
    cr_assert_eq(lt.a.tensor, g.b, "cuBLASLt's A is the plan's B");
    cr_assert_eq(lt.b.tensor, g.a, "cuBLASLt's B is the plan's A");
    cr_assert_eq(lt.trans_a ? lt.a.cols : lt.a.rows, lt.m, "op(A) rows");
    cr_assert_eq(lt.trans_b ? lt.b.rows : lt.b.cols, lt.n, "op(B) cols");
    cr_assert(lt.a.ld >= lt.a.rows && lt.b.ld >= lt.b.rows && lt.c.ld >= lt.c.rows,
              "a leading dimension below the rows of its column-major matrix");
    lt_compute(&lt, g.alpha, B, A, C, bias ? bv : NULL);
    for (int64_t z = 0; z < batch; z++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double ref = 0, mag = 0;
                for (int64_t p = 0; p < k; p++) {
                    double x = A[z * g.stride_a + (ta ? p * g.lda + i : i * g.lda + p)];
                    double y = B[z * g.stride_b + (tb ? j * g.ldb + p : p * g.ldb + j)];
                    ref += x * y, mag += fabs(x * y);
                }
                ref = g.alpha * ref + (bias ? bv[j] : 0);
                double got = C[z * g.stride_c + i * g.ldc + j];
                double tol = (double)(k + 2) * 0x1p-52 * (fabs(g.alpha) * mag + 1);
                cr_assert(fabs(got - ref) <= tol,
                          "seed %u ta %d tb %d batch %ld: C[%ld][%ld][%ld] = %.17g, want %.17g",
                          seed, ta, tb, (long)batch, (long)z, (long)i, (long)j, got, ref);
            }
    free(A), free(B), free(C), free(bv);
}

Test(cuda_map, gemm_row_major_as_column_major_every_transpose)
{
    unsigned seed = seed_now();
    for (int rep = 0; rep < 20; rep++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                check_gemm(ta, tb, 1, 0, 0, seed + (unsigned)rep);
}

Test(cuda_map, gemm_batched_strided_and_shared_operand)
{
    unsigned seed = seed_now();
    for (int rep = 0; rep < 10; rep++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                check_gemm(ta, tb, 3, 0, 0, seed + (unsigned)rep);
                check_gemm(ta, tb, 4, 1, 0, seed + (unsigned)rep);
            }
}

Test(cuda_map, gemm_bias_runs_along_the_rows_of_row_major_c)
{
    unsigned seed = seed_now();
    for (int rep = 0; rep < 10; rep++)
        for (int ta = 0; ta < 2; ta++)
            check_gemm(ta, rep & 1, 1 + rep % 3, 0, 1, seed + (unsigned)rep);
}

static void copy2d(char *dst, const char *src, RtCopy2D c)
{
    for (size_t r = 0; r < c.height; r++)
        memcpy(dst + c.dst_off + r * c.dst_pitch, src + c.src_off + r * c.src_pitch, c.width);
}

enum { SIZE = 3 };

/* A random [pre][chunk][post] shape of i32 elements per member. */
static void shape(unsigned *s, size_t *pre, size_t *chunk, size_t *post)
{
    *pre = 1 + (size_t)rand_r(s) % 4, *chunk = 1 + (size_t)rand_r(s) % 3;
    *post = 1 + (size_t)rand_r(s) % 4;
}

Test(cuda_map, all_gather_along_any_dim_through_contiguous_chunks)
{
    unsigned seed = seed_now(), s = seed;
    for (int rep = 0; rep < 30; rep++) {
        size_t pre, chunk, post;
        shape(&s, &pre, &chunk, &post);
        size_t cnt = pre * chunk * post, e = sizeof(int32_t);
        int32_t in[SIZE][64], nccl[SIZE * 64], out[SIZE * 64];
        for (int r = 0; r < SIZE; r++)
            for (size_t i = 0; i < cnt; i++)
                in[r][i] = rand_r(&s);
        for (int r = 0; r < SIZE; r++) /* ncclAllGather: member r's buffer at r * cnt */
            memcpy(nccl + (size_t)r * cnt, in[r], cnt * e);
        for (int r = 0; r < SIZE; r++)
            copy2d((char *)out, (char *)(nccl + (size_t)r * cnt),
                   rt_along_copy(pre, chunk, SIZE * chunk, post, e, (size_t)r * chunk, 1));
        for (size_t i = 0; i < pre; i++)
            for (size_t c = 0; c < SIZE * chunk; c++)
                for (size_t j = 0; j < post; j++) {
                    int32_t want = in[c / chunk][(i * chunk + c % chunk) * post + j];
                    cr_assert_eq(out[(i * SIZE * chunk + c) * post + j], want,
                                 "seed %u: [%zu][%zu][%zu] of [%zu][%zu][%zu]", seed, i, c, j, pre,
                                 SIZE * chunk, post);
                }
    }
}

Test(cuda_map, reduce_scatter_along_any_dim_through_contiguous_chunks)
{
    unsigned seed = seed_now(), s = seed;
    for (int rep = 0; rep < 30; rep++) {
        size_t pre, chunk, post;
        shape(&s, &pre, &chunk, &post);
        size_t cnt = pre * chunk * post, e = sizeof(int32_t);
        int32_t in[SIZE][SIZE * 64], packed[SIZE][SIZE * 64];
        for (int r = 0; r < SIZE; r++)
            for (size_t i = 0; i < SIZE * cnt; i++)
                in[r][i] = rand_r(&s) % 1000;
        for (int m = 0; m < SIZE; m++) /* each member packs block r at r * cnt */
            for (int r = 0; r < SIZE; r++)
                copy2d((char *)(packed[m] + (size_t)r * cnt), (char *)in[m],
                       rt_along_copy(pre, chunk, SIZE * chunk, post, e, (size_t)r * chunk, 0));
        for (int r = 0; r < SIZE; r++) /* ncclReduceScatter: member r sums chunk r */
            for (size_t i = 0; i < pre; i++)
                for (size_t c = 0; c < chunk; c++)
                    for (size_t j = 0; j < post; j++) {
                        int32_t got = 0, want = 0;
                        for (int m = 0; m < SIZE; m++) {
                            got += packed[m][(size_t)r * cnt + (i * chunk + c) * post + j];
                            want += in[m][(i * SIZE * chunk + (size_t)r * chunk + c) * post + j];
                        }
                        cr_assert_eq(got, want, "seed %u: member %d [%zu][%zu][%zu]", seed, r, i, c,
                                     j);
                    }
    }
}

/* all_to_all of [d0][d1] (i32) with dim2 = 1 (sent blocks) and dim = 0 (received
 * blocks concatenated): pack along dim2, exchange blocks, unpack along dim. */
Test(cuda_map, all_to_all_packs_along_dim2_and_unpacks_along_dim)
{
    unsigned seed = seed_now(), s = seed;
    for (int rep = 0; rep < 20; rep++) {
        size_t d0 = 1 + (size_t)rand_r(&s) % 4, q = 1 + (size_t)rand_r(&s) % 3, d1 = SIZE * q;
        size_t e = sizeof(int32_t), block = d0 * q;
        int32_t in[SIZE][SIZE * 16], send[SIZE][SIZE * 16], out[SIZE][SIZE * 16];
        for (int r = 0; r < SIZE; r++)
            for (size_t i = 0; i < d0 * d1; i++)
                in[r][i] = rand_r(&s);
        for (int r = 0; r < SIZE; r++)
            for (int j = 0; j < SIZE; j++) /* block j: columns [j q, (j + 1) q) */
                copy2d((char *)(send[r] + (size_t)j * block), (char *)in[r],
                       rt_along_copy(d0, q, d1, 1, e, (size_t)j * q, 0));
        for (int r = 0; r < SIZE; r++)
            for (int j = 0; j < SIZE; j++) /* received from j: rows [j d0, (j + 1) d0) */
                copy2d((char *)out[r], (char *)(send[j] + (size_t)r * block),
                       rt_along_copy(1, d0, SIZE * d0, q, e, (size_t)j * d0, 1));
        for (int r = 0; r < SIZE; r++)
            for (size_t i = 0; i < SIZE * d0; i++)
                for (size_t c = 0; c < q; c++)
                    cr_assert_eq(out[r][i * q + c], in[i / d0][(i % d0) * d1 + (size_t)r * q + c],
                                 "seed %u: member %d out[%zu][%zu]", seed, r, i, c);
    }
}

/* Where compute waits for a collective: an all_reduce of g (args g, g2) and
 * four later instructions: a GEMM that reads g2 through its operand b (named
 * in its PlanGemm only), a GEMM on other tensors, a GEMM whose bias aliases
 * g's last bytes, a kernel that writes g (which the collective still reads). */
Test(cuda_map, compute_waits_for_a_collective_only_where_it_shares_memory)
{
    PlanTensor t[8] = {0};
    uint64_t offs[8] = {0, 64, 128, 192, 256, 320, 120, 448};
    for (int i = 0; i < 8; i++)
        t[i] =
            (PlanTensor){.dtype = PD_F32, .rank = 1, .shape = {16}, .offset = offs[i], .bytes = 64};
    t[6].bytes = 8; /* bytes 120..127: the end of tensor 1 */
    int coll_args[2] = {0, 1}, kernel_args[1] = {0};
    PlanInstr in[5] = {
        {.kind = PI_COLL, .nargs = 2, .args = coll_args, .coll = {.op = PC_ALL_REDUCE}},
        {.kind = PI_GEMM, .gemm = {.a = 2, .b = 1, .c = 3}},
        {.kind = PI_GEMM, .gemm = {.a = 2, .b = 4, .c = 5}},
        {.kind = PI_GEMM, .gemm = {.a = 2, .b = 4, .c = 7, .epilogue = PE_BIAS, .bias = 6}},
        {.kind = PI_KERNEL, .nargs = 1, .args = kernel_args},
    };
    Plan p = {.ntensors = 8, .tensors = t, .ninstrs = 5, .instrs = in};
    cr_assert(rt_instr_touches(&p, 1, 0), "a GEMM operand read from the collective's output");
    cr_assert(!rt_instr_touches(&p, 2, 0), "a GEMM on unrelated tensors waits");
    cr_assert(rt_instr_touches(&p, 3, 0), "a bias aliasing the collective's output");
    in[3].gemm.epilogue = PE_NONE;
    cr_assert(!rt_instr_touches(&p, 3, 0), "the bias counts without the epilogue");
    cr_assert(rt_instr_touches(&p, 4, 0), "a kernel writing what the collective reads");
    cr_assert(rt_instr_touches(&p, 0, 4), "touching is symmetric");
    t[6].offset = 128; /* now just past tensor 1: adjacent, not overlapping */
    in[3].gemm.epilogue = PE_BIAS;
    cr_assert(!rt_instr_touches(&p, 3, 0), "adjacent tensors share no byte");
}

/* ---- pipeline channels ---- */

#define MAXI 512

/* A pipeline plan over axis 0 built from a real schedule (passes/schedule.c):
 * stage r's instructions in its order, F(mb) as [recv act from r-1] kernel
 * [send act to r+1], B(mb) as [recv grad from r+1] kernel [send grad to r-1].
 * Tags: the activation of mb into stage r is 2 (mb p + r), the gradient into
 * stage r 2 (mb p + r) + 1. */
typedef struct PipePlan {
    PlanInstr in[MAXI];
    Plan p;
} PipePlan;

static void p2p(PipePlan *pp, PlanCollKind op, int stage, int peer, int tag)
{
    PlanInstr *in = &pp->in[pp->p.ninstrs];
    *in = (PlanInstr){.kind = PI_COLL, .stage = stage};
    in->coll = (PlanColl){.op = op, .naxes = 1, .axes = {0}, .peer = peer, .tag = tag};
    pp->p.ninstrs++;
}

static void compute(PipePlan *pp, int stage)
{
    pp->in[pp->p.ninstrs++] = (PlanInstr){.kind = PI_KERNEL, .stage = stage};
}

static void pipe_plan(PipePlan *pp, SchedKind kind, int p, int m)
{
    Arena *a = arena_new();
    Schedule s;
    char err[256] = "";
    cr_assert_eq(sched_build(a, kind, p, m, 1, &s, err, sizeof err), 0, "%s", err);
    memset(pp, 0, sizeof *pp);
    pp->p.instrs = pp->in;
    for (int r = 0; r < p; r++)
        for (int k = 0; k < s.ranks[r].n; k++) {
            const Piece *pc = &s.ranks[r].pieces[k];
            int fwd = pc->kind == PIECE_F, from = fwd ? r - 1 : r + 1, to = fwd ? r + 1 : r - 1;
            cr_assert_lt(pp->p.ninstrs + 3, MAXI);
            if (from >= 0 && from < p)
                p2p(pp, PC_RECV, r, from, 2 * (pc->mb * p + r) + !fwd);
            compute(pp, r);
            if (to >= 0 && to < p)
                p2p(pp, PC_SEND, r, to, 2 * (pc->mb * p + to) + !fwd);
        }
    arena_free(a);
}

static const int8_t PIPE_AXES[1] = {0};

/* Whether instruction i is the first not done of its stage's stream. */
static int at_head(const Plan *p, const int *stream, const int *done, int i)
{
    for (int j = 0; j < i; j++)
        if (!done[j] && p->instrs[j].stage == p->instrs[i].stage && stream[j] == stream[i])
            return 0;
    return 1;
}

/* Whether every instruction of the kinds in `which` (bit 0: kernels, bit 1:
 * sends and recvs) queued before i on its stage is done. */
static int after(const Plan *p, const int *done, int i, int which)
{
    for (int j = 0; j < i; j++)
        if (!done[j] && p->instrs[j].stage == p->instrs[i].stage &&
            (which >> (p->instrs[j].kind == PI_COLL) & 1))
            return 0;
    return 1;
}

/* Run the plan's device programs with rendezvous sends (an NCCL send completes
 * only together with its recv), each device's instructions queued in order on
 * streams: compute on one, a send or recv on the stream of its channel
 * (channels 1) or all of them on one communication stream (channels 0). A
 * send or recv starts after the compute queued before it (the before event),
 * a kernel after every send and recv queued before it: more waits than the
 * runtime's (only for those sharing a byte with the kernel), and a wait
 * removed never stops a run that finished, so a plan that runs here runs
 * there. Returns how many instructions never ran (0: no deadlock). */
static int simulate(const PipePlan *pp, const RtPair *pairs, int np, int channels)
{
    const Plan *p = &pp->p;
    int done[MAXI] = {0}, stream[MAXI], left = p->ninstrs, progress = 1;
    for (int i = 0; i < p->ninstrs; i++) {
        int ch = rt_p2p_channel(p, i, PIPE_AXES, 1, pairs, np);
        if (p->instrs[i].kind == PI_COLL)
            cr_assert_geq(ch, 0, "instrs[%d]: a send or recv without a channel", i);
        stream[i] = p->instrs[i].kind != PI_COLL ? 0 : channels ? 1 + ch : 1;
    }
    while (progress) {
        progress = 0;
        for (int i = 0; i < p->ninstrs; i++) {
            const PlanInstr *in = &p->instrs[i];
            if (done[i] || !at_head(p, stream, done, i))
                continue;
            if (in->kind != PI_COLL) {
                if (after(p, done, i, 2))
                    done[i] = 1, left--, progress = 1;
                continue;
            }
            if (in->coll.op != PC_SEND || !after(p, done, i, 1))
                continue;
            for (int j = 0; j < p->ninstrs; j++) { /* the recv of its tag, at its head, ready */
                const PlanInstr *r = &p->instrs[j];
                if (r->kind == PI_COLL && r->coll.op == PC_RECV && r->coll.tag == in->coll.tag &&
                    !done[j] && at_head(p, stream, done, j) && after(p, done, j, 1)) {
                    done[i] = done[j] = 1, left -= 2, progress = 1;
                    break;
                }
            }
        }
    }
    return left;
}

static int pair_is(RtPair x, int from, int to)
{
    return x.from == from && x.to == to;
}

/* Two and four stages under 1F1B and GPipe: the pairs come out once each, in
 * increasing (from, to) order, and the same when the plan lists its
 * instructions in reverse; sends and recvs over another group, other
 * collectives and kernels are not pipeline traffic. */
Test(cuda_map, pipeline_pairs_are_distinct_and_ordered)
{
    static PipePlan pp, rev;
    for (int p = 2; p <= 4; p += 2) {
        pipe_plan(&pp, SCHED_1F1B, p, 2 * p);
        RtPair pairs[MAXI], again[MAXI];
        int np = rt_p2p_pairs(&pp.p, PIPE_AXES, 1, pairs);
        cr_assert_eq(np, 2 * (p - 1), "p=%d: %d pairs", p, np);
        for (int k = 0; k < np; k++) /* (0,1) (1,0) (1,2) (2,1) ... */
            cr_assert(pair_is(pairs[k], k / 2 + k % 2, k / 2 + !(k % 2)), "p=%d pair %d: (%d,%d)",
                      p, k, pairs[k].from, pairs[k].to);
        rev = pp;
        rev.p.instrs = rev.in;
        for (int i = 0; i < pp.p.ninstrs; i++)
            rev.in[i] = pp.in[pp.p.ninstrs - 1 - i];
        cr_assert_eq(rt_p2p_pairs(&rev.p, PIPE_AXES, 1, again), np);
        for (int k = 0; k < np; k++)
            cr_assert(pair_is(again[k], pairs[k].from, pairs[k].to), "p=%d: order differs", p);
        /* a send over axes {1} (another group) and an all_reduce over {0} do not count */
        int8_t other[1] = {1};
        p2p(&pp, PC_SEND, 0, p - 1, 9999);
        pp.in[pp.p.ninstrs - 1].coll.axes[0] = 1;
        p2p(&pp, PC_ALL_REDUCE, 0, 0, 0);
        pp.in[pp.p.ninstrs - 1].coll.peer = 0;
        cr_assert_eq(rt_p2p_pairs(&pp.p, PIPE_AXES, 1, again), np);
        cr_assert_eq(rt_p2p_pairs(&pp.p, other, 1, again), 1);
        cr_assert(pair_is(again[0], 0, p - 1));
        cr_assert_eq(rt_p2p_channel(&pp.p, pp.p.ninstrs - 2, PIPE_AXES, 1, pairs, np), -1);
        cr_assert_eq(rt_p2p_channel(&pp.p, pp.p.ninstrs - 1, PIPE_AXES, 1, pairs, np), -1);
    }
    Plan none = {0};
    cr_assert_eq(rt_p2p_pairs(&none, PIPE_AXES, 1, NULL), 0, "no instructions, no pairs");
}

/* 1F1B on two stages: stage 0's forward sends and backward recvs use different
 * channels; each send and the recv of its tag use the same channel, whose pair
 * is (sender, receiver); on each channel the sender's tags and the receiver's
 * come in the same order (NCCL matches by order). */
Test(cuda_map, pipeline_channels_split_the_directions)
{
    static PipePlan pp;
    for (int p = 2; p <= 4; p += 2) {
        pipe_plan(&pp, SCHED_1F1B, p, 4);
        RtPair pairs[MAXI];
        int np = rt_p2p_pairs(&pp.p, PIPE_AXES, 1, pairs), fsend = -1, brecv = -1;
        for (int i = 0; i < pp.p.ninstrs; i++) {
            const PlanInstr *in = &pp.in[i];
            if (in->kind != PI_COLL)
                continue;
            int ch = rt_p2p_channel(&pp.p, i, PIPE_AXES, 1, pairs, np);
            cr_assert_geq(ch, 0);
            int from = in->coll.op == PC_SEND ? in->stage : in->coll.peer;
            int to = in->coll.op == PC_SEND ? in->coll.peer : in->stage;
            cr_assert(pair_is(pairs[ch], from, to), "instrs[%d] on (%d,%d)", i, pairs[ch].from,
                      pairs[ch].to);
            for (int j = 0; j < pp.p.ninstrs; j++)
                if (j != i && pp.in[j].kind == PI_COLL && pp.in[j].coll.tag == in->coll.tag)
                    cr_assert_eq(rt_p2p_channel(&pp.p, j, PIPE_AXES, 1, pairs, np), ch);
            if (in->stage == 0 && in->coll.op == PC_SEND)
                fsend = fsend < 0 || fsend == ch ? ch : -2;
            if (in->stage == 0 && in->coll.op == PC_RECV)
                brecv = brecv < 0 || brecv == ch ? ch : -2;
        }
        cr_assert(fsend >= 0 && brecv >= 0 && fsend != brecv,
                  "p=%d: stage 0's sends on %d, recvs on %d", p, fsend, brecv);
        for (int ch = 0; ch < np; ch++) {
            int sent[MAXI], got[MAXI], ns = 0, ng = 0;
            for (int i = 0; i < pp.p.ninstrs; i++)
                if (pp.in[i].kind == PI_COLL &&
                    rt_p2p_channel(&pp.p, i, PIPE_AXES, 1, pairs, np) == ch) {
                    if (pp.in[i].coll.op == PC_SEND)
                        sent[ns++] = pp.in[i].coll.tag;
                    else
                        got[ng++] = pp.in[i].coll.tag;
                }
            cr_assert_eq(ns, ng);
            cr_assert_eq(memcmp(sent, got, (size_t)ns * sizeof *sent), 0,
                         "p=%d channel %d: out of order", p, ch);
        }
    }
}

/* The point of the channels: with rendezvous sends, 1F1B on one communication
 * stream per device deadlocks (stage 0 sends F(1) while stage 1 sends the
 * gradient of 0), and on a stream per channel it runs to the end; GPipe runs
 * both ways. */
Test(cuda_map, pipeline_channels_do_not_deadlock_under_1f1b)
{
    static PipePlan pp;
    for (int p = 2; p <= 4; p += 2) {
        RtPair pairs[MAXI];
        pipe_plan(&pp, SCHED_1F1B, p, 2 * p);
        int np = rt_p2p_pairs(&pp.p, PIPE_AXES, 1, pairs);
        cr_assert_gt(simulate(&pp, pairs, np, 0), 0, "p=%d: one stream should deadlock", p);
        cr_assert_eq(simulate(&pp, pairs, np, 1), 0, "p=%d: channels deadlock", p);
        pipe_plan(&pp, SCHED_GPIPE, p, 2 * p);
        np = rt_p2p_pairs(&pp.p, PIPE_AXES, 1, pairs);
        cr_assert_eq(simulate(&pp, pairs, np, 0), 0, "p=%d: GPipe on one stream", p);
        cr_assert_eq(simulate(&pp, pairs, np, 1), 0, "p=%d: GPipe on channels", p);
    }
}
