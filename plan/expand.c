/* expand.c: the microbatch loop of a plan, made into the program the
 * executors run (plan_expand), and its order (plan_expand_order), which the
 * compiler also reads to lay out memory.
 * Reads: a loop plan (Plan.nsched > 0) that passes plan_check: one
 * microbatch's instructions, each in a piece of its stage's schedule table
 * (or the prologue 0 / the epilogue -1), with when it runs. Writes: the same
 * Plan, holding each stage's program: the prologue, every table entry's
 * piece for its microbatch, the epilogue.
 * Key idea: an instruction that runs for every microbatch reads its frame
 * tensors at microbatch j's frame, copies microbatch j's input rows (block j
 * of k along the first dimension), and sends with tag + j ntags; one that runs once
 * (after the last microbatch's part of a sum, or before the first reader of
 * a value received for all of them) reads what it was compiled with. Each
 * channel (an ordered pair of stages) must then receive in the order it
 * sends, as NCCL pairs messages by order: a receive that comes after one
 * whose send is later moves up to just before that one, as the compiler does
 * for a plan without a loop (codegen/stages.c). Depends on libc only. */
#include "plan/plan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Instructions of one (stage, piece), by index in p->instrs. */
typedef struct Group {
    int stage, piece, lo, hi; /* into Order.idx */
} Group;

typedef struct Order {
    const Plan *p;
    int *idx;      /* instruction indices sorted by (stage, piece, index) */
    Group *groups; /* the runs of idx with one (stage, piece) */
    int ngroups;
    PlanItem *items;
    int n, cap;
    char *err;
    size_t errlen;
} Order;

/* An instruction's sort key: qsort has no context, so each carries its own
 * (a global would race between the ranks that open a plan at once). */
typedef struct Key {
    int stage, piece, i;
} Key;

static int by_stage_piece(const void *x, const void *y)
{
    const Key *a = x, *b = y;
    if (a->stage != b->stage)
        return a->stage < b->stage ? -1 : 1;
    if (a->piece != b->piece)
        return a->piece < b->piece ? -1 : 1;
    return a->i - b->i;
}

static const Group *group_of(const Order *o, int stage, int piece)
{
    int lo = 0, hi = o->ngroups;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        const Group *g = &o->groups[mid];
        if (g->stage < stage || (g->stage == stage && g->piece < piece))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < o->ngroups && o->groups[lo].stage == stage && o->groups[lo].piece == piece
               ? &o->groups[lo]
               : NULL;
}

static int push(Order *o, int src, int mb, int entry)
{
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 1024;
        PlanItem *items = realloc(o->items, sizeof(PlanItem) * (size_t)cap);
        if (!items)
            return plan_errorf(o->err, o->errlen, "out of memory expanding the microbatch loop");
        o->items = items, o->cap = cap;
    }
    o->items[o->n++] = (PlanItem){src, mb, entry};
    return 0;
}

/* The instructions of group g that run for microbatch mb of k. */
static int run_group(Order *o, const Group *g, int mb, int k, int entry)
{
    for (int j = g ? g->lo : 0; g && j < g->hi; j++) {
        const PlanInstr *in = &o->p->instrs[o->idx[j]];
        int runs = in->when == PW_EVERY || (in->when == PW_LAST && mb == k - 1) ||
                   (in->when == PW_FIRST && mb == 0);
        if (runs && push(o, o->idx[j], in->when == PW_EVERY ? mb : -1, entry))
            return -1;
    }
    return 0;
}

static int is_msg(const Plan *p, const PlanItem *it, PlanCollKind k)
{
    const PlanInstr *in = &p->instrs[it->src];
    return in->kind == PI_COLL && in->coll.op == k;
}

/* A message's number in the program: tag + mb ntags for a microbatch's. */
static int64_t msg_key(const Plan *p, const PlanItem *it)
{
    const PlanInstr *in = &p->instrs[it->src];
    return in->coll.tag + (it->mb > 0 ? (int64_t)it->mb * p->ntags : 0);
}

int plan_item_tag(const Plan *p, const PlanItem *it)
{
    return (int)(msg_key(p, it) % 32768); /* the backends' tags wrap, as the compiler's do */
}

/* A receive of stage items[lo, hi): its place (the item it goes before) and
 * its send's rank on the channel. */
typedef struct Recv {
    int from, seq, at, k;
} Recv;

static int by_channel_seq(const void *x, const void *y)
{
    const Recv *a = x, *b = y;
    if (a->from != b->from)
        return a->from - b->from;
    return a->seq - b->seq;
}

static int by_place(const void *x, const void *y)
{
    const Recv *a = x, *b = y;
    if (a->at != b->at)
        return a->at - b->at;
    return a->seq - b->seq;
}

/* Stage items [lo, hi): each channel's receives in its sends' order; seq:
 * by tag, the rank of its send on its channel. */
static int receive_in_order(Order *o, int lo, int hi, const int *seq)
{
    const Plan *p = o->p;
    int nr = 0;
    for (int i = lo; i < hi; i++)
        nr += is_msg(p, &o->items[i], PC_RECV);
    if (!nr)
        return 0;
    Recv *r = malloc(sizeof(Recv) * (size_t)nr);
    PlanItem *out = malloc(sizeof(PlanItem) * (size_t)(hi - lo));
    char *moved = calloc((size_t)(hi - lo), 1);
    if (!r || !out || !moved) {
        free(r), free(out), free(moved);
        return plan_errorf(o->err, o->errlen, "out of memory expanding the microbatch loop");
    }
    nr = 0;
    for (int i = lo; i < hi; i++)
        if (is_msg(p, &o->items[i], PC_RECV))
            r[nr] = (Recv){p->instrs[o->items[i].src].coll.peer,
                           seq[msg_key(p, &o->items[i])], i - lo, i - lo},
            nr++;
    qsort(r, (size_t)nr, sizeof(Recv), by_channel_seq);
    for (int j = nr - 2; j >= 0; j--)
        if (r[j].from == r[j + 1].from && r[j + 1].at < r[j].at)
            r[j].at = r[j + 1].at;
    qsort(r, (size_t)nr, sizeof(Recv), by_place);
    for (int j = 0; j < nr; j++)
        moved[r[j].k] = 1;
    int m = 0, j = 0;
    for (int i = 0; i < hi - lo; i++) {
        for (; j < nr && r[j].at == i; j++) { /* the receives placed before item i */
            out[m] = o->items[lo + r[j].k];
            out[m++].entry = o->items[lo + i].entry;
        }
        if (!moved[i])
            out[m++] = o->items[lo + i];
    }
    memcpy(o->items + lo, out, sizeof(PlanItem) * (size_t)(hi - lo));
    free(r), free(out), free(moved);
    return 0;
}

int plan_expand_order(const Plan *p, PlanItem **items, int *nitems, char *err, size_t errlen)
{
    Order o = {.p = p, .err = err, .errlen = errlen};
    int k = p->microbatches, ns = plan_stages(p), rc = -1;
    int *seq = NULL, *nsent = NULL;
    *items = NULL, *nitems = 0;
    o.idx = malloc(sizeof(int) * (size_t)(p->ninstrs + 1));
    o.groups = malloc(sizeof(Group) * (size_t)(p->ninstrs + 1));
    if (!o.idx || !o.groups)
        goto out;
    Key *keys = malloc(sizeof(Key) * (size_t)(p->ninstrs + 1));
    if (!keys)
        goto out;
    for (int i = 0; i < p->ninstrs; i++)
        keys[i] = (Key){p->instrs[i].stage, p->instrs[i].piece, i};
    qsort(keys, (size_t)p->ninstrs, sizeof(Key), by_stage_piece);
    for (int i = 0; i < p->ninstrs; i++)
        o.idx[i] = keys[i].i;
    free(keys);
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[o.idx[i]];
        Group *last = o.ngroups ? &o.groups[o.ngroups - 1] : NULL;
        if (last && last->stage == in->stage && last->piece == in->piece)
            last->hi = i + 1;
        else
            o.groups[o.ngroups++] = (Group){in->stage, in->piece, i, i + 1};
    }
    int *start = malloc(sizeof(int) * (size_t)(ns + 1)); /* each stage's first item */
    if (!start)
        goto out;
    for (int s = 0; s < ns; s++) {
        start[s] = o.n;
        int e = 0;
        if (run_group(&o, group_of(&o, s, 0), k - 1, k, 0))
            goto fail;
        for (int t = 0; t < p->nsched; t++)
            if (p->sched[t].stage == s &&
                run_group(&o, group_of(&o, s, p->sched[t].piece), p->sched[t].mb, k, ++e))
                goto fail;
        if (run_group(&o, group_of(&o, s, -1), k - 1, k, e + 1))
            goto fail;
    }
    start[ns] = o.n;
    /* each send's rank on its channel, by tag */
    size_t ntag = (size_t)p->ntags * (size_t)k + 1;
    seq = malloc(sizeof(int) * ntag);
    nsent = calloc((size_t)ns * (size_t)ns + 1, sizeof(int));
    if (!seq || !nsent)
        goto fail;
    for (int i = 0; i < o.n; i++)
        if (is_msg(p, &o.items[i], PC_SEND)) {
            const PlanInstr *in = &p->instrs[o.items[i].src];
            int64_t key = msg_key(p, &o.items[i]);
            if (key < 0 || (size_t)key >= ntag || in->coll.peer < 0 || in->coll.peer >= ns)
                continue; /* plan_check names it */
            seq[key] = nsent[(size_t)in->stage * (size_t)ns + (size_t)in->coll.peer]++;
        }
    for (int s = 0; s < ns; s++)
        if (receive_in_order(&o, start[s], start[s + 1], seq))
            goto fail;
    *items = o.items, *nitems = o.n;
    o.items = NULL;
    rc = 0;
fail:
    free(start);
out:
    if (rc && !(err && *err))
        plan_errorf(err, errlen, "out of memory expanding the microbatch loop");
    free(o.idx), free(o.groups), free(o.items), free(seq), free(nsent);
    return rc;
}

/* ---- the program ---- */

typedef struct Expand {
    Plan *p;
    int k, n0;          /* microbatches; tensors before the expansion */
    int *inst;          /* by (tensor, mb): its instance, -1 when none yet */
    PlanTensor *tensors;
    int ntensors, cap;
} Expand;

/* Tensor t as microbatch mb reads it: its frame's instance (microbatch 0's
 * is t itself), or with rows the microbatch's rows of input t; t itself for
 * the rest. */
static int instance(Expand *x, int t, int mb, int rows, char *err, size_t n)
{
    const PlanTensor *pt = &x->p->tensors[t];
    int frame = pt->frame > 0;
    if (mb < 0 || t < 0 || t >= x->n0 || (!frame && !rows) || (frame && mb == 0))
        return t;
    int *at = &x->inst[(size_t)t * (size_t)x->k + (size_t)mb];
    if (*at >= 0)
        return *at;
    if (x->ntensors == x->cap) {
        int cap = 2 * x->cap + 16;
        PlanTensor *ts = realloc(x->tensors, sizeof(PlanTensor) * (size_t)cap);
        if (!ts)
            return plan_errorf(err, n, "out of memory expanding the microbatch loop"), -2;
        x->tensors = ts, x->cap = cap;
    }
    PlanTensor c = x->tensors[t];
    c.name = NULL, c.init = NULL; /* owned by t */
    if (frame) {
        c.offset = x->p->frames[pt->frame - 1].base[mb] + pt->offset;
    } else { /* rows [mb r, (mb + 1) r) of the first dimension */
        c.bytes = pt->bytes / (uint64_t)x->k;
        c.offset = pt->offset + (uint64_t)mb * c.bytes;
        c.shape[0] /= x->k;
        c.role = PT_TEMP;
        c.limit = 0;
    }
    c.frame = frame ? 0 : -1;
    x->tensors[x->ntensors] = c;
    return *at = x->ntensors++;
}

int plan_expand(Plan *p, int owned, int *at, char *err, size_t n)
{
    if (p->nsched <= 0)
        return 0;
    PlanItem *items;
    int nitems, k = p->microbatches;
    if (plan_expand_order(p, &items, &nitems, err, n))
        return -1;
    Expand x = {p, k, p->ntensors, NULL, NULL, p->ntensors, p->ntensors + 16};
    x.inst = malloc(sizeof(int) * ((size_t)p->ntensors * (size_t)k + 1));
    x.tensors = malloc(sizeof(PlanTensor) * (size_t)x.cap);
    PlanInstr *out = calloc((size_t)nitems + 1, sizeof(PlanInstr));
    if (!x.inst || !x.tensors || !out) {
        free(items), free(x.inst), free(x.tensors), free(out);
        return plan_errorf(err, n, "out of memory expanding the microbatch loop");
    }
    memset(x.inst, 0xff, sizeof(int) * ((size_t)p->ntensors * (size_t)k + 1));
    memcpy(x.tensors, p->tensors, sizeof(PlanTensor) * (size_t)p->ntensors);
    int rc = 0, m = 0;
    for (int i = 0; i < nitems && !rc; i++, m++) {
        const PlanInstr *src = &p->instrs[items[i].src];
        int mb = items[i].mb;
        PlanInstr in = *src;
        in.args = malloc(sizeof(int) * (size_t)(src->nargs + 1));
        if (!in.args) {
            rc = plan_errorf(err, n, "out of memory expanding the microbatch loop");
            break;
        }
        if (src->nargs)
            memcpy(in.args, src->args, sizeof(int) * (size_t)src->nargs);
        if (in.acc && mb == 0 && in.kind == PI_GEMM) /* the first microbatch's product */
            in.gemm.beta = 0;
        else if (in.acc && mb == 0) { /* the first microbatch's part: a copy, not an add */
            in.kind = PI_COPY;
            in.kernel = 0;
            in.nargs = 2;
        }
        for (int a = 0; a < in.nargs; a++) {
            int t = instance(&x, in.args[a], mb, in.rows && a == 1, err, n);
            if (t < -1)
                rc = -1;
            in.args[a] = t;
        }
        if (in.kind == PI_GEMM) {
            int *g[4] = {&in.gemm.a, &in.gemm.b, &in.gemm.c, &in.gemm.bias};
            for (int a = 0; a < (in.gemm.epilogue == PE_BIAS ? 4 : 3); a++) {
                int t = instance(&x, *g[a], mb, 0, err, n);
                if (t < -1)
                    rc = -1;
                *g[a] = t;
            }
        }
        if (in.kind == PI_COLL && (in.coll.op == PC_SEND || in.coll.op == PC_RECV))
            in.coll.tag = plan_item_tag(p, &items[i]);
        in.piece = 0, in.when = PW_EVERY, in.acc = 0, in.rows = 0;
        out[m] = in;
    }
    free(items);
    free(x.inst);
    if (rc) {
        for (int i = 0; i < m; i++)
            free(out[i].args);
        free(out), free(x.tensors);
        return -1;
    }
    for (int t = 0; t < p->ntensors; t++) /* a frame tensor itself: microbatch 0's instance */
        if (x.tensors[t].frame > 0) {
            x.tensors[t].offset += p->frames[x.tensors[t].frame - 1].base[0];
            x.tensors[t].frame = 0;
        }
    if (owned) {
        for (int i = 0; i < p->ninstrs; i++)
            free(p->instrs[i].args);
        free(p->instrs);
        free(p->tensors);
        for (int f = 0; f < p->nframes; f++)
            free(p->frames[f].base);
        free(p->frames);
        free(p->sched);
    }
    p->instrs = out, p->ninstrs = nitems;
    p->tensors = x.tensors, p->ntensors = x.ntensors;
    p->sched = NULL, p->nsched = 0;
    p->frames = NULL, p->nframes = 0;
    if (plan_check_struct(p, err, n))
        return -1;
    return plan_check_comm(p, at, err, n);
}
