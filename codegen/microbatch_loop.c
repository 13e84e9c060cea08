/* microbatch_loop.c: the microbatch loop of a plan. The graph holds one microbatch's
 * step (passes/microbatch.c: its loss and each gradient a microbatch_sum);
 * the pipeline pass left every stage's schedule table (Graph.sched). Reads
 * the lowered instructions; writes when each runs, the piece it belongs to,
 * and the memory of the loop (instead of layout.c's).
 * Key idea: a value is a microbatch's own (per_mb) when its op belongs to a
 * microbatch or reads such a value, up to a microbatch_sum. An instruction
 * that makes one runs for every microbatch; the rest run once, in the
 * prologue, the epilogue, or with its piece's last microbatch (the sums are
 * complete then); a value received for all microbatches, with the first.
 * Memory: one stage runs its microbatches in turn, so one layout by the
 * compiled order serves them all (one_stage_memory). A pipeline stage has,
 * above its persistent tensors: each piece's transients, packed by the
 * compiled order into a block that every run of the piece occupies; frames,
 * one per span of pieces and microbatch, for what a microbatch holds from
 * one piece to a later one; and the values of the step (sums, what is
 * received once, the prologue's casts). The runs' blocks, the frames and the
 * step values are packed by where they live in the expanded program
 * (plan/expand.c), so a frame's memory is reused once its microbatch is
 * done with it, as the schedule allows. */
#include "kgen.h"

#include <stdlib.h>
#include <string.h>

int cg_loop_find(Gen *gen)
{
    const Graph *g = gen->g;
    const TrainConfig tc = gen->tc;
    int has = 0;
    for (int i = 0; i < g->ops.len; i++)
        has |= g->ops.data[i]->kind == OP_MB_SUM;
    if (!has || tc.microbatches < 2)
        return 0;
    if (!g->sched.len)
        return diag_error(&gen->c->diag, LOC_NONE,
                          "the graph holds one microbatch of %lld but no schedule table (a graph "
                          "read back after the pipeline pass): compile from the TDL",
                          (long long)tc.microbatches),
               -1;
    gen->loop = 1;
    gen->k = (int)tc.microbatches;
    gen->per_mb = arena_alloc(gen->a, (size_t)g->values.len + 1);
    memset(gen->per_mb, 0, (size_t)g->values.len + 1);
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        int pm = op->mb >= 0;
        for (int a = 0; a < op->nargs; a++)
            pm |= gen->per_mb[op->args[a]->id];
        for (int r = 0; r < op->nres; r++)
            gen->per_mb[op->res[r]->id] = (char)(pm && op->kind != OP_MB_SUM);
    }
    return 0;
}

/* An instruction lowered from op: every microbatch runs it when it makes a
 * microbatch's value (or adds one into a sum); else it runs once. */
PlanWhen cg_loop_when(const Gen *gen, const Op *op)
{
    if (!gen->loop || !op)
        return PW_EVERY;
    if (op->kind == OP_MB_SUM)
        return PW_EVERY;
    for (int r = 0; r < op->nres; r++)
        if (gen->per_mb[op->res[r]->id])
            return PW_EVERY;
    for (int a = 0; a < op->nargs; a++) /* no result: an update reads the step's values */
        if (!op->nres && gen->per_mb[op->args[a]->id])
            return PW_EVERY;
    return PW_LAST;
}

/* A message of maker's result to reader: a microbatch's value goes with
 * every microbatch; one of the step at the sender's once, and is received
 * with the first microbatch when a microbatch's instruction reads it. */
PlanWhen cg_loop_msg_when(const Gen *gen, const Op *maker, const Op *reader, int recv)
{
    if (!gen->loop)
        return PW_EVERY;
    if (cg_loop_when(gen, maker) == PW_EVERY && maker->kind != OP_MB_SUM)
        return PW_EVERY;
    return recv && cg_loop_when(gen, reader) == PW_EVERY ? PW_FIRST : PW_LAST;
}

/* A piece's reads of an input go through a copy of the microbatch's rows
 * into a temporary of the piece's own: kernels read aligned memory,
 * whatever the offset of the rows in the input (plan/expand.c). */
typedef struct RowsOf {
    int t, stage, piece, rows;
} RowsOf;

static void rows_copies(Gen *gen)
{
    int n = gen->instrs.len, stages = ir_pipeline_stages(&gen->g->mesh);
    PlanInstr *old = arena_alloc(gen->a, sizeof(PlanInstr) * (size_t)(n + 1));
    memcpy(old, gen->instrs.data, sizeof(PlanInstr) * (size_t)n);
    VEC(RowsOf) made = {0};
    gen->instrs.len = 0;
    for (int i = 0; i < n; i++) {
        PlanInstr in = old[i];
        int *gt[4] = {&in.gemm.a, &in.gemm.b, &in.gemm.c, &in.gemm.bias};
        int ng = in.kind != PI_GEMM ? 0 : in.gemm.epilogue == PE_BIAS ? 4 : 3;
        for (int j = 0; in.when == PW_EVERY && j < in.nargs + ng; j++) {
            int *at = j < in.nargs ? &in.args[j] : gt[j - in.nargs];
            if (gen->tensors.data[*at].role != PT_INPUT)
                continue;
            int m = 0;
            while (m < made.len && !(made.data[m].t == *at && made.data[m].stage == in.stage &&
                                     made.data[m].piece == in.piece))
                m++;
            if (m == made.len) {
                PlanTensor r = gen->tensors.data[*at];
                r.name = "", r.init = "", r.role = PT_TEMP, r.limit = 0, r.value = -1;
                r.shape[0] /= gen->k, r.bytes /= (uint64_t)gen->k;
                r.stage = stages > 1 ? in.stage : -1;
                VEC_PUSH(gen->a, gen->tensors, r);
                RowsOf ro = {*at, in.stage, in.piece, gen->tensors.len - 1};
                VEC_PUSH(gen->a, made, ro);
                PlanInstr cp = {.kind = PI_COPY, .nargs = 2, .phase = in.phase, .layer = in.layer,
                                .stage = in.stage, .piece = in.piece, .when = PW_EVERY, .rows = 1,
                                .mb = in.mb, .tick = in.tick, .op = in.op};
                cp.args = arena_alloc(gen->a, sizeof(int) * 2);
                cp.args[0] = ro.rows, cp.args[1] = *at;
                VEC_PUSH(gen->a, gen->instrs, cp);
            }
            *at = made.data[m].rows;
        }
        VEC_PUSH(gen->a, gen->instrs, in);
    }
}

static int by_int(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

/* An instruction that runs once and reads a sum over the microbatches (the
 * loss, from its microbatch_sum) runs when the sum is complete: in the piece
 * of its last add on that stage, or later. Its op's tick may be of another
 * stage's piece (the loss scaled where the sum arrives), which can come
 * before every piece of this stage and would put it in the prologue, before
 * the microbatches (it read the last step's sum). Pieces compare by tick; the
 * prologue (0) comes first, the epilogue (-1) last. */
static void after_sums(Gen *gen, const int *ticks, const int *at)
{
    const Graph *g = gen->g;
    int nt = gen->tensors.len;
    int *ready = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1)); /* the piece it is final in */
    for (int t = 0; t < nt; t++)
        ready[t] = 0;
    for (int i = 0; i < gen->instrs.len; i++) {
        PlanInstr *in = &gen->instrs.data[i];
        const Op *op = in->op > 0 ? g->ops.data[in->op - 1] : NULL;
        if (!op)
            continue;
        int rank = in->piece == 0 ? 0 : in->piece < 0 ? INT32_MAX : in->piece;
        if (op->kind == OP_MB_SUM) { /* each microbatch's add: final after its piece */
            int t = gen->tensor_of[op->res[0]->id];
            if (t >= 0 && rank > ready[t])
                ready[t] = rank;
            continue;
        }
        int need = 0;
        for (int a = 0; a < op->nargs; a++) {
            int t = gen->tensor_of[op->args[a]->id];
            if (t >= 0 && ready[t] > need)
                need = ready[t];
        }
        if (in->when == PW_EVERY || !need) /* what reads no sum keeps its piece */
            continue;
        if (need > rank) {
            int s = in->stage, lo = at[s], hi = at[s + 1];
            while (lo < hi && ticks[lo] < need)
                lo++;
            in->piece = need == INT32_MAX || lo == hi ? -1 : ticks[lo];
            rank = in->piece < 0 ? INT32_MAX : in->piece;
        }
        for (int r = 0; r < op->nres; r++) { /* a value of a sum: final no earlier */
            int t = gen->tensor_of[op->res[r]->id];
            if (t >= 0 && rank > ready[t])
                ready[t] = rank;
        }
    }
}

int cg_loop_pieces(Gen *gen)
{
    if (!gen->loop)
        return 0;
    const Graph *g = gen->g;
    int ns = ir_pipeline_stages(&g->mesh), n = g->sched.len;
    /* each stage's ticks of its table, sorted: [at[s], at[s + 1]) of ticks */
    int *at = arena_alloc(gen->a, sizeof(int) * (size_t)(ns + 2));
    int *ticks = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    memset(at, 0, sizeof(int) * (size_t)(ns + 2));
    for (int e = 0; e < n; e++) {
        const SchedStep *st = &g->sched.data[e];
        if (st->stage < 0 || st->stage >= ns)
            return diag_error(&gen->c->diag, LOC_NONE, "schedule table: stage %d of %d",
                              st->stage, ns),
                   -1;
        if (st->mb == 0)
            at[st->stage + 1]++;
        PlanSched ps = {st->stage, st->tick, st->mb};
        VEC_PUSH(gen->a, gen->sched, ps);
    }
    for (int s = 0; s < ns; s++)
        at[s + 1] += at[s];
    int *fill = arena_alloc(gen->a, sizeof(int) * (size_t)(ns + 1));
    memcpy(fill, at, sizeof(int) * (size_t)(ns + 1));
    for (int e = 0; e < n; e++)
        if (g->sched.data[e].mb == 0)
            ticks[fill[g->sched.data[e].stage]++] = g->sched.data[e].tick;
    for (int s = 0; s < ns; s++)
        qsort(ticks + at[s], (size_t)(at[s + 1] - at[s]), sizeof(int), by_int);
    for (int i = 0; i < gen->instrs.len; i++) {
        PlanInstr *in = &gen->instrs.data[i];
        int s = in->stage, lo = at[s], hi = at[s + 1], t = in->tick;
        if (lo == hi || (t < ticks[lo] && in->when != PW_EVERY)) {
            in->piece = 0; /* once, before the table's first piece: the prologue */
        } else if (t > ticks[hi - 1]) {
            in->piece = -1; /* after its last: the epilogue */
        } else { /* its piece, or (made from another stage's value) the next one here */
            while (lo < hi && ticks[lo] < t)
                lo++;
            in->piece = ticks[lo];
        }
        if (in->when == PW_EVERY && in->piece <= 0) {
            const Op *op = in->op > 0 ? g->ops.data[in->op - 1] : NULL;
            return diag_error(&gen->c->diag, op ? op->loc : LOC_NONE,
                              "the microbatch loop: an instruction of every microbatch "
                              "(from '%s') is outside the schedule's pieces (internal error)",
                              op ? ir_ops[op->kind].name : "?"),
                   -1;
        }
        if (in->kind == PI_COLL && (in->coll.op == PC_SEND || in->coll.op == PC_RECV) &&
            in->coll.tag + 1 > gen->ntags)
            gen->ntags = in->coll.tag + 1;
    }
    after_sums(gen, ticks, at);
    rows_copies(gen);
    return 0;
}

/* ---- memory ---- */

enum { K_NONE, K_TRANSIENT, K_FRAME, K_STEP };

typedef struct Mem {
    Gen *gen;
    Plan view;      /* the plan so far, for its expanded order */
    PlanItem *items;
    int nitems;
    char *kind;     /* by tensor */
    int *piece;     /* by tensor: the piece of its first instruction (INT_MIN: none yet) */
    char *several;  /* by tensor: touched in more than one piece, or by more than one kind of
                       instruction, or received */
} Mem;

static int is_recv(const PlanInstr *in) { return in->kind == PI_COLL && in->coll.op == PC_RECV; }


/* Each temporary's kind, from the instructions that touch it. */
static void classify(Mem *m)
{
    Gen *gen = m->gen;
    int nt = gen->tensors.len;
    char *every = arena_alloc(gen->a, (size_t)nt + 1), *once = arena_alloc(gen->a, (size_t)nt + 1);
    memset(every, 0, (size_t)nt + 1), memset(once, 0, (size_t)nt + 1);
    for (int t = 0; t < nt; t++)
        m->piece[t] = INT32_MIN, m->several[t] = 0;
    for (int i = 0; i < gen->instrs.len; i++) {
        PlanInstr *in = &gen->instrs.data[i];
        for (int j = 0, nts = plan_instr_ntensors(in); j < nts; j++) {
            int t = plan_instr_tensor(in, j);
            if (m->piece[t] == INT32_MIN)
                m->piece[t] = in->piece;
            else if (m->piece[t] != in->piece)
                m->several[t] = 1;
            if (in->when == PW_EVERY)
                every[t] = 1;
            else
                once[t] |= (char)(1 << in->when);
            if (is_recv(in) && j == 0)
                m->several[t] = 1; /* a receive may be moved to an earlier piece */
        }
    }
    for (int t = 0; t < nt; t++) {
        const PlanTensor *pt = &gen->tensors.data[t];
        if (pt->role != PT_TEMP || m->piece[t] == INT32_MIN)
            m->kind[t] = K_NONE;
        else if (every[t] && !once[t])
            m->kind[t] = m->several[t] ? K_FRAME : K_TRANSIENT;
        else if (!every[t] && !m->several[t] && (once[t] == 1 << PW_LAST || once[t] == 1 << PW_FIRST))
            m->kind[t] = K_TRANSIENT;
        else
            m->kind[t] = K_STEP;
        for (int o = 0; o < gen->g->outputs.len; o++) /* outputs live to the end */
            if (gen->tensor_of[gen->g->outputs.data[o]->id] == t && m->kind[t] != K_NONE)
                m->kind[t] = K_STEP;
    }
}

/* The frames of stage s: one per span (first piece, last piece) of its frame
 * tensors, each packed by the compiled order; *nf frames from gen->frames'
 * length on; frame tensors get frame and offset. */
typedef struct Span {
    int first, last, frame;
} Span;

static void frames_of(Mem *m, const int *space, int ns_t, const int *first, const int *last,
                      const int *pfirst, const int *plast, Span **spans, int *nspans)
{
    Gen *gen = m->gen;
    Span *sp = arena_alloc(gen->a, sizeof(Span) * (size_t)(ns_t + 1));
    int nsp = 0;
    int *of = arena_alloc(gen->a, sizeof(int) * (size_t)(ns_t + 1));
    for (int k = 0; k < ns_t; k++) {
        int t = space[k], j = 0;
        if (m->kind[t] != K_FRAME)
            continue;
        while (j < nsp && !(sp[j].first == pfirst[t] && sp[j].last == plast[t]))
            j++;
        if (j == nsp)
            sp[nsp++] = (Span){pfirst[t], plast[t], 0};
        of[k] = j;
    }
    for (int j = 0; j < nsp; j++) {
        int cnt = 0;
        for (int k = 0; k < ns_t; k++)
            cnt += m->kind[space[k]] == K_FRAME && of[k] == j;
        uint64_t *size = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(cnt + 1));
        uint64_t *off = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(cnt + 1));
        int *f = arena_alloc(gen->a, sizeof(int) * (size_t)(cnt + 1));
        int *l = arena_alloc(gen->a, sizeof(int) * (size_t)(cnt + 1));
        int *who = arena_alloc(gen->a, sizeof(int) * (size_t)(cnt + 1)), c = 0;
        for (int k = 0; k < ns_t; k++) {
            int t = space[k];
            if (m->kind[t] != K_FRAME || of[k] != j)
                continue;
            /* a received tensor may arrive earlier than compiled: alive from the frame's start */
            size[c] = cg_aligned(gen->tensors.data[t].bytes);
            f[c] = m->several[t] == 2 ? 0 : first[t], l[c] = last[t], who[c++] = t;
        }
        uint64_t bytes = cg_pack(gen, c, size, f, l, 0, off);
        PlanFrame fr = {gen->tensors.data[who[0]].stage < 0 ? 0 : gen->tensors.data[who[0]].stage,
                        bytes ? bytes : PLAN_ALIGN, NULL};
        fr.base = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)gen->k);
        VEC_PUSH(gen->a, gen->frames, fr);
        sp[j].frame = gen->frames.len - 1;
        for (int q = 0; q < c; q++) {
            gen->tensors.data[who[q]].offset = off[q];
            gen->tensors.data[who[q]].frame = sp[j].frame + 1;
        }
    }
    *spans = sp, *nspans = nsp;
}

/* The piece of each tensor's first and last instruction in the compiled
 * order of stage s (pfirst, plast). */
static void stage_pieces(Gen *gen, int s, int stages, const int *first, int *pfirst, int *plast)
{
    for (int i = 0; i < gen->instrs.len; i++) { /* pieces in the compiled order of the stage */
        PlanInstr *in = &gen->instrs.data[i];
        if (stages > 1 && in->stage != s)
            continue;
        for (int j = 0, c = plan_instr_ntensors(in); j < c; j++) {
            int t = plan_instr_tensor(in, j);
            if (first[t] == i)
                pfirst[t] = in->piece;
            plast[t] = in->piece;
        }
    }
}

/* What stage s places by the expanded order: its items [lo, hi) there, and
 * nall things alive over them, each over [xf[q], xl[q]] with xs[q] bytes, at
 * xo[q] once placed: first the nfi frame instances (span j's for microbatch
 * mb at j k + mb), then the step values (slot[t], by tensor). */
typedef struct StageItems {
    int lo, hi, nfi, nall;
    int *slot, *xf, *xl;
    uint64_t *xs, *xo;
} StageItems;

/* The stage's frame instances and step values, and when each is alive in
 * the expanded order. */
static void stage_items(Mem *m, int s, int stages, const int *space, int n, const Span *sp,
                        int nsp, StageItems *x)
{
    Gen *gen = m->gen;
    PlanTensor *ts = gen->tensors.data;
    int nt = gen->tensors.len;
    /* the expanded order: frame instances and step values, by item */
    int lo = 0, hi = 0;
    while (lo < m->nitems && m->view.instrs[m->items[lo].src].stage != s && stages > 1)
        lo++;
    for (hi = lo; hi < m->nitems && (stages == 1 || m->view.instrs[m->items[hi].src].stage == s);
         hi++)
        ;
    int nfi = nsp * gen->k, nstep = 0;
    int *slot = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1)); /* step value: its item */
    for (int k = 0; k < n; k++)
        if (m->kind[space[k]] == K_STEP)
            slot[space[k]] = nfi + nstep++;
    int nall = nfi + nstep;
    int *xf = arena_alloc(gen->a, sizeof(int) * (size_t)(nall + 1));
    int *xl = arena_alloc(gen->a, sizeof(int) * (size_t)(nall + 1));
    uint64_t *xs = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(nall + 1));
    uint64_t *xo = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(nall + 1));
    for (int q = 0; q < nall; q++)
        xf[q] = INT32_MAX, xl[q] = -1;
    int *fspan = arena_alloc(gen->a, sizeof(int) * (size_t)(gen->frames.len + 1));
    for (int j = 0; j < nsp; j++)
        fspan[sp[j].frame] = j;
    for (int it = lo; it < hi; it++) {
        PlanInstr *in = &m->view.instrs[m->items[it].src];
        int mb = m->items[it].mb;
        for (int j = 0, cnt = plan_instr_ntensors(in); j < cnt; j++) {
            int t = plan_instr_tensor(in, j), q = -1;
            if (m->kind[t] == K_FRAME && ts[t].frame > 0 && mb >= 0)
                q = fspan[ts[t].frame - 1] * gen->k + mb;
            else if (m->kind[t] == K_STEP)
                q = slot[t];
            if (q < 0)
                continue;
            xf[q] = it < xf[q] ? it : xf[q];
            xl[q] = it > xl[q] ? it : xl[q];
        }
    }
    for (int o = 0; o < gen->g->outputs.len; o++) { /* outputs: to the end of the step */
        int t = gen->tensor_of[gen->g->outputs.data[o]->id];
        if (t >= 0 && m->kind[t] == K_STEP && xl[slot[t]] >= 0 && ts[t].stage == (stages > 1 ? s : ts[t].stage))
            xl[slot[t]] = hi;
    }
    for (int q = 0; q < nall; q++) {
        if (q < nfi)
            xs[q] = gen->frames.data[sp[q / gen->k].frame].bytes;
        if (xl[q] < 0) /* never touched (a frame instance): anywhere */
            xf[q] = xl[q] = lo;
    }
    for (int k = 0; k < n; k++)
        if (m->kind[space[k]] == K_STEP)
            xs[slot[space[k]]] = cg_aligned(ts[space[k]].bytes);
    *x = (StageItems){lo, hi, nfi, nall, slot, xf, xl, xs, xo};
}

/* The stage's entries of the schedule, ne of them: 0 the prologue, 1.. the
 * table's, then the epilogue; by entry its piece (epiece) and its first and
 * last item in the expanded order (efirst, elast; -1 when none). */
static int stage_entries(Mem *m, int s, int stages, const StageItems *x, int **epiece_,
                         int **efirst_, int **elast_)
{
    Gen *gen = m->gen;
    int ne = 2; /* this stage's entries: 0 the prologue, 1.. the table's, then the epilogue */
    for (int e = 0; e < gen->sched.len; e++)
        ne += stages == 1 || gen->sched.data[e].stage == s;
    int *epiece = arena_alloc(gen->a, sizeof(int) * (size_t)(ne + 1));
    int *efirst = arena_alloc(gen->a, sizeof(int) * (size_t)(ne + 1));
    int *elast = arena_alloc(gen->a, sizeof(int) * (size_t)(ne + 1));
    epiece[0] = 0, epiece[ne - 1] = -1;
    for (int e = 0, k = 1; e < gen->sched.len; e++)
        if (stages == 1 || gen->sched.data[e].stage == s)
            epiece[k++] = gen->sched.data[e].piece;
    for (int e = 0; e < ne; e++)
        efirst[e] = -1, elast[e] = -1;
    for (int it = x->lo; it < x->hi; it++) {
        int e = m->items[it].entry;
        if (e < 0 || e >= ne)
            continue;
        efirst[e] = efirst[e] < 0 ? it : efirst[e];
        elast[e] = it;
    }
    *epiece_ = epiece, *efirst_ = efirst, *elast_ = elast;
    return ne;
}

/* Each piece's transients packed by the compiled order, apart, from top;
 * by entry, the bytes its piece's transients take (0: none). */
static uint64_t *piece_transients(Mem *m, const int *space, int n, const int *first,
                                  const int *last, int ne, const int *epiece, uint64_t top)
{
    Gen *gen = m->gen;
    PlanTensor *ts = gen->tensors.data;
    int nt = gen->tensors.len;
    int nx = 0;
    for (int k = 0; k < n; k++)
        nx += m->kind[space[k]] == K_TRANSIENT;
    uint64_t *size = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(nx + 1));
    uint64_t *off = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(nx + 1));
    int *f = arena_alloc(gen->a, sizeof(int) * (size_t)(nx + 1));
    int *l = arena_alloc(gen->a, sizeof(int) * (size_t)(nx + 1));
    int *who = arena_alloc(gen->a, sizeof(int) * (size_t)(nx + 1));
    char *done = arena_alloc(gen->a, (size_t)nt + 1);
    memset(done, 0, (size_t)nt + 1);
    uint64_t *psize = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(ne + 1)); /* by entry */
    memset(psize, 0, sizeof(uint64_t) * (size_t)(ne + 1));
    for (int k0 = 0; k0 < n; k0++) { /* piece by piece, from 0 */
        int t0 = space[k0];
        if (m->kind[t0] != K_TRANSIENT || done[t0])
            continue;
        int piece = m->piece[t0], c = 0;
        for (int k = k0; k < n; k++) {
            int t = space[k];
            if (m->kind[t] != K_TRANSIENT || done[t] || m->piece[t] != piece)
                continue;
            done[t] = 1;
            size[c] = cg_aligned(ts[t].bytes), f[c] = first[t], l[c] = last[t], who[c++] = t;
        }
        uint64_t region = cg_pack(gen, c, size, f, l, 0, off);
        for (int q = 0; q < c; q++)
            ts[who[q]].offset = top + off[q];
        for (int e = 0; e < ne; e++)
            if (epiece[e] == piece)
                psize[e] = region;
    }
    return psize;
}

/* One block per run of a piece (an entry), as large as that piece's
 * transients, alive over the run, placed first from top (runs never meet,
 * so every block starts at top); then the frame instances and step values
 * around the blocks: a run's transients sit in its block, which nothing
 * alive in the run overlaps. The frames' bases and the step values'
 * offsets; the top. */
static uint64_t place_runs(Mem *m, const Span *sp, const int *space, int n, int ne,
                           const int *efirst, const int *elast, const uint64_t *psize,
                           const StageItems *x, uint64_t top)
{
    Gen *gen = m->gen;
    PlanTensor *ts = gen->tensors.data;
    int nall = x->nall, nfi = x->nfi;
    int nb = 0, ntot = ne + nall;
    int *bf = arena_alloc(gen->a, sizeof(int) * (size_t)(ntot + 1));
    int *bl = arena_alloc(gen->a, sizeof(int) * (size_t)(ntot + 1));
    uint64_t *bs = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(ntot + 1));
    uint64_t *bo = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(ntot + 1));
    for (int e = 0; e < ne; e++)
        if (psize[e] && efirst[e] >= 0)
            bf[nb] = efirst[e], bl[nb] = elast[e], bs[nb++] = psize[e];
    memcpy(bf + nb, x->xf, sizeof(int) * (size_t)nall);
    memcpy(bl + nb, x->xl, sizeof(int) * (size_t)nall);
    memcpy(bs + nb, x->xs, sizeof(uint64_t) * (size_t)nall);
    uint64_t end = cg_pack_after(gen, nb, nb + nall, bs, bf, bl, top, bo);
    memcpy(x->xo, bo + nb, sizeof(uint64_t) * (size_t)nall);
    for (int b = 0; b < nb; b++)
        if (bo[b] != top)
            BUG("a piece's transients were placed at %llu, not at %llu",
                (unsigned long long)bo[b], (unsigned long long)top);
    for (int q = 0; q < nfi; q++)
        gen->frames.data[sp[q / gen->k].frame].base[q % gen->k] = x->xo[q];
    for (int k = 0; k < n; k++)
        if (m->kind[space[k]] == K_STEP)
            ts[space[k]].offset = x->xo[x->slot[space[k]]];
    return end;
}

/* The tensors of stage s (space[0..n)) laid out from *top: apart, the
 * persistent ones; then, by the compiled order, the transients of each
 * piece and each frame's insides; then, by the expanded order, one block
 * per run of a piece, the frame instances and the step values. */
static void stage_memory(Mem *m, int s, int stages, const int *space, int n, uint64_t *top)
{
    Gen *gen = m->gen;
    PlanTensor *ts = gen->tensors.data;
    int nt = gen->tensors.len;
    for (int k = 0; k < n; k++) /* persistent tensors, and untouched temporaries: apart */
        if (m->kind[space[k]] == K_NONE) {
            ts[space[k]].offset = *top;
            *top += cg_aligned(ts[space[k]].bytes);
        }
    /* the compiled order: transients and each frame's insides */
    int *first = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    int *last = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    cg_lifetimes(gen, first, last);
    int *pfirst = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    int *plast = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    stage_pieces(gen, s, stages, first, pfirst, plast);
    Span *sp;
    int nsp;
    frames_of(m, space, n, first, last, pfirst, plast, &sp, &nsp);
    StageItems x;
    stage_items(m, s, stages, space, n, sp, nsp, &x);
    int *epiece, *efirst, *elast;
    int ne = stage_entries(m, s, stages, &x, &epiece, &efirst, &elast);
    uint64_t *psize = piece_transients(m, space, n, first, last, ne, epiece, *top);
    *top = place_runs(m, sp, space, n, ne, efirst, elast, psize, &x, *top);
}

/* One stage runs its microbatches one after the other (F0 B0 F1 B1 ...):
 * no two hold values at once, so one layout by the compiled order serves
 * them all, as for a plan without a loop, but for the sums (made from the
 * first microbatch's piece on) and what a microbatch reads of the step,
 * which live through every microbatch's pieces: no piece of another
 * microbatch may reuse them (the epilogue may). */
static void one_stage_memory(Mem *m, uint64_t *top)
{
    Gen *gen = m->gen;
    PlanTensor *ts = gen->tensors.data;
    int nt = gen->tensors.len;
    int *first = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    int *last = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    char *every = arena_alloc(gen->a, (size_t)nt + 1);
    memset(every, 0, (size_t)nt + 1);
    cg_lifetimes(gen, first, last);
    /* the compiled order's first and last instruction of a microbatch's pieces */
    int pieces_start = gen->instrs.len, pieces_end = 0;
    for (int i = 0; i < gen->instrs.len; i++)
        if (gen->instrs.data[i].piece > 0) {
            pieces_start = i < pieces_start ? i : pieces_start;
            pieces_end = i;
        }
    /* every[t]: bit 1, touched in a piece; bit 2, before the last microbatch's runs (in the
     * prologue, or for every or the first microbatch) */
    for (int i = 0; i < gen->instrs.len; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        for (int j = 0, c = plan_instr_ntensors(in); j < c; j++)
            every[plan_instr_tensor(in, j)] |=
                (char)((in->piece > 0) | (in->piece == 0 || in->when != PW_LAST) << 1);
    }
    for (int t = 0; t < nt; t++) /* persistent tensors and untouched temporaries: apart */
        if (m->kind[t] == K_NONE) {
            ts[t].offset = *top;
            *top += cg_aligned(ts[t].bytes);
        }
    uint64_t *size = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(nt + 1));
    uint64_t *off = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)(nt + 1));
    int *f = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    int *l = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    int *who = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1)), c = 0;
    for (int t = 0; t < nt; t++) {
        if (m->kind[t] == K_NONE)
            continue;
        size[c] = cg_aligned(ts[t].bytes), f[c] = first[t], l[c] = last[t], who[c] = t;
        if (m->kind[t] == K_STEP && every[t] == 3) { /* a sum, what every microbatch reads: */
            f[c] = f[c] < pieces_start ? f[c] : pieces_start;   /* through all their pieces */
            l[c] = l[c] > pieces_end ? l[c] : pieces_end;
        }
        c++;
    }
    uint64_t end = cg_pack(gen, c, size, f, l, *top, off);
    for (int q = 0; q < c; q++)
        ts[who[q]].offset = off[q];
    *top = end;
}

int cg_loop_memory(Gen *gen)
{
    const Graph *g = gen->g;
    int nt = gen->tensors.len, stages = ir_pipeline_stages(&g->mesh);
    char err[512];
    Mem m = {.gen = gen};
    memset(&m.view, 0, sizeof m.view);
    m.view.naxes = g->mesh.naxes;
    m.view.axes = arena_alloc(gen->a, sizeof(PlanAxis) * (size_t)(g->mesh.naxes + 1));
    for (int i = 0; i < g->mesh.naxes; i++)
        m.view.axes[i] = (PlanAxis){(char *)g->mesh.axes[i].name,
                                    (char *)ir_role_name(g->mesh.axes[i].role),
                                    g->mesh.axes[i].size, 0};
    m.view.instrs = gen->instrs.data, m.view.ninstrs = gen->instrs.len;
    m.view.sched = gen->sched.data, m.view.nsched = gen->sched.len;
    m.view.microbatches = gen->k, m.view.ntags = gen->ntags;
    if (plan_expand_order(&m.view, &m.items, &m.nitems, err, sizeof err))
        return diag_error(&gen->c->diag, LOC_NONE, "the microbatch loop: %s", err), -1;
    m.kind = arena_alloc(gen->a, (size_t)nt + 1);
    m.piece = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    m.several = arena_alloc(gen->a, (size_t)nt + 1);
    classify(&m);
    for (int i = 0; i < gen->instrs.len; i++) /* received: alive from its frame's start */
        if (is_recv(&gen->instrs.data[i]) && m.kind[gen->instrs.data[i].args[0]] == K_FRAME)
            m.several[gen->instrs.data[i].args[0]] = 2;
    int *space = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1)), n = 0;
    uint64_t common = 0;
    gen->stage_slab = arena_alloc(gen->a, sizeof(uint64_t) * (size_t)stages);
    if (stages > 1) /* what every stage holds: the same offsets everywhere, apart */
        for (int t = 0; t < nt; t++)
            if (cg_everywhere(gen, t)) {
                gen->tensors.data[t].offset = common;
                common += cg_aligned(gen->tensors.data[t].bytes);
            }
    gen->slab = common;
    for (int s = 0; s < stages; s++) {
        n = 0;
        for (int t = 0; t < nt; t++)
            if (stages == 1 || (!cg_everywhere(gen, t) && gen->tensors.data[t].stage == s))
                space[n++] = t;
        uint64_t top = common;
        if (stages == 1)
            one_stage_memory(&m, &top);
        else
            stage_memory(&m, s, stages, space, n, &top);
        gen->stage_slab[s] = top ? top : PLAN_ALIGN;
        gen->slab = top > gen->slab ? top : gen->slab;
    }
    free(m.items);
    return 0;
}
