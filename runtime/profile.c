/* profile.c: where a step's time goes, instruction by instruction.
 * Reads: TCC_PROFILE (a file's path) when the runtime opens.
 * Writes: that file, when the runtime closes on world rank 0 (or on the one
 * device): each instruction of its stage that ran, with its mean time per
 * step over the steps after the first, in the plan's order.
 * Key idea: the CPU device runs an instruction to its end before the next
 * starts (collectives too), so a clock read around each call is its time;
 * on the cuda device the runtime waits for the GPU before and after each
 * instruction (exec.c's run_instr), so a time holds its launch and the wait too
 * (some microseconds) and the profiled step runs slower than an unprofiled one;
 * the cost model predicts the same instructions under the same labels
 * (plan_instr_label; bench/cost_cpu.sh puts the two side by side). The
 * first step is left out: it pays for first touches of pages and caches. */
#include "runtime/comm/comm.h"
#include "runtime/exec.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct RtProfile {
    char *path;
    double *sum;   /* by instruction: seconds over the timed steps */
    int64_t first; /* the first step seen (not timed); -1 before any */
    int64_t last;  /* the last step timed */
    int64_t steps; /* steps timed */
};

double rt_profile_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int rt_profile_open(Runtime *rt, RtDeviceKind kind, char *err, size_t n)
{
    const char *path = getenv("TCC_PROFILE");
    if (!path || !*path)
        return 0;
    RtProfile *pf = calloc(1, sizeof *pf);
    if (!pf || !(pf->path = strdup(path)) ||
        !(pf->sum = calloc((size_t)rt->p->ninstrs + 1, sizeof *pf->sum))) {
        if (pf)
            free(pf->path);
        free(pf);
        return plan_errorf(err, n, "TCC_PROFILE: out of memory");
    }
    pf->first = pf->last = -1;
    rt->prof = pf;
    return 0;
}

void rt_profile_add(Runtime *rt, int i, double seconds)
{
    RtProfile *pf = rt->prof;
    if (pf->first < 0)
        pf->first = rt->step_now;
    if (rt->step_now == pf->first)
        return;
    if (rt->step_now != pf->last)
        pf->last = rt->step_now, pf->steps++;
    pf->sum[i] += seconds;
}

static void write_profile(const Runtime *rt, const RtProfile *pf)
{
    const Plan *p = rt->p;
    FILE *f = fopen(pf->path, "w");
    if (!f) {
        fprintf(stderr, "TCC_PROFILE: cannot write '%s'\n", pf->path);
        return;
    }
    char label[160];
    double total = 0;
    fprintf(f,
            "# instruction times: plan \"%s\", %s device, world rank 0, stage %d, %" PRId64
            " step%s timed (the first step left out)%s\n",
            p->model ? p->model : "", rt->gpu ? "cuda" : "cpu", rt->stage, pf->steps,
            pf->steps == 1 ? "" : "s",
            rt->gpu ? "; each waited for, launch and wait included" : "");
    fprintf(f, "# index\tmean_us\tlabel\n");
    for (int i = 0; i < p->ninstrs; i++) {
        if (p->instrs[i].stage != rt->stage)
            continue;
        double us = pf->steps ? pf->sum[i] / (double)pf->steps * 1e6 : 0;
        total += us;
        fprintf(f, "%d\t%.3f\t%s\n", i, us, plan_instr_label(p, i, label, sizeof label));
    }
    fprintf(f, "# total_us\t%.3f\n", total);
    if (fclose(f) != 0)
        fprintf(stderr, "TCC_PROFILE: cannot write '%s'\n", pf->path);
}

void rt_profile_close(Runtime *rt)
{
    RtProfile *pf = rt->prof;
    if (!pf)
        return;
    if ((!rt->world || rt_world_rank(rt->world) == 0) && pf->first >= 0) /* a step ran */
        write_profile(rt, pf);
    free(pf->sum);
    free(pf->path);
    free(pf);
    rt->prof = NULL;
}
