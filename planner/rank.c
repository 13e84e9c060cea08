/* planner.c: the search of --plan=auto. Reads the profiles of one layer's
 * step at each tensor-parallel size (cost_profile: times and bytes per
 * microbatch row, measured by the cost and memory models on a compiled
 * one-layer plan) and the device; writes every candidate layout -- tensor,
 * pipeline and data sizes, virtual stages, rows per microbatch, ZeRO level,
 * recomputation, schedule -- with its predicted step time, MFU and peak
 * memory per device, sorted.
 *
 * Key idea: a candidate is a few multiplications away from the profiles. A
 * layer costs the same wherever it runs, so a stage's work per microbatch is
 * its layers' plus the embedding's or the head's; the schedule adds its
 * bubble in closed form; the gradients' reduction over the data axis is a
 * ring on the link the data group crosses, overlapped with the last
 * backward; memory is the stage's training state (sharded by the ZeRO level)
 * plus the activations of the microbatches in flight. No candidate is
 * compiled: thousands are ranked in milliseconds, and the driver compiles
 * the best to check it (docs/cost.md, "The planner"). */
#include "planner/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


static const CostProfile *profile_of(const PlanSpace *sp, int tp)
{
    for (int i = 0; i < sp->nprof; i++)
        if (sp->prof[i].tp == tp)
            return &sp->prof[i];
    return NULL;
}

/* ---- the schedule and the stages, as the pipeline pass makes them ---- */

/* What a schedule does with unit costs (passes/schedule.c): its bubble
 * fraction, and the most (microbatch, chunk) pairs the first rank holds
 * between their forward and backward. Under ZB-H1 also, by rank, the
 * moments that may be its largest: a microbatches between F and B (the one
 * in B among them) and w with B done and W waiting (the one in B among
 * them: its weight gradients' inputs pile up layer by layer as B runs),
 * none holding more of both than another. Cached by (kind, p, m, v). */
typedef struct Held {
    int rank, a, w;
} Held;

typedef struct SchedFacts {
    SchedKind kind;
    int p, m, v;
    double bubble, pairs;
    Held *held; /* ZB-H1 when simulated; NULL otherwise */
    int nheld;
} SchedFacts;

/* How the pipeline pass cuts the units (the embedding, each layer, the head)
 * into p v runs by forward FLOPs: each run's first unit. Cached by runs. */
typedef struct Cut {
    const CostProfile *P;
    int runs;
    int *start; /* by run: its first unit; start[runs] = the unit count */
} Cut;

typedef struct Cache {
    Arena *a;
    VEC(SchedFacts) f;
    VEC(Cut) cut;
} Cache;

#define SIM_PIECES 300000 /* above: closed forms (docs/schedules.md) instead of the simulator */

/* Adds (r, a, w) to f's moments unless one of rank r holds as much of both,
 * dropping those of rank r it holds as much as: a rank's moments differ in
 * a (0 to m), so there are at most p (m + 1) of them. */
static void add_moment(SchedFacts *f, int cap, int r, int a, int w)
{
    int n = 0;
    for (int i = 0; i < f->nheld; i++) {
        Held h = f->held[i];
        if (h.rank == r && h.a >= a && h.w >= w)
            return; /* what it dropped, this one holds as much as too */
        if (h.rank != r || h.a > a || h.w > w)
            f->held[n++] = h;
    }
    f->nheld = n;
    if (n < cap)
        f->held[f->nheld++] = (Held){r, a, w};
}

/* ZB-H1's moments on every rank, walking its pieces in order (v = 1). */
static void zb_moments(Arena *ar, const Schedule *s, SchedFacts *f)
{
    if (s->kind != SCHED_ZB_H1 || s->v != 1)
        return;
    int cap = s->p * (s->m + 2);
    f->held = arena_alloc(ar, sizeof(Held) * (size_t)cap);
    for (int r = 0; r < s->p; r++) {
        int a = 0, w = 0;
        for (int i = 0; i < s->ranks[r].n; i++) {
            PieceKind k = s->ranks[r].pieces[i].kind;
            if (k == PIECE_F)
                add_moment(f, cap, r, ++a, w);
            else if (k == PIECE_B)
                add_moment(f, cap, r, a--, ++w);
            else
                w--;
        }
    }
}

static const SchedFacts *sched_facts(Cache *ca, SchedKind kind, int p, int m, int v)
{
    for (int i = 0; i < ca->f.len; i++) {
        const SchedFacts *e = &ca->f.data[i];
        if (e->kind == kind && e->p == p && e->m == m && e->v == v)
            return e;
    }
    SchedFacts f = {kind, p, m, v, 0, 0, NULL, 0};
    Schedule s;
    SchedTimes t;
    char err[256];
    double fill = (double)(p - 1) / (kind == SCHED_INTERLEAVED ? v : 1);
    f.bubble = fill / (m + fill) / (kind == SCHED_ZB_H1 ? 3 : 1);
    f.pairs = kind == SCHED_GPIPE ? (double)m * v : (double)(m < p ? m : p) * v;
    if ((double)p * m * v <= SIM_PIECES && sched_build(ca->a, kind, p, m, v, &s, err, sizeof err) == 0 &&
        sched_simulate(ca->a, &s, NULL, NULL, 0, &t, err, sizeof err) == 0)
        f.bubble = t.bubble, f.pairs = t.peak[0], zb_moments(ca->a, &s, &f);
    VEC_PUSH(ca->a, ca->f, f);
    return &ca->f.data[ca->f.len - 1];
}

/* The pipeline pass's balance (passes/pipeline.c): the cut of U units into
 * runs non-empty contiguous runs whose costliest run is cheapest, the
 * earliest among equals. */
static const Cut *cut_of(Cache *ca, const CostProfile *P, int L, int runs)
{
    for (int i = 0; i < ca->cut.len; i++)
        if (ca->cut.data[i].runs == runs && ca->cut.data[i].P == P)
            return &ca->cut.data[i];
    int U = L + 2;
    size_t row = (size_t)U + 1;
    double *pre = arena_alloc(ca->a, sizeof(double) * row);
    double *best = arena_alloc(ca->a, sizeof(double) * (size_t)(runs + 1) * row);
    int *at = arena_alloc(ca->a, sizeof(int) * (size_t)(runs + 1) * row);
    pre[0] = 0;
    for (int u = 0; u < U; u++)
        pre[u + 1] = pre[u] + (u == 0 ? P->uflops_embed : u == U - 1 ? P->uflops_head : P->uflops_layer);
    for (int u = 0; u <= U; u++)
        best[u] = u ? 1e300 : 0;
    for (int k = 1; k <= runs; k++)
        for (int u = 0; u <= U; u++) {
            double b = 1e300;
            int arg = 0;
            for (int j = k - 1; j < u; j++) {
                double run = pre[u] - pre[j], prev = best[(size_t)(k - 1) * row + (size_t)j];
                double mx = run > prev ? run : prev;
                if (mx < b)
                    b = mx, arg = j;
            }
            best[(size_t)k * row + (size_t)u] = b;
            at[(size_t)k * row + (size_t)u] = arg;
        }
    Cut c = {P, runs, arena_alloc(ca->a, sizeof(int) * (size_t)(runs + 1))};
    for (int k = runs, u = U; k >= 1; k--) {
        c.start[k - 1] = at[(size_t)k * row + (size_t)u];
        u = c.start[k - 1];
    }
    c.start[runs] = U;
    VEC_PUSH(ca->a, ca->cut, c);
    return &ca->cut.data[ca->cut.len - 1];
}

/* Rank r's share of the cut: its layers, and whether it holds the embedding's
 * unit and the head's. */
static void rank_units(const Cut *cut, int L, int pp, int v, int r, int *layers, int *embed, int *head)
{
    *layers = *embed = *head = 0;
    for (int c = 0; c < v; c++) {
        int run = c * pp + r;
        for (int u = cut->start[run]; u < cut->start[run + 1]; u++) {
            if (u == 0)
                *embed = 1;
            else if (u == L + 1)
                *head = 1;
            else
                ++*layers;
        }
    }
}

/* The mesh is laid out pipeline, data, tensor (the last innermost): a data
 * group's members are tp apart, a pipeline neighbour tp * dp. */
/* A part's time with k rows per microbatch: its launches once, its GEMMs k
 * times over at the efficiency of their longer token dimension (the cost
 * model's d(x) = x / (x + gemm_dim)), the rest k times. */
static double scaled(const CostDevice *d, const CostProfile *P, const CostTime *t, double k)
{
    double x = P->row_tokens, g = d->k.gemm_dim;
    double launch = t->launches * d->k.launch_s;
    double eff = (x / (x + g)) / (k * x / (k * x + g));
    return launch + k * (t->t - launch - t->gemm) + k * t->gemm * eff;
}

/* The share of a part's parameter bytes (the layer's, or the rest's) that
 * ZeRO can split over n data ranks: those with a dimension n divides. */
static double shardable(const CostProfile *P, int layer, int n)
{
    double all = 0, split = 0;
    int from = layer ? 0 : P->nshapes_layer, to = layer ? P->nshapes_layer : P->nshapes;
    for (int i = from; i < to; i++) {
        int ok = 0;
        for (int d = 0; d < P->shape[i].rank && !ok; d++)
            ok = P->shape[i].dim[d] % n == 0;
        all += P->shape[i].bytes, split += ok ? P->shape[i].bytes : 0;
    }
    return all > 0 ? split / all : 1;
}

/* A layer's recomputation with k rows per microbatch. */
static double recompute_s(const CostDevice *d, const CostProfile *P, const PlanChoice *c, double k)
{
    return c->rc == RC_FULL        ? scaled(d, P, &P->t_r, k)
           : c->rc == RC_SELECTIVE ? scaled(d, P, &P->t_rsel, k)
                                   : 0;
}

/* Under ZB-H1: the most a rank's microbatches hold, over the schedule's
 * moments (sched_facts): a microbatches' saved activations and w waiting
 * weight gradients' inputs (the profile's w_held) for each of the rank's
 * layers, with k rows each, and the temporaries of one piece. */
static double zb_held(const SchedFacts *sf, const CostProfile *P, const Cut *cut, int L,
                      const PlanChoice *c, double act, double k)
{
    double most = 0;
    for (int i = 0; i < sf->nheld; i++) {
        const Held *h = &sf->held[i];
        int nl = L, e = 1, hd = 1;
        rank_units(cut, L, c->pp, c->v, h->rank, &nl, &e, &hd);
        double tr = fmax(P->transient, fmax(e ? P->transient_embed : 0, hd ? P->transient_head : 0));
        double b = h->a * k * (act * nl + e * P->act_embed + hd * P->act_head) +
                   h->w * k * P->w_held * nl + k * tr;
        most = fmax(most, b);
    }
    return most;
}

static void evaluate(const PlanSpace *sp, const CostProfile *P, Cache *ca, PlanChoice *c)
{
    const CostDevice *d = sp->d;
    double k = c->mbs;
    double layer = scaled(d, P, &P->t_f, k) + scaled(d, P, &P->t_b, k) + recompute_s(d, P, c, k);
    double embed = scaled(d, P, &P->embed_f, k) + scaled(d, P, &P->embed_b, k);
    double head = scaled(d, P, &P->head_f, k) + scaled(d, P, &P->head_b, k);
    /* each rank's work per microbatch, its chunks as the pipeline pass cuts them */
    const Cut *cut = c->pp > 1 ? cut_of(ca, P, sp->layers, c->pp * c->v) : NULL;
    double W = 0;
    int first_layers = sp->layers, last_layers = sp->layers, has_embed = 1, has_head = 1, most = 0;
    for (int r = 0; r < c->pp; r++) {
        int nl = sp->layers, e = 1, h = 1;
        if (cut)
            rank_units(cut, sp->layers, c->pp, c->v, r, &nl, &e, &h);
        double w = nl * layer + e * embed + h * head;
        if (w > W)
            W = w;
        if (nl > most)
            most = nl;
        if (r == 0)
            first_layers = nl, has_embed = e;
        if (r == c->pp - 1)
            last_layers = nl, has_head = h;
    }
    /* the schedule's bubble over the busiest rank's work, and the fill's messages */
    const SchedFacts *sf = c->pp > 1 ? sched_facts(ca, c->sched, c->pp, c->m, c->v) : NULL;
    double bubble = 0;
    if (sf) {
        bubble = c->m * W * sf->bubble / (1 - sf->bubble);
        CostLink pl = cost_link(d, (long)c->tp * c->dp);
        bubble += 2.0 * (c->pp - 1) * (k * P->msg / pl.bw + pl.lat);
    }
    /* the stage's training state, and its gradients' reduction over the data axis */
    int nl = first_layers > last_layers ? first_layers : last_layers;
    double share = c->pp > 1 ? 0.5 : 1.0; /* of what is outside the layers: first or last stage */
    double masters = P->params_layer * nl + P->params_out * share;
    double state = P->state_layer * nl + P->state_out * share;
    /* what a device keeps of what ZeRO splits: the parameters with a dimension
     * the data ranks divide are split, the others stay whole */
    double fl = shardable(P, 1, c->dp), fo = shardable(P, 0, c->dp);
    double share_l = P->params_layer * nl, share_o = masters - share_l;
    double split = (share_l * fl + share_o * fo) / (masters > 0 ? masters : 1);
    double over = split / c->dp + (1 - split);
    double comm = 0, window = W * 2 / 3; /* the last microbatch's backward on the stage */
    CostLink dl = cost_link(d, (long)(c->dp - 1) * c->tp);
    if (c->dp > 1) {
        /* ZeRO's collectives go one per parameter tensor (ZeRO 0's all-reduces in
         * buckets, codegen/buckets.c): each its latency, and each gather's slice
         * of the update and copy back a launch */
        double nt = P->nshapes_layer * nl + (P->nshapes - P->nshapes_layer) * share;
        double lat = nt * (c->dp - 1) * dl.lat, launches = nt * 2 * d->k.launch_s;
        double rs = cost_gather(masters, c->dp, dl) + lat, ag = rs + launches;
        if (c->zero == 0)
            comm = fmax(0, cost_all_reduce(masters, c->dp, dl) - window);
        else if (c->zero == 1)
            comm = fmax(0, rs - window) + ag;
        else
            comm = c->m * fmax(0, rs - window) + ag;
        if (c->zero == 3) /* each microbatch gathers its 16-bit weights for F and B */
            comm += c->m * 2 * fmax(0, cost_gather(masters / 2, c->dp, dl) - W / 3);
    }
    double updated = masters * (c->zero >= 1 ? over : 1);
    double opt = 7 * updated / (d->mem_bw * d->k.mem_eff);
    c->compute_s = c->m * W;
    c->bubble_s = bubble;
    c->comm_s = comm;
    c->opt_s = opt;
    c->step_s = c->compute_s + bubble + comm + opt;
    double flops = (P->flops_layer * sp->layers + P->flops_out) * (double)sp->batch;
    c->mfu = flops / (c->step_s * sp->gpus * d->peak16);
    /* memory: the first stage (the most in flight) and the last (the head) */
    /* parameters per master byte (their 16-bit casts), as measured without ZeRO
     * and with ZeRO 1; the gradients: an f32 accumulator per master (sharded
     * from ZeRO 2 on, which reduce-scatters each microbatch's part; under ZeRO
     * 0 and 1 the microbatches sum whole and the step reduces them once) and a
     * layer's parts in flight; the optimizer's state, sharded from ZeRO 1 on */
    double pm = c->zero ? P->params1 : P->params;
    double persist = masters * pm * (c->zero >= 3 ? over : 1) +
                     masters * (c->zero >= 2 ? over : 1) + P->params_layer +
                     state * P->optimizer * (c->zero >= 1 ? over : 1);
    double act = c->rc == RC_FULL ? P->act_full : c->rc == RC_SELECTIVE ? P->act_sel : P->act_none;
    /* (microbatch, chunk) pairs held on the first rank, each chunk its share of the layers */
    double inflight = sf ? sf->pairs / c->v : 1;
    /* the first rank's microbatches in flight over the most layers a rank holds */
    double first = inflight * k * (act * most + has_embed * P->act_embed) +
                   k * fmax(P->transient, has_embed ? P->transient_embed : 0);
    double last = (c->sched == SCHED_GPIPE ? c->m : 1) * k * (act * last_layers + has_head * P->act_head) +
                  k * fmax(P->transient, has_head ? P->transient_head : 0);
    /* ZB-H1: rank r keeps up to r microbatches' weight gradients waiting (passes/schedule.c),
     * each with what they read: the most on the last rank */
    if (c->sched == SCHED_ZB_H1 && sf && sf->held && cut)
        first = last = zb_held(sf, P, cut, sp->layers, c, act, k);
    else if (c->sched == SCHED_ZB_H1)
        last += (c->pp - 1 < c->m ? c->pp - 1 : c->m) * k * P->w_held * last_layers;
    if (c->pp == 1)
        first = last = inflight * k * (act * sp->layers + P->act_embed + P->act_head) +
                       k * fmax(P->transient, fmax(P->transient_embed, P->transient_head));
    double base = P->base + (sp->gpus > 1 ? MEM_NCCL : 0); /* NCCL's buffers on a mesh */
    base += fmax(fmax(k * P->scratch_layer, P->scratch_out), /* the first or last stage */
                 P->scratch_opt / (c->zero >= 1 ? c->dp : 1));
    c->peak = persist + fmax(first, last) + base;
    c->status = c->peak <= sp->budget ? PLAN_FITS : PLAN_OVER;
}

static int by_time(const void *x, const void *y)
{
    const PlanChoice *a = x, *b = y;
    if (a->status != b->status)
        return a->status - b->status;
    return a->step_s < b->step_s ? -1 : a->step_s > b->step_s ? 1 : 0;
}

/* ---- the best candidates, refined by simulating their schedules ---- */

typedef struct Refine {
    const PlanSpace *sp;
    const CostProfile *P;
    const Cut *cut;
    const PlanChoice *c;
    double k;
} Refine;

/* A piece's time: its chunk's layers and ends, forward or backward (under
 * ZB-H1 the backward's halves, B and W). */
static double refine_cost(const Piece *pc, int rank, void *user)
{
    const Refine *r = user;
    const CostDevice *d = r->sp->d;
    int run = pc->chunk * r->c->pp + rank, nl = 0, e = 0, h = 0;
    for (int u = r->cut->start[run]; u < r->cut->start[run + 1]; u++) {
        if (u == 0)
            e = 1;
        else if (u == r->sp->layers + 1)
            h = 1;
        else
            nl++;
    }
    const CostProfile *P = r->P;
    if (pc->kind == PIECE_F)
        return nl * scaled(d, P, &P->t_f, r->k) + e * scaled(d, P, &P->embed_f, r->k) +
               h * scaled(d, P, &P->head_f, r->k);
    double b = nl * (scaled(d, P, &P->t_b, r->k) + recompute_s(d, P, r->c, r->k)) +
               e * scaled(d, P, &P->embed_b, r->k) + h * scaled(d, P, &P->head_b, r->k);
    return r->c->sched == SCHED_ZB_H1 ? b / 2 : b;
}

#define REFINE 64 /* candidates whose schedules are simulated */

/* The pipeline's time of candidate c by the schedule simulator with each
 * rank's own piece times and the messages between stages (what the cost
 * model does with a compiled plan), in place of the closed form. */
static void refine(Arena *a, const PlanSpace *sp, const CostProfile *P, Cache *ca, PlanChoice *c)
{
    Schedule s;
    SchedTimes t;
    char err[256];
    if (c->pp <= 1 || (double)c->pp * c->m * c->v > SIM_PIECES ||
        sched_build(a, c->sched, c->pp, c->m, c->v, &s, err, sizeof err) != 0)
        return;
    Refine r = {sp, P, cut_of(ca, P, sp->layers, c->pp * c->v), c, c->mbs};
    CostLink pl = cost_link(sp->d, (long)c->tp * c->dp);
    double xfer = r.k * P->msg / pl.bw + pl.lat;
    if (sched_simulate(a, &s, refine_cost, &r, xfer, &t, err, sizeof err) != 0)
        return;
    c->bubble_s = t.makespan - c->compute_s;
    if (c->bubble_s < 0)
        c->bubble_s = 0;
    c->step_s = c->compute_s + c->bubble_s + c->comm_s + c->opt_s;
    c->mfu *= 0; /* recomputed by the caller */
}

int pl_search_space(Arena *a, const PlanSpace *sp, PlanChoice **out, int *n)
{
    static const int mbss[] = {1, 2, 4, 8}, vs[] = {2, 4, 8};
    static const SchedKind one[] = {SCHED_1F1B};
    static const SchedKind many[] = {SCHED_1F1B, SCHED_ZB_H1, SCHED_GPIPE};
    Cache ca = {.a = a};
    VEC(PlanChoice) all = {0};
    for (int tp = 1; tp <= sp->gpus; tp *= 2) {
        const CostProfile *P = profile_of(sp, tp);
        if (!P || sp->gpus % tp)
            continue;
        for (int pp = 1; pp <= sp->gpus / tp; pp++) {
            if ((sp->gpus / tp) % pp || (pp > 1 && !(sp->axes & 4)) || (pp > 1 && pp > sp->layers))
                continue;
            int dp = sp->gpus / tp / pp;
            if ((dp > 1 && !(sp->axes & 1)) || dp > 65536 || pp > 65536)
                continue; /* (a mesh axis is at most 65536) */
            for (size_t b = 0; b < sizeof mbss / sizeof mbss[0]; b++) {
                PlanChoice c = {.tp = tp, .pp = pp, .dp = dp, .v = 1, .mbs = mbss[b]};
                if (sp->batch % ((int64_t)dp * c.mbs))
                    continue;
                c.m = (int)(sp->batch / ((int64_t)dp * c.mbs));
                int nsched = pp > 1 ? 3 + 3 : 1;
                for (int s = 0; s < nsched; s++) {
                    c.sched = pp == 1 ? one[0] : s < 3 ? many[s] : SCHED_INTERLEAVED;
                    c.v = s < 3 ? 1 : vs[s - 3];
                    if (c.sched == SCHED_INTERLEAVED && (c.m % pp || pp * c.v > sp->layers + 2))
                        continue;
                    for (int z = 0; z <= (dp > 1 ? 3 : 0); z++)
                        for (int rc = RC_NONE; rc <= RC_FULL; rc++) {
                            c.zero = z, c.rc = rc;
                            if (P->ok)
                                evaluate(sp, P, &ca, &c);
                            else
                                c.status = PLAN_NODIV, c.step_s = INFINITY;
                            VEC_PUSH(a, all, c);
                        }
                }
            }
        }
    }
    *out = all.data, *n = all.len;
    if (*n)
        qsort(*out, (size_t)*n, sizeof **out, by_time);
    /* the fastest that fit, their pipelines simulated, ranked again */
    int k = 0;
    while (k < *n && k < REFINE && (*out)[k].status == PLAN_FITS)
        k++;
    for (int i = 0; i < k; i++) {
        PlanChoice *c = &(*out)[i];
        const CostProfile *P = profile_of(sp, c->tp);
        double flops = c->mfu * c->step_s;
        refine(a, sp, P, &ca, c);
        c->mfu = flops / c->step_s;
    }
    if (k)
        qsort(*out, (size_t)k, sizeof **out, by_time);
    return 0;
}
