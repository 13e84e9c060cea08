/* passes.c: the table of graph passes in pipeline order. The driver runs them
 * after lowering, verifies the graph after each, and dumps it on request.
 * Later passes (autodiff, optimizer, shard, partition, ...) are added here. */
#include "passes.h"

#include <string.h>

const Pass pass_table[] = {
    {"microbatch", pass_microbatch, "gradient accumulation: one forward copy per microbatch"},
    {"autodiff", pass_autodiff, "reverse-mode gradients of the loss for every parameter"},
    {"precision", pass_precision, "precision = bf16: bf16 activations and weight casts, f32 masters"},
    {"recompute", pass_recompute, "recomputation: forward ops copied into the backward, by layer"},
    {"optimizer", pass_optimizer, "learning rate, gradient clipping, SGD or AdamW updates"},
    {"pipeline", pass_pipeline, "stage partitioning: layers to pipeline stages, by FLOPs"},
    {"shard", pass_shard, "sharding propagation: a sharding and its reason for every value"},
    {"partition", pass_partition, "SPMD partitioning: collectives where shardings differ"},
    {NULL, NULL, NULL},
};

int pass_settings(Ctx *c, const Graph *g, Settings *s)
{
    char err[256];
    memset(s, 0, sizeof *s);
    if (ir_train_config(g, &s->train, err, sizeof err) == 0)
        return 0;
    diag_error(&c->diag, LOC_NONE, "train: %s", err);
    return -1;
}
