/* dedupe.c: one copy of each kernel in the plan. Reads a built Kernel;
 * writes the plan's kernels (gen->kernels, with their code's hash and text)
 * and every IR seen so far (gen->seen). Key idea: microbatches and layers
 * build the same kernels again on other tensors; a repeat is recognised by
 * its IR as built (a hash, then field by field) before it is simplified and
 * rendered, else by its C text under a neutral name, so the plan keeps one
 * copy and the compiler compiles it once. */
#include "kgen.h"

#include <string.h>

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
    if (at->softcap != 0) /* without one, the hash of before */
        h = MIX(h, at->softcap);
    if (at->seq_k != at->seq) /* self-attention: the hash of before */
        h = MIX(h, at->seq_k);
    if (at->head_dim_v != at->head_dim) /* likewise */
        h = MIX(h, at->head_dim_v);
    if (at->alibi) /* likewise */
        h = MIX(h, at->alibi), h = MIX(h, at->heads_whole), h = MIX(h, at->hoff);
    if (at->bias > 0) /* likewise (a kernel of another pattern: 0) */
        h = MIX(h, at->bias), h = MIX(h, at->bias_heads), h = MIX(h, at->dbias);
    for (int i = 0; i < 3; i++) /* views (likewise) */
        if (at->in_pitch[i])
            h = MIX(h, at->in_pitch[i]), h = MIX(h, at->in_head[i]), h = MIX(h, at->in_off[i]);
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
        !same_bits(p->scale, q->scale) || p->window != q->window || p->mask != q->mask ||
        !same_bits(p->softcap, q->softcap) || p->alibi != q->alibi ||
        p->heads_whole != q->heads_whole || p->hoff != q->hoff || p->seq_k != q->seq_k ||
        p->head_dim_v != q->head_dim_v || p->bias != q->bias || p->bias_heads != q->bias_heads ||
        p->dbias != q->dbias || memcmp(p->in_pitch, q->in_pitch, sizeof p->in_pitch) ||
        memcmp(p->in_head, q->in_head, sizeof p->in_head) || memcmp(p->in_off, q->in_off, sizeof p->in_off))
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
int cg_kernel_index(Gen *gen, Kernel *k)
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
