/* calibrate.c: how fast this machine runs what a plan's step is made of, for
 * the compiler's CPU cost model (docs/cost.md, "The CPU").
 * Reads: the OpenMP and OpenBLAS settings of the process, /proc/cpuinfo.
 * Writes: small kernels compiled into the kernel cache (as a plan's are).
 * Key idea: each rate is measured with the code the runtime itself runs: the
 * kernels are C in the style of the generated ones, compiled by the same
 * command into the same cache (cpu.c) and called the same way, each after a
 * kernel that fills the caches with other data (as in a step, where an
 * instruction's operands were last touched many kernels before); GEMMs are
 * OpenBLAS's sgemm, after the same. Each rate is one thread's, the median of
 * a few runs in turns; what every thread adds is measured apart for a GEMM,
 * a parallel loop of arithmetic and a parallel stream through memory, each
 * on every thread against one, in trials on fresh threads (a trial that the
 * machine slowed is outvoted). The whole takes well under a second once the
 * kernels are cached. */
#include "runtime/cpu.h"
#include "runtime/runtime.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ITEMS (1 << 20)      /* a kernel's loop: 4 MiB of f32 in, the same out */
#define CALL_ITEMS (1 << 16) /* of them, the ones the exp and tanh kernels take */
#define FLUSH (8 << 20)      /* floats a flush writes: 32 MiB, as much as a cache holds */
#define RUNS 7
#define TRIALS 3 /* of the speed-ups, each on a thread (and OpenMP team) of its own */
#define PAR_RUNS 2 /* a parallel region's runs for each of RUNS */

/* Bodies in the generated kernels' style (a temporary per node). Operations
 * first: 8 an item (3 loads, 2 integer, 2 float, 1 store). */
static const char source[] =
    "#include <math.h>\n#include <stdint.h>\n"
    "#define OPS_BODY(i0) { const int64_t t0 = i0; const float t1 = a0[t0];\\\n"
    "    const int64_t t2 = t0 % INT64_C(128); const int64_t t3 = t0 / INT64_C(128);\\\n"
    "    const float t4 = a0[t2]; const float t5 = a1[t3];\\\n"
    "    const float t6 = t1 * t4; const float t7 = t6 + t5; a2[t0] = t7; }\n"
    "#define ARGS const float *restrict a0 = (float *)args[0], *restrict a1 = (float *)args[1];\\\n"
    "    float *restrict a2 = (float *)args[2];\n"
    "void cal_ops(char *const *args)\n"
    "{\n    ARGS\n    for (int64_t i0 = 0; i0 < INT64_C(1048576); i0++) OPS_BODY(i0)\n}\n"
    "void cal_ops_par(char *const *args)\n"
    "{\n    ARGS\n#pragma omp parallel for schedule(static)\n"
    "    for (int64_t i0 = 0; i0 < INT64_C(1048576); i0++) OPS_BODY(i0)\n}\n"
    /* a running sum: one load and one dependent add a step */
    "void cal_chain(char *const *args)\n"
    "{\n    ARGS\n    float acc = 0.0f;\n"
    "    for (int64_t i1 = 0; i1 < INT64_C(1048576); i1++) { const float t1 = a0[i1]; acc += t1; "
    "}\n"
    "    a2[0] = acc + a1[0];\n}\n"
    /* running sums 64 long, one after another (a row's dot product, as in
     * attention and the row reductions): 2 operations and a chain step an item */
    "void cal_rows(char *const *args)\n"
    "{\n    ARGS\n    for (int64_t r = 0; r < INT64_C(16384); r++) {\n        float acc = 0.0f;\n"
    "        for (int64_t d = 0; d < 64; d++) { const float t1 = a0[r * 64 + d]; "
    "const float t2 = a1[d]; acc += t1 * t2; }\n        a2[r] = acc;\n    }\n}\n"
    /* a loop of independent items, as codegen writes one (parallel for simd, on one
     * thread here): 7 operations an item (2 loads, 4 arithmetic, 1 store), as vectors;
     * 2^14 items (192 KiB, in cache: the memory is priced apart) 64 times */
    "void cal_vops(char *const *args)\n"
    "{\n    ARGS\n    for (int r = 0; r < 64; r++) {\n#pragma omp simd\n"
    "    for (int64_t i0 = 0; i0 < INT64_C(16384); i0++) {\n"
    "        const float t1 = a0[i0]; const float t2 = a1[i0 + r]; const float t3 = t1 * t2;\n"
    "        const float t4 = t3 + t1; const float t5 = t4 * t4; a2[i0] = t5 - t2;\n    }\n    }\n}\n"
    /* a sum of two arrays: 4 operations and 12 bytes an item, bound by the memory */
    "void cal_stream(char *const *args)\n"
    "{\n    ARGS\n    for (int64_t i0 = 0; i0 < INT64_C(1048576); i0++) {\n"
    "        const float t1 = a0[i0]; const float t2 = a1[i0]; a2[i0] = t1 + t2;\n    }\n}\n"
    "void cal_stream_par(char *const *args)\n"
    "{\n    ARGS\n#pragma omp parallel for schedule(static)\n"
    "    for (int64_t i0 = 0; i0 < INT64_C(1048576); i0++) {\n"
    "        const float t1 = a0[i0]; const float t2 = a1[i0]; a2[i0] = t1 + t2;\n    }\n}\n"
    /* a division and a square root: 2 of them and 5 operations an item */
    "void cal_div(char *const *args)\n"
    "{\n    ARGS\n    for (int64_t i0 = 0; i0 < INT64_C(65536); i0++) {\n"
    "        const float t1 = a0[i0]; const float t2 = t1 * t1; const float t3 = t2 + 1.0f;\n"
    "        const float t4 = sqrtf(t3); const float t5 = a1[i0]; a2[i0] = t5 / t4;\n    }\n}\n"
    /* exp, and tanh, of values in [-3, 3]: a call and 2 operations an item */
    "void cal_exp(char *const *args)\n"
    "{\n    ARGS\n    for (int64_t i0 = 0; i0 < INT64_C(65536); i0++) {\n"
    "        const float t1 = a0[i0]; const float t2 = expf(t1); a2[i0] = t2;\n    }\n}\n"
    "#define TANH_BODY(i0) { const float t1 = a0[i0]; const float t2 = tanhf(t1); a2[i0] = t2; }\n"
    "void cal_tanh(char *const *args)\n"
    "{\n    ARGS\n    for (int64_t i0 = 0; i0 < INT64_C(65536); i0++) TANH_BODY(i0)\n}\n"
    "void cal_tanh_par(char *const *args)\n"
    "{\n    ARGS\n#pragma omp parallel for schedule(static)\n"
    "    for (int64_t i0 = 0; i0 < INT64_C(65536); i0++) TANH_BODY(i0)\n}\n"
    /* a parallel region with next to nothing to do */
    "void cal_fork(char *const *args)\n"
    "{\n    ARGS\n#pragma omp parallel for schedule(static)\n"
    "    for (int64_t i0 = 0; i0 < INT64_C(64); i0++) a2[i0] = a0[i0] + a1[i0];\n}\n"
    /* what the kernels before an instruction leave: the caches full of other data */
    "void cal_flush(char *const *args)\n"
    "{\n    float *restrict a3 = (float *)args[3];\n#pragma omp parallel for schedule(static)\n"
    "    for (int64_t i0 = 0; i0 < INT64_C(8388608); i0++) a3[i0] += 1.0f;\n}\n";

enum {
    K_OPS,
    K_CHAIN,
    K_STREAM,
    K_DIV,
    K_EXP,
    K_TANH,
    K_FORK,
    K_OPS_PAR,
    K_TANH_PAR,
    K_FLUSH,
    K_VOPS,
    K_ROWS,
    K_STREAM_PAR,
    K_COUNT
};
static const char *const names[K_COUNT] = {"cal_ops",      "cal_chain", "cal_stream", "cal_div",
                                           "cal_exp",      "cal_tanh",  "cal_fork",   "cal_ops_par",
                                           "cal_tanh_par", "cal_flush", "cal_vops",
                                           "cal_rows",     "cal_stream_par"};

/* The calibration's device: the kernels, the slab's arrays, a GEMM's operands. */
typedef struct Bench {
    CpuDevice d;
    char *args[4];
    float *gemm; /* 3 x 512 x 512 */
} Bench;

static int by_value(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, by_value);
    return t[n / 2];
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A plan with nothing but the calibration kernels and a slab for their
 * arrays, for rt_cpu_open (which compiles or finds them in the cache). */
static void kernel_plan(Plan *p, PlanKernel *k)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < K_COUNT; i++)
        k[i] = (PlanKernel){(char *)names[i], 4, 0, 1, 1};
    p->version = PLAN_VERSION;
    p->model = "calibration";
    p->slab_bytes = (3 * (uint64_t)ITEMS + FLUSH) * sizeof(float);
    p->nkernels = K_COUNT;
    p->kernels = k;
    p->kernel_source = (char *)source;
    p->loss = p->lr = p->grad_norm = -1;
}

static int bench_open(Bench *b, const char *cache_dir, char *err, size_t n)
{
    Plan p;
    PlanKernel k[K_COUNT];
    kernel_plan(&p, k);
    memset(b, 0, sizeof *b);
    if (rt_cpu_open(&b->d, &p, cache_dir, err, n))
        return -1;
    float *a = (float *)b->d.slab;
    uint32_t x = 1;
    for (int i = 0; i < 3 * ITEMS + FLUSH; i++) { /* uniform in [-3, 3], where activations lie, */
        x = x * 1664525u + 1013904223u;           /* in no order a branch predictor could learn */
        a[i] = 6.0f * (float)(x >> 8) / 16777216.0f - 3.0f;
    }
    for (int i = 0; i < 4; i++)
        b->args[i] = (char *)(a + (size_t)i * ITEMS);
    if (!(b->gemm = malloc(3 * 512 * 512 * sizeof(float)))) {
        rt_cpu_close(&b->d);
        return plan_errorf(err, n, "malloc of a 512 x 512 GEMM's operands failed");
    }
    for (int i = 0; i < 3 * 512 * 512; i++)
        b->gemm[i] = (float)(i % 13) * 0.01f;
    return 0;
}

static void bench_close(Bench *b)
{
    rt_cpu_close(&b->d);
    free(b->gemm);
}

/* Seconds of sgemm m x k times k x n (m * k, k * n, m * n <= 512^2). */
static double sgemm_s(Bench *b, int m, int nn, int k)
{
    float *a = b->gemm, *bb = a + 512 * 512, *c = bb + 512 * 512;
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, nn, k, 1, a, k, bb, nn, 0, c, nn);
    return now_s() - t0;
}

/* The measurements on one thread: the kernels first, in their order, then the others. */
enum { M_OPS, M_CHAIN, M_STREAM, M_DIV, M_EXP, M_TANH, M_GEMM1, M_CONVERT, M_VOPS, M_ROWS, M_COUNT };

/* Seconds of the bf16 GEMM wrapper's loops (runtime/cpu.c, compiled as it
 * is): ITEMS elements widened to f32, then rounded back; in the flush's array,
 * so that the kernels' inputs stay as they are. */
static double convert_s(Bench *b)
{
    float *w = (float *)b->args[3];
    const uint16_t *h = (const uint16_t *)(w + ITEMS);
    uint16_t *back = (uint16_t *)(w + ITEMS) + ITEMS;
    double t0 = now_s();
    for (size_t i = 0; i < ITEMS; i++)
        w[i] = rt_bf16_to_f32(h[i]);
    for (size_t i = 0; i < ITEMS; i++)
        back[i] = rt_f32_to_bf16(w[i]);
    return now_s() - t0;
}

/* Seconds of a parallel region that does nothing: the mean of RUNS times
 * PAR_RUNS, each right after an sgemm on every thread, as in a step. */
static double fork_s(Bench *b, int threads)
{
    double sum = 0;
    openblas_set_num_threads(threads);
    for (int r = 0; r < RUNS * PAR_RUNS; r++) {
        sgemm_s(b, 256, 256, 256);
        double t0 = now_s();
        b->d.fns[K_FORK](b->args);
        sum += now_s() - t0;
    }
    return sum / (RUNS * PAR_RUNS);
}

/* Seconds of measurement m on one thread, right after a flush of the caches
 * by every thread (as an instruction of a step follows other kernels). */
static double run_one(Bench *b, int m)
{
    b->d.fns[K_FLUSH](b->args);
    if (m == M_GEMM1)
        return sgemm_s(b, 512, 512, 512);
    if (m == M_CONVERT)
        return convert_s(b);
    double t0 = now_s();
    b->d.fns[m == M_VOPS ? K_VOPS : m == M_ROWS ? K_ROWS : m](b->args);
    return now_s() - t0;
}

/* The measurements on every thread against one: each a parallel
 * counterpart of a one-thread one. */
enum { P_GEMM, P_LOOP, P_STREAM, P_COUNT };

/* Seconds of parallel measurement m on `threads` OpenMP and OpenBLAS
 * threads, right after a flush of the caches. */
static double run_par(Bench *b, int m, int threads)
{
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    b->d.fns[K_FLUSH](b->args);
    if (m == P_GEMM)
        return sgemm_s(b, 512, 512, 512);
    double t0 = now_s();
    b->d.fns[m == P_LOOP ? K_TANH_PAR : K_STREAM_PAR](b->args);
    return now_s() - t0;
}

/* A trial of the speed-ups on a thread of its own, whose OpenMP threads are
 * a team of its own too (libgomp gives each thread that starts a parallel
 * region its own): each parallel measurement on every thread and on one,
 * RUNS times in turns; the ratios of their medians (for the stream: of the
 * parallel kernel to its one-thread run). Another process on the machine, or
 * the hypervisor taking a core away, can slow every run of a trial on all
 * threads, so the caller takes the median of TRIALS trials. */
typedef struct Trial {
    Bench *b;
    int cores;
    double ratio[P_COUNT];
} Trial;

static void *trial_main(void *arg)
{
    Trial *tr = arg;
    double one[P_COUNT][RUNS], all[P_COUNT][RUNS];
    for (int m = 0; m < P_COUNT; m++) /* the team and OpenBLAS's threads started, untimed */
        run_par(tr->b, m, tr->cores);
    for (int r = 0; r < RUNS; r++)
        for (int m = 0; m < P_COUNT; m++)
            one[m][r] = run_par(tr->b, m, 1), all[m][r] = run_par(tr->b, m, tr->cores);
    for (int m = 0; m < P_COUNT; m++)
        tr->ratio[m] = median(one[m], RUNS) / median(all[m], RUNS);
    return NULL;
}

/* The figures from the median times t (seconds) of the measurements. */
static void figures(RtCpuSpeed *s, const double *t)
{
    double items = ITEMS;
    s->op_ns = t[M_OPS] / items / 8 * 1e9;
    s->vop_ns = t[M_VOPS] / items / 7 * 1e9;
    s->chain_ns = fmax(t[M_CHAIN] / items * 1e9 - s->op_ns, 0.01);
    s->stream_gbs = 12.0 * items / t[M_STREAM] / 1e9;
    s->div_ns = fmax((t[M_DIV] / CALL_ITEMS * 1e9 - 5 * s->op_ns) / 2, 0.01);
    s->call_ns = fmax(t[M_EXP] / CALL_ITEMS * 1e9 - 2 * s->op_ns, 0.01);
    s->tanh_ns = fmax(t[M_TANH] / CALL_ITEMS * 1e9 - 2 * s->op_ns, 0.01);
    s->chain64_ns = fmax(t[M_ROWS] / items * 1e9 - 2 * s->op_ns, 0.01);
    s->gemm1_gflops = 2.0 * 512 * 512 * 512 / t[M_GEMM1] / 1e9;
    s->convert_ns = t[M_CONVERT] / (2.0 * ITEMS) * 1e9;
}

/* Every measurement on one thread RUNS times, in turns, so that a burst of
 * other work on the machine touches one run of each at most; the medians.
 * These come first, with OpenBLAS on one thread: its workers spin for a while
 * after each GEMM on more than one, on a core the one thread may share. Then
 * the parallel region, and each parallel measurement on every thread and on
 * one, in turns: the speed-ups are the ratios of their medians. */
static int measure_all(RtCpuSpeed *s, const char *cache_dir, char *err, size_t n)
{
    Bench b;
    double t[M_COUNT][RUNS], med[M_COUNT];
    if (bench_open(&b, cache_dir, err, n))
        return -1;
    int threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    for (int m = 0; m < M_COUNT; m++) /* once untimed: pages, code, OpenBLAS buffers */
        run_one(&b, m);
    for (int r = 0; r < RUNS; r++)
        for (int m = 0; m < M_COUNT; m++)
            t[m][r] = run_one(&b, m);
    for (int m = 0; m < M_COUNT; m++)
        med[m] = median(t[m], RUNS);
    figures(s, med);
    s->fork_us = fork_s(&b, s->cores) * 1e6;
    double q[P_COUNT][TRIALS];
    for (int i = 0; i < TRIALS; i++) {
        Trial tr = {&b, s->cores, {0}};
        pthread_t th;
        if (pthread_create(&th, NULL, trial_main, &tr) != 0)
            trial_main(&tr);
        else
            pthread_join(th, NULL);
        for (int m = 0; m < P_COUNT; m++)
            q[m][i] = tr.ratio[m];
    }
    double sp[P_COUNT];
    for (int m = 0; m < P_COUNT; m++)
        sp[m] = median(q[m], TRIALS);
    s->speedup = s->cores > 1 ? fmax(sp[P_GEMM], 1) : 1;
    s->loop_speedup = s->cores > 1 ? fmax(sp[P_LOOP], 1) : 1;
    s->stream_par_gbs = fmax(s->stream_gbs * sp[P_STREAM], s->stream_gbs);
    omp_set_num_threads(s->cores);
    openblas_set_num_threads(threads);
    bench_close(&b);
    return 0;
}

static void machine_names(RtCpuSpeed *s)
{
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(s->cpu, sizeof s->cpu, "cpu");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && colon) {
            colon[1 + strcspn(colon + 1, "\n")] = 0;
            snprintf(s->cpu, sizeof s->cpu, "%s", colon + 1 + (colon[1] == ' '));
            break;
        }
    }
    if (f)
        fclose(f);
    snprintf(s->blas, sizeof s->blas, "OpenBLAS %s", openblas_get_corename());
}

int rt_cpu_measure(RtCpuSpeed *s, const char *cache_dir, char *err, size_t n)
{
    memset(s, 0, sizeof *s);
    s->cores = omp_get_max_threads();
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    s->memory_bytes = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    machine_names(s);
    return measure_all(s, cache_dir, err, n);
}
