/* passes.h: the passes over the graph IR and the pass table the driver walks.
 * A pass reads the Graph, changes it, and leaves it valid (the driver runs the
 * verifier after each one). It returns 0, or -1 after
 * reporting errors to the context's diagnostics. */
#ifndef TCC_PASSES_H
#define TCC_PASSES_H

#include "../ir/ir.h"

typedef struct Pass {
    const char *name;                 /* --dump-after=NAME */
    int (*run)(Ctx *c, Graph *g);
    const char *summary;              /* one line for --help */
} Pass;

/* Gradient accumulation: with microbatches = k, k copies of the forward pass
 * over row slices of the inputs, and the loss becomes their mean. */
int pass_microbatch(Ctx *c, Graph *g);

/* Reverse-mode differentiation: appends the backward graph; outputs become the
 * loss followed by one gradient per parameter (PARAM.grad), in parameter order.
 * Does nothing to a graph that already has backward ops. */
int pass_autodiff(Ctx *c, Graph *g);

/* The parameter update: learning rate at the step, global gradient norm and
 * clipping, SGD (momentum) or AdamW per parameter, written back with 'update'.
 * Outputs become loss, learning rate, gradient norm. Needs autodiff's outputs. */
int pass_optimizer(Ctx *c, Graph *g);

/* Sharding propagation: every value gets a sharding and its reason, from the
 * annotations, the mesh-axis roles (data, fsdp), the train block's zero level
 * and sequence_parallel, and one rule per op kind (passes/shard_rules.c). */
int pass_shard(Ctx *c, Graph *g);

/* SPMD partitioning: the collectives (all_reduce, all_gather, reduce_scatter,
 * all_to_all) and local slices each sharding mismatch needs, with the bytes
 * each device sends; outputs end replicated. Nothing to do on one device. */
int pass_partition(Ctx *c, Graph *g);

/* The graph passes in pipeline order, terminated by a {NULL} entry. */
extern const Pass pass_table[];

#endif
