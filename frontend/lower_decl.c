/* lower_decl.c: the declarations of TDL: inputs, parameters and values
 * annotated with a type. Reads a TypeAst (dtype, dimensions, mesh axes);
 * writes input and param ops, bindings, and shardings.
 * Key idea: a declared type is evaluated like an expression (its sizes are
 * integer expressions) and checked against the mesh: each dimension's axes
 * must exist, be used once, and divide its size. */
#include "lower_impl.h"

#include <string.h>

#define MAX_DIM (INT64_C(1) << 40)

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
    fe_note(L, LOC_NONE, "the mesh is %s", buf);
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
            fe_err(L, loc, "unknown mesh axis '%s'", name);
            if (L->g->mesh.naxes)
                fe_note(L, L->g->mesh.axes[0].loc, "the mesh axes are declared here");
            else
                fe_note(L, L->model_loc, "the model declares no mesh axes");
            bad = 1;
            continue;
        }
        for (int p = 0; p < IR_MAX_RANK; p++)
            for (int q = 0; q < sh->naxes[p]; q++)
                if (sh->axes[p][q] == ax) {
                    fe_err(L, loc, "mesh axis '%s' is used twice in one sharding", name);
                    bad = 1;
                }
        for (int q = 0; q < j && bad; q++)
            if (d->axes.data[q] == name)
                fe_note(L, d->axis_locs.data[q], "first used here");
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
    fe_err(L, d->size->loc,
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
        fe_err(L, ty->dtype_loc, "unknown dtype '%s'", ty->dtype);
        fe_note(L, LOC_NONE, "the dtypes are f32, f64, bf16, f16 and i32");
        bad = 1;
    }
    *dt = t < 0 ? DT_F32 : (DType)t;
    if (ty->dims.len > IR_MAX_RANK) {
        fe_err(L, ty->loc, "'%s' has %d dimensions; at most %d are supported", what, ty->dims.len,
               IR_MAX_RANK);
        return -1;
    }
    *rank = ty->dims.len;
    for (int i = 0; i < ty->dims.len; i++) {
        DimAst *d = ty->dims.data[i];
        if (fe_eval_int(L, d->size, "a dimension", &shape[i]) != 0) {
            bad = 1;
            continue;
        }
        if (shape[i] < 1 || shape[i] > MAX_DIM) {
            fe_err(L, d->size->loc, "dimension %d of '%s' has size %lld; sizes must be in 1..2^40",
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

/* ---- declarations ---- */

void fe_lower_input(Lower *L, Stmt *s)
{
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    Sharding sh;
    if (fe_check_fresh(L, s->name, s->name_loc) != 0)
        return;
    Val v = ERRV;
    if (lower_type(L, s->type, s->name, &dt, &rank, shape, &sh) == 0) {
        Op *op = ir_op_new(L->g, OP_INPUT, NULL, 0, s->loc);
        op->layer = fe_op_layer(L);
        Value *t = ir_op_result(L->g, op, dt, rank, shape);
        t->name = s->name;
        t->shard = sh;
        v = vtensor(t);
    }
    fe_bind(L, L->scope, s->name, B_INPUT, v, s->name_loc);
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
            fe_err(L, e->loc, "'%s' takes one argument, '%s'", fns[i], keys[i]);
            return NULL;
        }
        Val v = fe_eval(L, arg);
        if (v.k == V_ERR)
            return NULL;
        if (!is_num(v) || (i < 2 && num(v) < 0)) {
            fe_err(L, arg->loc, "'%s' of '%s' must be a %snumber", keys[i], fns[i],
                   i < 2 ? "non-negative " : "");
            return NULL;
        }
        Attr *item = ir_attr_float(a, keys[i], num(v));
        return ir_attr_call(a, "init", fns[i], &item, 1);
    }
    fe_err(L, e->loc, "unknown initializer; use zeros, ones, normal(std), uniform(a) or constant(v)");
    return NULL;
}

static int check_param_name(Lower *L, const char *full, Loc loc)
{
    for (int i = 0; i < L->param_names.len; i++) {
        if (L->param_names.data[i] == full) {
            fe_err(L, loc, "duplicate parameter '%s'", full);
            fe_note(L, L->param_locs.data[i], "'%s' was first declared here", full);
            return -1;
        }
    }
    VEC_PUSH(L->c->arena, L->param_names, full);
    VEC_PUSH(L->c->arena, L->param_locs, loc);
    return 0;
}

void fe_lower_param(Lower *L, Stmt *s)
{
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    Sharding sh;
    if (fe_check_fresh(L, s->name, s->name_loc) != 0)
        return;
    const char *full = intern(L->c->strings, arena_printf(L->c->arena, "%s%s", L->prefix, s->name));
    int bad = check_param_name(L, full, s->name_loc);
    bad |= lower_type(L, s->type, full, &dt, &rank, shape, &sh);
    Attr *init = lower_init(L, s->value);
    Val v = ERRV;
    if (!bad && init) {
        if (!ir_dtype_is_float(dt)) {
            fe_err(L, s->type->dtype_loc, "parameter '%s' must have a float dtype, not %s", full,
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
    fe_bind(L, L->scope, s->name, B_PARAM, v, s->name_loc);
}

/* x : f32[B@dp, D] = expr : the value must have the declared type; its
 * sharding becomes the annotated one. */
Val fe_annotate(Lower *L, Stmt *s, Val v)
{
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    Sharding sh;
    if (lower_type(L, s->type, s->name, &dt, &rank, shape, &sh) != 0 || v.k == V_ERR)
        return ERRV;
    if (v.k != V_TENSOR) {
        fe_err(L, s->type->loc, "'%s' is declared a tensor but its value is %s", s->name,
               fe_kind_name(v.k));
        return ERRV;
    }
    char want[160];
    ir_type_str(want, sizeof want, dt, rank, shape);
    if (v.t->dtype != dt) {
        fe_err(L, s->type->dtype_loc, "dtype mismatch: '%s' is declared %s but its value is %s",
               s->name, ir_dtype_name(dt), ir_dtype_name(v.t->dtype));
        fe_note(L, s->value->loc, "the value is %s", fe_type_str(L, v.t));
        return ERRV;
    }
    if (v.t->rank != rank || memcmp(v.t->shape, shape, sizeof(int64_t) * (size_t)rank) != 0) {
        fe_err(L, s->type->loc, "shape mismatch: '%s' is declared %s but its value is %s", s->name,
               want, fe_type_str(L, v.t));
        fe_note(L, s->value->loc, "the value is computed here");
        return ERRV;
    }
    OpKind dk = v.t->def->kind;
    if (dk == OP_INPUT || dk == OP_PARAM || !ir_shard_is_replicated(&v.t->shard, v.t->rank)) {
        /* keep the other value's sharding: a new value (an identity reshape)
         * carries this one, and the partitioner moves data between them */
        Attr *a = ir_attr_ints(L->c->arena, "shape", v.t->shape, v.t->rank);
        v = vtensor(fe_emit(L, OP_RESHAPE, &v.t, 1, &a, 1, s->type->loc));
        if (v.k != V_TENSOR)
            return ERRV;
    }
    v.t->shard = sh;
    return v;
}
