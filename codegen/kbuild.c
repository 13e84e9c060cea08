/* kbuild.c: the kernel builder, which kernels.c writes every kernel with.
 * Reads the plan's tensors (an argument's dtype); writes one Kernel's nodes
 * and statements, then (kb_finish) the kernel into the plan, once
 * (dedupe.c), and the instruction that launches it on its tensors.
 * Key idea: a node is appended together with the statement that evaluates
 * it, so the body lists the nodes in evaluation order; loops and reductions
 * are statements around them (kb_loop, kb_reduce, kb_end). */
#include "kgen.h"

#include <string.h>

/* ---- the kernel builder ---- */

Kernel *kb_new(Gen *gen, KPattern p, int64_t extent, DType ftype)
{
    Kernel *k = arena_alloc(gen->a, sizeof(Kernel));
    k->arena = gen->a;
    k->pattern = p;
    k->extent = extent;
    k->ftype = ftype == DT_F64 ? DT_F64 : DT_F32;
    return k;
}

int kb_arg(Kernel *k, Gen *gen, int tensor)
{
    for (int i = 0; i < k->nargs; i++)
        if (k->args[i] == tensor)
            return i;
    if (k->nargs == 64)
        BUG("kernel with more than 64 arguments");
    k->args[k->nargs] = tensor;
    k->arg_dtype[k->nargs] = (DType)gen->tensors.data[tensor].dtype;
    return k->nargs++;
}

static Arena *karena(Kernel *k) { return k->arena; }

int kb_node(Kernel *k, KNodeKind kind, KType t, int a, int b, int c)
{
    KNode n = {kind, t, a, b, c, 0, 0};
    VEC_PUSH(karena(k), k->nodes, n);
    KStmt s = {KS_NODE, k->nodes.len - 1, 0, 0, 0};
    VEC_PUSH(karena(k), k->body, s);
    return k->nodes.len - 1;
}

int kb_const(Kernel *k, double x)
{
    int n = kb_node(k, KN_CONST, KT_FLOAT, 0, 0, 0);
    k->nodes.data[n].imm = x;
    return n;
}

int kb_iconst(Kernel *k, int64_t x)
{
    int n = kb_node(k, KN_ICONST, KT_INT, 0, 0, 0);
    k->nodes.data[n].iimm = x;
    return n;
}

int kb_idx(Kernel *k, int level) { return kb_node(k, KN_IDX, KT_INT, level, 0, 0); }

int kf(Kernel *k, KNodeKind kind, int a, int b) { return kb_node(k, kind, KT_FLOAT, a, b, 0); }
int ki(Kernel *k, KNodeKind kind, int a, int b) { return kb_node(k, kind, KT_INT, a, b, 0); }

int kb_load(Kernel *k, int slot, int index)
{
    KType t = k->arg_dtype[slot] == DT_I32 ? KT_INT : KT_FLOAT;
    return kb_node(k, KN_LOAD, t, slot, index, 0);
}

static void stmt(Kernel *k, KStmtKind kind, int a, int b, int c, int64_t extent)
{
    KStmt s = {kind, a, b, c, extent};
    VEC_PUSH(karena(k), k->body, s);
}

void kb_store(Kernel *k, int slot, int index, int value) { stmt(k, KS_STORE, slot, index, value, 0); }
void kb_store_add(Kernel *k, int slot, int index, int value)
{
    stmt(k, KS_STORE_ADD, slot, index, value, 0);
}

int kb_loop(Kernel *k, int64_t extent)
{
    stmt(k, KS_LOOP, 0, 0, 0, extent);
    k->levels = k->levels > 1 ? k->levels : 1;
    return k->body.len - 1;
}

void kb_reduce(Kernel *k, int loop, int value, KReduce r) { stmt(k, KS_REDUCE, loop, value, r, 0); }

int kb_end(Kernel *k, int loop)
{
    stmt(k, KS_END, 0, 0, 0, 0);
    for (int i = loop + 1; i < k->body.len; i++)
        if (k->body.data[i].kind == KS_REDUCE && k->body.data[i].a == loop)
            return kb_node(k, KN_ACC, KT_FLOAT, loop, 0, 0);
    return -1;
}

void kb_finish(Gen *gen, Kernel *k)
{
    int index = cg_kernel_index(gen, k);
    PlanInstr in = {.kind = PI_KERNEL, .kernel = index, .nargs = k->nargs,
                    .phase = gen->op->phase, .layer = gen->op->layer};
    in.args = arena_alloc(gen->a, sizeof(int) * (size_t)(k->nargs + 1));
    memcpy(in.args, k->args, sizeof(int) * (size_t)k->nargs);
    VEC_PUSH(gen->a, gen->instrs, in);
}
