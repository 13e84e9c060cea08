/* emit_gpu.c: Kernel IR -> CUDA C (for NVRTC) and OpenCL C (for PoCL).
 * Reads one Kernel; writes one kernel function. Both languages share one
 * mapping and one scalar printer; only spellings differ (qualifiers, thread
 * ids, barriers, math names) and one step: where CUDA reduces within a warp
 * with shuffles, OpenCL goes through local memory (docs/codegen.md).
 *
 * The mappings:
 * - pointwise: a thread per item, 256 a block. When every access is the
 *   item's own f32 element, a thread takes 4 items with 16-byte loads and
 *   stores (float4 / vload4).
 * - row: a block per item; the inner loops at the top of the body are
 *   strided over the block's threads (coalesced along the row), each loop's
 *   reduction is a block reduction whose result every thread sees, and
 *   stores outside loops are made by thread 0. A row kernel that adds into
 *   memory inside a loop (the embedding gradient) is mapped a thread per
 *   item instead, with its loops run by the thread: no two threads then add
 *   into one element. A row kernel whose loops walk down columns (a sum over
 *   rows) takes 32 neighbouring items a block, 8 threads each, so that a
 *   row's 32 elements are read together.
 * - attention: a block per (batch, head, 4 query rows), a warp per row,
 *   keys and values streamed through shared memory a tile at a time, with an
 *   online softmax. The backward recomputes each row's statistics, then
 *   per tile accumulates dq in registers and adds dk, dv into memory with
 *   atomics (the plan zeroes them before). */
#include "kgen.h"

#include <stdlib.h>
#include <string.h>

enum { PW_BLOCK = 256, ROW_MAX_BLOCK = 256 };
enum { COL_ITEMS = 32, COL_THREADS = 8 }; /* the column mapping's block: 32 x 8 */

typedef struct G {
    FILE *f;
    const Kernel *k;
    CgLang lang;
    int f32;     /* the float type is float */
    int lane;    /* >= 0: temporaries are per vector lane (t5_2) */
    int block;   /* row mapping: threads per block, else 0 */
    int cols;    /* column mapping: 32 items a block, 8 threads an item */
    char *toplv; /* by statement: a loop at the top of the body (strided over the block) */
    char *used;  /* by node: something stored or reduced depends on it */
    char *later; /* vec4: the nodes the lanes after the first need (not the index of a load
                    of one element for all 4 items: lane 0 loads it) */
    char *pre;   /* by node: made in the prologue (Kernel.npre), one for every lane */
    int i0_used; /* a node reads the parallel index */
} G;

static const char *ft(const G *g) { return g->f32 ? "float" : "double"; }

/* Node n is the parallel index itself. */
static int is_item(const Kernel *k, int n)
{
    return k->nodes.data[n].kind == KN_IDX && k->nodes.data[n].a == 0;
}

/* A math function's name: CUDA spells the float ones with an f. */
static const char *mf(const G *g, const char *name)
{
    static char buf[16];
    if (g->lang == CG_CUDA && g->f32) {
        snprintf(buf, sizeof buf, "%sf", name);
        return buf;
    }
    return name;
}

static const char *inf(const G *g) { return g->f32 ? "TCC_INF_F" : "TCC_INF_D"; }

static void literal(G *g, double x)
{
    char buf[48];
    if (x != x)
        fprintf(g->f, "(%s)(%s - %s)", ft(g), inf(g), inf(g));
    else if (x == 1.0 / 0.0 || x == -1.0 / 0.0)
        fprintf(g->f, "%s%s", x < 0 ? "-" : "", inf(g));
    else {
        fmt_double(buf, sizeof buf, x);
        fprintf(g->f, "%s%s", buf, g->f32 ? "f" : "");
    }
}

static void tmp(G *g, int node)
{
    if (g->lane >= 0 && !g->pre[node])
        fprintf(g->f, "t%d_%d", node, g->lane);
    else
        fprintf(g->f, "t%d", node);
}

/* The load of slot s at index node i, widened to the arithmetic type. */
static void load(G *g, int s, int i, int fl)
{
    DType t = g->k->arg_dtype[s];
    if (!fl) {
        fprintf(g->f, "(tcc_i64)a%d[", s);
        tmp(g, i);
        fputs("]", g->f);
    } else if (t == DT_BF16) {
        fprintf(g->f, "(%s)tcc_bf2f(a%d[", ft(g), s);
        tmp(g, i);
        fputs("])", g->f);
    } else {
        fprintf(g->f, "(%s)a%d[", ft(g), s);
        tmp(g, i);
        fputs("]", g->f);
    }
}

static void bin(G *g, int a, const char *op, int b)
{
    tmp(g, a);
    fprintf(g->f, " %s ", op);
    tmp(g, b);
}

static void call(G *g, const char *fn, int a, int b)
{
    fprintf(g->f, "%s(", mf(g, fn));
    tmp(g, a);
    if (b >= 0) {
        fputs(", ", g->f);
        tmp(g, b);
    }
    fputs(")", g->f);
}

static void expr(G *g, const KNode *n, int vec)
{
    FILE *f = g->f;
    int fl = n->type == KT_FLOAT;
    switch (n->kind) {
    case KN_CONST: literal(g, n->imm); return;
    case KN_ICONST: fprintf(f, "(tcc_i64)%lldLL", (long long)n->iimm); return;
    case KN_IDX:
        if (vec && n->a == 0)
            fprintf(f, "4 * q + %d", g->lane);
        else
            fprintf(f, "i%d", n->a);
        return;
    case KN_LOAD:
        if (vec && is_item(g->k, n->b) && g->k->arg_dtype[n->a] == DT_BF16)
            fprintf(f, "(%s)tcc_bf2f(v%d.%c)", ft(g), n->a, "xyzw"[g->lane]);
        else if (vec && is_item(g->k, n->b))
            fprintf(f, "v%d.%c", n->a, "xyzw"[g->lane]);
        else
            load(g, n->a, n->b, fl);
        return;
    case KN_ACC: fprintf(f, "acc%d", n->a); return;
    case KN_ADD: bin(g, n->a, "+", n->b); return;
    case KN_SUB: bin(g, n->a, "-", n->b); return;
    case KN_MUL: bin(g, n->a, "*", n->b); return;
    case KN_DIV: case KN_IDIV: bin(g, n->a, "/", n->b); return;
    case KN_IMOD: bin(g, n->a, "%", n->b); return;
    case KN_MAX: case KN_MIN:
        if (fl) {
            call(g, n->kind == KN_MAX ? "fmax" : "fmin", n->a, n->b);
        } else {
            bin(g, n->a, n->kind == KN_MAX ? ">" : "<", n->b);
            fputs(" ? ", f);
            bin(g, n->a, ":", n->b);
        }
        return;
    case KN_POW: call(g, "pow", n->a, n->b); return;
    case KN_NEG: fputs("-", f), tmp(g, n->a); return;
    case KN_EXP: call(g, "exp", n->a, -1); return;
    case KN_LOG: call(g, "log", n->a, -1); return;
    case KN_SQRT: call(g, "sqrt", n->a, -1); return;
    case KN_RSQRT: call(g, "rsqrt", n->a, -1); return;
    case KN_TANH: call(g, "tanh", n->a, -1); return;
    case KN_COS: call(g, "cos", n->a, -1); return;
    case KN_SIN: call(g, "sin", n->a, -1); return;
    case KN_ABS: call(g, "fabs", n->a, -1); return;
    case KN_FLOOR: call(g, "floor", n->a, -1); return;
    case KN_ERF: call(g, "erf", n->a, -1); return;
    case KN_LT: fputs("(tcc_i64)(", f), bin(g, n->a, "<", n->b), fputs(")", f); return;
    case KN_EQ: fputs("(tcc_i64)(", f), bin(g, n->a, "==", n->b), fputs(")", f); return;
    case KN_LE: fputs("(tcc_i64)(", f), bin(g, n->a, "<=", n->b), fputs(")", f); return;
    case KN_NE: fputs("(tcc_i64)(", f), bin(g, n->a, "!=", n->b), fputs(")", f); return;
    case KN_SELECT:
        tmp(g, n->a), fputs(" ? ", f), bin(g, n->b, ":", n->c);
        return;
    case KN_TOFLOAT: fprintf(f, "(%s)", ft(g)), tmp(g, n->a); return;
    case KN_TOINT: fputs("(tcc_i64)", f), tmp(g, n->a); return;
    case KN_HASH: fputs("tcc_hash(", f), bin(g, n->a, ",", n->b), fputs(")", f); return;
    case KN_BF16: fprintf(f, "(%s)tcc_bf2f(tcc_f2bf((float)", ft(g)), tmp(g, n->a), fputs("))", f); return;
    case KN_COUNT: break;
    }
    UNREACHABLE();
}

static void indent(G *g, int depth)
{
    for (int i = 0; i < depth; i++)
        fputs("    ", g->f);
}

static void node(G *g, int n, int depth, int vec)
{
    const KNode *nd = &g->k->nodes.data[n];
    if (!g->used[n])
        return;
    indent(g, depth);
    fprintf(g->f, "const %s ", nd->type == KT_FLOAT ? ft(g) : "tcc_i64");
    tmp(g, n);
    fputs(" = ", g->f);
    expr(g, nd, vec);
    fputs(";\n", g->f);
}

/* The value v of the arithmetic type as slot s stores it. */
static void stored(G *g, int s, int v)
{
    if (g->k->arg_dtype[s] == DT_BF16) {
        fputs("tcc_f2bf((float)", g->f);
        tmp(g, v);
        fputs(")", g->f);
    } else {
        fprintf(g->f, "(%s)", cg_gpu_storage(g->k->arg_dtype[s]));
        tmp(g, v);
    }
}

static void store(G *g, const KStmt *t)
{
    FILE *f = g->f;
    fprintf(f, "a%d[", t->a);
    tmp(g, t->b);
    fputs("] = ", f);
    if (t->kind == KS_STORE) {
        stored(g, t->a, t->c);
    } else if (g->k->arg_dtype[t->a] == DT_BF16) {
        fprintf(f, "tcc_f2bf(tcc_bf2f(a%d[", t->a);
        tmp(g, t->b);
        fputs("]) + (float)", f);
        tmp(g, t->c);
        fputs(")", f);
    } else {
        fprintf(f, "a%d[", t->a);
        tmp(g, t->b);
        fprintf(f, "] + (%s)", cg_gpu_storage(g->k->arg_dtype[t->a]));
        tmp(g, t->c);
    }
    fputs(";\n", f);
}

/* Whether node n can differ between items: it is not one of the kernel's
 * invariants, which cg_simplify moved to the prologue (codegen/simplify.c;
 * a kernel it did not simplify has none, and every load is then a lane's). */
static int on_item(const Kernel *k, int n)
{
    for (int s = 0; s < k->npre; s++)
        if (k->body.data[s].kind == KS_NODE && k->body.data[s].a == n)
            return 0;
    return 1;
}

/* Which nodes a store or a reduction needs, walking the statements back
 * (a node's operands come before it). In the 4-lane form a load of the
 * item's own element reads its vector, not its index. */
/* The nodes that statements need: stores' values (and indices unless vec),
 * reductions', and recursively their operands. With one_load, a load of one
 * element for the 4 items of a vec4 thread needs no index: the lanes after
 * the first take lane 0's value (vec4_kernel). */
static void mark_nodes(const Kernel *k, char *used, int vec, int one_load, int *i0)
{
    for (int s = k->body.len - 1; s >= 0; s--) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_STORE || t->kind == KS_STORE_ADD)
            used[t->b] = !vec, used[t->c] = 1;
        else if (t->kind == KS_REDUCE)
            used[t->b] = 1;
        if (t->kind != KS_NODE || !used[t->a])
            continue;
        const KNode *n = &k->nodes.data[t->a];
        switch (n->kind) {
        case KN_CONST: case KN_ICONST: case KN_ACC: break;
        case KN_IDX: *i0 |= n->a == 0; break;
        case KN_LOAD: /* (one_load: lane 0's value serves only where no item differs) */
            if (!vec || (!is_item(k, n->b) && (!one_load || on_item(k, n->b))))
                used[n->b] = 1;
            break;
        case KN_SELECT: used[n->c] = 1; /* fall through */
        case KN_ADD: case KN_SUB: case KN_MUL: case KN_DIV: case KN_MAX: case KN_MIN:
        case KN_POW: case KN_LT: case KN_EQ: case KN_LE: case KN_NE: case KN_IDIV: case KN_IMOD:
        case KN_HASH:
            used[n->b] = 1; /* fall through */
        default: used[n->a] = 1; break;
        }
    }
}

static void mark_used(G *g, int vec)
{
    const Kernel *k = g->k;
    int i0 = 0;
    g->used = calloc((size_t)k->nodes.len + 1, 1);
    g->later = calloc((size_t)k->nodes.len + 1, 1);
    if (!g->used || !g->later)
        BUG("out of memory");
    mark_nodes(k, g->used, vec, 0, &g->i0_used);
    if (vec)
        mark_nodes(k, g->later, vec, 1, &i0);
}

static const char *red_name(int r) { return r == KR_SUM ? "sum" : r == KR_MAX ? "max" : "min"; }

/* The body: loops at the top strided over the block in the row mapping,
 * every other loop run by the thread. */
static void body(G *g, int depth0)
{
    const Kernel *k = g->k;
    int depth = depth0, level = 0, open[64], nopen = 0;
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        switch (t->kind) {
        case KS_NODE: node(g, t->a, depth, 0); break;
        case KS_LOOP: {
            int r = cg_loop_reduce(k, s);
            if (r >= 0) {
                indent(g, depth);
                fprintf(g->f, "%s acc%d = ", ft(g), s);
                literal(g, r == KR_SUM ? 0.0 : r == KR_MAX ? -1.0 / 0.0 : 1.0 / 0.0);
                fputs(";\n", g->f);
            }
            level++;
            indent(g, depth);
            if (g->toplv && g->toplv[s] && g->cols)
                fprintf(g->f, "for (tcc_i64 i%d = ty; i%d < (valid ? %lldLL : 0); i%d += %d) {\n",
                        level, level, (long long)t->extent, level, COL_THREADS);
            else if (g->toplv && g->toplv[s])
                fprintf(g->f, "for (tcc_i64 i%d = TCC_TID; i%d < %lldLL; i%d += %d) {\n", level,
                        level, (long long)t->extent, level, g->block);
            else
                fprintf(g->f, "for (tcc_i64 i%d = 0; i%d < %lldLL; i%d++) {\n", level, level,
                        (long long)t->extent, level);
            open[nopen++] = s;
            depth++;
            break;
        }
        case KS_REDUCE:
            indent(g, depth);
            if (t->c == KR_SUM)
                fprintf(g->f, "acc%d += t%d;\n", t->a, t->b);
            else
                fprintf(g->f, "acc%d = %s(acc%d, t%d);\n", t->a,
                        mf(g, t->c == KR_MAX ? "fmax" : "fmin"), t->a, t->b);
            break;
        case KS_END: {
            int s0 = open[--nopen];
            level--;
            depth--;
            indent(g, depth);
            fputs("}\n", g->f);
            if (g->toplv && g->toplv[s0]) {
                int r = cg_loop_reduce(k, s0);
                indent(g, depth);
                if (r >= 0)
                    fprintf(g->f, "acc%d = tcc_%s_%s_%c(acc%d, tcc_red);\n", s0,
                            g->cols ? "cols" : "block", red_name(r),
                            g->f32 ? 'f' : 'd', s0);
                else
                    fputs("TCC_BARRIER();\n", g->f); /* its stores before later loads */
            }
            break;
        }
        case KS_STORE:
        case KS_STORE_ADD:
            indent(g, depth);
            if (g->block && nopen == 0)
                fputs(g->cols ? "if (valid && ty == 0) " : "if (TCC_TID == 0) ", g->f);
            store(g, t);
            break;
        }
    }
}

/* ---- mappings ---- */

typedef enum { M_THREAD, M_VEC4, M_ROW, M_COLS, M_ATTN } Mapping;

static int64_t eval_at(const Kernel *k, int n, int64_t x0, int64_t x1, int *ok);

/* The dtypes a thread moves 4 of at once: f32 (16 bytes), bf16 (8). */
static int vec_dtype(DType t) { return t == DT_F32 || t == DT_BF16; }

/* The vector type of 4 elements of slot s (vec4_kernel). */
static const char *vec_type(const Kernel *k, int s) { return k->arg_dtype[s] == DT_BF16 ? "ushort4" : "float4"; }

/* A pointwise kernel, 4 | extent, whose stores are to the item's own f32 or
 * bf16 element, with no load of a slot after a store to it. A load of the
 * item's own element is one vector load for the 4; a load whose index reads
 * no item (a hyperparameter) is lane 0's for all 4; any other load (a bias
 * at i % W, a row's value at i / W, a slice's element) is each lane's own.
 * (Lane 0's load once served every load that agreed over items 0..3 of the
 * first thread, and a row's value at i / 6 then read row 0's for items 6
 * and 7.) Not with lane loads beside sines, cosines, powers or float
 * divides: rope's 4 lanes of sinf, cosf and powf spilled registers, and
 * mixtral's gate renormalization's 4 divides with 4 lane loads 4 bytes. */
static int vec4_ok(const Kernel *k)
{
    if (k->pattern != KP_POINTWISE || k->levels || k->extent % 4)
        return 0;
    char stored_[64] = {0};
    int any = 0, lane_loads = 0, heavy = 0;
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_LOOP || t->kind == KS_STORE_ADD)
            return 0;
        if (t->kind == KS_STORE) {
            if (!is_item(k, t->b) || !vec_dtype(k->arg_dtype[t->a]))
                return 0;
            stored_[t->a] = 1;
            any = 1;
        }
        if (t->kind != KS_NODE)
            continue;
        const KNode *n = &k->nodes.data[t->a];
        heavy |= n->kind == KN_SIN || n->kind == KN_COS || n->kind == KN_POW ||
                 (n->kind == KN_DIV && n->type == KT_FLOAT);
        if (n->kind != KN_LOAD)
            continue;
        if (stored_[n->a] || (is_item(k, n->b) && !vec_dtype(k->arg_dtype[n->a])))
            return 0;
        lane_loads |= !is_item(k, n->b) && on_item(k, n->b);
    }
    return any && !(lane_loads && heavy);
}

/* Some loop adds into memory: threads of a block would race. */
static int adds_in_loop(const Kernel *k)
{
    int depth = 0;
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        depth += t->kind == KS_LOOP ? 1 : t->kind == KS_END ? -1 : 0;
        if (t->kind == KS_STORE_ADD && depth > 0)
            return 1;
    }
    return 0;
}

/* The value of int node n at i0 = x0, i1 = x1 (deeper loop indices 0); 0
 * with *ok cleared where it depends on memory or is not integer arithmetic. */
static int64_t eval_at(const Kernel *k, int n, int64_t x0, int64_t x1, int *ok)
{
    const KNode *d = &k->nodes.data[n];
    if (d->type != KT_INT || !*ok) {
        *ok = 0;
        return 0;
    }
    int64_t a = 0, b = 0;
    switch (d->kind) {
    case KN_ICONST: return d->iimm;
    case KN_IDX: return d->a == 0 ? x0 : d->a == 1 ? x1 : 0;
    case KN_ADD: case KN_SUB: case KN_MUL: case KN_IDIV: case KN_IMOD: case KN_MAX: case KN_MIN:
        a = eval_at(k, d->a, x0, x1, ok);
        b = eval_at(k, d->b, x0, x1, ok);
        break;
    default: *ok = 0; return 0;
    }
    switch (d->kind) {
    case KN_ADD: return a + b;
    case KN_SUB: return a - b;
    case KN_MUL: return a * b;
    case KN_IDIV: return b ? a / b : (*ok = 0);
    case KN_IMOD: return b ? a % b : (*ok = 0);
    case KN_MAX: return a > b ? a : b;
    default: return a < b ? a : b;
    }
}

/* A row kernel whose loops walk down columns: the first float load in a top
 * level loop steps by more than one element along the loop and by one along
 * the items (a reduction over rows: sum_to of a bias gradient). A block per
 * item would read a column with a stride; 32 neighbouring items a block
 * read 32 neighbouring elements per row instead. */
static int column_walk(const Kernel *k)
{
    if (k->extent < COL_ITEMS)
        return 0;
    for (int s = 0, depth = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        depth += t->kind == KS_LOOP ? 1 : t->kind == KS_END ? -1 : 0;
        if (t->kind != KS_NODE || depth != 1)
            continue;
        const KNode *n = &k->nodes.data[t->a];
        if (n->kind != KN_LOAD || n->type != KT_FLOAT)
            continue;
        int ok = 1;
        int64_t base = eval_at(k, n->b, 0, 0, &ok), d0 = eval_at(k, n->b, 1, 0, &ok) - base,
                d1 = eval_at(k, n->b, 0, 1, &ok) - base;
        return ok && d0 == 1 && (d1 > 1 || d1 < -1);
    }
    return 0;
}

static Mapping mapping(const Kernel *k)
{
    if (k->pattern == KP_ATTENTION || k->pattern == KP_ATTENTION_BWD)
        return M_ATTN;
    if (vec4_ok(k))
        return M_VEC4;
    if (k->levels && !adds_in_loop(k))
        return column_walk(k) ? M_COLS : M_ROW;
    return M_THREAD;
}

/* Threads of a row block: a power of two from 32 to 256 that covers the
 * longest loop at the top of the body. */
static int row_block(const Kernel *k)
{
    int64_t longest = 1;
    int depth = 0;
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_LOOP && depth == 0 && t->extent > longest)
            longest = t->extent;
        depth += t->kind == KS_LOOP ? 1 : t->kind == KS_END ? -1 : 0;
    }
    int b = 32;
    while (b < ROW_MAX_BLOCK && b < longest)
        b *= 2;
    return b;
}

CgLaunch cg_gpu_launch(const Kernel *k)
{
    if (k->extent < 1 && k->pattern != KP_ATTENTION && k->pattern != KP_ATTENTION_BWD)
        return (CgLaunch){0, 0}; /* no work items: nothing to launch */
    switch (mapping(k)) {
    case M_ATTN: return cg_attention_launch(k);
    case M_VEC4: return (CgLaunch){(k->extent / 4 + PW_BLOCK - 1) / PW_BLOCK, PW_BLOCK};
    case M_ROW: return (CgLaunch){k->extent, row_block(k)};
    case M_COLS: return (CgLaunch){(k->extent + COL_ITEMS - 1) / COL_ITEMS, COL_ITEMS * COL_THREADS};
    case M_THREAD: break;
    }
    return (CgLaunch){(k->extent + PW_BLOCK - 1) / PW_BLOCK, PW_BLOCK};
}

/* The tensor-core attention asks for one block a multiprocessor at least
 * (__launch_bounds__'s second number): left to aim at more, ptxas caps a
 * 128-wide head's kernel at 128 registers and spills. */
static void signature(G *g, int block)
{
    const Kernel *k = g->k;
    if (g->lang == CG_CUDA)
        fprintf(g->f, "extern \"C\" __global__ void __launch_bounds__(%d%s) %s(", block,
                cg_attention_tensor_cores(k) ? ", 1" : "", k->name);
    else
        fprintf(g->f, "__kernel __attribute__((reqd_work_group_size(%d, 1, 1))) void %s(", block,
                k->name);
    for (int i = 0; i < k->nargs; i++)
        fprintf(g->f, "%s%s%s *%sa%d", i ? ", " : "", g->lang == CG_OPENCL ? "__global " : "",
                cg_gpu_storage(k->arg_dtype[i]), g->lang == CG_CUDA ? "__restrict__ " : "restrict ", i);
    fputs(")\n{\n", g->f);
}

static void thread_kernel(G *g)
{
    fprintf(g->f, "    const tcc_i64 i0 = TCC_BID * %dLL + TCC_TID;\n    if (i0 >= %lldLL)\n"
                  "        return;\n", PW_BLOCK, (long long)g->k->extent);
    body(g, 1);
}

static void row_kernel(G *g)
{
    const Kernel *k = g->k;
    g->toplv = calloc((size_t)k->body.len + 1, 1);
    if (!g->toplv)
        BUG("out of memory");
    int reduces = 0;
    for (int s = 0, depth = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_LOOP && depth == 0) {
            g->toplv[s] = 1;
            reduces |= cg_loop_reduce(k, s) >= 0;
        }
        depth += t->kind == KS_LOOP ? 1 : t->kind == KS_END ? -1 : 0;
    }
    if (reduces)
        fprintf(g->f, "    TCC_SHARED %s tcc_red[%d];\n", ft(g),
                g->cols || g->lang == CG_OPENCL ? g->block : 32);
    if (g->cols) /* items past the end run along to the barriers, touching nothing */
        fprintf(g->f, "    const int ty = TCC_TID / %d;\n"
                      "    const tcc_i64 item = TCC_BID * %dLL + TCC_TID %% %d;\n"
                      "    const int valid = item < %lldLL;\n"
                      "    const tcc_i64 i0 = valid ? item : %lldLL;\n",
                COL_ITEMS, COL_ITEMS, COL_ITEMS, (long long)k->extent, (long long)k->extent - 1);
    else if (g->i0_used)
        fputs("    const tcc_i64 i0 = TCC_BID;\n", g->f);
    body(g, 1);
    free(g->toplv);
    g->toplv = NULL;
}

/* Four items a thread: one 16-byte load per f32 argument read (8 bytes for
 * bf16), the body once per lane on its component, one 16-byte (8-byte) store
 * per argument written. */
static void vec4_kernel(G *g)
{
    const Kernel *k = g->k;
    FILE *f = g->f;
    char loaded[64] = {0}, written[64] = {0};
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_NODE && k->nodes.data[t->a].kind == KN_LOAD &&
            is_item(k, k->nodes.data[t->a].b))
            loaded[k->nodes.data[t->a].a] = 1;
        if (t->kind == KS_STORE)
            written[t->a] = 1;
    }
    fprintf(f, "    const tcc_i64 q = TCC_BID * %dLL + TCC_TID;\n    if (q >= %lldLL)\n        return;\n",
            PW_BLOCK, (long long)k->extent / 4);
    for (int s = 0; s < k->nargs; s++) {
        const char *v4 = vec_type(k, s);
        if (loaded[s] && g->lang == CG_CUDA)
            fprintf(f, "    const %s v%d = reinterpret_cast<const %s *>(a%d)[q];\n", v4, s, v4, s);
        else if (loaded[s])
            fprintf(f, "    const %s v%d = vload4(q, a%d);\n", v4, s, s);
        if (written[s])
            fprintf(f, "    %s w%d;\n", v4, s);
    }
    for (int s = 0; s < k->npre; s++) /* the same for every lane: once */
        node(g, k->body.data[s].a, 1, 0);
    for (g->lane = 0; g->lane < 4; g->lane++)
        for (int s = k->npre; s < k->body.len; s++) {
            const KStmt *t = &k->body.data[s];
            const KNode *n = t->kind == KS_NODE ? &k->nodes.data[t->a] : NULL;
            if (n && g->lane > 0 && !g->later[t->a])
                continue; /* only lane 0 needs it: the index of a load for all 4 */
            if (n && g->lane > 0 && g->used[t->a] && n->kind == KN_LOAD && !is_item(k, n->b) &&
                !on_item(k, n->b)) {
                /* one element for the 4 items (vec4_ok): lane 0's load (its index's
                   computation in the other lanes is then dead) */
                fprintf(f, "    const %s t%d_%d = t%d_0;\n", n->type == KT_FLOAT ? ft(g) : "tcc_i64",
                        t->a, g->lane, t->a);
            } else if (t->kind == KS_NODE) {
                node(g, t->a, 1, 1);
            } else if (t->kind == KS_STORE) {
                fprintf(f, "    w%d.%c = ", t->a, "xyzw"[g->lane]);
                if (k->arg_dtype[t->a] == DT_BF16)
                    stored(g, t->a, t->c);
                else
                    tmp(g, t->c);
                fputs(";\n", f);
            }
        }
    g->lane = -1;
    for (int s = 0; s < k->nargs; s++)
        if (written[s] && g->lang == CG_CUDA)
            fprintf(f, "    reinterpret_cast<%s *>(a%d)[q] = w%d;\n", vec_type(k, s), s, s);
        else if (written[s])
            fprintf(f, "    vstore4(w%d, q, a%d);\n", s, s);
}

char *cg_emit_gpu(Arena *a, const Kernel *k, CgLang lang)
{
    for (int i = 0; i < k->nargs; i++)
        if (k->arg_dtype[i] == DT_F16)
            return NULL;
    char *buf = NULL;
    size_t len = 0;
    G g = {.f = open_memstream(&buf, &len), .k = k, .lang = lang, .f32 = k->ftype != DT_F64,
           .lane = -1, .pre = calloc((size_t)k->nodes.len + 1, 1)};
    if (!g.f || !g.pre)
        BUG("open_memstream failed");
    for (int s = 0; s < k->npre; s++)
        g.pre[k->body.data[s].a] = 1;
    Mapping m = mapping(k);
    CgLaunch l = cg_gpu_launch(k);
    mark_used(&g, m == M_VEC4);
    signature(&g, l.block);
    switch (m) {
    case M_ATTN: cg_attention_emit(g.f, a, k, lang); break;
    case M_VEC4: vec4_kernel(&g); break;
    case M_ROW:
    case M_COLS:
        g.block = l.block;
        g.cols = m == M_COLS;
        row_kernel(&g);
        break;
    case M_THREAD: thread_kernel(&g); break;
    }
    fputs("}\n\n", g.f);
    fclose(g.f);
    free(g.used);
    free(g.later);
    free(g.pre);
    char *s = arena_strdup(a, buf);
    free(buf);
    return s;
}

/* ---- preludes: the spellings and the reductions ---- */

/* ALiBi's slope of head g of n (docs/language.md, attention): 2^(-8 (g + 1)
 * / p) for the first p, the largest power of 2 <= n, then the odd terms of
 * the sequence for 2p; in double, as the C prelude's. */
#define ALIBI_SLOPE \
    "(tcc_i64 g, tcc_i64 n)\n" \
    "{\n" \
    "    tcc_i64 p = 1;\n" \
    "    while (p * 2 <= n)\n" \
    "        p *= 2;\n" \
    "    return g < p ? exp2(-8.0 * (double)(g + 1) / (double)p)\n" \
    "                 : exp2(-4.0 * (double)(2 * (g - p) + 1) / (double)p);\n" \
    "}\n"

static const char *cuda_prelude =
    "/* generated by tcc: the kernels of one training step, CUDA C for NVRTC */\n"
    "typedef long long tcc_i64;\n"
    "#define TCC_TID ((int)threadIdx.x)\n"
    "#define TCC_BID ((tcc_i64)blockIdx.x)\n"
    "#define TCC_BARRIER() __syncthreads()\n"
    "#define TCC_SHARED __shared__\n"
    "#define TCC_INF_F __int_as_float(0x7f800000)\n"
    "#define TCC_INF_D __longlong_as_double(0x7ff0000000000000LL)\n"
    "__device__ __forceinline__ float tcc_bf2f(unsigned short h)\n"
    "{\n"
    "    return __uint_as_float((unsigned)h << 16);\n"
    "}\n"
    "__device__ __forceinline__ tcc_i64 tcc_hash(tcc_i64 a, tcc_i64 b)\n"
    "{\n"
    "    unsigned long long z = (unsigned long long)a * 0x9E3779B97F4A7C15ull ^ (unsigned long long)b;\n"
    "    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;\n"
    "    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;\n"
    "    return (tcc_i64)((z ^ (z >> 31)) >> 1);\n"
    "}\n"
    "__device__ double tcc_alibi_slope" ALIBI_SLOPE
    "__device__ __forceinline__ unsigned short tcc_f2bf(float x)\n"
    "{\n"
    "    unsigned u = __float_as_uint(x);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u)\n"
    "        return (unsigned short)((u >> 16) | 0x40u);\n"
    "    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "/* Tensor cores (emit_attention.c): two bf16 to a 32-bit register, low first;\n"
    " * d += a b for a warp's m16n8k16 fragments, f32 accumulators. */\n"
    "typedef unsigned short tcc_u16;\n"
    "typedef unsigned tcc_u32;\n"
    "__device__ __forceinline__ tcc_u32 tcc_pk(tcc_u16 lo, tcc_u16 hi)\n"
    "{\n"
    "    return (tcc_u32)lo | (tcc_u32)hi << 16;\n"
    "}\n"
    "__device__ __forceinline__ void tcc_mma(float *d, const tcc_u32 *a, const tcc_u32 *b)\n"
    "{\n"
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \"\n"
    "                 \"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n\"\n"
    "                 : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n"
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n"
    "}\n"
    "#define TCC_MMA(d, a, b) tcc_mma((d), (a), (b))\n"
    "#define TCC_RPAIR(A, r, c) tcc_pk((A)[r][c], (A)[r][(c) + 1])\n"
    "#define TCC_CPAIR(A, r, c) tcc_pk((A)[r][c], (A)[(r) + 1][c])\n"
    "#define TCC_PKF(x, y) tcc_pk(tcc_f2bf(x), tcc_f2bf(y))\n"
    "#define TCC_BF(x) tcc_bf2f(tcc_f2bf(x))\n"
    "#define TCC_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))\n"
    "#define TCC_EMDECL\n"
    "#define TCC_WARP(NAME, T, OP) \\\n"
    "    __device__ __forceinline__ T NAME(T v) \\\n"
    "    { \\\n"
    "        for (int o = 16; o > 0; o >>= 1) { \\\n"
    "            T x = __shfl_xor_sync(0xffffffffu, v, o); \\\n"
    "            v = OP; \\\n"
    "        } \\\n"
    "        return v; \\\n"
    "    }\n"
    "TCC_WARP(tcc_warp_sum_f, float, v + x)\n"
    "TCC_WARP(tcc_warp_max_f, float, fmaxf(v, x))\n"
    "TCC_WARP(tcc_warp_min_f, float, fminf(v, x))\n"
    "TCC_WARP(tcc_warp_sum_d, double, v + x)\n"
    "TCC_WARP(tcc_warp_max_d, double, fmax(v, x))\n"
    "TCC_WARP(tcc_warp_min_d, double, fmin(v, x))\n"
    "/* Warps reduce with shuffles, warp results meet in red[32], every warp\n"
    " * reduces those again: each thread returns the block's value. */\n"
    "#define TCC_BLOCK(NAME, T, WARP, ID) \\\n"
    "    __device__ __forceinline__ T NAME(T v, T *red) \\\n"
    "    { \\\n"
    "        v = WARP(v); \\\n"
    "        __syncthreads(); \\\n"
    "        if ((threadIdx.x & 31) == 0) \\\n"
    "            red[threadIdx.x >> 5] = v; \\\n"
    "        __syncthreads(); \\\n"
    "        return WARP((threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : (ID)); \\\n"
    "    }\n"
    "TCC_BLOCK(tcc_block_sum_f, float, tcc_warp_sum_f, 0.0f)\n"
    "TCC_BLOCK(tcc_block_max_f, float, tcc_warp_max_f, -TCC_INF_F)\n"
    "TCC_BLOCK(tcc_block_min_f, float, tcc_warp_min_f, TCC_INF_F)\n"
    "TCC_BLOCK(tcc_block_sum_d, double, tcc_warp_sum_d, 0.0)\n"
    "TCC_BLOCK(tcc_block_max_d, double, tcc_warp_max_d, -TCC_INF_D)\n"
    "TCC_BLOCK(tcc_block_min_d, double, tcc_warp_min_d, TCC_INF_D)\n"
    "/* attention: a row is a warp */\n"
    "#define TCC_ROW_MAX_F(v) tcc_warp_max_f(v)\n"
    "#define TCC_ROW_SUM_F(v) tcc_warp_sum_f(v)\n"
    "#define TCC_ROW_MAX_D(v) tcc_warp_max_d(v)\n"
    "#define TCC_ROW_SUM_D(v) tcc_warp_sum_d(v)\n"
    "#define TCC_PJ(p, jj) __shfl_sync(0xffffffffu, (p), (jj))\n"
    "/* The column mapping: thread t serves item t % 32; an item's 8 threads meet in red[256]. */\n"
    "#define TCC_COLS(NAME, T, OP) \\\n"
    "    __device__ __forceinline__ T NAME(T v, T *red) \\\n"
    "    { \\\n"
    "        __syncthreads(); \\\n"
    "        red[threadIdx.x] = v; \\\n"
    "        __syncthreads(); \\\n"
    "        T a = red[threadIdx.x & 31]; \\\n"
    "        for (int j = 1; j < 8; j++) { \\\n"
    "            T x = red[(threadIdx.x & 31) + 32 * j]; \\\n"
    "            a = OP; \\\n"
    "        } \\\n"
    "        return a; \\\n"
    "    }\n"
    "TCC_COLS(tcc_cols_sum_f, float, a + x)\n"
    "TCC_COLS(tcc_cols_max_f, float, fmaxf(a, x))\n"
    "TCC_COLS(tcc_cols_min_f, float, fminf(a, x))\n"
    "TCC_COLS(tcc_cols_sum_d, double, a + x)\n"
    "TCC_COLS(tcc_cols_max_d, double, fmax(a, x))\n"
    "TCC_COLS(tcc_cols_min_d, double, fmin(a, x))\n"
    "__device__ __forceinline__ void tcc_atomic_add_f(float *p, float v) { atomicAdd(p, v); }\n"
    "__device__ __forceinline__ void tcc_atomic_add_d(double *p, double v) { atomicAdd(p, v); }\n"
    "/* bf16 has no atomic add here: compare-and-swap on the aligned word holding it. */\n"
    "__device__ void tcc_atomic_add_bf16(unsigned short *p, float v)\n"
    "{\n"
    "    unsigned *word = (unsigned *)((unsigned long long)p & ~3ULL);\n"
    "    const unsigned shift = ((unsigned long long)p & 2ULL) ? 16u : 0u;\n"
    "    unsigned old = *word, seen;\n"
    "    do {\n"
    "        seen = old;\n"
    "        const unsigned short h = tcc_f2bf(tcc_bf2f((unsigned short)(seen >> shift)) + v);\n"
    "        const unsigned next = (seen & ~(0xffffu << shift)) | ((unsigned)h << shift);\n"
    "        old = atomicCAS(word, seen, next);\n"
    "    } while (old != seen);\n"
    "}\n\n";

static const char *opencl_prelude =
    "/* generated by tcc: the kernels of one training step, OpenCL C */\n"
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    "#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable\n"
    "typedef long tcc_i64;\n"
    "#define TCC_TID ((int)get_local_id(0))\n"
    "#define TCC_BID ((tcc_i64)get_group_id(0))\n"
    "#define TCC_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)\n"
    "#define TCC_SHARED __local\n"
    "#define TCC_INF_F INFINITY\n"
    "#define TCC_INF_D ((double)INFINITY)\n"
    "float tcc_bf2f(ushort h) { return as_float((uint)h << 16); }\n"
    "double tcc_alibi_slope" ALIBI_SLOPE
    "tcc_i64 tcc_hash(tcc_i64 a, tcc_i64 b)\n"
    "{\n"
    "    ulong z = (ulong)a * 0x9E3779B97F4A7C15ul ^ (ulong)b;\n"
    "    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ul;\n"
    "    z = (z ^ (z >> 27)) * 0x94D049BB133111EBul;\n"
    "    return (tcc_i64)((z ^ (z >> 31)) >> 1);\n"
    "}\n"
    "ushort tcc_f2bf(float x)\n"
    "{\n"
    "    uint u = as_uint(x);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u)\n"
    "        return (ushort)((u >> 16) | 0x40u);\n"
    "    return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "/* Tensor cores emulated (emit_attention.c): a warp's fragments meet in its\n"
    " * local A [16][16] and B [16][8] in the layouts of PTX's mma m16n8k16 (lane\n"
    " * l: g = l / 4, t = l % 4; a: rows g, g + 8 by cols 2t, 2t + 8; b: rows 2t,\n"
    " * 2t + 8 by col g; d: rows g, g + 8 by cols 2t, 2t + 1), each lane then sums\n"
    " * its four of d. Every work-item of the group calls it alike (barriers). */\n"
    "typedef ushort tcc_u16;\n"
    "typedef uint tcc_u32;\n"
    "tcc_u32 tcc_pk(tcc_u16 lo, tcc_u16 hi) { return (tcc_u32)lo | (tcc_u32)hi << 16; }\n"
    "float tcc_lo(tcc_u32 x) { return as_float(x << 16); }\n"
    "float tcc_hi(tcc_u32 x) { return as_float(x & 0xffff0000u); }\n"
    "void tcc_mma_em(float *d, const tcc_u32 *a, const tcc_u32 *b, __local float *A,\n"
    "                __local float *B, int lane)\n"
    "{\n"
    "    const int g = lane >> 2, t = lane & 3;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int r = 0; r < 4; r++) {\n"
    "        const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);\n"
    "        A[row * 16 + col] = tcc_lo(a[r]);\n"
    "        A[row * 16 + col + 1] = tcc_hi(a[r]);\n"
    "    }\n"
    "    for (int r = 0; r < 2; r++) {\n"
    "        B[(2 * t + 8 * r) * 8 + g] = tcc_lo(b[r]);\n"
    "        B[(2 * t + 8 * r + 1) * 8 + g] = tcc_hi(b[r]);\n"
    "    }\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int e = 0; e < 4; e++) {\n"
    "        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);\n"
    "        float acc = 0;\n"
    "        for (int k = 0; k < 16; k++)\n"
    "            acc += A[row * 16 + k] * B[k * 8 + col];\n"
    "        d[e] += acc;\n"
    "    }\n"
    "}\n"
    "float tcc_xor_em(__local float *x, int lane, float v, int m)\n"
    "{\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    x[lane] = v;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    return x[lane ^ m];\n"
    "}\n"
    "#define TCC_MMA(d, a, b) tcc_mma_em((d), (a), (b), MmA[w], MmB[w], lane)\n"
    "#define TCC_RPAIR(A, r, c) tcc_pk((A)[r][c], (A)[r][(c) + 1])\n"
    "#define TCC_CPAIR(A, r, c) tcc_pk((A)[r][c], (A)[(r) + 1][c])\n"
    "#define TCC_PKF(x, y) tcc_pk(tcc_f2bf(x), tcc_f2bf(y))\n"
    "#define TCC_BF(x) tcc_bf2f(tcc_f2bf(x))\n"
    "#define TCC_XOR(v, m) tcc_xor_em(MmX[w], lane, (v), (m))\n"
    "#define TCC_EMDECL __local float MmA[NW][256], MmB[NW][128], MmX[NW][32];\n"
    "/* No shuffles: the block's values meet in red[block] and halve in a tree. */\n"
    "#define TCC_BLOCK(NAME, T, OP) \\\n"
    "    T NAME(T v, __local T *red) \\\n"
    "    { \\\n"
    "        const int t = get_local_id(0); \\\n"
    "        barrier(CLK_LOCAL_MEM_FENCE); \\\n"
    "        red[t] = v; \\\n"
    "        barrier(CLK_LOCAL_MEM_FENCE); \\\n"
    "        for (int s = (int)get_local_size(0) >> 1; s > 0; s >>= 1) { \\\n"
    "            if (t < s) { \\\n"
    "                T a = red[t], x = red[t + s]; \\\n"
    "                red[t] = OP; \\\n"
    "            } \\\n"
    "            barrier(CLK_LOCAL_MEM_FENCE); \\\n"
    "        } \\\n"
    "        return red[0]; \\\n"
    "    }\n"
    "TCC_BLOCK(tcc_block_sum_f, float, a + x)\n"
    "TCC_BLOCK(tcc_block_max_f, float, fmax(a, x))\n"
    "TCC_BLOCK(tcc_block_min_f, float, fmin(a, x))\n"
    "TCC_BLOCK(tcc_block_sum_d, double, a + x)\n"
    "TCC_BLOCK(tcc_block_max_d, double, fmax(a, x))\n"
    "TCC_BLOCK(tcc_block_min_d, double, fmin(a, x))\n"
    "/* The column mapping: work-item t serves item t % 32; an item's 8 meet in red[256]. */\n"
    "#define TCC_COLS(NAME, T, OP) \\\n"
    "    T NAME(T v, __local T *red) \\\n"
    "    { \\\n"
    "        const int t = get_local_id(0); \\\n"
    "        barrier(CLK_LOCAL_MEM_FENCE); \\\n"
    "        red[t] = v; \\\n"
    "        barrier(CLK_LOCAL_MEM_FENCE); \\\n"
    "        T a = red[t & 31]; \\\n"
    "        for (int j = 1; j < 8; j++) { \\\n"
    "            T x = red[(t & 31) + 32 * j]; \\\n"
    "            a = OP; \\\n"
    "        } \\\n"
    "        return a; \\\n"
    "    }\n"
    "TCC_COLS(tcc_cols_sum_f, float, a + x)\n"
    "TCC_COLS(tcc_cols_max_f, float, fmax(a, x))\n"
    "TCC_COLS(tcc_cols_min_f, float, fmin(a, x))\n"
    "TCC_COLS(tcc_cols_sum_d, double, a + x)\n"
    "TCC_COLS(tcc_cols_max_d, double, fmax(a, x))\n"
    "TCC_COLS(tcc_cols_min_d, double, fmin(a, x))\n"
    "/* A row's 32 values through its slice of local memory (a warp's shuffle). */\n"
    "#define TCC_ROW(NAME, T, OP) \\\n"
    "    T NAME(__local T *row, int lane, T v) \\\n"
    "    { \\\n"
    "        barrier(CLK_LOCAL_MEM_FENCE); \\\n"
    "        row[lane] = v; \\\n"
    "        barrier(CLK_LOCAL_MEM_FENCE); \\\n"
    "        T a = row[0]; \\\n"
    "        for (int j = 1; j < 32; j++) { \\\n"
    "            T x = row[j]; \\\n"
    "            a = OP; \\\n"
    "        } \\\n"
    "        return a; \\\n"
    "    }\n"
    "TCC_ROW(tcc_row_sum_f, float, a + x)\n"
    "TCC_ROW(tcc_row_max_f, float, fmax(a, x))\n"
    "TCC_ROW(tcc_row_sum_d, double, a + x)\n"
    "TCC_ROW(tcc_row_max_d, double, fmax(a, x))\n"
    "/* attention: a row's values meet in Red[w], its p in Ps[w] */\n"
    "#define TCC_ROW_MAX_F(v) tcc_row_max_f(Red[w], lane, (v))\n"
    "#define TCC_ROW_SUM_F(v) tcc_row_sum_f(Red[w], lane, (v))\n"
    "#define TCC_ROW_MAX_D(v) tcc_row_max_d(Red[w], lane, (v))\n"
    "#define TCC_ROW_SUM_D(v) tcc_row_sum_d(Red[w], lane, (v))\n"
    "#define TCC_PJ(p, jj) (Ps[w][jj])\n"
    "void tcc_atomic_add_f(__global float *p, float v)\n"
    "{\n"
    "    volatile __global uint *w = (volatile __global uint *)p;\n"
    "    uint seen, old = *w;\n"
    "    do {\n"
    "        seen = old;\n"
    "        old = atomic_cmpxchg(w, seen, as_uint(as_float(seen) + v));\n"
    "    } while (old != seen);\n"
    "}\n"
    "void tcc_atomic_add_d(__global double *p, double v)\n"
    "{\n"
    "    volatile __global ulong *w = (volatile __global ulong *)p;\n"
    "    ulong seen, old = *w;\n"
    "    do {\n"
    "        seen = old;\n"
    "        old = atom_cmpxchg(w, seen, as_ulong(as_double(seen) + v));\n"
    "    } while (old != seen);\n"
    "}\n"
    "void tcc_atomic_add_bf16(__global ushort *p, float v)\n"
    "{\n"
    "    volatile __global uint *w = (volatile __global uint *)((ulong)p & ~(ulong)3);\n"
    "    const uint shift = ((ulong)p & 2) ? 16u : 0u;\n"
    "    uint seen, old = *w;\n"
    "    do {\n"
    "        seen = old;\n"
    "        const ushort h = tcc_f2bf(tcc_bf2f((ushort)(seen >> shift)) + v);\n"
    "        old = atomic_cmpxchg(w, seen, (seen & ~(0xffffu << shift)) | ((uint)h << shift));\n"
    "    } while (old != seen);\n"
    "}\n\n";

const char *cg_gpu_prelude(CgLang lang) { return lang == CG_CUDA ? cuda_prelude : opencl_prelude; }
