/* mpi_check.c: the mpi backend of runtime/comm/comm.h, run under mpirun with 4
 * ranks (tests/lit/comm/mpi.test): the collectives of tests/unit/test_comm.c on
 * the world and on the rows and columns of a 2x2 mesh, buffered sends in a ring,
 * and the refusals.
 * Reads: nothing. Writes: on rank 0, one line per check, "<check>: ok" or
 * "<check>: FAILED" (the failing ranks say why on stderr), then a summary;
 * exits 1 when any check failed on any rank.
 * Key idea: the verdicts, the seed and the cross-rank comparisons go through
 * plain MPI on MPI_COMM_WORLD, never through the comm under test. Inputs are
 * fresh random numbers (seed from rank 0's clock, shown on failure) or codes
 * that name the rank and index an element came from. Leaks are looked for
 * before the world closes: after MPI_Finalize, OpenMPI's unloaded components
 * leave leaks that no suppression can name, so lit.local.cfg turns off the
 * check at exit (leak_check_at_exit=0).
 * Bounds as in test_comm.c: an f32 sum of n members within n * 2^-24 * sum|x| of
 * the float64 sum, f64 within n * 2^-53 * sum|x|; i32 sums and maxima exact. */
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/comm/comm.h"
#include "runtime/runtime.h"
#include "tests/support/comm_values.h"

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_LSAN 1
#endif
#endif
#ifdef HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

typedef struct Ctx {
    RtWorld *w;
    int rank, size; /* in the world */
    uint64_t seed;
    int checks, failed;
    char why[512]; /* this rank's first failure in the current check; "" if none */
} Ctx;

/* Plain MPI, for the verdicts: a failure here ends the job. */
static void must(int rc, const char *call)
{
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "mpi_check: %s failed (%d)\n", call, rc);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

__attribute__((format(printf, 2, 3))) static void fail(Ctx *c, const char *fmt, ...)
{
    va_list ap;
    if (c->why[0])
        return;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
}

#define CHECK(c, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail((c), __VA_ARGS__);                                                                \
    } while (0)

/* Close the current check: every rank's verdict, one line on rank 0. */
__attribute__((format(printf, 2, 3))) static void verdict(Ctx *c, const char *fmt, ...)
{
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int bad = c->why[0] != 0, any = 0;
    must(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    if (bad)
        fprintf(stderr, "mpi_check: rank %d: %s: %s (seed %llu)\n", c->rank, name, c->why,
                (unsigned long long)c->seed);
    if (c->rank == 0)
        printf("%s: %s\n", name, any ? "FAILED" : "ok");
    fflush(stdout);
    c->checks++;
    c->failed += any;
    c->why[0] = 0;
}

/* Are bytes at p bitwise the same on every rank of the world? */
static int same_everywhere(const void *p, size_t bytes)
{
    int size, ok = 1;
    must(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
    char *all = malloc((size_t)size * bytes + 1);
    must(MPI_Allgather(p, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD),
         "MPI_Allgather");
    for (int r = 1; r < size; r++)
        ok &= !memcmp(all, all + (size_t)r * bytes, bytes);
    free(all);
    return ok;
}

/* ---- values ---- */

/* Element values and codes: tests/support/comm_values.h. */
static double value(const Ctx *c, PlanDType dt, int rank, size_t i, int salt)
{
    return cv_value(c->seed, dt, rank, i, salt);
}

/* ---- all_reduce ---- */

static void check_reduced(Ctx *c, RtComm *comm, PlanDType dt, int max, const void *buf,
                          size_t count, int salt)
{
    double eps = dt == PD_F32 ? ldexp(1, -24) : dt == PD_F64 ? ldexp(1, -53) : 0;
    int n = rt_comm_size(comm);
    for (size_t i = 0; i < count; i++) {
        double ref = value(c, dt, 0, i, salt), mag = fabs(ref);
        for (int r = 1; r < n; r++) {
            double v = value(c, dt, r, i, salt);
            ref = max ? fmax(ref, v) : ref + v;
            mag += fabs(v);
        }
        double got = cv_get(dt, buf, i), tol = max ? 0 : n * eps * mag;
        if (!(fabs(got - ref) <= tol)) {
            fail(c, "element %zu is %.17g, want %.17g", i, got, ref);
            return;
        }
    }
}

static void reduce_once(Ctx *c, RtComm *comm, PlanDType dt, int max, void *buf, size_t count,
                        int salt)
{
    char err[512] = "";
    for (size_t i = 0; i < count; i++)
        cv_put(dt, buf, i, value(c, dt, rt_comm_rank(comm), i, salt));
    int rc = max ? rt_comm_all_reduce_max(comm, buf, count, dt, err, sizeof err)
                 : rt_comm_all_reduce(comm, buf, count, dt, err, sizeof err);
    CHECK(c, rc == 0, "%s", err);
}

/* On the world only: the bitwise comparison runs over MPI_COMM_WORLD. */
static void all_reduce_case(Ctx *c, RtComm *comm, PlanDType dt, int max, size_t count)
{
    size_t bytes = count * plan_dtype_size(dt);
    char *buf = malloc(bytes + 1), *again = malloc(bytes + 1);
    int salt = (int)count + 16 * dt + 4 * max;
    reduce_once(c, comm, dt, max, buf, count, salt);
    check_reduced(c, comm, dt, max, buf, count, salt);
    CHECK(c, same_everywhere(buf, bytes), "not bitwise the same on every rank");
    reduce_once(c, comm, dt, max, again, count, salt);
    CHECK(c, !memcmp(buf, again, bytes), "another result from the same inputs");
    verdict(c, "all_reduce%s %s count %zu", max ? "_max" : "", plan_dtype_name(dt), count);
    free(buf);
    free(again);
}

/* ---- all_gather, reduce_scatter, all_to_all, broadcast, send/recv ---- */

static void gather_case(Ctx *c, RtComm *comm, const char *on, size_t pre, size_t chunk, size_t post,
                        size_t elem)
{
    size_t size = (size_t)rt_comm_size(comm), nin = pre * chunk * post, bad = (size_t)-1;
    int me = rt_comm_rank(comm);
    char *in = malloc(nin * elem + 1), *out = malloc(size * nin * elem + 1), err[512] = "";
    for (size_t p = 0, i = 0; p < pre; p++)
        for (size_t k = 0; k < chunk; k++)
            for (size_t q = 0; q < post; q++)
                cv_put_code(in, i++, elem, cv_code(me, p, k, q));
    int rc = rt_comm_all_gather(comm, in, out, pre, chunk, post, elem, err, sizeof err);
    CHECK(c, rc == 0, "%s", err);
    for (size_t p = 0, i = 0; p < pre; p++)
        for (size_t k = 0; k < size * chunk; k++)
            for (size_t q = 0; q < post; q++, i++)
                if (bad == (size_t)-1 &&
                    cv_get_code(out, i, elem) != cv_code((int)(k / chunk), p, k % chunk, q))
                    bad = i;
    CHECK(c, bad == (size_t)-1, "element %zu is %llu", bad,
          (unsigned long long)cv_get_code(out, bad, elem));
    verdict(c, "all_gather %s [%zu][%zu][%zu] x %zu bytes", on, pre, chunk, post, elem);
    free(in);
    free(out);
}

static void scatter_case(Ctx *c, RtComm *comm, const char *on, PlanDType dt, size_t pre,
                         size_t chunk, size_t post)
{
    size_t size = (size_t)rt_comm_size(comm), es = plan_dtype_size(dt), bad = (size_t)-1;
    int me = rt_comm_rank(comm);
    char *in = malloc(pre * size * chunk * post * es + 1), *out = malloc(pre * chunk * post * es);
    char err[512] = "";
    double ranks = (double)(size * (size - 1) / 2);
    for (size_t p = 0, i = 0; p < pre; p++)
        for (size_t k = 0; k < size * chunk; k++)
            for (size_t q = 0; q < post; q++)
                cv_put(dt, in, i++, (double)cv_code(0, p, k, q) + 1000.0 * me);
    int rc = rt_comm_reduce_scatter(comm, in, out, pre, chunk, post, dt, err, sizeof err);
    CHECK(c, rc == 0, "%s", err);
    for (size_t p = 0, i = 0; p < pre; p++)
        for (size_t k = 0; k < chunk; k++)
            for (size_t q = 0; q < post; q++, i++) {
                double want = (double)size * cv_code(0, p, me * chunk + k, q) + 1000.0 * ranks;
                if (bad == (size_t)-1 && cv_get(dt, out, i) != want)
                    bad = i;
            }
    CHECK(c, bad == (size_t)-1, "element %zu is %g", bad, cv_get(dt, out, bad));
    verdict(c, "reduce_scatter %s %s [%zu][%zu][%zu]", on, plan_dtype_name(dt), pre, chunk, post);
    free(in);
    free(out);
}

static void all_to_all_case(Ctx *c, RtComm *comm, const char *on)
{
    size_t size = (size_t)rt_comm_size(comm), bb = 3 * sizeof(uint32_t);
    int me = rt_comm_rank(comm), ok = 1;
    uint32_t *in = malloc(size * bb), *out = malloc(size * bb);
    char err[512] = "";
    for (size_t j = 0; j < size; j++)
        for (size_t b = 0; b < 3; b++)
            in[j * 3 + b] = (uint32_t)cv_code(me, j, b, 0);
    CHECK(c, !rt_comm_all_to_all(comm, in, out, bb, err, sizeof err), "%s", err);
    for (size_t j = 0; j < size; j++)
        for (size_t b = 0; b < 3; b++)
            ok &= out[j * 3 + b] == (uint32_t)cv_code((int)j, (size_t)me, b, 0);
    CHECK(c, ok, "a block is not the one its member sent");
    verdict(c, "all_to_all %s", on);
    free(in);
    free(out);
}

static void broadcast_case(Ctx *c, RtComm *comm, const char *on, int root)
{
    uint64_t buf[5];
    int me = rt_comm_rank(comm), ok = 1;
    char err[512] = "";
    for (size_t b = 0; b < 5; b++)
        buf[b] = cv_code(me, 0, b, 1);
    CHECK(c, !rt_comm_broadcast(comm, buf, sizeof buf, root, err, sizeof err), "%s", err);
    for (size_t b = 0; b < 5; b++)
        ok &= buf[b] == cv_code(root, 0, b, 1);
    CHECK(c, ok, "not the root's bytes");
    verdict(c, "broadcast %s from %d", on, root);
}

/* Every member sends tags 1 then 2 (words of them) to the next, then receives tags 2
 * then 1 from the previous. Large messages would deadlock an unbuffered MPI_Send. */
static void ring_case(Ctx *c, RtComm *comm, const char *on, size_t words)
{
    int n = rt_comm_size(comm), me = rt_comm_rank(comm), next = (me + 1) % n;
    int prev = (me + n - 1) % n;
    uint64_t *msg = malloc(2 * words * sizeof *msg), *got = malloc(words * sizeof *got);
    char err[512] = "";
    for (int t = 0; t < 2; t++) {
        for (size_t b = 0; b < words; b++)
            msg[t * words + b] = cv_code(me, (size_t)t, b % 32, 2) + (b << 20);
        CHECK(c, !rt_comm_send(comm, msg + t * words, words * 8, next, t + 1, err, sizeof err),
              "send: %s", err);
    }
    memset(msg, 0, 2 * words * sizeof *msg); /* the sends are done with it */
    for (int t = 1; t >= 0; t--) {
        memset(got, 0, words * sizeof *got);
        CHECK(c, !rt_comm_recv(comm, got, words * 8, prev, t + 1, err, sizeof err), "recv: %s",
              err);
        for (size_t b = 0; b < words; b++)
            if (got[b] != cv_code(prev, (size_t)t, b % 32, 2) + (b << 20)) {
                fail(c, "tag %d: word %zu is %llu", t + 1, b, (unsigned long long)got[b]);
                break;
            }
    }
    verdict(c, "send/recv ring %s, %zu bytes", on, words * 8);
    free(msg);
    free(got);
}

/* ---- the checks ---- */

static RtComm *split(Ctx *c, int color, int key, int rank, int size, const char *what)
{
    char err[512] = "";
    RtComm *comm = rt_comm_split(c->w, color, key, err, sizeof err);
    CHECK(c, comm, "%s", err);
    if (comm)
        CHECK(c, rt_comm_rank(comm) == rank && rt_comm_size(comm) == size,
              "rank %d of %d, want %d of %d", rt_comm_rank(comm), rt_comm_size(comm), rank, size);
    verdict(c, "comm_split %s", what);
    return comm;
}

/* noinline: no stale pointer of it stays in main's frame to hide a leak */
__attribute__((noinline)) static void check_world(Ctx *c)
{
    static const size_t counts[] = {0, 1, 3, 1031};
    static const PlanDType dts[] = {PD_F32, PD_F64, PD_I32};
    RtComm *all = split(c, 0, c->rank, c->rank, c->size, "world");
    if (!all)
        return;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (size_t d = 0; d < 3; d++)
            for (int max = 0; max < 2; max++)
                all_reduce_case(c, all, dts[d], max, counts[k]);
    gather_case(c, all, "world", 3, 2, 5, 4);
    gather_case(c, all, "world", 1, 3, 2, 8);
    gather_case(c, all, "world", 2, 1, 1, 2);
    for (size_t d = 0; d < 3; d++) {
        scatter_case(c, all, "world", dts[d], 3, 2, 5);
        scatter_case(c, all, "world", dts[d], 1, 3, 2);
    }
    all_to_all_case(c, all, "world");
    broadcast_case(c, all, "world", 0);
    broadcast_case(c, all, "world", c->size - 1);
    char err[512] = "";
    CHECK(c, !rt_comm_barrier(all, err, sizeof err), "%s", err);
    verdict(c, "barrier world");
    ring_case(c, all, "world", 4);
    ring_case(c, all, "world", 1 << 17);
    rt_comm_free(all);
}

/* World rank = 2 x + y on a 2x2 mesh. Rows: color x, key y; columns: color y, key -x. */
__attribute__((noinline)) static void check_mesh(Ctx *c)
{
    int x = c->rank / 2, y = c->rank % 2;
    RtComm *row = split(c, x, y, y, 2, "rows of 2x2");
    RtComm *col = split(c, y, -x, 1 - x, 2, "columns of 2x2");
    if (row && col) {
        int32_t buf[3];
        char err[512] = "";
        for (int i = 0; i < 3; i++)
            buf[i] = 100 * x + y + i;
        CHECK(c, !rt_comm_all_reduce(row, buf, 3, PD_I32, err, sizeof err), "%s", err);
        for (int i = 0; i < 3; i++)
            CHECK(c, buf[i] == 2 * (100 * x + i) + 1, "sum[%d] = %d", i, buf[i]);
        verdict(c, "all_reduce rows i32");
        gather_case(c, col, "columns", 2, 2, 3, 4);
        scatter_case(c, row, "rows", PD_F32, 2, 1, 3);
        all_to_all_case(c, col, "columns");
        broadcast_case(c, row, "rows", 1);
        ring_case(c, col, "columns", 4);
    }
    rt_comm_free(row);
    rt_comm_free(col);
}

/* bf16 sums: widened, summed in f32, rounded once. Element 0 is 1 on rank 0
 * and 2^-8 elsewhere: rounded once, 1 + (n-1) 2^-8; rounded after each member,
 * every partial sum 1 + 2^-8 (a tie, to even) would fall back to 1. The
 * reduce-scatter's values k / 4 + rank and their sums are exact in bf16. */
__attribute__((noinline)) static void check_bf16(Ctx *c)
{
    char err[512] = "";
    RtComm *all = split(c, 0, c->rank, c->rank, c->size, "world for bf16");
    if (!all)
        return;
    uint16_t buf[3] = {rt_f32_to_bf16(c->rank ? 0x1p-8f : 1.0f), rt_f32_to_bf16(0.5f),
                       rt_f32_to_bf16(-2.0f * (float)c->rank)};
    CHECK(c, !rt_comm_all_reduce(all, buf, 3, PD_BF16, err, sizeof err), "%s", err);
    double n = c->size;
    CHECK(c, buf[0] == rt_f32_to_bf16((float)(1 + (n - 1) * 0x1p-8)), "bf16 sum 0x%04x", buf[0]);
    CHECK(c, rt_bf16_to_f32(buf[1]) == 0.5 * n && rt_bf16_to_f32(buf[2]) == -n * (n - 1),
          "bf16 sums %g %g", (double)rt_bf16_to_f32(buf[1]), (double)rt_bf16_to_f32(buf[2]));
    uint16_t in[64], out[2];
    for (int k = 0; k < 2 * c->size && k < 64; k++)
        in[k] = rt_f32_to_bf16((float)k / 4 + (float)c->rank);
    CHECK(c, !rt_comm_reduce_scatter(all, in, out, 1, 2, 1, PD_BF16, err, sizeof err), "%s", err);
    for (int k = 0; k < 2; k++)
        CHECK(c, rt_bf16_to_f32(out[k]) == n * (2 * c->rank + k) / 4 + n * (n - 1) / 2,
              "bf16 reduce_scatter element %d: %g", k, (double)rt_bf16_to_f32(out[k]));
    verdict(c, "bf16 sums rounded once");
    rt_comm_free(all);
}

__attribute__((noinline)) static void check_refusals(Ctx *c)
{
    char err[512] = "";
    float f[4] = {0};
    RtComm *all = rt_comm_split(c->w, 0, c->rank, err, sizeof err);
    CHECK(c, all, "%s", err);
    if (all) {
        CHECK(c,
              rt_comm_all_reduce(all, f, 2, PD_F16, err, sizeof err) == -1 &&
                  strstr(err, "dtype f16 does not reduce"),
              "f16: %s", err);
        CHECK(c,
              rt_comm_send(all, f, 4, c->rank, 0, err, sizeof err) == -1 &&
                  strstr(err, "this member itself"),
              "send to itself: %s", err);
    }
    CHECK(c, !rt_comm_split(c->w, -1, 0, err, sizeof err) && strstr(err, "negative"),
          "negative color: %s", err);
    verdict(c, "refusals");
    rt_comm_free(all);
}

/* ---- the watchdog: mpi_check watchdog|watchdog-recv DIR, TCC_COMM_TIMEOUT=1, 4 ranks ----
 * watchdog: ranks 0-2 all-reduce over the world's group "all" while rank 3 is
 * busy outside MPI for 4 timeouts: rank 0 (the lowest) names rank 3, which does
 * not answer, after a timeout and the second it gives the answers; ranks 1 and
 * 2 leave the report to rank 0 for a timeout more, then make their own.
 * watchdog-recv: ranks 0 and 1 each wait for a message from the other (a
 * deadlock): each names the other and what it waits for, a timeout later (the
 * other waits too). Every rank then writes to DIR/rank.R what its call returned,
 * whether it took 2.5 timeouts or more, whether the world is broken and whether
 * a later call is refused at once (a file: what a process prints may be lost
 * when the job is killed); closing the world then ends the job (MPI_Abort). */
__attribute__((noinline)) static void check_watchdog(Ctx *c, int recv, const char *dir)
{
    char err[512] = "none", late[512] = "", path[4096];
    float f[4] = {0};
    RtComm *all = rt_comm_split(c->w, 0, c->rank, err, sizeof err);
    if (!all) {
        fprintf(stderr, "mpi_check: %s\n", err);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    rt_comm_name(all, "all");
    int rc = 0;
    double t0 = MPI_Wtime();
    if (recv && c->rank < 2)
        rc = rt_comm_recv(all, f, sizeof f, 1 - c->rank, 5 + c->rank, err, sizeof err);
    else if (!recv && c->rank < 3)
        rc = rt_comm_all_reduce(all, f, 4, PD_F32, err, sizeof err);
    else if (!recv)
        nanosleep(&(struct timespec){4, 0}, NULL);
    double took = MPI_Wtime() - t0;
    int refused = rc && rt_comm_barrier(all, late, sizeof late) && strstr(late, ": stopped: ");
    snprintf(path, sizeof path, "%s/rank.%d", dir, c->rank);
    FILE *out = fopen(path, "w");
    if (out && rc)
        fprintf(out, "on rank %d: %s; took %s 2.5 timeouts, broken %d, a later call refused %d\n",
                c->rank, err, took >= 2.5 ? ">=" : "<", rt_world_broken(c->w), refused);
    else if (out)
        fprintf(out, "on rank %d: no wait\n", c->rank);
    if (!out || fclose(out))
        fprintf(stderr, "mpi_check: %s: cannot write\n", path);
    must(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    rt_comm_free(all);
}

int main(int argc, char **argv)
{
    Ctx c = {0};
    char err[512] = "";
    c.w = rt_world_mpi(err, sizeof err);
    if (!c.w) {
        fprintf(stderr, "mpi_check: %s\n", err);
        return 1;
    }
    c.rank = rt_world_rank(c.w);
    c.size = rt_world_size(c.w);
    c.seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)clock();
    must(MPI_Bcast(&c.seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
    int mpi_rank;
    must(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "MPI_Comm_rank");
    CHECK(&c, mpi_rank == c.rank && !strcmp(rt_world_backend(c.w), "mpi"), "rank %d backend %s",
          c.rank, rt_world_backend(c.w));
    verdict(&c, "world of %d ranks", c.size);
    if (argc > 2 && c.size == 4 && !strncmp(argv[1], "watchdog", 8)) {
        check_watchdog(&c, !strcmp(argv[1], "watchdog-recv"), argv[2]);
        rt_world_close(c.w); /* broken: MPI_Abort */
        return 1;
    }
    check_world(&c);
    if (c.size == 4)
        check_mesh(&c);
    check_refusals(&c);
    check_bf16(&c);
#ifdef HAVE_LSAN
    CHECK(&c, !__lsan_do_recoverable_leak_check(), "leaks (above)");
    verdict(&c, "no leaks before MPI_Finalize");
#endif
    if (c.rank == 0)
        printf("mpi_check: %d checks, %d failed\n", c.checks, c.failed);
    int failed = c.failed;
    rt_world_close(c.w);
    return failed ? 1 : 0;
}
