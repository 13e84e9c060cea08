/* mpi.c: the mpi backend of comm.h: one process per rank under mpirun (OpenMPI).
 * Reads: the launcher's environment (rt_mpi_launched), the buffers of each call.
 * Writes: the outputs of each call; MPI_Init_thread on the first world and
 * MPI_Finalize when the last one closes.
 * Key idea: every sum is reduced exactly once, by MPI_Reduce_scatter_block (each
 * element lives on one member), and then copied to everyone (MPI_Allgather), so
 * all members get bitwise the same result, whatever MPI's reduction order. The
 * [pre][chunk][post] geometry of all_gather and reduce_scatter is permuted
 * through the comm's scratch buffer into MPI's [size][...] blocks (not needed
 * when pre is 1). Sends are buffered (a copy sent by MPI_Isend, freed once done),
 * as in the threads backend, so a ring of sends then recvs cannot deadlock.
 * Every MPI call is checked (communicators get MPI_ERRORS_RETURN); the message
 * names the call, file:line, MPI's own text and the world rank. A call that
 * fails on one rank leaves the others waiting in the collective: the caller
 * exits nonzero and mpirun then ends the job. */
#include "runtime/comm/comm_impl.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Pending {
    MPI_Request req;
    void *copy; /* what MPI_Isend is sending */
    size_t bytes; /* its size, as counted (rt_account) */
} Pending;

typedef struct MComm {
    RtComm base;
    MPI_Comm comm;
    Pending *pending; /* sends not known to be done */
    int npending, cap;
} MComm;

typedef struct MWorld {
    RtWorld base;
    MComm all; /* a duplicate of MPI_COMM_WORLD */
} MWorld;

/* MPI itself is once per process, so this state is too: the worlds open in this
 * process, and whether MPI_Init was ours (then MPI_Finalize is ours as well).
 * Only one thread calls MPI (MPI_THREAD_FUNNELED), so no lock. */
static int open_worlds, we_initialized;

static const RtCommOps mpi_ops;

/* ---- errors ---- */

/* "rank R: MPI_Xxx failed at file:line: MPI's text" into err; -1. */
static int mpi_fail(int rank, int rc, const char *call, int line, char *err, size_t n)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
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

/* ---- buffered sends ---- */

/* Free the copies of the sends that are done (wait: of all of them). A send whose
 * wait or test fails stays pending, its copy kept: MPI may still read it. */
static int settle(MComm *m, int wait, char *err, size_t n)
{
    int kept = 0, rc = MPI_SUCCESS;
    for (int i = 0; i < m->npending; i++) {
        int done = 1, e;
        if (wait)
            e = MPI_Wait(&m->pending[i].req, MPI_STATUS_IGNORE);
        else
            e = MPI_Test(&m->pending[i].req, &done, MPI_STATUS_IGNORE);
        if (e == MPI_SUCCESS && done) {
            rt_account(m->base.account, -(int64_t)m->pending[i].bytes);
            free(m->pending[i].copy);
        } else
            m->pending[kept++] = m->pending[i];
        rc = rc == MPI_SUCCESS ? e : rc;
    }
    m->npending = kept;
    if (rc != MPI_SUCCESS)
        return mpi_fail(m->base.world_rank, rc, wait ? "MPI_Wait" : "MPI_Test", __LINE__, err, n);
    return 0;
}

static int m_send(RtComm *c, const void *buf, size_t bytes, int peer, int tag, char *err, size_t n)
{
    MComm *m = (MComm *)c;
    int count = 0;
    if (count_of(c, "send", bytes, &count, err, n) || settle(m, 0, err, n))
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
    m->pending[m->npending++] = (Pending){req, copy, bytes ? bytes : 1};
    return 0;
}

static int m_recv(RtComm *c, void *buf, size_t bytes, int peer, int tag, char *err, size_t n)
{
    MComm *m = (MComm *)c;
    int count = 0, got;
    MPI_Status st;
    if (count_of(c, "recv", bytes, &count, err, n) || settle(m, 0, err, n))
        return -1;
    MPI_TRY(c->world_rank, MPI_Recv(buf, count, MPI_BYTE, peer, tag, m->comm, &st));
    MPI_TRY(c->world_rank, MPI_Get_count(&st, MPI_BYTE, &got));
    if (got != count)
        return plan_errorf(err, n, "rank %d: recv: member %d sent %d bytes with tag %d, not %d",
                           c->world_rank, peer, got, tag, count);
    return 0;
}

/* ---- collectives ---- */

/* Pad count up to a multiple of size in scratch, reduce-scatter the blocks, gather
 * the reduced blocks back: every element is reduced once, on one member. */
static int m_all_reduce(RtComm *c, void *buf, size_t count, PlanDType dt, int max, char *err,
                        size_t n)
{
    MComm *m = (MComm *)c;
    size_t es = plan_dtype_size(dt), size = (size_t)c->size;
    size_t per = (count + size - 1) / size, padded = per * size;
    int iper = 0;
    if (count == 0)
        return 0;
    if (count_of(c, max ? "all_reduce_max" : "all_reduce", per, &iper, err, n))
        return -1;
    char *s = rt_comm_scratch(c, (padded + per) * es, err, n); /* [padded] then [per] */
    if (!s)
        return -1;
    memcpy(s, buf, count * es);
    memset(s + count * es, 0, (padded - count) * es);
    MPI_Datatype t = mpi_type(dt);
    MPI_Op op = max ? MPI_MAX : MPI_SUM;
    char *mine = s + padded * es;
    MPI_TRY(c->world_rank, MPI_Reduce_scatter_block(s, mine, iper, t, op, m->comm));
    MPI_TRY(c->world_rank, MPI_Allgather(mine, iper, t, s, iper, t, m->comm));
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
    if (block == 0)
        return 0;
    if (count_of(c, "all_gather", block, &count, err, n))
        return -1;
    if (pre == 1) {
        MPI_TRY(c->world_rank, MPI_Allgather(in, count, MPI_BYTE, out, count, MPI_BYTE, m->comm));
        return 0;
    }
    char *s = rt_comm_scratch(c, size * block, err, n);
    if (!s)
        return -1;
    MPI_TRY(c->world_rank, MPI_Allgather(in, count, MPI_BYTE, s, count, MPI_BYTE, m->comm));
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
    MPI_TRY(c->world_rank,
            MPI_Reduce_scatter_block(send, out, count, mpi_type(dt), MPI_SUM, m->comm));
    return 0;
}

static int m_all_to_all(RtComm *c, const void *in, void *out, size_t block_bytes, char *err,
                        size_t n)
{
    int count = 0;
    if (block_bytes == 0)
        return 0;
    if (count_of(c, "all_to_all", block_bytes, &count, err, n))
        return -1;
    MPI_TRY(c->world_rank,
            MPI_Alltoall(in, count, MPI_BYTE, out, count, MPI_BYTE, ((MComm *)c)->comm));
    return 0;
}

static int m_broadcast(RtComm *c, void *buf, size_t bytes, int root, char *err, size_t n)
{
    int count = 0;
    if (bytes == 0)
        return 0;
    if (count_of(c, "broadcast", bytes, &count, err, n))
        return -1;
    MPI_TRY(c->world_rank, MPI_Bcast(buf, count, MPI_BYTE, root, ((MComm *)c)->comm));
    return 0;
}

static int m_barrier(RtComm *c, char *err, size_t n)
{
    MPI_TRY(c->world_rank, MPI_Barrier(((MComm *)c)->comm));
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
 * The copies of sends that failed are left alone: MPI may still hold them. */
static void comm_close(MComm *m)
{
    char msg[512];
    say_failure(settle(m, 1, msg, sizeof msg) != 0, msg);
    int rc = MPI_Comm_free(&m->comm);
    if (rc != MPI_SUCCESS)
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

/* m->comm and m->base from MPI_Comm_split of the world's duplicate. */
static int split_into(MWorld *w, MComm *m, int color, int key, char *err, size_t n)
{
    int rank, size, me = w->base.rank;
    MPI_TRY(me, MPI_Comm_split(w->all.comm, color, key, &m->comm));
    MPI_TRY(me, MPI_Comm_rank(m->comm, &rank));
    MPI_TRY(me, MPI_Comm_size(m->comm, &size));
    m->base = (RtComm){&mpi_ops, rank, size, me, NULL, 0, NULL, 0, NULL};
    return 0;
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
        if (m->comm != MPI_COMM_NULL)
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

/* w's duplicate of MPI_COMM_WORLD, errors returned instead of fatal. */
static int world_open(MWorld *w, char *err, size_t n)
{
    int rank = -1, size;
    MPI_TRY(rank, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_TRY(rank, MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_TRY(rank, MPI_Comm_size(MPI_COMM_WORLD, &size));
    MPI_TRY(rank, MPI_Comm_dup(MPI_COMM_WORLD, &w->all.comm));
    w->base = (RtWorld){&mpi_ops, rank, size};
    w->all.base = (RtComm){&mpi_ops, rank, size, rank, NULL, 0, NULL, 0, NULL};
    return 0;
}

RtWorld *rt_world_mpi(char *err, size_t n)
{
    if (!rt_mpi_launched()) {
        plan_errorf(err, n,
                    "mpi: not started by mpirun or srun (none of OMPI_COMM_WORLD_SIZE, "
                    "PMIX_RANK, PMI_RANK, PMI_SIZE is set)");
        return NULL;
    }
    MWorld *w = calloc(1, sizeof *w);
    if (!w) {
        plan_errorf(err, n, "mpi: out of memory");
        return NULL;
    }
    if (mpi_start(err, n) || world_open(w, err, n)) {
        free(w);
        mpi_stop();
        return NULL;
    }
    open_worlds++;
    return &w->base;
}

static void m_world_close(RtWorld *w)
{
    MWorld *mw = (MWorld *)w;
    comm_close(&mw->all);
    free(mw);
    open_worlds--;
    mpi_stop();
}

static const RtCommOps mpi_ops = {
    .name = "mpi",
    .split = m_split,
    .comm_free = m_comm_free,
    .world_close = m_world_close,
    .all_reduce = m_all_reduce,
    .all_gather = m_all_gather,
    .reduce_scatter = m_reduce_scatter,
    .all_to_all = m_all_to_all,
    .broadcast = m_broadcast,
    .barrier = m_barrier,
    .send = m_send,
    .recv = m_recv,
};
