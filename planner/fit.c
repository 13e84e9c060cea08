/* fit.c: a plan that compiles fits. Reads the options and the graph of the
 * step; compiles probes of it through the compile API (the memory model of
 * each); chooses recompute = auto's layers and refuses a plan over the
 * device's memory, naming the levers (a deeper pipeline, recomputation,
 * ZeRO) that would bring it under, with the peak each would give. */
#include "planner/planner.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

double pl_headroom_of(const Options *o)
{
    if (o->has_headroom)
        return o->memory_headroom;
    return o->device_memory > 0 || drv_device_memory(o) <= 0 ? 0 : MEM_HEADROOM;
}

double pl_budget_of(const Options *o)
{
    double m = drv_device_memory(o);
    return m > 0 ? m - pl_headroom_of(o) : 0;
}



/* Which stage each layer's forward runs on, into ls[0..n) (-1: none). */
static void layer_stages(const Graph *g, int *ls, int n)
{
    for (int i = 0; i < n; i++)
        ls[i] = -1;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->phase == PH_FWD && op->layer >= 0 && op->layer < n)
            ls[op->layer] = op->stage;
    }
}


int pl_compile_one(Ctx *c, const Options *o, OneStep *one)
{
    Options q = *o;
    q.dump_after = q.stop_after = NULL;
    q.verbose = q.unroll = 0;
    return drv_compile(c, &q, 1, one);
}

/* The memory model of the step as the options say, of one: the step of
 * one microbatch compiled. */
int pl_model_in(Ctx *c, const Options *o, MemoryModel *mm, OneStep *one)
{
    return pl_compile_one(c, o, one) ||
                   mem_model(c, one->g, &one->s.train, one->local, &one->plan, drv_on_gpu(o), mm)
               ? -1
               : 0;
}

/* What a probe gives: each stage's peak and each layer's stage. */
typedef struct ProbeResult {
    int ok, nstages, nlayers;
    double peak, stage_peak[1024];
    int layer_stage[4096];
} ProbeResult;

/* model_in in a context of its own whose diagnostics go nowhere: a lever
 * that does not compile (a mesh that does not divide) is just not offered. */
static void probe(Ctx *c, const Options *o, ProbeResult *r)
{
    FILE *null = fopen("/dev/null", "w");
    Ctx *q = ctx_new(null ? null : stderr);
    for (int i = 0; i < c->defines.len; i++)
        VEC_PUSH(q->arena, q->defines, c->defines.data[i]);
    MemoryModel mm;
    OneStep one;
    memset(r, 0, sizeof *r);
    r->ok = pl_model_in(q, o, &mm, &one) == 0 && mm.nstages <= 1024;
    if (r->ok) {
        r->peak = mm.peak, r->nstages = mm.nstages;
        for (int s = 0; s < mm.nstages; s++)
            r->stage_peak[s] = mm.stage[s].peak;
        r->nlayers = o->nrecompute_layers > 0 ? o->nrecompute_layers : 0;
        layer_stages(one.g, r->layer_stage, 4096);
    }
    ctx_free(q);
    if (null)
        fclose(null);
}


/* A mesh spec by name with the pipeline axis k times longer, and with the
 * data axes k times shorter when same (the same devices), or NULL when the
 * mesh has no such axes. */
static const char *deeper_pipeline(Ctx *c, const Mesh *m, int k, int same)
{
    int pp = -1, dp = -1;
    for (int i = 0; i < m->naxes; i++) {
        if (m->axes[i].role == ROLE_PIPELINE && pp < 0)
            pp = i;
        if ((m->axes[i].role == ROLE_DATA || m->axes[i].role == ROLE_FSDP) && m->axes[i].size % k == 0 &&
            dp < 0 && same)
            dp = i;
    }
    if (pp < 0 || (same && dp < 0))
        return NULL;
    char spec[512] = "";
    for (int i = 0, at = 0; i < m->naxes; i++) {
        int size = m->axes[i].size * (i == pp ? k : 1) / (i == dp ? k : 1);
        at += snprintf(spec + at, sizeof spec - (size_t)at, "%s%s=%d", i ? "," : "", m->axes[i].name,
                       size);
    }
    return intern(c->strings, spec);
}

/* Another setting or mesh to try: the options with it, and how the
 * refusal's note names it ("--set zero=2", "--mesh pp=4,dp=2"). */
typedef struct Lever {
    Options o;
    const char *what;
} Lever;

static Lever *lever(Ctx *c, const Options *o, Lever *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char buf[128];
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    l->o = *o;
    l->what = intern(c->strings, buf);
    return l;
}

/* The levers that would lower the peak, each tried: recomputation, a ZeRO
 * level, a deeper pipeline on the same devices and on 2, 4 and 8 times as
 * many, a schedule that holds fewer microbatches, smaller microbatches,
 * sequence parallelism. At most 16. */
static int levers(Ctx *c, const Options *o, const TrainConfig *t, const Graph *g, Lever *out)
{
    const TrainConfig tc = *t;
    const char *mesh;
    int n = 0, data = 0, tensor = 0;
    for (int i = 0; i < g->mesh.naxes; i++) {
        data |= (g->mesh.axes[i].role == ROLE_DATA || g->mesh.axes[i].role == ROLE_FSDP) &&
                g->mesh.axes[i].size > 1;
        tensor |= g->mesh.axes[i].role == ROLE_TENSOR && g->mesh.axes[i].size > 1;
    }
    if (strcmp(tc.recompute, "selective") && strcmp(tc.recompute, "full"))
        lever(c, o, &out[n++], "--set recompute=selective")->o.recompute = "selective";
    if (strcmp(tc.recompute, "full"))
        lever(c, o, &out[n++], "--set recompute=full")->o.recompute = "full";
    for (int z = (int)tc.zero + 1; data && z <= 3; z++)
        lever(c, o, &out[n++], "--set zero=%d", z)->o.zero = z;
    if ((mesh = deeper_pipeline(c, &g->mesh, 2, 1)))
        lever(c, o, &out[n++], "--mesh %s", mesh)->o.mesh = mesh;
    for (int more = 2; more <= 8; more *= 2) /* more devices */
        if ((mesh = deeper_pipeline(c, &g->mesh, more, 0)))
            lever(c, o, &out[n++], "--mesh %s", mesh)->o.mesh = mesh;
    if (ir_pipeline_stages(&g->mesh) > 1 && sched_kind_of(&tc) == SCHED_GPIPE)
        lever(c, o, &out[n++], "--set schedule=1f1b")->o.schedule = "1f1b";
    lever(c, o, &out[n++], "--set microbatches=%lld", (long long)tc.microbatches * 2)
        ->o.microbatches = tc.microbatches * 2;
    if (tensor && !tc.sequence_parallel)
        lever(c, o, &out[n++], "--set sequence_parallel=true")->o.sequence_parallel = 1;
    return n;
}

static Loc budget_loc(const Graph *g)
{
    for (int i = 0; i < g->mesh.naxes; i++)
        if (g->mesh.axes[i].loc.line > 0)
            return g->mesh.axes[i].loc;
    return g->ops.len ? g->ops.data[0]->loc : LOC_NONE;
}

/* bytes as "79.65 GiB" or "41.2 MiB" into buf. */
static const char *size_str(char *buf, size_t n, double bytes)
{
    if (bytes >= GIB)
        snprintf(buf, n, "%.2f GiB", bytes / GIB);
    else
        snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    return buf;
}

/* The refusal of a plan over budget: the stage, peak and budget, the five
 * largest tensors, and every lever with the peak it would give. */
void pl_refuse(Ctx *c, const Options *o, const TrainConfig *tc, const Graph *g, const MemoryModel *mm,
               double budget)
{
    const StageMemory *sm = &mm->stage[mm->peak_stage];
    char a[32], b[32];
    char h[32], m[32], less[96] = "";
    if (pl_headroom_of(o) > 0)
        snprintf(less, sizeof less, " (%s less %s of --memory-headroom)",
                 size_str(m, sizeof m, drv_device_memory(o)), size_str(h, sizeof h, pl_headroom_of(o)));
    diag_error(&c->diag, budget_loc(g),
               "the plan does not fit: stage %d needs %s per device at the %s, over the %s of %s%s",
               mm->peak_stage, size_str(a, sizeof a, sm->peak), sm->moment,
               size_str(b, sizeof b, budget), o->device_memory > 0 ? "--device-memory" : o->gpu, less);
    for (int i = 0; i < sm->ntop; i++)
        diag_note(&c->diag, sm->top[i].loc, "%s (%s): %s%s", sm->top[i].name,
                  mem_cat_name(sm->top[i].cat),
                  size_str(a, sizeof a, sm->top[i].bytes * sm->top[i].count),
                  sm->top[i].count > 1 ? " over the microbatches in flight" : "");
    Lever lv[24];
    int n = levers(c, o, tc, g, lv), worse = 0;
    for (int i = 0; i < n; i++) { /* the ones that lower the peak: a lever that raises it is no help */
        ProbeResult r;
        probe(c, &lv[i].o, &r);
        if (r.ok && r.peak < sm->peak)
            diag_note(&c->diag, LOC_NONE, "%s: peak %s%s", lv[i].what, size_str(a, sizeof a, r.peak),
                      r.peak <= budget ? " (fits)" : "");
        worse += r.ok && r.peak >= sm->peak;
    }
    if (worse)
        diag_note(&c->diag, LOC_NONE, "%d other lever%s tried would not lower the peak", worse,
                  worse == 1 ? "" : "s");
    if (!o->plan_auto)
        diag_note(&c->diag, LOC_NONE, "--plan=auto --gpus N searches the meshes and settings of N "
                                      "devices for the fastest plan that fits");
}

/* ---- recompute = auto ---- */

/* The i-th layer of a stage (of n) at level k in [0, 2n]: k <= n: the first
 * k selective; k > n: all selective, the first k - n full. More recompute,
 * less memory, as k grows. */
static signed char auto_mode(int i, int n, int k)
{
    if (k <= n)
        return i < k ? RC_SELECTIVE : RC_NONE;
    return i < k - n ? RC_FULL : RC_SELECTIVE;
}

typedef struct Auto {
    int nlayers, nstages;
    int *stage_of;   /* by layer */
    int *index;      /* by layer: its place among its stage's layers */
    int *count;      /* by stage: layers */
    signed char *mode;
} Auto;

static void auto_apply(Options *o, Auto *a, const int *k)
{
    for (int l = 0; l < a->nlayers; l++) {
        int s = a->stage_of[l];
        a->mode[l] = s < 0 ? RC_NONE : auto_mode(a->index[l], a->count[s], k[s]);
    }
    o->recompute_layers = a->mode;
    o->nrecompute_layers = a->nlayers;
}

static void auto_layers(Ctx *c, Auto *a, const ProbeResult *r)
{
    a->nstages = r->nstages;
    a->nlayers = 0;
    for (int l = 0; l < 4096; l++)
        if (r->layer_stage[l] >= 0)
            a->nlayers = l + 1;
    a->stage_of = arena_alloc(c->arena, sizeof(int) * (size_t)(a->nlayers + 1));
    a->index = arena_alloc(c->arena, sizeof(int) * (size_t)(a->nlayers + 1));
    a->count = arena_alloc(c->arena, sizeof(int) * (size_t)(a->nstages + 1));
    a->mode = arena_alloc(c->arena, (size_t)a->nlayers + 1);
    memset(a->count, 0, sizeof(int) * (size_t)(a->nstages + 1));
    for (int l = 0; l < a->nlayers; l++) {
        a->stage_of[l] = r->layer_stage[l];
        a->index[l] = a->stage_of[l] >= 0 ? a->count[a->stage_of[l]]++ : 0;
    }
}

/* Per stage, the least recompute whose peak fits: a binary search over the
 * levels of all stages at once (a stage's peak depends on its own layers). */
int pl_choose_recompute(Ctx *c, Options *o, double budget)
{
    ProbeResult r;
    Auto a;
    o->recompute_layers = NULL;
    o->nrecompute_layers = 0;
    Options none = *o;
    none.recompute = "none";
    probe(c, &none, &r);
    if (!r.ok)
        return -1;
    auto_layers(c, &a, &r);
    int lo[1024], hi[1024], k[1024];
    for (int s = 0; s < a.nstages; s++)
        lo[s] = 0, hi[s] = r.stage_peak[s] <= budget ? 0 : 2 * a.count[s];
    for (int busy = 1; busy;) {
        busy = 0;
        for (int s = 0; s < a.nstages; s++)
            k[s] = lo[s] < hi[s] ? (lo[s] + hi[s]) / 2 : hi[s], busy |= lo[s] < hi[s];
        if (!busy)
            break;
        auto_apply(o, &a, k);
        probe(c, o, &r);
        for (int s = 0; r.ok && s < a.nstages; s++)
            if (lo[s] < hi[s])
                *(r.stage_peak[s] <= budget ? &hi[s] : &lo[s]) = k[s] + (r.stage_peak[s] > budget);
        if (!r.ok)
            return -1;
    }
    auto_apply(o, &a, hi);
    return 0;
}

/* "recompute = auto: stage 0: layers 0-3 full, 4-5 selective, 6-11 none" */
void pl_print_auto(FILE *f, const Options *o)
{
    static const char *const names[] = {"none", "selective", "full"};
    fprintf(f, "recompute = auto:");
    for (int l = 0; l < o->nrecompute_layers;) {
        int e = l;
        while (e + 1 < o->nrecompute_layers && o->recompute_layers[e + 1] == o->recompute_layers[l])
            e++;
        fprintf(f, "%s layer%s %d", l ? "," : "", e > l ? "s" : "", l);
        if (e > l)
            fprintf(f, "-%d", e);
        fprintf(f, " %s", names[o->recompute_layers[l]]);
        l = e + 1;
    }
    fputc('\n', f);
}

/* ---- --emit=memory ---- */

/* Before a plan is built: recompute = auto chosen, and the step's peak
 * checked against the budget (a plan over it is refused). */
int pl_fit_budget(Ctx *c, Options *o, const TrainConfig *tc, const Graph *g)
{
    double budget = pl_budget_of(o);
    if (!strcmp(tc->recompute, "auto")) {
        if (budget <= 0)
            return diag_error(&c->diag, budget_loc(g),
                              "recompute = auto needs a device budget (--gpu NAME or "
                              "--device-memory SIZE)"),
                   -1;
        if (pl_choose_recompute(c, o, budget) != 0)
            return -1;
        if (!o->emit || strcmp(o->emit, "memory"))
            pl_print_auto(stderr, o);
    }
    int builds = (o->emit && strcmp(o->emit, "ir")) || (!o->emit && o->out);
    if (budget <= 0 || !builds || (o->emit && (!strcmp(o->emit, "memory") || !strcmp(o->emit, "cost"))))
        return 0;
    MemoryModel mm;
    OneStep one;
    if (pl_model_in(c, o, &mm, &one) != 0)
        return -1;
    if (o->verbose)
        fprintf(stderr, "tcc: memory     peak %.2f GiB per device (stage %d) of %.2f GiB\n",
                mm.peak / GIB, mm.peak_stage, budget / GIB);
    return mm.peak > budget ? (pl_refuse(c, o, tc, one.g, &mm, budget), -1) : 0;
}

/* ---- --plan=auto (planner/rank.c) ---- */

