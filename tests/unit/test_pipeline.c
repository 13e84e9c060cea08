/* test_pipeline.c: pipeline stages in the runtime (runtime/exec.c, mesh.c,
 * verify.c) on plans built here by hand. A tiny model is cut into two stages
 * on a mesh with a "pp" axis of role pipeline: stage 0 computes h = x * w and
 * sends h; stage 1 receives it as r, computes loss = sum(r^2) / 2 and sends
 * the gradient g = r back; stage 0 receives it and updates w -= 0.1 g x.
 * Checks: each device runs only its stage's instructions and holds only its
 * stage's tensors (rt_tensor_data is NULL for the others), the loss (held by
 * stage 1) reaches every rank after rt_step and rt_forward, rt_tensor_global
 * takes a tensor's value from the devices of its stage, a plan with stages
 * does not run without a mesh, a recv of the wrong size is refused before
 * any rank runs, and on a pp x dp mesh the run matches the one-device plan
 * of the same model (rt_verify). Bounds: f64 throughout; one device and the
 * mesh differ only in the order of a 4-term sum (a few ulps), tol 1e-12. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/comm/comm.h"
#include "runtime/runtime.h"
#include "tests/support/tmpdir.h"

static char dir[64], cache[96];

static void make_dir(void)
{
    tmpdir_make(dir, "pipe");
    snprintf(cache, sizeof cache, "%s/cache", dir);
}

static void remove_dir(void)
{
    tmpdir_remove(dir);
}

/* a rank that fails a check may leave the other waiting in a recv: fail, do not hang */
TestSuite(pipeline, .init = make_dir, .fini = remove_dir, .timeout = 60);

/* ---- the model ---- */

/* N: the elements of each vector on one device. */
static const char *KERNELS =
    "void k_mul(char *const *a) /* h = x * w */\n"
    "{\n"
    "    double *h = (double *)a[0];\n"
    "    const double *x = (const double *)a[1], *w = (const double *)a[2];\n"
    "    for (int i = 0; i < N; i++)\n"
    "        h[i] = x[i] * w[i];\n"
    "}\n"
    "void k_half_sq(char *const *a) /* l = sum(r^2) / 2 */\n"
    "{\n"
    "    double *l = (double *)a[0], s = 0;\n"
    "    const double *r = (const double *)a[1];\n"
    "    for (int i = 0; i < N; i++)\n"
    "        s += r[i] * r[i];\n"
    "    *l = s / 2;\n"
    "}\n"
    "void k_grad(char *const *a) /* g = dl/dr = r */\n"
    "{\n"
    "    double *g = (double *)a[0];\n"
    "    const double *r = (const double *)a[1];\n"
    "    for (int i = 0; i < N; i++)\n"
    "        g[i] = r[i];\n"
    "}\n"
    "void k_update(char *const *a) /* w -= 0.1 g x */\n"
    "{\n"
    "    double *w = (double *)a[0];\n"
    "    const double *x = (const double *)a[1], *g = (const double *)a[2];\n"
    "    for (int i = 0; i < N; i++)\n"
    "        w[i] -= 0.1 * g[i] * x[i];\n"
    "}\n";

enum { X, W, H, R, PART, LOSS, G, G2, NTENSORS };

static void tensor(Plan *p, int i, const char *name, PlanRole role, int rank, int64_t n, int stage)
{
    PlanTensor *t = &p->tensors[i];
    t->name = strdup(name);
    t->init = strdup(role == PT_PARAM ? "normal" : "");
    t->init_arg = role == PT_PARAM ? 1.0 : 0;
    t->dtype = PD_F64;
    t->role = role;
    t->rank = rank;
    t->shape[0] = n;
    t->bytes = (uint64_t)(rank ? n : 1) * 8;
    t->offset = p->slab_bytes;
    t->layer = t->value = -1;
    t->stage = stage;
    p->slab_bytes += (t->bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
}

static PlanInstr *instr(Plan *p, PlanInstrKind kind, int nargs, const int *args, int stage,
                        int phase)
{
    PlanInstr *in = &p->instrs[p->ninstrs++];
    *in = (PlanInstr){.kind = kind, .nargs = nargs, .phase = phase, .layer = -1, .stage = stage};
    in->args = malloc(sizeof(int) * (size_t)nargs);
    memcpy(in->args, args, sizeof(int) * (size_t)nargs);
    return in;
}

static void kernel(Plan *p, int k, const int *args, int nargs, int stage, int phase)
{
    static const char *const names[] = {"k_mul", "k_half_sq", "k_grad", "k_update"};
    instr(p, PI_KERNEL, nargs, args, stage, phase)->kernel = k;
    if (!p->kernels[k].name)
        p->kernels[k] = (PlanKernel){strdup(names[k]), nargs, 0, 1, 256};
}

/* Tensor t from stage `from` to stage `to` (a send and a recv), or a copy on one device. */
static void hand_over(Plan *p, int pipeline, int src, int dst, int from, int to, int tag, int phase)
{
    if (!pipeline) {
        instr(p, PI_COPY, 2, (int[]){dst, src}, 0, phase);
        return;
    }
    PlanColl c = {.naxes = 1, .axes = {0}, .dim = -1, .dim2 = -1, .bytes = 8, .tag = tag};
    c.op = PC_SEND, c.peer = to;
    instr(p, PI_COLL, 1, &src, from, phase)->coll = c;
    c.op = PC_RECV, c.peer = from;
    instr(p, PI_COLL, 1, &dst, to, phase)->coll = c;
}

/* The model on one device (pipeline 0, dp 1), or in two stages over axis 0 "pp",
 * with dp > 1 a data-parallel axis 1 "dp" that splits x and w (the partial
 * losses are then summed over dp by stage 1). */
static Plan *model(int pipeline, int dp)
{
    Plan *p = calloc(1, sizeof *p);
    int64_t n = 4 / dp;
    int s0 = pipeline ? 0 : -1, s1 = pipeline ? 1 : -1, i1 = pipeline ? 1 : 0;
    char src[2048];
    p->version = PLAN_VERSION;
    p->model = strdup("pipe");
    p->axes = calloc(2, sizeof *p->axes);
    if (pipeline)
        p->axes[p->naxes++] = (PlanAxis){strdup("pp"), strdup("pipeline"), 2, 0};
    if (dp > 1)
        p->axes[p->naxes++] = (PlanAxis){strdup("dp"), strdup("data"), dp, 0};
    p->ntensors = NTENSORS;
    p->tensors = calloc(NTENSORS, sizeof *p->tensors);
    tensor(p, X, "x", PT_INPUT, 1, n, -1);
    tensor(p, W, "w", PT_PARAM, 1, n, s0);
    tensor(p, H, "", PT_TEMP, 1, n, s0);
    tensor(p, R, "", PT_TEMP, 1, n, s1);
    tensor(p, PART, "", PT_TEMP, 0, 0, s1);
    tensor(p, LOSS, "loss", PT_TEMP, 0, 0, s1);
    tensor(p, G, "", PT_TEMP, 1, n, s1);
    tensor(p, G2, "", PT_TEMP, 1, n, s0);
    for (int t = 0; dp > 1 && t < NTENSORS; t++)
        if (p->tensors[t].rank == 1)
            p->tensors[t].nsplit[0] = 1, p->tensors[t].split[0][0] = (int8_t)(pipeline ? 1 : 0);
    p->instrs = calloc(10, sizeof *p->instrs);
    p->kernels = calloc(4, sizeof *p->kernels);
    p->nkernels = 4;
    kernel(p, 0, (int[]){H, X, W}, 3, 0, 0);
    hand_over(p, pipeline, H, R, 0, 1, 0, 0);
    kernel(p, 1, (int[]){PART, R}, 2, i1, 0);
    if (dp > 1) {
        PlanInstr *in = instr(p, PI_COLL, 2, (int[]){PART, LOSS}, i1, 0);
        in->coll = (PlanColl){.op = PC_ALL_REDUCE, .naxes = 1, .dim = -1, .dim2 = -1, .bytes = 8};
        in->coll.axes[0] = (int8_t)(pipeline ? 1 : 0);
    } else {
        instr(p, PI_COPY, 2, (int[]){LOSS, PART}, i1, 0);
    }
    kernel(p, 2, (int[]){G, R}, 2, i1, 1);
    hand_over(p, pipeline, G, G2, 1, 0, 1, 1);
    kernel(p, 3, (int[]){W, X, G2}, 3, 0, 3);
    snprintf(src, sizeof src, "#define N %d\n%s", (int)n, KERNELS);
    p->kernel_source = strdup(src);
    p->loss = LOSS;
    p->lr = p->grad_norm = -1;
    return p;
}

static Plan *checked(Plan *p)
{
    char err[512] = "";
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    return p;
}

/* ---- two stages on two ranks ---- */

#define RANK_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(err, n, __VA_ARGS__);                                                         \
            rc = -1;                                                                               \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static int near(double a, double b)
{
    return fabs(a - b) <= 1e-12 * fmax(1, fabs(b));
}

/* This rank's Runtime of p, attached to w; NULL with the reason in err. */
static Runtime *attached(RtWorld *w, const Plan *p, char *err, size_t n)
{
    char msg[512] = "";
    Runtime *rt = rt_open(p, cache, err, n);
    if (rt && rt_attach(rt, w, msg, sizeof msg)) {
        snprintf(err, n, "rank %d: attach: %s", rt_world_rank(w), msg);
        rt_close(rt);
        return NULL;
    }
    return rt;
}

/* x = 1 2 3 4, w = 1: one step, then the checks of the file comment on each rank. */
static int two_stage_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    const Plan *p = arg;
    const double x[4] = {1, 2, 3, 4};
    double got[4], h2 = 0;
    char msg[512] = "";
    int rc = 0, rank = rt_world_rank(w);
    Runtime *rt = attached(w, p, err, n);
    if (!rt)
        return -1;
    RANK_CHECK(!rt_set_input(rt, "x", x, sizeof x, msg, sizeof msg), "rank %d: %s", rank, msg);
    /* each device holds its own stage's tensors only: w on stage 0, r on stage 1 */
    double *wt = rt_tensor_data(rt, W), *r = rt_tensor_data(rt, R);
    RANK_CHECK(!wt == (rank == 1) && !r == (rank == 0), "rank %d: holds w %d, r %d", rank, !!wt,
               !!r);
    for (int i = 0; wt && i < 4; i++)
        wt[i] = 1;
    RANK_CHECK(!rt_step(rt, 1, msg, sizeof msg), "rank %d: step: %s", rank, msg);
    RANK_CHECK(near(rt_scalar(rt, LOSS), 15), "rank %d: loss %g, want 15", rank,
               rt_scalar(rt, LOSS));
    for (int i = 0; i < 4; i++) { /* stage 1 received x w; stage 0 updated w */
        RANK_CHECK(!r || r[i] == x[i], "rank %d: r[%d] = %g", rank, i, r[i]);
        RANK_CHECK(!wt || near(wt[i], 1 - 0.1 * x[i] * x[i]), "rank %d: w[%d] = %g", rank, i,
                   wt[i]);
    }
    RANK_CHECK(!rt_tensor_global(rt, R, got, msg, sizeof msg), "rank %d: %s", rank, msg);
    for (int i = 0; i < 4; i++)
        RANK_CHECK(got[i] == x[i], "rank %d: global r[%d] = %g, want %g", rank, i, got[i], x[i]);
    RANK_CHECK(!rt_tensor_global(rt, W, got, msg, sizeof msg), "rank %d: %s", rank, msg);
    for (int i = 0; i < 4; i++) {
        RANK_CHECK(near(got[i], 1 - 0.1 * x[i] * x[i]), "rank %d: global w[%d] = %g", rank, i,
                   got[i]);
        h2 += x[i] * got[i] * x[i] * got[i];
    }
    RANK_CHECK(!rt_forward(rt, msg, sizeof msg), "rank %d: forward: %s", rank, msg);
    RANK_CHECK(near(rt_scalar(rt, LOSS), h2 / 2), "rank %d: forward loss %g, want %g", rank,
               rt_scalar(rt, LOSS), h2 / 2);
done:
    rt_close(rt);
    return rc;
}

Test(pipeline, each_stage_runs_its_instructions_and_the_loss_reaches_every_rank)
{
    char err[1024] = "";
    Plan *p = checked(model(1, 1));
    cr_assert_eq(plan_stages(p), 2);
    cr_assert_eq(rt_run_threads(2, two_stage_rank, p, err, sizeof err), 0, "%s", err);
    plan_free(p);
}

Test(pipeline, a_plan_with_stages_does_not_run_without_a_mesh)
{
    char err[512] = "";
    Plan *p = checked(model(1, 1));
    Runtime *rt = rt_open(p, cache, err, sizeof err);
    cr_assert_not_null(rt, "%s", err);
    cr_assert_eq(rt_step(rt, 1, err, sizeof err), -1);
    cr_assert(strstr(err, "the plan has 2 pipeline stages") && strstr(err, "no mesh was attached"),
              "%s", err);
    cr_assert_eq(rt_forward(rt, err, sizeof err), -1);
    rt_close(rt);
    plan_free(p);
}

static int run_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    Runtime *rt = attached(w, arg, err, n);
    int rc = rt ? rt_step(rt, 1, err, n) : -1;
    rt_close(rt);
    return rc;
}

/* The comm layer's own check of a recv's size (test_comm.c) is not reached:
 * plan_check (plan_check_comm) refuses the plan, and rt_open with it, so no
 * rank starts a step that would wait. */
Test(pipeline, a_recv_of_another_size_is_refused_before_any_rank_runs)
{
    char err[1024] = "";
    Plan *p = model(1, 1);
    int all = p->ninstrs;
    p->tensors[R].shape[0] = 2; /* stage 0 sends 4 doubles, stage 1 expects 2 */
    p->tensors[R].bytes = 16;
    p->ninstrs = 3; /* k_mul, the send and the recv */
    p->loss = -1;
    cr_assert_eq(plan_check(p, err, sizeof err), -1);
    cr_assert(strstr(err, "instrs[1] (send of 32 bytes f64 to stage 1, tag 0; layer -1, phase fwd) "
                          "on stage 0 (rank 0) and instrs[2]") &&
                  strstr(err, "differ in size: 32 bytes sent, 16 received"),
              "%s", err);
    cr_assert_eq(rt_run_threads(2, run_rank, p, err, sizeof err), -1);
    cr_assert(strstr(err, "differ in size: 32 bytes sent, 16 received"), "%s", err);
    p->ninstrs = all; /* as built, so that plan_free frees it all */
    plan_free(p);
}

/* ---- against one device ---- */

Test(pipeline, two_stages_times_two_replicas_match_one_device)
{
    char err[1024] = "", *text = NULL;
    size_t len = 0;
    Plan *mesh = checked(model(1, 2)), *one = checked(model(0, 1));
    cr_assert_eq(plan_mesh_size(mesh), 4);
    FILE *report = open_memstream(&text, &len);
    int rc = rt_verify(mesh, one, 3, 5, 1e-12, cache, report, err, sizeof err);
    fclose(report);
    cr_assert_eq(rc, 0, "%s%s", err, text);
    cr_assert(strstr(text, "step 3: loss") && strstr(text, "param  w") && strstr(text, "verified"),
              "%s", text);
    free(text);
    plan_free(mesh);
    plan_free(one);
}

/* The runtime numbers ranks by the plan's placement (PlanAxis.stride): with
 * the pipeline axis innermost, ranks 0 and 2 run stage 0 and hold w, ranks
 * 1 and 3 stage 1 (row-major, ranks 0 and 1 would be stage 0), and the step
 * is still the one device's. */
static int placed_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    int rc = 0, rank = rt_world_rank(w);
    Runtime *rt = attached(w, arg, err, n);
    if (!rt)
        return -1;
    RANK_CHECK(!rt_tensor_data(rt, W) == (rank % 2 == 1), "rank %d: holds w: %d", rank,
               rt_tensor_data(rt, W) != NULL);
done:
    rt_close(rt);
    return rc;
}

Test(pipeline, ranks_are_numbered_by_the_placement)
{
    char err[1024] = "", *text = NULL;
    size_t len = 0;
    Plan *mesh = model(1, 2), *one = checked(model(0, 1));
    mesh->axes[0].stride = 1, mesh->axes[1].stride = 2; /* pp innermost */
    checked(mesh);
    cr_assert_eq(rt_run_threads(4, placed_rank, mesh, err, sizeof err), 0, "%s", err);
    FILE *report = open_memstream(&text, &len);
    int rc = rt_verify(mesh, one, 3, 5, 1e-12, cache, report, err, sizeof err);
    fclose(report);
    cr_assert_eq(rc, 0, "%s%s", err, text);
    free(text);
    plan_free(mesh);
    plan_free(one);
}
