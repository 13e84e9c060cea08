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
#include <string.h>

typedef struct Memo {
    Value *from;
    Sharding to;
    Value *v;
} Memo;

typedef struct PP {
    Graph *g;
    ShardOpts o;
    VEC(Op *) ops;   /* the new op order */
    VEC(Memo) memo;
} PP;

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
    op->phase = site->phase;
    op->layer = site->layer;
    op->stage = site->stage;
    ir_op_set_attr(g, op, axes_attr(p, st->axes, st->naxes));
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

/* x resharded to `to` for op (memoised). */
static Value *reshard(PP *p, Value *x, const Sharding *to, const Op *site)
{
    if (shard_same(&x->shard, to, x->rank))
        return x;
    for (int i = 0; i < p->memo.len; i++)
        if (p->memo.data[i].from == x && shard_same(&p->memo.data[i].to, to, x->rank))
            return p->memo.data[i].v;
    ReStep steps[SH_MAXSTEPS];
    int n = shard_reshard_plan(&p->g->mesh, x, &x->shard, to, steps);
    Value *v = x;
    const char *why = why_for(p, "resharded for %s", site);
    for (int i = 0; i < n; i++)
        v = emit_step(p, v, &steps[i], site, why);
    v->shard.why = to->why.kind ? to->why : v->shard.why;
    VEC_PUSH(p->g->arena, p->memo, ((Memo){x, *to, v}));
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

int pass_partition(Ctx *c, Graph *g)
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
    shard_opts(g, &p.o);
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
