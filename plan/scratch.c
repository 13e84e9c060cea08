/* scratch.c: the staging memory a device needs beside its slab for a plan's
 * copies and collectives (plan_instr_scratch, plan_scratch_bytes).
 * Reads: a Plan's instructions and tensors. Writes: nothing: byte counts.
 * Key idea: one function says what each device stages (the CPU a bucket's
 * inputs and an all_to_all's; the cuda device, runtime/gpu, overlapping
 * copies and gathers and scatters along an inner dimension), so what the
 * runtime allocates (runtime/mesh.c, runtime/gpu/cuda.c) and what the
 * compiler's memory and cost models count (passes/memory.c, passes/cost.c)
 * are the same bytes. Depends on plan.h only. */
#include "plan/plan.h"

/* Elements of t before dimension dim: the rows a gather along dim interleaves. */
static uint64_t outer_rows(const PlanTensor *t, int dim)
{
    uint64_t pre = 1;
    for (int d = 0; d < dim && d < t->rank; d++)
        pre *= (uint64_t)t->shape[d];
    return pre;
}

/* Whether a copy's tensors may share a byte: within the slab by their
 * offsets; a loop plan's frame tensors sit at a microbatch's base, unknown
 * here, so they may. */
static int may_overlap(const PlanTensor *a, const PlanTensor *b)
{
    if (a->frame > 0 || b->frame > 0)
        return 1;
    return a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

uint64_t plan_instr_scratch(const Plan *p, const PlanInstr *in, int cuda)
{
    if (!cuda) {
        uint64_t k = 0, sum = 0;
        if (in->kind != PI_COLL)
            return 0;
        if (in->coll.op == PC_ALL_TO_ALL)
            k = 2 * p->tensors[in->args[0]].bytes;
        for (int a = 0; in->nargs > 2 && a < in->nargs; a += 2)
            sum += p->tensors[in->args[a]].bytes;
        return sum > k ? sum : k;
    }
    if (in->nargs < 2)
        return 0;
    const PlanTensor *a = &p->tensors[in->args[0]], *b = &p->tensors[in->args[1]];
    if (in->kind == PI_COPY) {
        int same = a->offset == b->offset && a->frame == b->frame && a->frame <= 0;
        return !same && may_overlap(a, b) ? a->bytes : 0;
    }
    if (in->kind != PI_COLL)
        return 0;
    switch (in->coll.op) {
    case PC_ALL_GATHER:
        return outer_rows(a, in->coll.dim) > 1 ? b->bytes : 0;
    case PC_REDUCE_SCATTER:
        return outer_rows(b, in->coll.dim) > 1 ? a->bytes : 0;
    case PC_ALL_TO_ALL:
        return 2 * a->bytes;
    default:
        return 0;
    }
}

uint64_t plan_scratch_bytes(const Plan *p, int cuda)
{
    uint64_t need = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        uint64_t k = plan_instr_scratch(p, &p->instrs[i], cuda);
        need = k > need ? k : need;
    }
    return need;
}
