/* settings.c: the command line's train settings into the graph's train
 * block. Reads --set KEY=VALUE (a value as the train block spells it), the
 * flags that stand for train settings (--zero, --schedule, ...) and --role;
 * writes them into Graph.train and the mesh's roles, each checked as the
 * block's own settings are (ir_train_set). */
#include "driver/driver.h"

#include <stdlib.h>
#include <string.h>

/* --place AXIS,AXIS,...: every axis of the mesh of more than one device
 * once, innermost first; the axes of one device after them. */
static int set_place(Graph *g, const char *list)
{
    const char *at = list;
    int n = 0, seen = 0, bad = 0;
    while (*at && n < g->mesh.naxes) {
        size_t len = strcspn(at, ",");
        int ax = -1;
        for (int k = 0; k < g->mesh.naxes; k++)
            if (strlen(g->mesh.axes[k].name) == len && !strncmp(g->mesh.axes[k].name, at, len))
                ax = k;
        if (ax < 0 || (seen >> ax & 1))
            break;
        seen |= 1 << ax;
        g->mesh.place[n++] = (int8_t)ax;
        at += len + (at[len] == ',');
    }
    for (int k = 0; k < g->mesh.naxes; k++)
        if (!(seen >> k & 1)) {
            bad |= g->mesh.axes[k].size > 1;
            g->mesh.place[n++] = (int8_t)k;
        }
    size_t len = strlen(list);
    if (*at || bad || !len || list[len - 1] == ',') {
        fprintf(stderr, "tcc: error: --place %s: expected each axis of the mesh with more than one "
                        "device once, innermost first (", list);
        for (int k = 0, m = 0; k < g->mesh.naxes; k++)
            if (g->mesh.axes[k].size > 1)
                fprintf(stderr, "%s%s", m++ ? ", " : "", g->mesh.axes[k].name);
        fprintf(stderr, ")\n");
        g->mesh.nplace = 0;
        return -1;
    }
    g->mesh.nplace = n;
    return 0;
}

/* The train-block settings and axis roles given on the command line. */
void drv_set_train(Graph *g, Attr *a)
{
    for (int i = 0; i < g->train.len; i++)
        if (g->train.data[i]->key && !strcmp(g->train.data[i]->key, a->key)) {
            g->train.data[i] = a;
            return;
        }
    VEC_PUSH(g->arena, g->train, a);
}

/* ---- --set KEY=VALUE: a value as the train block spells it ---- */

typedef struct SetText {
    Graph *g;
    const char *p;
} SetText;

static void set_space(SetText *t)
{
    while (*t->p == ' ')
        t->p++;
}

static Attr *set_value(SetText *t, const char *key);

/* ITEM {, ITEM} up to close; ITEM: [NAME =] VALUE. */
static int set_items(SetText *t, char close, Attr ***items, int *n)
{
    VEC(Attr *) v = {0};
    set_space(t);
    while (*t->p && *t->p != close) {
        const char *key = NULL, *q = t->p;
        while (*q == '_' || (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
               (*q >= '0' && *q <= '9'))
            q++;
        if (q > t->p && q[*q == ' '] == '=') {
            key = intern_n(t->g->strings, t->p, (size_t)(q - t->p));
            t->p = q + (*q == ' ') + 1;
        }
        Attr *a = set_value(t, key);
        if (!a)
            return -1;
        VEC_PUSH(t->g->arena, v, a);
        set_space(t);
        if (*t->p == ',')
            t->p++, set_space(t);
        else if (*t->p != close)
            return -1;
    }
    if (*t->p++ != close)
        return -1;
    *items = v.data, *n = v.len;
    return 0;
}

static Attr *set_value(SetText *t, const char *key)
{
    Arena *a = t->g->arena;
    Attr **items = NULL;
    int n = 0;
    set_space(t);
    if (*t->p == '(')
        return t->p++, set_items(t, ')', &items, &n) ? NULL : ir_attr_list(a, key, items, n);
    char *end;
    long long i = strtoll(t->p, &end, 10);
    if (end > t->p && strchr(",) ", *end)) /* (strchr finds the NUL too) */
        return t->p = end, ir_attr_int(a, key, i);
    double x = strtod(t->p, &end);
    if (end > t->p && strchr(",) ", *end))
        return t->p = end, ir_attr_float(a, key, x);
    const char *q = t->p;
    while (*q == '_' || *q == '-' || (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
           (*q >= '0' && *q <= '9'))
        q++;
    if (q == t->p)
        return NULL;
    const char *name = intern_n(t->g->strings, t->p, (size_t)(q - t->p));
    t->p = q;
    if (!strcmp(name, "true") || !strcmp(name, "false"))
        return ir_attr_bool(a, key, name[0] == 't');
    if (*t->p != '(')
        return ir_attr_str(a, key, name);
    t->p++;
    return set_items(t, ')', &items, &n) ? NULL : ir_attr_call(a, key, name, items, n);
}

/* --set KEY=VALUE into the train block, checked as the block's own settings are. */
static int apply_set(Graph *g, const char *text)
{
    const char *eq = strchr(text, '=');
    TrainConfig tc;
    char err[256];
    if (!eq || eq == text) {
        fprintf(stderr, "tcc: error: --set %s: expected KEY=VALUE\n", text);
        return -1;
    }
    SetText t = {g, eq + 1};
    Attr *a = set_value(&t, intern_n(g->strings, text, (size_t)(eq - text)));
    if (a)
        set_space(&t);
    if (!a || *t.p) {
        fprintf(stderr, "tcc: error: --set %s: cannot read the value '%s'\n", text, eq + 1);
        return -1;
    }
    ir_train_defaults(&tc);
    if (ir_train_set(&tc, a, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: --set %s: %s\n", text, err);
        return -1;
    }
    drv_set_train(g, a);
    return 0;
}

int drv_apply_settings(Ctx *c, const Options *o, Graph *g)
{
    for (int i = 0; i < o->nsets; i++)
        if (apply_set(g, o->sets[i]) != 0)
            return -1;
    if (o->verify && !o->verify_native) /* both of --verify's plans: float64 unless native */
        drv_set_train(g, ir_attr_str(g->arena, intern(g->strings, "precision"), "f64"));
    if (o->microbatches > 0)
        drv_set_train(g, ir_attr_int(g->arena, intern(g->strings, "microbatches"), o->microbatches));
    if (o->recompute)
        drv_set_train(g, ir_attr_str(g->arena, intern(g->strings, "recompute"), o->recompute));
    if (o->zero >= 0)
        drv_set_train(g, ir_attr_int(g->arena, intern(g->strings, "zero"), o->zero));
    if (o->sequence_parallel >= 0)
        drv_set_train(g, ir_attr_bool(g->arena, intern(g->strings, "sequence_parallel"),
                                      o->sequence_parallel));
    if (o->schedule)
        drv_set_train(g, ir_attr_str(g->arena, intern(g->strings, "schedule"), o->schedule));
    if (o->virtual_stages > 0)
        drv_set_train(g, ir_attr_int(g->arena, intern(g->strings, "virtual_stages"), o->virtual_stages));
    for (int i = 0; i < o->nroles; i++) {
        const char *eq = strchr(o->roles[i], '=');
        int role = eq ? ir_role_lookup(eq + 1) : -1;
        int ax = -1;
        for (int k = 0; eq && k < g->mesh.naxes; k++)
            if (strlen(g->mesh.axes[k].name) == (size_t)(eq - o->roles[i]) &&
                !strncmp(g->mesh.axes[k].name, o->roles[i], (size_t)(eq - o->roles[i])))
                ax = k;
        if (role < 0 || ax < 0) {
            fprintf(stderr, "tcc: error: --role %s: expected AXIS=ROLE with a mesh axis and one "
                            "of data, fsdp, tensor, sequence, pipeline\n", o->roles[i]);
            return -1;
        }
        g->mesh.axes[ax].role = (AxisRole)role;
    }
    return o->place ? set_place(g, o->place) : 0;
}

