/* instrs.c: the instructions of one op. Reads an op of the graph and the
 * tensors of its values; appends to gen->instrs a GEMM for a matmul (with
 * its bias epilogue, or writing its transpose, as fusion.c decided; a sum of
 * weight gradients as its matmul's GEMM adding into it), a copy
 * for an update (none when written in place), a collective for each
 * collective op and shard_slice, and one or more kernels for the rest
 * (kernels.c); nothing for ops that are fused, dead or without work.
 * Key idea: a GEMM reads its operands through the transposes of their last
 * two dims with its transpose flags, so those transposes move no memory. */
#include "kgen.h"

#include <string.h>

/* The GEMM of matmul op into the tensor of c, plus bias (a vector) when not
 * NULL; with swap, the transpose of the product, B^T A^T, into c. */
static void gemm_into(Gen *gen, const Op *op, const Value *c, const Value *bias, int swap)
{
    const Value *a = op->args[0], *b = op->args[1];
    int folds = cg_gemm_folds(op), fa = 0, fb = 0;
    const Value *ta = folds & 1 ? cg_gemm_source(a, &fa) : a, *tb = folds & 2 ? cg_gemm_source(b, &fb) : b;
    PlanGemm g = {.a = gen_tensor(gen, ta), .b = gen_tensor(gen, tb), .c = gen_tensor(gen, c),
                  .alpha = 1, .beta = 0, .batch = 1, .trans_a = fa & 1, .trans_b = fb & 1,
                  .epilogue = bias ? PE_BIAS : PE_NONE, .bias = bias ? gen_tensor(gen, bias) : 0};
    int64_t K = a->shape[a->rank - 1], N = b->shape[b->rank - 1];
    g.k = K;
    g.n = N;
    g.ldb = g.trans_b ? K : N; /* the row length of what is stored */
    g.ldc = N;
    if (b->rank == 2) {
        g.m = 1;
        for (int i = 0; i < a->rank - 1; i++)
            g.m *= a->shape[i];
    } else {
        g.m = a->shape[a->rank - 2];
        for (int i = 0; i < a->rank - 2; i++)
            g.batch *= a->shape[i];
        g.stride_a = g.m * K;
        g.stride_b = K * N;
        g.stride_c = g.m * N;
    }
    g.lda = g.trans_a ? g.m : K;
    if (swap) { /* plain matrices (transposed_gemm): C^T [N,M] = B^T [N,K] A^T [K,M] */
        g = (PlanGemm){.a = g.b, .b = g.a, .c = g.c, .alpha = 1, .beta = 0, .batch = 1,
                       .trans_a = (fb + 1) & 1, .trans_b = (fa + 1) & 1, .m = N, .n = g.m, .k = K};
        g.lda = g.trans_a ? g.m : K; /* the row length of what is stored */
        g.ldb = g.trans_b ? K : g.n;
        g.ldc = g.n;
    }
    PlanInstr in = {.kind = PI_GEMM, .gemm = g, .phase = op->phase, .layer = op->layer};
    VEC_PUSH(gen->a, gen->instrs, in);
    gen->flops += 2.0 * (double)g.m * (double)g.n * (double)g.k * (double)g.batch;
}

static void gemm(Gen *gen, const Op *op) { gemm_into(gen, op, op->res[0], NULL, 0); }

static void copy(Gen *gen, const Op *op)
{
    PlanInstr in = {.kind = PI_COPY, .nargs = 2, .phase = op->phase, .layer = op->layer};
    in.args = arena_alloc(gen->a, sizeof(int) * 2);
    in.args[0] = gen_tensor(gen, op->args[0]);
    in.args[1] = gen_tensor(gen, op->args[1]);
    if (op->kind == OP_UPDATE && in.args[0] == in.args[1])
        return; /* written in place (in_place_updates) */
    VEC_PUSH(gen->a, gen->instrs, in);
}

static void collective(Gen *gen, const Op *op)
{
    static const PlanCollKind kinds[] = {PC_ALL_REDUCE, PC_ALL_GATHER, PC_REDUCE_SCATTER,
                                         PC_ALL_TO_ALL, PC_SLICE};
    PlanInstr in = {.kind = PI_COLL, .nargs = 2, .phase = op->phase, .layer = op->layer};
    in.coll.op = kinds[op->kind - OP_ALL_REDUCE];
    const Attr *how = ir_op_attr(op, "op");
    if (op->kind == OP_ALL_REDUCE && how && how->s && !strcmp(how->s, "max"))
        in.coll.op = PC_ALL_REDUCE_MAX;
    in.coll.naxes = cg_attr_axes(gen, op, in.coll.axes);
    in.coll.dim = (int)ir_op_attr_int(op, "dim", -1);
    in.coll.dim2 = (int)ir_op_attr_int(op, "split", -1);
    in.coll.bytes = ir_op_attr_int(op, "bytes", 0);
    in.args = arena_alloc(gen->a, sizeof(int) * 2);
    in.args[0] = gen_tensor(gen, op->args[0]);
    in.args[1] = gen_tensor(gen, op->res[0]);
    const Value *x = op->args[0];
    const PlanTensor *t = &gen->tensors.data[in.args[0]];
    if (t->rank != x->rank || memcmp(t->shape, x->shape, sizeof(int64_t) * (size_t)x->rank)) {
        /* a reshape's memory under another shape: collectives need the shape */
        PlanInstr cp = {.kind = PI_COPY, .nargs = 2, .phase = op->phase, .layer = op->layer};
        cp.args = arena_alloc(gen->a, sizeof(int) * 2);
        cp.args[0] = gen_temp(gen, x->dtype, x->rank, x->shape);
        cp.args[1] = in.args[0];
        in.args[0] = cp.args[0];
        VEC_PUSH(gen->a, gen->instrs, cp);
    }
    VEC_PUSH(gen->a, gen->instrs, in);
}

int cg_lower_op(Gen *gen, const Op *op)
{
    gen->op = op;
    if (op->nres == 1 && (gen->fused[op->res[0]->id] || gen->kept[op->res[0]->id] ||
                          (gen->view && gen->view[op->res[0]->id])))
        return 0; /* computed inside its user's kernel, or read in place (a view) */
    if (gen->dead && gen->dead[op->id])
        return 0; /* nothing reads it */
    if (gen->ce_pair && gen->ce_pair[op->id] < 0)
        return 0; /* written by its cross_entropy's kernel */
    for (int i = 0; i < op->nres; i++)
        if (op->res[i]->dtype == DT_F16) {
            diag_error(&gen->c->diag, op->loc, "no CPU kernels for f16 (use f32, bf16 or f64)");
            return -1;
        }
    switch (op->kind) {
    case OP_INPUT: case OP_PARAM: case OP_STATE: case OP_STEP: case OP_RESHAPE:
    case OP_AXIS_OFFSET:
        return 0;
    case OP_ALL_REDUCE: case OP_ALL_GATHER: case OP_REDUCE_SCATTER: case OP_ALL_TO_ALL:
    case OP_SHARD_SLICE:
        collective(gen, op);
        return 0;
    case OP_MATMUL: gemm(gen, op); return 0;
    case OP_TRANSPOSE:
        if (gen->tgemm && gen->tgemm[op->id]) { /* its matmul's GEMM, operands swapped */
            gemm_into(gen, op->args[0]->def, op->res[0], NULL, 1);
            return 0;
        }
        return cg_op_kernels(gen, op);
    case OP_UPDATE: copy(gen, op); return 0;
    case OP_MB_SUM:
        if (gen->acc_gemm && gen->acc_gemm[op->id]) { /* the product added into the sum */
            gemm_into(gen, gen->g->ops.data[gen->acc_gemm[op->id] - 1], op->res[0], NULL, 0);
            gen->instrs.data[gen->instrs.len - 1].gemm.beta = 1;
            gen->instrs.data[gen->instrs.len - 1].acc = 1; /* beta 0 for the first microbatch */
            return 0;
        }
        return cg_op_kernels(gen, op);
    case OP_LR: cg_learning_rate(gen, op); return 0;
    case OP_SGD: cg_sgd(gen, op); return 0;
    case OP_ADAMW: cg_adamw(gen, op); return 0;
    case OP_CROSS_ENTROPY_SHARD: cg_cross_entropy_shard(gen, op); return 0;
    case OP_CROSS_ENTROPY_GRAD_SHARD: cg_cross_entropy_grad_shard(gen, op); return 0;
    case OP_ADD:
        if (gen->bias_add && gen->bias_add[op->id]) {
            const Value *bias, *m = cg_bias_matmul(op, NULL, &bias);
            gemm_into(gen, m->def, op->res[0], bias, 0);
            return 0;
        }
        if (gen->acc_gemm && gen->acc_gemm[op->id]) { /* into the running sum's tensor */
            gemm_into(gen, gen->g->ops.data[gen->acc_gemm[op->id] - 1], op->res[0], NULL, 0);
            gen->instrs.data[gen->instrs.len - 1].gemm.beta = 1;
            return 0;
        }
        /* fall through */
    default:
        if (cg_op_kernels(gen, op) == 0)
            return 0;
        diag_error(&gen->c->diag, op->loc, "no CPU kernel for '%s' yet", ir_ops[op->kind].name);
        return -1;
    }
}
