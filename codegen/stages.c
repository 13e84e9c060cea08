/* stages.c: one program per pipeline stage. Reads the lowered instructions
 * (in op order, each with its op in gen->owner) and the pipeline pass's
 * stages and ticks; writes each stage's program into gen->instrs with the
 * sends and receives between stages, then the gradient buckets (buckets.c)
 * and the microbatch loop's pieces (microbatch_loop.c).
 * Key idea: a tensor computed on one stage and read on another is sent once
 * per step right after the op that computes it and received, into a copy of
 * the reader's own, just before its first reader there; each channel
 * delivers in the order it sends. */
#include "kgen.h"

#include <stdlib.h>
#include <string.h>

/* ---- pipeline stages: one program per stage, sends and receives between ---- */

typedef struct Event {
    int stage, tick, pos, sub; /* the order: a stage's program by (tick, position) */
    int instr;                 /* index into gen->instrs, or -1 - (send index) */
} Event;

static int by_event(const void *x, const void *y)
{
    const Event *a = x, *b = y;
    if (a->stage != b->stage)
        return a->stage - b->stage;
    if (a->tick != b->tick)
        return a->tick < b->tick ? -1 : 1;
    if (a->pos != b->pos)
        return a->pos < b->pos ? -1 : 1;
    return a->sub < b->sub ? -1 : a->sub > b->sub;
}

/* The tensors instruction in touches, by pointer (to rewrite them). */
static int touched(PlanInstr *in, int **out)
{
    int n = 0;
    for (int a = 0; a < in->nargs; a++)
        out[n++] = &in->args[a];
    if (in->kind == PI_GEMM) {
        out[n++] = &in->gemm.a;
        out[n++] = &in->gemm.b;
        out[n++] = &in->gemm.c;
        if (in->gemm.epilogue == PE_BIAS)
            out[n++] = &in->gemm.bias;
    }
    return n;
}

static PlanInstr p2p(Gen *gen, PlanCollKind k, int tensor, int stage, int peer, int tag,
                     const PlanInstr *like)
{
    PlanInstr in = {.kind = PI_COLL, .nargs = 1, .phase = like->phase, .layer = like->layer,
                    .stage = stage, .mb = like->mb, .tick = like->tick, .op = like->op};
    in.args = arena_alloc(gen->a, sizeof(int));
    in.args[0] = tensor;
    in.coll.op = k;
    in.coll.dim = in.coll.dim2 = -1;
    in.coll.peer = peer;
    in.coll.tag = tag;
    in.coll.bytes = (int64_t)gen->tensors.data[tensor].bytes;
    for (int a = 0; a < gen->g->mesh.naxes; a++)
        if (gen->g->mesh.axes[a].role == ROLE_PIPELINE)
            in.coll.axes[in.coll.naxes++] = (int8_t)a;
    return in;
}

/* A temporary without a stage (made while lowering an op) that instructions
 * of one stage only touch belongs to that stage: its memory is that stage's. */
static void own_temps(Gen *gen)
{
    int nt = gen->tensors.len;
    int *seen = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1)); /* -1 none, -2 several */
    for (int t = 0; t < nt; t++)
        seen[t] = -1;
    for (int i = 0; i < gen->instrs.len; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        const PlanGemm *g = &in->gemm;
        int gt[4] = {g->a, g->b, g->c, g->bias};
        int ng = in->kind != PI_GEMM ? 0 : g->epilogue == PE_BIAS ? 4 : 3;
        for (int k = 0; k < in->nargs + ng; k++) {
            int t = k < in->nargs ? in->args[k] : gt[k - in->nargs];
            seen[t] = seen[t] == -1 || seen[t] == in->stage ? in->stage : -2;
        }
    }
    for (int t = 0; t < nt; t++)
        if (gen->tensors.data[t].role == PT_TEMP && gen->tensors.data[t].stage < 0 && seen[t] >= 0)
            gen->tensors.data[t].stage = seen[t];
}

/* A message between stages: from its sender to its receiver, and its place
 * in the merged order (its send's). */
typedef struct Msg {
    int from, to, sent, k;
} Msg;

static int by_channel(const void *x, const void *y)
{
    const Msg *a = x, *b = y;
    if (a->from != b->from || a->to != b->to)
        return a->from != b->from ? a->from - b->from : a->to - b->to;
    return (a->sent > b->sent) - (a->sent < b->sent);
}

/* Receive k goes before event before[k]. Each channel (an ordered pair of
 * stages) must deliver its messages in the order they are sent: NCCL pairs a
 * channel's k-th send with its k-th recv whatever the tags (plan/comm_match.c).
 * A receive placed after one its sender sends later moves up to just before
 * that one: it then waits no longer than that one would (its send comes
 * first), so no new wait arises. */
static void recvs_in_send_order(Gen *gen, const PlanInstr *recvs, const int *sent, int *before,
                                int nr)
{
    Msg *m = arena_alloc(gen->a, sizeof(Msg) * (size_t)(nr + 1));
    for (int k = 0; k < nr; k++)
        m[k] = (Msg){recvs[k].coll.peer, recvs[k].stage, sent[k], k};
    qsort(m, (size_t)nr, sizeof(Msg), by_channel);
    for (int j = nr - 2; j >= 0; j--)
        if (m[j].from == m[j + 1].from && m[j].to == m[j + 1].to &&
            before[m[j + 1].k] < before[m[j].k])
            before[m[j].k] = before[m[j + 1].k];
}

/* A receive's place: the event it precedes, then its send's place. */
typedef struct RecvAt {
    int before, sent, k;
} RecvAt;

static int by_place(const void *x, const void *y)
{
    const RecvAt *a = x, *b = y;
    if (a->before != b->before)
        return a->before - b->before;
    return (a->sent > b->sent) - (a->sent < b->sent);
}

/* The program of every stage into gen->instrs: the sorted instructions ev,
 * each receive before its event (several: in their sends' order), the sends
 * after their makers. */
static void merge_programs(Gen *gen, const Event *ev, int n, const PlanInstr *recvs, int *before,
                           const Event *sends, const PlanInstr *send_in, int ns)
{
    int m = 0, *sent = arena_alloc(gen->a, sizeof(int) * (size_t)(ns + 1));
    Event *all = arena_alloc(gen->a, sizeof(Event) * (size_t)(n + ns + 1));
    memcpy(all, ev, sizeof(Event) * (size_t)n);
    for (int k = 0; k < ns; k++) {
        all[n + k] = sends[k];
        all[n + k].sub = INT32_MAX - ns + k; /* after the maker, in order */
        all[n + k].instr = -1 - k;
    }
    qsort(all, (size_t)(n + ns), sizeof(Event), by_event);
    for (int e = 0; e < n + ns; e++)
        if (all[e].instr < 0)
            sent[-1 - all[e].instr] = e;
    if (!gen->loop) /* a loop plan's channels are put in order when expanded (plan/expand.c) */
        recvs_in_send_order(gen, recvs, sent, before, ns);
    /* by instruction: its receives, as a list in place order */
    RecvAt *place = arena_alloc(gen->a, sizeof(RecvAt) * (size_t)(ns + 1));
    int *first = arena_alloc(gen->a, sizeof(int) * (size_t)(n + 1));
    int *next = arena_alloc(gen->a, sizeof(int) * (size_t)(ns + 1));
    for (int k = 0; k < ns; k++)
        place[k] = (RecvAt){before[k], sent[k], k};
    qsort(place, (size_t)ns, sizeof(RecvAt), by_place);
    for (int i = 0; i < n; i++)
        first[i] = -1;
    for (int j = ns - 1; j >= 0; j--) {
        int at = ev[place[j].before].instr;
        next[place[j].k] = first[at];
        first[at] = place[j].k;
    }
    PlanInstr *out = arena_alloc(gen->a, sizeof(PlanInstr) * (size_t)(n + 2 * ns + 1));
    for (int e = 0; e < n + ns; e++) {
        if (all[e].instr < 0) {
            out[m++] = send_in[-1 - all[e].instr];
            continue;
        }
        for (int k = first[all[e].instr]; k >= 0; k = next[k])
            out[m++] = recvs[k];
        out[m++] = gen->instrs.data[all[e].instr];
    }
    gen->instrs.len = 0;
    for (int i = 0; i < m; i++)
        VEC_PUSH(gen->a, gen->instrs, out[i]);
}

/* Each op's instructions go to its stage, in the order (tick, position) the
 * pipeline pass gave (passes/pipeline.c). A tensor computed on one stage and
 * read on another is sent once per step right after the op that computes it
 * (a parameter: at the start) and received, into a tensor of the reader's
 * own, just before its first reader there; the readers there then use that
 * copy, so each stage's temporaries live in its own part of the order.
 * Inputs, the step and coordinates are written on every device: never sent. */
int cg_stage_programs(Gen *gen)
{
    const Graph *g = gen->g;
    int n = gen->instrs.len, nt = gen->tensors.len, stages = ir_pipeline_stages(&g->mesh);
    /* home: the stage computing each tensor; its op (for the send's place) */
    int *home = arena_alloc(gen->a, sizeof(int) * (size_t)(nt + 1));
    const Op **maker = arena_alloc(gen->a, sizeof(Op *) * (size_t)(nt + 1));
    for (int t = 0; t < nt; t++)
        home[t] = -1, maker[t] = NULL;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        PlanRole r = cg_role_of(op);
        for (int j = 0; j < op->nres; j++) {
            int t = gen->tensor_of[op->res[j]->id];
            if (t < 0 || maker[t])
                continue;
            maker[t] = op;
            home[t] = r == PT_INPUT || r == PT_STEP || r == PT_COORD ? -1 : op->stage;
        }
    }
    for (int t = 0; t < nt; t++)
        gen->tensors.data[t].stage = stages > 1 ? home[t] : -1;
    Event *ev = arena_alloc(gen->a, sizeof(Event) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) {
        const Op *op = g->ops.data[gen->owner.data[i]];
        /* a sum that its weight gradient's GEMM adds into runs where the matmul is
         * (fusion.c), so the GEMM's operands are not held to the end of the backward */
        const Op *at = gen->acc_gemm && gen->acc_gemm[op->id] ? g->ops.data[gen->acc_gemm[op->id] - 1]
                                                              : op;
        gen->instrs.data[i].stage = stages > 1 ? op->stage : 0;
        ev[i] = (Event){gen->instrs.data[i].stage, at->tick, at->id, i, i};
    }
    int ticked = 0; /* one stage with ticks: its microbatches in the schedule's order */
    for (int i = 0; i < g->ops.len; i++)
        ticked |= g->ops.data[i]->tick != 0;
    if (ticked || stages > 1) { /* (one stage has nothing to send) */
        qsort(ev, (size_t)n, sizeof(Event), by_event);
        /* by (tensor, stage): the copy received there, -1 when none yet */
        int *copy = arena_alloc(gen->a, sizeof(int) * (size_t)nt * (size_t)stages + 1);
        for (size_t k = 0; k < (size_t)nt * (size_t)stages; k++)
            copy[k] = -1;
        VEC(PlanInstr) recvs = {0}; /* (the receive; its event follows it) */
        VEC(int) recv_before = {0};
        VEC(Event) sends = {0};
        VEC(PlanInstr) send_in = {0};
        int tag = 0;
        for (int e = 0; e < n; e++) {
            PlanInstr *in = &gen->instrs.data[ev[e].instr];
            int *ts[72];
            int nts = touched(in, ts), s = in->stage;
            for (int k = 0; k < nts; k++) {
                int t = *ts[k];
                if (t >= nt || home[t] < 0 || home[t] == s)
                    continue;
                int *c = &copy[(size_t)t * (size_t)stages + (size_t)s];
                if (*c < 0) {
                    PlanTensor pt = gen->tensors.data[t];
                    pt.name = "";
                    pt.role = PT_TEMP;
                    pt.init = "";
                    pt.stage = s;
                    VEC_PUSH(gen->a, gen->tensors, pt);
                    *c = gen->tensors.len - 1;
                    const Op *mk = maker[t], *rd = g->ops.data[gen->owner.data[ev[e].instr]];
                    PlanInstr rcv = p2p(gen, PC_RECV, *c, s, home[t], tag, in);
                    rcv.when = cg_loop_msg_when(gen, mk, rd, 1);
                    VEC_PUSH(gen->a, recvs, rcv);
                    VEC_PUSH(gen->a, recv_before, e);
                    VEC_PUSH(gen->a, sends, ((Event){home[t], mk->tick, mk->id, INT32_MAX, -1}));
                    PlanInstr snd = p2p(gen, PC_SEND, t, home[t], s, tag, in);
                    snd.op = mk->id + 1;
                    snd.tick = mk->tick; /* its piece: its maker's */
                    snd.when = cg_loop_msg_when(gen, mk, rd, 0);
                    VEC_PUSH(gen->a, send_in, snd);
                    tag = (tag + 1) % 32768;
                    in = &gen->instrs.data[ev[e].instr]; /* the vectors may have moved */
                    nts = touched(in, ts);
                }
                *ts[k] = *c;
            }
        }
        merge_programs(gen, ev, n, recvs.data, recv_before.data, sends.data, send_in.data,
                       sends.len);
    }
    cg_bucket_all(gen);
    if (stages > 1)
        own_temps(gen);
    return cg_loop_pieces(gen);
}
