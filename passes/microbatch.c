/* microbatch.c: gradient accumulation over microbatches. Reads the forward
 * graph and `microbatches = k` of the train block; writes the step of one
 * microbatch: every op that depends on the inputs sees rows [0, B/k) of each
 * input's first (batch) dimension, and the loss is the mean of the k
 * microbatch losses: a microbatch_sum of this one's, times 1/k. Ops that
 * only read parameters are shared. Key idea: the graph holds one microbatch
 * and the plan runs it k times (its schedule table, codegen/microbatch_loop.c), the
 * j-th time at rows [j B/k, (j+1) B/k); autodiff sums each shared value's
 * gradient the same way (a microbatch_sum where the microbatch's part is
 * made), so compiling costs the same for any k. When the loss is a mean
 * over the rows of the batch (as cross_entropy is), the mean of the k
 * microbatch losses is the full-batch loss, so the gradients accumulate
 * exactly (a loss that sums over rows comes out k times smaller). With
 * Settings.unroll the graph holds k copies instead, copy j seeing rows j, summed
 * by adds: --verify compares every value of such a step. */
#include "passes.h"

#include <string.h>

typedef struct MB {
    Ctx *c;
    Graph *g;
    int k, mb; /* microbatches; the one being built */
    int unroll;  /* Settings.unroll */
    int nops;    /* the forward's ops, before any copy */
    char *dep;   /* by Value.id: depends on an input */
    Value **map; /* by Value.id: its value in the copy being built */
} MB;

static int err(MB *m, Loc loc, const char *fmt, ...) PRINTF_LIKE(3, 4);
static int err(MB *m, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(&m->c->diag, SEV_ERROR, loc, 1, fmt, ap);
    va_end(ap);
    return -1;
}

static int op_dep(const MB *m, const Op *op) { return op->nres && m->dep[op->res[0]->id]; }

/* Input rows of microbatch j along dim 0. */
static Value *slice_input(MB *m, Value *in, int j)
{
    int64_t rows = in->shape[0] / m->k;
    Op *op = ir_op_new(m->g, OP_SLICE, &in, 1, in->loc);
    op->mb = j;
    Arena *a = m->g->arena;
    ir_op_set_attr(m->g, op, ir_attr_int(a, "dim", 0));
    ir_op_set_attr(m->g, op, ir_attr_int(a, "start", j * rows));
    ir_op_set_attr(m->g, op, ir_attr_int(a, "end", (j + 1) * rows));
    /* the marker: rows of each data-parallel rank's own piece (passes/shard_rules.c) */
    ir_op_set_attr(m->g, op, ir_attr_bool(a, "rows", 1));
    int64_t shape[IR_MAX_RANK];
    memcpy(shape, in->shape, sizeof(int64_t) * (size_t)in->rank);
    shape[0] = rows;
    Value *v = ir_op_result(m->g, op, in->dtype, in->rank, shape);
    v->name = in->name;
    return v;
}

/* A reshape of the batch must keep it first: its target shrinks with it. */
static int fix_reshape(MB *m, Op *copy, const Op *orig)
{
    const Attr *s = ir_op_attr(orig, "shape");
    const Value *in = orig->args[0];
    if (!s || !s->nitems || s->items[0]->kind != ATTR_INT || s->items[0]->i != in->shape[0])
        return err(m, orig->loc,
                   "microbatches: this reshape must keep the batch dimension (%lld) first",
                   (long long)in->shape[0]);
    int64_t dims[IR_MAX_RANK];
    for (int i = 0; i < s->nitems; i++)
        dims[i] = s->items[i]->i;
    dims[0] /= m->k;
    ir_op_set_attr(m->g, copy, ir_attr_ints(m->g->arena, "shape", dims, s->nitems));
    return 0;
}

/* Is n the batch size (dim 0) of an input? */
static int batch_size(const MB *m, int64_t n)
{
    for (int i = 0; i < m->nops; i++) {
        const Op *op = m->g->ops.data[i];
        if (op->kind == OP_INPUT && op->res[0]->rank && op->res[0]->shape[0] == n)
            return 1;
    }
    return 0;
}

/* An expand whose target's first dim is the batch: it broadcasts over the
 * batch's rows (vit's class token expanded to [B, 1, D]), so each microbatch
 * has its own rows, B/k of them, even when it broadcasts a parameter. */
static int expands_batch(const MB *m, const Op *op)
{
    const Attr *s = ir_op_attr(op, "shape");
    return op->kind == OP_EXPAND && s && s->nitems > 0 && s->items[0]->kind == ATTR_INT &&
           batch_size(m, s->items[0]->i);
}

static void fix_expand(MB *m, Op *copy, const Op *orig)
{
    const Attr *s = ir_op_attr(orig, "shape");
    int64_t dims[IR_MAX_RANK];
    for (int i = 0; i < s->nitems; i++)
        dims[i] = s->items[i]->i;
    dims[0] /= m->k;
    ir_op_set_attr(m->g, copy, ir_attr_ints(m->g->arena, "shape", dims, s->nitems));
}

static int clone_op(MB *m, const Op *op)
{
    Value *args[64];
    for (int i = 0; i < op->nargs && i < 64; i++)
        args[i] = m->map[op->args[i]->id] ? m->map[op->args[i]->id] : op->args[i];
    Op *copy = ir_op_new(m->g, op->kind, args, op->nargs, op->loc);
    copy->layer = op->layer;
    copy->phase = op->phase;
    copy->stage = op->stage;
    copy->mb = m->mb;
    for (int i = 0; i < op->nattrs; i++)
        ir_op_set_attr(m->g, copy, op->attrs[i]);
    if (op->kind == OP_RESHAPE && fix_reshape(m, copy, op) != 0)
        return -1;
    if (expands_batch(m, op))
        fix_expand(m, copy, op);
    for (int i = 0; i < op->nres; i++) {
        DType dt;
        int rank;
        int64_t shape[IR_MAX_RANK];
        char msg[256];
        if (ir_infer_result(copy, i, &dt, &rank, shape, msg, sizeof msg) != 0)
            return err(m, op->loc, "microbatches: %s (this op does not split by batch rows)", msg);
        Value *v = ir_op_result(m->g, copy, dt, rank, shape);
        v->name = op->res[i]->name;
        v->shard = op->res[i]->shard;
        for (int d = 0; d < rank; d++) {
            int64_t f = ir_shard_factor(&m->g->mesh, &v->shard, d);
            if (f > 1 && shape[d] % f != 0)
                return err(m, op->loc,
                           "microbatches: dimension %d of a microbatch of '%s' has size %lld, "
                           "which is not divisible by %lld, the mesh axes it is split over",
                           d, v->name ? v->name : "?", (long long)shape[d], (long long)f);
        }
        m->map[op->res[i]->id] = v;
    }
    return 0;
}

static void mark_deps(MB *m, int nops)
{
    for (int i = 0; i < nops; i++) {
        const Op *op = m->g->ops.data[i];
        int d = op->kind == OP_INPUT || expands_batch(m, op);
        for (int j = 0; j < op->nargs; j++)
            d |= m->dep[op->args[j]->id];
        for (int j = 0; j < op->nres; j++)
            m->dep[op->res[j]->id] = (char)d;
    }
}

/* How many pieces the data-parallel axes (annotated on dim 0, or of role data
 * or fsdp) cut the batch of v into. */
static int64_t data_pieces(const MB *m, const Value *v)
{
    const Mesh *mesh = &m->g->mesh;
    int64_t f = 1;
    for (int ax = 0; ax < mesh->naxes; ax++) {
        int on0 = 0;
        for (int i = 0; i < v->shard.naxes[0]; i++)
            on0 |= v->shard.axes[0][i] == ax;
        AxisRole r = mesh->axes[ax].role;
        if (on0 || r == ROLE_DATA || r == ROLE_FSDP)
            f *= mesh->axes[ax].size;
    }
    return f;
}

static int check_inputs(MB *m, int nops)
{
    for (int i = 0; i < nops; i++) {
        const Op *op = m->g->ops.data[i];
        if (op->kind != OP_INPUT)
            continue;
        const Value *v = op->res[0];
        if (v->rank == 0 || v->shape[0] % m->k != 0)
            return err(m, op->loc,
                       "microbatches: the batch dimension of input '%s' (%lld) is not divisible "
                       "by %d microbatches",
                       v->name ? v->name : "?", (long long)(v->rank ? v->shape[0] : 0), m->k);
        int64_t f = data_pieces(m, v);
        if (f > 1 && v->shape[0] % (f * m->k) != 0)
            return err(m, op->loc,
                       "microbatches: input '%s' has %lld rows over %lld data-parallel ranks, "
                       "which do not split into %d microbatches per rank",
                       v->name ? v->name : "?", (long long)v->shape[0], (long long)f, m->k);
    }
    return 0;
}

/* The loss of the step: the mean of the microbatch losses. */
static Value *mean_loss(MB *m, Value **losses)
{
    Value *sum = losses[0];
    Loc loc = sum->loc;
    for (int j = 1; j < m->k && m->unroll; j++) {
        Op *add = ir_op_new(m->g, OP_ADD, (Value *[]){sum, losses[j]}, 2, loc);
        sum = ir_op_result(m->g, add, sum->dtype, 0, NULL);
    }
    if (!m->unroll) { /* the loop: each microbatch adds its loss */
        Op *acc = ir_op_new(m->g, OP_MB_SUM, &sum, 1, loc);
        sum = ir_op_result(m->g, acc, sum->dtype, 0, NULL);
    }
    Op *c = ir_op_new(m->g, OP_CONSTANT, NULL, 0, loc);
    ir_op_set_attr(m->g, c, ir_attr_float(m->g->arena, "value", 1.0 / m->k));
    Value *inv = ir_op_result(m->g, c, sum->dtype, 0, NULL);
    Op *mul = ir_op_new(m->g, OP_MUL, (Value *[]){sum, inv}, 2, loc);
    ir_op_set_attr(m->g, mul, ir_attr_int(m->g->arena, "microbatches", m->k)); /* the marker */
    Value *loss = ir_op_result(m->g, mul, sum->dtype, 0, NULL);
    loss->name = intern(m->g->strings, "loss");
    return loss;
}

int pass_microbatch(Ctx *c, Graph *g, const Settings *s)
{
    const TrainConfig tc = s->train;
    for (int i = 0; i < g->ops.len; i++) /* already unrolled, or past autodiff */
        if (g->ops.data[i]->phase != PH_FWD || ir_op_attr(g->ops.data[i], "microbatches"))
            return 0;
    if (!g->outputs.len)
        return 0;
    int nops = g->ops.len;
    MB m = {c, g, (int)tc.microbatches, 0, s->unroll, nops, NULL, NULL};
    if (m.k <= 1) { /* one microbatch: what reads the data is microbatch 0 */
        m.dep = arena_alloc(g->arena, (size_t)g->values.len + 1);
        mark_deps(&m, nops);
        for (int i = 0; i < nops; i++)
            if (op_dep(&m, g->ops.data[i]) && g->ops.data[i]->kind != OP_INPUT)
                g->ops.data[i]->mb = 0;
        return 0;
    }
    if (check_inputs(&m, nops) != 0)
        return -1;
    m.dep = arena_alloc(g->arena, (size_t)g->values.len + 1);
    mark_deps(&m, nops);
    Value *loss = g->outputs.data[0], **losses = arena_alloc(g->arena, sizeof(Value *) * (size_t)m.k);
    if (!m.dep[loss->id])
        return 0; /* the loss does not read the data: nothing to split */
    /* every copy is fresh; the originals that read the data are dropped after */
    size_t mapsz = sizeof(Value *) * (size_t)(g->values.len + 1);
    VEC(Op *) kept = {0};
    for (int i = 0; i < nops; i++)
        if (!op_dep(&m, g->ops.data[i]) || g->ops.data[i]->kind == OP_INPUT)
            VEC_PUSH(g->arena, kept, g->ops.data[i]);
    for (int j = 0; j < (s->unroll ? m.k : 1); j++) { /* the loop: the first only */
        m.mb = j;
        m.map = arena_alloc(g->arena, mapsz);
        for (int i = 0; i < nops; i++) {
            const Op *op = g->ops.data[i];
            if (op->kind == OP_INPUT)
                m.map[op->res[0]->id] = slice_input(&m, op->res[0], j);
            else if (op_dep(&m, op) && clone_op(&m, op) != 0)
                return -1;
        }
        losses[j] = m.map[loss->id];
    }
    Value *total = mean_loss(&m, losses);
    /* sources and shared ops first, then the copies */
    VEC(Op *) ops = {0};
    for (int i = 0; i < kept.len; i++)
        VEC_PUSH(g->arena, ops, kept.data[i]);
    for (int i = nops; i < g->ops.len; i++)
        VEC_PUSH(g->arena, ops, g->ops.data[i]);
    g->ops.data = ops.data;
    g->ops.len = ops.len;
    g->ops.cap = ops.cap;
    for (int i = 0; i < g->ops.len; i++)
        g->ops.data[i]->id = i;
    g->outputs.len = 0;
    VEC_PUSH(g->arena, g->outputs, total);
    return 0;
}
