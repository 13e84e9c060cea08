/* memory.c: the memory model of one training step, per pipeline stage.
 * Reads a plan (tensors, and each stage's program with every instruction's
 * microbatch and schedule piece), the per-device graph it came from (names,
 * locations) and the pipeline schedule; writes, per stage, the bytes of the
 * device's largest moment split into parameters, gradients, optimizer state,
 * activations, temporaries, communication buffers, workspace and reserved
 * memory, with the largest tensors alive then.
 *
 * Key idea: the plan of ONE microbatch (passes/microbatch.c's model mode)
 * says everything the step needs per microbatch. Walking a stage's program,
 * every temporary lives from its first to its last instruction; a tensor born
 * in one piece of the schedule (the forward of chunk c, say) and dying in a
 * later one (its backward) is held across the pieces between, once per
 * microbatch in flight; a gradient that lives on to the optimizer is the
 * accumulation buffer, once per step. Replaying the stage's piece list of the
 * real schedule (m microbatches) with these per-piece profiles gives every
 * moment's live bytes without building m copies of the graph: the peak is the
 * largest moment, not a sum of maxima. docs/memory.md has the rules. */
#include "model/model.h"

#include "../plan/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const cat_names[MC_COUNT] = {
    "params", "grads", "optimizer", "activations", "temporaries", "comm", "workspace", "reserved",
};

const char *mem_cat_name(MemCat c) { return c >= 0 && c < MC_COUNT ? cat_names[c] : "?"; }

typedef double Bytes[MC_COUNT];

static double total(const double *v)
{
    double s = 0;
    for (int c = 0; c < MC_COUNT; c++)
        s += v[c];
    return s;
}

static void add(double *to, const double *v, double k)
{
    for (int c = 0; c < MC_COUNT; c++)
        to[c] += k * v[c];
}

static double aligned(uint64_t n) { return (double)((n + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN); }

/* ---- what each tensor is ---- */

/* Values that are parameter gradients: read by the optimizer (not made by
 * it), and what reduces, sums or reshapes into those: collectives and the
 * shared backward ops (mb -1) that combine the microbatches' parts. */
char *mem_gradient_values(Arena *a, const Graph *l)
{
    char *grad = arena_alloc(a, (size_t)l->values.len + 1);
    memset(grad, 0, (size_t)l->values.len + 1);
    for (int i = l->ops.len - 1; i >= 0; i--) {
        const Op *op = l->ops.data[i];
        int into = op->phase == PH_OPT;
        for (int j = 0; j < op->nres && !into; j++)
            into = grad[op->res[j]->id] && (op->mb < 0 || op->kind == OP_ALL_REDUCE ||
                                            op->kind == OP_REDUCE_SCATTER);
        for (int k = 0; into && k < op->nargs; k++) {
            const Op *d = op->args[k]->def;
            if (d && (d->phase == PH_BWD || d->kind == OP_ALL_REDUCE ||
                      d->kind == OP_REDUCE_SCATTER) && d->kind != OP_PARAM && d->kind != OP_STATE)
                grad[op->args[k]->id] = 1;
        }
    }
    return grad;
}

/* A parameter, or a copy or cast of one made for the step's use. */
int mem_weight_value(const Value *v)
{
    for (int hops = 0; v && v->def && hops < 4; hops++) {
        const Op *d = v->def;
        if (d->kind == OP_PARAM)
            return 1;
        if (d->mb >= 0 || (d->kind != OP_CAST && d->kind != OP_ALL_GATHER && d->kind != OP_RESHAPE &&
                           d->kind != OP_TRANSPOSE))
            return 0;
        v = d->args[0];
    }
    return 0;
}

static MemCat category(const Plan *p, const Graph *l, const char *grad, int t, const PlanInstr *first)
{
    const PlanTensor *pt = &p->tensors[t];
    switch (pt->role) {
    case PT_PARAM: return MC_PARAMS;
    case PT_STATE: return MC_OPTIMIZER;
    case PT_TEMP: break;
    default: return MC_TEMPORARIES; /* data, step, hyperparameters */
    }
    const Value *v = pt->value >= 0 && pt->value < l->values.len ? l->values.data[pt->value] : NULL;
    if (v && grad[v->id])
        return MC_GRADS;
    if (v && mem_weight_value(v))
        return MC_PARAMS;
    if (first && first->kind == PI_COLL && (first->coll.op == PC_RECV || first->coll.op == PC_SEND))
        return v && v->def && (v->def->phase == PH_FWD || v->def->phase == PH_RECOMPUTE)
                   ? MC_ACTIVATIONS
                   : MC_TEMPORARIES;
    int ph = v && v->def ? (int)v->def->phase : first ? first->phase : PH_BWD;
    return ph == PH_FWD || ph == PH_RECOMPUTE ? MC_ACTIVATIONS : MC_TEMPORARIES;
}

/* ---- one stage's program ---- */

typedef struct Span {
    int first, last; /* positions in the stage's program; -1 when untouched */
} Span;

typedef struct StageProg {
    int n;           /* instructions */
    int *instr;      /* position -> plan instruction */
    int *piece;      /* position -> piece index, -1 prologue, npieces epilogue */
    int npieces;
    PieceKind *kind; /* by piece */
    Span *span;      /* by tensor */
} StageProg;

static void touch_span(Span *s, int pos)
{
    if (s->first < 0)
        s->first = pos;
    s->last = pos;
}

/* Every tensor that instruction in touches, into span at position pos. */
static void touch_instr(const PlanInstr *in, Span *span, int pos)
{
    for (int a = 0; a < in->nargs; a++)
        touch_span(&span[in->args[a]], pos);
    if (in->kind == PI_GEMM) {
        touch_span(&span[in->gemm.a], pos), touch_span(&span[in->gemm.b], pos);
        touch_span(&span[in->gemm.c], pos);
        if (in->gemm.epilogue == PE_BIAS)
            touch_span(&span[in->gemm.bias], pos);
    }
}

static int on_stage(const Plan *p, const PlanInstr *in, int s)
{
    return plan_stages(p) <= 1 || in->stage == s;
}

/* Pieces: a new one where the microbatch's tick changes (or, without ticks,
 * F or B: the IR read back unscheduled); a backward instruction with its
 * forward's tick (the loss head's) belongs to that F piece; shared
 * instructions join the piece in progress; the optimizer is the epilogue. */
static void split_pieces(Arena *a, const Plan *p, StageProg *sp)
{
    sp->piece = arena_alloc(a, sizeof(int) * (size_t)(sp->n + 1));
    sp->kind = arena_alloc(a, sizeof(PieceKind) * (size_t)(sp->n + 1));
    int cur = -1, tick = -1, fwd = -1, epi = 0, last = -1;
    for (int i = 0; i < sp->n; i++) /* the optimizer follows the last microbatch's work */
        if (p->instrs[sp->instr[i]].mb >= 0 || p->instrs[sp->instr[i]].phase == PH_BWD)
            last = i;
    for (int i = 0; i < sp->n; i++) {
        const PlanInstr *in = &p->instrs[sp->instr[i]];
        epi |= i > last && in->phase == PH_OPT;
        int send = in->kind == PI_COLL && in->coll.op == PC_SEND;
        if (!epi && in->mb >= 0 && !send) {
            int f = in->phase == PH_FWD;
            if (cur < 0 || in->tick != tick || (!tick && f != fwd)) {
                cur = sp->npieces++;
                sp->kind[cur] = f ? PIECE_F : PIECE_B;
                tick = in->tick, fwd = f;
            }
        }
        sp->piece[i] = epi ? -2 : cur;
    }
    for (int i = 0; i < sp->n; i++)
        if (sp->piece[i] == -2)
            sp->piece[i] = sp->npieces;
}

static void stage_prog(Arena *a, const Plan *p, int s, StageProg *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->instr = arena_alloc(a, sizeof(int) * (size_t)(p->ninstrs + 1));
    for (int i = 0; i < p->ninstrs; i++)
        if (on_stage(p, &p->instrs[i], s))
            sp->instr[sp->n++] = i;
    sp->span = arena_alloc(a, sizeof(Span) * (size_t)(p->ntensors + 1));
    for (int t = 0; t < p->ntensors; t++)
        sp->span[t] = (Span){-1, -1};
    for (int i = 0; i < sp->n; i++)
        touch_instr(&p->instrs[sp->instr[i]], sp->span, i);
    split_pieces(a, p, sp);
}

/* Held by the device of stage s for the whole step. */
static int persistent_on(const Plan *p, const PlanTensor *t, int s)
{
    return t->role != PT_TEMP && (plan_stages(p) <= 1 || t->stage < 0 || t->stage == s);
}

/* ---- per-piece profiles of the one-microbatch program ---- */

typedef struct PieceProf {
    Bytes born_out;   /* born here, held until a later piece of the same microbatch */
    Bytes held_in;    /* born in an earlier piece of the microbatch, dying here */
    Bytes acc;        /* gradients born here that live to the optimizer: accumulators */
    Bytes fin;        /* values of the whole step born here: on the last run only */
    Bytes acc_end;    /* accumulators and step values dying here (the optimizer: as it runs) */
    Bytes first, later; /* the piece's own largest moment on its first run, on later runs */
    Bytes last;       /* on the last run, which also makes the step's values (fin) */
    int at_first, at_later, at_last; /* the positions of those moments */
} PieceProf;

typedef struct Model {
    Arena *a;
    const Plan *p;
    const Graph *l;
    StageProg sp;
    MemCat *cat;    /* by tensor */
    char *shared;   /* by tensor: made by an op shared by the microbatches (mb -1) */
    char *summed;   /* by tensor: read by such an op of the backward, or the optimizer */
    char *sum;      /* by tensor: a loop plan's microbatch sum (what an acc kernel adds into) */
    int zero;       /* the train setting */
    int mbs;        /* microbatches */
    double saved, saved_layers; /* bytes a microbatch's forward holds for later, in layers */
    int *birth, *death; /* by tensor: piece of first and last touch (-1 prologue) */
    PieceProf *prof;
    Bytes base;     /* persistent, workspace, comm, reserved */
    Bytes pre;      /* made before the first piece (weight casts and gathers): held to their last use */
} Model;

static void tensor_pieces(Model *m)
{
    const StageProg *sp = &m->sp;
    for (int t = 0; t < m->p->ntensors; t++) {
        Span s = sp->span[t];
        m->birth[t] = s.first < 0 ? -1 : sp->piece[s.first];
        m->death[t] = s.first < 0 ? -1 : sp->piece[s.last];
        /* made by the first microbatch's run alone (a weight received from another
         * stage) and read by every run: held as the prologue's values are */
        if (s.first >= 0 && m->p->instrs[sp->instr[s.first]].when == PW_FIRST)
            m->birth[t] = -1;
    }
}

/* Per position: the tensors whose first touch (born) and last touch (dies) it is. */
typedef struct Events {
    int *born, *dies;           /* by position: first tensor, -1 */
    int *next_born, *next_dies; /* by tensor */
} Events;

static void events(const Model *m, Events *e)
{
    int n = m->sp.n, nt = m->p->ntensors;
    e->born = arena_alloc(m->a, sizeof(int) * (size_t)(n + 1));
    e->dies = arena_alloc(m->a, sizeof(int) * (size_t)(n + 1));
    e->next_born = arena_alloc(m->a, sizeof(int) * (size_t)(nt + 1));
    e->next_dies = arena_alloc(m->a, sizeof(int) * (size_t)(nt + 1));
    for (int i = 0; i < n; i++)
        e->born[i] = e->dies[i] = -1;
    for (int t = nt - 1; t >= 0; t--) {
        Span s = m->sp.span[t];
        if (m->p->tensors[t].role != PT_TEMP || s.first < 0)
            continue;
        e->next_born[t] = e->born[s.first], e->born[s.first] = t;
        e->next_dies[t] = e->dies[s.last], e->dies[s.last] = t;
    }
}

/* A parameter's gradient that outlives the piece making it: with several
 * microbatches it is their sum, one buffer per step however many are in
 * flight (passes/autodiff.c adds each microbatch's part in its own piece). */
static int accumulator(const Model *m, int t)
{
    if (m->p->nsched > 0) /* a loop plan: the tensor its acc kernels add into (the first
                             microbatch's run copies the part there) */
        return m->sum[t] && m->birth[t] >= 0 && m->birth[t] < m->sp.npieces;
    return m->cat[t] == MC_GRADS && !m->shared[t] && (m->death[t] > m->birth[t] || m->summed[t]) &&
           m->birth[t] >= 0 && m->birth[t] < m->sp.npieces;
}

/* A value of the whole step made in a piece (a sum over every microbatch, by
 * a shared op): with several microbatches it exists from the last one's run
 * of the piece on, once. */
static int step_value(const Model *m, int t)
{
    if (m->p->nsched > 0 && m->sum[t])
        return 0; /* a microbatch sum: held from the first run (accumulator) */
    return m->shared[t] && m->death[t] > m->birth[t] && m->birth[t] >= 0 &&
           m->birth[t] < m->sp.npieces;
}

/* Whether tensor t is part of piece pc's own moment: born in it, or held
 * into it from an earlier piece of the microbatch and dying in it (the
 * optimizer's epilogue counts only what it makes: the rest is held). */
static int counted(const Model *m, int t, int pc)
{
    int b = m->birth[t], d = m->death[t];
    if (step_value(m, t))
        return 0;
    return b == pc || (b >= 0 && b < pc && d == pc && pc < m->sp.npieces && !accumulator(m, t));
}

/* The pieces' own moments: held-in bytes at the start, births added, deaths
 * removed after their position. A later run of a piece makes its gradient
 * parts where the first run makes the accumulators, and adds each into its
 * sum as it goes (passes/autodiff.c), so the sums, not the parts, are held:
 * the later run's moment is the first's without the accumulators born so
 * far, plus the largest part and its new sum, alive beside the old sum for
 * the add. */
static void sweep(Model *m, const Events *e)
{
    Bytes now, step, parts, gone;
    double part = 0;
    for (int i = 0, pc = -1; i < m->sp.n; i++) {
        int cur = m->sp.piece[i];
        if (cur < 0)
            continue;
        PieceProf *pf = &m->prof[cur];
        if (cur != pc) {
            memcpy(now, cur == m->sp.npieces ? pf->acc_end : pf->held_in, sizeof(Bytes));
            memset(step, 0, sizeof(Bytes)), memset(parts, 0, sizeof(Bytes)), pc = cur, part = 0;
            memset(gone, 0, sizeof(Bytes));
        }
        for (int t = e->born[i]; t >= 0; t = e->next_born[t]) {
            double b = aligned(m->p->tensors[t].bytes);
            if (m->birth[t] < 0)
                continue; /* held from the start (tensor_pieces) */
            if (step_value(m, t)) {
                step[m->cat[t]] += b;
                continue;
            }
            now[m->cat[t]] += b;
            if (accumulator(m, t))
                parts[MC_GRADS] += b, part = b > part ? b : part;
        }
        if (total(now) > total(pf->first))
            memcpy(pf->first, now, sizeof(Bytes)), pf->at_first = i;
        /* the last run adds its parts as a later run does, and makes the step's values
         * from the sums, which are freed as they are read (with one microbatch the
         * parts are the sums) */
        /* (a loop plan adds each part into its sum in place: no new sum beside the old) */
        double add2 = m->p->nsched > 0 ? 0 : 2 * part;
        double k = m->mbs > 1 ? -1 : 0, extra = m->mbs > 1 ? add2 : 0;
        if (total(now) + total(step) + k * total(parts) + extra - total(gone) > total(pf->last))
            memcpy(pf->last, now, sizeof(Bytes)), add(pf->last, step, 1), add(pf->last, parts, k),
                add(pf->last, gone, -1), pf->last[MC_GRADS] += extra, pf->at_last = i;
        /* a later run adds each part into its sum as it is made: the parts are not held
         * (the sums are, from the first run), but the largest one and its new sum are
         * alive beside the old sum for a moment */
        if (total(now) - total(parts) + add2 > total(pf->later))
            memcpy(pf->later, now, sizeof(Bytes)), add(pf->later, parts, -1),
                pf->later[MC_GRADS] += add2, pf->at_later = i;
        for (int t = e->dies[i]; t >= 0; t = e->next_dies[t])
            if (cur < m->sp.npieces && m->death[t] == cur &&
                ((m->mbs > 1 && accumulator(m, t)) || m->birth[t] < 0))
                /* the last run reads a sum, or a prologue's weight cast, for the last time */
                gone[m->cat[t]] += aligned(m->p->tensors[t].bytes);
            else if (step_value(m, t) && m->birth[t] == cur)
                step[m->cat[t]] -= aligned(m->p->tensors[t].bytes);
            else if ((counted(m, t, cur) && (!accumulator(m, t) || m->mbs == 1)) || /* a sum lives on */
                (cur == m->sp.npieces && m->birth[t] < cur && (accumulator(m, t) || step_value(m, t))))
                now[m->cat[t]] -= aligned(m->p->tensors[t].bytes);
    }
}

/* Where each temporary is born and dies, and what that makes of it: part of
 * the base (born before the first piece), held across pieces, an
 * accumulator, or the piece's own. */
static void classify(Model *m)
{
    int np = m->sp.npieces;
    for (int t = 0; t < m->p->ntensors; t++) {
        const PlanTensor *pt = &m->p->tensors[t];
        int b = m->birth[t], d = m->death[t];
        if (pt->role != PT_TEMP || m->sp.span[t].first < 0)
            continue;
        double by = aligned(pt->bytes);
        if (b < 0 && d < 0)
            continue; /* made and used before the first piece */
        if (b < 0)
            m->pre[m->cat[t]] += by, m->prof[d].acc_end[m->cat[t]] += by;
        else if (step_value(m, t) || accumulator(m, t)) {
            if (step_value(m, t))
                m->prof[b].fin[m->cat[t]] += by;
            else
                m->prof[b].acc[MC_GRADS] += by;
            /* freed after the last run of the piece it dies in */
            m->prof[d].acc_end[m->cat[t]] += by;
        } else if (b < np && d > b) {
            m->prof[b].born_out[m->cat[t]] += by;
            if (m->sp.kind[b] == PIECE_F) /* saved by the forward for a later piece */
                m->saved += by, m->saved_layers += pt->layer >= 0 ? by : 0;
            if (d < np)
                m->prof[d].held_in[m->cat[t]] += by;
        }
    }
}

/* ---- replaying the schedule ---- */

typedef struct Replay {
    int *map;     /* by kind * v + chunk: the program's piece, -1 when it has none */
    int npc;      /* pieces of the rank's schedule */
    const Piece *pcs;
    int v, m;
} Replay;

/* The rank's pieces of microbatch 0 in schedule order are the program's pieces
 * in program order (a piece with nothing on this stage is skipped): map, by
 * kind * v + chunk, the program's piece or -1. */
static int *piece_map(Arena *a, const StageProg *sp, const Schedule *sc, int s)
{
    int *map = arena_alloc(a, sizeof(int) * (size_t)(3 * sc->v + 1));
    for (int i = 0; i < 3 * sc->v; i++)
        map[i] = -1;
    int k = 0;
    for (int i = 0; i < sc->ranks[s].n; i++) {
        const Piece *pc = &sc->ranks[s].pieces[i];
        if (pc->mb != 0 || k >= sp->npieces)
            continue;
        if ((pc->kind == PIECE_F) == (sp->kind[k] == PIECE_F))
            map[pc->kind * sc->v + pc->chunk] = k++;
    }
    return map;
}

static void align(Model *m, const Schedule *sc, int s, Replay *r)
{
    r->v = sc->v, r->m = sc->m;
    r->pcs = sc->ranks[s].pieces, r->npc = sc->ranks[s].n;
    r->map = piece_map(m->a, &m->sp, sc, s);
}

void mem_stage_pieces(Arena *a, const Plan *p, const Schedule *sc, int s, StagePieces *out)
{
    StageProg sp;
    stage_prog(a, p, s, &sp);
    *out = (StagePieces){.n = sp.n, .instr = sp.instr, .piece = sp.piece, .npieces = sp.npieces,
                         .map = piece_map(a, &sp, sc, s)};
}

typedef struct Peak {
    Bytes b;
    int at, piece, mb, later; /* the schedule position, program piece, microbatch, run */
    int inflight;
} Peak;

static int piece_of(const Replay *r, int i) { return r->map[r->pcs[i].kind * r->v + r->pcs[i].chunk]; }

/* Every piece of the rank in order: the held bytes of the microbatches in
 * flight and the accumulators so far, plus the piece's own moment. */
static void replay(Model *m, const Replay *r, Peak *pk)
{
    int np = m->sp.npieces, inflight = 0;
    Bytes run = {0}, acc, now;
    memcpy(acc, m->pre, sizeof(Bytes));
    char *started = arena_alloc(m->a, (size_t)np + 1);
    int *done = arena_alloc(m->a, sizeof(int) * (size_t)(r->m + 1));
    memset(started, 0, (size_t)np + 1);
    memset(done, 0, sizeof(int) * (size_t)(r->m + 1));
    memset(pk, 0, sizeof *pk);
    pk->at = -1;
    for (int i = 0; i < r->npc; i++) {
        int P = piece_of(r, i), j = r->pcs[i].mb;
        if (P < 0)
            continue;
        inflight += done[j] == 0;
        int later = started[P];
        memcpy(now, m->base, sizeof(Bytes));
        add(now, acc, 1), add(now, run, 1), add(now, m->prof[P].held_in, -1);
        const double *own = later ? m->prof[P].later : m->prof[P].first;
        if (j == r->m - 1 && total(m->prof[P].last) > total(own))
            own = m->prof[P].last;
        add(now, own, 1);
        if (total(now) > total(pk->b) || pk->at < 0)
            *pk = (Peak){.at = i, .piece = P, .mb = j, .later = later, .inflight = inflight},
            memcpy(pk->b, now, sizeof(Bytes));
        add(run, m->prof[P].born_out, 1), add(run, m->prof[P].held_in, -1);
        if (!later)
            add(acc, m->prof[P].acc, 1), started[P] = 1;
        if (j == r->m - 1)
            add(acc, m->prof[P].fin, 1), add(acc, m->prof[P].acc_end, -1);
        if (++done[j] == np) /* its last piece on this stage */
            inflight--;
    }
    /* the optimizer: every accumulator, what the microbatches hold to it, its own */
    memcpy(now, m->base, sizeof(Bytes));
    add(now, acc, 1), add(now, m->prof[np].acc_end, -1), add(now, run, 1);
    add(now, m->prof[np].first, 1);
    if (total(now) > total(pk->b))
        *pk = (Peak){.at = r->npc, .piece = np, .mb = -1}, memcpy(pk->b, now, sizeof(Bytes));
}

/* ---- beside the slab: what the runtime allocates (runtime/mesh.c, cpu.c, gpu/cuda.c) ---- */

#define CUDA_WORKSPACE (32.0 * 1048576.0) /* cuBLASLt's, runtime/gpu/cuda.c */

/* The CPU's bf16 GEMMs widen A, B (and a bf16 C) to f32 in one buffer. */
static double cpu_workspace(const Plan *p, int s)
{
    double need = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        if (in->kind != PI_GEMM || !on_stage(p, in, s) || p->tensors[in->gemm.a].dtype != PD_BF16)
            continue;
        const PlanTensor *c = &p->tensors[in->gemm.c];
        double k = 2 * ((double)p->tensors[in->gemm.a].bytes + (double)p->tensors[in->gemm.b].bytes +
                        (c->dtype == PD_BF16 ? (double)c->bytes : 0));
        need = k > need ? k : need;
    }
    return need;
}

/* The threads backend's own buffers per communicator (runtime/comm): an
 * all-reduce stages the member's share (count / members) in the group's
 * scratch, a bf16 reduction widens its operands to f32, and a send keeps a
 * copy until its receiver takes it. Each communicator keeps its largest. */
static double group_buffers(const Plan *p, int s)
{
    uint32_t keys[64];
    double need[64];
    int ng = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        if (in->kind != PI_COLL || !on_stage(p, in, s) || in->coll.op == PC_SLICE || !in->nargs)
            continue;
        uint32_t key = 0;
        double members = (double)plan_axes_size(p, in->coll.axes, in->coll.naxes), count = 0, k = 0;
        for (int a = 0; a < in->coll.naxes; a++)
            key |= 1u << in->coll.axes[a];
        const PlanTensor *t = &p->tensors[in->args[0]];
        double es = (double)plan_dtype_size(t->dtype);
        for (int a = 0; a < in->nargs; a += in->nargs > 2 ? 2 : in->nargs)
            count += (double)p->tensors[in->args[a]].bytes / es;
        if (in->coll.op == PC_ALL_REDUCE || in->coll.op == PC_ALL_REDUCE_MAX)
            k = ((double)(int64_t)((count + members - 1) / members)) * es +
                (t->dtype == PD_BF16 ? 4 * count : 0);
        else if (in->coll.op == PC_REDUCE_SCATTER && t->dtype == PD_BF16)
            k = 4 * (count + count / members);
        else if (in->coll.op == PC_SEND)
            k = (double)t->bytes + 64;
        int g = 0;
        while (g < ng && keys[g] != key)
            g++;
        if (g == ng && ng < 64)
            keys[ng] = key, need[ng++] = 0;
        if (g < ng && k > need[g])
            need[g] = k;
    }
    double sum = 0;
    for (int g = 0; g < ng; g++)
        sum += need[g];
    return sum;
}

static void set_base(Model *m, int s, int gpu)
{
    const Plan *p = m->p;
    for (int t = 0; t < p->ntensors; t++)
        if (persistent_on(p, &p->tensors[t], s))
            m->base[m->cat[t]] += aligned(p->tensors[t].bytes);
    int mesh = plan_mesh_size(p) > 1;
    if (gpu) {
        m->base[MC_WORKSPACE] += CUDA_WORKSPACE;
        m->base[MC_COMM] += (double)plan_scratch_bytes(p, 1) + (mesh ? MEM_NCCL : 0);
        m->base[MC_RESERVED] += MEM_CUDA_CONTEXT;
    } else {
        m->base[MC_WORKSPACE] += cpu_workspace(p, s);
        m->base[MC_COMM] += mesh ? (double)plan_scratch_bytes(p, 0) + group_buffers(p, s) : 0;
    }
}

/* ---- the largest tensors at the peak ---- */

static void item_of(const Model *m, int t, int count, MemItem *it)
{
    const PlanTensor *pt = &m->p->tensors[t];
    const Value *v = pt->value >= 0 && pt->value < m->l->values.len ? m->l->values.data[pt->value]
                                                                   : NULL;
    it->name = pt->name && *pt->name ? pt->name : v && v->name ? v->name : NULL;
    if (!it->name && v && v->def)
        it->name = ir_ops[v->def->kind].name;
    if (!it->name)
        it->name = "temporary";
    it->loc = v ? v->loc : LOC_NONE;
    if (v && v->def && v->def->loc.line)
        it->loc = v->def->loc;
    it->cat = m->cat[t];
    it->bytes = aligned(pt->bytes);
    it->count = count;
}

static void keep_top(StageMemory *sm, const MemItem *it)
{
    int k = sm->ntop;
    if (k == 5) { /* full: it replaces the smallest, if larger */
        if (sm->top[4].bytes * sm->top[4].count >= it->bytes * it->count)
            return;
        k = 4;
    } else {
        sm->ntop++;
    }
    sm->top[k] = *it;
    for (; k > 0 && sm->top[k - 1].bytes * sm->top[k - 1].count < sm->top[k].bytes * sm->top[k].count; k--) {
        MemItem x = sm->top[k - 1];
        sm->top[k - 1] = sm->top[k], sm->top[k] = x;
    }
}

/* How many copies of tensor t are alive at the peak: persistent and
 * prologue tensors once; held ones once per microbatch that made them and has
 * not reached their last piece; the peak piece's own at its moment. */
static int copies_at(const Model *m, const Replay *r, const Peak *pk, const char *done, int t)
{
    const PlanTensor *pt = &m->p->tensors[t];
    int np = m->sp.npieces, b = m->birth[t], d = m->death[t], n = 0;
    Span s = m->sp.span[t];
    if (pt->role != PT_TEMP)
        return 1;
    if (s.first < 0)
        return 0;
    if (b < 0)
        return 1;
    int pos = pk->piece == np || !pk->later ? m->prof[pk->piece].at_first
                                            : m->prof[pk->piece].at_later;
    if (pk->piece == np) { /* the optimizer */
        if (b == np)
            return s.first <= pos && pos <= s.last;
        return accumulator(m, t) ? 1 : d == np ? r->m : 0;
    }
    if (accumulator(m, t))
        return b != pk->piece ? done[b] != 0 : !pk->later && s.first <= pos;
    for (int j = 0; j < r->m; j++) {
        const char *dj = done + (size_t)(j + 1) * (size_t)(np + 1);
        int mine = j == pk->mb && counted(m, t, pk->piece);
        if (mine)
            n += s.first <= pos && pos <= s.last;
        else if (b < np && dj[b] && (d >= np || !dj[d]))
            n++;
    }
    return n;
}

/* The schedule up to the peak: which pieces each microbatch has run
 * (done[0][P]: any microbatch; done[1 + j][P]: microbatch j). */
static char *done_before(Model *m, const Replay *r, int upto)
{
    int np = m->sp.npieces;
    size_t row = (size_t)np + 1;
    char *done = arena_alloc(m->a, row * (size_t)(r->m + 1));
    memset(done, 0, row * (size_t)(r->m + 1));
    for (int i = 0; i < upto && i < r->npc; i++) {
        int P = piece_of(r, i);
        if (P >= 0)
            done[P] = 1, done[(size_t)(r->pcs[i].mb + 1) * row + (size_t)P] = 1;
    }
    return done;
}

static void top_tensors(Model *m, int s, const Replay *r, const Peak *pk, StageMemory *sm)
{
    char *done = done_before(m, r, pk->at);
    for (int t = 0; t < m->p->ntensors; t++) {
        const PlanTensor *pt = &m->p->tensors[t];
        int n = pt->role == PT_TEMP ? copies_at(m, r, pk, done, t) : persistent_on(m->p, pt, s);
        if (n <= 0)
            continue;
        MemItem it;
        item_of(m, t, n, &it);
        keep_top(sm, &it);
    }
}

/* A gradient's reduction that the step runs once, on the sum over the
 * microbatches (every ZeRO level but 2 and 3, which reduce-scatter each
 * microbatch's part: passes/shard.c). */
static int summed_reduction(const Model *m, const char *grad, const Value *v)
{
    const Op *d = v->def;
    return m->zero < 2 && (d->kind == OP_ALL_REDUCE || d->kind == OP_REDUCE_SCATTER) &&
           d->nargs && grad[d->args[0]->id];
}

/* By Value.id: a value of one microbatch. Besides what the microbatch's own
 * ops make, a resharding step (a collective the partition inserts, shared:
 * mb -1) of such a value that is no gradient's reduction: an all-gather of
 * a sequence-split activation that the backward reads, run where its
 * operand is made, is held per microbatch like the operand would be. */
static char *microbatch_values(Arena *a, const Graph *l, const char *grad)
{
    char *own = arena_alloc(a, (size_t)l->values.len + 1);
    memset(own, 0, (size_t)l->values.len + 1);
    for (int i = 0; i < l->ops.len; i++) {
        const Op *op = l->ops.data[i];
        int mine = op->mb >= 0 || (op->nargs == 1 && op->nres == 1 && own[op->args[0]->id] &&
                                   !grad[op->res[0]->id] && op->kind != OP_PARAM);
        for (int j = 0; j < op->nres; j++)
            own[op->res[j]->id] = (char)mine;
    }
    return own;
}

/* ---- the model ---- */

static void describe(const Replay *r, const Peak *pk, int np, StageMemory *sm)
{
    static const char *const kinds[] = {"forward", "backward", "weight gradient"};
    sm->inflight = pk->inflight;
    if (pk->piece >= np || pk->at < 0 || pk->at >= r->npc) {
        snprintf(sm->moment, sizeof sm->moment, "optimizer");
        return;
    }
    const Piece *pc = &r->pcs[pk->at];
    int n = snprintf(sm->moment, sizeof sm->moment, "%s of microbatch %d", kinds[pc->kind], pc->mb);
    if (r->v > 1)
        snprintf(sm->moment + n, sizeof sm->moment - (size_t)n, ", chunk %d", pc->chunk);
}

static void model_stage(Model *m, int s, int gpu, const Schedule *sc, StageMemory *sm)
{
    const Plan *p = m->p;
    stage_prog(m->a, p, s, &m->sp);
    int nt = p->ntensors, np = m->sp.npieces;
    m->birth = arena_alloc(m->a, sizeof(int) * (size_t)(nt + 1));
    m->death = arena_alloc(m->a, sizeof(int) * (size_t)(nt + 1));
    m->prof = arena_alloc(m->a, sizeof(PieceProf) * (size_t)(np + 1));
    memset(m->prof, 0, sizeof(PieceProf) * (size_t)(np + 1));
    memset(m->base, 0, sizeof(Bytes));
    memset(m->pre, 0, sizeof(Bytes));
    m->saved = m->saved_layers = 0;
    tensor_pieces(m);
    char *grad = mem_gradient_values(m->a, m->l);
    char *own = microbatch_values(m->a, m->l, grad);
    char *reads = arena_alloc(m->a, (size_t)m->l->values.len + 1);
    memset(reads, 0, (size_t)m->l->values.len + 1);
    for (int i = 0; i < m->l->ops.len; i++) {
        const Op *op = m->l->ops.data[i];
        for (int k = 0; k < op->nargs && ((op->mb < 0 && op->phase == PH_BWD) || op->phase == PH_OPT); k++)
            reads[op->args[k]->id] = 1;
    }
    for (int t = 0; t < nt; t++) {
        const PlanTensor *pt = &p->tensors[t];
        const Value *v = pt->value >= 0 && pt->value < m->l->values.len ? m->l->values.data[pt->value]
                                                                       : NULL;
        m->shared[t] = pt->role == PT_TEMP && v && v->def &&
                       ((v->def->mb < 0 && v->def->kind != OP_PARAM && !own[v->id]) ||
                        summed_reduction(m, grad, v));
        m->summed[t] = v && reads[v->id];
        Span sp = m->sp.span[t];
        m->cat[t] = category(p, m->l, grad, t, sp.first >= 0 ? &p->instrs[m->sp.instr[sp.first]] : NULL);
    }
    set_base(m, s, gpu);
    classify(m);
    Events e;
    events(m, &e);
    sweep(m, &e);
    Replay r;
    Peak pk;
    align(m, sc, s, &r);
    replay(m, &r, &pk);
    memcpy(sm->cat, pk.b, sizeof(Bytes));
    sm->peak = total(pk.b);
    describe(&r, &pk, np, sm);
    sm->saved = m->saved, sm->saved_layers = m->saved_layers;
    top_tensors(m, s, &r, &pk, sm);
}

/* A loop plan (codegen/microbatch_loop.c) is the step itself, laid out: what the device
 * holds is its stage's slab, whatever the moment, plus the buffers beside it
 * (comm, workspace, allowances). The replay above gives the breakdown at the
 * largest moment; the difference the layout makes goes to its transient
 * categories: what the slab's reuse of memory across pieces and microbatches
 * leaves unused is added to temporaries, and what the replay counts twice
 * that the layout holds once (a microbatch's gradient part added into its sum
 * where the part dies) comes off temporaries, then activations, then
 * gradients. Parameters and optimizer state are exact in both. */
static void as_laid_out(const Plan *p, int s, StageMemory *st)
{
    double beside = st->cat[MC_COMM] + st->cat[MC_WORKSPACE] + st->cat[MC_RESERVED];
    double diff = (double)plan_stage_slab(p, s) + beside - st->peak;
    static const MemCat from[] = {MC_TEMPORARIES, MC_ACTIVATIONS, MC_GRADS};
    if (diff >= 0)
        st->cat[MC_TEMPORARIES] += diff;
    for (int k = 0; k < 3 && diff < 0; k++) {
        double take = -diff < st->cat[from[k]] ? -diff : st->cat[from[k]];
        st->cat[from[k]] -= take;
        diff += take;
    }
    st->peak = 0;
    for (int k = 0; k < MC_COUNT; k++)
        st->peak += st->cat[k];
}

int mem_model(Ctx *c, const Graph *g, const TrainConfig *tc, const Graph *local, const Plan *p, int gpu,
                      MemoryModel *out)
{
    Schedule sc;
    memset(out, 0, sizeof *out);
    if (sched_of_train(c, g, tc, &sc, "memory model") != 0)
        return -1;
    out->microbatches = sc.m;
    out->schedule = sched_kind_name(sc.kind);
    out->gpu = gpu;
    out->nstages = sc.p;
    out->stage = arena_alloc(c->arena, sizeof(StageMemory) * (size_t)sc.p);
    memset(out->stage, 0, sizeof(StageMemory) * (size_t)sc.p);
    Model m = {.a = c->arena, .p = p, .l = local, .zero = (int)tc->zero, .mbs = sc.m};
    m.cat = arena_alloc(c->arena, sizeof(MemCat) * (size_t)(p->ntensors + 1));
    m.shared = arena_alloc(c->arena, (size_t)p->ntensors + 1);
    m.summed = arena_alloc(c->arena, (size_t)p->ntensors + 1);
    m.sum = arena_alloc(c->arena, (size_t)p->ntensors + 1);
    memset(m.sum, 0, (size_t)p->ntensors + 1);
    for (int i = 0; i < p->ninstrs; i++)
        if (p->instrs[i].acc)
            m.sum[p->instrs[i].kind == PI_GEMM ? p->instrs[i].gemm.c : p->instrs[i].args[0]] = 1;
    for (int s = 0; s < sc.p; s++) {
        model_stage(&m, s, gpu, &sc, &out->stage[s]);
        if (p->nsched > 0)
            as_laid_out(p, s, &out->stage[s]);
        if (out->stage[s].peak > out->peak)
            out->peak = out->stage[s].peak, out->peak_stage = s;
    }
    return 0;
}

/* ---- the plan as it is ---- */

/* A loop plan's program as the runtime runs it (plan_expand_order: every
 * microbatch's pieces in the schedule's order), stage s: its largest moment
 * into live (which holds the base), by category. A temporary that only
 * instructions run for every microbatch touch lives, in each microbatch's
 * run, from its first touch to its last: between runs its bytes are free (a
 * frame tensor has an instance per microbatch; a piece's own value is made
 * again in the next run). One carried across the runs (an accumulator, a
 * value made or read once, in the prologue or epilogue, or by an instruction
 * run for the first or last microbatch only) lives from its first touch in
 * the program to its last. -1 when the program cannot be made. */
static int program_peak(Model *m, int s, double *best)
{
    const Plan *p = m->p;
    PlanItem *items;
    int n, nt = p->ntensors, k = p->microbatches + 1;
    char err[256];
    if (plan_expand_order(p, &items, &n, err, sizeof err) != 0)
        return -1;
    char *carried = arena_alloc(m->a, (size_t)nt + 1);
    memset(carried, 0, (size_t)nt + 1);
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        for (int j = 0; j < plan_instr_ntensors(in) && in->when != PW_EVERY; j++)
            carried[plan_instr_tensor(in, j)] = 1;
        if (in->acc)
            carried[in->kind == PI_GEMM ? in->gemm.c : in->args[0]] = 1;
    }
    for (int i = 0; i < n; i++) /* the prologue's and epilogue's tensors */
        for (int j = 0; items[i].mb < 0 && j < plan_instr_ntensors(&p->instrs[items[i].src]); j++)
            carried[plan_instr_tensor(&p->instrs[items[i].src], j)] = 1;
    size_t nkeys = (size_t)nt * (size_t)k;
    int *first = malloc(sizeof(int) * nkeys), *last = malloc(sizeof(int) * nkeys);
    int *born = malloc(sizeof(int) * ((size_t)n + 1)), *dies = malloc(sizeof(int) * ((size_t)n + 1));
    int *next_born = malloc(sizeof(int) * nkeys), *next_dies = malloc(sizeof(int) * nkeys);
    if (!first || !last || !born || !dies || !next_born || !next_dies) {
        free(first), free(last), free(born), free(dies), free(next_born), free(next_dies);
        free(items);
        return -1;
    }
    for (size_t q = 0; q < nkeys; q++)
        first[q] = last[q] = -1;
    int pos = 0;
    for (int i = 0; i < n; i++) {
        const PlanInstr *in = &p->instrs[items[i].src];
        if (!on_stage(p, in, s))
            continue;
        for (int j = 0; j < plan_instr_ntensors(in); j++) {
            int t = plan_instr_tensor(in, j);
            size_t key = (size_t)t * (size_t)k + (size_t)(carried[t] ? 0 : items[i].mb + 1);
            if (first[key] < 0)
                first[key] = pos;
            last[key] = pos;
        }
        pos++;
    }
    free(items);
    for (int i = 0; i < pos; i++)
        born[i] = dies[i] = -1;
    for (size_t q = nkeys; q-- > 0;) {
        if (first[q] < 0 || p->tensors[q / (size_t)k].role != PT_TEMP)
            continue;
        next_born[q] = born[first[q]], born[first[q]] = (int)q;
        next_dies[q] = dies[last[q]], dies[last[q]] = (int)q;
    }
    Bytes live;
    memcpy(live, best, sizeof(Bytes));
    for (int i = 0; i < pos; i++) {
        for (int q = born[i]; q >= 0; q = next_born[q])
            live[m->cat[q / k]] += aligned(p->tensors[q / k].bytes);
        if (total(live) > total(best))
            memcpy(best, live, sizeof(Bytes));
        for (int q = dies[i]; q >= 0; q = next_dies[q])
            live[m->cat[q / k]] -= aligned(p->tensors[q / k].bytes);
    }
    free(first), free(last), free(born), free(dies), free(next_born), free(next_dies);
    return 0;
}

double mem_plan_peak(Arena *a, const Plan *p, const Graph *local, int s, int gpu,
                             double *cat)
{
    Model m = {.a = a, .p = p, .l = local};
    stage_prog(a, p, s, &m.sp);
    m.cat = arena_alloc(a, sizeof(MemCat) * (size_t)(p->ntensors + 1));
    char *grad = mem_gradient_values(a, local);
    for (int t = 0; t < p->ntensors; t++) {
        Span sp = m.sp.span[t];
        m.cat[t] = category(p, local, grad, t, sp.first >= 0 ? &p->instrs[m.sp.instr[sp.first]] : NULL);
    }
    memset(m.base, 0, sizeof(Bytes));
    set_base(&m, s, gpu);
    Bytes best;
    memcpy(best, m.base, sizeof(Bytes));
    if (p->nsched > 0 && program_peak(&m, s, best) == 0) {
        /* a loop plan: its slab as laid out, and what is beside it */
        StageMemory st;
        memcpy(st.cat, best, sizeof(Bytes));
        st.peak = total(best);
        as_laid_out(p, s, &st);
        memcpy(best, st.cat, sizeof(Bytes));
    } else {
        Events e;
        events(&m, &e);
        Bytes live;
        memcpy(live, m.base, sizeof(Bytes));
        for (int i = 0; i < m.sp.n; i++) {
            for (int t = e.born[i]; t >= 0; t = e.next_born[t])
                live[m.cat[t]] += aligned(p->tensors[t].bytes);
            if (total(live) > total(best))
                memcpy(best, live, sizeof(Bytes));
            for (int t = e.dies[i]; t >= 0; t = e.next_dies[t])
                live[m.cat[t]] -= aligned(p->tensors[t].bytes);
        }
        if (p->nsched > 0) { /* the program could not be made: the compact plan, laid out */
            StageMemory st;
            memcpy(st.cat, best, sizeof(Bytes));
            st.peak = total(best);
            as_laid_out(p, s, &st);
            memcpy(best, st.cat, sizeof(Bytes));
        }
    }
    if (cat)
        memcpy(cat, best, sizeof(Bytes));
    return total(best);
}
