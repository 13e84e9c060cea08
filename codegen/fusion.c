/* fusion.c: which values need no memory of their own. Reads the Graph;
 * writes gen->fused (computed inside its only user's kernel, or written by
 * a GEMM: its bias epilogue, its transposed product, a weight gradient it
 * adds into the sum over microbatches), gen->kept (computed
 * and stored by its first reader's kernel), gen->dead (ops whose results
 * nothing reads), gen->view (attention's q, k and v read in place from
 * the fused tensor they are sliced from), gen->bias_add, gen->tgemm and
 * gen->acc_gemm; and
 * says what a GEMM
 * operand reads through transposes (cg_gemm_source), as the instructions
 * then do (instrs.c).
 * Key idea: an elementwise result with one use, by an elementwise op of the
 * same shape (or a scalar constant), is computed inside that op's kernel.
 * Fusion decides the arithmetic, so a recomputed value fuses as it did
 * without recomputation and no bit changes (twin_uses). */
#include "kgen.h"

#include <string.h>

/* ---- what a GEMM reads through transposes, and writes transposed ---- */

/* The matrix v is the transpose of (last two dims swapped), or NULL. */
static const Value *transposed_from(const Value *v)
{
    const Op *t = v->def;
    if (!t || t->kind != OP_TRANSPOSE || t->args[0]->rank != v->rank || v->rank < 2)
        return NULL;
    int64_t perm[IR_MAX_RANK];
    ir_transpose_perm(t, perm);
    for (int i = 0; i < v->rank; i++) {
        int want = i == v->rank - 2 ? v->rank - 1 : i == v->rank - 1 ? v->rank - 2 : i;
        if (perm[i] != want)
            return NULL;
    }
    return t->args[0];
}

/* What a GEMM operand v reads: through the transposes of its last two dims
 * (the backward's transpose of the forward's transpose of a weight reads the
 * weight itself), the first value that is not one; *flips counts them, and
 * an odd count is read with the GEMM's transpose flag. */
const Value *cg_gemm_source(const Value *v, int *flips)
{
    const Value *u;
    *flips = 0;
    while ((u = transposed_from(v)))
        v = u, ++*flips;
    return v;
}

/* Which operands of a matmul read through transposes (cg_gemm_source): bit 0 for
 * a, bit 1 for b. A shared [K,N] matrix folds its batch into rows, so a read
 * with the flag is folded only when it is a plain matrix there. */
int cg_gemm_folds(const Op *op)
{
    const Value *a = op->args[0], *b = op->args[1];
    int fa, fb;
    cg_gemm_source(a, &fa), cg_gemm_source(b, &fb);
    return (fa && (fa % 2 == 0 || b->rank > 2 || a->rank == 2)) | (fb ? 2 : 0);
}

/* The matmul result m that transpose t (of a matrix) takes, when its GEMM can
 * write m's transpose instead, (A B)^T = B^T A^T: m read by t only, a plain
 * product of two matrices, on t's stage and in its piece. NULL otherwise. */
static const Value *transposed_gemm(const Op *t, const int *uses)
{
    if (t->kind != OP_TRANSPOSE || t->res[0]->rank != 2 || !transposed_from(t->res[0]))
        return NULL;
    const Value *m = t->args[0];
    const Op *mm = m->def;
    if (!mm || mm->kind != OP_MATMUL || uses[m->id] != 1 || mm->stage != t->stage ||
        mm->tick != t->tick || m->rank != 2 || mm->args[0]->rank != 2 || mm->args[1]->rank != 2 ||
        m->dtype != t->res[0]->dtype)
        return NULL;
    return m;
}

/* ---- fusion ----
 * An elementwise result with one use, by an elementwise op of the same
 * shape (or a scalar constant), is computed inside that op's kernel. */

/* The matmul result m of add(m, b) or add(b, m) that the GEMM can finish with
 * its bias epilogue: m read by the add only, b a vector along m's last dim,
 * one dtype, one stage, a plain weight matrix (no batch of products). */
const Value *cg_bias_matmul(const Op *add, const int *uses, const Value **bias)
{
    if (add->kind != OP_ADD || add->nargs != 2)
        return NULL;
    for (int j = 0; j < 2; j++) {
        const Value *m = add->args[j], *b = add->args[1 - j], *out = add->res[0];
        const Op *mm = m->def;
        if (!mm || mm->kind != OP_MATMUL || (uses && uses[m->id] != 1) || mm->stage != add->stage ||
            mm->args[1]->rank != 2 || m->rank < 2 || b->rank != 1 ||
            b->shape[0] != m->shape[m->rank - 1] || b->dtype != m->dtype ||
            out->dtype != m->dtype || out->rank != m->rank ||
            memcmp(out->shape, m->shape, sizeof(int64_t) * (size_t)m->rank))
            continue;
        *bias = b;
        return m;
    }
    return NULL;
}

static void find_bias_adds(Gen *gen, const int *uses)
{
    const Graph *g = gen->g;
    gen->bias_add = arena_alloc(gen->a, (size_t)g->ops.len + 1);
    gen->tgemm = arena_alloc(gen->a, (size_t)g->ops.len + 1);
    for (int i = 0; i < g->ops.len; i++) {
        const Value *b, *m = cg_bias_matmul(g->ops.data[i], uses, &b);
        gen->tgemm[i] = 0;
        if (m) {
            gen->bias_add[i] = 1;
            gen->fused[m->id] = 1; /* no memory of its own: the GEMM writes the sum */
        } else if ((m = transposed_gemm(g->ops.data[i], uses))) {
            gen->tgemm[i] = 1;
            gen->fused[m->id] = 1; /* likewise: the GEMM writes the transpose */
        }
    }
}

/* One gradient buffer: a matmul (a weight's gradient) whose only reader
 * sums it over the microbatches is a GEMM that adds its product into the
 * sum, beta 1, with no tensor of its own. In a loop plan the sum is a
 * microbatch_sum (its instruction an `acc`: the first microbatch's run
 * writes with beta 0, plan/expand.c); in a plan of adds (--verify's) it is
 * the add of the running sum and this microbatch's product, which takes
 * the running sum's tensor (tensors.c), the first product written there by
 * its own GEMM. Both run the same GEMMs on the same tensors, so the two
 * plans keep one step's bits. Not across stages or for a product of another
 * dtype or shape than its sum. */
static int acc_operand(const Gen *gen, const Op *sum, const Value *m, const int *uses)
{
    const Value *s = sum->res[0];
    return m->def && m->def->kind == OP_MATMUL && uses[m->id] == 1 && !gen->fused[m->id] &&
           m->def->stage == sum->stage && m->dtype == s->dtype && m->rank == s->rank &&
           !memcmp(m->shape, s->shape, sizeof(int64_t) * (size_t)s->rank);
}

static void find_acc_gemms(Gen *gen, const int *uses)
{
    const Graph *g = gen->g;
    gen->acc_gemm = arena_alloc(gen->a, sizeof(int) * (size_t)(g->ops.len + 1));
    memset(gen->acc_gemm, 0, sizeof(int) * (size_t)(g->ops.len + 1));
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        const Value *m = NULL;
        if (!gen->tc.grad_accumulation_fusion)
            break; /* the train setting: a part, its cast and an add per microbatch */
        if (op->kind == OP_MB_SUM && gen->loop && acc_operand(gen, op, op->args[0], uses) &&
            op->args[0]->def->mb >= 0)
            m = op->args[0];
        if (op->kind == OP_ADD && !gen->loop && op->mb < 0 && op->phase == PH_BWD) {
            /* ((p0 + p1) + p2) + ...: the microbatch's product (args[1]) is added; the
             * running sum or the first product (args[0]) lends its tensor */
            const Value *y = op->args[1], *x = op->args[0];
            const Op *xd = x->def;
            const Value *s = op->res[0];
            if (acc_operand(gen, op, y, uses) && y->def->mb >= 0 && xd && uses[x->id] == 1 &&
                xd->stage == op->stage && x->dtype == y->dtype && x->rank == s->rank &&
                !memcmp(x->shape, s->shape, sizeof(int64_t) * (size_t)s->rank) &&
                ((xd->kind == OP_MATMUL && xd->mb >= 0) || gen->acc_gemm[xd->id]) &&
                !gen->fused[x->id])
                m = y;
        }
        if (!m)
            continue;
        gen->acc_gemm[i] = m->def->id + 1;
        gen->fused[m->id] = 1; /* no memory of its own: the GEMM adds it into the sum */
    }
}

/* A forward value and its recomputed copy (passes/recompute.c) fuse as the
 * forward value did without recomputation: both count the readers it had then,
 * its own and its copy's other than recompute ops. Fusion decides the
 * arithmetic (a fused bf16 intermediate is never rounded to bf16, a product
 * with its bias add is one GEMM epilogue), so recomputation changes no bit. */
static void twin_uses(Gen *gen, int *uses, const int *recomputed)
{
    const Value **twin = ir_recompute_twins(gen->g, gen->a);
    for (int i = 0; i < gen->g->values.len; i++) {
        const Value *t = twin[i];
        if (!t)
            continue;
        int n = uses[t->id] + uses[i] - recomputed[i];
        uses[t->id] = uses[i] = n;
    }
}

/* Values computed in their first reader's kernel and stored there too, for
 * the readers after it: an elementwise result (f32, f64, or bf16, which its
 * reader rounds as its store did: kernels.c kept_expr; not a bf16 sum that
 * its GEMM's bias epilogue makes, rounded once there and twice inline) read
 * by more than one
 * op whose first reader is an elementwise kernel of its shape (GELU of a
 * product plus its bias) or a layernorm or rmsnorm of it (the residual add
 * before the next block's norm). That kernel computes it from its operands
 * and stores it at its own element (a norm: in its last loop over the row,
 * after the loops of its statistics read the operands); the value's own
 * pass over memory is gone. Not with recomputation in the picture (a value
 * with a recomputed copy, or ops of the recompute phase), across stages or
 * pieces of a schedule, or where the first reader is fused into another
 * kernel or kept in one itself (then it would not run where this value is
 * stored). An elementwise reader takes a value when every operand its
 * kernel loads has its shape or is broadcast along its rows with one width
 * (a bias: the kernel then runs in rows, emit_c.c); then a bias add that the
 * GEMM would finish (its epilogue, one thread) goes into the reader's
 * parallel kernel, and the GEMM writes the bare product (GELU of the MLP's
 * product). Measured on gpt-tiny (TCC_PROFILE): with a flat loop, which
 * reads the bias at i % N lane by lane, GELU took 1.0 ms a step more than
 * the epilogue saved; in rows, GELU and the MLP's forward GEMMs took 0.7 ms
 * less. Each element's arithmetic is unchanged, so are the bits. */
/* The loads of v's expression with its fused producers inlined. */
static int inline_loads(const Gen *gen, const Value *v)
{
    if (!gen->fused[v->id] || !v->def)
        return 1;
    int n = 0;
    for (int j = 0; j < v->def->nargs; j++)
        n += inline_loads(gen, v->def->args[j]);
    return n;
}

/* The width of a's broadcast into shape (rank, shape): the number of its
 * elements when its shape is the last dimensions of that shape (read at
 * i % width), 0 when it is the whole shape, -1 otherwise. */
static int64_t suffix_width(const Value *a, int rank, const int64_t *shape)
{
    if (a->rank == rank && !memcmp(a->shape, shape, sizeof(int64_t) * (size_t)rank))
        return 0;
    if (a->rank > rank || (a->rank && memcmp(a->shape, shape + rank - a->rank,
                                             sizeof(int64_t) * (size_t)a->rank)))
        return -1;
    int64_t w = 1;
    for (int d = 0; d < a->rank; d++)
        w *= a->shape[d];
    return w;
}

/* Whether every load of v's expression (its fused producers inlined) is of
 * shape (rank, shape) or broadcast along its rows with one width *w, which
 * the C rendering then reads in order (emit_c.c, row_width); a flat loop
 * would read a broadcast operand at a remainder, lane by lane. */
static int row_loads(const Gen *gen, const Value *v, int rank, const int64_t *shape, int64_t *w)
{
    if (!v->def)
        return 1;
    for (int j = 0; j < v->def->nargs; j++) {
        const Value *a = v->def->args[j];
        if (gen->fused[a->id]) {
            if (!row_loads(gen, a, rank, shape, w))
                return 0;
            continue;
        }
        int64_t aw = suffix_width(a, rank, shape);
        if (aw < 0 || (aw && ((*w && aw != *w) || aw < 8)))
            return 0;
        *w = aw ? aw : *w;
    }
    return 1;
}

static void find_kept(Gen *gen, const int *uses, const int *recomputed)
{
    const Graph *g = gen->g;
    const Op **first = arena_alloc(gen->a, sizeof(Op *) * (size_t)(g->values.len + 1));
    char *elsewhere = arena_alloc(gen->a, (size_t)g->values.len + 1); /* read on another stage */
    for (int i = g->ops.len - 1; i >= 0; i--)
        for (int j = 0; j < g->ops.data[i]->nargs; j++) {
            const Value *a = g->ops.data[i]->args[j];
            first[a->id] = g->ops.data[i];
            elsewhere[a->id] |= a->def && a->def->stage != g->ops.data[i]->stage;
        }
    const Value **twin = ir_recompute_twins(g, gen->a);
    char *is_twin = arena_alloc(gen->a, (size_t)g->values.len + 1);
    for (int i = 0; i < g->values.len; i++)
        if (twin[i])
            is_twin[twin[i]->id] = 1;
    for (int i = g->ops.len - 1; i >= 0; i--) { /* a reader's own result decided first */
        const Op *op = g->ops.data[i];
        if (!cg_fusable(op) || op->nres != 1 || op->kind == OP_CONSTANT || gen->tgemm[op->id] ||
            gen->acc_gemm[op->id])
            continue;
        const Value *v = op->res[0];
        const Op *u = first[v->id];
        /* a value another stage reads is sent where it is made: made later it would not be */
        if (gen->fused[v->id] || uses[v->id] < 2 || !u || twin[v->id] || is_twin[v->id] ||
            elsewhere[v->id] ||
            recomputed[v->id] || op->phase == PH_RECOMPUTE || u->phase == PH_RECOMPUTE ||
            (v->dtype != DT_F32 && v->dtype != DT_F64 && v->dtype != DT_BF16) ||
            (v->dtype == DT_BF16 && gen->bias_add[op->id]) || u->stage != op->stage ||
            u->tick != op->tick)
            continue;
        int64_t w = 0;
        int pointwise = cg_fusable(u) && u->kind != OP_CONSTANT && u->nres == 1 &&
                        !gen->fused[u->res[0]->id] && !gen->kept[u->res[0]->id] &&
                        u->res[0]->rank == v->rank &&
                        !memcmp(u->res[0]->shape, v->shape, sizeof(int64_t) * (size_t)v->rank) &&
                        row_loads(gen, u->res[0], v->rank, v->shape, &w);
        int norm = (u->kind == OP_LAYERNORM || u->kind == OP_RMSNORM) && u->args[0] == v;
        for (int j = 1; norm && j < u->nargs; j++)
            norm = u->args[j] != v;
        int n = 0; /* the loads it brings along (a norm computes it in each of its loops) */
        for (int j = 0; j < op->nargs; j++)
            n += inline_loads(gen, op->args[j]);
        if (!(pointwise || norm) || n > 4 || (gen->bias_add[op->id] && !pointwise))
            continue;
        if (gen->bias_add[op->id]) { /* the reader adds the bias: the GEMM writes the product */
            const Value *b, *m = cg_bias_matmul(op, NULL, &b);
            gen->bias_add[op->id] = 0;
            gen->fused[m->id] = 0;
        }
        gen->kept[v->id] = u->id + 1;
    }
}

/* ---- attention's q, k and v read in place ---- */

/* The slice s of a fused q/k/v tensor x [..., G, W] along its last dim that
 * operand n of attention op a reads, through a reshape r to [B, S, heads
 * x d]: a view when each group of W holds one head of the operand (its head
 * size is the slice's width), so that head h of row i is at i G W + h W +
 * start. Then attention reads x (0: not such a slice). */
static int view_fits(const Op *a, int n, const Value *r, const Op *s)
{
    const Value *x = s->args[0];
    int rx = x->rank;
    int64_t dim = ir_op_attr_int(s, "dim", -1);
    if (s->kind != OP_SLICE || rx < 3 || r->rank != 3 || (dim < 0 ? dim + rx : dim) != rx - 1)
        return 0;
    int64_t heads = n == 0 ? ir_op_attr_int(a, "heads", 1)
                           : ir_op_attr_int(a, "kv_heads", ir_op_attr_int(a, "heads", 1));
    int64_t w = ir_op_attr_int(s, "end", 0) - ir_op_attr_int(s, "start", 0), rows = 1;
    for (int i = 0; i < rx - 2; i++)
        rows *= x->shape[i];
    return heads > 0 && r->shape[2] % heads == 0 && w == r->shape[2] / heads &&
           x->shape[rx - 2] == heads && rows == r->shape[0] * r->shape[1] && a->stage == s->stage;
}

/* Marks the views: slices every reader of which (through reshapes) is an
 * attention op's q, k or v that fits (view_fits), k and v both or neither
 * (the GPU kernels load a value at its key's index, plus the offset
 * between them), x itself in memory. */
static void find_views(Gen *gen)
{
    const Graph *g = gen->g;
    int nv = g->values.len;
    char *ok = arena_alloc(gen->a, (size_t)nv + 1), *seen = arena_alloc(gen->a, (size_t)nv + 1);
    memset(ok, 1, (size_t)nv + 1);
    memset(seen, 0, (size_t)nv + 1);
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        int att = op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD;
        for (int j = 0; j < op->nargs; j++) {
            const Value *v = op->args[j];
            const Op *d = v->def;
            if (d && d->kind == OP_SLICE && d->nres == 1) { /* read other than through a reshape */
                if (op->kind != OP_RESHAPE)
                    ok[v->id] = 0;
                seen[v->id] = 1;
                continue;
            }
            if (!d || d->kind != OP_RESHAPE || !d->args[0]->def || d->args[0]->def->kind != OP_SLICE)
                continue;
            const Value *sv = d->args[0];
            const Value *x = sv->def->args[0];
            int fits = att && j < 3 && view_fits(op, j, v, sv->def) && !gen->fused[x->id] &&
                       !gen->fused[sv->id];
            if (fits && j > 0) { /* k and v: both views of one x, one pitch and head stride */
                const Op *o = op->args[3 - j]->def;
                fits = o && o->kind == OP_RESHAPE && o->args[0]->def && o->args[0]->def->kind == OP_SLICE &&
                       o->args[0]->def->args[0] == x && view_fits(op, 3 - j, op->args[3 - j], o->args[0]->def);
            }
            if (!fits)
                ok[sv->id] = 0;
        }
    }
    for (int i = 0; i < g->outputs.len; i++) { /* an output keeps its memory */
        const Value *v = g->outputs.data[i];
        if (v->def && v->def->kind == OP_RESHAPE)
            v = v->def->args[0];
        ok[v->id] = 0;
    }
    for (int i = 0; i < nv; i++)
        ok[i] &= seen[i] && !gen->kept[i];
    for (int changed = 1; changed;) { /* k without v, or v without k: neither */
        changed = 0;
        for (int i = 0; i < g->ops.len; i++) {
            const Op *op = g->ops.data[i];
            if (op->kind != OP_ATTENTION && op->kind != OP_ATTENTION_GRAD)
                continue;
            int on[2] = {0, 0}, id[2] = {-1, -1};
            for (int j = 1; j < 3; j++) {
                const Op *d = op->args[j]->def;
                if (d && d->kind == OP_RESHAPE && d->args[0]->def && d->args[0]->def->kind == OP_SLICE)
                    id[j - 1] = d->args[0]->id, on[j - 1] = ok[id[j - 1]];
            }
            if (on[0] != on[1]) {
                ok[on[0] ? id[0] : id[1]] = 0;
                changed = 1;
            }
        }
    }
    gen->view = ok;
}

/* ---- the cross-entropy and its gradient in one row kernel ---- */

/* A cross_entropy and the cross_entropy_grad of the same logits and targets,
 * on one stage and in one piece, whose loss gradient the compile knows (1,
 * or 1 / microbatches): the loss's row kernel computes the row's max and sum
 * once for both and writes the gradient too (kernels.c), so the logits, the
 * step's largest activation, are read in one kernel instead of two; the
 * gradient's operand chain is then read by nothing (uses). Not with
 * recomputation of the logits. The gradient's bits are those of its own
 * kernel: the same max, sum and scale, each rounded as there. */
static void find_ce_pairs(Gen *gen, int *uses)
{
    const Graph *g = gen->g;
    const Value **twin = ir_recompute_twins(g, gen->a);
    gen->ce_pair = arena_alloc(gen->a, sizeof(int) * (size_t)(g->ops.len + 1));
    for (int i = 0; i < g->ops.len; i++) {
        const Op *b = g->ops.data[i];
        double dl;
        if (b->kind != OP_CROSS_ENTROPY_GRAD || b->phase == PH_RECOMPUTE || twin[b->args[0]->id] ||
            !ir_scalar_value(b->args[2], &dl))
            continue;
        for (int j = 0; j < g->ops.len; j++) {
            const Op *f = g->ops.data[j];
            if (f->kind != OP_CROSS_ENTROPY || f->args[0] != b->args[0] || f->args[1] != b->args[1] ||
                f->stage != b->stage || f->tick != b->tick || f->phase == PH_RECOMPUTE ||
                gen->ce_pair[j] || j > i)
                continue;
            gen->ce_pair[j] = i + 1;
            gen->ce_pair[i] = -(j + 1);
            uses[b->args[2]->id]--;
            break;
        }
    }
}

void cg_find_fusions(Gen *gen, int flags)
{
    const Graph *g = gen->g;
    int *uses = arena_alloc(gen->a, sizeof(int) * (size_t)(g->values.len + 1));
    const Op **user = arena_alloc(gen->a, sizeof(Op *) * (size_t)(g->values.len + 1));
    gen->fused = arena_alloc(gen->a, (size_t)g->values.len + 1);
    gen->kept = arena_alloc(gen->a, sizeof(int) * (size_t)(g->values.len + 1));
    if (flags & CG_KEEP_VALUES)
        return;
    int *recomputed = arena_alloc(gen->a, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        int folds = op->kind == OP_MATMUL ? cg_gemm_folds(op) : 0, flips;
        for (int j = 0; j < op->nargs; j++) {
            const Value *v = folds & (1 << j) ? cg_gemm_source(op->args[j], &flips) : op->args[j];
            uses[v->id]++;
            recomputed[v->id] += op->phase == PH_RECOMPUTE;
            user[v->id] = op;
        }
    }
    for (int i = 0; i < g->outputs.len; i++)
        uses[g->outputs.data[i]->id] += 2;
    twin_uses(gen, uses, recomputed);
    find_bias_adds(gen, uses);
    find_acc_gemms(gen, uses);
    int *leaves = arena_alloc(gen->a, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (!cg_fusable(op) || op->nres != 1 || uses[op->res[0]->id] != 1 || gen->bias_add[op->id] ||
            gen->tgemm[op->id] || gen->acc_gemm[op->id])
            continue;
        int n = 0; /* the loads it brings along: a bound keeps kernels small */
        for (int j = 0; j < op->nargs; j++)
            n += gen->fused[op->args[j]->id] ? leaves[op->args[j]->id] : 1;
        leaves[op->res[0]->id] = n;
        if (n > 12)
            continue;
        const Value *v = op->res[0], *out = user[v->id]->nres ? user[v->id]->res[0] : NULL;
        int same = out && v->rank == out->rank &&
                   !memcmp(v->shape, out->shape, sizeof(int64_t) * (size_t)v->rank);
        int scalar = op->kind == OP_CONSTANT && v->rank == 0;
        /* a stage computes only its own ops; a value of an earlier piece of the schedule
         * is stored there (a microbatch's gradient is added into the sum in its own
         * backward, not read again by the last one) */
        /* the optimizer's kernel computes its gradient operand (the clipped gradient); a
         * reduction over a dimension, each element of its input when that is one
         * arithmetic op of loaded operands (a sum of squares): cheap in its loop */
        const Op *u = user[v->id];
        int grad_of_update = out && (u->kind == OP_ADAMW || u->kind == OP_SGD) && u->args[1] == v;
        int reduced = (u->kind == OP_SUM || u->kind == OP_MEAN || u->kind == OP_MAX) &&
                      u->args[0] == v && (op->kind == OP_MUL || op->kind == OP_ADD ||
                                          op->kind == OP_SUB || op->kind == OP_NEG);
        for (int j = 0; reduced && j < op->nargs; j++)
            reduced = !gen->fused[op->args[j]->id];
        if (out && (cg_fusable(u) || grad_of_update || reduced) && u->kind != OP_CONSTANT &&
            (same || scalar || reduced) && u->stage == op->stage && (scalar || u->tick == op->tick))
            gen->fused[v->id] = 1;
    }
    find_kept(gen, uses, recomputed);
    find_views(gen);
    find_ce_pairs(gen, uses);
    gen->dead = arena_alloc(gen->a, (size_t)g->ops.len + 1);
    for (int i = g->ops.len - 1; i >= 0; i--) { /* backwards: a dead op frees its operands */
        const Op *op = g->ops.data[i];
        int used = op->kind == OP_UPDATE || op->nres == 0;
        for (int j = 0; j < op->nres; j++)
            used |= uses[op->res[j]->id] > 0;
        if (used || op->kind == OP_PARAM || op->kind == OP_STATE || op->kind == OP_INPUT)
            continue;
        gen->dead[i] = 1;
        for (int j = 0; j < op->nargs; j++)
            uses[op->args[j]->id]--;
    }
    for (int i = 0; i < g->values.len; i++) /* a reader that does not run stores nothing */
        if (gen->kept[i] && gen->dead[gen->kept[i] - 1])
            gen->kept[i] = 0;
}
