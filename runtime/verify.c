/* verify.c: the contract check: a plan on a mesh computes the same training
 * step as the plan on one device. Reads two plans of one model (one for the
 * mesh, one for a single device), compiled with each parameter's gradient
 * kept as the state "NAME:grad" (Ctx.keep_grads). Writes a report: per step
 * the two losses; per parameter the largest difference of its step-1
 * gradient, relative to the largest gradient element of the whole model;
 * then per parameter and optimizer state the largest difference after the
 * steps, relative to the largest magnitude of the one-device tensor.
 * Key idea: both runs draw the same parameters and the same inputs (each
 * device takes its block of the same global values), so any difference
 * beyond rounding is a bug of the sharding, the partitioning or the
 * collectives. Gradients are compared before any update: AdamW divides by
 * the gradient's own magnitude, so a parameter whose true gradient is zero
 * (a key bias under softmax) takes lr-sized steps of rounding noise that
 * differ between any two summation orders. Such a parameter (its gradient
 * within the tolerance of zero, at the whole gradient's scale) and its
 * optimizer state are reported but not compared after the update. With a
 * tolerance per value (rt_verify_each: tcc's --verify=native, from the
 * rounding each value's chain of operations carries) only step 1's loss and
 * gradients are judged, each against its own. */
#include "runtime/comm/comm.h"
#include "runtime/exec.h"
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
    char **global;  /* by tensor: the whole value after the steps (params, state), or
                       of a gradient ("NAME:grad") after step 1 */
    uint64_t *bytes; /* by tensor: its whole size */
} Run;

static int keep(const PlanTensor *t) { return t->role == PT_PARAM || t->role == PT_STATE; }

/* A kept gradient: the state "NAME:grad" (no TDL name holds a colon). */
static int is_grad(const PlanTensor *t)
{
    size_t n = strlen(t->name);
    return t->role == PT_STATE && n > 5 && !strcmp(t->name + n - 5, ":grad");
}

/* The bytes of tensor t's whole (global) value. */
static uint64_t whole_bytes(const Plan *p, const PlanTensor *t)
{
    int64_t shape[PLAN_MAX_RANK];
    uint64_t bytes = plan_dtype_size(t->dtype);
    rt_global_shape(p, t, shape);
    for (int d = 0; d < t->rank; d++)
        bytes *= (uint64_t)shape[d];
    return bytes;
}

/* Tensor t's whole value of `bytes` into dst when this rank stores (every
 * rank takes part in the gather; the others throw their copy away). */
static int gather_one(Runtime *rt, int t, int store, char *dst, uint64_t bytes, char *err,
                      size_t n)
{
    char *buf = store ? dst : malloc(bytes + 1);
    int rc = buf ? rt_tensor_global(rt, t, buf, err, n) : plan_errorf(err, n, "out of memory");
    if (!store)
        free(buf);
    return rc;
}

/* Tensors of kind grads (1) or of the rest (0) gathered whole into r; only
 * the rank that stores keeps them. */
static int gather(Runtime *rt, Run *r, int store, int grads, char *err, size_t n)
{
    for (int t = 0; t < r->p->ntensors; t++)
        if (keep(&r->p->tensors[t]) && is_grad(&r->p->tensors[t]) == grads &&
            gather_one(rt, t, store, r->global[t], r->bytes[t], err, n))
            return -1;
    return 0;
}

/* The steps with the gradients of step 1, then the whole params and state. */
static int run_steps(Runtime *rt, Run *r, int store, char *err, size_t n)
{
    for (int s = 1; s <= r->steps; s++) {
        rt_random_inputs(rt, r->seed + (uint64_t)s);
        if (rt_step(rt, s, err, n))
            return -1;
        if (store)
            r->loss[s - 1] = rt_scalar(rt, r->p->loss);
        if (s == 1 && gather(rt, r, store, 1, err, n))
            return -1;
    }
    return gather(rt, r, store, 0, err, n);
}

/* This rank's Runtime of plan p on w (NULL: the one-device reference), its
 * parameters drawn from seed; NULL with the message in err. The ranks share
 * the cores: one OpenMP team each, no oversubscription. */
static Runtime *open_rank(RtWorld *w, const Plan *p, const char *cache, uint64_t seed, char *err,
                          size_t n)
{
    if (w) {
        int per = omp_get_num_procs() / rt_world_size(w);
        omp_set_num_threads(per > 1 ? per : 1);
    }
    Runtime *rt = rt_open(p, cache, err, n);
    if (rt && w && rt_attach(rt, w, err, n)) {
        rt_close(rt);
        return NULL;
    }
    if (rt)
        rt_init_params(rt, seed);
    return rt;
}

/* One rank of the mesh run: rank 0 keeps the losses and whole tensors. */
static int rank_fn(RtWorld *w, void *arg, char *err, size_t n)
{
    Run *r = arg;
    Runtime *rt = open_rank(w, r->p, r->cache, r->seed, err, n);
    if (!rt)
        return -1;
    int rc = run_steps(rt, r, rt_world_rank(w) == 0, err, n);
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
        uint64_t bytes = whole_bytes(p, &p->tensors[t]);
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

/* max |a - b| and max |b| over the tensor; NaN in one and not the other: inf. */
static void tensor_diff(const PlanTensor *t, const char *a, const char *b, int64_t count, double *dmax,
                 double *bmax)
{
    *dmax = *bmax = 0;
    for (int64_t i = 0; i < count; i++) {
        double x = value_at(a, t->dtype, i), y = value_at(b, t->dtype, i);
        *dmax = fmax(*dmax, fabs(x - y));
        *bmax = fmax(*bmax, fabs(y));
        if (isnan(x) != isnan(y)) {
            *dmax = INFINITY;
            return;
        }
    }
}

/* max |a - b|, and the largest |a| or |b| of the elements that differ: an
 * exact constant (a mask's -1e30) on both sides does not hide the rest. */
static void differing_diff(const PlanTensor *t, const char *a, const char *b, int64_t count,
                           double *dmax, double *smax)
{
    *dmax = *smax = 0;
    for (int64_t i = 0; i < count; i++) {
        double x = value_at(a, t->dtype, i), y = value_at(b, t->dtype, i);
        if (isnan(x) != isnan(y)) {
            *dmax = INFINITY;
            return;
        }
        if (x == y || (isnan(x) && isnan(y)))
            continue;
        *dmax = fmax(*dmax, fabs(x - y));
        *smax = fmax(*smax, fmax(fabs(x), fabs(y)));
    }
}

static int64_t count_of(const PlanTensor *t) { return (int64_t)(t->bytes / plan_dtype_size(t->dtype)); }

/* The parameter a state belongs to ("w.m", "w:grad": "w"), in name[n]. */
static void owner(const char *state, char *name, size_t n)
{
    snprintf(name, n, "%s", state);
    char *cut = strrchr(name, ':');
    if (!cut)
        cut = strrchr(name, '.');
    if (cut)
        *cut = 0;
}

/* The judged value with the largest difference for its tolerance. */
typedef struct Worst {
    double d, tol, ratio;
    const char *name;
} Worst;

static void judge_value(Worst *w, double d, double tol, const char *name)
{
    double r = tol > 0 ? d / tol : (d > 0 ? INFINITY : 0);
    if (!(r <= w->ratio) || !w->name)
        *w = (Worst){d, tol, r, name};
}

/* tols: NULL, every value against tol; else a tolerance per tensor of
 * one's plan, and only step 1's loss and gradients are judged. */
static int compare(const Run *mesh, const Run *one, double tol, const double *tols, FILE *report)
{
    const Plan *p = one->p;
    double scale = 0;
    Worst worst = {0, tol, 0, NULL};
    int *mt = calloc((size_t)p->ntensors + 1, sizeof *mt);
    double *gd = calloc((size_t)p->ntensors + 1, sizeof *gd),
           *gb = calloc((size_t)p->ntensors + 1, sizeof *gb);
    int rc = 1;
    if (!mt || !gd || !gb)
        goto done;
    for (int s = 0; s < one->steps; s++) {
        double d = fabs(mesh->loss[s] - one->loss[s]) / fmax(fabs(one->loss[s]), 1e-300);
        double lt = tols && p->loss >= 0 ? tols[p->loss] : tol;
        if (!tols || s == 0)
            judge_value(&worst, d, lt, "loss");
        if (report && tols && s == 0)
            fprintf(report, "step %d: loss %.10g (mesh) %.10g (one device), relative difference "
                            "%.3g, tolerance %.3g\n", s + 1, mesh->loss[s], one->loss[s], d, lt);
        else if (report && tols)
            fprintf(report, "step %d: loss %.10g (mesh) %.10g (one device), relative difference "
                            "%.3g (not judged after an update)\n", s + 1, mesh->loss[s],
                    one->loss[s], d);
        else if (report)
            fprintf(report, "step %d: loss %.10g (mesh) %.10g (one device), relative difference "
                            "%.3g\n", s + 1, mesh->loss[s], one->loss[s], d);
    }
    for (int t = 0; t < p->ntensors; t++) {
        const PlanTensor *pt = &p->tensors[t];
        if (!keep(pt))
            continue;
        if ((mt[t] = rt_find_tensor(mesh->p, pt->name)) < 0) {
            if (report)
                fprintf(report, "%s: missing from the mesh plan\n", pt->name);
            goto done;
        }
        if (is_grad(pt)) {
            tensor_diff(pt, mesh->global[mt[t]], one->global[t], count_of(pt), &gd[t], &gb[t]);
            scale = fmax(scale, gb[t]);
        }
    }
    /* step 1's gradients, each to the scale of the whole gradient */
    for (int t = 0; t < p->ntensors; t++) {
        const PlanTensor *pt = &p->tensors[t];
        if (!keep(pt) || !is_grad(pt))
            continue;
        double d = scale > 0 ? gd[t] / scale : gd[t], gt = tols ? tols[t] : tol;
        judge_value(&worst, d, gt, pt->name);
        if (report && tols)
            fprintf(report, "grad   %-32s max relative difference %.3g (step 1), tolerance %.3g\n",
                    pt->name, d, gt);
        else if (report)
            fprintf(report, "grad   %-32s max relative difference %.3g (step 1)%s\n", pt->name, d,
                    gb[t] <= tol * scale ? ", zero within the tolerance" : "");
    }
    /* after the steps: every parameter and state, but of a parameter whose
     * gradient is zero within the tolerance. In low precision (a plan with
     * kept gradients whose loss is not f64, or tolerances per value) they are
     * printed, not judged: AdamW turns the rounding differences of any
     * near-zero gradient element into lr-sized steps, so the gradients above
     * are the contract there. */
    int ngrads = 0;
    for (int t = 0; t < p->ntensors; t++)
        ngrads += keep(&p->tensors[t]) && is_grad(&p->tensors[t]);
    int judge = !tols && (!ngrads || (p->loss >= 0 && p->tensors[p->loss].dtype == PD_F64));
    for (int t = 0; t < p->ntensors; t++) {
        const PlanTensor *pt = &p->tensors[t];
        if (!keep(pt) || is_grad(pt))
            continue;
        char name[512], gname[520];
        owner(pt->name, name, sizeof name);
        snprintf(gname, sizeof gname, "%s:grad", pt->role == PT_PARAM ? pt->name : name);
        int g = rt_find_tensor(p, gname);
        double d, b;
        tensor_diff(pt, mesh->global[mt[t]], one->global[t], count_of(pt), &d, &b);
        d = b > 0 ? d / b : d;
        if (!judge) {
            if (report)
                fprintf(report, "%-6s %-32s max relative difference %.3g (not judged in this "
                                "precision)\n",
                        pt->role == PT_PARAM ? "param" : "state", pt->name, d);
            continue;
        }
        if (g >= 0 && gb[g] <= tol * scale) {
            if (report)
                fprintf(report, "%-6s %-32s max relative difference %.3g, not compared: its "
                                "gradient is zero within the tolerance (rounding noise that "
                                "the optimizer scales up)\n",
                        pt->role == PT_PARAM ? "param" : "state", pt->name, d);
            continue;
        }
        judge_value(&worst, d, tol, pt->name);
        if (report)
            fprintf(report, "%-6s %-32s max relative difference %.3g\n",
                    pt->role == PT_PARAM ? "param" : "state", pt->name, d);
    }
    int ok = worst.ratio <= 1;
    if (report && tols)
        fprintf(report, "%s: worst relative difference %.3g, tolerance %.3g (%s, %.2f of its "
                        "tolerance)\n",
                ok ? "verified" : "FAILED", worst.d, worst.tol, worst.name ? worst.name : "-",
                worst.ratio);
    else if (report)
        fprintf(report, "%s: worst relative difference %.3g, tolerance %.3g\n",
                ok ? "verified" : "FAILED", worst.d, tol);
    rc = !ok;
done:
    free(mt);
    free(gd);
    free(gb);
    return rc;
}

/* The reference run on one device, then the mesh run on w's ranks (threads
 * when w is NULL); rank 0 compares. */
static int verify(RtWorld *w, const Plan *mesh, const Plan *one, int steps, uint64_t seed,
                  double tol, const double *tols, const char *cache_dir, FILE *report, char *err,
                  size_t n)
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
    Runtime *rt = open_rank(NULL, one, cache_dir, seed, err, n);
    if (!rt) {
        rc = -1;
        goto done;
    }
    rc = run_steps(rt, &b, 1, err, n);
    rt_close(rt);
    if (!rc)
        rc = compare(&a, &b, tol, tols, report);
done:
    free_run(&a);
    free_run(&b);
    return rc;
}

int rt_verify(const Plan *mesh, const Plan *one, int steps, uint64_t seed, double tol,
              const char *cache_dir, FILE *report, char *err, size_t n)
{
    return verify(NULL, mesh, one, steps, seed, tol, NULL, cache_dir, report, err, n);
}

int rt_verify_each(const Plan *mesh, const Plan *one, int steps, uint64_t seed,
                   const double *tols, const char *cache_dir, FILE *report, char *err, size_t n)
{
    return verify(NULL, mesh, one, steps, seed, 0, tols, cache_dir, report, err, n);
}

int rt_verify_world(RtWorld *w, const Plan *mesh, const Plan *one, int steps, uint64_t seed,
                    double tol, const char *cache_dir, FILE *report, char *err, size_t n)
{
    return verify(w, mesh, one, steps, seed, tol, NULL, cache_dir, report, err, n);
}

/* ---- every value of step 1 (rt_verify_values) ---- */

typedef struct Values {
    const Plan *mesh, *one;
    uint64_t seed;
    const char *cache;
    int *pair;   /* by tensor of one: the mesh plan's tensor of the same value, or -1 */
    char **whole; /* by tensor of one: the mesh's whole value after step 1 */
} Values;

static int values_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    Values *v = arg;
    Runtime *rt = open_rank(w, v->mesh, v->cache, v->seed, err, n);
    if (!rt)
        return -1;
    int store = rt_world_rank(w) == 0;
    rt_random_inputs(rt, v->seed + 1);
    int rc = rt_step(rt, 1, err, n);
    for (int t = 0; !rc && t < v->one->ntensors; t++) /* every rank gathers, rank 0 keeps */
        if (v->pair[t] >= 0)
            rc = gather_one(rt, v->pair[t], store, v->whole[t], v->one->tensors[t].bytes, err, n);
    rt_close(rt);
    return rc;
}

int rt_verify_values(const Plan *mesh, const Plan *one, uint64_t seed, const char *cache_dir,
                     double *diff, double *scale, char *err, size_t n)
{
    Values v = {mesh, one, seed, cache_dir, NULL, NULL};
    int rc = -1, nt = one->ntensors;
    v.pair = calloc((size_t)nt + 1, sizeof *v.pair);
    v.whole = calloc((size_t)nt + 1, sizeof *v.whole);
    if (!v.pair || !v.whole) {
        plan_errorf(err, n, "out of memory");
        goto done;
    }
    for (int t = 0; t < nt; t++) {
        const PlanTensor *a = &one->tensors[t];
        diff[t] = scale[t] = -1;
        v.pair[t] = -1;
        for (int m = 0; a->value >= 0 && m < mesh->ntensors && v.pair[t] < 0; m++) {
            const PlanTensor *b = &mesh->tensors[m];
            if (b->value == a->value && b->dtype == a->dtype && whole_bytes(mesh, b) == a->bytes)
                v.pair[t] = m;
        }
        if (v.pair[t] >= 0 && !(v.whole[t] = calloc(1, a->bytes + 1))) {
            plan_errorf(err, n, "out of memory");
            goto done;
        }
    }
    int procs = omp_get_max_threads();
    openblas_set_num_threads(1);
    rc = rt_run_threads((int)plan_mesh_size(mesh), values_rank, &v, err, n);
    openblas_set_num_threads(procs);
    if (rc)
        goto done;
    Runtime *rt = open_rank(NULL, one, cache_dir, seed, err, n);
    if (!rt) {
        rc = -1;
        goto done;
    }
    rt_random_inputs(rt, seed + 1);
    rc = rt_step(rt, 1, err, n);
    for (int t = 0; !rc && t < nt; t++)
        if (v.pair[t] >= 0)
            differing_diff(&one->tensors[t], v.whole[t], rt_tensor_data(rt, t),
                           count_of(&one->tensors[t]), &diff[t], &scale[t]);
    rt_close(rt);
done:
    for (int t = 0; v.whole && t < nt; t++)
        free(v.whole[t]);
    free(v.whole);
    free(v.pair);
    return rc;
}
