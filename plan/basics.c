/* basics.c: the leaf of the plan format: the JSON names of its enums, the
 * sizes of dtypes, an instruction in a few words, the mesh's devices and
 * pipeline stages, which slab a stage has and which tensors it holds, the
 * error convention (plan_errorf), and the tensors an instruction touches.
 * Reads: a Plan (or one of its parts) in memory. Writes: nothing but the
 * caller's buffers.
 * Key idea: every other file of plan/ and the runtime ask these questions the
 * same way, so a stage or a name means one thing in the checker, the writer,
 * the loader and the executors. Needs nothing of plan/ but its headers;
 * depends on libc only. */
#include "plan/plan_impl.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *const plan_dtype_names[PD_COUNT] = {"f32", "f64", "bf16", "f16", "i32"};
static const size_t dtype_sizes[PD_COUNT] = {4, 8, 2, 2, 4};
const char *const plan_role_names[PT_COUNT] = {"param", "state", "input", "step",
                                               "hyper", "temp",  "coord"};
const char *const plan_kind_names[PI_COUNT] = {"kernel", "gemm", "copy", "collective"};
const char *const plan_coll_names[PC_COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
                                               "all_to_all", "slice",      "all_reduce_max",
                                               "send",       "recv"};

size_t plan_dtype_size(PlanDType t)
{
    return (unsigned)t < PD_COUNT ? dtype_sizes[t] : 0;
}

const char *plan_dtype_name(PlanDType t)
{
    return (unsigned)t < PD_COUNT ? plan_dtype_names[t] : "?";
}

const char *plan_coll_name(PlanCollKind k)
{
    return (unsigned)k < PC_COUNT ? plan_coll_names[k] : "?";
}

const char *plan_instr_label(const Plan *p, int i, char *buf, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    const PlanGemm *g = &in->gemm;
    if (!n)
        return buf;
    switch (in->kind) {
    case PI_KERNEL: snprintf(buf, n, "kernel %s", p->kernels[in->kernel].name); break;
    case PI_GEMM:
        if (g->batch > 1)
            snprintf(buf, n, "gemm %" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64 " %s", g->m, g->n,
                     g->k, g->batch, plan_dtype_name(p->tensors[g->a].dtype));
        else
            snprintf(buf, n, "gemm %" PRId64 "x%" PRId64 "x%" PRId64 " %s", g->m, g->n, g->k,
                     plan_dtype_name(p->tensors[g->a].dtype));
        break;
    case PI_COPY: snprintf(buf, n, "copy"); break;
    case PI_COLL: snprintf(buf, n, "%s", plan_coll_name(in->coll.op)); break;
    default: snprintf(buf, n, "kind %d", (int)in->kind); break;
    }
    return buf;
}

int64_t plan_mesh_size(const Plan *p)
{
    int64_t n = 1;
    for (int i = 0; p->axes && i < p->naxes; i++)
        n *= p->axes[i].size;
    return n;
}

int64_t plan_axis_stride(const Plan *p, int a)
{
    if (p->axes[a].stride > 0)
        return p->axes[a].stride;
    int64_t s = 1;
    for (int j = a + 1; j < p->naxes; j++)
        s *= p->axes[j].size;
    return s;
}

void plan_axes_by_stride(const Plan *p, int *order)
{
    for (int i = 0; i < p->naxes; i++) { /* an insertion sort */
        int64_t si = plan_axis_stride(p, i);
        int j = i;
        for (; j > 0; j--) {
            int64_t sb = plan_axis_stride(p, order[j - 1]);
            if (sb < si || (sb == si && (p->axes[order[j - 1]].size == 1 || p->axes[i].size > 1)))
                break;
            order[j] = order[j - 1];
        }
        order[j] = i;
    }
}

void plan_coords(const Plan *p, int64_t rank, int *coord)
{
    for (int a = 0; a < p->naxes; a++)
        coord[a] = (int)(rank / plan_axis_stride(p, a) % p->axes[a].size);
}

int64_t plan_rank(const Plan *p, const int *coord)
{
    int64_t r = 0;
    for (int a = 0; a < p->naxes; a++)
        r += coord[a] * plan_axis_stride(p, a);
    return r;
}

int64_t plan_axes_size(const Plan *p, const int8_t *axes, int naxes)
{
    int64_t n = 1;
    for (int i = 0; i < naxes; i++)
        n *= p->axes[axes[i]].size;
    return n;
}

int plan_stages(const Plan *p)
{
    int64_t n = 1;
    for (int i = 0; p->axes && i < p->naxes; i++)
        if (plan_is_pipeline(&p->axes[i]) && p->axes[i].size > 1)
            n = n > INT_MAX / p->axes[i].size ? INT_MAX : n * p->axes[i].size;
    return (int)n;
}

uint64_t plan_stage_slab(const Plan *p, int stage)
{
    int stages = plan_stages(p);
    if (!p->stage_slab_bytes)
        return p->slab_bytes;
    if (stage >= 0)
        return stage < stages ? p->stage_slab_bytes[stage] : 0;
    uint64_t least = p->slab_bytes;
    for (int s = 0; s < stages; s++)
        least = p->stage_slab_bytes[s] < least ? p->stage_slab_bytes[s] : least;
    return least;
}

int plan_stage_holds(const Plan *p, int stage, int t)
{
    int st = p->tensors[t].stage;
    return st < 0 || st == stage || t == p->loss || t == p->lr || t == p->grad_norm;
}

const char *plan_role_name(PlanRole r)
{
    return (unsigned)r < PT_COUNT ? plan_role_names[r] : "?";
}

const char *plan_shown(char *b, const char *s)
{
    size_t i = 0;
    for (s = plan_str_or_empty(s); *s && i < 40; s++)
        b[i++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    strcpy(b + i, *s ? "..." : "");
    return b;
}

/* Writes the message into err (if it has room) and returns -1. */
int plan_errorf(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    if (err && n) {
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int plan_is_keys(const PlanTensor *t)
{
    return t->role == PT_INPUT && t->init && !strcmp(t->init, "keys") && t->dtype == PD_I32 &&
           t->rank == 1;
}

int plan_instr_ntensors(const PlanInstr *in)
{
    return in->nargs + (in->kind != PI_GEMM ? 0 : in->gemm.epilogue == PE_BIAS ? 4 : 3);
}

int plan_instr_tensor(const PlanInstr *in, int j)
{
    if (j < in->nargs)
        return in->args[j];
    const int g[4] = {in->gemm.a, in->gemm.b, in->gemm.c, in->gemm.bias};
    return g[j - in->nargs];
}
