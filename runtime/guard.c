/* guard.c: a step that can stop before its update.
 * Reads: the plan's instructions and tensors; the TCC_TEST_NAN_GRAD and
 * TCC_TEST_STALL variables.
 * Writes: at open, where each stage's update starts (the split) and where the
 * optimizer first reads each gradient; during a step, the devices' agreement on
 * a non-finite loss or gradient norm, and the first non-finite gradient.
 * Key idea: the plan changes a parameter or an optimizer state only in its
 * optimizer phase, where the update writes into it (codegen: a copy; a kernel
 * of that phase that takes one may too). Everything of a stage before its
 * first such instruction -- forward, backward, the gradient norm -- leaves
 * the run's state as it was, so rt_step_begin can run it, the caller can look
 * at the loss and the norm, and rt_step_end can apply the update or drop it;
 * rt_step_blame can even run that part again to look at each gradient where
 * the optimizer first reads it (temporaries share memory, so the gradients
 * are not all there at the split; exec.c walks the instructions, this file
 * looks before each: rt_guard_blame_at). The split is safe when the loss and the
 * norm are computed before it and no message between stages crosses it (a
 * send before the split whose recv comes after it would be left unreceived by
 * a dropped update); otherwise the whole step is its first part (held = 0). */
#include "runtime/exec.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int overlap(const PlanTensor *a, const PlanTensor *b)
{
    int same_slab = a->stage < 0 || b->stage < 0 || a->stage == b->stage;
    return a->bytes && b->bytes && same_slab && a->offset < b->offset + b->bytes &&
           b->offset < a->offset + a->bytes;
}

/* The parameters and optimizer states by offset, reach[k] the largest end
 * among the first k + 1: which of them a tensor overlaps, in O(log n) for
 * the usual few. */
typedef struct Persistent {
    int n;
    const PlanTensor **t;
    uint64_t *reach;
} Persistent;

static int by_offset(const void *a, const void *b)
{
    uint64_t x = (*(const PlanTensor *const *)a)->offset,
             y = (*(const PlanTensor *const *)b)->offset;
    return (x > y) - (x < y);
}

static int persistent_index(const Plan *p, Persistent *ps)
{
    ps->n = 0;
    ps->t = malloc(((size_t)p->ntensors + 1) * sizeof *ps->t);
    ps->reach = malloc(((size_t)p->ntensors + 1) * sizeof *ps->reach);
    if (!ps->t || !ps->reach)
        return -1;
    for (int q = 0; q < p->ntensors; q++)
        if (p->tensors[q].role == PT_PARAM || p->tensors[q].role == PT_STATE)
            ps->t[ps->n++] = &p->tensors[q];
    qsort(ps->t, (size_t)ps->n, sizeof *ps->t, by_offset);
    for (int k = 0; k < ps->n; k++) {
        uint64_t end = ps->t[k]->offset + ps->t[k]->bytes;
        ps->reach[k] = k && ps->reach[k - 1] > end ? ps->reach[k - 1] : end;
    }
    return 0;
}

/* Whether tensor t shares a byte with a parameter or an optimizer state. */
static int persistent_bytes(const Plan *p, const Persistent *ps, int t)
{
    const PlanTensor *pt = &p->tensors[t];
    int lo = 0, hi = ps->n; /* the first that starts at or after t's end */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ps->t[mid]->offset < pt->offset + pt->bytes)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int k = lo - 1; k >= 0 && ps->reach[k] > pt->offset; k--)
        if (overlap(ps->t[k], pt))
            return 1;
    return 0;
}

/* Whether optimizer instruction i may write into a parameter or an optimizer
 * state: a copy's destination, a GEMM's C, a collective's outputs, and any
 * tensor of a kernel's (the plan does not say which a kernel writes; codegen's
 * optimizer kernels write parameters and state in place, or temporaries that
 * a copy puts in). */
static int writes_persistent(const Plan *p, const Persistent *ps, int i)
{
    const PlanInstr *in = &p->instrs[i];
    if (in->kind == PI_KERNEL) {
        for (int j = 0; j < in->nargs; j++)
            if (persistent_bytes(p, ps, in->args[j]))
                return 1;
        return 0;
    }
    if (in->kind == PI_COPY)
        return persistent_bytes(p, ps, in->args[0]);
    if (in->kind == PI_GEMM)
        return persistent_bytes(p, ps, in->gemm.c);
    if (in->kind != PI_COLL || in->coll.op == PC_SEND)
        return 0;
    if (in->coll.op == PC_RECV)
        return persistent_bytes(p, ps, in->args[0]);
    for (int j = 1; j < in->nargs; j += 2) /* [in, out] or a bucket's pairs */
        if (persistent_bytes(p, ps, in->args[j]))
            return 1;
    return 0;
}

static int mentions(const PlanInstr *in, int t)
{
    if (in->kind == PI_GEMM)
        return in->gemm.a == t || in->gemm.b == t || in->gemm.c == t ||
               (in->gemm.epilogue == PE_BIAS && in->gemm.bias == t);
    for (int j = 0; j < in->nargs; j++)
        if (in->args[j] == t)
            return 1;
    return 0;
}

/* An output (loss, grad norm) is computed before the split on every stage
 * that holds it, and on one stage at least. */
static int before_split(const Plan *p, const int *split, int nstages, int t)
{
    int seen = 0;
    if (t < 0)
        return 1;
    for (int s = 0; s < nstages; s++) {
        if (p->tensors[t].stage >= 0 && p->tensors[t].stage != s)
            continue;
        for (int i = 0; i < p->ninstrs; i++) {
            if (p->instrs[i].stage == s && mentions(&p->instrs[i], t)) {
                if (i >= split[s])
                    return 0;
                seen = 1;
                break;
            }
        }
    }
    return seen;
}

/* A send or a recv: the stages it goes from and to, its tag, its instruction. */
typedef struct Msg {
    int from, to, tag, instr;
} Msg;

static int by_channel(const void *a, const void *b)
{
    const Msg *x = a, *y = b;
    int d[] = {x->from - y->from, x->to - y->to, x->tag - y->tag, x->instr - y->instr};
    for (int i = 0; i < 4; i++)
        if (d[i])
            return (d[i] > 0) - (d[i] < 0);
    return 0;
}

/* The sends (recv 0) or the recvs (1) of p, sorted: on each channel and tag
 * the k-th send pairs with the k-th recv. NULL when out of memory. */
static Msg *messages(const Plan *p, int recv, int *count)
{
    Msg *m = malloc(((size_t)p->ninstrs + 1) * sizeof *m);
    *count = 0;
    for (int i = 0; m && i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        if (in->kind == PI_COLL && in->coll.op == (recv ? PC_RECV : PC_SEND))
            m[(*count)++] = recv ? (Msg){in->coll.peer, in->stage, in->coll.tag, i}
                                 : (Msg){in->stage, in->coll.peer, in->coll.tag, i};
    }
    if (m)
        qsort(m, (size_t)*count, sizeof *m, by_channel);
    return m;
}

/* Whether a send and its recv lie on different sides of their stages'
 * splits: 1, 0, or -1 when out of memory. */
static int message_crosses(const Plan *p, const int *split)
{
    int ns, nr, crosses = 0;
    Msg *s = messages(p, 0, &ns), *r = messages(p, 1, &nr);
    for (int i = 0, j = 0; s && r && i < ns && j < nr;) {
        Msg a = s[i], b = r[j];
        a.instr = b.instr = 0;
        int c = by_channel(&a, &b);
        if (c == 0)
            crosses |= (s[i].instr < split[s[i].from]) != (r[j].instr < split[r[j].to]);
        i += c <= 0, j += c >= 0;
    }
    int rc = s && r ? crosses : -1;
    free(s);
    free(r);
    return rc;
}

static int find_splits(Runtime *rt, char *err, size_t n)
{
    const Plan *p = rt->p;
    Persistent ps = {0};
    if (!(rt->split = malloc((size_t)rt->nstages * sizeof *rt->split)) ||
        persistent_index(p, &ps)) {
        free(ps.t);
        free(ps.reach);
        return plan_errorf(err, n, "malloc: out of memory");
    }
    for (int s = 0; s < rt->nstages; s++)
        rt->split[s] = p->ninstrs;
    for (int i = p->ninstrs - 1; i >= 0; i--)
        if (p->instrs[i].phase == 3 && writes_persistent(p, &ps, i))
            rt->split[p->instrs[i].stage] = i;
    free(ps.t);
    free(ps.reach);
    int crosses = message_crosses(p, rt->split);
    if (crosses < 0)
        return plan_errorf(err, n, "malloc: out of memory");
    rt->held = before_split(p, rt->split, rt->nstages, p->loss) &&
               before_split(p, rt->split, rt->nstages, p->grad_norm) && !crosses;
    if (!rt->held)
        for (int s = 0; s < rt->nstages; s++)
            rt->split[s] = p->ninstrs;
    return 0;
}

/* ---- gradients ---- */

/* By tensor: the first optimizer instruction that mentions it, or -1. */
static int *first_opt_reads(const Plan *p)
{
    int *at = malloc(((size_t)p->ntensors + 1) * sizeof *at);
    for (int t = 0; at && t < p->ntensors; t++)
        at[t] = -1;
    for (int i = p->ninstrs - 1; at && i >= 0; i--) {
        const PlanInstr *in = &p->instrs[i];
        if (in->phase != 3)
            continue;
        for (int j = 0; j < in->nargs; j++)
            at[in->args[j]] = i;
        if (in->kind == PI_GEMM) {
            at[in->gemm.a] = at[in->gemm.b] = at[in->gemm.c] = i;
            if (in->gemm.epilogue == PE_BIAS)
                at[in->gemm.bias] = i;
        }
    }
    return at;
}

/* The parameter whose gradient tensor t is (codegen names it PARAM.grad), or -1. */
static int param_of_grad(const Plan *p, int t)
{
    const char *name = p->tensors[t].name;
    size_t len = name ? strlen(name) : 0;
    if (p->tensors[t].role != PT_TEMP || len <= 5 || strcmp(name + len - 5, ".grad"))
        return -1;
    for (int q = 0; q < p->ntensors; q++)
        if (p->tensors[q].role == PT_PARAM && strlen(p->tensors[q].name) == len - 5 &&
            !strncmp(p->tensors[q].name, name, len - 5))
            return q;
    return -1;
}

/* Add gradient g of param q, first read at instruction i, keeping the table
 * ordered by i (an insertion sort: the plan mostly has them in order); a
 * parameter's first gradient tensor only. */
static void add_grad(Runtime *rt, int q, int g, int i)
{
    int j = rt->ngrads;
    for (int k = 0; k < rt->ngrads; k++)
        if (rt->grad_param[k] == q)
            return;
    for (; j > 0 && rt->grad_at[j - 1] > i; j--) {
        rt->grad_param[j] = rt->grad_param[j - 1], rt->grad_tensor[j] = rt->grad_tensor[j - 1];
        rt->grad_at[j] = rt->grad_at[j - 1];
    }
    rt->grad_param[j] = q, rt->grad_tensor[j] = g, rt->grad_at[j] = i;
    rt->ngrads++;
}

/* The parameters with a named gradient that the optimizer reads, ordered by
 * where it first does. */
static int find_grads(Runtime *rt, char *err, size_t n)
{
    const Plan *p = rt->p;
    size_t np = (size_t)p->ntensors + 1;
    rt->grad_param = malloc(np * sizeof *rt->grad_param);
    rt->grad_tensor = malloc(np * sizeof *rt->grad_tensor);
    rt->grad_at = malloc(np * sizeof *rt->grad_at);
    int *at = first_opt_reads(p);
    if (!rt->grad_param || !rt->grad_tensor || !rt->grad_at || !at) {
        free(at);
        return plan_errorf(err, n, "malloc: out of memory");
    }
    for (int g = 0; g < p->ntensors; g++) {
        int q = at[g] >= 0 ? param_of_grad(p, g) : -1;
        if (q >= 0)
            add_grad(rt, q, g, at[g]);
    }
    free(at);
    return 0;
}

/* ---- the test hook ---- */

/* TCC_TEST_NAN_GRAD=STEP[-LAST]:PARAM: at step STEP (to LAST), element 0 of
 * PARAM's gradient becomes NaN just before the optimizer first reads it
 * (test-only). */
static int read_hook(Runtime *rt, char *err, size_t n)
{
    const char *v = getenv("TCC_TEST_NAN_GRAD");
    char *end;
    rt->poison_at = rt->poison_tensor = -1;
    if (!v || !*v)
        return 0;
    long long step = strtoll(v, &end, 10), last = step;
    if (end != v && *end == '-')
        last = strtoll(end + 1, &end, 10);
    if (end == v || *end != ':' || step < 1 || last < step)
        return plan_errorf(err, n, "TCC_TEST_NAN_GRAD: expected STEP[-LAST]:PARAM, got '%s'", v);
    for (int g = 0; g < rt->ngrads; g++)
        if (!strcmp(rt->p->tensors[rt->grad_param[g]].name, end + 1)) {
            rt->poison_step = step, rt->poison_last = last, rt->poison_at = rt->grad_at[g];
            rt->poison_tensor = rt->grad_tensor[g];
            return 0;
        }
    return plan_errorf(err, n, "TCC_TEST_NAN_GRAD: the plan names no gradient of '%s'", end + 1);
}

int rt_guard_due(const Runtime *rt, int i)
{
    return i == rt->poison_at && rt->step_now >= rt->poison_step && rt->step_now <= rt->poison_last;
}

int rt_guard_poison(Runtime *rt, char *err, size_t n)
{
    const PlanTensor *t = &rt->p->tensors[rt->poison_tensor];
    char *x = rt_host(rt, rt->poison_tensor);
    float f = NAN;
    double d = NAN;
    uint16_t h = t->dtype == PD_BF16 ? 0x7fc0 : 0x7e00;
    if (!t->bytes)
        return 0;
    if (rt->gpu && rt_cuda_sync(rt->gpu, err, n)) /* a collective may still write it */
        return -1;
    if (t->dtype == PD_F32)
        memcpy(x, &f, sizeof f);
    else if (t->dtype == PD_F64)
        memcpy(x, &d, sizeof d);
    else if (t->dtype == PD_BF16 || t->dtype == PD_F16)
        memcpy(x, &h, sizeof h);
    return rt->gpu
               ? rt_cuda_put(rt->gpu, rt->dev.slab, t->offset, plan_dtype_size(t->dtype), err, n)
               : 0;
}

/* TCC_TEST_STALL=RANK:STEP: world rank RANK stops at the start of step STEP,
 * outside any collective, as a rank that hangs would (test-only: the others'
 * watchdog must name it). */
static int read_stall(Runtime *rt, char *err, size_t n)
{
    const char *v = getenv("TCC_TEST_STALL");
    char *end;
    rt->stall_rank = -1;
    if (!v || !*v)
        return 0;
    long long rank = strtoll(v, &end, 10), step = 0;
    if (end != v && *end == ':')
        step = strtoll(end + 1, &end, 10);
    if (rank < 0 || rank > 1 << 30 || step < 1 || *end)
        return plan_errorf(err, n, "TCC_TEST_STALL: expected RANK:STEP, got '%s'", v);
    rt->stall_rank = (int)rank, rt->stall_step = step;
    return 0;
}

int rt_guard_gpu_hang(Runtime *rt, int cuda, char *err, size_t n)
{
    const char *v = getenv("TCC_TEST_GPU_HANG");
    char *end;
    rt->hang_at = -1;
    if (!v || !*v)
        return 0;
    long long step = strtoll(v, &end, 10), at = -1;
    if (end != v && *end == ':')
        at = strtoll(end + 1, &end, 10);
    if (step < 1 || at < 0 || at >= rt->p->ninstrs || *end)
        return plan_errorf(err, n, "TCC_TEST_GPU_HANG: expected STEP:INSTR (INSTR < %d), got '%s'",
                           rt->p->ninstrs, v);
    if (!cuda)
        return plan_errorf(err, n, "TCC_TEST_GPU_HANG: the cpu device has no GPU to hang "
                                   "(--device cuda)");
    rt->hang_step = step, rt->hang_at = (int)at;
    return 0;
}

int rt_guard_open(Runtime *rt, char *err, size_t n)
{
    return find_splits(rt, err, n) || find_grads(rt, err, n) || read_hook(rt, err, n) ||
                   read_stall(rt, err, n)
               ? -1
               : 0;
}

int rt_guard_stall(Runtime *rt, char *err, size_t n)
{
    struct timespec nap = {0, 10 * 1000 * 1000};
    if (!rt->world || rt->step_now != rt->stall_step || rt_world_rank(rt->world) != rt->stall_rank)
        return 0;
    while (!rt_world_broken(rt->world)) /* mpi: MPI_Abort ends this process first */
        nanosleep(&nap, NULL);
    return plan_errorf(err, n,
                       "step %" PRId64 ", TCC_TEST_STALL: rank %d stalled until the run "
                       "failed",
                       rt->step_now, rt->stall_rank);
}

void rt_guard_close(Runtime *rt)
{
    free(rt->split);
    free(rt->grad_param);
    free(rt->grad_tensor);
    free(rt->grad_at);
}

/* ---- during a step ---- */

int rt_step_holds_update(const Runtime *rt)
{
    return rt->held;
}

/* Whether output t is finite where this device holds it (another stage's is
 * not here until rt_step_end broadcasts it). */
static int finite_here(Runtime *rt, int t)
{
    if (t < 0 || (rt->p->tensors[t].stage >= 0 && rt->p->tensors[t].stage != rt->stage))
        return 1;
    return isfinite(rt_scalar(rt, t));
}

int rt_step_nonfinite(Runtime *rt)
{
    return (finite_here(rt, rt->p->loss) ? 0 : RT_BAD_LOSS) |
           (finite_here(rt, rt->p->grad_norm) ? 0 : RT_BAD_NORM);
}

/* Whether tensor t holds a NaN or an infinity: 1, 0, or -1 with a message. */
static int nonfinite_tensor(Runtime *rt, int t, char *err, size_t n)
{
    const PlanTensor *pt = &rt->p->tensors[t];
    const char *x = rt_host(rt, t);
    if (rt->gpu && (rt_cuda_get(rt->gpu, rt->dev.slab, pt->offset, pt->bytes, err, n) ||
                    rt_cuda_sync(rt->gpu, err, n)))
        return -1;
    size_t size = plan_dtype_size(pt->dtype), count = pt->bytes / size;
    for (size_t j = 0; j < count; j++) {
        float f;
        double d;
        uint16_t h;
        if (pt->dtype == PD_F32 && (memcpy(&f, x + j * size, size), !isfinite(f)))
            return 1;
        if (pt->dtype == PD_F64 && (memcpy(&d, x + j * size, size), !isfinite(d)))
            return 1;
        if (pt->dtype == PD_BF16 && (memcpy(&h, x + j * size, size), (h & 0x7f80) == 0x7f80))
            return 1;
        if (pt->dtype == PD_F16 && (memcpy(&h, x + j * size, size), (h & 0x7c00) == 0x7c00))
            return 1;
    }
    return 0;
}

/* Look at gradient g (if this stage holds it and it could come first): 0 or -1. */
static int look(Runtime *rt, int g, int *first, char *err, size_t n)
{
    if (rt->p->instrs[rt->grad_at[g]].stage != rt->stage ||
        (*first >= 0 && rt->grad_param[g] > *first))
        return 0;
    int bad = nonfinite_tensor(rt, rt->grad_tensor[g], err, n);
    if (bad > 0)
        *first = rt->grad_param[g];
    return bad < 0 ? -1 : 0;
}

/* ---- rt_step_blame's looks (its walk, which runs the instructions: exec.c) ---- */

int rt_guard_blame_at(Runtime *rt, RtBlame *b, int i, char *err, size_t n)
{
    char msg[400];
    if (rt_guard_due(rt, i) && rt_guard_poison(rt, msg, sizeof msg))
        return plan_errorf(err, n, "TCC_TEST_NAN_GRAD: %s", msg);
    for (; b->g < rt->ngrads && rt->grad_at[b->g] <= i; b->g++)
        if (look(rt, b->g, &b->first, err, n))
            return -1;
    return 0;
}

int rt_guard_blame_end(Runtime *rt, RtBlame *b, int *param, char *err, size_t n)
{
    const Plan *p = rt->p;
    for (; b->g < rt->ngrads; b->g++) /* read only after the split: still intact there */
        if (look(rt, b->g, &b->first, err, n))
            return -1;
    int32_t v = b->first >= 0 ? p->ntensors - b->first : 0; /* the largest: the first parameter */
    if (rt_mesh_agree(rt, &v, 1, err, n))
        return -1;
    *param = v ? p->ntensors - v : -1;
    return 0;
}
