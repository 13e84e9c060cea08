/* cost_profile.c: the planner's profile of one tensor-parallel size. Reads
 * the plan of a one-layer step with one row per microbatch (full
 * recomputation, no pipeline), its memory model and a device; writes, per
 * row, what a layer, the embedding and the head cost in time, what each
 * holds for the backward at each recompute level, their temporaries, the
 * parameters' and the optimizer's bytes, and the model's FLOPs.
 *
 * Key idea: the planner's search (planner/rank.c) scales these numbers
 * analytically to any layer count, microbatch size and pipeline depth; one
 * compile per tensor-parallel size is all it measures (docs/cost.md). */
#include "model/cost_stage.h"

#include <string.h>

/* ---- the planner's profile: one layer's step, measured ---- */

/* Where an instruction of a one-layer step belongs. */
enum { PART_LAYER, PART_EMBED, PART_HEAD };

/* The part of position i: its layer, else before the layer's forward (or
 * after its backward): the embedding; else the head and loss. */
static int part_of(const Stage *st, int i, int first_f, int last_b)
{
    const PlanInstr *in = &st->p->instrs[st->sp.instr[i]];
    if (in->layer >= 0)
        return PART_LAYER;
    if (in->phase == PH_FWD)
        return first_f < 0 || i < first_f ? PART_EMBED : PART_HEAD;
    return last_b >= 0 && i > last_b ? PART_EMBED : PART_HEAD;
}

/* Whether instruction in writes tensor t: t holds a result of the op it
 * was lowered from (a pad's fill and its interior both write the pad's
 * tensor, so the first toucher alone does not say who makes it). */
static int writes(const Stage *st, const PlanInstr *in, int t)
{
    if (in->kind == PI_GEMM)
        return t == in->gemm.c;
    if (in->op <= 0 || in->op > st->local->ops.len)
        return 0;
    const Op *op = st->local->ops.data[in->op - 1];
    for (int r = 0; r < op->nres; r++)
        if (op->res[r]->id == st->p->tensors[t].value)
            return 1;
    return 0;
}

/* Bytes that a layer's weight gradients read and the rest of the step made:
 * under ZB-H1 the weight gradients wait in a W piece, and these wait with
 * them. The weight gradients are the layer's backward instructions that the
 * layer's input gradient does not need: what the embedding's backward
 * (after the layer's, position > last_b) reads, and everything the layer's
 * backward writes toward it, is needed (as the pipeline pass splits B and W,
 * passes/pipeline.c). first[t]: the position that first touches tensor t. */
static double weight_grad_inputs(Arena *a, const Stage *st, const int *first, int last_b)
{
    const Plan *p = st->p;
    int n = st->sp.n;
    if (last_b < 0)
        return 0;
    char *need = arena_alloc(a, (size_t)p->ntensors + 1), *w = arena_alloc(a, (size_t)n + 1);
    memset(need, 0, (size_t)p->ntensors + 1);
    memset(w, 0, (size_t)n + 1);
    for (int i = n - 1; i >= 0; i--) {
        const PlanInstr *in = &p->instrs[st->sp.instr[i]];
        int layer_bwd = in->layer >= 0 && in->phase == PH_BWD && st->per_mb[i];
        int needed = i > last_b && in->phase == PH_BWD, k = plan_instr_ntensors(in);
        for (int j = 0; j < k && layer_bwd && !needed; j++) {
            int t = plan_instr_tensor(in, j);
            needed = need[t] && writes(st, in, t);
        }
        if (!needed && !layer_bwd)
            continue;
        w[i] = !needed;
        for (int j = 0; j < k && needed; j++) { /* what it reads is needed too */
            int t = plan_instr_tensor(in, j);
            if (!writes(st, in, t))
                need[t] = 1;
        }
    }
    char *seen = need; /* reused: the tensors counted */
    memset(seen, 0, (size_t)p->ntensors + 1);
    double held = 0;
    for (int i = 0; i < n; i++) {
        const PlanInstr *in = &p->instrs[st->sp.instr[i]];
        for (int j = 0, k = plan_instr_ntensors(in); j < k && w[i]; j++) {
            int t = plan_instr_tensor(in, j);
            if (p->tensors[t].role == PT_TEMP && first[t] >= 0 && !w[first[t]] && !seen[t])
                seen[t] = 1, held += (double)p->tensors[t].bytes;
        }
    }
    return held;
}

static double graph_flops_of(const Graph *g, Phase ph, int layer)
{
    double f = 0;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->phase == ph && (op->kind == OP_MATMUL || op->kind == OP_ATTENTION) &&
            (layer ? op->layer >= 0 : op->layer < 0))
            f += ir_op_flops(op);
    }
    return f;
}

/* One stage's program as the profile walks it. */
typedef struct Prof {
    Stage st;
    const Plan *p;
    int n;              /* positions */
    int first_f, last_b; /* the layer's first forward and last backward position */
    int *first, *last;  /* by tensor: its maker's and its last reader's position */
} Prof;

/* The layer's own work (not its weights' casts): its span. */
static void layer_span(Prof *f)
{
    f->first_f = f->last_b = -1;
    for (int i = 0; i < f->n; i++) {
        const PlanInstr *in = &f->p->instrs[f->st.sp.instr[i]];
        if (in->layer < 0 || !f->st.per_mb[i])
            continue;
        if (in->phase == PH_FWD && f->first_f < 0)
            f->first_f = i;
        if (in->phase != PH_FWD)
            f->last_b = i;
    }
}

/* Each tensor's maker and last reader. */
static void tensor_spans(Arena *a, Prof *f)
{
    const Plan *p = f->p;
    f->first = arena_alloc(a, sizeof(int) * (size_t)(p->ntensors + 1));
    f->last = arena_alloc(a, sizeof(int) * (size_t)(p->ntensors + 1));
    for (int t = 0; t < p->ntensors; t++)
        f->first[t] = f->last[t] = -1;
    for (int i = 0; i < f->n; i++) {
        const PlanInstr *in = &p->instrs[f->st.sp.instr[i]];
        int ts[PLAN_MAX_RANK + 64], k = 0;
        for (int j = 0; j < in->nargs && k < 60; j++)
            ts[k++] = in->args[j];
        if (in->kind == PI_GEMM)
            ts[k++] = in->gemm.a, ts[k++] = in->gemm.b, ts[k++] = in->gemm.c;
        for (int j = 0; j < k; j++) {
            if (f->first[ts[j]] < 0)
                f->first[ts[j]] = i;
            f->last[ts[j]] = i;
        }
    }
}

/* The parameters' shapes on a device: the layer's, then the others'. */
static void param_shapes(const Plan *p, CostProfile *out)
{
    for (int pass = 0; pass < 2; pass++)
        for (int t = 0; t < p->ntensors && out->nshapes < 64; t++) {
            const PlanTensor *pt = &p->tensors[t];
            if (pt->role != PT_PARAM || (pt->layer >= 0) != (pass == 0))
                continue;
            int k = out->nshapes++;
            out->shape[k].bytes = (double)pt->bytes;
            out->shape[k].rank = pt->rank < 4 ? pt->rank : 4;
            for (int dd = 0; dd < out->shape[k].rank; dd++)
                out->shape[k].dim[dd] = pt->shape[dd];
            out->nshapes_layer += pass == 0;
        }
}

/* What temporary t, made at first[t], holds for the backward, by recompute
 * level and part; and the message a stage sends the next. */
static void held_tensor(const Prof *f, int t, CostProfile *out)
{
    const Plan *p = f->p;
    const Stage *st = &f->st;
    const int *first = f->first, *last = f->last;
    const PlanInstr *mk = &p->instrs[st->sp.instr[first[t]]];
    int held = st->sp.piece[first[t]] >= 0 && st->sp.piece[last[t]] > st->sp.piece[first[t]] &&
               st->sp.piece[last[t]] < st->sp.npieces && st->per_mb[first[t]];
    int part = part_of(st, first[t], f->first_f, f->last_b);
    double b = (double)p->tensors[t].bytes;
    if (!held && !(mk->phase == PH_RECOMPUTE && st->sp.piece[last[t]] < st->sp.npieces))
        return;
    int read_by_bwd = p->instrs[st->sp.instr[last[t]]].phase == PH_BWD;
    if (mk->phase == PH_RECOMPUTE && part == PART_LAYER) {
        out->act_none += read_by_bwd ? b : 0; /* what none would have held */
        out->act_sel += mk->flops > 0 ? b : 0; /* selective keeps matmuls' and attention's */
    } else if (mk->phase == PH_FWD) {
        if (part == PART_LAYER)
            out->act_full += b, out->act_none += b, out->act_sel += b;
        else if (part == PART_EMBED)
            out->act_embed += b;
        else
            out->act_head += b;
    }
    if (mk->phase == PH_FWD && part == PART_EMBED && f->first_f >= 0 && last[t] >= f->first_f &&
        b > out->msg)
        out->msg = b; /* the embedding's output the layer reads: what crosses a stage */
}

/* Parameters' and state's bytes (the layer's and all), and what the
 * temporaries hold for the backward; mm: the step's memory model. */
static void held_bytes(const Prof *f, const MemoryModel *mm, CostProfile *out)
{
    const Plan *p = f->p;
    double params = 0, params_layer = 0, state_layer = 0, state = 0;
    for (int t = 0; t < p->ntensors; t++) {
        const PlanTensor *pt = &p->tensors[t];
        if (pt->role == PT_PARAM)
            params += (double)pt->bytes, params_layer += pt->layer >= 0 ? (double)pt->bytes : 0;
        if (pt->role == PT_STATE)
            state += (double)pt->bytes, state_layer += pt->layer >= 0 ? (double)pt->bytes : 0;
        if (pt->role == PT_TEMP && f->first[t] >= 0)
            held_tensor(f, t, out);
    }
    const StageMemory *sm = &mm->stage[0];
    double other = params > 0 ? 1.0 / params : 0;
    out->params = sm->cat[MC_PARAMS] * other, out->grads = sm->cat[MC_GRADS] * other;
    out->optimizer = state > 0 ? sm->cat[MC_OPTIMIZER] / state : 0;
    out->params_layer = params_layer, out->params_out = params - params_layer;
    out->state_layer = state_layer, out->state_out = state - state_layer;
    out->base = sm->cat[MC_WORKSPACE] + sm->cat[MC_RESERVED];
}

/* Each part's time by phase on d, with its GEMMs' share and launches. */
static void part_times(const Prof *f, const CostDevice *d, CostProfile *out)
{
    const Plan *p = f->p;
    for (int i = 0; i < f->n; i++) {
        const PlanInstr *in = &p->instrs[f->st.sp.instr[i]];
        if (!f->st.per_mb[i] || (in->kind == PI_COLL && (in->coll.op == PC_SEND || in->coll.op == PC_RECV)))
            continue;
        double t = in->kind == PI_COLL && in->coll.op != PC_SLICE ? cost_coll_time(p, d, in)
                                                                   : cost_compute_time(p, d, in);
        int part = part_of(&f->st, i, f->first_f, f->last_b);
        int fwd = in->phase == PH_FWD, rc = in->phase == PH_RECOMPUTE;
        CostTime *to = part == PART_LAYER ? (fwd ? &out->t_f : rc ? &out->t_r : &out->t_b)
                       : part == PART_EMBED ? (fwd ? &out->embed_f : &out->embed_b)
                                            : (fwd ? &out->head_f : &out->head_b);
        int gemm = in->kind == PI_GEMM, launch = in->kind != PI_COLL;
        to->t += t, to->gemm += gemm ? t - d->k.launch_s : 0, to->launches += launch;
        if (part == PART_LAYER && rc && !(in->flops > 0))
            out->t_rsel.t += t, out->t_rsel.launches += launch;
    }
}

/* A piece's own temporaries alive together, at most (one microbatch's), by
 * the part that makes them: the layer's, the embedding's, the head's. */
static void transients(Arena *a, const Prof *f, CostProfile *out)
{
    const Plan *p = f->p;
    const Stage *st = &f->st;
    const int *first = f->first, *last = f->last;
    size_t n1 = (size_t)(f->n + 1);
    double *born = arena_alloc(a, sizeof(double) * 3 * n1);
    double *dies = arena_alloc(a, sizeof(double) * 3 * n1);
    memset(born, 0, sizeof(double) * 3 * n1);
    memset(dies, 0, sizeof(double) * 3 * n1);
    for (int t = 0; t < p->ntensors; t++) {
        if (p->tensors[t].role != PT_TEMP || first[t] < 0 || !st->per_mb[first[t]] ||
            st->sp.piece[first[t]] != st->sp.piece[last[t]] || st->sp.piece[first[t]] < 0 ||
            st->sp.piece[first[t]] >= st->sp.npieces)
            continue;
        size_t k = (size_t)part_of(st, first[t], f->first_f, f->last_b) * n1;
        born[k + (size_t)first[t]] += (double)p->tensors[t].bytes;
        dies[k + (size_t)last[t]] += (double)p->tensors[t].bytes;
    }
    double *most[3] = {&out->transient, &out->transient_embed, &out->transient_head};
    for (int k = 0; k < 3; k++) {
        double live = 0;
        for (int i = 0; i < f->n; i++) {
            live += born[(size_t)k * n1 + (size_t)i];
            if (live > *most[k])
                *most[k] = live;
            live -= dies[(size_t)k * n1 + (size_t)i];
        }
    }
}

/* The cuda device's staging beside the slab (plan_scratch_bytes): the
 * largest of its copies' and collectives' (plan_instr_scratch): the
 * layers' (per row), the optimizer's (sharded by ZeRO) and the rest's. */
static void scratch(const Prof *f, CostProfile *out)
{
    for (int i = 0; i < f->n; i++) {
        const PlanInstr *in = &f->p->instrs[f->st.sp.instr[i]];
        double b = (double)plan_instr_scratch(f->p, in, 1);
        if (b <= 0)
            continue;
        int lay = in->layer >= 0 && f->st.per_mb[i];
        double *to = lay ? &out->scratch_layer
                         : in->phase == PH_OPT ? &out->scratch_opt : &out->scratch_out;
        if (b > *to)
            *to = b;
    }
}

/* FLOPs of the global graph g (one microbatch of every data rank, m of
 * them), per row; and the forward's as the pipeline pass weighs its units. */
static void model_flops(const Graph *g, int m, CostProfile *out)
{
    double rows = 0;
    for (int i = 0; i < g->ops.len && !rows; i++)
        if (g->ops.data[i]->kind == OP_INPUT && g->ops.data[i]->res[0]->rank > 0)
            rows = (double)g->ops.data[i]->res[0]->shape[0];
    double per = rows > 0 ? m / rows : 1;
    out->rows = m;
    out->tokens = cost_graph_tokens(g);
    out->row_tokens = rows > 0 ? out->tokens / rows : 1;
    out->flops_layer = 3 * graph_flops_of(g, PH_FWD, 1) * per;
    out->flops_out = 3 * graph_flops_of(g, PH_FWD, 0) * per;
    out->rc_flops_layer = graph_flops_of(g, PH_RECOMPUTE, 1) * per;
    int seen_layer = 0; /* the pipeline pass's units: before the layers, the layer, after */
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->phase != PH_FWD || op->kind == OP_PARAM || op->kind == OP_INPUT ||
            op->kind == OP_CONSTANT || op->kind == OP_STATE || op->kind == OP_STEP)
            continue; /* the pipeline pass weighs no source */
        seen_layer |= op->layer >= 0;
        double fl = ir_op_flops(op);
        *(op->layer >= 0 ? &out->uflops_layer : seen_layer ? &out->uflops_head : &out->uflops_embed) += fl;
    }
}

int cost_profile(Ctx *c, const Graph *g, const TrainConfig *tc, const Graph *local, const Plan *p,
                 const MemoryModel *mm, const CostDevice *d, CostProfile *out)
{
    Schedule sc;
    memset(out, 0, sizeof *out);
    if (sched_of_train(c, g, tc, &sc, "cost model") != 0)
        return -1;
    Prof f = {.st = {.p = p, .d = d, .grad = mem_gradient_values(c->arena, local), .local = local},
              .p = p};
    cost_stage_runs(c->arena, &f.st, &sc, 0);
    f.n = f.st.sp.n;
    layer_span(&f);
    tensor_spans(c->arena, &f);
    param_shapes(p, out);
    held_bytes(&f, mm, out);
    part_times(&f, d, out);
    out->w_held = weight_grad_inputs(c->arena, &f.st, f.first, f.last_b);
    transients(c->arena, &f, out);
    scratch(&f, out);
    model_flops(g, sc.m, out);
    return 0;
}
