/* pipeline.c: stage partitioning over the pipeline axis. Reads the training
 * step graph, the mesh's pipeline axis (p stages) and the train setting
 * stage_starts; writes every op's stage. Key idea: the units of work are the
 * layers of the repeat blocks, with the ops before the first layer (the
 * embedding) as one more unit in front and the ops after the last (the output
 * layer and the loss) one more at the end (an op between two layers joins the
 * one before); each unit costs the FLOPs of its
 * forward ops (2mnk per matmul, 4 B S^2 H Dh per attention, one per element
 * for the rest). Contiguous units go to stages so that the costliest stage is
 * as cheap as possible (an exact search), unless stage_starts pins the first
 * layer of each stage after the first. A backward op goes where its forward
 * op went (same layer, or same source location outside layers); an optimizer
 * op goes with its parameter; a recompute op goes with its layer, like the
 * backward. Nothing is sent between stages yet. */
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct PL {
    Ctx *c;
    Graph *g;
    Loc at;            /* the pipeline axis, for messages */
    int p, v, P, m;    /* ranks, chunks per rank, P = p v virtual stages, microbatches */
    int nlayers, nunits;
    int *unit;         /* by op id: the unit of a forward op, -1 for the rest */
    int *vs;           /* by op id: its virtual stage (stage = vs % p, chunk = vs / p) */
    double *cost;      /* by unit */
    int *start;        /* by virtual stage: its first unit */
    double *vcost;     /* by virtual stage: the forward FLOPs of one microbatch */
} PL;

static int is_source(const Op *op)
{
    return op->kind == OP_PARAM || op->kind == OP_INPUT || op->kind == OP_STATE ||
           op->kind == OP_STEP;
}

static int is_fwd(const Op *op) { return op->phase == PH_FWD && !is_source(op); }

/* By op id: the layer of the last forward op in a layer before it, of its
 * microbatch, when one comes after it too (an op between two repeats); else -1. */
static int *between_layers(PL *l)
{
    Graph *g = l->g;
    int n = g->ops.len, *at = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1));
    int *cur = arena_alloc(g->arena, sizeof(int) * (size_t)(l->m + 1));
    for (int j = 0; j <= l->m; j++)
        cur[j] = -1;
    for (int i = 0; i < n; i++) { /* forwards: the last layer so far */
        const Op *op = g->ops.data[i];
        int mb = op->mb >= 0 && op->mb < l->m ? op->mb : l->m;
        if (is_fwd(op) && op->layer >= 0)
            cur[mb] = op->layer;
        at[i] = cur[mb];
    }
    for (int j = 0; j <= l->m; j++)
        cur[j] = 0;
    for (int i = n - 1; i >= 0; i--) { /* backwards: is a layer still to come? */
        const Op *op = g->ops.data[i];
        int mb = op->mb >= 0 && op->mb < l->m ? op->mb : l->m;
        if (!cur[mb])
            at[i] = -1;
        cur[mb] |= is_fwd(op) && op->layer >= 0;
    }
    return at;
}

/* Every forward op's unit: 1 + its layer inside a layer; before the layers of
 * its microbatch 0 (the embedding), between two layers the earlier one's, after
 * them the last unit (the output layer and the loss); an op shared by the
 * microbatches (reading only parameters), or reading only the inputs (a
 * microbatch's rows of the targets), goes with its first reader. */
static void forward_units(PL *l)
{
    Graph *g = l->g;
    int n = g->ops.len;
    int *first = arena_alloc(g->arena, sizeof(int) * (size_t)(l->m + 1));
    int *reader = arena_alloc(g->arena, sizeof(int) * (size_t)(g->values.len + 1));
    l->unit = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1));
    for (int j = 0; j <= l->m; j++)
        first[j] = n;
    char *data = arena_alloc(g->arena, (size_t)g->values.len + 1); /* computed from inputs only */
    for (int i = 0; i < g->values.len; i++)
        reader[i] = -1, data[i] = 0;
    for (int i = 0; i < n; i++) {
        const Op *op = g->ops.data[i];
        int d = op->kind == OP_INPUT || (op->nargs > 0 && !is_source(op));
        for (int a = 0; a < op->nargs; a++)
            d &= data[op->args[a]->id];
        for (int r = 0; r < op->nres; r++)
            data[op->res[r]->id] = (char)d;
        l->unit[i] = -1;
        if (op->layer + 1 > l->nlayers)
            l->nlayers = op->layer + 1;
        int mb = op->mb >= 0 && op->mb < l->m ? op->mb : l->m;
        if (is_fwd(op) && op->layer >= 0 && i < first[mb])
            first[mb] = i;
    }
    l->nunits = l->nlayers + 2;
    int *between = between_layers(l);
    for (int i = n - 1; i >= 0; i--) {
        const Op *op = g->ops.data[i];
        if (!is_fwd(op))
            continue;
        int u;
        if (op->layer >= 0)
            u = 1 + op->layer;
        else if (op->mb >= 0 && op->mb < l->m && !(op->nres && data[op->res[0]->id]))
            u = i < first[op->mb] ? 0 : between[i] >= 0 ? 1 + between[i] : l->nunits - 1;
        else
            u = op->nres && reader[op->res[0]->id] >= 0 ? reader[op->res[0]->id] : l->nunits - 1;
        l->unit[i] = u;
        for (int a = 0; a < op->nargs; a++)
            reader[op->args[a]->id] = u; /* backwards: the first reader wins */
    }
}

/* The cut of the units into p non-empty contiguous runs whose costliest run
 * is cheapest: best[k][u] over the first u units in k runs (dynamic
 * programming, O(p U^2)); the earliest cut among equals, so it is stable. */
static void balance(PL *l)
{
    int U = l->nunits, P = l->P;
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

static int pinned(PL *l, const Attr *a)
{
    if (a) {
        if (a->kind != ATTR_LIST || a->nitems != l->P - 1) {
            diag_error(&l->c->diag, l->at,
                       "stage_starts needs %d first layers (one per stage after the first)",
                       l->P - 1);
            return -1;
        }
        l->start[0] = 0;
        for (int s = 1; s < l->P; s++) {
            int64_t layer = a->items[s - 1]->i;
            if (a->items[s - 1]->kind != ATTR_INT || layer < 0 || layer >= l->nlayers ||
                (s > 1 && 1 + layer <= l->start[s - 1]))
                return diag_error(&l->c->diag, l->at,
                                  "stage_starts: %lld is not a layer after the previous start "
                                  "(the model has layers 0..%d)",
                                  (long long)layer, l->nlayers - 1),
                       -1;
            l->start[s] = 1 + (int)layer;
        }
        return 1;
    }
    return 0;
}

static int stage_of(const PL *l, int unit)
{
    int s = 0;
    while (s + 1 < l->P && l->start[s + 1] <= unit)
        s++;
    return s;
}

/* A small map from a source location to the unit of the first forward op
 * there: a backward op outside the layers goes where its forward op went. */
typedef struct LocMap {
    int cap;
    int *line, *col, *unit;
} LocMap;

static int *loc_slot(LocMap *m, Loc loc)
{
    unsigned h = ((unsigned)loc.line * 2654435761u) ^ (unsigned)loc.col * 40503u;
    for (int i = (int)(h & (unsigned)(m->cap - 1));; i = (i + 1) & (m->cap - 1))
        if (m->line[i] < 0 || (m->line[i] == loc.line && m->col[i] == loc.col)) {
            m->line[i] = loc.line, m->col[i] = loc.col;
            return &m->unit[i];
        }
}

static void loc_map(PL *l, LocMap *m)
{
    Graph *g = l->g;
    m->cap = 16;
    while (m->cap < 2 * g->ops.len + 2)
        m->cap *= 2;
    m->line = arena_alloc(g->arena, sizeof(int) * (size_t)m->cap);
    m->col = arena_alloc(g->arena, sizeof(int) * (size_t)m->cap);
    m->unit = arena_alloc(g->arena, sizeof(int) * (size_t)m->cap);
    for (int i = 0; i < m->cap; i++)
        m->line[i] = -1, m->unit[i] = -1;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (l->unit[i] >= 0 && op->loc.line > 0) {
            int *u = loc_slot(m, op->loc);
            if (*u < 0)
                *u = l->unit[i];
        }
    }
}

/* Every op's virtual stage. Forward ops: their unit's. Backward and recompute
 * ops: their layer's, or their forward op's (same location). Optimizer ops: their
 * layer's, their parameter's, or that of their largest operand. Sources and
 * what is still unplaced (constants): with their first reader. */
static void assign(PL *l)
{
    Graph *g = l->g;
    int n = g->ops.len;
    LocMap lm;
    loc_map(l, &lm);
    l->vs = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1));
    int *reader = arena_alloc(g->arena, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->values.len; i++)
        reader[i] = -1;
    for (int i = n - 1; i >= 0; i--) { /* parameters: their first forward reader's */
        const Op *op = g->ops.data[i];
        for (int a = 0; l->unit[i] >= 0 && a < op->nargs; a++)
            reader[op->args[a]->id] = stage_of(l, l->unit[i]);
    }
    for (int i = 0; i < n; i++) {
        Op *op = g->ops.data[i];
        int vs = -1;
        if (l->unit[i] >= 0)
            vs = stage_of(l, l->unit[i]);
        else if (op->kind == OP_PARAM)
            vs = reader[op->res[0]->id];
        else if (is_source(op))
            vs = -1;
        else if (op->layer >= 0)
            vs = stage_of(l, 1 + op->layer);
        else if (op->phase != PH_OPT && op->loc.line > 0 && *loc_slot(&lm, op->loc) >= 0)
            vs = stage_of(l, *loc_slot(&lm, op->loc));
        else {
            double big = -1;
            for (int a = 0; a < op->nargs; a++) {
                const Op *d = op->args[a]->def;
                int dvs = d ? l->vs[d->id] : -1;
                if (d && d->kind == OP_PARAM) {
                    vs = dvs;
                    break;
                }
                if (dvs >= 0 && ir_numel(op->args[a]) > big)
                    big = ir_numel(op->args[a]), vs = dvs;
            }
        }
        l->vs[i] = vs;
    }
    for (int i = 0; i < g->values.len; i++)
        reader[i] = -1;
    for (int i = n - 1; i >= 0; i--) { /* the rest: with their first reader */
        Op *op = g->ops.data[i];
        if (l->vs[i] < 0 && op->nres && reader[op->res[0]->id] >= 0)
            l->vs[i] = reader[op->res[0]->id];
        if (l->vs[i] < 0)
            l->vs[i] = 0;
        for (int a = 0; a < op->nargs; a++)
            reader[op->args[a]->id] = l->vs[i];
        op->stage = l->vs[i] % l->p;
    }
}

/* ---- the schedule: every op's tick ---- */

static double piece_cost(const Piece *pc, int rank, void *user)
{
    const PL *l = user;
    double f = l->vcost[pc->chunk * l->p + rank];
    f = f > 0 ? f : 1;
    return pc->kind == PIECE_F ? f : pc->kind == PIECE_W ? f : 2 * f;
}

typedef struct Start {
    double t;
    int rank, i;
} Start;

static int by_start(const void *x, const void *y)
{
    const Start *a = x, *b = y;
    if (a->t != b->t)
        return a->t < b->t ? -1 : 1;
    return a->rank != b->rank ? a->rank - b->rank : a->i - b->i;
}

/* Backward ops that the input gradient needs: those whose results another
 * stage reads, and what they read on their stage. The rest of a microbatch's
 * backward is its weight gradient (W under ZB-H1). */
static char *input_gradient(PL *l)
{
    Graph *g = l->g;
    int n = g->ops.len;
    char *need = arena_alloc(g->arena, (size_t)n + 1);
    memset(need, 0, (size_t)n + 1);
    for (int i = 0; i < n; i++) {
        const Op *op = g->ops.data[i];
        for (int a = 0; a < op->nargs; a++) {
            const Op *d = op->args[a]->def;
            if (d && d->phase == PH_BWD && d->stage != op->stage)
                need[d->id] = 1;
        }
    }
    for (int i = n - 1; i >= 0; i--) {
        const Op *op = g->ops.data[i];
        if (!need[i])
            continue;
        for (int a = 0; a < op->nargs; a++) {
            const Op *d = op->args[a]->def;
            if (d && d->phase == PH_BWD && d->stage == op->stage)
                need[d->id] = 1;
        }
    }
    return need;
}

/* Ops whose results a later stage's op reads: what is sent keeps its piece,
 * so the messages between stages stay in the schedule's order. */
static char *read_elsewhere(PL *l)
{
    Graph *g = l->g;
    char *away = arena_alloc(g->arena, (size_t)g->ops.len + 1);
    memset(away, 0, (size_t)g->ops.len + 1);
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        for (int a = 0; a < op->nargs; a++) {
            const Op *d = op->args[a]->def;
            if (d && l->vs[d->id] != l->vs[i])
                away[d->id] = 1;
        }
    }
    return away;
}

/* Run the schedule in the simulator (forward FLOPs as costs), number its
 * pieces by start time, and give each op its piece's number: a microbatch's
 * forward ops their F piece, its backward ops B (or W), its recompute ops B
 * (they run before the backward that reads them). The loss head's backward
 * (outside the layers, on the last virtual stage, reading only what its F
 * piece has made, read by no other stage) runs in that F piece, so the
 * logits die there instead of being held to B. Shared ops follow
 * their operands; the optimizer's come after the last piece. A stage runs its ops by (tick, position): the order of the
 * schedule, and one order across the stages that every value's producer
 * precedes its readers in, so the sends and receives cannot deadlock. */
static int ticks(PL *l, SchedKind kind)
{
    Graph *g = l->g;
    Schedule s;
    SchedTimes t;
    char err[256];
    if (sched_build(g->arena, kind, l->p, l->m, l->v, &s, err, sizeof err) != 0 ||
        sched_simulate(g->arena, &s, piece_cost, l, 0, &t, err, sizeof err) != 0) {
        diag_error(&l->c->diag, l->at, "the %s schedule on %d stages with %d microbatches: %s",
                   sched_kind_name(kind), l->p, l->m, err);
        if (kind == SCHED_INTERLEAVED && l->m % l->p)
            diag_note(&l->c->diag, LOC_NONE,
                      "set 'microbatches' in the train block to a multiple of %d, or use "
                      "'schedule = 1f1b'", l->p);
        return -1;
    }
    int total = 0;
    for (int r = 0; r < l->p; r++)
        total += s.ranks[r].n;
    Start *st = arena_alloc(g->arena, sizeof(Start) * (size_t)(total + 1));
    int k = 0;
    for (int r = 0; r < l->p; r++)
        for (int i = 0; i < s.ranks[r].n; i++)
            st[k++] = (Start){t.start[r][i], r, i};
    qsort(st, (size_t)total, sizeof(Start), by_start);
    size_t nslots = (size_t)3 * (size_t)l->P * (size_t)l->m;
    int *slot = arena_alloc(g->arena, sizeof(int) * (nslots + 1)); /* [kind][vs][mb] */
    for (size_t i = 0; i < nslots; i++)
        slot[i] = 0;
    for (int i = 0; i < total; i++) {
        const Piece *pc = &s.ranks[st[i].rank].pieces[st[i].i];
        int vs = pc->chunk * l->p + st[i].rank;
        slot[((size_t)pc->kind * (size_t)l->P + (size_t)vs) * (size_t)l->m + (size_t)pc->mb] = 1 + i;
    }
    g->sched.len = 0; /* each rank's pieces in its order, by their microbatch-0 ticks */
    for (int r = 0; r < l->p; r++)
        for (int i = 0; i < s.ranks[r].n; i++) {
            const Piece *pc = &s.ranks[r].pieces[i];
            int vs = pc->chunk * l->p + r;
            SchedStep step = {r, slot[((size_t)pc->kind * (size_t)l->P + (size_t)vs) * (size_t)l->m],
                              pc->mb};
            VEC_PUSH(g->arena, g->sched, step);
        }
    char *need = kind == SCHED_ZB_H1 ? input_gradient(l) : NULL;
    char *away = read_elsewhere(l);
    for (int i = 0; i < g->ops.len; i++) {
        Op *op = g->ops.data[i];
        int own = op->mb >= 0 && op->mb < l->m && !is_source(op) && op->phase != PH_OPT;
        op->tick = 0;
        if (own) { /* recompute ops precede every backward reader: B, never W */
            PieceKind pk = op->phase == PH_FWD                      ? PIECE_F
                           : op->phase == PH_BWD && need && !need[i] ? PIECE_W
                                                                     : PIECE_B;
            op->tick = slot[((size_t)pk * (size_t)l->P + (size_t)l->vs[i]) * (size_t)l->m +
                            (size_t)op->mb];
            /* the loss head's backward: in its forward's piece when all it reads is there */
            int f = slot[((size_t)PIECE_F * (size_t)l->P + (size_t)l->vs[i]) * (size_t)l->m +
                         (size_t)op->mb];
            int early = op->phase == PH_BWD && op->layer < 0 && l->vs[i] == l->P - 1 && !away[i];
            for (int a = 0; early && a < op->nargs; a++)
                early = !op->args[a]->def || op->args[a]->def->tick <= f;
            if (early)
                op->tick = f;
        }
        if (op->phase == PH_OPT) { /* after the step's last piece: the gradients' reductions
                                      overlap the backward that is left */
            op->tick = total + 1;
            continue;
        }
        for (int a = 0; a < op->nargs; a++) {
            const Op *d = op->args[a]->def;
            if (!d || d->tick <= op->tick)
                continue;
            if (own)
                return diag_error(&l->c->diag, op->loc,
                                  "pipeline: this op of microbatch %d reads a value that the "
                                  "schedule computes later (internal error)",
                                  op->mb),
                       -1;
            op->tick = d->tick;
        }
    }
    return 0;
}

/* The partition: every op's virtual stage, and each one's forward FLOPs. */
static int partition(PL *l, Ctx *c, Graph *g, const TrainConfig *t, SchedKind *kind)
{
    const TrainConfig tc = *t;
    *kind = sched_kind_of(&tc);
    l->m = (int)tc.microbatches;
    l->v = *kind == SCHED_INTERLEAVED && l->p > 1 ? (int)tc.virtual_stages : 1;
    if (*kind != SCHED_INTERLEAVED && tc.virtual_stages > 1 && l->p > 1)
        return diag_error(&c->diag, l->at,
                          "virtual_stages = %lld needs 'schedule = interleaved' (the schedule is "
                          "%s)",
                          (long long)tc.virtual_stages, sched_kind_name(*kind)),
               -1;
    l->P = l->p * l->v;
    forward_units(l);
    if (l->nunits < l->P)
        return diag_error(&c->diag, l->at,
                          "the pipeline has %d stages%s, but the model has only %d layers (and "
                          "the embedding and the loss as one unit each): at most %d stages",
                          l->P, l->v > 1 ? " (virtual: ranks x virtual_stages)" : "",
                          l->nlayers, l->nunits),
               -1;
    l->cost = arena_alloc(g->arena, sizeof(double) * (size_t)l->nunits);
    memset(l->cost, 0, sizeof(double) * (size_t)l->nunits);
    l->start = arena_alloc(g->arena, sizeof(int) * (size_t)l->P);
    for (int i = 0; i < g->ops.len; i++)
        if (l->unit[i] >= 0)
            l->cost[l->unit[i]] += ir_op_flops(g->ops.data[i]);
    int pin = l->P > 1 ? pinned(l, tc.stage_starts) : 0; /* one stage: nothing to pin */
    if (pin < 0)
        return -1;
    if (!pin)
        balance(l);
    assign(l);
    l->vcost = arena_alloc(g->arena, sizeof(double) * (size_t)l->P);
    memset(l->vcost, 0, sizeof(double) * (size_t)l->P);
    for (int u = 0; u < l->nunits; u++)
        l->vcost[stage_of(l, u)] += l->cost[u] / (l->m > 0 ? l->m : 1);
    return 0;
}

static int pipeline_ranks(const Graph *g, Loc *at)
{
    int p = 1;
    for (int i = 0; i < g->mesh.naxes; i++)
        if (g->mesh.axes[i].role == ROLE_PIPELINE)
            p *= g->mesh.axes[i].size, *at = g->mesh.axes[i].loc;
    return p;
}

int pass_pipeline(Ctx *c, Graph *g, const Settings *s)
{
    PL l = {.c = c, .g = g, .at = LOC_NONE};
    SchedKind kind;
    l.p = pipeline_ranks(g, &l.at);
    for (int i = 0; i < g->ops.len; i++)
        if (g->ops.data[i]->tick) /* scheduled already (IR read back) */
            return 0;
    if (partition(&l, c, g, &s->train, &kind) != 0)
        return -1;
    if (l.p == 1) /* one stage: its microbatches one after the other (F0 B0 F1 B1 ...) */
        kind = SCHED_1F1B;
    return ticks(&l, kind);
}
