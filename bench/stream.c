/* stream.c: the machine's memory bandwidth as a kernel of tcc's sees it: a
 * triad a[i] = b[i] + s c[i] over f32 arrays far larger than the caches, as
 * one OpenMP parallel loop on every thread (the generated kernels' form);
 * 12 bytes an element. Prints the best of 10 trials in GB/s.
 *   cc -O3 -march=native -fopenmp -o stream bench/stream.c
 *   ./stream [MiB per array, default 256] */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int64_t n = (argc > 1 ? atoll(argv[1]) : 256) * (1 << 20) / 4;
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n),
          *c = malloc(sizeof(float) * (size_t)n);
    if (!a || !b || !c || n <= 0)
        return fprintf(stderr, "stream: out of memory\n"), 1;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        a[i] = 0, b[i] = (float)i, c[i] = 1.0f; /* pages placed by the threads that use them */
    double best = 0;
    for (int t = 0; t < 10; t++) {
        double t0 = now_s();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            a[i] = b[i] + 3.0f * c[i];
        double gbs = 12.0 * (double)n / (now_s() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    printf("stream triad: %.1f GB/s on %d threads (%.0f MiB arrays, check %g)\n", best,
           omp_get_max_threads(), (double)n * 4 / 1048576, (double)a[n / 2]);
    free(a), free(b), free(c);
    return 0;
}
