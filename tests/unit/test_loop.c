/* test_loop.c: the microbatch loop of a plan (codegen/microbatch_loop.c, plan/expand.c).
 * A tiny GPT-2 compiled with 4 microbatches holds one microbatch's
 * instructions and a schedule table; its JSON round trip keeps them, and the
 * loader expands them into the program (each piece once per entry). The
 * memory of the loop is checked on the program itself: no two tensors whose
 * lives meet in a stage's expanded program share a byte, for one device and
 * for 1F1B, GPipe, ZB-H1 and interleaved pipelines. Then the rules plan_check
 * adds for a loop are shown to refuse a table that skips a microbatch or
 * runs a piece twice, a frame outside its slab, an add into a sum that is not
 * a kernel of two equal tensors, an instruction of every microbatch outside
 * the table's pieces, rows that are not an input's, and more tags than the
 * backends pair. Last, plans expanded from several threads at once (as the
 * ranks of the threads backend open theirs) come out as each does alone. */
#define _XOPEN_SOURCE 700 /* open_memstream */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/support/settings.h"
#include "tests/support/programs.h"

TestSuite(loop, .timeout = 120);

typedef struct Built {
    Ctx *c;
    const Graph *local;
    Plan p;
} Built;

/* The tiny GPT-2 in f32 with 4 microbatches on mesh, with the schedule
 * setting `set` ("" for the sample's 1F1B). */
static void build(Built *b, const char *mesh, const char *set)
{
    const char *src = test_sample("gpt2.tdl", "model gpt2(V = 96, S = 8, D = 32, H = 2, L = 4, "
                                              "B = 16)");
    cr_assert_not_null(src);
    static char text[16384];
    const char *from[3] = {"microbatches = 8", "precision    = bf16", "schedule     = 1f1b"};
    const char *to[3] = {"microbatches = 4", "precision = f32", *set ? set : "schedule = 1f1b"};
    snprintf(text, sizeof text, "%s", src);
    for (int k = 0; k < 3; k++) {
        char *at = strstr(text, from[k]), rest[16384];
        cr_assert_not_null(at, "%s", from[k]);
        snprintf(rest, sizeof rest, "%s", at + strlen(from[k]));
        snprintf(at, sizeof text - (size_t)(at - text), "%s%s", to[k], rest);
    }
    b->c = ctx_new(stderr);
    Graph *g = fe_compile(b->c, "t.tdl", text, strlen(text), &(FeOptions){.mesh = mesh});
    cr_assert_not_null(g);
    for (const Pass *p = pass_table; p->name; p++)
        cr_assert_eq(p->run(b->c, g, ts_settings(b->c, g, 0)), 0, "%s", p->name);
    Kernel **kernels;
    cr_assert_eq(cg_build_plan_local(b->c, g, &ts_settings(b->c, g, 0)->train, 0, &b->p, &kernels, &b->local), 0);
    cr_assert_gt(b->p.nsched, 0, "a plan of 4 microbatches has a schedule table");
    cr_assert_eq(b->p.microbatches, 4);
}


/* A stretch of the program over which a tensor holds one value. */
typedef struct Seg {
    int t, stage, first, last;
} Seg;

/* The program q that loop plan p makes: no two temporaries share a byte
 * while both hold a value. A temporary that one piece makes and reads for
 * each microbatch (every instruction touching it runs for every microbatch,
 * all in one piece) holds a value within each run of that piece; one that
 * only instructions of every microbatch touch, within that microbatch's
 * runs; any other from the first to the last instruction that touches it.
 * Tensors holding one value (the same IR value, or the same bytes: a
 * reshape) may share. Returns the pairs of stretches that meet in time. */
static long no_overlap(const Plan *p, const Plan *q)
{
    PlanItem *items;
    int nitems;
    char err[256];
    cr_assert_eq(plan_expand_order(p, &items, &nitems, err, sizeof err), 0, "%s", err);
    cr_assert_eq(nitems, q->ninstrs);
    int *piece = malloc(sizeof(int) * (size_t)p->ntensors);
    char *transient = malloc((size_t)p->ntensors), *own = malloc((size_t)p->ntensors);
    for (int t = 0; t < p->ntensors; t++)
        piece[t] = 0, transient[t] = own[t] = p->tensors[t].role == PT_TEMP;
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        for (int j = 0; j < plan_instr_ntensors(in); j++) {
            int t = plan_instr_tensor(in, j);
            if (in->when != PW_EVERY || in->piece <= 0 || (piece[t] && piece[t] != in->piece))
                transient[t] = 0;
            if (in->when != PW_EVERY || in->piece <= 0)
                own[t] = 0;
            piece[t] = in->piece;
        }
    }
    /* stretches: (tensor of q, entry) for transients, (tensor of q) for the rest */
    int cap = 1024, n = 0;
    Seg *seg = malloc(sizeof(Seg) * (size_t)cap);
    int *at = malloc(sizeof(int) * (size_t)q->ntensors); /* q tensor: its open stretch (rest) */
    for (int t = 0; t < q->ntensors; t++)
        at[t] = -1;
    for (int i = 0; i < nitems; i++) {
        const PlanInstr *in = &q->instrs[i], *src = &p->instrs[items[i].src];
        for (int j = 0; j < plan_instr_ntensors(in); j++) {
            int t = plan_instr_tensor(in, j), tmpl = plan_instr_tensor(src, j);
            if (q->tensors[t].role != PT_TEMP || q->tensors[t].frame == -1)
                continue;
            int k = at[t];
            if (k < 0 || (transient[tmpl] && items[seg[k].first].entry != items[i].entry) ||
                (own[tmpl] && items[seg[k].first].mb != items[i].mb)) {
                if (n == cap)
                    seg = realloc(seg, sizeof(Seg) * (size_t)(cap *= 2));
                seg[n] = (Seg){t, in->stage, i, i};
                at[t] = k = n++;
            }
            seg[k].last = i;
        }
    }
    long pairs = 0;
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            const PlanTensor *x = &q->tensors[seg[a].t], *y = &q->tensors[seg[b].t];
            if (seg[a].stage != seg[b].stage || seg[a].t == seg[b].t || seg[a].last < seg[b].first ||
                seg[b].last < seg[a].first || (x->value >= 0 && x->value == y->value) ||
                (x->offset == y->offset && x->bytes == y->bytes))
                continue;
            pairs++;
            cr_assert(x->offset + x->bytes <= y->offset || y->offset + y->bytes <= x->offset,
                      "stage %d: tensors %d [%lu, %lu) and %d [%lu, %lu) hold values at once "
                      "(instructions %d-%d and %d-%d) and overlap",
                      seg[a].stage, seg[a].t, (unsigned long)x->offset,
                      (unsigned long)(x->offset + x->bytes), seg[b].t, (unsigned long)y->offset,
                      (unsigned long)(y->offset + y->bytes), seg[a].first, seg[a].last,
                      seg[b].first, seg[b].last);
        }
    free(items), free(piece), free(transient), free(own), free(seg), free(at);
    return pairs;
}

/* p through JSON and the loader: the program it makes, checked. */
static Plan *loaded(const Plan *p)
{
    char err[512];
    char *text = plan_to_json((Plan *)p, err, sizeof err);
    cr_assert_not_null(text, "%s", err);
    cr_assert(strstr(text, "\"sched\"") && strstr(text, "\"frames\""));
    Plan *q = plan_parse("mem", text, strlen(text), err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    free(text);
    return q;
}

/* The program has each piece once per table entry: the prologue and
 * epilogue once, an instruction of every microbatch k times, one that runs
 * with the first or last microbatch once. */
static void program_size(const Plan *p, const Plan *q)
{
    long want = 0;
    for (int i = 0; i < p->ninstrs; i++)
        want += p->instrs[i].piece > 0 && p->instrs[i].when == PW_EVERY ? p->microbatches : 1;
    cr_assert_eq(q->ninstrs, want);
    cr_assert_eq(q->nsched, 0);
    cr_assert_eq(q->ntensors >= p->ntensors, 1);
}

static void loads_and_fits(const char *mesh, const char *set)
{
    Built b;
    build(&b, mesh, set);
    Plan *q = loaded(&b.p);
    program_size(&b.p, q);
    cr_assert_gt(no_overlap(&b.p, q), 100, "%s %s: few tensors alive together", mesh, set);
    plan_free(q);
    ctx_free(b.c);
}

Test(loop, one_device_loads_and_no_live_tensors_overlap) { loads_and_fits("1", ""); }
Test(loop, pipeline_1f1b) { loads_and_fits("1x1x2", ""); }
Test(loop, pipeline_gpipe) { loads_and_fits("1x1x2", "schedule = gpipe"); }
Test(loop, pipeline_zb) { loads_and_fits("1x1x4", "schedule = zb"); }
Test(loop, pipeline_interleaved)
{
    loads_and_fits("2x1x2", "schedule = interleaved\n    virtual_stages = 2");
}

/* ---- what plan_check refuses in a loop plan ---- */

static void refused(Plan *p, const char *want)
{
    char err[512] = "";
    cr_assert_eq(plan_check(p, err, sizeof err), -1, "want \"%s\": the plan passed", want);
    cr_assert(strstr(err, want), "want \"%s\", got \"%s\"", want, err);
}

static int find(const Plan *p, int (*pred)(const PlanInstr *))
{
    for (int i = 0; i < p->ninstrs; i++)
        if (pred(&p->instrs[i]))
            return i;
    cr_assert_fail("no such instruction");
    return -1;
}

static int is_acc(const PlanInstr *in) { return in->acc; }
static int is_acc_gemm(const PlanInstr *in) { return in->acc && in->kind == PI_GEMM; }
static int is_rows(const PlanInstr *in) { return in->rows; }
static int is_every(const PlanInstr *in) { return in->when == PW_EVERY && in->piece > 0; }
static int is_send(const PlanInstr *in)
{
    return in->kind == PI_COLL && in->coll.op == PC_SEND && in->when == PW_EVERY;
}

Test(loop, a_table_that_skips_or_repeats_a_microbatch_is_refused)
{
    Built b;
    build(&b, "1x1x2", "");
    char err[512];
    cr_assert_eq(plan_check(&b.p, err, sizeof err), 0, "%s", err);
    b.p.sched[0].mb = (b.p.sched[0].mb + 1) % 4; /* one piece runs for one microbatch twice */
    refused(&b.p, "does not run once for each of the 4 microbatches");
    b.p.sched[0].mb = 7;
    refused(&b.p, "sched[0]: stage 0, piece");
    ctx_free(b.c);
}

Test(loop, a_frame_outside_its_slab_is_refused)
{
    Built b;
    build(&b, "1x1x2", ""); /* one stage needs no frames: its microbatches run in turn */
    cr_assert_gt(b.p.nframes, 0);
    b.p.frames[0].base[3] = plan_stage_slab(&b.p, 0);
    refused(&b.p, "frames[0].base[3]");
    ctx_free(b.c);
}

Test(loop, misplaced_instructions_are_refused)
{
    Built b;
    build(&b, "1x1x2", "");
    int a = find(&b.p, is_acc);
    b.p.instrs[a].when = PW_LAST;
    refused(&b.p, "acc: a microbatch_sum adds one tensor into another of its size");
    b.p.instrs[a].when = PW_EVERY;
    /* a weight gradient's GEMM that adds into its sum: beta 1, every microbatch */
    int g = find(&b.p, is_acc_gemm);
    b.p.instrs[g].gemm.beta = 0;
    refused(&b.p, "a product into its C (a gemm, beta 1)");
    b.p.instrs[g].gemm.beta = 1;
    b.p.instrs[g].when = PW_LAST;
    refused(&b.p, "a product into its C (a gemm, beta 1)");
    b.p.instrs[g].when = PW_EVERY;
    int e = find(&b.p, is_every);
    b.p.instrs[e].piece = 0; /* a microbatch's instruction in the prologue */
    refused(&b.p, "a per-microbatch instruction outside one");
    b.p.instrs[e].piece = 12345;
    refused(&b.p, "not a piece of its stage's table");
    ctx_free(b.c);
}

Test(loop, rows_of_no_input_and_too_many_tags_are_refused)
{
    Built b;
    build(&b, "1x1x2", "");
    int r = find(&b.p, is_rows), keep = b.p.instrs[r].args[1];
    b.p.instrs[r].args[1] = b.p.instrs[r].args[0];
    refused(&b.p, "rows: a copy of one microbatch's rows of an input");
    b.p.instrs[r].args[1] = keep;
    int s = find(&b.p, is_send);
    b.p.instrs[s].coll.tag = b.p.ntags;
    refused(&b.p, "tag: beyond the tags of one microbatch");
    b.p.instrs[s].coll.tag = 0;
    b.p.ntags = 32769;
    refused(&b.p, "tags per microbatch (at most 32768)");
    ctx_free(b.c);
}

/* Ranks open their plans at once (each rank thread of the threads backend,
 * and --verify's): expanding two different loop plans from four threads
 * gives each the order it has alone, every time. */
typedef struct Racer {
    const Plan *p;
    const PlanItem *want;
    int nwant, bad;
} Racer;

static void *race(void *arg)
{
    Racer *r = arg;
    for (int k = 0; k < 100; k++) {
        PlanItem *items;
        int n;
        char err[256];
        if (plan_expand_order(r->p, &items, &n, err, sizeof err) || n != r->nwant ||
            memcmp(items, r->want, sizeof(PlanItem) * (size_t)n))
            r->bad++;
        free(items);
    }
    return NULL;
}

Test(loop, plans_expand_the_same_from_threads_at_once)
{
    Built b[2];
    build(&b[0], "1x1x2", "");
    build(&b[1], "1x1x4", "schedule = zb");
    PlanItem *want[2];
    int nwant[2];
    char err[256];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(plan_expand_order(&b[i].p, &want[i], &nwant[i], err, sizeof err), 0, "%s", err);
    Racer r[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        r[t] = (Racer){&b[t % 2].p, want[t % 2], nwant[t % 2], 0};
        cr_assert_eq(pthread_create(&th[t], NULL, race, &r[t]), 0);
    }
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 4; t++)
        cr_expect_eq(r[t].bad, 0, "thread %d: %d of 100 expansions differ from the plan's own", t,
                     r[t].bad);
    for (int i = 0; i < 2; i++)
        free(want[i]), ctx_free(b[i].c);
}
