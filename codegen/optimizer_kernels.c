/* optimizer_kernels.c: the optimizer's ops -> Kernel IR: the learning rate
 * of the step, SGD with momentum and AdamW. Reads the op and the plan
 * tensors of its operands and results; writes one kernel. Key idea: an
 * update is one pointwise kernel over a parameter's elements, its gradient
 * an operand that may be computed in it (the clipping scale applied), its
 * learning rate and step loaded once from their f32[] tensors. */
#include "kgen.h"

#include <math.h>
#include <string.h>

/* lr at step t: linear warm-up to lr, then constant, linear or cosine decay
 * from lr (first step after warm-up) to min_lr (last step). */
void cg_learning_rate(Gen *gen, const Op *op)
{
    Kernel *k = kb_new(gen, KP_POINTWISE, 1, cg_ftype(op));
    int zero = kb_iconst(k, 0);
    int t = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[0])), zero);
    double lr = ir_op_attr_float(op, "lr", 0.01), lo = ir_op_attr_float(op, "min_lr", 0);
    double warm = (double)ir_op_attr_int(op, "warmup", 0), total = (double)ir_op_attr_int(op, "total", 0);
    const Attr *s = ir_op_attr(op, "schedule");
    const char *sched = s && s->kind == ATTR_STR ? s->s : "constant";
    /* the peak rate is a hyperparameter the runtime may change (--lr); the
     * floor keeps its ratio to it */
    int base = kb_load(k, kb_arg(k, gen, gen_hyper(gen, "lr", op->res[0]->dtype, lr)), zero);
    int v = base;
    if (strcmp(sched, "constant") != 0) {
        double span = total - warm - 1;
        int p = span > 0 ? kf(k, KN_DIV, kf(k, KN_SUB, t, kb_const(k, warm + 1)), kb_const(k, span))
                         : kb_const(k, 1);
        p = kf(k, KN_MIN, kb_const(k, 1), kf(k, KN_MAX, kb_const(k, 0), p));
        int frac = !strcmp(sched, "linear")
                       ? kf(k, KN_SUB, kb_const(k, 1), p)
                       : kf(k, KN_MUL, kb_const(k, 0.5),
                            kf(k, KN_ADD, kb_const(k, 1),
                               kb_node(k, KN_COS, KT_FLOAT, kf(k, KN_MUL, kb_const(k, M_PI), p), 0, 0)));
        double floor = lr > 0 ? lo / lr : 0;
        v = kf(k, KN_MUL, base, kf(k, KN_ADD, kb_const(k, floor), kf(k, KN_MUL, frac, kb_const(k, 1 - floor))));
    }
    if (warm > 0) {
        int in_warm = kb_node(k, KN_LT, KT_INT, t, kb_const(k, warm + 0.5), 0);
        int ramp = kf(k, KN_MUL, base, kf(k, KN_DIV, t, kb_const(k, warm)));
        v = kb_node(k, KN_SELECT, KT_FLOAT, in_warm, ramp, v);
    }
    kb_store(k, kb_arg(k, gen, gen_tensor(gen, op->res[0])), zero, v);
    kb_finish(gen, k);
}

void cg_sgd(Gen *gen, const Op *op)
{
    const Value *p = op->args[0];
    Kernel *k = kb_new(gen, KP_POINTWISE, cg_numel(p), cg_ftype(op));
    int i = kb_idx(k, 0), z = kb_iconst(k, 0);
    int pv = kb_load(k, kb_arg(k, gen, gen_tensor(gen, p)), i);
    int g = cg_operand(k, gen, op->args[1], op->res[0], i); /* may be computed here: clipped */
    int mom = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[2])), i);
    int lr = kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[3])), z);
    int m = kf(k, KN_ADD, kf(k, KN_MUL, kb_const(k, ir_op_attr_float(op, "momentum", 0)), mom),
               kf(k, KN_ADD, g, kf(k, KN_MUL, kb_const(k, ir_op_attr_float(op, "weight_decay", 0)), pv)));
    kb_store(k, kb_arg(k, gen, gen_tensor(gen, op->res[1])), i, m);
    kb_store(k, kb_arg(k, gen, gen_tensor(gen, op->res[0])), i, kf(k, KN_SUB, pv, kf(k, KN_MUL, lr, m)));
    kb_finish(gen, k);
}

void cg_adamw(Gen *gen, const Op *op)
{
    const Value *p = op->args[0];
    Kernel *k = kb_new(gen, KP_POINTWISE, cg_numel(p), cg_ftype(op));
    int i = kb_idx(k, 0), z = kb_iconst(k, 0), one = kb_const(k, 1);
    double b1 = ir_op_attr_float(op, "beta1", 0.9), b2 = ir_op_attr_float(op, "beta2", 0.999);
    int ld[6];
    for (int a = 0; a < 6; a++) /* the gradient may be computed here: clipped */
        ld[a] = a == 1 ? cg_operand(k, gen, op->args[a], op->res[0], i)
                       : kb_load(k, kb_arg(k, gen, gen_tensor(gen, op->args[a])), a < 4 ? i : z);
    int g = ld[1], lr = ld[4], t = ld[5];
    int m = kf(k, KN_ADD, kf(k, KN_MUL, kb_const(k, b1), ld[2]), kf(k, KN_MUL, kb_const(k, 1 - b1), g));
    int v = kf(k, KN_ADD, kf(k, KN_MUL, kb_const(k, b2), ld[3]),
               kf(k, KN_MUL, kb_const(k, 1 - b2), kf(k, KN_MUL, g, g)));
    int mh = kf(k, KN_DIV, m, kf(k, KN_SUB, one, kf(k, KN_POW, kb_const(k, b1), t)));
    int vh = kf(k, KN_DIV, v, kf(k, KN_SUB, one, kf(k, KN_POW, kb_const(k, b2), t)));
    int den = kf(k, KN_ADD, kb_node(k, KN_SQRT, KT_FLOAT, vh, 0, 0),
                 kb_const(k, ir_op_attr_float(op, "eps", 1e-8)));
    int decay = kf(k, KN_SUB, one, kf(k, KN_MUL, lr, kb_const(k, ir_op_attr_float(op, "weight_decay", 0))));
    int np = kf(k, KN_SUB, kf(k, KN_MUL, ld[0], decay), kf(k, KN_MUL, lr, kf(k, KN_DIV, mh, den)));
    kb_store(k, kb_arg(k, gen, gen_tensor(gen, op->res[1])), i, m);
    kb_store(k, kb_arg(k, gen, gen_tensor(gen, op->res[2])), i, v);
    kb_store(k, kb_arg(k, gen, gen_tensor(gen, op->res[0])), i, np);
    kb_finish(gen, k);
}
