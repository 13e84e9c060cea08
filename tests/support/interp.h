/* interp.h: a float64 reference interpreter of the graph IR, for tests only.
 * It defines what each op computes in the plainest loops, so that generated
 * kernels and gradients can be checked against it. */
#ifndef TCC_INTERP_H
#define TCC_INTERP_H

#include "ir/ir.h"

/* One buffer per value, indexed by Value.id; ids (i32) are stored as doubles. */
typedef struct Interp {
    const Graph *g;
    double **buf;   /* buf[v->id]: row-major, ir_numel(v) elements */
    double step;    /* the value of the 'step' op: 1 for the first step */
    char err[256];  /* why interp_run failed */
} Interp;

int64_t interp_numel(const Value *v);
/* Allocate buffers for every value (zeroed). */
Interp *interp_new(const Graph *g);
void interp_free(Interp *in);
/* Evaluate every op in order, then apply the 'update's (params and state take
 * their new values) and advance step. INPUT and PARAM buffers must be filled
 * first. Returns 0, or -1 with in->err set (e.g. an id out of range). */
int interp_run(Interp *in);
/* Fill every PARAM from its init attr and every INPUT with random data from
 * seed (ids uniform in range `vocab`, floats normal). */
void interp_init(Interp *in, uint64_t seed, int64_t vocab);
double interp_uniform(uint64_t *state); /* in [0, 1) */

#endif
