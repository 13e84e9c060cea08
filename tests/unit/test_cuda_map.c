/* test_cuda_map.c: the pure arithmetic of the cuda device (runtime/gpu/gpumap.h),
 * checked on the CPU: a row-major PlanGemm mapped to cuBLASLt's column-major
 * problem and then computed with cuBLASLt's semantics by a naive loop must give
 * the row-major product; the 2D copies around NCCL's contiguous chunks must
 * give the layouts of all_gather, reduce_scatter and all_to_all that comm.h
 * defines, along every dim; compute must wait for a collective exactly where
 * the two share a byte of the slab (a GEMM's operands and bias included).
 * Data: fresh random numbers (seed in the failure message). Bounds: the GEMM
 * runs in float64 in both orders, each result a sum of k products, so it is
 * within k * 2^-52 * sum|a b| of the reference; copies move bits and are exact. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
