/* pipeline.c: stage partitioning over the pipeline axis. Reads the training
 * step graph, the mesh's pipeline axis (p stages) and the train setting
 * stage_starts; writes every op's stage. Key idea: the units of work are the
 * layers of the repeat blocks, with the ops before the first layer (the
 * embedding) as one more unit in front and the ops after the last (the output
 * layer and the loss) one more at the end; each unit costs the FLOPs of its
 * forward ops (2mnk per matmul, 4 B S^2 H Dh per attention, one per element
 * for the rest). Contiguous units go to stages so that the costliest stage is
 * as cheap as possible (an exact search), unless stage_starts pins the first
 * layer of each stage after the first. A backward op goes where its forward
 * op went (same layer, or same source location outside layers); an optimizer
 * op goes with its parameter. Nothing is sent between stages yet. */
#include "passes.h"

#include <stdio.h>
#include <string.h>

typedef struct PL {
    Ctx *c;
    Graph *g;
    int p, nlayers, nunits;
    int first_layered; /* index of the first forward op inside a layer */
    double *cost;      /* by unit */
    int *start;        /* by stage: its first unit */
} PL;

static double numel(const Value *v)
{
    double n = 1;
    for (int d = 0; d < v->rank; d++)
        n *= (double)v->shape[d];
    return n;
}

static double flops(const Op *op)
{
    if (!op->nres)
        return 0;
    const Value *r = op->res[0];
    if (op->kind == OP_MATMUL) {
        const Value *a = op->args[0];
        return 2 * numel(r) * (double)a->shape[a->rank - 1];
    }
    if (op->kind == OP_ATTENTION) { /* 4 B S^2 (H Dh) */
        const Value *q = op->args[0];
        return 4 * numel(q) * (double)q->shape[1];
    }
    if (op->kind == OP_CROSS_ENTROPY || op->kind == OP_EMBED)
        return 4 * numel(op->args[0]);
    return numel(r);
}

/* The unit of a forward op: 0 before the layers, 1 + layer, or the last. */
static int fwd_unit(const PL *l, const Op *op, int index)
{
    if (op->layer >= 0)
        return 1 + op->layer;
    return index < l->first_layered ? 0 : l->nunits - 1;
}

static int count_layers(PL *l)
{
    l->first_layered = l->g->ops.len;
    for (int i = 0; i < l->g->ops.len; i++) {
        const Op *op = l->g->ops.data[i];
        if (op->layer + 1 > l->nlayers)
            l->nlayers = op->layer + 1;
        if (op->layer >= 0 && op->phase == PH_FWD && op->kind != OP_PARAM && i < l->first_layered)
            l->first_layered = i;
    }
    l->nunits = l->nlayers + 2;
    return l->nlayers;
}

/* The cut of the units into p non-empty contiguous runs whose costliest run
 * is cheapest: best[k][u] over the first u units in k runs (dynamic
 * programming, O(p U^2)); the earliest cut among equals, so it is stable. */
static void balance(PL *l)
{
    int U = l->nunits, P = l->p;
    double *best = arena_alloc(l->g->arena, sizeof(double) * (size_t)((P + 1) * (U + 1)));
    int *cut = arena_alloc(l->g->arena, sizeof(int) * (size_t)((P + 1) * (U + 1)));
    double *pre = arena_alloc(l->g->arena, sizeof(double) * (size_t)(U + 1));
    pre[0] = 0;
    for (int u = 0; u < U; u++)
        pre[u + 1] = pre[u] + l->cost[u];
    for (int u = 0; u <= U; u++)
        best[u] = u ? 1e300 : 0, cut[u] = 0;
    for (int k = 1; k <= P; k++)
        for (int u = 0; u <= U; u++) {
            double b = 1e300;
            int at = 0;
            for (int j = k - 1; j < u; j++) { /* the last run is units [j, u) */
                double run = pre[u] - pre[j], prev = best[(k - 1) * (U + 1) + j];
                double m = run > prev ? run : prev;
                if (m < b)
                    b = m, at = j;
            }
            best[k * (U + 1) + u] = b;
            cut[k * (U + 1) + u] = at;
        }
    for (int k = P, u = U; k >= 1; k--) {
        l->start[k - 1] = cut[k * (U + 1) + u];
        u = l->start[k - 1];
    }
}

static int pinned(PL *l, const TrainConfig *tc)
{
    for (int i = 0; i < l->g->train.len; i++) {
        const Attr *a = l->g->train.data[i];
        if (!a->key || strcmp(a->key, "stage_starts") != 0)
            continue;
        if (a->kind != ATTR_LIST || a->nitems != l->p - 1) {
            diag_error(&l->c->diag, LOC_NONE,
                       "stage_starts needs %d first layers (one per stage after the first)",
                       l->p - 1);
            return -1;
        }
        l->start[0] = 0;
        for (int s = 1; s < l->p; s++) {
            int64_t layer = a->items[s - 1]->i;
            if (a->items[s - 1]->kind != ATTR_INT || layer < 0 || layer >= l->nlayers ||
                (s > 1 && 1 + layer <= l->start[s - 1]))
                return diag_error(&l->c->diag, LOC_NONE,
                                  "stage_starts: %lld is not a layer after the previous start "
                                  "(the model has layers 0..%d)",
                                  (long long)layer, l->nlayers - 1),
                       -1;
            l->start[s] = 1 + (int)layer;
        }
        return 1;
    }
    (void)tc;
    return 0;
}

static int stage_of(const PL *l, int unit)
{
    int s = 0;
    while (s + 1 < l->p && l->start[s + 1] <= unit)
        s++;
    return s;
}

/* Backward ops: their forward op's unit (layer, or the source location). */
static void assign(PL *l)
{
    Graph *g = l->g;
    int *unit_of_param = arena_alloc(g->arena, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->values.len; i++)
        unit_of_param[i] = -1;
    for (int i = 0; i < g->ops.len; i++) {
        Op *op = g->ops.data[i];
        int unit = l->nunits - 1;
        if (op->phase == PH_FWD && op->kind != OP_PARAM && op->kind != OP_INPUT) {
            unit = fwd_unit(l, op, i);
            for (int a = 0; a < op->nargs; a++)
                if (op->args[a]->def && op->args[a]->def->kind == OP_PARAM &&
                    unit_of_param[op->args[a]->id] < 0)
                    unit_of_param[op->args[a]->id] = unit;
        } else if (op->layer >= 0) {
            unit = 1 + op->layer;
        } else if (op->phase == PH_BWD) {
            for (int j = 0; j < i; j++) { /* the forward op at the same place */
                const Op *f = g->ops.data[j];
                if (f->phase == PH_FWD && f->loc.line == op->loc.line &&
                    f->loc.col == op->loc.col && f->kind != OP_PARAM) {
                    unit = fwd_unit(l, f, j);
                    break;
                }
            }
        } else if (op->phase == PH_OPT && op->nargs && op->args[0]->def &&
                   op->args[0]->def->kind == OP_PARAM && unit_of_param[op->args[0]->id] >= 0) {
            unit = unit_of_param[op->args[0]->id];
        }
        op->stage = stage_of(l, unit);
    }
    for (int i = 0; i < g->ops.len; i++) { /* params and inputs: with their first reader */
        Op *op = g->ops.data[i];
        if (op->kind == OP_PARAM && unit_of_param[op->res[0]->id] >= 0)
            op->stage = stage_of(l, unit_of_param[op->res[0]->id]);
        else if (op->kind == OP_PARAM || op->kind == OP_INPUT)
            op->stage = 0;
    }
}

int pass_pipeline(Ctx *c, Graph *g)
{
    PL l = {c, g, 1, 0, 0, 0, NULL, NULL};
    Loc at = LOC_NONE;
    for (int i = 0; i < g->mesh.naxes; i++)
        if (g->mesh.axes[i].role == ROLE_PIPELINE)
            l.p *= g->mesh.axes[i].size, at = g->mesh.axes[i].loc;
    if (l.p == 1)
        return 0;
    TrainConfig tc;
    char err[256];
    if (ir_train_config(g, &tc, err, sizeof err) != 0)
        return diag_error(&c->diag, LOC_NONE, "%s", err), -1;
    count_layers(&l);
    if (l.nunits < l.p)
        return diag_error(&c->diag, at,
                          "the pipeline has %d stages, but the model has only %d layers (and "
                          "the embedding and the loss as one unit each): at most %d stages",
                          l.p, l.nlayers, l.nunits),
               -1;
    l.cost = arena_alloc(g->arena, sizeof(double) * (size_t)l.nunits);
    memset(l.cost, 0, sizeof(double) * (size_t)l.nunits);
    l.start = arena_alloc(g->arena, sizeof(int) * (size_t)l.p);
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->phase == PH_FWD && op->kind != OP_PARAM && op->kind != OP_INPUT)
            l.cost[fwd_unit(&l, op, i)] += flops(op);
    }
    int pin = pinned(&l, &tc);
    if (pin < 0)
        return -1;
    if (!pin)
        balance(&l);
    assign(&l);
    return 0;
}
