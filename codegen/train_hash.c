/* train_hash.c: the training run's identity, whatever the mesh: what a
 * checkpoint must match. Reads the train block and the plan's persistent
 * tensors; writes Plan.train_hash.
 * Key idea: only what changes a step's arithmetic goes in, and each
 * persistent tensor by its global shape and in any order, so that every
 * mesh and every cut of one run (microbatches, pipeline schedule, ZeRO,
 * recompute) gives the same hash. */
#include "kgen.h"

#include <stdio.h>
#include <string.h>

/* ---- the training run, whatever the mesh: what a checkpoint must match ---- */

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)data)[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t fnv_text(uint64_t h, const char *s)
{
    return fnv(h, s ? s : "", s ? strlen(s) + 1 : 1);
}

/* A param, state, input or hyperparameter: name, role, dtype, global shape, init. */
static uint64_t tensor_identity(const Graph *g, const PlanTensor *t)
{
    uint64_t h = fnv_text(0xcbf29ce484222325ULL, t->name);
    int64_t v[3 + PLAN_MAX_RANK] = {t->role, t->dtype, t->rank};
    for (int d = 0; d < t->rank; d++) {
        v[3 + d] = t->shape[d] * ir_axes_size(&g->mesh, t->split[d], t->nsplit[d]);
    }
    h = fnv(h, v, sizeof(int64_t) * (size_t)(3 + t->rank));
    return fnv(fnv_text(h, t->init), &t->init_arg, sizeof t->init_arg);
}

/* The model, the train settings that change a step's arithmetic (not how it
 * is cut: microbatches, pipeline schedule, ZeRO, recompute) and the
 * persistent tensors by their global value, in any order: the same for every
 * mesh of one run. "" when the train block does not read. */
void cg_train_hash(Gen *gen, Plan *p)
{
    const TrainConfig tc = gen->tc;
    uint64_t h = fnv_text(0xcbf29ce484222325ULL, p->model), sum = 0;
    double x[] = {
        tc.optimizer, tc.lr,           tc.momentum, tc.beta1,          tc.beta2,
        tc.eps,       tc.weight_decay, tc.schedule, (double)tc.warmup, (double)tc.total_steps,
        tc.min_lr,    tc.grad_clip};
    h = fnv_text(fnv(h, x, sizeof x), tc.precision);
    if (!tc.grad_accumulation_fusion) /* (the default keeps the hashes of runs before it) */
        h = fnv_text(h, "grad_accumulation_fusion = false");
    for (int i = 0; i < p->ntensors; i++) {
        PlanRole r = p->tensors[i].role;
        if (r == PT_PARAM || r == PT_STATE || r == PT_INPUT || r == PT_HYPER)
            sum += tensor_identity(gen->g, &p->tensors[i]);
    }
    h = fnv(h, &sum, sizeof sum);
    snprintf(p->train_hash, sizeof p->train_hash, "%016llx", (unsigned long long)h);
}
