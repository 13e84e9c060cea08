/* tcc.c: the driver. Reads the command line and a TDL (or IR) file, runs the
 * pass pipeline -- lowering, then the verifier after every pass -- and writes
 * the IR where asked. Key idea: the pipeline is one table; --dump-after names
 * any entry of it, and --from-ir starts after lowering. */
#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "runtime/runtime.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>

typedef struct Options {
    const char *input;
    const char *from_ir;
    const char *out;
    const char *emit;       /* "ir", "plan", "c", "cuda", ... or NULL */
    const char *dump_after; /* a pass name, "all" or NULL */
    const char *stop_after; /* a pass name or NULL */
    int print_commands;
    int zero;               /* --zero=N, -1 when absent */
    int sequence_parallel;  /* --sequence-parallel */
    const char *roles[8];   /* --role AXIS=ROLE */
    int nroles;
    const char *schedule;   /* --schedule=NAME: the train setting schedule */
    int verify;             /* --verify[=STEPS]: steps to compare, 0 when absent */
    double verify_tol;      /* --verify-tol=X, 0: by dtype */
} Options;

/* The pipeline: lowering and the verifier first, then the graph passes. */
typedef struct Stage {
    const char *name;
    const char *summary;
} Stage;

static const Stage front_stages[] = {
    {"lower", "TDL -> graph IR: parse, check, evaluate shapes, expand blocks and repeats"},
    {"parse-ir", "read a printed graph IR (--from-ir) instead of lowering TDL"},
    {"verify", "check every IR invariant (runs again after each pass)"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tcc FILE.tdl [options]\n"
            "       tcc --from-ir FILE.tir [options]\n"
            "options:\n"
            "  --mesh 8x4x2          bind mesh axis sizes in declaration order\n"
            "  --mesh dp=8,tp=4      bind mesh axis sizes by name\n"
            "  -D NAME=VALUE         override an integer model parameter\n"
            "  --zero=N              ZeRO level 0-3 over the data axes (train setting zero)\n"
            "  --sequence-parallel   split norms and elementwise ops on the sequence over\n"
            "                        the tensor axis (train setting sequence_parallel)\n"
            "  --role AXIS=ROLE      give a mesh axis another role (data, fsdp, tensor, ...)\n"
            "  --verify[=N]          run N steps (3) on the mesh (threads) and on one device,\n"
            "                        print per parameter the largest relative difference,\n"
            "                        fail above --verify-tol (1e-9 for f64, 1e-3 for f32)\n"
            "  --emit=ir             print the final graph IR (to -o FILE or stdout)\n"
            "  --emit=plan -o DIR    write the plan of one training step to DIR/plan.json\n"
            "  --emit=c              print the C source of the plan's kernels\n"
            "  --emit=cuda           print the CUDA C source of the plan's kernels (for NVRTC;\n"
            "                        tccnvrtc compiles and checks it)\n"
            "  --emit=schedule       print the pipeline schedule, each stage's order of pieces\n"
            "  --emit=trace -o F     write the schedule as a Chrome trace (Perfetto), unit costs\n"
            "  --schedule=NAME       gpipe, 1f1b, interleaved or zb (train setting schedule)\n"
            "  --emit=memory         print the bytes one device holds: parameters, gradients,\n"
            "                        optimizer state, and the plan's slab\n"
            "  --dump-after=PASS     print the IR after PASS ('all': after every pass)\n"
            "  --stop-after=PASS     run the pipeline up to PASS only (e.g. lower: the forward IR)\n"
            "  --from-ir FILE.tir    start from a printed IR instead of TDL\n"
            "  -o FILE               write the output to FILE; without --emit, build an\n"
            "                        executable that trains the model (NAME --help)\n"
            "  --print-commands      show the commands that build the executable\n"
            "  -v                    report each pass, its time and the op count\n"
            "  --help                show this help\n"
            "  --version             show the version\n"
            "passes:\n");
    for (size_t i = 0; i < sizeof front_stages / sizeof front_stages[0]; i++)
        fprintf(f, "  %-20s  %s\n", front_stages[i].name, front_stages[i].summary);
    for (const Pass *p = pass_table; p->name; p++)
        fprintf(f, "  %-20s  %s\n", p->name, p->summary);
}

static int fail(const char *fmt, const char *arg)
{
    fprintf(stderr, "tcc: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\ntcc: run 'tcc --help' for the options\n");
    return -1;
}

static int add_define(Ctx *c, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return fail("-D expects NAME=VALUE, got '%s'", arg);
    char *end;
    errno = 0;
    long long v = strtoll(eq + 1, &end, 10);
    if (errno || *end || end == eq + 1)
        return fail("-D %s: the value must be an integer", arg);
    const char *name = intern_n(c->strings, arg, (size_t)(eq - arg));
    for (int i = 0; i < c->defines.len; i++)
        if (c->defines.data[i].name == name)
            return fail("-D %s: given twice", arg);
    Define d = {name, v, 0};
    VEC_PUSH(c->arena, c->defines, d);
    return 0;
}

/* Value of "--opt=V" or "--opt V"; advances *i for the second form. */
static const char *opt_value(int argc, char **argv, int *i, const char *opt)
{
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != 0)
        return NULL;
    if (*i + 1 >= argc) {
        fail("%s needs a value", opt);
        exit(1);
    }
    return argv[++*i];
}

static int parse_args(Ctx *c, Options *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--version")) {
            printf("tcc %s\n", TCC_VERSION);
            exit(0);
        } else if (!strcmp(a, "--print-commands")) {
            o->print_commands = 1;
        } else if (!strcmp(a, "-v")) {
            c->verbose = 1;
        } else if ((v = opt_value(argc, argv, &i, "--mesh"))) {
            c->mesh_spec = v;
        } else if ((v = opt_value(argc, argv, &i, "--zero"))) {
            if (strlen(v) != 1 || v[0] < '0' || v[0] > '3')
                return fail("--zero=%s: expected 0, 1, 2 or 3", v);
            o->zero = v[0] - '0';
        } else if (!strcmp(a, "--verify")) {
            o->verify = 3;
        } else if (!strncmp(a, "--verify=", 9)) {
            o->verify = atoi(a + 9);
            if (o->verify < 1 || o->verify > 1000)
                return fail("--verify=%s: expected a step count in [1, 1000]", a + 9);
        } else if ((v = opt_value(argc, argv, &i, "--verify-tol"))) {
            o->verify_tol = strtod(v, NULL);
            if (!(o->verify_tol > 0))
                return fail("--verify-tol=%s: expected a positive number", v);
        } else if ((v = opt_value(argc, argv, &i, "--schedule"))) {
            o->schedule = v;
        } else if (!strcmp(a, "--sequence-parallel")) {
            o->sequence_parallel = 1;
        } else if ((v = opt_value(argc, argv, &i, "--role"))) {
            if (o->nroles >= 8)
                return fail("%s", "at most 8 --role options");
            o->roles[o->nroles++] = v;
        } else if ((v = opt_value(argc, argv, &i, "--emit"))) {
            if (strcmp(v, "ir") && strcmp(v, "plan") && strcmp(v, "c") && strcmp(v, "cuda") &&
                strcmp(v, "memory") && strcmp(v, "schedule") && strcmp(v, "trace"))
                return fail("--emit=%s: expected ir, plan, c, cuda, memory, schedule or trace", v);
            o->emit = v;
        } else if ((v = opt_value(argc, argv, &i, "--dump-after"))) {
            o->dump_after = v;
        } else if ((v = opt_value(argc, argv, &i, "--stop-after"))) {
            o->stop_after = v;
        } else if ((v = opt_value(argc, argv, &i, "--from-ir"))) {
            o->from_ir = v;
        } else if ((v = opt_value(argc, argv, &i, "-o"))) {
            o->out = v;
        } else if (!strcmp(a, "-D") || !strncmp(a, "-D", 2)) {
            const char *d = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : "");
            if (add_define(c, d) != 0)
                return -1;
        } else if (a[0] == '-' && a[1]) {
            return fail("unknown option '%s'", a);
        } else if (o->input) {
            return fail("more than one input file ('%s')", a);
        } else {
            o->input = a;
        }
    }
    if (o->input && strlen(o->input) > 4 && !strcmp(o->input + strlen(o->input) - 4, ".tir") &&
        !o->from_ir) {
        o->from_ir = o->input;
        o->input = NULL;
    }
    if (!o->input && !o->from_ir)
        return fail("%s", "no input file");
    if (o->input && o->from_ir)
        return fail("give a TDL file or --from-ir %s, not both", o->from_ir);
    if (o->from_ir && (c->mesh_spec || c->defines.len))
        return fail("%s", "--mesh and -D apply to TDL input; an IR file carries its own mesh");

    if (o->verify && o->from_ir)
        return fail("%s", "--verify compiles the TDL input twice (mesh and one device): give a TDL file");
    if (o->emit && !strcmp(o->emit, "plan") && !o->out)
        return fail("%s", "--emit=plan needs -o DIR");
    return 0;
}

static int known_pass(const char *name)
{
    if (!strcmp(name, "all"))
        return 1;
    for (size_t i = 0; i < sizeof front_stages / sizeof front_stages[0]; i++)
        if (!strcmp(front_stages[i].name, name))
            return 1;
    for (const Pass *p = pass_table; p->name; p++)
        if (!strcmp(p->name, name))
            return 1;
    return 0;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* After stage `name`: report it with -v, dump it if asked. */
static void after(Ctx *c, const Options *o, const Graph *g, const char *name, double t0)
{
    if (c->verbose)
        fprintf(stderr, "tcc: %-10s %8.2f ms  %d ops, %d values\n", name, now_ms() - t0,
                g->ops.len, g->values.len);
    if (o->dump_after && (!strcmp(o->dump_after, "all") || !strcmp(o->dump_after, name))) {
        printf("# ---- after %s ----\n", name);
        ir_print(stdout, g);
    }
}

static Graph *load(Ctx *c, const Options *o)
{
    const char *path = o->from_ir ? o->from_ir : o->input;
    size_t len;
    char *text = read_file(c->arena, path, &len);
    if (!text) {
        fprintf(stderr, "tcc: error: cannot read '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    double t0 = now_ms();
    Graph *g = o->from_ir ? ir_parse(c, path, text, len) : fe_compile(c, path, text, len);
    if (g)
        after(c, o, g, o->from_ir ? "parse-ir" : "lower", t0);
    return g;
}

/* The train-block settings and axis roles given on the command line. */
static void set_train(Graph *g, Attr *a)
{
    for (int i = 0; i < g->train.len; i++)
        if (g->train.data[i]->key && !strcmp(g->train.data[i]->key, a->key)) {
            g->train.data[i] = a;
            return;
        }
    VEC_PUSH(g->arena, g->train, a);
}

static int apply_settings(Ctx *c, const Options *o, Graph *g)
{
    (void)c;
    if (o->zero >= 0)
        set_train(g, ir_attr_int(g->arena, intern(g->strings, "zero"), o->zero));
    if (o->sequence_parallel)
        set_train(g, ir_attr_bool(g->arena, intern(g->strings, "sequence_parallel"), 1));
    if (o->schedule)
        set_train(g, ir_attr_str(g->arena, intern(g->strings, "schedule"), o->schedule));
    for (int i = 0; i < o->nroles; i++) {
        const char *eq = strchr(o->roles[i], '=');
        int role = eq ? ir_role_lookup(eq + 1) : -1;
        int ax = -1;
        for (int k = 0; eq && k < g->mesh.naxes; k++)
            if (strlen(g->mesh.axes[k].name) == (size_t)(eq - o->roles[i]) &&
                !strncmp(g->mesh.axes[k].name, o->roles[i], (size_t)(eq - o->roles[i])))
                ax = k;
        if (role < 0 || ax < 0) {
            fprintf(stderr, "tcc: error: --role %s: expected AXIS=ROLE with a mesh axis and one "
                            "of data, fsdp, tensor, sequence, pipeline\n", o->roles[i]);
            return -1;
        }
        g->mesh.axes[ax].role = (AxisRole)role;
    }
    return 0;
}

static int verify(Ctx *c, const Options *o, Graph *g, const char *after_pass)
{
    double t0 = now_ms();
    if (ir_verify(c, g) != 0) {
        if (!strcmp(after_pass, "parse-ir")) /* hand-written IR: the user's error */
            return -1;
        fprintf(stderr, "tcc: internal error: the IR is invalid after '%s'\n", after_pass);
        fprintf(stderr, "tcc: the IR follows, replay it with --from-ir\n");
        ir_print(stderr, g);
        return -1;
    }
    after(c, o, g, "verify", t0);
    return 0;
}

static int write_ir(const Options *o, const Graph *g)
{
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f) {
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out, strerror(errno));
        return -1;
    }
    ir_print(f, g);
    int bad = ferror(f);
    if (o->out)
        bad |= fclose(f) != 0;
    else
        bad |= fflush(f) != 0;
    if (bad)
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out ? o->out : "<stdout>");
    return bad ? -1 : 0;
}

/* --emit=memory: the training state and the slab of one device. */
static int print_memory(const Graph *g, const Plan *plan)
{
    CgMemory m;
    cg_memory(g, &m);
    printf("memory per device, mesh");
    for (int i = 0; i < g->mesh.naxes; i++)
        printf("%s%s=%d", i ? " x " : " ", g->mesh.axes[i].name, g->mesh.axes[i].size);
    printf(" (%lld devices)\n", (long long)ir_mesh_size(&g->mesh));
    printf("  parameters       %14.0f bytes\n", m.params);
    printf("  gradients        %14.0f bytes\n", m.grads);
    printf("  optimizer state  %14.0f bytes\n", m.state);
    printf("  training state   %14.0f bytes\n", m.params + m.grads + m.state);
    printf("  slab             %14llu bytes (every tensor of the step, with reuse)\n",
           (unsigned long long)plan->slab_bytes);
    return 0;
}

/* --emit=c, --emit=cuda: text to -o FILE, else stdout. */
static int write_text(const Options *o, const char *text)
{
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f || fputs(text, f) < 0 || (o->out && fclose(f) != 0)) {
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out ? o->out : "<stdout>",
                strerror(errno));
        return -1;
    }
    return 0;
}

/* The plan into DIR/plan.json (DIR is created), or its kernels as C or CUDA C. */
static int write_plan(Ctx *c, const Options *o, const Graph *g)
{
    Plan plan;
    double t0 = now_ms();
    if (cg_build_plan(c, g, 0, &plan) != 0)
        return -1;
    if (c->verbose)
        fprintf(stderr, "tcc: %-10s %8.2f ms  %d kernels, %d instructions, %.1f MiB slab\n",
                "codegen", now_ms() - t0, plan.nkernels, plan.ninstrs,
                (double)plan.slab_bytes / 1048576.0);
    if (!o->emit)
        return cg_write_program(c, &plan, o->out, o->print_commands);
    if (!strcmp(o->emit, "memory"))
        return print_memory(g, &plan);
    if (!strcmp(o->emit, "c"))
        return write_text(o, plan.kernel_source);
    if (!strcmp(o->emit, "cuda")) {
        const char *cuda = plan.gpu_source ? plan.gpu_source : "";
        if (plan.nkernels > 0 && !*cuda) {
            fprintf(stderr, "tcc: error: --emit=cuda: the kernels have no CUDA rendering\n");
            return -1;
        }
        return write_text(o, cuda);
    }
    if (mkdir(o->out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "tcc: error: cannot create '%s': %s\n", o->out, strerror(errno));
        return -1;
    }
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/plan.json", o->out);
    if (plan_check(&plan, err, sizeof err) != 0)
        BUG("codegen made an invalid plan: %s", err);
    if (plan_write(path, &plan, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: %s\n", err);
        return -1;
    }
    return 0;
}

/* The graph passes in order, each verified, up to and including --stop-after. */
static int run_passes(Ctx *c, const Options *o, Graph *g)
{
    int stop = o->stop_after && (!strcmp(o->stop_after, "lower") ||
                                 !strcmp(o->stop_after, "parse-ir") ||
                                 !strcmp(o->stop_after, "verify"));
    for (const Pass *p = pass_table; p->name && !stop; p++) {
        double t0 = now_ms();
        if (p->run(c, g) != 0)
            return -1;
        after(c, o, g, p->name, t0);
        if (verify(c, o, g, p->name) != 0)
            return -1;
        stop = o->stop_after && !strcmp(o->stop_after, p->name);
    }
    return 0;
}

/* --verify: the plan for the mesh against the same model compiled for one
 * device (every mesh axis of size 1), run side by side on random inputs. */
static int verify_mesh(Ctx *c, Options *o, Graph *g)
{
    Plan mesh, one;
    if (cg_build_plan(c, g, 0, &mesh) != 0)
        return -1;
    char ones[64] = "";
    for (int i = 0; i < g->mesh.naxes && i < 16; i++)
        strcat(ones, i ? "x1" : "1");
    c->mesh_spec = g->mesh.naxes ? intern(c->strings, ones) : NULL;
    Options quiet = *o;
    quiet.dump_after = quiet.stop_after = NULL;
    Graph *g1 = load(c, &quiet);
    if (!g1 || apply_settings(c, o, g1) != 0 || verify(c, &quiet, g1, "lower") != 0 ||
        run_passes(c, &quiet, g1) != 0 || cg_build_plan(c, g1, 0, &one) != 0)
        return -1;
    int f64 = one.loss >= 0 && one.tensors[one.loss].dtype == PD_F64;
    double tol = o->verify_tol > 0 ? o->verify_tol : f64 ? 1e-9 : 1e-3;
    char err[512];
    printf("verify: %s on %lld devices against one device, %d steps\n", g->name,
           (long long)plan_mesh_size(&mesh), o->verify);
    int rc = rt_verify(&mesh, &one, o->verify, 1, tol, NULL, stdout, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "tcc: error: --verify: %s\n", err);
    return rc ? -1 : 0;
}

/* The cost model of a schedule's pieces: the forward FLOPs of one microbatch
 * on the piece's stage; a backward twice that (under ZB-H1, B and W once each). */
typedef struct PieceCosts {
    const double *flops; /* by virtual stage */
    int p;
    SchedKind kind;
} PieceCosts;

static double piece_flops(const Piece *pc, int rank, void *user)
{
    const PieceCosts *pcs = user;
    double f = pcs->flops[pc->chunk * pcs->p + rank];
    return pc->kind == PIECE_B && pcs->kind != SCHED_ZB_H1 ? 2 * f : f;
}

#define TRACE_FLOPS 1e14 /* the nominal device rate of --emit=trace: 100 TFLOP/s */

/* --emit=schedule | trace: the static pipeline schedule of the train block on
 * the mesh's pipeline axis (docs/schedules.md), with unit costs and with the
 * FLOPs of the pipeline pass's stages (the trace uses these). */
static int emit_schedule(Ctx *c, const Options *o, Graph *g)
{
    TrainConfig tc;
    char err[256];
    if (ir_train_config(g, &tc, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: %s\n", err);
        return -1;
    }
    int p = ir_pipeline_stages(&g->mesh);
    SchedKind kind = sched_kind_of(&tc);
    Schedule s;
    SchedTimes t;
    if (sched_build(c->arena, kind, p, (int)tc.microbatches, (int)tc.virtual_stages, &s,
                    err, sizeof err) != 0 ||
        sched_simulate(c->arena, &s, NULL, NULL, 0, &t, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: schedule: %s\n", err);
        return -1;
    }
    /* the cost model: the stages' FLOPs, once the step's graph is built */
    Options upto = *o;
    upto.dump_after = NULL;
    upto.stop_after = "optimizer";
    PieceCosts pcs = {NULL, p, s.kind};
    int nv = 0;
    SchedTimes ct;
    if (p > 1 && (run_passes(c, &upto, g) != 0 || pipeline_stage_costs(c, g, (double **)&pcs.flops, &nv) != 0 ||
                  sched_simulate(c->arena, &s, piece_flops, &pcs, 0, &ct, err, sizeof err) != 0))
        return -1;
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f) {
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out, strerror(errno));
        return -1;
    }
    if (!strcmp(o->emit, "trace"))
        sched_write_trace(&s, p > 1 ? &ct : &t, p > 1 ? 1e6 / TRACE_FLOPS : 1000, f);
    else
        sched_print(&s, f);
    if (o->out && fclose(f) != 0) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out);
        return -1;
    }
    int json = !strcmp(o->emit, "trace") && !o->out; /* keep stdout pure JSON */
    fprintf(json ? stderr : stdout,
            "%s schedule: %d stages, %d microbatches, %d virtual stages: bubble fraction %.4f "
            "(unit costs: F 1, backward 2)\n",
            sched_kind_name(s.kind), p, (int)tc.microbatches, (int)tc.virtual_stages, t.bubble);
    if (p > 1)
        fprintf(json ? stderr : stdout,
                "cost model (forward FLOPs of each stage, backward twice that) at %.0f TFLOP/s: "
                "step %.3f ms, bubble fraction %.4f%s\n",
                TRACE_FLOPS / 1e12, ct.makespan / TRACE_FLOPS * 1e3, ct.bubble,
                !strcmp(o->emit, "trace") ? " (the trace's durations)" : "");
    return 0;
}

static int run(Ctx *c, Options *o)
{
    const char *names[2] = {o->dump_after, o->stop_after};
    for (int i = 0; i < 2; i++)
        if (names[i] && (!known_pass(names[i]) || (i && !strcmp(names[i], "all")))) {
            fprintf(stderr, "tcc: error: --%s=%s: no such pass (see tcc --help)\n",
                    i ? "stop-after" : "dump-after", names[i]);
            return -1;
        }
    Graph *g = load(c, o);
    if (!g || apply_settings(c, o, g) != 0 || verify(c, o, g, o->from_ir ? "parse-ir" : "lower") != 0)
        return -1;
    if (o->emit && (!strcmp(o->emit, "schedule") || !strcmp(o->emit, "trace")))
        return emit_schedule(c, o, g);
    if (run_passes(c, o, g) != 0)
        return -1;
    if (o->verify)
        return verify_mesh(c, o, g);
    if ((o->emit && strcmp(o->emit, "ir") != 0) || (!o->emit && o->out))
        return write_plan(c, o, g);
    return o->emit ? write_ir(o, g) : 0;
}

int main(int argc, char **argv)
{
    Ctx *c = ctx_new(stderr);
    Options o = {0};
    o.zero = -1;
    int rc = parse_args(c, &o, argc, argv) == 0 && run(c, &o) == 0 ? 0 : 1;
    if (c->diag.nerrors)
        fprintf(stderr, "%d error%s generated.\n", c->diag.nerrors, c->diag.nerrors > 1 ? "s" : "");
    ctx_free(c);
    return rc;
}
