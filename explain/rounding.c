/* rounding.c: how much rounding a value of one device's step carries, for
 * the tolerances of --verify=native (tcc.c). Reads a graph after every pass
 * (the one-device plan's); writes, by value id, an estimate of the value's
 * relative error from rounding.
 * Key idea: rounding errors behave as independent random variables of mean
 * zero (Higham and Mary 2019, "A new approach to probabilistic rounding error
 * analysis"), so a chain of n operations that each round to unit u carries
 * about sqrt(n) u, not the worst case n u, and a sum of K terms accumulated
 * with unit u' adds about sqrt(K) u'. An op that rounds its result to its
 * dtype adds u of that dtype; one that sums K terms adds sqrt(K) units of
 * its accumulator (f32 for bf16 and f16 values: every kernel computes in
 * f32), but one computed inside its reader's kernel (not stored: fused) stays
 * in the accumulator's precision. A value's estimate is the root of the sum
 * of these squares along the chain of operands that carries most: the
 * largest of its operands', not their sum, which would count an ancestor
 * that operands share once per path. A mean of R rows whose errors are
 * independent and of mean zero carries 1 / sqrt(R) of a row's relative error
 * when the rows do not cancel: the cross-entropy loss, a mean of R losses
 * each >= 0, divides its logits' variance by R (a bound that stayed at a
 * row's error let a step-1 loss 11% off pass on 1x2x2). The conditioning of an op (cancellation in a difference, a norm's
 * division) is not modelled: the factor --verify puts on the estimate covers
 * it, and docs/passes.md gives what the samples measured against it. */
#include "explain/explain.h"

#include <math.h>
#include <string.h>

static double unit(DType t)
{
    switch (t) {
    case DT_BF16: return 0x1p-8;
    case DT_F16: return 0x1p-11;
    case DT_F32: return 0x1p-24;
    case DT_F64: return 0x1p-53;
    default: return 0;
    }
}

static int64_t last_dim(const Value *v) { return v->rank ? v->shape[v->rank - 1] : 1; }

/* The terms one element of op's result sums (0: none). */
static double terms(const Op *op)
{
    const Value *x = op->nargs ? op->args[0] : NULL;
    if (!x)
        return 0;
    switch (op->kind) {
    case OP_MATMUL:
        return (double)last_dim(x);
    case OP_SUM:
    case OP_MEAN: {
        int64_t d = ir_op_attr_int(op, "dim", -1);
        d = d < 0 ? d + x->rank : d;
        return d >= 0 && d < x->rank ? (double)x->shape[d] : (double)last_dim(x);
    }
    case OP_SUM_TO:
        return ir_numel(x) / fmax(1, ir_numel(op->res[0]));
    case OP_EMBED_GRAD: /* operands ids, dy: every row of dy may go to one table row */
        return op->nargs > 1 ? ir_numel(op->args[1]) / (double)last_dim(op->args[1]) : 0;
    case OP_SOFTMAX:
    case OP_SOFTMAX_GRAD:
    case OP_LAYERNORM:
    case OP_RMSNORM:
    case OP_CROSS_ENTROPY_GRAD:
        return (double)last_dim(x);
    case OP_LAYERNORM_GRAD:
    case OP_RMSNORM_GRAD: /* dx over the row; dg, db over the rows */
        return (double)last_dim(x) + ir_numel(x) / (double)last_dim(x);
    case OP_CROSS_ENTROPY:
        return ir_numel(x);
    case OP_ATTENTION:
    case OP_ATTENTION_GRAD: /* over the keys (or queries), and a head's features */
        if (x->rank < 2 || op->nargs < 2 || op->args[1]->rank < 2)
            return 0;
        return fmax((double)x->shape[x->rank - 2], (double)op->args[1]->shape[1]) + (double)last_dim(x);
    default:
        return 0;
    }
}

/* Whether op's result is its operands' bits, or exact in any dtype (a
 * comparison's 0 or 1 carries what its operands carry). */
static int exact(const Op *op)
{
    switch (op->kind) {
    case OP_RESHAPE: case OP_TRANSPOSE: case OP_SLICE: case OP_CONCAT: case OP_EXPAND:
    case OP_PAD: case OP_STOP_GRAD: case OP_EMBED: case OP_NEG: case OP_RELU:
    case OP_RELU_GRAD: case OP_MAX: case OP_MAX_GRAD: case OP_ALL_GATHER: case OP_SHARD_SLICE:
    case OP_ALL_TO_ALL: case OP_UPDATE: case OP_LT: case OP_LE: case OP_GT: case OP_GE:
    case OP_EQ: case OP_NE: case OP_WHERE: case OP_ARGMAX: case OP_GATHER: case OP_GATHER_GRAD:
    case OP_TOPK: case OP_ABS: case OP_FLOOR: case OP_ARANGE:
        return 1;
    default:
        return 0;
    }
}

double *ex_rounding_error(Arena *a, const Graph *g, const char *stored)
{
    int nv = g->values.len;
    double *e2 = arena_alloc(a, sizeof(double) * (size_t)(nv + 1));
    memset(e2, 0, sizeof(double) * (size_t)(nv + 1));
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        double in = 0;
        for (int j = 0; j < op->nargs; j++)
            in = fmax(in, e2[op->args[j]->id]);
        if ((op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_SHARD) && op->nargs)
            in /= fmax(1, ir_numel(op->args[0]) / (double)last_dim(op->args[0])); /* the rows' mean */
        for (int r = 0; r < op->nres; r++) {
            const Value *v = op->res[r];
            double u = unit(v->dtype), acc = v->dtype == DT_BF16 || v->dtype == DT_F16 ? unit(DT_F32) : u;
            double own = 0;
            double store = !stored || stored[v->id] ? u * u : acc * acc;
            if (op->kind == OP_CAST)
                own = u > unit(op->args[0]->dtype) && (!stored || stored[v->id]) ? u * u : 0;
            else if (!exact(op) && op->nargs)
                own = store + terms(op) * acc * acc;
            e2[v->id] = u > 0 ? in + own : 0;
        }
    }
    for (int v = 0; v < nv; v++)
        e2[v] = sqrt(e2[v]);
    return e2;
}
