/* optimizer.c: the parameter update of one training step.
 * Reads the train settings and the gradients that autodiff left as outputs
 * 1.. (one per parameter, in order); appends phase-opt ops: the learning rate
 * at this step, the global gradient norm (and clipping by it), and one SGD or
 * AdamW update per parameter, whose new values are stored back with 'update'.
 * Optimizer moments are 'state' values, ordinary tensors that later passes can
 * shard like parameters. The outputs become loss, learning rate, gradient norm.
 * Weight decay skips rank-1 parameters (norm gains and biases). For --verify
 * (Settings.keep_grads) each gradient, before clipping, is also stored into a
 * state "NAME:grad", so that the contract check can compare gradients. */
#include "passes.h"

#include <string.h>

typedef struct Opt {
    Ctx *c;
    Graph *g;
    TrainConfig tc;
    const Op *at; /* the parameter whose update is being built */
} Opt;

static Op *new_op(Opt *o, OpKind k, Value **args, int n)
{
    Op *op = ir_op_new(o->g, k, args, n, o->at ? o->at->loc : LOC_NONE);
    op->phase = PH_OPT;
    op->layer = o->at ? o->at->layer : -1;
    return op;
}

/* An op whose results take the types the shape rules give. */
static Op *emit_op(Opt *o, OpKind k, Value **args, int n, Attr **attrs, int na)
{
    Op *op = new_op(o, k, args, n);
    ir_op_finish(o->g, op, attrs, na, "the optimizer");
    return op;
}

static Value *emit(Opt *o, OpKind k, Value **args, int n, Attr **attrs, int na)
{
    return emit_op(o, k, args, n, attrs, na)->res[0];
}

static Value *bin(Opt *o, OpKind k, Value *a, Value *b)
{
    return emit(o, k, (Value *[]){a, b}, 2, NULL, 0);
}

static Value *source(Opt *o, OpKind k, DType dt, int rank, const int64_t *shape, const char *name)
{
    Op *op = new_op(o, k, NULL, 0);
    Value *v = ir_op_result(o->g, op, dt, rank, shape);
    if (k == OP_STATE)
        ir_op_set_attr(o->g, op, ir_attr_str(o->g->arena, "init", "zeros"));
    v->name = name ? intern(o->g->strings, name) : NULL;
    return v;
}

static void update(Opt *o, Value *target, Value *v) { new_op(o, OP_UPDATE, (Value *[]){target, v}, 2); }

static Value *as_dtype(Opt *o, Value *v, DType dt);

/* The schedule is computed in float64 when the model is (step is f32 always). */
static Value *learning_rate(Opt *o, DType dt)
{
    static const char *names[] = {"constant", "cosine", "linear"};
    Arena *a = o->g->arena;
    Value *t = as_dtype(o, source(o, OP_STEP, DT_F32, 0, NULL, "step"), dt);
    Attr *attrs[5] = {ir_attr_float(a, "lr", o->tc.lr), ir_attr_str(a, "schedule", names[o->tc.schedule]),
                      ir_attr_int(a, "warmup", o->tc.warmup), ir_attr_int(a, "total", o->tc.total_steps),
                      ir_attr_float(a, "min_lr", o->tc.min_lr)};
    Value *lr = emit(o, OP_LR, &t, 1, attrs, 5);
    lr->name = intern(o->g->strings, "lr");
    return lr;
}

/* sqrt(sum over every gradient of the sum of its squares), in dt. Each
 * gradient's squares are summed one dim at a time, not through a flattening
 * reshape: a split dimension then gives a partial sum instead of a gather
 * (passes/shard_rules.c). The sums are made a level at a time, the first
 * dim's of every gradient, then the second's: the sums of one level are
 * independent, so code generation runs them as one group of kernels
 * (codegen/groups.c) instead of one parallel region each. */
static Value *global_norm(Opt *o, Value **grads, int n, DType dt)
{
    Value *total = NULL, **s = arena_alloc(o->g->arena, sizeof(Value *) * (size_t)(n + 1));
    int most = 0;
    for (int i = 0; i < n; i++) {
        s[i] = bin(o, OP_MUL, grads[i], grads[i]);
        most = grads[i]->rank > most ? grads[i]->rank : most;
    }
    for (int d = 0; d < most; d++)
        for (int i = 0; i < n; i++)
            if (d < grads[i]->rank)
                s[i] = emit(o, OP_SUM, &s[i], 1, NULL, 0);
    for (int i = 0; i < n; i++) {
        if (grads[i]->dtype != dt) {
            Attr *cast = ir_attr_str(o->g->arena, "dtype", ir_dtype_name(dt));
            s[i] = emit(o, OP_CAST, &s[i], 1, &cast, 1);
        }
        total = total ? bin(o, OP_ADD, total, s[i]) : s[i];
    }
    if (!total)
        total = source(o, OP_CONSTANT, dt, 0, NULL, NULL);
    Value *norm = emit(o, OP_SQRT, &total, 1, NULL, 0);
    norm->name = intern(o->g->strings, "grad_norm");
    return norm;
}

static Value *as_dtype(Opt *o, Value *v, DType dt)
{
    if (v->dtype == dt)
        return v;
    Attr *a = ir_attr_str(o->g->arena, "dtype", ir_dtype_name(dt));
    return emit(o, OP_CAST, &v, 1, &a, 1);
}

static const char *state_name(Opt *o, const Value *p, const char *suffix)
{
    return arena_printf(o->g->arena, "%s.%s", p->name ? p->name : "param", suffix);
}

static void update_param(Opt *o, Value *p, Value *g, Value *lr32, Value *step)
{
    Arena *a = o->g->arena;
    double wd = p->rank >= 2 ? o->tc.weight_decay : 0.0;
    Value *lr = as_dtype(o, lr32, p->dtype);
    if (o->tc.optimizer == OPT_ADAMW) {
        Value *m = source(o, OP_STATE, p->dtype, p->rank, p->shape, state_name(o, p, "m"));
        Value *v = source(o, OP_STATE, p->dtype, p->rank, p->shape, state_name(o, p, "v"));
        Attr *attrs[4] = {ir_attr_float(a, "beta1", o->tc.beta1), ir_attr_float(a, "beta2", o->tc.beta2),
                          ir_attr_float(a, "eps", o->tc.eps), ir_attr_float(a, "weight_decay", wd)};
        Op *op = emit_op(o, OP_ADAMW, (Value *[]){p, g, m, v, lr, as_dtype(o, step, p->dtype)}, 6,
                         attrs, 4);
        update(o, p, op->res[0]);
        update(o, m, op->res[1]);
        update(o, v, op->res[2]);
        return;
    }
    if (o->tc.momentum > 0) {
        Value *mom = source(o, OP_STATE, p->dtype, p->rank, p->shape, state_name(o, p, "momentum"));
        Attr *attrs[2] = {ir_attr_float(a, "momentum", o->tc.momentum),
                          ir_attr_float(a, "weight_decay", wd)};
        Op *op = emit_op(o, OP_SGD, (Value *[]){p, g, mom, lr}, 4, attrs, 2);
        update(o, p, op->res[0]);
        update(o, mom, op->res[1]);
        return;
    }
    if (wd > 0) { /* plain SGD: p - lr (g + wd p) */
        Op *c = new_op(o, OP_CONSTANT, NULL, 0);
        ir_op_set_attr(o->g, c, ir_attr_float(a, "value", wd));
        g = bin(o, OP_ADD, g, bin(o, OP_MUL, p, ir_op_result(o->g, c, p->dtype, 0, NULL)));
    }
    update(o, p, bin(o, OP_SUB, p, bin(o, OP_MUL, g, lr)));
}

static int has_phase(const Graph *g, Phase ph)
{
    for (int i = 0; i < g->ops.len; i++)
        if (g->ops.data[i]->phase == ph)
            return 1;
    return 0;
}

int pass_optimizer(Ctx *c, Graph *g, const Settings *s)
{
    if (has_phase(g, PH_OPT))
        return 0;
    Opt o = {c, g, s->train, NULL};
    VEC(Value *) params = {0};
    for (int i = 0; i < g->ops.len; i++)
        if (g->ops.data[i]->kind == OP_PARAM)
            VEC_PUSH(g->arena, params, g->ops.data[i]->res[0]);
    if (params.len == 0)
        return 0; /* nothing to train */
    if (!has_phase(g, PH_BWD) || g->outputs.len != params.len + 1) {
        diag_error(&c->diag, LOC_NONE, "the optimizer needs the gradients that autodiff makes");
        return -1;
    }
    Value *loss = g->outputs.data[0], **grads = g->outputs.data + 1;
    DType sdt = DT_F32;
    for (int i = 0; i < params.len; i++)
        sdt = params.data[i]->dtype == DT_F64 ? DT_F64 : sdt;
    Value *lr = learning_rate(&o, sdt);
    Value *step = lr->def->args[0];
    Value *norm = global_norm(&o, grads, params.len, sdt);
    for (int i = 0; s->keep_grads && i < params.len; i++) {
        o.at = params.data[i]->def;
        Value *gv = grads[i];
        const char *name = params.data[i]->name ? params.data[i]->name : "param";
        update(&o, source(&o, OP_STATE, gv->dtype, gv->rank, gv->shape,
                          arena_printf(g->arena, "%s:grad", name)),
               gv);
    }
    o.at = NULL;
    if (o.tc.grad_clip > 0) {
        Attr *mx = ir_attr_float(g->arena, "max_norm", o.tc.grad_clip);
        Value *scale = emit(&o, OP_CLIP_SCALE, &norm, 1, &mx, 1);
        for (int i = 0; i < params.len; i++)
            grads[i] = bin(&o, OP_MUL, grads[i], as_dtype(&o, scale, grads[i]->dtype));
    }
    for (int i = 0; i < params.len; i++) {
        o.at = params.data[i]->def;
        update_param(&o, params.data[i], grads[i], lr, step);
    }
    g->outputs.len = 0;
    VEC_PUSH(g->arena, g->outputs, loss);
    VEC_PUSH(g->arena, g->outputs, lr);
    VEC_PUSH(g->arena, g->outputs, norm);
    return 0;
}
