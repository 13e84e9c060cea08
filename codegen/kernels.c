/* kernels.c: graph-IR ops -> Kernel IR. Reads one op and the plan tensors of
 * its operands and results; writes one or more kernels. Key idea: every op is
 * an expression over loads at computed indices -- pointwise ops over output
 * elements, row ops over rows with inner loops that reduce -- so the same
 * handful of builder calls serve every op, and the targets share them. */
#include "kgen.h"

#include <math.h>
#include <string.h>

static int64_t numel(const Value *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++)
        n *= v->shape[i];
    return n;
}

static int norm_dim(int64_t d, int rank) { return (int)(d < 0 ? d + rank : d); }

static DType ftype_of(const Op *op)
{
    for (int i = 0; i < op->nargs; i++)
        if (op->args[i]->dtype == DT_F64)
            return DT_F64;
    for (int i = 0; i < op->nres; i++)
        if (op->res[i]->dtype == DT_F64)
            return DT_F64;
    return DT_F32;
}

static int T(Gen *gen, const Value *v) { return gen_tensor(gen, v); }

/* ---- index helpers ---- */

/* Coordinates of flat index i in shape: c[d] = i / stride[d] % shape[d]. */
static void unravel(Kernel *k, int i, int rank, const int64_t *shape, int *coord)
{
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        int q = stride == 1 ? i : ki(k, KN_IDIV, i, kb_iconst(k, stride));
        coord[d] = d == 0 ? q : ki(k, KN_IMOD, q, kb_iconst(k, shape[d]));
        stride *= shape[d];
    }
}

/* Flat index into an operand of shape `in` (right-aligned, broadcasting) at
 * the coordinates of an output of rank `rank`. */
static int bcast_offset(Kernel *k, const int *coord, int rank, const Value *in)
{
    int off = -1;
    int64_t stride = 1;
    for (int d = in->rank - 1; d >= 0; d--) {
        int od = rank - in->rank + d;
        if (in->shape[d] != 1) {
            int term = stride == 1 ? coord[od] : ki(k, KN_MUL, coord[od], kb_iconst(k, stride));
            off = off < 0 ? term : ki(k, KN_ADD, off, term);
        }
        stride *= in->shape[d];
    }
    return off < 0 ? kb_iconst(k, 0) : off;
}

/* Load operand v at output element i of an output shaped `out`. */
static int load_bcast(Kernel *k, Gen *gen, const Value *v, const Value *out, int i)
{
    int slot = kb_arg(k, gen, T(gen, v));
    if (v->rank == out->rank && !memcmp(v->shape, out->shape, sizeof(int64_t) * (size_t)v->rank))
        return kb_load(k, slot, i);
    if (numel(v) == 1)
        return kb_load(k, slot, kb_iconst(k, 0));
    int coord[IR_MAX_RANK];
    unravel(k, i, out->rank, out->shape, coord);
    return kb_load(k, slot, bcast_offset(k, coord, out->rank, v));
}

/* ---- pointwise ---- */

static int gelu(Kernel *k, int x)
{
    int x3 = kf(k, KN_MUL, kf(k, KN_MUL, x, x), x);
    int in = kf(k, KN_MUL, kb_const(k, 0.7978845608028654),
                kf(k, KN_ADD, x, kf(k, KN_MUL, kb_const(k, 0.044715), x3)));
    int t = kb_node(k, KN_TANH, KT_FLOAT, in, 0, 0);
    return kf(k, KN_MUL, kf(k, KN_MUL, kb_const(k, 0.5), x), kf(k, KN_ADD, kb_const(k, 1), t));
}

static int sigmoid(Kernel *k, int x)
{
    int e = kb_node(k, KN_EXP, KT_FLOAT, kb_node(k, KN_NEG, KT_FLOAT, x, 0, 0), 0, 0);
    return kf(k, KN_DIV, kb_const(k, 1), kf(k, KN_ADD, kb_const(k, 1), e));
}

/* d gelu / dx for the tanh form: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2). */
static int gelu_grad(Kernel *k, int x, int dy)
{
    int c = kb_const(k, 0.7978845608028654), a = kb_const(k, 0.044715), one = kb_const(k, 1);
    int x2 = kf(k, KN_MUL, x, x);
    int t = kb_node(k, KN_TANH, KT_FLOAT, kf(k, KN_MUL, c, kf(k, KN_ADD, x, kf(k, KN_MUL, a, kf(k, KN_MUL, x2, x)))), 0, 0);
    int half = kb_const(k, 0.5);
    int left = kf(k, KN_MUL, half, kf(k, KN_ADD, one, t));
    int sech2 = kf(k, KN_SUB, one, kf(k, KN_MUL, t, t));
    int inner = kf(k, KN_MUL, c, kf(k, KN_ADD, one, kf(k, KN_MUL, kb_const(k, 3 * 0.044715), x2)));
    int right = kf(k, KN_MUL, kf(k, KN_MUL, half, x), kf(k, KN_MUL, sech2, inner));
    return kf(k, KN_MUL, dy, kf(k, KN_ADD, left, right));
}

static int unary(Kernel *k, OpKind kind, int x)
{
    switch (kind) {
    case OP_NEG: return kb_node(k, KN_NEG, k->nodes.data[x].type, x, 0, 0);
    case OP_EXP: return kb_node(k, KN_EXP, KT_FLOAT, x, 0, 0);
    case OP_LOG: return kb_node(k, KN_LOG, KT_FLOAT, x, 0, 0);
    case OP_SQRT: return kb_node(k, KN_SQRT, KT_FLOAT, x, 0, 0);
    case OP_RSQRT: return kb_node(k, KN_RSQRT, KT_FLOAT, x, 0, 0);
    case OP_TANH: return kb_node(k, KN_TANH, KT_FLOAT, x, 0, 0);
    case OP_SIGMOID: return sigmoid(k, x);
    case OP_RELU: return kf(k, KN_MAX, x, kb_const(k, 0));
    case OP_GELU: return gelu(k, x);
    case OP_SILU: return kf(k, KN_MUL, x, sigmoid(k, x));
    case OP_ERF: return kb_node(k, KN_ERF, KT_FLOAT, x, 0, 0);
    case OP_ABS: return kb_node(k, KN_ABS, KT_FLOAT, x, 0, 0);
    case OP_FLOOR: return kb_node(k, KN_FLOOR, KT_FLOAT, x, 0, 0);
    default: UNREACHABLE();
    }
}

/* a > b is b < a, a >= b is b <= a: the comparison's 0 or 1 (int), made a
 * float when the operands are, as the result has their dtype. */
static int compare(Kernel *k, OpKind kind, KType t, int a, int b)
{
    int swap = kind == OP_GT || kind == OP_GE;
    KNodeKind n = kind == OP_LT || kind == OP_GT ? KN_LT
                : kind == OP_LE || kind == OP_GE ? KN_LE
                : kind == OP_EQ                  ? KN_EQ
                                                 : KN_NE;
    int c = kb_node(k, n, KT_INT, swap ? b : a, swap ? a : b, 0);
    return t == KT_INT ? c : kb_node(k, KN_TOFLOAT, KT_FLOAT, c, 0, 0);
}

static int binary(Kernel *k, OpKind kind, int a, int b)
{
    KType t = k->nodes.data[a].type == KT_INT && k->nodes.data[b].type == KT_INT ? KT_INT : KT_FLOAT;
    if (kind != OP_ADD && kind != OP_SUB && kind != OP_MUL && kind != OP_DIV)
        return compare(k, kind, t, a, b);
    KNodeKind n = kind == OP_ADD ? KN_ADD : kind == OP_SUB ? KN_SUB : kind == OP_MUL ? KN_MUL
                : t == KT_INT ? KN_IDIV : KN_DIV;
    return kb_node(k, n, t, a, b, 0);
}

static int pointwise_grad(Kernel *k, OpKind kind, int x, int dy)
{
    switch (kind) {
    case OP_RELU_GRAD: {
        int pos = kb_node(k, KN_LT, KT_INT, kb_const(k, 0), x, 0);
        return kb_node(k, KN_SELECT, KT_FLOAT, pos, dy, kb_const(k, 0));
    }
    case OP_SILU_GRAD: {
        int s = sigmoid(k, x), one = kb_const(k, 1);
        int d = kf(k, KN_ADD, s, kf(k, KN_MUL, kf(k, KN_MUL, x, s), kf(k, KN_SUB, one, s)));
        return kf(k, KN_MUL, dy, d);
    }
    case OP_GELU_GRAD: return gelu_grad(k, x, dy);
    default: UNREACHABLE();
    }
}

/* c != 0 as an int node (a NaN is nonzero); a comparison computed here is its
 * own 0 or 1. */
static int truth(Kernel *k, int c)
{
    const KNode *n = &k->nodes.data[c];
    int cmp = n->kind == KN_TOFLOAT ? n->a : c;
    KNodeKind ck = k->nodes.data[cmp].kind;
    if (ck == KN_LT || ck == KN_LE || ck == KN_EQ || ck == KN_NE)
        return cmp;
    int zero = n->type == KT_INT ? kb_iconst(k, 0) : kb_const(k, 0);
    return kb_node(k, KN_NE, KT_INT, c, zero, 0);
}

/* The value of elementwise op's result at element i of `out` (its own shape,
 * or the shape of the op it is fused into, which is the same). */
static int operand(Kernel *k, Gen *gen, const Value *v, const Value *out, int i);

/* dropout at element i (of x's shape): the element's place in the whole
 * tensor g (its global coordinates in dims >= 1, the block's offsets added
 * where a dim is split) and its row's key r give h = hash(hash(hash(r, step),
 * stream), g); the element is kept when h mod 2^24 >= round(p 2^24), and then
 * scaled by 1 / (1 - p). Step 0 (evaluation) keeps every element unscaled. */
static int dropout_expr(Kernel *k, Gen *gen, const Op *op, const Value *out, int i)
{
    const Value *xv = op->args[0];
    int x = operand(k, gen, xv, out, i);
    double p = ir_op_attr_float(op, "p", 0);
    int64_t inner = numel(xv) / xv->shape[0], whole[IR_MAX_RANK], offs[IR_MAX_RANK], n = 0;
    int has[IR_MAX_RANK] = {0};
    const Attr *sa = ir_op_attr(op, "shape"), *oa = ir_op_attr(op, "offsets");
    for (int d = 0; d < xv->rank; d++)
        whole[d] = sa && sa->kind == ATTR_LIST && d < sa->nitems ? sa->items[d]->i : xv->shape[d];
    for (int j = 0; oa && oa->kind == ATTR_LIST && j < oa->nitems && 3 + j < op->nargs; j++) {
        int d = (int)oa->items[j]->i;
        if (d >= 1 && d < xv->rank)
            has[d] = 1, offs[d] = kb_load(k, kb_arg(k, gen, T(gen, op->args[3 + j])), kb_iconst(k, 0));
        n++;
    }
    int row = ki(k, KN_IDIV, i, kb_iconst(k, inner));
    int g = ki(k, KN_IMOD, i, kb_iconst(k, inner));
    if (n) { /* global coordinates from the local ones, minor to major */
        int64_t lstride = 1, gstride = 1;
        g = kb_iconst(k, 0);
        for (int d = xv->rank - 1; d >= 1; d--) {
            int c = ki(k, KN_IMOD, ki(k, KN_IDIV, i, kb_iconst(k, lstride)), kb_iconst(k, xv->shape[d]));
            if (has[d])
                c = ki(k, KN_ADD, c, offs[d]);
            g = ki(k, KN_ADD, g, ki(k, KN_MUL, c, kb_iconst(k, gstride)));
            lstride *= xv->shape[d], gstride *= whole[d];
        }
    }
    int key = kb_load(k, kb_arg(k, gen, T(gen, op->args[1])), row);
    int step = kb_node(k, KN_TOINT, KT_INT, kb_load(k, kb_arg(k, gen, T(gen, op->args[2])), kb_iconst(k, 0)), 0, 0);
    int h = kb_node(k, KN_HASH, KT_INT, key, step, 0);
    h = kb_node(k, KN_HASH, KT_INT, h, kb_iconst(k, ir_op_attr_int(op, "stream", 0)), 0);
    h = kb_node(k, KN_HASH, KT_INT, h, g, 0);
    int u = ki(k, KN_IMOD, h, kb_iconst(k, (int64_t)1 << 24));
    int keep = kb_node(k, KN_LE, KT_INT, kb_iconst(k, llround(p * 16777216.0)), u, 0);
    int eval = kb_node(k, KN_EQ, KT_INT, step, kb_iconst(k, 0), 0);
    int kept = kb_node(k, KN_SELECT, KT_FLOAT, keep, kf(k, KN_MUL, x, kb_const(k, 1 / (1 - p))), kb_const(k, 0));
    return kb_node(k, KN_SELECT, KT_FLOAT, eval, x, kept);
}

static void around(Kernel *k, int i, const Value *out, int dim, int *o, int *j, int *in,
                   int64_t *inner);

/* The index of x's element (o, j, in) with j clamped into [0, n): always a
 * safe load (slices, concatenations and pads). */
static int clamped_at(Kernel *k, const Value *x, int dim, int o, int j, int in, int64_t inner)
{
    int64_t n = x->shape[dim];
    int jc = ki(k, KN_MIN, ki(k, KN_MAX, j, kb_iconst(k, 0)), kb_iconst(k, n - 1));
    int row = ki(k, KN_ADD, ki(k, KN_MUL, o, kb_iconst(k, n)), jc);
    return ki(k, KN_ADD, ki(k, KN_MUL, row, kb_iconst(k, inner)), in);
}

/* pad at element i of its own shape (out has it): x at (o, j - before, in)
 * when that lies inside x, else 0. The index is clamped into x, so the load
 * is safe either way; x's own fused producers are computed at it. */
static int pad_expr(Kernel *k, Gen *gen, const Op *op, const Value *out, int i)
{
    const Value *x = op->args[0];
    int dim = norm_dim(ir_op_attr_int(op, "dim", -1), out->rank), o, j, in;
    int64_t inner, n = x->shape[dim];
    around(k, i, out, dim, &o, &j, &in, &inner);
    int jx = ki(k, KN_SUB, j, kb_iconst(k, ir_op_attr_int(op, "before", 0)));
    int inside = ki(k, KN_MUL, kb_node(k, KN_LE, KT_INT, kb_iconst(k, 0), jx, 0),
                    kb_node(k, KN_LT, KT_INT, jx, kb_iconst(k, n), 0));
    int v = operand(k, gen, x, x, clamped_at(k, x, dim, o, jx, in, inner));
    return kb_node(k, KN_SELECT, KT_FLOAT, inside, v, kb_const(k, 0));
}

static int pw_expr(Kernel *k, Gen *gen, const Op *op, const Value *out, int i)
{
    if (op->kind == OP_DROPOUT)
        return dropout_expr(k, gen, op, out, i);
    if (op->kind == OP_PAD)
        return pad_expr(k, gen, op, out, i);
    int x = op->nargs > 0 ? operand(k, gen, op->args[0], out, i) : -1;
    int y = op->nargs > 1 ? operand(k, gen, op->args[1], out, i) : -1;
    int z = op->nargs > 2 ? operand(k, gen, op->args[2], out, i) : -1;
    switch (op->kind) {
    case OP_CONSTANT: return kb_const(k, ir_op_attr_float(op, "value", 0));
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_LT: case OP_LE: case OP_GT:
    case OP_GE: case OP_EQ: case OP_NE:
        return binary(k, op->kind, x, y);
    case OP_CAST:
        return op->res[0]->dtype == DT_I32 ? kb_node(k, KN_TOINT, KT_INT, x, 0, 0)
               : k->nodes.data[x].type == KT_INT ? kb_node(k, KN_TOFLOAT, KT_FLOAT, x, 0, 0)
                                                 : x;
    case OP_EXPAND: case OP_STOP_GRAD: return x;
    case OP_WHERE: return kb_node(k, KN_SELECT, k->nodes.data[y].type, truth(k, x), y, z);
    case OP_GELU_GRAD: case OP_SILU_GRAD: case OP_RELU_GRAD:
        return pointwise_grad(k, op->kind, x, y);
    case OP_CLIP_SCALE: {
        int eps = kf(k, KN_ADD, x, kb_const(k, 1e-6));
        int mx = kb_const(k, ir_op_attr_float(op, "max_norm", 1));
        return kf(k, KN_MIN, kb_const(k, 1), kf(k, KN_DIV, mx, eps));
    }
    default: return unary(k, op->kind, x);
    }
}

/* A kept value v (find_kept) computed at element i of out: a bf16 value as
 * its own kernel computed it (its fused operands unrounded inside it) and
 * rounded as its store rounded it, so its reader sees the bits it would load. */
static int kept_expr(Kernel *k, Gen *gen, const Value *v, const Value *out, int i)
{
    if (v->dtype != DT_BF16)
        return pw_expr(k, gen, v->def, out, i);
    return kb_node(k, KN_BF16, KT_FLOAT, pw_expr(k, gen, v->def, v, i), 0, 0);
}

/* An operand is read from memory, or computed in place when its producer was
 * fused into this kernel. */
static int operand(Kernel *k, Gen *gen, const Value *v, const Value *out, int i)
{
    if (gen->fused[v->id]) {
        /* a bf16 value is rounded as its store would have been where it is
         * a cast's (the cast's meaning) or read by a kernel of a wider type
         * (through a cast to f32); inside a bf16 kernel it stays unrounded */
        int e = pw_expr(k, gen, v->def, out, i);
        const Op *d = v->def;
        if (v->dtype == DT_BF16 &&
            ((d->kind == OP_CAST && d->args[0]->dtype != DT_BF16) || out->dtype != DT_BF16))
            e = kb_node(k, KN_BF16, KT_FLOAT, e, 0, 0);
        return e;
    }
    if (gen->kept[v->id] && gen->kept[v->id] == gen->op->id + 1) { /* computed and stored here */
        int e = kept_expr(k, gen, v, out, i);
        kb_store(k, kb_arg(k, gen, T(gen, v)), i, e);
        return e;
    }
    return load_bcast(k, gen, v, out, i);
}

/* Elementwise ops, casts, expand and constants: one store per element, with
 * the single-use elementwise producers of the operands inlined. */
/* The helpers optimizer_kernels.c shares. */
int64_t cg_numel(const Value *v) { return numel(v); }
DType cg_ftype(const Op *op) { return ftype_of(op); }
int cg_operand(Kernel *k, Gen *gen, const Value *v, const Value *out, int i)
{
    return operand(k, gen, v, out, i);
}

static void pointwise(Gen *gen, const Op *op)
{
    const Value *out = op->res[0];
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
    int i = kb_idx(k, 0);
    int v = pw_expr(k, gen, op, out, i);
    kb_store(k, kb_arg(k, gen, T(gen, out)), i, v);
    kb_finish(gen, k);
}

/* A cast between bf16 and f32 computes in the kernel's float type as its
 * reader does (f64 and f16 casts, and integer ones, keep their kernel). */
static int float_cast(const Op *op)
{
    DType a = op->args[0]->dtype, b = op->res[0]->dtype;
    return (a == DT_F32 || a == DT_BF16) && (b == DT_F32 || b == DT_BF16);
}

int cg_fusable(const Op *op)
{
    switch (op->kind) {
    case OP_CAST: return float_cast(op);
    case OP_PAD: return 1;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_NEG: case OP_EXP: case OP_LOG:
    case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID: case OP_RELU: case OP_GELU:
    case OP_SILU: case OP_GELU_GRAD: case OP_SILU_GRAD: case OP_RELU_GRAD: case OP_CONSTANT:
    case OP_STOP_GRAD: case OP_ERF: case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_EQ:
    case OP_NE: case OP_WHERE: case OP_DROPOUT: case OP_ABS: case OP_FLOOR:
        return 1;
    default: return 0;
    }
}

/* ---- data movement: one load per output element at a computed index ---- */

/* Output element i of a transpose reads x at the permuted coordinates. */
static void transpose(Gen *gen, const Op *op)
{
    const Value *x = op->args[0], *out = op->res[0];
    int64_t perm[IR_MAX_RANK], xstride[IR_MAX_RANK];
    ir_transpose_perm(op, perm);
    xstride[x->rank - 1] = 1;
    for (int d = x->rank - 2; d >= 0; d--)
        xstride[d] = xstride[d + 1] * x->shape[d + 1];
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
    int i = kb_idx(k, 0), coord[IR_MAX_RANK], off = kb_iconst(k, 0);
    unravel(k, i, out->rank, out->shape, coord);
    for (int d = 0; d < out->rank; d++)
        off = ki(k, KN_ADD, off, ki(k, KN_MUL, coord[d], kb_iconst(k, xstride[perm[d]])));
    int v = kb_load(k, kb_arg(k, gen, T(gen, x)), off);
    kb_store(k, kb_arg(k, gen, T(gen, out)), i, v);
    kb_finish(gen, k);
}

/* Split an output index around dim into (outer, j, inner) of out's shape. */
static void around(Kernel *k, int i, const Value *out, int dim, int *o, int *j, int *in,
                   int64_t *inner)
{
    *inner = 1;
    for (int d = dim + 1; d < out->rank; d++)
        *inner *= out->shape[d];
    int64_t n = out->shape[dim];
    /* along the last dim the item is (row, column): one width, which the C
     * rendering writes as rows (emit_c.c, row_width) */
    *in = *inner == 1 ? kb_iconst(k, 0) : ki(k, KN_IMOD, i, kb_iconst(k, *inner));
    int q = *inner == 1 ? i : ki(k, KN_IDIV, i, kb_iconst(k, *inner));
    *j = ki(k, KN_IMOD, q, kb_iconst(k, n));
    *o = ki(k, KN_IDIV, q, kb_iconst(k, n));
}

/* x's element (o, j, in) with j clamped into [0, n): always a safe load. */
static int load_at(Kernel *k, Gen *gen, const Value *x, int dim, int o, int j, int in,
                   int64_t inner)
{
    int idx = clamped_at(k, x, dim, o, j, in, inner);
    return kb_load(k, kb_arg(k, gen, T(gen, x)), idx);
}

/* slice: output element (o, j, in) reads x at (o, start + j, in). */
static void slice(Gen *gen, const Op *op)
{
    const Value *out = op->res[0], *x = op->args[0];
    int dim = norm_dim(ir_op_attr_int(op, "dim", -1), out->rank);
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
    int i = kb_idx(k, 0), o, j, in;
    int64_t inner;
    around(k, i, out, dim, &o, &j, &in, &inner);
    int sj = ki(k, KN_ADD, j, kb_iconst(k, ir_op_attr_int(op, "start", 0)));
    kb_store(k, kb_arg(k, gen, T(gen, out)), i, load_at(k, gen, x, dim, o, sj, in, inner));
    kb_finish(gen, k);
}

/* Copy all of x into out at offset `at` along dim (a segment of a concat or
 * the middle of a pad). */
static void place(Gen *gen, const Op *op, const Value *x, const Value *out, int dim, int64_t at)
{
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(x), ftype_of(op));
    int i = kb_idx(k, 0), o, j, in;
    int64_t inner;
    around(k, i, x, dim, &o, &j, &in, &inner);
    int row = ki(k, KN_ADD, ki(k, KN_MUL, o, kb_iconst(k, out->shape[dim])),
                 ki(k, KN_ADD, j, kb_iconst(k, at)));
    int idx = ki(k, KN_ADD, ki(k, KN_MUL, row, kb_iconst(k, inner)), in);
    kb_store(k, kb_arg(k, gen, T(gen, out)), idx, kb_load(k, kb_arg(k, gen, T(gen, x)), i));
    kb_finish(gen, k);
}

/* concat: one copy per operand; pad: zeros, then the operand in the middle. */
static void segments(Gen *gen, const Op *op)
{
    const Value *out = op->res[0];
    int dim = norm_dim(ir_op_attr_int(op, "dim", -1), out->rank);
    if (op->kind == OP_PAD) {
        Kernel *z = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
        kb_store(z, kb_arg(z, gen, T(gen, out)), kb_idx(z, 0), kb_const(z, 0));
        kb_finish(gen, z);
        place(gen, op, op->args[0], out, dim, ir_op_attr_int(op, "before", 0));
        return;
    }
    int64_t at = 0;
    for (int a = 0; a < op->nargs; a++) {
        place(gen, op, op->args[a], out, dim, at);
        at += op->args[a]->shape[dim];
    }
}

/* out[..., d] = table[ids[...], d] */
/* A table split by rows holds rows [off, off + V) (operand `off`, i32[]): an id
 * outside reads row 0 and counts 0 (*keep), so the partial sums over the
 * devices add up to the whole table's row. */
/* id - offset (the i32[] tensor `offset`) when it lies in [0, V), else 0;
 * *keep is 1 or 0 accordingly. */
int cg_shifted_id(Kernel *k, Gen *gen, const Value *offset, int id, int64_t V, int *keep)
{
    int off = kb_load(k, kb_arg(k, gen, T(gen, offset)), kb_iconst(k, 0));
    int lid = ki(k, KN_SUB, id, off);
    int below = kb_node(k, KN_LT, KT_INT, lid, kb_iconst(k, V), 0);
    int above = kb_node(k, KN_LT, KT_INT, kb_iconst(k, -1), lid, 0);
    *keep = ki(k, KN_MUL, below, above);
    return ki(k, KN_MUL, lid, *keep);
}

/* An embedding op's row: shifted by its third operand when the table is split. */
static int local_id(Kernel *k, Gen *gen, const Op *op, int id, int64_t V, int *keep)
{
    *keep = -1;
    return op->nargs < 3 ? id : cg_shifted_id(k, gen, op->args[2], id, V, keep);
}

static void embed(Gen *gen, const Op *op)
{
    const Value *tab = op->args[0], *out = op->res[0];
    int64_t D = tab->shape[1];
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
    int i = kb_idx(k, 0), dc = kb_iconst(k, D), keep;
    int id = kb_load(k, kb_arg(k, gen, T(gen, op->args[1])), ki(k, KN_IDIV, i, dc));
    id = local_id(k, gen, op, id, tab->shape[0], &keep);
    int idx = ki(k, KN_ADD, ki(k, KN_MUL, id, dc), ki(k, KN_IMOD, i, dc));
    int v = kb_load(k, kb_arg(k, gen, T(gen, tab)), idx);
    if (keep >= 0)
        v = kf(k, KN_MUL, v, kb_node(k, KN_TOFLOAT, KT_FLOAT, keep, 0, 0));
    kb_store(k, kb_arg(k, gen, T(gen, out)), i, v);
    kb_finish(gen, k);
}

/* gather(x[...,V], index[...]) -> [...]: x[r, index[r]]; an index outside
 * [0, V) reads the row's clamped element and gives 0. */
static void gather(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    int64_t V = x->shape[x->rank - 1];
    int64_t K = op->args[1]->rank == x->rank ? op->args[1]->shape[x->rank - 1] : 1; /* per row */
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(op->res[0]), ftype_of(op));
    int i = kb_idx(k, 0), id = kb_load(k, kb_arg(k, gen, T(gen, op->args[1])), i);
    int r = K == 1 ? i : ki(k, KN_IDIV, i, kb_iconst(k, K));
    int jc = ki(k, KN_MIN, ki(k, KN_MAX, id, kb_iconst(k, 0)), kb_iconst(k, V - 1));
    int v = kb_load(k, kb_arg(k, gen, T(gen, x)), ki(k, KN_ADD, ki(k, KN_MUL, r, kb_iconst(k, V)), jc));
    int in = kb_node(k, KN_EQ, KT_INT, id, jc, 0);
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), i, kb_node(k, KN_SELECT, KT_FLOAT, in, v, kb_const(k, 0)));
    kb_finish(gen, k);
}

/* gather_grad(index[...], dy[...]) -> [...,V]: dy[r] at column index[r] of
 * row r, 0 elsewhere (one pass over the result: nothing is added twice). */
static void gather_grad(Gen *gen, const Op *op)
{
    const Value *out = op->res[0];
    int64_t V = out->shape[out->rank - 1];
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
    int i = kb_idx(k, 0), vc = kb_iconst(k, V), r = ki(k, KN_IDIV, i, vc);
    int id = kb_load(k, kb_arg(k, gen, T(gen, op->args[0])), r);
    int g = kb_load(k, kb_arg(k, gen, T(gen, op->args[1])), r);
    int at = kb_node(k, KN_EQ, KT_INT, ki(k, KN_IMOD, i, vc), id, 0);
    kb_store(k, kb_arg(k, gen, T(gen, out)), i, kb_node(k, KN_SELECT, KT_FLOAT, at, g, kb_const(k, 0)));
    kb_finish(gen, k);
}

/* Rotary embedding: within each head, pair (2p, 2p+1) turns by
 * pos * theta^(-2p/Dh), pos the index along dim -2; inverse turns back.
 * With rotate_half the pairs are (p, p + Dh/2) (the layout of Hugging Face's
 * Llama checkpoints), at the same angles. */
static void rope(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    int64_t C = x->shape[x->rank - 1], S = x->shape[x->rank - 2];
    int64_t Dh = C / ir_op_attr_int(op, "heads", 1);
    int64_t apart = ir_op_attr_int(op, "rotate_half", 0) ? Dh / 2 : 1; /* a pair's distance */
    double theta = ir_op_attr_float(op, "theta", 10000), sign = ir_op_attr_int(op, "inverse", 0) ? -1 : 1;
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(x), ftype_of(op));
    int i = kb_idx(k, 0), slot = kb_arg(k, gen, T(gen, x));
    int c = ki(k, KN_IMOD, i, kb_iconst(k, C)), jd = ki(k, KN_IMOD, c, kb_iconst(k, Dh));
    int pos = kb_node(k, KN_TOFLOAT, KT_FLOAT, ki(k, KN_IMOD, ki(k, KN_IDIV, i, kb_iconst(k, C)), kb_iconst(k, S)), 0, 0);
    int second, pair; /* 1 for the pair's second element; the pair's number p */
    if (apart == 1) {
        second = ki(k, KN_IMOD, jd, kb_iconst(k, 2)), pair = ki(k, KN_IDIV, jd, kb_iconst(k, 2));
    } else {
        second = kb_node(k, KN_LT, KT_INT, kb_iconst(k, apart - 1), jd, 0);
        pair = ki(k, KN_SUB, jd, ki(k, KN_MUL, second, kb_iconst(k, apart)));
    }
    int expo = kf(k, KN_MUL, kb_node(k, KN_TOFLOAT, KT_FLOAT, pair, 0, 0), kb_const(k, -2.0 / (double)Dh));
    int ang = kf(k, KN_MUL, kf(k, KN_MUL, kb_const(k, sign), pos), kf(k, KN_POW, kb_const(k, theta), expo));
    int co = kb_node(k, KN_COS, KT_FLOAT, ang, 0, 0), si = kb_node(k, KN_SIN, KT_FLOAT, ang, 0, 0);
    int first = ki(k, KN_SUB, i, apart == 1 ? second : ki(k, KN_MUL, second, kb_iconst(k, apart)));
    int a = kb_load(k, slot, first), b = kb_load(k, slot, ki(k, KN_ADD, first, kb_iconst(k, apart)));
    int first_v = kf(k, KN_SUB, kf(k, KN_MUL, a, co), kf(k, KN_MUL, b, si));
    int second_v = kf(k, KN_ADD, kf(k, KN_MUL, a, si), kf(k, KN_MUL, b, co));
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), i,
             kb_node(k, KN_SELECT, KT_FLOAT, second, second_v, first_v));
    kb_finish(gen, k);
}

/* ---- row ops: a parallel loop over rows, inner loops over the row ---- */

typedef struct Row {
    Kernel *k;
    int64_t n, inner;
    int base; /* flat index of the row's first element */
} Row;

/* Rows of x along dim: outer * inner of them, n elements apart by inner. */
static Row row_begin(Gen *gen, const Op *op, const Value *x, int dim)
{
    Row R = {NULL, x->shape[dim], 1, 0};
    int64_t outer = 1;
    for (int d = 0; d < dim; d++)
        outer *= x->shape[d];
    for (int d = dim + 1; d < x->rank; d++)
        R.inner *= x->shape[d];
    R.k = kb_new(gen, KP_ROW, outer * R.inner, ftype_of(op));
    int r = kb_idx(R.k, 0);
    if (R.inner == 1) {
        R.base = ki(R.k, KN_MUL, r, kb_iconst(R.k, R.n));
    } else {
        int o = ki(R.k, KN_IDIV, r, kb_iconst(R.k, R.inner));
        int in = ki(R.k, KN_IMOD, r, kb_iconst(R.k, R.inner));
        R.base = ki(R.k, KN_ADD, ki(R.k, KN_MUL, o, kb_iconst(R.k, R.n * R.inner)), in);
    }
    return R;
}

/* Index of element c (a loop index node) of the row. */
static int at(Row *R, int c)
{
    int off = R->inner == 1 ? c : ki(R->k, KN_MUL, c, kb_iconst(R->k, R->inner));
    return ki(R->k, KN_ADD, R->base, off);
}

static int ld(Row *R, Gen *gen, const Value *v, int idx) { return kb_load(R->k, kb_arg(R->k, gen, T(gen, v)), idx); }

/* A norm's input at element idx: loaded, or, when it is kept in this kernel
 * (find_kept, fusion.c), computed and stored by the row's first loop (`first`),
 * whose element it reads at that element only (so it may take the memory of
 * an operand: the residual stream in place), and loaded by the loops after. */
static int ld_in(Row *R, Gen *gen, const Value *x, int idx, int first)
{
    if (!first || !gen->kept[x->id] || gen->kept[x->id] != gen->op->id + 1)
        return ld(R, gen, x, idx);
    int e = kept_expr(R->k, gen, x, x, idx);
    kb_store(R->k, kb_arg(R->k, gen, T(gen, x)), idx, e);
    return e;
}

/* Open a loop over the row (c: the element index node); fold a value with r. */
static int row_open(Row *R, int *c)
{
    int l = kb_loop(R->k, R->n);
    *c = kb_idx(R->k, 1);
    return l;
}

static int row_fold(Row *R, int loop, int v, KReduce r)
{
    kb_reduce(R->k, loop, v, r);
    return kb_end(R->k, loop);
}

static int row_max(Row *R, Gen *gen, const Value *x)
{
    int c, l = row_open(R, &c);
    return row_fold(R, l, ld(R, gen, x, at(R, c)), KR_MAX);
}

/* sum of exp(x - m) over the row */
static int row_sumexp(Row *R, Gen *gen, const Value *x, int m)
{
    Kernel *k = R->k;
    int c, l = row_open(R, &c);
    int e = kb_node(k, KN_EXP, KT_FLOAT, kf(k, KN_SUB, ld(R, gen, x, at(R, c)), m), 0, 0);
    return row_fold(R, l, e, KR_SUM);
}

static void softmax(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    Row R = row_begin(gen, op, x, norm_dim(ir_op_attr_int(op, "dim", -1), x->rank));
    Kernel *k = R.k;
    int m = row_max(&R, gen, x), s = row_sumexp(&R, gen, x, m), c;
    int loop = row_open(&R, &c), idx = at(&R, c);
    int e = kb_node(k, KN_EXP, KT_FLOAT, kf(k, KN_SUB, ld(&R, gen, x, idx), m), 0, 0);
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), idx, kf(k, KN_DIV, e, s));
    kb_end(k, loop);
    kb_finish(gen, k);
}

static void softmax_grad(Gen *gen, const Op *op)
{
    const Value *y = op->args[0], *dy = op->args[1];
    Row R = row_begin(gen, op, y, norm_dim(ir_op_attr_int(op, "dim", -1), y->rank));
    Kernel *k = R.k;
    int c, l = row_open(&R, &c);
    int dot = row_fold(&R, l, kf(k, KN_MUL, ld(&R, gen, y, at(&R, c)), ld(&R, gen, dy, at(&R, c))), KR_SUM);
    int loop = row_open(&R, &c), idx = at(&R, c);
    int v = kf(k, KN_MUL, ld(&R, gen, y, idx), kf(k, KN_SUB, ld(&R, gen, dy, idx), dot));
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), idx, v);
    kb_end(k, loop);
    kb_finish(gen, k);
}

static void reduce(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    Row R = row_begin(gen, op, x, norm_dim(ir_op_attr_int(op, "dim", -1), x->rank));
    Kernel *k = R.k;
    KReduce r = op->kind == OP_MAX ? KR_MAX : KR_SUM;
    int c, l = row_open(&R, &c);
    int v = row_fold(&R, l, operand(k, gen, x, x, at(&R, c)), r); /* x may be computed here */
    if (op->kind == OP_MEAN) /* over a split dim: the global count (localize.c) */
        v = kf(k, KN_DIV, v, kb_const(k, (double)ir_op_attr_int(op, "count", R.n)));
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), kb_idx(k, 0), v);
    kb_finish(gen, k);
}

/* dy goes to the first maximum of the row. */
static void max_grad(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    Row R = row_begin(gen, op, x, norm_dim(ir_op_attr_int(op, "dim", -1), x->rank));
    Kernel *k = R.k;
    int m = row_max(&R, gen, x), c, l = row_open(&R, &c);
    int is_max = kb_node(k, KN_EQ, KT_INT, ld(&R, gen, x, at(&R, c)), m, 0);
    int where = kb_node(k, KN_SELECT, KT_FLOAT, is_max, kb_node(k, KN_TOFLOAT, KT_FLOAT, c, 0, 0),
                        kb_const(k, (double)R.n));
    int first = row_fold(&R, l, where, KR_MIN);
    int g = kb_load(k, kb_arg(k, gen, T(gen, op->args[1])), kb_idx(k, 0));
    int loop = row_open(&R, &c);
    int hit = kb_node(k, KN_EQ, KT_INT, kb_node(k, KN_TOFLOAT, KT_FLOAT, c, 0, 0), first, 0);
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), at(&R, c), kb_node(k, KN_SELECT, KT_FLOAT, hit, g, kb_const(k, 0)));
    kb_end(k, loop);
    kb_finish(gen, k);
}

/* The index of the first maximum of each row, as max_grad finds it: the max
 * m, then the least c with x[c] == m (a KR_MIN over c or n), stored as i32;
 * n (a row of NaNs only) becomes 0. The index rides in the float type, exact
 * up to 2^24 in f32: a longer row computes in f64. */
static void argmax(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    Row R = row_begin(gen, op, x, norm_dim(ir_op_attr_int(op, "dim", -1), x->rank));
    Kernel *k = R.k;
    if (R.n > (INT64_C(1) << 24))
        k->ftype = DT_F64;
    int m = row_max(&R, gen, x), c, l = row_open(&R, &c);
    int is_max = kb_node(k, KN_EQ, KT_INT, ld(&R, gen, x, at(&R, c)), m, 0);
    int where = kb_node(k, KN_SELECT, KT_FLOAT, is_max, kb_node(k, KN_TOFLOAT, KT_FLOAT, c, 0, 0),
                        kb_const(k, (double)R.n));
    int first = kb_node(k, KN_TOINT, KT_INT, row_fold(&R, l, where, KR_MIN), 0, 0);
    first = ki(k, KN_MUL, first, kb_node(k, KN_LT, KT_INT, first, kb_iconst(k, R.n), 0));
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), kb_idx(k, 0), first);
    kb_finish(gen, k);
}

/* topk(x[...,V]) -> values, indices [...,k]: in the order largest first,
 * ties by index, NaNs last (among them by index), the j-th of the row is the
 * first of the elements after the (j-1)-th in that order: per j, three
 * passes over the row (the largest number left, how many numbers are left,
 * the first element with that value, or the first NaN left when no number
 * is). k is small (a router's experts): 3k passes. */
static void topk(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    int64_t K = ir_op_attr_int(op, "k", 1);
    Row R = row_begin(gen, op, x, x->rank - 1);
    Kernel *k = R.k;
    if (R.n > (INT64_C(1) << 24)) /* the element numbers are folded as floats */
        k->ftype = DT_F64;
    int r = kb_idx(k, 0), pv = -1, pi = -1, one = kb_iconst(k, 1), zero = kb_iconst(k, 0);
    int vs = kb_arg(k, gen, T(gen, op->res[0])), is = kb_arg(k, gen, T(gen, op->res[1]));
    for (int64_t j = 0; j < K; j++) {
        int m = -1, cnt = -1, idx = -1; /* this j's largest number left, numbers left, index */
        for (int p = 0; p < 3; p++) { /* each pass its own loop: its own element c */
            int c, l = row_open(&R, &c), a = ld(&R, gen, x, at(&R, c));
            int nan = kb_node(k, KN_NE, KT_INT, a, a, 0), avail = one;
            if (j > 0) { /* after the previous (pv, pi): a number below it or equal and later, or a NaN */
                int later = kb_node(k, KN_LT, KT_INT, pi, c, 0);
                int below = kb_node(k, KN_LT, KT_INT, a, pv, 0);
                int tie = ki(k, KN_MUL, kb_node(k, KN_EQ, KT_INT, a, pv, 0), later);
                int after_num = kb_node(k, KN_LT, KT_INT, zero, ki(k, KN_ADD, ki(k, KN_ADD, nan, below), tie), 0);
                int pnan = kb_node(k, KN_NE, KT_INT, pv, pv, 0);
                avail = kb_node(k, KN_SELECT, KT_INT, pnan, ki(k, KN_MUL, nan, later), after_num);
            }
            int num = ki(k, KN_MUL, avail, ki(k, KN_SUB, one, nan));
            if (p == 0) {
                m = row_fold(&R, l, kb_node(k, KN_SELECT, KT_FLOAT, num, a, kb_const(k, -INFINITY)), KR_MAX);
            } else if (p == 1) {
                cnt = row_fold(&R, l, kb_node(k, KN_TOFLOAT, KT_FLOAT, num, 0, 0), KR_SUM);
            } else {
                int some = kb_node(k, KN_LT, KT_INT, kb_const(k, 0.5), cnt, 0); /* numbers are left */
                int top = ki(k, KN_MUL, num, kb_node(k, KN_EQ, KT_INT, a, m, 0));
                int cand = kb_node(k, KN_SELECT, KT_INT, some, top, avail);
                int f = kb_node(k, KN_SELECT, KT_FLOAT, cand, kb_node(k, KN_TOFLOAT, KT_FLOAT, c, 0, 0),
                                kb_const(k, (double)R.n));
                idx = kb_node(k, KN_TOINT, KT_INT, row_fold(&R, l, f, KR_MIN), 0, 0);
            }
        }
        pi = ki(k, KN_MIN, idx, kb_iconst(k, R.n - 1));
        pv = ld(&R, gen, x, at(&R, pi)); /* the value at the index: a NaN too */
        int o = ki(k, KN_ADD, ki(k, KN_MUL, r, kb_iconst(k, K)), kb_iconst(k, j));
        kb_store(k, vs, o, pv);
        kb_store(k, is, o, pi);
    }
    kb_finish(gen, k);
}

/* scatter_add(indices[...,k], src[...,k]) -> [...,V]: at each element the
 * row's src values whose index is its column, summed in index order (0 when
 * none). Up to SCATTER_UNROLL indices per row are unrolled into a pointwise
 * kernel; more take a loop. */
#define SCATTER_UNROLL 8
static void scatter_add(Gen *gen, const Op *op)
{
    const Value *out = op->res[0];
    int64_t V = out->shape[out->rank - 1], K = op->args[0]->shape[op->args[0]->rank - 1];
    int unroll = K <= SCATTER_UNROLL;
    Kernel *k = kb_new(gen, unroll ? KP_POINTWISE : KP_ROW, numel(out), ftype_of(op));
    int i = kb_idx(k, 0), vc = kb_iconst(k, V), r = ki(k, KN_IDIV, i, vc), c = ki(k, KN_IMOD, i, vc);
    int ix = kb_arg(k, gen, T(gen, op->args[0])), src = kb_arg(k, gen, T(gen, op->args[1]));
    int g = kb_const(k, 0), l = -1;
    for (int64_t j = 0; j < (unroll ? K : 1); j++) {
        int jj = unroll ? kb_iconst(k, j) : (l = kb_loop(k, K), kb_idx(k, 1));
        int at_j = ki(k, KN_ADD, ki(k, KN_MUL, r, kb_iconst(k, K)), jj);
        int hit = kb_node(k, KN_EQ, KT_INT, kb_load(k, ix, at_j), c, 0);
        int add = kb_node(k, KN_SELECT, KT_FLOAT, hit, kb_load(k, src, at_j), kb_const(k, 0));
        if (unroll) {
            g = j ? kf(k, KN_ADD, g, add) : add;
        } else {
            kb_reduce(k, l, add, KR_SUM);
            g = kb_end(k, l);
        }
    }
    kb_store(k, kb_arg(k, gen, T(gen, out)), i, g);
    kb_finish(gen, k);
}

/* The row's mean (0 for rmsnorm) and 1 / sqrt(var + eps). */
static void norm_stats(Row *R, Gen *gen, const Op *op, const Value *x, int ln, int *mean, int *rs)
{
    Kernel *k = R->k;
    double C = (double)R->n;
    int c, l;
    *mean = kb_const(k, 0);
    if (ln) { /* (each fold closes its loop before the next node is made) */
        l = row_open(R, &c);
        int sum = row_fold(R, l, ld_in(R, gen, x, at(R, c), 1), KR_SUM);
        *mean = kf(k, KN_DIV, sum, kb_const(k, C));
    }
    l = row_open(R, &c);
    int d = kf(k, KN_SUB, ld_in(R, gen, x, at(R, c), !ln), *mean);
    int sq = row_fold(R, l, kf(k, KN_MUL, d, d), KR_SUM);
    int var = kf(k, KN_DIV, sq, kb_const(k, C));
    *rs = kb_node(k, KN_RSQRT, KT_FLOAT, kf(k, KN_ADD, var, kb_const(k, ir_op_attr_float(op, "eps", 1e-5))), 0, 0);
}

static void norm(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    int ln = op->kind == OP_LAYERNORM, mean, rs;
    Row R = row_begin(gen, op, x, x->rank - 1);
    Kernel *k = R.k;
    norm_stats(&R, gen, op, x, ln, &mean, &rs);
    int c, loop = row_open(&R, &c), idx = at(&R, c);
    int v = kf(k, KN_MUL, kf(k, KN_MUL, kf(k, KN_SUB, ld(&R, gen, x, idx), mean), rs),
               ld(&R, gen, op->args[1], c));
    if (ln)
        v = kf(k, KN_ADD, v, ld(&R, gen, op->args[2], c));
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), idx, v);
    kb_end(k, loop);
    kb_finish(gen, k);
}

/* dx by rows (saving mean and rstd), then dg and db by columns. */
static void norm_grad(Gen *gen, const Op *op)
{
    const Value *x = op->args[0], *g = op->args[1], *dy = op->args[2];
    int ln = op->kind == OP_LAYERNORM_GRAD, mean, rs;
    Row R = row_begin(gen, op, x, x->rank - 1);
    Kernel *k = R.k;
    int64_t rows = R.k->extent, C = R.n;
    int tmean = gen_temp(gen, ftype_of(op), 1, &rows), trs = gen_temp(gen, ftype_of(op), 1, &rows);
    norm_stats(&R, gen, op, x, ln, &mean, &rs);
    int c, l = row_open(&R, &c);
    int m1 = row_fold(&R, l, kf(k, KN_MUL, ld(&R, gen, dy, at(&R, c)), ld(&R, gen, g, c)), KR_SUM);
    l = row_open(&R, &c);
    int dxh = kf(k, KN_MUL, ld(&R, gen, dy, at(&R, c)), ld(&R, gen, g, c));
    int xh0 = kf(k, KN_MUL, kf(k, KN_SUB, ld(&R, gen, x, at(&R, c)), mean), rs);
    int m2 = row_fold(&R, l, kf(k, KN_MUL, dxh, xh0), KR_SUM);
    m1 = kf(k, KN_DIV, m1, kb_const(k, (double)C));
    m2 = kf(k, KN_DIV, m2, kb_const(k, (double)C));
    int loop = row_open(&R, &c), idx = at(&R, c);
    int xh = kf(k, KN_MUL, kf(k, KN_SUB, ld(&R, gen, x, idx), mean), rs);
    int v = kf(k, KN_SUB, kf(k, KN_MUL, ld(&R, gen, dy, idx), ld(&R, gen, g, c)), kf(k, KN_MUL, xh, m2));
    if (ln)
        v = kf(k, KN_SUB, v, m1);
    kb_store(k, kb_arg(k, gen, T(gen, op->res[0])), idx, kf(k, KN_MUL, rs, v));
    kb_end(k, loop);
    kb_store(k, kb_arg(k, gen, tmean), kb_idx(k, 0), mean);
    kb_store(k, kb_arg(k, gen, trs), kb_idx(k, 0), rs);
    kb_finish(gen, k);
    /* columns: dg[c] = sum_r dy xh, db[c] = sum_r dy */
    for (int out = 1; out < op->nres; out++) {
        Kernel *kc = kb_new(gen, KP_ROW, C, ftype_of(op));
        int col = kb_idx(kc, 0), lc = kb_loop(kc, rows), r = kb_idx(kc, 1);
        int e = ki(kc, KN_ADD, ki(kc, KN_MUL, r, kb_iconst(kc, C)), col);
        int d = kb_load(kc, kb_arg(kc, gen, T(gen, dy)), e);
        if (out == 1) {
            int mu = kb_load(kc, kb_arg(kc, gen, tmean), r), s = kb_load(kc, kb_arg(kc, gen, trs), r);
            int xv = kb_load(kc, kb_arg(kc, gen, T(gen, x)), e);
            d = kf(kc, KN_MUL, d, kf(kc, KN_MUL, kf(kc, KN_SUB, xv, mu), s));
        }
        kb_reduce(kc, lc, d, KR_SUM);
        int acc = kb_end(kc, lc);
        kb_store(kc, kb_arg(kc, gen, T(gen, op->res[out])), col, acc);
        kb_finish(gen, kc);
    }
}

/* The gradient's loop over row R of x: (exp(x - m) / s - [column is target t]) * scale into out. */
static void ce_grad_loop(Row *R, Gen *gen, const Value *x, int m, int s, int t, int scale, const Value *out)
{
    Kernel *k = R->k;
    int c, loop = row_open(R, &c), idx = at(R, c);
    int p = kf(k, KN_DIV, kb_node(k, KN_EXP, KT_FLOAT, kf(k, KN_SUB, ld(R, gen, x, idx), m), 0, 0), s);
    int hot = kb_node(k, KN_TOFLOAT, KT_FLOAT, kb_node(k, KN_EQ, KT_INT, c, t, 0), 0, 0);
    kb_store(k, kb_arg(k, gen, T(gen, out)), idx, kf(k, KN_MUL, kf(k, KN_SUB, p, hot), scale));
    kb_end(k, loop);
}

/* log-sum-exp of the row minus the target's logit, per row, then the mean.
 * Paired with its gradient (gen->ce_pair, fusion.c), the row kernel also
 * writes the gradient, in the logits' own memory when tensors.c put it
 * there: the target's logit is read before the row's first loop, so every
 * element is read before any is written. */
static void cross_entropy(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    const Op *grad = gen->ce_pair && gen->ce_pair[op->id] > 0 ? gen->g->ops.data[gen->ce_pair[op->id] - 1] : NULL;
    Row R = row_begin(gen, op, x, x->rank - 1);
    Kernel *k = R.k;
    int64_t rows = k->extent;
    int tmp = gen_temp(gen, ftype_of(op), 1, &rows);
    int t = kb_load(k, kb_arg(k, gen, T(gen, op->args[1])), kb_idx(k, 0));
    int xt = ld(&R, gen, x, ki(k, KN_ADD, R.base, t));
    int m = row_max(&R, gen, x), s = row_sumexp(&R, gen, x, m);
    int loss = kf(k, KN_SUB, kf(k, KN_ADD, m, kb_node(k, KN_LOG, KT_FLOAT, s, 0, 0)), xt);
    kb_store(k, kb_arg(k, gen, tmp), kb_idx(k, 0), loss);
    double dl;
    if (grad) { /* the loss's gradient, which find_ce_pairs found the compile knows */
        if (!ir_scalar_value(grad->args[2], &dl))
            UNREACHABLE();
        double n = (double)ir_op_attr_int(grad, "rows", rows);
        ce_grad_loop(&R, gen, x, m, s, t, kf(k, KN_DIV, kb_const(k, dl), kb_const(k, n)), grad->res[0]);
    }
    kb_finish(gen, k);
    Kernel *k2 = kb_new(gen, KP_ROW, 1, ftype_of(op));
    int l = kb_loop(k2, rows);
    kb_reduce(k2, l, kb_load(k2, kb_arg(k2, gen, tmp), kb_idx(k2, 1)), KR_SUM);
    int sum = kb_end(k2, l);
    double all = (double)ir_op_attr_int(op, "rows", rows); /* rows split: all of them */
    kb_store(k2, kb_arg(k2, gen, T(gen, op->res[0])), kb_iconst(k2, 0), kf(k2, KN_DIV, sum, kb_const(k2, all)));
    kb_finish(gen, k2);
}

static void cross_entropy_grad(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    Row R = row_begin(gen, op, x, x->rank - 1);
    Kernel *k = R.k;
    int m = row_max(&R, gen, x), s = row_sumexp(&R, gen, x, m);
    int t = kb_load(k, kb_arg(k, gen, T(gen, op->args[1])), kb_idx(k, 0));
    int dl = kb_load(k, kb_arg(k, gen, T(gen, op->args[2])), kb_iconst(k, 0));
    int scale = kf(k, KN_DIV, dl, kb_const(k, (double)ir_op_attr_int(op, "rows", k->extent)));
    ce_grad_loop(&R, gen, x, m, s, t, scale, op->res[0]);
    kb_finish(gen, k);
}

/* out (the target shape) [j] = sum of x over the dims broadcasting stretched. */
static void sum_to(Gen *gen, const Op *op)
{
    const Value *x = op->args[0], *out = op->res[0];
    int64_t kept[IR_MAX_RANK], red[IR_MAX_RANK], kstride[IR_MAX_RANK], rstride[IR_MAX_RANK];
    int nk = 0, nr = 0;
    int64_t stride = 1, nred = 1;
    for (int d = x->rank - 1; d >= 0; d--) {
        int od = out->rank - x->rank + d;
        int keep = od >= 0 && out->shape[od] == x->shape[d];
        if (keep) {
            kept[nk] = x->shape[d];
            kstride[nk++] = stride;
        } else {
            red[nr] = x->shape[d];
            rstride[nr++] = stride;
            nred *= x->shape[d];
        }
        stride *= x->shape[d];
    }
    Kernel *k = kb_new(gen, KP_ROW, numel(out), ftype_of(op));
    int j = kb_idx(k, 0), base = kb_iconst(k, 0);
    for (int q = 0; q < nk; q++) { /* kept dims, innermost first */
        int coord = ki(k, KN_IMOD, j, kb_iconst(k, kept[q]));
        base = ki(k, KN_ADD, base, ki(k, KN_MUL, coord, kb_iconst(k, kstride[q])));
        j = ki(k, KN_IDIV, j, kb_iconst(k, kept[q]));
    }
    int l = kb_loop(k, nred), r = kb_idx(k, 1), idx = base;
    for (int q = 0; q < nr; q++) {
        int coord = ki(k, KN_IMOD, r, kb_iconst(k, red[q]));
        idx = ki(k, KN_ADD, idx, ki(k, KN_MUL, coord, kb_iconst(k, rstride[q])));
        r = ki(k, KN_IDIV, r, kb_iconst(k, red[q]));
    }
    kb_reduce(k, l, kb_load(k, kb_arg(k, gen, T(gen, x)), idx), KR_SUM);
    int acc = kb_end(k, l);
    kb_store(k, kb_arg(k, gen, T(gen, out)), kb_idx(k, 0), acc);
    kb_finish(gen, k);
}

/* Zero the table, then per column d, add the rows of dy at their ids: columns
 * are independent, so the parallel loop has no conflicts. */
static void embed_grad(Gen *gen, const Op *op)
{
    const Value *ids = op->args[0], *dy = op->args[1], *out = op->res[0];
    int64_t D = out->shape[1], rows = numel(ids);
    Kernel *z = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
    kb_store(z, kb_arg(z, gen, T(gen, out)), kb_idx(z, 0), kb_const(z, 0));
    kb_finish(gen, z);
    Kernel *k = kb_new(gen, KP_ROW, D, ftype_of(op));
    int d = kb_idx(k, 0), l = kb_loop(k, rows), r = kb_idx(k, 1);
    int id = kb_load(k, kb_arg(k, gen, T(gen, ids)), r), keep;
    id = local_id(k, gen, op, id, out->shape[0], &keep);
    int g = kb_load(k, kb_arg(k, gen, T(gen, dy)), ki(k, KN_ADD, ki(k, KN_MUL, r, kb_iconst(k, D)), d));
    if (keep >= 0)
        g = kf(k, KN_MUL, g, kb_node(k, KN_TOFLOAT, KT_FLOAT, keep, 0, 0));
    kb_store_add(k, kb_arg(k, gen, T(gen, out)), ki(k, KN_ADD, ki(k, KN_MUL, id, kb_iconst(k, D)), d), g);
    kb_end(k, l);
    kb_finish(gen, k);
}

/* arange: element i is i. A kernel of its own: it reads nothing, so it
 * fuses with no reader's loads. */
static void arange(Gen *gen, const Op *op)
{
    const Value *out = op->res[0];
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
    int i = kb_idx(k, 0);
    kb_store(k, kb_arg(k, gen, T(gen, out)), i, kb_node(k, KN_TOFLOAT, KT_FLOAT, i, 0, 0));
    kb_finish(gen, k);
}

/* The tensor an attention operand (q 0, k 1, v 2) reads in place when it is
 * a view (gen->view, codegen/fusion.c) of a fused q/k/v tensor x [..., G,
 * W], with where head h of row r starts in it: r *pitch + h *head + *off;
 * NULL when the operand has memory of its own. */
static const Value *attention_view(const Gen *gen, const Value *operand, int64_t *pitch,
                                   int64_t *head, int64_t *off)
{
    const Op *r = operand->def;
    if (!gen->view || !r || r->kind != OP_RESHAPE || !gen->view[r->args[0]->id])
        return NULL;
    const Op *s = r->args[0]->def;
    const Value *x = s->args[0];
    *head = x->shape[x->rank - 1];
    *pitch = x->shape[x->rank - 2] * *head;
    *off = ir_op_attr_int(s, "start", 0);
    return x;
}

static void attention(Gen *gen, const Op *op)
{
    const Value *q = op->args[0];
    int64_t H = ir_op_attr_int(op, "heads", 1), Dh = q->shape[2] / H;
    int64_t Dv = op->args[2]->shape[2] / ir_op_attr_int(op, "kv_heads", H);
    if (op->kind == OP_ATTENTION_GRAD) /* the kernel adds into dk and dv (and the bias's gradient) */
        for (int i = 1; i < op->nres; i++) {
            Kernel *z = kb_new(gen, KP_POINTWISE, numel(op->res[i]), ftype_of(op));
            kb_store(z, kb_arg(z, gen, T(gen, op->res[i])), kb_idx(z, 0), kb_const(z, 0));
            kb_finish(gen, z);
        }
    Kernel *k = kb_new(gen, op->kind == OP_ATTENTION ? KP_ATTENTION : KP_ATTENTION_BWD, 1,
                       ftype_of(op));
    k->attn = (KAttention){q->shape[0], q->shape[1], H, ir_op_attr_int(op, "kv_heads", H), Dh,
                           (int)ir_op_attr_int(op, "causal", 0),
                           ir_op_attr_float(op, "scale", 1 / sqrt((double)Dh)),
                           ir_op_attr_int(op, "window", 0), -1,
                           (int)ir_op_attr_int(op, "alibi", 0), ir_op_attr_int(op, "alibi_heads", H), -1,
                           ir_op_attr_float(op, "softcap", 0), op->args[1]->shape[1], Dv,
                           -1, 0, -1, {0}, {0}, {0}};
    int nq = op->kind == OP_ATTENTION ? 3 : 4; /* q, k, v (dout): the mask and the rest after */
    for (int i = 0; i < nq; i++) { /* q, k and v may be views of the fused tensor */
        const Value *x = i < 3 ? attention_view(gen, op->args[i], &k->attn.in_pitch[i],
                                                 &k->attn.in_head[i], &k->attn.in_off[i])
                               : NULL;
        k->args[k->nargs] = T(gen, x ? x : op->args[i]), k->arg_dtype[k->nargs++] = op->args[i]->dtype;
    }
    for (int i = 0; i < op->nres && i < 3; i++)
        k->args[k->nargs] = T(gen, op->res[i]), k->arg_dtype[k->nargs++] = op->res[i]->dtype;
    if (op->kind == OP_ATTENTION_GRAD) { /* the C rendering's scratch: [2][B][H][S] */
        int64_t n = 2 * q->shape[0] * H * q->shape[1];
        DType t = ftype_of(op) == DT_F64 ? DT_F64 : DT_F32;
        k->args[k->nargs] = gen_temp(gen, t, 1, &n), k->arg_dtype[k->nargs++] = t;
    }
    static const int rank[3] = {2, 0, 3}; /* the mask [B, Sk]; ALiBi's head offset; the bias */
    int *slot[3] = {&k->attn.mask, &k->attn.hoff, &k->attn.bias};
    for (int r = 0; r < 3; r++) {
        int i = ir_attention_arg(op, rank[r]);
        if (i < 0)
            continue;
        *slot[r] = k->nargs;
        k->args[k->nargs] = T(gen, op->args[i]), k->arg_dtype[k->nargs++] = op->args[i]->dtype;
        if (r == 2)
            k->attn.bias_heads = op->args[i]->shape[0];
    }
    if (op->nres == 4) { /* the bias's gradient */
        k->attn.dbias = k->nargs;
        k->args[k->nargs] = T(gen, op->res[3]), k->arg_dtype[k->nargs++] = op->res[3]->dtype;
    }
    double f = 2.0 * (double)(k->attn.batch * H * k->attn.seq * k->attn.seq_k * (Dh + Dv));
    f = k->attn.causal ? f / 2 : f;
    if (k->attn.window > 0) { /* a window: the (query, key) pairs it lets through, not S^2 */
        int64_t S = k->attn.seq, W = k->attn.window, pairs = 0;
        for (int64_t i = 0; i < S; i++)
            pairs += (k->attn.causal ? i : (i + W - 1 < S - 1 ? i + W - 1 : S - 1)) -
                     (i - W + 1 > 0 ? i - W + 1 : 0) + 1;
        f = 2.0 * (double)(k->attn.batch * H * (Dh + Dv)) * (double)pairs;
    }
    gen->flops += f * (op->kind == OP_ATTENTION ? 1 : 2.5);
    kb_finish(gen, k);
}

/* microbatch_sum: x added into the sum, element by element. The runtime
 * runs the first microbatch's as a copy of x (plan/expand.c), so the sum
 * is ((x_0 + x_1) + x_2) + ..., the unrolled adds' order. */
static void microbatch_sum(Gen *gen, const Op *op)
{
    const Value *out = op->res[0], *x = op->args[0];
    Kernel *k = kb_new(gen, KP_POINTWISE, numel(out), ftype_of(op));
    int i = kb_idx(k, 0);
    int acc = kb_arg(k, gen, T(gen, out)), xs = kb_arg(k, gen, T(gen, x));
    kb_store(k, acc, i, kf(k, KN_ADD, kb_load(k, acc, i), kb_load(k, xs, i)));
    kb_finish(gen, k);
    gen->instrs.data[gen->instrs.len - 1].acc = 1;
}

int cg_op_kernels(Gen *gen, const Op *op)
{
    switch (op->kind) {
    case OP_MB_SUM: microbatch_sum(gen, op); return 0;
    case OP_CONSTANT: case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_NEG:
    case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH: case OP_SIGMOID:
    case OP_RELU: case OP_GELU: case OP_SILU: case OP_CAST: case OP_EXPAND: case OP_GELU_GRAD:
    case OP_SILU_GRAD: case OP_RELU_GRAD: case OP_CLIP_SCALE: case OP_STOP_GRAD: case OP_ERF:
    case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_EQ: case OP_NE: case OP_WHERE:
    case OP_DROPOUT: case OP_ABS: case OP_FLOOR:
        pointwise(gen, op);
        return 0;
    case OP_ARANGE: arange(gen, op); return 0;
    case OP_TRANSPOSE: transpose(gen, op); return 0;
    case OP_SLICE: slice(gen, op); return 0;
    case OP_PAD: case OP_CONCAT: segments(gen, op); return 0;
    case OP_EMBED: embed(gen, op); return 0;
    case OP_GATHER: gather(gen, op); return 0;
    case OP_TOPK: topk(gen, op); return 0;
    case OP_SCATTER_ADD: scatter_add(gen, op); return 0;
    case OP_GATHER_GRAD: gather_grad(gen, op); return 0;
    case OP_ROPE: rope(gen, op); return 0;
    case OP_SOFTMAX: softmax(gen, op); return 0;
    case OP_SOFTMAX_GRAD: softmax_grad(gen, op); return 0;
    case OP_SUM: case OP_MEAN: case OP_MAX: reduce(gen, op); return 0;
    case OP_MAX_GRAD: max_grad(gen, op); return 0;
    case OP_ARGMAX: argmax(gen, op); return 0;
    case OP_LAYERNORM: case OP_RMSNORM: norm(gen, op); return 0;
    case OP_LAYERNORM_GRAD: case OP_RMSNORM_GRAD: norm_grad(gen, op); return 0;
    case OP_CROSS_ENTROPY: cross_entropy(gen, op); return 0;
    case OP_CROSS_ENTROPY_GRAD: cross_entropy_grad(gen, op); return 0;
    case OP_SUM_TO: sum_to(gen, op); return 0;
    case OP_EMBED_GRAD: embed_grad(gen, op); return 0;
    case OP_ATTENTION: case OP_ATTENTION_GRAD: attention(gen, op); return 0;
    default: return -1;
    }
}
