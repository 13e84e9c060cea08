/* ir.c: the op table, name tables, and the builders for Graph, Value, Op, Attr
 * and Sharding. Everything is allocated in the graph's arena. */
#include "ir.h"

#include <string.h>

const OpInfo ir_ops[OP_COUNT] = {
#define OP(id, name, nargs, nres, doc) {name, nargs, nres, doc},
#include "ops.def"
#undef OP
};

int ir_op_arity_ok(const Op *op)
{
    int want = ir_ops[op->kind].nargs;
    if (want < 0)
        return op->nargs >= 1;
    if (op->kind == OP_DROPOUT) /* the axis offsets of its split dims */
        return op->nargs >= want && op->nargs < want + IR_MAX_RANK;
    return op->nargs == want || ((op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD) &&
                                 op->nargs > want && op->nargs <= want + 3); /* mask, bias, head offset */
}

int ir_op_nres_ok(const Op *op)
{
    return op->nres == ir_ops[op->kind].nres ||
           (op->kind == OP_ATTENTION_GRAD && op->nres == 4 && ir_attention_arg(op, 3) >= 0);
}

int ir_attention_arg(const Op *op, int rank)
{
    int nq = op->kind == OP_ATTENTION_GRAD ? 4 : 3;
    if (op->kind != OP_ATTENTION && op->kind != OP_ATTENTION_GRAD)
        return -1;
    for (int i = nq; i < op->nargs; i++)
        if (op->args[i]->rank == rank)
            return i;
    return -1;
}

static const char *dtype_names[DT_COUNT] = {"f32", "f64", "bf16", "f16", "i32"};
static const size_t dtype_sizes[DT_COUNT] = {4, 8, 2, 2, 4};
static const char *role_names[ROLE_COUNT] = {"data", "fsdp", "tensor", "sequence", "pipeline"};
static const char *why_names[WHY_COUNT] = {"none", "annotation", "role", "rule", "cost", "user"};
static const char *phase_names[PH_COUNT] = {"fwd", "bwd", "recompute", "opt"};

static int lookup(const char *const *names, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

const char *ir_dtype_name(DType t) { return (unsigned)t < DT_COUNT ? dtype_names[t] : "?"; }
int ir_dtype_lookup(const char *name) { return lookup(dtype_names, DT_COUNT, name); }
int ir_dtype_is_float(DType t) { return t != DT_I32; }
size_t ir_dtype_size(DType t) { return (unsigned)t < DT_COUNT ? dtype_sizes[t] : 0; }
const char *ir_role_name(AxisRole r) { return (unsigned)r < ROLE_COUNT ? role_names[r] : "?"; }
int ir_role_lookup(const char *name) { return lookup(role_names, ROLE_COUNT, name); }
const char *ir_why_name(WhyKind k) { return (unsigned)k < WHY_COUNT ? why_names[k] : "?"; }
int ir_why_lookup(const char *name) { return lookup(why_names, WHY_COUNT, name); }
const char *ir_phase_name(Phase p) { return (unsigned)p < PH_COUNT ? phase_names[p] : "?"; }
int ir_phase_lookup(const char *name) { return lookup(phase_names, PH_COUNT, name); }

int ir_op_lookup(const char *name)
{
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(ir_ops[i].name, name) == 0)
            return i;
    return -1;
}

Graph *ir_graph_new(Arena *a, Interner *strings, const char *name)
{
    Graph *g = arena_alloc(a, sizeof(Graph));
    g->arena = a;
    g->strings = strings;
    g->name = name ? intern(strings, name) : NULL;
    return g;
}

Value *ir_value_new(Graph *g, DType t, int rank, const int64_t *shape)
{
    if (rank < 0 || rank > IR_MAX_RANK)
        BUG("rank %d out of range", rank);
    Value *v = arena_alloc(g->arena, sizeof(Value));
    v->id = g->values.len;
    v->dtype = t;
    v->rank = rank;
    if (rank)
        memcpy(v->shape, shape, sizeof(int64_t) * (size_t)rank);
    VEC_PUSH(g->arena, g->values, v);
    return v;
}

Op *ir_op_new(Graph *g, OpKind kind, Value **args, int nargs, Loc loc)
{
    Op *op = arena_alloc(g->arena, sizeof(Op));
    op->id = g->ops.len;
    op->kind = kind;
    op->nargs = nargs;
    if (nargs) {
        op->args = arena_alloc(g->arena, sizeof(Value *) * (size_t)nargs);
        memcpy(op->args, args, sizeof(Value *) * (size_t)nargs);
    }
    op->loc = loc;
    op->layer = -1;
    op->phase = PH_FWD;
    op->mb = -1;
    VEC_PUSH(g->arena, g->ops, op);
    return op;
}

int ir_pipeline_stages(const Mesh *m)
{
    int p = 1;
    for (int i = 0; i < m->naxes; i++)
        if (m->axes[i].role == ROLE_PIPELINE)
            p *= m->axes[i].size;
    return p;
}

double ir_numel(const Value *v)
{
    double n = 1;
    for (int d = 0; d < v->rank; d++)
        n *= (double)v->shape[d];
    return n;
}

double ir_op_flops(const Op *op)
{
    if (!op->nres)
        return 0;
    const Value *r = op->res[0];
    if (op->kind == OP_MATMUL) {
        const Value *a = op->args[0];
        return 2 * ir_numel(r) * (double)a->shape[a->rank - 1];
    }
    if (op->kind == OP_ATTENTION) { /* 2 B S Sk (H Dh + H Dv): Sk = S but in cross-attention */
        const Value *q = op->args[0];
        return 2 * (ir_numel(q) + ir_numel(r)) * (double)op->args[1]->shape[1];
    }
    if (op->kind == OP_CROSS_ENTROPY || op->kind == OP_EMBED)
        return 4 * ir_numel(op->args[0]);
    return ir_numel(r);
}

int ir_attr_equal(const Attr *a, const Attr *b)
{
    if (a == b)
        return 1;
    if (a->kind != b->kind || a->i != b->i || a->nitems != b->nitems ||
        memcmp(&a->f, &b->f, sizeof a->f) || (!a->key != !b->key) ||
        (a->key && strcmp(a->key, b->key)) || (!a->s != !b->s) || (a->s && strcmp(a->s, b->s)))
        return 0;
    for (int i = 0; i < a->nitems; i++)
        if (!ir_attr_equal(a->items[i], b->items[i]))
            return 0;
    return 1;
}

/* Forward op f is what recompute op r copies, given the twins of r's operands. */
static int same_op(const Op *f, const Op *r, const Value **twin)
{
    if (f->phase != PH_FWD || f->kind != r->kind || f->layer != r->layer || f->mb != r->mb ||
        f->loc.line != r->loc.line || f->loc.col != r->loc.col || f->nargs != r->nargs ||
        f->nres != r->nres || f->nattrs != r->nattrs)
        return 0;
    for (int i = 0; i < f->nargs; i++)
        if (f->args[i] != r->args[i] && f->args[i] != twin[r->args[i]->id])
            return 0;
    for (int i = 0; i < f->nattrs; i++)
        if (!ir_attr_equal(f->attrs[i], r->attrs[i]))
            return 0;
    return 1;
}

const Value **ir_recompute_twins(const Graph *g, Arena *a)
{
    int nv = g->values.len;
    const Value **twin = arena_alloc(a, sizeof(Value *) * (size_t)(nv + 1));
    int *first = arena_alloc(a, sizeof(int) * (size_t)(nv + 2)); /* readers, by value: CSR */
    memset(twin, 0, sizeof(Value *) * (size_t)(nv + 1));
    memset(first, 0, sizeof(int) * (size_t)(nv + 2));
    int nargs = 0;
    for (int i = 0; i < g->ops.len; i++)
        for (int j = 0; j < g->ops.data[i]->nargs; j++)
            first[g->ops.data[i]->args[j]->id + 1]++, nargs++;
    for (int v = 0; v < nv; v++)
        first[v + 1] += first[v];
    const Op **reader = arena_alloc(a, sizeof(Op *) * (size_t)(nargs + 1));
    int *fill = arena_alloc(a, sizeof(int) * (size_t)(nv + 1));
    memcpy(fill, first, sizeof(int) * (size_t)nv);
    for (int i = 0; i < g->ops.len; i++)
        for (int j = 0; j < g->ops.data[i]->nargs; j++)
            reader[fill[g->ops.data[i]->args[j]->id]++] = g->ops.data[i];
    for (int i = 0; i < g->ops.len; i++) {
        const Op *r = g->ops.data[i];
        if (r->phase != PH_RECOMPUTE || !r->nargs)
            continue;
        const Value *in = twin[r->args[0]->id] ? twin[r->args[0]->id] : r->args[0];
        for (int k = first[in->id]; k < first[in->id + 1]; k++)
            if (same_op(reader[k], r, twin)) {
                for (int j = 0; j < r->nres; j++)
                    twin[r->res[j]->id] = reader[k]->res[j];
                break;
            }
    }
    return twin;
}

void ir_op_place_like(Op *dst, const Op *site)
{
    dst->layer = site->layer;
    dst->phase = site->phase;
    dst->stage = site->stage;
    dst->mb = -1;
    dst->tick = 0;
    for (int i = 0; i < dst->nargs; i++)
        if (dst->args[i]->def && dst->args[i]->def->tick > dst->tick)
            dst->tick = dst->args[i]->def->tick;
}

Value *ir_op_result(Graph *g, Op *op, DType t, int rank, const int64_t *shape)
{
    Value *v = ir_value_new(g, t, rank, shape);
    v->def = op;
    v->loc = op->loc;
    Value **res = arena_alloc(g->arena, sizeof(Value *) * (size_t)(op->nres + 1));
    if (op->nres)
        memcpy(res, op->res, sizeof(Value *) * (size_t)op->nres);
    res[op->nres++] = v;
    op->res = res;
    return v;
}

void ir_op_set_attr(Graph *g, Op *op, Attr *a)
{
    for (int i = 0; i < op->nattrs; i++) {
        if (strcmp(op->attrs[i]->key, a->key) == 0) {
            op->attrs[i] = a;
            return;
        }
    }
    Attr **na = arena_alloc(g->arena, sizeof(Attr *) * (size_t)(op->nattrs + 1));
    if (op->nattrs)
        memcpy(na, op->attrs, sizeof(Attr *) * (size_t)op->nattrs);
    na[op->nattrs++] = a;
    op->attrs = na;
}

const Attr *ir_op_attr(const Op *op, const char *key)
{
    for (int i = 0; i < op->nattrs; i++)
        if (op->attrs[i]->key && strcmp(op->attrs[i]->key, key) == 0)
            return op->attrs[i];
    return NULL;
}

int64_t ir_op_attr_int(const Op *op, const char *key, int64_t dflt)
{
    const Attr *a = ir_op_attr(op, key);
    return a && (a->kind == ATTR_INT || a->kind == ATTR_BOOL) ? a->i : dflt;
}

void ir_transpose_perm(const Op *op, int64_t perm[IR_MAX_RANK])
{
    const Attr *a = ir_op_attr(op, "perm");
    int rank = op->args[0]->rank;
    for (int d = 0; d < rank; d++)
        perm[d] = a && d < a->nitems ? a->items[d]->i : d;
    if (!a && rank >= 2) {
        perm[rank - 2] = rank - 1;
        perm[rank - 1] = rank - 2;
    }
}

double ir_op_attr_float(const Op *op, const char *key, double dflt)
{
    const Attr *a = ir_op_attr(op, key);
    if (!a)
        return dflt;
    if (a->kind == ATTR_FLOAT)
        return a->f;
    if (a->kind == ATTR_INT)
        return (double)a->i;
    return dflt;
}

static Attr *attr_new(Arena *a, const char *key, AttrKind kind)
{
    Attr *at = arena_alloc(a, sizeof(Attr));
    at->key = key ? arena_strdup(a, key) : NULL;
    at->kind = kind;
    return at;
}

Attr *ir_attr_int(Arena *a, const char *key, int64_t v)
{
    Attr *at = attr_new(a, key, ATTR_INT);
    at->i = v;
    return at;
}

Attr *ir_attr_float(Arena *a, const char *key, double v)
{
    Attr *at = attr_new(a, key, ATTR_FLOAT);
    at->f = v;
    return at;
}

Attr *ir_attr_bool(Arena *a, const char *key, int v)
{
    Attr *at = attr_new(a, key, ATTR_BOOL);
    at->i = v != 0;
    return at;
}

Attr *ir_attr_str(Arena *a, const char *key, const char *s)
{
    Attr *at = attr_new(a, key, ATTR_STR);
    at->s = arena_strdup(a, s);
    return at;
}

static void attr_set_items(Arena *a, Attr *at, Attr **items, int n)
{
    at->nitems = n;
    if (n) {
        at->items = arena_alloc(a, sizeof(Attr *) * (size_t)n);
        memcpy(at->items, items, sizeof(Attr *) * (size_t)n);
    }
}

Attr *ir_attr_list(Arena *a, const char *key, Attr **items, int n)
{
    Attr *at = attr_new(a, key, ATTR_LIST);
    attr_set_items(a, at, items, n);
    return at;
}

Attr *ir_attr_call(Arena *a, const char *key, const char *fn, Attr **items, int n)
{
    Attr *at = attr_new(a, key, ATTR_CALL);
    at->s = arena_strdup(a, fn);
    attr_set_items(a, at, items, n);
    return at;
}

Attr *ir_attr_ints(Arena *a, const char *key, const int64_t *v, int n)
{
    Attr *at = attr_new(a, key, ATTR_LIST);
    at->nitems = n;
    at->items = n ? arena_alloc(a, sizeof(Attr *) * (size_t)n) : NULL;
    for (int i = 0; i < n; i++)
        at->items[i] = ir_attr_int(a, NULL, v[i]);
    return at;
}

int ir_mesh_axis(const Mesh *m, const char *name)
{
    for (int i = 0; i < m->naxes; i++)
        if (strcmp(m->axes[i].name, name) == 0)
            return i;
    return -1;
}

int64_t ir_mesh_size(const Mesh *m)
{
    int64_t n = 1;
    for (int i = 0; i < m->naxes; i++)
        n *= m->axes[i].size;
    return n;
}

int64_t ir_axes_size(const Mesh *m, const int8_t *axes, int n)
{
    int64_t s = 1;
    for (int i = 0; i < n; i++)
        s *= m->axes[axes[i]].size;
    return s;
}

int64_t ir_shard_factor(const Mesh *m, const Sharding *s, int dim)
{
    int64_t f = 1;
    for (int i = 0; i < s->naxes[dim]; i++) {
        int ax = s->axes[dim][i];
        if (ax >= 0 && ax < m->naxes)
            f *= m->axes[ax].size;
    }
    return f;
}

int ir_shard_is_replicated(const Sharding *s, int rank)
{
    for (int d = 0; d < rank; d++)
        if (s->naxes[d])
            return 0;
    return s->partial == 0;
}

void ir_shard_add(Sharding *s, int dim, int axis)
{
    if (dim < 0 || dim >= IR_MAX_RANK || s->naxes[dim] >= IR_MAX_AXES)
        BUG("sharding slot out of range");
    s->axes[dim][s->naxes[dim]++] = (int8_t)axis;
}

const char *ir_type_str(char *buf, size_t n, DType t, int rank, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "%s[", ir_dtype_name(t));
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

int ir_scalar_value(const Value *v, double *out)
{
    const Op *d = v->def;
    double a, b = 0;
    if (!d || v->rank != 0 || (v->dtype != DT_F32 && v->dtype != DT_F64) || d->nres != 1)
        return 0;
    switch (d->kind) {
    case OP_CONSTANT: a = ir_op_attr_float(d, "value", 0); break;
    case OP_NEG:
        if (!ir_scalar_value(d->args[0], &a))
            return 0;
        a = -a;
        break;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV:
        if (d->nargs != 2 || !ir_scalar_value(d->args[0], &a) || !ir_scalar_value(d->args[1], &b))
            return 0;
        /* in double, then rounded once to f32: the f32 result itself (53 >= 2 * 24 + 2) */
        a = d->kind == OP_ADD ? a + b : d->kind == OP_SUB ? a - b : d->kind == OP_MUL ? a * b : a / b;
        break;
    default: return 0;
    }
    *out = v->dtype == DT_F32 ? (double)(float)a : a;
    return 1;
}
