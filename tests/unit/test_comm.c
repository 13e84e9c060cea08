/* test_comm.c: the collectives of runtime/comm/comm.h on the threads backend, with
 * 1 to 4 ranks (one thread and one RtWorld each) and the groups of 2x2 and 2x3
 * meshes; the mpi backend's refusal outside mpirun (tests/lit/comm runs it under
 * mpirun).
 * Inputs are fresh random numbers (the seed is in every failure message), or
 * codes that name the rank and index an element came from, so that a misplaced
 * element fails. Checks run in each rank's thread and are gathered after the
 * join; results are compared across ranks through a pthread barrier, not
 * through the comm under test.
 * Bounds: an f32 sum of n members is within n * 2^-24 * sum|x| of the float64
 * sum (n - 1 roundings, each under 2^-24 of a partial sum no larger than
 * sum|x|), f64 within n * 2^-53 * sum|x|; i32 sums and every max are exact. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/comm/comm.h"
#include "runtime/runtime.h"
#include "tests/support/comm_values.h"

#define MAX_RANKS 6

typedef struct Run {
    pthread_barrier_t bar;
    const void *ptr[MAX_RANKS]; /* check_same's view of every rank's result */
    int rows, cols;             /* the mesh of the split tests */
} Run;

typedef struct Ctx {
    Run *run;
    RtThreadsHub *hub;
    int rank, nranks;
    void (*body)(struct Ctx *);
    RtWorld *w;
    char fail[512]; /* the first failed check; "" when all passed */
} Ctx;

static uint64_t seed;

/* Record the first failed check and go on: every rank must make the same calls. */
#define CHECK(c, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond) && !(c)->fail[0])                                                              \
            snprintf((c)->fail, sizeof(c)->fail, __VA_ARGS__);                                     \
    } while (0)

static void *rank_main(void *p)
{
    Ctx *c = p;
    c->w = rt_world_threads(c->hub, c->rank);
    CHECK(c, c->w, "rt_world_threads failed");
    if (!c->w)
        return NULL;
    CHECK(c, rt_world_rank(c->w) == c->rank && rt_world_size(c->w) == c->nranks,
          "world rank %d size %d", rt_world_rank(c->w), rt_world_size(c->w));
    CHECK(c, !strcmp(rt_world_backend(c->w), "threads"), "backend %s", rt_world_backend(c->w));
    c->body(c);
    rt_world_close(c->w);
    return NULL;
}

/* body on nranks threads, each with its own world of one hub. */
static void run_ranks_mesh(int nranks, int rows, int cols, void (*body)(Ctx *))
{
    Run run = {.rows = rows, .cols = cols};
    Ctx ctx[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    cr_assert(nranks <= MAX_RANKS);
    cr_assert_eq(pthread_barrier_init(&run.bar, NULL, (unsigned)nranks), 0);
    RtThreadsHub *hub = rt_threads_hub_new(nranks);
    cr_assert_not_null(hub);
    for (int r = 0; r < nranks; r++) {
        ctx[r] = (Ctx){&run, hub, r, nranks, body, NULL, ""};
        cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &ctx[r]), 0);
    }
    for (int r = 0; r < nranks; r++)
        pthread_join(th[r], NULL);
    rt_threads_hub_free(hub);
    pthread_barrier_destroy(&run.bar);
    for (int r = 0; r < nranks; r++)
        cr_expect(!ctx[r].fail[0], "%d ranks, rank %d (seed %llu): %s", nranks, r,
                  (unsigned long long)seed, ctx[r].fail);
}

static void run_ranks(int nranks, void (*body)(Ctx *))
{
    run_ranks_mesh(nranks, 1, nranks, body);
}

/* Every rank's bytes at p are bitwise rank 0's. */
static void check_same(Ctx *c, const void *p, size_t bytes, const char *what)
{
    c->run->ptr[c->rank] = p;
    pthread_barrier_wait(&c->run->bar);
    CHECK(c, !bytes || !memcmp(p, c->run->ptr[0], bytes), "%s: not bitwise rank 0's result", what);
    pthread_barrier_wait(&c->run->bar);
}

static RtComm *world_comm(Ctx *c)
{
    char err[256] = "";
    RtComm *comm = rt_comm_split(c->w, 0, c->rank, err, sizeof err);
    CHECK(c, comm, "split: %s", err);
    if (comm)
        CHECK(c, rt_comm_rank(comm) == c->rank && rt_comm_size(comm) == c->nranks,
              "world comm: rank %d size %d", rt_comm_rank(comm), rt_comm_size(comm));
    return comm;
}

/* ---- values ---- */

/* Element values and codes: tests/support/comm_values.h. */
static double value(PlanDType dt, int rank, size_t i, int salt)
{
    return cv_value(seed, dt, rank, i, salt);
}

/* ---- all_reduce ---- */

/* buf against the float64 sum (or max) of every rank's value; the first bad index. */
static void check_reduced(Ctx *c, PlanDType dt, int max, const void *buf, size_t count, int salt)
{
    double eps = dt == PD_F32 ? ldexp(1, -24) : dt == PD_F64 ? ldexp(1, -53) : 0;
    for (size_t i = 0; i < count; i++) {
        double ref = value(dt, 0, i, salt), mag = fabs(ref);
        for (int r = 1; r < c->nranks; r++) {
            double v = value(dt, r, i, salt);
            ref = max ? fmax(ref, v) : ref + v;
            mag += fabs(v);
        }
        double got = cv_get(dt, buf, i), tol = max ? 0 : c->nranks * eps * mag;
        if (!(fabs(got - ref) <= tol)) {
            CHECK(c, 0, "all_reduce%s %s count %zu: element %zu is %.17g, want %.17g",
                  max ? "_max" : "", plan_dtype_name(dt), count, i, got, ref);
            return;
        }
    }
}

static int reduce_once(Ctx *c, RtComm *comm, PlanDType dt, int max, void *buf, size_t count,
                       int salt)
{
    char err[256] = "";
    for (size_t i = 0; i < count; i++)
        cv_put(dt, buf, i, value(dt, c->rank, i, salt));
    int rc = max ? rt_comm_all_reduce_max(comm, buf, count, dt, err, sizeof err)
                 : rt_comm_all_reduce(comm, buf, count, dt, err, sizeof err);
    CHECK(c, rc == 0, "all_reduce: %s", err);
    return rc;
}

static void all_reduce_case(Ctx *c, RtComm *comm, PlanDType dt, int max, size_t count)
{
    size_t bytes = count * plan_dtype_size(dt);
    char *buf = malloc(bytes + 1), *again = malloc(bytes + 1);
    int salt = (int)count + 16 * dt + 4 * max;
    reduce_once(c, comm, dt, max, buf, count, salt);
    check_reduced(c, dt, max, buf, count, salt);
    check_same(c, buf, bytes, "all_reduce");
    reduce_once(c, comm, dt, max, again, count, salt);
    CHECK(c, !count || !memcmp(buf, again, bytes),
          "all_reduce %s count %zu: another result "
          "from the same inputs",
          plan_dtype_name(dt), count);
    free(buf);
    free(again);
}

static void body_all_reduce(Ctx *c)
{
    static const size_t counts[] = {0, 1, 3, 1031};
    static const PlanDType dts[] = {PD_F32, PD_F64, PD_I32};
    RtComm *comm = world_comm(c);
    for (size_t k = 0; comm && k < sizeof counts / sizeof counts[0]; k++)
        for (size_t d = 0; d < 3; d++)
            for (int max = 0; max < 2; max++)
                all_reduce_case(c, comm, dts[d], max, counts[k]);
    rt_comm_free(comm);
}

Test(comm_threads, all_reduce_1_rank)
{
    run_ranks(1, body_all_reduce);
}

Test(comm_threads, all_reduce_2_ranks)
{
    run_ranks(2, body_all_reduce);
}

Test(comm_threads, all_reduce_3_ranks)
{
    run_ranks(3, body_all_reduce);
}

Test(comm_threads, all_reduce_4_ranks)
{
    run_ranks(4, body_all_reduce);
}

/* ---- bf16: summed in f32, rounded once ---- */

static uint16_t to_bf16(double x)
{
    return rt_f32_to_bf16((float)x);
}

/* Element 0: rank 0 holds 1, the others 2^-8 each. Summed in f32 and rounded
 * once, n ranks give bf16(1 + (n-1) 2^-8) (3 ranks: 1 + 2^-7; 4: a tie, to
 * even, 1 + 2^-6); adding in bf16 one rank at a time would round every
 * partial sum 1 + 2^-8 (a tie) back to 1. The other elements: random bf16
 * values, against the float64 sum within one bf16 rounding (bf16 keeps 8
 * significant bits: half an ulp is at most 2^-8 of the value) plus the f32
 * additions (n 2^-24 of the magnitudes). */
static void bf16_all_reduce_case(Ctx *c, RtComm *comm, size_t count)
{
    uint16_t *buf = malloc(sizeof(uint16_t) * count);
    char err[256] = "";
    for (size_t i = 0; i < count; i++)
        buf[i] = to_bf16(i ? value(PD_F32, c->rank, i, 99) : c->rank ? ldexp(1, -8) : 1.0);
    CHECK(c, rt_comm_all_reduce(comm, buf, count, PD_BF16, err, sizeof err) == 0,
          "bf16 all_reduce: %s", err);
    uint16_t want0 = rt_f32_to_bf16((float)(1 + (c->nranks - 1) * ldexp(1, -8)));
    CHECK(c, buf[0] == want0, "bf16 all_reduce element 0: 0x%04x, want 0x%04x", buf[0], want0);
    for (size_t i = 1; i < count; i++) {
        double ref = 0, mag = 0;
        for (int r = 0; r < c->nranks; r++) {
            double v = rt_bf16_to_f32(to_bf16(value(PD_F32, r, i, 99)));
            ref += v;
            mag += fabs(v);
        }
        double got = rt_bf16_to_f32(buf[i]);
        if (!(fabs(got - ref) <= ldexp(fabs(ref), -8) + 2 * c->nranks * ldexp(mag, -24))) {
            CHECK(c, 0, "bf16 all_reduce element %zu is %.9g, want %.9g", i, got, ref);
            break;
        }
    }
    check_same(c, buf, sizeof(uint16_t) * count, "bf16 all_reduce");
    free(buf);
}

/* in: [size * 3] of rank j holds k / 4 + j, exact in bf16, and so are the sums. */
static void bf16_reduce_scatter_case(Ctx *c, RtComm *comm)
{
    size_t size = (size_t)rt_comm_size(comm), chunk = 3;
    uint16_t in[MAX_RANKS * 3], out[3];
    char err[256] = "";
    for (size_t k = 0; k < size * chunk; k++)
        in[k] = to_bf16((double)k / 4 + c->rank);
    CHECK(c, rt_comm_reduce_scatter(comm, in, out, 1, chunk, 1, PD_BF16, err, sizeof err) == 0,
          "bf16 reduce_scatter: %s", err);
    for (size_t k = 0; k < chunk; k++) {
        double want =
            (double)size * (double)(c->rank * chunk + k) / 4 + (double)(size * (size - 1) / 2);
        CHECK(c, rt_bf16_to_f32(out[k]) == want, "bf16 reduce_scatter element %zu: %g, want %g", k,
              (double)rt_bf16_to_f32(out[k]), want);
    }
}

static void body_bf16(Ctx *c)
{
    RtComm *comm = world_comm(c);
    if (comm) {
        bf16_all_reduce_case(c, comm, 1031);
        bf16_reduce_scatter_case(c, comm);
    }
    rt_comm_free(comm);
}

Test(comm_threads, bf16_sums_in_f32_rounded_once_3_ranks)
{
    run_ranks(3, body_bf16);
}

Test(comm_threads, bf16_sums_in_f32_rounded_once_4_ranks)
{
    run_ranks(4, body_bf16);
}

/* ---- all_gather, reduce_scatter, all_to_all, broadcast ---- */

/* in: [pre][chunk][post] codes of this rank; out: [pre][size*chunk][post]. */
static void gather_case(Ctx *c, RtComm *comm, size_t pre, size_t chunk, size_t post, size_t elem)
{
    size_t size = (size_t)rt_comm_size(comm), nin = pre * chunk * post, bad = (size_t)-1;
    int me = rt_comm_rank(comm);
    char *in = malloc(nin * elem + 1), *out = malloc(size * nin * elem + 1), err[256] = "";
    for (size_t p = 0, i = 0; p < pre; p++)
        for (size_t k = 0; k < chunk; k++)
            for (size_t q = 0; q < post; q++)
                cv_put_code(in, i++, elem, cv_code(me, p, k, q));
    int rc = rt_comm_all_gather(comm, in, out, pre, chunk, post, elem, err, sizeof err);
    CHECK(c, rc == 0, "all_gather: %s", err);
    for (size_t p = 0, i = 0; p < pre; p++)
        for (size_t k = 0; k < size * chunk; k++)
            for (size_t q = 0; q < post; q++, i++)
                if (bad == (size_t)-1 &&
                    cv_get_code(out, i, elem) != cv_code((int)(k / chunk), p, k % chunk, q))
                    bad = i;
    CHECK(c, bad == (size_t)-1, "all_gather [%zu][%zu][%zu] x %zu bytes: element %zu is %llu", pre,
          chunk, post, elem, bad, (unsigned long long)cv_get_code(out, bad, elem));
    free(in);
    free(out);
}

/* in: [pre][size*chunk][post] of rank j holds cv_code(0, p, k, q) + 1000 j. */
static void scatter_case(Ctx *c, RtComm *comm, PlanDType dt, size_t pre, size_t chunk, size_t post)
{
    size_t size = (size_t)rt_comm_size(comm), es = plan_dtype_size(dt), bad = (size_t)-1;
    int me = rt_comm_rank(comm);
    char *in = malloc(pre * size * chunk * post * es + 1), *out = malloc(pre * chunk * post * es);
    char err[256] = "";
    double ranks = (double)(size * (size - 1) / 2);
    for (size_t p = 0, i = 0; p < pre; p++)
        for (size_t k = 0; k < size * chunk; k++)
            for (size_t q = 0; q < post; q++)
                cv_put(dt, in, i++, (double)cv_code(0, p, k, q) + 1000.0 * me);
    int rc = rt_comm_reduce_scatter(comm, in, out, pre, chunk, post, dt, err, sizeof err);
    CHECK(c, rc == 0, "reduce_scatter: %s", err);
    for (size_t p = 0, i = 0; p < pre; p++)
        for (size_t k = 0; k < chunk; k++)
            for (size_t q = 0; q < post; q++, i++) {
                double want = (double)size * cv_code(0, p, me * chunk + k, q) + 1000.0 * ranks;
                if (bad == (size_t)-1 && cv_get(dt, out, i) != want)
                    bad = i;
            }
    CHECK(c, bad == (size_t)-1, "reduce_scatter %s [%zu][%zu][%zu]: element %zu is %g",
          plan_dtype_name(dt), pre, chunk, post, bad, cv_get(dt, out, bad));
    free(in);
    free(out);
}

/* Block j of in on member i: 3 codes of (i, j); out block j on i: member j's block i. */
static void all_to_all_case(Ctx *c, RtComm *comm)
{
    size_t size = (size_t)rt_comm_size(comm), bb = 3 * sizeof(uint32_t);
    int me = rt_comm_rank(comm), ok = 1;
    uint32_t *in = malloc(size * bb), *out = malloc(size * bb);
    char err[256] = "";
    for (size_t j = 0; j < size; j++)
        for (size_t b = 0; b < 3; b++)
            in[j * 3 + b] = (uint32_t)cv_code(me, j, b, 0);
    int rc = rt_comm_all_to_all(comm, in, out, bb, err, sizeof err);
    CHECK(c, rc == 0, "all_to_all: %s", err);
    for (size_t j = 0; j < size; j++)
        for (size_t b = 0; b < 3; b++)
            ok &= out[j * 3 + b] == (uint32_t)cv_code((int)j, (size_t)me, b, 0);
    CHECK(c, ok, "all_to_all: a block is not the one its member sent");
    free(in);
    free(out);
}

static void broadcast_case(Ctx *c, RtComm *comm, int root)
{
    uint64_t buf[5];
    int me = rt_comm_rank(comm), ok = 1;
    char err[256] = "";
    for (size_t b = 0; b < 5; b++)
        buf[b] = cv_code(me, 0, b, 1);
    int rc = rt_comm_broadcast(comm, buf, sizeof buf, root, err, sizeof err);
    CHECK(c, rc == 0, "broadcast: %s", err);
    for (size_t b = 0; b < 5; b++)
        ok &= buf[b] == cv_code(root, 0, b, 1);
    CHECK(c, ok, "broadcast from %d: not the root's bytes", root);
}

static void body_collectives(Ctx *c)
{
    RtComm *comm = world_comm(c);
    if (!comm)
        return;
    gather_case(c, comm, 3, 2, 5, 4);
    gather_case(c, comm, 1, 3, 2, 8);
    gather_case(c, comm, 2, 1, 1, 2);
    for (PlanDType dt = PD_F32; dt <= PD_I32; dt += dt == PD_F64 ? 3 : 1) {
        scatter_case(c, comm, dt, 3, 2, 5);
        scatter_case(c, comm, dt, 1, 3, 2);
    }
    all_to_all_case(c, comm);
    broadcast_case(c, comm, 0);
    broadcast_case(c, comm, rt_comm_size(comm) - 1);
    char err[256] = "";
    CHECK(c, rt_comm_barrier(comm, err, sizeof err) == 0, "barrier: %s", err);
    rt_comm_free(comm);
}

Test(comm_threads, collectives_1_rank)
{
    run_ranks(1, body_collectives);
}

Test(comm_threads, collectives_2_ranks)
{
    run_ranks(2, body_collectives);
}

Test(comm_threads, collectives_3_ranks)
{
    run_ranks(3, body_collectives);
}

Test(comm_threads, collectives_4_ranks)
{
    run_ranks(4, body_collectives);
}

/* ---- send / recv ---- */

/* Each member sends tags 1 then 2 to the next and receives tags 2 then 1 from the
 * previous: sends are buffered, so this neither deadlocks nor mixes the tags. */
static void ring_case(Ctx *c, RtComm *comm)
{
    int n = rt_comm_size(comm), me = rt_comm_rank(comm), next = (me + 1) % n;
    int prev = (me + n - 1) % n;
    uint64_t msg[2][4], got[4];
    char err[256] = "";
    for (int t = 0; t < 2; t++) {
        for (size_t b = 0; b < 4; b++)
            msg[t][b] = cv_code(me, (size_t)t, b, 2);
        CHECK(c, !rt_comm_send(comm, msg[t], sizeof msg[t], next, t + 1, err, sizeof err),
              "send: %s", err);
    }
    memset(msg, 0, sizeof msg); /* the sends are done with it */
    for (int t = 1; t >= 0; t--) {
        memset(got, 0, sizeof got);
        CHECK(c, !rt_comm_recv(comm, got, sizeof got, prev, t + 1, err, sizeof err), "recv: %s",
              err);
        for (size_t b = 0; b < 4; b++)
            CHECK(c, got[b] == cv_code(prev, (size_t)t, b, 2), "recv tag %d: word %zu is %llu", t + 1,
                  b, (unsigned long long)got[b]);
    }
}

static void body_ring(Ctx *c)
{
    RtComm *comm = world_comm(c);
    if (comm)
        ring_case(c, comm);
    rt_comm_free(comm);
}

Test(comm_threads, send_recv_ring_2_ranks)
{
    run_ranks(2, body_ring);
}

Test(comm_threads, send_recv_ring_4_ranks)
{
    run_ranks(4, body_ring);
}

/* ---- comm_split: the rows and columns of a mesh ---- */

static void check_split(Ctx *c, RtComm *comm, int rank, int size, const char *what)
{
    CHECK(c, comm, "%s: split failed", what);
    if (comm)
        CHECK(c, rt_comm_rank(comm) == rank && rt_comm_size(comm) == size,
              "%s: rank %d of %d, want %d of %d", what, rt_comm_rank(comm), rt_comm_size(comm),
              rank, size);
}

/* Row r of the mesh sums x = 100 r + y + i over its columns y. */
static void row_sum(Ctx *c, RtComm *row, int x)
{
    int32_t buf[3];
    char err[256] = "";
    int cols = c->run->cols;
    for (int i = 0; i < 3; i++)
        buf[i] = 100 * x + rt_comm_rank(row) + i;
    CHECK(c, !rt_comm_all_reduce(row, buf, 3, PD_I32, err, sizeof err), "row: %s", err);
    for (int i = 0; i < 3; i++)
        CHECK(c, buf[i] == cols * (100 * x + i) + cols * (cols - 1) / 2, "row %d sum[%d] = %d", x,
              i, buf[i]);
}

/* World rank = x * cols + y. Rows: color x, key y. Columns: color y, key -x (so a
 * column's ranks run against x). Both then run collectives, rows and columns in turn. */
static void body_mesh(Ctx *c)
{
    int cols = c->run->cols, rows = c->run->rows, x = c->rank / cols, y = c->rank % cols;
    char err[256] = "";
    RtComm *row = rt_comm_split(c->w, x, y, err, sizeof err);
    RtComm *col = rt_comm_split(c->w, y, -x, err, sizeof err);
    RtComm *all = rt_comm_split(c->w, 7, 0, err, sizeof err); /* ties: by world rank */
    check_split(c, row, y, cols, "row");
    check_split(c, col, rows - 1 - x, rows, "column");
    check_split(c, all, c->rank, c->nranks, "all");
    if (row && col && all) {
        row_sum(c, row, x);
        gather_case(c, col, 2, 2, 3, 4);
        scatter_case(c, row, PD_F32, 2, 1, 3);
        all_to_all_case(c, col);
        broadcast_case(c, row, cols - 1);
        ring_case(c, col);
        all_reduce_case(c, all, PD_F64, 0, 17);
    }
    rt_comm_free(row);
    rt_comm_free(col);
    rt_comm_free(all);
}

Test(comm_threads, split_mesh_2x2)
{
    run_ranks_mesh(4, 2, 2, body_mesh);
}

Test(comm_threads, split_mesh_2x3)
{
    run_ranks_mesh(6, 2, 3, body_mesh);
}

/* ---- errors: refused arguments, members that disagree ---- */

/* Refusals before any communication: every member refuses alike. */
static void body_refusals(Ctx *c)
{
    RtComm *comm = world_comm(c);
    char err[256] = "";
    float f[4] = {0};
    if (!comm)
        return;
    CHECK(c,
          rt_comm_all_reduce(comm, f, 2, PD_F16, err, sizeof err) == -1 &&
              strstr(err, "dtype f16 does not reduce"),
          "f16 all_reduce: %s", err);
    CHECK(c,
          rt_comm_broadcast(comm, f, 4, 2, err, sizeof err) == -1 &&
              strstr(err, "root 2 is not a member"),
          "broadcast root 2: %s", err);
    CHECK(c,
          rt_comm_send(comm, f, 4, c->rank, 0, err, sizeof err) == -1 &&
              strstr(err, "this member itself"),
          "send to itself: %s", err);
    CHECK(c,
          rt_comm_send(comm, f, 4, 1 - c->rank, 1 << 20, err, sizeof err) == -1 &&
              strstr(err, "tag 1048576"),
          "tag: %s", err);
    CHECK(c, !rt_comm_split(c->w, -1, 0, err, sizeof err) && strstr(err, "color -1 is negative"),
          "negative color: %s", err);
    rt_comm_free(comm);
}

Test(comm_threads, refuses_bad_arguments)
{
    run_ranks(2, body_refusals);
}

/* Member 0 sums 4 elements, member 1 5; then one barriers while the other broadcasts.
 * Both calls fail on both members, and the comm still works afterwards. */
static void body_disagree(Ctx *c)
{
    RtComm *comm = world_comm(c);
    char err[256] = "";
    float f[5] = {0};
    if (!comm)
        return;
    int rc = rt_comm_all_reduce(comm, f, 4 + (size_t)c->rank, PD_F32, err, sizeof err);
    CHECK(c, rc == -1 && strstr(err, "the members disagree"), "count mismatch: %d %s", rc, err);
    rc = c->rank ? rt_comm_broadcast(comm, f, 4, 0, err, sizeof err)
                 : rt_comm_barrier(comm, err, sizeof err);
    CHECK(c, rc == -1 && strstr(err, "calls broadcast"), "op mismatch: %d %s", rc, err);
    f[0] = 1.5f;
    rc = rt_comm_all_reduce(comm, f, 1, PD_F32, err, sizeof err);
    CHECK(c, rc == 0 && f[0] == 3.0f, "all_reduce after the failures: %d %g %s", rc, f[0], err);
    rt_comm_free(comm);
}

Test(comm_threads, members_disagree)
{
    run_ranks(2, body_disagree);
}

/* A recv of 4 bytes matched by a send of 8 fails on the receiver; sends to a member
 * that never receives are freed with the comm. */
static void body_recv_size(Ctx *c)
{
    RtComm *comm = world_comm(c);
    char err[256] = "";
    double d = 2.5;
    if (!comm)
        return;
    if (c->rank == 0) {
        CHECK(c, !rt_comm_send(comm, &d, 8, 1, 3, err, sizeof err), "send: %s", err);
        CHECK(c, !rt_comm_send(comm, &d, 8, 1, 4, err, sizeof err), "send: %s", err);
    } else {
        float f;
        int rc = rt_comm_recv(comm, &f, 4, 0, 3, err, sizeof err);
        CHECK(c, rc == -1 && strstr(err, "member 0 sent 8 bytes with tag 3, not 4"), "recv: %s",
              err);
    }
    rt_comm_free(comm);
}

Test(comm_threads, recv_of_another_size)
{
    run_ranks(2, body_recv_size);
}

Test(comm_threads, world_rank_taken_or_out_of_range)
{
    RtThreadsHub *hub = rt_threads_hub_new(2);
    cr_assert_not_null(hub);
    RtWorld *w = rt_world_threads(hub, 1);
    cr_assert_not_null(w);
    cr_expect_null(rt_world_threads(hub, 1));
    cr_expect_null(rt_world_threads(hub, 2));
    cr_expect_null(rt_world_threads(hub, -1));
    cr_expect_null(rt_threads_hub_new(0));
    rt_threads_hub_free(hub); /* before the world closes: the world keeps it alive */
    rt_world_close(w);
    rt_world_close(NULL);
    rt_comm_free(NULL);
}

/* Outside mpirun the mpi backend refuses, rather than start MPI as a singleton. */
Test(comm_mpi, refuses_outside_mpirun)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    char err[256] = "";
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    cr_expect_eq(rt_mpi_launched(), 0);
    cr_expect_null(rt_world_mpi(err, sizeof err));
    cr_expect(strstr(err, "mpi: not started by mpirun"), "%s", err);
    setenv("PMI_RANK", "0", 1);
    cr_expect_eq(rt_mpi_launched(), 1);
    unsetenv("PMI_RANK");
}

static void set_seed(void)
{
    seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
}

TestSuite(comm_threads, .init = set_seed);

/* ---- no hangs: a failed rank stops the others; the watchdog ---- */

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Rank 2 fails before its first collective; the others all-reduce (and would
 * wait for it forever) or recv from it. */
static int fail_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    (void)arg;
    int me = rt_world_rank(w), rc;
    float x[16] = {0};
    RtComm *c = rt_comm_split(w, 0, me, err, n);
    if (!c)
        return -1;
    if (me == 2)
        rc = plan_errorf(err, n, "rank 2: instrs[7] (kernel k3_gelu): a planted failure");
    else if (me == 3)
        rc = rt_comm_recv(c, x, sizeof x, 2, 5, err, n);
    else
        rc = rt_comm_all_reduce(c, x, 16, PD_F32, err, n);
    rt_comm_free(c);
    return rc;
}

Test(comm_threads, a_failed_rank_stops_the_others, .timeout = 30)
{
    char err[512] = "";
    double t0 = wall_s();
    int rc = rt_run_threads(4, fail_rank, NULL, err, sizeof err);
    double took = wall_s() - t0;
    cr_assert_neq(rc, 0);
    /* the failed rank's own message, not one of those it stopped */
    cr_assert(strstr(err, "rank 2: instrs[7] (kernel k3_gelu): a planted failure"), "%s", err);
    cr_assert_lt(took, 5.0, "the others took %.1f s to stop", took);
}

/* Rank 1 never comes to the all-reduce over the group named "dp" (it returns
 * at once, as a rank whose program lacks the collective would): the watchdog
 * names it, and the group; the world is broken. */
static int absent_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    char *seen = arg;
    float x[4] = {0};
    RtComm *c = rt_comm_split(w, 0, rt_world_rank(w), err, n);
    if (!c)
        return -1;
    rt_comm_name(c, "dp");
    int rc = rt_world_rank(w) == 1 ? 0 : rt_comm_all_reduce(c, x, 4, PD_F32, err, n);
    if (rc && rt_world_rank(w) == 0)
        snprintf(seen, 512, "%s; broken %d", err, rt_world_broken(w));
    rt_comm_free(c);
    return rc;
}

Test(comm_threads, the_watchdog_names_the_absent_member, .timeout = 30)
{
    char err[512] = "", seen[512] = "";
    setenv("TCC_COMM_TIMEOUT", "1", 1);
    double t0 = wall_s();
    int rc = rt_run_threads(3, absent_rank, seen, err, sizeof err);
    double took = wall_s() - t0;
    unsetenv("TCC_COMM_TIMEOUT");
    cr_assert_neq(rc, 0);
    cr_assert(strstr(err, ": all_reduce in group dp (ranks 0 1 2): waited 1 s (the watchdog, "
                          "TCC_COMM_TIMEOUT or --timeout): not arrived: rank 1"),
              "%s", err);
    cr_assert(strstr(seen, "not arrived: rank 1; broken 1") || strstr(seen, "stopped, rank"), "%s",
              seen);
    cr_assert_lt(took, 5.0, "took %.1f s", took);
}

/* Ranks 7 and 9 of 10 never come (the group has no name; its members are in
 * reverse order): the message lists the first 8 members, then "...". Rank 3
 * waits for a message that rank 4 never sends. */
static int absent_of_ten(RtWorld *w, void *arg, char *err, size_t n)
{
    int me = rt_world_rank(w), rc = 0;
    float x[4] = {0};
    RtComm *c = rt_comm_split(w, 0, -me, err, n);
    if (!c)
        return -1;
    if (arg && me == 3)
        rc = rt_comm_recv(c, x, sizeof x, rt_comm_size(c) - 1 - 4, 5, err, n);
    else if (!arg && me != 7 && me != 9)
        rc = rt_comm_all_reduce(c, x, 4, PD_F32, err, n);
    rt_comm_free(c);
    return rc;
}

Test(comm_threads, the_watchdog_names_members_by_world_rank, .timeout = 30)
{
    char err[512] = "";
    setenv("TCC_COMM_TIMEOUT", "0.5", 1);
    int rc = rt_run_threads(10, absent_of_ten, NULL, err, sizeof err);
    cr_assert_neq(rc, 0);
    cr_assert(strstr(err, ": all_reduce in a group of 10 (ranks 9 8 7 6 5 4 3 2 ...): waited 0.5 s "
                          "(the watchdog, TCC_COMM_TIMEOUT or --timeout): not arrived: rank 9, "
                          "rank 7"),
              "%s", err);
    rc = rt_run_threads(10, absent_of_ten, err, err, sizeof err);
    unsetenv("TCC_COMM_TIMEOUT");
    cr_assert_neq(rc, 0);
    cr_assert(strstr(err, "rank 3: recv in a group of 10 (ranks 9 8 7 6 5 4 3 2 ...): waited 0.5 s "
                          "(the watchdog, TCC_COMM_TIMEOUT or --timeout): no message from rank 4 "
                          "with tag 5"),
              "%s", err);
}

Test(comm_threads, a_bad_timeout_is_refused)
{
    char err[512] = "";
    setenv("TCC_COMM_TIMEOUT", "soon", 1);
    int rc = rt_run_threads(2, absent_rank, err, err, sizeof err);
    unsetenv("TCC_COMM_TIMEOUT");
    cr_assert_neq(rc, 0);
    cr_assert(strstr(err, "TCC_COMM_TIMEOUT=soon: expected a number of seconds > 0"), "%s", err);
}

/* The commands' --timeout S sets TCC_COMM_TIMEOUT, which both backends read:
 * a number of seconds > 0, else refused; unset, 300. */
Test(comm_threads, the_timeout_setting)
{
    static const char *const bad[] = {"0", "-1", "soon", "", "2s", "nan", "inf", "1e10"};
    char err[512] = "";
    double s = 0;
    unsetenv("TCC_COMM_TIMEOUT");
    cr_assert_eq(rt_comm_timeout(&s, err, sizeof err), 0, "%s", err);
    cr_assert_eq(s, 300);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(rt_comm_set_timeout(bad[i]), -1, "'%s' was taken", bad[i]);
    cr_assert_null(getenv("TCC_COMM_TIMEOUT"));
    cr_assert_eq(rt_comm_set_timeout("2.5"), 0);
    cr_assert_eq(rt_comm_timeout(&s, err, sizeof err), 0, "%s", err);
    cr_assert_eq(s, 2.5);
    unsetenv("TCC_COMM_TIMEOUT");
}
