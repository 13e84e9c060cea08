/* loss_kernels.c: the vocabulary-parallel cross-entropy and its gradient
 * (ops cross_entropy_shard, cross_entropy_grad_shard: the logits split by
 * columns over the tensor axis, the row max and sum of exponentials already
 * all-reduced by the partition pass). Reads the op; writes its kernels.
 * Key idea: each device adds the target's logit only where it holds the
 * target's column (cg_shifted_id), so the partial losses sum to the whole. */
#include "kgen.h"

/* Vocabulary-parallel: this device holds columns [off, off + V) of the
 * logits; m and s (operands 2, 3; [rows]) are the row max and sum of
 * exp(logits - m) over the whole vocabulary. Per row (log s + m) / n minus the
 * target's logit when held here, summed over the rows, over all rows. */
static int held_target(Kernel *k, Gen *gen, const Op *op, int slot_off, int64_t V, int *keep)
{
    int t = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[1])), kb_idx(k, 0));
    return cg_shifted_id(k, gen, op->args[slot_off], t, V, keep);
}

void cg_cross_entropy_shard(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    int64_t V = x->shape[x->rank - 1], rows = cg_numel(x) / V;
    int tmp = gen_temp(gen, cg_ftype(op), 1, &rows);
    Kernel *k = kb_new(gen, KP_POINTWISE, rows, cg_ftype(op));
    int r = kb_idx(k, 0), keep;
    int m = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[2])), r);
    int s = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[3])), r);
    int lt = held_target(k, gen, op, 4, V, &keep);
    int xt = kb_load(k, kb_arg(k, gen, gen_tensor(gen, x)), ki(k, KN_ADD, ki(k, KN_MUL, r, kb_iconst(k, V)), lt));
    xt = kf(k, KN_MUL, xt, kb_node(k, KN_TOFLOAT, KT_FLOAT, keep, 0, 0));
    int lse = kf(k, KN_ADD, m, kb_node(k, KN_LOG, KT_FLOAT, s, 0, 0));
    lse = kf(k, KN_DIV, lse, kb_const(k, (double)ir_op_attr_int(op, "n", 1)));
    kb_store(k, kb_arg(k, gen, tmp), r, kf(k, KN_SUB, lse, xt));
    kb_finish(gen, k);
    Kernel *k2 = kb_new(gen, KP_ROW, 1, cg_ftype(op));
    int l = kb_loop(k2, rows);
    kb_reduce(k2, l, kb_load(k2, kb_arg(k2, gen, tmp), kb_idx(k2, 1)), KR_SUM);
    int sum = kb_end(k2, l);
    double all = (double)ir_op_attr_int(op, "rows", rows);
    kb_store(k2, kb_arg(k2, gen, gen_tensor(gen, op->res[0])), kb_iconst(k2, 0), kf(k2, KN_DIV, sum, kb_const(k2, all)));
    kb_finish(gen, k2);
}

/* Its gradient: (exp(logits - m) / s - [column is the target]) * dloss / rows. */
void cg_cross_entropy_grad_shard(Gen *gen, const Op *op)
{
    const Value *x = op->args[0];
    int64_t V = x->shape[x->rank - 1], rows = cg_numel(x) / V;
    Kernel *k = kb_new(gen, KP_ROW, rows, cg_ftype(op));
    int r = kb_idx(k, 0), keep;
    int m = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[3])), r);
    int s = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[4])), r);
    int lt = held_target(k, gen, op, 5, V, &keep);
    int dl = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[2])), kb_iconst(k, 0));
    int scale = kf(k, KN_DIV, dl, kb_const(k, (double)ir_op_attr_int(op, "rows", rows)));
    int loop = kb_loop(k, V), c = kb_idx(k, 1);
    int idx = ki(k, KN_ADD, ki(k, KN_MUL, r, kb_iconst(k, V)), c);
    int p = kf(k, KN_DIV, kb_node(k, KN_EXP, KT_FLOAT, kf(k, KN_SUB, kb_load(k, kb_arg(k, gen, gen_tensor(gen, x)), idx), m), 0, 0), s);
    int hot = ki(k, KN_MUL, kb_node(k, KN_EQ, KT_INT, c, lt, 0), keep);
    hot = kb_node(k, KN_TOFLOAT, KT_FLOAT, hot, 0, 0);
    kb_store(k, kb_arg(k, gen, gen_tensor(gen, op->res[0])), idx, kf(k, KN_MUL, kf(k, KN_SUB, p, hot), scale));
    kb_end(k, loop);
    kb_finish(gen, k);
}
