/* comm_match.c: the plan's communication proved to match before anything runs
 * (plan_check_comm; plan_check ends with it, so the compiler, the loader and
 * rt_open all refuse a plan whose devices would disagree or wait forever).
 * Reads: a Plan that passes plan_check's other rules. Writes: a message.
 * Key idea: a plan is SPMD within a pipeline stage: every device of stage s
 * runs the same instruction list, so the members of a group that lies within
 * one stage (a collective whose axes miss every pipeline axis) issue the same
 * collectives in the same order with the same operands by construction. What
 * can disagree are the programs of different stages: sends and recvs, and
 * collectives whose axes take in a pipeline axis. So each distinct program,
 * one per stage, is walked once, whatever the number of devices:
 * 1. channels: every ordered pair of stages is one channel; its k-th send and
 *    its k-th recv must agree in tag, bytes and dtype. The threads and MPI
 *    backends pair a recv with the oldest send of its tag from its peer; NCCL
 *    pairs the k-th send on a channel with its k-th recv whatever the tags
 *    (runtime/gpu/nccl.c). Agreeing in order makes both pair the same messages.
 * 2. groups that span stages: each member stage issues the same collectives
 *    over the group (the group being the runtime's, by its ordered axes) in
 *    the same order, with the same kind, dims, operand sizes and dtype.
 * 3. deadlock: the programs run as the host runs them. A send is buffered on
 *    every backend (threads: copied into a mailbox; MPI: a copy sent with
 *    MPI_Isend; runtime/comm/): it returns at once. A recv waits for its
 *    send; a collective waits until every member of its group is at it. Each
 *    stage is a cursor over its list; all devices of a stage move together.
 *    Every wait has exactly one way to end (its matching send, its group's
 *    members arriving) and nothing a device does can disable another's, so
 *    the system is deterministic: if this one order of execution finishes,
 *    every order does; if it sticks, every order sticks at the same cycle of
 *    waits, which the message names.
 * The step and the forward-only run (rt_forward: the fwd instructions alone,
 * for evaluation) are both checked. Not modelled: the cuda device's streams
 * and events (on the device an NCCL send does wait for its recv; the host
 * never waits) and what the data mean. */
#include "plan/plan.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { EV_SEND, EV_RECV, EV_COLL } EvKind;

/* One instruction that meets another stage: a send, a recv, or a collective
 * over a group that spans stages. */
typedef struct Ev {
    int i; /* the instruction */
    EvKind kind;
    int stage;      /* the stage that runs it */
    int64_t k1, k2; /* sort keys: the channel (from, to), or the group (axes key, base stage) */
    int pos;        /* its index in Match.ev (instruction order) */
    int id;         /* its channel or group, after matching */
} Ev;

typedef struct Match {
    const Plan *p;
    int fwd; /* checking the forward-only run */
    int npipe;
    int8_t pipe[PLAN_MAX_AXES];
    Ev *ev;
    int nev;
    int *stages; /* the distinct stages of the events, ascending */
    int nstages;
    int *at;
    char *err;
    size_t n;
} Match;

static const char *const phase_names[] = {"fwd", "bwd", "recompute", "opt"};

static int is_pipe_axis(const Plan *p, int a)
{
    return p->axes[a].role && !strcmp(p->axes[a].role, "pipeline");
}

/* ---- messages ---- */

static const char *nth(int k, char *buf) /* 1 -> "1st" */
{
    int t = k % 100 >= 11 && k % 100 <= 13 ? 0 : k % 10;
    sprintf(buf, "%d%s", k, t == 1 ? "st" : t == 2 ? "nd" : t == 3 ? "rd" : "th");
    return buf;
}

/* The devices of the mesh, or -1 beyond 2^62 (a corrupt plan: no rank numbers). */
static int64_t mesh_devices(const Plan *p)
{
    int64_t n = 1;
    for (int a = 0; a < p->naxes; a++) {
        if (n > ((int64_t)1 << 62) / p->axes[a].size)
            return -1;
        n *= p->axes[a].size;
    }
    return n;
}

/* "ranks 0, 2, 4 and 5 others": the devices of stage s, ascending: its
 * pipeline coordinates' ranks plus, counting k = 0, 1, ..., k's digits over
 * the other axes taken innermost first (by the placement's strides, which
 * make those sums increase with k). */
static const char *stage_ranks(const Match *m, int s, char *buf, size_t n)
{
    const Plan *p = m->p;
    int other[PLAN_MAX_AXES], byst[PLAN_MAX_AXES], nother = 0, count = 0;
    int64_t all = mesh_devices(p), base = 0;
    for (int j = m->npipe - 1; j >= 0; j--) {
        int64_t size = p->axes[m->pipe[j]].size;
        all = all < 0 ? -1 : all / size;
        base += s % size * plan_axis_stride(p, m->pipe[j]);
        s /= (int)size;
    }
    if (all < 0 || p->naxes > PLAN_MAX_AXES)
        return strcpy(buf, "its devices");
    plan_axes_by_stride(p, byst);
    for (int k = 0; k < p->naxes; k++) /* the other axes, innermost first */
        if (!is_pipe_axis(p, byst[k]))
            other[nother++] = byst[k];
    size_t at = (size_t)snprintf(buf, n, "rank%s", all > 1 ? "s" : "");
    for (int64_t k = 0; count < 3 && k < all && at < n; k++, count++) {
        int64_t r = base, rest = k;
        for (int j = 0; j < nother; j++) {
            r += rest % p->axes[other[j]].size * plan_axis_stride(p, other[j]);
            rest /= p->axes[other[j]].size;
        }
        at += (size_t)snprintf(buf + at, n - at, "%s %" PRId64, count ? "," : "", r);
    }
    if (all > count && at < n)
        snprintf(buf + at, n - at, " and %" PRId64 " other%s", all - count,
                 all - count > 1 ? "s" : "");
    return buf;
}

static const char *axes_text(const Plan *p, const PlanColl *c, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = 0;
    for (int j = 0; j < c->naxes && at < n; j++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", j ? "," : "", p->axes[c->axes[j]].name);
    return buf;
}

/* "instrs[12] (recv of 3072 bytes f32 from stage 1, tag 7; layer 0, phase fwd) on stage 0
 * (ranks 0, 2)" */
static const char *instr_text(const Match *m, int i, char *buf, size_t n)
{
    const PlanInstr *in = &m->p->instrs[i];
    const PlanColl *c = &in->coll;
    const PlanTensor *t = &m->p->tensors[in->args[0]];
    char what[160], ranks[96];
    if (c->op == PC_SEND || c->op == PC_RECV)
        snprintf(what, sizeof what, "%s of %" PRIu64 " bytes %s %s stage %d, tag %d",
                 plan_coll_name(c->op), t->bytes, plan_dtype_name(t->dtype),
                 c->op == PC_SEND ? "to" : "from", c->peer, c->tag);
    else {
        char axes[64];
        snprintf(what, sizeof what, "%s of %" PRIu64 " bytes %s over %s", plan_coll_name(c->op),
                 t->bytes, plan_dtype_name(t->dtype), axes_text(m->p, c, axes, sizeof axes));
    }
    snprintf(buf, n, "instrs[%d] (%s; layer %d, phase %s) on stage %d (%s)", i, what, in->layer,
             phase_names[in->phase], in->stage, stage_ranks(m, in->stage, ranks, sizeof ranks));
    return buf;
}

/* The error: *at = instruction i, the message prefixed by the run it is in. */
static int fail(Match *m, int i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(Match *m, int i, const char *fmt, ...)
{
    char msg[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m->at)
        *m->at = i;
    return plan_errorf(m->err, m->n, "%s%s", m->fwd ? "in the forward-only run: " : "", msg);
}

/* ---- the events ---- */

static int in_coll(const PlanColl *c, int a)
{
    for (int j = 0; j < c->naxes; j++)
        if (c->axes[j] == a)
            return 1;
    return 0;
}

/* The runtime's key of c's group: its ordered axes (runtime/mesh.c). */
static int64_t axes_key(const PlanColl *c)
{
    int64_t k = 0;
    for (int j = 0; j < c->naxes; j++)
        k = k * 9 + c->axes[j] + 1;
    return k;
}

/* The stages of c's group on stage s: the least (s with its coordinates on
 * c's pipeline axes at 0) returned, their number in *count. */
static int64_t group_base(const Match *m, const PlanColl *c, int s, int64_t *count)
{
    int64_t base = 0, stride = 1;
    *count = 1;
    for (int j = m->npipe - 1; j >= 0; j--) {
        int size = m->p->axes[m->pipe[j]].size, x = s % size;
        s /= size;
        if (in_coll(c, m->pipe[j]))
            *count *= size;
        else
            base += x * stride;
        stride *= size;
    }
    return base;
}

/* Member k of the group of c at base, as a stage (ascending in k). */
static int member_stage(const Match *m, const PlanColl *c, int64_t base, int64_t k)
{
    int64_t s = base, stride = 1;
    for (int j = m->npipe - 1; j >= 0; j--) {
        int size = m->p->axes[m->pipe[j]].size;
        if (in_coll(c, m->pipe[j])) {
            s += k % size * stride;
            k /= size;
        }
        stride *= size;
    }
    return (int)s;
}

/* The sends, recvs and collectives over stages of the run, in instruction order. */
static void collect(Match *m)
{
    const Plan *p = m->p;
    m->nev = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        const PlanColl *c = &in->coll;
        if (in->kind != PI_COLL || c->op == PC_SLICE || (m->fwd && in->phase != 0))
            continue;
        Ev e = {i, EV_COLL, in->stage, 0, 0, m->nev, -1};
        int64_t count;
        if (c->op == PC_SEND)
            e.kind = EV_SEND, e.k1 = in->stage, e.k2 = c->peer;
        else if (c->op == PC_RECV)
            e.kind = EV_RECV, e.k1 = c->peer, e.k2 = in->stage;
        else if ((e.k2 = group_base(m, c, in->stage, &count)), count > 1)
            e.k1 = axes_key(c);
        else
            continue; /* within one stage: the same on every member */
        m->ev[m->nev++] = e;
    }
}

static int cmp_int(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

/* By kind, channel or group, stage, then instruction order. */
static int cmp_ev(const void *x, const void *y)
{
    const Ev *a = x, *b = y;
    int64_t d[4] = {(int64_t)a->kind - b->kind, a->k1 - b->k1, a->k2 - b->k2, a->stage - b->stage};
    for (int j = 0; j < 4; j++)
        if (d[j])
            return d[j] < 0 ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* The index of stage s in m->stages. */
static int dense(const Match *m, int s)
{
    const int *at = bsearch(&s, m->stages, (size_t)m->nstages, sizeof(int), cmp_int);
    return at ? (int)(at - m->stages) : -1;
}

static void distinct_stages(Match *m)
{
    int k = 0;
    for (int e = 0; e < m->nev; e++)
        m->stages[e] = m->ev[e].stage;
    qsort(m->stages, (size_t)m->nev, sizeof(int), cmp_int);
    for (int e = 0; e < m->nev; e++)
        if (!k || m->stages[k - 1] != m->stages[e])
            m->stages[k++] = m->stages[e];
    m->nstages = k;
}

/* ---- 1. channels ---- */

static int same_message(const Plan *p, int i, int j)
{
    const PlanInstr *a = &p->instrs[i], *b = &p->instrs[j];
    const PlanTensor *x = &p->tensors[a->args[0]], *y = &p->tensors[b->args[0]];
    return a->coll.tag == b->coll.tag && x->bytes == y->bytes && x->dtype == y->dtype;
}

static int has_tag(const Plan *p, const Ev *v, int n, int tag)
{
    for (int j = 0; j < n; j++)
        if (p->instrs[v[j].i].coll.tag == tag)
            return 1;
    return 0;
}

/* Where the k-th send and the k-th recv of a channel first disagree. */
static int channel_differs(Match *m, const Ev *s, int ns, const Ev *r, int nr, int k)
{
    const Plan *p = m->p;
    const PlanInstr *a = &p->instrs[s[k].i], *b = &p->instrs[r[k].i];
    const PlanTensor *x = &p->tensors[a->args[0]], *y = &p->tensors[b->args[0]];
    int from = a->stage, to = b->stage;
    char ta[400], tb[400], kth[16];
    instr_text(m, s[k].i, ta, sizeof ta);
    instr_text(m, r[k].i, tb, sizeof tb);
    if (a->coll.tag != b->coll.tag && !has_tag(p, s, ns, b->coll.tag))
        return fail(m, r[k].i, "%s has no send: stage %d sends nothing with tag %d to stage %d", tb,
                    from, b->coll.tag, to);
    if (a->coll.tag != b->coll.tag && !has_tag(p, r, nr, a->coll.tag))
        return fail(m, s[k].i,
                    "%s has no recv: stage %d receives nothing with tag %d from stage %d", ta, to,
                    a->coll.tag, from);
    nth(k + 1, kth);
    if (a->coll.tag != b->coll.tag)
        return fail(
            m, s[k].i,
            "messages out of order: the %s message from stage %d to stage %d is %s, but the "
            "%s recv there is %s (a recv must take the messages of its peer in the order "
            "they are sent)",
            kth, from, to, ta, kth, tb);
    if (x->bytes != y->bytes)
        return fail(m, s[k].i,
                    "%s and %s, the %s message from stage %d to stage %d, differ in size: %" PRIu64
                    " bytes sent, %" PRIu64 " received",
                    ta, tb, kth, from, to, x->bytes, y->bytes);
    return fail(m, s[k].i,
                "%s and %s, the %s message from stage %d to stage %d, differ in dtype: %s sent, %s "
                "received",
                ta, tb, kth, from, to, plan_dtype_name(x->dtype), plan_dtype_name(y->dtype));
}

/* One channel: its sends s[0, ns) and recvs r[0, nr), each in program order. */
static int match_channel(Match *m, const Ev *s, int ns, const Ev *r, int nr)
{
    const Plan *p = m->p;
    char t[400];
    int k = 0;
    while (k < ns && k < nr && same_message(p, s[k].i, r[k].i))
        k++;
    if (k < ns && k < nr)
        return channel_differs(m, s, ns, r, nr, k);
    if (k < nr)
        return fail(m, r[k].i, "%s has no send: stage %d sends %d message%s to stage %d",
                    instr_text(m, r[k].i, t, sizeof t), (int)r[k].k1, ns, ns == 1 ? "" : "s",
                    r[k].stage);
    if (k < ns)
        return fail(m, s[k].i, "%s has no recv: stage %d receives %d message%s from stage %d",
                    instr_text(m, s[k].i, t, sizeof t), (int)s[k].k2, nr, nr == 1 ? "" : "s",
                    s[k].stage);
    return 0;
}

static int chan_less(const Ev *a, const Ev *b)
{
    return a->k1 < b->k1 || (a->k1 == b->k1 && a->k2 < b->k2);
}

/* Sends s[0, ns) and recvs r[0, nr), sorted by channel: each channel matched and
 * numbered (Ev.id); their count in *nch. */
static int match_channels(Match *m, Ev *s, int ns, Ev *r, int nr, int *nch)
{
    int x = 0, y = 0, ch = 0;
    while (x < ns || y < nr) {
        const Ev *lead = x == ns ? &r[y] : y == nr || chan_less(&s[x], &r[y]) ? &s[x] : &r[y];
        int64_t k1 = lead->k1, k2 = lead->k2;
        int x1 = x, y1 = y;
        while (x1 < ns && s[x1].k1 == k1 && s[x1].k2 == k2)
            s[x1++].id = ch;
        while (y1 < nr && r[y1].k1 == k1 && r[y1].k2 == k2)
            r[y1++].id = ch;
        if (match_channel(m, s + x, x1 - x, r + y, y1 - y))
            return -1;
        x = x1, y = y1, ch++;
    }
    *nch = ch;
    return 0;
}

/* ---- 2. groups that span stages ---- */

/* What differs between collectives i and j of one group, or NULL. */
static const char *coll_differs(const Plan *p, int i, int j, char *buf, size_t n)
{
    const PlanInstr *a = &p->instrs[i], *b = &p->instrs[j];
    const PlanTensor *x = &p->tensors[a->args[0]], *y = &p->tensors[b->args[0]];
    if (a->coll.op != b->coll.op)
        snprintf(buf, n, "kind (%s, %s)", plan_coll_name(a->coll.op), plan_coll_name(b->coll.op));
    else if (x->dtype != y->dtype)
        snprintf(buf, n, "dtype (%s, %s)", plan_dtype_name(x->dtype), plan_dtype_name(y->dtype));
    else if (a->nargs != b->nargs)
        snprintf(buf, n, "operands (%d tensors, %d)", a->nargs, b->nargs);
    else if (a->coll.dim != b->coll.dim || a->coll.dim2 != b->coll.dim2)
        snprintf(buf, n, "dims (%d/%d, %d/%d)", a->coll.dim, a->coll.dim2, b->coll.dim,
                 b->coll.dim2);
    else {
        for (int k = 0; k < a->nargs; k++) {
            uint64_t u = p->tensors[a->args[k]].bytes, v = p->tensors[b->args[k]].bytes;
            if (u != v) {
                snprintf(buf, n, "size (%s %d: %" PRIu64 " bytes, %" PRIu64 ")",
                         k % 2 ? "output" : "input", k / 2, u, v);
                return buf;
            }
        }
        return NULL;
    }
    return buf;
}

/* The collectives of one stage, a[0, na), against those of another, b[0, nb). */
static int compare_members(Match *m, const Ev *a, int na, const Ev *b, int nb)
{
    char ta[400], tb[400], kth[16], what[128], axes[64];
    const PlanColl *c = &m->p->instrs[a[0].i].coll;
    axes_text(m->p, c, axes, sizeof axes);
    for (int k = 0; k < na && k < nb; k++)
        if (coll_differs(m->p, a[k].i, b[k].i, what, sizeof what))
            return fail(m, b[k].i, "%s and %s, the %s collective over %s of each, differ in %s",
                        instr_text(m, a[k].i, ta, sizeof ta), instr_text(m, b[k].i, tb, sizeof tb),
                        nth(k + 1, kth), axes, what);
    if (na == nb)
        return 0;
    const Ev *more = na > nb ? a : b, *fewer = na > nb ? b : a;
    int k = na < nb ? na : nb;
    return fail(m, more[k].i,
                "%s has no partner: stage %d issues %d collective%s over %s, stage %d %d",
                instr_text(m, more[k].i, ta, sizeof ta), fewer[0].stage, k, k == 1 ? "" : "s", axes,
                more[0].stage, na > nb ? na : nb);
}

static int stage_run_end(const Ev *v, int n, int at)
{
    int e = at;
    while (e < n && v[e].stage == v[at].stage)
        e++;
    return e;
}

/* One group (an axes key and a base stage): its collectives v[0, n), by stage.
 * Its member stages, ascending and dense, are appended to members at *nm. */
static int match_group(Match *m, Ev *v, int n, int g, int *members, int *nm)
{
    const PlanColl *c = &m->p->instrs[v[0].i].coll;
    int64_t count, k = 0;
    group_base(m, c, v[0].stage, &count);
    int first = stage_run_end(v, n, 0);
    char t[400], axes[64];
    for (int at = 0, end; at < n || k < count; at = end, k++) {
        int want = member_stage(m, c, v[0].k2, k);
        if (at == n || v[at].stage != want)
            return fail(m, v[0].i, "%s has no partner: stage %d issues no collective over %s",
                        instr_text(m, v[0].i, t, sizeof t), want, axes_text(m->p, c, axes, 64));
        end = stage_run_end(v, n, at);
        if (compare_members(m, v, first, v + at, end - at))
            return -1;
        for (int e = at; e < end; e++)
            v[e].id = g;
        members[(*nm)++] = dense(m, want);
    }
    return 0;
}

/* ---- 3. the run: a cursor per stage ---- */

typedef struct Sim {
    int *prog, *start, *len, *cur; /* by stage: its events (indices into Match.ev) */
    char *arrived, *queued;        /* by stage: waiting at a collective; in the queue */
    int *queue, head, count;
    int *sent, *got;               /* by channel */
    int *waiting, *gstart, *gsize; /* by group: members at it, its members in members[] */
    int *members;
} Sim;

static void wake(Sim *s, int ns, int st)
{
    if (s->queued[st])
        return;
    s->queued[st] = 1;
    s->queue[(s->head + s->count++) % ns] = st;
}

/* A group's collective is complete: every member goes past it. */
static void complete(Match *m, Sim *s, int g, int self)
{
    s->waiting[g] = 0;
    for (int k = s->gstart[g]; k < s->gstart[g] + s->gsize[g]; k++) {
        int u = s->members[k];
        s->arrived[u] = 0;
        s->cur[u]++;
        if (u != self)
            wake(s, m->nstages, u);
    }
}

/* Run stage st until it waits or ends. */
static void advance(Match *m, Sim *s, int st)
{
    while (s->cur[st] < s->len[st]) {
        const Ev *e = &m->ev[s->prog[s->start[st] + s->cur[st]]];
        if (e->kind == EV_SEND) {
            s->sent[e->id]++;
            s->cur[st]++;
            wake(s, m->nstages, dense(m, (int)e->k2));
        } else if (e->kind == EV_RECV) {
            if (s->got[e->id] == s->sent[e->id])
                return;
            s->got[e->id]++;
            s->cur[st]++;
        } else {
            if (s->arrived[st])
                return;
            s->arrived[st] = 1;
            if (++s->waiting[e->id] < s->gsize[e->id])
                return;
            complete(m, s, e->id, st);
        }
    }
}

/* The stage that blocked stage st waits for. */
static int waits_for(const Match *m, const Sim *s, int st)
{
    const Ev *e = &m->ev[s->prog[s->start[st] + s->cur[st]]];
    if (e->kind == EV_RECV)
        return dense(m, (int)e->k1);
    for (int k = s->gstart[e->id]; k < s->gstart[e->id] + s->gsize[e->id]; k++)
        if (!s->arrived[s->members[k]])
            return s->members[k];
    return st; /* (not reached: the collective would have completed) */
}

/* Some stage is stuck: name the cycle of waits it is on. */
static int deadlock(Match *m, Sim *s)
{
    int st = 0, steps = 0, *seen = s->queue; /* the queue is empty: reuse it */
    while (s->cur[st] == s->len[st])
        st++;
    for (int k = 0; k < m->nstages; k++)
        seen[k] = -1;
    for (; seen[st] < 0; st = waits_for(m, s, st))
        seen[st] = steps++;
    char msg[1024], t[400];
    size_t at = 0;
    int first = s->prog[s->start[st] + s->cur[st]], len = steps - seen[st];
    for (int k = 0; k < len && k < 4 && at < sizeof msg; k++, st = waits_for(m, s, st)) {
        int i = m->ev[s->prog[s->start[st] + s->cur[st]]].i;
        at += (size_t)snprintf(msg + at, sizeof msg - at, "%s%s waits for stage %d", k ? "; " : "",
                               instr_text(m, i, t, sizeof t), m->stages[waits_for(m, s, st)]);
    }
    return fail(m, m->ev[first].i, "deadlock: %s%s", msg, len > 4 ? "; ..." : "");
}

static int simulate(Match *m, Sim *s)
{
    int ns = m->nstages;
    for (int st = 0; st < ns; st++)
        wake(s, ns, st);
    while (s->count) {
        int st = s->queue[s->head];
        s->head = (s->head + 1) % ns, s->count--;
        s->queued[st] = 0;
        advance(m, s, st);
    }
    for (int st = 0; st < ns; st++)
        if (s->cur[st] < s->len[st])
            return deadlock(m, s);
    return 0;
}

/* ---- the check ---- */

/* Each stage's events in instruction order (a counting sort by stage). */
static void programs(Match *m, Sim *s)
{
    for (int e = 0; e < m->nev; e++)
        s->len[dense(m, m->ev[e].stage)]++;
    for (int st = 1; st < m->nstages; st++)
        s->start[st] = s->start[st - 1] + s->len[st - 1];
    for (int e = 0; e < m->nev; e++) {
        int st = dense(m, m->ev[e].stage);
        s->prog[s->start[st] + s->cur[st]++] = e;
    }
    memset(s->cur, 0, sizeof(int) * (size_t)m->nstages);
}

/* Match the channels and the groups of the sorted events v (Ev.id set in m->ev). */
static int match_all(Match *m, Sim *s, Ev *v)
{
    int ns = 0, nr = 0, nch = 0, ng = 0, nm = 0;
    while (ns < m->nev && v[ns].kind == EV_SEND)
        ns++;
    while (ns + nr < m->nev && v[ns + nr].kind == EV_RECV)
        nr++;
    if (match_channels(m, v, ns, v + ns, nr, &nch))
        return -1;
    for (int at = ns + nr, end; at < m->nev; at = end, ng++) {
        for (end = at; end < m->nev && v[end].k1 == v[at].k1 && v[end].k2 == v[at].k2; end++)
            ;
        s->gstart[ng] = nm;
        if (match_group(m, v + at, end - at, ng, s->members, &nm))
            return -1;
        s->gsize[ng] = nm - s->gstart[ng];
    }
    for (int e = 0; e < m->nev; e++)
        m->ev[v[e].pos].id = v[e].id;
    return 0;
}

/* The arrays of one run, zeroed; NULL when out of memory. */
static void *sim_alloc(Sim *s, int nev)
{
    size_t n = (size_t)nev + 1;
    int *mem = calloc(11 * n, sizeof(int));
    char *flags = calloc(2 * n, 1);
    if (!mem || !flags) {
        free(mem);
        free(flags);
        return NULL;
    }
    int **ints[] = {&s->prog, &s->start,   &s->len,    &s->cur,   &s->queue,   &s->sent,
                    &s->got,  &s->waiting, &s->gstart, &s->gsize, &s->members, NULL};
    for (int k = 0; ints[k]; k++)
        *ints[k] = mem + (size_t)k * n;
    s->arrived = flags, s->queued = flags + n;
    return mem;
}

/* One run: the step (fwd 0) or the forward-only run (fwd 1). */
static int check_run(Match *m, Ev *sorted)
{
    collect(m);
    if (!m->nev)
        return 0;
    distinct_stages(m);
    Sim s = {0};
    void *mem = sim_alloc(&s, m->nev);
    if (!mem)
        return plan_errorf(m->err, m->n, "out of memory checking the collectives");
    memcpy(sorted, m->ev, sizeof(Ev) * (size_t)m->nev);
    qsort(sorted, (size_t)m->nev, sizeof(Ev), cmp_ev);
    programs(m, &s);
    int rc = match_all(m, &s, sorted) || simulate(m, &s) ? -1 : 0;
    free(mem);
    free(s.arrived);
    return rc;
}

int plan_check_comm(const Plan *p, int *at, char *err, size_t n)
{
    Match m = {.p = p, .at = at, .err = err, .n = n};
    if (at)
        *at = -1;
    if (p->ninstrs <= 0)
        return 0;
    int64_t stages = 1;
    for (int a = 0; a < p->naxes; a++)
        if (is_pipe_axis(p, a)) {
            m.pipe[m.npipe++] = (int8_t)a;
            stages *= p->axes[a].size;
            if (stages > INT_MAX)
                return plan_errorf(err, n, "axes: the pipeline axes make more than %d stages",
                                   INT_MAX);
        }
    m.ev = malloc(sizeof(Ev) * (size_t)p->ninstrs);
    Ev *sorted = malloc(sizeof(Ev) * (size_t)p->ninstrs);
    m.stages = malloc(sizeof(int) * (size_t)p->ninstrs);
    int rc = !m.ev || !sorted || !m.stages
                 ? plan_errorf(err, n, "out of memory checking the collectives")
                 : check_run(&m, sorted);
    if (!rc) {
        m.fwd = 1;
        rc = check_run(&m, sorted);
    }
    free(m.ev);
    free(sorted);
    free(m.stages);
    return rc;
}
