/* threads.c: the threads backend of comm.h: every rank is a thread of one process.
 * Reads: the buffers the members of a group pass to a collective (each reads
 * the others' inputs in place). Writes: each member its own outputs only.
 * Key idea: a group is one shared Group (a mutex, a barrier with a generation
 * counter, a slot per member, a mailbox per ordered pair of members). A
 * collective is: publish this member's call and buffers in its slot, barrier,
 * check that every member makes the same call, compute this member's part from
 * the others' buffers, barrier again so nobody returns (and reuses a buffer)
 * while another still reads it. Sums run over members 0..size-1 in order and
 * each element is summed by one member only, so every member gets bitwise the
 * same result, every run. Sends are buffered (copied into the mailbox), so a
 * send never waits for its recv and a ring of sends then recvs cannot deadlock.
 * No hangs: a rank whose work fails marks the hub (rt_threads_fail), and every
 * wait (a barrier, a recv) looks at that mark every 100 ms, so the others stop
 * at once with a message naming the failed rank; a wait longer than the hub's
 * timeout (the watchdog) marks the hub too, naming the members that never
 * came or the message that never arrived. */
#include "runtime/comm/comm_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum {
    OP_BROKEN, /* this member cannot take part (out of memory): everyone fails */
    OP_SPLIT,
    OP_ALL_REDUCE,
    OP_ALL_REDUCE_MAX,
    OP_ALL_GATHER,
    OP_REDUCE_SCATTER,
    OP_ALL_TO_ALL,
    OP_BROADCAST,
    OP_BARRIER,
} OpKind;

static const char *const op_names[] = {
    "(failed)",       "comm_split", "all_reduce", "all_reduce_max", "all_gather",
    "reduce_scatter", "all_to_all", "broadcast",  "barrier",
};

/* What a member says it is doing; the members of one collective say the same. */
typedef struct Sig {
    int op, dt;
    size_t a, b, c, d; /* the sizes of the call, in the order of its arguments */
} Sig;

typedef struct Group Group;

typedef struct Slot {
    Sig sig;
    unsigned long at; /* the barrier generation this member reached, + 1 */
    const void *in;
    void *out;
    int color, key; /* comm_split */
    Group *made;    /* comm_split: the group its leader made */
} Slot;

typedef struct Msg {
    struct Msg *next;
    int tag;
    size_t bytes;
    RtAccount *account; /* the sender's: counted there until received (or the sender's comm
                           is freed); read and cleared under the group's lock */
    unsigned char data[];
} Msg;

struct Group {
    RtThreadsHub *hub; /* whose failure mark and watchdog the waits read */
    int size;
    int refs; /* members whose comm is not freed yet */
    pthread_mutex_t mu;
    pthread_cond_t turn; /* the barrier's generation moved on */
    pthread_cond_t mail; /* a message arrived */
    int arrived;
    unsigned long gen;
    Slot *slot;         /* [size] */
    Msg **head, **tail; /* [src * size + dst]: queues, oldest first */
};

struct RtThreadsHub {
    int failed;      /* 1 + the rank that failed first (or whose wait timed out); 0: none.
                        Read without the lock (__atomic), set once under it */
    double timeout;  /* seconds a wait may last (the watchdog) */
    int nranks;
    pthread_mutex_t mu;
    int refs;             /* the creator's, and one per open world */
    unsigned char *taken; /* [nranks]: a world of that rank is open */
    Group *world;         /* every rank, in rank order */
};

typedef struct TComm {
    RtComm base;
    Group *g;
    int owns; /* holds a reference on g (a split comm; not the world's own) */
} TComm;

typedef struct TWorld {
    RtWorld base;
    RtThreadsHub *hub;
    TComm all; /* the world as a group, for comm_split */
} TWorld;

static const RtCommOps threads_ops;

/* ---- pthreads, checked: a failure here is a bug (a bad mutex), so it aborts ---- */

static void die(const char *what, const char *why, int line)
{
    fprintf(stderr, "tcc: internal error at %s:%d: %s: %s\n", __FILE__, line, what, why);
    fflush(NULL);
    abort();
}

#define PT_CHECK(call)                                                                             \
    do {                                                                                           \
        int e_ = (call);                                                                           \
        if (e_)                                                                                    \
            die(#call, strerror(e_), __LINE__);                                                    \
    } while (0)

static void lock(pthread_mutex_t *m)
{
    PT_CHECK(pthread_mutex_lock(m));
}

static void unlock(pthread_mutex_t *m)
{
    PT_CHECK(pthread_mutex_unlock(m));
}

/* memcpy that accepts NULL pointers when there is nothing to copy. */
static void copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

/* ---- groups ---- */

static void group_free(Group *g)
{
    for (size_t q = 0; q < (size_t)g->size * (size_t)g->size; q++)
        for (Msg *m = g->head[q], *next; m; m = next) {
            next = m->next;
            free(m);
        }
    PT_CHECK(pthread_mutex_destroy(&g->mu));
    PT_CHECK(pthread_cond_destroy(&g->turn));
    PT_CHECK(pthread_cond_destroy(&g->mail));
    free(g->slot);
    free(g->head);
    free(g->tail);
    free(g);
}

/* A group of size members, each holding a reference; NULL when out of memory. */
static Group *group_new(RtThreadsHub *hub, int size)
{
    Group *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->hub = hub;
    size_t pairs = (size_t)size * (size_t)size;
    g->size = g->refs = size;
    g->slot = calloc((size_t)size, sizeof *g->slot);
    g->head = calloc(pairs, sizeof *g->head);
    g->tail = calloc(pairs, sizeof *g->tail);
    if (!g->slot || !g->head || !g->tail || pthread_mutex_init(&g->mu, NULL)) {
        free(g->slot), free(g->head), free(g->tail), free(g);
        return NULL;
    }
    PT_CHECK(pthread_cond_init(&g->turn, NULL));
    PT_CHECK(pthread_cond_init(&g->mail, NULL));
    return g;
}

static void group_unref(Group *g)
{
    lock(&g->mu);
    int last = --g->refs == 0;
    unlock(&g->mu);
    if (last)
        group_free(g);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Mark the hub: rank failed first (the first mark stays). */
static void hub_fail(RtThreadsHub *hub, int rank)
{
    lock(&hub->mu);
    if (!hub->failed)
        __atomic_store_n(&hub->failed, rank + 1, __ATOMIC_SEQ_CST);
    unlock(&hub->mu);
}

void rt_threads_fail(RtThreadsHub *hub, int rank)
{
    if (hub)
        hub_fail(hub, rank);
}

int rt_threads_failed(RtThreadsHub *hub)
{
    return hub ? __atomic_load_n(&hub->failed, __ATOMIC_SEQ_CST) - 1 : -1;
}

/* One tick of a wait on cv (g->mu held; *since: the wait's start, 0 before
 * its first tick): 0 to wait on, or -1 with the message when a rank of the
 * world has failed or the wait has lasted the timeout (then this rank marks
 * the hub). why() writes what is awaited, for that. */
static int tick(TComm *t, pthread_cond_t *cv, double *since, const char *op,
                void (*why)(TComm *, const void *, char *, size_t), const void *arg, char *err,
                size_t n)
{
    Group *g = t->g;
    RtThreadsHub *hub = g->hub;
    if (!*since) /* the wait's start, wall time: a wait can be woken often (every send) */
        *since = now_s();
    double waited = now_s() - *since;
    int failed = hub ? __atomic_load_n(&hub->failed, __ATOMIC_SEQ_CST) : 0;
    if (failed)
        return plan_errorf(err, n, "rank %d: %s: stopped, rank %d failed", t->base.world_rank, op,
                           failed - 1);
    if (hub && waited >= hub->timeout) {
        char what[256], group[128];
        why(t, arg, what, sizeof what);
        rt_comm_describe(&t->base, group, sizeof group);
        unlock(&g->mu); /* the hub's lock is never taken under a group's */
        hub_fail(hub, t->base.world_rank);
        lock(&g->mu);
        return plan_errorf(err, n,
                           "rank %d: %s in %s: waited %g s (the watchdog, TCC_COMM_TIMEOUT or "
                           "--timeout): %s",
                           t->base.world_rank, op, group, hub->timeout, what);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    int e = pthread_cond_timedwait(cv, &g->mu, &ts);
    if (e && e != ETIMEDOUT)
        die("pthread_cond_timedwait", strerror(e), __LINE__);
    return 0;
}

/* The world ranks of the members of t's group that have not reached barrier
 * generation *gen (the first 8, then how many more). */
static void absent(TComm *t, const void *gen, char *out, size_t n)
{
    Group *g = t->g;
    size_t at = (size_t)snprintf(out, n, "not arrived:");
    int shown = 0, more = 0;
    for (int j = 0; j < g->size; j++) {
        if (g->slot[j].at == *(const unsigned long *)gen + 1)
            continue;
        if (shown < 8 && at < n)
            at += (size_t)snprintf(out + at, n - at, "%s rank %d", shown ? "," : "",
                                   rt_comm_member(&t->base, j));
        shown < 8 ? shown++ : more++;
    }
    if (more && at < n)
        snprintf(out + at, n - at, " and %d more", more);
}

/* Wait until every member of t's group has come here: 0, or -1 with a message
 * when a rank failed or the watchdog fired. */
static int barrier(TComm *t, const char *op, char *err, size_t n)
{
    Group *g = t->g;
    int rc = 0;
    double since = 0;
    lock(&g->mu);
    unsigned long gen = g->gen;
    g->slot[t->base.rank].at = gen + 1;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        g->gen++;
        PT_CHECK(pthread_cond_broadcast(&g->turn));
    } else {
        while (gen == g->gen && !(rc = tick(t, &g->turn, &since, op, absent, &gen, err, n)))
            ;
    }
    unlock(&g->mu);
    return rc;
}

static int sig_equal(const Sig *x, const Sig *y)
{
    return x->op == y->op && x->dt == y->dt && x->a == y->a && x->b == y->b && x->c == y->c &&
           x->d == y->d;
}

static int disagree(const TComm *t, int j, char *err, size_t n)
{
    const Sig *mine = &t->g->slot[t->base.rank].sig, *other = &t->g->slot[j].sig;
    if (other->op == OP_BROKEN)
        return plan_errorf(err, n, "rank %d: %s: member %d of the group could not take part",
                           t->base.world_rank, op_names[mine->op], j);
    return plan_errorf(err, n,
                       "rank %d: %s: the members disagree: member %d calls %s "
                       "(dtype %d, sizes %zu %zu %zu %zu), member %d calls %s "
                       "(dtype %d, sizes %zu %zu %zu %zu)",
                       t->base.world_rank, op_names[mine->op], t->base.rank, op_names[mine->op],
                       mine->dt, mine->a, mine->b, mine->c, mine->d, j, op_names[other->op],
                       other->dt, other->a, other->b, other->c, other->d);
}

/* Publish this member's call and buffers, wait for every member, and check that
 * they all make the same call. On -1 every member has failed (and has passed the
 * closing barrier); a member that published OP_BROKEN keeps its own message. */
static int meet(TComm *t, Sig sig, const void *in, void *out, char *err, size_t n)
{
    Group *g = t->g;
    Slot *me = &g->slot[t->base.rank];
    me->sig = sig;
    me->in = in;
    me->out = out;
    if (barrier(t, op_names[sig.op], err, n))
        return -1;
    int bad = -1;
    for (int j = 0; j < g->size && bad < 0; j++)
        if (!sig_equal(&g->slot[j].sig, &sig) || sig.op == OP_BROKEN)
            bad = j;
    if (bad < 0)
        return 0;
    if (sig.op != OP_BROKEN)
        disagree(t, bad, err, n);
    char late[256];
    barrier(t, op_names[sig.op], late, sizeof late);
    return -1;
}

/* ---- reductions: over members 0..size-1 in order, so bitwise the same everywhere ---- */

#define COMBINE(T, SUM)                                                                            \
    do {                                                                                           \
        T *a_ = acc;                                                                               \
        const T *x_ = x;                                                                           \
        if (max)                                                                                   \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = x_[i] > a_[i] ? x_[i] : a_[i];                                             \
        else                                                                                       \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = SUM(a_[i], x_[i]);                                                         \
    } while (0)

#define PLUS(u, v) ((u) + (v))
/* i32 sums wrap (two's complement) instead of overflowing. */
#define PLUS_WRAP(u, v) ((int32_t)((uint32_t)(u) + (uint32_t)(v)))

/* acc[i] = acc[i] + x[i] (max: the larger of them), count elements of dt. */
static void combine(PlanDType dt, int max, void *acc, const void *x, size_t count)
{
    switch (dt) {
    case PD_F32:
        COMBINE(float, PLUS);
        break;
    case PD_F64:
        COMBINE(double, PLUS);
        break;
    case PD_I32:
        COMBINE(int32_t, PLUS_WRAP);
        break;
    default: /* comm.c lets no other dtype through */
        die("combine", plan_dtype_name(dt), __LINE__);
    }
}

/* dst[0..len) = the reduction over the members of their in[off..off+len). */
static void reduce_members(const Group *g, PlanDType dt, int max, void *dst, size_t off, size_t len)
{
    size_t es = plan_dtype_size(dt);
    copy(dst, (const char *)g->slot[0].in + off * es, len * es);
    for (int j = 1; j < g->size && len; j++)
        combine(dt, max, dst, (const char *)g->slot[j].in + off * es, len);
}

/* Member r's share of count elements: [lo, lo + len), the shares in member order. */
static void share(size_t count, int size, int r, size_t *lo, size_t *len)
{
    size_t q = count / (size_t)size, rem = count % (size_t)size, ur = (size_t)r;
    *lo = ur * q + (ur < rem ? ur : rem);
    *len = q + (ur < rem);
}

/* ---- collectives ---- */

/* Each member reduces its share into its scratch; then everyone copies every share. */
static int t_all_reduce(RtComm *c, void *buf, size_t count, PlanDType dt, int max, char *err,
                        size_t n)
{
    TComm *t = (TComm *)c;
    size_t es = plan_dtype_size(dt), lo, len;
    share(count, c->size, c->rank, &lo, &len);
    void *part = rt_comm_scratch(c, len * es, err, n);
    Sig sig = {part ? (max ? OP_ALL_REDUCE_MAX : OP_ALL_REDUCE) : OP_BROKEN, dt, count, 0, 0, 0};
    if (meet(t, sig, buf, part, err, n))
        return -1;
    reduce_members(t->g, dt, max, part, lo, len);
    if (barrier(t, op_names[sig.op], err, n)) /* every share is done, nobody reads a buf */
        return -1;
    for (int j = 0; j < c->size; j++) {
        share(count, c->size, j, &lo, &len);
        copy((char *)buf + lo * es, t->g->slot[j].out, len * es);
    }
    return barrier(t, op_names[sig.op], err, n); /* nobody reads a share any more */
}

/* in: [pre][chunk][post]; out: [pre][size*chunk][post], member j's in at chunk index j. */
static int t_all_gather(RtComm *c, const void *in, void *out, size_t pre, size_t chunk, size_t post,
                        size_t elem, char *err, size_t n)
{
    TComm *t = (TComm *)c;
    Sig sig = {OP_ALL_GATHER, 0, pre, chunk, post, elem};
    if (meet(t, sig, in, out, err, n))
        return -1;
    size_t row = chunk * post * elem, size = (size_t)c->size;
    for (size_t j = 0; j < size; j++)
        for (size_t p = 0; p < pre; p++)
            copy((char *)out + (p * size + j) * row, (const char *)t->g->slot[j].in + p * row, row);
    return barrier(t, op_names[sig.op], err, n);
}

/* in: [pre][size*chunk][post]; out: [pre][chunk][post], the sum of block rank. */
static int t_reduce_scatter(RtComm *c, const void *in, void *out, size_t pre, size_t chunk,
                            size_t post, PlanDType dt, char *err, size_t n)
{
    TComm *t = (TComm *)c;
    Sig sig = {OP_REDUCE_SCATTER, dt, pre, chunk, post, 0};
    if (meet(t, sig, in, out, err, n))
        return -1;
    size_t row = chunk * post, es = plan_dtype_size(dt), size = (size_t)c->size;
    for (size_t p = 0; p < pre; p++)
        reduce_members(t->g, dt, 0, (char *)out + p * row * es, (p * size + (size_t)c->rank) * row,
                       row);
    return barrier(t, op_names[sig.op], err, n);
}

static int t_all_to_all(RtComm *c, const void *in, void *out, size_t block_bytes, char *err,
                        size_t n)
{
    TComm *t = (TComm *)c;
    Sig sig = {OP_ALL_TO_ALL, 0, block_bytes, 0, 0, 0};
    if (meet(t, sig, in, out, err, n))
        return -1;
    size_t mine = (size_t)c->rank * block_bytes;
    for (int j = 0; j < c->size; j++)
        copy((char *)out + (size_t)j * block_bytes, (const char *)t->g->slot[j].in + mine,
             block_bytes);
    return barrier(t, op_names[sig.op], err, n);
}

static int t_broadcast(RtComm *c, void *buf, size_t bytes, int root, char *err, size_t n)
{
    TComm *t = (TComm *)c;
    Sig sig = {OP_BROADCAST, 0, bytes, (size_t)root, 0, 0};
    if (meet(t, sig, buf, buf, err, n))
        return -1;
    if (c->rank != root)
        copy(buf, t->g->slot[root].in, bytes);
    return barrier(t, op_names[sig.op], err, n);
}

static int t_barrier(RtComm *c, char *err, size_t n)
{
    TComm *t = (TComm *)c;
    Sig sig = {OP_BARRIER, 0, 0, 0, 0, 0};
    if (meet(t, sig, NULL, NULL, err, n))
        return -1;
    return barrier(t, op_names[sig.op], err, n);
}

/* ---- point to point: a FIFO per (src, dst), matched by tag ---- */

static int t_send(RtComm *c, const void *buf, size_t bytes, int peer, int tag, char *err, size_t n)
{
    Group *g = ((TComm *)c)->g;
    Msg *m = malloc(sizeof *m + bytes);
    if (!m)
        return plan_errorf(err, n, "rank %d: send: out of memory for %zu bytes", c->world_rank,
                           bytes);
    m->next = NULL;
    m->tag = tag;
    m->bytes = bytes;
    m->account = c->account;
    rt_account(m->account, (int64_t)(sizeof *m + bytes));
    copy(m->data, buf, bytes);
    size_t q = (size_t)c->rank * (size_t)g->size + (size_t)peer;
    lock(&g->mu);
    if (g->tail[q])
        g->tail[q]->next = m;
    else
        g->head[q] = m;
    g->tail[q] = m;
    PT_CHECK(pthread_cond_broadcast(&g->mail));
    unlock(&g->mu);
    return 0;
}

/* The oldest message of queue q with tag, unlinked; NULL when there is none. */
static Msg *take(Group *g, size_t q, int tag)
{
    Msg *prev = NULL;
    for (Msg *m = g->head[q]; m; prev = m, m = m->next) {
        if (m->tag != tag)
            continue;
        if (prev)
            prev->next = m->next;
        else
            g->head[q] = m->next;
        if (g->tail[q] == m)
            g->tail[q] = prev;
        return m;
    }
    return NULL;
}

/* What a recv waits for, for the watchdog's message. */
static void no_message(TComm *t, const void *arg, char *out, size_t n)
{
    const int *pt = arg;
    snprintf(out, n, "no message from rank %d with tag %d", rt_comm_member(&t->base, pt[0]), pt[1]);
}

static int t_recv(RtComm *c, void *buf, size_t bytes, int peer, int tag, char *err, size_t n)
{
    TComm *t = (TComm *)c;
    Group *g = t->g;
    size_t q = (size_t)peer * (size_t)g->size + (size_t)c->rank;
    Msg *m;
    int what[2] = {peer, tag};
    double since = 0;
    lock(&g->mu);
    while (!(m = take(g, q, tag)))
        if (tick(t, &g->mail, &since, "recv", no_message, what, err, n)) {
            unlock(&g->mu);
            return -1;
        }
    rt_account(m->account, -(int64_t)(sizeof *m + m->bytes)); /* the sender may be gone */
    unlock(&g->mu);
    int rc = 0;
    if (m->bytes != bytes)
        rc = plan_errorf(err, n, "rank %d: recv: member %d sent %zu bytes with tag %d, not %zu",
                         c->world_rank, peer, m->bytes, tag, bytes);
    else
        copy(buf, m->data, bytes);
    free(m);
    return rc;
}

/* ---- comm_split ---- */

/* Does member j (with key kj) come before member me (with key k) in their new group? */
static int before(int kj, int j, int k, int me)
{
    return kj < k || (kj == k && j < me);
}

/* Members of a new group: their (key, world rank), to be sorted. */
typedef struct Member {
    int key, rank;
} Member;

static int member_order(const void *a, const void *b)
{
    const Member *x = a, *y = b;
    return before(x->key, x->rank, y->key, y->rank) ? -1 : before(y->key, y->rank, x->key, x->rank);
}

/* The world ranks of the members of color, in their order in the new group
 * (g's slots hold every rank's color and key); NULL when out of memory. */
static int *members_of(const Group *g, int color, int size)
{
    Member *m = malloc((size_t)size * sizeof *m);
    int *ranks = malloc((size_t)size * sizeof *ranks), k = 0;
    for (int j = 0; m && ranks && j < g->size; j++)
        if (g->slot[j].color == color)
            m[k++] = (Member){g->slot[j].key, j};
    if (m && ranks) {
        qsort(m, (size_t)size, sizeof *m, member_order);
        for (int j = 0; j < size; j++)
            ranks[j] = m[j].rank;
    } else {
        free(ranks);
        ranks = NULL;
    }
    free(m);
    return ranks;
}

/* Collective over the world: publish (color, key); the lowest world rank of each
 * color makes its group and publishes it; each member finds its rank by key. */
static RtComm *t_split(RtWorld *w, int color, int key, char *err, size_t n)
{
    TWorld *tw = (TWorld *)w;
    Group *g = tw->all.g;
    int me = w->rank, leader = me, size = 0, rank = 0, *members = NULL;
    TComm *t = calloc(1, sizeof *t);
    g->slot[me].color = color;
    g->slot[me].key = key;
    g->slot[me].made = NULL;
    Sig sig = {t ? OP_SPLIT : OP_BROKEN, 0, 0, 0, 0, 0};
    if (!t)
        plan_errorf(err, n, "rank %d: comm_split: out of memory", me);
    if (meet(&tw->all, sig, NULL, NULL, err, n)) {
        free(t);
        return NULL;
    }
    for (int j = 0; j < g->size; j++) {
        if (g->slot[j].color != color)
            continue;
        leader = j < leader ? j : leader;
        size++;
        rank += before(g->slot[j].key, j, key, me);
    }
    if (leader == me)
        g->slot[me].made = group_new(tw->hub, size);
    members = members_of(g, color, size);
    if (barrier(&tw->all, "comm_split", err, n)) {
        free(t), free(members);
        return NULL;
    }
    Group *made = g->slot[leader].made;
    if (barrier(&tw->all, "comm_split", err, n)) { /* nobody reads the slots any more */
        free(t), free(members);
        return NULL;
    }
    if (!made || !members) {
        free(t), free(members);
        plan_errorf(err, n, "rank %d: comm_split: out of memory for a group of %d", me, size);
        return NULL;
    }
    t->base = (RtComm){&threads_ops, rank, size, me, NULL, 0, NULL, 0, NULL, members, ""};
    t->g = made;
    t->owns = 1;
    return &t->base;
}

/* The messages c sent that no one received are no longer counted: the
 * account is its device's, which goes away with it. */
static void forget_sent(TComm *t)
{
    Group *g = t->g;
    lock(&g->mu);
    for (int peer = 0; peer < g->size; peer++)
        for (Msg *m = g->head[(size_t)t->base.rank * (size_t)g->size + (size_t)peer]; m;
             m = m->next)
            m->account = NULL;
    unlock(&g->mu);
}

static void t_comm_free(RtComm *c)
{
    TComm *t = (TComm *)c;
    if (t->base.account)
        forget_sent(t);
    rt_comm_release(c);
    if (t->owns) {
        group_unref(t->g);
        free(t);
    }
}

/* ---- the hub and its worlds ---- */

static void hub_destroy(RtThreadsHub *hub)
{
    group_free(hub->world);
    PT_CHECK(pthread_mutex_destroy(&hub->mu));
    free(hub->taken);
    free(hub);
}

/* Drop one reference; the last one frees the hub. */
static void hub_unref(RtThreadsHub *hub)
{
    lock(&hub->mu);
    int last = --hub->refs == 0;
    unlock(&hub->mu);
    if (last)
        hub_destroy(hub);
}

RtThreadsHub *rt_threads_hub_new(int nranks)
{
    if (nranks < 1)
        return NULL;
    RtThreadsHub *hub = calloc(1, sizeof *hub);
    if (!hub)
        return NULL;
    hub->nranks = nranks;
    hub->refs = 1;
    hub->taken = calloc((size_t)nranks, 1);
    hub->timeout = 300;
    hub->world = group_new(hub, nranks);
    if (!hub->taken || !hub->world || pthread_mutex_init(&hub->mu, NULL)) {
        if (hub->world)
            group_free(hub->world);
        free(hub->taken);
        free(hub);
        return NULL;
    }
    return hub;
}

void rt_threads_hub_timeout(RtThreadsHub *hub, double seconds)
{
    if (hub && seconds > 0)
        hub->timeout = seconds;
}

void rt_threads_hub_free(RtThreadsHub *hub)
{
    if (hub)
        hub_unref(hub);
}

RtWorld *rt_world_threads(RtThreadsHub *hub, int rank)
{
    if (!hub)
        return NULL;
    TWorld *w = calloc(1, sizeof *w);
    lock(&hub->mu);
    int ok = w && rank >= 0 && rank < hub->nranks && !hub->taken[rank];
    if (ok) {
        hub->taken[rank] = 1;
        hub->refs++;
    }
    unlock(&hub->mu);
    if (!ok) {
        fprintf(stderr, "tcc: rt_world_threads: rank %d: %s (the hub has %d ranks)\n", rank,
                w ? "out of range or taken" : "out of memory", hub->nranks);
        free(w);
        return NULL;
    }
    w->base = (RtWorld){&threads_ops, rank, hub->nranks};
    w->hub = hub;
    w->all.base = (RtComm){&threads_ops, rank, hub->nranks, rank, NULL, 0, NULL, 0, NULL, NULL, ""};
    w->all.g = hub->world;
    rt_comm_name(&w->all.base, "world");
    return &w->base;
}

static void t_world_close(RtWorld *w)
{
    TWorld *tw = (TWorld *)w;
    RtThreadsHub *hub = tw->hub;
    rt_comm_release(&tw->all.base);
    lock(&hub->mu);
    hub->taken[w->rank] = 0;
    unlock(&hub->mu);
    free(tw);
    hub_unref(hub);
}

static int t_world_broken(const RtWorld *w)
{
    return rt_threads_failed(((const TWorld *)w)->hub) >= 0;
}

static const RtCommOps threads_ops = {
    .name = "threads",
    .split = t_split,
    .comm_free = t_comm_free,
    .world_close = t_world_close,
    .world_broken = t_world_broken,
    .all_reduce = t_all_reduce,
    .all_gather = t_all_gather,
    .reduce_scatter = t_reduce_scatter,
    .all_to_all = t_all_to_all,
    .broadcast = t_broadcast,
    .barrier = t_barrier,
    .send = t_send,
    .recv = t_recv,
};
