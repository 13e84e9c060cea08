/* placement.c: where the mesh's axes lie on the ranks (PlanAxis.stride).
 * Reads the plan's collectives and messages (the axes of their groups, the
 * bytes they move) and the mesh's roles, or the order of --place; writes
 * each axis's stride into the plan, which the runtime numbers ranks by
 * (plan_coords) and the cost model prices links by.
 * Key idea: launchers (mpirun, srun) number ranks server by server, so the
 * innermost axis -- stride 1 -- has its groups on the GPUs of one server
 * and the fastest links. The tensor axis goes there, since its collectives
 * are on the critical path of every layer; then a sequence (context) axis;
 * then the pipeline and data axes, the one that carries more bytes a step
 * innermost. The order in which --mesh names the axes decides only ties, as
 * before (the last axis innermost). */
#include "kgen.h"

/* 0 tensor, 1 sequence, 2 the rest. */
static int place_class(AxisRole r) { return r == ROLE_TENSOR ? 0 : r == ROLE_SEQUENCE ? 1 : 2; }

/* Bytes each axis's groups move a step: every collective's and message's
 * larger operand (a bucket's inputs together; a slice moves nothing), times
 * the microbatches that run it. */
static void axis_bytes(const Gen *gen, const Plan *p, double *bytes)
{
    for (int a = 0; a < p->naxes; a++)
        bytes[a] = 0;
    for (int i = 0; i < gen->instrs.len; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        if (in->kind != PI_COLL || in->nargs < 1 || in->coll.op == PC_SLICE) /* a slice: local */
            continue;
        double b = (double)p->tensors[in->args[0]].bytes;
        if (in->nargs == 2 && (double)p->tensors[in->args[1]].bytes > b)
            b = (double)p->tensors[in->args[1]].bytes;
        for (int a = 2; in->nargs > 2 && a < in->nargs; a += 2) /* a bucket: its in/out pairs */
            b += (double)p->tensors[in->args[a]].bytes;
        double times = gen->loop && in->mb >= 0 ? gen->k : 1;
        for (int j = 0; j < in->coll.naxes; j++)
            if (in->coll.axes[j] >= 0 && in->coll.axes[j] < p->naxes)
                bytes[in->coll.axes[j]] += b * times;
    }
}

void cg_place_axes(const Gen *gen, Plan *p)
{
    const Mesh *m = &gen->g->mesh;
    int n = p->naxes, order[IR_MAX_AXES];
    if (n < 1 || n > IR_MAX_AXES)
        return;
    if (m->nplace == n) {
        for (int k = 0; k < n; k++)
            order[k] = m->place[k];
    } else {
        double bytes[IR_MAX_AXES];
        axis_bytes(gen, p, bytes);
        for (int k = 0; k < n; k++) { /* innermost first: by class, then bytes, then last first */
            int a = n - 1 - k, j = k;
            for (; j > 0; j--) {
                int b = order[j - 1], ca = place_class(m->axes[a].role), cb = place_class(m->axes[b].role);
                if (cb < ca || (cb == ca && bytes[b] >= bytes[a]))
                    break;
                order[j] = b;
            }
            order[j] = a;
        }
    }
    int64_t stride = 1;
    for (int k = 0; k < n; k++) {
        p->axes[order[k]].stride = stride;
        stride *= p->axes[order[k]].size;
    }
}
