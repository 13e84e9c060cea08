/* emit_c.c: Kernel IR -> C (C99 + OpenMP) for the CPU backend.
 * Reads one Kernel; writes `void NAME(char *const *args)`. The parallel loop
 * becomes an OpenMP loop, each node one typed temporary, inner loops plain
 * loops with an accumulator. Attention kernels come from two templates with
 * an online softmax over the keys (forward: tiles of 64 keys; backward: key by
 * key, twice), so no S x S matrix is ever stored. */
#include "codegen.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

typedef struct Out {
    FILE *f;
    const Kernel *k;
    int f32;   /* the float type is float, so math functions take the f suffix */
    int lanes; /* lane_kernel: a reduction's accumulator is an array, lane l's at [l] */
    int64_t row_w; /* loop_kernel in rows of row_w items (row_width): i0 % row_w is c, i0 / row_w r */
    int raw_ds; /* the attention backward's bias part: a score's gradient before the cap and scale */
} Out;

/* Whether node a is the item index. */
static int is_item(const Kernel *k, int a)
{
    return k->nodes.data[a].kind == KN_IDX && k->nodes.data[a].a == 0;
}

static const char *ftype(const Out *o) { return o->f32 ? "float" : "double"; }

static const char *storage(DType t)
{
    switch (t) {
    case DT_F32: return "float";
    case DT_F64: return "double";
    case DT_I32: return "int32_t";
    default: return "uint16_t"; /* bf16 / f16 bits */
    }
}

static void literal(Out *o, double x)
{
    char buf[48];
    fmt_double(buf, sizeof buf, x);
    if (strchr(buf, 'n') || strchr(buf, 'i')) /* inf / nan */
        fprintf(o->f, "(%s)%s", ftype(o), x != x ? "NAN" : x > 0 ? "INFINITY" : "-INFINITY");
    else
        fprintf(o->f, "%s%s", buf, o->f32 ? "f" : "");
}

static void call1(Out *o, const char *fn, int a)
{
    fprintf(o->f, "%s%s(t%d)", fn, o->f32 ? "f" : "", a);
}

static void expr(Out *o, const KNode *n)
{
    static const char *ops[] = {[KN_ADD] = "+", [KN_SUB] = "-", [KN_MUL] = "*", [KN_DIV] = "/",
                                [KN_IDIV] = "/", [KN_IMOD] = "%"};
    FILE *f = o->f;
    int fl = n->type == KT_FLOAT;
    switch (n->kind) {
    case KN_CONST: literal(o, n->imm); return;
    case KN_ICONST: fprintf(f, "INT64_C(%lld)", (long long)n->iimm); return;
    case KN_IDX: fprintf(f, "i%d", n->a); return;
    case KN_LOAD:
        if (o->k->arg_dtype[n->a] == DT_BF16)
            fprintf(f, "(%s)tcc_bf2f(a%d[t%d])", ftype(o), n->a, n->b);
        else
            fprintf(f, "(%s)a%d[t%d]", fl ? ftype(o) : "int64_t", n->a, n->b);
        return;
    case KN_ACC: fprintf(f, o->lanes ? "acc%d[l]" : "acc%d", n->a); return;
    case KN_IDIV: case KN_IMOD: /* in rows: the row and the column (row_width) */
        if (o->row_w && is_item(o->k, n->a) && o->k->nodes.data[n->b].kind == KN_ICONST &&
            o->k->nodes.data[n->b].iimm == o->row_w) {
            fputs(n->kind == KN_IMOD ? "c" : "r", f);
            return;
        }
        /* fall through */
    case KN_ADD: case KN_SUB: case KN_MUL: case KN_DIV:
        fprintf(f, "t%d %s t%d", n->a, ops[n->kind], n->b);
        return;
    case KN_MAX: case KN_MIN:
        if (fl)
            fprintf(f, "%s%s(t%d, t%d)", n->kind == KN_MAX ? "fmax" : "fmin", o->f32 ? "f" : "",
                    n->a, n->b);
        else
            fprintf(f, "t%d %s t%d ? t%d : t%d", n->a, n->kind == KN_MAX ? ">" : "<", n->b, n->a,
                    n->b);
        return;
    case KN_POW: fprintf(f, "pow%s(t%d, t%d)", o->f32 ? "f" : "", n->a, n->b); return;
    case KN_NEG: fprintf(f, "-t%d", n->a); return;
    case KN_EXP: /* f32: the prelude's, which vectorizes; f64 (the checks): the C library's */
        o->f32 ? fprintf(f, "tcc_expf(t%d)", n->a) : call1(o, "exp", n->a);
        return;
    case KN_LOG: call1(o, "log", n->a); return;
    case KN_SQRT: call1(o, "sqrt", n->a); return;
    case KN_RSQRT: fprintf(f, "1 / sqrt%s(t%d)", o->f32 ? "f" : "", n->a); return;
    case KN_TANH: o->f32 ? fprintf(f, "tcc_tanhf(t%d)", n->a) : call1(o, "tanh", n->a); return;
    case KN_COS: call1(o, "cos", n->a); return;
    case KN_SIN: call1(o, "sin", n->a); return;
    case KN_ABS: call1(o, "fabs", n->a); return;
    case KN_FLOOR: call1(o, "floor", n->a); return;
    case KN_ERF: call1(o, "erf", n->a); return;
    case KN_LT: fprintf(f, "(int64_t)(t%d < t%d)", n->a, n->b); return;
    case KN_EQ: fprintf(f, "(int64_t)(t%d == t%d)", n->a, n->b); return;
    case KN_LE: fprintf(f, "(int64_t)(t%d <= t%d)", n->a, n->b); return;
    case KN_NE: fprintf(f, "(int64_t)(t%d != t%d)", n->a, n->b); return;
    case KN_SELECT: fprintf(f, "t%d ? t%d : t%d", n->a, n->b, n->c); return;
    case KN_TOFLOAT: fprintf(f, "(%s)t%d", ftype(o), n->a); return;
    case KN_TOINT: fprintf(f, "(int64_t)t%d", n->a); return;
    case KN_HASH: fprintf(f, "tcc_hash(t%d, t%d)", n->a, n->b); return;
    case KN_BF16: fprintf(f, "(%s)tcc_bf2f(tcc_f2bf((float)t%d))", ftype(o), n->a); return;
    case KN_COUNT: break;
    }
    UNREACHABLE();
}

static void indent(Out *o, int depth)
{
    for (int i = 0; i < depth; i++)
        fputs("    ", o->f);
}

int cg_loop_reduce(const Kernel *k, int s)
{
    for (int i = s + 1, depth = 1; i < k->body.len && depth > 0; i++) {
        const KStmt *t = &k->body.data[i];
        depth += t->kind == KS_LOOP ? 1 : t->kind == KS_END ? -1 : 0;
        if (t->kind == KS_REDUCE && t->a == s)
            return t->c;
    }
    return -1;
}

static void stmt(Out *o, int s, int *depth, int *level)
{
    const KStmt *t = &o->k->body.data[s];
    const KNode *nodes = o->k->nodes.data;
    if (t->kind == KS_END) {
        --*level;
        --*depth;
        indent(o, *depth);
        fputs("}\n", o->f);
        return;
    }
    indent(o, *depth);
    switch (t->kind) {
    case KS_NODE:
        fprintf(o->f, "const %s t%d = ", nodes[t->a].type == KT_FLOAT ? ftype(o) : "int64_t", t->a);
        expr(o, &nodes[t->a]);
        fputs(";\n", o->f);
        return;
    case KS_LOOP: {
        int r = cg_loop_reduce(o->k, s);
        if (r >= 0) {
            fprintf(o->f, "%s acc%d = ", ftype(o), s);
            literal(o, r == KR_SUM ? 0.0 : r == KR_MAX ? -1.0 / 0.0 : 1.0 / 0.0);
            fputs(";\n", o->f);
            indent(o, *depth);
        }
        ++*level;
        fprintf(o->f, "for (int64_t i%d = 0; i%d < INT64_C(%lld); i%d++) {\n", *level, *level,
                (long long)t->extent, *level);
        ++*depth;
        return;
    }
    case KS_REDUCE:
        if (t->c == KR_SUM)
            fprintf(o->f, o->lanes ? "acc%d[l] += t%d;\n" : "acc%d += t%d;\n", t->a, t->b);
        else
            fprintf(o->f, "acc%d = fm%s%s(acc%d, t%d);\n", t->a, t->c == KR_MAX ? "ax" : "in",
                    o->f32 ? "f" : "", t->a, t->b);
        return;
    case KS_END: break;
    case KS_STORE:
    case KS_STORE_ADD:
        if (o->k->arg_dtype[t->a] == DT_BF16) { /* f32 arithmetic, one rounding */
            fprintf(o->f, "a%d[t%d] = tcc_f2bf(", t->a, t->b);
            if (t->kind == KS_STORE_ADD)
                fprintf(o->f, "tcc_bf2f(a%d[t%d]) + ", t->a, t->b);
            fprintf(o->f, "(float)t%d);\n", t->c);
            return;
        }
        fprintf(o->f, "a%d[t%d] %s(%s)t%d;\n", t->a, t->b, t->kind == KS_STORE ? "= " : "+= ",
                storage(o->k->arg_dtype[t->a]), t->c);
        return;
    }
    UNREACHABLE();
}

/* Items that are independent: a kernel without inner loops whose every
 * stored slot is stored, and loaded if at all, at the item's own index only,
 * so no item reads what another writes. Its loop may run as vectors (the
 * compiler cannot see it: OpenMP's outlined loop loses `restrict`); each
 * item's arithmetic is unchanged, so are its bits. */
static int independent_items(const Kernel *k)
{
    if (k->levels)
        return 0;
    char stored[64] = {0};
    const KNode *nd = k->nodes.data;
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_STORE || t->kind == KS_STORE_ADD) {
            if (nd[t->b].kind != KN_IDX || nd[t->b].a != 0)
                return 0;
            stored[t->a] = 1;
        }
    }
    for (int i = 0; i < k->nodes.len; i++)
        if (nd[i].kind == KN_LOAD && stored[nd[i].a] &&
            (nd[nd[i].b].kind != KN_IDX || nd[nd[i].b].a != 0))
            return 0;
    return 1;
}

/* A kernel whose items each sum one loop (a column of a matrix summed over
 * its rows, a bias's gradient): one item after another, each sum is a chain
 * of dependent adds. In lanes, LANES items advance together: for each step
 * of the loop, every lane's item adds its term, so the chains interleave and
 * a row's terms are read side by side. Each item's sum still adds its terms
 * in the loop's order, so its bits are unchanged. The statements before the
 * loop (each item's own) are computed again in each lane's loop, which is
 * cheap for what they are (index arithmetic, a row's offset). The shape: the
 * body after the hoisted part is item statements, one summing loop (no loop
 * inside it) and then statements and stores. loop: the loop's statement, or
 * -1 when the kernel is not of that shape, or too small to gain what the
 * longer code costs the C compiler (about 0.06 s a kernel at -O3 here):
 * fewer than two lanes' worth of items, or sums shorter than LANE_MIN_LOOP. */
enum { LANES = 16, LANE_MIN_LOOP = 64 };

static int lane_loop(const Kernel *k)
{
    int loop = -1, depth = 0;
    if (!k->levels || k->extent < 2 * LANES)
        return -1;
    for (int s = k->npre; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_LOOP) {
            if (depth || loop >= 0 || cg_loop_reduce(k, s) != KR_SUM || t->extent < LANE_MIN_LOOP)
                return -1;
            loop = s, depth = 1;
        } else if (t->kind == KS_END) {
            depth = 0;
        } else if ((t->kind == KS_STORE || t->kind == KS_STORE_ADD) && (depth || loop < 0)) {
            return -1;
        }
    }
    return loop;
}

/* The statements [from, to) of the body; every item statement's temporary
 * marked used (each is computed in both lane loops, used in one or both). */
static void lane_stmts(Out *o, int from, int to, int depth, int level, int mark)
{
    for (int s = from; s < to; s++) {
        stmt(o, s, &depth, &level);
        const KStmt *t = &o->k->body.data[s];
        if (mark && t->kind == KS_NODE) {
            indent(o, depth);
            fprintf(o->f, "(void)t%d;\n", t->a);
        }
    }
}

static void lane_kernel(Out *o, int loop)
{
    const Kernel *k = o->k;
    int depth = 1, level = 0, end = loop;
    for (int d = 0; end < k->body.len; end++) /* the loop's KS_END */
        if ((d += k->body.data[end].kind == KS_LOOP ? 1 : k->body.data[end].kind == KS_END ? -1 : 0) == 0)
            break;
    for (int s = 0; s < k->npre; s++)
        stmt(o, s, &depth, &level);
    long long n = (long long)k->extent, r = (long long)k->body.data[loop].extent;
    fputs("#pragma omp for schedule(static) nowait\n", o->f);
    fprintf(o->f, "    for (int64_t ib = 0; ib < INT64_C(%lld); ib += %d) {\n", n, LANES);
    fprintf(o->f, "        const int64_t nl = INT64_C(%lld) - ib < %d ? INT64_C(%lld) - ib : %d;\n",
            n, LANES, n, LANES);
    fprintf(o->f, "        %s acc%d[%d];\n", ftype(o), loop, LANES);
    fprintf(o->f, "        for (int64_t l = 0; l < nl; l++)\n            acc%d[l] = 0;\n", loop);
    fprintf(o->f, "        for (int64_t i1 = 0; i1 < INT64_C(%lld); i1++) {\n", r);
    fputs("            for (int64_t l = 0; l < nl; l++) {\n", o->f);
    fputs("                const int64_t i0 = ib + l;\n                (void)i0;\n", o->f);
    o->lanes = 1;
    lane_stmts(o, k->npre, loop, 4, 0, 1);
    lane_stmts(o, loop + 1, end, 4, 1, 0);
    fputs("            }\n        }\n", o->f);
    fputs("        for (int64_t l = 0; l < nl; l++) {\n", o->f);
    fputs("            const int64_t i0 = ib + l;\n            (void)i0;\n", o->f);
    lane_stmts(o, k->npre, loop, 3, 0, 1);
    lane_stmts(o, end + 1, k->body.len, 3, 0, 0);
    o->lanes = 0;
    fputs("        }\n    }\n", o->f);
}

/* A loop kernel (this one or lane_kernel's) is written as NAME_ws, its loop
 * shared out among the threads of the parallel region it is called in
 * (`omp for ... nowait`: alone on one thread when called outside one), and
 * NAME, which opens a region for it when it is large enough (cg_emit_c). The
 * runtime calls several NAME_ws of independent instructions in one region
 * (tcc_run_group, groups.c). */
/* The row width W of an elementwise kernel whose every remainder or quotient
 * of the item index is by one W (a bias along the last dimension is read at
 * i0 % W): its items are written as rows of W, a vector loop over the row's
 * columns, where i0 % W is the column and i0 / W the row, so the bias is
 * read in order rather than at a remainder lane by lane. 0 when it is not
 * such a kernel (W below 8, or not dividing the extent). */
static int64_t row_width(const Kernel *k)
{
    if (k->levels || !independent_items(k))
        return 0;
    int64_t w = 0;
    for (int s = 0; s < k->body.len; s++) { /* the nodes computed (the body's) */
        if (k->body.data[s].kind != KS_NODE)
            continue;
        const KNode *n = &k->nodes.data[k->body.data[s].a];
        if ((n->kind != KN_IMOD && n->kind != KN_IDIV) || !is_item(k, n->a))
            continue;
        const KNode *d = &k->nodes.data[n->b];
        if (d->kind != KN_ICONST || (w && d->iimm != w))
            return 0;
        w = d->iimm;
    }
    return w >= 8 && k->extent % w == 0 ? w : 0;
}

static void loop_kernel(Out *o)
{
    int depth = 1, level = 0, simd = independent_items(o->k);
    int64_t w = row_width(o->k);
    for (int s = 0; s < o->k->npre; s++) /* the same for every item: once a call */
        stmt(o, s, &depth, &level);
    if (w) {
        fputs("#pragma omp for schedule(static) nowait\n", o->f);
        fprintf(o->f, "    for (int64_t r = 0; r < INT64_C(%lld); r++) {\n",
                (long long)(o->k->extent / w));
        fprintf(o->f, "#pragma omp simd\n        for (int64_t c = 0; c < INT64_C(%lld); c++) {\n"
                      "            const int64_t i0 = r * INT64_C(%lld) + c;\n",
                (long long)w, (long long)w);
        o->row_w = w, depth = 3;
        for (int s = o->k->npre; s < o->k->body.len; s++)
            stmt(o, s, &depth, &level);
        o->row_w = 0;
        fputs("        }\n    }\n", o->f);
        return;
    }
    fprintf(o->f, "#pragma omp for%s schedule(static) nowait\n", simd ? " simd" : "");
    fprintf(o->f, "    for (int64_t i0 = 0; i0 < INT64_C(%lld); i0++) {\n", (long long)o->k->extent);
    depth = 2;
    for (int s = o->k->npre; s < o->k->body.len; s++)
        stmt(o, s, &depth, &level);
    fputs("    }\n", o->f);
}

int64_t cg_c_items(const Kernel *k) { return k->extent * (k->levels ? 64 : 1); }

int cg_pattern_workshared(int pattern) { return pattern != KP_ATTENTION && pattern != KP_ATTENTION_BWD; }

int cg_c_workshared(const Kernel *k) { return cg_pattern_workshared((int)k->pattern); }

/* ---- attention templates ----
 * Written once with $WORDS filled per kernel: $T the float type, $X the math
 * functions' suffix, $M and $E the prelude's max and exp (codegen/groups.c; the
 * C library's for f64 exp), and per argument n its storage type $Sn, the widening
 * load $Ln(x) and the rounding store $Wn(x) (tcc_bf2f / tcc_f2bf for bf16, a
 * cast otherwise). Storage is bf16, f32 or f64; arithmetic is $T.
 * The soft cap (KAttention.softcap; all empty without one): $C and $D around
 * a scaled score, cap tanh(score / cap); in the backward $V the line of
 * tc = tanh(score / cap), $O the score as capped, $J the cap's derivative
 * 1 - tc^2 in the score's gradient. $Z is the keys' length: S, or SK
 * where the keys have a length of their own (cross-attention). $v is the
 * values' (and the output's) head size, $c the values' pitch, $o the
 * output's (and dout's): DH, KC, QC, or DV, VC, OC where the values have a
 * head size of their own (latent attention); $(A$|B$) is A, or B there
 * (loops over both head sizes split in two). The score bias
 * (KAttention.bias; all empty without one): $Y declares row i's bias brow,
 * $A adds key j0 + j's to the score (after ALiBi's), $g is the score
 * gradient's factor $J * scale (empty in the bias's part, which sums the
 * biased score's gradient), $B runs that part and $d adds row r's into the
 * bias's gradient. */

/* $R: the tiles of keys a block of query rows i0 .. i0 + ni - 1 reads, from
 * the one at `first` to the one holding `last`: the causal or windowed
 * bounds (the tiles outside hold no key any of the rows sees). */
static const char *attention_range =
    "const int64_t last = CAUSAL ? i0 + ni - 1\n"
    "                   : WIN > 0 && i0 + ni + WIN - 2 < $Z - 1 ? i0 + ni + WIN - 2 : $Z - 1;\n"
    "const int64_t first = WIN > 0 && i0 - WIN + 1 > 0 ? (i0 - WIN + 1) / TILE * TILE : 0;\n";

/* below: the fragments $U, $F, $P, $K, $G, $Q; $N is the kernel's name; $H
 * is whether query i does not see key j0 + j of row b (the window, the mask):
 * the templates ask it only where HIDE (the sizes) is 1, so that without a
 * window or a mask the compiler drops every test of it. */
static const char *attention_tile, *attention_keys, *attention_bwd_pass, *attention_bwd_kv, *attention_bwd_grad,
    *attention_bwd_dq, *attention_bwd_tiles;

/* Input n's (q 0, k 1, v 2) row pitch ($pn), head stride ($en) and offset
 * ($fn) in its tensor: the numbers of a view of a fused q/k/v tensor
 * (KAttention.in_pitch), else QC or KC (VC), DH (DV) and nothing. */
static void view_word(Out *o, char w, int n)
{
    const KAttention *a = &o->k->attn;
    int dv = a->head_dim_v != a->head_dim;
    if (n < 0 || n > 2)
        BUG("attention template: bad word $%c%d", w, n);
    if (a->in_pitch[n] && w == 'f')
        fprintf(o->f, " + %lld", (long long)a->in_off[n]);
    else if (a->in_pitch[n])
        fprintf(o->f, "%lld", (long long)(w == 'p' ? a->in_pitch[n] : a->in_head[n]));
    else if (w == 'p')
        fputs(n == 0 ? "QC" : n == 2 && dv ? "VC" : "KC", o->f);
    else if (w == 'e')
        fputs(n == 2 && dv ? "DV" : "DH", o->f);
}

/* The soft cap's word w ($C, $D, $V, $O, $J above); `at` is its column. */
static void softcap_word(Out *o, char w, int at)
{
    const char *tanh_f = o->f32 ? "tcc_tanhf" : "tanh";
    if (w == 'O')
        fputs(o->k->attn.softcap > 0 ? "cap * tc" : "s[j] * scale", o->f);
    else if (o->k->attn.softcap <= 0)
        return;
    else if (w == 'C')
        fprintf(o->f, "cap * %s(", tanh_f);
    else if (w == 'D')
        fputs(" / cap)", o->f);
    else if (w == 'V')
        fprintf(o->f, "const %s tc = %s(s[j] * scale / cap);\n%*s", ftype(o), tanh_f, at, "");
    else
        fputs(" * (1 - tc * tc)", o->f);
}

static void attention_fill(Out *o, const char *tmpl, int indent);

/* The widening load of argument n, before its element in parentheses. */
static void load_prefix(Out *o, int n)
{
    if (o->k->arg_dtype[n] == DT_BF16)
        fputs("tcc_bf2f", o->f);
    else
        fprintf(o->f, "(%s)", ftype(o));
}

/* The score bias's words $Y (row i's bias, brow) and $A (key j0 + j's,
 * added): nothing without a bias. */
static void score_bias_word(Out *o, char w)
{
    const KAttention *at = &o->k->attn;
    if (at->bias <= 0)
        return;
    if (w == 'Y') {
        fprintf(o->f, "const %s *const brow = a%d + ((BH == 1 ? 0 : h) * S + i) * ",
                storage(o->k->arg_dtype[at->bias]), at->bias);
        attention_fill(o, "$Z; ", 0);
        return;
    }
    fputs(" + ", o->f);
    load_prefix(o, at->bias);
    fputs("(brow[j0 + j])", o->f);
}

/* $B: the backward's bias part over every (bias head, query block), after
 * the rest; $d: row r's score gradients of the tile (g) added into the
 * bias's gradient. Nothing without one. */
static void bias_grad_word(Out *o, char w, int at)
{
    const KAttention *a = &o->k->attn;
    if (a->dbias <= 0)
        return;
    if (w == 'B') {
        fprintf(o->f, "    #pragma omp for schedule(static)\n"
                      "    for (int64_t t = 0; t < BH * NQB; t++) %s_bias(args, t / NQB, t %% NQB);\n",
                o->k->name);
        return;
    }
    const char *st = storage(o->k->arg_dtype[a->dbias]);
    fprintf(o->f, "%s *const dbi = a%d + ((BH == 1 ? 0 : h) * S + i) * ", st, a->dbias);
    attention_fill(o, "$Z + j0;\n", 0);
    fprintf(o->f, "%*sfor (int64_t j = 0; j < nr; j++) dbi[j] = (%s)((%s)dbi[j] + dp[j]);\n", at, "",
            st, ftype(o));
}

/* tmpl filled into the kernel; every line after the first indented by
 * `indent` more spaces (a fragment set in at a word's column). */
static void attention_fill(Out *o, const char *tmpl, int indent)
{
    const Kernel *k = o->k;
    int column = indent > 0; /* a fragment's first line: at the word's column already */
    int dv = k->attn.head_dim_v != k->attn.head_dim, skip = 0;
    for (const char *p = tmpl; *p; p++) {
        if (*p == '$' && (p[1] == '(' || p[1] == '|' || p[1] == ')')) { /* $(A$|B$) */
            p++;
            skip = *p == '(' ? dv : *p == '|' ? !dv : 0;
            continue;
        }
        if (skip)
            continue;
        if (column == 0 && *p != '\n')
            fprintf(o->f, "%*s", indent, "");
        if (*p != '$') {
            fputc(*p, o->f);
            column = *p == '\n' ? 0 : column + 1;
            continue;
        }
        char w = *++p;
        column += 2;
        const char *frag = w == 'U' ? attention_tile /* the online softmax's step over a tile */
                         : w == 'F' ? attention_keys
                         : w == 'P' ? attention_bwd_pass
                         : w == 'K' ? attention_bwd_kv
                         : w == 'G' ? attention_bwd_grad
                         : w == 'Q' ? attention_bwd_dq
                         : w == 'I' ? attention_bwd_tiles
                         : w == 'R' ? attention_range : NULL;
        if (frag) { /* a fragment, set in at this column */
            attention_fill(o, frag, indent + column - 2);
            column = 0; /* it ends its last line */
            continue;
        }
        if (w == 'N') {
            fputs(k->name, o->f);
            continue;
        }
        if (w == 'H') { /* the mask widened, so that -0 is 0 */
            fputs("(WIN > 0 && (i - (j0 + j) >= WIN || (j0 + j) - i >= WIN))", o->f);
            if (k->attn.mask >= 10)
                BUG("attention template: the mask is argument %d", k->attn.mask);
            if (k->attn.mask >= 0) {
                fputs(" || ", o->f);
                attention_fill(o, (char[]){'$', 'L', (char)('0' + k->attn.mask), 0}, 0);
                fprintf(o->f, "(mk[b * %s + j0 + j]) == 0", k->attn.seq_k != k->attn.seq ? "SK" : "S");
            }
            continue;
        }
        if (w == 'A' || w == 'Y') { /* ALiBi: the bias of key j0 + j for query i; head h's slope */
            const KAttention *at = &k->attn;
            score_bias_word(o, w);
            if (at->alibi && w == 'A')
                fprintf(o->f, " - slope * (%s)(i > j0 + j ? i - (j0 + j) : (j0 + j) - i)", ftype(o));
            else if (at->alibi && at->hoff >= 0)
                fprintf(o->f, "const %s slope = (%s)tcc_alibi_slope(h + a%d[0] / DH, %lld);", ftype(o),
                        ftype(o), at->hoff, (long long)at->heads_whole);
            else if (at->alibi)
                fprintf(o->f, "const %s slope = (%s)tcc_alibi_slope(h, %lld);", ftype(o), ftype(o),
                        (long long)at->heads_whole);
            continue;
        }
        if (w == 'C' || w == 'D' || w == 'V' || w == 'O' || w == 'J') {
            softcap_word(o, w, indent + column - 2);
            continue;
        }
        if (w == 'g') {
            if (!o->raw_ds)
                attention_fill(o, "$J * scale", 0);
            continue;
        }
        if (w == 'B' || w == 'd') {
            bias_grad_word(o, w, indent + column - 2);
            column = 0;
            continue;
        }
        if (w == 'Z') {
            fputs(k->attn.seq_k != k->attn.seq ? "SK" : "S", o->f);
            continue;
        }
        if (w == 'v' || w == 'c' || w == 'o') { /* the values' head size and pitches */
            fputs(w == 'v' ? (dv ? "DV" : "DH") : w == 'c' ? (dv ? "VC" : "KC") : dv ? "OC" : "QC",
                  o->f);
            continue;
        }
        if (w == 'T' || w == 'X') {
            fputs(w == 'T' ? ftype(o) : o->f32 ? "f" : "", o->f);
            continue;
        }
        if (w == 'M' || w == 'E') { /* the prelude's max and exp: inline, so loops of them vectorize */
            fputs(w == 'M' ? (o->f32 ? "tcc_fmaxf" : "tcc_fmax") : o->f32 ? "tcc_expf" : "exp", o->f);
            continue;
        }
        if (w == 'p' || w == 'e' || w == 'f') { /* input n's pitch, head stride, offset */
            view_word(o, w, *++p - '0');
            continue;
        }
        int n = *++p - '0';
        if (n < 0 || n >= k->nargs || (w != 'S' && w != 'L' && w != 'W'))
            BUG("attention template: bad word $%c%c", w, *p);
        int bf = k->arg_dtype[n] == DT_BF16;
        if (w == 'S')
            fputs(storage(k->arg_dtype[n]), o->f);
        else if (w == 'L')
            load_prefix(o, n);
        else
            fprintf(o->f, bf ? "tcc_f2bf" : "(%s)", storage(k->arg_dtype[n]));
    }
}

/* The C templates' query rows per block and keys per tile. */
enum { ATT_QB = 16, ATT_TILE = 64 };

/* The sizes; with `full` also the rows' pitches and the scale. */
static void attention_consts(Out *o, int full)
{
    const KAttention *a = &o->k->attn;
    fprintf(o->f,
            "    enum { B = %lld, S = %lld, H = %lld, KV = %lld, DH = %lld, CAUSAL = %d, TILE = %d, "
            "QB = %d };\n",
            (long long)a->batch, (long long)a->seq, (long long)a->heads, (long long)a->kv_heads,
            (long long)a->head_dim, a->causal, ATT_TILE, ATT_QB);
    if (a->seq_k != a->seq) /* cross-attention: the keys' length ($Z) */
        fprintf(o->f, "    enum { SK = %lld };\n", (long long)a->seq_k);
    if (a->head_dim_v != a->head_dim) /* latent attention: the values' head size ($v) */
        fprintf(o->f, "    enum { DV = %lld };\n", (long long)a->head_dim_v);
    if (a->bias > 0) /* the bias's heads: H, or 1 for all */
        fprintf(o->f, "    enum { BH = %lld };\n", (long long)a->bias_heads);
    if (!full)
        return;
    fprintf(o->f, "    enum { WIN = %lld, HIDE = %d };\n", (long long)a->window,
            a->window > 0 || a->mask >= 0);
    if (a->mask >= 0)
        fprintf(o->f, "    const %s *const mk = a%d;\n", storage(o->k->arg_dtype[a->mask]), a->mask);
    fprintf(o->f, "    const int64_t QC = H * DH, KC = KV * DH;\n");
    if (a->head_dim_v != a->head_dim) /* the values' and the output's pitches ($c, $o) */
        fputs("    const int64_t VC = KV * DV, OC = H * DV;\n", o->f);
    fprintf(o->f, "    const %s scale = ", ftype(o));
    literal(o, a->scale);
    fputs(";\n", o->f);
    if (a->softcap > 0) {
        fprintf(o->f, "    const %s cap = ", ftype(o));
        literal(o, a->softcap);
        fputs(";\n", o->f);
    }
}

/* In both templates a loop over the head is not unrolled whole (GCC unroll
 * 1; it still runs as vectors): at small head sizes the compiler otherwise
 * unrolls every such loop of the block and tile loops, and the backward
 * took 1.2 s to compile at head size 8 (0.3 s so).
 *
 * A block of QB query rows per task (each row widened once) against tiles
 * of TILE keys: the tile's keys are widened and transposed once per task
 * (kt[d][j]), so that a row's scores for the whole tile are one loop over
 * the head whose body runs across the keys as vectors. Each score is still
 * the sum over the head in its order (a lane per key), so the result is the
 * one-key-at-a-time dot's. Per row: running max m, running sum l, running
 * output acc, rescaled when the max grows, tile after tile; the tile's
 * exponentials as vectors (the prelude's exp, no call). */
/* Row r's step over a tile of nr keys (none: nothing): its scores against
 * the transposed keys kt, then the online softmax's running max m, sum l and
 * output acc rescaled, and the tile's probabilities (as vectors) added in.
 * The forward's and the backward's first pass ($U). */
static const char *attention_tile =
    "if (nr <= 0)\n"
    "    continue;\n"
    "$Y\n"
    "for (int64_t j = 0; j < nr; j++) s[j] = 0;\n"
    "#pragma GCC unroll 1\n"
    "for (int64_t d = 0; d < DH; d++) {\n"
    "    const $T x = q[r][d];\n"
    "    for (int64_t j = 0; j < nr; j++) s[j] += x * kt[d][j];\n"
    "}\n"
    "$T tm = -INFINITY;\n"
    "for (int64_t j = 0; j < nr; j++) {\n"
    "    s[j] = $Cs[j] * scale$D$A;\n"
    "    if (HIDE && ($H))\n"
    "        s[j] = -INFINITY;\n"
    "    tm = $M(tm, s[j]);\n"
    "}\n"
    "if (HIDE && tm == -INFINITY) /* the row sees no key of the tile */\n"
    "    continue;\n"
    "const $T nm = $M(m[r], tm), corr = $E(m[r] - nm);\n"
    "for (int64_t j = 0; j < nr; j++) s[j] = $E(s[j] - nm);\n"
    "l[r] *= corr;\n"
    "for (int64_t j = 0; j < nr; j++) l[r] += s[j];\n"
    "#pragma GCC unroll 1\n"
    "for (int64_t d = 0; d < $v; d++) acc[r][d] *= corr;\n"
    "for (int64_t j = 0; j < nr; j++) {\n"
    "    const $T p = s[j];\n"
    "    const $S2 *vj = a2 + (b * $Z + j0 + j) * $p2 + kh * $e2$f2;\n"
    "    #pragma GCC unroll 1\n"
    "    for (int64_t d = 0; d < $v; d++) acc[r][d] += p * $L2(vj[d]);\n"
    "}\n"
    "m[r] = nm;\n";

/* $F: the block's rows against every tile of keys up to `last`, each tile's
 * keys transposed once, each row's step over the tile ($U). The forward's
 * and the backward's first pass. */
static const char *attention_keys =
    "for (int64_t j0 = first; j0 <= last; j0 += TILE) {\n"
    "    const int64_t n = last - j0 + 1 < TILE ? last - j0 + 1 : TILE;\n"
    "    for (int64_t j = 0; j < n; j++) {\n"
    "        const $S1 *kj = a1 + (b * $Z + j0 + j) * $p1 + kh * $e1$f1;\n"
    "        #pragma GCC unroll 1\n"
    "        for (int64_t d = 0; d < DH; d++) kt[d][j] = $L1(kj[d]);\n"
    "    }\n"
    "    for (int64_t r = 0; r < ni; r++) {\n"
    "        const int64_t i = i0 + r, nr = CAUSAL && i - j0 + 1 < n ? i - j0 + 1 : n;\n"
    "        $U"
    "    }\n"
    "}\n";

static const char *attention_fwd =
    "    enum { NQB = (S + QB - 1) / QB };\n"
    "    #pragma omp parallel for collapse(3) schedule(static)\n"
    "    for (int64_t b = 0; b < B; b++)\n"
    "    for (int64_t h = 0; h < H; h++)\n"
    "    for (int64_t qb = 0; qb < NQB; qb++) {\n"
    "        const int64_t kh = h / (H / KV), i0 = qb * QB, ni = S - i0 < QB ? S - i0 : QB;\n"
    "        $R"
    "        $T m[QB], l[QB], q[QB][DH], acc[QB][$v], kt[DH][TILE], s[TILE];\n"
    "        for (int64_t r = 0; r < ni; r++) {\n"
    "            const $S0 *qi = a0 + (b * S + i0 + r) * $p0 + h * $e0$f0;\n"
    "            m[r] = -INFINITY, l[r] = 0;\n"
    "            #pragma GCC unroll 1\n"
    "            for (int64_t d = 0; d < DH; d++) q[r][d] = $L0(qi[d])$(, acc[r][d] = 0$|;\n"
    "            #pragma GCC unroll 1\n"
    "            for (int64_t d = 0; d < DV; d++) acc[r][d] = 0$);\n"
    "        }\n"
    "        $F"
    "        for (int64_t r = 0; r < ni; r++) {\n"
    "            $S3 *oi = a3 + (b * S + i0 + r) * $o + h * $v;\n"
    "            #pragma GCC unroll 1\n"
    "            for (int64_t d = 0; d < $v; d++) oi[d] = $W3(HIDE && l[r] == 0 ? 0 : acc[r][d] / l[r]);\n"
    "        }\n"
    "    }\n";

/* The backward, in one parallel region, one of two ways by the threads it
 * has (TCC_THREADS, the prelude), from two parts written as functions of
 * their own (NAME_block, NAME_tile: each compiled once):
 *
 * - With 4 or more (batch, kv head) pairs a thread: per pair, its query rows
 *   in blocks of QB against tiles of TILE keys (NAME_block with with_kv),
 *   the tile's keys (and values) widened and transposed once per block as
 *   in the forward, so that the dot products of a row with the tile's keys
 *   run across the keys as vectors (each still summed over the head in its
 *   order). For each block, first each row's log-sum-exp and output, tile
 *   by tile as the forward computes them, then the gradients: each tile's
 *   probabilities and score gradients as vectors, then key by key in order:
 *   dq in a row of $T, stored once; dk and dv added into memory (zeroed by a
 *   kernel before, as the GPU renderings add into them from many blocks), in
 *   the order of the query rows. dk and dv of a kv head belong to one task,
 *   so nothing races.
 * - With fewer (a small batch on many cores), with more tasks: per (batch,
 *   head, query block), the same first pass, each row's log-sum-exp and
 *   dot(dout, out) kept in the scratch a7 ([2][B][H][S]), and dq; then per
 *   (batch, kv head, key tile), dk and dv of the tile's keys (NAME_tile).
 *   The scores are computed twice, but no two tasks write one element.
 *
 * Both add every term in the same order with the same operations (dk and
 * dv are f32 or f64 storage whatever q is, the shape rule of
 * attention_grad, so an add into memory does not round), so the two give
 * the same bits (tests/lit/kernels/attention-forms.test). Measured here
 * (TCC_PROFILE, two threads), the second form is 6-25% slower at S = 64
 * with 48 or 64 pairs, and 25-40% faster at S = 512 with 2 pairs. */
static const char *attention_bwd =
    "    enum { NQB = (S + QB - 1) / QB, NKT = ($Z + TILE - 1) / TILE };\n"
    "    #pragma omp parallel\n"
    "    {\n"
    "    if (B * KV >= 4 * TCC_THREADS()) {\n"
    "        #pragma omp for collapse(2) schedule(static)\n"
    "        for (int64_t b = 0; b < B; b++)\n"
    "        for (int64_t kh = 0; kh < KV; kh++)\n"
    "            for (int64_t h = kh * (H / KV); h < (kh + 1) * (H / KV); h++)\n"
    "                for (int64_t qb = 0; qb < NQB; qb++) $N_block(args, b, h, qb, 1);\n"
    "    } else {\n"
    "        #pragma omp for collapse(3) schedule(static)\n"
    "        for (int64_t b = 0; b < B; b++)\n"
    "        for (int64_t h = 0; h < H; h++)\n"
    "        for (int64_t qb = 0; qb < NQB; qb++) $N_block(args, b, h, qb, 0);\n"
    "        #pragma omp for collapse(3) schedule(static)\n"
    "        for (int64_t b = 0; b < B; b++)\n"
    "        for (int64_t kh = 0; kh < KV; kh++)\n"
    "        for (int64_t t = 0; t < NKT; t++) $N_tile(args, b, kh, t);\n"
    "    }\n"
    "$B"
    "    }\n";

/* NAME_block(args, b, h, qb, with_kv): query block qb of head h against
 * every tile of keys: first pass, then dq; dk and dv added into memory
 * (with_kv), or else the rows' log-sum-exp and dot(dout, out) kept in a7. */
static const char *attention_bwd_block =
    "    const int64_t kh = h / (H / KV), i0 = qb * QB, ni = S - i0 < QB ? S - i0 : QB;\n"
    "    $R"
    "    $T m[QB], l[QB], dot_o[QB], lse[QB], q[QB][DH], dout[QB][$v], acc[QB][$v], dq[QB][DH];\n"
    "    $T kt[DH][TILE], vt[$v][TILE], s[TILE], dp[TILE];\n"
    "    $P"
    "    for (int64_t r = 0; r < ni && !with_kv; r++)\n"
    "        a7[(b * H + h) * S + i0 + r] = lse[r], a7[((B + b) * H + h) * S + i0 + r] = dot_o[r];\n"
    "    $I"
    "            for (int64_t j = 0; j < nr; j++) {\n"
    "                const $S1 *kj = a1 + (b * $Z + j0 + j) * $p1 + kh * $e1$f1;\n"
    "                const $T p = s[j], ds = dp[j];\n"
    "                #pragma GCC unroll 1\n"
    "                for (int64_t d = 0; d < DH; d++) dq[r][d] += ds * $L1(kj[d]);\n"
    "                if (!with_kv)\n"
    "                    continue;\n"
    "                $S5 *dkj = a5 + (b * $Z + j0 + j) * KC + kh * DH;\n"
    "                $S6 *dvj = a6 + (b * $Z + j0 + j) * $c + kh * $v;\n"
    "                #pragma GCC unroll 1\n"
    "                for (int64_t d = 0; d < $v; d++) {\n"
    "                    dvj[d] = $W6($L6(dvj[d]) + p * dout[r][d]);\n"
    "$(                    dkj[d] = $W5($L5(dkj[d]) + ds * q[r][d]);\n"
    "                }\n$|                }\n"
    "                #pragma GCC unroll 1\n"
    "                for (int64_t d = 0; d < DH; d++) dkj[d] = $W5($L5(dkj[d]) + ds * q[r][d]);\n$)"
    "            }\n"
    "        }\n"
    "    }\n"
    "    $Q";

/* NAME_tile(args, b, kh, t): dk and dv of key tile t of kv head kh, from
 * every head of the kv head and every query row in order, with the rows'
 * log-sum-exp and dot(dout, out) that NAME_block kept in a7; summed in $T,
 * then added into memory (zero there: 0 + x is x, the bits of the adds
 * into memory one by one). */
static const char *attention_bwd_tile =
    "    (void)a4;\n"
    "    const int64_t j0 = t * TILE, n = $Z - j0 < TILE ? $Z - j0 : TILE;\n"
    "    $T kt[DH][TILE], vt[$v][TILE], s[TILE], dp[TILE], q[1][DH], dout[1][$v], dk[TILE][DH];\n"
    "    $T dv[TILE][$v];\n"
    "    $K"
    "    for (int64_t j = 0; j < n; j++)\n"
    "        for (int64_t d = 0; d < DH; d++) dk[j][d] = $(dv[j][d] = 0$|0;\n"
    "    for (int64_t j = 0; j < n; j++)\n"
    "        for (int64_t d = 0; d < DV; d++) dv[j][d] = 0$);\n"
    "    for (int64_t h = kh * (H / KV); h < (kh + 1) * (H / KV); h++)\n"
    "    for (int64_t i = WIN > 0 && j0 - WIN + 1 > (CAUSAL ? j0 : 0) ? j0 - WIN + 1 : CAUSAL ? j0 : 0;\n"
    "         i < (WIN > 0 && j0 + n + WIN - 1 < S ? j0 + n + WIN - 1 : S); i++) {\n"
    "        const int64_t r = 0, nr = CAUSAL && i - j0 + 1 < n ? i - j0 + 1 : n;\n"
    "        const $T lse[1] = {a7[(b * H + h) * S + i]}, dot_o[1] = {a7[((B + b) * H + h) * S + i]};\n"
    "        const $S0 *qi = a0 + (b * S + i) * $p0 + h * $e0$f0;\n"
    "        const $S3 *doi = a3 + (b * S + i) * $o + h * $v;\n"
    "        #pragma GCC unroll 1\n"
    "        for (int64_t d = 0; d < DH; d++) q[0][d] = $L0(qi[d])$(, $|;\n"
    "        #pragma GCC unroll 1\n"
    "        for (int64_t d = 0; d < DV; d++) $)dout[0][d] = $L3(doi[d]);\n"
    "        $G"
    "        for (int64_t j = 0; j < nr; j++) {\n"
    "            const $T p = s[j], ds = dp[j];\n"
    "            #pragma GCC unroll 1\n"
    "            for (int64_t d = 0; d < $v; d++) dv[j][d] += p * dout[0][d]$(, $|;\n"
    "            #pragma GCC unroll 1\n"
    "            for (int64_t d = 0; d < DH; d++) $)dk[j][d] += ds * q[0][d];\n"
    "        }\n"
    "    }\n"
    "    for (int64_t j = 0; j < n; j++) {\n"
    "        $S5 *dkj = a5 + (b * $Z + j0 + j) * KC + kh * DH;\n"
    "        $S6 *dvj = a6 + (b * $Z + j0 + j) * $c + kh * $v;\n"
    "        #pragma GCC unroll 1\n"
    "        for (int64_t d = 0; d < DH; d++)\n"
    "            dkj[d] = $W5($L5(dkj[d]) + dk[j][d])$(, $|;\n"
    "        #pragma GCC unroll 1\n"
    "        for (int64_t d = 0; d < DV; d++)\n"
    "            $)dvj[d] = $W6($L6(dvj[d]) + dv[j][d]);\n"
    "    }\n";

/* NAME_bias(args, hb, qb): the bias's gradient at query block qb of bias
 * head hb, summed over the batch (and over the heads for a bias of one
 * head) in order: per (head, row of the batch) the first pass, then the
 * tiles' score gradients before the cap and the scale (raw_ds) added in.
 * One task owns its rows of the gradient, so nothing races. */
static const char *attention_bwd_bias =
    "    const int64_t i0 = qb * QB, ni = S - i0 < QB ? S - i0 : QB;\n"
    "    $R"
    "    $T m[QB], l[QB], dot_o[QB], lse[QB], q[QB][DH], dout[QB][$v], acc[QB][$v], dq[QB][DH];\n"
    "    $T kt[DH][TILE], vt[$v][TILE], s[TILE], dp[TILE];\n"
    "    (void)a4;\n"
    "    for (int64_t h = BH == 1 ? 0 : hb; h < (BH == 1 ? H : hb + 1); h++)\n"
    "    for (int64_t b = 0; b < B; b++) {\n"
    "        const int64_t kh = h / (H / KV);\n"
    "        $P"
    "        $I"
    "                $d"
    "            }\n"
    "        }\n"
    "    }\n";

/* $I: the head of the backward's loops over the tiles of keys and the
 * block's rows: each tile's keys and values widened ($K), then row r's
 * probabilities and score gradients ($G); what follows in the template is
 * the rows' loop's body, then the two loops' ends. */
static const char *attention_bwd_tiles =
    "for (int64_t j0 = first; j0 <= last; j0 += TILE) {\n"
    "    const int64_t n = last - j0 + 1 < TILE ? last - j0 + 1 : TILE;\n"
    "    $K"
    "    for (int64_t r = 0; r < ni; r++) {\n"
    "        const int64_t i = i0 + r, nr = CAUSAL && i - j0 + 1 < n ? i - j0 + 1 : n;\n"
    "        $G";

/* The backward's fragments. $P: a block's rows widened, then each row's
 * log-sum-exp and dot(dout, out) from a first pass over the keys. */
static const char *attention_bwd_pass =
    "for (int64_t r = 0; r < ni; r++) {\n"
    "    const $S0 *qi = a0 + (b * S + i0 + r) * $p0 + h * $e0$f0;\n"
    "    const $S3 *doi = a3 + (b * S + i0 + r) * $o + h * $v;\n"
    "    m[r] = -INFINITY, l[r] = 0, dot_o[r] = 0;\n"
    "    #pragma GCC unroll 1\n"
    "    for (int64_t d = 0; d < DH; d++)\n"
    "        q[r][d] = $L0(qi[d]), $(dout[r][d] = $L3(doi[d]), acc[r][d] = $)dq[r][d] = 0;\n"
    "$($|    #pragma GCC unroll 1\n"
    "    for (int64_t d = 0; d < DV; d++)\n"
    "        dout[r][d] = $L3(doi[d]), acc[r][d] = 0;\n$)"
    "}\n"
    "$F"
    "for (int64_t r = 0; r < ni; r++) {\n"
    "    #pragma GCC unroll 1\n"
    "    for (int64_t d = 0; d < $v; d++)\n"
    "        dot_o[r] += HIDE && l[r] == 0 ? 0 : dout[r][d] * acc[r][d] / l[r];\n"
    "    lse[r] = m[r] + log$X(l[r]);\n"
    "}\n";

/* $K: the tile's keys and values widened and transposed. */
static const char *attention_bwd_kv =
    "for (int64_t j = 0; j < n; j++) {\n"
    "    const $S1 *kj = a1 + (b * $Z + j0 + j) * $p1 + kh * $e1$f1;\n"
    "    const $S2 *vj = a2 + (b * $Z + j0 + j) * $p2 + kh * $e2$f2;\n"
    "    #pragma GCC unroll 1\n"
    "    for (int64_t d = 0; d < DH; d++) kt[d][j] = $L1(kj[d])$(, $|;\n"
    "    #pragma GCC unroll 1\n"
    "    for (int64_t d = 0; d < DV; d++) $)vt[d][j] = $L2(vj[d]);\n"
    "}\n";

/* $G: row r's probabilities s and score gradients dp for the tile's first nr keys. */
static const char *attention_bwd_grad =
    "$Y\n"
    "for (int64_t j = 0; j < nr; j++) s[j] = 0, dp[j] = 0;\n"
    "#pragma GCC unroll 1\n"
    "for (int64_t d = 0; d < DH; d++) {\n"
    "$(    const $T x = q[r][d], y = dout[r][d];\n"
    "    for (int64_t j = 0; j < nr; j++) s[j] += x * kt[d][j], dp[j] += y * vt[d][j];\n"
    "}\n$|    const $T x = q[r][d];\n"
    "    for (int64_t j = 0; j < nr; j++) s[j] += x * kt[d][j];\n"
    "}\n"
    "#pragma GCC unroll 1\n"
    "for (int64_t d = 0; d < DV; d++) {\n"
    "    const $T y = dout[r][d];\n"
    "    for (int64_t j = 0; j < nr; j++) dp[j] += y * vt[d][j];\n"
    "}\n$)"
    "for (int64_t j = 0; j < nr; j++) {\n"
    "    $Vconst $T p = HIDE && ($H) ? 0 : $E($O$A - lse[r]);\n"
    "    s[j] = p, dp[j] = p * (dp[j] - dot_o[r])$g;\n"
    "}\n";

/* $Q: the block's dq stored. */
static const char *attention_bwd_dq =
    "for (int64_t r = 0; r < ni; r++) {\n"
    "    $S4 *dqi = a4 + (b * S + i0 + r) * QC + h * DH;\n"
    "    #pragma GCC unroll 1\n"
    "    for (int64_t d = 0; d < DH; d++) dqi[d] = $W4(dq[r][d]);\n"
    "}\n";

/* The kernel's arguments as typed pointers a0, a1, ... */
static void arg_decls(Out *o)
{
    const Kernel *k = o->k;
    for (int i = 0; i < k->nargs; i++)
        fprintf(o->f, "    %s *restrict a%d = (%s *)args[%d];\n", storage(k->arg_dtype[i]), i,
                storage(k->arg_dtype[i]), i);
}

char *cg_emit_c(Arena *a, const Kernel *k)
{
    char *buf = NULL;
    size_t len = 0;
    Out o = {open_memstream(&buf, &len), k, k->ftype != DT_F64, 0, 0, 0};
    if (!o.f)
        BUG("open_memstream failed");
    int ws = cg_c_workshared(k);
    if (k->pattern == KP_ATTENTION_BWD) { /* its parts, called from the kernel below */
        static const char *const part[3] = {"block", "tile", "bias"}, *const params[3] = {
            "int64_t b, int64_t h, int64_t qb, int with_kv", "int64_t b, int64_t kh, int64_t t",
            "int64_t hb, int64_t qb"};
        const char *tmpl[3] = {attention_bwd_block, attention_bwd_tile, attention_bwd_bias};
        for (int f = 0; f < (k->attn.dbias > 0 ? 3 : 2); f++) {
            fprintf(o.f, "static __attribute__((noinline)) void %s_%s(char *const *args, %s)\n{\n",
                    k->name, part[f], params[f]);
            arg_decls(&o);
            attention_consts(&o, 1);
            o.raw_ds = f == 2;
            attention_fill(&o, tmpl[f], 0);
            o.raw_ds = 0;
            fputs("}\n\n", o.f);
        }
    }
    fprintf(o.f, "void %s%s(char *const *args)\n{\n", k->name, ws ? "_ws" : "");
    if (k->pattern != KP_ATTENTION_BWD)
        arg_decls(&o);
    if (k->pattern == KP_ATTENTION || k->pattern == KP_ATTENTION_BWD) {
        attention_consts(&o, k->pattern == KP_ATTENTION);
        attention_fill(&o, k->pattern == KP_ATTENTION ? attention_fwd : attention_bwd, 0);
    } else if (lane_loop(k) >= 0) {
        lane_kernel(&o, lane_loop(k));
    } else {
        loop_kernel(&o);
    }
    fputs("}\n\n", o.f);
    if (ws)
        fprintf(o.f, "void %s(char *const *args)\n{\n#pragma omp parallel if (INT64_C(%lld) > 4096)\n"
                     "    %s_ws(args);\n}\n\n",
                k->name, (long long)cg_c_items(k), k->name);
    fclose(o.f);
    char *s = arena_strdup(a, buf);
    free(buf);
    return s;
}

/* ---- the work of a call, for the CPU cost model ---- */

/* A math-library call: the transcendental functions, and fmax and fmin of
 * floats (not inlined by the compiler without -ffast-math). */
static int libm_call(const KNode *n)
{
    return n->kind == KN_EXP || n->kind == KN_LOG || n->kind == KN_POW || n->kind == KN_SIN ||
           n->kind == KN_COS || n->kind == KN_ERF ||
           ((n->kind == KN_MAX || n->kind == KN_MIN) && n->type == KT_FLOAT);
}

/* The operations of the prelude's f32 exp and tanh (groups.c), counted as
 * they are written: the polynomial, the reduction, the selects, the bits. */
#define EXPF_OPS 37
#define TANHF_OPS (EXPF_OPS + 23)

/* One statement run `times` times into w. */
static void stmt_work(const Kernel *k, const KStmt *t, double times, PlanWork *w)
{
    const KNode *n = t->kind == KS_NODE ? &k->nodes.data[t->a] : NULL;
    int f32 = k->ftype == DT_F32;
    if (n && f32 && n->kind == KN_EXP)
        w->ops += times * EXPF_OPS;
    else if (n && f32 && n->kind == KN_TANH)
        w->ops += times * TANHF_OPS, w->divs += times;
    else if (t->kind == KS_STORE || t->kind == KS_STORE_ADD)
        w->ops += times * (t->kind == KS_STORE ? 1 : 2);
    else if (t->kind == KS_REDUCE && t->c != KR_SUM) /* fmax or fmin */
        w->calls += times;
    else if (n && n->kind == KN_TANH)
        w->tanh += times;
    else if (n && n->type == KT_FLOAT && (n->kind == KN_DIV || n->kind == KN_SQRT))
        w->divs += times;
    else if (n && n->kind == KN_RSQRT)
        w->divs += 2 * times;
    else if (n && libm_call(n))
        w->calls += times;
    else if (n && n->kind != KN_CONST && n->kind != KN_ICONST && n->kind != KN_IDX &&
             n->kind != KN_ACC)
        w->ops += times;
}

/* A loop kernel: each statement runs the parallel loop's extent times the
 * extents of the inner loops around it (the hoisted ones once); a loop that
 * reduces is a chain. */
static PlanWork loop_work(const Kernel *k)
{
    PlanWork w = {.serial = k->extent * (k->levels ? 64 : 1) <= 4096};
    double times[16] = {(double)k->extent}, loop_calls = 0, steps = 0;
    int depth = 0;
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_LOOP) {
            if (depth == 15)
                BUG("kernel %s: loops nested deeper than 15", k->name);
            times[depth + 1] = times[depth] * (double)t->extent;
            depth++;
            if (cg_loop_reduce(k, s) >= 0)
                w.chain += times[depth], steps += times[depth] * (double)t->extent;
        } else if (t->kind == KS_END) {
            depth--;
        } else {
            double c = w.calls + w.tanh;
            stmt_work(k, t, s < k->npre ? 1 : times[depth], &w);
            loop_calls += s < k->npre ? 0 : w.calls + w.tanh - c;
        }
    }
    /* a vector loop: no library call in it (the prologue's, once a call, do not count) */
    if (independent_items(k) && loop_calls == 0)
        w.vops = w.ops + 4 * w.divs, w.ops = w.divs = 0;
    w.chain_len = w.chain > 0 ? steps / w.chain : 0;
    if (lane_loop(k) >= 0) /* in lanes: the sums interleave, an add each, no chain */
        w.ops += w.chain, w.chain = 0, w.chain_len = 0;
    return w;
}

/* The attention templates (above), per (query, key) pair: the forward's
 * dot product over the head as vectors across the tile's keys (a multiply
 * and an add a step), the score scaled and its max taken, its exponential
 * as vectors (the prelude's exp), the row's sum (a chain as long as the
 * tile) and the update of the output row (two operations an element, as
 * vectors); per tile of each block, the keys transposed (a load and a store
 * an element, over QB rows); per row and tile, the rescale (an exp, and the
 * row times the correction as vectors); per row, the output divided by the
 * sum. The backward: the same first pass, then two dot products, the
 * probability and the score's gradient (an exp and 4 operations), and dv,
 * dq and dk (eleven operations an element, as vectors), the values
 * transposed with the keys. */
/* The scores one (batch, head) computes, as the C templates walk the tiles:
 * per block of QB query rows the tiles from `first` to the one holding
 * `last` ($R), each row all of a tile's keys (up to its own when causal).
 * Without a window the closed forms: S (S + 1) / 2 causal, else S Sk (a
 * window or causal only where Sk = S). */
static double attention_pairs(const KAttention *a)
{
    int64_t S = a->seq, W = a->window;
    if (W <= 0)
        return a->causal ? (double)S * (double)(S + 1) / 2 : (double)S * (double)a->seq_k;
    double pairs = 0;
    for (int64_t i0 = 0; i0 < S; i0 += ATT_QB) {
        int64_t ni = S - i0 < ATT_QB ? S - i0 : ATT_QB;
        int64_t last = a->causal ? i0 + ni - 1 : i0 + ni + W - 2 < S - 1 ? i0 + ni + W - 2 : S - 1;
        int64_t first = i0 - W + 1 > 0 ? (i0 - W + 1) / ATT_TILE * ATT_TILE : 0;
        for (int64_t j0 = first; j0 <= last; j0 += ATT_TILE) {
            int64_t n = last - j0 + 1 < ATT_TILE ? last - j0 + 1 : ATT_TILE;
            for (int64_t i = i0; i < i0 + ni; i++)
                pairs += (double)(a->causal && i - j0 + 1 < n ? (i - j0 + 1 > 0 ? i - j0 + 1 : 0) : n);
        }
    }
    return pairs;
}

static PlanWork attention_work(const Kernel *k)
{
    const KAttention *a = &k->attn;
    double rows = (double)(a->batch * a->heads * a->seq);
    double dh = (double)(a->head_dim + a->head_dim_v) / 2; /* the mean of the two head sizes */
    double pairs = (double)(a->batch * a->heads) * attention_pairs(a);
    double tiles = rows * ceil((double)a->seq_k / ATT_TILE), tr = 2 * dh * pairs / ATT_QB;
    int len = a->seq_k < ATT_TILE ? (int)a->seq_k : ATT_TILE;
    PlanWork fwd = {.ops = 4 * pairs + tr + tiles * EXPF_OPS,
                    .chain = pairs,
                    .divs = dh * rows,
                    .vops = pairs * (4 * dh + EXPF_OPS) + tiles * dh + 2 * dh * rows,
                    .chain_len = len};
    double cap = a->softcap > 0 ? TANHF_OPS + 2 : 0; /* a score's tanh, divide and multiply */
    fwd.ops += cap * pairs, fwd.vops += cap * pairs, fwd.divs += cap > 0 ? pairs : 0;
    if (k->pattern == KP_ATTENTION)
        return fwd;
    PlanWork first = fwd; /* the backward's first pass: each row's statistics */
    fwd.ops += 4 * pairs + 2 * tr, fwd.vops += pairs * (4 * dh + EXPF_OPS + 4 + 11 * dh) + 4 * dh * rows;
    fwd.ops += cap * pairs, fwd.vops += cap * pairs, fwd.divs += cap > 0 ? pairs : 0;
    if (a->dbias > 0) { /* the bias's part: the first pass again, the scores' gradients, their adds */
        fwd.ops += first.ops + 2 * pairs, fwd.chain += first.chain, fwd.divs += first.divs;
        fwd.vops += first.vops + pairs * (4 * dh + EXPF_OPS + 4);
    }
    return fwd;
}

PlanWork cg_c_work(const Kernel *k)
{
    if (k->pattern == KP_ATTENTION || k->pattern == KP_ATTENTION_BWD)
        return attention_work(k);
    return loop_work(k);
}
