/* plan.c: a verified graph -> the Plan of one step, for the CPU.
 * Reads the Graph; writes tensors (one per value, at aligned offsets in one
 * slab per pipeline stage: what every stage holds first, then the stage's own
 * parameters and optimizer state, then its temporaries), the
 * instruction list in op order (GEMMs for matmuls, kernels for the rest, copies
 * for updates; a reshape shares its operand's memory), and the C source of the
 * kernels. Key idea of the memory plan: a temporary lives from the first
 * instruction that touches it to the last; in instruction order, each one
 * takes the first free block that fits, and gives it back after its last use.
 * Every plan built here is proved to communicate as one before it is handed
 * out (cg_check_comm: runtime/match.c), an error at the op's TDL line if not. */
#include "kgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the kernel builder ---- */

Kernel *kb_new(Gen *gen, KPattern p, int64_t extent, DType ftype)
{
    Kernel *k = arena_alloc(gen->a, sizeof(Kernel));
    k->arena = gen->a;
    k->pattern = p;
    k->extent = extent;
    k->ftype = ftype == DT_F64 ? DT_F64 : DT_F32;
    return k;
}

int kb_arg(Kernel *k, Gen *gen, int tensor)
{
    for (int i = 0; i < k->nargs; i++)
        if (k->args[i] == tensor)
            return i;
    if (k->nargs == 64)
        BUG("kernel with more than 64 arguments");
    k->args[k->nargs] = tensor;
    k->arg_dtype[k->nargs] = (DType)gen->tensors.data[tensor].dtype;
    return k->nargs++;
}

static Arena *karena(Kernel *k) { return k->arena; }

int kb_node(Kernel *k, KNodeKind kind, KType t, int a, int b, int c)
{
    KNode n = {kind, t, a, b, c, 0, 0};
    VEC_PUSH(karena(k), k->nodes, n);
    KStmt s = {KS_NODE, k->nodes.len - 1, 0, 0, 0};
    VEC_PUSH(karena(k), k->body, s);
    return k->nodes.len - 1;
}

int kb_const(Kernel *k, double x)
{
    int n = kb_node(k, KN_CONST, KT_FLOAT, 0, 0, 0);
    k->nodes.data[n].imm = x;
    return n;
}

int kb_iconst(Kernel *k, int64_t x)
{
    int n = kb_node(k, KN_ICONST, KT_INT, 0, 0, 0);
    k->nodes.data[n].iimm = x;
    return n;
}

int kb_idx(Kernel *k, int level) { return kb_node(k, KN_IDX, KT_INT, level, 0, 0); }

int kf(Kernel *k, KNodeKind kind, int a, int b) { return kb_node(k, kind, KT_FLOAT, a, b, 0); }
int ki(Kernel *k, KNodeKind kind, int a, int b) { return kb_node(k, kind, KT_INT, a, b, 0); }

int kb_load(Kernel *k, int slot, int index)
{
    KType t = k->arg_dtype[slot] == DT_I32 ? KT_INT : KT_FLOAT;
    return kb_node(k, KN_LOAD, t, slot, index, 0);
}

static void stmt(Kernel *k, KStmtKind kind, int a, int b, int c, int64_t extent)
{
    KStmt s = {kind, a, b, c, extent};
    VEC_PUSH(karena(k), k->body, s);
}

void kb_store(Kernel *k, int slot, int index, int value) { stmt(k, KS_STORE, slot, index, value, 0); }
void kb_store_add(Kernel *k, int slot, int index, int value)
{
    stmt(k, KS_STORE_ADD, slot, index, value, 0);
}

int kb_loop(Kernel *k, int64_t extent)
{
    stmt(k, KS_LOOP, 0, 0, 0, extent);
    k->levels = k->levels > 1 ? k->levels : 1;
    return k->body.len - 1;
}

void kb_reduce(Kernel *k, int loop, int value, KReduce r) { stmt(k, KS_REDUCE, loop, value, r, 0); }

int kb_end(Kernel *k, int loop)
{
    stmt(k, KS_END, 0, 0, 0, 0);
    for (int i = loop + 1; i < k->body.len; i++)
        if (k->body.data[i].kind == KS_REDUCE && k->body.data[i].a == loop)
            return kb_node(k, KN_ACC, KT_FLOAT, loop, 0, 0);
    return -1;
}

/* FNV-1a 64 of a string. */
static uint64_t text_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

/* The index of a kernel whose code is k's (the same loops over the same
 * argument slots), or -1. Microbatches and layers repeat the same kernels on
 * other tensors: the plan keeps one copy, so the compiler compiles it once. */
static int same_kernel(Gen *gen, Kernel *k, const char **src, uint64_t *h)
{
    const char *name = k->name;
    k->name = "kernel";
    *src = cg_emit_c(gen->a, k);
    k->name = name;
    *h = text_hash(*src);
    for (int i = 0; i < gen->kernels.len; i++)
        if (gen->kernel_hash.data[i] == *h && !strcmp(gen->kernel_text.data[i], *src))
            return i;
    return -1;
}

/* ---- kernels by their IR: the same IR gives the same code ----
 * Most of the kernels built are repeats (every layer and microbatch builds
 * its ops' kernels again), so a repeat is recognised from the IR as built,
 * before it is simplified and rendered: rendering each one to compare its
 * text was most of codegen's time and memory. cg_simplify and the renderings
 * read only what ir_hash and same_ir compare, so equal IR means equal text. */

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

#define MIX(h, x) mix((h), &(x), sizeof(x))

/* Over the fields one by one (the structs have padding). */
static uint64_t ir_hash(const Kernel *k)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    h = MIX(h, k->pattern), h = MIX(h, k->extent), h = MIX(h, k->ftype);
    h = MIX(h, k->nargs), h = MIX(h, k->levels), h = MIX(h, k->npre);
    h = mix(h, k->arg_dtype, sizeof(DType) * (size_t)k->nargs);
    for (int i = 0; i < k->nodes.len; i++) {
        const KNode *n = &k->nodes.data[i];
        h = MIX(h, n->kind), h = MIX(h, n->type), h = MIX(h, n->a), h = MIX(h, n->b);
        h = MIX(h, n->c), h = MIX(h, n->imm), h = MIX(h, n->iimm);
    }
    for (int i = 0; i < k->body.len; i++) {
        const KStmt *t = &k->body.data[i];
        h = MIX(h, t->kind), h = MIX(h, t->a), h = MIX(h, t->b), h = MIX(h, t->c);
        h = MIX(h, t->extent);
    }
    const KAttention *at = &k->attn;
    h = MIX(h, at->batch), h = MIX(h, at->seq), h = MIX(h, at->heads);
    h = MIX(h, at->kv_heads), h = MIX(h, at->head_dim), h = MIX(h, at->causal);
    h = MIX(h, at->window), h = MIX(h, at->mask);
    return MIX(h, at->scale);
}

/* Doubles by their bits: -0 and 0 print differently. */
static int same_bits(double x, double y)
{
    return !memcmp(&x, &y, sizeof x);
}

static int same_node(const KNode *x, const KNode *y)
{
    return x->kind == y->kind && x->type == y->type && x->a == y->a && x->b == y->b &&
           x->c == y->c && same_bits(x->imm, y->imm) && x->iimm == y->iimm;
}

static int same_ir(const Kernel *x, const Kernel *y)
{
    const KAttention *p = &x->attn, *q = &y->attn;
    if (x->pattern != y->pattern || x->extent != y->extent || x->ftype != y->ftype ||
        x->nargs != y->nargs || x->levels != y->levels || x->npre != y->npre ||
        x->nodes.len != y->nodes.len || x->body.len != y->body.len ||
        memcmp(x->arg_dtype, y->arg_dtype, sizeof(DType) * (size_t)x->nargs) ||
        p->batch != q->batch || p->seq != q->seq || p->heads != q->heads ||
        p->kv_heads != q->kv_heads || p->head_dim != q->head_dim || p->causal != q->causal ||
        !same_bits(p->scale, q->scale) || p->window != q->window || p->mask != q->mask)
        return 0;
    for (int i = 0; i < x->nodes.len; i++)
        if (!same_node(&x->nodes.data[i], &y->nodes.data[i]))
            return 0;
    for (int i = 0; i < x->body.len; i++) {
        const KStmt *s = &x->body.data[i], *t = &y->body.data[i];
        if (s->kind != t->kind || s->a != t->a || s->b != t->b || s->c != t->c ||
            s->extent != t->extent)
            return 0;
    }
    return 1;
}

/* The kernel an IR equal to k's became, or -1. */
static int seen_kernel(const Gen *gen, const Kernel *k, uint64_t h)
{
    if (!gen->seen_cap)
        return -1;
    for (int i = gen->seen_head[h & (uint64_t)(gen->seen_cap - 1)]; i >= 0;
         i = gen->seen.data[i].next)
        if (gen->seen.data[i].hash == h && same_ir(gen->seen.data[i].ir, k))
            return gen->seen.data[i].index;
    return -1;
}

static void seen_link(Gen *gen, int i)
{
    KernelSeen *e = &gen->seen.data[i];
    int *head = &gen->seen_head[e->hash & (uint64_t)(gen->seen_cap - 1)];
    e->next = *head;
    *head = i;
}

/* Remember k's IR as built (a copy: cg_simplify rewrites k); its place. */
static int seen_add(Gen *gen, const Kernel *k, uint64_t h)
{
    Kernel *ir = arena_alloc(gen->a, sizeof(Kernel));
    *ir = *k;
    ir->nodes.data = arena_alloc(gen->a, sizeof(KNode) * (size_t)(k->nodes.len + 1));
    ir->body.data = arena_alloc(gen->a, sizeof(KStmt) * (size_t)(k->body.len + 1));
    if (k->nodes.len) /* an attention kernel has none (and no arrays) */
        memcpy(ir->nodes.data, k->nodes.data, sizeof(KNode) * (size_t)k->nodes.len);
    if (k->body.len)
        memcpy(ir->body.data, k->body.data, sizeof(KStmt) * (size_t)k->body.len);
    ir->nodes.cap = ir->nodes.len, ir->body.cap = ir->body.len;
    VEC_PUSH(gen->a, gen->seen, ((KernelSeen){ir, h, -1, -1}));
    if (gen->seen.len > gen->seen_cap) { /* rehash into twice the buckets */
        gen->seen_cap = gen->seen_cap ? gen->seen_cap * 2 : 256;
        gen->seen_head = arena_alloc(gen->a, sizeof(int) * (size_t)gen->seen_cap);
        for (int b = 0; b < gen->seen_cap; b++)
            gen->seen_head[b] = -1;
        for (int i = 0; i < gen->seen.len; i++)
            seen_link(gen, i);
    } else {
        seen_link(gen, gen->seen.len - 1);
    }
    return gen->seen.len - 1;
}

/* The kernel k is (a new one, or one it repeats), and its launch. */
static int kernel_index(Gen *gen, Kernel *k)
{
    uint64_t ir = ir_hash(k);
    int index = seen_kernel(gen, k, ir);
    if (index >= 0)
        return index;
    int at = seen_add(gen, k, ir);
    k->name = arena_printf(gen->a, "k%d_%s", gen->kernels.len, ir_ops[gen->op->kind].name);
    cg_simplify(k);
    const char *src;
    uint64_t h;
    index = same_kernel(gen, k, &src, &h);
    if (index < 0) {
        VEC_PUSH(gen->a, gen->kernels, k);
        VEC_PUSH(gen->a, gen->kernel_hash, h);
        VEC_PUSH(gen->a, gen->kernel_text, src);
        index = gen->kernels.len - 1;
    }
    gen->seen.data[at].index = index;
    return index;
}

void kb_finish(Gen *gen, Kernel *k)
{
    int index = kernel_index(gen, k);
    PlanInstr in = {.kind = PI_KERNEL, .kernel = index, .nargs = k->nargs,
                    .phase = gen->op->phase, .layer = gen->op->layer};
    in.args = arena_alloc(gen->a, sizeof(int) * (size_t)(k->nargs + 1));
    memcpy(in.args, k->args, sizeof(int) * (size_t)k->nargs);
    VEC_PUSH(gen->a, gen->instrs, in);
}

/* ---- tensors ---- */

static uint64_t bytes_of(DType t, int rank, const int64_t *shape)
{
    uint64_t n = ir_dtype_size(t);
    for (int i = 0; i < rank; i++)
        n *= (uint64_t)shape[i];
    return n;
}

static int new_tensor(Gen *gen, const char *name, DType t, int rank, const int64_t *shape,
                      PlanRole role)
{
    PlanTensor pt = {0};
    pt.name = arena_strdup(gen->a, name ? name : "");
    pt.dtype = (PlanDType)t;
    pt.rank = rank;
    if (rank)
        memcpy(pt.shape, shape, sizeof(int64_t) * (size_t)rank);
    pt.bytes = bytes_of(t, rank, shape);
    pt.offset = gen->slab;
    gen->slab += (pt.bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
    pt.role = role;
    pt.init = "";
    pt.layer = gen->op ? gen->op->layer : -1;
    pt.value = -1;
    VEC_PUSH(gen->a, gen->tensors, pt);
    return gen->tensors.len - 1;
}

int gen_temp(Gen *gen, DType t, int rank, const int64_t *shape)
{
    return new_tensor(gen, NULL, t, rank, shape, PT_TEMP);
}

int gen_hyper(Gen *gen, const char *name, DType dt, double value)
{
    for (int i = 0; i < gen->tensors.len; i++)
        if (gen->tensors.data[i].role == PT_HYPER && !strcmp(gen->tensors.data[i].name, name))
            return i;
    int t = new_tensor(gen, name, dt == DT_F64 ? DT_F64 : DT_F32, 0, NULL, PT_HYPER);
    gen->tensors.data[t].init_arg = value;
    return t;
}

int gen_tensor(Gen *gen, const Value *v)
{
    if (gen->tensor_of[v->id] < 0)
        BUG("value %%%d has no tensor", v->id);
    return gen->tensor_of[v->id];
}

static PlanRole role_of(const Op *op)
{
    switch (op->kind) {
    case OP_PARAM: return PT_PARAM;
    case OP_STATE: return PT_STATE;
    case OP_INPUT: return PT_INPUT;
    case OP_STEP: return PT_STEP;
    case OP_AXIS_OFFSET: return PT_COORD;
    default: return PT_TEMP;
    }
}

static void set_init(Gen *gen, PlanTensor *t, const Op *op)
{
    const Attr *a = ir_op_attr(op, "init");
    if (!a) {
        t->init = op->kind == OP_PARAM ? "normal" : "zeros";
        t->init_arg = op->kind == OP_PARAM ? 0.02 : 0;
        return;
    }
    t->init = arena_strdup(gen->a, a->s ? a->s : "zeros");
    t->init_arg = a->kind == ATTR_CALL && a->nitems ? a->items[0]->f : 0;
}

/* Mesh axis indices of an op's attr `axes` (names). */
static int attr_axes(const Gen *gen, const Op *op, int8_t *out)
{
    const Attr *a = ir_op_attr(op, "axes");
    int n = 0;
    for (int i = 0; a && i < a->nitems && n < PLAN_MAX_AXES; i++) {
        int ax = ir_mesh_axis(&gen->g->mesh, a->items[i]->s);
        if (ax < 0)
            BUG("axis '%s' is not in the mesh", a->items[i]->s);
        out[n++] = (int8_t)ax;
    }
    return n;
}

/* How the tensor's global value is split (from v's sharding); coord axes. */
static void set_split(Gen *gen, PlanTensor *t, const Value *v, const Op *op)
{
    for (int d = 0; d < v->rank; d++) {
        t->nsplit[d] = v->shard.naxes[d];
        memcpy(t->split[d], v->shard.axes[d], v->shard.naxes[d]);
    }
    if (op->kind == OP_AXIS_OFFSET) {
        t->ncoord = attr_axes(gen, op, t->coord);
        t->init_arg = (double)ir_op_attr_int(op, "scale", 1);
    }
}

/* The largest id an i32 input may hold: the rows of the table it indexes. */
static void set_limits(Gen *gen)
{
    for (int i = 0; i < gen->g->ops.len; i++) {
        const Op *op = gen->g->ops.data[i];
        const Value *ids = NULL;
        int64_t limit = 0;
        const Mesh *m = &gen->g->mesh;
        if (op->kind == OP_EMBED) { /* the global vocabulary of a split table */
            ids = op->args[1];
            limit = op->args[0]->shape[0] * ir_shard_factor(m, &op->args[0]->shard, 0);
        } else if (op->kind == OP_GATHER) { /* the indices of a gather: its row */
            ids = op->args[1];
            limit = op->args[0]->shape[op->args[0]->rank - 1];
        } else if (op->kind == OP_SCATTER_ADD) { /* scatter's indices: its row */
            ids = op->args[0];
            limit = ir_op_attr_int(op, "size", 0);
        } else if (op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_SHARD) {
            ids = op->args[1];
            int last = op->args[0]->rank - 1;
            limit = op->args[0]->shape[last] * ir_shard_factor(m, &op->args[0]->shard, last);
        }
        while (ids && (ids->def->kind == OP_SLICE || ids->def->kind == OP_RESHAPE ||
                       (ids->def->kind >= OP_ALL_REDUCE && ids->def->kind <= OP_SHARD_SLICE)))
            ids = ids->def->args[0]; /* a microbatch's rows of the input, resharded */
        if (ids && ids->def->kind == OP_INPUT) {
            PlanTensor *t = &gen->tensors.data[gen->tensor_of[ids->id]];
            t->limit = t->limit ? (t->limit < limit ? t->limit : limit) : limit;
        }
    }
}

/* Fusion: an elementwise result with one use, by an elementwise op of the same
 * shape (or a scalar constant), is computed inside that op's kernel. */
static int gemm_folds(const Op *op);
static const Value *gemm_source(const Value *v, int *flips);
static const Value *transposed_gemm(const Op *t, const int *uses);

/* The matmul result m of add(m, b) or add(b, m) that the GEMM can finish with
 * its bias epilogue: m read by the add only, b a vector along m's last dim,
 * one dtype, one stage, a plain weight matrix (no batch of products). */
static const Value *bias_matmul(const Op *add, const int *uses, const Value **bias)
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
        const Value *b, *m = bias_matmul(g->ops.data[i], uses, &b);
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
 * the readers after it: an elementwise result (f32 or f64: a stored bf16
 * value would be rounded where the inline one is not) read by more than one
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
        if (!cg_fusable(op) || op->nres != 1 || op->kind == OP_CONSTANT || gen->tgemm[op->id])
            continue;
        const Value *v = op->res[0];
        const Op *u = first[v->id];
        /* a value another stage reads is sent where it is made: made later it would not be */
        if (gen->fused[v->id] || uses[v->id] < 2 || !u || twin[v->id] || is_twin[v->id] ||
            elsewhere[v->id] ||
            recomputed[v->id] || op->phase == PH_RECOMPUTE || u->phase == PH_RECOMPUTE ||
            (v->dtype != DT_F32 && v->dtype != DT_F64) || u->stage != op->stage || u->tick != op->tick)
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
            const Value *b, *m = bias_matmul(op, NULL, &b);
            gen->bias_add[op->id] = 0;
            gen->fused[m->id] = 0;
        }
        gen->kept[v->id] = u->id + 1;
    }
}

static void find_fusions(Gen *gen, int flags)
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
        int folds = op->kind == OP_MATMUL ? gemm_folds(op) : 0, flips;
        for (int j = 0; j < op->nargs; j++) {
            const Value *v = folds & (1 << j) ? gemm_source(op->args[j], &flips) : op->args[j];
            uses[v->id]++;
            recomputed[v->id] += op->phase == PH_RECOMPUTE;
            user[v->id] = op;
        }
    }
    for (int i = 0; i < g->outputs.len; i++)
        uses[g->outputs.data[i]->id] += 2;
    twin_uses(gen, uses, recomputed);
    find_bias_adds(gen, uses);
    int *leaves = arena_alloc(gen->a, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (!cg_fusable(op) || op->nres != 1 || uses[op->res[0]->id] != 1 || gen->bias_add[op->id] ||
            gen->tgemm[op->id])
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

/* The op that runs op's work: op itself, or the kernel of the user it is
 * fused into, and so on. */
static const Op *runs_in(const Gen *gen, const Op **user, const Op *op)
{
    while (op->nres == 1 && gen->fused[op->res[0]->id] && user[op->res[0]->id])
        op = user[op->res[0]->id];
    return op;
}

/* By value id, the value whose tensor it takes (-1: its own): the
 * optimizer's new parameter or state (an adamw or sgd result that only its
 * update reads) is written straight into its target, whose kernel reads
 * each element before it writes it, when nothing reads the target later:
 * the update then moves nothing, and no temporary holds the new value. */
static int *in_place_updates(Gen *gen)
{
    const Graph *g = gen->g;
    int nv = g->values.len;
    int *into = arena_alloc(gen->a, sizeof(int) * (size_t)(nv + 1));
    int *uses = arena_alloc(gen->a, sizeof(int) * (size_t)(nv + 1));
    int *last = arena_alloc(gen->a, sizeof(int) * (size_t)(nv + 1)); /* its last reader's run */
    const Op **user = arena_alloc(gen->a, sizeof(Op *) * (size_t)(nv + 1));
    for (int v = 0; v < nv; v++)
        into[v] = -1, uses[v] = 0, last[v] = -1, user[v] = NULL;
    for (int i = 0; i < g->ops.len; i++)
        for (int j = 0; j < g->ops.data[i]->nargs; j++) {
            uses[g->ops.data[i]->args[j]->id]++;
            user[g->ops.data[i]->args[j]->id] = g->ops.data[i];
        }
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->kind == OP_UPDATE || (gen->dead && gen->dead[op->id]))
            continue;
        int at = runs_in(gen, user, op)->id;
        for (int j = 0; j < op->nargs; j++)
            if (at > last[op->args[j]->id])
                last[op->args[j]->id] = at;
    }
    for (int i = 0; i < g->ops.len; i++) {
        const Op *up = g->ops.data[i];
        if (up->kind != OP_UPDATE)
            continue;
        const Value *t = up->args[0], *v = up->args[1];
        const Op *d = v->def;
        if (!d || (d->kind != OP_ADAMW && d->kind != OP_SGD) || uses[v->id] != 1 ||
            (t->def->kind != OP_PARAM && t->def->kind != OP_STATE) || t->dtype != v->dtype ||
            t->rank != v->rank || memcmp(t->shape, v->shape, sizeof(int64_t) * (size_t)t->rank) ||
            gen->fused[v->id] || last[t->id] > d->id || t->def->stage != d->stage)
            continue;
        into[v->id] = t->id;
    }
    return into;
}

/* Persistent tensors first (so a checkpoint is one range), then the rest. */
static void place_values(Gen *gen)
{
    int *into = in_place_updates(gen);
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < gen->g->ops.len; i++) {
            const Op *op = gen->g->ops.data[i];
            PlanRole r = role_of(op);
            int want = r == PT_PARAM || r == PT_STATE ? 0
                       : r == PT_INPUT || r == PT_STEP || r == PT_COORD ? 1 : 2;
            if (want != pass || (gen->dead && gen->dead[op->id]))
                continue;
            gen->op = op;
            for (int j = 0; j < op->nres; j++) {
                const Value *v = op->res[j];
                if (gen->fused[v->id])
                    continue;
                if (op->kind == OP_RESHAPE) { /* same memory, another shape */
                    gen->tensor_of[v->id] = gen->tensor_of[op->args[0]->id];
                    continue;
                }
                if (into[v->id] >= 0) { /* the optimizer's new value, in its target */
                    gen->tensor_of[v->id] = gen->tensor_of[into[v->id]];
                    continue;
                }
                int t = new_tensor(gen, v->name, v->dtype, v->rank, v->shape, r);
                gen->tensors.data[t].value = v->id;
                set_split(gen, &gen->tensors.data[t], v, op);
                if (r == PT_PARAM) /* state always starts at zero */
                    set_init(gen, &gen->tensors.data[t], op);
                if (r == PT_INPUT && ir_op_attr_int(op, "keys", 0)) /* dropout's: from the seed */
                    gen->tensors.data[t].init = arena_strdup(gen->a, "keys");
                gen->tensor_of[v->id] = t;
            }
        }
    }
    gen->op = NULL;
    set_limits(gen);
}

/* The model FLOPs one device does in a whole step, the average over the
 * mesh: an instruction of a microbatch loop runs once per microbatch (the
 * graph holds one), and the devices of a pipeline stage run its share only,
 * so the stages' sum is spread over the stages. GFLOP/s = flops x devices /
 * step time, whatever the microbatches and stages (issue 32). */
static double step_flops(const Gen *gen)
{
    double f = 0;
    for (int i = 0; i < gen->instrs.len; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        f += in->flops * (gen->loop && in->when == PW_EVERY ? gen->k : 1);
    }
    return f / ir_pipeline_stages(&gen->g->mesh);
}

/* ---- instructions ---- */

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
static const Value *gemm_source(const Value *v, int *flips)
{
    const Value *u;
    *flips = 0;
    while ((u = transposed_from(v)))
        v = u, ++*flips;
    return v;
}

/* Which operands of a matmul read through transposes (gemm_source): bit 0 for
 * a, bit 1 for b. A shared [K,N] matrix folds its batch into rows, so a read
 * with the flag is folded only when it is a plain matrix there. */
static int gemm_folds(const Op *op)
{
    const Value *a = op->args[0], *b = op->args[1];
    int fa, fb;
    gemm_source(a, &fa), gemm_source(b, &fb);
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

/* The GEMM of matmul op into the tensor of c, plus bias (a vector) when not
 * NULL; with swap, the transpose of the product, B^T A^T, into c. */
static void gemm_into(Gen *gen, const Op *op, const Value *c, const Value *bias, int swap)
{
    const Value *a = op->args[0], *b = op->args[1];
    int folds = gemm_folds(op), fa = 0, fb = 0;
    const Value *ta = folds & 1 ? gemm_source(a, &fa) : a, *tb = folds & 2 ? gemm_source(b, &fb) : b;
    PlanGemm g = {.a = gen_tensor(gen, ta), .b = gen_tensor(gen, tb), .c = gen_tensor(gen, c),
                  .alpha = 1, .beta = 0, .batch = 1, .trans_a = fa & 1, .trans_b = fb & 1,
                  .epilogue = bias ? PE_BIAS : PE_NONE, .bias = bias ? gen_tensor(gen, bias) : 0};
    int64_t K = a->shape[a->rank - 1], N = b->shape[b->rank - 1];
    g.k = K;
    g.n = N;
    g.ldb = g.trans_b ? K : N; /* the row length of what is stored */
    g.ldc = N;
    if (b->rank == 2) {
        g.m = 1;
        for (int i = 0; i < a->rank - 1; i++)
            g.m *= a->shape[i];
    } else {
        g.m = a->shape[a->rank - 2];
        for (int i = 0; i < a->rank - 2; i++)
            g.batch *= a->shape[i];
        g.stride_a = g.m * K;
        g.stride_b = K * N;
        g.stride_c = g.m * N;
    }
    g.lda = g.trans_a ? g.m : K;
    if (swap) { /* plain matrices (transposed_gemm): C^T [N,M] = B^T [N,K] A^T [K,M] */
        g = (PlanGemm){.a = g.b, .b = g.a, .c = g.c, .alpha = 1, .beta = 0, .batch = 1,
                       .trans_a = (fb + 1) & 1, .trans_b = (fa + 1) & 1, .m = N, .n = g.m, .k = K};
        g.lda = g.trans_a ? g.m : K; /* the row length of what is stored */
        g.ldb = g.trans_b ? K : g.n;
        g.ldc = g.n;
    }
    PlanInstr in = {.kind = PI_GEMM, .gemm = g, .phase = op->phase, .layer = op->layer};
    VEC_PUSH(gen->a, gen->instrs, in);
    gen->flops += 2.0 * (double)g.m * (double)g.n * (double)g.k * (double)g.batch;
}

static void gemm(Gen *gen, const Op *op) { gemm_into(gen, op, op->res[0], NULL, 0); }

static void copy(Gen *gen, const Op *op)
{
    PlanInstr in = {.kind = PI_COPY, .nargs = 2, .phase = op->phase, .layer = op->layer};
    in.args = arena_alloc(gen->a, sizeof(int) * 2);
    in.args[0] = gen_tensor(gen, op->args[0]);
    in.args[1] = gen_tensor(gen, op->args[1]);
    if (op->kind == OP_UPDATE && in.args[0] == in.args[1])
        return; /* written in place (in_place_updates) */
    VEC_PUSH(gen->a, gen->instrs, in);
}

static void collective(Gen *gen, const Op *op)
{
    static const PlanCollKind kinds[] = {PC_ALL_REDUCE, PC_ALL_GATHER, PC_REDUCE_SCATTER,
                                         PC_ALL_TO_ALL, PC_SLICE};
    PlanInstr in = {.kind = PI_COLL, .nargs = 2, .phase = op->phase, .layer = op->layer};
    in.coll.op = kinds[op->kind - OP_ALL_REDUCE];
    const Attr *how = ir_op_attr(op, "op");
    if (op->kind == OP_ALL_REDUCE && how && how->s && !strcmp(how->s, "max"))
        in.coll.op = PC_ALL_REDUCE_MAX;
    in.coll.naxes = attr_axes(gen, op, in.coll.axes);
    in.coll.dim = (int)ir_op_attr_int(op, "dim", -1);
    in.coll.dim2 = (int)ir_op_attr_int(op, "split", -1);
    in.coll.bytes = ir_op_attr_int(op, "bytes", 0);
    in.args = arena_alloc(gen->a, sizeof(int) * 2);
    in.args[0] = gen_tensor(gen, op->args[0]);
    in.args[1] = gen_tensor(gen, op->res[0]);
    const Value *x = op->args[0];
    const PlanTensor *t = &gen->tensors.data[in.args[0]];
    if (t->rank != x->rank || memcmp(t->shape, x->shape, sizeof(int64_t) * (size_t)x->rank)) {
        /* a reshape's memory under another shape: collectives need the shape */
        PlanInstr cp = {.kind = PI_COPY, .nargs = 2, .phase = op->phase, .layer = op->layer};
        cp.args = arena_alloc(gen->a, sizeof(int) * 2);
        cp.args[0] = gen_temp(gen, x->dtype, x->rank, x->shape);
        cp.args[1] = in.args[0];
        in.args[0] = cp.args[0];
        VEC_PUSH(gen->a, gen->instrs, cp);
    }
    VEC_PUSH(gen->a, gen->instrs, in);
}

static int lower_op(Gen *gen, const Op *op)
{
    gen->op = op;
    if (op->nres == 1 && (gen->fused[op->res[0]->id] || gen->kept[op->res[0]->id]))
        return 0; /* computed inside its user's kernel */
    if (gen->dead && gen->dead[op->id])
        return 0; /* nothing reads it */
    for (int i = 0; i < op->nres; i++)
        if (op->res[i]->dtype == DT_F16) {
            diag_error(&gen->c->diag, op->loc, "no CPU kernels for f16 (use f32, bf16 or f64)");
            return -1;
        }
    switch (op->kind) {
    case OP_INPUT: case OP_PARAM: case OP_STATE: case OP_STEP: case OP_RESHAPE:
    case OP_AXIS_OFFSET:
        return 0;
    case OP_ALL_REDUCE: case OP_ALL_GATHER: case OP_REDUCE_SCATTER: case OP_ALL_TO_ALL:
    case OP_SHARD_SLICE:
        collective(gen, op);
        return 0;
    case OP_MATMUL: gemm(gen, op); return 0;
    case OP_TRANSPOSE:
        if (gen->tgemm && gen->tgemm[op->id]) { /* its matmul's GEMM, operands swapped */
            gemm_into(gen, op->args[0]->def, op->res[0], NULL, 1);
            return 0;
        }
        return cg_op_kernels(gen, op);
    case OP_UPDATE: copy(gen, op); return 0;
    case OP_ADD:
        if (gen->bias_add && gen->bias_add[op->id]) {
            const Value *bias, *m = bias_matmul(op, NULL, &bias);
            gemm_into(gen, m->def, op->res[0], bias, 0);
            return 0;
        }
        /* fall through */
    default:
        if (cg_op_kernels(gen, op) == 0)
            return 0;
        diag_error(&gen->c->diag, op->loc, "no CPU kernel for '%s' yet", ir_ops[op->kind].name);
        return -1;
    }
}

/* ---- gradient buckets ---- */

/* Data parallelism reduces each gradient once, after the last microbatch: many
 * small all-reduces. Those of the backward pass whose results nothing reads
 * before the optimizer are merged, per group and dtype, into buckets of up to
 * CG_BUCKET_BYTES (one collective each: fewer, larger messages), each run when
 * it is full or, at the latest, just before the optimizer. */
#define CG_BUCKET_BYTES (25u << 20)

typedef struct Bucket {
    PlanInstr in;  /* the merged all-reduce: args in0, out0, in1, out1, ... */
    uint64_t bytes;
    int cap;
} Bucket;

static int same_group(const PlanColl *a, const PlanColl *b)
{
    return a->naxes == b->naxes && !memcmp(a->axes, b->axes, (size_t)a->naxes);
}

/* By tensor: the first instruction that reads it (a collective's outputs are
 * writes), or n. A gradient's all-reduce writes a fresh tensor, so its first
 * reader anywhere is its first reader after the all-reduce. */
static int *first_readers(const Gen *gen)
{
    int n = gen->instrs.len;
    int *first = arena_alloc(gen->a, sizeof(int) * (size_t)(gen->tensors.len + 1));
    for (int t = 0; t < gen->tensors.len; t++)
        first[t] = n;
    for (int i = n - 1; i >= 0; i--) {
        const PlanInstr *in = &gen->instrs.data[i];
        for (int a = 0; a < in->nargs; a++)
            if (!(in->kind == PI_COLL && a % 2))
                first[in->args[a]] = i;
        if (in->kind == PI_GEMM)
            first[in->gemm.a] = first[in->gemm.b] = first[in->gemm.c] = i;
        if (in->kind == PI_GEMM && in->gemm.epilogue == PE_BIAS)
            first[in->gemm.bias] = i;
    }
    return first;
}

static void bucket_add(Gen *gen, Bucket *b, const PlanInstr *in)
{
    if (b->in.nargs + 2 > b->cap) {
        b->cap = b->cap ? 2 * b->cap : 16;
        int *args = arena_alloc(gen->a, sizeof(int) * (size_t)b->cap);
        if (b->in.nargs)
            memcpy(args, b->in.args, sizeof(int) * (size_t)b->in.nargs);
        b->in.args = args;
    }
    if (!b->in.nargs) {
        int *args = b->in.args;
        b->in = *in;
        b->in.args = args;
        b->in.nargs = 0;
        b->in.coll.bytes = 0;
        b->in.layer = -1;
    }
    b->in.args[b->in.nargs++] = in->args[0];
    b->in.args[b->in.nargs++] = in->args[1];
    b->in.tick = in->tick; /* flushed when full: at its last member */
    b->in.coll.bytes += in->coll.bytes;
    b->bytes += gen->tensors.data[in->args[0]].bytes;
}

static void bucket_flush(Gen *gen, Bucket *b, PlanInstr *out, int *n)
{
    if (b->in.nargs)
        out[(*n)++] = b->in;
    b->in.nargs = 0;
    b->in.args = NULL; /* the flushed instruction keeps its array */
    b->cap = 0;
    b->bytes = 0;
}

/* Instructions [lo, hi) (one stage's program) into out at *m. */
static void bucket_gradients(Gen *gen, const int *first, int lo, int hi, PlanInstr *out, int *mp)
{
    int n = hi, m = *mp, opt = hi;
    for (int i = hi - 1; i >= lo; i--)
        if (gen->instrs.data[i].phase == PH_BWD) {
            opt = i + 1;
            break;
        }
    Bucket *bk = arena_alloc(gen->a, sizeof(Bucket) * (size_t)(hi - lo + 1));
    int nb = 0;
    memset(bk, 0, sizeof(Bucket) * (size_t)(hi - lo + 1));
    for (int i = lo; i < n; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        if (i == opt)
            for (int k = 0; k < nb; k++) {
                bk[k].in.tick = in->tick; /* where it runs: the optimizer's piece */
                bucket_flush(gen, &bk[k], out, &m);
            }
        int member = in->kind == PI_COLL && in->coll.op == PC_ALL_REDUCE && in->phase == PH_BWD &&
                     in->nargs == 2 && first[in->args[1]] >= opt &&
                     (!gen->loop || in->when == PW_LAST); /* the loop: once, the sums complete */
        if (!member) {
            out[m++] = *in;
            continue;
        }
        PlanDType dt = gen->tensors.data[in->args[0]].dtype;
        int k = 0;
        while (k < nb && !(bk[k].in.nargs && same_group(&bk[k].in.coll, &in->coll) &&
                           gen->tensors.data[bk[k].in.args[0]].dtype == dt))
            k++;
        if (k == nb) { /* a new (or an emptied) bucket */
            for (k = 0; k < nb && bk[k].in.nargs; k++)
                ;
            nb += k == nb;
        }
        bucket_add(gen, &bk[k], in);
        if (bk[k].bytes >= CG_BUCKET_BYTES)
            bucket_flush(gen, &bk[k], out, &m);
    }
    for (int k = 0; k < nb; k++)
        bucket_flush(gen, &bk[k], out, &m);
    *mp = m;
}

/* Every stage's program bucketed on its own: a bucket never spans stages. */
static void bucket_all(Gen *gen)
{
    int n = gen->instrs.len, m = 0;
    int *first = first_readers(gen);
    PlanInstr *out = arena_alloc(gen->a, sizeof(PlanInstr) * (size_t)(n + 1));
    for (int lo = 0, hi; lo < n; lo = hi) {
        for (hi = lo + 1; hi < n && gen->instrs.data[hi].stage == gen->instrs.data[lo].stage; hi++)
            ;
        bucket_gradients(gen, first, lo, hi, out, &m);
    }
    gen->instrs.len = 0;
    for (int i = 0; i < m; i++)
        VEC_PUSH(gen->a, gen->instrs, out[i]);
}

/* ---- memory plan: temporaries share memory when their lifetimes do not meet ---- */

typedef struct Block {
    uint64_t off, size;
} Block;

static uint64_t aligned(uint64_t n) { return (n + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }
uint64_t cg_aligned(uint64_t n) { return aligned(n); }

static void touch(int *first, int *last, int t, int at)
{
    if (first[t] < 0)
        first[t] = at;
    last[t] = at;
}

/* First and last instruction of every tensor; outputs live to the end. */
void cg_lifetimes(const Gen *gen, int *first, int *last)
{
    for (int i = 0; i < gen->tensors.len; i++)
        first[i] = last[i] = -1;
    for (int i = 0; i < gen->instrs.len; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        for (int a = 0; a < in->nargs; a++)
            touch(first, last, in->args[a], i);
        if (in->kind == PI_GEMM) {
            touch(first, last, in->gemm.a, i);
            touch(first, last, in->gemm.b, i);
            touch(first, last, in->gemm.c, i);
            if (in->gemm.epilogue == PE_BIAS)
                touch(first, last, in->gemm.bias, i);
        }
    }
    for (int i = 0; i < gen->g->outputs.len; i++) {
        int t = gen->tensor_of[gen->g->outputs.data[i]->id];
        if (t >= 0)
            last[t] = gen->instrs.len;
    }
}

/* First fit in the free list, else the top of the slab. */
static uint64_t take(Gen *gen, Block *free_, int *nfree, uint64_t size, uint64_t *top)
{
    for (int i = 0; i < *nfree; i++) {
        if (free_[i].size < size)
            continue;
        uint64_t off = free_[i].off;
        free_[i].off += size;
        free_[i].size -= size;
        return off;
    }
    uint64_t off = *top;
    *top += size;
    return off;
}

static void give(Block *free_, int *nfree, uint64_t off, uint64_t size)
{
    int i = 0;
    while (i < *nfree && free_[i].off < off)
        i++;
    memmove(free_ + i + 1, free_ + i, sizeof(Block) * (size_t)(*nfree - i));
    free_[i] = (Block){off, size};
    (*nfree)++;
    for (int j = *nfree - 1; j > 0; j--) /* merge neighbours */
        if (free_[j - 1].off + free_[j - 1].size == free_[j].off) {
            free_[j - 1].size += free_[j].size;
            memmove(free_ + j, free_ + j + 1, sizeof(Block) * (size_t)(*nfree - j - 1));
            (*nfree)--;
        }
}

/* Each temporary of space (by tensor) at the first free block that fits from
 * its first to its last instruction; every other tensor of space packed from
 * *top in plan order (untouched temporaries too: kept valid, apart). */
/* A temporary to place, with the key of the order it is placed in. */
typedef struct Place {
    uint64_t key, size;
    int first, t, last;
} Place;

/* Largest key first; then by birth, then by tensor. */
static int by_key(const void *x, const void *y)
{
    const Place *a = x, *b = y;
    if (a->key != b->key)
        return a->key > b->key ? -1 : 1;
    return a->first != b->first ? a->first - b->first : a->t - b->t;
}

/* The placed temporaries, as indices into pl, in offset order (then in the
 * order placed). */
typedef VEC(int) Placed;

/* The lowest offset from o up where a temporary of size alive over
 * [first, last] fits among the placed ones of list that are alive then. */
static uint64_t first_gap(const Place *pl, const uint64_t *off, const Placed *list, int first,
                          int last, uint64_t o, uint64_t size)
{
    for (int j = 0; j < list->len; j++) {
        const Place *u = &pl[list->data[j]];
        if (u->last < first || u->first > last)
            continue;
        if (off[list->data[j]] >= o + size)
            break;
        if (off[list->data[j]] + u->size > o)
            o = off[list->data[j]] + u->size;
    }
    return o;
}

/* Add k, placed last, after every entry at or below its offset. */
static void add_placed(Gen *gen, Placed *list, int k, const uint64_t *off)
{
    int lo = 0, hi = list->len; /* the first entry above off[k] */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (off[list->data[mid]] > off[k])
            hi = mid;
        else
            lo = mid + 1;
    }
    VEC_PUSH(gen->a, *list, k);
    int at = lo;
    memmove(list->data + at + 1, list->data + at, sizeof(int) * (size_t)(list->len - 1 - at));
    list->data[at] = k;
}

/* Window w of the instructions: [w W, (w + 2) W). A temporary alive for less
 * than W instructions lies inside the window where it is born, so only the
 * placed temporaries alive in that window can overlap it: the search for its
 * gap reads those, not every one placed (which made placement quadratic).
 * Longer-lived ones (a few percent) read every one placed. */
enum { PLACE_WINDOW = 1024 };

/* The temporaries pl[0..n), in that order, each at the lowest offset above
 * base where it overlaps no placed temporary alive at the same time; offsets
 * into off[] by place. The top. */
static uint64_t place_in_order(Gen *gen, const Place *pl, int n, uint64_t base, uint64_t *off)
{
    int horizon = 0; /* the last moment an item lives (instructions, or the loop's items) */
    for (int k = 0; k < n; k++)
        horizon = pl[k].last > horizon ? pl[k].last : horizon;
    int nwin = horizon / PLACE_WINDOW + 1;
    Placed all = {0}, *win = arena_alloc(gen->a, sizeof(Placed) * (size_t)nwin);
    uint64_t top = base;
    for (int k = 0; k < n; k++) {
        int f = pl[k].first, l = pl[k].last, w = f / PLACE_WINDOW;
        const Placed *near = l - f < PLACE_WINDOW ? &win[w] : &all;
        off[k] = first_gap(pl, off, near, f, l, base, pl[k].size);
        add_placed(gen, &all, k, off);
        for (int v = w > 0 ? w - 1 : 0; v <= l / PLACE_WINDOW && v < nwin; v++)
            add_placed(gen, &win[v], k, off);
        top = off[k] + pl[k].size > top ? off[k] + pl[k].size : top;
    }
    return top;
}

uint64_t cg_pack(Gen *gen, int n, const uint64_t *size, const int *first, const int *last,
                 uint64_t base, uint64_t *off)
{
    return cg_pack_after(gen, 0, n, size, first, last, base, off);
}

uint64_t cg_pack_after(Gen *gen, int nfirst, int n, const uint64_t *size, const int *first,
                       const int *last, uint64_t base, uint64_t *off)
{
    Place *pl = arena_alloc(gen->a, sizeof(Place) * (size_t)(n + 1));
    uint64_t *at = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(n + 1));
    for (int k = 0; k < n; k++) /* the first nfirst in their order, then the largest first */
        pl[k] = (Place){k < nfirst ? UINT64_MAX - (uint64_t)k : size[k], size[k], first[k], k, last[k]};
    qsort(pl, (size_t)n, sizeof(Place), by_key);
    uint64_t end = place_in_order(gen, pl, n, base, at);
    for (int k = 0; k < n; k++)
        off[pl[k].t] = at[k];
    return end > base ? end : base;
}

/* Offline placement of the temporaries temps[0..n) above base, knowing every
 * lifetime: largest first, each at the lowest offset free for its whole life.
 * This packs within a few percent of the most bytes alive at once, where
 * first fit in program order fragments. (Tried and no better on the samples:
 * size times lifetime first; the smallest gap that fits.) */
static void place_by_size(Gen *gen, int *temps, int n, const int *first, const int *last,
                          uint64_t base, uint64_t *top)
{
    PlanTensor *ts = gen->tensors.data;
    uint64_t *size = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(n + 1));
    uint64_t *off = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(n + 1));
    int *f = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    int *l = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    for (int k = 0; k < n; k++)
        size[k] = aligned(ts[temps[k]].bytes), f[k] = first[temps[k]], l[k] = last[temps[k]];
    uint64_t end = cg_pack(gen, n, size, f, l, base, off);
    for (int k = 0; k < n; k++)
        ts[temps[k]].offset = off[k];
    *top = end > *top ? end : *top;
}

#define CG_PLACE_BY_SIZE 20000 /* more temporaries than this: first fit (quadratic) */

static void lay_out(Gen *gen, const char *space, const int *first, const int *last, uint64_t *top)
{
    int n = gen->tensors.len, m = gen->instrs.len + 1, nfree = 0;
    PlanTensor *ts = gen->tensors.data;
    Block *free_ = arena_alloc(gen->a, sizeof(Block) * (size_t)(n + 1));
    for (int t = 0; t < n; t++) /* persistent tensors first, packed in plan order */
        if (space[t] && ts[t].role != PT_TEMP) {
            ts[t].offset = *top;
            *top += aligned(ts[t].bytes);
        }
    for (int t = 0; t < n; t++)
        if (space[t] && ts[t].role == PT_TEMP && first[t] < 0)
            ts[t].offset = take(gen, free_, &nfree, aligned(ts[t].bytes), top);
    int *temps = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1)), nt = 0;
    for (int t = 0; t < n; t++)
        if (space[t] && ts[t].role == PT_TEMP && first[t] >= 0)
            temps[nt++] = t;
    if (nt <= CG_PLACE_BY_SIZE) {
        place_by_size(gen, temps, nt, first, last, *top, top);
        return;
    }
    /* per instruction, the temporaries born and dying there, in tensor order */
    int *born = arena_alloc(gen->a, sizeof(int) * (size_t)m), *dies = arena_alloc(gen->a, sizeof(int) * (size_t)m);
    int *next_born = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    int *next_dies = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < m; i++)
        born[i] = dies[i] = -1;
    for (int t = n - 1; t >= 0; t--) {
        if (!space[t] || ts[t].role != PT_TEMP || first[t] < 0)
            continue;
        next_born[t] = born[first[t]];
        born[first[t]] = t;
        next_dies[t] = dies[last[t]];
        dies[last[t]] = t;
    }
    for (int i = 0; i < m; i++) {
        for (int t = born[i]; t >= 0; t = next_born[t])
            ts[t].offset = take(gen, free_, &nfree, aligned(ts[t].bytes), top);
        for (int t = dies[i]; t >= 0; t = next_dies[t])
            give(free_, &nfree, ts[t].offset, aligned(ts[t].bytes));
    }
}

/* Whether tensor t is held by every stage: stage -1, or an output (the
 * runtime broadcasts the outputs into every stage's copy after a step). */
int cg_everywhere(const Gen *gen, int t)
{
    const Graph *g = gen->g;
    for (int i = 0; i < g->outputs.len; i++)
        if (gen->tensor_of[g->outputs.data[i]->id] == t)
            return 1;
    return gen->tensors.data[t].stage < 0;
}

/* One address space per pipeline stage, each from 0: first what every stage
 * holds (same offsets everywhere), then per stage its own persistent tensors,
 * then its temporaries, reused over its own program only. */
static void plan_memory(Gen *gen)
{
    int n = gen->tensors.len, stages = ir_pipeline_stages(&gen->g->mesh);
    int *first = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    int *last = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    char *space = arena_alloc(gen->a, (size_t)n + 1);
    uint64_t common = 0;
    cg_lifetimes(gen, first, last);
    gen->stage_slab = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)stages);
    for (int t = 0; t < n; t++)
        space[t] = stages == 1 || cg_everywhere(gen, t);
    lay_out(gen, space, first, last, &common);
    gen->slab = common;
    for (int s = 0; s < stages; s++) {
        uint64_t top = common;
        for (int t = 0; stages > 1 && t < n; t++)
            space[t] = !cg_everywhere(gen, t) && gen->tensors.data[t].stage == s;
        if (stages > 1)
            lay_out(gen, space, first, last, &top);
        gen->stage_slab[s] = top ? top : PLAN_ALIGN;
        gen->slab = top > gen->slab ? top : gen->slab;
    }
}

static const char *prelude =
    "/* generated by tcc: the kernels of one training step */\n"
    "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n"
    "#ifdef _OPENMP\n#include <omp.h>\n#define TCC_THREADS() omp_get_num_threads()\n#else\n"
    "#define TCC_THREADS() 1\n#endif\n\n"
    "/* bf16 storage: widened to float on load, rounded to nearest even on store\n"
    " * (NaN stays a quiet NaN), as rt_f32_to_bf16 in the runtime */\n"
    "static inline float tcc_bf2f(uint16_t h)\n{\n"
    "    uint32_t u = (uint32_t)h << 16;\n    float x;\n    memcpy(&x, &u, 4);\n    return x;\n}\n"
    "static inline uint16_t tcc_f2bf(float x)\n{\n"
    "    uint32_t u;\n    memcpy(&u, &x, 4);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u)\n        return (uint16_t)((u >> 16) | 0x40);\n"
    "    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);\n}\n\n"
    "/* dropout's counter-based stream: splitmix64's finalizer of a times the\n"
    " * golden ratio xor b, in [0, 2^63) */\n"
    "static inline int64_t tcc_hash(int64_t a, int64_t b)\n{\n"
    "    uint64_t z = (uint64_t)a * 0x9E3779B97F4A7C15u ^ (uint64_t)b;\n"
    "    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;\n"
    "    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;\n"
    "    return (int64_t)((z ^ (z >> 31)) >> 1);\n}\n\n"
    "/* ALiBi's slope of head g of n: 2^(-8 (g + 1) / p) for the first p, the\n"
    " * largest power of 2 <= n, then the odd ones of the sequence for 2p */\n"
    "static inline double tcc_alibi_slope(int64_t g, int64_t n)\n{\n"
    "    int64_t p = 1;\n    while (p * 2 <= n)\n        p *= 2;\n"
    "    return g < p ? exp2(-8.0 * (double)(g + 1) / (double)p)\n"
    "                 : exp2(-4.0 * (double)(2 * (g - p) + 1) / (double)p);\n}\n\n"
    /* f32 exp and tanh of the C rendering: plain arithmetic and selects, the
     * same code in a vector loop and a scalar one, so a loop the compiler
     * vectorizes gives the bits its scalar form gives (a call of the C
     * library's expf stops a loop from being vectorized). */
    "/* exp(x) = 2^n exp(r), x = n ln2 + r, |r| <= ln2 / 2 (n rounded to nearest\n"
    " * by adding and taking away 1.5 2^23; ln2 in two parts); exp(r) by a degree\n"
    " * 5 polynomial (Cephes' expf, about 1 ulp); 2^n as two powers of two whose\n"
    " * exponent bits are set directly, so that results from the subnormals to\n"
    " * infinity are rounded once; NaN stays NaN */\n"
    "static inline float tcc_expf(float x)\n{\n"
    "    float c = x < -104.0f ? -104.0f : x > 89.0f ? 89.0f : x;\n"
    "    c = c == c ? c : 0.0f;\n"
    "    const float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;\n"
    "    const float r = (c - n * 0.693359375f) - n * -2.12194440e-4f;\n"
    "    float p = 1.9875691500e-4f;\n"
    "    p = p * r + 1.3981999507e-3f;\n    p = p * r + 8.3334519073e-3f;\n"
    "    p = p * r + 4.1665795894e-2f;\n    p = p * r + 1.6666665459e-1f;\n"
    "    p = p * r + 5.0000001201e-1f;\n"
    "    const float y = p * (r * r) + r + 1.0f;\n"
    "    const int32_t k = (int32_t)n, k1 = k / 2, k2 = k - k1;\n"
    "    const uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;\n"
    "    float s1, s2;\n    memcpy(&s1, &b1, 4);\n    memcpy(&s2, &b2, 4);\n"
    "    return x == x ? y * s1 * s2 : x;\n}\n"
    "/* tanh: below 0.625 in magnitude x + x^3 P(x^2) (Cephes' tanhf), else\n"
    " * 1 - 2 / (exp(2 |x|) + 1) with x's sign; within 2 ulp */\n"
    "static inline float tcc_tanhf(float x)\n{\n"
    "    const float a = x < 0.0f ? -x : x, z = x * x;\n"
    "    float p = -5.70498872745e-3f;\n"
    "    p = p * z + 2.06390887954e-2f;\n    p = p * z - 5.37397155531e-2f;\n"
    "    p = p * z + 1.33314422036e-1f;\n    p = p * z - 3.33332819422e-1f;\n"
    "    const float small = x == 0.0f ? x : p * z * x + x; /* -0 stays -0 */\n"
    "    const float big = 1.0f - 2.0f / (tcc_expf(a + a) + 1.0f);\n"
    "    return a < 0.625f ? small : x < 0.0f ? -big : big;\n}\n"
    "/* fmax without a call of the C library (a NaN operand gives the other) */\n"
    "static inline float tcc_fmaxf(float a, float b) { return a > b || b != b ? a : b; }\n"
    "static inline double tcc_fmax(double a, double b) { return a > b || b != b ? a : b; }\n\n";

/* After the C kernels: the runner of kernel groups (group_kernels). */
static const char *group_runner =
    "/* independent kernels in one parallel region (runtime/exec.c): each NAME_ws\n"
    " * shares its loop out among the threads without waiting at its end; the\n"
    " * region's end is the one barrier */\n"
    "void tcc_run_group(int n, void (*const *fns)(char *const *), char *const *const *args)\n{\n"
    "#pragma omp parallel\n"
    "    for (int i = 0; i < n; i++)\n        fns[i](args[i]);\n}\n";

const char *cg_c_prelude(void) { return prelude; }

static char *emit_cuda(Arena *a, const Kernel *k) { return cg_emit_gpu(a, k, CG_CUDA); }

/* The prelude, then every kernel as emit renders it, then post; "" when one
 * has no rendering (f16 on the GPU). */
static char *sources(Gen *gen, const char *pre, const char *post,
                     char *(*emit)(Arena *, const Kernel *))
{
    size_t total = strlen(pre) + strlen(post) + 1;
    char **parts = arena_alloc(gen->a, sizeof(char *) * (size_t)(gen->kernels.len + 1));
    for (int i = 0; i < gen->kernels.len; i++) {
        if (!(parts[i] = emit(gen->a, gen->kernels.data[i])))
            return "";
        total += strlen(parts[i]);
    }
    char *src = arena_alloc(gen->a, total), *p = src;
    p = stpcpy(p, pre);
    for (int i = 0; i < gen->kernels.len; i++)
        p = stpcpy(p, parts[i]);
    stpcpy(p, post);
    return src;
}

/* ---- kernel groups ----
 * Consecutive kernel instructions of one stage that are independent (none
 * writes bytes of the slab that another reads or writes) and whose kernels
 * have a work-shared form (cg_c_workshared) run in one parallel region on
 * the CPU: the first gets group = their number. A run is cut where that
 * would fail; it becomes a group when it has two or more kernels and more
 * work than one kernel needs to open a region (cg_c_items > 4096), so small
 * kernels that run alone on the calling thread stay so. The optimizer's
 * updates of all parameters, and the squares summed for clipping, are such
 * runs: one region each instead of one per parameter. In a loop plan the
 * kernels of a group are of one piece and run for the same microbatches
 * (one `when`), so runtime/pieces.c keeps them together when it expands the
 * loop. */

enum { GROUP_MAX = 256 }; /* kernels a group: bounds the pairs checked */

/* The argument slots kernel k stores to, a bit each. */
static uint64_t written_slots(const Kernel *k)
{
    uint64_t m = 0;
    for (int s = 0; s < k->body.len; s++)
        if (k->body.data[s].kind == KS_STORE || k->body.data[s].kind == KS_STORE_ADD)
            m |= UINT64_C(1) << k->body.data[s].a;
    return m;
}

static int overlap(const PlanTensor *x, const PlanTensor *y)
{
    return x->bytes && y->bytes && x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
}

/* Whether instruction j conflicts with instruction i: one writes what the
 * other touches. w: the written slots of each kernel. */
static int conflict(const Gen *gen, const uint64_t *w, const PlanInstr *i, const PlanInstr *j)
{
    for (int a = 0; a < i->nargs; a++)
        for (int b = 0; b < j->nargs; b++)
            if ((((w[i->kernel] >> a) | (w[j->kernel] >> b)) & 1) &&
                (i->args[a] == j->args[b] ||
                 overlap(&gen->tensors.data[i->args[a]], &gen->tensors.data[j->args[b]])))
                return 1;
    return 0;
}

/* In a loop plan only kernels on tensors of no microbatch frame (the bytes
 * of those move with the microbatch) that add nothing over microbatches;
 * group_kernels keeps a group to one piece and one `when`. */
static int groupable(const Gen *gen, const PlanInstr *in)
{
    if (in->kind != PI_KERNEL || !cg_c_workshared(gen->kernels.data[in->kernel]))
        return 0;
    if (!gen->loop)
        return 1;
    if (in->acc)
        return 0;
    for (int a = 0; a < in->nargs; a++)
        if (gen->tensors.data[in->args[a]].frame != 0)
            return 0;
    return 1;
}

static void group_kernels(Gen *gen)
{
    PlanInstr *ins = gen->instrs.data;
    int n = gen->instrs.len;
    uint64_t *w = arena_alloc(gen->a, sizeof *w * (size_t)(gen->kernels.len + 1));
    for (int k = 0; k < gen->kernels.len; k++)
        w[k] = written_slots(gen->kernels.data[k]);
    for (int i = 0; i < n;) {
        int j = i + 1;
        int64_t items = groupable(gen, &ins[i]) ? cg_c_items(gen->kernels.data[ins[i].kernel]) : 0;
        while (items && j < n && j - i < GROUP_MAX && groupable(gen, &ins[j]) &&
               ins[j].stage == ins[i].stage && (!gen->loop || (ins[j].piece == ins[i].piece && ins[j].when == ins[i].when))) {
            int free_ = 1;
            for (int m = i; m < j && free_; m++)
                free_ = !conflict(gen, w, &ins[m], &ins[j]);
            if (!free_)
                break;
            items += cg_c_items(gen->kernels.data[ins[j].kernel]);
            j++;
        }
        if (j - i >= 2 && items > 4096) {
            ins[i].group = j - i;
            for (int m = i + 1; m < j; m++)
                ins[m].grouped = 1;
        }
        i = j;
    }
}

static int output_tensor(Gen *gen, const char *name, int index)
{
    const Graph *g = gen->g;
    for (int i = 0; i < g->outputs.len; i++) {
        const Value *v = g->outputs.data[i];
        if ((name && v->name && !strcmp(v->name, name)) || (!name && i == index))
            return gen->tensor_of[v->id];
    }
    return -1;
}

static void fill_plan(Gen *gen, Plan *p)
{
    const Graph *g = gen->g;
    memset(p, 0, sizeof *p);
    p->version = PLAN_VERSION;
    p->model = arena_strdup(gen->a, g->name ? g->name : "model");
    p->naxes = g->mesh.naxes;
    p->axes = arena_alloc(gen->a, sizeof(PlanAxis) * (size_t)(g->mesh.naxes + 1));
    for (int i = 0; i < g->mesh.naxes; i++)
        p->axes[i] = (PlanAxis){arena_strdup(gen->a, g->mesh.axes[i].name),
                                arena_strdup(gen->a, ir_role_name(g->mesh.axes[i].role)),
                                g->mesh.axes[i].size};
    p->slab_bytes = gen->slab ? gen->slab : PLAN_ALIGN;
    /* without a memory plan NULL: every stage's slab is slab_bytes */
    p->stage_slab_bytes = gen->stage_slab;
    p->ntensors = gen->tensors.len;
    p->tensors = gen->tensors.data;
    p->ninstrs = gen->instrs.len;
    p->instrs = gen->instrs.data;
    p->nkernels = gen->kernels.len;
    p->kernels = arena_alloc(gen->a, sizeof(PlanKernel) * (size_t)(gen->kernels.len + 1));
    for (int i = 0; i < gen->kernels.len; i++) {
        const Kernel *k = gen->kernels.data[i];
        CgLaunch l = cg_gpu_launch(k);
        p->kernels[i] = (PlanKernel){(char *)k->name, k->nargs, (int)k->pattern, l.grid, l.block};
    }
    for (int i = 0; i < gen->instrs.len; i++)
        if (gen->instrs.data[i].kind == PI_KERNEL)
            gen->instrs.data[i].work = cg_c_work(gen->kernels.data[gen->instrs.data[i].kernel]);
    p->kernel_source = sources(gen, prelude, gen->kernels.len ? group_runner : "", cg_emit_c);
    p->gpu_source = gen->kernels.len ? sources(gen, cg_gpu_prelude(CG_CUDA), "", emit_cuda) : "";
    p->loss = output_tensor(gen, NULL, 0);
    p->lr = output_tensor(gen, "lr", -1);
    p->grad_norm = output_tensor(gen, "grad_norm", -1);
    p->flops = step_flops(gen);
    TrainConfig tc; /* the train block's steps and seed: the program's defaults */
    char err[256];
    p->steps = 0, p->seed = -1;
    if (ir_train_config(gen->g, &tc, err, sizeof err) == 0)
        p->steps = tc.steps, p->seed = tc.seed;
    p->microbatches = 1;
    if (gen->loop) {
        p->microbatches = gen->k, p->ntags = gen->ntags;
        p->sched = gen->sched.data, p->nsched = gen->sched.len;
        p->frames = gen->frames.data, p->nframes = gen->frames.len;
    }
    for (int i = 0; !gen->loop && i < gen->instrs.len; i++) /* only a loop has pieces */
        gen->instrs.data[i].piece = 0, gen->instrs.data[i].when = PW_EVERY, gen->instrs.data[i].acc = 0;
}

/* ---- the training run, whatever the mesh: what a checkpoint must match ---- */

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)data)[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t fnv_text(uint64_t h, const char *s)
{
    return fnv(h, s ? s : "", s ? strlen(s) + 1 : 1);
}

/* A param, state, input or hyperparameter: name, role, dtype, global shape, init. */
static uint64_t tensor_identity(const Graph *g, const PlanTensor *t)
{
    uint64_t h = fnv_text(0xcbf29ce484222325ULL, t->name);
    int64_t v[3 + PLAN_MAX_RANK] = {t->role, t->dtype, t->rank};
    for (int d = 0; d < t->rank; d++) {
        v[3 + d] = t->shape[d];
        for (int j = 0; j < t->nsplit[d]; j++)
            v[3 + d] *= g->mesh.axes[t->split[d][j]].size;
    }
    h = fnv(h, v, sizeof(int64_t) * (size_t)(3 + t->rank));
    return fnv(fnv_text(h, t->init), &t->init_arg, sizeof t->init_arg);
}

/* The model, the train settings that change a step's arithmetic (not how it
 * is cut: microbatches, pipeline schedule, ZeRO, recompute) and the
 * persistent tensors by their global value, in any order: the same for every
 * mesh of one run. "" when the train block does not read. */
static void train_hash(Gen *gen, Plan *p)
{
    TrainConfig tc;
    char err[256];
    if (ir_train_config(gen->g, &tc, err, sizeof err))
        return;
    uint64_t h = fnv_text(0xcbf29ce484222325ULL, p->model), sum = 0;
    double x[] = {
        tc.optimizer, tc.lr,           tc.momentum, tc.beta1,          tc.beta2,
        tc.eps,       tc.weight_decay, tc.schedule, (double)tc.warmup, (double)tc.total_steps,
        tc.min_lr,    tc.grad_clip};
    h = fnv_text(fnv(h, x, sizeof x), tc.precision);
    for (int i = 0; i < p->ntensors; i++) {
        PlanRole r = p->tensors[i].role;
        if (r == PT_PARAM || r == PT_STATE || r == PT_INPUT || r == PT_HYPER)
            sum += tensor_identity(gen->g, &p->tensors[i]);
    }
    h = fnv(h, &sum, sizeof sum);
    snprintf(p->train_hash, sizeof p->train_hash, "%016llx", (unsigned long long)h);
}

/* ---- pipeline stages: one program per stage, sends and receives between ---- */

typedef struct Event {
    int stage, tick, pos, sub; /* the order: a stage's program by (tick, position) */
    int instr;                 /* index into gen->instrs, or -1 - (send index) */
} Event;

static int by_event(const void *x, const void *y)
{
    const Event *a = x, *b = y;
    if (a->stage != b->stage)
        return a->stage - b->stage;
    if (a->tick != b->tick)
        return a->tick < b->tick ? -1 : 1;
    if (a->pos != b->pos)
        return a->pos < b->pos ? -1 : 1;
    return a->sub < b->sub ? -1 : a->sub > b->sub;
}

/* The tensors instruction in touches, by pointer (to rewrite them). */
static int touched(PlanInstr *in, int **out)
{
    int n = 0;
    for (int a = 0; a < in->nargs; a++)
        out[n++] = &in->args[a];
    if (in->kind == PI_GEMM) {
        out[n++] = &in->gemm.a;
        out[n++] = &in->gemm.b;
        out[n++] = &in->gemm.c;
        if (in->gemm.epilogue == PE_BIAS)
            out[n++] = &in->gemm.bias;
    }
    return n;
}

static PlanInstr p2p(Gen *gen, PlanCollKind k, int tensor, int stage, int peer, int tag,
                     const PlanInstr *like)
{
    PlanInstr in = {.kind = PI_COLL, .nargs = 1, .phase = like->phase, .layer = like->layer,
                    .stage = stage, .mb = like->mb, .tick = like->tick, .op = like->op};
    in.args = arena_alloc(gen->a, sizeof(int));
    in.args[0] = tensor;
    in.coll.op = k;
    in.coll.dim = in.coll.dim2 = -1;
    in.coll.peer = peer;
    in.coll.tag = tag;
    in.coll.bytes = (int64_t)gen->tensors.data[tensor].bytes;
    for (int a = 0; a < gen->g->mesh.naxes; a++)
        if (gen->g->mesh.axes[a].role == ROLE_PIPELINE)
            in.coll.axes[in.coll.naxes++] = (int8_t)a;
    return in;
}

/* A temporary without a stage (made while lowering an op) that instructions
 * of one stage only touch belongs to that stage: its memory is that stage's. */
static void own_temps(Gen *gen)
{
    int nt = gen->tensors.len;
    int *seen = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1)); /* -1 none, -2 several */
    for (int t = 0; t < nt; t++)
        seen[t] = -1;
    for (int i = 0; i < gen->instrs.len; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        const PlanGemm *g = &in->gemm;
        int gt[4] = {g->a, g->b, g->c, g->bias};
        int ng = in->kind != PI_GEMM ? 0 : g->epilogue == PE_BIAS ? 4 : 3;
        for (int k = 0; k < in->nargs + ng; k++) {
            int t = k < in->nargs ? in->args[k] : gt[k - in->nargs];
            seen[t] = seen[t] == -1 || seen[t] == in->stage ? in->stage : -2;
        }
    }
    for (int t = 0; t < nt; t++)
        if (gen->tensors.data[t].role == PT_TEMP && gen->tensors.data[t].stage < 0 && seen[t] >= 0)
            gen->tensors.data[t].stage = seen[t];
}

/* A message between stages: from its sender to its receiver, and its place
 * in the merged order (its send's). */
typedef struct Msg {
    int from, to, sent, k;
} Msg;

static int by_channel(const void *x, const void *y)
{
    const Msg *a = x, *b = y;
    if (a->from != b->from || a->to != b->to)
        return a->from != b->from ? a->from - b->from : a->to - b->to;
    return (a->sent > b->sent) - (a->sent < b->sent);
}

/* Receive k goes before event before[k]. Each channel (an ordered pair of
 * stages) must deliver its messages in the order they are sent: NCCL pairs a
 * channel's k-th send with its k-th recv whatever the tags (runtime/match.c).
 * A receive placed after one its sender sends later moves up to just before
 * that one: it then waits no longer than that one would (its send comes
 * first), so no new wait arises. */
static void recvs_in_send_order(Gen *gen, const PlanInstr *recvs, const int *sent, int *before,
                                int nr)
{
    Msg *m = arena_alloc(gen->a, sizeof(Msg) * (size_t)(nr + 1));
    for (int k = 0; k < nr; k++)
        m[k] = (Msg){recvs[k].coll.peer, recvs[k].stage, sent[k], k};
    qsort(m, (size_t)nr, sizeof(Msg), by_channel);
    for (int j = nr - 2; j >= 0; j--)
        if (m[j].from == m[j + 1].from && m[j].to == m[j + 1].to &&
            before[m[j + 1].k] < before[m[j].k])
            before[m[j].k] = before[m[j + 1].k];
}

/* A receive's place: the event it precedes, then its send's place. */
typedef struct RecvAt {
    int before, sent, k;
} RecvAt;

static int by_place(const void *x, const void *y)
{
    const RecvAt *a = x, *b = y;
    if (a->before != b->before)
        return a->before - b->before;
    return (a->sent > b->sent) - (a->sent < b->sent);
}

/* The program of every stage into gen->instrs: the sorted instructions ev,
 * each receive before its event (several: in their sends' order), the sends
 * after their makers. */
static void merge_programs(Gen *gen, const Event *ev, int n, const PlanInstr *recvs, int *before,
                           const Event *sends, const PlanInstr *send_in, int ns)
{
    int m = 0, *sent = arena_alloc(gen->a, sizeof(int) * (size_t)(ns + 1));
    Event *all = arena_alloc(gen->a, sizeof(Event) * (size_t)(n + ns + 1));
    memcpy(all, ev, sizeof(Event) * (size_t)n);
    for (int k = 0; k < ns; k++) {
        all[n + k] = sends[k];
        all[n + k].sub = INT32_MAX - ns + k; /* after the maker, in order */
        all[n + k].instr = -1 - k;
    }
    qsort(all, (size_t)(n + ns), sizeof(Event), by_event);
    for (int e = 0; e < n + ns; e++)
        if (all[e].instr < 0)
            sent[-1 - all[e].instr] = e;
    if (!gen->loop) /* a loop plan's channels are put in order when expanded (runtime/pieces.c) */
        recvs_in_send_order(gen, recvs, sent, before, ns);
    /* by instruction: its receives, as a list in place order */
    RecvAt *place = arena_alloc(gen->a, sizeof(RecvAt) * (size_t)(ns + 1));
    int *first = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    int *next = arena_alloc(gen->a, sizeof(int) * (size_t)(ns + 1));
    for (int k = 0; k < ns; k++)
        place[k] = (RecvAt){before[k], sent[k], k};
    qsort(place, (size_t)ns, sizeof(RecvAt), by_place);
    for (int i = 0; i < n; i++)
        first[i] = -1;
    for (int j = ns - 1; j >= 0; j--) {
        int at = ev[place[j].before].instr;
        next[place[j].k] = first[at];
        first[at] = place[j].k;
    }
    PlanInstr *out = arena_alloc(gen->a, sizeof(PlanInstr) * (size_t)(n + 2 * ns + 1));
    for (int e = 0; e < n + ns; e++) {
        if (all[e].instr < 0) {
            out[m++] = send_in[-1 - all[e].instr];
            continue;
        }
        for (int k = first[all[e].instr]; k >= 0; k = next[k])
            out[m++] = recvs[k];
        out[m++] = gen->instrs.data[all[e].instr];
    }
    gen->instrs.len = 0;
    for (int i = 0; i < m; i++)
        VEC_PUSH(gen->a, gen->instrs, out[i]);
}

/* Each op's instructions go to its stage, in the order (tick, position) the
 * pipeline pass gave (passes/pipeline.c). A tensor computed on one stage and
 * read on another is sent once per step right after the op that computes it
 * (a parameter: at the start) and received, into a tensor of the reader's
 * own, just before its first reader there; the readers there then use that
 * copy, so each stage's temporaries live in its own part of the order.
 * Inputs, the step and coordinates are written on every device: never sent. */
static int stage_programs(Gen *gen)
{
    const Graph *g = gen->g;
    int n = gen->instrs.len, nt = gen->tensors.len, stages = ir_pipeline_stages(&g->mesh);
    /* home: the stage computing each tensor; its op (for the send's place) */
    int *home = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    const Op **maker = arena_alloc(gen->a, sizeof(Op *) * (size_t)(nt + 1));
    for (int t = 0; t < nt; t++)
        home[t] = -1, maker[t] = NULL;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        PlanRole r = role_of(op);
        for (int j = 0; j < op->nres; j++) {
            int t = gen->tensor_of[op->res[j]->id];
            if (t < 0 || maker[t])
                continue;
            maker[t] = op;
            home[t] = r == PT_INPUT || r == PT_STEP || r == PT_COORD ? -1 : op->stage;
        }
    }
    for (int t = 0; t < nt; t++)
        gen->tensors.data[t].stage = stages > 1 ? home[t] : -1;
    Event *ev = arena_alloc(gen->a, sizeof(Event) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) {
        const Op *op = g->ops.data[gen->owner.data[i]];
        gen->instrs.data[i].stage = stages > 1 ? op->stage : 0;
        ev[i] = (Event){gen->instrs.data[i].stage, op->tick, op->id, i, i};
    }
    int ticked = 0; /* one stage with ticks: its microbatches in the schedule's order */
    for (int i = 0; i < g->ops.len; i++)
        ticked |= g->ops.data[i]->tick != 0;
    if (ticked || stages > 1) { /* (one stage has nothing to send) */
        qsort(ev, (size_t)n, sizeof(Event), by_event);
        /* by (tensor, stage): the copy received there, -1 when none yet */
        int *copy = arena_alloc(gen->a, sizeof(int) * (size_t)nt * (size_t)stages + 1);
        for (size_t k = 0; k < (size_t)nt * (size_t)stages; k++)
            copy[k] = -1;
        VEC(PlanInstr) recvs = {0}; /* (the receive; its event follows it) */
        VEC(int) recv_before = {0};
        VEC(Event) sends = {0};
        VEC(PlanInstr) send_in = {0};
        int tag = 0;
        for (int e = 0; e < n; e++) {
            PlanInstr *in = &gen->instrs.data[ev[e].instr];
            int *ts[72];
            int nts = touched(in, ts), s = in->stage;
            for (int k = 0; k < nts; k++) {
                int t = *ts[k];
                if (t >= nt || home[t] < 0 || home[t] == s)
                    continue;
                int *c = &copy[(size_t)t * (size_t)stages + (size_t)s];
                if (*c < 0) {
                    PlanTensor pt = gen->tensors.data[t];
                    pt.name = "";
                    pt.role = PT_TEMP;
                    pt.init = "";
                    pt.stage = s;
                    VEC_PUSH(gen->a, gen->tensors, pt);
                    *c = gen->tensors.len - 1;
                    const Op *mk = maker[t], *rd = g->ops.data[gen->owner.data[ev[e].instr]];
                    PlanInstr rcv = p2p(gen, PC_RECV, *c, s, home[t], tag, in);
                    rcv.when = cg_loop_msg_when(gen, mk, rd, 1);
                    VEC_PUSH(gen->a, recvs, rcv);
                    VEC_PUSH(gen->a, recv_before, e);
                    VEC_PUSH(gen->a, sends, ((Event){home[t], mk->tick, mk->id, INT32_MAX, -1}));
                    PlanInstr snd = p2p(gen, PC_SEND, t, home[t], s, tag, in);
                    snd.op = mk->id + 1;
                    snd.tick = mk->tick; /* its piece: its maker's */
                    snd.when = cg_loop_msg_when(gen, mk, rd, 0);
                    VEC_PUSH(gen->a, send_in, snd);
                    tag = (tag + 1) % 32768;
                    in = &gen->instrs.data[ev[e].instr]; /* the vectors may have moved */
                    nts = touched(in, ts);
                }
                *ts[k] = *c;
            }
        }
        merge_programs(gen, ev, n, recvs.data, recv_before.data, sends.data, send_in.data,
                       sends.len);
    }
    bucket_all(gen);
    if (stages > 1)
        own_temps(gen);
    return cg_loop_pieces(gen);
}

/* A mismatch plan_check_comm found at instruction at of p, named by its op. */
static int comm_error(Ctx *c, const Graph *local, const Plan *p, int at, const char *err)
{
    static const char *const phases[] = {"fwd", "bwd", "recompute", "opt"};
    int k = at >= 0 ? p->instrs[at].op - 1 : -1;
    const Op *op = k >= 0 && k < local->ops.len ? local->ops.data[k] : NULL;
    diag_error(&c->diag, op ? op->loc : LOC_NONE, "the stages' programs do not match: %s", err);
    if (!op || op->nres < 1)
        return -1;
    const Value *v = op->res[0];
    const char *what = v->name ? arena_printf(c->arena, "'%s'", v->name)
                               : arena_printf(c->arena, "value %%%d", v->id);
    diag_note(&c->diag, op->loc, "instrs[%d] comes from the op '%s' of %s (layer %d, %s)", at,
              ir_ops[op->kind].name, what, op->layer, phases[op->phase]);
    return -1;
}

int cg_check_comm(Ctx *c, const Graph *local, const Plan *p)
{
    char err[1024];
    int at = -1;
    if (p->nsched <= 0)
        return plan_check_comm(p, &at, err, sizeof err) ? comm_error(c, local, p, at, err) : 0;
    /* a loop: the collectives of the program it makes (what meets another stage is
     * among them; the rest neither waits nor is waited for), each keeping its op */
    PlanItem *items;
    int nitems, m = 0;
    if (plan_expand_order(p, &items, &nitems, err, sizeof err))
        return diag_error(&c->diag, LOC_NONE, "the microbatch loop: %s", err), -1;
    Plan x = *p;
    x.nsched = 0, x.sched = NULL, x.nframes = 0, x.frames = NULL;
    x.instrs = malloc(sizeof(PlanInstr) * (size_t)(nitems + 1));
    if (!x.instrs) {
        free(items);
        return diag_error(&c->diag, LOC_NONE, "out of memory"), -1;
    }
    for (int i = 0; i < nitems; i++) {
        const PlanInstr *in = &p->instrs[items[i].src];
        if (in->kind != PI_COLL)
            continue;
        x.instrs[m] = *in;
        if (in->coll.op == PC_SEND || in->coll.op == PC_RECV)
            x.instrs[m].coll.tag = plan_item_tag(p, &items[i]);
        m++;
    }
    x.ninstrs = m;
    int rc = plan_check_comm(&x, &at, err, sizeof err) ? comm_error(c, local, &x, at, err) : 0;
    free(x.instrs);
    free(items);
    return rc;
}

int cg_build_plan(Ctx *c, const Graph *global, int flags, Plan *out)
{
    Kernel **kernels;
    return cg_build_plan_ir(c, global, flags, out, &kernels);
}

int cg_build_plan_ir(Ctx *c, const Graph *global, int flags, Plan *out, Kernel ***kernels)
{
    const Graph *local;
    return cg_build_plan_local(c, global, flags, out, kernels, &local);
}

int cg_build_plan_local(Ctx *c, const Graph *global, int flags, Plan *out, Kernel ***kernels,
                        const Graph **local)
{
    const Graph *g = cg_localize(c->arena, global);
    *local = g;
    Gen gen = {.c = c, .g = g, .a = c->arena};
    gen.tensor_of = arena_alloc(c->arena, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->values.len; i++)
        gen.tensor_of[i] = -1;
    if (cg_loop_find(&gen))
        return -1;
    if (gen.loop && (flags & CG_KEEP_VALUES))
        return diag_error(&c->diag, LOC_NONE, "a plan that keeps every value has no "
                                              "microbatch loop (compile it unrolled)"),
               -1;
    find_fusions(&gen, flags);
    place_values(&gen);
    int bad = 0;
    for (int i = 0; i < g->ops.len; i++) {
        double flops = gen.flops;
        bad |= lower_op(&gen, g->ops.data[i]) != 0;
        if (gen.instrs.len > gen.owner.len) { /* on its GEMM, else its last kernel (attention) */
            int at = gen.instrs.len - 1;
            for (int j = gen.owner.len; j < gen.instrs.len; j++)
                if (gen.instrs.data[j].kind == PI_GEMM)
                    at = j;
            gen.instrs.data[at].flops = gen.flops - flops;
        }
        while (gen.owner.len < gen.instrs.len) {
            PlanInstr *in = &gen.instrs.data[gen.owner.len];
            in->mb = g->ops.data[i]->mb, in->tick = g->ops.data[i]->tick, in->op = i + 1;
            in->when = cg_loop_when(&gen, g->ops.data[i]);
            VEC_PUSH(c->arena, gen.owner, i);
        }
    }
    if (bad || stage_programs(&gen) != 0)
        return -1;
    if (gen.loop) {
        if (cg_loop_memory(&gen))
            return -1;
    } else if (!(flags & CG_KEEP_VALUES)) {
        plan_memory(&gen);
    }
    group_kernels(&gen);
    fill_plan(&gen, out);
    if (cg_check_comm(c, g, out) != 0)
        return -1;
    train_hash(&gen, out);
    *kernels = gen.kernels.data;
    return 0;
}
