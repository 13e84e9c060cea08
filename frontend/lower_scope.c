/* lower_scope.c: the diagnostics and the scopes of names of lowering.
 * Reads the Lower state; writes diagnostics and bindings (in the arena).
 * Key idea: a scope is a list of bindings with a parent; name lookup walks
 * out through the parents, and a boundary scope (a block call's, the model's)
 * is where assignment stops looking (lower.c's assign). */
#include "lower_impl.h"

void fe_err(Lower *L, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(&L->c->diag, SEV_ERROR, loc, 1, fmt, ap);
    va_end(ap);
}

void fe_note(Lower *L, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(&L->c->diag, SEV_NOTE, loc, 1, fmt, ap);
    va_end(ap);
}

const char *fe_type_str(Lower *L, const Value *v)
{
    char buf[160];
    ir_type_str(buf, sizeof buf, v->dtype, v->rank, v->shape);
    return arena_strdup(L->c->arena, buf);
}

/* The kind of a value with its article: "an integer", "a tensor". */
const char *fe_kind_name(VKind k)
{
    static const char *names[] = {"an error", "an integer", "a number", "a flag",
                                  "a string",  "a tensor",   "a list"};
    return names[k];
}

/* ---- scopes ---- */

Scope *fe_scope_new(Lower *L, Scope *parent, int boundary)
{
    Scope *s = arena_alloc(L->c->arena, sizeof(Scope));
    s->parent = parent;
    s->boundary = boundary;
    return s;
}

Binding *fe_scope_find_local(Scope *s, const char *name)
{
    for (int i = 0; i < s->b.len; i++)
        if (s->b.data[i].name == name)
            return &s->b.data[i];
    return NULL;
}

Binding *fe_lookup(Lower *L, const char *name)
{
    for (Scope *s = L->scope; s; s = s->parent) {
        Binding *b = fe_scope_find_local(s, name);
        if (b)
            return b;
    }
    return NULL;
}

/* A digit-led token (`3D`, `1f1b`) is a name only as a training setting's
 * value: declared, it would make a graph whose IR does not read back. */
int fe_digit_led(Lower *L, const char *name, Loc loc)
{
    if (!name || name[0] < '0' || name[0] > '9')
        return 0;
    fe_err(L, loc, "'%s' is not a name: a name starts with a letter or '_'", name);
    return 1;
}

void fe_bind(Lower *L, Scope *s, const char *name, BindKind kind, Val v, Loc loc)
{
    fe_digit_led(L, name, loc);
    Binding b = {name, kind, v, loc};
    VEC_PUSH(L->c->arena, s->b, b);
}

int fe_check_fresh(Lower *L, const char *name, Loc loc)
{
    Binding *b = fe_scope_find_local(L->scope, name);
    Binding *m = L->scope != L->root ? fe_scope_find_local(L->root, name) : NULL;
    if (!b && m) {
        fe_err(L, loc, "'%s' is a model parameter", name);
        fe_note(L, m->loc, "'%s' is declared here", name);
        return -1;
    }
    if (!b)
        return 0;
    fe_err(L, loc, "duplicate name '%s'", name);
    fe_note(L, b->loc, "'%s' was first defined here", name);
    return -1;
}
