/* comm_impl.h: what the backends of comm.h share; not for users of comm.h.
 * A World and a Comm start with the same public part (rank, size, the table of
 * the backend's operations); a backend puts its own fields after it (its
 * struct's first member is the RtWorld or RtComm), and comm.c checks the
 * arguments once for every backend, then calls through the table. */
#ifndef TCC_COMM_IMPL_H
#define TCC_COMM_IMPL_H

#include "runtime/comm/comm.h"

typedef struct RtCommOps {
    const char *name; /* "threads", "mpi" */
    RtComm *(*split)(RtWorld *w, int color, int key, char *err, size_t n);
    void (*comm_free)(RtComm *c);
    void (*world_close)(RtWorld *w);
    int (*world_broken)(const RtWorld *w);
    /* max: 0 sums, 1 takes the maximum */
    int (*all_reduce)(RtComm *c, void *buf, size_t count, PlanDType dt, int max, char *err,
                      size_t n);
    int (*all_gather)(RtComm *c, const void *in, void *out, size_t pre, size_t chunk, size_t post,
                      size_t elem, char *err, size_t n);
    int (*reduce_scatter)(RtComm *c, const void *in, void *out, size_t pre, size_t chunk,
                          size_t post, PlanDType dt, char *err, size_t n);
    int (*all_to_all)(RtComm *c, const void *in, void *out, size_t block_bytes, char *err,
                      size_t n);
    int (*broadcast)(RtComm *c, void *buf, size_t bytes, int root, char *err, size_t n);
    int (*barrier)(RtComm *c, char *err, size_t n);
    int (*send)(RtComm *c, const void *buf, size_t bytes, int peer, int tag, char *err, size_t n);
    int (*recv)(RtComm *c, void *buf, size_t bytes, int peer, int tag, char *err, size_t n);
} RtCommOps;

struct RtWorld {
    const RtCommOps *ops;
    int rank, size;
};

struct RtComm {
    const RtCommOps *ops;
    int rank, size;
    int world_rank; /* for messages */
    void *scratch;  /* rt_comm_scratch's buffer: grows, freed with the comm */
    size_t scratch_bytes;
    float *wide;    /* bf16 reductions: their f32 copies (comm.c), freed with scratch */
    size_t wide_len;
    RtAccount *account; /* where its buffers are counted, or NULL */
    int *members;       /* the world rank of each member (the backend's, freed with the
                           scratch); NULL: member r is world rank r */
    char name[32];      /* rt_comm_name's, for messages; "" when none was given */
};

/* The comm's scratch buffer with room for at least bytes (at least 1), kept
 * until the next call or rt_comm_free. NULL and a message when out of memory. */
void *rt_comm_scratch(RtComm *c, size_t bytes, char *err, size_t n);
/* Frees the scratch buffer and the members (the backends' comm_free call it). */
void rt_comm_release(RtComm *c);
/* The world rank of member r of c. */
int rt_comm_member(const RtComm *c, int r);

#endif
