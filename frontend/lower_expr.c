/* lower_expr.c: evaluates TDL expressions, calls included.
 * Reads Expr trees and the scopes; writes ops (through lower_emit.c).
 * Key idea: expressions are evaluated, not translated. Integer expressions
 * (shapes, counts) fold to numbers; tensor expressions emit ops. A call is a
 * numeric function, a tensor op of the op table (its arguments sorted into
 * operands and attrs) or a block (L->call_block). An error yields ERRV,
 * which silences follow-on errors. */
#include "lower_impl.h"

#include <math.h>
#include <string.h>

/* ---- expressions ---- */

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
            fe_err(L, loc, "division by zero");
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
    fe_err(L, loc, "integer overflow in '%c'", op);
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
            fe_err(L, loc, "division by zero");
            return ERRV;
        }
        return vfloat(x / y);
    case '%': fe_err(L, loc, "'%%' needs integers"); return ERRV;
    case '@': fe_err(L, loc, "'@' (matrix product) needs two tensors"); return ERRV;
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
    return fe_emit_constant(L, num(v), dt, loc);
}

static Val eval_bin(Lower *L, Expr *e)
{
    Val a = fe_eval(L, e->lhs), b = fe_eval(L, e->rhs);
    if (a.k == V_ERR || b.k == V_ERR)
        return ERRV;
    if (is_num(a) && is_num(b))
        return eval_num_bin(L, e->op, a, b, e->loc);
    int ok = (a.k == V_TENSOR || is_num(a)) && (b.k == V_TENSOR || is_num(b));
    OpKind k = bin_op(e->op);
    if (!ok || k == OP_COUNT || (k == OP_MATMUL && (a.k != V_TENSOR || b.k != V_TENSOR))) {
        fe_err(L, e->loc, "operator '%s' cannot take %s and %s", op_text(e->op), fe_kind_name(a.k),
               fe_kind_name(b.k));
        return ERRV;
    }
    DType dt = a.k == V_TENSOR ? a.t->dtype : b.t->dtype;
    if (!ir_dtype_is_float(dt) && (is_num(a) || is_num(b))) {
        fe_err(L, e->loc, "operator '%s' cannot mix a number with an %s tensor", op_text(e->op),
               ir_dtype_name(dt));
        return ERRV;
    }
    Value *args[2] = {as_tensor(L, a, dt, e->loc), as_tensor(L, b, dt, e->loc)};
    if (!args[0] || !args[1])
        return ERRV;
    return vtensor(fe_emit(L, k, args, 2, NULL, 0, e->loc));
}

static Val eval_neg(Lower *L, Expr *e)
{
    Val a = fe_eval(L, e->lhs);
    switch (a.k) {
    case V_ERR: return ERRV;
    case V_INT:
        if (a.i == INT64_MIN) {
            fe_err(L, e->loc, "integer overflow in '-'");
            return ERRV;
        }
        return vint(-a.i);
    case V_FLOAT: return vfloat(-a.f);
    case V_TENSOR: return vtensor(fe_emit(L, OP_NEG, &a.t, 1, NULL, 0, e->loc));
    default: fe_err(L, e->loc, "cannot negate %s", fe_kind_name(a.k)); return ERRV;
    }
}

static Val eval_name(Lower *L, Expr *e)
{
    Binding *b = fe_lookup(L, e->name);
    if (b)
        return b->val;
    if (strcmp(e->name, "true") == 0 || strcmp(e->name, "false") == 0)
        return (Val){V_BOOL, e->name[0] == 't', 0, NULL, NULL, NULL, 0};
    if (e->name[0] >= '0' && e->name[0] <= '9')
        fe_err(L, e->loc, "'%s' is not a number or a name; write a product with '*' (e.g. 3*D)",
               e->name);
    else
        fe_err(L, e->loc, "use of undefined name '%s'", e->name);
    return ERRV;
}

static Val eval_list(Lower *L, Expr *e)
{
    Val v = {V_LIST, 0, 0, NULL, NULL, NULL, e->args.len};
    v.items = arena_alloc(L->c->arena, sizeof(Val) * (size_t)(e->args.len + 1));
    for (int i = 0; i < e->args.len; i++) {
        v.items[i] = fe_eval(L, e->args.data[i]);
        if (v.items[i].k == V_ERR)
            return ERRV;
    }
    return v;
}

/* ---- calls: tensor ops, numeric functions, blocks ---- */

/* Convert one keyword argument to an Attr of the kind the op expects. */
static Attr *kw_attr(Lower *L, const OpSpec *s, const KwSpec *kw, Expr *e)
{
    Arena *a = L->c->arena;
    if (kw->kind == K_DTYPE && e->kind == E_NAME && ir_dtype_lookup(e->name) >= 0)
        return ir_attr_str(a, kw->name, e->name);
    if (kw->kind == K_DTYPE && e->kind == E_NAME && !fe_lookup(L, e->name)) {
        fe_err(L, e->loc, "unknown dtype '%s'", e->name);
        fe_note(L, LOC_NONE, "the dtypes are f32, f64, bf16, f16 and i32");
        return NULL;
    }
    Val v = fe_eval(L, e);
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
            fe_err(L, e->loc, "'%s' of '%s' has more than %d entries", kw->name, s->name,
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
    fe_err(L, e->loc, "'%s' of '%s' must be %s, got %s", kw->name, s->name, want[kw->kind],
           fe_kind_name(v.k));
    return NULL;
}

/* A tensor keyword argument val, given at `at` (attention's mask and bias), into extra[*n],
 * its keyword's name into kws[*n]; -1 with an error when given twice or not
 * a tensor of the keyword's rank (the kernels tell the mask, [B, Sk], and
 * the bias, [H or 1, S, Sk], apart by it). */
static int tensor_kwarg(Lower *L, const OpSpec *s, const KwSpec *kw, Loc at, Expr *val, Value **extra,
                        const char **kws, int *n)
{
    Val v = fe_eval(L, val);
    int twice = 0, rank = strcmp(kw->name, "bias") ? 2 : 3;
    for (int j = 0; j < *n; j++)
        twice |= strcmp(kws[j], kw->name) == 0;
    if (v.k == V_ERR)
        return -1;
    if (twice || *n == 2) {
        fe_err(L, at, "argument '%s' of '%s' given twice", kw->name, s->name);
        return -1;
    }
    if (v.k != V_TENSOR) {
        fe_err(L, val->loc, "'%s' of '%s' must be a tensor, got %s", kw->name, s->name,
               fe_kind_name(v.k));
        return -1;
    }
    if (v.t->rank != rank) {
        fe_err(L, val->loc, "'%s' of '%s' must have rank %d (%s), got %s", kw->name, s->name, rank,
               rank == 2 ? "[B, Sk]" : "[H or 1, S, Sk]", fe_type_str(L, v.t));
        return -1;
    }
    kws[*n] = kw->name;
    extra[(*n)++] = v.t;
    return 0;
}

/* Sort the call's arguments into tensor operands and attrs, then emit. */
static Val call_op(Lower *L, const OpSpec *s, Expr *e)
{
    Value *t[64], *extra[2]; /* K_TENSOR arguments (attention's mask and bias) */
    const char *extra_kw[2];
    int nextra = 0;
    Attr *attrs[8];
    int nt = 0, na = 0, npos = 0, bad = 0;
    for (int i = 0; i < e->args.len; i++) {
        Expr *a = e->args.data[i];
        const KwSpec *kw = NULL;
        Expr *val = a;
        if (a->kind == E_KWARG) {
            kw = fe_find_kw(s, a->name);
            val = a->lhs;
            if (!kw) {
                char names[128];
                fe_kw_names(s, names, sizeof names);
                fe_err(L, a->loc, "unknown keyword argument '%s' for '%s'", a->name, s->name);
                if (names[0])
                    fe_note(L, e->loc, "'%s' takes %s", s->name, names);
                else
                    fe_note(L, e->loc, "'%s' takes no keyword arguments", s->name);
                bad = 1;
                continue;
            }
        } else if (a->kind == E_NAME && fe_find_kw(s, a->name) && fe_find_kw(s, a->name)->kind == K_BOOL &&
                   !fe_lookup(L, a->name)) {
            attrs[na++] = ir_attr_bool(L->c->arena, a->name, 1); /* a bare flag: causal */
            continue;
        } else if (nt < s->max_t && npos == nt) {
            Val v = fe_eval(L, a);
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
                fe_err(L, a->loc, "argument %d of '%s' must be a tensor, got %s", i + 1, s->name,
                       fe_kind_name(v.k));
                bad = 1;
                continue;
            }
        }
        if (!kw) {
            int k = npos++ - nt;
            if (k >= 6 || !s->kw[k].name) {
                fe_err(L, a->loc, "too many arguments for '%s'", s->name);
                bad = 1;
                continue;
            }
            kw = &s->kw[k];
        }
        for (int j = 0; j < na; j++)
            if (strcmp(attrs[j]->key, kw->name) == 0) {
                fe_err(L, a->loc, "argument '%s' of '%s' given twice", kw->name, s->name);
                bad = 1;
            }
        if (kw->kind == K_TENSOR) {
            bad |= tensor_kwarg(L, s, kw, a->loc, val, extra, extra_kw, &nextra) != 0;
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
        fe_err(L, e->loc, "'%s' needs %d tensor argument%s, got %d", s->name, s->min_t,
               s->min_t > 1 ? "s" : "", nt);
        return ERRV;
    }
    if (s->op == OP_ATTENTION) {
        if (nt == 2) {
            fe_err(L, e->loc, "'attention' takes q, k, v or one fused qkv tensor, got 2 tensors");
            return ERRV;
        }
        if (!ir_op_attr(&(Op){.attrs = attrs, .nattrs = na}, "heads")) {
            fe_err(L, e->loc, "'attention' needs 'heads'");
            return ERRV;
        }
        if (nt == 1 && fe_split_qkv(L, t, attrs, na, e->loc) != 0)
            return ERRV;
        nt = 3;
    }
    if (s->op == OP_SCATTER_ADD)
        return fe_call_scatter(L, t, e->loc);
    if (s->op == OP_DROPOUT)
        return fe_call_dropout(L, t[0], attrs, na, e->loc);
    for (int j = 0; j < nextra; j++)
        t[nt++] = extra[j];
    Value *r = fe_emit(L, s->op, t, nt, attrs, na, e->loc);
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
        fe_err(L, e->loc, "'where' takes 3 arguments (c, a, b), got %d", e->args.len);
        return ERRV;
    }
    for (int i = 0; i < 3; i++) {
        Expr *a = e->args.data[i];
        if (a->kind == E_KWARG) {
            fe_err(L, a->loc, "'where' takes no keyword arguments");
            return ERRV;
        }
        v[i] = fe_eval(L, a);
        if (v[i].k == V_ERR)
            return ERRV;
        if (v[i].k != V_TENSOR && (i == 0 || !is_num(v[i]))) {
            fe_err(L, a->loc, "argument %d of 'where' must be a tensor%s, got %s", i + 1,
                   i ? " or a number" : "", fe_kind_name(v[i].k));
            return ERRV;
        }
    }
    Value *t = v[1].k == V_TENSOR ? v[1].t : v[2].k == V_TENSOR ? v[2].t : v[0].t;
    if (!ir_dtype_is_float(t->dtype) && (is_num(v[1]) || is_num(v[2]))) {
        fe_err(L, e->loc, "'where' cannot mix a number with an %s tensor", ir_dtype_name(t->dtype));
        return ERRV;
    }
    Value *args[3] = {v[0].t, as_tensor(L, v[1], t->dtype, e->loc),
                      as_tensor(L, v[2], t->dtype, e->loc)};
    if (!args[1] || !args[2])
        return ERRV;
    return vtensor(fe_emit(L, OP_WHERE, args, 3, NULL, 0, e->loc));
}

/* sqrt, exp and log of a number fold to a number; of a tensor they are ops.
 * Returns 1 and sets *out when it handled the call (one positional argument). */
static int call_math(Lower *L, Expr *e, Val *out)
{
    if (e->args.len != 1 || e->args.data[0]->kind == E_KWARG)
        return 0;
    Val v = fe_eval(L, e->args.data[0]);
    if (v.k == V_TENSOR) {
        *out = vtensor(fe_emit(L, fe_find_spec(e->name)->op, &v.t, 1, NULL, 0, e->loc));
        return 1;
    }
    *out = ERRV;
    if (v.k == V_ERR)
        return 1;
    if (!is_num(v)) {
        fe_err(L, e->loc, "'%s' needs a number or a tensor, got %s", e->name, fe_kind_name(v.k));
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
        fe_err(L, e->loc, "'%s' of %g is not a real number", e->name, x);
    return 1;
}

Stmt *fe_find_block(Lower *L, const char *name)
{
    for (int i = 0; i < L->blocks.len; i++)
        if (L->blocks.data[i]->name == name)
            return L->blocks.data[i];
    return NULL;
}

static Val eval_call(Lower *L, Expr *e)
{
    int is_math = !strcmp(e->name, "sqrt") || !strcmp(e->name, "exp") || !strcmp(e->name, "log");
    Val v;
    if (is_math && !fe_lookup(L, e->name) && call_math(L, e, &v))
        return v;
    Stmt *blk = fe_find_block(L, e->name);
    if (blk)
        return L->call_block(L, blk, e);
    const OpSpec *s = fe_find_spec(e->name);
    if (s && s->op == OP_WHERE)
        return call_where(L, e);
    if (s)
        return call_op(L, s, e);
    fe_err(L, e->loc, "unknown function '%s'", e->name);
    return ERRV;
}

Val fe_eval(Lower *L, Expr *e)
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
        fe_err(L, e->loc, "'%s = ...' is only allowed as a call argument", e->name);
        return ERRV;
    }
    UNREACHABLE();
}

/* An integer expression (shape, count); -1 with an error when it is not one. */
int fe_eval_int(Lower *L, Expr *e, const char *what, int64_t *out)
{
    Val v = fe_eval(L, e);
    if (v.k == V_ERR)
        return -1;
    if (v.k == V_FLOAT && v.f == floor(v.f) && fabs(v.f) < 9e15)
        v = vint((int64_t)v.f);
    if (v.k != V_INT) {
        if (v.k == V_FLOAT)
            fe_err(L, e->loc, "%s must be an integer, got %g", what, v.f);
        else
            fe_err(L, e->loc, "%s must be an integer, got %s", what, fe_kind_name(v.k));
        return -1;
    }
    *out = v.i;
    return 0;
}
