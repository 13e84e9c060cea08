/* cost.c: the cost model of one training step. Reads the plan of ONE
 * microbatch's step (as the memory model does: every instruction with its
 * microbatch, schedule piece and FLOPs), the pipeline schedule and a device
 * with its links; writes the step's time per stage (compute, exposed
 * communication, bubble, optimizer), tokens/s, model FLOPs utilization and
 * hardware TFLOP/s per device.
 *
 * Key idea: a piece of the schedule (the forward of chunk c, say) costs the
 * same for every microbatch, so the plan of one microbatch gives every
 * piece's time; the schedule simulator (passes/schedule.c) then places the
 * pieces of all microbatches on the stages. Inside a piece, compute and
 * collectives run on two streams as the cuda runtime runs them: a collective
 * starts when the compute before it is done and the communication stream is
 * free, and compute waits for it where it first touches its tensors. The
 * shared instructions of the microbatches (gradient sums and reductions) run
 * once, in the last microbatch's pieces; what they leave on the
 * communication stream overlaps the rest of the backward and delays the
 * optimizer. docs/cost.md has every formula and constant. */
#include "model/cost_stage.h"

#include "../plan/plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the device ---- */

void cost_device_of_cluster(const ClusterSpec *c, CostDevice *d)
{
    memset(d, 0, sizeof *d);
    d->name = c->gpu->name;
    d->what = c->what;
    d->peak16 = c->gpu->bf16_tflops * 1e12;
    d->peak32 = c->gpu->f32_tflops * 1e12;
    d->mem_bw = c->gpu->hbm_gbs * 1e9;
    d->intra_bw = c->nvlink_gbs * 1e9;
    d->inter_bw = c->network_gbs * 1e9;
    d->intra_lat = c->nvlink_us * 1e-6;
    d->inter_lat = c->network_us * 1e-6;
    d->per_node = c->gpus_per_node;
    d->k = c->k;
}

/* ---- what each instruction costs ---- */

CostLink cost_link(const CostDevice *d, int64_t span)
{
    if (span < d->per_node)
        return (CostLink){d->intra_bw * d->k.link_eff, d->intra_lat};
    return (CostLink){d->inter_bw * d->k.link_eff, d->inter_lat};
}

int cost_placement_text(const Plan *p, const CostDevice *d, char *buf, size_t n)
{
    int order[PLAN_MAX_AXES], crossing = -1;
    size_t at = 0;
    buf[0] = 0;
    if (p->naxes > PLAN_MAX_AXES)
        return -1;
    plan_axes_by_stride(p, order);
    for (int k = 0; k < p->naxes && k < PLAN_MAX_AXES && at < n; k++) {
        const PlanAxis *a = &p->axes[order[k]];
        int64_t span = (int64_t)(a->size - 1) * plan_axis_stride(p, order[k]);
        int across = a->size > 1 && span >= d->per_node;
        if (across && crossing < 0 && a->role &&
            (!strcmp(a->role, "tensor") || !strcmp(a->role, "sequence")))
            crossing = order[k];
        at += (size_t)snprintf(buf + at, n - at, "%s%s=%d%s", k ? ", " : "", a->name, a->size,
                               a->size < 2 ? "" : across ? " (across servers)" : " (in a server)");
    }
    return crossing;
}

double cost_all_reduce(double S, int n, CostLink l)
{
    if (n <= 1)
        return 0;
    double ring = 2.0 * (n - 1) / n * S / l.bw + 2.0 * (n - 1) * l.lat;
    double tree = 2.0 * S / l.bw + 2.0 * ceil(log2(n)) * l.lat;
    return ring < tree ? ring : tree;
}

double cost_gather(double S, int n, CostLink l)
{
    return n <= 1 ? 0 : (double)(n - 1) / n * S / l.bw + (n - 1) * l.lat;
}

/* The group along axes of the mesh (placed as the plan says, plan_axis_stride):
 * its members' ranks span (size - 1) x stride over its axes. */
static CostLink group_link(const Plan *p, const CostDevice *d, const int8_t *axes, int naxes)
{
    int64_t span = 0;
    for (int i = 0; i < naxes; i++)
        span += (int64_t)(p->axes[axes[i]].size - 1) * plan_axis_stride(p, axes[i]);
    return cost_link(d, span);
}

/* Ring and tree algorithms (docs/cost.md): S the bytes of a device's input
 * (all-reduce, reduce-scatter) or output (all-gather), n members. */
double cost_coll_time(const Plan *p, const CostDevice *d, const PlanInstr *in)
{
    if (d->cpu)
        return cost_cpu_coll_time(p, d, in);
    const PlanColl *c = &in->coll;
    int n = (int)plan_axes_size(p, c->axes, c->naxes);
    if (n <= 1 && c->op != PC_SEND && c->op != PC_RECV)
        return 0;
    CostLink l = group_link(p, d, c->axes, c->naxes);
    double S_in = (double)p->tensors[in->args[0]].bytes;
    double S_out = in->nargs > 1 ? (double)p->tensors[in->args[1]].bytes : S_in;
    switch (c->op) {
    case PC_ALL_REDUCE:
    case PC_ALL_REDUCE_MAX: return cost_all_reduce(S_in, n, l);
    case PC_ALL_GATHER: return cost_gather(S_out, n, l);
    case PC_REDUCE_SCATTER:
    case PC_ALL_TO_ALL: return cost_gather(S_in, n, l);
    case PC_SLICE: return (S_in + S_out) / (d->mem_bw * d->k.mem_eff);
    case PC_SEND:
    case PC_RECV: return S_in / l.bw + l.lat;
    default: return 0;
    }
}

static double dim_eff(const CostConsts *k, int64_t x) { return (double)x / ((double)x + k->gemm_dim); }

static double peak_of(const CostDevice *d, PlanDType t)
{
    return t == PD_BF16 || t == PD_F16 ? d->peak16 : t == PD_F64 ? d->peak32 / 2 : d->peak32;
}

/* Bytes an instruction reads and writes: each tensor it names once. */
static double instr_bytes(const Plan *p, const PlanInstr *in)
{
    double b = 0;
    for (int a = 0; a < in->nargs; a++)
        b += (double)p->tensors[in->args[a]].bytes;
    if (in->kind == PI_GEMM)
        b += (double)(p->tensors[in->gemm.a].bytes + p->tensors[in->gemm.b].bytes +
                      p->tensors[in->gemm.c].bytes);
    return b;
}

/* Compute time of one non-collective instruction: the larger of its FLOPs at
 * the reachable rate and its bytes at the reachable bandwidth, plus a launch. */
double cost_compute_time(const Plan *p, const CostDevice *d, const PlanInstr *in)
{
    if (d->cpu)
        return cost_cpu_compute_time(p, d, in);
    const CostConsts *k = &d->k;
    double mem = instr_bytes(p, in) / (d->mem_bw * k->mem_eff), fl = 0;
    if (in->kind == PI_GEMM) {
        const PlanGemm *g = &in->gemm;
        double eff = k->gemm_eff * dim_eff(k, g->m) * dim_eff(k, g->n) * dim_eff(k, g->k);
        fl = in->flops / (peak_of(d, p->tensors[g->a].dtype) * eff);
    } else if (in->kind == PI_KERNEL && in->flops > 0) {
        PlanDType t = in->nargs ? p->tensors[in->args[0]].dtype : PD_F32;
        fl = in->flops / (peak_of(d, t) * k->attn_eff);
    } else if (in->kind == PI_COPY) {
        mem = 2.0 * (double)p->tensors[in->args[0]].bytes / (d->mem_bw * k->mem_eff);
    }
    return (fl > mem ? fl : mem) + k->launch_s;
}

/* ---- a stage's pieces, each run on two streams ---- */


static int is_p2p(const PlanInstr *in)
{
    return in->kind == PI_COLL && (in->coll.op == PC_SEND || in->coll.op == PC_RECV);
}

static void touch_max(const Plan *p, const PlanInstr *in, const double *busy, double *t)
{
    for (int a = 0; a < in->nargs; a++)
        if (busy[in->args[a]] > *t)
            *t = busy[in->args[a]];
    if (in->kind == PI_GEMM) {
        int g[3] = {in->gemm.a, in->gemm.b, in->gemm.c};
        for (int i = 0; i < 3; i++)
            if (busy[g[i]] > *t)
                *t = busy[g[i]];
    }
    (void)p;
}

/* Calls f(t, user) for every tensor instruction in names. */
static void each_tensor(const PlanInstr *in, void (*f)(int, void *), void *user)
{
    for (int a = 0; a < in->nargs; a++)
        f(in->args[a], user);
    if (in->kind == PI_GEMM) {
        f(in->gemm.a, user), f(in->gemm.b, user), f(in->gemm.c, user);
        if (in->gemm.epilogue == PE_BIAS)
            f(in->gemm.bias, user);
    }
}

typedef struct Flow {
    int pos, *first;   /* the position at hand; by tensor: its first toucher (its maker) */
    char *derived;     /* by tensor: made from a microbatch's data */
    char *feeds;       /* by tensor: read by a microbatch's work */
    int any_in, any_out;
} Flow;

static void flow_first(int t, void *u)
{
    Flow *f = u;
    if (f->first[t] < 0)
        f->first[t] = f->pos;
}

static void flow_in(int t, void *u)
{
    Flow *f = u;
    if (f->first[t] != f->pos)
        f->any_in |= f->derived[t];
    else
        f->any_out |= f->feeds[t];
}

static void flow_made(int t, void *u) /* its outputs are made from a microbatch's data */
{
    Flow *f = u;
    if (f->first[t] == f->pos)
        f->derived[t] = 1;
}

static void flow_read(int t, void *u) /* its inputs feed a microbatch's work */
{
    Flow *f = u;
    if (f->first[t] != f->pos)
        f->feeds[t] = 1;
}

/* Which shared instructions (mb -1) are really each microbatch's: the plan
 * of one microbatch marks the collectives that partitioning adds (and the
 * vocabulary-parallel loss's pieces) as shared, though each microbatch has
 * its own. A loop plan says so itself (`when`: every microbatch). Else an
 * instruction is a microbatch's when it has a microbatch, or when it reads
 * a tensor made from a microbatch's data and what it makes is read by a
 * microbatch's work (a gradient's reduction feeds only the optimizer; a
 * weight's gather reads no microbatch's data). */
static void per_microbatch(Arena *a, Stage *st)
{
    const Plan *p = st->p;
    int n = st->sp.n, nt = p->ntensors;
    Flow f = {0};
    f.first = arena_alloc(a, sizeof(int) * (size_t)(nt + 1));
    f.derived = arena_alloc(a, (size_t)nt + 1);
    f.feeds = arena_alloc(a, (size_t)nt + 1);
    st->per_mb = arena_alloc(a, (size_t)n + 1);
    st->chain = arena_alloc(a, (size_t)n + 1);
    memset(st->chain, 0, (size_t)n + 1);
    for (int t = 0; t < nt; t++)
        f.first[t] = -1, f.derived[t] = 0, f.feeds[t] = 0;
    for (int i = 0; i < n; i++) /* makers, and what microbatch data flows into */
        f.pos = i, each_tensor(&p->instrs[st->sp.instr[i]], flow_first, &f);
    for (int i = 0; i < n; i++) {
        const PlanInstr *in = &p->instrs[st->sp.instr[i]];
        f.pos = i, f.any_in = 0;
        each_tensor(in, flow_in, &f);
        if (in->mb >= 0 || f.any_in)
            each_tensor(in, flow_made, &f);
    }
    for (int i = n - 1; i >= 0; i--) { /* readers, last first */
        const PlanInstr *in = &p->instrs[st->sp.instr[i]];
        f.pos = i, f.any_in = f.any_out = 0;
        each_tensor(in, flow_in, &f);
        st->per_mb[i] = (char)(in->mb >= 0 || (f.any_in && f.any_out && in->phase != PH_OPT));
        if (p->nsched > 0) /* a loop plan says it: what runs for every microbatch */
            st->per_mb[i] = in->when == PW_EVERY;
        if (in->kind == PI_COLL && in->coll.op == PC_RECV) { /* the readers came first here */
            int v = p->tensors[in->args[0]].value; /* a weight (a tied one's cast) or its */
            const Value *val = v >= 0 && v < st->local->values.len ? st->local->values.data[v] : NULL;
            st->chain[i] = f.feeds[in->args[0]] && !(val && (st->grad[v] || mem_weight_value(val)));
        }
        if (st->per_mb[i])
            each_tensor(in, flow_read, &f);
    }
}

/* Positions [from, to) of the stage's program; shared: with the instructions
 * shared by the microbatches (the last microbatch's run); overlap: 0 runs
 * collectives inline (the CPU runtime: blocking). */
static Run run_range(Stage *st, int from, int to, int shared)
{
    const Plan *p = st->p;
    int overlap = !st->d->cpu;
    double ct = 0, cm = 0, cs = 0, own_end = 0;
    Run r = {0};
    for (int i = from; i < to; i++) {
        const PlanInstr *in = &p->instrs[st->sp.instr[i]];
        int mine = st->per_mb[i];
        if (!mine && !shared)
            continue;
        if (is_p2p(in) && mine) { /* a microbatch's received input is the simulator's message; */
            double t = cost_coll_time(p, st->d, in); /* a tied weight's cast or gradient part */
            if (st->chain[i] && t > st->p2p)        /* goes on a channel of its own */
                st->p2p = t;
            continue;
        }
        if (in->kind == PI_COLL && in->coll.op != PC_SLICE) { /* also a step's own message */
            double dur = cost_coll_time(p, st->d, in);
            if (!overlap) {
                ct += dur, r.exposed += dur;
                continue;
            }
            double *stream = mine ? &cm : &cs, start = ct > *stream ? ct : *stream;
            touch_max(p, in, st->busy, &start);
            *stream = start + dur;
            for (int a = 0; a < in->nargs; a++)
                st->busy[in->args[a]] = *stream;
            if (!mine)
                r.once += dur;
            else if (cm > own_end)
                own_end = cm;
            continue;
        }
        double start = ct;
        touch_max(p, in, st->busy, &start);
        r.exposed += start - ct;
        double dur = in->kind == PI_COLL ? cost_coll_time(p, st->d, in) : cost_compute_time(p, st->d, in);
        ct = start + dur;
        r.compute += dur;
    }
    r.end = ct > own_end ? ct : own_end;
    r.backlog = cs > r.end ? cs - r.end : 0;
    /* clear what this run marked */
    for (int i = from; i < to; i++) {
        const PlanInstr *in = &p->instrs[st->sp.instr[i]];
        for (int a = 0; a < in->nargs; a++)
            st->busy[in->args[a]] = 0;
    }
    return r;
}

void cost_stage_runs(Arena *a, Stage *st, const Schedule *sc, int s)
{
    mem_stage_pieces(a, st->p, sc, s, &st->sp);
    per_microbatch(a, st);
    int np = st->sp.npieces;
    st->from = arena_alloc(a, sizeof(int) * (size_t)(np + 3));
    st->to = arena_alloc(a, sizeof(int) * (size_t)(np + 3));
    for (int k = 0; k < np + 2; k++)
        st->from[k] = st->sp.n, st->to[k] = 0;
    for (int i = 0; i < st->sp.n; i++) {
        int k = st->sp.piece[i] + 1;
        if (i < st->from[k])
            st->from[k] = i;
        st->to[k] = i + 1;
    }
    st->busy = arena_alloc(a, sizeof(double) * (size_t)(st->p->ntensors + 1));
    memset(st->busy, 0, sizeof(double) * (size_t)(st->p->ntensors + 1));
    st->regular = arena_alloc(a, sizeof(Run) * (size_t)(np + 1));
    st->last = arena_alloc(a, sizeof(Run) * (size_t)(np + 1));
    for (int k = 0; k < np; k++) {
        st->regular[k] = run_range(st, st->from[k + 1], st->to[k + 1], 0);
        st->last[k] = run_range(st, st->from[k + 1], st->to[k + 1], 1);
    }
    st->pro = st->from[0] < st->to[0] ? run_range(st, st->from[0], st->to[0], 1) : (Run){0};
    st->epi = st->from[np + 1] < st->to[np + 1] ? run_range(st, st->from[np + 1], st->to[np + 1], 1)
                                                 : (Run){0};
}

typedef struct Sim {
    Stage *stages;
    int m;
} Sim;

static const Run *piece_run(const Sim *sim, const Piece *pc, int rank, const Schedule *sc)
{
    const Stage *st = &sim->stages[rank];
    int k = st->sp.map[pc->kind * sc->v + pc->chunk];
    if (k < 0)
        return NULL;
    return pc->mb == sim->m - 1 ? &st->last[k] : &st->regular[k];
}

typedef struct CostUser {
    const Sim *sim;
    const Schedule *sc;
} CostUser;

static double piece_cost(const Piece *pc, int rank, void *user)
{
    const CostUser *u = user;
    const Run *r = piece_run(u->sim, pc, rank, u->sc);
    return r ? r->end : 0;
}

/* ---- FLOPs and tokens ---- */

/* Forward FLOPs of the matmuls and attention of the global graph's ops of
 * phase ph (the usual count: attention's full S^2, causal or not). */
static double graph_flops(const Graph *g, Phase ph)
{
    double f = 0;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->phase == ph && (op->kind == OP_MATMUL || op->kind == OP_ATTENTION))
            f += ir_op_flops(op);
    }
    return f;
}

/* Tokens of one microbatch: the first data input's elements (integer ids),
 * or its rows (all but the last dimension) for real-valued inputs. */
double cost_graph_tokens(const Graph *g)
{
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->kind != OP_INPUT)
            continue;
        const Value *v = op->res[0];
        double n = 1;
        int int_ids = v->dtype == DT_I32;
        for (int d = 0; d < v->rank - (int_ids ? 0 : 1); d++)
            n *= (double)v->shape[d];
        return n;
    }
    return 0;
}

/* ---- the model ---- */

/* Stage st's instructions with their predicted times, for the JSON. */
static void instr_times(Arena *a, const Stage *st, int m, CostModel *out)
{
    char label[160];
    out->ninstrs = st->sp.n;
    out->instrs = arena_alloc(a, sizeof(CostInstr) * (size_t)(st->sp.n + 1));
    for (int i = 0; i < st->sp.n; i++) {
        const PlanInstr *in = &st->p->instrs[st->sp.instr[i]];
        CostInstr *o = &out->instrs[i];
        o->index = st->sp.instr[i];
        o->runs = st->per_mb[i] ? m : 1;
        o->label = arena_strdup(a, plan_instr_label(st->p, o->index, label, sizeof label));
        o->time_s = in->kind == PI_COLL ? cost_coll_time(st->p, st->d, in)
                                        : cost_compute_time(st->p, st->d, in);
    }
}

int cost_model(Ctx *c, const Graph *g, const TrainConfig *tc, const Graph *local, const Plan *p, const CostDevice *d,
                    CostModel *out)
{
    Schedule sc;
    memset(out, 0, sizeof *out);
    if (sched_of_train(c, g, tc, &sc, "cost model") != 0)
        return -1;
    Sim sim = {arena_alloc(c->arena, sizeof(Stage) * (size_t)sc.p), sc.m};
    memset(sim.stages, 0, sizeof(Stage) * (size_t)sc.p);
    double pro = 0, p2p = 0;
    const char *grad = mem_gradient_values(c->arena, local);
    for (int s = 0; s < sc.p; s++) {
        sim.stages[s].p = p, sim.stages[s].d = d;
        sim.stages[s].grad = grad, sim.stages[s].local = local;
        cost_stage_runs(c->arena, &sim.stages[s], &sc, s);
        if (sim.stages[s].pro.end > pro)
            pro = sim.stages[s].pro.end;
        if (sim.stages[s].p2p > p2p)
            p2p = sim.stages[s].p2p;
    }
    CostUser u = {&sim, &sc};
    char err[256];
    if (sched_simulate(c->arena, &sc, piece_cost, &u, p2p, &out->times, err, sizeof err) != 0)
        return diag_error(&c->diag, LOC_NONE, "cost model: %s", err), -1;
    out->sched = sc;
    out->nstages = sc.p;
    out->microbatches = sc.m;
    out->schedule = sched_kind_name(sc.kind);
    out->stage = arena_alloc(c->arena, sizeof(StageCost) * (size_t)sc.p);
    memset(out->stage, 0, sizeof(StageCost) * (size_t)sc.p);
    double step = 0;
    for (int s = 0; s < sc.p; s++) {
        Stage *st = &sim.stages[s];
        StageCost *o = &out->stage[s];
        double end = 0, busy = 0, compute = 0, cm = 0;
        for (int i = 0; i < sc.ranks[s].n; i++) {
            const Piece *pc = &sc.ranks[s].pieces[i];
            const Run *r = piece_run(&sim, pc, s, &sc);
            if (!r)
                continue;
            double e = out->times.end[s][i];
            end = e > end ? e : end;
            busy += r->end, compute += r->compute;
            if (pc->mb == sc.m - 1) { /* the shared collectives, one stream across pieces */
                double a = cm + r->once, b = e + r->backlog;
                cm = a > b ? a : b;
            }
        }
        double tail = cm > end ? cm - end : 0;
        o->compute = compute + st->pro.compute + st->epi.compute;
        o->optimizer = st->epi.end;
        o->comm_exposed = (busy - compute) + tail + (st->pro.end - st->pro.compute) +
                          (st->epi.end - st->epi.compute);
        o->total = pro + end + tail + st->epi.end;
        o->bubble = o->total - o->compute - o->comm_exposed;
        if (o->bubble < 0)
            o->bubble = 0;
        if (o->total > step)
            step = o->total, out->binding_stage = s;
    }
    instr_times(c->arena, &sim.stages[0], sc.m, out);
    out->p2p_s = p2p;
    out->step_s = step;
    out->devices = (double)plan_mesh_size(p);
    out->tokens = cost_graph_tokens(g); /* the data input is whole: each microbatch slices it */
    out->model_flops = 3 * graph_flops(g, PH_FWD) * sc.m;
    out->hw_flops = out->model_flops + graph_flops(g, PH_RECOMPUTE) * sc.m;
    out->peak_flops = d->peak16;
    if (step > 0) {
        out->tokens_per_s = out->tokens / step;
        out->mfu = out->model_flops / (step * out->devices * out->peak_flops);
        out->tflops_per_gpu = out->hw_flops / (step * out->devices) / 1e12;
        out->hfu = out->tflops_per_gpu * 1e12 / out->peak_flops;
    }
    return 0;
}

/* ---- output ---- */

void cost_print(FILE *f, const CostModel *cm)
{
    fprintf(f, "step %.6f s (stage %d binds): %d microbatch%s, %s schedule\n", cm->step_s,
            cm->binding_stage, cm->microbatches, cm->microbatches == 1 ? "" : "es", cm->schedule);
    fprintf(f, "  tokens/s         %14.1f  (%.0f tokens per step, %.1f per device per s)\n",
            cm->tokens_per_s, cm->tokens, cm->tokens_per_s / cm->devices);
    fprintf(f, "  model FLOPs      %14.4g  per step (6 N tokens + attention)\n", cm->model_flops);
    fprintf(f, "  MFU              %14.4f\n", cm->mfu);
    fprintf(f, "  hardware TFLOP/s %14.2f  per device, counting recomputation (HFU %.4f)\n",
            cm->tflops_per_gpu, cm->hfu);
    fprintf(f, "  pipeline message %14.6f s\n", cm->p2p_s);
    for (int s = 0; s < cm->nstages; s++) {
        const StageCost *o = &cm->stage[s];
        fprintf(f, "stage %d: %.6f s: compute %.6f, exposed communication %.6f, bubble %.6f "
                   "(optimizer %.6f)\n",
                s, o->total, o->compute, o->comm_exposed, o->bubble, o->optimizer);
    }
}

char *cost_json(const CostModel *cm, const char *model, const char *device)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "device", device);
    cJSON_AddNumberToObject(o, "devices", cm->devices);
    cJSON_AddNumberToObject(o, "microbatches", cm->microbatches);
    cJSON_AddStringToObject(o, "schedule", cm->schedule);
    cJSON_AddNumberToObject(o, "step_time_s", cm->step_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", cm->tokens_per_s);
    cJSON_AddNumberToObject(o, "mfu", cm->mfu);
    cJSON_AddNumberToObject(o, "hfu", cm->hfu);
    cJSON_AddNumberToObject(o, "tflops_per_gpu", cm->tflops_per_gpu);
    cJSON_AddNumberToObject(o, "model_flops", cm->model_flops);
    cJSON_AddNumberToObject(o, "hardware_flops", cm->hw_flops);
    cJSON_AddNumberToObject(o, "tokens", cm->tokens);
    cJSON_AddNumberToObject(o, "binding_stage", cm->binding_stage);
    cJSON *st = cJSON_AddArrayToObject(o, "stages");
    for (int s = 0; s < cm->nstages; s++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "total_s", cm->stage[s].total);
        cJSON_AddNumberToObject(e, "compute_s", cm->stage[s].compute);
        cJSON_AddNumberToObject(e, "comm_exposed_s", cm->stage[s].comm_exposed);
        cJSON_AddNumberToObject(e, "bubble_s", cm->stage[s].bubble);
        cJSON_AddNumberToObject(e, "optimizer_s", cm->stage[s].optimizer);
        cJSON_AddItemToArray(st, e);
    }
    cJSON *ins = cJSON_AddArrayToObject(o, "instructions");
    for (int i = 0; i < cm->ninstrs; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "index", cm->instrs[i].index);
        cJSON_AddStringToObject(e, "label", cm->instrs[i].label);
        cJSON_AddNumberToObject(e, "runs", cm->instrs[i].runs);
        cJSON_AddNumberToObject(e, "time_s", cm->instrs[i].time_s);
        cJSON_AddItemToArray(ins, e);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}
