/* shape.c: the shape and dtype rule of every op. Reads an Op's operands and
 * attrs; writes the result dtype and global shape, or one lowercase line saying
 * what is wrong. The TDL lowering reports that line at the user's expression and
 * the verifier re-checks every op with it, so a rule lives here and nowhere
 * else. Key idea: validate arity and operands once up front, so each rule may
 * index shapes freely; check every product of dimensions for overflow. */
#include "ir.h"

#include <stdarg.h>
#include <string.h>

/* Largest element count: a byte size of any dtype (at most 8 bytes) still fits. */
#define MAX_ELEMS (INT64_MAX / 8)

typedef struct Infer {
    const Op *op;
    const char *name; /* the op's spelling */
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    char *err;
    size_t errlen;
} Infer;

/* A printed type, returned by value so a message can format several at once. */
typedef struct TypeStr {
    char s[200];
} TypeStr;

static int fail(Infer *in, const char *fmt, ...) PRINTF_LIKE(2, 3);
static int fail(Infer *in, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (in->err && in->errlen)
        vsnprintf(in->err, in->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static TypeStr type_str(DType t, int rank, const int64_t *shape)
{
    TypeStr ts;
    ir_type_str(ts.s, sizeof(ts.s), t, rank < 0 || rank > IR_MAX_RANK ? 0 : rank, shape);
    return ts;
}

static TypeStr ts(const Value *v)
{
    return type_str(v->dtype, v->rank, v->shape);
}

/* "[5,-1]": an attr shape, which has no dtype. */
static TypeStr dims_str(int n, const int64_t *d)
{
    TypeStr ts;
    size_t k = 0;
    ts.s[k++] = '[';
    for (int i = 0; i < n && k < sizeof(ts.s) - 24; i++)
        k += (size_t)snprintf(ts.s + k, sizeof(ts.s) - k, "%s%lld", i ? "," : "", (long long)d[i]);
    snprintf(ts.s + k, sizeof(ts.s) - k, "]");
    return ts;
}

/* a * b for a, b >= 0; -1 past MAX_ELEMS. */
static int64_t mul_dims(int64_t a, int64_t b)
{
    if (a != 0 && b > MAX_ELEMS / a)
        return -1;
    return a * b;
}

/* Element count of a validated shape; -1 past MAX_ELEMS. */
static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank && n >= 0; i++)
        n = mul_dims(n, shape[i]);
    return n;
}

static const Value *arg(const Infer *in, int i)
{
    return in->op->args[i];
}

static int set_result(Infer *in, DType t, int rank, const int64_t *shape)
{
    in->dt = t;
    in->rank = rank;
    if (rank > 0)
        memmove(in->shape, shape, sizeof(int64_t) * (size_t)rank);
    return 0;
}

static int same_as(Infer *in, const Value *v)
{
    return set_result(in, v->dtype, v->rank, v->shape);
}

/* ---- operands and attrs ---- */

/* A Value any rule may index: present, known dtype, rank in range, sizes >= 0. */
static int check_value(Infer *in, const Value *v, const char *what, int i)
{
    if (!v)
        return fail(in, "%s %d of '%s' is missing", what, i, in->name);
    if (v->rank < 0 || v->rank > IR_MAX_RANK)
        return fail(in, "%s %d of '%s' has rank %d (at most %d)", what, i, in->name, v->rank,
                    IR_MAX_RANK);
    if ((unsigned)v->dtype >= DT_COUNT)
        return fail(in, "%s %d of '%s' has unknown dtype %d", what, i, in->name, (int)v->dtype);
    for (int d = 0; d < v->rank; d++)
        if (v->shape[d] < 0)
            return fail(in, "%s %d of '%s' has a negative dimension: %s", what, i, in->name,
                        ts(v).s);
    if (numel(v->rank, v->shape) < 0)
        return fail(in, "shape too large: %s", ts(v).s);
    return 0;
}

static int check_arity(Infer *in)
{
    int want = ir_ops[in->op->kind].nargs, got = in->op->nargs;
    if (ir_op_arity_ok(in->op))
        want = want < 0 ? want : got; /* attention's optional mask */
    if (want < 0 && got < 1)
        return fail(in, "'%s' takes at least 1 operand, got %d", in->name, got);
    if (want >= 0 && got != want)
        return fail(in, "'%s' takes %d operand%s, got %d", in->name, want, want == 1 ? "" : "s",
                    got);
    for (int i = 0; i < got; i++)
        if (check_value(in, in->op->args ? in->op->args[i] : NULL, "operand", i) != 0)
            return -1;
    return 0;
}

static int attr_int(Infer *in, const char *key, int64_t dflt, int64_t *out)
{
    const Attr *a = ir_op_attr(in->op, key);
    *out = dflt;
    if (!a)
        return 0;
    if (a->kind != ATTR_INT)
        return fail(in, "'%s' must be an integer", key);
    *out = a->i;
    return 0;
}

static int attr_bool(Infer *in, const char *key)
{
    const Attr *a = ir_op_attr(in->op, key);
    if (a && a->kind != ATTR_BOOL)
        return fail(in, "'%s' must be true or false", key);
    return 0;
}

/* A number that must be > 0 (eps, theta); INT or FLOAT. */
static int attr_positive(Infer *in, const char *key)
{
    const Attr *a = ir_op_attr(in->op, key);
    if (!a)
        return 0;
    if (a->kind != ATTR_INT && a->kind != ATTR_FLOAT)
        return fail(in, "'%s' must be a number", key);
    double x = ir_op_attr_float(in->op, key, 0);
    if (!(x > 0))
        return fail(in, "'%s' must be positive, got %g", key, x);
    return 0;
}

/* A LIST of INT with at most IR_MAX_RANK items into out[]; *n its length. */
static int attr_ints(Infer *in, const char *key, int64_t *out, int *n)
{
    const Attr *a = ir_op_attr(in->op, key);
    if (!a)
        return fail(in, "'%s' needs attr '%s'", in->name, key);
    if (a->kind != ATTR_LIST)
        return fail(in, "'%s' must be a list of integers", key);
    for (int i = 0; i < a->nitems; i++)
        if (!a->items || !a->items[i] || a->items[i]->kind != ATTR_INT)
            return fail(in, "'%s' must be a list of integers", key);
    if (a->nitems > IR_MAX_RANK)
        return fail(in, "'%s' has %d entries, at most %d", key, a->nitems, IR_MAX_RANK);
    for (int i = 0; i < a->nitems; i++)
        out[i] = a->items[i]->i;
    *n = a->nitems;
    return 0;
}

/* Attr dim (default -1) as an index into a shape of this rank. */
static int attr_dim(Infer *in, int rank, int *dim)
{
    int64_t d;
    if (attr_int(in, "dim", -1, &d) != 0)
        return -1;
    if (d < -rank || d >= rank)
        return fail(in, "'dim' %lld out of range for rank %d", (long long)d, rank);
    *dim = (int)(d < 0 ? d + rank : d);
    return 0;
}

static int need_float(Infer *in, const Value *v)
{
    if (!ir_dtype_is_float(v->dtype))
        return fail(in, "'%s' needs a float operand, got %s", in->name, ir_dtype_name(v->dtype));
    return 0;
}

static int same_dtype(Infer *in, const Value *a, const Value *b)
{
    if (a->dtype != b->dtype)
        return fail(in, "dtype mismatch: %s and %s", ir_dtype_name(a->dtype),
                    ir_dtype_name(b->dtype));
    return 0;
}

static int need_rank(Infer *in, const Value *v, const char *what, int lo)
{
    if (v->rank < lo)
        return fail(in, "%s %s must have rank >= %d, got %s", in->name, what, lo, ts(v).s);
    return 0;
}

/* ---- rules ---- */

/* input, param, constant: the result carries its own type. */
static int infer_source(Infer *in)
{
    const Op *op = in->op;
    if (op->nres != 1)
        return fail(in, "'%s' must have 1 result, got %d", in->name, op->nres);
    const Value *v = op->res ? op->res[0] : NULL;
    if (check_value(in, v, "result", 0) != 0)
        return -1;
    if (op->kind == OP_STEP && (v->dtype != DT_F32 || v->rank != 0))
        return fail(in, "'step' must be f32[], got %s", ts(v).s);
    if (op->kind == OP_STATE && !ir_dtype_is_float(v->dtype))
        return fail(in, "'state' needs a float type, got %s", ts(v).s);
    if (op->kind == OP_CONSTANT && !ir_dtype_is_float(v->dtype))
        return fail(in, "'constant' needs a float type, got %s", ts(v).s);
    const Attr *a = ir_op_attr(op, "value");
    if (op->kind == OP_CONSTANT && a && a->kind != ATTR_INT && a->kind != ATTR_FLOAT)
        return fail(in, "'value' must be a number");
    return same_as(in, v);
}

/* NumPy broadcasting: align trailing dims; a size-1 or missing dim stretches. */
static int infer_broadcast(Infer *in)
{
    const Value *a = arg(in, 0), *b = arg(in, 1);
    if (same_dtype(in, a, b) != 0)
        return -1;
    int r = a->rank > b->rank ? a->rank : b->rank;
    int64_t out[IR_MAX_RANK];
    for (int i = 0; i < r; i++) {
        int64_t ia = i - (r - a->rank), ib = i - (r - b->rank), da = ia >= 0 ? a->shape[ia] : 1,
                db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return fail(in, "shapes %s and %s do not broadcast", ts(a).s, ts(b).s);
        out[i] = da == 1 ? db : da;
    }
    return set_result(in, a->dtype, r, out);
}

/* where(c, a, b): a and b of one dtype, c of any (a mask, ids); the three
 * shapes broadcast together. */
static int infer_where(Infer *in)
{
    const Value *c = arg(in, 0), *a = arg(in, 1), *b = arg(in, 2);
    if (same_dtype(in, a, b) != 0)
        return -1;
    int r = c->rank > a->rank ? c->rank : a->rank;
    r = b->rank > r ? b->rank : r;
    int64_t out[IR_MAX_RANK];
    for (int i = 0; i < r; i++) {
        int64_t d = 1;
        for (int k = 0; k < 3; k++) {
            const Value *v = arg(in, k);
            int j = i - (r - v->rank);
            int64_t s = j >= 0 ? v->shape[j] : 1;
            if (s != 1 && d != 1 && s != d)
                return fail(in, "shapes %s, %s and %s do not broadcast", ts(c).s, ts(a).s,
                            ts(b).s);
            d = s == 1 ? d : s;
        }
        out[i] = d;
    }
    return set_result(in, a->dtype, r, out);
}

static int infer_unary(Infer *in, int any_dtype)
{
    if (!any_dtype && need_float(in, arg(in, 0)) != 0)
        return -1;
    return same_as(in, arg(in, 0));
}

static int infer_cast(Infer *in)
{
    const Attr *a = ir_op_attr(in->op, "dtype");
    if (!a)
        return fail(in, "'cast' needs attr 'dtype'");
    if (a->kind != ATTR_STR || !a->s)
        return fail(in, "'dtype' must be a dtype name");
    int t = ir_dtype_lookup(a->s);
    if (t < 0)
        return fail(in, "unknown dtype '%s'", a->s);
    const Value *x = arg(in, 0);
    return set_result(in, (DType)t, x->rank, x->shape);
}

/* b[K,N] is shared by every batch of a; a rank > 2 b must match a's batch dims. */
static int infer_matmul(Infer *in)
{
    const Value *a = arg(in, 0), *b = arg(in, 1);
    if (need_float(in, a) || need_float(in, b) || same_dtype(in, a, b) ||
        need_rank(in, a, "operand a", 2) || need_rank(in, b, "operand b", 2))
        return -1;
    if (b->rank > 2 && b->rank != a->rank)
        return fail(in, "batched matmul needs operands of equal rank: %s x %s", ts(a).s, ts(b).s);
    for (int i = 0; b->rank > 2 && i < a->rank - 2; i++)
        if (a->shape[i] != b->shape[i])
            return fail(in, "batched matmul leading dimensions differ: %s x %s", ts(a).s, ts(b).s);
    int64_t ka = a->shape[a->rank - 1], kb = b->shape[b->rank - 2], out[IR_MAX_RANK];
    if (ka != kb)
        return fail(in, "matmul inner dimensions differ: %s x %s (%lld vs %lld)", ts(a).s, ts(b).s,
                    (long long)ka, (long long)kb);
    memcpy(out, a->shape, sizeof(int64_t) * (size_t)a->rank);
    out[a->rank - 1] = b->shape[b->rank - 1];
    const Attr *d = ir_op_attr(in->op, "dtype"); /* "f32": 16-bit operands' f32 sums, kept */
    if (d && (d->kind != ATTR_STR || !d->s || strcmp(d->s, "f32") || a->dtype != DT_BF16))
        return fail(in, "dtype = \"%s\" of %s operands: only \"f32\" of bf16 ones",
                    d->kind == ATTR_STR && d->s ? d->s : "?", ir_dtype_name(a->dtype));
    return set_result(in, d ? DT_F32 : a->dtype, a->rank, out);
}

static int infer_softmax(Infer *in)
{
    const Value *x = arg(in, 0);
    int dim;
    if (need_float(in, x) || attr_dim(in, x->rank, &dim))
        return -1;
    return same_as(in, x);
}

/* x[...,C] with g[C] (and b[C] for layernorm) of x's dtype. */
static int infer_norm(Infer *in)
{
    const Value *x = arg(in, 0);
    static const char *what[] = {"input", "weight", "bias"};
    if (need_float(in, x) || need_rank(in, x, "input", 1))
        return -1;
    int64_t c = x->shape[x->rank - 1];
    for (int i = 1; i < in->op->nargs; i++) {
        const Value *p = arg(in, i);
        if (p->dtype != x->dtype || p->rank != 1 || p->shape[0] != c)
            return fail(in, "%s %s must be %s, got %s", in->name, what[i],
                        type_str(x->dtype, 1, &c).s, ts(p).s);
    }
    if (attr_positive(in, "eps") != 0)
        return -1;
    return same_as(in, x);
}

/* sum, mean, max, argmax: remove attr dim, or keep it as size 1 with keepdim.
 * argmax's result is the i32 index along dim, which must be a non-empty
 * dimension whose indices fit i32. */
static int infer_reduce(Infer *in)
{
    const Value *x = arg(in, 0);
    if (in->op->kind == OP_SUM && !ir_dtype_is_float(x->dtype) && x->dtype != DT_I32)
        return fail(in, "'sum' needs a float or i32 operand, got %s", ir_dtype_name(x->dtype));
    if (in->op->kind != OP_SUM && need_float(in, x) != 0)
        return -1;
    int dim;
    if (attr_dim(in, x->rank, &dim) || attr_bool(in, "keepdim"))
        return -1;
    int arg = in->op->kind == OP_ARGMAX;
    if (arg && (x->shape[dim] < 1 || x->shape[dim] > INT32_MAX))
        return fail(in, "'argmax' over dimension %d of %s: its size must be in 1..2^31-1", dim,
                    ts(x).s);
    int keep = ir_op_attr_int(in->op, "keepdim", 0) != 0;
    int64_t out[IR_MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (i != dim)
            out[r++] = x->shape[i];
        else if (keep)
            out[r++] = 1;
    }
    return set_result(in, arg ? DT_I32 : x->dtype, r, out);
}

/* table[V,D] gathered at ids i32[...] -> [...,D] */
static int infer_embed(Infer *in)
{
    const Value *t = arg(in, 0), *ids = arg(in, 1);
    if (t->rank != 2)
        return fail(in, "embed table must have rank 2, got %s", ts(t).s);
    if (need_float(in, t) != 0)
        return -1;
    if (ids->dtype != DT_I32)
        return fail(in, "embed ids must be i32, got %s", ts(ids).s);
    if (ids->rank > IR_MAX_RANK - 1)
        return fail(in, "embed ids must have rank <= %d, got %s", IR_MAX_RANK - 1, ts(ids).s);
    int64_t out[IR_MAX_RANK];
    memcpy(out, ids->shape, sizeof(int64_t) * (size_t)ids->rank);
    out[ids->rank] = t->shape[1];
    return set_result(in, t->dtype, ids->rank + 1, out);
}

/* gather(x[...,V], index) -> index's shape, x's dtype: index i32[...] (one
 * per row) or i32[...,k] (k per row), its leading dims x's. */
static int infer_gather(Infer *in)
{
    const Value *x = arg(in, 0), *ix = arg(in, 1);
    if (need_float(in, x) || need_rank(in, x, "x", 1))
        return -1;
    if (ix->dtype != DT_I32 || (ix->rank != x->rank - 1 && ix->rank != x->rank) ||
        memcmp(ix->shape, x->shape, sizeof(int64_t) * (size_t)(x->rank - 1)) != 0)
    {
        TypeStr one = type_str(DT_I32, x->rank - 1, x->shape);
        size_t n = strlen(one.s);
        return fail(in, "gather index must be %s (one per row) or %.*s%sk] (k per row) for x %s, got %s",
                    one.s, (int)(n - 1), one.s, x->rank > 1 ? "," : "", ts(x).s, ts(ix).s);
    }
    return set_result(in, x->dtype, ix->rank, ix->shape);
}

/* dropout(x, keys i32[n0], step f32[], offsets i32[]...) -> x's type; p in [0, 1). */
static int infer_dropout(Infer *in)
{
    const Value *x = arg(in, 0), *keys = arg(in, 1), *step = arg(in, 2);
    const Attr *pa = ir_op_attr(in->op, "p");
    if (need_float(in, x) || need_rank(in, x, "x", 1))
        return -1;
    if (!pa || (pa->kind != ATTR_INT && pa->kind != ATTR_FLOAT))
        return fail(in, "dropout needs 'p', a number");
    double p = ir_op_attr_float(in->op, "p", 0);
    if (!(p >= 0 && p < 1))
        return fail(in, "'p' must be in [0, 1), got %g", p);
    if (keys->dtype != DT_I32 || keys->rank != 1 || keys->shape[0] != x->shape[0])
        return fail(in, "dropout keys must be i32[%lld] (x's first dimension), got %s",
                    (long long)x->shape[0], ts(keys).s);
    if (step->dtype != DT_F32 || step->rank != 0)
        return fail(in, "dropout step must be f32[], got %s", ts(step).s);
    for (int i = 3; i < in->op->nargs; i++)
        if (arg(in, i)->dtype != DT_I32 || arg(in, i)->rank != 0)
            return fail(in, "dropout offset %d must be i32[], got %s", i - 3, ts(arg(in, i)).s);
    return set_result(in, x->dtype, x->rank, x->shape);
}

/* topk(x[...,V]) -> values [...,k] (x's dtype), indices i32[...,k]; 1 <= k <= V. */
static int infer_topk(Infer *in)
{
    const Value *x = arg(in, 0);
    int64_t k, out[IR_MAX_RANK];
    if (need_float(in, x) || need_rank(in, x, "x", 1) || attr_int(in, "k", 0, &k))
        return -1;
    if (k < 1 || k > x->shape[x->rank - 1])
        return fail(in, "'k' must be in [1, %lld] (the last dimension of %s), got %lld",
                    (long long)x->shape[x->rank - 1], ts(x).s, (long long)k);
    memcpy(out, x->shape, sizeof(int64_t) * (size_t)x->rank);
    out[x->rank - 1] = k;
    return set_result(in, x->dtype, x->rank, out);
}

/* scatter_add(indices i32[...,k], src[...,k]) -> [..., size], size >= 1. */
static int infer_scatter_add(Infer *in)
{
    const Value *ix = arg(in, 0), *dy = arg(in, 1);
    int64_t size, out[IR_MAX_RANK];
    if (attr_int(in, "size", 0, &size) || need_float(in, dy) || need_rank(in, dy, "dy", 1))
        return -1;
    if (ix->dtype != DT_I32 || ix->rank != dy->rank ||
        memcmp(ix->shape, dy->shape, sizeof(int64_t) * (size_t)ix->rank) != 0)
        return fail(in, "scatter_add indices %s do not match src %s", ts(ix).s, ts(dy).s);
    if (size < 1)
        return fail(in, "'size' must be >= 1, got %lld", (long long)size);
    memcpy(out, dy->shape, sizeof(int64_t) * (size_t)dy->rank);
    out[dy->rank - 1] = size;
    return set_result(in, dy->dtype, dy->rank, out);
}

/* gather_grad(index i32[...], dy[...]) -> [..., size]. */
static int infer_gather_grad(Infer *in)
{
    const Value *ix = arg(in, 0), *dy = arg(in, 1);
    int64_t size, out[IR_MAX_RANK];
    if (attr_int(in, "size", 0, &size) || need_float(in, dy))
        return -1;
    if (size < 1)
        return fail(in, "'size' must be >= 1, got %lld", (long long)size);
    if (ix->dtype != DT_I32 || ix->rank != dy->rank || ix->rank > IR_MAX_RANK - 1 ||
        memcmp(ix->shape, dy->shape, sizeof(int64_t) * (size_t)ix->rank) != 0)
        return fail(in, "gather_grad index %s does not match dy %s", ts(ix).s, ts(dy).s);
    memcpy(out, dy->shape, sizeof(int64_t) * (size_t)dy->rank);
    out[dy->rank] = size;
    return set_result(in, dy->dtype, dy->rank + 1, out);
}

/* x[...,S,H*Dh]: rotation pairs within each head need an even Dh. */
static int infer_rope(Infer *in)
{
    const Value *x = arg(in, 0);
    int64_t heads;
    if (need_float(in, x) || need_rank(in, x, "input", 2) || attr_int(in, "heads", 1, &heads))
        return -1;
    int64_t last = x->shape[x->rank - 1];
    if (heads < 1)
        return fail(in, "'heads' must be >= 1, got %lld", (long long)heads);
    if (last % heads != 0)
        return fail(in, "'heads' %lld does not divide %lld, the last dimension of %s",
                    (long long)heads, (long long)last, ts(x).s);
    if ((last / heads) % 2 != 0)
        return fail(in, "rope head dimension %lld is odd (%s, heads %lld)",
                    (long long)(last / heads), ts(x).s, (long long)heads);
    if (attr_positive(in, "theta") != 0)
        return -1;
    return same_as(in, x);
}

/* q, k, v: rank 3, one float dtype, same batch; v shares k's batch and
 * length (the keys' length Sk their own: cross-attention); v's last
 * dimension is checked by the head rule (a head size Dv of its own). */
static int attention_operands(Infer *in)
{
    static const char *names[] = {"q", "k", "v"};
    const Value *q = arg(in, 0), *k = arg(in, 1), *v = arg(in, 2);
    if (need_float(in, q) || same_dtype(in, q, k) || same_dtype(in, q, v))
        return -1;
    for (int i = 0; i < 3; i++)
        if (arg(in, i)->rank != 3)
            return fail(in, "attention %s must have rank 3, got %s", names[i], ts(arg(in, i)).s);
    if (q->shape[0] != k->shape[0])
        return fail(in, "attention q and k differ in batch: %s and %s", ts(q).s, ts(k).s);
    if (memcmp(k->shape, v->shape, sizeof(int64_t) * 2) != 0)
        return fail(in, "attention v must have k's batch and length %s, got %s", ts(k).s, ts(v).s);
    return 0;
}

/* Keys of a length Sk of their own (cross-attention, Sk != S): causal, a
 * window and ALiBi measure a key's distance from the query by position,
 * which means nothing between two sequences: refused. */
static int cross_refusals(Infer *in, int64_t window)
{
    int64_t S = arg(in, 0)->shape[1], Sk = arg(in, 1)->shape[1];
    const char *what = ir_op_attr_int(in->op, "causal", 0) ? "causal"
                     : window > 0                          ? "window"
                     : ir_op_attr_int(in->op, "alibi", 0)  ? "alibi"
                                                           : NULL;
    if (S == Sk || !what)
        return 0;
    return fail(in, "'%s' needs keys as long as the queries; q has %lld positions, k %lld "
                    "(cross-attention)", what, (long long)S, (long long)Sk);
}

/* q[B,S,H*Dh], k[B,Sk,KV*Dh], v[B,Sk,KV*Dv] -> [B,S,H*Dv]; KV divides H
 * (grouped-query); the values' head size Dv their own (DeepSeek-V2's latent
 * attention; Dh but there); the mask [B,Sk]. */
static int infer_attention(Infer *in)
{
    const Value *q = arg(in, 0), *k = arg(in, 1);
    int64_t h, kv, window;
    if (attention_operands(in) != 0)
        return -1;
    if (!ir_op_attr(in->op, "heads"))
        return fail(in, "'attention' needs attr 'heads'");
    if (attr_int(in, "heads", 1, &h) || attr_int(in, "kv_heads", h, &kv) ||
        attr_bool(in, "causal") || attr_int(in, "window", 0, &window))
        return -1;
    if (window < 0)
        return fail(in, "'window' must be >= 0 (0: none), got %lld", (long long)window);
    double scale = ir_op_attr_float(in->op, "scale", 1); /* the scores' factor; 1/sqrt(Dh) */
    if (!(scale > 0 && scale < 1e30))
        return fail(in, "'scale' must be a positive number, got %g", scale);
    double cap = ir_op_attr_float(in->op, "softcap", 1); /* the scores' cap: c tanh(s / c) */
    if (!(cap > 0 && cap < 1e30))
        return fail(in, "'softcap' must be a positive number, got %g", cap);
    int nq = in->op->kind == OP_ATTENTION_GRAD ? 4 : 3, masks = 0, offsets = 0, biases = 0;
    if (attr_bool(in, "alibi") || cross_refusals(in, window))
        return -1;
    if (h < 1 || kv < 1)
        return fail(in, "'%s' must be >= 1, got %lld", h < 1 ? "heads" : "kv_heads",
                    (long long)(h < 1 ? h : kv));
    int64_t sk = k->shape[1];
    for (int i = nq; i < in->op->nargs; i++) {
        const Value *m = arg(in, i);
        if (m->rank == 0) { /* ALiBi's head offset (localize): the block's first column of q */
            if (m->dtype != DT_I32 || !ir_op_attr_int(in->op, "alibi", 0) || offsets++)
                return fail(in, "attention's head offset must be one i32[] of an 'alibi' attention, got %s",
                            ts(m).s);
            continue;
        }
        if (m->rank == 3) { /* the scores' bias: per head or one for all, every query and key */
            int64_t hb = m->shape[0];
            if ((hb != 1 && hb != h) || m->shape[1] != q->shape[1] || m->shape[2] != sk ||
                !ir_dtype_is_float(m->dtype) || biases++)
                return fail(in, "attention bias must be [H, S, %s] = [%lld, %lld, %lld] or [1, %lld, %lld] (float), "
                            "got %s", sk == q->shape[1] ? "S" : "Sk", (long long)h, (long long)q->shape[1],
                            (long long)sk, (long long)q->shape[1], (long long)sk, ts(m).s);
            continue;
        }
        /* the mask: which keys of each row are seen */
        if (m->rank != 2 || m->shape[0] != q->shape[0] || m->shape[1] != sk ||
            !(ir_dtype_is_float(m->dtype) || m->dtype == DT_I32) || masks++)
            return fail(in, "attention mask must be [B, %s] = [%lld, %lld] (float or i32), got %s",
                        sk == q->shape[1] ? "S" : "Sk", (long long)q->shape[0], (long long)sk,
                        ts(m).s);
    }
    if (q->shape[2] % h != 0)
        return fail(in, "'heads' %lld does not divide %lld, the last dimension of q %s",
                    (long long)h, (long long)q->shape[2], ts(q).s);
    if (h % kv != 0)
        return fail(in, "'kv_heads' %lld does not divide 'heads' %lld", (long long)kv,
                    (long long)h);
    int64_t dh = q->shape[2] / h;
    if (k->shape[2] != kv * dh)
        return fail(in,
                    "attention k must have last dimension %lld (kv_heads %lld x head dim %lld), "
                    "got %s",
                    (long long)(kv * dh), (long long)kv, (long long)dh, ts(k).s);
    const Value *v = arg(in, 2);
    if (v->shape[2] % kv != 0 || v->shape[2] == 0)
        return fail(in, "'kv_heads' %lld does not divide %lld, the last dimension of v %s",
                    (long long)kv, (long long)v->shape[2], ts(v).s);
    int64_t out[3] = {q->shape[0], q->shape[1], h * (v->shape[2] / kv)};
    return set_result(in, q->dtype, 3, out);
}

/* logits[...,V], targets i32[...] -> a scalar mean loss. */
static int infer_cross_entropy(Infer *in)
{
    const Value *l = arg(in, 0), *t = arg(in, 1);
    if (need_float(in, l) || need_rank(in, l, "logits", 1))
        return -1;
    int lead = l->rank - 1;
    if (t->dtype != DT_I32 || t->rank != lead ||
        memcmp(t->shape, l->shape, sizeof(int64_t) * (size_t)lead) != 0)
        return fail(in, "cross_entropy targets must be %s for logits %s, got %s",
                    type_str(DT_I32, lead, l->shape).s, ts(l).s, ts(t).s);
    return set_result(in, l->dtype == DT_F64 ? DT_F64 : DT_F32, 0, NULL);
}

/* attr shape: sizes >= 0 and at most one -1, inferred from the element count. */
static int infer_reshape(Infer *in)
{
    const Value *x = arg(in, 0);
    int64_t s[IR_MAX_RANK], known = 1, total = numel(x->rank, x->shape);
    int n, hole = -1;
    if (attr_ints(in, "shape", s, &n) != 0)
        return -1;
    for (int i = 0; i < n; i++) {
        if (s[i] < -1 || (s[i] == -1 && hole >= 0))
            return fail(in, "'shape' %s: sizes must be >= 0, with at most one -1",
                        dims_str(n, s).s);
        if (s[i] == -1)
            hole = i;
        else if ((known = mul_dims(known, s[i])) < 0)
            return fail(in, "shape too large: %s", dims_str(n, s).s);
    }
    if (hole >= 0 && (known == 0 || total % known != 0))
        return fail(in, "reshape from %s (%lld elements) to %s: cannot infer the -1", ts(x).s,
                    (long long)total, dims_str(n, s).s);
    if (hole >= 0)
        s[hole] = total / known;
    else if (known != total)
        return fail(in, "reshape from %s (%lld elements) to %s (%lld elements)", ts(x).s,
                    (long long)total, dims_str(n, s).s, (long long)known);
    return set_result(in, x->dtype, n, s);
}

/* arange: attr n >= 1 positions, f32[n] (attr dtype: another float type;
 * precision = f64 gives f64). */
static int infer_arange(Infer *in)
{
    int64_t n;
    const Attr *a = ir_op_attr(in->op, "dtype");
    int t = a && a->kind == ATTR_STR && a->s ? ir_dtype_lookup(a->s) : a ? -1 : DT_F32;
    if (attr_int(in, "n", -1, &n))
        return -1;
    if (n < 1 || n > MAX_ELEMS)
        return fail(in, "arange needs a length n of at least 1, got %lld", (long long)n);
    if (t < 0 || !ir_dtype_is_float((DType)t))
        return fail(in, "arange's 'dtype' must name a float type");
    return set_result(in, (DType)t, 1, &n);
}

/* attr perm, a permutation of 0..rank-1; without it, swap the last two dims. */
static int infer_transpose(Infer *in)
{
    const Value *x = arg(in, 0);
    int64_t p[IR_MAX_RANK], out[IR_MAX_RANK];
    int n, seen[IR_MAX_RANK] = {0};
    if (!ir_op_attr(in->op, "perm")) {
        if (x->rank < 2)
            return fail(in, "transpose without 'perm' needs rank >= 2, got %s", ts(x).s);
        ir_transpose_perm(in->op, p);
        for (int d = 0; d < x->rank; d++)
            out[d] = x->shape[p[d]];
        return set_result(in, x->dtype, x->rank, out);
    }
    if (attr_ints(in, "perm", p, &n) != 0)
        return -1;
    for (int i = 0; i < n && n == x->rank; i++) {
        if (p[i] < 0 || p[i] >= n || seen[p[i]]++)
            n = -1;
        else
            out[i] = x->shape[p[i]];
    }
    if (n != x->rank)
        return fail(in, "'perm' %s is not a permutation of the %d dimensions of %s",
                    dims_str(ir_op_attr(in->op, "perm")->nitems, p).s, x->rank, ts(x).s);
    return set_result(in, x->dtype, n, out);
}

/* x[start:end] along attr dim; 0 <= start < end <= size. */
static int infer_slice(Infer *in)
{
    const Value *x = arg(in, 0);
    int dim;
    int64_t start, end;
    if (attr_dim(in, x->rank, &dim) != 0)
        return -1;
    int64_t size = x->shape[dim];
    if (attr_int(in, "start", 0, &start) || attr_int(in, "end", size, &end))
        return -1;
    if (start < 0 || start > size || end < 0 || end > size)
        return fail(in, "slice %lld:%lld out of range for dimension %d of %s", (long long)start,
                    (long long)end, dim, ts(x).s);
    if (start >= end)
        return fail(in, "slice %lld:%lld of dimension %d of %s is empty", (long long)start,
                    (long long)end, dim, ts(x).s);
    int64_t out[IR_MAX_RANK];
    memcpy(out, x->shape, sizeof(int64_t) * (size_t)x->rank);
    out[dim] = end - start;
    return set_result(in, x->dtype, x->rank, out);
}

/* Operands of one dtype and rank, equal outside attr dim, which adds up. */
static int infer_concat(Infer *in)
{
    const Value *a = arg(in, 0);
    int dim;
    if (attr_dim(in, a->rank, &dim) != 0)
        return -1;
    int64_t out[IR_MAX_RANK];
    memcpy(out, a->shape, sizeof(int64_t) * (size_t)a->rank);
    for (int i = 1; i < in->op->nargs; i++) {
        const Value *b = arg(in, i);
        if (same_dtype(in, a, b) != 0)
            return -1;
        if (b->rank != a->rank)
            return fail(in, "concat operands differ in rank: %s and %s", ts(a).s, ts(b).s);
        for (int d = 0; d < a->rank; d++)
            if (d != dim && a->shape[d] != b->shape[d])
                return fail(in, "concat operands differ outside dimension %d: %s and %s", dim,
                            ts(a).s, ts(b).s);
        if (b->shape[dim] > MAX_ELEMS - out[dim])
            return fail(in, "shape too large: concat of %d operands", in->op->nargs);
        out[dim] += b->shape[dim];
    }
    return set_result(in, a->dtype, a->rank, out);
}

/* ---- backward ops ---- */

/* sum_to: attr shape must broadcast up to x's shape. */
static int infer_sum_to(Infer *in)
{
    const Value *x = arg(in, 0);
    int64_t s[IR_MAX_RANK];
    int n;
    if (attr_ints(in, "shape", s, &n) != 0)
        return -1;
    if (n > x->rank)
        return fail(in, "sum_to target %s has more dimensions than %s", dims_str(n, s).s, ts(x).s);
    for (int i = 0; i < n; i++) {
        int64_t d = x->shape[x->rank - n + i];
        if (s[i] != d && s[i] != 1)
            return fail(in, "sum_to target %s does not broadcast to %s", dims_str(n, s).s, ts(x).s);
    }
    return set_result(in, x->dtype, n, s);
}

/* expand: x must broadcast up to attr shape. */
static int infer_expand(Infer *in)
{
    const Value *x = arg(in, 0);
    int64_t s[IR_MAX_RANK];
    int n;
    if (attr_ints(in, "shape", s, &n) != 0)
        return -1;
    if (x->rank > n)
        return fail(in, "cannot expand %s to fewer dimensions %s", ts(x).s, dims_str(n, s).s);
    for (int i = 0; i < x->rank; i++) {
        int64_t d = s[n - x->rank + i];
        if (x->shape[i] != d && x->shape[i] != 1)
            return fail(in, "%s does not broadcast to %s", ts(x).s, dims_str(n, s).s);
    }
    for (int i = 0; i < n; i++) /* no empty tensor: its gradient would slice nothing */
        if (s[i] < 1)
            return fail(in, "expand target %s has a size below 1", dims_str(n, s).s);
    return set_result(in, x->dtype, n, s);
}

static int infer_pad(Infer *in)
{
    const Value *x = arg(in, 0);
    int dim;
    int64_t before, after, out[IR_MAX_RANK];
    if (attr_dim(in, x->rank, &dim) || attr_int(in, "before", 0, &before) ||
        attr_int(in, "after", 0, &after))
        return -1;
    if (before < 0 || after < 0 || before > MAX_ELEMS || after > MAX_ELEMS)
        return fail(in, "pad sizes must be >= 0, got %lld and %lld", (long long)before,
                    (long long)after);
    memcpy(out, x->shape, sizeof(int64_t) * (size_t)x->rank);
    out[dim] += before + after;
    return set_result(in, x->dtype, x->rank, out);
}

/* Operands 0 and 1 are x and dy (or y and dy) of one shape: the result is x's. */
static int infer_pointwise_grad(Infer *in)
{
    const Value *x = arg(in, 0), *dy = arg(in, 1);
    if (need_float(in, x) || same_dtype(in, x, dy))
        return -1;
    if (x->rank != dy->rank || memcmp(x->shape, dy->shape, sizeof(int64_t) * (size_t)x->rank))
        return fail(in, "%s gradient %s does not match %s", in->name, ts(dy).s, ts(x).s);
    if (in->op->kind == OP_SOFTMAX_GRAD) {
        int dim;
        if (attr_dim(in, x->rank, &dim) != 0)
            return -1;
    }
    return same_as(in, x);
}

/* max_grad: dy has the reduced shape of x. */
static int infer_max_grad(Infer *in)
{
    const Value *x = arg(in, 0), *dy = arg(in, 1);
    int dim;
    if (need_float(in, x) || same_dtype(in, x, dy) || attr_dim(in, x->rank, &dim) ||
        attr_bool(in, "keepdim"))
        return -1;
    int keep = ir_op_attr_int(in->op, "keepdim", 0) != 0, r = 0;
    int64_t red[IR_MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        if (i != dim || keep)
            red[r++] = i == dim ? 1 : x->shape[i];
    if (dy->rank != r || memcmp(dy->shape, red, sizeof(int64_t) * (size_t)r))
        return fail(in, "max_grad gradient %s does not match the reduced %s", ts(dy).s,
                    type_str(x->dtype, r, red).s);
    return same_as(in, x);
}

/* layernorm_grad / rmsnorm_grad: x[...,C], g[C], dy like x. */
static int infer_norm_grad(Infer *in)
{
    const Value *x = arg(in, 0), *g = arg(in, 1), *dy = arg(in, 2);
    if (need_float(in, x) || need_rank(in, x, "input", 1) || same_dtype(in, x, dy))
        return -1;
    int64_t c = x->shape[x->rank - 1];
    if (g->dtype != x->dtype || g->rank != 1 || g->shape[0] != c)
        return fail(in, "%s weight must be %s, got %s", in->name, type_str(x->dtype, 1, &c).s,
                    ts(g).s);
    if (dy->rank != x->rank || memcmp(dy->shape, x->shape, sizeof(int64_t) * (size_t)x->rank))
        return fail(in, "%s gradient %s does not match %s", in->name, ts(dy).s, ts(x).s);
    if (attr_positive(in, "eps") != 0)
        return -1;
    return same_as(in, x);
}

/* embed_grad: ids i32[...], dy[...,D] -> [vocab, D]. */
static int infer_embed_grad(Infer *in)
{
    const Value *ids = arg(in, 0), *dy = arg(in, 1);
    int64_t vocab;
    if (ids->dtype != DT_I32)
        return fail(in, "embed_grad ids must be i32, got %s", ts(ids).s);
    if (need_float(in, dy) || attr_int(in, "vocab", 0, &vocab))
        return -1;
    if (vocab < 1 || vocab > MAX_ELEMS)
        return fail(in, "'vocab' must be >= 1, got %lld", (long long)vocab);
    if (dy->rank != ids->rank + 1 ||
        memcmp(dy->shape, ids->shape, sizeof(int64_t) * (size_t)ids->rank) != 0)
        return fail(in, "embed_grad gradient %s does not match ids %s", ts(dy).s, ts(ids).s);
    int64_t out[2] = {vocab, dy->shape[dy->rank - 1]};
    return set_result(in, dy->dtype, 2, out);
}

/* attention_grad: q, k, v as attention, dout like the output ([B,S,H*Dv]);
 * results mirror q, k, v. */
static int infer_attention_grad(Infer *in)
{
    const Value *q = arg(in, 0), *d = arg(in, 3);
    if (infer_attention(in) != 0)
        return -1;
    int64_t want[3] = {in->shape[0], in->shape[1], in->shape[2]};
    if (d->dtype != q->dtype || d->rank != 3 || memcmp(d->shape, want, sizeof want))
        return fail(in, "attention_grad dout %s does not match the output %s", ts(d).s,
                    type_str(q->dtype, 3, want).s);
    return same_as(in, q);
}

/* cross_entropy_grad: logits, targets as cross_entropy; dloss a scalar. */
static int infer_cross_entropy_grad(Infer *in)
{
    const Value *l = arg(in, 0), *dl = arg(in, 2);
    if (infer_cross_entropy(in) != 0)
        return -1;
    if (dl->rank != 0 || dl->dtype != in->dt)
        return fail(in, "cross_entropy_grad dloss must be %s[], got %s", ir_dtype_name(in->dt),
                    ts(dl).s);
    return same_as(in, l);
}

/* ---- optimizer ops ---- */

static int need_scalar(Infer *in, const Value *v, const char *what)
{
    if (!ir_dtype_is_float(v->dtype) || v->rank != 0)
        return fail(in, "%s %s must be a float scalar, got %s", in->name, what, ts(v).s);
    return 0;
}

static int same_type(Infer *in, const Value *a, const Value *b, const char *what)
{
    if (a->dtype != b->dtype || a->rank != b->rank ||
        memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank) != 0)
        return fail(in, "%s %s must be %s, got %s", in->name, what, ts(a).s, ts(b).s);
    return 0;
}

/* lr, clip_scale: a scalar of a scalar. */
static int infer_scalar_fn(Infer *in)
{
    const Value *x = arg(in, 0);
    if (need_scalar(in, x, "operand") != 0 ||
        (in->op->kind == OP_LR && ir_op_attr(in->op, "lr") && attr_positive(in, "lr") != 0))
        return -1;
    return same_as(in, x);
}

/* sgd (p, g, mom, lr) and adamw (p, g, m, v, lr, step): state shaped as p. */
static int infer_optimizer(Infer *in)
{
    static const char *names[] = {"param", "gradient", "state", "state"};
    const Value *p = arg(in, 0);
    int nstate = in->op->kind == OP_ADAMW ? 4 : 3;
    if (need_float(in, p) != 0)
        return -1;
    for (int i = 1; i < nstate; i++)
        if (same_type(in, p, arg(in, i), names[i]) != 0)
            return -1;
    for (int i = nstate; i < in->op->nargs; i++)
        if (need_scalar(in, arg(in, i), i == nstate ? "lr" : "step") != 0)
            return -1;
    return same_as(in, p);
}

/* update target, value: the target is a param or state of the value's type. */
static int infer_update(Infer *in)
{
    const Value *t = arg(in, 0), *v = arg(in, 1);
    if (!t->def || (t->def->kind != OP_PARAM && t->def->kind != OP_STATE))
        return fail(in, "update target must be a param or state");
    if (same_type(in, t, v, "value") != 0)
        return -1;
    return same_as(in, t);
}

/* The gradient ops autodiff adds; no rule otherwise. */
static int infer_grad_rule(Infer *in)
{
    switch (in->op->kind) {
    case OP_GATHER_GRAD:
        return infer_gather_grad(in);
    case OP_GELU_GRAD:
    case OP_SILU_GRAD:
    case OP_RELU_GRAD:
    case OP_SOFTMAX_GRAD:
        return infer_pointwise_grad(in);
    case OP_MAX_GRAD:
        return infer_max_grad(in);
    case OP_LAYERNORM_GRAD:
    case OP_RMSNORM_GRAD:
        return infer_norm_grad(in);
    case OP_EMBED_GRAD:
        return infer_embed_grad(in);
    case OP_ATTENTION_GRAD:
        return infer_attention_grad(in);
    case OP_CROSS_ENTROPY_GRAD:
        return infer_cross_entropy_grad(in);
    default:
        return fail(in, "no shape rule for '%s'", in->name);
    }
}

/* The forward ops of layers and of layout: matmul, norms, reductions,
 * lookups, attention, reshapes; the gradients otherwise. */
static int infer_layer_rule(Infer *in)
{
    switch (in->op->kind) {
    case OP_MATMUL:
        return infer_matmul(in);
    case OP_SOFTMAX:
        return infer_softmax(in);
    case OP_LAYERNORM:
    case OP_RMSNORM:
        return infer_norm(in);
    case OP_SUM:
    case OP_MEAN:
    case OP_MAX:
    case OP_ARGMAX:
        return infer_reduce(in);
    case OP_EMBED:
        return infer_embed(in);
    case OP_GATHER:
        return infer_gather(in);
    case OP_TOPK:
        return infer_topk(in);
    case OP_DROPOUT:
        return infer_dropout(in);
    case OP_SCATTER_ADD:
        return infer_scatter_add(in);
    case OP_ROPE:
        return infer_rope(in);
    case OP_ATTENTION:
        return infer_attention(in);
    case OP_CROSS_ENTROPY:
        return infer_cross_entropy(in);
    case OP_RESHAPE:
        return infer_reshape(in);
    case OP_TRANSPOSE:
        return infer_transpose(in);
    case OP_SLICE:
        return infer_slice(in);
    case OP_CONCAT:
        return infer_concat(in);
    case OP_SUM_TO:
        return infer_sum_to(in);
    case OP_EXPAND:
        return infer_expand(in);
    case OP_PAD:
        return infer_pad(in);
    default:
        return infer_grad_rule(in);
    }
}

/* The elementwise ops: binary and comparisons, where, unary, arange, cast;
 * the layer ops otherwise. */
static int infer_pointwise_rule(Infer *in)
{
    switch (in->op->kind) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
    case OP_LT:
    case OP_LE:
    case OP_GT:
    case OP_GE:
    case OP_EQ:
    case OP_NE:
        return infer_broadcast(in); /* a comparison's 0 or 1 has its operands' dtype */
    case OP_WHERE:
        return infer_where(in);
    case OP_NEG:
    case OP_STOP_GRAD:
    case OP_MB_SUM:
        return infer_unary(in, 1);
    case OP_EXP:
    case OP_LOG:
    case OP_SQRT:
    case OP_RSQRT:
    case OP_TANH:
    case OP_SIGMOID:
    case OP_RELU:
    case OP_GELU:
    case OP_SILU:
    case OP_ERF:
    case OP_ABS:
    case OP_FLOOR:
        return infer_unary(in, 0);
    case OP_ARANGE:
        return infer_arange(in);
    case OP_CAST:
        return infer_cast(in);
    default:
        return infer_layer_rule(in);
    }
}

/* The rule of the op's family. First the ops of the training step and of
 * the partitioner (sources, optimizer, collectives), then the elementwise
 * ops, the layer ops and the gradients, each family passing on the rest. */
static int infer_rule(Infer *in)
{
    switch (in->op->kind) {
    case OP_INPUT:
    case OP_PARAM:
    case OP_CONSTANT:
    case OP_STEP:
    case OP_STATE:
        return infer_source(in);
    case OP_LR:
    case OP_CLIP_SCALE:
        return infer_scalar_fn(in);
    case OP_SGD:
    case OP_ADAMW:
        return infer_optimizer(in);
    case OP_UPDATE:
        return infer_update(in);
    case OP_AXIS_OFFSET:
        return set_result(in, DT_I32, 0, NULL);
    case OP_CROSS_ENTROPY_SHARD:
        return infer_cross_entropy(in);
    case OP_CROSS_ENTROPY_GRAD_SHARD:
        return same_as(in, arg(in, 0));
    case OP_ALL_REDUCE:
    case OP_ALL_GATHER:
    case OP_REDUCE_SCATTER:
    case OP_ALL_TO_ALL:
    case OP_SHARD_SLICE:
        return same_as(in, arg(in, 0)); /* the global value is unchanged */
    default:
        return infer_pointwise_rule(in);
    }
}

int ir_infer(const Op *op, DType *dt, int *rank, int64_t *shape, char *err, size_t errlen)
{
    Infer in = {.op = op, .err = err, .errlen = errlen};
    if (err && errlen)
        err[0] = '\0';
    if ((unsigned)op->kind >= OP_COUNT)
        return fail(&in, "unknown op kind %d", (int)op->kind);
    in.name = ir_ops[op->kind].name;
    if (check_arity(&in) != 0 || infer_rule(&in) != 0)
        return -1;
    if (numel(in.rank, in.shape) < 0)
        return fail(&in, "shape too large: %s", type_str(in.dt, in.rank, in.shape).s);
    *dt = in.dt;
    *rank = in.rank;
    if (in.rank > 0)
        memcpy(shape, in.shape, sizeof(int64_t) * (size_t)in.rank);
    return 0;
}

void ir_op_finish(Graph *g, Op *op, Attr **attrs, int nattrs, const char *who)
{
    for (int i = 0; i < nattrs; i++)
        ir_op_set_attr(g, op, attrs[i]);
    for (int i = 0; i < ir_ops[op->kind].nres; i++) {
        DType dt;
        int rank;
        int64_t shape[IR_MAX_RANK];
        char err[256];
        if (ir_infer_result(op, i, &dt, &rank, shape, err, sizeof err) != 0)
            BUG("%s made an invalid '%s': %s", who, ir_ops[op->kind].name, err);
        ir_op_result(g, op, dt, rank, shape);
    }
}

/* Results after the first mirror an operand: layernorm_grad gives dx, dg, db
 * shaped as x, g, g; rmsnorm_grad dx, dg; attention_grad dq, dk, dv; sgd p',
 * mom'; adamw p', m', v'. attention_grad's dk and dv of bf16 operands are f32:
 * the kernel adds every query row's share into them, which bf16 storage would
 * round at each addition. A fourth result of attention_grad, the gradient of
 * its bias, has the bias's shape (f32 for bf16, summed over the batch). */
int ir_infer_result(const Op *op, int i, DType *dt, int *rank, int64_t *shape, char *err,
                    size_t errlen)
{
    static const int8_t mirror[5][3] = {{0, 1, 1}, {0, 1, -1}, {0, 1, 2}, {0, 2, -1}, {0, 2, 3}};
    if (ir_infer(op, dt, rank, shape, err, errlen) != 0)
        return -1;
    if (i == 0)
        return 0;
    if (op->kind == OP_TOPK && i == 1) { /* the indices: the values' shape */
        *dt = DT_I32;
        return 0;
    }
    int row = op->kind == OP_LAYERNORM_GRAD ? 0 : op->kind == OP_RMSNORM_GRAD ? 1
              : op->kind == OP_ATTENTION_GRAD ? 2 : op->kind == OP_SGD ? 3 : op->kind == OP_ADAMW ? 4 : -1;
    int bias = row == 2 && i == 3 ? ir_attention_arg(op, 3) : -1; /* the bias's gradient */
    if (bias < 0 && (row < 0 || i < 0 || i >= 3 || mirror[row][i] < 0)) {
        Infer in = {.op = op, .name = ir_ops[op->kind].name, .err = err, .errlen = errlen};
        return fail(&in, "'%s' has no result %d", in.name, i);
    }
    const Value *v = op->args[bias >= 0 ? bias : mirror[row][i]];
    *dt = row == 2 && v->dtype == DT_BF16 ? DT_F32 : v->dtype;
    *rank = v->rank;
    memcpy(shape, v->shape, sizeof(int64_t) * (size_t)v->rank);
    return 0;
}
