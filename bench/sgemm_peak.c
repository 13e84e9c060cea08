/* sgemm_peak.c: the single-precision GEMM rate OpenBLAS reaches on this machine,
 * the yardstick for bench/cpu_train.sh. Times C = A B for n x n row-major
 * matrices with cblas_sgemm: one untimed call, then the best of `trials`
 * trials of `reps` calls each. Prints the OpenBLAS core, config and thread
 * count, then one line "sgemm n=N: X GFLOP/s (best of T x R)". The rate counts
 * 2 n^3 flops per product.
 *   cc -O2 -o sgemm_peak bench/sgemm_peak.c -lopenblas
 *   ./sgemm_peak [n [reps [trials]]]        (defaults 2048 4 3) */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* openblas_config.h declares these in most packagings; declared again in case. */
char *openblas_get_corename(void);
char *openblas_get_config(void);
int openblas_get_num_threads(void);

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int arg(int argc, char **argv, int i, int def)
{
    if (argc <= i)
        return def;
    int v = atoi(argv[i]);
    if (v < 1) {
        fprintf(stderr, "sgemm_peak: expected a positive integer, got '%s'\n", argv[i]);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    int n = arg(argc, argv, 1, 2048), reps = arg(argc, argv, 2, 4), trials = arg(argc, argv, 3, 3);
    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "sgemm_peak: out of memory for n=%d\n", n);
        return 1;
    }
    unsigned s = 12345;
    for (size_t i = 0; i < nn; i++) {
        s = s * 1103515245u + 12345u;
        a[i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
        s = s * 1103515245u + 12345u;
        b[i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
        c[i] = 0;
    }
    printf("openblas core: %s\n", openblas_get_corename());
    printf("openblas config: %s\n", openblas_get_config());
    printf("openblas threads: %d\n", openblas_get_num_threads());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 1e300;
    for (int t = 0; t < trials; t++) {
        double t0 = now_s();
        for (int r = 0; r < reps; r++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                        c, n);
        double dt = (now_s() - t0) / reps;
        if (dt < best)
            best = dt;
    }
    double gflops = 2.0 * (double)n * (double)n * (double)n / best / 1e9;
    /* A checksum keeps the products from being optimised away and spots garbage. */
    double sum = 0;
    for (size_t i = 0; i < nn; i += 4099)
        sum += c[i];
    printf("sgemm n=%d: %.1f GFLOP/s (best of %d x %d, %.1f ms each; checksum %.4g)\n", n, gflops,
           trials, reps, best * 1e3, sum);
    free(a);
    free(b);
    free(c);
    return 0;
}
