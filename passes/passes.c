/* passes.c: the table of graph passes in pipeline order. The driver runs them
 * after lowering, verifies the graph after each, and dumps it on request.
 * Later passes (autodiff, optimizer, shard, partition, ...) are added here. */
#include "passes.h"

const Pass pass_table[] = {
    {NULL, NULL, NULL},
};
