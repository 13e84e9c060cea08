/* simplify.c: Kernel IR simplification before any rendering.
 * Reads a built Kernel; rewrites its nodes and statements in place.
 * Key idea: three rewrites that change no result by a bit, for C, CUDA and
 * OpenCL alike:
 * - constant folding of + - * / and negation on literals, in the kernel's
 *   float type (a literal is rounded to it when it is rendered, so a folded
 *   f32 value is the float the unfolded code computed);
 * - common subexpressions: one node per distinct computation in scope (a node
 *   made inside an inner loop is not reused after it closes); a load only from
 *   a slot the kernel never stores to;
 * - hoisting: the nodes that depend on no loop index, no accumulator and no
 *   stored slot (a scalar made from hyperparameters and the step, such as
 *   AdamW's bias corrections 1 - beta^t) become the first `npre` statements,
 *   which the C rendering runs once per call, before its parallel loop, and
 *   the GPU renderings once per thread.
 * What nothing stores or reduces is dropped. */
#include "codegen.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The operand fields of node n that are nodes: a mask of a (1), b (2), c (4). */
static int operands(const KNode *n)
{
    switch (n->kind) {
    case KN_CONST: case KN_ICONST: case KN_IDX: case KN_ACC: return 0;
    case KN_LOAD: return 2;
    case KN_SELECT: return 7;
    case KN_ADD: case KN_SUB: case KN_MUL: case KN_DIV: case KN_MAX: case KN_MIN: case KN_POW:
    case KN_LT: case KN_EQ: case KN_LE: case KN_NE: case KN_IDIV: case KN_IMOD: case KN_HASH:
        return 3;
    default: return 1;
    }
}

/* A literal as an f32 kernel's C has it: its rendering (the shortest decimal
 * of the double, with an f) read as a float, which a halfway double's plain
 * conversion may round the other way. */
static float f32_literal(double x)
{
    char buf[48];
    fmt_double(buf, sizeof buf, x);
    return strtof(buf, NULL);
}

/* The folded value of float node n on literals x, y, in the kernel's type. */
static int fold_float(const Kernel *k, const KNode *n, double x, double y, double *out)
{
    if (k->ftype == DT_F32) {
        float a = f32_literal(x), b = f32_literal(y), r;
        switch (n->kind) {
        case KN_ADD: r = a + b; break;
        case KN_SUB: r = a - b; break;
        case KN_MUL: r = a * b; break;
        case KN_DIV: r = a / b; break;
        case KN_NEG: r = -a; break;
        default: return 0;
        }
        *out = r;
        return r == r; /* a NaN stays a computation */
    }
    switch (n->kind) {
    case KN_ADD: *out = x + y; break;
    case KN_SUB: *out = x - y; break;
    case KN_MUL: *out = x * y; break;
    case KN_DIV: *out = x / y; break;
    case KN_NEG: *out = -x; break;
    default: return 0;
    }
    return *out == *out;
}

static int fold_int(const KNode *n, int64_t x, int64_t y, int64_t *out)
{
    switch (n->kind) {
    case KN_ADD: *out = (int64_t)((uint64_t)x + (uint64_t)y); return 1;
    case KN_SUB: *out = (int64_t)((uint64_t)x - (uint64_t)y); return 1;
    case KN_MUL: *out = (int64_t)((uint64_t)x * (uint64_t)y); return 1;
    case KN_IDIV: if (y == 0 || (x == INT64_MIN && y == -1)) return 0; *out = x / y; return 1;
    case KN_IMOD: if (y == 0 || (x == INT64_MIN && y == -1)) return 0; *out = x % y; return 1;
    default: return 0;
    }
}

/* Node n with literal operands becomes a literal. */
static void fold(Kernel *k, KNode *n)
{
    const KNode *nd = k->nodes.data;
    int ops = operands(n);
    if (!ops || (ops & 4) || n->kind == KN_LOAD)
        return;
    const KNode *a = &nd[n->a], *b = (ops & 2) ? &nd[n->b] : a;
    if (n->type == KT_FLOAT && a->kind == KN_CONST && b->kind == KN_CONST) {
        double r;
        if (fold_float(k, n, a->imm, b->imm, &r))
            *n = (KNode){KN_CONST, KT_FLOAT, 0, 0, 0, r, 0};
    } else if (n->type == KT_INT && a->kind == KN_ICONST && b->kind == KN_ICONST) {
        int64_t r;
        if (fold_int(n, a->iimm, b->iimm, &r))
            *n = (KNode){KN_ICONST, KT_INT, 0, 0, 0, 0, r};
    }
}

static int same_node(const KNode *x, const KNode *y)
{
    return x->kind == y->kind && x->type == y->type && x->a == y->a && x->b == y->b &&
           x->c == y->c && !memcmp(&x->imm, &y->imm, sizeof x->imm) && x->iimm == y->iimm;
}

static uint64_t node_hash(const KNode *n)
{
    uint64_t h = 0xcbf29ce484222325ULL, bits;
    memcpy(&bits, &n->imm, sizeof bits);
    uint64_t w[6] = {(uint64_t)n->kind, (uint64_t)n->type, (uint64_t)(int64_t)n->a,
                     (uint64_t)(int64_t)n->b, bits ^ (uint64_t)(int64_t)n->c, (uint64_t)n->iimm};
    for (int i = 0; i < 6; i++)
        h = (h ^ w[i]) * 0x100000001b3ULL;
    return h;
}

typedef struct Seen {
    int cap;
    int *node;   /* by slot: a node in scope, -1 */
    int *depth;  /* by slot: the loop depth it was made at */
} Seen;

static int *seen_slot(Seen *s, const KNode *nodes, const KNode *n)
{
    for (int i = (int)(node_hash(n) & (uint64_t)(s->cap - 1));; i = (i + 1) & (s->cap - 1))
        if (s->node[i] < 0 || same_node(&nodes[s->node[i]], n))
            return &s->node[i];
}

/* Leaving a loop: forget what was made inside it (rebuilt without those). */
static void seen_close(Seen *s, const KNode *nodes, int depth, Arena *a)
{
    int *node = s->node, *dep = s->depth;
    s->node = arena_alloc(a, sizeof(int) * (size_t)s->cap);
    s->depth = arena_alloc(a, sizeof(int) * (size_t)s->cap);
    for (int i = 0; i < s->cap; i++)
        s->node[i] = -1;
    for (int i = 0; i < s->cap; i++)
        if (node[i] >= 0 && dep[i] <= depth) {
            int *slot = seen_slot(s, nodes, &nodes[node[i]]);
            *slot = node[i];
            s->depth[slot - s->node] = dep[i];
        }
}

void cg_simplify(Kernel *k)
{
    if (k->pattern == KP_ATTENTION || k->pattern == KP_ATTENTION_BWD || k->npre)
        return;
    Arena *a = k->arena;
    int nn = k->nodes.len, ns = k->body.len;
    KNode *nd = k->nodes.data;
    char stored[64] = {0};
    for (int s = 0; s < ns; s++)
        if (k->body.data[s].kind == KS_STORE || k->body.data[s].kind == KS_STORE_ADD)
            stored[k->body.data[s].a] = 1;
    int *rep = arena_alloc(a, sizeof(int) * (size_t)(nn + 1));
    char *inv = arena_alloc(a, (size_t)nn + 1), *keep = arena_alloc(a, (size_t)ns + 1);
    for (int i = 0; i < nn; i++)
        rep[i] = i, inv[i] = 0;
    Seen seen = {16, NULL, NULL};
    while (seen.cap < 2 * nn + 2)
        seen.cap *= 2;
    seen.node = arena_alloc(a, sizeof(int) * (size_t)seen.cap);
    seen.depth = arena_alloc(a, sizeof(int) * (size_t)seen.cap);
    for (int i = 0; i < seen.cap; i++)
        seen.node[i] = -1;
    /* forward: operands through their representatives, folding, the table in scope */
    for (int s = 0, depth = 0; s < ns; s++) {
        KStmt *t = &k->body.data[s];
        keep[s] = 1;
        if (t->kind == KS_LOOP) {
            depth++;
            continue;
        }
        if (t->kind == KS_END) {
            seen_close(&seen, nd, --depth, a);
            continue;
        }
        if (t->kind != KS_NODE) {
            if (t->kind == KS_STORE || t->kind == KS_STORE_ADD)
                t->b = rep[t->b], t->c = rep[t->c];
            else if (t->kind == KS_REDUCE)
                t->b = rep[t->b];
            continue;
        }
        KNode *n = &nd[t->a];
        int ops = operands(n);
        if (ops & 1)
            n->a = rep[n->a];
        if (ops & 2)
            n->b = rep[n->b];
        if (ops & 4)
            n->c = rep[n->c];
        fold(k, n);
        ops = operands(n);
        int in = n->kind == KN_CONST || n->kind == KN_ICONST ||
                 (n->kind == KN_LOAD && !stored[n->a] && inv[n->b]) ||
                 (n->kind != KN_LOAD && n->kind != KN_IDX && n->kind != KN_ACC && ops &&
                  (!(ops & 1) || inv[n->a]) && (!(ops & 2) || inv[n->b]) && (!(ops & 4) || inv[n->c]));
        inv[t->a] = (char)in;
        if (n->kind == KN_ACC || (n->kind == KN_LOAD && stored[n->a]))
            continue;
        int *slot = seen_slot(&seen, nd, n);
        if (*slot >= 0) { /* computed already, in scope */
            rep[t->a] = *slot;
            keep[s] = 0;
            continue;
        }
        *slot = t->a;
        seen.depth[slot - seen.node] = in ? 0 : depth; /* an invariant moves to the top */
    }
    /* backward: what a store or a reduction needs */
    char *live = arena_alloc(a, (size_t)nn + 1);
    memset(live, 0, (size_t)nn + 1);
    for (int s = ns - 1; s >= 0; s--) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_STORE || t->kind == KS_STORE_ADD)
            live[t->b] = live[t->c] = 1;
        else if (t->kind == KS_REDUCE)
            live[t->b] = 1;
        else if (t->kind == KS_NODE && keep[s] && live[t->a]) {
            const KNode *n = &nd[t->a];
            int ops = operands(n);
            if (ops & 1)
                live[n->a] = 1;
            if (ops & 2)
                live[n->b] = 1;
            if (ops & 4)
                live[n->c] = 1;
        }
    }
    /* the new body: the live invariants, then the rest; loops renumbered */
    KStmt *old = arena_alloc(a, sizeof(KStmt) * (size_t)(ns + 1));
    memcpy(old, k->body.data, sizeof(KStmt) * (size_t)ns);
    int *where = arena_alloc(a, sizeof(int) * (size_t)(ns + 1)), n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int s = 0; s < ns; s++) {
            const KStmt *t = &old[s];
            int node = t->kind == KS_NODE;
            if (node && (!keep[s] || !live[t->a]))
                continue;
            if ((pass == 0) != (node && inv[t->a]))
                continue;
            where[s] = n;
            k->body.data[n++] = *t;
        }
        if (pass == 0)
            k->npre = n;
    }
    k->body.len = n;
    for (int s = 0; s < n; s++)
        if (k->body.data[s].kind == KS_REDUCE)
            k->body.data[s].a = where[k->body.data[s].a];
    for (int i = 0; i < nn; i++)
        if (nd[i].kind == KN_ACC)
            nd[i].a = where[nd[i].a];
}
