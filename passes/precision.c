/* precision.c: bf16 mixed precision (train setting precision = bf16), and
 * precision = f64 (every float in float64: promote_f64).
 * Reads the forward and backward graph that autodiff left (outputs: loss, one
 * gradient per parameter); writes it with bf16 activations. Parameters stay
 * f32 (the master weights): every fwd/bwd op that reads one reads its bf16
 * cast, made once per step before its first reader. Float inputs are cast the
 * same way. The loss stays f32: cross_entropy gives f32 for bf16 logits, the
 * scalar arithmetic that combines loss terms (an auxiliary loss, its weight,
 * the mean over microbatches) runs in f32, and a loss that is a bf16
 * reduction is widened by a cast. Each gradient reaches the optimizer as
 * f32: the adds that accumulate it (microbatches, a parameter read twice) run
 * on f32 casts of their operands, so the sum, the data-parallel reduction
 * that partition puts on it and the clipping norm are f32. Kernels compute in
 * f32 whatever their storage.
 * Key idea: walk the ops in order, giving each a mode (keep, bf16, f32), cast
 * the float operands that differ from the mode, and recompute its results'
 * dtypes with the shape rules. Only f32 values change: an f64 model (or an f64
 * part of one) is left as it is. */
#include "passes.h"

#include <string.h>

typedef enum { MODE_KEEP, MODE_BF16, MODE_F32 } Mode;

typedef struct Prec {
    Graph *g;
    Value **cast_bf16, **cast_f32; /* by 2 value id + slot: the cast made, or NULL */
    int regather;                  /* zero = 3 or an fsdp axis: the backward's own casts */
    uint8_t *f32;                  /* by op id: runs in f32 (a gradient's accumulating add,
                                      the scalar arithmetic of the loss) */
    const Op *reader;              /* the op whose operands are being cast */
    int nv;                        /* values before the pass: casts are numbered above */
} Prec;

/* An f32 parameter or input: what the pass reads through a bf16 cast. */
static int is_source(const Value *v)
{
    return v->dtype == DT_F32 && v->def && (v->def->kind == OP_PARAM || v->def->kind == OP_INPUT);
}

/* v as dtype dt: one cast per value and dtype, placed before its first reader. */
static Value *cast_to(Prec *p, Value *v, DType dt)
{
    Value **memo = dt == DT_BF16 ? p->cast_bf16 : p->cast_f32;
    if (v->dtype == dt)
        return v;
    if (v->id >= p->nv) /* a cast of ours: its operand has the other dtype */
        return v->def->args[0];
    /* parameters gathered again for the backward (ZeRO-3, FSDP) get a second
     * cast there, so that no whole weight copy lives from forward to backward */
    int slot = 2 * v->id +
               (p->regather && p->reader->phase == PH_BWD && v->def && v->def->kind == OP_PARAM);
    if (memo[slot])
        return memo[slot];
    Op *op = ir_op_new(p->g, OP_CAST, &v, 1, p->reader->loc);
    op->phase = p->reader->phase;
    op->layer = p->reader->layer;
    op->mb = v->def ? v->def->mb : -1;
    Attr *a = ir_attr_str(p->g->arena, "dtype", ir_dtype_name(dt));
    ir_op_finish(p->g, op, &a, 1, "the precision pass");
    Value *c = op->res[0];
    if (v->def && v->def->kind == OP_PARAM && v->name)
        c->name =
            intern(p->g->strings, arena_printf(p->g->arena, "%s.%s", v->name, ir_dtype_name(dt)));
    memo[slot] = c;
    return c;
}

/* The adds whose results flow only by adds into gradient output v (a chain as
 * long as the microbatches: a worklist, not recursion), and the transposes
 * and reshapes of the backward between them (a tied embedding's gradient:
 * the output projection's sum over microbatches, transposed, plus the
 * embedding's). */
static void mark_chain(Prec *p, Value *v)
{
    VEC(Value *) todo = {0};
    VEC_PUSH(p->g->arena, todo, v);
    while (todo.len) {
        Op *d = todo.data[--todo.len]->def;
        int layout = d && (d->kind == OP_TRANSPOSE || d->kind == OP_RESHAPE) && d->mb < 0;
        if (!d || (d->kind != OP_ADD && d->kind != OP_MB_SUM && !layout) || d->phase != PH_BWD ||
            p->f32[d->id])
            continue;
        p->f32[d->id] = 1;
        for (int a = 0; a < d->nargs; a++)
            VEC_PUSH(p->g->arena, todo, d->args[a]);
    }
}

/* The forward ops that combine the loss from scalar terms: all their operands
 * and results are scalars. Rounding them to bf16 would round the f32
 * cross-entropy term by 2^-9 of the whole loss; in f32 they cost nothing. */
static void mark_loss(Prec *p, Value *loss)
{
    VEC(Value *) todo = {0};
    VEC_PUSH(p->g->arena, todo, loss);
    while (todo.len) {
        Op *d = todo.data[--todo.len]->def;
        if (!d || d->phase != PH_FWD || p->f32[d->id] || !d->nargs)
            continue;
        int scalar = d->nres == 1 && d->res[0]->rank == 0;
        for (int i = 0; i < d->nargs; i++)
            scalar &= d->args[i]->rank == 0;
        if (!scalar)
            continue;
        p->f32[d->id] = 1;
        for (int i = 0; i < d->nargs; i++)
            VEC_PUSH(p->g->arena, todo, d->args[i]);
    }
}

static Mode mode_of(const Prec *p, const Op *op)
{
    if (op->phase != PH_FWD && op->phase != PH_BWD)
        return MODE_KEEP;
    if (p->f32[op->id])
        return MODE_F32;
    Mode m = MODE_KEEP;
    for (int i = 0; i < op->nargs; i++)
        if (op->args[i]->dtype == DT_BF16 || is_source(op->args[i]))
            m = MODE_BF16;
    /* embed_grad adds into its table row by row, which bf16 storage would
     * round each time (attention_grad's shape rule keeps its sums dk, dv f32) */
    if (m == MODE_BF16 && op->kind == OP_EMBED_GRAD)
        return MODE_F32;
    return m;
}

/* Cast op's float operands to its mode, then retype its results. */
static void retype(Prec *p, Op *op)
{
    Mode m = mode_of(p, op);
    p->reader = op;
    for (int i = 0; i < op->nargs && m != MODE_KEEP; i++) {
        if (op->args[i]->dtype != DT_F32 && op->args[i]->dtype != DT_BF16)
            continue; /* ids; f64 is left alone */
        if (op->kind == OP_CROSS_ENTROPY_GRAD && i == 2)
            continue; /* the f32 loss gradient */
        if (op->args[i]->def && op->args[i]->def->kind == OP_STEP)
            continue; /* the step number, f32 always (dropout's operand) */
        op->args[i] = cast_to(p, op->args[i], m == MODE_BF16 ? DT_BF16 : DT_F32);
    }
    if (op->kind == OP_PARAM || op->kind == OP_INPUT || op->kind == OP_STATE ||
        op->kind == OP_CONSTANT || op->kind == OP_STEP || op->kind == OP_ARANGE)
        return; /* arange: f32, exact to 2^24 whatever its readers' precision */
    for (int i = 0; i < op->nres; i++) {
        DType dt;
        int rank;
        int64_t shape[IR_MAX_RANK];
        char err[256];
        if (ir_infer_result(op, i, &dt, &rank, shape, err, sizeof err) != 0)
            BUG("the precision pass made an invalid '%s': %s", ir_ops[op->kind].name, err);
        op->res[i]->dtype = dt;
    }
}

/* A loss that op made bf16 (a reduction of bf16 values) gets an f32 cast right
 * after it, and the name: the plan's loss is an f32 scalar. */
static void widen_loss(Prec *p, Op *op)
{
    Value *loss = p->g->outputs.data[0];
    if (loss->def != op || loss->dtype != DT_BF16)
        return;
    p->reader = op;
    Value *wide = cast_to(p, loss, DT_F32);
    wide->name = loss->name;
    loss->name = NULL;
    p->g->outputs.data[0] = wide;
}

/* A backward matmul of bf16 operands whose only reader is a cast to f32 (a
 * weight gradient on its way into the f32 sum over microbatches, or to the
 * optimizer) makes f32 itself (matmul's dtype = "f32"): the GEMM's f32
 * accumulation is kept instead of rounded to bf16 and widened, and the
 * GEMM can add it into the sum in place (codegen/fusion.c). The cast goes:
 * its readers read the matmul. */
static void widen_gradient_matmuls(Graph *g)
{
    int nv = g->values.len;
    int *uses = arena_alloc(g->arena, sizeof(int) * (size_t)(nv + 1));
    memset(uses, 0, sizeof(int) * (size_t)(nv + 1));
    for (int i = 0; i < g->ops.len; i++)
        for (int a = 0; a < g->ops.data[i]->nargs; a++)
            uses[g->ops.data[i]->args[a]->id]++;
    for (int i = 0; i < g->outputs.len; i++)
        uses[g->outputs.data[i]->id]++;
    Value **to = arena_alloc(g->arena, sizeof(Value *) * (size_t)(nv + 1));
    memset(to, 0, sizeof(Value *) * (size_t)(nv + 1));
    int k = 0;
    for (int i = 0; i < g->ops.len; i++) {
        Op *c = g->ops.data[i];
        Value *m = c->kind == OP_CAST ? c->args[0] : NULL;
        if (!m || c->res[0]->dtype != DT_F32 || m->dtype != DT_BF16 || !m->def ||
            m->def->kind != OP_MATMUL || m->def->phase != PH_BWD || uses[m->id] != 1 ||
            ir_op_attr(m->def, "dtype")) {
            g->ops.data[k++] = c;
            continue;
        }
        ir_op_set_attr(g, m->def, ir_attr_str(g->arena, "dtype", "f32"));
        m->dtype = DT_F32;
        to[c->res[0]->id] = m;
        if (c->res[0]->name && !m->name)
            m->name = c->res[0]->name;
        c->res[0]->name = NULL; /* the cast is gone: no value of the graph's is it */
    }
    g->ops.len = k;
    for (int i = 0; i < g->ops.len; i++) {
        Op *op = g->ops.data[i];
        op->id = i;
        for (int a = 0; a < op->nargs; a++)
            if (to[op->args[a]->id])
                op->args[a] = to[op->args[a]->id];
    }
    for (int i = 0; i < g->outputs.len; i++)
        if (to[g->outputs.data[i]->id])
            g->outputs.data[i] = to[g->outputs.data[i]->id];
}

/* Already applied: some parameter is read through a bf16 cast. */
static int applied(const Graph *g)
{
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->kind == OP_CAST && op->res[0]->dtype == DT_BF16 && op->args[0]->def &&
            op->args[0]->def->kind == OP_PARAM)
            return 1;
    }
    return 0;
}

/* precision = f64: every float value in float64, and every cast to a float
 * dtype a cast to f64 (an identity). --verify compiles both of its plans so:
 * the mesh and one device then agree up to the order of their sums. */
static void promote_f64(Graph *g)
{
    const char *f64 = intern(g->strings, ir_dtype_name(DT_F64));
    for (int i = 0; i < g->values.len; i++) /* (the step number is f32 always: dropout's) */
        if (ir_dtype_is_float(g->values.data[i]->dtype) &&
            !(g->values.data[i]->def && g->values.data[i]->def->kind == OP_STEP))
            g->values.data[i]->dtype = DT_F64;
    for (int i = 0; i < g->ops.len; i++) {
        Op *op = g->ops.data[i];
        if (op->kind == OP_ARANGE) /* its dtype is an attr, as a cast's */
            ir_op_set_attr(g, op, ir_attr_str(g->arena, "dtype", f64));
        for (int k = 0; op->kind == OP_CAST && k < op->nattrs; k++) {
            Attr *a = op->attrs[k];
            int dt = a->key && !strcmp(a->key, "dtype") && a->kind == ATTR_STR
                         ? ir_dtype_lookup(a->s)
                         : -1;
            if (dt >= 0 && ir_dtype_is_float((DType)dt))
                a->s = f64;
        }
    }
}

int pass_precision(Ctx *c, Graph *g, const Settings *s)
{
    const TrainConfig tc = s->train;
    if (!strcmp(tc.precision, "f64")) {
        promote_f64(g);
        return 0;
    }
    if (strcmp(tc.precision, "bf16") || applied(g))
        return 0;
    int n = g->ops.len, nv = g->values.len;
    Prec p = {.g = g,
              .nv = nv,
              .f32 = arena_alloc(g->arena, (size_t)n + 1),
              .cast_bf16 = arena_alloc(g->arena, sizeof(Value *) * (size_t)(2 * nv + 2)),
              .cast_f32 = arena_alloc(g->arena, sizeof(Value *) * (size_t)(2 * nv + 2))};
    memset(p.cast_bf16, 0, sizeof(Value *) * (size_t)(2 * nv + 2));
    memset(p.cast_f32, 0, sizeof(Value *) * (size_t)(2 * nv + 2));
    p.regather = ir_regathers(g, &tc);
    memset(p.f32, 0, (size_t)n + 1);
    for (int i = 1; i < g->outputs.len; i++)
        mark_chain(&p, g->outputs.data[i]);
    mark_loss(&p, g->outputs.data[0]);
    Op **old = arena_alloc(g->arena, sizeof(Op *) * (size_t)(n + 1));
    memcpy(old, g->ops.data, sizeof(Op *) * (size_t)n);
    g->ops.len = 0; /* casts are appended before their reader, then the reader */
    for (int i = 0; i < n; i++) {
        retype(&p, old[i]);
        VEC_PUSH(g->arena, g->ops, old[i]);
        widen_loss(&p, old[i]);
    }
    for (int i = 1; i < g->outputs.len; i++) { /* gradients into the optimizer: f32 */
        Value *v = g->outputs.data[i];
        if (v->dtype == DT_BF16) {
            p.reader = v->def;
            g->outputs.data[i] = cast_to(&p, v, DT_F32);
        }
    }
    if (tc.grad_accumulation_fusion)
        widen_gradient_matmuls(g);
    for (int i = 0; i < g->ops.len; i++)
        g->ops.data[i]->id = i;
    return 0;
}
