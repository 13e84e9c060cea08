/* lower.c: checks a TDL Ast and lowers it to the forward Graph in one walk.
 * Reads the Ast, the -D defines and the --mesh text; writes Values and Ops.
 * Key idea: expressions are evaluated, not translated. Integer expressions
 * (shapes, counts) fold to numbers; tensor expressions emit ops whose shapes
 * come from ir_infer, the one table of shape rules. Blocks are expanded at
 * each call and repeats unrolled, so the Graph has no control flow. An error
 * yields an error value that silences follow-on errors, and the walk goes on. */
#include "ast.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_REPEAT = 100000, MAX_OPS = 100000, MAX_CALL_DEPTH = 64 };
#define MAX_DIM (INT64_C(1) << 40)

typedef enum { V_ERR, V_INT, V_FLOAT, V_BOOL, V_STR, V_TENSOR, V_LIST } VKind;

typedef struct Val {
    VKind k;
    int64_t i;
    double f;
    const char *s;
    Value *t;
    struct Val *items;
    int n;
} Val;

typedef enum { B_VALUE, B_MODEL, B_PARAM, B_INPUT, B_INDEX } BindKind;

typedef struct Binding {
    const char *name;
    BindKind kind;
    Val val;
    Loc loc;
} Binding;

typedef struct Scope {
    struct Scope *parent;
    VEC(Binding) b;
    int boundary; /* assignments do not look past a boundary scope */
} Scope;

typedef struct Lower {
    Ctx *c;
    Graph *g;
    Ast *ast;
    Scope *root;      /* model parameters */
    Scope *scope;
    int64_t unrolled;   /* repeat bodies lowered so far, nested ones included */
    const char *prefix; /* parameter name prefix, "" or "h.3." */
    int layer;          /* of the ops being lowered: -1 outside repeats, or LAYER_NEXT */
    int next_layer;     /* the number the next layer takes: layers go in program order */
    int depth;        /* block call depth */
    int too_big;
    int dropouts; /* dropout calls lowered so far: each its own random stream */
    Loc model_loc;
    VEC(Stmt *) blocks;
    VEC(const char *) param_names; /* every parameter's full name */
    VEC(Loc) param_locs;
} Lower;

/* A region of a repeat copy (the copy's start, or its rest after a nested
 * repeat) is a new layer, numbered when it makes its first op: layers are in
 * program order (the pipeline cuts them in that order), and a region with no
 * op (an outer copy that only holds the inner repeat) takes no number. */
enum { LAYER_NEXT = -2 };

static int op_layer(Lower *L)
{
    if (L->layer == LAYER_NEXT)
        L->layer = L->next_layer++;
    return L->layer;
}

static const Val ERRV = {V_ERR, 0, 0, NULL, NULL, NULL, 0};

static void err(Lower *L, Loc loc, const char *fmt, ...) PRINTF_LIKE(3, 4);
static void err(Lower *L, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(&L->c->diag, SEV_ERROR, loc, 1, fmt, ap);
    va_end(ap);
}

static void note(Lower *L, Loc loc, const char *fmt, ...) PRINTF_LIKE(3, 4);
static void note(Lower *L, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(&L->c->diag, SEV_NOTE, loc, 1, fmt, ap);
    va_end(ap);
}

static const char *type_str(Lower *L, const Value *v)
{
    char buf[160];
    ir_type_str(buf, sizeof buf, v->dtype, v->rank, v->shape);
    return arena_strdup(L->c->arena, buf);
}

/* ---- scopes ---- */

static Scope *scope_new(Lower *L, Scope *parent, int boundary)
{
    Scope *s = arena_alloc(L->c->arena, sizeof(Scope));
    s->parent = parent;
    s->boundary = boundary;
    return s;
}

static Binding *scope_find_local(Scope *s, const char *name)
{
    for (int i = 0; i < s->b.len; i++)
        if (s->b.data[i].name == name)
            return &s->b.data[i];
    return NULL;
}

static Binding *lookup(Lower *L, const char *name)
{
    for (Scope *s = L->scope; s; s = s->parent) {
        Binding *b = scope_find_local(s, name);
        if (b)
            return b;
    }
    return NULL;
}

/* A digit-led token (`3D`, `1f1b`) is a name only as a training setting's
 * value: declared, it would make a graph whose IR does not read back. */
static int digit_led(Lower *L, const char *name, Loc loc)
{
    if (!name || name[0] < '0' || name[0] > '9')
        return 0;
    err(L, loc, "'%s' is not a name: a name starts with a letter or '_'", name);
    return 1;
}

static void bind(Lower *L, Scope *s, const char *name, BindKind kind, Val v, Loc loc)
{
    digit_led(L, name, loc);
    Binding b = {name, kind, v, loc};
    VEC_PUSH(L->c->arena, s->b, b);
}

/* ---- values ---- */

static Val vint(int64_t i) { return (Val){V_INT, i, 0, NULL, NULL, NULL, 0}; }
static Val vfloat(double f) { return (Val){V_FLOAT, 0, f, NULL, NULL, NULL, 0}; }
static Val vtensor(Value *t) { return t ? (Val){V_TENSOR, 0, 0, NULL, t, NULL, 0} : ERRV; }
static int is_num(Val v) { return v.k == V_INT || v.k == V_FLOAT; }
static double num(Val v) { return v.k == V_INT ? (double)v.i : v.f; }

/* The kind of a value with its article: "an integer", "a tensor". */
static const char *kind_name(VKind k)
{
    static const char *names[] = {"an error", "an integer", "a number", "a flag",
                                  "a string",  "a tensor",   "a list"};
    return names[k];
}

/* ---- emitting ops ---- */

static void shape_notes(Lower *L, Value **args, int n)
{
    for (int i = 0; i < n; i++) {
        Value *v = args[i];
        if (v->name)
            note(L, v->loc, "'%s' is %s", v->name, type_str(L, v));
        else
            note(L, v->loc, "operand %d is %s, computed here", i + 1, type_str(L, v));
    }
}

/* Append op kind(args) with attrs and infer its result. On a shape or dtype
 * error, report it at loc with a note per operand and return NULL. */
static Value *emit(Lower *L, OpKind kind, Value **args, int n, Attr **attrs, int nattrs, Loc loc)
{
    if (L->g->ops.len >= MAX_OPS) {
        if (!L->too_big++)
            err(L, loc, "the model has more than %d ops", MAX_OPS);
        return NULL;
    }
    Op *op = ir_op_new(L->g, kind, args, n, loc);
    op->layer = op_layer(L);
    for (int i = 0; i < nattrs; i++)
        ir_op_set_attr(L->g, op, attrs[i]);
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    char msg[256];
    if (ir_infer(op, &dt, &rank, shape, msg, sizeof msg) != 0) {
        L->g->ops.len--;
        err(L, loc, "in '%s': %s", ir_ops[kind].name, msg);
        shape_notes(L, args, n);
        return NULL;
    }
    Value *v = ir_op_result(L->g, op, dt, rank, shape);
    for (int i = 1; i < ir_ops[kind].nres; i++) /* topk's indices */
        if (ir_infer_result(op, i, &dt, &rank, shape, msg, sizeof msg) == 0)
            ir_op_result(L->g, op, dt, rank, shape);
        else
            BUG("'%s' has no result %d: %s", ir_ops[kind].name, i, msg);
    return v;
}

static Value *emit_constant(Lower *L, double x, DType dt, Loc loc)
{
    Attr *a = ir_attr_float(L->c->arena, "value", x);
    if (L->g->ops.len >= MAX_OPS)
        return emit(L, OP_CONSTANT, NULL, 0, NULL, 0, loc);
    Op *op = ir_op_new(L->g, OP_CONSTANT, NULL, 0, loc);
    op->layer = op_layer(L);
    ir_op_set_attr(L->g, op, a);
    return ir_op_result(L->g, op, dt, 0, NULL);
}

/* ---- expressions ---- */

static Val eval(Lower *L, Expr *e);

static Val eval_int_bin(Lower *L, int op, int64_t a, int64_t b, Loc loc)
{
    int64_t r = 0;
    switch (op) {
    case '+':
        if (__builtin_add_overflow(a, b, &r))
            goto overflow;
        return vint(r);
    case '-':
        if (__builtin_sub_overflow(a, b, &r))
            goto overflow;
        return vint(r);
    case '*':
        if (__builtin_mul_overflow(a, b, &r))
            goto overflow;
        return vint(r);
    case '/':
    case '%':
        if (b == 0) {
            err(L, loc, "division by zero");
            return ERRV;
        }
        if (a == INT64_MIN && b == -1)
            goto overflow;
        if (op == '%')
            return vint(a % b);
        return a % b == 0 ? vint(a / b) : vfloat((double)a / (double)b);
    }
    UNREACHABLE();
overflow:
    err(L, loc, "integer overflow in '%c'", op);
    return ERRV;
}

/* The spelling of a binary operator, for messages. */
static const char *op_text(int op)
{
    switch (op) {
    case '+': return "+";
    case '-': return "-";
    case '*': return "*";
    case '/': return "/";
    case '%': return "%";
    case '@': return "@";
    case '<': return "<";
    case '>': return ">";
    case OPC_LE: return "<=";
    case OPC_GE: return ">=";
    case OPC_EQ: return "==";
    default: return "!=";
    }
}

static int is_compare(int op)
{
    return op == '<' || op == '>' || op == OPC_LE || op == OPC_GE || op == OPC_EQ || op == OPC_NE;
}

/* A comparison of two numbers is a flag (two integers compare exactly; a NaN
 * is unequal to everything). */
static Val compare_nums(int op, Val a, Val b)
{
    double x = num(a), y = num(b);
    int c = a.k == V_INT && b.k == V_INT ? (a.i > b.i) - (a.i < b.i) : (x > y) - (x < y);
    int r = x != x || y != y ? op == OPC_NE
            : op == '<'      ? c < 0
            : op == '>'      ? c > 0
            : op == OPC_LE   ? c <= 0
            : op == OPC_GE   ? c >= 0
            : op == OPC_EQ   ? c == 0
                             : c != 0;
    return (Val){V_BOOL, r, 0, NULL, NULL, NULL, 0};
}

static Val eval_num_bin(Lower *L, int op, Val a, Val b, Loc loc)
{
    if (is_compare(op))
        return compare_nums(op, a, b);
    if (a.k == V_INT && b.k == V_INT && op != '@')
        return eval_int_bin(L, op, a.i, b.i, loc);
    double x = num(a), y = num(b);
    switch (op) {
    case '+': return vfloat(x + y);
    case '-': return vfloat(x - y);
    case '*': return vfloat(x * y);
    case '/':
        if (y == 0) {
            err(L, loc, "division by zero");
            return ERRV;
        }
        return vfloat(x / y);
    case '%': err(L, loc, "'%%' needs integers"); return ERRV;
    case '@': err(L, loc, "'@' (matrix product) needs two tensors"); return ERRV;
    }
    UNREACHABLE();
}

static OpKind bin_op(int op)
{
    switch (op) {
    case '+': return OP_ADD;
    case '-': return OP_SUB;
    case '*': return OP_MUL;
    case '/': return OP_DIV;
    case '@': return OP_MATMUL;
    case '<': return OP_LT;
    case '>': return OP_GT;
    case OPC_LE: return OP_LE;
    case OPC_GE: return OP_GE;
    case OPC_EQ: return OP_EQ;
    case OPC_NE: return OP_NE;
    }
    return OP_COUNT;
}

/* A number next to a tensor becomes a scalar constant of the tensor's dtype. */
static Value *as_tensor(Lower *L, Val v, DType dt, Loc loc)
{
    if (v.k == V_TENSOR)
        return v.t;
    return emit_constant(L, num(v), dt, loc);
}

static Val eval_bin(Lower *L, Expr *e)
{
    Val a = eval(L, e->lhs), b = eval(L, e->rhs);
    if (a.k == V_ERR || b.k == V_ERR)
        return ERRV;
    if (is_num(a) && is_num(b))
        return eval_num_bin(L, e->op, a, b, e->loc);
    int ok = (a.k == V_TENSOR || is_num(a)) && (b.k == V_TENSOR || is_num(b));
    OpKind k = bin_op(e->op);
    if (!ok || k == OP_COUNT || (k == OP_MATMUL && (a.k != V_TENSOR || b.k != V_TENSOR))) {
        err(L, e->loc, "operator '%s' cannot take %s and %s", op_text(e->op), kind_name(a.k),
            kind_name(b.k));
        return ERRV;
    }
    DType dt = a.k == V_TENSOR ? a.t->dtype : b.t->dtype;
    if (!ir_dtype_is_float(dt) && (is_num(a) || is_num(b))) {
        err(L, e->loc, "operator '%s' cannot mix a number with an %s tensor", op_text(e->op),
            ir_dtype_name(dt));
        return ERRV;
    }
    Value *args[2] = {as_tensor(L, a, dt, e->loc), as_tensor(L, b, dt, e->loc)};
    if (!args[0] || !args[1])
        return ERRV;
    return vtensor(emit(L, k, args, 2, NULL, 0, e->loc));
}

static Val eval_neg(Lower *L, Expr *e)
{
    Val a = eval(L, e->lhs);
    switch (a.k) {
    case V_ERR: return ERRV;
    case V_INT:
        if (a.i == INT64_MIN) {
            err(L, e->loc, "integer overflow in '-'");
            return ERRV;
        }
        return vint(-a.i);
    case V_FLOAT: return vfloat(-a.f);
    case V_TENSOR: return vtensor(emit(L, OP_NEG, &a.t, 1, NULL, 0, e->loc));
    default: err(L, e->loc, "cannot negate %s", kind_name(a.k)); return ERRV;
    }
}

static Val eval_name(Lower *L, Expr *e)
{
    Binding *b = lookup(L, e->name);
    if (b)
        return b->val;
    if (strcmp(e->name, "true") == 0 || strcmp(e->name, "false") == 0)
        return (Val){V_BOOL, e->name[0] == 't', 0, NULL, NULL, NULL, 0};
    if (e->name[0] >= '0' && e->name[0] <= '9')
        err(L, e->loc, "'%s' is not a number or a name; write a product with '*' (e.g. 3*D)",
            e->name);
    else
        err(L, e->loc, "use of undefined name '%s'", e->name);
    return ERRV;
}

static Val eval_list(Lower *L, Expr *e)
{
    Val v = {V_LIST, 0, 0, NULL, NULL, NULL, e->args.len};
    v.items = arena_alloc(L->c->arena, sizeof(Val) * (size_t)(e->args.len + 1));
    for (int i = 0; i < e->args.len; i++) {
        v.items[i] = eval(L, e->args.data[i]);
        if (v.items[i].k == V_ERR)
            return ERRV;
    }
    return v;
}

/* ---- calls: tensor ops, numeric functions, blocks ---- */

typedef enum { K_INT, K_FLOAT, K_BOOL, K_INTS, K_DTYPE, K_TENSOR } KwKind; /* K_TENSOR: an extra
                                                                       operand, after the others */

typedef struct KwSpec {
    const char *name;
    KwKind kind;
} KwSpec;

enum { OP_MAX_KW = 8 };

typedef struct OpSpec {
    const char *name;
    OpKind op;
    int min_t, max_t; /* leading tensor operands */
    KwSpec kw[OP_MAX_KW]; /* further positional arguments fill these in order */
} OpSpec;

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
    {"dropout", OP_DROPOUT, 1, 1, {{"p", K_FLOAT}}}, /* call_dropout */
    {"rope", OP_ROPE, 1, 1, {{"heads", K_INT}, {"theta", K_FLOAT}, {"rotate_half", K_BOOL}}},
    {"attention", OP_ATTENTION, 1, 3,
     {{"heads", K_INT}, {"kv_heads", K_INT}, {"causal", K_BOOL}, {"window", K_INT}, {"mask", K_TENSOR},
      {"alibi", K_BOOL}, {"scale", K_FLOAT}}},
    {"cross_entropy", OP_CROSS_ENTROPY, 2, 2, {{0}}},
    {"reshape", OP_RESHAPE, 1, 1, {{"shape", K_INTS}}},
    {"expand", OP_EXPAND, 1, 1, {{"shape", K_INTS}}},
    {"transpose", OP_TRANSPOSE, 1, 1, {{"perm", K_INTS}}},
    {"slice", OP_SLICE, 1, 1, {{"start", K_INT}, {"end", K_INT}, {"dim", K_INT}}},
    {"concat", OP_CONCAT, 1, 64, {{"dim", K_INT}}},
    {"cast", OP_CAST, 1, 1, {{"dtype", K_DTYPE}}},
};

static const OpSpec *find_spec(const char *name)
{
    for (size_t i = 0; i < sizeof op_specs / sizeof op_specs[0]; i++)
        if (strcmp(op_specs[i].name, name) == 0)
            return &op_specs[i];
    return NULL;
}

static const KwSpec *find_kw(const OpSpec *s, const char *name)
{
    for (int i = 0; i < OP_MAX_KW && s->kw[i].name; i++)
        if (strcmp(s->kw[i].name, name) == 0)
            return &s->kw[i];
    return NULL;
}

static void kw_names(const OpSpec *s, char *buf, size_t n)
{
    buf[0] = 0;
    for (int i = 0; i < OP_MAX_KW && s->kw[i].name; i++) {
        size_t k = strlen(buf);
        snprintf(buf + k, n - k, "%s'%s'", i ? ", " : "", s->kw[i].name);
    }
}

/* Convert one keyword argument to an Attr of the kind the op expects. */
static Attr *kw_attr(Lower *L, const OpSpec *s, const KwSpec *kw, Expr *e)
{
    Arena *a = L->c->arena;
    if (kw->kind == K_DTYPE && e->kind == E_NAME && ir_dtype_lookup(e->name) >= 0)
        return ir_attr_str(a, kw->name, e->name);
    if (kw->kind == K_DTYPE && e->kind == E_NAME && !lookup(L, e->name)) {
        err(L, e->loc, "unknown dtype '%s'", e->name);
        note(L, LOC_NONE, "the dtypes are f32, f64, bf16, f16 and i32");
        return NULL;
    }
    Val v = eval(L, e);
    if (v.k == V_ERR)
        return NULL;
    switch (kw->kind) {
    case K_INT:
        if (v.k == V_INT)
            return ir_attr_int(a, kw->name, v.i);
        break;
    case K_FLOAT:
        if (is_num(v))
            return ir_attr_float(a, kw->name, num(v));
        break;
    case K_BOOL:
        if (v.k == V_BOOL)
            return ir_attr_bool(a, kw->name, (int)v.i);
        break;
    case K_INTS: {
        if (v.k != V_LIST)
            break;
        int64_t xs[IR_MAX_RANK];
        if (v.n > IR_MAX_RANK) {
            err(L, e->loc, "'%s' of '%s' has more than %d entries", kw->name, s->name,
                IR_MAX_RANK);
            return NULL;
        }
        for (int i = 0; i < v.n; i++) {
            if (v.items[i].k != V_INT)
                goto bad;
            xs[i] = v.items[i].i;
        }
        return ir_attr_ints(a, kw->name, xs, v.n);
    }
    case K_DTYPE:
    case K_TENSOR: break;
    }
bad:;
    static const char *want[] = {"an integer", "a number", "true or false", "a list of integers",
                                 "a dtype"};
    err(L, e->loc, "'%s' of '%s' must be %s, got %s", kw->name, s->name, want[kw->kind],
        kind_name(v.k));
    return NULL;
}

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
    Value *part = emit(L, OP_SLICE, &view, 1, sa, 3, loc);
    if (!part)
        return NULL;
    int64_t shape[IR_MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = width;
    Attr *ra = ir_attr_ints(a, "shape", shape, x->rank);
    return emit(L, OP_RESHAPE, &part, 1, &ra, 1, loc);
}

static int split_qkv(Lower *L, Value **t, Attr **attrs, int nattrs, Loc loc)
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
        err(L, loc, "in 'attention': the fused operand %s does not split into q, k, v for "
            "%lld heads and %lld kv heads", type_str(L, x), (long long)heads, (long long)kv);
        return -1;
    }
    int64_t dh = c / (heads + 2 * kv), g = heads / kv, w = (g + 2) * dh;
    int64_t shape[IR_MAX_RANK + 1];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = kv;
    shape[x->rank] = w;
    Attr *ra = ir_attr_ints(L->c->arena, "shape", shape, x->rank + 1);
    Value *view = x->rank < IR_MAX_RANK ? emit(L, OP_RESHAPE, &x, 1, &ra, 1, loc) : NULL;
    if (!view)
        return -1;
    t[0] = qkv_part(L, view, 0, g * dh, heads * dh, x, loc);
    t[1] = t[0] ? qkv_part(L, view, g * dh, (g + 1) * dh, kv * dh, x, loc) : NULL;
    t[2] = t[1] ? qkv_part(L, view, (g + 1) * dh, w, kv * dh, x, loc) : NULL;
    return t[2] ? 0 : -1;
}

/* scatter(x[...,V], index i32[...,k], src[...,k]): x with src added at the
 * indices along the last dim, as x + scatter_add(index, src) {size = V}. */
static Val call_scatter(Lower *L, Value **t, Loc loc)
{
    Value *x = t[0], *ix = t[1];
    if (x->rank < 1 || ix->rank != x->rank ||
        memcmp(x->shape, ix->shape, sizeof(int64_t) * (size_t)(x->rank - 1)) != 0) {
        char xs[128], is[128];
        ir_type_str(xs, sizeof xs, x->dtype, x->rank, x->shape);
        ir_type_str(is, sizeof is, ix->dtype, ix->rank, ix->shape);
        err(L, loc, "in 'scatter': index %s must have x's rank and leading dimensions (x is %s)", is, xs);
        return ERRV;
    }
    Attr *size = ir_attr_int(L->c->arena, "size", x->shape[x->rank - 1]);
    Value *add = emit(L, OP_SCATTER_ADD, t + 1, 2, &size, 1, loc);
    return add ? vtensor(emit(L, OP_ADD, (Value *[]){x, add}, 2, NULL, 0, loc)) : ERRV;
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
static Val call_dropout(Lower *L, Value *x, Attr **attrs, int na, Loc loc)
{
    if (!ir_op_attr(&(Op){.attrs = attrs, .nattrs = na}, "p")) {
        err(L, loc, "'dropout' needs 'p', the probability of zeroing an element");
        return ERRV;
    }
    double p = ir_op_attr_float(&(Op){.attrs = attrs, .nattrs = na}, "p", 0);
    if (!(p >= 0 && p < 1)) {
        err(L, loc, "in 'dropout': 'p' must be in [0, 1), got %g", p);
        return ERRV;
    }
    if (x->rank < 1 || !ir_dtype_is_float(x->dtype)) {
        char xs[128];
        ir_type_str(xs, sizeof xs, x->dtype, x->rank, x->shape);
        err(L, loc, "in 'dropout': x must be a float tensor of rank >= 1, got %s", xs);
        return ERRV;
    }
    if (p == 0)
        return vtensor(x);
    Value *keys = dropout_source(L, OP_INPUT, x->shape[0], loc);
    Value *step = dropout_source(L, OP_STEP, 0, loc);
    attrs[na++] = ir_attr_int(L->c->arena, "stream", ++L->dropouts);
    return vtensor(emit(L, OP_DROPOUT, (Value *[]){x, keys, step}, 3, attrs, na, loc));
}

/* Sort the call's arguments into tensor operands and attrs, then emit. */
static Val call_op(Lower *L, const OpSpec *s, Expr *e)
{
    Value *t[64], *extra = NULL; /* extra: a K_TENSOR argument (attention's mask) */
    Attr *attrs[8];
    int nt = 0, na = 0, npos = 0, bad = 0;
    for (int i = 0; i < e->args.len; i++) {
        Expr *a = e->args.data[i];
        const KwSpec *kw = NULL;
        Expr *val = a;
        if (a->kind == E_KWARG) {
            kw = find_kw(s, a->name);
            val = a->lhs;
            if (!kw) {
                char names[128];
                kw_names(s, names, sizeof names);
                err(L, a->loc, "unknown keyword argument '%s' for '%s'", a->name, s->name);
                if (names[0])
                    note(L, e->loc, "'%s' takes %s", s->name, names);
                else
                    note(L, e->loc, "'%s' takes no keyword arguments", s->name);
                bad = 1;
                continue;
            }
        } else if (a->kind == E_NAME && find_kw(s, a->name) && find_kw(s, a->name)->kind == K_BOOL &&
                   !lookup(L, a->name)) {
            attrs[na++] = ir_attr_bool(L->c->arena, a->name, 1); /* a bare flag: causal */
            continue;
        } else if (nt < s->max_t && npos == nt) {
            Val v = eval(L, a);
            if (v.k == V_TENSOR) {
                t[nt++] = v.t;
                npos++;
                continue;
            }
            if (v.k == V_ERR) {
                bad = 1;
                npos++;
                nt++;
                continue;
            }
            if (nt < s->min_t) {
                err(L, a->loc, "argument %d of '%s' must be a tensor, got %s", i + 1, s->name,
                    kind_name(v.k));
                bad = 1;
                continue;
            }
        }
        if (!kw) {
            int k = npos++ - nt;
            if (k >= 6 || !s->kw[k].name) {
                err(L, a->loc, "too many arguments for '%s'", s->name);
                bad = 1;
                continue;
            }
            kw = &s->kw[k];
        }
        for (int j = 0; j < na; j++)
            if (strcmp(attrs[j]->key, kw->name) == 0) {
                err(L, a->loc, "argument '%s' of '%s' given twice", kw->name, s->name);
                bad = 1;
            }
        if (kw->kind == K_TENSOR) {
            Val v = eval(L, val);
            if (extra) {
                err(L, a->loc, "argument '%s' of '%s' given twice", kw->name, s->name);
                bad = 1;
            } else if (v.k == V_TENSOR) {
                extra = v.t;
            } else if (v.k != V_ERR) {
                err(L, val->loc, "'%s' of '%s' must be a tensor, got %s", kw->name, s->name,
                    kind_name(v.k));
                bad = 1;
            } else {
                bad = 1;
            }
            continue;
        }
        Attr *at = na < 8 ? kw_attr(L, s, kw, val) : NULL;
        if (at)
            attrs[na++] = at;
        else
            bad = 1;
    }
    if (bad)
        return ERRV;
    if (nt < s->min_t) {
        err(L, e->loc, "'%s' needs %d tensor argument%s, got %d", s->name, s->min_t,
            s->min_t > 1 ? "s" : "", nt);
        return ERRV;
    }
    if (s->op == OP_ATTENTION) {
        if (nt == 2) {
            err(L, e->loc, "'attention' takes q, k, v or one fused qkv tensor, got 2 tensors");
            return ERRV;
        }
        if (!ir_op_attr(&(Op){.attrs = attrs, .nattrs = na}, "heads")) {
            err(L, e->loc, "'attention' needs 'heads'");
            return ERRV;
        }
        if (nt == 1 && split_qkv(L, t, attrs, na, e->loc) != 0)
            return ERRV;
        nt = 3;
    }
    if (s->op == OP_SCATTER_ADD)
        return call_scatter(L, t, e->loc);
    if (s->op == OP_DROPOUT)
        return call_dropout(L, t[0], attrs, na, e->loc);
    if (extra)
        t[nt++] = extra;
    Value *r = emit(L, s->op, t, nt, attrs, na, e->loc);
    if (r && r->def->nres > 1) { /* topk: its values and indices, bound by `v, i = topk(...)` */
        Val v = {V_LIST, 0, 0, NULL, NULL, NULL, r->def->nres};
        v.items = arena_alloc(L->c->arena, sizeof(Val) * (size_t)r->def->nres);
        for (int i = 0; i < r->def->nres; i++)
            v.items[i] = vtensor(r->def->res[i]);
        return v;
    }
    return vtensor(r);
}

/* where(c, a, b): c a tensor; a or b may be a number, a constant of the
 * other's dtype, or of c's float dtype when both are numbers. */
static Val call_where(Lower *L, Expr *e)
{
    Val v[3];
    if (e->args.len != 3) {
        err(L, e->loc, "'where' takes 3 arguments (c, a, b), got %d", e->args.len);
        return ERRV;
    }
    for (int i = 0; i < 3; i++) {
        Expr *a = e->args.data[i];
        if (a->kind == E_KWARG) {
            err(L, a->loc, "'where' takes no keyword arguments");
            return ERRV;
        }
        v[i] = eval(L, a);
        if (v[i].k == V_ERR)
            return ERRV;
        if (v[i].k != V_TENSOR && (i == 0 || !is_num(v[i]))) {
            err(L, a->loc, "argument %d of 'where' must be a tensor%s, got %s", i + 1,
                i ? " or a number" : "", kind_name(v[i].k));
            return ERRV;
        }
    }
    Value *t = v[1].k == V_TENSOR ? v[1].t : v[2].k == V_TENSOR ? v[2].t : v[0].t;
    if (!ir_dtype_is_float(t->dtype) && (is_num(v[1]) || is_num(v[2]))) {
        err(L, e->loc, "'where' cannot mix a number with an %s tensor", ir_dtype_name(t->dtype));
        return ERRV;
    }
    Value *args[3] = {v[0].t, as_tensor(L, v[1], t->dtype, e->loc),
                      as_tensor(L, v[2], t->dtype, e->loc)};
    if (!args[1] || !args[2])
        return ERRV;
    return vtensor(emit(L, OP_WHERE, args, 3, NULL, 0, e->loc));
}

/* sqrt, exp and log of a number fold to a number; of a tensor they are ops.
 * Returns 1 and sets *out when it handled the call (one positional argument). */
static int call_math(Lower *L, Expr *e, Val *out)
{
    if (e->args.len != 1 || e->args.data[0]->kind == E_KWARG)
        return 0;
    Val v = eval(L, e->args.data[0]);
    if (v.k == V_TENSOR) {
        *out = vtensor(emit(L, find_spec(e->name)->op, &v.t, 1, NULL, 0, e->loc));
        return 1;
    }
    *out = ERRV;
    if (v.k == V_ERR)
        return 1;
    if (!is_num(v)) {
        err(L, e->loc, "'%s' needs a number or a tensor, got %s", e->name, kind_name(v.k));
        return 1;
    }
    double x = num(v);
    if (e->name[0] == 'e')
        *out = vfloat(exp(x));
    else if (e->name[0] == 's' && x >= 0)
        *out = vfloat(sqrt(x));
    else if (e->name[0] == 'l' && x > 0)
        *out = vfloat(log(x));
    else
        err(L, e->loc, "'%s' of %g is not a real number", e->name, x);
    return 1;
}

static Stmt *find_block(Lower *L, const char *name)
{
    for (int i = 0; i < L->blocks.len; i++)
        if (L->blocks.data[i]->name == name)
            return L->blocks.data[i];
    return NULL;
}

static Val call_block(Lower *L, Stmt *blk, Expr *e);

static Val eval_call(Lower *L, Expr *e)
{
    int is_math = !strcmp(e->name, "sqrt") || !strcmp(e->name, "exp") || !strcmp(e->name, "log");
    Val v;
    if (is_math && !lookup(L, e->name) && call_math(L, e, &v))
        return v;
    Stmt *blk = find_block(L, e->name);
    if (blk)
        return call_block(L, blk, e);
    const OpSpec *s = find_spec(e->name);
    if (s && s->op == OP_WHERE)
        return call_where(L, e);
    if (s)
        return call_op(L, s, e);
    err(L, e->loc, "unknown function '%s'", e->name);
    return ERRV;
}

static Val eval(Lower *L, Expr *e)
{
    switch (e->kind) {
    case E_INT: return vint(e->ival);
    case E_FLOAT: return vfloat(e->fval);
    case E_STR: return (Val){V_STR, 0, 0, e->name, NULL, NULL, 0};
    case E_NAME: return eval_name(L, e);
    case E_BIN: return eval_bin(L, e);
    case E_NEG: return eval_neg(L, e);
    case E_CALL: return eval_call(L, e);
    case E_LIST: return eval_list(L, e);
    case E_KWARG:
        err(L, e->loc, "'%s = ...' is only allowed as a call argument", e->name);
        return ERRV;
    }
    UNREACHABLE();
}

/* An integer expression (shape, count); -1 with an error when it is not one. */
static int eval_int(Lower *L, Expr *e, const char *what, int64_t *out)
{
    Val v = eval(L, e);
    if (v.k == V_ERR)
        return -1;
    if (v.k == V_FLOAT && v.f == floor(v.f) && fabs(v.f) < 9e15)
        v = vint((int64_t)v.f);
    if (v.k != V_INT) {
        if (v.k == V_FLOAT)
            err(L, e->loc, "%s must be an integer, got %g", what, v.f);
        else
            err(L, e->loc, "%s must be an integer, got %s", what, kind_name(v.k));
        return -1;
    }
    *out = v.i;
    return 0;
}

/* ---- types and annotated shardings ---- */

static void mesh_note(Lower *L)
{
    const Mesh *m = &L->g->mesh;
    char buf[256] = "";
    for (int i = 0; i < m->naxes; i++) {
        size_t k = strlen(buf);
        snprintf(buf + k, sizeof buf - k, "%s%s=%d", i ? ", " : "", m->axes[i].name,
                 m->axes[i].size);
    }
    note(L, LOC_NONE, "the mesh is %s", buf);
}

/* Resolve the axes of one dimension into sh; -1 after errors. */
static int lower_dim_axes(Lower *L, DimAst *d, int dim, Sharding *sh)
{
    int bad = 0;
    for (int j = 0; j < d->axes.len; j++) {
        const char *name = d->axes.data[j];
        Loc loc = d->axis_locs.data[j];
        int ax = ir_mesh_axis(&L->g->mesh, name);
        if (ax < 0) {
            err(L, loc, "unknown mesh axis '%s'", name);
            if (L->g->mesh.naxes)
                note(L, L->g->mesh.axes[0].loc, "the mesh axes are declared here");
            else
                note(L, L->model_loc, "the model declares no mesh axes");
            bad = 1;
            continue;
        }
        for (int p = 0; p < IR_MAX_RANK; p++)
            for (int q = 0; q < sh->naxes[p]; q++)
                if (sh->axes[p][q] == ax) {
                    err(L, loc, "mesh axis '%s' is used twice in one sharding", name);
                    bad = 1;
                }
        for (int q = 0; q < j && bad; q++)
            if (d->axes.data[q] == name)
                note(L, d->axis_locs.data[q], "first used here");
        if (!bad)
            ir_shard_add(sh, dim, ax);
    }
    return bad ? -1 : 0;
}

static int check_divisible(Lower *L, DimAst *d, int dim, int64_t size, const Sharding *sh,
                           const char *what)
{
    int64_t f = ir_shard_factor(&L->g->mesh, sh, dim);
    if (f <= 1 || size % f == 0)
        return 0;
    char axes[128] = "";
    for (int j = 0; j < sh->naxes[dim]; j++) {
        size_t k = strlen(axes);
        snprintf(axes + k, sizeof axes - k, "%s%s", j ? " x " : "",
                 L->g->mesh.axes[sh->axes[dim][j]].name);
    }
    err(L, d->size->loc,
        "dimension %d of '%s' has size %lld, which is not divisible by %lld (mesh axis %s)", dim,
        what, (long long)size, (long long)f, axes);
    mesh_note(L);
    return -1;
}

/* Evaluate a declared type; -1 after errors. */
static int lower_type(Lower *L, TypeAst *ty, const char *what, DType *dt, int *rank,
                      int64_t *shape, Sharding *sh)
{
    int bad = 0;
    memset(sh, 0, sizeof *sh);
    int t = ir_dtype_lookup(ty->dtype);
    if (t < 0) {
        err(L, ty->dtype_loc, "unknown dtype '%s'", ty->dtype);
        note(L, LOC_NONE, "the dtypes are f32, f64, bf16, f16 and i32");
        bad = 1;
    }
    *dt = t < 0 ? DT_F32 : (DType)t;
    if (ty->dims.len > IR_MAX_RANK) {
        err(L, ty->loc, "'%s' has %d dimensions; at most %d are supported", what, ty->dims.len,
            IR_MAX_RANK);
        return -1;
    }
    *rank = ty->dims.len;
    for (int i = 0; i < ty->dims.len; i++) {
        DimAst *d = ty->dims.data[i];
        if (eval_int(L, d->size, "a dimension", &shape[i]) != 0) {
            bad = 1;
            continue;
        }
        if (shape[i] < 1 || shape[i] > MAX_DIM) {
            err(L, d->size->loc, "dimension %d of '%s' has size %lld; sizes must be in 1..2^40",
                i, what, (long long)shape[i]);
            bad = 1;
            continue;
        }
        if (lower_dim_axes(L, d, i, sh) != 0 || check_divisible(L, d, i, shape[i], sh, what))
            bad = 1;
    }
    if (!ir_shard_is_replicated(sh, *rank))
        sh->why = (Why){WHY_ANNOTATION, ty->loc, NULL};
    return bad ? -1 : 0;
}

/* ---- statements ---- */

static void lower_items(Lower *L, Stmt *holder, int top);

static int check_fresh(Lower *L, const char *name, Loc loc)
{
    Binding *b = scope_find_local(L->scope, name);
    Binding *m = L->scope != L->root ? scope_find_local(L->root, name) : NULL;
    if (!b && m) {
        err(L, loc, "'%s' is a model parameter", name);
        note(L, m->loc, "'%s' is declared here", name);
        return -1;
    }
    if (!b)
        return 0;
    err(L, loc, "duplicate name '%s'", name);
    note(L, b->loc, "'%s' was first defined here", name);
    return -1;
}

static void lower_input(Lower *L, Stmt *s)
{
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    Sharding sh;
    if (check_fresh(L, s->name, s->name_loc) != 0)
        return;
    Val v = ERRV;
    if (lower_type(L, s->type, s->name, &dt, &rank, shape, &sh) == 0) {
        Op *op = ir_op_new(L->g, OP_INPUT, NULL, 0, s->loc);
        op->layer = op_layer(L);
        Value *t = ir_op_result(L->g, op, dt, rank, shape);
        t->name = s->name;
        t->shard = sh;
        v = vtensor(t);
    }
    bind(L, L->scope, s->name, B_INPUT, v, s->name_loc);
}

/* The init expression as an Attr: zeros, ones, normal(std), uniform(a), constant(value). */
static Attr *lower_init(Lower *L, Expr *e)
{
    Arena *a = L->c->arena;
    if (!e)
        return ir_attr_call(a, "init", "normal", (Attr *[]){ir_attr_float(a, "std", 0.02)}, 1);
    if (e->kind == E_NAME && (!strcmp(e->name, "zeros") || !strcmp(e->name, "ones")))
        return ir_attr_str(a, "init", e->name);
    static const char *fns[] = {"normal", "uniform", "constant"};
    static const char *keys[] = {"std", "a", "value"};
    for (int i = 0; e->kind == E_CALL && i < 3; i++) {
        if (strcmp(e->name, fns[i]) != 0)
            continue;
        Expr *arg = e->args.len == 1 ? e->args.data[0] : NULL;
        if (arg && arg->kind == E_KWARG && strcmp(arg->name, keys[i]) == 0)
            arg = arg->lhs;
        else if (arg && arg->kind == E_KWARG)
            arg = NULL;
        if (!arg) {
            err(L, e->loc, "'%s' takes one argument, '%s'", fns[i], keys[i]);
            return NULL;
        }
        Val v = eval(L, arg);
        if (v.k == V_ERR)
            return NULL;
        if (!is_num(v) || (i < 2 && num(v) < 0)) {
            err(L, arg->loc, "'%s' of '%s' must be a %snumber", keys[i], fns[i],
                i < 2 ? "non-negative " : "");
            return NULL;
        }
        Attr *item = ir_attr_float(a, keys[i], num(v));
        return ir_attr_call(a, "init", fns[i], &item, 1);
    }
    err(L, e->loc, "unknown initializer; use zeros, ones, normal(std), uniform(a) or constant(v)");
    return NULL;
}

static int check_param_name(Lower *L, const char *full, Loc loc)
{
    for (int i = 0; i < L->param_names.len; i++) {
        if (L->param_names.data[i] == full) {
            err(L, loc, "duplicate parameter '%s'", full);
            note(L, L->param_locs.data[i], "'%s' was first declared here", full);
            return -1;
        }
    }
    VEC_PUSH(L->c->arena, L->param_names, full);
    VEC_PUSH(L->c->arena, L->param_locs, loc);
    return 0;
}

static void lower_param(Lower *L, Stmt *s)
{
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    Sharding sh;
    if (check_fresh(L, s->name, s->name_loc) != 0)
        return;
    const char *full = intern(L->c->strings, arena_printf(L->c->arena, "%s%s", L->prefix, s->name));
    int bad = check_param_name(L, full, s->name_loc);
    bad |= lower_type(L, s->type, full, &dt, &rank, shape, &sh);
    Attr *init = lower_init(L, s->value);
    Val v = ERRV;
    if (!bad && init) {
        if (!ir_dtype_is_float(dt)) {
            err(L, s->type->dtype_loc, "parameter '%s' must have a float dtype, not %s", full,
                ir_dtype_name(dt));
        } else {
            Op *op = ir_op_new(L->g, OP_PARAM, NULL, 0, s->loc);
            op->layer = L->layer; /* for now: param_layers settles it */
            ir_op_set_attr(L->g, op, init);
            Value *t = ir_op_result(L->g, op, dt, rank, shape);
            t->name = full;
            t->shard = sh;
            v = vtensor(t);
        }
    }
    bind(L, L->scope, s->name, B_PARAM, v, s->name_loc);
}

/* x : f32[B@dp, D] = expr : the value must have the declared type; its
 * sharding becomes the annotated one. */
static Val annotate(Lower *L, Stmt *s, Val v)
{
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    Sharding sh;
    if (lower_type(L, s->type, s->name, &dt, &rank, shape, &sh) != 0 || v.k == V_ERR)
        return ERRV;
    if (v.k != V_TENSOR) {
        err(L, s->type->loc, "'%s' is declared a tensor but its value is %s", s->name,
            kind_name(v.k));
        return ERRV;
    }
    char want[160];
    ir_type_str(want, sizeof want, dt, rank, shape);
    if (v.t->dtype != dt) {
        err(L, s->type->dtype_loc, "dtype mismatch: '%s' is declared %s but its value is %s",
            s->name, ir_dtype_name(dt), ir_dtype_name(v.t->dtype));
        note(L, s->value->loc, "the value is %s", type_str(L, v.t));
        return ERRV;
    }
    if (v.t->rank != rank || memcmp(v.t->shape, shape, sizeof(int64_t) * (size_t)rank) != 0) {
        err(L, s->type->loc, "shape mismatch: '%s' is declared %s but its value is %s", s->name,
            want, type_str(L, v.t));
        note(L, s->value->loc, "the value is computed here");
        return ERRV;
    }
    OpKind dk = v.t->def->kind;
    if (dk == OP_INPUT || dk == OP_PARAM || !ir_shard_is_replicated(&v.t->shard, v.t->rank)) {
        /* keep the other value's sharding: a new value (an identity reshape)
         * carries this one, and the partitioner moves data between them */
        Attr *a = ir_attr_ints(L->c->arena, "shape", v.t->shape, v.t->rank);
        v = vtensor(emit(L, OP_RESHAPE, &v.t, 1, &a, 1, s->type->loc));
        if (v.k != V_TENSOR)
            return ERRV;
    }
    v.t->shard = sh;
    return v;
}

/* name = v: rebinding walks out to the enclosing block or model scope. */
static void assign(Lower *L, const char *name, Loc loc, Val v)
{
    if (v.k == V_TENSOR && !v.t->name && v.t->def->kind != OP_PARAM && v.t->def->kind != OP_INPUT)
        v.t->name = name;
    for (Scope *sc = L->scope; sc; sc = sc->boundary ? NULL : sc->parent) {
        Binding *b = scope_find_local(sc, name);
        if (!b)
            continue;
        if (b->kind == B_MODEL || b->kind == B_PARAM || b->kind == B_INDEX) {
            static const char *what[] = {"value", "model parameter", "parameter", "input",
                                         "repeat index"};
            err(L, loc, "cannot assign to %s '%s'", what[b->kind], name);
            note(L, b->loc, "'%s' is declared here", name);
            return;
        }
        b->val = v;
        return;
    }
    if (lookup(L, name) && lookup(L, name)->kind == B_MODEL) {
        err(L, loc, "cannot assign to model parameter '%s'", name);
        note(L, lookup(L, name)->loc, "'%s' is declared here", name);
        return;
    }
    bind(L, L->scope, name, B_VALUE, v, loc);
}

/* `a, b, c = e`: e is a list of as many values (a block's `return x, y, z`),
 * bound in order. The names are distinct. */
static void assign_several(Lower *L, Stmt *s, Val v)
{
    int n = s->params.len + 1;
    for (int i = 0; i < s->params.len; i++) {
        const char *a = s->params.data[i];
        for (int j = -1; j < i; j++)
            if (!strcmp(a, j < 0 ? s->name : s->params.data[j])) {
                err(L, s->param_locs.data[i], "'%s' is assigned twice in one statement", a);
                return;
            }
    }
    if (v.k == V_ERR)
        return;
    if (v.k != V_LIST || v.n != n) {
        if (v.k == V_LIST)
            err(L, s->value->loc, "%d names are assigned %d value%s", n, v.n, v.n == 1 ? "" : "s");
        else
            err(L, s->value->loc, "%d names are assigned one value (%s); a block returns several "
                                  "with 'return x, y'",
                n, kind_name(v.k));
        return;
    }
    for (int i = 0; i < n; i++)
        assign(L, i ? s->params.data[i - 1] : s->name, i ? s->param_locs.data[i - 1] : s->name_loc,
               v.items[i]);
}

static void lower_assign(Lower *L, Stmt *s)
{
    Val v = eval(L, s->value);
    if (s->params.len) {
        assign_several(L, s, v);
        return;
    }
    if (s->type)
        v = annotate(L, s, v);
    assign(L, s->name, s->name_loc, v);
}

static void lower_repeat(Lower *L, Stmt *s)
{
    int64_t n;
    if (eval_int(L, s->value, "a repeat count", &n) != 0)
        return;
    if (n < 0 || n > MAX_REPEAT) {
        err(L, s->value->loc, "repeat count %lld is out of range 0..%d", (long long)n, MAX_REPEAT);
        return;
    }
    if (L->c->repeat_limit > 0 && n > L->c->repeat_limit)
        n = L->c->repeat_limit;
    const char *name = s->str ? s->str : "layers";
    const Binding *shadow = s->index ? lookup(L, s->index) : NULL;
    if (shadow && shadow->kind != B_VALUE) { /* a value of the enclosing scope may be shadowed */
        static const char *what[] = {"a value", "a model parameter", "a parameter", "an input",
                                     "the index of an enclosing repeat"};
        err(L, s->index_loc, "the repeat index '%s' is already %s", s->index, what[shadow->kind]);
        note(L, shadow->loc, "'%s' is declared here", s->index);
        return;
    }
    Scope *saved = L->scope;
    const char *saved_prefix = L->prefix;
    int saved_layer = L->layer, errors = L->c->diag.nerrors;
    for (int64_t i = 0; i < n && L->c->diag.nerrors == errors; i++) {
        if (++L->unrolled > MAX_REPEAT) { /* nested repeats of empty bodies add no ops */
            err(L, s->value->loc, "the repeats unroll into more than %d layers", MAX_REPEAT);
            break;
        }
        L->scope = scope_new(L, saved, 0);
        if (s->index) /* the copy's number, 0 .. n-1: an integer like a model parameter */
            bind(L, L->scope, s->index, B_INDEX, vint(i), s->index_loc);
        L->prefix = arena_printf(L->c->arena, "%s%s.%lld.", saved_prefix, name, (long long)i);
        L->layer = LAYER_NEXT;
        lower_items(L, s, 0);
    }
    L->scope = saved;
    L->prefix = saved_prefix;
    L->layer = saved_layer == -1 ? -1 : LAYER_NEXT; /* an outer copy goes on in a new layer */
}

/* A fresh parameter prefix for one call of a block: NAME. then NAME_1. ... */
static const char *instance_prefix(Lower *L, const char *block)
{
    for (int k = 0;; k++) {
        const char *p = k ? arena_printf(L->c->arena, "%s%s_%d.", L->prefix, block, k)
                          : arena_printf(L->c->arena, "%s%s.", L->prefix, block);
        p = intern(L->c->strings, p);
        int used = 0;
        for (int i = 0; i < L->param_names.len && !used; i++)
            used = strncmp(L->param_names.data[i], p, strlen(p)) == 0;
        if (!used)
            return p;
    }
}

static Val call_block(Lower *L, Stmt *blk, Expr *e)
{
    if (e->args.len != blk->params.len) {
        err(L, e->loc, "block '%s' takes %d argument%s, got %d", blk->name, blk->params.len,
            blk->params.len == 1 ? "" : "s", e->args.len);
        note(L, blk->name_loc, "'%s' is defined here", blk->name);
        return ERRV;
    }
    if (L->depth >= MAX_CALL_DEPTH) {
        err(L, e->loc, "block calls nest deeper than %d (is '%s' recursive?)", MAX_CALL_DEPTH,
            blk->name);
        return ERRV;
    }
    Scope *sc = scope_new(L, L->root, 1);
    for (int i = 0; i < e->args.len; i++) {
        Expr *a = e->args.data[i];
        if (a->kind == E_KWARG) {
            err(L, a->loc, "blocks take positional arguments only");
            return ERRV;
        }
        Val v = eval(L, a);
        if (v.k == V_ERR)
            return ERRV;
        bind(L, sc, blk->params.data[i], B_VALUE, v, blk->param_locs.data[i]);
    }
    Scope *saved = L->scope;
    const char *saved_prefix = L->prefix;
    L->prefix = instance_prefix(L, blk->name);
    L->scope = sc;
    L->depth++;
    int errors = L->c->diag.nerrors;
    lower_items(L, blk, 0);
    Stmt *ret = blk->body.len ? blk->body.data[blk->body.len - 1] : NULL;
    Val v = ERRV;
    if (ret && ret->kind == S_RETURN && L->c->diag.nerrors == errors)
        v = eval(L, ret->value);
    L->depth--;
    L->scope = saved;
    L->prefix = saved_prefix;
    return v;
}

/* ---- the train block: kept as Attrs, acted on by later passes ---- */

static const char *const train_keys[] = {
    "optimizer", "lr", "lr_schedule", "grad_clip", "microbatches", "recompute", "precision",
    "schedule", "virtual_stages", "zero", "sequence_parallel", "stage_starts", "steps", "seed",
    "weight_decay", NULL};

static Attr *train_attr(Lower *L, const char *key, Expr *e)
{
    Arena *a = L->c->arena;
    switch (e->kind) {
    case E_NAME:
        if (!lookup(L, e->name) && strcmp(e->name, "true") && strcmp(e->name, "false"))
            return ir_attr_str(a, key, e->name);
        break;
    case E_STR: return ir_attr_str(a, key, e->name);
    case E_CALL:
    case E_LIST: {
        Attr **items = arena_alloc(a, sizeof(Attr *) * (size_t)(e->args.len + 1));
        for (int i = 0; i < e->args.len; i++) {
            Expr *x = e->args.data[i];
            items[i] = x->kind == E_KWARG ? train_attr(L, x->name, x->lhs) : train_attr(L, NULL, x);
            if (!items[i])
                return NULL;
        }
        return e->kind == E_CALL ? ir_attr_call(a, key, e->name, items, e->args.len)
                                 : ir_attr_list(a, key, items, e->args.len);
    }
    default: break;
    }
    Val v = eval(L, e);
    switch (v.k) {
    case V_INT: return ir_attr_int(a, key, v.i);
    case V_FLOAT: return ir_attr_float(a, key, v.f);
    case V_BOOL: return ir_attr_bool(a, key, (int)v.i);
    case V_ERR: return NULL;
    default: err(L, e->loc, "a training setting cannot be %s", kind_name(v.k)); return NULL;
    }
}

static void lower_train(Lower *L, Stmt *s)
{
    if (L->g->train.len) {
        err(L, s->loc, "more than one 'train' block");
        return;
    }
    Scope *saved = L->scope;
    L->scope = L->root; /* settings see model parameters, not tensors */
    for (int i = 0; i < s->body.len; i++) {
        Stmt *t = s->body.data[i];
        if (t->kind != S_ASSIGN || t->type) {
            err(L, t->loc, "only 'name = value' settings are allowed in 'train'");
            continue;
        }
        int known = 0;
        for (int k = 0; train_keys[k]; k++)
            known |= strcmp(train_keys[k], t->name) == 0;
        if (!known) { /* before evaluating: the value may not even make sense */
            err(L, t->name_loc, "unknown training setting '%s'", t->name);
            note(L, LOC_NONE, "the settings are optimizer, lr, lr_schedule, grad_clip, "
                 "microbatches, recompute, precision, schedule, virtual_stages, zero, steps, "
                 "seed, weight_decay");
            continue;
        }
        for (int k = 0; k < L->g->train.len; k++)
            if (strcmp(L->g->train.data[k]->key, t->name) == 0)
                err(L, t->name_loc, "training setting '%s' given twice", t->name);
        Attr *a = train_attr(L, t->name, t->value);
        TrainConfig tc;
        char msg[256];
        ir_train_defaults(&tc);
        if (a && ir_train_set(&tc, a, msg, sizeof msg) != 0) {
            err(L, t->value->loc, "%s", msg);
            a = NULL;
        }
        if (a)
            VEC_PUSH(L->c->arena, L->g->train, a);
    }
    L->scope = saved;
    TrainConfig tc;
    char msg[256];
    if (L->c->diag.nerrors == 0 && ir_train_config(L->g, &tc, msg, sizeof msg) != 0)
        err(L, s->loc, "%s", msg);
}

static void lower_output(Lower *L, Stmt *s)
{
    Binding *b = lookup(L, s->name);
    if (!b) {
        err(L, s->name_loc, "use of undefined name '%s'", s->name);
        return;
    }
    if (b->val.k == V_TENSOR)
        VEC_PUSH(L->c->arena, L->g->outputs, b->val.t);
    else if (b->val.k != V_ERR)
        err(L, s->name_loc, "output '%s' must be a tensor, not %s", s->name,
            kind_name(b->val.k));
}

static void lower_stmt(Lower *L, Stmt *s, const Stmt *holder, int top, int last)
{
    static const char *names[] = {"model", "mesh", "axis", "input", "param", "assign",
                                  "repeat", "block", "return", "train", "output"};
    switch (s->kind) {
    case S_INPUT:
        if (top)
            lower_input(L, s);
        else
            err(L, s->loc, "'input' is only allowed at the top level");
        return;
    case S_PARAM: lower_param(L, s); return;
    case S_ASSIGN: lower_assign(L, s); return;
    case S_REPEAT: lower_repeat(L, s); return;
    case S_MODEL:
    case S_MESH:
    case S_BLOCK:
    case S_TRAIN:
    case S_OUTPUT:
        if (top) {
            if (s->kind == S_TRAIN)
                lower_train(L, s);
            if (s->kind == S_OUTPUT)
                lower_output(L, s);
            return; /* model, mesh and blocks were handled first */
        }
        err(L, s->loc, "'%s' is only allowed at the top level", names[s->kind]);
        return;
    case S_RETURN:
        if (holder->kind != S_BLOCK || !last)
            err(L, s->loc, "'return' must be the last statement of a block");
        return; /* the caller evaluates it */
    case S_AXIS: break;
    }
    UNREACHABLE();
}

static void lower_items(Lower *L, Stmt *holder, int top)
{
    for (int i = 0; i < holder->body.len && !L->too_big; i++)
        lower_stmt(L, holder->body.data[i], holder, top, i == holder->body.len - 1);
}

/* ---- model header, mesh declaration and --mesh binding ---- */

static Define *find_define(Ctx *c, const char *name)
{
    for (int i = 0; i < c->defines.len; i++)
        if (strcmp(c->defines.data[i].name, name) == 0)
            return &c->defines.data[i];
    return NULL;
}

/* Whether a default makes a float parameter: it holds a float literal
 * (0.5, 30.0, 1e-5) or a float parameter. Decided by how it is written, not
 * by its value, so 16 / 2 stays an integer and 7 / 2 an error. */
static int float_default(Lower *L, const Expr *e)
{
    if (!e)
        return 0;
    if (e->kind == E_FLOAT)
        return 1;
    if (e->kind == E_NAME) {
        const Binding *b = lookup(L, e->name);
        return b && b->kind == B_MODEL && b->val.k == V_FLOAT;
    }
    int f = float_default(L, e->lhs) || float_default(L, e->rhs);
    for (int i = 0; i < e->args.len && !f; i++)
        f = float_default(L, e->args.data[i]);
    return f;
}

/* A model parameter: an integer (sizes, counts), or a float (scales, caps,
 * epsilons) when its default is written so (float_default); -D NAME=VALUE
 * replaces the default (not evaluated then), a float parameter taking any
 * number, an integer one integers only. */
static Val model_param(Lower *L, Stmt *p, Define *d)
{
    int fl = float_default(L, p->value);
    int64_t i = 0;
    if (d) {
        d->used = 1;
        if (fl)
            return vfloat(d->fvalue);
        if (!d->is_float)
            return vint(d->value);
        err(L, p->name_loc, "-D %s=%g: '%s' is an integer parameter", d->name, d->fvalue,
            p->name);
        return ERRV;
    }
    if (!fl)
        return eval_int(L, p->value, "a model parameter", &i) == 0 ? vint(i) : ERRV;
    Val v = eval(L, p->value);
    if (v.k == V_INT)
        return vfloat((double)v.i);
    if (v.k != V_FLOAT && v.k != V_ERR)
        err(L, p->value->loc, "a model parameter must be a number, got %s", kind_name(v.k));
    return v.k == V_FLOAT ? v : ERRV;
}

static void lower_model(Lower *L, Stmt *s)
{
    L->g->name = s->name;
    L->model_loc = s->loc;
    L->scope = L->root;
    for (int i = 0; i < s->body.len; i++) {
        Stmt *p = s->body.data[i];
        if (check_fresh(L, p->name, p->name_loc) != 0)
            continue;
        Val v = model_param(L, p, find_define(L->c, p->name));
        bind(L, L->root, p->name, B_MODEL, v, p->name_loc);
        if (v.k == V_INT)
            VEC_PUSH(L->c->arena, L->g->config, ir_attr_int(L->c->arena, p->name, v.i));
        else if (v.k == V_FLOAT)
            VEC_PUSH(L->c->arena, L->g->config, ir_attr_float(L->c->arena, p->name, v.f));
    }
}

static void check_defines(Lower *L, Stmt *model)
{
    for (int i = 0; i < L->c->defines.len; i++) {
        Define *d = &L->c->defines.data[i];
        if (d->used)
            continue;
        err(L, LOC_NONE, "-D %s: model '%s' has no parameter '%s'", d->name, L->g->name,
            d->name);
        if (model)
            note(L, model->name_loc, "the parameters are declared here");
    }
}

static void lower_mesh(Lower *L, Stmt *s)
{
    Mesh *m = &L->g->mesh;
    for (int i = 0; i < s->body.len; i++) {
        Stmt *a = s->body.data[i];
        int role = ir_role_lookup(a->str);
        int dup = ir_mesh_axis(m, a->name);
        if (digit_led(L, a->name, a->name_loc)) {
        } else if (dup >= 0) {
            err(L, a->name_loc, "duplicate mesh axis '%s'", a->name);
            note(L, m->axes[dup].loc, "'%s' was first declared here", a->name);
        } else if (role < 0) {
            err(L, a->str_loc, "unknown mesh axis role '%s'", a->str);
            note(L, LOC_NONE, "the roles are data, fsdp, tensor, sequence and pipeline");
        } else if (m->naxes == IR_MAX_AXES) {
            err(L, a->name_loc, "more than %d mesh axes", IR_MAX_AXES);
        } else {
            m->axes[m->naxes++] = (MeshAxis){a->name, 1, (AxisRole)role, a->name_loc};
        }
    }
}

static int parse_size(const char *s, const char **end, int *out)
{
    char *e;
    if (*s < '0' || *s > '9')
        return -1;
    long v = strtol(s, &e, 10);
    if (v < 1 || v > 65536)
        return -1;
    *out = (int)v;
    *end = e;
    return 0;
}

/* By name, the axes take the order given, the last innermost (devices are
 * numbered row-major over the axes, so the last axis's groups are neighbours:
 * the devices of one server); axes not named stay first. */
static void order_mesh(Mesh *m, const int *order, int n, const int *seen)
{
    MeshAxis axes[IR_MAX_AXES];
    int k = 0;
    for (int i = 0; i < m->naxes; i++)
        if (!seen[i])
            axes[k++] = m->axes[i];
    for (int i = 0; i < n; i++)
        axes[k++] = m->axes[order[i]];
    memcpy(m->axes, axes, sizeof(MeshAxis) * (size_t)m->naxes);
}

/* "8x4x2" binds sizes in declaration order; "dp=8,tp=4" binds by name, and
 * lays the devices out in that order (order_mesh). */
static void bind_mesh(Lower *L)
{
    const char *spec = L->c->mesh_spec, *p = spec;
    Mesh *m = &L->g->mesh;
    int by_name = strchr(spec, '=') != NULL, n = 0, seen[IR_MAX_AXES] = {0}, order[IR_MAX_AXES];
    const char *sep = strchr(spec, ',') || by_name ? "," : "x";
    if (!*spec || spec[strlen(spec) - 1] == *sep || strchr(spec, ' ')) {
        err(L, LOC_NONE, "--mesh '%s': expected sizes like 8x4x2 or names like dp=8,tp=4", spec);
        return;
    }
    while (*p) {
        int ax = n, size;
        if (by_name) {
            const char *eq = strchr(p, '='), *comma = strchr(p, ',');
            if (!eq || (comma && comma < eq)) {
                err(L, LOC_NONE, "--mesh %s: expected NAME=SIZE, got '%.*s'", spec,
                    (int)(comma ? comma - p : (long)strlen(p)), p);
                return;
            }
            const char *name = eq ? intern_n(L->c->strings, p, (size_t)(eq - p)) : "";
            ax = eq ? ir_mesh_axis(m, name) : -1;
            if (ax < 0) {
                err(L, LOC_NONE, "--mesh %s: the model declares no mesh axis '%s'", spec, name);
                goto declared;
            }
            p = eq + 1;
        } else if (n >= m->naxes) {
            err(L, LOC_NONE, "--mesh %s gives more sizes than the model's %d mesh axes", spec,
                m->naxes);
            goto declared;
        }
        if (parse_size(p, &p, &size) != 0 || (*p && *p != (by_name ? ',' : 'x'))) {
            err(L, LOC_NONE, "--mesh %s: expected sizes 1..65536 like 8x4x2 or dp=8,tp=4", spec);
            return;
        }
        if (seen[ax]++) {
            err(L, LOC_NONE, "--mesh %s: axis '%s' given twice", spec, m->axes[ax].name);
            return;
        }
        m->axes[ax].size = size;
        order[n++] = ax;
        p += *p != 0;
    }
    if (by_name)
        order_mesh(m, order, n, seen);
    return;
declared:
    if (m->naxes)
        note(L, m->axes[0].loc, "the mesh axes are declared here");
    else
        note(L, L->model_loc, "the model declares no mesh axes");
}

/* ---- entry points ---- */

static const char *base_name(Lower *L, const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    const char *dot = strrchr(b, '.');
    return intern_n(L->c->strings, b, dot ? (size_t)(dot - b) : strlen(b));
}

/* Model header, mesh and blocks take effect before the statements in order. */
static Stmt *lower_headers(Lower *L)
{
    Stmt *model = NULL, *mesh = NULL;
    for (int i = 0; i < L->ast->items.len; i++) {
        Stmt *s = L->ast->items.data[i];
        if (s->kind == S_MODEL && model) {
            err(L, s->loc, "more than one 'model' declaration");
            note(L, model->loc, "the first is here");
        } else if (s->kind == S_MODEL) {
            model = s;
        } else if (s->kind == S_MESH) {
            if (mesh) {
                err(L, s->loc, "more than one 'mesh' declaration");
                note(L, mesh->loc, "the first is here");
            }
            mesh = mesh ? mesh : s;
        } else if (s->kind == S_BLOCK) {
            Stmt *old = find_block(L, s->name);
            if (digit_led(L, s->name, s->name_loc))
                continue;
            if (old || find_spec(s->name)) {
                err(L, s->name_loc, "duplicate name '%s'", s->name);
                if (old)
                    note(L, old->name_loc, "'%s' was first defined here", s->name);
                continue;
            }
            for (int a = 0; a < s->params.len; a++)
                for (int b = 0; b < a; b++)
                    if (s->params.data[a] == s->params.data[b]) {
                        err(L, s->param_locs.data[a], "duplicate name '%s'", s->params.data[a]);
                        note(L, s->param_locs.data[b], "'%s' was first defined here",
                             s->params.data[b]);
                    }
            if (!s->body.len || s->body.data[s->body.len - 1]->kind != S_RETURN)
                err(L, s->name_loc, "block '%s' must end with 'return'", s->name);
            VEC_PUSH(L->c->arena, L->blocks, s);
        }
    }
    if (model)
        lower_model(L, model);
    check_defines(L, model);
    if (mesh)
        lower_mesh(L, mesh);
    if (L->c->mesh_spec)
        bind_mesh(L);
    return model;
}

/* A parameter declared in a repeat belongs to the layer of its first reader
 * in a layer, which need not be the region it is declared in (declared before
 * a nested repeat, read after it): the pipeline keeps a parameter, its
 * update and its first reader on one stage. One that no layer reads keeps
 * the layer of its region, or none. */
static void param_layers(Graph *g)
{
    char *done = arena_alloc(g->arena, (size_t)g->ops.len + 1);
    memset(done, 0, (size_t)g->ops.len + 1);
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        for (int a = 0; op->layer >= 0 && op->kind != OP_PARAM && a < op->nargs; a++) {
            Op *d = op->args[a]->def;
            if (d && d->kind == OP_PARAM && d->layer != -1 && !done[d->id])
                d->layer = op->layer, done[d->id] = 1;
        }
    }
    for (int i = 0; i < g->ops.len; i++)
        if (g->ops.data[i]->layer == LAYER_NEXT)
            g->ops.data[i]->layer = -1;
}

static void find_outputs(Lower *L)
{
    if (L->g->outputs.len)
        return;
    Binding *b = scope_find_local(L->scope, intern(L->c->strings, "loss"));
    if (b && b->val.k == V_TENSOR)
        VEC_PUSH(L->c->arena, L->g->outputs, b->val.t);
    else if (b && b->val.k != V_ERR)
        err(L, b->loc, "the output 'loss' must be a tensor, not %s", kind_name(b->val.k));
    else if (!b)
        err(L, LOC_NONE, "%s: the model has no output: assign 'loss' or add 'output NAME'",
            L->ast->file);
}

Graph *fe_lower(Ctx *c, Ast *ast)
{
    int errors = c->diag.nerrors;
    Lower L = {.c = c, .ast = ast, .prefix = "", .layer = -1};
    L.g = ir_graph_new(c->arena, c->strings, NULL);
    L.root = scope_new(&L, NULL, 1);
    L.scope = L.root;
    L.model_loc = (Loc){ast->file, 1, 1};
    L.g->name = base_name(&L, ast->file); /* a model statement renames it */
    lower_headers(&L);
    L.scope = scope_new(&L, L.root, 1);
    lower_items(&L, &(Stmt){.body.data = ast->items.data, .body.len = ast->items.len}, 1);
    param_layers(L.g);
    if (!L.too_big)
        find_outputs(&L);
    return c->diag.nerrors == errors ? L.g : NULL;
}

Graph *fe_compile(Ctx *c, const char *path, const char *text, size_t len)
{
    Ast *ast = fe_parse(c, path, text, len);
    return ast ? fe_lower(c, ast) : NULL;
}
