/* search.c: --plan=auto. Reads the model's shape and the cluster; ranks
 * candidate plans (meshes, microbatches, recomputation, ZeRO) with the cost
 * and memory models (planner/rank.c), compiles the best few through the
 * compile API to check each fits and to time it with the cost model, and
 * prints the choice with why it beat the others. */
#include "planner/planner.h"
#include "explain/explain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What the planner needs to know of the model: its layers, its global batch
 * (rows of the first data input) and the names of its mesh axes by role. */
typedef struct ModelShape {
    int layers;
    int64_t batch;
    const char *axis[ROLE_COUNT];
} ModelShape;

static int model_shape(Ctx *c, const Options *o, ModelShape *ms)
{
    Options q = *o;
    q.dump_after = q.stop_after = NULL;
    memset(ms, 0, sizeof *ms);
    Graph *g = drv_load(c, &q);
    if (!g || drv_apply_settings(c, &q, g) != 0)
        return -1;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->layer + 1 > ms->layers)
            ms->layers = op->layer + 1;
        if (op->kind == OP_INPUT && !ms->batch && op->res[0]->rank > 0)
            ms->batch = op->res[0]->shape[0];
    }
    for (int i = g->mesh.naxes - 1; i >= 0; i--)
        ms->axis[g->mesh.axes[i].role] = g->mesh.axes[i].name;
    if (!ms->batch)
        return fprintf(stderr, "tcc: error: --plan=auto: the model has no data input to split\n"), -1;
    return 0;
}

/* A compile in a context of its own whose diagnostics are kept in why[] (the
 * first line): the step of one microbatch on mesh, its memory and cost. */
typedef struct Trial {
    int ok;
    char why[160];
    double saved_layers; /* stage 0's: what a microbatch's forward holds in layers */
    char place[256];     /* the compiled plan's placement in words (cost_placement_text) */
    MemoryModel mm;
    CostModel cm;
    CostProfile prof;
} Trial;

static void trial(Ctx *c, const Options *o, const CostDevice *d, Trial *t)
{
    char *text = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&text, &len);
    Ctx *q = ctx_new(log ? log : stderr);
    for (int i = 0; i < c->defines.len; i++)
        VEC_PUSH(q->arena, q->defines, c->defines.data[i]);
    OneStep one;
    memset(t, 0, sizeof *t);
    /* recompute = auto: each layer's level chosen first, as fit_budget does */
    int auto_rc = o->recompute && !strcmp(o->recompute, "auto"), profile = o->repeat_limit > 0;
    Options to = *o;
    t->ok = (!auto_rc || pl_choose_recompute(q, &to, pl_budget_of(o)) == 0) &&
            pl_compile_one(q, &to, &one) == 0 &&
            mem_model(q, one.g, &one.s.train, one.local, &one.plan, 1, &t->mm) == 0 &&
            (profile ? cost_profile(q, one.g, &one.s.train, one.local, &one.plan, &t->mm, d, &t->prof)
                          : cost_model(q, one.g, &one.s.train, one.local, &one.plan, d, &t->cm)) == 0;
    if (t->ok) { /* the model's stages live in q's arena: keep the numbers only */
        t->saved_layers = t->mm.stage[0].saved_layers;
        cost_placement_text(&one.plan, d, t->place, sizeof t->place);
        t->mm.stage = NULL;
        memset(&t->cm.sched, 0, sizeof t->cm.sched);
        memset(&t->cm.times, 0, sizeof t->cm.times);
        t->cm.stage = NULL;
    }
    ctx_free(q);
    if (log)
        fclose(log);
    const char *e = text ? strstr(text, "error: ") : NULL;
    snprintf(t->why, sizeof t->why, "%.*s", e ? (int)strcspn(e + 7, "\n") : 0, e ? e + 7 : "");
    free(text);
}

static const char *rc_name(int rc)
{
    return rc == PLAN_RC_AUTO   ? "auto"
           : rc == RC_FULL      ? "full"
           : rc == RC_SELECTIVE ? "selective"
                                : "none";
}

static const char *sched_setting(SchedKind k)
{
    return k == SCHED_INTERLEAVED ? "interleaved"
           : k == SCHED_ZB_H1     ? "zb"
           : k == SCHED_GPIPE     ? "gpipe"
                                  : "1f1b";
}

/* A choice's mesh by name (pipeline, data, tensor: the tensor groups
 * innermost, in a node); NULL for a model without mesh axes (one device). */
static const char *choice_mesh(Ctx *c, const ModelShape *ms, const PlanChoice *ch)
{
    const char *spec = NULL;
    const char *names[3] = {ms->axis[ROLE_PIPELINE], ms->axis[ROLE_DATA], ms->axis[ROLE_TENSOR]};
    int sizes[3] = {ch->pp, ch->dp, ch->tp};
    for (int i = 0; i < 3; i++)
        if (names[i])
            spec = arena_printf(c->arena, "%s%s%s=%d", spec ? spec : "", spec ? "," : "", names[i],
                                sizes[i]);
    return spec ? intern(c->strings, spec) : NULL;
}

/* o set to a choice: its mesh and its train settings. */
static Options choice_options(Ctx *c, const ModelShape *ms, const PlanChoice *ch, const Options *o)
{
    Options q = *o;
    q.mesh = choice_mesh(c, ms, ch);
    q.microbatches = ch->m;
    q.recompute = rc_name(ch->rc);
    q.zero = ch->zero;
    if (ms->axis[ROLE_TENSOR])
        q.sequence_parallel = ch->tp > 1;
    if (ch->pp > 1) {
        q.schedule = sched_setting(ch->sched);
        if (ch->sched == SCHED_INTERLEAVED)
            q.virtual_stages = ch->v;
    }
    return q;
}

/* The mesh and --set settings of a choice as the command line would say them. */
static void choice_args(Ctx *c, const ModelShape *ms, const PlanChoice *ch, const char **mesh,
                        const char **sets, int *nsets)
{
    *mesh = choice_mesh(c, ms, ch);
    int n = 0;
    sets[n++] = arena_printf(c->arena, "microbatches=%d", ch->m);
    sets[n++] = arena_printf(c->arena, "recompute=%s", rc_name(ch->rc));
    sets[n++] = arena_printf(c->arena, "zero=%d", ch->zero);
    if (ms->axis[ROLE_TENSOR])
        sets[n++] = ch->tp > 1 ? "sequence_parallel=true" : "sequence_parallel=false";
    if (ch->pp > 1) {
        sets[n++] = arena_printf(c->arena, "schedule=%s", sched_setting(ch->sched));
        if (ch->sched == SCHED_INTERLEAVED)
            sets[n++] = arena_printf(c->arena, "virtual_stages=%d", ch->v);
    }
    *nsets = n;
}

static void print_choice(FILE *f, int rank, const PlanChoice *ch)
{
    char sched[32];
    if (ch->pp == 1)
        snprintf(sched, sizeof sched, "-");
    else if (ch->sched == SCHED_INTERLEAVED)
        snprintf(sched, sizeof sched, "interleaved/%d", ch->v);
    else
        snprintf(sched, sizeof sched, "%s", sched_kind_name(ch->sched));
    fprintf(f, "  %d. tp %-3d pp %-4d dp %-6d %3d x %d rows, zero %d, recompute %-9s %-14s "
               "step %9.4g s  MFU %5.1f%%  peak %6.2f GiB\n",
            rank, ch->tp, ch->pp, ch->dp, ch->m, ch->mbs, ch->zero, rc_name(ch->rc), sched,
            ch->step_s, 100 * ch->mfu, ch->peak / GIB);
}

/* Why the best of a (tp, pp) family lost to the winner w: its largest gap. */
static void family_reason(const PlanSpace *sp, const PlanChoice *best, const PlanChoice *w,
                          char *buf, size_t n)
{
    double gaps[4] = {best->bubble_s - w->bubble_s, best->comm_s - w->comm_s,
                      best->compute_s - w->compute_s, best->opt_s - w->opt_s};
    int k = 0;
    for (int i = 1; i < 4; i++)
        if (gaps[i] > gaps[k])
            k = i;
    if (best->tp > sp->d->per_node)
        snprintf(buf, n, "tensor-parallel traffic across nodes (tp %d > %d per node): step %.4g s",
                 best->tp, sp->d->per_node, best->step_s);
    else if (k == 0)
        snprintf(buf, n, "slower because of the bubble: %.4g s against %.4g s (step %.4g s)",
                 best->bubble_s, w->bubble_s, best->step_s);
    else if (k == 1)
        snprintf(buf, n, "slower because of exposed data-parallel communication: %.4g s against "
                         "%.4g s (step %.4g s)", best->comm_s, w->comm_s, best->step_s);
    else if (k == 2)
        snprintf(buf, n, "slower compute per device (%s): %.4g s against %.4g s (step %.4g s)",
                 best->rc != RC_NONE ? "recomputation, smaller GEMMs" : "smaller GEMMs, more "
                 "tensor-parallel collectives", best->compute_s, w->compute_s, best->step_s);
    else
        snprintf(buf, n, "slower optimizer (less sharded): %.4g s (step %.4g s)", best->opt_s,
                 best->step_s);
}

static void print_families(FILE *f, const PlanSpace *sp, const PlanChoice *all, int n,
                           const PlanChoice *w)
{
    fprintf(f, "families (tensor x pipeline) not chosen:\n");
    int most = 1;
    for (int k = 0; k < sp->nprof; k++) {
        int tp = sp->prof[k].tp;
        most = tp > most ? tp : most;
        for (int pp = 1; pp <= sp->gpus / tp; pp++) {
            const PlanChoice *best = NULL, *least = NULL;
            int any = 0;
            for (int i = 0; i < n; i++) {
                const PlanChoice *c = &all[i];
                if (c->tp != tp || c->pp != pp)
                    continue;
                any = 1;
                if (c->status == PLAN_FITS && (!best || c->step_s < best->step_s))
                    best = c;
                if (c->status == PLAN_OVER && (!least || c->peak < least->peak))
                    least = c;
            }
            if ((sp->gpus / tp) % pp || (tp == w->tp && pp == w->pp) || (pp > 1 && pp > sp->layers) ||
                (pp > 1 && !(sp->axes & 4)))
                continue;
            char why[256];
            const CostProfile *P = NULL;
            for (int i = 0; i < sp->nprof; i++)
                if (sp->prof[i].tp == tp)
                    P = &sp->prof[i];
            if (P && !P->ok)
                snprintf(why, sizeof why, "does not divide: %s", P->why);
            else if (!best && least)
                snprintf(why, sizeof why, "does not fit: at least %.2f GiB per device",
                         least->peak / GIB);
            else if (!any || !best)
                snprintf(why, sizeof why, "does not divide: the batch of %lld rows over %d data "
                                          "ranks", (long long)sp->batch, sp->gpus / tp / pp);
            else
                family_reason(sp, best, w, why, sizeof why);
            fprintf(f, "  tp %-3d pp %-4d %s\n", tp, pp, why);
        }
    }
    if (most < sp->gpus)
        fprintf(f, "  tp > %d: not considered: tensor-parallel groups over more than two nodes\n",
                most);
}

static void explain(FILE *f, const PlanSpace *sp, const PlanChoice *all, int n, const PlanChoice *w)
{
    double t = w->step_s;
    fprintf(f, "why this plan:\n");
    fprintf(f, "  its step: compute %.1f%%, pipeline bubble %.1f%%, exposed data-parallel "
               "communication %.1f%%, optimizer %.1f%%\n",
            100 * w->compute_s / t, 100 * w->bubble_s / t, 100 * w->comm_s / t, 100 * w->opt_s / t);
    fprintf(f, "  memory: %.2f of %.2f GiB per device (%.0f%% used)\n", w->peak / GIB, /* less headroom */
            sp->budget / GIB, 100 * w->peak / sp->budget);
    /* what binds: the faster candidates of any layout that do not fit */
    const PlanChoice *faster = NULL;
    for (int i = 0; i < n; i++)
        if (all[i].status == PLAN_OVER && all[i].step_s < t && (!faster || all[i].step_s < faster->step_s))
            faster = &all[i];
    if (faster)
        fprintf(f, "  memory binds: the fastest layout over it (tp %d, pp %d, dp %d, %d x %d rows, "
                   "zero %d, recompute %s) would take %.4g s but needs %.2f GiB\n",
                faster->tp, faster->pp, faster->dp, faster->m, faster->mbs, faster->zero,
                rc_name(faster->rc), faster->step_s, faster->peak / GIB);
    else
        fprintf(f, "  memory does not bind: no faster layout was over the budget\n");
    if (w->bubble_s > w->comm_s && w->bubble_s > 0.02 * t)
        fprintf(f, "  the bubble binds next: %d microbatches of %d rows per data rank (the batch "
                   "of %lld rows over %d data ranks)\n",
                w->m, w->mbs, (long long)sp->batch, w->dp);
    else if (w->comm_s > 0.02 * t)
        fprintf(f, "  exposed communication binds next: the gradients' reduction over %d data "
                   "ranks outlasts the last backward\n", w->dp);
    else
        fprintf(f, "  compute binds: %.1f%% of the step is the devices' own work\n",
                100 * w->compute_s / t);
    for (int i = 0; i < n; i++)
        if (all[i].status == PLAN_FITS && (all[i].tp != w->tp || all[i].pp != w->pp)) {
            fprintf(f, "  the fastest other layout (tp %d, pp %d) is predicted %.1f%% %s\n",
                    all[i].tp, all[i].pp, 100 * fabs(all[i].step_s / t - 1),
                    all[i].step_s >= t ? "slower" : "faster (it lost when compiled)");
            break;
        }
}

static double plan_ms(void);

#define PLAN_CHECKS 3 /* layouts compiled to check the search's best */

/* Candidate i has the mesh and rows of one already compiled that fit (only
 * ZeRO, recompute or the schedule differ): compiling it tells little more. */
static int same_layout(const PlanChoice *all, const char *fitted, int i)
{
    for (int j = 0; j < i; j++)
        if (fitted[j] && all[j].tp == all[i].tp && all[j].pp == all[i].pp &&
            all[j].mbs == all[i].mbs)
            return 1;
    return 0;
}

/* The profile at tensor-parallel size tp (*P; P->ok 0 with why when it does
 * not compile): two data ranks, so the gradients' shardings are a
 * data-parallel step's; the step three times: without recomputation and ZeRO
 * (times, what is held), selective under ZeRO 1 (what is held then), full
 * (recompute's times). */
static void profile_at(Ctx *c, const Options *o, const ModelShape *ms, const CostDevice *d, int tp,
                       CostProfile *P)
{
    int dp = ms->axis[ROLE_DATA] && ms->batch % 2 == 0 && o->gpus >= 2 * tp ? 2 : 1;
    char mesh[128] = "";
    if (dp > 1)
        snprintf(mesh, sizeof mesh, "%s=%d", ms->axis[ROLE_DATA], dp);
    if (tp > 1)
        snprintf(mesh + strlen(mesh), sizeof mesh - strlen(mesh), "%s%s=%d", dp > 1 ? "," : "",
                 ms->axis[ROLE_TENSOR], tp);
    static const char *const rc[3] = {"none", "selective", "full"};
    static const int zero[3] = {0, 1, 0};
    Trial t[3];
    for (int k = 0; k < 3; k++) {
        Options q = *o;
        q.mesh = *mesh ? intern(c->strings, mesh) : NULL;
        q.repeat_limit = 1;
        q.microbatches = ms->batch / dp;
        q.recompute = rc[k];
        q.zero = dp > 1 ? zero[k] : 0;
        q.sequence_parallel = tp > 1;
        q.schedule = "1f1b";
        trial(c, &q, d, &t[k]);
    }
    *P = t[0].prof;
    P->tp = tp;
    P->ok = t[0].ok && t[1].ok && t[2].ok;
    snprintf(P->why, sizeof P->why, "%s", !t[0].ok ? t[0].why : !t[1].ok ? t[1].why : t[2].why);
    /* held per microbatch by a layer, by the memory model of each (one layer, one row) */
    P->act_none = t[0].saved_layers, P->act_sel = t[1].saved_layers, P->act_full = t[2].saved_layers;
    P->t_r = t[2].prof.t_r, P->t_rsel = t[1].prof.t_r;
    P->params1 = dp > 1 ? t[1].prof.params : P->params;
}

/* Why no candidate is offered: none spreads the devices (n 0), or none fits. */
static int no_candidate(Ctx *c, const Options *o, const ModelShape *ms, const PlanSpace *sp,
                        const PlanChoice *all, int n)
{
    if (!n) {
        diag_error(&c->diag, LOC_NONE, "--plan=auto: no layout spreads %d devices over the "
                   "model's %s%s%s axis", o->gpus, ms->axis[ROLE_DATA] ? "data" : "(no data)",
                   ms->axis[ROLE_TENSOR] ? ", tensor" : ", (no tensor)",
                   ms->axis[ROLE_PIPELINE] ? " and pipeline" : " and (no pipeline)");
        diag_note(&c->diag, LOC_NONE, "a layout needs tensor x pipeline x data = %d, with the "
                  "batch of %lld rows a multiple of data x rows per microbatch, at most one "
                  "pipeline stage per layer (%d), tensor sizes a power of two up to %d, and every "
                  "axis at most 65536", o->gpus, (long long)ms->batch, ms->layers, 2 * sp->d->per_node);
        return -1;
    }
    diag_error(&c->diag, LOC_NONE, "--plan=auto: no layout of %d devices fits %.2f GiB",
               o->gpus, sp->budget / GIB);
    const PlanChoice *least = NULL;
    for (int i = 0; i < n; i++)
        if (all[i].status == PLAN_OVER && (!least || all[i].peak < least->peak))
            least = &all[i];
    if (least)
        diag_note(&c->diag, LOC_NONE, "the least memory: %.2f GiB (tp %d, pp %d, dp %d)",
                  least->peak / GIB, least->tp, least->pp, least->dp);
    return -1;
}

/* The fastest that the compiled plan's own models confirm: the first
 * PLAN_CHECKS distinct layouts predicted to fit are compiled, and the
 * fastest compiled one that fits wins (*won, its index returned; -1 after
 * reporting when none does). A candidate that does not fit when compiled
 * teaches how far the analytic peak was under for its (tensor, pipeline)
 * family: the family's next ones must fit with that margin. */
static int check_best(Ctx *c, const Options *o, const ModelShape *ms, const PlanSpace *sp,
                      const PlanChoice *all, int nfit, Trial *won)
{
    struct { int tp, pp; double under; } learnt[8];
    int nlearnt = 0, best = -1, checked = 0;
    char *fitted = arena_alloc(c->arena, (size_t)nfit + 1); /* zeroed */
    for (int i = 0, tries = 0; i < nfit && tries < 8 && checked < PLAN_CHECKS; i++) {
        double under = 1;
        for (int k = 0; k < nlearnt; k++)
            if (learnt[k].tp == all[i].tp && learnt[k].pp == all[i].pp)
                under = learnt[k].under;
        if (all[i].peak * under > sp->budget || same_layout(all, fitted, i))
            continue;
        tries++;
        Options q = choice_options(c, ms, &all[i], o);
        Trial t;
        trial(c, &q, sp->d, &t);
        if (!t.ok || t.mm.peak > sp->budget) {
            fprintf(stderr, "plan: candidate %d %s when compiled%s%s%s\n", i + 1,
                    t.ok ? "does not fit" : "fails", t.ok ? "" : ": ", t.ok ? "" : t.why,
                    t.ok ? arena_printf(c->arena, " (%.2f GiB against %.2f predicted)",
                                        t.mm.peak / GIB, all[i].peak / GIB) : "");
            if (t.ok && nlearnt < 8)
                learnt[nlearnt].tp = all[i].tp, learnt[nlearnt].pp = all[i].pp,
                learnt[nlearnt++].under = t.mm.peak / all[i].peak;
            continue;
        }
        checked++;
        fitted[i] = 1;
        fprintf(stderr, "plan: candidate %d compiled: step %.4g s, peak %.2f GiB (predicted %.4g s, "
                        "%.2f GiB)\n", i + 1, t.cm.step_s, t.mm.peak / GIB, all[i].step_s,
                all[i].peak / GIB);
        if (best < 0 || t.cm.step_s < won->cm.step_s)
            best = i, *won = t;
    }
    if (best < 0)
        diag_error(&c->diag, LOC_NONE, "--plan=auto: none of the best candidates fits when compiled");
    return best;
}

/* The winner recomputes uniformly: the compiler's per-layer choice
 * (recompute = auto, from the compiled plan's own memory model) may fit
 * with less recomputation than the analytic peak allowed; *ch and *won
 * take it when it is faster. */
static void try_auto_recompute(Ctx *c, const Options *o, const ModelShape *ms, const PlanSpace *sp,
                               int best, PlanChoice *ch, Trial *won)
{
    if (ch->rc != RC_SELECTIVE && ch->rc != RC_FULL)
        return;
    PlanChoice a = *ch;
    a.rc = PLAN_RC_AUTO;
    Options q = choice_options(c, ms, &a, o);
    Trial t;
    trial(c, &q, sp->d, &t);
    int better = t.ok && t.mm.peak <= sp->budget && t.cm.step_s < won->cm.step_s;
    fprintf(stderr, "plan: candidate %d with recompute = auto: %s", best + 1,
            !t.ok ? "fails: " : better ? "step " : "no faster: step ");
    if (t.ok)
        fprintf(stderr, "%.4g s, peak %.2f GiB\n", t.cm.step_s, t.mm.peak / GIB);
    else
        fprintf(stderr, "%s\n", t.why);
    if (better)
        ch->rc = PLAN_RC_AUTO, *won = t;
}

/* The choice, the families' best and (--explain) why it won, as the
 * command line would say it. */
static void report_choice(Ctx *c, const Options *o, const ModelShape *ms, const PlanSpace *sp,
                          const PlanChoice *all, int n, int best, const Trial *won)
{
    const char *mesh, *sets[8];
    int nsets;
    choice_args(c, ms, &all[best], &mesh, sets, &nsets);
    print_families(stderr, sp, all, n, &all[best]);
    if (o->explain) {
        explain(stderr, sp, all, n, &all[best]);
        fprintf(stderr, "  placement, innermost first: %s\n", won->place);
    }
    fprintf(stderr, "plan: chose candidate %d:%s%s", best + 1, mesh ? " --mesh " : "",
            mesh ? mesh : "");
    for (int k = 0; k < nsets; k++)
        fprintf(stderr, " --set %s", sets[k]);
    fprintf(stderr, "\nplan: compiled: step %.4g s, MFU %.1f%%, peak %.2f GiB (predicted %.4g s, "
                    "%.2f GiB)\n",
            won->cm.step_s, 100 * won->cm.mfu, won->mm.peak / GIB, all[best].step_s,
            all[best].peak / GIB);
}

/* Choose the plan: profiles at each tensor-parallel size, the analytic search,
 * the best checked by compiling it; then o says that plan. */
int pl_plan_auto(Ctx *c, Options *o)
{
    double t0 = plan_ms();
    ModelShape ms;
    CostDevice d;
    cost_device_of_cluster(&o->cluster_spec, &d);
    if (model_shape(c, o, &ms) != 0)
        return -1;
    CostProfile prof[16];
    int nprof = 0;
    for (int tp = 1; tp <= o->gpus && tp <= 2 * d.per_node && nprof < 16; tp *= 2)
        if (!(o->gpus % tp || (tp > 1 && !ms.axis[ROLE_TENSOR])))
            profile_at(c, o, &ms, &d, tp, &prof[nprof++]);
    PlanSpace sp = {.gpus = o->gpus, .layers = ms.layers, .batch = ms.batch, .d = &d,
                    .budget = pl_budget_of(o), .prof = prof, .nprof = nprof};
    sp.axes = (ms.axis[ROLE_DATA] ? 1 : 0) | (ms.axis[ROLE_TENSOR] ? 2 : 0) |
              (ms.axis[ROLE_PIPELINE] ? 4 : 0);
    PlanChoice *all;
    int n;
    pl_search_space(c->arena, &sp, &all, &n);
    double searched = plan_ms() - t0;
    int nfit = 0;
    while (nfit < n && all[nfit].status == PLAN_FITS)
        nfit++;
    fprintf(stderr, "plan: %d candidates for %d %s on %d devices in %.0f ms, %d fit %.2f GiB", n,
            ms.layers, ms.layers == 1 ? "layer" : "layers", o->gpus, searched, nfit,
            drv_device_memory(o) / GIB);
    if (pl_headroom_of(o) > 0)
        fprintf(stderr, " less %.2f GiB of headroom", pl_headroom_of(o) / GIB);
    fputc('\n', stderr);
    if (!nfit)
        return no_candidate(c, o, &ms, &sp, all, n);
    fprintf(stderr, "the five fastest predicted to fit:\n");
    for (int i = 0; i < nfit && i < 5; i++)
        print_choice(stderr, i + 1, &all[i]);
    Trial won = {0};
    int best = check_best(c, o, &ms, &sp, all, nfit, &won);
    if (best < 0)
        return -1;
    try_auto_recompute(c, o, &ms, &sp, best, &all[best], &won);
    report_choice(c, o, &ms, &sp, all, n, best, &won);
    *o = choice_options(c, &ms, &all[best], o);
    return 0;
}

static double plan_ms(void) { return drv_now_ms(); }

