/* build_plan.c: a verified graph -> the Plan of one step (cg_build_plan).
 * Reads the Graph; runs the builder's steps in order: the per-device graph
 * (localize.c), the microbatch loop (microbatch_loop.c), fusion (fusion.c), the
 * tensors (tensors.c), each op's instructions (instrs.c), the stages'
 * programs (stages.c), the memory plan (layout.c, or microbatch_loop.c's), the kernel
 * groups and sources (groups.c); writes the Plan's fields and its train hash
 * (train_hash.c).
 * Key idea: every plan built here is proved to communicate as one before it
 * is handed out (cg_check_comm: plan/comm_match.c), an error at the op's TDL
 * line if not. */
#include "kgen.h"

#include <stdlib.h>
#include <string.h>

/* ---- the plan's fields ---- */

static int output_tensor(Gen *gen, const char *name, int index)
{
    const Graph *g = gen->g;
    for (int i = 0; i < g->outputs.len; i++) {
        const Value *v = g->outputs.data[i];
        if ((name && v->name && !strcmp(v->name, name)) || (!name && i == index))
            return gen->tensor_of[v->id];
    }
    return -1;
}

/* The model FLOPs one device does in a whole step, the average over the
 * mesh: an instruction of a microbatch loop runs once per microbatch (the
 * graph holds one), and the devices of a pipeline stage run its share only,
 * so the stages' sum is spread over the stages. GFLOP/s = flops x devices /
 * step time, whatever the microbatches and stages (issue 32). */
static double step_flops(const Gen *gen)
{
    double f = 0;
    for (int i = 0; i < gen->instrs.len; i++) {
        const PlanInstr *in = &gen->instrs.data[i];
        f += in->flops * (gen->loop && in->when == PW_EVERY ? gen->k : 1);
    }
    return f / ir_pipeline_stages(&gen->g->mesh);
}

static void fill_plan(Gen *gen, Plan *p)
{
    const Graph *g = gen->g;
    memset(p, 0, sizeof *p);
    p->version = PLAN_VERSION;
    p->model = arena_strdup(gen->a, g->name ? g->name : "model");
    p->config = arena_alloc(gen->a, sizeof(PlanParam) * (size_t)(g->config.len + 1));
    p->nconfig = 0;
    for (int i = 0; i < g->config.len; i++)
        if (g->config.data[i]->kind == ATTR_INT && g->config.data[i]->key)
            p->config[p->nconfig++] =
                (PlanParam){arena_strdup(gen->a, g->config.data[i]->key), g->config.data[i]->i};
    p->naxes = g->mesh.naxes;
    p->axes = arena_alloc(gen->a, sizeof(PlanAxis) * (size_t)(g->mesh.naxes + 1));
    for (int i = 0; i < g->mesh.naxes; i++)
        p->axes[i] = (PlanAxis){arena_strdup(gen->a, g->mesh.axes[i].name),
                                arena_strdup(gen->a, ir_role_name(g->mesh.axes[i].role)),
                                g->mesh.axes[i].size, 0};
    p->ntensors = gen->tensors.len;
    p->tensors = gen->tensors.data;
    cg_place_axes(gen, p);
    p->slab_bytes = gen->slab ? gen->slab : PLAN_ALIGN;
    /* without a memory plan NULL: every stage's slab is slab_bytes */
    p->stage_slab_bytes = gen->stage_slab;
    p->ntensors = gen->tensors.len;
    p->tensors = gen->tensors.data;
    p->ninstrs = gen->instrs.len;
    p->instrs = gen->instrs.data;
    p->nkernels = gen->kernels.len;
    p->kernels = arena_alloc(gen->a, sizeof(PlanKernel) * (size_t)(gen->kernels.len + 1));
    for (int i = 0; i < gen->kernels.len; i++) {
        const Kernel *k = gen->kernels.data[i];
        CgLaunch l = cg_gpu_launch(k);
        p->kernels[i] = (PlanKernel){(char *)k->name, k->nargs, (int)k->pattern, l.grid, l.block};
    }
    for (int i = 0; i < gen->instrs.len; i++)
        if (gen->instrs.data[i].kind == PI_KERNEL)
            gen->instrs.data[i].work = cg_c_work(gen->kernels.data[gen->instrs.data[i].kernel]);
    cg_kernel_sources(gen, p);
    p->loss = output_tensor(gen, NULL, 0);
    p->lr = output_tensor(gen, "lr", -1);
    p->grad_norm = output_tensor(gen, "grad_norm", -1);
    p->flops = step_flops(gen);
    p->steps = gen->tc.steps, p->seed = gen->tc.seed; /* the program's defaults */
    p->microbatches = 1;
    if (gen->loop) {
        p->microbatches = gen->k, p->ntags = gen->ntags;
        p->sched = gen->sched.data, p->nsched = gen->sched.len;
        p->frames = gen->frames.data, p->nframes = gen->frames.len;
    }
    for (int i = 0; !gen->loop && i < gen->instrs.len; i++) /* only a loop has pieces */
        gen->instrs.data[i].piece = 0, gen->instrs.data[i].when = PW_EVERY, gen->instrs.data[i].acc = 0;
}

/* ---- the stages' programs, proved to match ---- */

/* A mismatch plan_check_comm found at instruction at of p, named by its op. */
static int comm_error(Ctx *c, const Graph *local, const Plan *p, int at, const char *err)
{
    static const char *const phases[] = {"fwd", "bwd", "recompute", "opt"};
    int k = at >= 0 ? p->instrs[at].op - 1 : -1;
    const Op *op = k >= 0 && k < local->ops.len ? local->ops.data[k] : NULL;
    diag_error(&c->diag, op ? op->loc : LOC_NONE, "the stages' programs do not match: %s", err);
    if (!op || op->nres < 1)
        return -1;
    const Value *v = op->res[0];
    const char *what = v->name ? arena_printf(c->arena, "'%s'", v->name)
                               : arena_printf(c->arena, "value %%%d", v->id);
    diag_note(&c->diag, op->loc, "instrs[%d] comes from the op '%s' of %s (layer %d, %s)", at,
              ir_ops[op->kind].name, what, op->layer, phases[op->phase]);
    return -1;
}

int cg_check_launches(Ctx *c, const Graph *local, const Plan *p)
{
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        const PlanKernel *k = in->kind == PI_KERNEL ? &p->kernels[in->kernel] : NULL;
        if (!k || k->grid < INT64_C(1) << 31)
            continue;
        const Op *op = in->op > 0 && in->op <= local->ops.len ? local->ops.data[in->op - 1] : NULL;
        diag_error(&c->diag, op ? op->loc : LOC_NONE,
                   "kernel %s needs %lld blocks of %d threads on a GPU, over CUDA's 2^31 - 1: "
                   "the step is too large for one device (split it over a mesh)",
                   k->name, (long long)k->grid, k->block);
        return -1;
    }
    return 0;
}

int cg_check_comm(Ctx *c, const Graph *local, const Plan *p)
{
    char err[1024];
    int at = -1;
    if (p->nsched <= 0)
        return plan_check_comm(p, &at, err, sizeof err) ? comm_error(c, local, p, at, err) : 0;
    /* a loop: the collectives of the program it makes (what meets another stage is
     * among them; the rest neither waits nor is waited for), each keeping its op */
    PlanItem *items;
    int nitems, m = 0;
    if (plan_expand_order(p, &items, &nitems, err, sizeof err))
        return diag_error(&c->diag, LOC_NONE, "the microbatch loop: %s", err), -1;
    Plan x = *p;
    x.nsched = 0, x.sched = NULL, x.nframes = 0, x.frames = NULL;
    x.instrs = malloc(sizeof(PlanInstr) * (size_t)(nitems + 1));
    if (!x.instrs) {
        free(items);
        return diag_error(&c->diag, LOC_NONE, "out of memory"), -1;
    }
    for (int i = 0; i < nitems; i++) {
        const PlanInstr *in = &p->instrs[items[i].src];
        if (in->kind != PI_COLL)
            continue;
        x.instrs[m] = *in;
        if (in->coll.op == PC_SEND || in->coll.op == PC_RECV)
            x.instrs[m].coll.tag = plan_item_tag(p, &items[i]);
        m++;
    }
    x.ninstrs = m;
    int rc = plan_check_comm(&x, &at, err, sizeof err) ? comm_error(c, local, &x, at, err) : 0;
    free(x.instrs);
    free(items);
    return rc;
}

/* ---- the builder ---- */

int cg_build_plan(Ctx *c, const Graph *global, const TrainConfig *tc, int flags, Plan *out)
{
    Kernel **kernels;
    return cg_build_plan_ir(c, global, tc, flags, out, &kernels);
}

int cg_build_plan_ir(Ctx *c, const Graph *global, const TrainConfig *tc, int flags, Plan *out,
                     Kernel ***kernels)
{
    const Graph *local;
    return cg_build_plan_local(c, global, tc, flags, out, kernels, &local);
}

/* The instructions of op i, each owned by it, the FLOPs on its GEMM (else its
 * last kernel: attention). Nonzero when it has none that run. */
static int lower_one(Gen *gen, int i)
{
    const Graph *g = gen->g;
    double flops = gen->flops;
    int bad = cg_lower_op(gen, g->ops.data[i]) != 0;
    if (gen->instrs.len > gen->owner.len) {
        int at = gen->instrs.len - 1;
        for (int j = gen->owner.len; j < gen->instrs.len; j++)
            if (gen->instrs.data[j].kind == PI_GEMM)
                at = j;
        gen->instrs.data[at].flops = gen->flops - flops;
    }
    while (gen->owner.len < gen->instrs.len) {
        PlanInstr *in = &gen->instrs.data[gen->owner.len];
        in->mb = g->ops.data[i]->mb, in->tick = g->ops.data[i]->tick, in->op = i + 1;
        in->when = cg_loop_when(gen, g->ops.data[i]);
        VEC_PUSH(gen->a, gen->owner, i);
    }
    return bad;
}

int cg_build_plan_local(Ctx *c, const Graph *global, const TrainConfig *tc, int flags, Plan *out,
                        Kernel ***kernels, const Graph **local)
{
    const Graph *g = cg_localize(c->arena, global);
    *local = g;
    Gen gen = {.c = c, .g = g, .a = c->arena, .tc = *tc};
    gen.tensor_of = arena_alloc(c->arena, sizeof(int) * (size_t)(g->values.len + 1));
    for (int i = 0; i < g->values.len; i++)
        gen.tensor_of[i] = -1;
    if (cg_loop_find(&gen))
        return -1;
    if (gen.loop && (flags & CG_KEEP_VALUES))
        return diag_error(&c->diag, LOC_NONE, "a plan that keeps every value has no "
                                              "microbatch loop (compile it unrolled)"),
               -1;
    cg_find_fusions(&gen, flags);
    cg_place_values(&gen);
    int bad = 0;
    /* a sum that a weight gradient's GEMM adds into runs where its matmul is (fusion.c),
     * not where the sum is in the graph (after the backward): its operands die there */
    int *early = arena_alloc(c->arena, sizeof(int) * (size_t)(g->ops.len + 1));
    char *done = arena_alloc(c->arena, (size_t)g->ops.len + 1);
    memset(early, 0, sizeof(int) * (size_t)(g->ops.len + 1));
    memset(done, 0, (size_t)g->ops.len + 1);
    for (int i = 0; gen.acc_gemm && i < g->ops.len; i++)
        if (gen.acc_gemm[i])
            early[gen.acc_gemm[i] - 1] = i + 1;
    for (int i = 0; i < g->ops.len; i++) {
        if (!done[i])
            bad |= lower_one(&gen, i);
        if (early[i] && early[i] - 1 > i)
            bad |= lower_one(&gen, early[i] - 1), done[early[i] - 1] = 1;
    }
    if (bad || cg_stage_programs(&gen) != 0)
        return -1;
    if (gen.loop) {
        if (cg_loop_memory(&gen))
            return -1;
    } else if (!(flags & CG_KEEP_VALUES)) {
        cg_plan_memory(&gen);
    }
    cg_group_kernels(&gen);
    fill_plan(&gen, out);
    if (cg_check_launches(c, g, out) != 0 || cg_check_comm(c, g, out) != 0)
        return -1;
    cg_train_hash(&gen, out);
    *kernels = gen.kernels.data;
    return 0;
}
