/* agree.c: what the training loop's agreements between ranks cost: the
 * all-reduce (max) of a few int32 over every rank that a step of a mesh
 * program makes twice (runtime/train.c: after the gradient norm, whether the
 * loss and the norm are finite; after the step, a failure or a stop signal).
 * Reads: nothing. Writes: one line per payload on stdout, from rank 0:
 * the mean microseconds per call over ITERS calls after ITERS / 10 warm-ups.
 * Key idea: the same calls the loop makes (rt_comm_all_reduce_max over the
 * group of every rank), on the threads backend (RANKS threads) or, under
 * mpirun, the mpi backend: ./agree [ITERS [RANKS]]. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/comm/comm.h"
#include "runtime/runtime.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Mean seconds of one all-reduce max of count int32 over c. */
static double time_calls(RtComm *c, int count, long iters, char *err, size_t n)
{
    int32_t v[4] = {0};
    for (long i = 0; i < iters / 10; i++)
        if (rt_comm_all_reduce_max(c, v, (size_t)count, PD_I32, err, n))
            return -1;
    double t0 = now_s();
    for (long i = 0; i < iters; i++)
        if (rt_comm_all_reduce_max(c, v, (size_t)count, PD_I32, err, n))
            return -1;
    return (now_s() - t0) / (double)iters;
}

static int rank_main(RtWorld *w, void *arg, char *err, size_t n)
{
    long iters = *(const long *)arg;
    RtComm *all = rt_comm_split(w, 0, rt_world_rank(w), err, n);
    if (!all)
        return -1;
    int counts[] = {2, 3};
    for (int k = 0; k < 2; k++) {
        double s = time_calls(all, counts[k], iters, err, n);
        if (s < 0) {
            rt_comm_free(all);
            return -1;
        }
        if (rt_world_rank(w) == 0)
            printf("agree: %d ranks (%s), all-reduce max of %d int32: %.2f us per call\n",
                   rt_world_size(w), rt_world_backend(w), counts[k], s * 1e6);
    }
    rt_comm_free(all);
    return 0;
}

int main(int argc, char **argv)
{
    char err[512];
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    int ranks = argc > 2 ? atoi(argv[2]) : 4;
    if (rt_mpi_launched()) {
        RtWorld *w = rt_world_mpi(err, sizeof err);
        int rc = w ? rank_main(w, &iters, err, sizeof err) : -1;
        if (rc)
            fprintf(stderr, "agree: %s\n", err);
        rt_world_close(w);
        return rc ? 1 : 0;
    }
    if (rt_run_threads(ranks, rank_main, &iters, err, sizeof err)) {
        fprintf(stderr, "agree: %s\n", err);
        return 1;
    }
    return 0;
}
