/* exec.c: the executor: open a plan on the CPU device and run its step.
 * Reads: a Plan and the data the caller hands in. Writes: the tensors of the
 * plan in the device's slab.
 * Key idea: everything a step needs is resolved at open time (the kernel
 * functions, the argument pointers of every instruction), so a step is one
 * walk over the instruction list with no allocation and no lookup; on a
 * pipeline the walk skips the instructions of the other stages. */
#include "runtime/exec.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int bind_args(Runtime *rt, char *err, size_t n)
{
    const Plan *p = rt->p;
    size_t total = 0, k = 0;
    for (int i = 0; i < p->ninstrs; i++)
        total += (size_t)p->instrs[i].nargs;
    rt->argv = calloc(total + 1, sizeof *rt->argv);
    rt->args = calloc((size_t)p->ninstrs + 1, sizeof *rt->args);
    if (!rt->argv || !rt->args)
        return plan_errorf(err, n, "calloc: out of memory");
    int nsteps = 0;
    for (int t = 0; t < p->ntensors; t++)
        nsteps += p->tensors[t].role == PT_STEP;
    if (!(rt->steps = calloc((size_t)nsteps + 1, sizeof *rt->steps)))
        return plan_errorf(err, n, "calloc: out of memory");
    for (int t = 0, j = 0; t < p->ntensors; t++)
        if (p->tensors[t].role == PT_STEP)
            rt->steps[j++] = (float *)(rt->dev.slab + p->tensors[t].offset);
    for (int i = 0; i < p->ninstrs; i++) {
        rt->args[i] = rt->argv + k;
        for (int j = 0; j < p->instrs[i].nargs; j++)
            rt->argv[k++] = rt->dev.slab + p->tensors[p->instrs[i].args[j]].offset;
    }
    return 0;
}

Runtime *rt_open(const Plan *p, const char *cache_dir, char *err, size_t n)
{
    return rt_open_linked(p, NULL, cache_dir, err, n);
}

Runtime *rt_open_linked(const Plan *p, RtKernel const *kernels, const char *cache_dir, char *err,
                        size_t n)
{
    char msg[512];
    if (plan_check(p, msg, sizeof msg)) {
        plan_errorf(err, n, "plan \"%s\": %s", p->model ? p->model : "", msg);
        return NULL;
    }
    Runtime *rt = calloc(1, sizeof *rt);
    if (!rt) {
        plan_errorf(err, n, "calloc: out of memory");
        return NULL;
    }
    rt->p = p;
    rt->nstages = plan_stages(p);
    if (rt_cpu_open_linked(&rt->dev, p, kernels, cache_dir, err, n) || bind_args(rt, err, n)) {
        rt_close(rt);
        return NULL;
    }
    return rt;
}

void rt_close(Runtime *rt)
{
    if (!rt)
        return;
    rt_mesh_close(rt);
    rt_cpu_close(&rt->dev);
    free(rt->argv);
    free(rt->steps);
    free(rt->args);
    free(rt);
}

const Plan *rt_plan(const Runtime *rt)
{
    return rt->p;
}

int rt_find_tensor(const Plan *p, const char *name)
{
    for (int i = 0; i < p->ntensors; i++)
        if (p->tensors[i].name && !strcmp(p->tensors[i].name, name))
            return i;
    return -1;
}

void *rt_tensor_data(Runtime *rt, int tensor)
{
    if (tensor < 0 || tensor >= rt->p->ntensors)
        return NULL;
    return rt->dev.slab + rt->p->tensors[tensor].offset;
}

double rt_scalar(Runtime *rt, int tensor)
{
    if (tensor < 0 || tensor >= rt->p->ntensors || rt->p->tensors[tensor].rank != 0)
        return NAN;
    const void *x = rt_tensor_data(rt, tensor);
    switch (rt->p->tensors[tensor].dtype) {
    case PD_F32:
        return *(const float *)x;
    case PD_F64:
        return *(const double *)x;
    default:
        return NAN;
    }
}

/* The first id outside [0, limit), or -1. data may be unaligned. */
static int64_t first_bad_id(const void *data, size_t count, int64_t limit, int32_t *id)
{
    for (size_t i = 0; i < count; i++) {
        memcpy(id, (const char *)data + i * sizeof *id, sizeof *id);
        if (*id < 0 || *id >= limit)
            return (int64_t)i;
    }
    return -1;
}

int rt_set_input(Runtime *rt, const char *name, const void *data, size_t bytes, char *err, size_t n)
{
    const Plan *p = rt->p;
    int t = 0;
    while (t < p->ntensors && (p->tensors[t].role != PT_INPUT || strcmp(p->tensors[t].name, name)))
        t++;
    if (t == p->ntensors)
        return plan_errorf(err, n, "no input named \"%s\" in the plan", name);
    const PlanTensor *pt = &p->tensors[t];
    int64_t gshape[PLAN_MAX_RANK];
    rt_global_shape(p, pt, gshape);
    uint64_t global = plan_dtype_size(pt->dtype), rows = global;
    for (int d = 0; d < pt->rank; d++) {
        global *= (uint64_t)gshape[d];
        rows *= (uint64_t)(d ? gshape[d] : pt->shape[d]);
    }
    if (bytes != global && bytes != rows && rows == global)
        return plan_errorf(err, n, "input \"%s\": %zu bytes given, its %s tensor takes %" PRIu64,
                           name, bytes, plan_dtype_name(pt->dtype), global);
    if (bytes != global && bytes != rows)
        return plan_errorf(err, n, "input \"%s\": %zu bytes given, its %s tensor takes %" PRIu64
                                   " (%" PRIu64 " for this device's rows)",
                           name, bytes, plan_dtype_name(pt->dtype), global, rows);
    if (pt->dtype == PD_I32 && pt->limit > 0) {
        int32_t id;
        int64_t i = first_bad_id(data, bytes / sizeof id, pt->limit, &id);
        if (i >= 0)
            return plan_errorf(err, n, "input \"%s\": element %" PRId64 " is %d, outside [0, %" PRId64 ")",
                        name, i, (int)id, pt->limit);
    }
    if (bytes == pt->bytes) {
        memcpy(rt_tensor_data(rt, t), data, bytes);
        return 0;
    }
    PlanTensor view = *pt; /* rows-local data: the rest of the dims are global */
    if (bytes == rows && bytes != global)
        view.nsplit[0] = 0, view.shape[0] = pt->shape[0];
    rt_block_copy(rt, &view, (void *)data, rt_tensor_data(rt, t), 0);
    return 0;
}

int rt_set_hyper(Runtime *rt, const char *name, double value, char *err, size_t n)
{
    for (int t = 0; t < rt->p->ntensors; t++)
        if (rt->p->tensors[t].role == PT_HYPER && !strcmp(rt->p->tensors[t].name, name)) {
            if (rt->p->tensors[t].dtype == PD_F64)
                *(double *)rt_tensor_data(rt, t) = value;
            else
                *(float *)rt_tensor_data(rt, t) = (float)value;
            return 0;
        }
    return plan_errorf(err, n, "the plan has no hyperparameter \"%s\"", name);
}

/* The instructions of this device's stage in order; only the forward ones
 * (phase 0) when fwd_only. Then the outputs from their stage to every device. */
static int run(Runtime *rt, int64_t step, int fwd_only, char *err, size_t n)
{
    const Plan *p = rt->p;
    char msg[400];
    if (rt->nstages > 1 && !rt->world)
        return plan_errorf(err, n,
                           "the plan has %d pipeline stages, each on its own devices, "
                           "but no mesh was attached (rt_attach)",
                           rt->nstages);
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        if ((fwd_only && in->phase != 0) || in->stage != rt->stage)
            continue;
        switch (in->kind) {
        case PI_KERNEL:
            rt->dev.fns[in->kernel](rt->args[i]);
            break;
        case PI_GEMM:
            if (rt_cpu_gemm(&rt->dev, p, &in->gemm, msg, sizeof msg))
                return plan_errorf(err, n, "step %" PRId64 ", instrs[%d]: %s", step, i, msg);
            break;
        case PI_COPY: /* tensors may alias: memmove */
            memmove(rt->args[i][0], rt->args[i][1], p->tensors[in->args[0]].bytes);
            break;
        case PI_COLL:
            if (rt_mesh_coll(rt, i, msg, sizeof msg))
                return plan_errorf(err, n, "step %" PRId64 ", instrs[%d]: %s", step, i, msg);
            break;
        default:
            return plan_errorf(err, n, "instrs[%d]: unknown kind %d", i, (int)in->kind);
        }
    }
    if (rt_mesh_outputs(rt, msg, sizeof msg))
        return plan_errorf(err, n, "step %" PRId64 ", the outputs: %s", step, msg);
    return 0;
}

int rt_step(Runtime *rt, int64_t step, char *err, size_t n)
{
    for (float **t = rt->steps; *t; t++)
        **t = (float)step;
    return run(rt, step, 0, err, n);
}

int rt_forward(Runtime *rt, char *err, size_t n) { return run(rt, 0, 1, err, n); }
