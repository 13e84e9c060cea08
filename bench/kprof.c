/* kprof.c: a wall-clock profile of a program built by tcc, without touching it.
 * Preloaded, it times every GOMP_parallel (each generated kernel is one
 * `omp parallel for`, run through GOMP_parallel even when its if() clause makes
 * it serial) and every cblas_sgemm / cblas_dgemm, on the thread that calls them,
 * and writes the totals at exit:
 *   K OFFSET CALLS SECONDS          one line per kernel (OFFSET: of the outlined
 *                                   function in the executable, for nm)
 *   G M N K TRANSA TRANSB CALLS SECONDS   one line per GEMM shape
 * bench/kprof.py turns that into a table per op and per GEMM shape.
 *   cc -O2 -shared -fPIC -o kprof.so bench/kprof.c -ldl
 *   KPROF_OUT=prof.txt LD_PRELOAD=./kprof.so ./NAME --steps 3
 *   python3 bench/kprof.py ./NAME prof.txt 3 MS_PER_STEP */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { MAXK = 16384, MAXG = 4096 };

static struct {
    uintptr_t fn;
    long calls;
    double s;
} kern[MAXK];
static struct {
    int m, n, k, ta, tb;
    long calls;
    double s;
} gemm[MAXG];
static int nkern, ngemm, depth;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *next(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        fprintf(stderr, "kprof: no %s to wrap\n", name);
        abort();
    }
    return f;
}

typedef void (*ParallelFn)(void (*)(void *), void *, unsigned, unsigned);

void GOMP_parallel(void (*fn)(void *), void *data, unsigned nthreads, unsigned flags);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned nthreads, unsigned flags)
{
    static ParallelFn real;
    if (!real)
        real = (ParallelFn)next("GOMP_parallel");
    if (depth) { /* inside a timed call: counted there */
        real(fn, data, nthreads, flags);
        return;
    }
    depth++;
    double t0 = now_s();
    real(fn, data, nthreads, flags);
    double dt = now_s() - t0;
    depth--;
    int i = 0;
    while (i < nkern && kern[i].fn != (uintptr_t)fn)
        i++;
    if (i == MAXK)
        return;
    if (i == nkern)
        kern[nkern++].fn = (uintptr_t)fn;
    kern[i].calls++;
    kern[i].s += dt;
}

static void count_gemm(int m, int n, int k, int ta, int tb, double dt)
{
    int i = 0;
    while (i < ngemm && !(gemm[i].m == m && gemm[i].n == n && gemm[i].k == k && gemm[i].ta == ta &&
                          gemm[i].tb == tb))
        i++;
    if (i == MAXG)
        return;
    if (i == ngemm) {
        gemm[i].m = m, gemm[i].n = n, gemm[i].k = k, gemm[i].ta = ta, gemm[i].tb = tb;
        ngemm++;
    }
    gemm[i].calls++;
    gemm[i].s += dt;
}

#define GEMM_WRAPPER(NAME, T)                                                                      \
    typedef void (*NAME##_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE,        \
                              blasint, blasint, blasint, T, const T *, blasint, const T *,         \
                              blasint, T, T *, blasint);                                           \
    void NAME(const enum CBLAS_ORDER o, const enum CBLAS_TRANSPOSE ta,                             \
              const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n, const blasint k,    \
              const T alpha, const T *a, const blasint lda, const T *b, const blasint ldb,         \
              const T beta, T *c, const blasint ldc)                                               \
    {                                                                                              \
        static NAME##_fn real;                                                                     \
        if (!real)                                                                                 \
            real = (NAME##_fn)next(#NAME);                                                         \
        depth++;                                                                                   \
        double t0 = now_s();                                                                       \
        real(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);                             \
        double dt = now_s() - t0;                                                                  \
        depth--;                                                                                   \
        count_gemm((int)m, (int)n, (int)k, (int)ta, (int)tb, dt);                                  \
    }

GEMM_WRAPPER(cblas_sgemm, float)
GEMM_WRAPPER(cblas_dgemm, double)

__attribute__((destructor)) static void dump(void)
{
    const char *path = getenv("KPROF_OUT");
    FILE *f = fopen(path ? path : "kprof.txt", "w");
    if (!f)
        return;
    for (int i = 0; i < nkern; i++) {
        Dl_info di;
        uintptr_t off = kern[i].fn;
        if (dladdr((void *)kern[i].fn, &di) && di.dli_fbase)
            off -= (uintptr_t)di.dli_fbase;
        fprintf(f, "K %lx %ld %.6f\n", (unsigned long)off, kern[i].calls, kern[i].s);
    }
    for (int i = 0; i < ngemm; i++)
        fprintf(f, "G %d %d %d %d %d %ld %.6f\n", gemm[i].m, gemm[i].n, gemm[i].k, gemm[i].ta,
                gemm[i].tb, gemm[i].calls, gemm[i].s);
    fclose(f);
}
