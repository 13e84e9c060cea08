/* test_match.c: the communication check of every plan (plan/comm_match.c,
 * plan_check_comm; codegen's cg_check_comm reports it at the op's location).
 * Real plans are compiled here from samples/gpt2.tdl (2 layers, D = 32) on
 * the meshes 2x2, 2x1x2 and 2x2x2 (dp x tp x pp) and pass. Then a 2x1x2 plan
 * is mutated in memory: a send dropped, a recv dropped, two sends of one
 * channel swapped, a send moved after the recv that waits for it, a recv's
 * size and its dtype changed, and collectives over the pipeline axis added
 * (they pass), one dropped, changed in size, dtype or kind, or placed so that
 * it waits on a recv. Each is refused with a message that names the
 * instruction, its stage and ranks, and what differs, and the compiler's
 * error points at the TDL line of the op. Last, ./tccrun refuses such a plan
 * when it loads it, at once and with the same message. */
#define _XOPEN_SOURCE 700 /* nftw, open_memstream */
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/support/settings.h"
#include "tests/support/command.h"
#include "tests/support/programs.h"
#include "tests/support/tmpdir.h"

static char dir[64];

static void make_dir(void)
{
    tmpdir_make(dir, "match");
}

static void remove_dir(void)
{
    tmpdir_remove(dir);
}

TestSuite(match, .init = make_dir, .fini = remove_dir, .timeout = 120);

/* ---- building real plans ---- */

typedef struct Built {
    Ctx *c;
    const Graph *local;
    Plan p;
    char *diag; /* what the compiler reported */
    size_t len;
    FILE *out;
} Built;

/* The tiny GPT-2 with `microbatches` on mesh (dp x tp x pp), compiled with
 * every microbatch in the graph (a plain program: its instructions are what
 * the devices run), or with loop, one microbatch's pieces and a schedule
 * table (plan/expand.c makes the program). */
static void build_as(Built *b, const char *mesh, int microbatches, int loop)
{
    const char *src = test_sample("gpt2.tdl", "model gpt2(V = 96, S = 8, D = 32, H = 2, L = 2, "
                                              "B = 32)");
    cr_assert_not_null(src);
    static char text[65536];
    const char *mb = strstr(src, "microbatches = 8");
    cr_assert_not_null(mb);
    snprintf(text, sizeof text, "%.*smicrobatches = %d%s", (int)(mb - src), src, microbatches,
             mb + strlen("microbatches = 8"));
    memset(b, 0, sizeof *b);
    b->out = open_memstream(&b->diag, &b->len);
    b->c = ctx_new(b->out);
    Graph *g = fe_compile(b->c, "t.tdl", text, strlen(text), &(FeOptions){.mesh = mesh});
    cr_assert_not_null(g);
    for (const Pass *p = pass_table; p->name; p++)
        cr_assert_eq(p->run(b->c, g, ts_settings(b->c, g, !loop)), 0, "%s", p->name);
    Kernel **kernels;
    int rc = cg_build_plan_local(b->c, g, &ts_settings(b->c, g, 0)->train, 0, &b->p, &kernels, &b->local);
    fflush(b->out);
    cr_assert_eq(rc, 0, "%s", b->diag);
}

static void build(Built *b, const char *mesh, int microbatches)
{
    build_as(b, mesh, microbatches, 0);
}

static void done(Built *b)
{
    ctx_free(b->c);
    fclose(b->out);
    free(b->diag);
}

/* The compiler's check of the (mutated) plan: -1 expected, its report returned. */
static const char *refused(Built *b)
{
    fflush(b->out);
    size_t before = b->len;
    cr_assert_eq(cg_check_comm(b->c, b->local, &b->p), -1);
    fflush(b->out);
    return b->diag + before;
}

/* The report names the op by its place in t.tdl, the message, and the note. */
static void names_the_op(const char *report, const char *what)
{
    cr_assert(strncmp(report, "t.tdl:", 6) == 0, "%s", report);
    cr_assert(strstr(report, ": error: the stages' programs do not match: "), "%s", report);
    cr_assert(strstr(report, what), "%s", report);
    cr_assert(strstr(report, "note: instrs[") && strstr(report, "] comes from the op '"), "%s",
              report);
}

/* Instruction index of the k-th (0-based) send or recv of `stage` (phase < 0: any). */
static int p2p(const Plan *p, PlanCollKind op, int stage, int phase, int k)
{
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        if (in->kind == PI_COLL && in->coll.op == op && in->stage == stage &&
            (phase < 0 || in->phase == phase) && k-- == 0)
            return i;
    }
    cr_assert_fail("no %s number %d on stage %d", plan_coll_name(op), k, stage);
    return -1;
}

/* The last send or recv of `stage` in `phase`. */
static int last_p2p(const Plan *p, PlanCollKind op, int stage, int phase)
{
    int last = -1;
    for (int k = 0; k < p->ninstrs; k++)
        if (p->instrs[k].kind == PI_COLL && p->instrs[k].coll.op == op &&
            p->instrs[k].stage == stage && p->instrs[k].phase == phase)
            last = k;
    cr_assert_geq(last, 0, "no %s on stage %d", plan_coll_name(op), stage);
    return last;
}

/* Move instruction `from` to index `to` (the others keep their order). */
static void move(Plan *p, int from, int to)
{
    PlanInstr in = p->instrs[from];
    if (from < to)
        memmove(&p->instrs[from], &p->instrs[from + 1], sizeof in * (size_t)(to - from));
    else
        memmove(&p->instrs[to + 1], &p->instrs[to], sizeof in * (size_t)(from - to));
    p->instrs[to] = in;
}

static void drop(Plan *p, int i)
{
    move(p, i, p->ninstrs - 1);
    p->ninstrs--;
}

/* ---- correct plans ---- */

static void passes(const char *mesh, int microbatches, int min_p2p)
{
    Built b;
    char err[1024];
    build(&b, mesh, microbatches);
    int n = 0;
    for (int i = 0; i < b.p.ninstrs; i++)
        n += b.p.instrs[i].kind == PI_COLL &&
             (b.p.instrs[i].coll.op == PC_SEND || b.p.instrs[i].coll.op == PC_RECV);
    cr_assert_geq(n, min_p2p, "%s: %d sends and recvs", mesh, n);
    cr_assert_eq(plan_check_comm(&b.p, NULL, err, sizeof err), 0, "%s: %s", mesh, err);
    cr_assert_eq(plan_check(&b.p, err, sizeof err), 0, "%s: %s", mesh, err);
    cr_assert_eq(b.len, 0, "%s", b.diag);
    done(&b);
}

Test(match, correct_plans_pass_on_2x2_2x1x2_and_2x2x2)
{
    passes("2x2", 4, 0);
    passes("2x1x2", 4, 20);
    passes("2x2x2", 4, 20);
    passes("2x1x2", 1, 8);
}

/* Stage 0's k-th forward send dropped from b's plan: refused at the recv
 * that waits for it, named by its op. */
static void send_dropped(Built *b, int k)
{
    int s = p2p(&b->p, PC_SEND, 0, 0, k), tag = b->p.instrs[s].coll.tag;
    char want[128];
    snprintf(want, sizeof want,
             "on stage 1 (ranks 2, 3) has no send: stage 0 sends nothing with "
             "tag %d to stage 1",
             tag);
    drop(&b->p, s);
    names_the_op(refused(b), want);
    done(b);
}

/* A loop plan is checked as the program its table makes: correct, it
 * passes; a send of every microbatch dropped from the piece, it is refused
 * at the op whose value the recv waits for, in microbatch 0's program. */
Test(match, a_loop_plan_is_checked_as_the_program_it_makes)
{
    Built b;
    char err[1024];
    build_as(&b, "2x1x2", 4, 1);
    cr_assert_gt(b.p.nsched, 0);
    cr_assert_eq(cg_check_comm(b.c, b.local, &b.p), 0);
    cr_assert_eq(plan_check(&b.p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(b.p.instrs[p2p(&b.p, PC_SEND, 0, 0, 0)].when, PW_EVERY);
    send_dropped(&b, 0);
}

/* ---- mutated sends and recvs (2x1x2, dp innermost by traffic: stage 0 on ranks 0 and 1, stage 1 on 2 and 3) ---- */

Test(match, a_dropped_send_is_refused_at_its_recv)
{
    Built b;
    build(&b, "2x1x2", 4);
    send_dropped(&b, 1);
}

Test(match, a_dropped_recv_is_refused_at_its_send)
{
    Built b;
    build(&b, "2x1x2", 4);
    int r = p2p(&b.p, PC_RECV, 1, 0, 2), tag = b.p.instrs[r].coll.tag;
    char want[128];
    snprintf(want, sizeof want,
             "on stage 0 (ranks 0, 1) has no recv: stage 1 receives nothing "
             "with tag %d from stage 0",
             tag);
    drop(&b.p, r);
    names_the_op(refused(&b), want);
    done(&b);
}

Test(match, two_sends_swapped_on_a_channel_are_refused)
{
    Built b;
    build(&b, "2x1x2", 4);
    int a = p2p(&b.p, PC_SEND, 0, 0, 0), c = p2p(&b.p, PC_SEND, 0, 0, 1);
    PlanInstr t = b.p.instrs[a];
    b.p.instrs[a] = b.p.instrs[c];
    b.p.instrs[c] = t;
    const char *r = refused(&b);
    names_the_op(r, "messages out of order: the 1st message from stage 0 to stage 1 is instrs[");
    cr_assert(strstr(r, "but the 1st recv there is instrs["), "%s", r);
    done(&b);
}

Test(match, a_send_moved_after_the_recv_that_waits_for_it_deadlocks)
{
    Built b;
    build(&b, "2x1x2", 1); /* stage 0: the activations out, then their gradient in */
    int s = last_p2p(&b.p, PC_SEND, 0, 0), r = p2p(&b.p, PC_RECV, 0, 1, 0);
    cr_assert_lt(s, r);
    move(&b.p, s, r); /* just after the recv, still before the next send to stage 1 */
    const char *rep = refused(&b);
    names_the_op(rep, "deadlock: instrs[");
    cr_assert(strstr(rep, "on stage 0 (ranks 0, 1) waits for stage 1; instrs[") &&
                  strstr(rep, "on stage 1 (ranks 2, 3) waits for stage 0"),
              "%s", rep);
    done(&b);
}

Test(match, a_recv_of_another_size_is_refused)
{
    Built b;
    build(&b, "2x1x2", 4);
    PlanTensor *t = &b.p.tensors[b.p.instrs[p2p(&b.p, PC_RECV, 1, 0, 1)].args[0]];
    uint64_t bytes = t->bytes;
    char want[128];
    t->shape[0] /= 2, t->bytes /= 2;
    snprintf(want, sizeof want, "differ in size: %llu bytes sent, %llu received",
             (unsigned long long)bytes, (unsigned long long)bytes / 2);
    names_the_op(refused(&b), want);
    done(&b);
}

Test(match, a_recv_of_another_dtype_is_refused)
{
    Built b;
    build(&b, "2x1x2", 4);
    PlanTensor *t = &b.p.tensors[b.p.instrs[p2p(&b.p, PC_RECV, 1, 0, 1)].args[0]];
    PlanDType was = t->dtype, now = plan_dtype_size(was) == 2 ? PD_F16 : PD_I32;
    cr_assert_eq(plan_dtype_size(now), plan_dtype_size(was)); /* the same bytes */
    t->dtype = now;
    char want[96];
    snprintf(want, sizeof want, "differ in dtype: %s sent, %s received", plan_dtype_name(was),
             plan_dtype_name(now));
    names_the_op(refused(&b), want);
    done(&b);
}

/* ---- collectives over the pipeline axis ---- */

/* Put in before instruction `at` (at most ninstrs; the array has room). */
static void insert(Plan *p, int at, PlanInstr in)
{
    memmove(&p->instrs[at + 1], &p->instrs[at], sizeof in * (size_t)(p->ninstrs - at));
    p->instrs[at] = in;
    p->ninstrs++;
}

/* One all_reduce over (dp, pp) of 16 floats on each stage, stage 0's before
 * instruction at0 and stage 1's before at1 (indices into the plan as built);
 * the new tensors and instructions in the compilation's arena. */
static void add_collectives(Built *b, int at0, int at1)
{
    Plan *p = &b->p;
    int nt = p->ntensors, n = p->ninstrs;
    PlanTensor *ts = arena_alloc(b->c->arena, sizeof *ts * (size_t)(nt + 4));
    PlanInstr *is = arena_alloc(b->c->arena, sizeof *is * (size_t)(n + 2));
    int *args = arena_alloc(b->c->arena, sizeof(int) * 4);
    memcpy(ts, p->tensors, sizeof *ts * (size_t)nt);
    memcpy(is, p->instrs, sizeof *is * (size_t)n);
    for (int k = 0; k < 4; k++) {
        ts[nt + k] = (PlanTensor){.name = "",
                                  .dtype = PD_F32,
                                  .rank = 1,
                                  .shape = {16},
                                  .bytes = 64,
                                  .role = PT_TEMP,
                                  .layer = -1,
                                  .stage = k / 2};
        args[k] = nt + k;
    }
    p->tensors = ts, p->ntensors = nt + 4, p->instrs = is;
    PlanInstr in[2];
    for (int s = 0; s < 2; s++) {
        in[s] = (PlanInstr){.kind = PI_COLL,
                            .nargs = 2,
                            .args = args + 2 * s,
                            .phase = PH_OPT,
                            .layer = -1,
                            .stage = s,
                            .op = p->instrs[0].op};
        in[s].coll = (PlanColl){
            .op = PC_ALL_REDUCE, .naxes = 2, .axes = {0, 2}, .dim = -1, .dim2 = -1, .bytes = 64};
    }
    if (at0 >= at1) /* the later place first: the earlier one stays where it was */
        insert(p, at0, in[0]), insert(p, at1, in[1]);
    else
        insert(p, at1, in[1]), insert(p, at0, in[0]);
}

/* The index of the collective added on `stage`. */
static int added(const Plan *p, int stage)
{
    for (int i = 0; i < p->ninstrs; i++)
        if (p->instrs[i].kind == PI_COLL && p->instrs[i].coll.naxes == 2 &&
            p->instrs[i].stage == stage)
            return i;
    cr_assert_fail("no collective added on stage %d", stage);
    return -1;
}

/* The plan with the two collectives last on their stages. */
static void with_collectives(Built *b)
{
    build(b, "2x1x2", 4);
    add_collectives(b, b->p.ninstrs, b->p.ninstrs);
}

Test(match, collectives_over_the_stages_pass_when_they_match)
{
    Built b;
    char err[1024];
    with_collectives(&b);
    cr_assert_eq(plan_check_comm(&b.p, NULL, err, sizeof err), 0, "%s", err);
    done(&b);
}

Test(match, a_dropped_collective_is_refused)
{
    Built b;
    with_collectives(&b);
    drop(&b.p, added(&b.p, 1));
    names_the_op(refused(&b), "(all_reduce of 64 bytes f32 over dp,pp; layer -1, phase opt) on "
                              "stage 0 (ranks 0, 1) has no partner: stage 1 issues no collective "
                              "over dp,pp");
    done(&b);
}

Test(match, a_collective_of_another_size_dtype_or_kind_is_refused)
{
    Built b;
    with_collectives(&b);
    PlanInstr *c = &b.p.instrs[added(&b.p, 1)];
    PlanTensor *t = &b.p.tensors[c->args[0]];
    t->shape[0] = 8, t->bytes = 32;
    names_the_op(refused(&b), "the 1st collective over dp,pp of each, differ in size (input 0: "
                              "64 bytes, 32)");
    t->shape[0] = 16, t->bytes = 64;
    t->dtype = PD_I32;
    names_the_op(refused(&b), "differ in dtype (f32, i32)");
    t->dtype = PD_F32;
    c->coll.op = PC_ALL_REDUCE_MAX;
    names_the_op(refused(&b), "differ in kind (all_reduce, all_reduce_max)");
    done(&b);
}

Test(match, a_collective_that_waits_on_a_recv_deadlocks)
{
    Built b;
    build(&b, "2x1x2", 4);
    /* stage 1's before its first recv from stage 0; stage 0's after its last recv */
    int r1 = p2p(&b.p, PC_RECV, 1, -1, 0), r0 = b.p.ninstrs;
    add_collectives(&b, r0, r1);
    const char *rep = refused(&b);
    names_the_op(rep, "deadlock: instrs[");
    cr_assert(strstr(rep, "all_reduce of 64 bytes f32 over dp,pp") && strstr(rep, "(recv of "),
              "%s", rep);
    done(&b);
}

/* ---- tccrun loads the plan ---- */

static int tccrun(const char *args, char *out, size_t size)
{
    char cmd[512];
    cr_assert_eq(access("./tccrun", X_OK), 0, "./tccrun is not built");
    snprintf(cmd, sizeof cmd, "timeout 60 ./tccrun %s 2>&1", args);
    return run_command(cmd, out, size);
}

Test(match, tccrun_refuses_a_mutated_plan_when_it_loads_it)
{
    Built b;
    char err[1024], path[128], out[4096];
    build(&b, "2x1x2", 1);
    snprintf(path, sizeof path, "%s/plan.json", dir);
    move(&b.p, last_p2p(&b.p, PC_SEND, 0, 0), p2p(&b.p, PC_RECV, 0, 1, 0));
    cr_assert_eq(plan_write(path, &b.p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tccrun(dir, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "/plan.json: deadlock: instrs[") &&
                  strchr(out, '\n') == strrchr(out, '\n'),
              "%s", out);
    done(&b);
    build(&b, "2x1x2", 4);
    drop(&b.p, p2p(&b.p, PC_SEND, 0, 0, 2));
    cr_assert_eq(plan_write(path, &b.p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tccrun(dir, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "has no send: stage 0 sends nothing with tag"), "%s", out);
    done(&b);
}
