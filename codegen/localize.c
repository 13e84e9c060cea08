/* localize.c: the per-device graph of a partitioned one. Reads a graph whose
 * values carry global shapes and shardings (after the partition pass); writes
 * a copy in which every value has the shape of one device's block, and the
 * ops whose meaning depends on global sizes or on which block a device holds
 * say so: mean keeps the global count, cross_entropy the global rows, the
 * attention and rope ops their local heads, a split embedding table an
 * axis_offset operand (its first row's global index), dropout one for each
 * split dimension but the first (its elements' global places), an ALiBi
 * attention one for its split heads, a microbatch slice its
 * rows within the device's block. Kernels are then written from local shapes
 * alone, the same code for one device or many. */
#include "kgen.h"

#include <string.h>

static int64_t factor(const Graph *g, const Value *v, int d)
{
    return d >= 0 && d < v->rank ? ir_shard_factor(&g->mesh, &v->shard, d) : 1;
}

static void local_shape(const Graph *g, const Value *v, int64_t *out)
{
    for (int d = 0; d < v->rank; d++)
        out[d] = v->shape[d] / factor(g, v, d);
}

static void set_int(Graph *l, Op *op, const char *key, int64_t v)
{
    ir_op_set_attr(l, op, ir_attr_int(l->arena, intern(l->strings, key), v));
}

/* An i32[] operand holding the global index of this device's first element
 * along dim d of v, split there (a table's first row); one per split and
 * block size, made before its first use. */
static Value *row_offset(Graph *l, const Graph *g, const Value *v, int d, Value **map, Loc loc)
{
    char name[128];
    int64_t rows = map[v->id]->shape[d];
    int k = snprintf(name, sizeof name, "row_offset.%lld", (long long)rows);
    for (int i = 0; i < v->shard.naxes[d] && k < (int)sizeof name; i++)
        k += snprintf(name + k, sizeof name - (size_t)k, ".%s",
                      g->mesh.axes[v->shard.axes[d][i]].name);
    const char *id = intern(l->strings, name);
    for (int i = 0; i < l->ops.len; i++)
        if (l->ops.data[i]->kind == OP_AXIS_OFFSET && l->ops.data[i]->res[0]->name == id)
            return l->ops.data[i]->res[0];
    Op *op = ir_op_new(l, OP_AXIS_OFFSET, NULL, 0, loc);
    Attr *items[IR_MAX_AXES];
    for (int i = 0; i < v->shard.naxes[d]; i++)
        items[i] = ir_attr_str(l->arena, NULL, g->mesh.axes[v->shard.axes[d][i]].name);
    ir_op_set_attr(l, op, ir_attr_list(l->arena, "axes", items, v->shard.naxes[d]));
    set_int(l, op, "scale", rows);
    Value *r = ir_op_result(l, op, DT_I32, 0, NULL);
    r->name = id;
    return r;
}

static void fix_attrs(Graph *l, const Graph *g, const Op *orig, Op *op, Value **map)
{
    const Value *x = orig->nargs ? orig->args[0] : NULL, *r = orig->nres ? orig->res[0] : NULL;
    switch (orig->kind) {
    case OP_RESHAPE: case OP_EXPAND: case OP_SUM_TO:
        ir_op_set_attr(l, op, ir_attr_ints(l->arena, "shape", op->res[0]->shape, r->rank));
        break;
    case OP_SLICE: {
        int dim = (int)ir_op_attr_int(orig, "dim", -1);
        dim = dim < 0 ? dim + x->rank : dim;
        int64_t f = factor(g, x, dim);
        if (f > 1) {
            set_int(l, op, "start", ir_op_attr_int(orig, "start", 0) / f);
            set_int(l, op, "end", ir_op_attr_int(orig, "end", 0) / f);
        }
        break;
    }
    case OP_ATTENTION: case OP_ATTENTION_GRAD: case OP_ROPE: {
        int64_t h = ir_op_attr_int(orig, "heads", 1);
        set_int(l, op, "heads", h / factor(g, x, x->rank - 1));
        if (ir_op_attr_int(orig, "alibi", 0)) /* the slopes are of the global head count */
            set_int(l, op, "alibi_heads", h);
        if (ir_op_attr(orig, "kv_heads"))
            set_int(l, op, "kv_heads", ir_op_attr_int(orig, "kv_heads", h) /
                                           factor(g, orig->args[1], orig->args[1]->rank - 1));
        break;
    }
    case OP_MEAN: {
        int dim = (int)ir_op_attr_int(orig, "dim", -1);
        set_int(l, op, "count", x->shape[dim < 0 ? dim + x->rank : dim]);
        break;
    }
    case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD: {
        int64_t rows = 1;
        for (int d = 0; d < x->rank - 1; d++)
            rows *= x->shape[d];
        set_int(l, op, "rows", rows);
        break;
    }
    case OP_EMBED_GRAD:
        set_int(l, op, "vocab", op->res[0]->shape[0]);
        break;
    default:
        break;
    }
}

static Op *clone_op(Graph *l, const Graph *g, const Op *orig, Value **map)
{
    Value *args[68];
    int n = orig->nargs < 64 ? orig->nargs : 64;
    for (int i = 0; i < n; i++)
        args[i] = map[orig->args[i]->id];
    const Value *table = orig->kind == OP_EMBED ? orig->args[0]
                         : orig->kind == OP_EMBED_GRAD ? orig->res[0] : NULL;
    if (table && factor(g, table, 0) > 1)
        args[n++] = row_offset(l, g, table, 0, map, orig->loc);
    int64_t offsets[IR_MAX_RANK];
    int noff = 0;
    for (int d = 1; orig->kind == OP_DROPOUT && d < orig->args[0]->rank; d++)
        if (factor(g, orig->args[0], d) > 1) /* dropout's counter: global coordinates */
            offsets[noff++] = d, args[n++] = row_offset(l, g, orig->args[0], d, map, orig->loc);
    if ((orig->kind == OP_ATTENTION || orig->kind == OP_ATTENTION_GRAD) &&
        ir_op_attr_int(orig, "alibi", 0) && factor(g, orig->args[0], 2) > 1) /* the global head */
        args[n++] = row_offset(l, g, orig->args[0], 2, map, orig->loc);
    Op *op = ir_op_new(l, orig->kind, args, n, orig->loc);
    op->layer = orig->layer;
    op->phase = orig->phase;
    op->stage = orig->stage;
    op->mb = orig->mb;
    op->tick = orig->tick;
    for (int i = 0; i < orig->nattrs; i++)
        ir_op_set_attr(l, op, orig->attrs[i]);
    Value **res = arena_alloc(l->arena, sizeof(Value *) * (size_t)(orig->nres + 1));
    for (int i = 0; i < orig->nres; i++) {
        res[i] = map[orig->res[i]->id];
        res[i]->def = op;
    }
    op->res = res;
    op->nres = orig->nres;
    fix_attrs(l, g, orig, op, map);
    if (noff) {
        const Value *x = orig->args[0];
        ir_op_set_attr(l, op, ir_attr_ints(l->arena, "offsets", offsets, noff));
        ir_op_set_attr(l, op, ir_attr_ints(l->arena, "shape", x->shape, x->rank));
    }
    return op;
}

const Graph *cg_localize(Arena *a, const Graph *g)
{
    if (ir_mesh_size(&g->mesh) == 1)
        return g;
    Graph *l = ir_graph_new(a, g->strings, g->name);
    l->mesh = g->mesh;
    l->config = g->config;
    l->train = g->train;
    l->sched = g->sched;
    Value **map = arena_alloc(a, sizeof(Value *) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->values.len; i++) {
        const Value *v = g->values.data[i];
        int64_t shape[IR_MAX_RANK];
        local_shape(g, v, shape);
        Value *w = ir_value_new(l, v->dtype, v->rank, shape);
        w->name = v->name;
        w->shard = v->shard;
        w->loc = v->loc;
        map[i] = w;
    }
    for (int i = 0; i < g->ops.len; i++)
        clone_op(l, g, g->ops.data[i], map);
    for (int i = 0; i < g->outputs.len; i++)
        VEC_PUSH(a, l->outputs, map[g->outputs.data[i]->id]);
    return l;
}

/* ---- per-device memory of the training state ---- */

static double local_bytes(const Graph *g, const Value *v)
{
    double b = (double)ir_dtype_size(v->dtype);
    for (int d = 0; d < v->rank; d++)
        b *= (double)(v->shape[d] / factor(g, v, d));
    return b;
}

/* The buffer gradient v is summed in over the microbatches: v itself, but
 * with zero = 1 the whole sum that the step reduce-scatters once. */
static const Value *kept_gradient(const Value *v, int zero)
{
    while (zero == 1 && v->def && v->def->phase == PH_BWD &&
           (v->def->kind == OP_REDUCE_SCATTER || v->def->kind == OP_ALL_REDUCE))
        v = v->def->args[0];
    return v;
}

/* The bf16 copy of a parameter that the step reads: the cast op makes,
 * past the all-gathers that bring it to the compute sharding (the
 * distributed optimizer casts the shard); NULL when that is not a parameter's
 * bf16 cast or the copy is made again for the backward (ZeRO-3, fsdp). */
static const Value *held_copy(const Op *op, const Value **gathered, int regather)
{
    if (regather || op->kind != OP_CAST || op->phase == PH_OPT || op->res[0]->dtype != DT_BF16 ||
        !op->args[0]->def || op->args[0]->def->kind != OP_PARAM)
        return NULL;
    const Value *v = op->res[0];
    while (gathered[v->id])
        v = gathered[v->id];
    return v;
}

void cg_memory(const Graph *g, const TrainConfig *tc, CgMemory *m)
{
    memset(m, 0, sizeof *m);
    int regather = ir_regathers(g, tc);
    const Value **gathered = arena_alloc(g->arena, sizeof *gathered * (size_t)(g->values.len + 1));
    memset(gathered, 0, sizeof *gathered * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->ops.len; i++)
        if (g->ops.data[i]->kind == OP_ALL_GATHER)
            gathered[g->ops.data[i]->args[0]->id] = g->ops.data[i]->res[0];
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        const Value *copy = held_copy(op, gathered, regather);
        if (copy)
            m->params += local_bytes(g, copy);
        if (op->kind == OP_PARAM)
            m->params += local_bytes(g, op->res[0]), m->nparams += 1;
        else if (op->kind == OP_STATE)
            m->state += local_bytes(g, op->res[0]);
        else if (op->kind == OP_SGD || op->kind == OP_ADAMW) {
            const Value *grad = op->args[1];
            /* the gradient as reduced: before clipping and the update's own slice */
            while (grad->def && ((grad->def->kind == OP_MUL && grad->def->phase == PH_OPT) ||
                                 grad->def->kind == OP_SHARD_SLICE))
                grad = grad->def->args[grad->def->kind == OP_MUL && grad->def->args[0]->rank == 0];
            m->grads += local_bytes(g, kept_gradient(grad, (int)tc->zero));
        }
    }
}
