/* cost_stage.h: the cost model's view of one stage's program, shared by the
 * step's model (cost_model.c) and the planner's profile (cost_profile.c):
 * its pieces with their positions, and each piece's run on two streams. */
#ifndef TCC_COST_STAGE_H
#define TCC_COST_STAGE_H

#include "model/model.h"

typedef struct Run {
    double end;     /* when the piece is done: its compute and its own collectives */
    double compute; /* time the compute stream works */
    double once;    /* collectives of the shared instructions: their time */
    double backlog; /* of those, still on the communication stream at end */
    double exposed; /* compute's waits for collectives */
} Run;

typedef struct Stage {
    const Plan *p;
    const CostDevice *d;
    StagePieces sp;
    int *from, *to;     /* by piece + 1 (prologue at 0, epilogue at npieces + 1): positions */
    double *busy;       /* by tensor: when the collective using it is done (scratch) */
    Run *regular, *last; /* by piece: a microbatch's run; the last microbatch's */
    Run pro, epi;
    double p2p;         /* the largest message to a neighbouring stage */
    char *per_mb;       /* by position: work of each microbatch (not only mb >= 0) */
    char *chain;        /* by position: a receive that a microbatch's work reads (the
                           schedule's dependency between stages) */
    const char *grad;   /* by local value id: a parameter's gradient */
    const Graph *local;
} Stage;

/* Stage s of schedule sc over st->p and st->d: its pieces, which positions
 * are a microbatch's, and each piece's run (a microbatch's, the last's). */
void cost_stage_runs(Arena *a, Stage *st, const Schedule *sc, int s);
/* Tokens of one microbatch: the first data input's elements (integer ids),
 * or its rows (all but the last dimension) for real-valued inputs. */
double cost_graph_tokens(const Graph *g);

#endif
