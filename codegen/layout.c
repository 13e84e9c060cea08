/* layout.c: the memory plan of a plan without a microbatch loop, and the
 * lifetimes and packing that microbatch_loop.c's memory plan uses too. Reads the
 * tensors and the instructions; writes every tensor's offset, the slab and
 * each pipeline stage's slab (gen->stage_slab).
 * Key idea: a temporary lives from the first instruction that touches it
 * to the last, and temporaries whose lifetimes do not meet share memory:
 * placed largest first, each at the lowest offset free for its whole life
 * (cg_pack); with very many, each takes the first free block that fits in
 * instruction order and gives it back after its last use. One address
 * space per pipeline stage, each from 0, what every stage holds first. */
#include "kgen.h"

#include <stdlib.h>
#include <string.h>

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
void cg_plan_memory(Gen *gen)
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
