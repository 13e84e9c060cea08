/* lower.c: checks a TDL Ast and lowers it to the forward Graph in one walk.
 * Reads the Ast, the -D defines and the --mesh text; writes Values and Ops.
 * Key idea: expressions are evaluated, not translated (lower_expr.c): tensor
 * expressions emit ops whose shapes come from ir_infer, the one table of
 * shape rules. Here are the walk and its statements: blocks are expanded at
 * each call and repeats unrolled, so the Graph has no control flow. An error
 * yields an error value that silences follow-on errors, and the walk goes on.
 * The other files of the walk are listed in lower_impl.h. */
#include "lower_impl.h"

#include <string.h>

enum { MAX_REPEAT = 100000, MAX_CALL_DEPTH = 64 };

/* ---- statements ---- */

static void lower_items(Lower *L, Stmt *holder, int top);
static void lower_if(Lower *L, Stmt *s);

/* name = v: rebinding walks out to the enclosing block or model scope. */
static void assign(Lower *L, const char *name, Loc loc, Val v)
{
    if (v.k == V_TENSOR && !v.t->name && v.t->def->kind != OP_PARAM && v.t->def->kind != OP_INPUT)
        v.t->name = name;
    for (Scope *sc = L->scope; sc; sc = sc->boundary ? NULL : sc->parent) {
        Binding *b = fe_scope_find_local(sc, name);
        if (!b)
            continue;
        if (b->kind == B_MODEL || b->kind == B_PARAM || b->kind == B_INDEX) {
            static const char *what[] = {"value", "model parameter", "parameter", "input",
                                         "repeat index"};
            fe_err(L, loc, "cannot assign to %s '%s'", what[b->kind], name);
            fe_note(L, b->loc, "'%s' is declared here", name);
            return;
        }
        b->val = v;
        return;
    }
    if (fe_lookup(L, name) && fe_lookup(L, name)->kind == B_MODEL) {
        fe_err(L, loc, "cannot assign to model parameter '%s'", name);
        fe_note(L, fe_lookup(L, name)->loc, "'%s' is declared here", name);
        return;
    }
    fe_bind(L, L->scope, name, B_VALUE, v, loc);
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
                fe_err(L, s->param_locs.data[i], "'%s' is assigned twice in one statement", a);
                return;
            }
    }
    if (v.k == V_ERR)
        return;
    if (v.k != V_LIST || v.n != n) {
        if (v.k == V_LIST)
            fe_err(L, s->value->loc, "%d names are assigned %d value%s", n, v.n, v.n == 1 ? "" : "s");
        else
            fe_err(L, s->value->loc, "%d names are assigned one value (%s); a block returns several "
                                  "with 'return x, y'",
                   n, fe_kind_name(v.k));
        return;
    }
    for (int i = 0; i < n; i++)
        assign(L, i ? s->params.data[i - 1] : s->name, i ? s->param_locs.data[i - 1] : s->name_loc,
               v.items[i]);
}

static void lower_assign(Lower *L, Stmt *s)
{
    Val v = fe_eval(L, s->value);
    if (s->params.len) {
        assign_several(L, s, v);
        return;
    }
    if (s->type)
        v = fe_annotate(L, s, v);
    assign(L, s->name, s->name_loc, v);
}

static void lower_repeat(Lower *L, Stmt *s)
{
    int64_t n;
    if (fe_eval_int(L, s->value, "a repeat count", &n) != 0)
        return;
    if (n < 0 || n > MAX_REPEAT) {
        fe_err(L, s->value->loc, "repeat count %lld is out of range 0..%d", (long long)n, MAX_REPEAT);
        return;
    }
    if (L->fo.repeat_limit > 0 && n > L->fo.repeat_limit)
        n = L->fo.repeat_limit;
    const char *name = s->str ? s->str : "layers";
    const Binding *shadow = s->index ? fe_lookup(L, s->index) : NULL;
    if (shadow && shadow->kind != B_VALUE) { /* a value of the enclosing scope may be shadowed */
        static const char *what[] = {"a value", "a model parameter", "a parameter", "an input",
                                     "the index of an enclosing repeat"};
        fe_err(L, s->index_loc, "the repeat index '%s' is already %s", s->index, what[shadow->kind]);
        fe_note(L, shadow->loc, "'%s' is declared here", s->index);
        return;
    }
    Scope *saved = L->scope;
    const char *saved_prefix = L->prefix;
    int saved_layer = L->layer, errors = L->c->diag.nerrors;
    for (int64_t i = 0; i < n && L->c->diag.nerrors == errors; i++) {
        if (++L->unrolled > MAX_REPEAT) { /* nested repeats of empty bodies add no ops */
            fe_err(L, s->value->loc, "the repeats unroll into more than %d layers", MAX_REPEAT);
            break;
        }
        L->scope = fe_scope_new(L, saved, 0);
        if (s->index) /* the copy's number, 0 .. n-1: an integer like a model parameter */
            fe_bind(L, L->scope, s->index, B_INDEX, vint(i), s->index_loc);
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
        fe_err(L, e->loc, "block '%s' takes %d argument%s, got %d", blk->name, blk->params.len,
               blk->params.len == 1 ? "" : "s", e->args.len);
        fe_note(L, blk->name_loc, "'%s' is defined here", blk->name);
        return ERRV;
    }
    if (L->depth >= MAX_CALL_DEPTH) {
        fe_err(L, e->loc, "block calls nest deeper than %d (is '%s' recursive?)", MAX_CALL_DEPTH,
               blk->name);
        return ERRV;
    }
    Scope *sc = fe_scope_new(L, L->root, 1);
    for (int i = 0; i < e->args.len; i++) {
        Expr *a = e->args.data[i];
        if (a->kind == E_KWARG) {
            fe_err(L, a->loc, "blocks take positional arguments only");
            return ERRV;
        }
        Val v = fe_eval(L, a);
        if (v.k == V_ERR)
            return ERRV;
        fe_bind(L, sc, blk->params.data[i], B_VALUE, v, blk->param_locs.data[i]);
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
        v = fe_eval(L, ret->value);
    L->depth--;
    L->scope = saved;
    L->prefix = saved_prefix;
    return v;
}

static void lower_output(Lower *L, Stmt *s)
{
    Binding *b = fe_lookup(L, s->name);
    if (!b) {
        fe_err(L, s->name_loc, "use of undefined name '%s'", s->name);
        return;
    }
    if (b->val.k == V_TENSOR)
        VEC_PUSH(L->c->arena, L->g->outputs, b->val.t);
    else if (b->val.k != V_ERR)
        fe_err(L, s->name_loc, "output '%s' must be a tensor, not %s", s->name,
               fe_kind_name(b->val.k));
}

static void lower_stmt(Lower *L, Stmt *s, const Stmt *holder, int top, int last)
{
    static const char *names[] = {"model", "mesh", "axis", "input", "param", "assign",
                                  "repeat", "block", "return", "train", "output", "if"};
    switch (s->kind) {
    case S_INPUT:
        if (top)
            fe_lower_input(L, s);
        else
            fe_err(L, s->loc, "'input' is only allowed at the top level");
        return;
    case S_PARAM: fe_lower_param(L, s); return;
    case S_ASSIGN: lower_assign(L, s); return;
    case S_REPEAT: lower_repeat(L, s); return;
    case S_IF: lower_if(L, s); return;
    case S_MODEL:
    case S_MESH:
    case S_BLOCK:
    case S_TRAIN:
    case S_OUTPUT:
        if (top) {
            if (s->kind == S_TRAIN)
                fe_lower_train(L, s);
            if (s->kind == S_OUTPUT)
                lower_output(L, s);
            return; /* model, mesh and blocks were handled first */
        }
        fe_err(L, s->loc, "'%s' is only allowed at the top level", names[s->kind]);
        return;
    case S_RETURN:
        if (holder->kind != S_BLOCK || !last)
            fe_err(L, s->loc, "'return' must be the last statement of a block");
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

/* if COND { ... } else { ... }: COND is known when the model is lowered (a
 * comparison of integers: a repeat's index, model parameters), and only the
 * branch it chooses is lowered, in the enclosing scope (what it binds is
 * bound after it). A repeat whose copies choose differently is still one
 * run of layers. */
static void lower_if(Lower *L, Stmt *s)
{
    for (; s; s = s->orelse && s->orelse->kind == S_IF ? s->orelse : NULL) {
        Val c = fe_eval(L, s->value);
        if (c.k == V_ERR)
            return;
        if (c.k != V_BOOL) {
            fe_err(L, s->value->loc, "the condition of 'if' must be a flag known when the model "
                   "is lowered (a comparison of integers, such as i %% 2 == 0), got %s",
                   fe_kind_name(c.k));
            return;
        }
        if (c.i) {
            lower_items(L, s, 0);
            return;
        }
        if (s->orelse && s->orelse->kind != S_IF) {
            lower_items(L, s->orelse, 0);
            return;
        }
    }
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
            fe_err(L, s->loc, "more than one 'model' declaration");
            fe_note(L, model->loc, "the first is here");
        } else if (s->kind == S_MODEL) {
            model = s;
        } else if (s->kind == S_MESH) {
            if (mesh) {
                fe_err(L, s->loc, "more than one 'mesh' declaration");
                fe_note(L, mesh->loc, "the first is here");
            }
            mesh = mesh ? mesh : s;
        } else if (s->kind == S_BLOCK) {
            Stmt *old = fe_find_block(L, s->name);
            if (fe_digit_led(L, s->name, s->name_loc))
                continue;
            if (old || fe_find_spec(s->name)) {
                fe_err(L, s->name_loc, "duplicate name '%s'", s->name);
                if (old)
                    fe_note(L, old->name_loc, "'%s' was first defined here", s->name);
                continue;
            }
            for (int a = 0; a < s->params.len; a++)
                for (int b = 0; b < a; b++)
                    if (s->params.data[a] == s->params.data[b]) {
                        fe_err(L, s->param_locs.data[a], "duplicate name '%s'", s->params.data[a]);
                        fe_note(L, s->param_locs.data[b], "'%s' was first defined here",
                                s->params.data[b]);
                    }
            if (!s->body.len || s->body.data[s->body.len - 1]->kind != S_RETURN)
                fe_err(L, s->name_loc, "block '%s' must end with 'return'", s->name);
            VEC_PUSH(L->c->arena, L->blocks, s);
        }
    }
    if (model)
        fe_lower_model(L, model);
    fe_check_defines(L, model);
    if (mesh)
        fe_lower_mesh(L, mesh);
    if (L->fo.mesh)
        fe_bind_mesh(L);
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
    Binding *b = fe_scope_find_local(L->scope, intern(L->c->strings, "loss"));
    if (b && b->val.k == V_TENSOR)
        VEC_PUSH(L->c->arena, L->g->outputs, b->val.t);
    else if (b && b->val.k != V_ERR)
        fe_err(L, b->loc, "the output 'loss' must be a tensor, not %s", fe_kind_name(b->val.k));
    else if (!b)
        fe_err(L, LOC_NONE, "%s: the model has no output: assign 'loss' or add 'output NAME'",
               L->ast->file);
}

Graph *fe_lower(Ctx *c, Ast *ast, const FeOptions *fo)
{
    int errors = c->diag.nerrors;
    Lower L = {.c = c, .ast = ast, .prefix = "", .layer = -1, .call_block = call_block,
               .fo = fo ? *fo : (FeOptions){0}};
    L.g = ir_graph_new(c->arena, c->strings, NULL);
    L.root = fe_scope_new(&L, NULL, 1);
    L.scope = L.root;
    L.model_loc = (Loc){ast->file, 1, 1};
    L.g->name = base_name(&L, ast->file); /* a model statement renames it */
    lower_headers(&L);
    L.scope = fe_scope_new(&L, L.root, 1);
    lower_items(&L, &(Stmt){.body.data = ast->items.data, .body.len = ast->items.len}, 1);
    param_layers(L.g);
    if (!L.too_big)
        find_outputs(&L);
    return c->diag.nerrors == errors ? L.g : NULL;
}

Graph *fe_compile(Ctx *c, const char *path, const char *text, size_t len, const FeOptions *fo)
{
    Ast *ast = fe_parse(c, path, text, len);
    return ast ? fe_lower(c, ast, fo) : NULL;
}
