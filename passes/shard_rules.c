/* shard_rules.c: the sharding rule of every op kind, and reshardings.
 * Reads an op and its operands' shardings; writes a Strategy (what each operand
 * must be, what each result comes out as) or the steps of a resharding. Key
 * idea: an op is a loop nest over factors (shard.h); a strategy assigns mesh
 * axes to factors, and among the assignments the operands propose (keep
 * operand 0 as it is, keep operand 1, ...), the one whose reshardings move the
 * fewest bytes wins. Partial sums flow through ops that are linear in them.
 * For --why, the same search can keep every way it weighed (shard_weigh) and
 * say which operand gave a result each of its mesh axes (shard_axis_from). */
#include "shard.h"

#include <stdlib.h>
#include <string.h>

typedef struct Factors {
    int nf;
    int64_t align[SH_MAXF];          /* the split count must divide this (0: no limit) */
    uint8_t full[SH_MAXF];           /* never split (softmax's row, attention's sequence) */
    int8_t in[SH_MAXARGS][IR_MAX_RANK]; /* operand dim -> factor, -1: whole */
    int8_t out[SH_MAXRES][IR_MAX_RANK];
    uint32_t lin;                    /* operands that partial sums may pass through */
    int lin_all;                     /* 1: all of lin carry the same partial (add), 0: one */
} Factors;

static int nres_of(const Op *op) { return op->nres < SH_MAXRES ? op->nres : SH_MAXRES; }

static int new_factor(Factors *f)
{
    if (f->nf >= SH_MAXF)
        BUG("too many sharding factors");
    f->align[f->nf] = 0;
    f->full[f->nf] = 0;
    return f->nf++;
}

static int norm_dim(const Op *op, int rank)
{
    int64_t d = ir_op_attr_int(op, "dim", -1);
    return (int)(d < 0 ? d + rank : d);
}

/* Result dims are factors; operand dims aligned from the right map to them
 * unless broadcast (size 1 against a larger size). */
static void fac_elementwise(const Op *op, Factors *f)
{
    const Value *r = op->res[0];
    for (int d = 0; d < r->rank; d++)
        new_factor(f);
    for (int i = 0; i < nres_of(op); i++)
        for (int d = 0; d < op->res[i]->rank; d++)
            f->out[i][d] = (int8_t)(d + r->rank - op->res[i]->rank);
    for (int a = 0; a < op->nargs && a < SH_MAXARGS; a++) {
        const Value *x = op->args[a];
        for (int d = 0; d < x->rank; d++) {
            int rd = d + r->rank - x->rank;
            f->in[a][d] = (int8_t)(rd >= 0 && x->shape[d] == r->shape[rd] ? rd : -1);
        }
    }
}

/* a[...,M,K] x b[K,N] or b[...,K,N] */
static void fac_matmul(const Op *op, Factors *f)
{
    const Value *a = op->args[0], *b = op->args[1], *r = op->res[0];
    for (int d = 0; d < r->rank; d++)
        f->out[0][d] = (int8_t)new_factor(f);
    int k = new_factor(f);
    for (int d = 0; d < a->rank - 1; d++)
        f->in[0][d] = (int8_t)d;
    f->in[0][a->rank - 1] = (int8_t)k;
    int off = r->rank - b->rank;
    for (int d = 0; d < b->rank - 2; d++)
        f->in[1][d] = (int8_t)(b->shape[d] == r->shape[d + off] ? d + off : -1);
    f->in[1][b->rank - 2] = (int8_t)k;
    f->in[1][b->rank - 1] = (int8_t)(r->rank - 1);
    f->lin = 3;
}

/* One factor per dim of operand 0; `gone` dims (reduced) are absent from the
 * result, `whole` ones may not be split. */
static void fac_rows(const Op *op, Factors *f, int whole, int gone, int keep)
{
    const Value *x = op->args[0];
    for (int d = 0; d < x->rank; d++) {
        f->in[0][d] = (int8_t)new_factor(f);
        if (d == whole)
            f->full[d] = 1;
    }
    for (int i = 0; i < nres_of(op); i++) {
        int r = 0;
        for (int d = 0; d < x->rank && r < op->res[i]->rank; d++) {
            if (d == gone && !keep)
                continue;
            f->out[i][r++] = (int8_t)(d == gone ? -1 : d);
        }
    }
}

static void fac_reduce(const Op *op, Factors *f)
{
    int dim = norm_dim(op, op->args[0]->rank);
    int keep = ir_op_attr_int(op, "keepdim", 0) != 0;
    int whole = op->kind == OP_MAX || op->kind == OP_ARGMAX; /* no partial max or index */
    fac_rows(op, f, whole ? dim : -1, dim, keep);
    if (!whole)
        f->lin = 1, f->lin_all = 1;
}

/* Same shape in and out, row dim whole (softmax; the grads: both operands). */
static void fac_rowwise(const Op *op, Factors *f, int dim)
{
    fac_rows(op, f, dim, -1, 0);
    for (int a = 1; a < op->nargs && a < SH_MAXARGS; a++)
        for (int d = 0; d < op->args[a]->rank; d++)
            f->in[a][d] = (int8_t)(op->args[a]->rank == op->args[0]->rank ? d : -1);
}

/* max_grad(x, dy): dy has x's shape without dim (or with it as 1 under
 * keepdim), so its dimensions share x's factors, split as x's rows are. */
static void fac_max_grad(const Op *op, Factors *f)
{
    const Value *x = op->args[0];
    int dim = norm_dim(op, x->rank), keep = ir_op_attr_int(op, "keepdim", 0) != 0, r = 0;
    fac_rowwise(op, f, dim);
    memset(f->in[1], -1, sizeof f->in[1]);
    for (int d = 0; d < x->rank && r < op->args[1]->rank; d++)
        if (d != dim || keep)
            f->in[1][r++] = (int8_t)(d == dim ? -1 : f->in[0][d]);
    f->lin = 2;
}

/* layernorm(x, g, b), rmsnorm(x, g), and their grads (x, g, dy): the last dim
 * whole; the weight grads sum the rows (partial over the row axes). */
static void fac_norm(const Op *op, Factors *f)
{
    const Value *x = op->args[0];
    int c = x->rank - 1;
    fac_rows(op, f, c, -1, 0);
    for (int a = 1; a < op->nargs && a < SH_MAXARGS; a++) {
        const Value *y = op->args[a];
        for (int d = 0; d < y->rank; d++)
            f->in[a][d] = (int8_t)(y->rank == x->rank ? d : -1);
    }
    for (int i = 1; i < nres_of(op); i++)
        f->out[i][0] = -1;
    if (op->kind == OP_LAYERNORM_GRAD || op->kind == OP_RMSNORM_GRAD)
        f->lin = 1u << 2;
}

/* x[B,S,H*Dh] (attention, attention_grad, rope): the batch free, the
 * sequence whole, the heads split whole (the split count divides H and KV).
 * Keys and values of a length of their own (cross-attention: k, v [B,Sk,..]
 * and the mask [B,Sk]) have a factor of their own for it, whole as well:
 * a split of the queries' sequence says nothing of the keys'. Values of a
 * head size Dv of their own (latent attention: v [B,Sk,KV*Dv], the output
 * and dout [B,S,H*Dv]) take the head factor on their last dimension too:
 * a split count that divides KV divides KV*Dv and H*Dv. A score bias
 * [H, S, Sk] has the head factor on its first dimension (a bias [1, S, Sk]
 * is whole); its gradient, summed over the batch (and over the heads for a
 * bias of one head), is a partial sum over the axes that split them. */
static void fac_heads(const Op *op, Factors *f)
{
    int b = new_factor(f), s = new_factor(f), h = new_factor(f), sk = s;
    f->full[s] = 1;
    int64_t heads = ir_op_attr_int(op, "heads", 1);
    int64_t kv = ir_op_attr_int(op, "kv_heads", heads);
    f->align[h] = kv < heads ? kv : heads;
    int nq = op->kind == OP_ATTENTION_GRAD ? 4 : op->kind == OP_ATTENTION ? 3 : op->nargs;
    int attn = op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD;
    if (attn && op->args[1]->shape[1] != op->args[0]->shape[1])
        sk = new_factor(f), f->full[sk] = 1; /* cross-attention */
    for (int a = 0; a < op->nargs && a < SH_MAXARGS; a++) {
        int r = op->args[a]->rank, keys = attn && (a == 1 || a == 2);
        if (a >= nq && r == 3) { /* attention's bias [H or 1, S, Sk]: heads as q's, no batch */
            f->in[a][0] = (int8_t)(op->args[a]->shape[0] == 1 ? -1 : h);
            f->in[a][1] = (int8_t)s;
            f->in[a][2] = (int8_t)sk;
            continue;
        }
        if (a >= nq) { /* attention's mask [B, Sk]: the batch split as q's, the keys whole */
            f->in[a][0] = (int8_t)b;
            f->in[a][1] = (int8_t)sk;
            continue;
        }
        f->in[a][0] = (int8_t)(r == 3 ? b : -1);
        f->in[a][r - 2] = (int8_t)(keys ? sk : s);
        f->in[a][r - 1] = (int8_t)h;
        for (int d = 1; d < r - 2; d++)
            f->in[a][d] = -1;
        if (r == 2)
            f->in[a][0] = (int8_t)s;
    }
    for (int i = 0; i < nres_of(op) && i < 3; i++)
        memcpy(f->out[i], f->in[i < op->nargs ? i : 0], sizeof f->out[i]);
    if (op->kind == OP_ATTENTION_GRAD && op->nres == 4) /* the bias's gradient: a partial sum over */
        memcpy(f->out[3], f->in[ir_attention_arg(op, 3)], sizeof f->out[3]); /* the batch's axes */
    if (op->kind == OP_ATTENTION_GRAD)
        f->lin = 1u << 3;
}

/* embed(table[V,D], ids[...]) -> [...,D]: V is summed over (a split table
 * gives partial rows, each rank adding the ids in its range). */
static void fac_embed(const Op *op, Factors *f)
{
    const Value *ids = op->args[1];
    int v = new_factor(f), dd = new_factor(f);
    f->in[0][0] = (int8_t)v;
    f->in[0][1] = (int8_t)dd;
    for (int d = 0; d < ids->rank; d++)
        f->in[1][d] = f->out[0][d] = (int8_t)new_factor(f);
    f->out[0][ids->rank] = (int8_t)dd;
}

/* embed_grad(ids[...], dy[...,D]) -> [V,D]: the rows are summed over. */
static void fac_embed_grad(const Op *op, Factors *f)
{
    const Value *ids = op->args[0];
    for (int d = 0; d < ids->rank; d++)
        f->in[0][d] = f->in[1][d] = (int8_t)new_factor(f);
    int v = new_factor(f), dd = new_factor(f);
    f->in[1][ids->rank] = (int8_t)dd;
    f->out[0][0] = (int8_t)v;
    f->out[0][1] = (int8_t)dd;
    f->lin = 1u << 1;
}

/* gather(x[...,V], index[...]) -> [...] and gather_grad(index, dy) ->
 * [...,V]: the rows shared by every operand and the result, V whole (an
 * index reaches across it); linear in x, and in dy. With k indices per row
 * (index[...,k]) k is whole too. */
static void fac_gather(const Op *op, Factors *f)
{
    int grad = op->kind == OP_GATHER_GRAD;
    const Value *ix = op->args[grad ? 0 : 1];
    if (!grad && ix->rank == op->args[0]->rank) { /* k per row: rows shared, V and k whole */
        int r = ix->rank;
        for (int d = 0; d < r - 1; d++)
            f->in[0][d] = f->in[1][d] = f->out[0][d] = (int8_t)new_factor(f);
        int v = new_factor(f), k = new_factor(f);
        f->full[v] = f->full[k] = 1;
        f->in[0][r - 1] = (int8_t)v;
        f->in[1][r - 1] = f->out[0][r - 1] = (int8_t)k;
        f->lin = 1u << 0;
        return;
    }
    for (int d = 0; d < ix->rank; d++)
        f->in[0][d] = f->in[1][d] = f->out[0][d] = (int8_t)new_factor(f);
    int v = new_factor(f);
    f->full[v] = 1;
    if (grad)
        f->out[0][ix->rank] = (int8_t)v, f->lin = 1u << 1;
    else
        f->in[0][ix->rank] = (int8_t)v, f->lin = 1u << 0;
}

/* dropout(x, keys, step): elementwise, linear in x; the keys share x's
 * first dimension (each row's key goes with its row); the step is a scalar. */
static void fac_dropout(const Op *op, Factors *f)
{
    for (int d = 0; d < op->args[0]->rank; d++)
        f->in[0][d] = f->out[0][d] = (int8_t)new_factor(f);
    f->in[1][0] = f->in[0][0];
    f->lin = 1u << 0;
}

/* topk(x[...,V]) -> values, indices [...,k]; scatter_add(indices, dy) ->
 * [...,V]: the rows shared, V and k whole; scatter_add linear in dy. */
static void fac_topk(const Op *op, Factors *f)
{
    int grad = op->kind == OP_SCATTER_ADD, r = op->args[grad ? 1 : 0]->rank;
    for (int d = 0; d < r - 1; d++) {
        int8_t x = (int8_t)new_factor(f);
        f->in[0][d] = f->out[0][d] = x;
        if (grad)
            f->in[1][d] = x;
        else
            f->out[1][d] = x;
    }
    int v = new_factor(f), k = new_factor(f);
    f->full[v] = f->full[k] = 1;
    if (grad) {
        f->in[0][r - 1] = f->in[1][r - 1] = (int8_t)k;
        f->out[0][r - 1] = (int8_t)v;
        f->lin = 1u << 1;
    } else {
        f->in[0][r - 1] = (int8_t)v;
        f->out[0][r - 1] = f->out[1][r - 1] = (int8_t)k;
    }
}

/* cross_entropy(logits[...,V], targets) -> []: rows summed (partial);
 * cross_entropy_grad(logits, targets, dloss) -> [...,V]. A split vocabulary
 * is vocabulary-parallel: the partition pass computes the row max and sum of
 * exponentials over the whole vocabulary with two all-reduces, and each device
 * its share of the loss (partial over the vocabulary axes too). */
static void fac_cross_entropy(const Op *op, Factors *f)
{
    const Value *l = op->args[0];
    for (int d = 0; d < l->rank; d++)
        f->in[0][d] = (int8_t)new_factor(f);
    for (int d = 0; d < l->rank - 1; d++)
        f->in[1][d] = (int8_t)d;
    if (op->kind == OP_CROSS_ENTROPY_GRAD) {
        for (int d = 0; d < l->rank; d++)
            f->out[0][d] = (int8_t)d;
        f->lin = 1u << 2;
    }
}

static void fac_transpose(const Op *op, Factors *f)
{
    int64_t perm[IR_MAX_RANK];
    ir_transpose_perm(op, perm);
    for (int d = 0; d < op->args[0]->rank; d++) {
        f->out[0][d] = (int8_t)new_factor(f);
        f->in[0][perm[d]] = f->out[0][d];
    }
    f->lin = 1, f->lin_all = 1;
}

/* Groups of dims with equal products; a group may be split on its first
 * (outermost) dim on both sides, the split count dividing both. */
static void fac_reshape(const Op *op, Factors *f)
{
    const Value *x = op->args[0], *r = op->res[0];
    int i = 0, j = 0;
    while (i < x->rank || j < r->rank) {
        while (i < x->rank && x->shape[i] == 1)
            i++;
        while (j < r->rank && r->shape[j] == 1)
            j++;
        if (i >= x->rank || j >= r->rank)
            break;
        int fac = new_factor(f);
        f->in[0][i] = f->out[0][j] = (int8_t)fac;
        int64_t pa = x->shape[i++], pb = r->shape[j++];
        while (pa != pb) {
            if (pa < pb)
                pa *= x->shape[i++];
            else
                pb *= r->shape[j++];
        }
    }
    f->lin = 1, f->lin_all = 1;
}

/* sum_to(x) -> attr shape: dims that broadcasting stretched are summed. */
static void fac_sum_to(const Op *op, Factors *f)
{
    const Value *x = op->args[0], *r = op->res[0];
    int off = x->rank - r->rank;
    for (int d = 0; d < x->rank; d++) {
        f->in[0][d] = (int8_t)new_factor(f);
        int rd = d - off;
        if (rd >= 0)
            f->out[0][rd] = (int8_t)(r->shape[rd] == x->shape[d] ? d : -1);
    }
    f->lin = 1, f->lin_all = 1;
}

/* Dims that must stay whole in slice, pad, concat; the rest free. A slice
 * of the microbatch pass takes rows of each rank's own piece (rows are
 * interchangeable in a loss that is a mean over them). */
static void fac_along(const Op *op, Factors *f)
{
    fac_elementwise(op, f);
    int dim = norm_dim(op, op->res[0]->rank);
    if (!(op->kind == OP_SLICE && ir_op_attr_int(op, "rows", 0)))
        f->full[dim] = 1;
    for (int a = 0; a < op->nargs && a < SH_MAXARGS; a++)
        f->in[a][dim] = (int8_t)dim;
    f->lin = op->nargs >= 32 ? 0 : (uint32_t)((1ull << op->nargs) - 1), f->lin_all = 1;
}

/* A cast to a wider float type: exact, so a partial sum may pass it. */
static int widening(const Op *op)
{
    return op->kind == OP_CAST && ir_dtype_is_float(op->args[0]->dtype) &&
           ir_dtype_size(op->res[0]->dtype) > ir_dtype_size(op->args[0]->dtype);
}

/* A test's hook (tests/lit/shard/op-contract-mutants.test): the variable
 * TCC_TEST_BREAK=rule:NAME mutates op NAME's rule, so that the per-op
 * contract (tests/contract/op_contract.py) has a wrong rule to catch. The
 * rule's whole dims may be split (softmax then normalises each device's
 * slice); a transpose's factors are reversed (its old bug without perm). */
static void broken_rule(const Op *op, Factors *f)
{
    const char *e = getenv("TCC_TEST_BREAK");
    if (!e || strncmp(e, "rule:", 5) || strcmp(e + 5, ir_ops[op->kind].name))
        return;
    memset(f->full, 0, sizeof f->full);
    int r = op->args[0]->rank;
    for (int d = 0; op->kind == OP_TRANSPOSE && d < r / 2; d++) {
        int8_t t = f->in[0][d];
        f->in[0][d] = f->in[0][r - 1 - d];
        f->in[0][r - 1 - d] = t;
    }
}

static void op_factors(const Op *op, Factors *f)
{
    memset(f, 0, sizeof *f);
    memset(f->in, -1, sizeof f->in);
    memset(f->out, -1, sizeof f->out);
    switch (op->kind) {
    case OP_ADD: case OP_SUB: fac_elementwise(op, f); f->lin = 3, f->lin_all = 1; break;
    case OP_MUL: fac_elementwise(op, f); f->lin = 3; break;
    case OP_DIV: fac_elementwise(op, f); f->lin = 1; break;
    case OP_WHERE: /* where(c, sum a_i, sum b_i) = sum where(c, a_i, b_i); c whole */
        fac_elementwise(op, f); f->lin = 6, f->lin_all = 1; break;
    case OP_NEG: case OP_STOP_GRAD: case OP_MB_SUM: fac_elementwise(op, f); f->lin = 1, f->lin_all = 1; break;
    case OP_EXPAND: fac_elementwise(op, f); f->lin = 1, f->lin_all = 1; break;
    case OP_CAST: /* widening is exact: a partial sum is summed after it, in the wider type */
        fac_elementwise(op, f);
        f->lin = f->lin_all = widening(op);
        break;
    case OP_GELU_GRAD: case OP_SILU_GRAD: case OP_RELU_GRAD:
        fac_elementwise(op, f); f->lin = 2; break;
    case OP_MATMUL: fac_matmul(op, f); break;
    case OP_SUM: case OP_MEAN: case OP_MAX: case OP_ARGMAX: fac_reduce(op, f); break;
    case OP_SOFTMAX: fac_rowwise(op, f, norm_dim(op, op->args[0]->rank)); break;
    case OP_SOFTMAX_GRAD:
        fac_rowwise(op, f, norm_dim(op, op->args[0]->rank));
        f->lin = 2;
        break;
    case OP_MAX_GRAD: fac_max_grad(op, f); break;
    case OP_LAYERNORM: case OP_RMSNORM: case OP_LAYERNORM_GRAD: case OP_RMSNORM_GRAD:
        fac_norm(op, f); break;
    case OP_ROPE: case OP_ATTENTION: case OP_ATTENTION_GRAD: fac_heads(op, f); break;
    case OP_EMBED: fac_embed(op, f); break;
    case OP_EMBED_GRAD: fac_embed_grad(op, f); break;
    case OP_GATHER: case OP_GATHER_GRAD: fac_gather(op, f); break;
    case OP_TOPK: case OP_SCATTER_ADD: fac_topk(op, f); break;
    case OP_DROPOUT: fac_dropout(op, f); break;
    case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD: fac_cross_entropy(op, f); break;
    case OP_TRANSPOSE: fac_transpose(op, f); break;
    case OP_ARANGE: /* positions: each device holds all, so no offset is needed */
        f->out[0][0] = (int8_t)new_factor(f);
        f->full[f->out[0][0]] = 1;
        break;
    case OP_RESHAPE: fac_reshape(op, f); break;
    case OP_SUM_TO: fac_sum_to(op, f); break;
    case OP_SLICE: case OP_PAD: case OP_CONCAT: fac_along(op, f); break;
    default: fac_elementwise(op, f); break; /* unary math, comparisons, cast, optimizer ops */
    }
    broken_rule(op, f);
}

/* ---- shardings ---- */

int shard_pinned(const Sharding *s)
{
    WhyKind k = s->why.kind;
    return k == WHY_ANNOTATION || k == WHY_ROLE || k == WHY_USER;
}

int shard_same(const Sharding *a, const Sharding *b, int rank)
{
    if (a->partial != b->partial)
        return 0;
    for (int d = 0; d < rank; d++)
        if (a->naxes[d] != b->naxes[d] ||
            memcmp(a->axes[d], b->axes[d], (size_t)a->naxes[d]) != 0)
            return 0;
    return 1;
}

double shard_local_bytes(const Mesh *m, const Value *v, const Sharding *s)
{
    double b = (double)ir_dtype_size(v->dtype);
    for (int d = 0; d < v->rank; d++)
        b *= (double)v->shape[d] / (double)ir_shard_factor(m, s, d);
    return b;
}

/* ---- strategies ---- */

typedef struct Cand {
    int n;
    int own; /* proposed by a result alone (its readers' wish or its pin), no operand */
    int8_t axes[IR_MAX_AXES];
} Cand;

typedef struct Search {
    const Graph *g;
    const Op *op;
    const ShardOpts *o;
    Factors f;
    Cand cand[SH_MAXF][SH_MAXARGS + 4];
    int ncand[SH_MAXF];
    int pick[SH_MAXF];
    Strategy best, second;
    int have_best, have_second, nargs;
    /* shard_weigh: the cheapest strategy for each distinct set of result
     * shardings, with the order each was found in (ties go to the first) */
    Strategy *ways;
    int *seq;
    int nways, maxways, nseen;
} Search;

/* Every operand dim and result dim of factor fac divisible by n (and align). */
static int factor_fits(const Search *s, int fac, int64_t n)
{
    if (n == 1)
        return 1;
    if (s->f.full[fac] || (s->f.align[fac] && s->f.align[fac] % n))
        return 0;
    for (int a = 0; a < s->nargs; a++)
        for (int d = 0; d < s->op->args[a]->rank; d++)
            if (s->f.in[a][d] == fac && s->op->args[a]->shape[d] % n)
                return 0;
    for (int i = 0; i < nres_of(s->op); i++)
        for (int d = 0; d < s->op->res[i]->rank; d++)
            if (s->f.out[i][d] == fac && s->op->res[i]->shape[d] % n)
                return 0;
    return 1;
}

static void add_cand(Search *s, int fac, const int8_t *axes, int n, int own)
{
    for (int i = 0; i < s->ncand[fac]; i++)
        if (s->cand[fac][i].n == n && (!n || !memcmp(s->cand[fac][i].axes, axes, (size_t)n))) {
            s->cand[fac][i].own &= own; /* proposed by another too */
            return;
        }
    if (!factor_fits(s, fac, ir_axes_size(&s->g->mesh, axes, n)) ||
        s->ncand[fac] >= SH_MAXARGS + 4)
        return;
    Cand *c = &s->cand[fac][s->ncand[fac]++];
    c->n = n;
    c->own = own && n;
    if (n)
        memcpy(c->axes, axes, (size_t)n);
}

/* Result i's split sh as candidates; a pin's major axes too: the rest may be
 * scattered after the op. */
static void add_result_cands(Search *s, int i, const Sharding *sh, int pin)
{
    for (int d = 0; d < s->op->res[i]->rank; d++)
        for (int n = pin ? 1 : sh->naxes[d]; n <= sh->naxes[d]; n++)
            if (s->f.out[i][d] >= 0 && n)
                add_cand(s, s->f.out[i][d], sh->axes[d], n, 1);
}

/* Candidates: what each operand has on the factor (operand order), what the
 * results are or are wished to be, the sequence-parallel split of an
 * activation's dim 1, and unsplit. */
static void gather_cands(Search *s)
{
    for (int a = 0; a < s->nargs; a++) {
        const Value *x = s->op->args[a];
        for (int d = 0; d < x->rank; d++)
            if (s->f.in[a][d] >= 0)
                add_cand(s, s->f.in[a][d], x->shard.axes[d], x->shard.naxes[d], 0);
    }
    /* what the result is (a hint, its pin), or the layout it is wished in */
    for (int i = 0; i < nres_of(s->op); i++) {
        const Value *v = s->op->res[i];
        const Value *w = s->o->wish && v->id < s->o->nuses ? s->o->wish[v->id] : NULL;
        add_result_cands(s, i, &v->shard, shard_pinned(&v->shard));
        if (w)
            add_result_cands(s, i, &w->shard, 1);
    }
    const Value *r = s->op->res[0];
    if (s->o->seq_axis >= 0 && r->rank >= 3 && s->f.out[0][1] >= 0 && s->op->nargs &&
        s->op->kind != OP_MATMUL) {
        int8_t ax = (int8_t)s->o->seq_axis;
        add_cand(s, s->f.out[0][1], &ax, 1, 0);
    }
    for (int fac = 0; fac < s->f.nf; fac++)
        add_cand(s, fac, NULL, 0, 0);
}

/* The operand and result shardings of the current pick, with partial kept
 * on operand keep (-1: none; -2: all lin operands). */
static void build(Search *s, int keep, uint32_t kept, Strategy *st)
{
    memset(st, 0, sizeof *st);
    uint32_t used = 0;
    for (int fac = 0; fac < s->f.nf; fac++)
        for (int i = 0; i < s->cand[fac][s->pick[fac]].n; i++)
            used |= 1u << s->cand[fac][s->pick[fac]].axes[i];
    for (int a = 0; a < s->nargs; a++) {
        const Value *x = s->op->args[a];
        for (int d = 0; d < x->rank; d++) {
            int fac = s->f.in[a][d];
            if (fac < 0)
                continue;
            const Cand *c = &s->cand[fac][s->pick[fac]];
            st->req[a].naxes[d] = (uint8_t)c->n;
            memcpy(st->req[a].axes[d], c->axes, (size_t)c->n);
        }
        if (keep == a || (keep == -2 && (s->f.lin >> a & 1)))
            st->req[a].partial = x->shard.partial;
    }
    for (int i = 0; i < nres_of(s->op); i++) {
        const Value *r = s->op->res[i];
        uint32_t present = 0;
        for (int d = 0; d < r->rank; d++) {
            int fac = s->f.out[i][d];
            if (fac < 0)
                continue;
            const Cand *c = &s->cand[fac][s->pick[fac]];
            st->out[i].naxes[d] = (uint8_t)c->n;
            memcpy(st->out[i].axes[d], c->axes, (size_t)c->n);
            st->own |= (uint32_t)c->own << i;
            for (int k = 0; k < c->n; k++)
                present |= 1u << c->axes[k];
        }
        st->out[i].partial = (used & ~present) | kept;
    }
}

static uint32_t picked_axes(const Search *s)
{
    uint32_t used = 0;
    for (int fac = 0; fac < s->f.nf; fac++) {
        const Cand *c = &s->cand[fac][s->pick[fac]];
        for (int i = 0; i < c->n; i++) {
            if (used >> c->axes[i] & 1)
                return UINT32_MAX;
            used |= 1u << c->axes[i];
        }
    }
    return used;
}

/* A parameter whose sharding the user annotated (or a transpose or reshape of
 * one): its layout is the user's intent, and moving it is paid again for
 * every microbatch and in the backward, so it weighs more than moving an
 * activation (Megatron: weights stay, activations move). */
int shard_anchored(const Value *v)
{
    while (v->def && (v->def->kind == OP_TRANSPOSE || v->def->kind == OP_RESHAPE) &&
           v->shard.why.kind != WHY_ANNOTATION)
        v = v->def->args[0];
    return v->def && v->def->kind == OP_PARAM && v->shard.why.kind == WHY_ANNOTATION;
}

/* The axes that split the batch (roles data and fsdp, size > 1). */
static uint32_t batch_axes(const Mesh *m)
{
    uint32_t b = 0;
    for (int ax = 0; ax < m->naxes; ax++)
        if ((m->axes[ax].role == ROLE_DATA || m->axes[ax].role == ROLE_FSDP) &&
            m->axes[ax].size > 1)
            b |= 1u << ax;
    return b;
}

static Sharding without_axes(const Sharding *sh, int rank, uint32_t drop)
{
    Sharding t = *sh;
    for (int d = 0; d < rank; d++) {
        int k = 0;
        for (int i = 0; i < sh->naxes[d]; i++)
            if (!(drop >> sh->axes[d][i] & 1))
                t.axes[d][k++] = sh->axes[d][i];
        t.naxes[d] = (uint8_t)k;
    }
    t.partial &= ~drop;
    return t;
}

/* What bringing result r from `out` to `to` after its op moves: to its pin
 * (pinned), or to the layout the pinned gradient it is summed into wishes,
 * whose sum then reduces the partial sums over the axes `to` does not split.
 * The batch axes are left out: where a gradient's partial sum over them is
 * reduced is what the zero level says (each microbatch's under zero = 2, the
 * sum's otherwise), not a trade against gathering the batch. */
static double after_cost(const Mesh *m, const Value *r, const Sharding *out, const Sharding *to,
                         int pinned)
{
    uint32_t batch = batch_axes(m), split = 0;
    Sharding from = without_axes(out, r->rank, batch), want = without_axes(to, r->rank, batch);
    for (int d = 0; d < r->rank; d++)
        for (int i = 0; i < want.naxes[d]; i++)
            split |= 1u << want.axes[d][i];
    if (!pinned)
        want.partial = from.partial & ~split;
    return shard_reshard_cost(m, r, &from, &want);
}

/* Keep st if it is the cheapest way yet to its result shardings. */
static void record_way(Search *s, const Strategy *st)
{
    int seq = s->nseen++;
    for (int i = 0; i < s->nways; i++) {
        int same = 1;
        for (int r = 0; r < nres_of(s->op) && same; r++)
            same = shard_same(&s->ways[i].out[r], &st->out[r], s->op->res[r]->rank);
        if (!same)
            continue;
        if (st->cost < s->ways[i].cost)
            s->ways[i] = *st, s->seq[i] = seq;
        return;
    }
    if (s->nways < s->maxways)
        s->ways[s->nways] = *st, s->seq[s->nways++] = seq;
}

static void consider(Search *s, int keep, uint32_t kept)
{
    Strategy st;
    build(s, keep, kept, &st);
    const Mesh *m = &s->g->mesh;
    double cost = 0;
    for (int a = 0; a < s->nargs; a++) {
        double c = shard_reshard_cost(m, s->op->args[a], &s->op->args[a]->shard, &st.req[a]);
        cost += shard_anchored(s->op->args[a]) ? 8 * c : c;
    }
    for (int i = 0; i < nres_of(s->op); i++) { /* and the results, to their pins or wishes */
        const Value *r = s->op->res[i];
        if (shard_pinned(&r->shard))
            cost += after_cost(m, r, &st.out[i], &r->shard, 1);
        else if (s->o->wish && r->id < s->o->nuses && s->o->wish[r->id])
            cost += after_cost(m, r, &st.out[i], &s->o->wish[r->id]->shard, 0);
    }
    st.comm = cost;
    /* a tie goes to the strategy that leaves each device less to compute */
    cost += 1e-3 * shard_local_bytes(m, s->op->res[0], &st.out[0]);
    st.cost = cost;
    if (s->ways)
        record_way(s, &st);
    if (!s->have_best || cost < s->best.cost) {
        if (s->have_best)
            s->second = s->best, s->have_second = 1;
        s->best = st;
        s->have_best = 1;
    } else if (!s->have_second || cost < s->second.cost) {
        s->second = st;
        s->have_second = 1;
    }
}

/* Partial sums: through the lin operands when the op is linear in them, and
 * its results have one reader each (one that many read would be reduced once
 * per reader's view of it). A widening cast that may hand its operand's
 * partial sum on always does, so the sum is taken in the wider type: a bf16
 * gradient is reduced in f32, although reducing it before its cast would
 * move half the bytes. */
static void consider_partials(Search *s, uint32_t used)
{
    int hand_on = 1;
    for (int i = 0; s->o->uses && i < s->op->nres; i++) {
        const Value *r = s->op->res[i];
        /* a pinned result is resharded once, after the op */
        if (!shard_pinned(&r->shard) && r->id < s->o->nuses && s->o->uses[r->id] > 1)
            hand_on = 0;
    }
    int widen = widening(s->op) && s->op->args[0]->shard.partial;
    if (!hand_on || !widen)
        consider(s, -1, 0);
    if (!hand_on)
        return;
    if (s->f.lin_all) {
        uint32_t p = 0;
        int first = 1, ok = 1;
        for (int a = 0; a < s->nargs; a++) {
            if (!(s->f.lin >> a & 1))
                continue;
            uint32_t q = s->op->args[a]->shard.partial;
            if (!first && q != p)
                ok = 0;
            p = q, first = 0;
        }
        if (ok && p && !(p & used))
            consider(s, -2, p);
        return;
    }
    for (int a = 0; a < s->nargs; a++) {
        uint32_t p = s->op->args[a]->shard.partial;
        if ((s->f.lin >> a & 1) && p && !(p & used))
            consider(s, a, p);
    }
}

static void search(Search *s, int fac)
{
    if (fac == s->f.nf) {
        uint32_t used = picked_axes(s);
        if (used != UINT32_MAX)
            consider_partials(s, used);
        return;
    }
    for (int i = 0; i < s->ncand[fac]; i++) {
        s->pick[fac] = i;
        search(s, fac + 1);
    }
}

/* s is the caller's (on its stack: an op's search is some 10 KB, and one per
 * op per sweep would otherwise fill the arena with dead searches). */
static void run_search(Search *s, const Graph *g, const Op *op, const ShardOpts *o, Strategy *ways,
                       int max)
{
    memset(s, 0, sizeof *s);
    s->g = g, s->op = op, s->o = o;
    if (ways) {
        s->ways = ways, s->maxways = max;
        s->seq = arena_alloc(g->arena, sizeof(int) * (size_t)(max + 1));
    }
    s->nargs = op->nargs < SH_MAXARGS ? op->nargs : SH_MAXARGS;
    op_factors(op, &s->f);
    if (op->nargs > SH_MAXARGS) /* many-operand concat: everything whole */
        for (int fac = 0; fac < s->f.nf; fac++)
            s->f.full[fac] = 1;
    gather_cands(s);
    double combos = 1;
    for (int fac = 0; fac < s->f.nf; fac++)
        combos *= s->ncand[fac];
    if (combos > 20000) /* keep only "unsplit" past the first factors */
        for (int fac = 4; fac < s->f.nf; fac++)
            s->cand[fac][0] = s->cand[fac][s->ncand[fac] - 1], s->ncand[fac] = 1;
    search(s, 0);
}

void shard_strategy(const Graph *g, const Op *op, const ShardOpts *o, Strategy *st)
{
    Search sb, *s = &sb;
    run_search(s, g, op, o, NULL, 0);
    *st = s->best;
    /* a choice worth a reason: the operands had to move, and another way existed */
    st->choice = s->have_second && s->best.comm >= 1;
    st->alt_comm = s->have_second ? s->second.comm : 0;
}

int shard_weigh(const Graph *g, const Op *op, const ShardOpts *o, Strategy *ways, int max)
{
    Search sb, *s = &sb;
    run_search(s, g, op, o, ways, max);
    for (int i = 1; i < s->nways; i++) /* by cost, then as found: shard_strategy's order */
        for (int j = i; j > 0 && (ways[j].cost < ways[j - 1].cost ||
                                  (ways[j].cost == ways[j - 1].cost && s->seq[j] < s->seq[j - 1]));
             j--) {
            Strategy t = ways[j];
            int q = s->seq[j];
            ways[j] = ways[j - 1], s->seq[j] = s->seq[j - 1];
            ways[j - 1] = t, s->seq[j - 1] = q;
        }
    return s->nways;
}

static int has_axis(const Sharding *sh, int d, int ax)
{
    for (int i = 0; i < sh->naxes[d]; i++)
        if (sh->axes[d][i] == ax)
            return 1;
    return 0;
}

/* The operand dim of factor fac that carries ax: first as the operands are,
 * then as st needs them (moved into it). */
static void factor_source(const Op *op, const Factors *f, const Strategy *st, int fac, int ax,
                          AxisFrom *from)
{
    int n = op->nargs < SH_MAXARGS ? op->nargs : SH_MAXARGS;
    for (int moved = 0; moved < 2; moved++)
        for (int a = 0; a < n; a++)
            for (int e = 0; e < op->args[a]->rank; e++)
                if (f->in[a][e] == fac &&
                    has_axis(moved ? &st->req[a] : &op->args[a]->shard, e, ax)) {
                    from->arg = a, from->dim = e, from->moved = moved;
                    return;
                }
    from->how = FROM_NONE;
}

void shard_axis_from(const Op *op, const Strategy *st, int r, int ax, AxisFrom *from)
{
    Factors f;
    op_factors(op, &f);
    *from = (AxisFrom){FROM_NONE, -1, -1, 0};
    const Sharding *res = &st->out[r];
    int n = op->nargs < SH_MAXARGS ? op->nargs : SH_MAXARGS, fac = -1;
    for (int d = 0; d < op->res[r]->rank; d++)
        if (has_axis(res, d, ax))
            fac = f.out[r][d], from->how = FROM_SPLIT;
    if (fac < 0 && (res->partial >> ax & 1)) {
        for (int a = 0; a < n; a++)
            if ((f.lin >> a & 1) && (st->req[a].partial >> ax & 1)) {
                *from = (AxisFrom){FROM_PARTIAL, a, -1, 0};
                return;
            }
        for (int a = 0; a < n && fac < 0; a++) /* the factor ax splits, absent from the result */
            for (int e = 0; e < op->args[a]->rank && fac < 0; e++)
                if (has_axis(&st->req[a], e, ax))
                    fac = f.in[a][e], from->how = FROM_SUMMED;
    }
    if (fac < 0) {
        from->how = FROM_NONE;
        return;
    }
    factor_source(op, &f, st, fac, ax, from);
}

/* ---- reshardings ---- */

static double ring(const Mesh *m, const int8_t *axes, int n, double bytes)
{
    double k = (double)ir_axes_size(m, axes, n);
    return bytes * (k - 1) / k;
}

static void push(ReStep *steps, int *n, OpKind kind, int dim, int dim2, const int8_t *axes,
                 int naxes, const Sharding *after, double bytes)
{
    if (*n >= SH_MAXSTEPS)
        BUG("resharding needs too many steps");
    ReStep *st = &steps[(*n)++];
    memset(st, 0, sizeof *st);
    st->kind = kind, st->dim = dim, st->dim2 = dim2, st->naxes = naxes;
    memcpy(st->axes, axes, (size_t)naxes);
    st->after = *after;
    st->bytes = bytes;
}

static int common_prefix(const Sharding *a, const Sharding *b, int d)
{
    int k = 0;
    while (k < a->naxes[d] && k < b->naxes[d] && a->axes[d][k] == b->axes[d][k])
        k++;
    return k;
}

/* 1. gather what `to` does not keep in place; 2. reduce partial sums (onto a
 * dim `to` splits by the axis: reduce-scatter, else all-reduce); 3. slice what
 * `to` splits further. A gather on one dim and a slice on another over the
 * same axes become one all-to-all. */
int shard_reshard_plan(const Mesh *m, const Value *v, const Sharding *from, const Sharding *to,
                       ReStep *steps)
{
    int n = 0;
    Sharding cur = *from;
    cur.why = to->why;
    for (int d = 0; d < v->rank; d++) {
        int k = common_prefix(&cur, to, d);
        if (k == cur.naxes[d])
            continue;
        int8_t axes[IR_MAX_AXES];
        int na = cur.naxes[d] - k;
        memcpy(axes, cur.axes[d] + k, (size_t)na);
        double in = shard_local_bytes(m, v, &cur);
        cur.naxes[d] = (uint8_t)k;
        int moved = -1;
        for (int e = 0; e < v->rank && moved < 0; e++)
            if (e != d && to->naxes[e] == cur.naxes[e] + na &&
                common_prefix(&cur, to, e) == cur.naxes[e] &&
                !memcmp(to->axes[e] + cur.naxes[e], axes, (size_t)na) && !cur.partial)
                moved = e;
        if (moved >= 0) {
            memcpy(cur.axes[moved] + cur.naxes[moved], axes, (size_t)na);
            cur.naxes[moved] = (uint8_t)(cur.naxes[moved] + na);
            push(steps, &n, OP_ALL_TO_ALL, d, moved, axes, na, &cur, ring(m, axes, na, in));
        } else {
            push(steps, &n, OP_ALL_GATHER, d, -1, axes, na, &cur,
                 ring(m, axes, na, shard_local_bytes(m, v, &cur)));
        }
    }
    uint32_t red = cur.partial & ~to->partial;
    int8_t all[IR_MAX_AXES];
    int nall = 0;
    for (int ax = 0; ax < m->naxes; ax++) {
        if (!(red >> ax & 1))
            continue;
        int dim = -1;
        for (int d = 0; d < v->rank && dim < 0; d++)
            if (to->naxes[d] > cur.naxes[d] && common_prefix(&cur, to, d) == cur.naxes[d] &&
                to->axes[d][cur.naxes[d]] == ax)
                dim = d;
        if (dim < 0) {
            all[nall++] = (int8_t)ax;
            continue;
        }
        double in = shard_local_bytes(m, v, &cur);
        int8_t a1 = (int8_t)ax;
        cur.partial &= ~(1u << ax);
        cur.axes[dim][cur.naxes[dim]++] = a1;
        push(steps, &n, OP_REDUCE_SCATTER, dim, -1, &a1, 1, &cur, ring(m, &a1, 1, in));
    }
    if (nall) {
        for (int i = 0; i < nall; i++)
            cur.partial &= ~(1u << all[i]);
        double b = shard_local_bytes(m, v, &cur);
        push(steps, &n, OP_ALL_REDUCE, -1, -1, all, nall, &cur, 2 * ring(m, all, nall, b));
    }
    for (int d = 0; d < v->rank; d++) {
        if (to->naxes[d] == cur.naxes[d])
            continue;
        int k = cur.naxes[d], na = to->naxes[d] - k;
        memcpy(cur.axes[d] + k, to->axes[d] + k, (size_t)na);
        cur.naxes[d] = to->naxes[d];
        push(steps, &n, OP_SHARD_SLICE, d, -1, to->axes[d] + k, na, &cur, 0);
    }
    if (!shard_same(&cur, to, v->rank))
        BUG("resharding %%%d did not reach its target", v->id);
    return n;
}

double shard_reshard_cost(const Mesh *m, const Value *v, const Sharding *from, const Sharding *to)
{
    if (shard_same(from, to, v->rank))
        return 0;
    if (to->partial & ~from->partial) /* a partial sum cannot be made from a whole value */
        return 1e30;
    ReStep steps[SH_MAXSTEPS];
    int n = shard_reshard_plan(m, v, from, to, steps);
    double c = 0;
    for (int i = 0; i < n; i++) /* + 1: fewer collectives win a tie; slices are free */
        c += steps[i].bytes + (steps[i].kind != OP_SHARD_SLICE);
    return c;
}

/* The summands of v, the pinned gradient root, wished in its layout: down
 * the shared adds of the sum over microbatches and through widening casts,
 * each read by its sum alone. A pinned summand (zero = 2) has its own pin. */
static void wish_summands(ShardOpts *o, const Value **wish, const Value *v, const Value *root)
{
    const Op *op = v->def;
    int sum = op && ((op->kind == OP_ADD && op->mb < 0) || op->kind == OP_MB_SUM) &&
              op->phase == PH_BWD;
    if (!op || (!sum && !widening(op)))
        return;
    for (int a = 0; a < op->nargs; a++) {
        const Value *x = op->args[a];
        if (x->rank != v->rank || memcmp(x->shape, v->shape, sizeof(int64_t) * (size_t)v->rank) ||
            o->uses[x->id] != 1 || shard_pinned(&x->shard) || wish[x->id])
            continue;
        wish[x->id] = root;
        wish_summands(o, wish, x, root);
    }
}

void shard_opts(const Graph *g, int sequence_parallel, ShardOpts *o)
{
    o->seq_axis = -1;
    int *uses = arena_alloc(g->arena, sizeof(int) * (size_t)(g->values.len + 1));
    memset(uses, 0, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->ops.len; i++)
        for (int a = 0; a < g->ops.data[i]->nargs; a++)
            uses[g->ops.data[i]->args[a]->id]++;
    o->uses = uses;
    o->nuses = g->values.len;
    const Value **wish = arena_alloc(g->arena, sizeof(Value *) * (size_t)(g->values.len + 1));
    memset(wish, 0, sizeof(Value *) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->values.len; i++) {
        const Value *v = g->values.data[i];
        if (shard_pinned(&v->shard) && v->def &&
            (v->def->kind == OP_ADD || v->def->kind == OP_MB_SUM))
            wish_summands(o, wish, v, v);
    }
    o->wish = wish;
    for (int ax = 0; sequence_parallel && ax < g->mesh.naxes; ax++)
        if (g->mesh.axes[ax].role == ROLE_TENSOR && g->mesh.axes[ax].size > 1)
            o->seq_axis = ax;
}
