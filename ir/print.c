/* print.c: Graph -> the text form described in docs/ir.md. Reads a Graph, writes
 * lines to a FILE (or to a string in the arena). Key idea: the text depends only
 * on the graph's structure. Values are renumbered densely in definition order
 * through a lookup-only pointer map, so neither Value.id, pointers nor hash order
 * reach the output; parse.c reads the same text back, and print -> parse ->
 * print is byte-identical. The printer never fails: the driver dumps a graph
 * the verifier has just rejected, so whatever cannot be named (an axis index
 * out of range, a missing operand) prints as '?' and makes the parser stop
 * there with a location. */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

/* ---- value numbering ---- */

/* Value -> printed number, open addressing keyed by pointer. It is only ever
 * looked up, never walked, so its layout cannot change the text. */
typedef struct Numbering {
    const Value **keys;
    int *nums;
    size_t cap;
    int next;
} Numbering;

static size_t num_slot(const Numbering *n, const Value *v)
{
    uint64_t h = (uint64_t)(uintptr_t)v;
    h = (h ^ (h >> 29)) * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 17) & (n->cap - 1);
    while (n->keys[i] && n->keys[i] != v)
        i = (i + 1) & (n->cap - 1);
    return i;
}

static void num_add(Numbering *n, const Value *v)
{
    size_t i = v ? num_slot(n, v) : 0;
    if (v && !n->keys[i]) {
        n->keys[i] = v;
        n->nums[i] = n->next++;
    }
}

static void print_ref(FILE *out, const Numbering *n, const Value *v)
{
    size_t i = v ? num_slot(n, v) : 0;
    if (v && n->keys[i])
        fprintf(out, "%%%d", n->nums[i]);
    else
        fputs("%?", out);
}

static int op_nres(const Op *op)
{
    return op->res && op->nres > 0 ? op->nres : 0;
}

static int op_nargs(const Op *op)
{
    return op->args && op->nargs > 0 ? op->nargs : 0;
}

/* Results first, in op order; values used but defined by no op (a broken
 * graph the verifier will reject) get the numbers after them, so a dump of a
 * broken graph still prints and the parser names the undefined value. */
static void num_init(Numbering *n, const Graph *g)
{
    size_t count = (size_t)g->outputs.len;
    for (int i = 0; i < g->ops.len; i++)
        count += (size_t)op_nres(g->ops.data[i]) + (size_t)op_nargs(g->ops.data[i]);
    n->cap = 16;
    while (n->cap < 2 * count + 1)
        n->cap *= 2;
    n->keys = calloc(n->cap, sizeof(*n->keys));
    n->nums = calloc(n->cap, sizeof(*n->nums));
    if (!n->keys || !n->nums) {
        fprintf(stderr, "tcc: out of memory\n");
        exit(1);
    }
    n->next = 0;
    for (int i = 0; i < g->ops.len; i++)
        for (int r = 0; r < op_nres(g->ops.data[i]); r++)
            num_add(n, g->ops.data[i]->res[r]);
    for (int i = 0; i < g->ops.len; i++)
        for (int a = 0; a < op_nargs(g->ops.data[i]); a++)
            num_add(n, g->ops.data[i]->args[a]);
    for (int i = 0; i < g->outputs.len; i++)
        num_add(n, g->outputs.data[i]);
}

static void num_free(Numbering *n)
{
    free(n->keys);
    free(n->nums);
}

/* ---- strings, numbers, attributes ---- */

static int is_identifier(const char *s)
{
    if (!s || !((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_'))
        return 0;
    for (s++; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '.'))
            return 0;
    return 1;
}

static void print_quoted(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", out);
        else if (*p == '\t')
            fputs("\\t", out);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(out, "\\x%02x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

/* "FILE":LINE:COL; a NULL file prints as "" (the parser maps "" back to NULL). */
static void print_loc(FILE *out, Loc loc)
{
    print_quoted(out, loc.file ? loc.file : "");
    fprintf(out, ":%d:%d", loc.line, loc.col);
}

static void print_attr_value(FILE *out, const Attr *a);

static void print_item(FILE *out, const Attr *a)
{
    if (!a) {
        fputc('?', out);
        return;
    }
    if (a->key)
        fprintf(out, "%s = ", a->key);
    print_attr_value(out, a);
}

static void print_items(FILE *out, Attr *const *items, int n)
{
    for (int i = 0; i < n; i++) {
        if (i)
            fputs(", ", out);
        print_item(out, items[i]);
    }
}

static void print_attr_value(FILE *out, const Attr *a)
{
    char buf[64];
    switch (a->kind) {
    case ATTR_INT:
        fprintf(out, "%lld", (long long)a->i);
        break;
    case ATTR_FLOAT:
        fmt_double(buf, sizeof(buf), a->f);
        fputs(buf, out);
        break;
    case ATTR_BOOL:
        fputs(a->i ? "true" : "false", out);
        break;
    case ATTR_STR:
        print_quoted(out, a->s ? a->s : "");
        break;
    case ATTR_LIST:
        fputc('[', out);
        print_items(out, a->items, a->nitems);
        fputc(']', out);
        break;
    case ATTR_CALL:
        fprintf(out, "%s(", a->s ? a->s : "?");
        print_items(out, a->items, a->nitems);
        fputc(')', out);
        break;
    default:
        fputc('?', out);
    }
}

/* KEY = VALUE, where a key is required (config, train, op attributes). */
static void print_keyed(FILE *out, const Attr *a)
{
    if (!a || !a->key)
        fputs("? = ", out);
    print_item(out, a);
}

static int mesh_naxes(const Graph *g)
{
    int n = g->mesh.naxes;
    return n < 0 ? 0 : n > IR_MAX_AXES ? IR_MAX_AXES : n;
}

/* ---- types and shardings ---- */

static void print_axis(FILE *out, const Graph *g, int axis)
{
    if (axis >= 0 && axis < mesh_naxes(g) && g->mesh.axes[axis].name)
        fputs(g->mesh.axes[axis].name, out);
    else
        fprintf(out, "?%d", axis);
}

/* SIZE, SIZE@AXIS or SIZE@(AX1,AX2): major to minor. */
static void print_dim(FILE *out, const Graph *g, const Value *v, int d)
{
    int n = v->shard.naxes[d] > IR_MAX_AXES ? IR_MAX_AXES : v->shard.naxes[d];
    fprintf(out, "%lld", (long long)v->shape[d]);
    if (!n)
        return;
    fputs(n > 1 ? "@(" : "@", out);
    for (int i = 0; i < n; i++) {
        fputs(i ? "," : "", out);
        print_axis(out, g, v->shard.axes[d][i]);
    }
    if (n > 1)
        fputc(')', out);
}

static void print_partial(FILE *out, const Graph *g, uint32_t partial)
{
    if (!partial)
        return;
    fputs(" partial(", out);
    for (int i = 0, first = 1; i < 32; i++) {
        if (!(partial & (UINT32_C(1) << i)))
            continue;
        fputs(first ? "" : ",", out);
        print_axis(out, g, i);
        first = 0;
    }
    fputc(')', out);
}

void ir_print_value_type(FILE *out, const Graph *g, const Value *v)
{
    int rank = v->rank < 0 ? 0 : v->rank > IR_MAX_RANK ? IR_MAX_RANK : v->rank;
    fprintf(out, "%s[", ir_dtype_name(v->dtype));
    for (int d = 0; d < rank; d++) {
        if (d)
            fputc(',', out);
        print_dim(out, g, v, d);
    }
    fputc(']', out);
    print_partial(out, g, v->shard.partial);
}

static void print_why(FILE *out, const Why *w)
{
    if (w->kind == WHY_NONE)
        return;
    fprintf(out, " why(%s", ir_why_name(w->kind));
    if (w->loc.line > 0) {
        fputs(", ", out);
        print_loc(out, w->loc);
    }
    if (w->detail) {
        fputs(", ", out);
        print_quoted(out, w->detail);
    }
    fputc(')', out);
}

/* ---- lines ---- */

static void print_header(FILE *out, const Graph *g)
{
    fprintf(out, "# tcc ir v%d\n", IR_FORMAT_VERSION);
    if (g->name) {
        fputs("module ", out);
        if (is_identifier(g->name))
            fputs(g->name, out);
        else
            print_quoted(out, g->name);
        fputc('\n', out);
    }
    if (g->config.len) {
        fputs("config ", out);
        for (int i = 0; i < g->config.len; i++) {
            fputs(i ? ", " : "", out);
            print_keyed(out, g->config.data[i]);
        }
        fputc('\n', out);
    }
    for (int i = 0; i < mesh_naxes(g); i++) {
        const MeshAxis *ax = &g->mesh.axes[i];
        fprintf(out, "%s%s: %s = %d", i ? ", " : "mesh ", ax->name ? ax->name : "?",
                ir_role_name(ax->role), ax->size);
    }
    if (mesh_naxes(g))
        fputc('\n', out);
    for (int i = 0; i < g->train.len; i++) {
        fputs("train ", out);
        print_keyed(out, g->train.data[i]);
        fputc('\n', out);
    }
    int top = -1; /* the schedule table, one line per stage */
    for (int e = 0; e < g->sched.len; e++)
        top = g->sched.data[e].stage > top ? g->sched.data[e].stage : top;
    for (int s = 0; s <= top; s++) {
        int first = 1;
        for (int e = 0; e < g->sched.len; e++) {
            const SchedStep *st = &g->sched.data[e];
            if (st->stage != s)
                continue;
            if (first)
                fprintf(out, "schedule %d:", s);
            fprintf(out, "%s %d %d", first ? "" : ",", st->tick, st->mb);
            first = 0;
        }
        if (!first)
            fputc('\n', out);
    }
}

static void print_results(FILE *out, const Graph *g, const Numbering *n, const Op *op)
{
    for (int i = 0; i < op_nres(op); i++) {
        const Value *v = op->res[i];
        fputs(i ? ", " : "", out);
        print_ref(out, n, v);
        if (!v)
            continue;
        if (v->name) {
            fputc(' ', out);
            print_quoted(out, v->name);
        }
        fputs(" : ", out);
        ir_print_value_type(out, g, v);
        print_why(out, &v->shard.why);
    }
    if (op_nres(op))
        fputs(" = ", out);
}

static void print_op(FILE *out, const Graph *g, const Numbering *n, const Op *op)
{
    print_results(out, g, n, op);
    fputs((unsigned)op->kind < OP_COUNT ? ir_ops[op->kind].name : "?", out);
    for (int i = 0; i < op_nargs(op); i++) {
        fputs(i ? ", " : " ", out);
        print_ref(out, n, op->args[i]);
    }
    for (int i = 0; op->attrs && i < op->nattrs; i++) {
        fputs(i ? ", " : " {", out);
        print_keyed(out, op->attrs[i]);
    }
    if (op->attrs && op->nattrs > 0)
        fputc('}', out);
    if (op->loc.line > 0) {
        fputs(" loc(", out);
        print_loc(out, op->loc);
        fputc(')', out);
    }
    if (op->layer >= 0)
        fprintf(out, " layer %d", op->layer);
    if (op->phase != PH_FWD)
        fprintf(out, " phase %s", ir_phase_name(op->phase));
    if (op->stage)
        fprintf(out, " stage %d", op->stage);
    if (op->mb >= 0)
        fprintf(out, " mb %d", op->mb);
    if (op->tick)
        fprintf(out, " tick %d", op->tick);
    fputc('\n', out);
}

void ir_print(FILE *out, const Graph *g)
{
    Numbering n;
    num_init(&n, g);
    print_header(out, g);
    for (int i = 0; i < g->ops.len; i++)
        print_op(out, g, &n, g->ops.data[i]);
    for (int i = 0; i < g->outputs.len; i++) {
        fputs("output ", out);
        print_ref(out, &n, g->outputs.data[i]);
        fputc('\n', out);
    }
    num_free(&n);
}

void ir_print_op(FILE *out, const Graph *g, const Op *op)
{
    Numbering n;
    num_init(&n, g);
    print_op(out, g, &n, op);
    num_free(&n);
}

char *ir_print_string(Arena *a, const Graph *g)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        fprintf(stderr, "tcc: out of memory\n");
        exit(1);
    }
    ir_print(f, g);
    if (fclose(f) != 0 || !buf) {
        fprintf(stderr, "tcc: out of memory\n");
        exit(1);
    }
    char *s = arena_strndup(a, buf, len);
    free(buf);
    return s;
}
