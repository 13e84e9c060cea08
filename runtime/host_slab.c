/* host_slab.c: an open Runtime's tensors on the host: where each lies in the
 * slab, whether this device holds it, its value; and on the cuda device the
 * host mirror of the device's slab, kept in step around each step.
 * Reads: the plan's tensor table; on the cuda device, the device's slab into
 * the mirror (rt_cuda_get: the outputs after a step, the whole slab when the
 * host asks for a stale tensor). Writes: on the cuda device, the mirror to the
 * device before a step (rt_cuda_put) and the staleness flags (host_stale,
 * dev_stale, sticky).
 * Key idea: every host-side call (rt_tensor_data, init, inputs, checkpoints,
 * the guard's and the mesh's reads) goes through these few accessors, which
 * need nothing of the executor, the guard or the mesh: they are the leaf the
 * other files of the Runtime stand on. On the cuda device the mirror moves
 * as little as a step allows (docs/runtime.md, "The host mirror"). */
#include "runtime/exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

const char *rt_device_name(const Runtime *rt)
{
    return rt->gpu ? "cuda" : "cpu";
}

int rt_holds(const Runtime *rt, int t)
{
    return rt->nstages <= 1 || plan_stage_holds(rt->p, rt->stage, t);
}

char *rt_host(Runtime *rt, int t)
{
    return rt->dev.slab + rt->p->tensors[t].offset;
}

/* ---- the host mirror (cuda device) ----
 * The host slab mirrors the device's. Before a step the device gets the whole
 * mirror when the host may have written it (dev_stale: after init, a load, any
 * rt_tensor_data), else only the tensors the host writes each step (inputs,
 * step, hyperparameters, coordinates); after a step the host gets the outputs
 * (loss, lr, grad_norm) and knows the rest is stale until the next
 * rt_tensor_data or rt_sync_host downloads the whole slab. */

/* The tensors the host writes before each step. */
static int per_step_tensor(PlanRole r)
{
    return r == PT_INPUT || r == PT_STEP || r == PT_HYPER || r == PT_COORD;
}

/* The host holds the newer value of the tensors it writes before each step
 * (inputs, step, hyperparameters, coordinates) and of the step's outputs (on
 * a pipeline, broadcast into the host copy from their stage). */
static int host_owned(const Plan *p, int t)
{
    return per_step_tensor(p->tensors[t].role) || t == p->loss || t == p->lr || t == p->grad_norm;
}

int rt_sync_host(Runtime *rt, char *err, size_t n)
{
    if (!rt->gpu || !rt->host_stale)
        return 0;
    const Plan *p = rt->p;
    size_t keep = 0;
    for (int t = 0; t < p->ntensors; t++)
        keep += host_owned(p, t) ? p->tensors[t].bytes : 0;
    char *saved = malloc(keep + 1), *at = saved;
    if (!saved)
        return plan_errorf(err, n, "malloc: out of memory");
    for (int t = 0; t < p->ntensors; t++)
        if (host_owned(p, t))
            at = (char *)memcpy(at, rt_host(rt, t), p->tensors[t].bytes) + p->tensors[t].bytes;
    int rc = rt_cuda_get(rt->gpu, rt->dev.slab, 0, rt->dev.slab_bytes, err, n) ||
             rt_cuda_sync(rt->gpu, err, n);
    at = saved;
    for (int t = 0; t < p->ntensors; t++) /* put them back over the device's copies */
        if (host_owned(p, t)) {
            memcpy(rt_host(rt, t), at, p->tensors[t].bytes);
            at += p->tensors[t].bytes;
        }
    free(saved);
    if (rc)
        return -1;
    rt->host_stale = 0;
    return 0;
}

void *rt_tensor_data(Runtime *rt, int tensor)
{
    if (tensor < 0 || tensor >= rt->p->ntensors || !rt_holds(rt, tensor))
        return NULL;
    if (rt->gpu) {
        char msg[400];
        if (rt_sync_host(rt, msg, sizeof msg) && !rt->sticky[0])
            snprintf(rt->sticky, sizeof rt->sticky, "downloading the slab: %s", msg);
        rt->dev_stale = 1;
    }
    return rt_host(rt, tensor);
}

int rt_mirror_upload(Runtime *rt, char *err, size_t n)
{
    const Plan *p = rt->p;
    if (rt->sticky[0])
        return plan_errorf(err, n, "%s", rt->sticky);
    if (rt_cuda_sync(rt->gpu, err, n)) /* idle already, unless the last step failed midway */
        return -1;
    if (rt->dev_stale) {
        if (rt_cuda_put(rt->gpu, rt->dev.slab, 0, rt->dev.slab_bytes, err, n))
            return -1;
        rt->dev_stale = 0;
        return 0;
    }
    for (int t = 0; t < p->ntensors; t++)
        if (per_step_tensor(p->tensors[t].role) &&
            rt_cuda_put(rt->gpu, rt->dev.slab, p->tensors[t].offset, p->tensors[t].bytes, err, n))
            return -1;
    return 0;
}

int rt_mirror_download(Runtime *rt, char *err, size_t n)
{
    const Plan *p = rt->p;
    int outs[] = {p->loss, p->lr, p->grad_norm};
    for (int j = 0; j < 3; j++)
        if (outs[j] >= 0 && rt_cuda_get(rt->gpu, rt->dev.slab, p->tensors[outs[j]].offset,
                                        p->tensors[outs[j]].bytes, err, n))
            return -1;
    if (rt_cuda_sync(rt->gpu, err, n))
        return -1;
    rt->host_stale = 1;
    return 0;
}

double rt_scalar(Runtime *rt, int tensor)
{
    if (tensor < 0 || tensor >= rt->p->ntensors || rt->p->tensors[tensor].rank != 0)
        return NAN;
    const Plan *p = rt->p; /* the outputs are downloaded after each step: no whole-slab sync */
    int out = tensor == p->loss || tensor == p->lr || tensor == p->grad_norm;
    const void *x = out ? rt_host(rt, tensor) : rt_tensor_data(rt, tensor);
    if (!x)
        return NAN;
    switch (rt->p->tensors[tensor].dtype) {
    case PD_F32:
        return *(const float *)x;
    case PD_F64:
        return *(const double *)x;
    default:
        return NAN;
    }
}
