/* comm.h: collectives between the ranks of a mesh, behind one interface.
 * A World is this rank's handle on all ranks of the mesh; a Comm is one group
 * of ranks (the ranks that differ only in the coordinates of some mesh axes),
 * made by rt_comm_split like MPI_Comm_split. Backends: threads (every rank a
 * thread of one process) and mpi (one process per rank under mpirun).
 * Every call is collective over its group (each member makes the same calls in
 * the same order), blocking, and returns 0 or -1 with a one-line message.
 * Sums are deterministic: every member gets bitwise the same result, and the
 * same inputs give the same result run to run.
 * No hangs: every wait (a collective, a recv) has a watchdog. A wait longer
 * than the timeout (rt_comm_timeout) fails, naming the call, the group and the
 * members that have not come, and breaks the world (rt_world_broken): every
 * later call fails at once. */
#ifndef TCC_COMM_H
#define TCC_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"

typedef struct RtWorld RtWorld;
typedef struct RtComm RtComm;
typedef struct RtThreadsHub RtThreadsHub;

/* ---- memory accounting ----
 * The bytes a device holds outside its slab (BLAS widening copies, collective
 * staging and scratch, messages in flight): every such buffer is counted
 * through rt_account when it is allocated, grown or freed, so `peak` is the
 * exact high-water mark of their sum. Thread-safe (a threads-backend message
 * is counted against its sender and freed by its receiver). */
typedef struct RtAccount {
    uint64_t now, peak;
} RtAccount;
/* now += delta (a negative delta frees), peak = max(peak, now). a may be NULL. */
void rt_account(RtAccount *a, int64_t delta);
/* Count what comm c allocates (scratch, send copies) against a (NULL: nothing). */
void rt_comm_account(RtComm *c, RtAccount *a);

/* ---- the threads backend ----
 * The hub is made once by the process for nranks ranks; each of the nranks
 * threads then calls rt_world_threads(hub, rank) with its own rank. The hub is
 * freed after every world made from it is closed. */
RtThreadsHub *rt_threads_hub_new(int nranks);
void rt_threads_hub_free(RtThreadsHub *hub);
RtWorld *rt_world_threads(RtThreadsHub *hub, int rank);
/* No hangs: a rank whose work failed marks the hub, and every other rank's
 * wait in a collective or recv then fails within 100 ms with "stopped, rank R
 * failed". A wait longer than the hub's timeout (default 300 s) fails too,
 * naming the members it waited for, and marks the hub with its own rank. */
void rt_threads_fail(RtThreadsHub *hub, int rank);
int rt_threads_failed(RtThreadsHub *hub); /* the marked rank, or -1 */
void rt_threads_hub_timeout(RtThreadsHub *hub, double seconds);

/* ---- the mpi backend ----
 * 1 when this process was started by mpirun/srun (an MPI launcher's
 * environment variables are set), else 0. */
int rt_mpi_launched(void);
/* MPI_Init (once per process) and the world of MPI_COMM_WORLD, its watchdog
 * set to rt_comm_timeout. NULL with a message when MPI is not available or
 * fails, or the timeout is not a number. A wait of this world that lasts the
 * timeout asks the other members where they are, and fails with what they
 * said (those that do not answer are busy outside MPI, stopped or gone); any
 * failed MPI call breaks the world too. Closing a broken world ends the whole
 * job (MPI_Abort, status 1) instead of MPI_Finalize, which would wait for the
 * ranks that hang. */
RtWorld *rt_world_mpi(char *err, size_t n);

/* ---- the watchdog ----
 * The seconds a wait may last: TCC_COMM_TIMEOUT when set (a number > 0, else
 * -1 and a message), else 300. */
int rt_comm_timeout(double *seconds, char *err, size_t n);
/* The commands' --timeout S: TCC_COMM_TIMEOUT=S for this process. -1 when S is
 * not a number of seconds > 0. */
int rt_comm_set_timeout(const char *seconds);
/* 1 when w is broken (threads: a rank failed or a wait timed out; mpi: a wait
 * of this process timed out or an MPI call failed): every later call fails. */
int rt_world_broken(const RtWorld *w);

int rt_world_rank(const RtWorld *w);
int rt_world_size(const RtWorld *w);
const char *rt_world_backend(const RtWorld *w); /* "threads" or "mpi" */
/* Close the world (and MPI_Finalize for the last mpi world). w may be NULL. */
void rt_world_close(RtWorld *w);

/* Collective over the world: the ranks that pass the same color (>= 0) form one
 * group, ordered by key (ties: by world rank). */
RtComm *rt_comm_split(RtWorld *w, int color, int key, char *err, size_t n);
void rt_comm_free(RtComm *c); /* c may be NULL */
/* A name for c in messages, e.g. the mesh axes its members differ along
 * ("dp", "dp,tp"); at most 31 bytes are kept. */
void rt_comm_name(RtComm *c, const char *name);
/* "group dp (ranks 0 2)": c's name and its members' world ranks (the first 8,
 * then "..."), for messages. */
void rt_comm_describe(const RtComm *c, char *out, size_t n);
int rt_comm_rank(const RtComm *c);
int rt_comm_size(const RtComm *c);

/* Sum over the group of count elements of buf, in place. dt: PD_F32, PD_F64
 * (PD_I32 too: exact). */
int rt_comm_all_reduce(RtComm *c, void *buf, size_t count, PlanDType dt, char *err, size_t n);
/* Max instead of sum (same dtypes). */
int rt_comm_all_reduce_max(RtComm *c, void *buf, size_t count, PlanDType dt, char *err, size_t n);
/* in: a [pre][chunk][post] array of elem-byte elements; out: [pre][size*chunk][post],
 * member r's in at chunk index r. in and out do not overlap. */
int rt_comm_all_gather(RtComm *c, const void *in, void *out, size_t pre, size_t chunk, size_t post,
                       size_t elem, char *err, size_t n);
/* in: [pre][size*chunk][post]; out: [pre][chunk][post], member r gets the sum
 * over the group of block r. dt as rt_comm_all_reduce. in and out do not overlap. */
int rt_comm_reduce_scatter(RtComm *c, const void *in, void *out, size_t pre, size_t chunk,
                           size_t post, PlanDType dt, char *err, size_t n);
/* in: size blocks of block_bytes; out: size blocks; block j of out on member i
 * = block i of in on member j. in and out do not overlap. */
int rt_comm_all_to_all(RtComm *c, const void *in, void *out, size_t block_bytes, char *err,
                       size_t n);
/* bytes of buf from member root to every member. */
int rt_comm_broadcast(RtComm *c, void *buf, size_t bytes, int root, char *err, size_t n);
int rt_comm_barrier(RtComm *c, char *err, size_t n);
/* Point to point within the group (pipeline stages): blocking; a send is
 * matched by the recv of the same tag on the peer. A send is buffered: it returns
 * once buf may be reused, without waiting for the recv. peer is not the caller;
 * tag lies in [0, 32767]. */
int rt_comm_send(RtComm *c, const void *buf, size_t bytes, int peer, int tag, char *err, size_t n);
int rt_comm_recv(RtComm *c, void *buf, size_t bytes, int peer, int tag, char *err, size_t n);

#endif
