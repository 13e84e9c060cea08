/* shard.h: the sharding rules shared by the shard and partition passes and
 * the why-chains (internal to passes/). Each op kind is described by its loop factors: every
 * dimension of an operand or result belongs to one factor (or none, when it is
 * broadcast or must stay whole). A strategy gives each factor an ordered list
 * of mesh axes; an operand or result dimension is split over the axes of its
 * factor; a result is a partial sum over the axes of the factors it lacks (a
 * matmul's contracted dimension, a reduced one). The rule for an op is the
 * cheapest strategy given its operands' current shardings, counting the bytes
 * each operand's resharding moves (shard_reshard_plan). */
#ifndef TCC_SHARD_H
#define TCC_SHARD_H

#include "passes.h"

#define SH_MAXARGS 16
#define SH_MAXRES 4
#define SH_MAXF 16
#define SH_MAXSTEPS 16

typedef struct ShardOpts {
    int seq_axis;    /* sequence parallelism: the tensor axis split over the sequence; -1 off */
    const int *uses; /* by Value.id: how many operands read it (NULL: unknown) */
    int nuses;
    /* by Value.id (NULL: none): the pinned gradient this value is a summand of
     * (the sum over microbatches, through widening casts), read by that sum
     * alone; the value is wished in that gradient's layout */
    const Value **wish;
} ShardOpts;

typedef struct Strategy {
    Sharding req[SH_MAXARGS]; /* what each operand must be before the op */
    Sharding out[SH_MAXRES];  /* what each result comes out as */
    double cost;              /* comm plus a small charge for the local result's size */
    double comm;              /* bytes moved per device to reshard the operands */
    int choice;               /* 1 when operands had to move and another way existed */
    double alt_comm;          /* what the next best strategy would move */
    uint32_t own;             /* results split as only they proposed (their readers' wish) */
} Strategy;

/* The strategy for op from its operands' current shardings (g's mesh). Sources
 * and update are not handled here (shard_strategy BUGs on them). */
void shard_strategy(const Graph *g, const Op *op, const ShardOpts *o, Strategy *st);

/* Every way the rule weighed for op: the cheapest strategy for each distinct
 * set of result shardings, cheapest first (ties as the search found them), so
 * ways[0] is what shard_strategy picks. At most max; returns how many. */
int shard_weigh(const Graph *g, const Op *op, const ShardOpts *o, Strategy *ways, int max);

/* Where mesh axis ax of result r of op under st (a split or a partial sum)
 * comes from: the operand that carries it on the same factor (as it is, or
 * moved: resharded into it for the op), or a partial sum it hands on; NONE
 * when no operand carries it: the op made it (a hint, a pin, a slice). */
typedef enum { FROM_NONE, FROM_SPLIT, FROM_SUMMED, FROM_PARTIAL } FromKind;
typedef struct AxisFrom {
    FromKind how; /* SPLIT: a split dim; SUMMED: a dim the op sums over; PARTIAL: handed on */
    int arg, dim; /* the operand and its dimension (-1 for PARTIAL) */
    int moved;    /* 1: the operand did not carry it; the op resharded it to */
} AxisFrom;
void shard_axis_from(const Op *op, const Strategy *st, int r, int ax, AxisFrom *from);

/* An annotated parameter (or a transpose or reshape of one): moving it
 * costs 8 times its bytes in a strategy's price. */
int shard_anchored(const Value *v);

/* One step of a resharding: a collective (all_reduce, all_gather,
 * reduce_scatter, all_to_all) or a local shard_slice, over axes. */
typedef struct ReStep {
    OpKind kind;
    int dim, dim2;    /* the dimension gathered / scattered / sliced; all_to_all: dim2 split */
    int naxes;
    int8_t axes[IR_MAX_AXES];
    Sharding after;   /* the sharding once the step is done */
    double bytes;     /* sent per device (ring algorithms) */
} ReStep;

/* The steps that turn v (of global shape v->shape) from sharding `from` into
 * `to`. Returns their count. */
int shard_reshard_plan(const Mesh *m, const Value *v, const Sharding *from, const Sharding *to,
                       ReStep *steps);
double shard_reshard_cost(const Mesh *m, const Value *v, const Sharding *from,
                          const Sharding *to);

/* A sharding fixed before propagation (an annotation, a role default, a hand
 * edit): the sweep keeps it and the partition pass reshards into it. */
int shard_pinned(const Sharding *s);
/* Equal splits and partial axes (the reason is not compared). */
int shard_same(const Sharding *a, const Sharding *b, int rank);
/* Bytes of v's local piece under s. */
double shard_local_bytes(const Mesh *m, const Value *v, const Sharding *s);
/* The sharding options of g: the train block's sequence_parallel, the use
 * counts of g's values as they are now and the wishes of the summands of
 * pinned gradients (in g's arena). */
void shard_opts(const Graph *g, int sequence_parallel, ShardOpts *o);

#endif
