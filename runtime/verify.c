/* verify.c: the contract check: a plan on a mesh computes the same training
 * step as the plan on one device. Reads two plans of one model (one for the
 * mesh, one for a single device). Writes a report: per step the two losses,
 * then per parameter and optimizer state the largest difference after the
 * steps, relative to the largest magnitude of the one-device tensor. Key idea:
 * both runs draw the same parameters and the same inputs (each device takes
 * its block of the same global values), so any difference beyond rounding is
 * a bug of the sharding, the partitioning or the collectives. */
#include "runtime/comm/comm.h"
#include "runtime/runtime.h"

#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Run {
    const Plan *p;
    int steps;
    uint64_t seed;
    const char *cache;
    double *loss;   /* by step */
    char **global;  /* by tensor: the whole value after the steps (params, state) */
    uint64_t *bytes; /* by tensor: its whole size */
} Run;

static int keep(const PlanTensor *t) { return t->role == PT_PARAM || t->role == PT_STATE; }

/* The steps, then the whole params and state. Only the rank that stores keeps
 * them (every rank takes part in the gathers). */
static int run_steps(Runtime *rt, Run *r, int store, char *err, size_t n)
{
    for (int s = 1; s <= r->steps; s++) {
        rt_random_inputs(rt, r->seed + (uint64_t)s);
        if (rt_step(rt, s, err, n))
            return -1;
        if (store)
            r->loss[s - 1] = rt_scalar(rt, r->p->loss);
    }
    for (int t = 0; t < r->p->ntensors; t++) {
        if (!keep(&r->p->tensors[t]))
            continue;
        char *buf = store ? r->global[t] : malloc(r->bytes[t] + 1);
        int rc = buf ? rt_tensor_global(rt, t, buf, err, n) : plan_errorf(err, n, "out of memory");
        if (!store)
            free(buf);
        if (rc)
            return -1;
    }
    return 0;
}

/* One rank of the mesh run: rank 0 keeps the losses and whole tensors. */
static int rank_fn(RtWorld *w, void *arg, char *err, size_t n)
{
    Run *r = arg;
    /* the ranks share the cores: one team each, no oversubscription */
    int per = omp_get_num_procs() / rt_world_size(w);
    omp_set_num_threads(per > 1 ? per : 1);
    Runtime *rt = rt_open(r->p, r->cache, err, n);
    if (!rt)
        return -1;
    int rc = rt_attach(rt, w, err, n);
    if (!rc) {
        rt_init_params(rt, r->seed);
        rc = run_steps(rt, r, rt_world_rank(w) == 0, err, n);
    }
    rt_close(rt);
    return rc;
}

static int alloc_run(Run *r, const Plan *p, int steps, uint64_t seed, const char *cache)
{
    memset(r, 0, sizeof *r);
    r->p = p, r->steps = steps, r->seed = seed, r->cache = cache;
    r->loss = calloc((size_t)steps + 1, sizeof *r->loss);
    r->global = calloc((size_t)p->ntensors + 1, sizeof *r->global);
    r->bytes = calloc((size_t)p->ntensors + 1, sizeof *r->bytes);
    if (!r->loss || !r->global || !r->bytes)
        return -1;
    for (int t = 0; t < p->ntensors; t++) {
        if (!keep(&p->tensors[t]))
            continue;
        uint64_t bytes = plan_dtype_size(p->tensors[t].dtype);
        for (int d = 0; d < p->tensors[t].rank; d++) {
            int64_t f = 1;
            for (int j = 0; j < p->tensors[t].nsplit[d]; j++)
                f *= p->axes[p->tensors[t].split[d][j]].size;
            bytes *= (uint64_t)(p->tensors[t].shape[d] * f);
        }
        r->bytes[t] = bytes;
        if (!(r->global[t] = calloc(1, bytes + 1)))
            return -1;
    }
    return 0;
}

static void free_run(Run *r)
{
    for (int t = 0; r->global && t < r->p->ntensors; t++)
        free(r->global[t]);
    free(r->global);
    free(r->bytes);
    free(r->loss);
}

static double value_at(const char *base, PlanDType dt, int64_t i)
{
    if (dt == PD_BF16)
        return rt_bf16_to_f32(((const uint16_t *)base)[i]);
    return dt == PD_F64 ? ((const double *)base)[i] : dt == PD_F32 ? ((const float *)base)[i] : 0;
}

/* max |a - b| / max |b| over the tensor (0 when b is all zero and a equals it). */
static double rel_diff(const PlanTensor *t, const char *a, const char *b, int64_t count)
{
    double dmax = 0, bmax = 0;
    for (int64_t i = 0; i < count; i++) {
        double x = value_at(a, t->dtype, i), y = value_at(b, t->dtype, i);
        dmax = fmax(dmax, fabs(x - y));
        bmax = fmax(bmax, fabs(y));
        if (isnan(x) != isnan(y))
            return INFINITY;
    }
    return bmax > 0 ? dmax / bmax : dmax;
}

static int compare(const Run *mesh, const Run *one, double tol, FILE *report)
{
    const Plan *p = one->p;
    double worst = 0;
    for (int s = 0; s < one->steps; s++) {
        double d = fabs(mesh->loss[s] - one->loss[s]) / fmax(fabs(one->loss[s]), 1e-300);
        worst = fmax(worst, d);
        if (report)
            fprintf(report, "step %d: loss %.10g (mesh) %.10g (one device), relative difference "
                            "%.3g\n", s + 1, mesh->loss[s], one->loss[s], d);
    }
    for (int t = 0; t < p->ntensors; t++) {
        const PlanTensor *pt = &p->tensors[t];
        if (!keep(pt))
            continue;
        int mt = rt_find_tensor(mesh->p, pt->name);
        if (mt < 0) {
            if (report)
                fprintf(report, "%s: missing from the mesh plan\n", pt->name);
            return 1;
        }
        double d = rel_diff(pt, mesh->global[mt], one->global[t],
                            (int64_t)(pt->bytes / plan_dtype_size(pt->dtype)));
        worst = fmax(worst, d);
        if (report)
            fprintf(report, "%-6s %-32s max relative difference %.3g\n",
                    pt->role == PT_PARAM ? "param" : "state", pt->name, d);
    }
    if (report)
        fprintf(report, "%s: worst relative difference %.3g, tolerance %.3g\n",
                worst <= tol ? "verified" : "FAILED", worst, tol);
    return !(worst <= tol);
}

/* The reference run on one device, then the mesh run on w's ranks (threads
 * when w is NULL); rank 0 compares. */
static int verify(RtWorld *w, const Plan *mesh, const Plan *one, int steps, uint64_t seed,
                  double tol, const char *cache_dir, FILE *report, char *err, size_t n)
{
    Run a = {0}, b = {0};
    int rc = -1;
    if (plan_mesh_size(one) != 1) {
        plan_errorf(err, n, "the reference plan runs on %" PRId64 " devices, not one",
                    plan_mesh_size(one));
        return -1;
    }
    if (alloc_run(&a, mesh, steps, seed, cache_dir) || alloc_run(&b, one, steps, seed, cache_dir)) {
        plan_errorf(err, n, "out of memory");
        goto done;
    }
    /* the mesh first: a failing reference on rank 0 then leaves no rank waiting */
    int rank = w ? rt_world_rank(w) : 0;
    int procs = omp_get_max_threads();
    if (!w) /* BLAS inside the rank threads: one thread each */
        openblas_set_num_threads(1);
    rc = w ? rank_fn(w, &a, err, n) : rt_run_threads((int)plan_mesh_size(mesh), rank_fn, &a, err, n);
    if (!w)
        openblas_set_num_threads(procs);
    if (rc || rank != 0)
        goto done;
    Runtime *rt = rt_open(one, cache_dir, err, n);
    if (!rt) {
        rc = -1;
        goto done;
    }
    rt_init_params(rt, seed);
    rc = run_steps(rt, &b, 1, err, n);
    rt_close(rt);
    if (!rc)
        rc = compare(&a, &b, tol, report);
done:
    free_run(&a);
    free_run(&b);
    return rc;
}

int rt_verify(const Plan *mesh, const Plan *one, int steps, uint64_t seed, double tol,
              const char *cache_dir, FILE *report, char *err, size_t n)
{
    return verify(NULL, mesh, one, steps, seed, tol, cache_dir, report, err, n);
}

int rt_verify_world(RtWorld *w, const Plan *mesh, const Plan *one, int steps, uint64_t seed,
                    double tol, const char *cache_dir, FILE *report, char *err, size_t n)
{
    return verify(w, mesh, one, steps, seed, tol, cache_dir, report, err, n);
}
