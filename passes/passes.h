/* passes.h: the passes over the graph IR and the pass table the driver walks.
 * A pass reads the Graph, changes it, and leaves it valid (the driver runs the
 * verifier after each one). It returns 0, or -1 after
 * reporting errors to the context's diagnostics. */
#ifndef TCC_PASSES_H
#define TCC_PASSES_H

#include "../ir/ir.h"

/* What the passes read besides the graph: the train block's settings, parsed
 * once (pass_settings), and the compile's own choices, which no TDL spells. */
typedef struct Settings {
    TrainConfig train;
    /* recompute = auto: the mode (RC_*) of each layer (repeat index) that the
     * planner chose to fit the device's memory, nrecompute_layers of them;
     * NULL until chosen */
    const signed char *recompute_layers;
    int nrecompute_layers;
    /* 1: the microbatch pass copies the forward once per microbatch (an
     * unrolled step, whose every value has an IR value of its own: --verify's
     * value comparison); 0, the default: the graph holds one microbatch's
     * step, which the plan's schedule table runs once per microbatch */
    int unroll;
    /* --verify: the optimizer also keeps each parameter's gradient, before
     * clipping, as the state "NAME:grad" (passes/optimizer.c) */
    int keep_grads;
    int verbose; /* -v: passes say what they did (recompute's layers) */
} Settings;
/* g's train block parsed into s->train, the choices 0; or -1 after reporting
 * what is wrong with it. The one place the passes' settings are read. */
int pass_settings(Ctx *c, const Graph *g, Settings *s);

typedef struct Pass {
    const char *name;                 /* --dump-after=NAME */
    int (*run)(Ctx *c, Graph *g, const Settings *s);
    const char *summary;              /* one line for --help */
} Pass;

/* Gradient accumulation: with microbatches = k, k copies of the forward pass
 * over row slices of the inputs, and the loss becomes their mean. */
int pass_microbatch(Ctx *c, Graph *g, const Settings *s);

/* Reverse-mode differentiation: appends the backward graph; outputs become the
 * loss followed by one gradient per parameter (PARAM.grad), in parameter order.
 * Does nothing to a graph that already has backward ops. */
int pass_autodiff(Ctx *c, Graph *g, const Settings *s);

/* Mixed precision for precision = bf16 (after autodiff): bf16 activations and
 * bf16 casts of the f32 parameters (once per step) for the forward and backward;
 * the loss and every gradient into the optimizer stay f32, and so do the adds
 * that accumulate a gradient. Does nothing for other precisions. */
int pass_precision(Ctx *c, Graph *g, const Settings *s);

/* The parameter update: learning rate at the step, global gradient norm and
 * clipping, SGD (momentum) or AdamW per parameter, written back with 'update'.
 * Outputs become loss, learning rate, gradient norm. Needs autodiff's outputs. */
int pass_optimizer(Ctx *c, Graph *g, const Settings *s);

/* Activation recomputation (train setting recompute). A layer is one
 * iteration of a repeat; its mode says which of its forward values the
 * backward reads as kept and which it recomputes (ops of phase recompute).
 * recompute = auto takes each layer's mode from s->recompute_layers. */
typedef enum { RC_NONE, RC_SELECTIVE, RC_FULL } RecomputeMode;
int pass_recompute(Ctx *c, Graph *g, const Settings *s);
/* The same with layer l's mode mode_by_layer[l] (RC_*; none for l >= nlayers
 * or a NULL array), whatever the train block says: for a driver that chose
 * the modes itself. Does nothing to a graph that has recompute ops. */
int pass_recompute_with(Ctx *c, Graph *g, const signed char *mode_by_layer, int nlayers);

/* Stage partitioning over the pipeline axis: contiguous layers (the embedding
 * and the loss count as one more each) to stages, balanced by forward FLOPs
 * or pinned by the train setting stage_starts; every op gets its stage. */
int pass_pipeline(Ctx *c, Graph *g, const Settings *s);

/* Sharding propagation: every value gets a sharding and its reason, from the
 * annotations, the mesh-axis roles (data, fsdp), the train block's zero level
 * and sequence_parallel, and one rule per op kind (passes/shard_rules.c). */
int pass_shard(Ctx *c, Graph *g, const Settings *s);

/* SPMD partitioning: the collectives (all_reduce, all_gather, reduce_scatter,
 * all_to_all) and local slices each sharding mismatch needs, with the bytes
 * each device sends; outputs end replicated. Nothing to do on one device. */
int pass_partition(Ctx *c, Graph *g, const Settings *s);

/* The graph passes in pipeline order, terminated by a {NULL} entry. */
extern const Pass pass_table[];

/* ---- static pipeline schedules (passes/schedule.c) ---- */
typedef enum { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZB_H1 } SchedKind;
typedef enum { PIECE_F, PIECE_B, PIECE_W } PieceKind;

/* One unit of work on a rank: the forward, backward (input gradient; the whole
 * backward outside ZB-H1) or weight gradient of microbatch mb on model chunk
 * chunk, which is global stage chunk * p + rank. */
typedef struct Piece {
    PieceKind kind;
    int mb, chunk;
} Piece;

typedef struct SchedRank {
    Piece *pieces; /* in execution order */
    int n;
} SchedRank;

typedef struct Schedule {
    SchedKind kind;
    int p, m, v;      /* ranks, microbatches, chunks per rank */
    SchedRank *ranks; /* p of them */
} Schedule;

/* Cost of one piece on a rank, in any unit (the trace writer scales it). */
typedef double (*SchedCostFn)(const Piece *pc, int rank, void *user);

typedef struct SchedTimes {
    double **start, **end; /* [rank][i]: piece i of that rank's list */
    double makespan;
    double bubble; /* sum over ranks of (makespan - busy) / (p * makespan) */
    int *peak;     /* [rank]: most (microbatch, chunk) pairs with F done and B not */
} SchedTimes;

/* "gpipe", "1f1b", "interleaved" or "zb-h1". */
const char *sched_kind_name(SchedKind k);
/* The train block's schedule (setting `schedule`: gpipe, 1f1b, interleaved, zb). */
SchedKind sched_kind_of(const TrainConfig *tc);

/* The per-rank piece lists of a schedule, allocated in a. Returns 0, or -1 with
 * the reason in err (invalid p, m, v or combination). */
int sched_build(Arena *a, SchedKind kind, int p, int m, int v, Schedule *out, char *err,
                size_t errn);

/* The unit-cost convention: F = 1, B = 2 (B = 1 and W = 1 under ZB-H1), so a
 * microbatch's backward costs 2 in every schedule. user is the Schedule. */
double sched_unit_cost(const Piece *pc, int rank, void *user);

/* Run every rank's list in order, one piece at a time, each piece starting when
 * its rank is free and its inputs are done (+ xfer between ranks). cost NULL means
 * sched_unit_cost. Returns 0, or -1 with err on a deadlock, a repeated or missing
 * piece, or a piece out of range. */
int sched_simulate(Arena *a, const Schedule *s, SchedCostFn cost, void *user, double xfer,
                   SchedTimes *out, char *err, size_t errn);

/* Chrome trace-event JSON, one track ("stage N") per rank, one X event per
 * piece; times are multiplied by us_per_unit. Returns 0, or -1 on a write error. */
int sched_write_trace(const Schedule *s, const SchedTimes *t, double us_per_unit, FILE *f);

/* One line per rank: "rank 0: F0 F1 B0 ...", with ".chunk" when v > 1. */
void sched_print(const Schedule *s, FILE *f);

/* The schedule of g's train block on its pipeline axis (one rank, 1F1B,
 * without one): 0, or -1 after reporting "WHO: the ... schedule: why". */
int sched_of_train(Ctx *c, const Graph *g, const TrainConfig *tc, Schedule *sc, const char *who);


#endif
