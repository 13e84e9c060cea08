/* tensors.c: the plan's tensors. Reads the Graph and fusion's decisions
 * (gen->fused, gen->dead); writes a tensor for each value that needs memory
 * (its role, dtype, shape, how its global value is split, its init, the
 * largest id an index input may hold), and the temporaries and
 * hyperparameters that lowering asks for (gen_temp, gen_hyper). Each takes
 * the next aligned offset of the slab; the memory plan (layout.c, microbatch_loop.c)
 * packs them unless the plan keeps every value.
 * Key idea: persistent tensors first, so a checkpoint is one range; a reshape
 * shares its operand's tensor, and the optimizer's new value is written
 * straight into its target when nothing reads the target later. */
#include "kgen.h"

#include <string.h>

/* ---- tensors ---- */

static uint64_t bytes_of(DType t, int rank, const int64_t *shape)
{
    uint64_t n = ir_dtype_size(t);
    for (int i = 0; i < rank; i++)
        n *= (uint64_t)shape[i];
    return n;
}

static int new_tensor(Gen *gen, const char *name, DType t, int rank, const int64_t *shape,
                      PlanRole role)
{
    PlanTensor pt = {0};
    pt.name = arena_strdup(gen->a, name ? name : "");
    pt.dtype = (PlanDType)t;
    pt.rank = rank;
    if (rank)
        memcpy(pt.shape, shape, sizeof(int64_t) * (size_t)rank);
    pt.bytes = bytes_of(t, rank, shape);
    pt.offset = gen->slab;
    gen->slab += (pt.bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
    pt.role = role;
    pt.init = "";
    pt.layer = gen->op ? gen->op->layer : -1;
    pt.value = -1;
    VEC_PUSH(gen->a, gen->tensors, pt);
    return gen->tensors.len - 1;
}

int gen_temp(Gen *gen, DType t, int rank, const int64_t *shape)
{
    return new_tensor(gen, NULL, t, rank, shape, PT_TEMP);
}

int gen_hyper(Gen *gen, const char *name, DType dt, double value)
{
    for (int i = 0; i < gen->tensors.len; i++)
        if (gen->tensors.data[i].role == PT_HYPER && !strcmp(gen->tensors.data[i].name, name))
            return i;
    int t = new_tensor(gen, name, dt == DT_F64 ? DT_F64 : DT_F32, 0, NULL, PT_HYPER);
    gen->tensors.data[t].init_arg = value;
    return t;
}

int gen_tensor(Gen *gen, const Value *v)
{
    if (gen->tensor_of[v->id] < 0)
        BUG("value %%%d has no tensor", v->id);
    return gen->tensor_of[v->id];
}

PlanRole cg_role_of(const Op *op)
{
    switch (op->kind) {
    case OP_PARAM: return PT_PARAM;
    case OP_STATE: return PT_STATE;
    case OP_INPUT: return PT_INPUT;
    case OP_STEP: return PT_STEP;
    case OP_AXIS_OFFSET: return PT_COORD;
    default: return PT_TEMP;
    }
}

static void set_init(Gen *gen, PlanTensor *t, const Op *op)
{
    const Attr *a = ir_op_attr(op, "init");
    if (!a) {
        t->init = op->kind == OP_PARAM ? "normal" : "zeros";
        t->init_arg = op->kind == OP_PARAM ? 0.02 : 0;
        return;
    }
    t->init = arena_strdup(gen->a, a->s ? a->s : "zeros");
    t->init_arg = a->kind == ATTR_CALL && a->nitems ? a->items[0]->f : 0;
}

/* Mesh axis indices of an op's attr `axes` (names). */
int cg_attr_axes(const Gen *gen, const Op *op, int8_t *out)
{
    const Attr *a = ir_op_attr(op, "axes");
    int n = 0;
    for (int i = 0; a && i < a->nitems && n < PLAN_MAX_AXES; i++) {
        int ax = ir_mesh_axis(&gen->g->mesh, a->items[i]->s);
        if (ax < 0)
            BUG("axis '%s' is not in the mesh", a->items[i]->s);
        out[n++] = (int8_t)ax;
    }
    return n;
}

/* How the tensor's global value is split (from v's sharding); coord axes. */
static void set_split(Gen *gen, PlanTensor *t, const Value *v, const Op *op)
{
    for (int d = 0; d < v->rank; d++) {
        t->nsplit[d] = v->shard.naxes[d];
        memcpy(t->split[d], v->shard.axes[d], v->shard.naxes[d]);
    }
    if (op->kind == OP_AXIS_OFFSET) {
        t->ncoord = cg_attr_axes(gen, op, t->coord);
        t->init_arg = (double)ir_op_attr_int(op, "scale", 1);
    }
}

/* The largest id an i32 input may hold: the rows of the table it indexes. */
static void set_limits(Gen *gen)
{
    for (int i = 0; i < gen->g->ops.len; i++) {
        const Op *op = gen->g->ops.data[i];
        const Value *ids = NULL;
        int64_t limit = 0;
        const Mesh *m = &gen->g->mesh;
        if (op->kind == OP_EMBED) { /* the global vocabulary of a split table */
            ids = op->args[1];
            limit = op->args[0]->shape[0] * ir_shard_factor(m, &op->args[0]->shard, 0);
        } else if (op->kind == OP_GATHER) { /* the indices of a gather: its row */
            ids = op->args[1];
            limit = op->args[0]->shape[op->args[0]->rank - 1];
        } else if (op->kind == OP_SCATTER_ADD) { /* scatter's indices: its row */
            ids = op->args[0];
            limit = ir_op_attr_int(op, "size", 0);
        } else if (op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_SHARD) {
            ids = op->args[1];
            int last = op->args[0]->rank - 1;
            limit = op->args[0]->shape[last] * ir_shard_factor(m, &op->args[0]->shard, last);
        }
        while (ids && (ids->def->kind == OP_SLICE || ids->def->kind == OP_RESHAPE ||
                       (ids->def->kind >= OP_ALL_REDUCE && ids->def->kind <= OP_SHARD_SLICE)))
            ids = ids->def->args[0]; /* a microbatch's rows of the input, resharded */
        if (ids && ids->def->kind == OP_INPUT) {
            PlanTensor *t = &gen->tensors.data[gen->tensor_of[ids->id]];
            t->limit = t->limit ? (t->limit < limit ? t->limit : limit) : limit;
        }
    }
}

/* ---- a tensor for each value ---- */

/* The op that runs op's work: op itself, or the kernel of the user it is
 * fused into, and so on. */
static const Op *runs_in(const Gen *gen, const Op **user, const Op *op)
{
    while (op->nres == 1 && gen->fused[op->res[0]->id] && user[op->res[0]->id])
        op = user[op->res[0]->id];
    return op;
}

/* The gradient of the logits that cross_entropy f's row kernel writes
 * (gen->ce_pair) takes the logits' tensor when f and the gradient are their
 * only readers and nothing reads them after f: that kernel reads every
 * element of a row before it writes one (kernels.c), so the step holds one
 * copy of the vocabulary's activations, not two. */
static void logits_in_place(Gen *gen, const Op *f, const Op *b, const int *uses, const int *last,
                            int *into)
{
    const Value *x = f->args[0], *v = b->res[0];
    for (int i = 0; i < gen->g->outputs.len; i++)
        if (gen->g->outputs.data[i] == x || gen->g->outputs.data[i] == v)
            return;
    if (!x->def || x->def->kind == OP_RESHAPE || cg_role_of(x->def) != PT_TEMP || uses[x->id] != 2 ||
        last[x->id] > f->id || x->def->stage != f->stage || x->dtype != v->dtype ||
        x->rank != v->rank || memcmp(x->shape, v->shape, sizeof(int64_t) * (size_t)x->rank) ||
        gen->fused[x->id] || gen->fused[v->id] || (gen->view && (gen->view[x->id] || gen->view[v->id])))
        return;
    into[v->id] = x->id;
}

/* By value id, the value whose tensor it takes (-1: its own): a running
 * sum of weight gradients that its GEMM adds into (fusion.c), the tensor of
 * the sum so far; the
 * optimizer's new parameter or state (an adamw or sgd result that only its
 * update reads) is written straight into its target, whose kernel reads
 * each element before it writes it, when nothing reads the target later:
 * the update then moves nothing, and no temporary holds the new value. */
static int *in_place_updates(Gen *gen)
{
    const Graph *g = gen->g;
    int nv = g->values.len;
    int *into = arena_alloc(gen->a, sizeof(int) * (size_t)(nv + 1));
    int *uses = arena_alloc(gen->a, sizeof(int) * (size_t)(nv + 1));
    int *last = arena_alloc(gen->a, sizeof(int) * (size_t)(nv + 1)); /* its last reader's run */
    const Op **user = arena_alloc(gen->a, sizeof(Op *) * (size_t)(nv + 1));
    for (int v = 0; v < nv; v++)
        into[v] = -1, uses[v] = 0, last[v] = -1, user[v] = NULL;
    for (int i = 0; i < g->ops.len; i++)
        for (int j = 0; j < g->ops.data[i]->nargs; j++) {
            uses[g->ops.data[i]->args[j]->id]++;
            user[g->ops.data[i]->args[j]->id] = g->ops.data[i];
        }
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->kind == OP_UPDATE || (gen->dead && gen->dead[op->id]))
            continue;
        int at = runs_in(gen, user, op)->id;
        if (gen->ce_pair && gen->ce_pair[op->id] < 0) /* run in its cross_entropy's kernel */
            at = -gen->ce_pair[op->id] - 1;
        for (int j = 0; j < op->nargs; j++)
            if (at > last[op->args[j]->id])
                last[op->args[j]->id] = at;
    }
    for (int i = 0; i < g->ops.len; i++) {
        const Op *up = g->ops.data[i];
        if (up->kind != OP_UPDATE)
            continue;
        const Value *t = up->args[0], *v = up->args[1];
        const Op *d = v->def;
        if (!d || (d->kind != OP_ADAMW && d->kind != OP_SGD) || uses[v->id] != 1 ||
            (t->def->kind != OP_PARAM && t->def->kind != OP_STATE) || t->dtype != v->dtype ||
            t->rank != v->rank || memcmp(t->shape, v->shape, sizeof(int64_t) * (size_t)t->rank) ||
            gen->fused[v->id] || last[t->id] > d->id || t->def->stage != d->stage)
            continue;
        into[v->id] = t->id;
    }
    for (int i = 0; i < g->ops.len && gen->acc_gemm; i++) { /* a running sum of products */
        const Op *op = g->ops.data[i];
        if (op->kind != OP_ADD || !gen->acc_gemm[i])
            continue;
        const Value *m = g->ops.data[gen->acc_gemm[i] - 1]->res[0];
        into[op->res[0]->id] = (op->args[0] == m ? op->args[1] : op->args[0])->id;
    }
    for (int i = 0; i < g->ops.len && gen->ce_pair; i++) /* the logits' gradient */
        if (gen->ce_pair[i] > 0)
            logits_in_place(gen, g->ops.data[i], g->ops.data[gen->ce_pair[i] - 1], uses, last, into);
    return into;
}

/* Persistent tensors first (so a checkpoint is one range), then the rest. */
void cg_place_values(Gen *gen)
{
    int *into = in_place_updates(gen);
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < gen->g->ops.len; i++) {
            const Op *op = gen->g->ops.data[i];
            PlanRole r = cg_role_of(op);
            int want = r == PT_PARAM || r == PT_STATE ? 0
                       : r == PT_INPUT || r == PT_STEP || r == PT_COORD ? 1 : 2;
            if (want != pass || (gen->dead && gen->dead[op->id]))
                continue;
            gen->op = op;
            for (int j = 0; j < op->nres; j++) {
                const Value *v = op->res[j];
                if (gen->fused[v->id] || (gen->view && gen->view[v->id]))
                    continue;
                if (op->kind == OP_RESHAPE) { /* same memory, another shape */
                    gen->tensor_of[v->id] = gen->tensor_of[op->args[0]->id];
                    continue;
                }
                if (into[v->id] >= 0) { /* the optimizer's new value, in its target */
                    gen->tensor_of[v->id] = gen->tensor_of[into[v->id]];
                    continue;
                }
                int t = new_tensor(gen, v->name, v->dtype, v->rank, v->shape, r);
                gen->tensors.data[t].value = v->id;
                set_split(gen, &gen->tensors.data[t], v, op);
                if (r == PT_PARAM) /* state always starts at zero */
                    set_init(gen, &gen->tensors.data[t], op);
                if (r == PT_INPUT && ir_op_attr_int(op, "keys", 0)) /* dropout's: from the seed */
                    gen->tensors.data[t].init = arena_strdup(gen->a, "keys");
                gen->tensor_of[v->id] = t;
            }
        }
    }
    gen->op = NULL;
    set_limits(gen);
}
