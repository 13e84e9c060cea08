/* verify.c: the structural checker run after every pass. Reads a Graph; writes
 * only diagnostics, one "invalid IR: ..." per violation at the op's location.
 * Key idea: first number the values as the printer does (walk the ops, number
 * results in order), so any message can name a value by its printed %N, even
 * one used before its definition; then walk the ops once more, marking each
 * result defined as it is passed. Shape and dtype rules are ir_infer's alone. */
#include "ir.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct Verifier {
    Ctx *c;
    const Graph *g;
    int *num;       /* by value id: printed number, -1 when no op defines it */
    int *def_at;    /* by value id: index of the defining op once walked, else -1 */
    char *broken;   /* by value id: rank, dtype or sizes unusable; rules skip it */
    int naxes;      /* mesh axes that may be indexed */
    int mesh_ok;    /* sizes >= 1 and their product fits: factors are safe */
    int stages;     /* size of the pipeline axis, 1 without one */
    const char *pp; /* the pipeline axis' name, NULL without one */
    int errors;
} Verifier;

/* A value or op reference, returned by value so a message can hold several. */
typedef struct Ref {
    char s[256];
} Ref;

static void bad(Verifier *vf, Loc loc, const char *fmt, ...) PRINTF_LIKE(3, 4);
static void bad(Verifier *vf, Loc loc, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    diag_error(&vf->c->diag, loc, "invalid IR: %s", msg);
    vf->errors++;
}

/* The value's index in g->values, or -1 when it is not there. */
static int slot(const Verifier *vf, const Value *v)
{
    const Graph *g = vf->g;
    if (v && v->id >= 0 && v->id < g->values.len && g->values.data[v->id] == v)
        return v->id;
    return -1;
}

/* "%5 'x'", "%5", or "a value 'x'" when no op defines it. */
static Ref vref(const Verifier *vf, const Value *v)
{
    Ref r;
    int s = slot(vf, v), k;
    if (s >= 0 && vf->num[s] >= 0)
        k = snprintf(r.s, sizeof(r.s), "%%%d", vf->num[s]);
    else
        k = snprintf(r.s, sizeof(r.s), "a value");
    if (v && v->name && k >= 0 && (size_t)k < sizeof(r.s))
        snprintf(r.s + k, sizeof(r.s) - (size_t)k, " '%s'", v->name);
    return r;
}

/* " ('x')" for a named value that has no number, else "". */
static Ref name_note(const Value *v)
{
    Ref r = {""};
    if (v->name)
        snprintf(r.s, sizeof(r.s), " ('%s')", v->name);
    return r;
}

static const char *op_name(const Op *op)
{
    return (unsigned)op->kind < OP_COUNT ? ir_ops[op->kind].name : "?";
}

/* "'add' defining %5 'x'", or "'add'" when it defines nothing usable. */
static Ref oref(const Verifier *vf, const Op *op)
{
    Ref r;
    const Value *v = op->nres > 0 && op->res ? op->res[0] : NULL;
    if (slot(vf, v) >= 0)
        snprintf(r.s, sizeof(r.s), "'%.32s' defining %.200s", op_name(op), vref(vf, v).s);
    else
        snprintf(r.s, sizeof(r.s), "'%s'", op_name(op));
    return r;
}

/* Why a value cannot be indexed or sized, or NULL when it can. */
static const char *value_problem(const Value *v)
{
    if (v->rank < 0 || v->rank > IR_MAX_RANK)
        return "has a rank out of range";
    if ((unsigned)v->dtype >= DT_COUNT)
        return "has an unknown dtype";
    int64_t n = 1;
    for (int d = 0; d < v->rank; d++) {
        if (v->shape[d] < 0)
            return "has a negative dimension";
        if (v->shape[d] != 0 && n > INT64_MAX / 8 / v->shape[d])
            return "has too many elements";
        n *= v->shape[d];
    }
    return NULL;
}

/* ---- the mesh and the value table ---- */

static void check_mesh_axis(Verifier *vf, int i, int64_t *total)
{
    const MeshAxis *a = &vf->g->mesh.axes[i];
    const char *name = a->name ? a->name : "?";
    if (!a->name)
        bad(vf, a->loc, "mesh axis %d has no name", i);
    for (int j = 0; j < i && a->name; j++)
        if (vf->g->mesh.axes[j].name && strcmp(vf->g->mesh.axes[j].name, a->name) == 0)
            bad(vf, a->loc, "mesh axis '%s' is declared twice", name);
    if ((unsigned)a->role >= ROLE_COUNT)
        bad(vf, a->loc, "mesh axis '%s' has unknown role %d", name, (int)a->role);
    if (a->size < 1) {
        bad(vf, a->loc, "mesh axis '%s' has size %d", name, a->size);
        vf->mesh_ok = 0;
    } else if (*total <= INT32_MAX) {
        *total *= a->size; /* both factors fit 31 bits: no overflow */
    }
    if (a->role == ROLE_PIPELINE && !vf->pp && a->size >= 1) {
        vf->pp = name;
        vf->stages = a->size;
    }
}

static void check_mesh(Verifier *vf)
{
    const Mesh *m = &vf->g->mesh;
    int64_t total = 1;
    vf->naxes = m->naxes < 0 ? 0 : m->naxes > IR_MAX_AXES ? IR_MAX_AXES : m->naxes;
    vf->mesh_ok = vf->naxes == m->naxes;
    vf->stages = 1;
    if (!vf->mesh_ok)
        bad(vf, LOC_NONE, "mesh has %d axes (at most %d)", m->naxes, IR_MAX_AXES);
    for (int i = 0; i < vf->naxes; i++)
        check_mesh_axis(vf, i, &total);
    if (total > INT32_MAX) {
        bad(vf, LOC_NONE, "mesh has more than %d devices", INT32_MAX);
        vf->mesh_ok = 0;
    }
}

static void check_value_table(Verifier *vf)
{
    for (int i = 0; i < vf->g->values.len; i++) {
        const Value *v = vf->g->values.data[i];
        if (!v)
            bad(vf, LOC_NONE, "value table entry %d is missing", i);
        else if (v->id != i)
            bad(vf, v->loc, "value table entry %d has id %d", i, v->id);
    }
}

/* Printed numbers: walk the ops, number each result at its first definition. */
static void number_values(Verifier *vf)
{
    int n = 0;
    for (int i = 0; i < vf->g->ops.len; i++) {
        const Op *op = vf->g->ops.data[i];
        for (int r = 0; op && op->res && r < op->nres; r++) {
            int s = slot(vf, op->res[r]);
            if (s >= 0 && vf->num[s] < 0) {
                vf->num[s] = n++;
                vf->broken[s] = value_problem(op->res[r]) != NULL;
            }
        }
    }
}

/* ---- shardings ---- */

static const char *axis_name(const Verifier *vf, int ax)
{
    const char *name = vf->g->mesh.axes[ax].name;
    return name ? name : "?";
}

/* Axes of one dimension: in range, each mesh axis once per value, divisible. */
static void check_dim(Verifier *vf, const Value *v, int d, uint32_t *used, Loc loc)
{
    const Sharding *s = &v->shard;
    const Mesh *m = &vf->g->mesh;
    char axes[256] = "";
    int ok = vf->mesh_ok;
    if (s->naxes[d] > IR_MAX_AXES) {
        bad(vf, loc, "dimension %d of %s lists %d mesh axes (at most %d)", d, vref(vf, v).s,
            s->naxes[d], IR_MAX_AXES);
        return;
    }
    for (int k = 0; k < s->naxes[d]; k++) {
        int ax = s->axes[d][k];
        if (ax < 0 || ax >= vf->naxes) {
            bad(vf, loc, "dimension %d of %s is split over mesh axis %d, but the mesh has %d axes",
                d, vref(vf, v).s, ax, vf->naxes);
            ok = 0;
            continue;
        }
        if (*used & (1u << ax)) {
            bad(vf, loc, "%s uses mesh axis '%s' more than once", vref(vf, v).s, axis_name(vf, ax));
            ok = 0;
        }
        *used |= 1u << ax;
        size_t k0 = strlen(axes);
        snprintf(axes + k0, sizeof(axes) - k0, "%s%s", k ? "," : "", axis_name(vf, ax));
    }
    int64_t f = ok ? ir_shard_factor(m, s, d) : 1;
    if (v->shape[d] % f != 0)
        bad(vf, loc, "dimension %d of %s (size %lld) is not divisible by %lld (axes %s)", d,
            vref(vf, v).s, (long long)v->shape[d], (long long)f, axes);
}

static void check_sharding(Verifier *vf, const Value *v, Loc loc)
{
    const Sharding *s = &v->shard;
    uint32_t used = 0;
    for (int d = 0; d < IR_MAX_RANK; d++) {
        if (d < v->rank)
            check_dim(vf, v, d, &used, loc);
        else if (s->naxes[d])
            bad(vf, loc, "%s has rank %d but its sharding splits dimension %d", vref(vf, v).s,
                v->rank, d);
    }
    for (int ax = 0; ax < 32; ax++) {
        if (!(s->partial & (1u << ax)))
            continue;
        if (ax >= vf->naxes)
            bad(vf, loc, "%s is partial over mesh axis %d, but the mesh has %d axes", vref(vf, v).s,
                ax, vf->naxes);
        else if (used & (1u << ax))
            bad(vf, loc, "%s is both split and partial over mesh axis '%s'", vref(vf, v).s,
                axis_name(vf, ax));
    }
    if ((unsigned)s->why.kind >= WHY_COUNT)
        bad(vf, loc, "%s has unknown sharding reason %d", vref(vf, v).s, (int)s->why.kind);
}

/* ---- ops ---- */

/* Operand and result arrays that may be walked. */
static int check_lists(Verifier *vf, const Op *op)
{
    if (op->nargs < 0 || (op->nargs > 0 && !op->args) || op->nres < 0 ||
        (op->nres > 0 && !op->res)) {
        bad(vf, op->loc, "'%s' has malformed operand or result lists", op_name(op));
        return 0;
    }
    return 1;
}

/* Kind and counts against the op table. */
static int check_counts(Verifier *vf, const Op *op, int i)
{
    if ((unsigned)op->kind >= OP_COUNT) {
        bad(vf, op->loc, "op %d has unknown kind %d", i, (int)op->kind);
        return 0;
    }
    int ok = 1, want = ir_ops[op->kind].nargs;
    if (!ir_op_arity_ok(op)) {
        bad(vf, op->loc, "'%s' takes %s%d operand%s, got %d", op_name(op),
            want < 0 ? "at least " : "", want < 0 ? 1 : want, want == 1 || want < 0 ? "" : "s",
            op->nargs);
        ok = 0;
    }
    if (!ir_op_nres_ok(op)) {
        bad(vf, op->loc, "'%s' has %d results, expected %d", op_name(op), op->nres,
            ir_ops[op->kind].nres);
        ok = 0;
    }
    return ok;
}

/* Every operand present and defined by an earlier op. */
static int check_operands(Verifier *vf, const Op *op)
{
    int ok = 1;
    for (int j = 0; j < op->nargs; j++) {
        const Value *v = op->args[j];
        int s = slot(vf, v);
        if (!v || s < 0) {
            bad(vf, op->loc, "operand %d of %s is %s", j, oref(vf, op).s,
                v ? "not in the graph's value table" : "missing");
            ok = 0;
        } else if (vf->def_at[s] < 0 && vf->num[s] >= 0) {
            bad(vf, op->loc, "%s is used by %s before its definition", vref(vf, v).s,
                oref(vf, op).s);
        } else if (vf->def_at[s] < 0) {
            bad(vf, op->loc, "operand %d%s of %s is not defined by any op", j, name_note(v).s,
                oref(vf, op).s);
        } else if (vf->broken[s]) {
            ok = 0;
        }
    }
    return ok;
}

/* Every result present, defined here and nowhere else, well formed, well sharded. */
static int check_results(Verifier *vf, const Op *op, int i)
{
    int ok = 1;
    for (int r = 0; r < op->nres; r++) {
        const Value *v = op->res[r];
        int s = slot(vf, v);
        const char *why = v ? value_problem(v) : NULL;
        if (!v || s < 0) {
            bad(vf, op->loc, "result %d of '%s' is %s", r, op_name(op),
                v ? "not in the graph's value table" : "missing");
        } else if (vf->def_at[s] >= 0) {
            bad(vf, op->loc, "%s is defined twice", vref(vf, v).s);
        } else {
            vf->def_at[s] = i;
            if (v->def != op)
                bad(vf, op->loc, "%s is a result of '%s' but names another op as its definition",
                    vref(vf, v).s, op_name(op));
            if (why)
                bad(vf, op->loc, "%s %s", vref(vf, v).s, why);
            else
                check_sharding(vf, v, op->loc);
        }
        ok &= v && s >= 0 && !why;
    }
    return ok;
}

static void check_placement(Verifier *vf, const Op *op)
{
    if ((unsigned)op->phase >= PH_COUNT)
        bad(vf, op->loc, "%s has unknown phase %d", oref(vf, op).s, (int)op->phase);
    if (op->layer < -1)
        bad(vf, op->loc, "%s has layer %d", oref(vf, op).s, op->layer);
    if (op->stage < 0)
        bad(vf, op->loc, "%s has negative stage %d", oref(vf, op).s, op->stage);
    else if (op->stage >= vf->stages && vf->pp)
        bad(vf, op->loc, "%s is on stage %d, but pipeline axis '%s' has %d stages", oref(vf, op).s,
            op->stage, vf->pp, vf->stages);
    else if (op->stage >= vf->stages)
        bad(vf, op->loc, "%s is on stage %d, but the mesh has no pipeline axis", oref(vf, op).s,
            op->stage);
}

/* ir_infer must accept the op and agree with each result's type. */
static void check_type(Verifier *vf, const Op *op)
{
    char err[512];
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    if (op->nres == 0 && ir_infer(op, &dt, &rank, shape, err, sizeof(err)) != 0)
        bad(vf, op->loc, "in %s: %s", oref(vf, op).s, err);
    for (int i = 0; i < op->nres; i++) {
        const Value *v = op->res[i];
        if (ir_infer_result(op, i, &dt, &rank, shape, err, sizeof(err)) != 0) {
            bad(vf, op->loc, "in %s: %s", oref(vf, op).s, err);
            return;
        }
        if (dt == v->dtype && rank == v->rank &&
            memcmp(shape, v->shape, sizeof(int64_t) * (size_t)rank) == 0)
            continue;
        char want[200], got[200];
        ir_type_str(want, sizeof(want), dt, rank, shape);
        ir_type_str(got, sizeof(got), v->dtype, v->rank, v->shape);
        bad(vf, op->loc, "%s is %s but '%s' gives %s", vref(vf, v).s, got, op_name(op), want);
    }
}

/* A collective's or axis_offset's attrs: axes names distinct mesh axes, dims
 * in range (the partition pass writes them; an IR file may not). */
static void check_collective(Verifier *vf, const Op *op)
{
    if (op->kind < OP_ALL_REDUCE || op->kind > OP_AXIS_OFFSET || op->kind == OP_CROSS_ENTROPY_SHARD ||
        op->kind == OP_CROSS_ENTROPY_GRAD_SHARD)
        return;
    const Attr *axes = ir_op_attr(op, "axes");
    uint32_t seen = 0;
    if (!axes || axes->kind != ATTR_LIST) {
        bad(vf, op->loc, "in '%s': attr 'axes' must be a list of mesh axis names", op_name(op));
        return;
    }
    for (int k = 0; k < axes->nitems; k++) {
        const Attr *a = axes->items[k];
        int ax = a->kind == ATTR_STR ? ir_mesh_axis(&vf->g->mesh, a->s) : -1;
        if (ax < 0 || (seen >> ax & 1)) {
            bad(vf, op->loc, "in '%s': axes[%d] is not a mesh axis, or is named twice",
                op_name(op), k);
            return;
        }
        seen |= 1u << ax;
    }
    int rank = op->nargs ? op->args[0]->rank : 0;
    const char *keys[2] = {"dim", "split"};
    for (int k = 0; k < 2; k++) {
        int need = (k == 0 && op->kind != OP_ALL_REDUCE && op->kind != OP_AXIS_OFFSET) ||
                   (k == 1 && op->kind == OP_ALL_TO_ALL);
        int64_t d = ir_op_attr_int(op, keys[k], -1);
        if (need && (d < 0 || d >= rank))
            bad(vf, op->loc, "in '%s': attr '%s' must be a dimension in [0, %d)", op_name(op),
                keys[k], rank);
    }
}

static void check_op(Verifier *vf, int i)
{
    const Op *op = vf->g->ops.data[i];
    if (!op) {
        bad(vf, LOC_NONE, "op %d is missing", i);
        return;
    }
    if (op->id != i)
        bad(vf, op->loc, "op at position %d has id %d", i, op->id);
    if (check_lists(vf, op)) {
        int ok = check_counts(vf, op, i);
        ok &= check_operands(vf, op);
        ok &= check_results(vf, op, i);
        if (ok) {
            check_type(vf, op);
            check_collective(vf, op);
        }
    }
    check_placement(vf, op);
}

static void check_outputs(Verifier *vf)
{
    for (int i = 0; i < vf->g->outputs.len; i++) {
        const Value *v = vf->g->outputs.data[i];
        int s = slot(vf, v);
        if (!v)
            bad(vf, LOC_NONE, "output %d is missing", i);
        else if (s < 0 || vf->def_at[s] < 0)
            bad(vf, v->loc, "output %d%s is not defined by any op", i, name_note(v).s);
    }
}

int ir_verify(Ctx *c, const Graph *g)
{
    Verifier vf = {.c = c, .g = g};
    size_t n = (size_t)g->values.len + 1;
    vf.num = malloc(n * sizeof(int));
    vf.def_at = malloc(n * sizeof(int));
    vf.broken = calloc(n, 1);
    if (!vf.num || !vf.def_at || !vf.broken)
        BUG("out of memory");
    for (size_t i = 0; i < n; i++)
        vf.num[i] = vf.def_at[i] = -1;
    check_mesh(&vf);
    check_value_table(&vf);
    number_values(&vf);
    for (int i = 0; i < g->ops.len; i++)
        check_op(&vf, i);
    check_outputs(&vf);
    free(vf.num);
    free(vf.def_at);
    free(vf.broken);
    return vf.errors ? -1 : 0;
}
