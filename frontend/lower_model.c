/* lower_model.c: the model header, the mesh declaration and --mesh.
 * Reads the model's parameters, the -D defines (Ctx.defines) and the --mesh
 * text (FeOptions.mesh); writes the root scope's bindings, Graph.config and
 * Graph.mesh. Key idea: a model parameter is an integer or a float by how
 * its default is written; -D replaces the default; --mesh gives the sizes of
 * the declared axes, by position or by name (then also their order). */
#include "lower_impl.h"

#include <stdlib.h>
#include <string.h>

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
        const Binding *b = fe_lookup(L, e->name);
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
        fe_err(L, p->name_loc, "-D %s=%g: '%s' is an integer parameter", d->name, d->fvalue,
               p->name);
        return ERRV;
    }
    if (!fl)
        return fe_eval_int(L, p->value, "a model parameter", &i) == 0 ? vint(i) : ERRV;
    Val v = fe_eval(L, p->value);
    if (v.k == V_INT)
        return vfloat((double)v.i);
    if (v.k != V_FLOAT && v.k != V_ERR)
        fe_err(L, p->value->loc, "a model parameter must be a number, got %s", fe_kind_name(v.k));
    return v.k == V_FLOAT ? v : ERRV;
}

void fe_lower_model(Lower *L, Stmt *s)
{
    L->g->name = s->name;
    L->model_loc = s->loc;
    L->scope = L->root;
    for (int i = 0; i < s->body.len; i++) {
        Stmt *p = s->body.data[i];
        if (fe_check_fresh(L, p->name, p->name_loc) != 0)
            continue;
        Val v = model_param(L, p, find_define(L->c, p->name));
        fe_bind(L, L->root, p->name, B_MODEL, v, p->name_loc);
        if (v.k == V_INT)
            VEC_PUSH(L->c->arena, L->g->config, ir_attr_int(L->c->arena, p->name, v.i));
        else if (v.k == V_FLOAT)
            VEC_PUSH(L->c->arena, L->g->config, ir_attr_float(L->c->arena, p->name, v.f));
    }
}

void fe_check_defines(Lower *L, Stmt *model)
{
    for (int i = 0; i < L->c->defines.len; i++) {
        Define *d = &L->c->defines.data[i];
        if (d->used)
            continue;
        fe_err(L, LOC_NONE, "-D %s: model '%s' has no parameter '%s'", d->name, L->g->name,
               d->name);
        if (model)
            fe_note(L, model->name_loc, "the parameters are declared here");
    }
}

void fe_lower_mesh(Lower *L, Stmt *s)
{
    Mesh *m = &L->g->mesh;
    for (int i = 0; i < s->body.len; i++) {
        Stmt *a = s->body.data[i];
        int role = ir_role_lookup(a->str);
        int dup = ir_mesh_axis(m, a->name);
        if (fe_digit_led(L, a->name, a->name_loc)) {
        } else if (dup >= 0) {
            fe_err(L, a->name_loc, "duplicate mesh axis '%s'", a->name);
            fe_note(L, m->axes[dup].loc, "'%s' was first declared here", a->name);
        } else if (role < 0) {
            fe_err(L, a->str_loc, "unknown mesh axis role '%s'", a->str);
            fe_note(L, LOC_NONE, "the roles are data, fsdp, tensor, sequence and pipeline");
        } else if (m->naxes == IR_MAX_AXES) {
            fe_err(L, a->name_loc, "more than %d mesh axes", IR_MAX_AXES);
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

/* By name, the axes take the order given (axes not named stay first); the
 * devices' placement is the plan's (codegen/placement.c: the tensor axis
 * innermost, then by traffic), which this order decides only in ties. */
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

/* "8x4x2" binds sizes in declaration order; "dp=8,tp=4" binds by name, in
 * that order (order_mesh). */
void fe_bind_mesh(Lower *L)
{
    const char *spec = L->fo.mesh, *p = spec;
    Mesh *m = &L->g->mesh;
    int by_name = strchr(spec, '=') != NULL, n = 0, seen[IR_MAX_AXES] = {0}, order[IR_MAX_AXES];
    const char *sep = strchr(spec, ',') || by_name ? "," : "x";
    if (!*spec || spec[strlen(spec) - 1] == *sep || strchr(spec, ' ')) {
        fe_err(L, LOC_NONE, "--mesh '%s': expected sizes like 8x4x2 or names like dp=8,tp=4", spec);
        return;
    }
    while (*p) {
        int ax = n, size;
        if (by_name) {
            const char *eq = strchr(p, '='), *comma = strchr(p, ',');
            if (!eq || (comma && comma < eq)) {
                fe_err(L, LOC_NONE, "--mesh %s: expected NAME=SIZE, got '%.*s'", spec,
                       (int)(comma ? comma - p : (long)strlen(p)), p);
                return;
            }
            const char *name = eq ? intern_n(L->c->strings, p, (size_t)(eq - p)) : "";
            ax = eq ? ir_mesh_axis(m, name) : -1;
            if (ax < 0) {
                fe_err(L, LOC_NONE, "--mesh %s: the model declares no mesh axis '%s'", spec, name);
                goto declared;
            }
            p = eq + 1;
        } else if (n >= m->naxes) {
            fe_err(L, LOC_NONE, "--mesh %s gives more sizes than the model's %d mesh axes", spec,
                   m->naxes);
            goto declared;
        }
        if (parse_size(p, &p, &size) != 0 || (*p && *p != (by_name ? ',' : 'x'))) {
            fe_err(L, LOC_NONE, "--mesh %s: expected sizes 1..65536 like 8x4x2 or dp=8,tp=4", spec);
            return;
        }
        if (seen[ax]++) {
            fe_err(L, LOC_NONE, "--mesh %s: axis '%s' given twice", spec, m->axes[ax].name);
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
        fe_note(L, m->axes[0].loc, "the mesh axes are declared here");
    else
        fe_note(L, L->model_loc, "the model declares no mesh axes");
}
