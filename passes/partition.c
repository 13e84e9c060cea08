/* partition.c: SPMD partitioning. Reads the graph with a sharding on every
 * value (the shard pass); writes the same graph with the collectives and
 * local slices that make every op see its operands as its rule needs them,
 * and every value as its sharding says. Key idea: the rule that chose the
 * shardings (shard_strategy) is run again over the same operand shardings, so
 * it asks for the same operand shardings; each mismatch becomes the steps of
 * shard_reshard_plan (all-gather, reduce-scatter, all-reduce, all-to-all,
 * shard_slice) on the sub-group of the mesh axes involved, each with the bytes
 * one device sends. A resharded value is made once and reused. A result whose
 * stored sharding differs from what its op makes (a pinned gradient, a
 * gathered parameter) is resharded right after the op. Every output ends
 * replicated. The graph keeps global shapes: per-device shapes are the global
 * ones divided by the split counts (codegen lays them out). */
#include "shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Memo {
    Value *from;
    Sharding to;
    Value *v;
    int bwd; /* made for a backward (or recomputing) op */
} Memo;

typedef struct Stats {
    Value *logits, *m, *s, *offset; /* a split vocabulary's row max and sum of exp */
} Stats;

typedef struct PP {
    Graph *g;
    ShardOpts o;
    VEC(Op *) ops;   /* the new op order */
    VEC(Memo) memo;
    VEC(Stats) stats;
    int nreduce;     /* all-reduces emitted so far (the test hook of emit_step) */
} PP;

/* A test's hook (tests/lit/shard/verify-diverge.test): the environment
 * variable TCC_TEST_BREAK=all_reduce:N makes the Nth all-reduce this pass
 * emits reduce over no axis, so that the plan is wrong on purpose and
 * --verify has a divergence to find. */
static int broken_reduce(PP *p)
{
    const char *e = getenv("TCC_TEST_BREAK");
    return e && !strncmp(e, "all_reduce:", 11) && atoi(e + 11) == ++p->nreduce;
}

static Attr *axes_attr(PP *p, const int8_t *axes, int n)
{
    Attr *items[IR_MAX_AXES];
    for (int i = 0; i < n; i++)
        items[i] = ir_attr_str(p->g->arena, NULL, p->g->mesh.axes[axes[i]].name);
    return ir_attr_list(p->g->arena, "axes", items, n);
}

/* One step as an op after `site` (its phase, layer and stage); its result. */
static Value *emit_step(PP *p, Value *x, const ReStep *st, const Op *site, const char *why)
{
    Graph *g = p->g;
    Op *op = ir_op_new(g, st->kind, &x, 1, site->loc);
    g->ops.len--; /* ordered by p->ops */
    ir_op_place_like(op, site);
    int naxes = st->kind == OP_ALL_REDUCE && broken_reduce(p) ? 0 : st->naxes;
    ir_op_set_attr(g, op, axes_attr(p, st->axes, naxes));
    if (st->kind != OP_ALL_REDUCE)
        ir_op_set_attr(g, op, ir_attr_int(g->arena, "dim", st->dim));
    if (st->kind == OP_ALL_TO_ALL)
        ir_op_set_attr(g, op, ir_attr_int(g->arena, "split", st->dim2));
    if (st->kind != OP_SHARD_SLICE)
        ir_op_set_attr(g, op, ir_attr_int(g->arena, "bytes", (int64_t)(st->bytes + 0.5)));
    Value *v = ir_op_result(g, op, x->dtype, x->rank, x->shape);
    v->shard = st->after;
    v->shard.why = (Why){ir_shard_is_replicated(&v->shard, v->rank) ? WHY_NONE : WHY_RULE,
                         LOC_NONE, why};
    VEC_PUSH(g->arena, p->ops, op);
    return v;
}

static const char *why_for(PP *p, const char *fmt, const Op *op)
{
    char buf[128];
    snprintf(buf, sizeof buf, fmt, ir_ops[op->kind].name);
    return intern(p->g->strings, buf);
}

static int backward_site(const Op *site)
{
    return site->phase == PH_BWD || site->phase == PH_RECOMPUTE;
}

/* Whether the steps gather a microbatch's activation (a value made from the
 * step's inputs, not a parameter or its copy): the backward then gathers it
 * again from the shard the forward saved, as Megatron's sequence parallelism
 * does, instead of keeping the gathered copy from the forward to the
 * backward. One all-gather more a step, and the activation held split. */
static int gathers_activation(const Value *x, const ReStep *steps, int n)
{
    if (!x->def || x->def->mb < 0 || x->def->phase != PH_FWD)
        return 0;
    for (int i = 0; i < n; i++)
        if (steps[i].kind == OP_ALL_GATHER)
            return 1;
    return 0;
}

/* x resharded to `to` for op (memoised; a forward activation's gather once
 * for the forward and once for the backward). */
static Value *reshard(PP *p, Value *x, const Sharding *to, const Op *site)
{
    if (shard_same(&x->shard, to, x->rank))
        return x;
    ReStep steps[SH_MAXSTEPS];
    int n = shard_reshard_plan(&p->g->mesh, x, &x->shard, to, steps);
    int again = gathers_activation(x, steps, n);
    for (int i = 0; i < p->memo.len; i++)
        if (p->memo.data[i].from == x && shard_same(&p->memo.data[i].to, to, x->rank) &&
            (!again || p->memo.data[i].bwd == backward_site(site)))
            return p->memo.data[i].v;
    Value *v = x;
    const char *why = why_for(p, "resharded for %s", site);
    /* a value of another pipeline stage: the steps that do not grow it (a
     * reduction, a slice) run on its own stage, so that less crosses */
    const Op *home = x->def && x->def->stage != site->stage && x->def->kind != OP_PARAM &&
                             x->def->kind != OP_INPUT && x->def->kind != OP_STATE
                         ? x->def
                         : site;
    for (int i = 0; i < n; i++) {
        home = steps[i].kind == OP_ALL_GATHER ? site : home;
        v = emit_step(p, v, &steps[i], home, why);
        /* a step runs as soon as its operand is made (its tick), but the
         * backward's gather of a saved shard runs in the backward's piece,
         * else it would be made in the forward's and held all the same */
        if (again && backward_site(site) && v->def->tick < site->tick)
            v->def->tick = site->tick;
    }
    v->shard.why = to->why.kind ? to->why : v->shard.why;
    VEC_PUSH(p->g->arena, p->memo, ((Memo){x, *to, v, backward_site(site)}));
    return v;
}

/* op made result i as `made`; its value must be as stored: a new value takes
 * the op's result, and the steps end in the original value. */
static void fix_result(PP *p, Op *op, int i, const Sharding *made)
{
    Value *orig = op->res[i];
    Value *tmp = ir_value_new(p->g, orig->dtype, orig->rank, orig->shape);
    tmp->def = op;
    tmp->loc = orig->loc;
    tmp->shard = *made;
    tmp->shard.why = (Why){WHY_RULE, LOC_NONE, ir_ops[op->kind].name};
    op->res[i] = tmp;
    ReStep steps[SH_MAXSTEPS];
    int n = shard_reshard_plan(&p->g->mesh, tmp, made, &orig->shard, steps);
    if (n == 0)
        BUG("a result needs no resharding but differs");
    Value *v = tmp;
    const char *why = why_for(p, "resharded after %s", op);
    for (int k = 0; k < n - 1; k++)
        v = emit_step(p, v, &steps[k], op, why);
    Value *last = emit_step(p, v, &steps[n - 1], op, why);
    Op *lop = last->def;
    lop->res[0] = orig; /* the last step defines the original value */
    orig->def = lop;
}

/* ---- vocabulary-parallel cross-entropy ---- */

/* A new op before `site` (its phase, layer, stage) with one result. */
static Value *emit_op(PP *p, OpKind kind, Value **args, int n, const Op *site, DType dt, int rank,
                      const int64_t *shape, const Sharding *sh)
{
    Op *op = ir_op_new(p->g, kind, args, n, site->loc);
    p->g->ops.len--;
    ir_op_place_like(op, site);
    Value *v = ir_op_result(p->g, op, dt, rank, shape);
    v->shard = *sh;
    v->shard.why = (Why){WHY_RULE, LOC_NONE, "vocabulary-parallel cross_entropy"};
    VEC_PUSH(p->g->arena, p->ops, op);
    return v;
}

static void set_int(PP *p, Value *v, const char *key, int64_t x)
{
    ir_op_set_attr(p->g, v->def, ir_attr_int(p->g->arena, intern(p->g->strings, key), x));
}

/* Row max m and sum s of exp(logits - m) over the whole (split) vocabulary,
 * both [...,1], and the device's first column: made once per logits value. */
static Stats *vocab_stats(PP *p, Value *l, const Op *site)
{
    for (int i = 0; i < p->stats.len; i++)
        if (p->stats.data[i].logits == l)
            return &p->stats.data[i];
    Graph *g = p->g;
    int last = l->rank - 1, na = l->shard.naxes[last];
    const int8_t *axes = l->shard.axes[last];
    uint32_t mask = 0;
    for (int i = 0; i < na; i++)
        mask |= 1u << axes[i];
    int64_t shape[IR_MAX_RANK];
    memcpy(shape, l->shape, sizeof(int64_t) * (size_t)l->rank);
    shape[last] = 1;
    Sharding part = l->shard, whole;
    part.naxes[last] = 0;
    part.partial |= mask; /* per-device maxima and sums: the all-reduces read them */
    whole = part;
    whole.partial &= ~mask;
    Value *mloc = emit_op(p, OP_MAX, &l, 1, site, l->dtype, l->rank, shape, &part);
    set_int(p, mloc, "dim", -1);
    ir_op_set_attr(g, mloc->def, ir_attr_bool(g->arena, "keepdim", 1));
    ReStep st = {OP_ALL_REDUCE, -1, -1, na, {0}, whole, 0};
    memcpy(st.axes, axes, (size_t)na);
    double ways = (double)ir_shard_factor(&g->mesh, &l->shard, last);
    st.bytes = 2 * (ways - 1) / ways * shard_local_bytes(&g->mesh, mloc, &whole); /* ring */
    Value *m = emit_step(p, mloc, &st, site, "vocabulary-parallel cross_entropy");
    ir_op_set_attr(g, m->def, ir_attr_str(g->arena, "op", "max"));
    Value *d = emit_op(p, OP_SUB, (Value *[]){l, m}, 2, site, l->dtype, l->rank, l->shape,
                       &l->shard);
    Value *e = emit_op(p, OP_EXP, &d, 1, site, l->dtype, l->rank, l->shape, &l->shard);
    Value *sloc = emit_op(p, OP_SUM, &e, 1, site, l->dtype, l->rank, shape, &part);
    set_int(p, sloc, "dim", -1);
    ir_op_set_attr(g, sloc->def, ir_attr_bool(g->arena, "keepdim", 1));
    Value *sum = emit_step(p, sloc, &st, site, "vocabulary-parallel cross_entropy");
    Sharding none;
    memset(&none, 0, sizeof none);
    char name[128];
    int k = snprintf(name, sizeof name, "vocab_offset");
    for (int i = 0; i < na && k < (int)sizeof name; i++)
        k += snprintf(name + k, sizeof name - (size_t)k, ".%s", g->mesh.axes[axes[i]].name);
    const char *id = intern(g->strings, name);
    Value *off = NULL; /* one per split of the vocabulary, shared by the microbatches */
    for (int i = 0; i < p->stats.len && !off; i++)
        if (p->stats.data[i].offset->name == id)
            off = p->stats.data[i].offset;
    if (!off) {
        off = emit_op(p, OP_AXIS_OFFSET, NULL, 0, site, DT_I32, 0, NULL, &none);
        off->shard.why = (Why){WHY_NONE, LOC_NONE, NULL};
        off->name = id;
        Attr *items[IR_MAX_AXES];
        for (int i = 0; i < na; i++)
            items[i] = ir_attr_str(g->arena, NULL, g->mesh.axes[axes[i]].name);
        ir_op_set_attr(g, off->def, ir_attr_list(g->arena, "axes", items, na));
        set_int(p, off, "scale", l->shape[last] / ir_shard_factor(&g->mesh, &l->shard, last));
    }
    VEC_PUSH(g->arena, p->stats, ((Stats){l, m, sum, off}));
    return &p->stats.data[p->stats.len - 1];
}

/* cross_entropy(_grad) over a split vocabulary, in place: the _shard op. */
static void vocab_parallel(PP *p, Op *op)
{
    Value *l = op->args[0];
    Stats *st = vocab_stats(p, l, op);
    int grad = op->kind == OP_CROSS_ENTROPY_GRAD;
    Value **args = arena_alloc(p->g->arena, sizeof(Value *) * 6);
    int n = 0;
    args[n++] = l;
    args[n++] = op->args[1];
    if (grad)
        args[n++] = op->args[2];
    args[n++] = st->m;
    args[n++] = st->s;
    args[n++] = st->offset;
    op->kind = grad ? OP_CROSS_ENTROPY_GRAD_SHARD : OP_CROSS_ENTROPY_SHARD;
    op->args = args;
    op->nargs = n;
    int64_t rows = 1;
    for (int d = 0; d < l->rank - 1; d++)
        rows *= l->shape[d];
    ir_op_set_attr(p->g, op, ir_attr_int(p->g->arena, "rows", rows));
    if (!grad)
        ir_op_set_attr(p->g, op, ir_attr_int(p->g->arena, "n",
                                            ir_shard_factor(&p->g->mesh, &l->shard, l->rank - 1)));
}

static int partition_op(PP *p, Op *op)
{
    if (op->kind == OP_UPDATE) {
        op->args[1] = reshard(p, op->args[1], &op->args[0]->shard, op);
        VEC_PUSH(p->g->arena, p->ops, op);
        return 0;
    }
    if (op->nargs == 0) {
        VEC_PUSH(p->g->arena, p->ops, op);
        return 0;
    }
    Strategy st;
    shard_strategy(p->g, op, &p->o, &st);
    for (int a = 0; a < op->nargs && a < SH_MAXARGS; a++) {
        if (st.req[a].partial & ~op->args[a]->shard.partial)
            BUG("rule of %s asks for a partial sum", ir_ops[op->kind].name);
        op->args[a] = reshard(p, op->args[a], &st.req[a], op);
    }
    if ((op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_GRAD) &&
        op->args[0]->shard.naxes[op->args[0]->rank - 1])
        vocab_parallel(p, op);
    VEC_PUSH(p->g->arena, p->ops, op);
    for (int r = 0; r < op->nres && r < SH_MAXRES; r++)
        if (!shard_same(&st.out[r], &op->res[r]->shard, op->res[r]->rank))
            fix_result(p, op, r, &st.out[r]);
    return 0;
}

/* Outputs are read by the runtime on every device: whole and summed. */
static void outputs_whole(PP *p)
{
    Graph *g = p->g;
    for (int i = 0; i < g->outputs.len; i++) {
        Value *v = g->outputs.data[i];
        if (ir_shard_is_replicated(&v->shard, v->rank))
            continue;
        Sharding whole;
        memset(&whole, 0, sizeof whole);
        Value *w = reshard(p, v, &whole, v->def);
        w->name = v->name;
        v->name = NULL;
        g->outputs.data[i] = w;
    }
}

int pass_partition(Ctx *c, Graph *g, const Settings *s)
{
    (void)c;
    if (ir_mesh_size(&g->mesh) == 1)
        return 0;
    for (int i = 0; i < g->ops.len; i++) /* partitioned already (an IR file read back) */
        if (g->ops.data[i]->kind >= OP_ALL_REDUCE && g->ops.data[i]->kind <= OP_SHARD_SLICE)
            return 0;
    PP p;
    memset(&p, 0, sizeof p);
    p.g = g;
    shard_opts(g, (int)s->train.sequence_parallel, &p.o);
    int n = g->ops.len;
    Op **old = arena_alloc(g->arena, sizeof(Op *) * (size_t)(n ? n : 1));
    memcpy(old, g->ops.data, sizeof(Op *) * (size_t)n);
    for (int i = 0; i < n; i++)
        partition_op(&p, old[i]);
    outputs_whole(&p);
    g->ops.len = 0;
    for (int i = 0; i < p.ops.len; i++) {
        p.ops.data[i]->id = i;
        VEC_PUSH(g->arena, g->ops, p.ops.data[i]);
    }
    return 0;
}
