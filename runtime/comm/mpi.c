/* mpi.c: the mpi backend of comm.h: one process per rank under mpirun (OpenMPI).
 * Reads: the launcher's environment (rt_mpi_launched), TCC_COMM_TIMEOUT
 * (rt_comm_timeout), the buffers of each call.
 * Writes: the outputs of each call; MPI_Init_thread on the first world and
 * MPI_Finalize when the last one closes (MPI_Abort when it is broken).
 * Key idea: every sum is reduced exactly once, by MPI_Reduce_scatter_block (each
 * element lives on one member), and then copied to everyone (MPI_Allgather), so
 * all members get bitwise the same result, whatever MPI's reduction order. The
 * [pre][chunk][post] geometry of all_gather and reduce_scatter is permuted
 * through the comm's scratch buffer into MPI's [size][...] blocks (not needed
 * when pre is 1). Sends are buffered (a copy sent by MPI_Isend, freed once done),
 * as in the threads backend, so a ring of sends then recvs cannot deadlock.
 * No hangs: every collective and recv is the nonblocking MPI call (MPI_Iallgather,
 * MPI_Irecv, ...) waited for by polling MPI_Test against a deadline (await). While
 * it waits, a rank answers the questions of other ranks' watchdogs (on a
 * communicator of their own) with the call it waits in. When the deadline passes,
 * the rank asks the group's other members (a recv: its peer) where they are, gives
 * them a second to answer, and fails naming the members that have not come and
 * where each one is: in another call, or silent (busy outside MPI, stopped or
 * gone). Of the members waiting in the same collective only the lowest world rank
 * reports, and only when a member it waits for does not answer; one that waits
 * for ranks that wait elsewhere gives their watchdogs a timeout more to end the
 * job (reports_now), so the message comes from the ranks nearest the cause.
 * Every MPI call is checked (communicators get MPI_ERRORS_RETURN); the message
 * names the call, file:line, MPI's own text and the world rank. A failed call or
 * wait breaks the world (the state is per process, like MPI): every later call
 * fails at once, and closing the world calls MPI_Abort, which ends the job, where
 * MPI_Finalize would wait for the ranks that hang. */
#include "runtime/comm/comm_impl.h"

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct Pending {
    MPI_Request req;
    void *copy;    /* what MPI_Isend is sending */
    size_t bytes;  /* its size, as counted (rt_account) */
    int peer, tag; /* the receiver (world rank) and the tag, for the watchdog */
} Pending;

typedef struct MWorld MWorld;

typedef struct MComm {
    RtComm base;
    MPI_Comm comm;
    MWorld *world;    /* whose watchdog its waits have */
    int id, color;    /* the split that made it (the world's count of splits, the same on every
                         rank; 0: the world itself) and its color */
    int64_t seq;      /* the collectives begun on it: with id, what the members call one */
    Pending *pending; /* sends not known to be done */
    int npending, cap;
} MComm;

/* The calls a rank waits in; the point-to-point ones last. */
typedef enum {
    W_NONE = -1,
    W_ALL_REDUCE,
    W_ALL_REDUCE_MAX,
    W_ALL_GATHER,
    W_REDUCE_SCATTER,
    W_ALL_TO_ALL,
    W_BROADCAST,
    W_BARRIER,
    W_SPLIT,
    W_CLOSE,
    W_RECV,
    W_SEND,
} WaitOp;

static const char *const wait_names[] = {
    "all_reduce", "all_reduce_max", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
    "barrier",    "comm_split",     "close",      "recv",           "send",
};

/* What a rank waits in, as it tells another rank's watchdog (sent as bytes: every
 * rank runs the same program). */
typedef struct Where {
    int32_t op;              /* a WaitOp */
    int32_t id, color, size; /* the comm (MComm.id, .color) and its member count */
    int32_t peer, tag;       /* recv, send: the other rank (world) and the tag */
    int64_t seq;             /* the comm's seq */
    char group[32];          /* the comm's name */
} Where;

enum { TAG_ASK = 1, TAG_TELL = 2 }; /* on MWorld.watch */

struct MWorld {
    RtWorld base;
    MComm all;      /* a duplicate of MPI_COMM_WORLD */
    MPI_Comm watch; /* another: the watchdogs' questions and answers */
    double timeout; /* seconds a wait may last */
    int splits;     /* the comms split from it so far */
    int asked;      /* a question's payload (this rank), read by MPI_Isend */
    Where now;      /* the call this rank waits in (op W_NONE: none) */
    Where *told;    /* [size]: the answer sent to each rank that asked (MPI reads it) */
};

/* MPI itself is once per process, so this state is too: the worlds open in this
 * process, whether MPI_Init was ours (then MPI_Finalize is ours as well), and
 * whether MPI is broken here (a failed call, a wait that timed out: MPI may be
 * stuck in a call that never completes). Only one thread calls MPI
 * (MPI_THREAD_FUNNELED), so no lock. */
static int open_worlds, we_initialized, broken;

static const RtCommOps mpi_ops;

/* ---- errors ---- */

/* "rank R: MPI_Xxx failed at file:line: MPI's text" into err; -1. The world is broken. */
static int mpi_fail(int rank, int rc, const char *call, int line, char *err, size_t n)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    broken = 1;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    int name = (int)strcspn(call, "(");
    return plan_errorf(err, n, "rank %d: %.*s failed at %s:%d: %s", rank, name, call, __FILE__,
                       line, text);
}

#define MPI_TRY(rank, call)                                                                        \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS)                                                                    \
            return mpi_fail((rank), rc_, #call, __LINE__, err, n);                                 \
    } while (0)

/* -1 with a message once the world is broken: MPI may wait for ranks that hang. */
static int dead(const RtComm *c, const char *what, char *err, size_t n)
{
    if (!broken)
        return 0;
    return plan_errorf(err, n,
                       "rank %d: %s: stopped: a wait of this rank timed out or an MPI call "
                       "failed before",
                       c->world_rank, what);
}

/* v as an MPI count; -1 with a message when it does not fit an int. */
static int count_of(const RtComm *c, const char *what, size_t v, int *out, char *err, size_t n)
{
    if (v > INT_MAX)
        return plan_errorf(err, n, "rank %d: %s: %zu is more than an MPI count can hold (%d)",
                           c->world_rank, what, v, INT_MAX);
    *out = (int)v;
    return 0;
}

static MPI_Datatype mpi_type(PlanDType dt)
{
    return dt == PD_F32 ? MPI_FLOAT : dt == PD_F64 ? MPI_DOUBLE : MPI_INT32_T;
}

/* ---- the watchdog ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap(void) /* a millisecond, between polls that need no hurry */
{
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* Answer every question that has come: the asker gets w->now. */
static int serve(MWorld *w, char *err, size_t n)
{
    int me = w->base.rank, flag = 1, q;
    while (flag) {
        MPI_Status st;
        MPI_Request r;
        MPI_TRY(me, MPI_Iprobe(MPI_ANY_SOURCE, TAG_ASK, w->watch, &flag, &st));
        if (!flag)
            return 0;
        MPI_TRY(me, MPI_Recv(&q, 1, MPI_INT, st.MPI_SOURCE, TAG_ASK, w->watch, MPI_STATUS_IGNORE));
        if (!w->told && !(w->told = calloc((size_t)w->base.size, sizeof *w->told)))
            return plan_errorf(err, n, "rank %d: the watchdog: out of memory", me);
        w->told[st.MPI_SOURCE] = w->now;
        MPI_TRY(me, MPI_Isend(&w->told[st.MPI_SOURCE], (int)sizeof(Where), MPI_BYTE, st.MPI_SOURCE,
                              TAG_TELL, w->watch, &r));
        MPI_TRY(me, MPI_Request_free(&r));
    }
    return 0;
}

/* Ask the k ranks where they are; got[rank] (by world rank) their answers, op
 * W_NONE for those that give none within the grace (a second, at most the
 * timeout). The whole grace is spent answering others too: a rank whose
 * watchdog fires a little later learns where this one is. */
static int ask(MWorld *w, const int *ranks, int k, Where *got, char *err, size_t n)
{
    int me = w->base.rank, flag;
    for (int r = 0; r < w->base.size; r++)
        got[r].op = W_NONE;
    for (int i = 0; i < k; i++) { /* one that cannot be asked (gone) does not answer */
        MPI_Request r;
        if (MPI_Isend(&w->asked, 1, MPI_INT, ranks[i], TAG_ASK, w->watch, &r) == MPI_SUCCESS)
            MPI_Request_free(&r);
    }
    double t0 = now_s(), grace = w->timeout < 1 ? w->timeout : 1;
    while (now_s() - t0 < grace) {
        MPI_Status st;
        Where a;
        if (serve(w, err, n))
            return -1;
        MPI_TRY(me, MPI_Iprobe(MPI_ANY_SOURCE, TAG_TELL, w->watch, &flag, &st));
        if (!flag) {
            nap();
            continue;
        }
        MPI_TRY(me, MPI_Recv(&a, (int)sizeof a, MPI_BYTE, st.MPI_SOURCE, TAG_TELL, w->watch,
                             MPI_STATUS_IGNORE));
        got[st.MPI_SOURCE] = a;
    }
    return 0;
}

/* Whether a waits in the collective here. */
static int same_call(const Where *a, const Where *here)
{
    return a->op == here->op && a->id == here->id && a->color == here->color && a->seq == here->seq;
}

/* Whether a has come to the collective here: waits in it, or has left it (a broadcast's
 * root, say, may finish before the others). */
static int has_come(const Where *a, const Where *here)
{
    return same_call(a, here) ||
           (a->op != W_NONE && a->id == here->id && a->color == here->color && a->seq > here->seq);
}

/* What a rank said, for the message: the call it waits in, or "does not answer". */
static void whereabouts(const Where *a, char *out, size_t n)
{
    char group[64];
    if (a->op < 0 || a->op > W_SEND) {
        snprintf(out, n, "does not answer: busy outside MPI, stopped or gone");
        return;
    }
    if (a->group[0])
        snprintf(group, sizeof group, "group %.31s", a->group);
    else
        snprintf(group, sizeof group, "a group of %d", (int)a->size);
    if (a->op == W_RECV)
        snprintf(out, n, "waits in recv from rank %d, tag %d, in %s", (int)a->peer, (int)a->tag,
                 group);
    else if (a->op == W_SEND)
        snprintf(out, n, "waits for rank %d to receive tag %d in %s", (int)a->peer, (int)a->tag,
                 group);
    else
        snprintf(out, n, "waits in %s in %s", wait_names[a->op], group);
}

/* "not arrived: rank 2 (does not answer: ...), rank 3 (waits in ...)": the members of m
 * that have not come to the collective here (the first 4, then how many more). */
static void absent(const MComm *m, const Where *got, const Where *here, char *out, size_t n)
{
    int shown = 0, more = 0;
    size_t at = (size_t)snprintf(out, n, "not arrived:");
    for (int j = 0; j < m->base.size; j++) {
        int r = rt_comm_member(&m->base, j);
        char where[160];
        if (r == m->base.world_rank || has_come(&got[r], here))
            continue;
        whereabouts(&got[r], where, sizeof where);
        if (shown < 4 && at < n)
            at += (size_t)snprintf(out + at, n - at, "%s rank %d (%s)", shown ? "," : "", r, where);
        shown < 4 ? shown++ : more++;
    }
    if (!shown)
        snprintf(out, n, "every member has come, but the call does not complete");
    else if (more && at < n)
        snprintf(out + at, n - at, " and %d more", more);
}

/* The watchdog's message into err: the call, the group, the time, who is missing. */
static int report(const MComm *m, const Where *got, char *err, size_t n)
{
    const Where *here = &m->world->now;
    char group[128], what[320], where[160];
    rt_comm_describe(&m->base, group, sizeof group);
    if (here->op == W_RECV || here->op == W_SEND) {
        whereabouts(&got[here->peer], where, sizeof where);
        if (here->op == W_RECV)
            snprintf(what, sizeof what, "no message from rank %d with tag %d; rank %d %s",
                     (int)here->peer, (int)here->tag, (int)here->peer, where);
        else
            snprintf(what, sizeof what, "rank %d has not received tag %d; rank %d %s",
                     (int)here->peer, (int)here->tag, (int)here->peer, where);
    } else {
        absent(m, got, here, what, sizeof what);
    }
    return plan_errorf(err, n,
                       "rank %d: %s in %s: waited %g s (the watchdog, TCC_COMM_TIMEOUT or "
                       "--timeout): %s",
                       m->base.world_rank, wait_names[here->op], group, m->world->timeout, what);
}

/* Whether this rank reports at once. A collective: when no member of lower world
 * rank waits in it too (that one reports), and a member that has not come does
 * not answer, or every one has come. A recv or send: when the peer does not
 * answer. A rank that waits for ranks that wait elsewhere waits a timeout more:
 * those ranks' watchdogs are nearer the cause (one that waits for a rank that
 * does not answer, say), and it reports only if the job still runs then (a
 * deadlock: every rank waits for another). */
static int reports_now(const MComm *m, const Where *got, const Where *here)
{
    int me = m->base.world_rank, missing = 0, silent = 0;
    if (here->op == W_RECV || here->op == W_SEND)
        return got[here->peer].op == W_NONE;
    for (int j = 0; j < m->base.size; j++) {
        int r = rt_comm_member(&m->base, j);
        if (r < me && same_call(&got[r], here))
            return 0;
        if (r != me && !has_come(&got[r], here))
            missing++, silent += got[r].op == W_NONE;
    }
    return !missing || silent;
}

/* The wait of m in w->now has lasted the timeout: ask the others, maybe wait
 * a timeout more for another rank to end the job (reports_now), report. The
 * world is broken. -1. */
static int watchdog(MComm *m, char *err, size_t n)
{
    MWorld *w = m->world;
    const Where *here = &w->now;
    int p2p = here->op == W_RECV || here->op == W_SEND, k = 0;
    Where *got = malloc((size_t)w->base.size * sizeof *got);
    int *ranks = malloc((size_t)m->base.size * sizeof *ranks);
    broken = 1;
    if (!got || !ranks) {
        free(got), free(ranks);
        return plan_errorf(err, n,
                           "rank %d: %s: waited %g s (the watchdog); out of memory "
                           "to ask the others why",
                           m->base.world_rank, wait_names[here->op], w->timeout);
    }
    for (int j = 0; j < m->base.size; j++) {
        int r = rt_comm_member(&m->base, j);
        if (p2p ? r == here->peer : r != m->base.world_rank)
            ranks[k++] = r;
    }
    int rc = ask(w, ranks, k, got, err, n);
    if (!rc && !reports_now(m, got, here))
        for (double t1 = now_s(); !rc && now_s() - t1 < w->timeout; nap())
            rc = serve(w, err, n);
    if (!rc)
        report(m, got, err, n);
    free(got);
    free(ranks);
    return -1;
}

/* Wait for req, a call op of m (peer, tag: of a recv or send, as world ranks): 0
 * once it completes. Meanwhile this rank answers other ranks' watchdogs; when
 * the wait lasts the timeout, its own fires. A failed wait breaks the world. */
static int await(MComm *m, MPI_Request *req, MPI_Status *st, WaitOp op, int peer, int tag,
                 char *err, size_t n)
{
    MWorld *w = m->world;
    int done = 0, me = m->base.world_rank, rc;
    MPI_TRY(me, MPI_Test(req, &done, st));
    if (done)
        return 0;
    w->now = (Where){op, m->id, m->color, m->base.size, peer, tag, m->seq, ""};
    memcpy(w->now.group, m->base.name, sizeof w->now.group);
    double t0 = now_s();
    for (rc = 0; !rc && !done;) {
        if (serve(w, err, n))
            rc = -1;
        else if (now_s() - t0 >= w->timeout)
            rc = watchdog(m, err, n);
        else if ((rc = MPI_Test(req, &done, st)) != MPI_SUCCESS)
            rc = mpi_fail(me, rc, "MPI_Test", __LINE__, err, n);
    }
    if (rc)
        broken = 1;
    else
        w->now.op = W_NONE;
    return rc;
}

/* A collective started by call (its return rc) into *req: wait for it. */
static int wait_for(MComm *m, int rc, const char *call, int line, MPI_Request *req, WaitOp op,
                    char *err, size_t n)
{
    if (rc != MPI_SUCCESS)
        return mpi_fail(m->base.world_rank, rc, call, line, err, n);
    return await(m, req, MPI_STATUS_IGNORE, op, -1, -1, err, n);
}

/* The nonblocking collective call (its last argument &req), waited for as op. */
#define COLL(m, op, call)                                                                          \
    do {                                                                                           \
        if (wait_for((m), (call), #call, __LINE__, &req, (op), err, n))                            \
            return -1;                                                                             \
    } while (0)

/* ---- buffered sends ---- */

/* Free the copies of the sends that are done (wait: of all of them). A send whose
 * wait or test fails stays pending, its copy kept: MPI may still read it. */
static int settle(MComm *m, int wait, char *err, size_t n)
{
    int kept = 0, rc = 0;
    for (int i = 0; i < m->npending; i++) {
        Pending *p = &m->pending[i];
        int done = 1, e;
        if (wait && !rc)
            rc = await(m, &p->req, MPI_STATUS_IGNORE, W_SEND, p->peer, p->tag, err, n);
        else if (!wait && !rc && (e = MPI_Test(&p->req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            rc = mpi_fail(m->base.world_rank, e, "MPI_Test", __LINE__, err, n);
        if (!rc && done) {
            rt_account(m->base.account, -(int64_t)p->bytes);
            free(p->copy);
        } else {
            m->pending[kept++] = *p;
        }
    }
    m->npending = kept;
    return rc;
}

static int m_send(RtComm *c, const void *buf, size_t bytes, int peer, int tag, char *err, size_t n)
{
    MComm *m = (MComm *)c;
    int count = 0;
    if (dead(c, "send", err, n) || count_of(c, "send", bytes, &count, err, n) ||
        settle(m, 0, err, n))
        return -1;
    if (m->npending == m->cap) {
        int cap = m->cap ? 2 * m->cap : 8;
        Pending *p = realloc(m->pending, (size_t)cap * sizeof *p);
        if (!p)
            return plan_errorf(err, n, "rank %d: send: out of memory", c->world_rank);
        m->pending = p;
        m->cap = cap;
    }
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy)
        return plan_errorf(err, n, "rank %d: send: out of memory for %zu bytes", c->world_rank,
                           bytes);
    memcpy(copy, buf, bytes);
    MPI_Request req;
    int rc = MPI_Isend(copy, count, MPI_BYTE, peer, tag, m->comm, &req);
    if (rc != MPI_SUCCESS) {
        free(copy);
        return mpi_fail(c->world_rank, rc, "MPI_Isend", __LINE__, err, n);
    }
    rt_account(c->account, (int64_t)(bytes ? bytes : 1));
    m->pending[m->npending++] =
        (Pending){req, copy, bytes ? bytes : 1, rt_comm_member(c, peer), tag};
    return 0;
}

static int m_recv(RtComm *c, void *buf, size_t bytes, int peer, int tag, char *err, size_t n)
{
    MComm *m = (MComm *)c;
    int count = 0, got;
    MPI_Status st;
    MPI_Request req;
    if (dead(c, "recv", err, n) || count_of(c, "recv", bytes, &count, err, n) ||
        settle(m, 0, err, n))
        return -1;
    MPI_TRY(c->world_rank, MPI_Irecv(buf, count, MPI_BYTE, peer, tag, m->comm, &req));
    if (await(m, &req, &st, W_RECV, rt_comm_member(c, peer), tag, err, n))
        return -1;
    MPI_TRY(c->world_rank, MPI_Get_count(&st, MPI_BYTE, &got));
    if (got != count)
        return plan_errorf(err, n, "rank %d: recv: member %d sent %d bytes with tag %d, not %d",
                           c->world_rank, peer, got, tag, count);
    return 0;
}

/* ---- collectives ---- */

/* The start of every collective: it counts (seq), unless the world is broken. */
static int begin(RtComm *c, const char *what, char *err, size_t n)
{
    ((MComm *)c)->seq++;
    return dead(c, what, err, n);
}

/* Pad count up to a multiple of size in scratch, reduce-scatter the blocks, gather
 * the reduced blocks back: every element is reduced once, on one member. */
static int m_all_reduce(RtComm *c, void *buf, size_t count, PlanDType dt, int max, char *err,
                        size_t n)
{
    MComm *m = (MComm *)c;
    const char *what = max ? "all_reduce_max" : "all_reduce";
    size_t es = plan_dtype_size(dt), size = (size_t)c->size;
    size_t per = (count + size - 1) / size, padded = per * size;
    int iper = 0;
    MPI_Request req;
    if (begin(c, what, err, n))
        return -1;
    if (count == 0)
        return 0;
    if (count_of(c, what, per, &iper, err, n))
        return -1;
    char *s = rt_comm_scratch(c, (padded + per) * es, err, n); /* [padded] then [per] */
    if (!s)
        return -1;
    memcpy(s, buf, count * es);
    memset(s + count * es, 0, (padded - count) * es);
    MPI_Datatype t = mpi_type(dt);
    MPI_Op op = max ? MPI_MAX : MPI_SUM;
    WaitOp w = max ? W_ALL_REDUCE_MAX : W_ALL_REDUCE;
    char *mine = s + padded * es;
    COLL(m, w, MPI_Ireduce_scatter_block(s, mine, iper, t, op, m->comm, &req));
    COLL(m, w, MPI_Iallgather(mine, iper, t, s, iper, t, m->comm, &req));
    memcpy(buf, s, count * es);
    return 0;
}

/* in: [pre][chunk][post]; MPI gathers [size][pre][chunk][post]; out: [pre][size*chunk][post]. */
static int m_all_gather(RtComm *c, const void *in, void *out, size_t pre, size_t chunk, size_t post,
                        size_t elem, char *err, size_t n)
{
    MComm *m = (MComm *)c;
    size_t row = chunk * post * elem, block = pre * row, size = (size_t)c->size;
    int count = 0;
    MPI_Request req;
    if (begin(c, "all_gather", err, n))
        return -1;
    if (block == 0)
        return 0;
    if (count_of(c, "all_gather", block, &count, err, n))
        return -1;
    if (pre == 1) {
        COLL(m, W_ALL_GATHER,
             MPI_Iallgather(in, count, MPI_BYTE, out, count, MPI_BYTE, m->comm, &req));
        return 0;
    }
    char *s = rt_comm_scratch(c, size * block, err, n);
    if (!s)
        return -1;
    COLL(m, W_ALL_GATHER, MPI_Iallgather(in, count, MPI_BYTE, s, count, MPI_BYTE, m->comm, &req));
    for (size_t j = 0; j < size; j++)
        for (size_t p = 0; p < pre; p++)
            memcpy((char *)out + (p * size + j) * row, s + (j * pre + p) * row, row);
    return 0;
}

/* in: [pre][size*chunk][post], permuted to [size][pre][chunk][post]; out: [pre][chunk][post]. */
static int m_reduce_scatter(RtComm *c, const void *in, void *out, size_t pre, size_t chunk,
                            size_t post, PlanDType dt, char *err, size_t n)
{
    MComm *m = (MComm *)c;
    size_t es = plan_dtype_size(dt), row = chunk * post * es, size = (size_t)c->size;
    int count = 0;
    MPI_Request req;
    if (begin(c, "reduce_scatter", err, n))
        return -1;
    if (pre * row == 0)
        return 0;
    if (count_of(c, "reduce_scatter", pre * chunk * post, &count, err, n))
        return -1;
    const void *send = in;
    if (pre > 1) {
        char *s = rt_comm_scratch(c, size * pre * row, err, n);
        if (!s)
            return -1;
        for (size_t j = 0; j < size; j++)
            for (size_t p = 0; p < pre; p++)
                memcpy(s + (j * pre + p) * row, (const char *)in + (p * size + j) * row, row);
        send = s;
    }
    COLL(m, W_REDUCE_SCATTER,
         MPI_Ireduce_scatter_block(send, out, count, mpi_type(dt), MPI_SUM, m->comm, &req));
    return 0;
}

static int m_all_to_all(RtComm *c, const void *in, void *out, size_t block_bytes, char *err,
                        size_t n)
{
    MComm *m = (MComm *)c;
    int count = 0;
    MPI_Request req;
    if (begin(c, "all_to_all", err, n))
        return -1;
    if (block_bytes == 0)
        return 0;
    if (count_of(c, "all_to_all", block_bytes, &count, err, n))
        return -1;
    COLL(m, W_ALL_TO_ALL, MPI_Ialltoall(in, count, MPI_BYTE, out, count, MPI_BYTE, m->comm, &req));
    return 0;
}

static int m_broadcast(RtComm *c, void *buf, size_t bytes, int root, char *err, size_t n)
{
    MComm *m = (MComm *)c;
    int count = 0;
    MPI_Request req;
    if (begin(c, "broadcast", err, n))
        return -1;
    if (bytes == 0)
        return 0;
    if (count_of(c, "broadcast", bytes, &count, err, n))
        return -1;
    COLL(m, W_BROADCAST, MPI_Ibcast(buf, count, MPI_BYTE, root, m->comm, &req));
    return 0;
}

static int m_barrier(RtComm *c, char *err, size_t n)
{
    MComm *m = (MComm *)c;
    MPI_Request req;
    if (begin(c, "barrier", err, n))
        return -1;
    COLL(m, W_BARRIER, MPI_Ibarrier(m->comm, &req));
    return 0;
}

/* ---- communicators ---- */

/* A failure while closing has no caller to tell: it goes to stderr. */
static void say_failure(int failed, const char *msg)
{
    if (failed)
        fprintf(stderr, "tcc: %s\n", msg);
}

/* Wait for the pending sends, free the communicator and the buffers (not m itself).
 * The copies of sends that failed are left alone: MPI may still hold them. A
 * broken world makes no MPI call (MPI_Abort comes next). */
static void comm_close(MComm *m)
{
    char msg[512];
    int rc;
    if (!broken && settle(m, 1, msg, sizeof msg))
        say_failure(1, msg);
    if (!broken && (rc = MPI_Comm_free(&m->comm)) != MPI_SUCCESS)
        say_failure(mpi_fail(m->base.world_rank, rc, "MPI_Comm_free", __LINE__, msg, sizeof msg),
                    msg);
    free(m->pending);
    rt_comm_release(&m->base);
}

static void m_comm_free(RtComm *c)
{
    comm_close((MComm *)c);
    free(c);
}

/* The world ranks of m's members into m->base.members. */
static int members_of(MComm *m, MPI_Comm world, char *err, size_t n)
{
    int size = m->base.size, me = m->base.world_rank, rc;
    int *idx = malloc((size_t)size * sizeof *idx), *out = malloc((size_t)size * sizeof *out);
    MPI_Group g, wg;
    if (!idx || !out) {
        free(idx), free(out);
        return plan_errorf(err, n, "rank %d: comm_split: out of memory", me);
    }
    for (int i = 0; i < size; i++)
        idx[i] = i;
    if ((rc = MPI_Comm_group(m->comm, &g)) == MPI_SUCCESS) {
        if ((rc = MPI_Comm_group(world, &wg)) == MPI_SUCCESS) {
            rc = MPI_Group_translate_ranks(g, size, idx, wg, out);
            MPI_Group_free(&wg);
        }
        MPI_Group_free(&g);
    }
    free(idx);
    if (rc != MPI_SUCCESS) {
        free(out);
        return mpi_fail(me, rc, "MPI_Group_translate_ranks", __LINE__, err, n);
    }
    m->base.members = out;
    return 0;
}

/* m->comm and m->base from MPI_Comm_split of the world's duplicate, once every
 * rank has come (a watched barrier: MPI_Comm_split itself would wait forever). */
static int split_into(MWorld *w, MComm *m, int color, int key, char *err, size_t n)
{
    int rank, size, me = w->base.rank;
    MPI_Request req;
    if (begin(&w->all.base, "comm_split", err, n))
        return -1;
    COLL(&w->all, W_SPLIT, MPI_Ibarrier(w->all.comm, &req));
    MPI_TRY(me, MPI_Comm_split(w->all.comm, color, key, &m->comm));
    MPI_TRY(me, MPI_Comm_rank(m->comm, &rank));
    MPI_TRY(me, MPI_Comm_size(m->comm, &size));
    m->base = (RtComm){&mpi_ops, rank, size, me, NULL, 0, NULL, 0, NULL, NULL, ""};
    m->world = w;
    m->id = ++w->splits;
    m->color = color;
    return members_of(m, w->all.comm, err, n);
}

static RtComm *m_split(RtWorld *w, int color, int key, char *err, size_t n)
{
    MComm *m = calloc(1, sizeof *m);
    if (!m) {
        plan_errorf(err, n, "rank %d: comm_split: out of memory", w->rank);
        return NULL;
    }
    m->comm = MPI_COMM_NULL;
    if (split_into((MWorld *)w, m, color, key, err, n)) {
        if (m->comm != MPI_COMM_NULL && !broken)
            MPI_Comm_free(&m->comm);
        free(m);
        return NULL;
    }
    return &m->base;
}

/* ---- worlds ---- */

int rt_mpi_launched(void)
{
    /* OMPI_COMM_WORLD_SIZE: OpenMPI's mpirun. PMIX_RANK: PMIx launchers (OpenMPI >= 4
     * mpirun/prterun, srun --mpi=pmix). PMI_RANK, PMI_SIZE: MPICH's hydra, srun
     * --mpi=pmi2. Not SLURM_PROCID: sbatch sets it in the batch script too, where no
     * launcher has wired up the ranks. */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return 1;
    }
    return 0;
}

/* MPI_Init_thread unless MPI runs already; refuses after MPI_Finalize. */
static int mpi_start(char *err, size_t n)
{
    int finalized, initialized, provided;
    MPI_TRY(-1, MPI_Finalized(&finalized));
    if (finalized)
        return plan_errorf(err, n, "mpi: MPI was finalized already (it starts once a process)");
    MPI_TRY(-1, MPI_Initialized(&initialized));
    if (initialized)
        return 0;
    /* Only the thread that opened the world calls MPI; kernels' threads never do. */
    MPI_TRY(-1, MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided));
    we_initialized = 1;
    return 0;
}

static void mpi_stop(void)
{
    char msg[512];
    if (open_worlds > 0 || !we_initialized)
        return;
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS)
        say_failure(mpi_fail(-1, rc, "MPI_Finalize", __LINE__, msg, sizeof msg), msg);
}

/* w's duplicates of MPI_COMM_WORLD (its comm and the watchdogs'), errors returned
 * instead of fatal. */
static int world_open(MWorld *w, double timeout, char *err, size_t n)
{
    int rank = -1, size;
    w->all.comm = w->watch = MPI_COMM_NULL;
    MPI_TRY(rank, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_TRY(rank, MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_TRY(rank, MPI_Comm_size(MPI_COMM_WORLD, &size));
    MPI_TRY(rank, MPI_Comm_dup(MPI_COMM_WORLD, &w->all.comm));
    MPI_TRY(rank, MPI_Comm_dup(MPI_COMM_WORLD, &w->watch));
    w->base = (RtWorld){&mpi_ops, rank, size};
    w->all.base = (RtComm){&mpi_ops, rank, size, rank, NULL, 0, NULL, 0, NULL, NULL, "world"};
    w->all.world = w;
    w->timeout = timeout;
    w->asked = rank;
    w->now.op = W_NONE;
    return 0;
}

RtWorld *rt_world_mpi(char *err, size_t n)
{
    double timeout;
    if (!rt_mpi_launched()) {
        plan_errorf(err, n,
                    "mpi: not started by mpirun or srun (none of OMPI_COMM_WORLD_SIZE, "
                    "PMIX_RANK, PMI_RANK, PMI_SIZE is set)");
        return NULL;
    }
    if (rt_comm_timeout(&timeout, err, n))
        return NULL;
    MWorld *w = calloc(1, sizeof *w);
    if (!w) {
        plan_errorf(err, n, "mpi: out of memory");
        return NULL;
    }
    if (mpi_start(err, n) || world_open(w, timeout, err, n)) {
        if (w->all.comm != MPI_COMM_NULL)
            MPI_Comm_free(&w->all.comm);
        if (w->watch != MPI_COMM_NULL)
            MPI_Comm_free(&w->watch);
        free(w);
        mpi_stop();
        return NULL;
    }
    open_worlds++;
    return &w->base;
}

/* Every rank is here before MPI_Finalize (a watched barrier, so a rank that never
 * comes is named); a broken world ends the job instead. */
static void m_world_close(RtWorld *w)
{
    MWorld *mw = (MWorld *)w;
    char msg[512];
    MPI_Request req;
    if (!broken && !begin(&mw->all.base, "close", msg, sizeof msg))
        say_failure(wait_for(&mw->all, MPI_Ibarrier(mw->all.comm, &req), "MPI_Ibarrier", __LINE__,
                             &req, W_CLOSE, msg, sizeof msg) != 0,
                    msg);
    if (broken) {
        fflush(NULL);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    comm_close(&mw->all);
    int rc = MPI_Comm_free(&mw->watch);
    if (rc != MPI_SUCCESS)
        say_failure(mpi_fail(w->rank, rc, "MPI_Comm_free", __LINE__, msg, sizeof msg), msg);
    free(mw->told);
    free(mw);
    open_worlds--;
    mpi_stop();
}

static int m_world_broken(const RtWorld *w)
{
    (void)w;
    return broken;
}

static const RtCommOps mpi_ops = {
    .name = "mpi",
    .split = m_split,
    .comm_free = m_comm_free,
    .world_close = m_world_close,
    .world_broken = m_world_broken,
    .all_reduce = m_all_reduce,
    .all_gather = m_all_gather,
    .reduce_scatter = m_reduce_scatter,
    .all_to_all = m_all_to_all,
    .broadcast = m_broadcast,
    .barrier = m_barrier,
    .send = m_send,
    .recv = m_recv,
};
