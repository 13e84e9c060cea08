/* recompute.c: activation recomputation (train setting recompute = none |
 * full | selective | auto). Reads the forward and backward graph that autodiff
 * and precision left; writes ops of phase recompute: copies of forward ops
 * that the backward reads instead of the forward's own activations.
 * Key idea: a group is the forward ops of one layer (repeat index) and one
 * microbatch. A value of a group is kept when something outside the group
 * and its layer's backward reads it (the layer's output, which the next layer
 * reads), and under selective also when a matmul (with its bias add) or an
 * attention computes it. Every other value of the group that the backward
 * reads comes from a clone of the forward ops that compute it from the kept
 * values and the group's inputs (the previous layer's output, parameters and
 * their casts, the data), placed just before the group's backward: the
 * forward's activations die in the forward, the recomputed ones in the
 * backward. The clones compute exactly what the originals computed (same
 * kinds, operands, attributes); codegen fuses them as it fused the originals
 * (ir_recompute_twins), so the step is bitwise the same. */
#include "passes.h"

#include <stdio.h>
#include <string.h>

typedef struct RC {
    Ctx *c;
    Graph *g;
    const signed char *mode; /* by layer: RecomputeMode; layers past nmode: none */
    int nmode;
    int n0;  /* ops before the pass */
    int nmb; /* groups are numbered layer * nmb + mb */
    int ngroups;
    char *keep;   /* by value id: a value of a group that stays from the forward */
    char *need;   /* by op id: a forward op the backward needs recomputed */
    Value **copy; /* by value id: its recomputed copy, NULL when none */
    int *at;      /* by group: the op the group's copies go before (n0: none) */
} RC;

static int is_source(const Op *op)
{
    return op->kind == OP_PARAM || op->kind == OP_INPUT || op->kind == OP_STATE ||
           op->kind == OP_STEP || op->kind == OP_CONSTANT;
}

static RecomputeMode layer_mode(const RC *r, int layer)
{
    return layer >= 0 && layer < r->nmode ? (RecomputeMode)r->mode[layer] : RC_NONE;
}

/* op's group, or -1: not a forward op of one microbatch in a layer that
 * recomputes (shared ops, such as parameter casts, are inputs of the group). */
static int group_of(const RC *r, const Op *op)
{
    if (!op || op->phase != PH_FWD || op->layer < 0 || op->mb < 0 || is_source(op) ||
        layer_mode(r, op->layer) == RC_NONE)
        return -1;
    return op->layer * r->nmb + op->mb;
}

/* The value selective keeps of a matmul: its result, or the bias add that
 * is its only reader (codegen computes the two as one GEMM with a bias
 * epilogue, on the same conditions as here; keeping the bare product would
 * split them and round it once more in bf16). */
static Value *gemm_result(const Op *mm, const int *nread, Op *const *reader)
{
    Value *m = mm->res[0];
    const Op *add = reader[m->id];
    if (nread[m->id] != 1 || add->kind != OP_ADD || add->phase != PH_FWD ||
        mm->args[1]->rank != 2 || m->rank < 2)
        return m;
    const Value *b = add->args[0] == m ? add->args[1] : add->args[0], *out = add->res[0];
    if (b->rank != 1 || b->shape[0] != m->shape[m->rank - 1] || b->dtype != m->dtype ||
        out->dtype != m->dtype || out->rank != m->rank ||
        memcmp(out->shape, m->shape, sizeof(int64_t) * (size_t)m->rank))
        return m;
    return add->res[0];
}

/* keep[]: what the backward reads from the forward itself. */
static void mark_kept(RC *r)
{
    Graph *g = r->g;
    int *nread = arena_alloc(g->arena, sizeof(int) * (size_t)(g->values.len + 1));
    Op **reader = arena_alloc(g->arena, sizeof(Op *) * (size_t)(g->values.len + 1));
    memset(nread, 0, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < r->n0; i++) {
        Op *op = g->ops.data[i];
        for (int a = 0; a < op->nargs; a++) {
            Value *v = op->args[a];
            nread[v->id]++, reader[v->id] = op;
            int gv = group_of(r, v->def);
            if (gv < 0 || group_of(r, op) == gv ||
                (op->phase == PH_BWD && op->layer == v->def->layer))
                continue;
            r->keep[v->id] = 1; /* read outside the group and its backward */
        }
    }
    for (int i = 0; i < g->outputs.len; i++)
        r->keep[g->outputs.data[i]->id] = 1;
    for (int i = 0; i < r->n0; i++) {
        const Op *op = g->ops.data[i];
        if (group_of(r, op) < 0 || layer_mode(r, op->layer) != RC_SELECTIVE)
            continue;
        if (op->kind == OP_MATMUL)
            r->keep[gemm_result(op, nread, reader)->id] = 1;
        else if (op->kind == OP_ATTENTION)
            r->keep[op->res[0]->id] = 1;
    }
}

/* A value of a group that the forward does not keep. */
static int recomputed(const RC *r, const Value *v)
{
    return !r->keep[v->id] && group_of(r, v->def) >= 0;
}

/* need[]: the forward ops behind what the backward reads and the forward
 * does not keep, back to the kept values and the inputs (one backward walk:
 * an op precedes its readers). */
static int mark_needed(RC *r)
{
    Graph *g = r->g;
    int any = 0;
    for (int i = 0; i < r->n0; i++) {
        const Op *op = g->ops.data[i];
        for (int a = 0; op->phase == PH_BWD && a < op->nargs; a++)
            if (recomputed(r, op->args[a]))
                r->need[op->args[a]->def->id] = 1, any = 1;
    }
    for (int i = r->n0 - 1; i >= 0; i--) {
        const Op *op = g->ops.data[i];
        for (int a = 0; r->need[i] && a < op->nargs; a++)
            if (recomputed(r, op->args[a]))
                r->need[op->args[a]->def->id] = 1;
    }
    return any;
}

/* The copy of forward op op, appended to g->ops: same kind, attributes,
 * location, layer and microbatch, phase recompute, reading copies where
 * there are. */
static void clone(RC *r, const Op *op)
{
    Graph *g = r->g;
    Value **args = arena_alloc(g->arena, sizeof(Value *) * (size_t)(op->nargs + 1));
    for (int a = 0; a < op->nargs; a++)
        args[a] = r->copy[op->args[a]->id] ? r->copy[op->args[a]->id] : op->args[a];
    Op *c = ir_op_new(g, op->kind, args, op->nargs, op->loc);
    c->layer = op->layer;
    c->mb = op->mb;
    c->phase = PH_RECOMPUTE;
    if (op->nattrs) { /* an array of its own: a later pass may replace an attribute */
        c->attrs = arena_alloc(g->arena, sizeof(Attr *) * (size_t)op->nattrs);
        memcpy(c->attrs, op->attrs, sizeof(Attr *) * (size_t)op->nattrs);
        c->nattrs = op->nattrs;
    }
    for (int i = 0; i < op->nres; i++) {
        const Value *v = op->res[i];
        Value *cv = ir_op_result(g, c, v->dtype, v->rank, v->shape);
        cv->name = v->name;
        cv->shard = v->shard;
        r->copy[v->id] = cv;
    }
}

/* Backward reads of what is recomputed go to the copies; at[] gets each
 * group's first backward op (or first such reader). */
static void rewrite(RC *r)
{
    for (int i = 0; i < r->n0; i++) {
        Op *op = r->g->ops.data[i];
        if (op->phase != PH_BWD)
            continue;
        if (layer_mode(r, op->layer) != RC_NONE && op->mb >= 0) {
            int gr = op->layer * r->nmb + op->mb;
            r->at[gr] = i < r->at[gr] ? i : r->at[gr];
        }
        for (int a = 0; a < op->nargs; a++) {
            const Value *v = op->args[a];
            if (!recomputed(r, v) || !r->copy[v->id])
                continue;
            int gr = group_of(r, v->def);
            r->at[gr] = i < r->at[gr] ? i : r->at[gr];
            op->args[a] = r->copy[v->id];
        }
    }
}

/* The copies (g->ops from n0 on) moved before their group's at[], in the
 * order they were made; then every op's id is its index again. */
static void place(RC *r)
{
    Graph *g = r->g;
    int n = g->ops.len, nc = n - r->n0;
    int *start = arena_alloc(g->arena, sizeof(int) * (size_t)(r->n0 + 2));
    Op **out = arena_alloc(g->arena, sizeof(Op *) * (size_t)(n + 1));
    Op **copies = arena_alloc(g->arena, sizeof(Op *) * (size_t)(nc + 1));
    memset(start, 0, sizeof(int) * (size_t)(r->n0 + 2));
    for (int k = 0; k < nc; k++) { /* a counting sort by position, stable */
        const Op *c = g->ops.data[r->n0 + k];
        start[r->at[c->layer * r->nmb + c->mb] + 1]++;
    }
    for (int i = 0; i < r->n0; i++)
        start[i + 1] += start[i];
    for (int k = 0; k < nc; k++) {
        Op *c = g->ops.data[r->n0 + k];
        copies[start[r->at[c->layer * r->nmb + c->mb]]++] = c;
    }
    int m = 0, k = 0;
    for (int i = 0; i < r->n0; i++) {
        while (k < nc && r->at[copies[k]->layer * r->nmb + copies[k]->mb] == i)
            out[m++] = copies[k++];
        out[m++] = g->ops.data[i];
    }
    memcpy(g->ops.data, out, sizeof(Op *) * (size_t)n);
    for (int i = 0; i < n; i++)
        g->ops.data[i]->id = i;
}

/* "1.23 GFLOP": f with a prefix that leaves 1 to 999 in front. */
static const char *flop_text(char *buf, size_t n, double f)
{
    static const char *const prefix[] = {"", "k", "M", "G", "T", "P"};
    int p = 0;
    while (f >= 999.5 && p < 5)
        f /= 1000, p++;
    snprintf(buf, n, "%.3g %sFLOP", f, prefix[p]);
    return buf;
}

/* -v: what the copies cost, against the forward of the whole step. */
static void report(const RC *r, const char *label)
{
    const Graph *g = r->g;
    double fwd = 0, extra = 0;
    int nlayers = 0;
    char *seen = arena_alloc(g->arena, (size_t)r->ngroups / (size_t)r->nmb + 1);
    memset(seen, 0, (size_t)r->ngroups / (size_t)r->nmb + 1);
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->phase == PH_FWD && !is_source(op))
            fwd += ir_op_flops(op);
        if (op->phase != PH_RECOMPUTE)
            continue;
        extra += ir_op_flops(op);
        nlayers += !seen[op->layer];
        seen[op->layer] = 1;
    }
    char buf[64];
    fprintf(stderr,
            "tcc: recompute   %s: %d ops recomputed in %d layers, +%s (+%.1f%% of the "
            "forward)\n",
            label, g->ops.len - r->n0, nlayers, flop_text(buf, sizeof buf, extra),
            fwd > 0 ? 100 * extra / fwd : 0.0);
}

static int apply(Ctx *c, Graph *g, const signed char *mode, int nmode, const char *label, int verbose)
{
    RC r = {.c = c, .g = g, .mode = mode, .nmode = nmode, .n0 = g->ops.len, .nmb = 1};
    int nlayers = 0, bwd = 0;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->phase == PH_RECOMPUTE) /* applied already (IR read back) */
            return 0;
        bwd |= op->phase == PH_BWD;
        nlayers = op->layer + 1 > nlayers ? op->layer + 1 : nlayers;
        r.nmb = op->mb + 1 > r.nmb ? op->mb + 1 : r.nmb;
    }
    if (!bwd || !nlayers)
        return 0;
    r.ngroups = nlayers * r.nmb;
    r.keep = arena_alloc(g->arena, (size_t)g->values.len + 1);
    r.need = arena_alloc(g->arena, (size_t)r.n0 + 1);
    r.copy = arena_alloc(g->arena, sizeof(Value *) * (size_t)(g->values.len + 1));
    r.at = arena_alloc(g->arena, sizeof(int) * (size_t)r.ngroups);
    memset(r.keep, 0, (size_t)g->values.len + 1);
    memset(r.need, 0, (size_t)r.n0 + 1);
    memset(r.copy, 0, sizeof(Value *) * (size_t)(g->values.len + 1));
    for (int i = 0; i < r.ngroups; i++)
        r.at[i] = r.n0;
    mark_kept(&r);
    if (mark_needed(&r)) {
        for (int i = 0; i < r.n0; i++)
            if (r.need[i])
                clone(&r, g->ops.data[i]);
        rewrite(&r);
        place(&r);
    }
    if (verbose)
        report(&r, label);
    return 0;
}

int pass_recompute_with(Ctx *c, Graph *g, const signed char *mode_by_layer, int nlayers)
{
    return apply(c, g, mode_by_layer, mode_by_layer ? nlayers : 0, "per layer", 0);
}

int pass_recompute(Ctx *c, Graph *g, const Settings *s)
{
    const TrainConfig tc = s->train;
    if (!strcmp(tc.recompute, "auto")) {
        if (!s->recompute_layers)
            return diag_error(&c->diag, LOC_NONE,
                              "recompute = auto needs a device budget (--gpu NAME or "
                              "--device-memory SIZE)"),
                   -1;
        return apply(c, g, s->recompute_layers, s->nrecompute_layers, "auto", s->verbose);
    }
    RecomputeMode m = !strcmp(tc.recompute, "full")        ? RC_FULL
                      : !strcmp(tc.recompute, "selective") ? RC_SELECTIVE
                                                           : RC_NONE;
    if (m == RC_NONE)
        return 0;
    int nlayers = 0;
    for (int i = 0; i < g->ops.len; i++)
        nlayers = g->ops.data[i]->layer + 1 > nlayers ? g->ops.data[i]->layer + 1 : nlayers;
    signed char *mode = arena_alloc(g->arena, (size_t)nlayers + 1);
    memset(mode, m, (size_t)nlayers + 1);
    return apply(c, g, mode, nlayers, tc.recompute, s->verbose);
}
