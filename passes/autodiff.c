/* autodiff.c: reverse-mode differentiation of the forward graph.
 * Reads the forward ops and the scalar loss (outputs[0]); appends backward ops
 * (phase bwd, with the layer and location of the forward op they mirror) and
 * sets the outputs to the loss followed by the gradient of every parameter in
 * declaration order, each named PARAM.grad. Key idea: one vector-Jacobian rule
 * per op kind, written with ordinary IR ops plus a few *_grad ops; a value
 * used more than once gets the sum of its gradients (e.g. GPT-2's tied
 * embedding, used by the embedding and the output layer). */
#include "passes.h"

#include <string.h>

/* A microbatch's part of a gradient, summed over its own contributions. */
typedef struct Part {
    Value *sum;
    int mb;
    struct Part *next;
} Part;

typedef struct AD {
    Ctx *c;
    Graph *g;
    Part **grad;   /* by Value.id: the gradient so far, one part per microbatch; NULL when none */
    char *needs;   /* by Value.id: depends on a parameter */
    const Op *fwd; /* the forward op being differentiated */
    int failed;    /* an op had no rule (hand-written IR) */
    int loop;      /* the graph holds one microbatch of several (a microbatch_sum makes its loss) */
} AD;

/* Append a backward op; its types come from the shape rules. */
static Op *emit_op(AD *ad, OpKind k, Value **args, int n, Attr **attrs, int na)
{
    Op *op = ir_op_new(ad->g, k, args, n, ad->fwd->loc);
    op->phase = PH_BWD;
    op->layer = ad->fwd->layer;
    op->mb = ad->fwd->mb;
    ir_op_finish(ad->g, op, attrs, na, "autodiff");
    return op;
}

static Value *emit(AD *ad, OpKind k, Value **args, int n, Attr **attrs, int na)
{
    return emit_op(ad, k, args, n, attrs, na)->res[0];
}

static Value *un(AD *ad, OpKind k, Value *a) { return emit(ad, k, &a, 1, NULL, 0); }
static Value *bin(AD *ad, OpKind k, Value *a, Value *b)
{
    Value *args[2] = {a, b};
    return emit(ad, k, args, 2, NULL, 0);
}

static Value *constant(AD *ad, double x, DType dt, int rank, const int64_t *shape)
{
    Op *op = ir_op_new(ad->g, OP_CONSTANT, NULL, 0, ad->fwd->loc);
    op->phase = PH_BWD;
    op->layer = ad->fwd->layer;
    op->mb = ad->fwd->mb;
    ir_op_set_attr(ad->g, op, ir_attr_float(ad->g->arena, "value", x));
    return ir_op_result(ad->g, op, dt, rank, shape);
}

static Value *scale(AD *ad, Value *v, double x)
{
    return bin(ad, OP_MUL, v, constant(ad, x, v->dtype, 0, NULL));
}

static Attr *ints(AD *ad, const char *key, const int64_t *v, int n)
{
    return ir_attr_ints(ad->g->arena, key, v, n);
}

static Attr *int1(AD *ad, const char *key, int64_t v) { return ir_attr_int(ad->g->arena, key, v); }

static Value *reshape(AD *ad, Value *v, int rank, const int64_t *shape)
{
    if (v->rank == rank && !memcmp(v->shape, shape, sizeof(int64_t) * (size_t)rank))
        return v;
    Attr *a = ints(ad, "shape", shape, rank);
    return emit(ad, OP_RESHAPE, &v, 1, &a, 1);
}

/* Sum a broadcast gradient back to the shape of the operand it came from. */
static Value *unbroadcast(AD *ad, Value *dy, const Value *like)
{
    if (dy->rank == like->rank && !memcmp(dy->shape, like->shape, sizeof(int64_t) * (size_t)dy->rank))
        return dy;
    Attr *a = ints(ad, "shape", like->shape, like->rank);
    return emit(ad, OP_SUM_TO, &dy, 1, &a, 1);
}

/* Add g to the gradient of v: into the part of g's microbatch. A gradient
 * of another float type (attention's dk and dv are f32 for bf16 operands) is
 * cast to v's first: the gradient of a value has its dtype. */
static void accumulate(AD *ad, Value *v, Value *g)
{
    if (!ad->needs[v->id] || !g)
        return;
    if (g->dtype != v->dtype && ir_dtype_is_float(g->dtype) && ir_dtype_is_float(v->dtype)) {
        Attr *a = ir_attr_str(ad->g->arena, "dtype", ir_dtype_name(v->dtype));
        g = emit(ad, OP_CAST, &g, 1, &a, 1);
    }
    Part *p = ad->grad[v->id];
    while (p && p->mb != g->def->mb)
        p = p->next;
    if (p) {
        p->sum = bin(ad, OP_ADD, p->sum, g);
        return;
    }
    p = arena_alloc(ad->g->arena, sizeof(Part));
    *p = (Part){g, g->def->mb, ad->grad[v->id]};
    ad->grad[v->id] = p;
}

/* The gradient of v, once every contribution is in. The parts of several
 * microbatches are summed in microbatch order (shared adds, mb -1), so a
 * schedule that runs microbatch j's backward adds its part then and frees it:
 * no microbatch's gradient waits for the last one. A part of shared ops (a
 * sum over the microbatches already, like a tied weight's) comes last. When
 * the graph holds one microbatch of several (ad->loop), a shared value's
 * part of that microbatch becomes a microbatch_sum, made where the part is:
 * each microbatch adds its part there, in microbatch order, so the sum has
 * the bits of the unrolled adds. */
static Value *grad_of(AD *ad, const Value *v)
{
    Part *p = ad->grad[v->id];
    if (!p || (!p->next && !(ad->loop && p->mb >= 0 && (!v->def || v->def->mb < 0))))
        return p ? p->sum : NULL;
    int n = 0;
    for (Part *q = p; q; q = q->next)
        n++;
    Part **order = arena_alloc(ad->g->arena, sizeof(Part *) * (size_t)n);
    n = 0;
    for (; p; p = p->next) {
        int k = n++;
        for (; k > 0 && (unsigned)order[k - 1]->mb > (unsigned)p->mb; k--) /* shared (-1) last */
            order[k] = order[k - 1];
        order[k] = p;
    }
    const Op *at = ad->fwd;
    Value *sum = order[0]->sum;
    if (ad->loop && order[0]->mb >= 0 && (!v->def || v->def->mb < 0)) {
        ad->fwd = sum->def;
        sum = un(ad, OP_MB_SUM, sum);
        sum->def->mb = -1; /* its result is the step's: shared */
    }
    for (int i = 1; i < n; i++) { /* each add where its part is made: one send at most */
        ad->fwd = order[i]->sum->def;
        sum = bin(ad, OP_ADD, sum, order[i]->sum);
        sum->def->mb = -1; /* a sum over microbatches: shared */
    }
    ad->fwd = at;
    p = arena_alloc(ad->g->arena, sizeof(Part));
    *p = (Part){sum, -1, NULL};
    ad->grad[v->id] = p;
    return sum;
}

static Value *transpose_last(AD *ad, Value *v)
{
    int64_t perm[IR_MAX_RANK];
    for (int i = 0; i < v->rank; i++)
        perm[i] = i;
    perm[v->rank - 2] = v->rank - 1;
    perm[v->rank - 1] = v->rank - 2;
    Attr *a = ints(ad, "perm", perm, v->rank);
    return emit(ad, OP_TRANSPOSE, &v, 1, &a, 1);
}

/* C = A B.  dA = dC B^T;  dB = A^T dC, with A's batch dims folded into rows when
 * B is a shared [K,N] matrix. */
static void vjp_matmul(AD *ad, const Op *op, Value *dy)
{
    Value *a = op->args[0], *b = op->args[1];
    if (ad->needs[a->id])
        accumulate(ad, a, bin(ad, OP_MATMUL, dy, transpose_last(ad, b)));
    if (!ad->needs[b->id])
        return;
    if (b->rank > 2) {
        accumulate(ad, b, bin(ad, OP_MATMUL, transpose_last(ad, a), dy));
        return;
    }
    int64_t K = a->shape[a->rank - 1], N = dy->shape[dy->rank - 1];
    int64_t rows = 1;
    for (int i = 0; i < a->rank - 1; i++)
        rows *= a->shape[i];
    Value *a2 = reshape(ad, a, 2, (int64_t[]){rows, K});
    Value *d2 = reshape(ad, dy, 2, (int64_t[]){rows, N});
    accumulate(ad, b, bin(ad, OP_MATMUL, transpose_last(ad, a2), d2));
}

static void vjp_arith(AD *ad, const Op *op, Value *dy)
{
    Value *a = op->args[0], *b = op->args[1], *y = op->res[0];
    switch (op->kind) {
    case OP_ADD:
        if (ad->needs[a->id])
            accumulate(ad, a, unbroadcast(ad, dy, a));
        if (ad->needs[b->id])
            accumulate(ad, b, unbroadcast(ad, dy, b));
        return;
    case OP_SUB:
        if (ad->needs[a->id])
            accumulate(ad, a, unbroadcast(ad, dy, a));
        if (ad->needs[b->id])
            accumulate(ad, b, unbroadcast(ad, un(ad, OP_NEG, dy), b));
        return;
    case OP_MUL:
        if (ad->needs[a->id])
            accumulate(ad, a, unbroadcast(ad, bin(ad, OP_MUL, dy, b), a));
        if (ad->needs[b->id])
            accumulate(ad, b, unbroadcast(ad, bin(ad, OP_MUL, dy, a), b));
        return;
    case OP_DIV: /* d(a/b)/db = -y/b */
        if (ad->needs[a->id])
            accumulate(ad, a, unbroadcast(ad, bin(ad, OP_DIV, dy, b), a));
        if (ad->needs[b->id]) {
            Value *t = bin(ad, OP_DIV, bin(ad, OP_MUL, dy, y), b);
            accumulate(ad, b, unbroadcast(ad, un(ad, OP_NEG, t), b));
        }
        return;
    default: UNREACHABLE();
    }
}

/* where(c, a, b): dy goes to a where c holds and to b elsewhere, each summed
 * back to its operand's shape; c gets none. */
static void vjp_where(AD *ad, const Op *op, Value *dy)
{
    Value *zero = NULL;
    for (int i = 1; i <= 2; i++) {
        Value *x = op->args[i];
        if (!ad->needs[x->id])
            continue;
        zero = zero ? zero : constant(ad, 0.0, dy->dtype, 0, NULL);
        Value *args[3] = {op->args[0], i == 1 ? dy : zero, i == 1 ? zero : dy};
        accumulate(ad, x, unbroadcast(ad, emit(ad, OP_WHERE, args, 3, NULL, 0), x));
    }
}

/* Elementwise functions of one operand, written with the result y where cheaper. */
static Value *vjp_unary(AD *ad, const Op *op, Value *dy)
{
    Value *x = op->args[0], *y = op->res[0];
    switch (op->kind) {
    case OP_NEG: return un(ad, OP_NEG, dy);
    case OP_EXP: return bin(ad, OP_MUL, dy, y);
    case OP_LOG: return bin(ad, OP_DIV, dy, x);
    case OP_SQRT: return bin(ad, OP_DIV, scale(ad, dy, 0.5), y);
    case OP_RSQRT: /* d x^-1/2 = -1/2 y^3 */
        return scale(ad, bin(ad, OP_MUL, bin(ad, OP_MUL, dy, y), bin(ad, OP_MUL, y, y)), -0.5);
    case OP_TANH: /* dy (1 - y^2) */
        return bin(ad, OP_SUB, dy, bin(ad, OP_MUL, bin(ad, OP_MUL, dy, y), y));
    case OP_SIGMOID: { /* dy y (1 - y) */
        Value *t = bin(ad, OP_MUL, dy, y);
        return bin(ad, OP_SUB, t, bin(ad, OP_MUL, t, y));
    }
    case OP_RELU: return bin(ad, OP_RELU_GRAD, x, dy);
    case OP_GELU: return bin(ad, OP_GELU_GRAD, x, dy);
    case OP_SILU: return bin(ad, OP_SILU_GRAD, x, dy);
    case OP_ABS: { /* dy sign(x): dy (x > 0) - dy (x < 0) */
        Value *zero = constant(ad, 0, x->dtype, 0, NULL);
        return bin(ad, OP_SUB, bin(ad, OP_MUL, dy, bin(ad, OP_GT, x, zero)),
                   bin(ad, OP_MUL, dy, bin(ad, OP_LT, x, zero)));
    }
    case OP_ERF: /* dy 2/sqrt(pi) e^(-x^2) */
        return bin(ad, OP_MUL, scale(ad, dy, 1.1283791670955126),
                   un(ad, OP_EXP, un(ad, OP_NEG, bin(ad, OP_MUL, x, x))));
    case OP_CAST: {
        Attr *a = ir_attr_str(ad->g->arena, "dtype", ir_dtype_name(x->dtype));
        return emit(ad, OP_CAST, &dy, 1, &a, 1);
    }
    default: UNREACHABLE();
    }
}

/* sum, mean, max over attr dim: spread dy back along the reduced dim. */
static Value *vjp_reduce(AD *ad, const Op *op, Value *dy)
{
    Value *x = op->args[0];
    int dim = (int)ir_op_attr_int(op, "dim", -1);
    dim = dim < 0 ? dim + x->rank : dim;
    if (op->kind == OP_MAX) {
        Value *args[2] = {x, dy};
        Attr *a[2] = {int1(ad, "dim", dim), ir_attr_bool(ad->g->arena, "keepdim",
                                                         (int)ir_op_attr_int(op, "keepdim", 0))};
        return emit(ad, OP_MAX_GRAD, args, 2, a, 2);
    }
    int64_t kept[IR_MAX_RANK];
    memcpy(kept, x->shape, sizeof(int64_t) * (size_t)x->rank);
    kept[dim] = 1;
    Attr *a = ints(ad, "shape", x->shape, x->rank);
    Value *g = emit(ad, OP_EXPAND, (Value *[]){reshape(ad, dy, x->rank, kept)}, 1, &a, 1);
    return op->kind == OP_MEAN ? scale(ad, g, 1.0 / (double)x->shape[dim]) : g;
}

/* Copy op's attrs (all of them) into a fresh array, plus one extra. */
static int copy_attrs(const Op *op, Attr **out, Attr *extra)
{
    int n = 0;
    for (int i = 0; i < op->nattrs && n < 7; i++)
        out[n++] = op->attrs[i];
    if (extra)
        out[n++] = extra;
    return n;
}

static void vjp_layer(AD *ad, const Op *op, Value *dy)
{
    Attr *attrs[8];
    int na = copy_attrs(op, attrs, NULL);
    Value **a = op->args;
    switch (op->kind) {
    case OP_SOFTMAX:
        accumulate(ad, a[0], emit(ad, OP_SOFTMAX_GRAD, (Value *[]){op->res[0], dy}, 2, attrs, na));
        return;
    case OP_LAYERNORM:
    case OP_RMSNORM: {
        OpKind k = op->kind == OP_LAYERNORM ? OP_LAYERNORM_GRAD : OP_RMSNORM_GRAD;
        Op *g = emit_op(ad, k, (Value *[]){a[0], a[1], dy}, 3, attrs, na);
        for (int i = 0; i < g->nres; i++)
            accumulate(ad, a[i], g->res[i]);
        return;
    }
    case OP_ATTENTION: { /* the mask and the bias, if any, go along; the mask gets no gradient */
        Value *args[7] = {a[0], a[1], a[2], dy};
        for (int i = 3; i < op->nargs && i < 6; i++)
            args[i + 1] = a[i];
        Op *g = emit_op(ad, OP_ATTENTION_GRAD, args, op->nargs + 1, attrs, na);
        int bias = ir_attention_arg(op, 3);
        if (bias >= 0 && ad->needs[a[bias]->id]) { /* the bias's gradient: a fourth result */
            DType dt;
            int rank;
            int64_t shape[IR_MAX_RANK];
            char err[256];
            if (ir_infer_result(g, 3, &dt, &rank, shape, err, sizeof err) != 0)
                BUG("autodiff made an invalid 'attention_grad': %s", err);
            ir_op_result(ad->g, g, dt, rank, shape);
            accumulate(ad, a[bias], g->res[3]);
        }
        for (int i = 0; i < 3; i++)
            accumulate(ad, a[i], g->res[i]);
        return;
    }
    case OP_TOPK: { /* the values' gradient at the indices; the indices get none */
        Attr *v = int1(ad, "size", a[0]->shape[a[0]->rank - 1]);
        accumulate(ad, a[0], emit(ad, OP_SCATTER_ADD, (Value *[]){op->res[1], dy}, 2, &v, 1));
        return;
    }
    case OP_GATHER: { /* dy at the gathered columns: k per row summed where they repeat */
        Attr *v = int1(ad, "size", a[0]->shape[a[0]->rank - 1]);
        OpKind g = a[1]->rank == a[0]->rank ? OP_SCATTER_ADD : OP_GATHER_GRAD;
        accumulate(ad, a[0], emit(ad, g, (Value *[]){a[1], dy}, 2, &v, 1));
        return;
    }
    case OP_DROPOUT: /* the same mask (the same keys, step and stream) on dy: linear in x */
        accumulate(ad, a[0], emit(ad, OP_DROPOUT, (Value *[]){dy, a[1], a[2]}, 3, attrs, na));
        return;
    case OP_SCATTER_ADD: /* (scatter) each src element's gradient: dy at its column; indices none */
        accumulate(ad, a[1], emit(ad, OP_GATHER, (Value *[]){dy, a[0]}, 2, NULL, 0));
        return;
    case OP_EMBED: {
        Attr *v = int1(ad, "vocab", a[0]->shape[0]);
        accumulate(ad, a[0], emit(ad, OP_EMBED_GRAD, (Value *[]){a[1], dy}, 2, &v, 1));
        return;
    }
    case OP_CROSS_ENTROPY:
        accumulate(ad, a[0], emit(ad, OP_CROSS_ENTROPY_GRAD, (Value *[]){a[0], a[1], dy}, 3,
                                  NULL, 0));
        return;
    case OP_ROPE: /* a rotation: its transpose turns the other way */
        na = copy_attrs(op, attrs, ir_attr_bool(ad->g->arena, "inverse",
                                                !ir_op_attr_int(op, "inverse", 0)));
        accumulate(ad, a[0], emit(ad, OP_ROPE, &dy, 1, attrs, na));
        return;
    default: UNREACHABLE();
    }
}

static void vjp_move(AD *ad, const Op *op, Value *dy)
{
    Value *x = op->args[0];
    switch (op->kind) {
    case OP_RESHAPE: accumulate(ad, x, reshape(ad, dy, x->rank, x->shape)); return;
    case OP_TRANSPOSE: {
        int64_t perm[IR_MAX_RANK], inv[IR_MAX_RANK];
        if (!ir_op_attr(op, "perm")) {
            accumulate(ad, x, transpose_last(ad, dy));
            return;
        }
        ir_transpose_perm(op, perm);
        for (int i = 0; i < x->rank; i++)
            inv[perm[i]] = i;
        Attr *a = ints(ad, "perm", inv, x->rank);
        accumulate(ad, x, emit(ad, OP_TRANSPOSE, &dy, 1, &a, 1));
        return;
    }
    case OP_SLICE: {
        int dim = (int)ir_op_attr_int(op, "dim", -1);
        dim = dim < 0 ? dim + x->rank : dim;
        int64_t start = ir_op_attr_int(op, "start", 0);
        int64_t end = ir_op_attr_int(op, "end", x->shape[dim]);
        Attr *a[3] = {int1(ad, "dim", dim), int1(ad, "before", start),
                      int1(ad, "after", x->shape[dim] - end)};
        accumulate(ad, x, emit(ad, OP_PAD, &dy, 1, a, 3));
        return;
    }
    case OP_CONCAT: {
        int dim = (int)ir_op_attr_int(op, "dim", -1);
        dim = dim < 0 ? dim + x->rank : dim;
        int64_t at = 0;
        for (int i = 0; i < op->nargs; i++) {
            int64_t w = op->args[i]->shape[dim];
            Attr *a[3] = {int1(ad, "dim", dim), int1(ad, "start", at), int1(ad, "end", at + w)};
            if (ad->needs[op->args[i]->id])
                accumulate(ad, op->args[i], emit(ad, OP_SLICE, &dy, 1, a, 3));
            at += w;
        }
        return;
    }
    default: UNREACHABLE();
    }
}

static void vjp(AD *ad, const Op *op, Value *dy)
{
    ad->fwd = op;
    switch (op->kind) {
    case OP_INPUT: case OP_PARAM: case OP_CONSTANT: return;
    case OP_STOP_GRAD: return; /* a constant to the gradient: nothing flows back */
    case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_EQ: case OP_NE: case OP_ARGMAX:
    case OP_FLOOR: case OP_ARANGE:
        return; /* piecewise constant: mark_needs gave the result no gradient */
    case OP_MB_SUM: accumulate(ad, op->args[0], dy); return; /* each microbatch's x: dy */
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: vjp_arith(ad, op, dy); return;
    case OP_WHERE: vjp_where(ad, op, dy); return;
    case OP_NEG: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH:
    case OP_SIGMOID: case OP_RELU: case OP_GELU: case OP_SILU: case OP_CAST: case OP_ERF:
    case OP_ABS:
        accumulate(ad, op->args[0], vjp_unary(ad, op, dy));
        return;
    case OP_MATMUL: vjp_matmul(ad, op, dy); return;
    case OP_SUM: case OP_MEAN: case OP_MAX: accumulate(ad, op->args[0], vjp_reduce(ad, op, dy)); return;
    case OP_SOFTMAX: case OP_LAYERNORM: case OP_RMSNORM: case OP_ATTENTION: case OP_EMBED:
    case OP_GATHER: case OP_TOPK: case OP_SCATTER_ADD: case OP_DROPOUT:
    case OP_CROSS_ENTROPY: case OP_ROPE:
        vjp_layer(ad, op, dy);
        return;
    case OP_RESHAPE: case OP_TRANSPOSE: case OP_SLICE: case OP_CONCAT: vjp_move(ad, op, dy); return;
    case OP_EXPAND: /* each element of x went to every copy: their gradients summed */
        accumulate(ad, op->args[0], unbroadcast(ad, dy, op->args[0]));
        return;
    default:
        diag_error(&ad->c->diag, op->loc, "autodiff: no gradient rule for '%s' in a forward graph",
                   ir_ops[op->kind].name);
        ad->failed = 1;
    }
}

/* Whether a gradient flows from op's result back to its operand j: not from a
 * comparison's 0 or 1 or an argmax (piecewise constant in their operands),
 * nor to where's condition. */
static int passes_grad(const Op *op, int j)
{
    switch (op->kind) {
    case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_EQ: case OP_NE: case OP_ARGMAX:
    case OP_FLOOR:
        return 0;
    case OP_WHERE: return j > 0;
    case OP_ATTENTION: return j < 3 || op->args[j]->rank == 3; /* q, k, v and the bias, not the mask */
    default: return 1;
    }
}

/* Which values depend on a parameter: only those need gradients. A value of
 * an integer type (a cast to i32) or a comparison's result (a mask, float or
 * not) is piecewise constant in everything, so its gradient is zero and none
 * flows through it; where's result needs one only through a or b. */
static void mark_needs(AD *ad, int nops)
{
    for (int i = 0; i < nops; i++) {
        const Op *op = ad->g->ops.data[i];
        int need = op->kind == OP_PARAM;
        for (int j = 0; j < op->nargs; j++)
            need |= ad->needs[op->args[j]->id] && passes_grad(op, j);
        for (int j = 0; j < op->nres; j++)
            ad->needs[op->res[j]->id] = (char)(need && ir_dtype_is_float(op->res[j]->dtype));
    }
}

static int already_differentiated(const Graph *g)
{
    for (int i = 0; i < g->ops.len; i++)
        if (g->ops.data[i]->phase != PH_FWD)
            return 1;
    return 0;
}

/* The gradients become outputs 1.. in parameter order; an unused parameter
 * gets a zero gradient. */
static void set_outputs(AD *ad, Value *loss, int nops)
{
    Graph *g = ad->g;
    g->outputs.len = 0;
    VEC_PUSH(g->arena, g->outputs, loss);
    for (int i = 0; i < nops; i++) {
        const Op *op = g->ops.data[i];
        if (op->kind != OP_PARAM)
            continue;
        ad->fwd = op; /* the sum over microbatches takes the parameter's layer and place */
        Value *p = op->res[0], *d = grad_of(ad, p);
        if (!d)
            d = constant(ad, 0.0, p->dtype, p->rank, p->shape);
        if (d->name) { /* shared with another value: give this gradient its own copy */
            Attr *a = ints(ad, "shape", p->shape, p->rank);
            d = emit(ad, OP_RESHAPE, &d, 1, &a, 1);
        }
        d->name = intern(g->strings, arena_printf(g->arena, "%s.grad", p->name ? p->name : "param"));
        VEC_PUSH(g->arena, g->outputs, d);
    }
}

int pass_autodiff(Ctx *c, Graph *g, const Settings *s)
{
    if (already_differentiated(g))
        return 0;
    if (!g->outputs.len || g->outputs.data[0]->rank != 0 ||
        !ir_dtype_is_float(g->outputs.data[0]->dtype)) {
        diag_error(&c->diag, g->outputs.len ? g->outputs.data[0]->loc : LOC_NONE,
                   "training needs a scalar float loss as the first output");
        return -1;
    }
    int nops = g->ops.len, nvals = g->values.len;
    AD ad = {c, g, NULL, NULL, NULL, 0, 0};
    ad.grad = arena_alloc(g->arena, sizeof(Part *) * (size_t)(nvals + 1));
    memset(ad.grad, 0, sizeof(Part *) * (size_t)(nvals + 1));
    ad.needs = arena_alloc(g->arena, (size_t)nvals + 1);
    for (int i = 0; i < nops; i++)
        ad.loop |= g->ops.data[i]->kind == OP_MB_SUM;
    mark_needs(&ad, nops);
    Value *loss = g->outputs.data[0];
    ad.fwd = loss->def;
    if (ad.needs[loss->id])
        accumulate(&ad, loss, constant(&ad, 1.0, loss->dtype, 0, NULL));
    for (int i = nops - 1; i >= 0; i--) {
        const Op *op = g->ops.data[i];
        ad.fwd = op;
        Value *dy = op->nres ? grad_of(&ad, op->res[0]) : NULL;
        if (dy)
            vjp(&ad, op, dy);
    }
    if (ad.failed)
        return -1;
    set_outputs(&ad, loss, nops);
    return 0;
}
