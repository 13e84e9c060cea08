/* exec.c: the executor: open a plan on the CPU or cuda device and run its step.
 * Reads: a Plan and the data the caller hands in. Writes: the tensors of the
 * plan in the device's slab.
 * Key idea: everything a step needs is resolved at open time (the kernel
 * functions, the argument pointers of every instruction), so a step is one
 * walk over the instruction list with no allocation and no lookup; on a
 * pipeline the walk skips the instructions of the other stages. The walk can
 * stop before the update and go on after a look at the loss and gradient
 * norm (rt_step_begin, rt_step_end; where to stop: guard.c). On the cuda
 * device the walk queues the instructions on its streams; the host mirror of
 * the slab is synced around the step (host_slab.c). rt_step_blame's walk is
 * here too, with the guard looking before each instruction: the executor
 * calls the guard, the mesh and host_slab.c, and none of them calls it. */
#include "runtime/exec.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int bind_args(Runtime *rt, char *err, size_t n)
{
    const Plan *p = rt->p;
    size_t total = 0, k = 0;
    for (int i = 0; i < p->ninstrs; i++)
        total += (size_t)p->instrs[i].nargs;
    rt->argv = calloc(total + 1, sizeof *rt->argv);
    rt->args = calloc((size_t)p->ninstrs + 1, sizeof *rt->args);
    if (!rt->argv || !rt->args)
        return plan_errorf(err, n, "calloc: out of memory");
    int nsteps = 0;
    for (int t = 0; t < p->ntensors; t++)
        nsteps += p->tensors[t].role == PT_STEP;
    if (!(rt->steps = calloc((size_t)nsteps + 1, sizeof *rt->steps)))
        return plan_errorf(err, n, "calloc: out of memory");
    for (int t = 0, j = 0; t < p->ntensors; t++)
        if (p->tensors[t].role == PT_STEP)
            rt->steps[j++] = (float *)(rt->dev.slab + p->tensors[t].offset);
    int most = 1;
    for (int i = 0; i < p->ninstrs; i++)
        most = p->instrs[i].group > most ? p->instrs[i].group : most;
    rt->gfns = calloc((size_t)most, sizeof *rt->gfns);
    rt->gargs = calloc((size_t)most, sizeof *rt->gargs);
    if (!rt->gfns || !rt->gargs)
        return plan_errorf(err, n, "calloc: out of memory");
    for (int i = 0; i < p->ninstrs; i++) {
        rt->args[i] = rt->argv + k;
        for (int j = 0; j < p->instrs[i].nargs; j++)
            rt->argv[k++] = rt->dev.slab + p->tensors[p->instrs[i].args[j]].offset;
    }
    return 0;
}

Runtime *rt_open(const Plan *p, const char *cache_dir, char *err, size_t n)
{
    return rt_open_linked(p, NULL, cache_dir, err, n);
}

Runtime *rt_open_linked(const Plan *p, RtKernel const *kernels, const char *cache_dir, char *err,
                        size_t n)
{
    return rt_open_device(p, kernels, RT_CPU, cache_dir, err, n);
}

/* The GPU of this process: its local rank under a launcher, else 0. */
static int local_ordinal(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                       "MPI_LOCALRANKID", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i]) && *getenv(vars[i]))
            return atoi(getenv(vars[i]));
    return 0;
}

static int open_gpu(Runtime *rt, const char *cache_dir, char *err, size_t n)
{
    char msg[512];
    if (rt->p->nkernels > 0 && (!rt->p->gpu_source || !*rt->p->gpu_source))
        return plan_errorf(err, n, "the plan has no CUDA kernels: rebuild it with a tcc that "
                                   "renders them");
    int count = rt_cuda_devices(msg, sizeof msg), ordinal = local_ordinal();
    if (count < 1)
        return plan_errorf(err, n, "no CUDA device found (%s)", msg);
    if (ordinal >= count)
        return plan_errorf(err, n, "local rank %d has no GPU: this node has %d", ordinal, count);
    int graphs;
    if (rt_cuda_graphs_setting(&graphs, err, n))
        return -1;
    if (!(rt->gpu = rt_cuda_open(rt->p, ordinal, cache_dir, graphs, msg, sizeof msg)))
        return plan_errorf(err, n, "cuda:%d: %s", ordinal, msg);
    rt->dev_stale = 1; /* the first step uploads the whole slab */
    return 0;
}

/* What expanded() allocated beside p's own arrays (ts: its tensors' first copy). */
static void free_expanded(Plan *x, const PlanTensor *ts)
{
    if (!x)
        return;
    for (int i = 0; i < x->ninstrs; i++)
        free(x->instrs[i].args);
    free(x->instrs);
    if (x->tensors != ts)
        free(x->tensors);
    free(x);
}

/* A loop plan's program (plan/expand.c) in a Plan of the runtime's own:
 * its tensors and instructions the heap's, the rest p's. NULL and err. */
static Plan *expanded(const Plan *p, char *err, size_t n)
{
    Plan *x = malloc(sizeof *x);
    PlanTensor *ts = malloc(sizeof(PlanTensor) * (size_t)(p->ntensors + 1));
    if (!x || !ts) {
        free(x), free(ts);
        plan_errorf(err, n, "out of memory");
        return NULL;
    }
    *x = *p;
    memcpy(ts, p->tensors, sizeof(PlanTensor) * (size_t)p->ntensors);
    x->tensors = ts;
    if (plan_expand(x, 0, NULL, err, n) == 0) {
        free(ts);
        return x;
    }
    if (x->instrs == p->instrs) /* it failed before making the program */
        x->ninstrs = 0, x->instrs = NULL;
    free_expanded(x, ts);
    free(ts);
    return NULL;
}

Runtime *rt_open_device(const Plan *p, RtKernel const *kernels, RtDeviceKind kind,
                        const char *cache_dir, char *err, size_t n)
{
    char msg[512];
    Plan *own = NULL;
    if (plan_check(p, msg, sizeof msg) || (p->nsched > 0 && !(own = expanded(p, msg, sizeof msg)))) {
        plan_errorf(err, n, "plan \"%s\": %s", p->model ? p->model : "", msg);
        return NULL;
    }
    p = own ? own : p;
    Runtime *rt = calloc(1, sizeof *rt);
    if (!rt) {
        free_expanded(own, NULL);
        plan_errorf(err, n, "calloc: out of memory");
        return NULL;
    }
    rt->p = p;
    rt->own = own;
    rt->nstages = plan_stages(p);
    rt->stage = rt->nstages > 1 ? -1 : 0; /* known at rt_attach */
    if (rt_cpu_open_linked(&rt->dev, p, kernels, cache_dir, err, n) || bind_args(rt, err, n) ||
        rt_guard_open(rt, err, n) || rt_guard_gpu_hang(rt, kind == RT_CUDA, err, n) ||
        rt_profile_open(rt, kind, err, n) || (kind == RT_CUDA && open_gpu(rt, cache_dir, err, n))) {
        rt_close(rt);
        return NULL;
    }
    rt->dev.account = &rt->mem;
    return rt;
}

void rt_close(Runtime *rt)
{
    if (!rt)
        return;
    rt_profile_close(rt); /* before the mesh: it asks the world rank */
    rt_mesh_close(rt);
    rt_guard_close(rt);
    rt_cuda_close(rt->gpu);
    rt_cpu_close(&rt->dev);
    free(rt->argv);
    free(rt->steps);
    free(rt->args);
    free(rt->gfns);
    free((void *)rt->gargs);
    free_expanded(rt->own, NULL);
    free(rt);
}

/* The first id outside [0, limit), or -1. data may be unaligned. */
static int64_t first_bad_id(const void *data, size_t count, int64_t limit, int32_t *id)
{
    for (size_t i = 0; i < count; i++) {
        memcpy(id, (const char *)data + i * sizeof *id, sizeof *id);
        if (*id < 0 || *id >= limit)
            return (int64_t)i;
    }
    return -1;
}

int rt_set_input(Runtime *rt, const char *name, const void *data, size_t bytes, char *err, size_t n)
{
    const Plan *p = rt->p;
    int t = 0;
    while (t < p->ntensors && (p->tensors[t].role != PT_INPUT || strcmp(p->tensors[t].name, name)))
        t++;
    if (t == p->ntensors)
        return plan_errorf(err, n, "no input named \"%s\" in the plan", name);
    const PlanTensor *pt = &p->tensors[t];
    int64_t gshape[PLAN_MAX_RANK];
    rt_global_shape(p, pt, gshape);
    uint64_t global = plan_dtype_size(pt->dtype), rows = global;
    for (int d = 0; d < pt->rank; d++) {
        global *= (uint64_t)gshape[d];
        rows *= (uint64_t)(d ? gshape[d] : pt->shape[d]);
    }
    if (bytes != global && bytes != rows && rows == global)
        return plan_errorf(err, n, "input \"%s\": %zu bytes given, its %s tensor takes %" PRIu64,
                           name, bytes, plan_dtype_name(pt->dtype), global);
    if (bytes != global && bytes != rows)
        return plan_errorf(err, n, "input \"%s\": %zu bytes given, its %s tensor takes %" PRIu64
                                   " (%" PRIu64 " for this device's rows)",
                           name, bytes, plan_dtype_name(pt->dtype), global, rows);
    if (pt->dtype == PD_I32 && pt->limit > 0) {
        int32_t id;
        int64_t i = first_bad_id(data, bytes / sizeof id, pt->limit, &id);
        if (i >= 0)
            return plan_errorf(err, n, "input \"%s\": element %" PRId64 " is %d, outside [0, %" PRId64 ")",
                        name, i, (int)id, pt->limit);
    }
    if (bytes == pt->bytes) {
        memcpy(rt_host(rt, t), data, bytes);
        return 0;
    }
    PlanTensor view = *pt; /* rows-local data: the rest of the dims are global */
    if (bytes == rows && bytes != global)
        view.nsplit[0] = 0, view.shape[0] = pt->shape[0];
    rt_block_copy(rt, &view, (void *)data, rt_host(rt, t), 0);
    return 0;
}

int rt_set_hyper(Runtime *rt, const char *name, double value, char *err, size_t n)
{
    for (int t = 0; t < rt->p->ntensors; t++)
        if (rt->p->tensors[t].role == PT_HYPER && !strcmp(rt->p->tensors[t].name, name)) {
            if (rt->p->tensors[t].dtype == PD_F64)
                *(double *)rt_host(rt, t) = value;
            else
                *(float *)rt_host(rt, t) = (float)value;
            return 0;
        }
    return plan_errorf(err, n, "the plan has no hyperparameter \"%s\"", name);
}

/* Instruction i on the cuda device: compute on its stream, a collective
 * through mesh.c (which hands it to NCCL). */
static int run_gpu(Runtime *rt, int i, char *err, size_t n)
{
    if (rt->p->instrs[i].kind == PI_COLL)
        return rt_mesh_coll(rt, i, err, n);
    return rt_cuda_run(rt->gpu, i, err, n);
}

static int run_cpu(Runtime *rt, int i, char *err, size_t n)
{
    const Plan *p = rt->p;
    const PlanInstr *in = &p->instrs[i];
    switch (in->kind) {
    case PI_KERNEL:
        rt->dev.fns[in->kernel](rt->args[i]);
        return 0;
    case PI_GEMM:
        return rt_cpu_gemm(&rt->dev, p, &in->gemm, err, n);
    case PI_COPY: /* tensors may alias: memmove */
        memmove(rt->args[i][0], rt->args[i][1], p->tensors[in->args[0]].bytes);
        return 0;
    case PI_COLL:
        return rt_mesh_coll(rt, i, err, n);
    default:
        return plan_errorf(err, n, "unknown kind %d", (int)in->kind);
    }
}

/* Instruction i on this device, after the test hooks when hook is set and they
 * are due (guard.c); an error names the step and the instruction. 0 or -1. */
static int run_instr(Runtime *rt, int i, int hook, char *err, size_t n)
{
    char msg[640], what[160];
    if (hook && rt_guard_due(rt, i) && rt_guard_poison(rt, msg, sizeof msg))
        return plan_errorf(err, n, "step %" PRId64 ", TCC_TEST_NAN_GRAD: %s", rt->step_now, msg);
    /* a profile on the GPU waits for the device around each instruction */
    int timed = rt->prof && hook, wait = timed && rt->gpu;
    if (wait && rt_cuda_sync(rt->gpu, msg, sizeof msg))
        return plan_errorf(err, n, "step %" PRId64 ", TCC_PROFILE: %s", rt->step_now, msg);
    double t0 = timed ? rt_profile_now() : 0;
    if (hook && rt->gpu && i == rt->hang_at && rt->step_now == rt->hang_step &&
        rt_cuda_hang(rt->gpu, msg, sizeof msg))
        return plan_errorf(err, n, "step %" PRId64 ", %s", rt->step_now, msg);
    if ((rt->gpu ? run_gpu(rt, i, msg, sizeof msg) : run_cpu(rt, i, msg, sizeof msg)) ||
        (wait && rt_cuda_sync(rt->gpu, msg, sizeof msg)))
        return plan_errorf(err, n, "step %" PRId64 ", instrs[%d] (%s): %s", rt->step_now, i,
                           plan_instr_label(rt->p, i, what, sizeof what), msg);
    if (timed)
        rt_profile_add(rt, i, rt_profile_now() - t0);
    return 0;
}

/* Before a walk: a pipeline must be attached; the cuda device gets the host's writes. */
static int prologue(Runtime *rt, char *err, size_t n)
{
    char msg[400];
    if (rt->nstages > 1 && !rt->world)
        return plan_errorf(err, n,
                           "the plan has %d pipeline stages, each on its own devices, "
                           "but no mesh was attached (rt_attach)",
                           rt->nstages);
    if (rt->gpu && rt_mirror_upload(rt, msg, sizeof msg))
        return plan_errorf(err, n, "step %" PRId64 ", the upload: %s", rt->step_now, msg);
    return 0;
}

/* The group of kernels that instruction i starts (PlanInstr.group), on the
 * CPU, in one parallel region, when all of them run in this walk (before
 * `to`, forward ones when fwd_only, no test hook due). The number run, or 0:
 * then each runs alone. A profile gives each member an equal share. */
static int run_group(Runtime *rt, int i, int to, int fwd_only)
{
    const Plan *p = rt->p;
    int g = p->instrs[i].group;
    if (g < 2 || rt->gpu || !rt->dev.run_group || i + g > to)
        return 0;
    for (int j = i; j < i + g; j++)
        if ((fwd_only && p->instrs[j].phase != 0) || rt_guard_due(rt, j))
            return 0;
    for (int j = 0; j < g; j++)
        rt->gfns[j] = rt->dev.ws[p->instrs[i + j].kernel], rt->gargs[j] = rt->args[i + j];
    double t0 = rt->prof ? rt_profile_now() : 0;
    rt->dev.run_group(g, rt->gfns, rt->gargs);
    double each = rt->prof ? (rt_profile_now() - t0) / g : 0;
    for (int j = 0; rt->prof && j < g; j++)
        rt_profile_add(rt, i + j, each);
    return g;
}

/* The instructions [from, to) of this device's stage in order, one by one;
 * only the forward ones (phase 0) when fwd_only. */
static int walk_each(Runtime *rt, int from, int to, int fwd_only, char *err, size_t n)
{
    const Plan *p = rt->p;
    for (int i = from; i < to; i++) {
        const PlanInstr *in = &p->instrs[i];
        if ((fwd_only && in->phase != 0) || in->stage != rt->stage)
            continue;
        int g = run_group(rt, i, to, fwd_only);
        if (g) {
            i += g - 1;
            continue;
        }
        if (run_instr(rt, i, 1, err, n))
            return -1;
    }
    return 0;
}

/* walk_each, on the cuda device through a CUDA graph of the walk: captured
 * the first time, replayed after (rt_cuda_walk_begin), unless a test hook or
 * a profile wants the instructions one by one. A capture that fails is said
 * once, and that walk runs one by one from then on. */
static int walk(Runtime *rt, int from, int to, int fwd_only, char *err, size_t n)
{
    char msg[400];
    if (!rt->gpu || rt->prof || rt->hang_at >= 0 || rt->poison_at >= 0)
        return walk_each(rt, from, to, fwd_only, err, n);
    int r = rt_cuda_walk_begin(rt->gpu, from, to, fwd_only, msg, sizeof msg);
    if (r < 0)
        return plan_errorf(err, n, "step %" PRId64 ", a CUDA graph: %s", rt->step_now, msg);
    if (r == 1)
        return 0;
    char why[640] = ""; /* an instruction's failure while captured */
    int ok = walk_each(rt, from, to, fwd_only, why, sizeof why) == 0;
    msg[0] = 0;
    r = rt_cuda_walk_end(rt->gpu, from, to, fwd_only, ok, msg, sizeof msg);
    if (r < 0)
        return plan_errorf(err, n, "step %" PRId64 ", a CUDA graph: %s", rt->step_now, msg);
    if (r == 0)
        return ok ? 0 : plan_errorf(err, n, "%s", why);
    /* run again one by one: a real failure fails there, with its instruction */
    if (walk_each(rt, from, to, fwd_only, err, n))
        return -1;
    fprintf(stderr, "cuda: instrs[%d..%d] run without a CUDA graph: its capture failed (%s)\n",
            from, to - 1, msg[0] ? msg : why);
    return 0;
}

/* After a walk: the outputs to the host (cuda) and, with stages, from their
 * stage to every device. */
static int epilogue(Runtime *rt, int mesh, char *err, size_t n)
{
    char msg[400];
    if (rt->gpu && rt_mirror_download(rt, msg, sizeof msg))
        return plan_errorf(err, n, "step %" PRId64 ", the outputs: %s", rt->step_now, msg);
    if (mesh && rt_mesh_outputs(rt, msg, sizeof msg))
        return plan_errorf(err, n, "step %" PRId64 ", the outputs: %s", rt->step_now, msg);
    return 0;
}

int rt_step_begin(Runtime *rt, int64_t step, char *err, size_t n)
{
    for (float **t = rt->steps; *t; t++)
        **t = (float)step;
    rt->step_now = step;
    if (rt_guard_stall(rt, err, n) || prologue(rt, err, n))
        return -1;
    return walk(rt, 0, rt->split[rt->stage], 0, err, n) || epilogue(rt, 0, err, n) ? -1 : 0;
}

int rt_step_end(Runtime *rt, int apply, char *err, size_t n)
{
    if (apply && walk(rt, rt->split[rt->stage], rt->p->ninstrs, 0, err, n))
        return -1;
    return epilogue(rt, 1, err, n);
}

/* The step's first part again, with no hook and no profile, the guard looking
 * at the gradients before each instruction (rt_guard_blame_at). */
int rt_step_blame(Runtime *rt, int *param, char *err, size_t n)
{
    const Plan *p = rt->p;
    RtBlame b = {-1, 0};
    int end = rt->split[rt->stage];
    for (int i = 0; i < end; i++) {
        if (p->instrs[i].stage != rt->stage)
            continue;
        if (rt_guard_blame_at(rt, &b, i, err, n) || run_instr(rt, i, 0, err, n))
            return -1;
    }
    return rt_guard_blame_end(rt, &b, param, err, n);
}

/* rt_step_begin and rt_step_end(rt, 1) in one walk: no stop in between. */
int rt_step(Runtime *rt, int64_t step, char *err, size_t n)
{
    for (float **t = rt->steps; *t; t++)
        **t = (float)step;
    rt->step_now = step;
    if (rt_guard_stall(rt, err, n) || prologue(rt, err, n) ||
        walk(rt, 0, rt->p->ninstrs, 0, err, n))
        return -1;
    return epilogue(rt, 1, err, n);
}

int rt_forward(Runtime *rt, char *err, size_t n)
{
    for (float **t = rt->steps; *t; t++) /* step 0: dropout keeps everything */
        **t = 0;
    rt->step_now = 0;
    if (prologue(rt, err, n) || walk(rt, 0, rt->p->ninstrs, 1, err, n))
        return -1;
    return epilogue(rt, 1, err, n);
}

int rt_cuda_graphs_setting(int *on, char *err, size_t n)
{
    const char *g = getenv("TCC_CUDA_GRAPHS");
    *on = !g || !*g || strcmp(g, "0");
    if (g && *g && strcmp(g, "0") && strcmp(g, "1"))
        return plan_errorf(err, n, "TCC_CUDA_GRAPHS=%s: 1 (the default: each walk of the step "
                                   "captured once, then replayed) or 0 (instruction by instruction)",
                           g);
    return 0;
}

int rt_cuda_devices(char *err, size_t n)
{
    return rt_cuda_count(err, n);
}
