/* why.c: why-chains, the reasons behind one value's sharding (--why NAME).
 * Reads the graph right after the shard pass, and again after the partition
 * pass; writes text. Key idea: the sweep gave each value what its op's rule
 * picks over the operands' final shardings, and the partition pass re-runs
 * that rule to the same answer (shard.h); so the chain asks the rule again,
 * now keeping every way it weighed (shard_weigh) and the operand each mesh
 * axis came from (shard_axis_from), and follows each axis back through those
 * operands to the annotation, role default or decision that started it. The
 * collectives are not predicted but read from the partitioned graph: what
 * the value's op needed of its operands, what brought it to its pin, what
 * reshards it for its readers. */
#include "explain/explain.h"
#include "passes/shard.h"

#include <stdlib.h>
#include <string.h>

#define WAYS 64       /* result layouts kept per op */
#define SHOW_WAYS 5   /* of them printed */
#define SHOW_OTHERS 8 /* other values of the same name listed */
#define SHOW_READERS 6

struct WhyChain {
    Graph *g;
    Value *v;
    Op *def;            /* v's op after the shard pass, NULL for none */
    int nvalues;        /* values after the shard pass */
    int *num;           /* by Value.id: the number --dump-after=shard prints, -1 none */
    const char **names; /* by Value.id: the names then (the partition pass moves outputs') */
    char *text;         /* what was written after the shard pass */
    Value **own;        /* a parameter's own values: gradient, state, copies */
    int nown;
};

/* ---- printing pieces ---- */

static void put_loc(FILE *f, Loc l)
{
    if (l.line > 0)
        fprintf(f, "%s:%d:%d", l.file ? l.file : "?", l.line, l.col);
    else
        fputs(l.file ? l.file : "(no location)", f);
}

static void put_ref(FILE *f, const WhyChain *w, const Value *v)
{
    int old = v->id < w->nvalues;
    const char *name = old ? w->names[v->id] : v->name;
    if (name)
        fprintf(f, "'%s' ", name);
    if (!old)
        fputs("(made by the partition pass)", f);
    else if (w->num[v->id] >= 0)
        fprintf(f, "%%%d", w->num[v->id]);
    else
        fputs("%?", f);
}

static void put_type(FILE *f, const Graph *g, const Value *v, const Sharding *sh)
{
    Value t = *v;
    t.shard = *sh;
    ir_print_value_type(f, g, &t);
}

static void put_axes(FILE *f, const Graph *g, const int8_t *axes, int n)
{
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%s", i ? "," : "", g->mesh.axes[axes[i]].name);
}

/* " (layer 0, bwd, microbatch 1)": where in the step an op runs. */
static void put_context(FILE *f, const Op *op)
{
    int n = 0;
    if (op->layer >= 0)
        fprintf(f, "%slayer %d", n++ ? ", " : " (", op->layer);
    if (op->phase != PH_FWD)
        fprintf(f, "%s%s", n++ ? ", " : " (", ir_phase_name(op->phase));
    if (op->mb >= 0)
        fprintf(f, "%smicrobatch %d", n++ ? ", " : " (", op->mb);
    if (n)
        fputc(')', f);
}

static void put_op(FILE *f, const Op *op)
{
    fprintf(f, "%s at ", ir_ops[op->kind].name);
    put_loc(f, op->loc);
    put_context(f, op);
}

static void put_why(FILE *f, const Why *y)
{
    fputs(ir_why_name(y->kind), f);
    if (y->kind == WHY_ANNOTATION) {
        fputs(" at ", f);
        put_loc(f, y->loc);
    }
    if (y->detail)
        fprintf(f, " \"%s\"", y->detail);
}

/* v's reference, its type after sep, then its sharding's reason. */
static void put_value(FILE *f, const WhyChain *w, const Value *v, const char *sep)
{
    put_ref(f, w, v);
    fputs(sep, f);
    ir_print_value_type(f, w->g, v);
    fputs(", ", f);
    put_why(f, &v->shard.why);
}

/* One collective or slice, as the partition pass emits it. */
static void put_step(FILE *f, const Graph *g, OpKind kind, int dim, int dim2, const int8_t *axes,
                     int naxes, double bytes, const char *redop)
{
    fputs(ir_ops[kind].name, f);
    if (redop)
        fprintf(f, "(%s)", redop);
    if (kind == OP_ALL_TO_ALL)
        fprintf(f, " dim %d to dim %d", dim, dim2);
    else if (kind == OP_REDUCE_SCATTER)
        fprintf(f, " onto dim %d", dim);
    else if (kind != OP_ALL_REDUCE)
        fprintf(f, " dim %d", dim);
    fputs(" over ", f);
    put_axes(f, g, axes, naxes);
    if (kind == OP_SHARD_SLICE)
        fputs(" (local)", f);
    else
        fprintf(f, " (%.0f bytes)", bytes);
}

static int is_comm(const Op *op)
{
    return op && op->kind >= OP_ALL_REDUCE && op->kind <= OP_SHARD_SLICE;
}

/* A collective op of the partitioned graph; its bytes into *bytes. */
static void put_comm(FILE *f, const Graph *g, const Op *op, double *bytes)
{
    int8_t axes[IR_MAX_AXES];
    int n = 0;
    const Attr *a = ir_op_attr(op, "axes"), *red = ir_op_attr(op, "op");
    for (int i = 0; a && i < a->nitems && n < IR_MAX_AXES; i++)
        if (a->items[i]->s && ir_mesh_axis(&g->mesh, a->items[i]->s) >= 0)
            axes[n++] = (int8_t)ir_mesh_axis(&g->mesh, a->items[i]->s);
    double b = (double)ir_op_attr_int(op, "bytes", 0);
    put_step(f, g, op->kind, (int)ir_op_attr_int(op, "dim", -1),
             (int)ir_op_attr_int(op, "split", -1), axes, n, b, red ? red->s : NULL);
    *bytes += b;
}

/* ---- after the shard pass: names ---- */

/* Each value's number as the printer gives it after the shard pass (results
 * in op order, ir/print.c), and its name then. */
static void number(WhyChain *w)
{
    Graph *g = w->g;
    int n = w->nvalues = g->values.len;
    w->num = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1));
    w->names = arena_alloc(g->arena, sizeof(char *) * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        w->num[i] = -1, w->names[i] = g->values.data[i]->name;
    int k = 0;
    for (int i = 0; i < g->ops.len; i++)
        for (int r = 0; r < g->ops.data[i]->nres; r++)
            if (w->num[g->ops.data[i]->res[r]->id] < 0)
                w->num[g->ops.data[i]->res[r]->id] = k++;
}

static int is_index(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return n > 0;
}

/* A name made in a repeat ("layers.3.ffn.w1") without its index: what
 * follows the last index ("ffn.w1") into rest, and the name with every index
 * left out ("layers.ffn.w1") into joined. 0 when it has no index. */
static int layer_forms(const char *name, char *rest, char *joined, size_t n)
{
    size_t len = 0;
    int found = 0;
    joined[0] = rest[0] = 0;
    for (const char *p = name; *p;) {
        const char *dot = strchr(p, '.');
        size_t k = dot ? (size_t)(dot - p) : strlen(p);
        if (is_index(p, k) && p != name && dot) {
            found = 1;
            snprintf(rest, n, "%s", dot + 1);
        } else if (len + k + 2 < n) {
            memcpy(joined + len, p, k);
            len += k;
            joined[len++] = '.';
            joined[len] = 0;
        }
        p += k + (dot != NULL);
    }
    if (len)
        joined[len - 1] = 0;
    return found;
}

/* 2: name is q; 1: q is name without its repeat's index (layer_forms), or
 * its last dotted parts: a block's parameter as the TDL declares it ("w1"
 * or "ffn.w1" of "layers.0.ffn.w1", "fc.w" of "enc.fc.w"); 0: neither. */
static int name_matches(const char *name, const char *q)
{
    char rest[512], joined[512];
    size_t n = name ? strlen(name) : 0, k = strlen(q);
    if (!name)
        return 0;
    if (!strcmp(name, q))
        return 2;
    if (k < n && name[n - k - 1] == '.' && !strcmp(name + n - k, q))
        return 1;
    return layer_forms(name, rest, joined, sizeof rest) && (!strcmp(rest, q) || !strcmp(joined, q));
}

static int distance(const char *a, const char *b)
{
    size_t n = strlen(b);
    if (strlen(a) > 200 || n > 200)
        return 1000;
    int row[202];
    for (size_t j = 0; j <= n; j++)
        row[j] = (int)j;
    for (size_t i = 1; a[i - 1]; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= n; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[n];
}

typedef struct Close {
    const char *text;
    const Value *v;
    int d;
} Close;

static const char *last_part(const char *s)
{
    const char *dot = strrchr(s, '.');
    return dot ? dot + 1 : s;
}

static int same_place(const Value *a, const Value *b)
{
    return a->loc.file == b->loc.file && a->loc.line == b->loc.line && a->loc.col == b->loc.col;
}

/* Keep text (naming v) among the three closest to q, one per place in the
 * model: by edit distance, a name that contains q or ends as q does counting
 * as close. */
static void consider_close(Close *best, const char *text, const Value *v, const char *q)
{
    int d = distance(text, q), limit = (int)strlen(q) / 3;
    if ((strlen(q) >= 3 && strstr(text, q)) || !strcmp(last_part(text), last_part(q)))
        d = d < 1 ? d : 1;
    if (d > (limit > 2 ? limit : 2))
        return;
    for (int i = 0; i < 3 && best[i].text; i++)
        if (!strcmp(best[i].text, text) || same_place(best[i].v, v)) {
            if (d >= best[i].d)
                return;
            memmove(best + i, best + i + 1,
                    sizeof *best * (size_t)(3 - i)); /* dropped; put back below */
            break;
        }
    for (int i = 0; i < 3; i++)
        if (!best[i].text || d < best[i].d) {
            memmove(best + i + 1, best + i, sizeof *best * (size_t)(2 - i));
            best[i] = (Close){text, v, d};
            return;
        }
}

/* No value is called q: say so, with the closest names at their places. */
static void refuse(Ctx *c, const Graph *g, const char *q)
{
    diag_error(&c->diag, LOC_NONE, "--why %s: model '%s' has no value or parameter named '%s'", q,
               g->name ? g->name : "?", q);
    Close best[4];
    memset(best, 0, sizeof best);
    for (int i = 0; i < g->values.len; i++) {
        const Value *v = g->values.data[i];
        char rest[512], joined[512];
        if (!v->name)
            continue;
        consider_close(best, v->name, v, q);
        if (layer_forms(v->name, rest, joined, sizeof rest)) {
            consider_close(best, intern(g->strings, rest), v, q);
            consider_close(best, intern(g->strings, joined), v, q);
        }
    }
    for (int i = 0; i < 3 && best[i].text && best[i].d == best[0].d; i++)
        diag_note(&c->diag, best[i].v->loc, "did you mean '%s'?", best[i].text);
    if (!best[0].text)
        diag_note(&c->diag, LOC_NONE, "--dump-after=shard lists every value with its name");
}

/* %N: the value printed as %N after the shard pass, into m. */
static int find_number(Ctx *c, const WhyChain *w, const char *q, Value **m)
{
    long k = strtol(q + 1, NULL, 10);
    int last = -1, n = 0;
    for (int i = 0; i < w->nvalues; i++) {
        last = w->num[i] > last ? w->num[i] : last;
        if (w->num[i] == k && !n)
            m[n++] = w->g->values.data[i];
    }
    if (!n)
        diag_error(&c->diag, LOC_NONE,
                   "--why %s: no such value: --dump-after=shard numbers them %%0 to %%%d", q, last);
    return n;
}

/* The values q names, in op order: %N, else the exact name, else the name
 * without its repeat index. */
static int find(Ctx *c, WhyChain *w, const char *q, Value ***out)
{
    Graph *g = w->g;
    Value **m = arena_alloc(g->arena, sizeof(Value *) * (size_t)(g->values.len + 1));
    int n = 0, exact = 0;
    *out = m;
    if (q[0] == '%' && is_index(q + 1, strlen(q + 1)))
        return find_number(c, w, q, m);
    for (int i = 0; i < g->values.len; i++)
        exact |= name_matches(g->values.data[i]->name, q) == 2;
    for (int i = 0; i < g->ops.len; i++)
        for (int r = 0; r < g->ops.data[i]->nres; r++) {
            Value *v = g->ops.data[i]->res[r];
            int k = name_matches(v->name, q);
            if (k == 2 || (k && !exact))
                m[n++] = v;
        }
    if (!n)
        refuse(c, g, q);
    return n;
}

/* The first forward value, else the first. */
static int pick(Value **m, int n)
{
    for (int i = 0; i < n; i++)
        if (!m[i]->def || m[i]->def->phase == PH_FWD)
            return i;
    return 0;
}

static void span(FILE *f, const char *one, const char *many, int lo, int hi)
{
    if (lo == hi)
        fprintf(f, ", %s %d", one, lo);
    else if (lo < hi)
        fprintf(f, ", %s %d-%d", many, lo, hi);
}

/* Several values of one name: the places that make them, their layers,
 * microbatches and phases. */
static void put_spread(FILE *f, const char *q, Value **m, int n)
{
    int lo[2] = {1 << 30, 1 << 30}, hi[2] = {-1, -1}, places = 0;
    unsigned phases = 0;
    fprintf(f, "  '%s' names %d values: made at", q, n);
    for (int i = 0; i < n; i++) {
        const Op *op = m[i]->def;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = m[j]->def->loc.line == op->loc.line && m[j]->def->loc.col == op->loc.col;
        if (!seen && places++ < 4)
            fprintf(f, "%s%d:%d", places > 1 ? ", " : " ", op->loc.line, op->loc.col);
        else if (!seen && places == 5)
            fputs(", ...", f);
        phases |= 1u << op->phase;
        int v[2] = {op->layer, op->mb};
        for (int t = 0; t < 2; t++)
            if (v[t] >= 0)
                lo[t] = v[t] < lo[t] ? v[t] : lo[t], hi[t] = v[t] > hi[t] ? v[t] : hi[t];
    }
    span(f, "layer", "layers", lo[0], hi[0]);
    span(f, "microbatch", "microbatches", lo[1], hi[1]);
    for (int p = 0; p < PH_COUNT; p++)
        if (phases >> p & 1)
            fprintf(f, "%s%s", p && (phases & ((1u << p) - 1)) ? " and " : ", phase ",
                    ir_phase_name((Phase)p));
    fputc('\n', f);
}

/* Which of the n values m[k] is, how many share its sharding, the others. */
static void put_matches(FILE *f, const WhyChain *w, const char *q, Value **m, int n, int k)
{
    put_spread(f, q, m, n);
    const Op *op = m[k]->def;
    fprintf(f, "  shown: the first%s", op->phase == PH_FWD ? " of the forward pass" : "");
    if (op->layer >= 0)
        fprintf(f, ", layer %d", op->layer);
    if (op->mb >= 0)
        fprintf(f, ", microbatch %d", op->mb);
    int alike = 0;
    for (int i = 0; i < n; i++)
        alike += shard_same(&m[i]->shard, &m[k]->shard, m[k]->rank);
    fprintf(f, "; %d of the %d are sharded alike\n  others:", alike, n);
    for (int i = 0, shown = 0; i < n && shown < SHOW_OTHERS; i++)
        if (i != k) {
            if (m[i]->name == m[k]->name)
                fprintf(f, " %%%d", w->num[m[i]->id]);
            else
                fputc(' ', f), put_ref(f, w, m[i]);
            shown++;
        }
    if (n - 1 > SHOW_OTHERS)
        fprintf(f, " and %d more", n - 1 - SHOW_OTHERS);
    fputs("; --why %N shows one\n", f);
}

/* ---- after the shard pass: chains ---- */

static int result_index(const Op *op, const Value *v)
{
    for (int r = 0; r < op->nres && r < SH_MAXRES; r++)
        if (op->res[r] == v)
            return r;
    return -1;
}

/* A step over data or fsdp axes only: a strategy's price leaves it out. */
static int batch_only(const Graph *g, const ReStep *st)
{
    for (int i = 0; i < st->naxes; i++)
        if (g->mesh.axes[st->axes[i]].role != ROLE_DATA &&
            g->mesh.axes[st->axes[i]].role != ROLE_FSDP)
            return 0;
    return st->naxes > 0;
}

/* The steps that take v from one sharding to another, as "a, then b";
 * `pin`: a result's move to its pin, whose batch-axis steps go unpriced. */
static void put_plan(FILE *f, const Graph *g, const Value *v, const Sharding *from,
                     const Sharding *to, int pin)
{
    ReStep steps[SH_MAXSTEPS];
    int k = shard_reshard_plan(&g->mesh, v, from, to, steps);
    for (int j = 0; j < k; j++) {
        fputs(j ? ", then " : "", f);
        put_step(f, g, steps[j].kind, steps[j].dim, steps[j].dim2, steps[j].axes, steps[j].naxes,
                 steps[j].bytes, NULL);
        if (pin && batch_only(g, &steps[j]))
            fputs(" not priced: the zero level places it", f);
    }
}

/* What st moves before op (and after it, to a pinned result's layout). */
static void put_moves(FILE *f, const WhyChain *w, const Op *op, const Strategy *st)
{
    int n = 0;
    for (int a = 0; a < op->nargs && a < SH_MAXARGS; a++) {
        const Value *x = op->args[a];
        if (shard_same(&x->shard, &st->req[a], x->rank) || (st->req[a].partial & ~x->shard.partial))
            continue;
        fputs(n++ ? "; " : "", f);
        put_ref(f, w, x);
        fputs(": ", f);
        put_plan(f, w->g, x, &x->shard, &st->req[a], 0);
        if (shard_anchored(x))
            fputs(", an annotated weight: priced 8 times", f);
    }
    for (int r = 0; r < op->nres && r < SH_MAXRES; r++) {
        const Value *v = op->res[r];
        if (!shard_pinned(&v->shard) || shard_same(&st->out[r], &v->shard, v->rank) ||
            (v->shard.partial & ~st->out[r].partial))
            continue;
        fputs(n++ ? "; then to its pin: " : "to its pin: ", f);
        put_plan(f, w->g, v, &st->out[r], &v->shard, 1);
    }
    if (!n)
        fputs("nothing moves", f);
}

typedef struct Link {
    Value *v;
    Strategy st; /* v's op's strategy, as the rule picks it */
    AxisFrom from;
} Link;

/* The origin of a chain: a pinned value, or a value that no op made. */
static void put_origin(FILE *f, const WhyChain *w, const Value *v)
{
    const Why *y = &v->shard.why;
    fputs("  ", f);
    put_loc(f, y->kind == WHY_ANNOTATION ? y->loc : v->loc);
    fputs(": ", f);
    if (v->def && v->def->nargs)
        fprintf(f, "%s -> ", ir_ops[v->def->kind].name);
    put_ref(f, w, v);
    fputc(' ', f);
    ir_print_value_type(f, w->g, v);
    switch (y->kind) {
    case WHY_ANNOTATION:
        fputs(": annotation, pinned\n", f);
        break;
    case WHY_USER:
        fputs(": set by hand in the IR (why(user)), pinned\n", f);
        break;
    case WHY_ROLE:
        fprintf(f, ": mesh-axis role, pinned: %s\n", y->detail ? y->detail : "");
        break;
    default:
        fputs(": no op made it\n", f);
        break;
    }
}

static int has_axis(const Sharding *sh, int rank, int ax)
{
    for (int d = 0; d < rank; d++)
        for (int i = 0; i < sh->naxes[d]; i++)
            if (sh->axes[d][i] == ax)
                return 1;
    return 0;
}

/* The first op that reads v and wants it split over ax (its rule asks so). */
static const Op *wanting_reader(const WhyChain *w, const Value *v, int ax, const ShardOpts *o)
{
    const Graph *g = w->g;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        Strategy st;
        int a = 0;
        while (a < op->nargs && a < SH_MAXARGS && op->args[a] != v)
            a++;
        if (a == op->nargs || a == SH_MAXARGS || !op->nres || op->kind == OP_UPDATE)
            continue;
        shard_strategy(g, op, o, &st);
        if (has_axis(&st.req[a], v->rank, ax))
            return op;
    }
    return NULL;
}

/* An axis no operand gave: its op took it from what its readers want (the
 * hints of the sweep, docs/passes.md) or its pin. Follow the readers forward
 * to the pinned value that wants it. */
static void put_wanted(FILE *f, const WhyChain *w, const Value *v, int ax, const ShardOpts *o)
{
    const Value *wish = o->wish && v->id < o->nuses ? o->wish[v->id] : NULL;
    if (wish) {
        fputs("    summed into the pinned gradient ", f);
        put_ref(f, w, wish);
        fputs(", so wished in its layout\n", f);
    }
    for (int n = 0; n < 64 && !shard_pinned(&v->shard); n++) {
        const Op *op = wanting_reader(w, v, ax, o);
        if (!op)
            return;
        v = op->res[0];
        fputs("    wanted so by ", f);
        put_op(f, op);
        fputs(" -> ", f);
        put_value(f, w, v, " ");
        fputc('\n', f);
    }
}

/* One op of a chain: which operand (and dim) gave the axis, and what the op
 * decided there. */
static void put_link(FILE *f, const WhyChain *w, const Link *l, int ax, const ShardOpts *o)
{
    const Op *op = l->v->def;
    const Graph *g = w->g;
    fputs("  ", f);
    put_loc(f, op->loc);
    fprintf(f, ": %s -> ", ir_ops[op->kind].name);
    put_ref(f, w, l->v);
    fputc(' ', f);
    ir_print_value_type(f, g, l->v);
    const AxisFrom *fr = &l->from;
    const Value *x = fr->arg >= 0 ? op->args[fr->arg] : NULL;
    fputs(": ", f);
    if (fr->how == FROM_NONE) {
        fputs("made here: ", f);
        put_why(f, &l->v->shard.why);
    } else if (fr->moved) {
        fputs("made here, by resharding ", f);
        put_ref(f, w, x);
        fprintf(f, " to split its dim %d", fr->dim);
    } else if (fr->how == FROM_PARTIAL) {
        fputs("the partial sum of ", f);
        put_ref(f, w, x);
        fputs(", handed on", f);
    } else if (fr->how == FROM_SUMMED) {
        fputs("sums over dim ", f);
        fprintf(f, "%d of ", fr->dim);
        put_ref(f, w, x);
        fprintf(f, ", split over %s", g->mesh.axes[ax].name);
    } else {
        fputs("from ", f);
        put_ref(f, w, x);
        fprintf(f, " dim %d", fr->dim);
    }
    fputc('\n', f);
    if (l->v->shard.why.kind == WHY_COST)
        fprintf(f, "    chosen by cost: %s\n", l->v->shard.why.detail);
    for (int a = 0; a < op->nargs && a < SH_MAXARGS; a++)
        if (!shard_same(&op->args[a]->shard, &l->st.req[a], op->args[a]->rank)) {
            fputs("    moves: ", f);
            put_moves(f, w, op, &l->st);
            fputc('\n', f);
            break;
        }
    if (fr->how == FROM_NONE)
        put_wanted(f, w, l->v, ax, o);
}

/* Follow mesh axis ax of v back to its origin; print from the origin on. */
static void put_chain(FILE *f, const WhyChain *w, Value *v, int ax, const ShardOpts *o)
{
    Graph *g = w->g;
    Link *links = arena_alloc(g->arena, sizeof(Link) * (size_t)(g->values.len + 1));
    int n = 0;
    while (n <= g->values.len) {
        const Op *op = v->def;
        int r = op ? result_index(op, v) : -1;
        if (shard_pinned(&v->shard) || !op || !op->nargs || op->kind == OP_UPDATE || r < 0)
            break;
        Link *l = &links[n++];
        l->v = v;
        shard_strategy(g, op, o, &l->st);
        shard_axis_from(op, &l->st, r, ax, &l->from);
        if (l->from.how == FROM_NONE || l->from.moved)
            break;
        v = op->args[l->from.arg];
    }
    if (!n || !(links[n - 1].from.how == FROM_NONE || links[n - 1].from.moved))
        put_origin(f, w, v);
    for (int i = n - 1; i >= 0; i--)
        put_link(f, w, &links[i], ax, o);
}

/* Each mesh axis of v's sharding, traced back. */
static void put_origins(FILE *f, const WhyChain *w, const ShardOpts *o)
{
    Value *v = w->v;
    const Graph *g = w->g;
    if (ir_shard_is_replicated(&v->shard, v->rank)) {
        fputs("replicated: every device holds all of it", f);
        if (v->shard.why.kind != WHY_NONE) {
            fputs(" (", f);
            put_why(f, &v->shard.why);
            fputc(')', f);
        }
        fputc('\n', f);
        return;
    }
    if (shard_pinned(&v->shard)) {
        fputs("pinned before propagation, kept by the sweep:\n", f);
        put_origin(f, w, v);
        return;
    }
    for (int d = 0; d < v->rank; d++)
        for (int i = 0; i < v->shard.naxes[d]; i++) {
            int ax = v->shard.axes[d][i];
            fprintf(f, "dim %d over %s, from:\n", d, g->mesh.axes[ax].name);
            put_chain(f, w, v, ax, o);
        }
    for (int ax = 0; ax < g->mesh.naxes; ax++)
        if (v->shard.partial >> ax & 1) {
            fprintf(f, "partial sum over %s, from:\n", g->mesh.axes[ax].name);
            put_chain(f, w, v, ax, o);
        }
}

/* The ways v's op weighed, cheapest first. */
static void put_weighed(FILE *f, const WhyChain *w, const ShardOpts *o)
{
    const Op *op = w->def;
    if (!op || !op->nargs || op->kind == OP_UPDATE || result_index(op, w->v) < 0)
        return;
    Strategy *ways = arena_alloc(w->g->arena, sizeof(Strategy) * WAYS);
    int n = shard_weigh(w->g, op, o, ways, WAYS), r = result_index(op, w->v), ok = 0;
    while (ok < n && ways[ok].comm < 1e29)
        ok++;
    fprintf(f, "weighed by ");
    put_op(f, op);
    fprintf(f, ": %d result layout%s, cost = bytes each device sends + 1 per collective%s:\n", ok,
            ok == 1 ? "" : "s",
            ok > 1 && ways[1].comm == ways[0].comm ? " (a tie goes to less on each device)" : "");
    for (int i = 0; i < ok && i < SHOW_WAYS; i++) {
        fprintf(f, "  %8.0f  ", ways[i].comm);
        put_type(f, w->g, w->v, &ways[i].out[r]);
        fputs(i ? "  " : "  chosen  ", f);
        put_moves(f, w, op, &ways[i]);
        fputc('\n', f);
    }
    if (ok > SHOW_WAYS)
        fprintf(f, "  and %d more, dearer\n", ok - SHOW_WAYS);
    if (ok && !shard_pinned(&w->v->shard) && !shard_same(&ways[0].out[r], &w->v->shard, w->v->rank))
        fputs("  (the last sweep left it otherwise: the partition pass reshards it after the op)\n",
              f);
}

/* The pinned summands of gradient v (zero >= 2: each microbatch's part,
 * reduce-scattered before the sum), down the shared adds of the sum and its
 * microbatch_sum. */
static void find_summands(WhyChain *w, const Value *v, int depth)
{
    const Op *op = v->def;
    if (!op || (op->kind != OP_ADD && op->kind != OP_MB_SUM) || op->mb >= 0 ||
        op->phase != PH_BWD || depth > 64)
        return;
    for (int a = 0; a < op->nargs; a++) {
        Value *x = op->args[a];
        if (x->shard.why.kind == WHY_ROLE && !x->name && w->nown < w->g->values.len)
            w->own[w->nown++] = x;
        else
            find_summands(w, x, depth + 1);
    }
}

/* A parameter's own values, after the shard pass: the values named after it
 * (PARAM.grad, PARAM.m, PARAM.bf16, ...), its gathered copies and the
 * pinned parts of its gradient. */
static void find_own(WhyChain *w)
{
    const Graph *g = w->g;
    const char *p = w->v->name;
    size_t len = p ? strlen(p) : 0;
    if (!w->def || w->def->kind != OP_PARAM || !p)
        return;
    w->own = arena_alloc(g->arena, sizeof(Value *) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->values.len; i++) {
        Value *x = g->values.data[i];
        const char *name = x->name;
        int named =
            name && !strncmp(name, p, len) && name[len] == '.' && !strchr(name + len + 1, '.');
        int copy = x->def && x->def->nargs == 1 && x->def->args[0] == w->v &&
                   x->shard.why.kind == WHY_ROLE;
        if (named || copy)
            w->own[w->nown++] = x;
        if (named && !strcmp(name + len, ".grad"))
            find_summands(w, x, 0);
    }
}

/* The value, where it is made, the reason the pass recorded. */
static void put_header(FILE *f, const WhyChain *w)
{
    fputs("why ", f);
    put_ref(f, w, w->v);
    fputs(" : ", f);
    ir_print_value_type(f, w->g, w->v);
    if (w->def && !w->def->nargs) {
        fprintf(f, "\n  %s declared at ", ir_ops[w->def->kind].name);
        put_loc(f, w->def->loc);
        put_context(f, w->def);
    } else if (w->def) {
        fputs("\n  made by ", f);
        put_op(f, w->def);
    }
    fputs("\n  reason: ", f);
    put_why(f, &w->v->shard.why);
    fputc('\n', f);
}

WhyChain *ex_why_trace(Ctx *c, Graph *g, const Settings *s, const char *name)
{
    WhyChain *w = arena_alloc(g->arena, sizeof *w);
    w->g = g;
    number(w);
    Value **m;
    int n = find(c, w, name, &m);
    if (!n)
        return NULL;
    int k = pick(m, n);
    w->v = m[k];
    w->def = w->v->def;
    ShardOpts o;
    shard_opts(g, (int)s->train.sequence_parallel, &o);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        BUG("open_memstream failed");
    put_header(f, w);
    if (n > 1)
        put_matches(f, w, name, m, n, k);
    put_origins(f, w, &o);
    put_weighed(f, w, &o);
    find_own(w);
    if (fclose(f) != 0)
        BUG("writing the why-chain failed");
    w->text = arena_strndup(g->arena, buf, len);
    free(buf);
    return w;
}

/* ---- after the partition pass: collectives ---- */

/* What x is a resharding of: back through the collectives and slices that
 * made it, stopping at stop. */
static const Value *base_of(const Value *x, const Value *stop)
{
    while (x != stop && x->def && is_comm(x->def))
        x = x->def->args[0];
    return x;
}

typedef struct Tally {
    const Op *seen[64];
    int nseen, count;
    double bytes;
} Tally;

/* The collectives from `from` to x, in order, as "a, then b". */
static void put_path(FILE *f, const Graph *g, const Value *x, const Value *from, Tally *t)
{
    const Op *ops[SH_MAXSTEPS * 2];
    int n = 0;
    for (const Value *y = x; y != from && y->def && is_comm(y->def) && n < SH_MAXSTEPS * 2;
         y = y->def->args[0])
        ops[n++] = y->def;
    for (int i = n - 1; i >= 0; i--) {
        double b = 0;
        fputs(i < n - 1 ? ", then " : "", f);
        put_comm(f, g, ops[i], &b);
        int dup = 0;
        for (int j = 0; j < t->nseen && !dup; j++)
            dup = t->seen[j] == ops[i];
        if (!dup && t->nseen < 64) {
            t->seen[t->nseen++] = ops[i];
            t->count += ops[i]->kind != OP_SHARD_SLICE;
            t->bytes += b;
        }
    }
}

/* The row max and sum a vocabulary-parallel cross_entropy(_grad) reads. */
static void put_vocab(FILE *f, const Graph *g, const Op *op, const char *ind, Tally *t)
{
    const Op *m = op->args[op->nargs - 3]->def;
    for (int i = 0; i < t->nseen; i++)
        if (t->seen[i] == m) {
            fprintf(f, "%svocabulary-parallel, with the row max and sum of exp above\n", ind);
            return;
        }
    fprintf(f, "%svocabulary-parallel, the logits never gathered: the row max by ", ind);
    put_path(f, g, op->args[op->nargs - 3], NULL, t);
    fputs("; the row sum of exp by ", f);
    put_path(f, g, op->args[op->nargs - 2], NULL, t);
    fputc('\n', f);
}

/* How v's op got its operands, and how v got to its pin, a line each after
 * ind; `quiet`: nothing when nothing moved. */
static void put_made(FILE *f, const WhyChain *w, const Value *v, const char *ind, int quiet,
                     Tally *t)
{
    const Graph *g = w->g;
    const Value *made = base_of(v, NULL);
    const Op *op = made->def;
    int n = 0;
    for (int a = 0; a < op->nargs; a++) {
        const Value *x = op->args[a], *b = base_of(x, NULL);
        if (b == x || b->id >= w->nvalues)
            continue;
        fprintf(f, "%sreads ", ind);
        put_ref(f, w, b);
        fputs(" after ", f);
        put_path(f, g, x, b, t);
        fputc('\n', f);
        n++;
    }
    if (op->kind == OP_CROSS_ENTROPY_SHARD || op->kind == OP_CROSS_ENTROPY_GRAD_SHARD)
        put_vocab(f, g, op, ind, t), n++;
    if (made != v) {
        fprintf(f, "%smakes it as ", ind);
        ir_print_value_type(f, g, made);
        fputs(", then to its pin by ", f);
        put_path(f, g, v, made, t);
        fputc('\n', f);
        n++;
    }
    if (!n && !quiet)
        fprintf(f, "%sreads its operands as they are\n", ind);
}

static int vocab_helper(const Op *op)
{
    const char *d = op->nres ? op->res[0]->shard.why.detail : NULL;
    return !is_comm(op) && op->kind != OP_CROSS_ENTROPY_SHARD &&
           op->kind != OP_CROSS_ENTROPY_GRAD_SHARD && d &&
           !strcmp(d, "vocabulary-parallel cross_entropy");
}

typedef struct Reader {
    const Value *via; /* what the reader reads: v, or a resharding of v */
    const Op *op;     /* NULL: the step's output */
} Reader;

static int collect_readers(const Graph *g, const Value *v, Reader *rd, int max)
{
    int n = 0;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (is_comm(op) || vocab_helper(op))
            continue;
        for (int a = 0; a < op->nargs && n < max; a++)
            if (base_of(op->args[a], v) == v && (!a || op->args[a] != op->args[a - 1]))
                rd[n++] = (Reader){op->args[a], op};
    }
    for (int i = 0; i < g->outputs.len && n < max; i++)
        if (base_of(g->outputs.data[i], v) == v)
            rd[n++] = (Reader){g->outputs.data[i], NULL};
    return n;
}

/* One reader (NULL: the step's output), and the collectives of its own:
 * a vocabulary-parallel cross_entropy's row statistics, an update's new
 * value brought to the parameter's layout. */
static void put_reader(FILE *f, const Graph *g, const Op *op, Tally *t)
{
    fputs("    ", f);
    if (op)
        put_op(f, op);
    else
        fputs("the step's output, whole on every device", f);
    fputc('\n', f);
    if (op && (op->kind == OP_CROSS_ENTROPY_SHARD || op->kind == OP_CROSS_ENTROPY_GRAD_SHARD))
        put_vocab(f, g, op, "      ", t);
    if (op && op->kind == OP_UPDATE && base_of(op->args[1], NULL) != op->args[1]) {
        fputs("      writes back the new value after ", f);
        put_path(f, g, op->args[1], NULL, t);
        fputc('\n', f);
    }
}

/* v's readers, grouped by what they read: v as it is, or a resharding. */
static void put_readers(FILE *f, const WhyChain *w, const Value *v, Tally *t)
{
    const Graph *g = w->g;
    Reader *rd = arena_alloc(g->arena, sizeof(Reader) * (size_t)(g->ops.len + g->outputs.len + 1));
    int n = collect_readers(g, v, rd, g->ops.len + g->outputs.len);
    if (!n) {
        fputs("  no op reads it\n", f);
        return;
    }
    for (int i = 0; i < n; i++) {
        int first = 1, count = 0;
        for (int j = 0; j < i && first; j++)
            first = rd[j].via != rd[i].via;
        if (!first)
            continue;
        if (rd[i].via == v) {
            fputs("  read as it is by:\n", f);
        } else {
            fputs("  resharded by ", f);
            put_path(f, g, rd[i].via, v, t);
            fputs(" to ", f);
            ir_print_value_type(f, g, rd[i].via);
            fputs(" for:\n", f);
        }
        for (int j = i; j < n; j++)
            if (rd[j].via == rd[i].via && count++ < SHOW_READERS)
                put_reader(f, g, rd[j].op, t);
        if (count > SHOW_READERS)
            fprintf(f, "    and %d more\n", count - SHOW_READERS);
    }
}

static void put_own(FILE *f, const WhyChain *w, Tally *t)
{
    for (int i = 0; i < w->nown; i++) {
        const Value *x = w->own[i];
        const Op *op = base_of(x, NULL)->def;
        fputs("  ", f);
        put_value(f, w, x, " : ");
        if (op && op->nargs) {
            fputs(", made by ", f);
            put_op(f, op);
        }
        fputc('\n', f);
        if (op && op->nargs)
            put_made(f, w, x, "    ", 1, t);
    }
}

void ex_why_print(FILE *f, const WhyChain *w)
{
    Tally t;
    memset(&t, 0, sizeof t);
    fputs(w->text, f);
    if (w->def && w->def->nargs) {
        fputs("its op, ", f);
        put_op(f, base_of(w->v, NULL)->def);
        fputs(":\n", f);
        put_made(f, w, w->v, "  ", 0, &t);
    }
    fputs("its readers:\n", f);
    put_readers(f, w, w->v, &t);
    if (w->nown) {
        fputs("its own values:\n", f);
        put_own(f, w, &t);
    }
    fprintf(f, "in all: %d collective%s, %.0f bytes sent by each device\n", t.count,
            t.count == 1 ? "" : "s", t.bytes);
}
