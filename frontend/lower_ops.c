/* lower_ops.c: the tensor ops a TDL call may name, and those lowered by more
 * than one op. Reads a call's sorted operands and attrs; writes ops.
 * Key idea: one table (op_specs) gives each op's name, tensor operands and
 * keyword arguments, in positional order; attention's fused qkv operand,
 * scatter and dropout become a few plain ops here. */
#include "lower_impl.h"

#include <string.h>

/* ---- the op table ---- */

static const OpSpec op_specs[] = {
    {"exp", OP_EXP, 1, 1, {{0}}},
    {"log", OP_LOG, 1, 1, {{0}}},
    {"sqrt", OP_SQRT, 1, 1, {{0}}},
    {"rsqrt", OP_RSQRT, 1, 1, {{0}}},
    {"tanh", OP_TANH, 1, 1, {{0}}},
    {"sigmoid", OP_SIGMOID, 1, 1, {{0}}},
    {"relu", OP_RELU, 1, 1, {{0}}},
    {"gelu", OP_GELU, 1, 1, {{0}}},
    {"silu", OP_SILU, 1, 1, {{0}}},
    {"erf", OP_ERF, 1, 1, {{0}}},
    {"abs", OP_ABS, 1, 1, {{0}}},
    {"floor", OP_FLOOR, 1, 1, {{0}}},
    {"arange", OP_ARANGE, 0, 0, {{"n", K_INT}, {"dtype", K_DTYPE}}},
    {"stop_gradient", OP_STOP_GRAD, 1, 1, {{0}}},
    {"where", OP_WHERE, 3, 3, {{0}}},
    {"matmul", OP_MATMUL, 2, 2, {{0}}},
    {"softmax", OP_SOFTMAX, 1, 1, {{"dim", K_INT}}},
    {"layernorm", OP_LAYERNORM, 3, 3, {{"eps", K_FLOAT}}},
    {"rmsnorm", OP_RMSNORM, 2, 2, {{"eps", K_FLOAT}}},
    {"sum", OP_SUM, 1, 1, {{"dim", K_INT}, {"keepdim", K_BOOL}}},
    {"mean", OP_MEAN, 1, 1, {{"dim", K_INT}, {"keepdim", K_BOOL}}},
    {"max", OP_MAX, 1, 1, {{"dim", K_INT}, {"keepdim", K_BOOL}}},
    {"argmax", OP_ARGMAX, 1, 1, {{"dim", K_INT}, {"keepdim", K_BOOL}}},
    {"embed", OP_EMBED, 2, 2, {{0}}},
    {"gather", OP_GATHER, 2, 2, {{0}}},
    {"topk", OP_TOPK, 1, 1, {{"k", K_INT}}},
    {"scatter", OP_SCATTER_ADD, 3, 3, {{0}}}, /* x + scatter_add(index, src): call_op */
    {"dropout", OP_DROPOUT, 1, 1, {{"p", K_FLOAT}}}, /* fe_call_dropout */
    {"rope", OP_ROPE, 1, 1, {{"heads", K_INT}, {"theta", K_FLOAT}, {"rotate_half", K_BOOL}}},
    {"attention", OP_ATTENTION, 1, 3,
     {{"heads", K_INT}, {"kv_heads", K_INT}, {"causal", K_BOOL}, {"window", K_INT}, {"mask", K_TENSOR},
      {"alibi", K_BOOL}, {"scale", K_FLOAT}, {"softcap", K_FLOAT}, {"bias", K_TENSOR}}},
    {"cross_entropy", OP_CROSS_ENTROPY, 2, 2, {{0}}},
    {"reshape", OP_RESHAPE, 1, 1, {{"shape", K_INTS}}},
    {"expand", OP_EXPAND, 1, 1, {{"shape", K_INTS}}},
    {"transpose", OP_TRANSPOSE, 1, 1, {{"perm", K_INTS}}},
    {"slice", OP_SLICE, 1, 1, {{"start", K_INT}, {"end", K_INT}, {"dim", K_INT}}},
    {"concat", OP_CONCAT, 1, 64, {{"dim", K_INT}}},
    {"cast", OP_CAST, 1, 1, {{"dtype", K_DTYPE}}},
};

const OpSpec *fe_find_spec(const char *name)
{
    for (size_t i = 0; i < sizeof op_specs / sizeof op_specs[0]; i++)
        if (strcmp(op_specs[i].name, name) == 0)
            return &op_specs[i];
    return NULL;
}

const KwSpec *fe_find_kw(const OpSpec *s, const char *name)
{
    for (int i = 0; i < OP_MAX_KW && s->kw[i].name; i++)
        if (strcmp(s->kw[i].name, name) == 0)
            return &s->kw[i];
    return NULL;
}

void fe_kw_names(const OpSpec *s, char *buf, size_t n)
{
    buf[0] = 0;
    for (int i = 0; i < OP_MAX_KW && s->kw[i].name; i++) {
        size_t k = strlen(buf);
        snprintf(buf + k, n - k, "%s'%s'", i ? ", " : "", s->kw[i].name);
    }
}

/* ---- ops lowered specially ---- */

/* attention(qkv, ...) with one fused operand, laid out group-major: for each of
 * the KV key/value groups, its H/KV query heads, then its key head, then its
 * value head, Dh wide each. Split q, k and v off it through a [..., KV, W]
 * view, so that a split of the fused dimension over a tensor axis is a split
 * of whole groups (heads) of q, k and v alike. */
static Value *qkv_part(Lower *L, Value *view, int64_t start, int64_t end, int64_t width,
                       const Value *x, Loc loc)
{
    Arena *a = L->c->arena;
    Attr *sa[3] = {ir_attr_int(a, "dim", -1), ir_attr_int(a, "start", start),
                   ir_attr_int(a, "end", end)};
    Value *part = fe_emit(L, OP_SLICE, &view, 1, sa, 3, loc);
    if (!part)
        return NULL;
    int64_t shape[IR_MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = width;
    Attr *ra = ir_attr_ints(a, "shape", shape, x->rank);
    return fe_emit(L, OP_RESHAPE, &part, 1, &ra, 1, loc);
}

int fe_split_qkv(Lower *L, Value **t, Attr **attrs, int nattrs, Loc loc)
{
    int64_t heads = 0, kv = 0;
    for (int i = 0; i < nattrs; i++) {
        if (strcmp(attrs[i]->key, "heads") == 0)
            heads = attrs[i]->i;
        if (strcmp(attrs[i]->key, "kv_heads") == 0)
            kv = attrs[i]->i;
    }
    kv = kv ? kv : heads;
    Value *x = t[0];
    int64_t c = x->rank ? x->shape[x->rank - 1] : 0;
    if (heads <= 0 || kv <= 0 || heads % kv != 0 || c % (heads + 2 * kv) != 0) {
        fe_err(L, loc, "in 'attention': the fused operand %s does not split into q, k, v for "
               "%lld heads and %lld kv heads", fe_type_str(L, x), (long long)heads, (long long)kv);
        return -1;
    }
    int64_t dh = c / (heads + 2 * kv), g = heads / kv, w = (g + 2) * dh;
    int64_t shape[IR_MAX_RANK + 1];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = kv;
    shape[x->rank] = w;
    Attr *ra = ir_attr_ints(L->c->arena, "shape", shape, x->rank + 1);
    Value *view = x->rank < IR_MAX_RANK ? fe_emit(L, OP_RESHAPE, &x, 1, &ra, 1, loc) : NULL;
    if (!view)
        return -1;
    t[0] = qkv_part(L, view, 0, g * dh, heads * dh, x, loc);
    t[1] = t[0] ? qkv_part(L, view, g * dh, (g + 1) * dh, kv * dh, x, loc) : NULL;
    t[2] = t[1] ? qkv_part(L, view, (g + 1) * dh, w, kv * dh, x, loc) : NULL;
    return t[2] ? 0 : -1;
}

/* scatter(x[...,V], index i32[...,k], src[...,k]): x with src added at the
 * indices along the last dim, as x + scatter_add(index, src) {size = V}. */
Val fe_call_scatter(Lower *L, Value **t, Loc loc)
{
    Value *x = t[0], *ix = t[1];
    if (x->rank < 1 || ix->rank != x->rank ||
        memcmp(x->shape, ix->shape, sizeof(int64_t) * (size_t)(x->rank - 1)) != 0) {
        char xs[128], is[128];
        ir_type_str(xs, sizeof xs, x->dtype, x->rank, x->shape);
        ir_type_str(is, sizeof is, ix->dtype, ix->rank, ix->shape);
        fe_err(L, loc, "in 'scatter': index %s must have x's rank and leading dimensions (x is %s)", is, xs);
        return ERRV;
    }
    Attr *size = ir_attr_int(L->c->arena, "size", x->shape[x->rank - 1]);
    Value *add = fe_emit(L, OP_SCATTER_ADD, t + 1, 2, &size, 1, loc);
    return add ? vtensor(fe_emit(L, OP_ADD, (Value *[]){x, add}, 2, NULL, 0, loc)) : ERRV;
}

/* A source op outside any layer, made once: the dropout keys of n rows (an
 * input that the runtime writes from the seed, split and sliced into
 * microbatches like the data) and the step number. */
static Value *dropout_source(Lower *L, OpKind kind, int64_t n, Loc loc)
{
    char name[64];
    if (kind == OP_INPUT)
        snprintf(name, sizeof name, "dropout.keys.%lld", (long long)n);
    else
        snprintf(name, sizeof name, "dropout.step");
    const char *id = intern(L->c->strings, name);
    for (int i = 0; i < L->g->ops.len; i++)
        if (L->g->ops.data[i]->kind == kind && L->g->ops.data[i]->res[0]->name == id)
            return L->g->ops.data[i]->res[0];
    Op *op = ir_op_new(L->g, kind, NULL, 0, loc);
    op->layer = -1;
    if (kind == OP_INPUT)
        ir_op_set_attr(L->g, op, ir_attr_bool(L->c->arena, "keys", 1));
    Value *v = kind == OP_INPUT ? ir_op_result(L->g, op, DT_I32, 1, &n)
                                : ir_op_result(L->g, op, DT_F32, 0, NULL);
    v->name = id;
    return v;
}

/* dropout(x, p): x's elements zeroed with probability p, the rest scaled by
 * 1 / (1 - p), from a counter-based random stream of the seed, the step, the
 * call and the element's place in the whole batch (docs/language.md). */
Val fe_call_dropout(Lower *L, Value *x, Attr **attrs, int na, Loc loc)
{
    if (!ir_op_attr(&(Op){.attrs = attrs, .nattrs = na}, "p")) {
        fe_err(L, loc, "'dropout' needs 'p', the probability of zeroing an element");
        return ERRV;
    }
    double p = ir_op_attr_float(&(Op){.attrs = attrs, .nattrs = na}, "p", 0);
    if (!(p >= 0 && p < 1)) {
        fe_err(L, loc, "in 'dropout': 'p' must be in [0, 1), got %g", p);
        return ERRV;
    }
    if (x->rank < 1 || !ir_dtype_is_float(x->dtype)) {
        char xs[128];
        ir_type_str(xs, sizeof xs, x->dtype, x->rank, x->shape);
        fe_err(L, loc, "in 'dropout': x must be a float tensor of rank >= 1, got %s", xs);
        return ERRV;
    }
    if (p == 0)
        return vtensor(x);
    Value *keys = dropout_source(L, OP_INPUT, x->shape[0], loc);
    Value *step = dropout_source(L, OP_STEP, 0, loc);
    attrs[na++] = ir_attr_int(L->c->arena, "stream", ++L->dropouts);
    return vtensor(fe_emit(L, OP_DROPOUT, (Value *[]){x, keys, step}, 3, attrs, na, loc));
}
