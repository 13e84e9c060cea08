/* tcc.c: the driver. Reads the command line and a TDL (or IR) file, runs the
 * pass pipeline -- lowering, then the verifier after every pass -- and writes
 * the IR where asked. Key idea: the pipeline is one table; --dump-after names
 * any entry of it, and --from-ir starts after lowering. */
#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "runtime/cpu.h"
#include "runtime/runtime.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SETS 40 /* --set settings; the planner adds up to PLAN_SETS of its own */
#define PLAN_SETS 8
#define MAX_WHY 8 /* --why NAME options */

typedef struct Options {
    const char *input;
    const char *from_ir;
    const char *out;
    const char *emit;       /* "ir", "plan", "c", "cuda", ... or NULL */
    const char *dump_after; /* a pass name, "all" or NULL */
    const char *stop_after; /* a pass name or NULL */
    int print_commands;
    int portable; /* --portable: the executable runs on any x86-64 (no -march=native) */
    int zero;               /* --zero=N, -1 when absent */
    int sequence_parallel;  /* --sequence-parallel */
    const char *roles[8];   /* --role AXIS=ROLE */
    int nroles;
    const char *schedule;   /* --schedule=NAME: the train setting schedule */
    int verify;             /* --verify[=STEPS]: steps to compare, 0 when absent */
    int verify_native;      /* --verify=native[,STEPS]: the model's own precision, not f64 */
    double verify_tol;      /* --verify-tol=X, 0: 1e-9, or per value in native mode */
    const char *gpu;        /* --gpu NAME: a row of passes/devices.c, or "cpu" */
    double device_memory;   /* --device-memory SIZE in bytes, 0 when absent */
    const char *sets[MAX_SETS]; /* --set KEY=VALUE: train settings */
    int nsets;
    int gpus;               /* --gpus N: the planner's device count, 0 when absent */
    int plan_auto;          /* --plan=auto */
    int explain;            /* --explain */
    const char *cluster;    /* --cluster NAME|FILE */
    ClusterSpec cluster_spec; /* what --cluster or --gpu names (valid when has_cluster) */
    int has_cluster;
    CpuSpec cpu;            /* this machine: a CPU file's keys (--cluster FILE), the rest measured */
    int calibrate_cpu;      /* --calibrate-cpu */
    const char *why[MAX_WHY]; /* --why NAME: the values whose sharding to explain */
    int nwhy;
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
            "  --verify[=N]          the contract: the model in float64 (precision = f64)\n"
            "                        on the mesh (threads) and on one device, N steps (3):\n"
            "                        each step's loss, step 1's gradients (to the scale of\n"
            "                        the whole gradient), then parameters and optimizer\n"
            "                        state; fail above --verify-tol (1e-9)\n"
            "  --verify=native[,N]   the same in the model's own precision: step 1's loss\n"
            "                        and gradients, each within the rounding its chain of\n"
            "                        operations carries (or --verify-tol)\n"
            "  --emit=ir             print the final graph IR (to -o FILE or stdout)\n"
            "  --emit=plan -o DIR    write the plan of one training step to DIR/plan.json\n"
            "  --emit=c              print the C source of the plan's kernels\n"
            "  --emit=cuda           print the CUDA C source of the plan's kernels (for NVRTC;\n"
            "                        tccnvrtc compiles and checks it)\n"
            "  --emit=schedule       print the pipeline schedule, each stage's order of pieces\n"
            "  --emit=trace -o F     write the schedule as a Chrome trace (Perfetto), each piece\n"
            "                        as long as the cost model says on the device (--emit=cost)\n"
            "  --schedule=NAME       gpipe, 1f1b, interleaved or zb (train setting schedule)\n"
            "  --emit=memory         print each stage's peak memory per device: parameters,\n"
            "                        gradients, optimizer state, activations, temporaries,\n"
            "                        buffers, with the largest tensors (-o FILE.json: as JSON)\n"
            "  --emit=memory-plan    each stage's largest moment in the compiled plan itself\n"
            "  --gpu NAME            plan for this GPU: its memory is the budget a plan must fit\n"
            "                        (a100-40gb, a100-80gb, h100-sxm, h100-pcie, h200-sxm), or for\n"
            "                        this machine's CPU (cpu, the default of --emit=cost)\n"
            "  --device-memory SIZE  the budget instead of the GPU's memory (80GiB, 40GB, 512MiB)\n"
            "  --cluster NAME|FILE   the GPUs' servers and network for the cost model: dgx-a100,\n"
            "                        dgx-a100-40gb, h100-roce, h100-pcie-ib, h200-roce, or a file\n"
            "                        of KEY = VALUE lines (docs/cost.md); default: --gpu's server;\n"
            "                        a file whose first line is gpu = cpu: this machine's CPU\n"
            "  --gpus N --plan=auto  choose the mesh (tensor x pipeline x data), microbatches, ZeRO\n"
            "                        level, recomputation and schedule for N GPUs: prints the five\n"
            "                        fastest that fit and why the others lost, compiles the best\n"
            "  --explain             with --plan=auto: why the chosen plan won, what binds it\n"
            "  --emit=cost           print the predicted step time per stage (compute, exposed\n"
            "                        communication, bubble), tokens/s, MFU, TFLOP/s per device\n"
            "                        (-o FILE.json: as JSON); on the CPU unless --gpu or --cluster\n"
            "                        names GPUs, with the CPU measured now (under a second)\n"
            "  --calibrate-cpu       measure this machine's CPU for the cost model and write it\n"
            "                        as a CPU file (-o FILE, else stdout) for --cluster FILE\n"
            "  --set KEY=VALUE       a train setting (recompute=full, microbatches=16, zero=1, ...)\n"
            "  --why NAME            why a value or parameter is sharded as it is: each split\n"
            "                        followed back through the ops (file:line:col) to its\n"
            "                        annotation or default, the ways its op weighed with their\n"
            "                        costs, the collectives it causes with bytes (needs --mesh;\n"
            "                        NAME as in the TDL or the IR, layers.0.wq or wq, or %%N of\n"
            "                        --dump-after=shard; may be given up to 8 times)\n"
            "  --dump-after=PASS     print the IR after PASS ('all': after every pass)\n"
            "  --stop-after=PASS     run the pipeline up to PASS only (e.g. lower: the forward IR)\n"
            "  --from-ir FILE.tir    start from a printed IR instead of TDL\n"
            "  -o FILE               write the output to FILE; without --emit, build an\n"
            "                        executable that trains the model (NAME --help)\n"
            "  --print-commands      show the commands that build the executable\n"
            "  --portable            build the executable for any CPU of its kind, not\n"
            "                        for this one (-march=native is the default)\n"
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

/* "80GiB", "40GB", "512MiB", "1.5TiB" or a byte count, into bytes. */
static int parse_size(const char *v, double *out)
{
    static const struct { const char *unit; double scale; } units[] = {
        {"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
        {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
    };
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || !(x > 0))
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].unit)) {
            *out = x * units[i].scale;
            return 0;
        }
    return -1;
}

/* ---- this machine's CPU (passes/cpu.c, runtime/calibrate.c) ---- */

/* --cluster FILE when the file is a CPU file (gpu = cpu): 0 read, 1 not a CPU
 * file, -1 refused. */
static int cpu_file(Ctx *c, Options *o)
{
    char err[512];
    int rc = pass_cpu_read(c->arena, o->cluster, &o->cpu, err, sizeof err);
    if (rc < 0)
        return fail("--cluster: %s", err);
    if (rc == 0 && o->gpu && strcmp(o->gpu, "cpu"))
        return fail("--cluster %s is this machine's CPU (gpu = cpu), not a GPU: drop --gpu",
                    o->cluster);
    if (rc == 0)
        o->gpu = "cpu";
    return rc;
}

/* --calibrate-cpu takes -o and nothing else. */
static int calibrate_args(const Ctx *c, const Options *o)
{
    int other = o->input || o->from_ir || o->emit || o->gpu || o->cluster || o->verify ||
                o->dump_after || o->stop_after || o->zero >= 0 || o->sequence_parallel ||
                o->nroles || o->schedule || o->nsets || o->device_memory > 0 || o->print_commands ||
                o->portable || c->mesh_spec || c->defines.len || o->nwhy;
    if (other)
        return fail("%s", "--calibrate-cpu measures this machine and writes its CPU file: it "
                          "takes no input and no option but -o FILE");
    return 0;
}

/* The CPU figures the CPU file did not give, measured now. */
static int measure_cpu(Ctx *c, Options *o)
{
    CpuSpec *s = &o->cpu;
    unsigned all = (1u << CPU_NKEYS) - 1;
    RtCpuSpeed m;
    char err[512];
    if ((s->given & all) == all)
        return 0;
    if (rt_cpu_measure(&m, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: measuring this machine's CPU: %s\n", err);
        return -1;
    }
    double v[CPU_NKEYS] = {m.cores,   m.gemm1_gflops, m.convert_ns, m.op_ns,
                           m.chain_ns, m.div_ns,     m.call_ns,    m.tanh_ns,
                           m.stream_gbs, m.speedup,  m.fork_us,    m.memory_bytes / 1073741824.0,
                           m.vop_ns,  m.loop_speedup, m.stream_par_gbs, m.chain64_ns};
    for (int k = 0; k < CPU_NKEYS; k++)
        if (!(s->given >> k & 1))
            s->v[k] = v[k];
    s->given = all;
    if (!s->what)
        s->what = arena_printf(c->arena, "%s, %s", m.cpu, m.blas);
    return 0;
}

/* --calibrate-cpu: the CPU file, to -o FILE or stdout. */
static int calibrate_cpu(Ctx *c, Options *o)
{
    if (measure_cpu(c, o) != 0)
        return -1;
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f) {
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out, strerror(errno));
        return -1;
    }
    pass_cpu_write(f, &o->cpu);
    if (o->out ? fclose(f) != 0 : fflush(f) != 0) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out ? o->out : "<stdout>");
        return -1;
    }
    return 0;
}

/* Whether this run measures the CPU: --calibrate-cpu, or the cost model on
 * the CPU without a complete CPU file. */
static int measures_cpu(const Options *o)
{
    int cost = o->emit && (!strcmp(o->emit, "cost") || !strcmp(o->emit, "trace"));
    unsigned all = (1u << CPU_NKEYS) - 1;
    return o->calibrate_cpu || (cost && !o->has_cluster && (o->cpu.given & all) != all);
}

/* The cost model's device: the cluster's GPUs, else this machine's CPU shared
 * by the plan's devices. */
static int cost_device(Ctx *c, Options *o, const Plan *p, CostDevice *d)
{
    if (o->has_cluster) {
        cost_device_of_cluster(&o->cluster_spec, d);
        return 0;
    }
    if (measure_cpu(c, o) != 0)
        return -1;
    cost_device_of_cpu(&o->cpu, plan_mesh_size(p), d);
    return 0;
}

/* --cluster NAME or FILE, else the server of --gpu: the devices and links the
 * cost model times. A cluster's GPU and --gpu must agree. */
static int resolve_cluster(Ctx *c, Options *o)
{
    char err[512];
    const ClusterSpec *named = o->cluster ? pass_cluster_lookup(o->cluster) : NULL;
    if (o->cluster && named) {
        o->cluster_spec = *named;
    } else if (o->cluster) {
        if (!strchr(o->cluster, '/') && !strchr(o->cluster, '.') && access(o->cluster, R_OK) != 0)
            return fail("--cluster=%s: no such cluster (dgx-a100, dgx-a100-40gb, h100-roce, "
                        "h100-pcie-ib, h200-roce) and not a file path", o->cluster);
        int cpu = cpu_file(c, o);
        if (cpu != 1)
            return cpu;
        if (pass_cluster_read(c->arena, o->cluster, &o->cluster_spec, err, sizeof err) != 0)
            return fail("--cluster: %s", err);
    } else if (o->gpu && strcmp(o->gpu, "cpu")) {
        o->cluster_spec = *pass_cluster_default(pass_device_lookup(o->gpu));
        o->cluster_spec.gpu = pass_device_lookup(o->gpu);
    } else {
        return 0;
    }
    if (o->gpu && !strcmp(o->gpu, "cpu"))
        return fail("--cluster %s: a cluster of GPUs, but --gpu cpu", o->cluster);
    if (o->gpu && pass_device_lookup(o->gpu) != o->cluster_spec.gpu) {
        fprintf(stderr, "tcc: error: --cluster %s has %s GPUs, not --gpu %s\n", o->cluster,
                o->cluster_spec.gpu->name, o->gpu);
        return -1;
    }
    o->gpu = o->cluster_spec.gpu->name;
    o->has_cluster = 1;
    return 0;
}

/* --plan=auto chooses the mesh and these settings: it needs the devices and
 * takes none of its choices from the command line. */
static int check_plan_options(Ctx *c, const Options *o)
{
    static const char *const chosen[] = {"microbatches", "recompute", "zero", "schedule",
                                         "virtual_stages", "sequence_parallel"};
    if (!o->plan_auto) {
        if (o->gpus)
            return fail("%s", "--gpus N is the planner's device count: add --plan=auto");
        if (o->explain)
            return fail("%s", "--explain says why --plan=auto chose its plan: add --plan=auto");
        return 0;
    }
    if (!o->gpus)
        return fail("%s", "--plan=auto needs the device count: --gpus N");
    if (!o->has_cluster)
        return fail("%s", "--plan=auto needs the GPU: --gpu NAME or --cluster NAME|FILE");
    if (c->mesh_spec)
        return fail("--plan=auto chooses the mesh: drop --mesh %s", c->mesh_spec);
    if (o->from_ir)
        return fail("%s", "--plan=auto compiles the TDL input: give a TDL file");
    if (o->zero >= 0 || o->sequence_parallel || o->schedule)
        return fail("%s", "--plan=auto chooses zero, sequence_parallel and schedule: drop them");
    for (int i = 0; i < o->nsets; i++)
        for (size_t k = 0; k < sizeof chosen / sizeof chosen[0]; k++)
            if (!strncmp(o->sets[i], chosen[k], strlen(chosen[k])) &&
                o->sets[i][strlen(chosen[k])] == '=')
                return fail("--plan=auto chooses %s: drop that --set", chosen[k]);
    return 0;
}

/* --why prints the reasons behind the shardings of the mesh given, after
 * the partition pass: options that make something else, stop before it or
 * choose the mesh are refused. */
static int check_why_options(const Options *o)
{
    if (!o->nwhy)
        return 0;
    if (o->emit)
        return fail("--why prints the reasons behind a sharding, not an output: drop --emit=%s",
                    o->emit);
    if (o->out)
        return fail("--why prints to standard output and builds nothing: drop -o %s", o->out);
    if (o->verify)
        return fail("%s", "--why and --verify compile differently: run them one at a time");
    if (o->stop_after)
        return fail("--why needs the shard and partition passes: drop --stop-after=%s",
                    o->stop_after);
    if (o->plan_auto)
        return fail("%s", "--why explains the mesh you give with --mesh: drop --plan=auto");
    if (o->gpu || o->cluster || o->device_memory > 0)
        return fail("%s", "--gpu, --cluster and --device-memory do not change a sharding: drop "
                          "them with --why");
    if (o->print_commands)
        return fail("%s", "--print-commands shows how an executable is built: --why builds none");
    return 0;
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
        } else if (!strcmp(a, "--portable")) {
            o->portable = 1;
        } else if (!strcmp(a, "--calibrate-cpu")) {
            o->calibrate_cpu = 1;
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
            const char *n = a + 9;
            if (!strncmp(n, "native", 6) && (!n[6] || n[6] == ',')) {
                o->verify_native = 1;
                n = n[6] ? n + 7 : "3";
            }
            char *end;
            long k = strtol(n, &end, 10);
            if (end == n || *end || k < 1 || k > 1000)
                return fail("--verify=%s: expected a step count in [1, 1000], 'native' or "
                            "'native,N'", a + 9);
            o->verify = (int)k;
        } else if ((v = opt_value(argc, argv, &i, "--verify-tol"))) {
            o->verify_tol = strtod(v, NULL);
            if (!(o->verify_tol > 0))
                return fail("--verify-tol=%s: expected a positive number", v);
        } else if ((v = opt_value(argc, argv, &i, "--gpu"))) {
            if (strcmp(v, "cpu") && !pass_device_lookup(v))
                return fail("--gpu=%s: unknown GPU (a100-40gb, a100-80gb, h100-sxm, h100-pcie, "
                            "h200-sxm or cpu)", v);
            o->gpu = v;
        } else if ((v = opt_value(argc, argv, &i, "--cluster"))) {
            o->cluster = v;
        } else if ((v = opt_value(argc, argv, &i, "--gpus"))) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || end == v || n < 1 || n > 1048576)
                return fail("--gpus=%s: expected a device count in [1, 1048576]", v);
            o->gpus = (int)n;
        } else if ((v = opt_value(argc, argv, &i, "--plan"))) {
            if (strcmp(v, "auto"))
                return fail("--plan=%s: expected auto", v);
            o->plan_auto = 1;
        } else if (!strcmp(a, "--explain")) {
            o->explain = 1;
        } else if ((v = opt_value(argc, argv, &i, "--device-memory"))) {
            if (parse_size(v, &o->device_memory) != 0)
                return fail("--device-memory=%s: expected a size like 80GiB, 40GB, 512MiB or "
                            "bytes", v);
        } else if ((v = opt_value(argc, argv, &i, "--set"))) {
            if (o->nsets >= MAX_SETS - PLAN_SETS)
                return fail("at most %s --set options", "32");
            o->sets[o->nsets++] = v;
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
                strcmp(v, "memory") && strcmp(v, "memory-plan") && strcmp(v, "schedule") &&
                strcmp(v, "trace") && strcmp(v, "cost"))
                return fail("--emit=%s: expected ir, plan, c, cuda, memory, memory-plan, cost, "
                            "schedule or trace", v);
            o->emit = v;
        } else if ((v = opt_value(argc, argv, &i, "--why"))) {
            if (o->nwhy >= MAX_WHY)
                return fail("at most %s --why options", "8");
            if (!*v)
                return fail("%s", "--why needs the name of a value or parameter");
            o->why[o->nwhy++] = v;
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
    if (o->calibrate_cpu)
        return calibrate_args(c, o);
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
    if (o->portable && (o->emit || o->verify || o->dump_after || o->stop_after || !o->out))
        return fail("%s", "--portable is how an executable is built (-o NAME, no --emit): a plan's "
                          "kernels are compiled where it runs, for that CPU");
    if (resolve_cluster(c, o) != 0 || check_why_options(o) != 0)
        return -1;
    return check_plan_options(c, o);
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

/* ---- --set KEY=VALUE: a value as the train block spells it ---- */

typedef struct SetText {
    Graph *g;
    const char *p;
} SetText;

static void set_space(SetText *t)
{
    while (*t->p == ' ')
        t->p++;
}

static Attr *set_value(SetText *t, const char *key);

/* ITEM {, ITEM} up to close; ITEM: [NAME =] VALUE. */
static int set_items(SetText *t, char close, Attr ***items, int *n)
{
    VEC(Attr *) v = {0};
    set_space(t);
    while (*t->p && *t->p != close) {
        const char *key = NULL, *q = t->p;
        while (*q == '_' || (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
               (*q >= '0' && *q <= '9'))
            q++;
        if (q > t->p && q[*q == ' '] == '=') {
            key = intern_n(t->g->strings, t->p, (size_t)(q - t->p));
            t->p = q + (*q == ' ') + 1;
        }
        Attr *a = set_value(t, key);
        if (!a)
            return -1;
        VEC_PUSH(t->g->arena, v, a);
        set_space(t);
        if (*t->p == ',')
            t->p++, set_space(t);
        else if (*t->p != close)
            return -1;
    }
    if (*t->p++ != close)
        return -1;
    *items = v.data, *n = v.len;
    return 0;
}

static Attr *set_value(SetText *t, const char *key)
{
    Arena *a = t->g->arena;
    Attr **items = NULL;
    int n = 0;
    set_space(t);
    if (*t->p == '(')
        return t->p++, set_items(t, ')', &items, &n) ? NULL : ir_attr_list(a, key, items, n);
    char *end;
    long long i = strtoll(t->p, &end, 10);
    if (end > t->p && strchr(",) ", *end)) /* (strchr finds the NUL too) */
        return t->p = end, ir_attr_int(a, key, i);
    double x = strtod(t->p, &end);
    if (end > t->p && strchr(",) ", *end))
        return t->p = end, ir_attr_float(a, key, x);
    const char *q = t->p;
    while (*q == '_' || *q == '-' || (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
           (*q >= '0' && *q <= '9'))
        q++;
    if (q == t->p)
        return NULL;
    const char *name = intern_n(t->g->strings, t->p, (size_t)(q - t->p));
    t->p = q;
    if (!strcmp(name, "true") || !strcmp(name, "false"))
        return ir_attr_bool(a, key, name[0] == 't');
    if (*t->p != '(')
        return ir_attr_str(a, key, name);
    t->p++;
    return set_items(t, ')', &items, &n) ? NULL : ir_attr_call(a, key, name, items, n);
}

/* --set KEY=VALUE into the train block, checked as the block's own settings are. */
static int apply_set(Graph *g, const char *text)
{
    const char *eq = strchr(text, '=');
    TrainConfig tc;
    char err[256];
    if (!eq || eq == text) {
        fprintf(stderr, "tcc: error: --set %s: expected KEY=VALUE\n", text);
        return -1;
    }
    SetText t = {g, eq + 1};
    Attr *a = set_value(&t, intern_n(g->strings, text, (size_t)(eq - text)));
    if (a)
        set_space(&t);
    if (!a || *t.p) {
        fprintf(stderr, "tcc: error: --set %s: cannot read the value '%s'\n", text, eq + 1);
        return -1;
    }
    ir_train_defaults(&tc);
    if (ir_train_set(&tc, a, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: --set %s: %s\n", text, err);
        return -1;
    }
    set_train(g, a);
    return 0;
}

static int apply_settings(Ctx *c, const Options *o, Graph *g)
{
    for (int i = 0; i < o->nsets; i++)
        if (apply_set(g, o->sets[i]) != 0)
            return -1;
    if (o->verify) { /* both of --verify's plans: gradients kept, float64 unless native */
        c->keep_grads = 1;
        if (!o->verify_native)
            set_train(g, ir_attr_str(g->arena, intern(g->strings, "precision"), "f64"));
    }
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

static int on_gpu(const Options *o) { return o->gpu && strcmp(o->gpu, "cpu") != 0; }

/* --emit=memory-plan (and --emit=memory of an IR file): each stage's largest
 * moment in the plan as compiled, every microbatch in it, and its slab. */
static int print_plan_memory(Ctx *c, const Options *o, const Plan *compact, const Graph *local)
{
    Plan x = *compact, *p = &x; /* a loop plan: as laid out (passes/memory.c) */
    int n = plan_stages(p);
    for (int s = 0; s < n; s++) {
        double cat[MC_COUNT];
        printf("stage %d: plan peak %.0f bytes, slab %llu bytes:", s,
               pass_memory_plan_peak(c->arena, p, local, s, on_gpu(o), cat),
               (unsigned long long)plan_stage_slab(p, s));
        for (int k = 0; k < MC_COUNT; k++)
            printf(" %s %.0f", mem_cat_name((MemCat)k), cat[k]);
        putchar('\n');
    }
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
    Kernel **kernels;
    const Graph *local;
    double t0 = now_ms();
    if (cg_build_plan_local(c, g, 0, &plan, &kernels, &local) != 0)
        return -1;
    if (c->verbose)
        fprintf(stderr, "tcc: %-10s %8.2f ms  %d kernels, %d instructions, %.1f MiB slab\n",
                "codegen", now_ms() - t0, plan.nkernels, plan.ninstrs,
                (double)plan.slab_bytes / 1048576.0);
    if (!o->emit)
        return cg_write_program(c, &plan, o->out, o->print_commands, o->portable);
    if (!strcmp(o->emit, "memory") || !strcmp(o->emit, "memory-plan")) /* the plan as it is */
        return print_plan_memory(c, o, &plan, local);
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

/* --why: each name's chain, right after the shard pass (every name tried). */
static int trace_why(Ctx *c, const Options *o, Graph *g, WhyChain **why)
{
    int bad = 0;
    for (int i = 0; i < o->nwhy; i++)
        bad |= !(why[i] = pass_why_trace(c, g, o->why[i]));
    return bad ? -1 : 0;
}

/* The graph passes in order, each verified, up to and including --stop-after;
 * with why, the --why chains after the shard pass. */
static int run_passes(Ctx *c, const Options *o, Graph *g, WhyChain **why)
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
        if (why && !strcmp(p->name, "shard") && trace_why(c, o, g, why) != 0)
            return -1;
        stop = o->stop_after && !strcmp(o->stop_after, p->name);
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The scale under which a value counts as zero: 1e-6 of the median of the
 * compared values' nonzero scales. A median, not the largest: one mask of
 * -1e30 would otherwise lift the floor over every real value (issue 38). */
static double zero_floor(Arena *a, const Plan *one, const double *diff, const double *scale)
{
    double *s = arena_alloc(a, sizeof(double) * (size_t)(one->ntensors + 1));
    int n = 0;
    for (int t = 0; t < one->ntensors; t++)
        if (diff[t] >= 0 && scale[t] > 0 && isfinite(scale[t]))
            s[n++] = scale[t];
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n ? 1e-6 * s[n / 2] : 0;
}

/* After a failed --verify: both plans again with every value kept (own
 * memory, nothing fused), step 1 of each, and the first value in the
 * one-device program's order that differs beyond tol at its own scale. A
 * value whose scale is under the zero floor (zero_floor) is judged at that
 * floor: the rounding noise of a true zero (a key bias's gradient) is no
 * divergence. Values the mesh holds as partial sums are skipped (their
 * blocks are not the whole value); the value their reduction makes is not.
 * When none differs it says step 1 agrees only if step 1's loss does. */
static void first_divergence(Ctx *c, Graph *g, Graph *g1, double tol)
{
    Plan mesh, one;
    char err[512];
    printf("looking for the first value of step 1 that differs (every value kept)\n");
    if (cg_build_plan(c, g, CG_KEEP_VALUES, &mesh) != 0 ||
        cg_build_plan(c, g1, CG_KEEP_VALUES, &one) != 0)
        return;
    double *diff = arena_alloc(c->arena, sizeof(double) * (size_t)(one.ntensors + 1));
    double *scale = arena_alloc(c->arena, sizeof(double) * (size_t)(one.ntensors + 1));
    int *t_of = arena_alloc(c->arena, sizeof(int) * (size_t)(g1->values.len + 1));
    if (rt_verify_values(&mesh, &one, 1, NULL, diff, scale, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: --verify: %s\n", err);
        return;
    }
    /* with data parallelism a microbatch holds other rows on the mesh (its
     * block of each device's rows) than on one device: only their sums compare */
    TrainConfig tc;
    int data = 1, per_mb;
    if (pass_train_config(c, g1, &tc))
        return;
    for (int a = 0; a < g->mesh.naxes; a++)
        if (g->mesh.axes[a].role == ROLE_DATA || g->mesh.axes[a].role == ROLE_FSDP)
            data *= g->mesh.axes[a].size;
    per_mb = data == 1 || tc.microbatches == 1;
    if (!per_mb)
        printf("(%d microbatches over %d data-parallel devices: the values of one "
               "microbatch hold other rows on the mesh, so only what sums them is compared; "
               "--set microbatches=1 compares every value)\n",
               (int)tc.microbatches, data);
    double floor = zero_floor(c->arena, &one, diff, scale);
    for (int i = 0; i < g1->values.len; i++)
        t_of[i] = -1;
    for (int t = one.ntensors - 1; t >= 0; t--) {
        int v = one.tensors[t].value;
        if (v >= 0 && v < g1->values.len)
            t_of[v] = t;
    }
    for (int i = 0; i < g1->ops.len; i++) {
        const Op *op = g1->ops.data[i];
        for (int r = 0; r < op->nres; r++) {
            const Value *v1 = op->res[r];
            int t = t_of[v1->id];
            /* parameters and state hold their updated values by now (the
             * comparison above judged them) */
            if (t < 0 || diff[t] < 0 || v1->id >= g->values.len ||
                one.tensors[t].role == PT_PARAM || one.tensors[t].role == PT_STATE ||
                (!per_mb && op->mb >= 0))
                continue;
            const Value *vm = g->values.data[v1->id];
            if (vm->shard.partial || vm->rank != v1->rank ||
                (vm->name != v1->name && (!vm->name || !v1->name || strcmp(vm->name, v1->name))))
                continue;
            double rel = diff[t] / fmax(scale[t], floor);
            if (!(rel > tol))
                continue;
            const Op *def = vm->def;
            Loc loc = def->loc.line > 0 ? def->loc : vm->loc;
            int coll = def->kind >= OP_ALL_REDUCE && def->kind <= OP_SHARD_SLICE;
            printf("first diverging value of step 1 (in the one-device program's order):\n  ");
            ir_print_op(stdout, g, def);
            if (loc.line > 0)
                printf("  at %s:%d:%d\n", loc.file ? loc.file : "?", loc.line, loc.col);
            printf("  sharding on the mesh: ");
            ir_print_value_type(stdout, g, vm);
            printf(" (%s%s%s)\n", ir_why_name(vm->shard.why.kind),
                   vm->shard.why.detail ? ": " : "",
                   vm->shard.why.detail ? vm->shard.why.detail : "");
            if (coll)
                printf("  made by: %s, a collective of the partition pass\n", ir_ops[def->kind].name);
            else
                printf("  made by: %s, partitioned on the mesh by its sharding rule\n",
                       ir_ops[def->kind].name);
            for (int a = 0; a < def->nargs; a++) { /* the collectives that fed it */
                const Op *in = def->args[a]->def;
                if (in && in->kind >= OP_ALL_REDUCE && in->kind <= OP_SHARD_SLICE) {
                    printf("  operand %d made by the partition pass (%s):\n    ", a,
                           def->args[a]->shard.why.detail ? def->args[a]->shard.why.detail
                                                          : ir_ops[in->kind].name);
                    ir_print_op(stdout, g, in);
                }
            }
            printf("  difference: max |mesh - one| %.3g, %.3g of its scale %.3g (tolerance %.3g)\n",
                   diff[t], rel, scale[t], tol);
            return;
        }
    }
    int l = one.loss;
    if (l >= 0 && diff[l] >= 0 && !(diff[l] > tol * scale[l]))
        printf("every value of step 1 agrees within the tolerance: the steps after diverge\n");
    else if (l >= 0 && diff[l] >= 0)
        printf("step 1's loss differs (%.3g relative, tolerance %.3g), but no value that both "
               "programs hold whole differs beyond the tolerance before it: the difference "
               "arises where only the mesh holds the value (a partial sum, a collective's "
               "result)%s\n",
               diff[l] / fmax(scale[l], 1e-300), tol,
               per_mb ? "" : ", or in one microbatch's values, which are not compared here");
    else
        printf("no value of step 1 that both programs hold whole differs beyond the tolerance "
               "(the loss is not among them)\n");
}

/* --verify: the plan for the mesh against the same model compiled for one
 * device (every mesh axis of size 1), run side by side on random inputs. */
/* The model through every pass again, on mesh (a --mesh spec). */
static Graph *passed(Ctx *c, Options *o, const char *mesh)
{
    Options quiet = *o;
    quiet.dump_after = quiet.stop_after = NULL;
    c->mesh_spec = mesh;
    Graph *g = load(c, &quiet);
    if (!g || apply_settings(c, o, g) != 0 || verify(c, &quiet, g, "lower") != 0 ||
        run_passes(c, &quiet, g, NULL) != 0)
        return NULL;
    return g;
}

/* --verify=native's tolerance of each value it judges (the one-device plan's
 * loss and kept gradients "NAME:grad"): VERIFY_SIGMAS times the rounding the
 * value's chain of operations carries (pass_rounding_error) on each side, so
 * sqrt(2) of it in their difference. */
#define VERIFY_SIGMAS 4.0

static double *native_tolerances(Ctx *c, const Graph *g1, const Plan *one)
{
    char *stored = arena_alloc(c->arena, (size_t)g1->values.len + 1);
    memset(stored, 0, (size_t)g1->values.len + 1);
    for (int t = 0; t < one->ntensors; t++)
        if (one->tensors[t].value >= 0 && one->tensors[t].value < g1->values.len)
            stored[one->tensors[t].value] = 1;
    double *e = pass_rounding_error(c->arena, g1, stored);
    int *from = arena_alloc(c->arena, sizeof(int) * (size_t)(g1->values.len + 1));
    double *tols = arena_alloc(c->arena, sizeof(double) * (size_t)(one->ntensors + 1));
    for (int v = 0; v < g1->values.len; v++)
        from[v] = v;
    for (int i = 0; i < g1->ops.len; i++) /* a kept gradient: the value its update stores */
        if (g1->ops.data[i]->kind == OP_UPDATE)
            from[g1->ops.data[i]->args[0]->id] = g1->ops.data[i]->args[1]->id;
    for (int t = 0; t < one->ntensors; t++) {
        int v = one->tensors[t].value;
        tols[t] = v >= 0 && v < g1->values.len ? VERIFY_SIGMAS * sqrt(2.0) * e[from[v]] : 0;
    }
    return tols;
}

static int verify_mesh(Ctx *c, Options *o, Graph *g)
{
    Plan mesh, one;
    const char *spec = c->mesh_spec;
    if (cg_build_plan(c, g, 0, &mesh) != 0)
        return -1;
    char ones[64] = "", err[512];
    for (int i = 0; i < g->mesh.naxes && i < 16; i++)
        strcat(ones, i ? "x1" : "1");
    Graph *g1 = passed(c, o, g->mesh.naxes ? intern(c->strings, ones) : NULL);
    if (!g1 || cg_build_plan(c, g1, 0, &one) != 0)
        return -1;

    TrainConfig tc;
    if (pass_train_config(c, g1, &tc))
        return -1;
    int f64 = one.loss >= 0 && one.tensors[one.loss].dtype == PD_F64;
    int bf16 = !strcmp(tc.precision, "bf16");
    double tol = o->verify_tol > 0 ? o->verify_tol : f64 ? 1e-9 : bf16 ? 5e-2 : 1e-4;
    printf("verify: %s on %lld devices against one device, %d step%s, %s\n", g->name,
           (long long)plan_mesh_size(&mesh), o->verify, o->verify > 1 ? "s" : "",
           o->verify_native ? (bf16 ? "in the model's precision (bf16)" : "in the model's precision")
                            : "in float64 (precision = f64)");
    double *tols = o->verify_native && !(o->verify_tol > 0) ? native_tolerances(c, g1, &one) : NULL;
    int rc = tols ? rt_verify_each(&mesh, &one, o->verify, 1, tols, NULL, stdout, err, sizeof err)
                  : rt_verify(&mesh, &one, o->verify, 1, tol, NULL, stdout, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "tcc: error: --verify: %s\n", err);
    if (rc > 0) { /* every value compared: each microbatch's its own, so the step unrolled */
        c->unroll = 1;
        const char *one_spec = g1->mesh.naxes ? intern(c->strings, ones) : NULL;
        Graph *gu = passed(c, o, spec), *g1u = gu ? passed(c, o, one_spec) : NULL;
        if (gu && g1u)
            first_divergence(c, gu, g1u, tol);
        c->unroll = 0;
    }
    return rc ? -1 : 0;
}

/* --emit=schedule: the static pipeline schedule of the train block on the
 * mesh's pipeline axis (docs/schedules.md), with unit costs. */
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
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f) {
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out, strerror(errno));
        return -1;
    }
    sched_print(&s, f);
    if (o->out && fclose(f) != 0) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out);
        return -1;
    }
    printf("%s schedule: %d stages, %d microbatches, %d virtual stages: bubble fraction %.4f "
           "(unit costs: F 1, backward 2)\n",
           sched_kind_name(s.kind), p, (int)tc.microbatches, (int)tc.virtual_stages, t.bubble);
    return 0;
}

/* ---- the memory model and the device's budget (passes/memory.c) ---- */

static double budget_of(const Options *o)
{
    const DeviceSpec *d = o->gpu ? pass_device_lookup(o->gpu) : NULL;
    return o->device_memory > 0 ? o->device_memory : d ? d->memory : 0;
}


/* Another setting or mesh to try (a lever), or none. */
typedef struct Probe {
    const char *mesh; /* a --mesh spec, NULL: as given */
    const char *set;  /* a --set KEY=VALUE, NULL: none */
} Probe;

/* Which stage each layer's forward runs on, into ls[0..n) (-1: none). */
static void layer_stages(const Graph *g, int *ls, int n)
{
    for (int i = 0; i < n; i++)
        ls[i] = -1;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->phase == PH_FWD && op->layer >= 0 && op->layer < n)
            ls[op->layer] = op->stage;
    }
}

/* The step of one microbatch (the microbatch pass's model mode) compiled in c
 * as the options and the probe pr say: the graph after the passes (*gout),
 * its plan and the per-device graph it was built from. */
typedef struct OneStep {
    Graph *g;
    Plan plan;
    const Graph *local;
} OneStep;

static int compile_one(Ctx *c, const Options *o, const Probe *pr, OneStep *one)
{
    Options q = *o;
    q.dump_after = q.stop_after = NULL;
    if (pr && pr->set && q.nsets < MAX_SETS)
        q.sets[q.nsets++] = pr->set;
    const char *mesh = c->mesh_spec;
    int verbose = c->verbose;
    c->mesh_spec = pr && pr->mesh ? pr->mesh : mesh;
    c->verbose = 0;
    int unroll = c->unroll;
    c->unroll = 0;
    Kernel **kernels;
    one->g = load(c, &q);
    int rc = !one->g || apply_settings(c, &q, one->g) || verify(c, &q, one->g, "lower") ||
                     run_passes(c, &q, one->g, NULL) ||
                     cg_build_plan_local(c, one->g, 0, &one->plan, &kernels, &one->local)
                 ? -1
                 : 0;
    c->unroll = unroll;
    c->mesh_spec = mesh;
    c->verbose = verbose;
    return rc;
}

/* The memory model of the step as the options say, plus pr. *gout: the
 * graph of one microbatch's step, after the passes. */
static int model_in(Ctx *c, const Options *o, const Probe *pr, MemoryModel *mm, Graph **gout)
{
    OneStep one;
    int rc = compile_one(c, o, pr, &one) ||
                     pass_memory_model(c, one.g, one.local, &one.plan, on_gpu(o), mm)
                 ? -1
                 : 0;
    if (gout)
        *gout = one.g;
    return rc;
}

/* What a probe gives: each stage's peak and each layer's stage. */
typedef struct ProbeResult {
    int ok, nstages, nlayers;
    double peak, stage_peak[1024];
    int layer_stage[4096];
} ProbeResult;

/* model_in in a context of its own whose diagnostics go nowhere: a lever
 * that does not compile (a mesh that does not divide) is just not offered. */
static void probe(Ctx *c, const Options *o, const Probe *pr, ProbeResult *r)
{
    FILE *null = fopen("/dev/null", "w");
    Ctx *q = ctx_new(null ? null : stderr);
    for (int i = 0; i < c->defines.len; i++)
        VEC_PUSH(q->arena, q->defines, c->defines.data[i]);
    q->mesh_spec = c->mesh_spec;
    q->recompute_layers = c->recompute_layers;
    q->nrecompute_layers = c->nrecompute_layers;
    MemoryModel mm;
    Graph *g = NULL;
    memset(r, 0, sizeof *r);
    r->ok = model_in(q, o, pr, &mm, &g) == 0 && mm.nstages <= 1024;
    if (r->ok) {
        r->peak = mm.peak, r->nstages = mm.nstages;
        for (int s = 0; s < mm.nstages; s++)
            r->stage_peak[s] = mm.stage[s].peak;
        r->nlayers = c->nrecompute_layers > 0 ? c->nrecompute_layers : 0;
        layer_stages(g, r->layer_stage, 4096);
    }
    ctx_free(q);
    if (null)
        fclose(null);
}

#define GIB (1024.0 * 1024.0 * 1024.0)

/* A mesh spec by name with the pipeline axis k times longer, and with the
 * data axes k times shorter when same (the same devices), or NULL when the
 * mesh has no such axes. */
static const char *deeper_pipeline(Ctx *c, const Mesh *m, int k, int same)
{
    int pp = -1, dp = -1;
    for (int i = 0; i < m->naxes; i++) {
        if (m->axes[i].role == ROLE_PIPELINE && pp < 0)
            pp = i;
        if ((m->axes[i].role == ROLE_DATA || m->axes[i].role == ROLE_FSDP) && m->axes[i].size % k == 0 &&
            dp < 0 && same)
            dp = i;
    }
    if (pp < 0 || (same && dp < 0))
        return NULL;
    char spec[512] = "";
    for (int i = 0, at = 0; i < m->naxes; i++) {
        int size = m->axes[i].size * (i == pp ? k : 1) / (i == dp ? k : 1);
        at += snprintf(spec + at, sizeof spec - (size_t)at, "%s%s=%d", i ? "," : "", m->axes[i].name,
                       size);
    }
    return intern(c->strings, spec);
}

/* The levers that would lower the peak, each tried: recomputation, a ZeRO
 * level, a deeper pipeline on the same devices and on 2, 4 and 8 times as
 * many, a schedule that holds fewer microbatches, smaller microbatches,
 * sequence parallelism. At most 16. */
static int levers(Ctx *c, const Graph *g, Probe *out)
{
    TrainConfig tc;
    char err[256], buf[64];
    int n = 0, data = 0, tensor = 0;
    if (ir_train_config(g, &tc, err, sizeof err) != 0)
        return 0;
    for (int i = 0; i < g->mesh.naxes; i++) {
        data |= (g->mesh.axes[i].role == ROLE_DATA || g->mesh.axes[i].role == ROLE_FSDP) &&
                g->mesh.axes[i].size > 1;
        tensor |= g->mesh.axes[i].role == ROLE_TENSOR && g->mesh.axes[i].size > 1;
    }
    if (strcmp(tc.recompute, "selective") && strcmp(tc.recompute, "full"))
        out[n++] = (Probe){NULL, "recompute=selective"};
    if (strcmp(tc.recompute, "full"))
        out[n++] = (Probe){NULL, "recompute=full"};
    for (int z = (int)tc.zero + 1; data && z <= 3; z++)
        snprintf(buf, sizeof buf, "zero=%d", z), out[n++] = (Probe){NULL, intern(c->strings, buf)};
    if ((out[n].mesh = deeper_pipeline(c, &g->mesh, 2, 1)))
        out[n++].set = NULL;
    for (int more = 2; more <= 8; more *= 2) /* more devices */
        if ((out[n].mesh = deeper_pipeline(c, &g->mesh, more, 0)))
            out[n++].set = NULL;
    if (ir_pipeline_stages(&g->mesh) > 1 && sched_kind_of(&tc) == SCHED_GPIPE)
        out[n++] = (Probe){NULL, "schedule=1f1b"};
    snprintf(buf, sizeof buf, "microbatches=%lld", (long long)tc.microbatches * 2);
    out[n++] = (Probe){NULL, intern(c->strings, buf)};
    if (tensor && !tc.sequence_parallel)
        out[n++] = (Probe){NULL, "sequence_parallel=true"};
    return n;
}

static Loc budget_loc(const Graph *g)
{
    for (int i = 0; i < g->mesh.naxes; i++)
        if (g->mesh.axes[i].loc.line > 0)
            return g->mesh.axes[i].loc;
    return g->ops.len ? g->ops.data[0]->loc : LOC_NONE;
}

/* bytes as "79.65 GiB" or "41.2 MiB" into buf. */
static const char *size_str(char *buf, size_t n, double bytes)
{
    if (bytes >= GIB)
        snprintf(buf, n, "%.2f GiB", bytes / GIB);
    else
        snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    return buf;
}

/* The refusal of a plan over budget: the stage, peak and budget, the five
 * largest tensors, and every lever with the peak it would give. */
static void refuse(Ctx *c, const Options *o, const Graph *g, const MemoryModel *mm, double budget)
{
    const StageMemory *sm = &mm->stage[mm->peak_stage];
    char a[32], b[32];
    diag_error(&c->diag, budget_loc(g),
               "the plan does not fit: stage %d needs %s per device at the %s, over the %s of %s",
               mm->peak_stage, size_str(a, sizeof a, sm->peak), sm->moment,
               size_str(b, sizeof b, budget), o->device_memory > 0 ? "--device-memory" : o->gpu);
    for (int i = 0; i < sm->ntop; i++)
        diag_note(&c->diag, sm->top[i].loc, "%s (%s): %s%s", sm->top[i].name,
                  mem_cat_name(sm->top[i].cat),
                  size_str(a, sizeof a, sm->top[i].bytes * sm->top[i].count),
                  sm->top[i].count > 1 ? " over the microbatches in flight" : "");
    Probe lv[24];
    int n = levers(c, g, lv);
    for (int i = 0; i < n; i++) {
        ProbeResult r;
        probe(c, o, &lv[i], &r);
        if (r.ok)
            diag_note(&c->diag, LOC_NONE, "%s%s: peak %s%s", lv[i].mesh ? "--mesh " : "--set ",
                      lv[i].mesh ? lv[i].mesh : lv[i].set, size_str(a, sizeof a, r.peak),
                      r.peak <= budget ? " (fits)" : "");
    }
}

/* ---- recompute = auto ---- */

/* The i-th layer of a stage (of n) at level k in [0, 2n]: k <= n: the first
 * k selective; k > n: all selective, the first k - n full. More recompute,
 * less memory, as k grows. */
static signed char auto_mode(int i, int n, int k)
{
    if (k <= n)
        return i < k ? RC_SELECTIVE : RC_NONE;
    return i < k - n ? RC_FULL : RC_SELECTIVE;
}

typedef struct Auto {
    int nlayers, nstages;
    int *stage_of;   /* by layer */
    int *index;      /* by layer: its place among its stage's layers */
    int *count;      /* by stage: layers */
    signed char *mode;
} Auto;

static void auto_apply(Ctx *c, Auto *a, const int *k)
{
    for (int l = 0; l < a->nlayers; l++) {
        int s = a->stage_of[l];
        a->mode[l] = s < 0 ? RC_NONE : auto_mode(a->index[l], a->count[s], k[s]);
    }
    c->recompute_layers = a->mode;
    c->nrecompute_layers = a->nlayers;
}

static void auto_layers(Ctx *c, Auto *a, const ProbeResult *r)
{
    a->nstages = r->nstages;
    a->nlayers = 0;
    for (int l = 0; l < 4096; l++)
        if (r->layer_stage[l] >= 0)
            a->nlayers = l + 1;
    a->stage_of = arena_alloc(c->arena, sizeof(int) * (size_t)(a->nlayers + 1));
    a->index = arena_alloc(c->arena, sizeof(int) * (size_t)(a->nlayers + 1));
    a->count = arena_alloc(c->arena, sizeof(int) * (size_t)(a->nstages + 1));
    a->mode = arena_alloc(c->arena, (size_t)a->nlayers + 1);
    memset(a->count, 0, sizeof(int) * (size_t)(a->nstages + 1));
    for (int l = 0; l < a->nlayers; l++) {
        a->stage_of[l] = r->layer_stage[l];
        a->index[l] = a->stage_of[l] >= 0 ? a->count[a->stage_of[l]]++ : 0;
    }
}

/* Per stage, the least recompute whose peak fits: a binary search over the
 * levels of all stages at once (a stage's peak depends on its own layers). */
static int choose_recompute(Ctx *c, const Options *o, double budget)
{
    ProbeResult r;
    Auto a;
    c->recompute_layers = NULL;
    c->nrecompute_layers = 0;
    probe(c, o, &(Probe){NULL, "recompute=none"}, &r);
    if (!r.ok)
        return -1;
    auto_layers(c, &a, &r);
    int lo[1024], hi[1024], k[1024];
    for (int s = 0; s < a.nstages; s++)
        lo[s] = 0, hi[s] = r.stage_peak[s] <= budget ? 0 : 2 * a.count[s];
    for (int busy = 1; busy;) {
        busy = 0;
        for (int s = 0; s < a.nstages; s++)
            k[s] = lo[s] < hi[s] ? (lo[s] + hi[s]) / 2 : hi[s], busy |= lo[s] < hi[s];
        if (!busy)
            break;
        auto_apply(c, &a, k);
        probe(c, o, NULL, &r);
        for (int s = 0; r.ok && s < a.nstages; s++)
            if (lo[s] < hi[s])
                *(r.stage_peak[s] <= budget ? &hi[s] : &lo[s]) = k[s] + (r.stage_peak[s] > budget);
        if (!r.ok)
            return -1;
    }
    auto_apply(c, &a, hi);
    return 0;
}

/* "recompute = auto: stage 0: layers 0-3 full, 4-5 selective, 6-11 none" */
static void print_auto(FILE *f, const Ctx *c)
{
    static const char *const names[] = {"none", "selective", "full"};
    fprintf(f, "recompute = auto:");
    for (int l = 0; l < c->nrecompute_layers;) {
        int e = l;
        while (e + 1 < c->nrecompute_layers && c->recompute_layers[e + 1] == c->recompute_layers[l])
            e++;
        fprintf(f, "%s layer%s %d", l ? "," : "", e > l ? "s" : "", l);
        if (e > l)
            fprintf(f, "-%d", e);
        fprintf(f, " %s", names[c->recompute_layers[l]]);
        l = e + 1;
    }
    fputc('\n', f);
}

/* ---- --emit=memory ---- */

static void print_header(FILE *f, const Graph *g, const MemoryModel *mm, const Options *o, double budget)
{
    CgMemory m;
    cg_memory(g, &m);
    fprintf(f, "memory per device, mesh");
    for (int i = 0; i < g->mesh.naxes; i++)
        fprintf(f, "%s%s=%d", i ? " x " : " ", g->mesh.axes[i].name, g->mesh.axes[i].size);
    fprintf(f, " (%lld devices), %d microbatch%s, %s schedule\n", (long long)ir_mesh_size(&g->mesh),
            mm->microbatches, mm->microbatches == 1 ? "" : "es", mm->schedule);
    fprintf(f, "device: %s", on_gpu(o) ? pass_device_lookup(o->gpu)->what : "cpu (this runtime)");
    if (budget > 0)
        fprintf(f, ", budget %.0f bytes (%.2f GiB)", budget, budget / GIB);
    fprintf(f, "\ntraining state of the whole model per device (before pipeline stages):\n");
    fprintf(f, "  parameters       %14.0f bytes\n", m.params);
    fprintf(f, "  gradients        %14.0f bytes\n", m.grads);
    fprintf(f, "  optimizer state  %14.0f bytes\n", m.state);
    fprintf(f, "  training state   %14.0f bytes\n", m.params + m.grads + m.state);
}

/* -o FILE (JSON when it ends in .json), else stdout; NULL after reporting. */
static FILE *open_out(const Options *o, int *json)
{
    *json = o->out && strlen(o->out) > 5 && !strcmp(o->out + strlen(o->out) - 5, ".json");
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f)
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out, strerror(errno));
    return f;
}

static int emit_memory(Ctx *c, const Options *o, double budget)
{
    MemoryModel mm;
    Graph *g;
    if (model_in(c, o, NULL, &mm, &g) != 0)
        return -1;
    int json;
    FILE *f = open_out(o, &json);
    if (!f)
        return -1;
    if (json) {
        char *text = pass_memory_json(&mm, g->name, on_gpu(o) ? o->gpu : "cpu", budget);
        fputs(text, f);
        fputc('\n', f);
        free(text);
    } else {
        print_header(f, g, &mm, o, budget);
        if (c->recompute_layers)
            print_auto(f, c);
        fprintf(f, "the largest moment of each stage's step:\n");
        pass_memory_print(f, &mm, budget);
    }
    if (o->out && fclose(f) != 0) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out);
        return -1;
    }
    if (budget > 0 && mm.peak > budget)
        return refuse(c, o, g, &mm, budget), -1;
    return 0;
}

/* ---- --emit=cost ---- */

/* The device's name in the header: the cluster, or the CPU and its share. */
static const char *device_text(Ctx *c, const Options *o, const CostDevice *d)
{
    if (!d->cpu)
        return o->cluster_spec.what;
    return arena_printf(c->arena, "this machine's CPU (%s): %g cores, %d thread%s per device "
                                  "at %.2f of a core each",
                        d->what, d->host->v[CPU_CORES], d->threads, d->threads == 1 ? "" : "s",
                        d->share);
}

static int emit_cost(Ctx *c, Options *o)
{
    CostDevice d;
    OneStep one;
    MemoryModel mm;
    CostModel cm;
    if (compile_one(c, o, NULL, &one) != 0 || cost_device(c, o, &one.plan, &d) != 0 ||
        pass_memory_model(c, one.g, one.local, &one.plan, !d.cpu, &mm) != 0 ||
        pass_cost_model(c, one.g, one.local, &one.plan, &d, &cm) != 0)
        return -1;
    double budget = budget_of(o);
    if (d.cpu && budget <= 0) /* the devices of the threads backend share the memory */
        budget = d.host->v[CPU_MEMORY] * GIB / cm.devices;
    int json;
    FILE *f = open_out(o, &json);
    if (!f)
        return -1;
    if (json) {
        char *text = pass_cost_json(&cm, one.g->name, d.name);
        cJSON *root = cJSON_Parse(text);
        free(text);
        cJSON_AddNumberToObject(root, "peak_memory_bytes", mm.peak);
        cJSON_AddBoolToObject(root, "fits", mm.peak <= budget);
        text = cJSON_Print(root);
        cJSON_Delete(root);
        fprintf(f, "%s\n", text);
        free(text);
    } else {
        fprintf(f, "cost of one step, mesh");
        for (int i = 0; i < one.g->mesh.naxes; i++)
            fprintf(f, "%s%s=%d", i ? " x " : " ", one.g->mesh.axes[i].name,
                    one.g->mesh.axes[i].size);
        fprintf(f, " (%.0f devices) on %s\n", cm.devices, device_text(c, o, &d));
        pass_cost_print(f, &cm);
        fprintf(f, "memory: peak %.2f GiB per device (stage %d) of %.2f GiB: %s\n", mm.peak / GIB,
                mm.peak_stage, budget / GIB, mm.peak <= budget ? "fits" : "does not fit");
    }
    if (o->out && fclose(f) != 0) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out);
        return -1;
    }
    return 0;
}

/* --emit=trace: the schedule of the step with each piece as long as the cost
 * model says on the device (--emit=cost's), as a Chrome trace. */
static int emit_trace(Ctx *c, Options *o)
{
    CostDevice d;
    OneStep one;
    CostModel cm;
    if (compile_one(c, o, NULL, &one) != 0 || cost_device(c, o, &one.plan, &d) != 0 ||
        pass_cost_model(c, one.g, one.local, &one.plan, &d, &cm) != 0)
        return -1;
    int json;
    FILE *f = open_out(o, &json);
    if (!f)
        return -1;
    int bad = sched_write_trace(&cm.sched, &cm.times, 1e6, f) != 0;
    if (o->out ? fclose(f) != 0 || bad : bad) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out ? o->out : "<stdout>");
        return -1;
    }
    fprintf(o->out ? stdout : stderr, /* keep stdout pure JSON */
            "%s schedule: %d stages, %d microbatches, %d virtual stages on %s: step %.3f ms, "
            "the pieces %.3f ms of it, bubble fraction %.4f (the trace's durations)\n",
            cm.schedule, cm.sched.p, cm.sched.m, cm.sched.v, device_text(c, o, &d),
            cm.step_s * 1e3, cm.times.makespan * 1e3, cm.times.bubble);
    return 0;
}

/* Before a plan is built: recompute = auto chosen, and the step's peak
 * checked against the budget (a plan over it is refused). */
static int fit_budget(Ctx *c, const Options *o, const Graph *g)
{
    double budget = budget_of(o);
    TrainConfig tc;
    char err[256];
    if (ir_train_config(g, &tc, err, sizeof err) != 0)
        return 0; /* the passes report it */
    if (!strcmp(tc.recompute, "auto")) {
        if (budget <= 0)
            return diag_error(&c->diag, budget_loc(g),
                              "recompute = auto needs a device budget (--gpu NAME or "
                              "--device-memory SIZE)"),
                   -1;
        if (choose_recompute(c, o, budget) != 0)
            return -1;
        if (!o->emit || strcmp(o->emit, "memory"))
            print_auto(stderr, c);
    }
    int builds = (o->emit && strcmp(o->emit, "ir")) || (!o->emit && o->out);
    if (budget <= 0 || !builds || (o->emit && (!strcmp(o->emit, "memory") || !strcmp(o->emit, "cost"))))
        return 0;
    MemoryModel mm;
    Graph *gm;
    if (model_in(c, o, NULL, &mm, &gm) != 0)
        return -1;
    if (c->verbose)
        fprintf(stderr, "tcc: memory     peak %.2f GiB per device (stage %d) of %.2f GiB\n",
                mm.peak / GIB, mm.peak_stage, budget / GIB);
    return mm.peak > budget ? (refuse(c, o, gm, &mm, budget), -1) : 0;
}

/* ---- --plan=auto (passes/planner.c) ---- */

/* What the planner needs to know of the model: its layers, its global batch
 * (rows of the first data input) and the names of its mesh axes by role. */
typedef struct ModelShape {
    int layers;
    int64_t batch;
    const char *axis[ROLE_COUNT];
} ModelShape;

static int model_shape(Ctx *c, const Options *o, ModelShape *ms)
{
    Options q = *o;
    q.dump_after = q.stop_after = NULL;
    memset(ms, 0, sizeof *ms);
    Graph *g = load(c, &q);
    if (!g || apply_settings(c, &q, g) != 0)
        return -1;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->layer + 1 > ms->layers)
            ms->layers = op->layer + 1;
        if (op->kind == OP_INPUT && !ms->batch && op->res[0]->rank > 0)
            ms->batch = op->res[0]->shape[0];
    }
    for (int i = g->mesh.naxes - 1; i >= 0; i--)
        ms->axis[g->mesh.axes[i].role] = g->mesh.axes[i].name;
    if (!ms->batch)
        return fprintf(stderr, "tcc: error: --plan=auto: the model has no data input to split\n"), -1;
    return 0;
}

/* o with more --set settings (the planner's choices). */
static Options with_sets(const Options *o, const char *const *sets, int n)
{
    Options q = *o;
    if (q.nsets + n > MAX_SETS)
        BUG("%d --set settings and %d of the planner's", q.nsets, n); /* check_plan_options */
    for (int i = 0; i < n; i++)
        q.sets[q.nsets++] = sets[i];
    return q;
}

/* A compile in a context of its own whose diagnostics are kept in why[] (the
 * first line): the step of one microbatch on mesh, its memory and cost. */
typedef struct Trial {
    int ok;
    char why[160];
    double saved_layers; /* stage 0's: what a microbatch's forward holds in layers */
    MemoryModel mm;
    CostModel cm;
    CostProfile prof;
} Trial;

static void trial(Ctx *c, const Options *o, const char *mesh, int repeat_limit, const CostDevice *d,
                  Trial *t)
{
    char *text = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&text, &len);
    Ctx *q = ctx_new(log ? log : stderr);
    for (int i = 0; i < c->defines.len; i++)
        VEC_PUSH(q->arena, q->defines, c->defines.data[i]);
    q->mesh_spec = mesh;
    q->repeat_limit = repeat_limit;
    OneStep one;
    memset(t, 0, sizeof *t);
    int auto_rc = 0; /* --set recompute=auto: each layer's level chosen first, as fit_budget does */
    for (int i = 0; i < o->nsets; i++)
        auto_rc = !strcmp(o->sets[i], "recompute=auto") ? 1 : !strncmp(o->sets[i], "recompute=", 10) ? 0 : auto_rc;
    t->ok = (!auto_rc || choose_recompute(q, o, budget_of(o)) == 0) &&
            compile_one(q, o, NULL, &one) == 0 &&
            pass_memory_model(q, one.g, one.local, &one.plan, 1, &t->mm) == 0 &&
            (repeat_limit ? pass_cost_profile(q, one.g, one.local, &one.plan, &t->mm, d, &t->prof)
                          : pass_cost_model(q, one.g, one.local, &one.plan, d, &t->cm)) == 0;
    if (t->ok) { /* the model's stages live in q's arena: keep the numbers only */
        t->saved_layers = t->mm.stage[0].saved_layers;
        t->mm.stage = NULL;
        memset(&t->cm.sched, 0, sizeof t->cm.sched);
        memset(&t->cm.times, 0, sizeof t->cm.times);
        t->cm.stage = NULL;
    }
    ctx_free(q);
    if (log)
        fclose(log);
    const char *e = text ? strstr(text, "error: ") : NULL;
    snprintf(t->why, sizeof t->why, "%.*s", e ? (int)strcspn(e + 7, "\n") : 0, e ? e + 7 : "");
    free(text);
}

static const char *rc_name(int rc)
{
    return rc == PLAN_RC_AUTO   ? "auto"
           : rc == RC_FULL      ? "full"
           : rc == RC_SELECTIVE ? "selective"
                                : "none";
}

/* The mesh and --set settings of a choice, by name (pipeline, data, tensor:
 * the tensor groups innermost, in a node). */
static void choice_args(Ctx *c, const ModelShape *ms, const PlanChoice *ch, const char **mesh,
                        const char **sets, int *nsets)
{
    const char *spec = NULL; /* NULL: a model without mesh axes, one device */
    const char *names[3] = {ms->axis[ROLE_PIPELINE], ms->axis[ROLE_DATA], ms->axis[ROLE_TENSOR]};
    int sizes[3] = {ch->pp, ch->dp, ch->tp};
    for (int i = 0; i < 3; i++)
        if (names[i])
            spec = arena_printf(c->arena, "%s%s%s=%d", spec ? spec : "", spec ? "," : "", names[i],
                                sizes[i]);
    *mesh = spec ? intern(c->strings, spec) : NULL;
    int n = 0;
    sets[n++] = arena_printf(c->arena, "microbatches=%d", ch->m);
    sets[n++] = arena_printf(c->arena, "recompute=%s", rc_name(ch->rc));
    sets[n++] = arena_printf(c->arena, "zero=%d", ch->zero);
    if (ms->axis[ROLE_TENSOR])
        sets[n++] = ch->tp > 1 ? "sequence_parallel=true" : "sequence_parallel=false";
    if (ch->pp > 1) {
        sets[n++] = arena_printf(c->arena, "schedule=%s",
                                 ch->sched == SCHED_INTERLEAVED ? "interleaved"
                                 : ch->sched == SCHED_ZB_H1     ? "zb"
                                 : ch->sched == SCHED_GPIPE     ? "gpipe"
                                                                : "1f1b");
        if (ch->sched == SCHED_INTERLEAVED)
            sets[n++] = arena_printf(c->arena, "virtual_stages=%d", ch->v);
    }
    *nsets = n;
}

static void print_choice(FILE *f, int rank, const PlanChoice *ch)
{
    char sched[32];
    if (ch->pp == 1)
        snprintf(sched, sizeof sched, "-");
    else if (ch->sched == SCHED_INTERLEAVED)
        snprintf(sched, sizeof sched, "interleaved/%d", ch->v);
    else
        snprintf(sched, sizeof sched, "%s", sched_kind_name(ch->sched));
    fprintf(f, "  %d. tp %-3d pp %-4d dp %-6d %3d x %d rows, zero %d, recompute %-9s %-14s "
               "step %9.4g s  MFU %5.1f%%  peak %6.2f GiB\n",
            rank, ch->tp, ch->pp, ch->dp, ch->m, ch->mbs, ch->zero, rc_name(ch->rc), sched,
            ch->step_s, 100 * ch->mfu, ch->peak / GIB);
}

/* Why the best of a (tp, pp) family lost to the winner w: its largest gap. */
static void family_reason(const PlanSpace *sp, const PlanChoice *best, const PlanChoice *w,
                          char *buf, size_t n)
{
    double gaps[4] = {best->bubble_s - w->bubble_s, best->comm_s - w->comm_s,
                      best->compute_s - w->compute_s, best->opt_s - w->opt_s};
    int k = 0;
    for (int i = 1; i < 4; i++)
        if (gaps[i] > gaps[k])
            k = i;
    if (best->tp > sp->d->per_node)
        snprintf(buf, n, "tensor-parallel traffic across nodes (tp %d > %d per node): step %.4g s",
                 best->tp, sp->d->per_node, best->step_s);
    else if (k == 0)
        snprintf(buf, n, "slower because of the bubble: %.4g s against %.4g s (step %.4g s)",
                 best->bubble_s, w->bubble_s, best->step_s);
    else if (k == 1)
        snprintf(buf, n, "slower because of exposed data-parallel communication: %.4g s against "
                         "%.4g s (step %.4g s)", best->comm_s, w->comm_s, best->step_s);
    else if (k == 2)
        snprintf(buf, n, "slower compute per device (%s): %.4g s against %.4g s (step %.4g s)",
                 best->rc != RC_NONE ? "recomputation, smaller GEMMs" : "smaller GEMMs, more "
                 "tensor-parallel collectives", best->compute_s, w->compute_s, best->step_s);
    else
        snprintf(buf, n, "slower optimizer (less sharded): %.4g s (step %.4g s)", best->opt_s,
                 best->step_s);
}

static void print_families(FILE *f, const PlanSpace *sp, const PlanChoice *all, int n,
                           const PlanChoice *w)
{
    fprintf(f, "families (tensor x pipeline) not chosen:\n");
    int most = 1;
    for (int k = 0; k < sp->nprof; k++) {
        int tp = sp->prof[k].tp;
        most = tp > most ? tp : most;
        for (int pp = 1; pp <= sp->gpus / tp; pp++) {
            const PlanChoice *best = NULL, *least = NULL;
            int any = 0;
            for (int i = 0; i < n; i++) {
                const PlanChoice *c = &all[i];
                if (c->tp != tp || c->pp != pp)
                    continue;
                any = 1;
                if (c->status == PLAN_FITS && (!best || c->step_s < best->step_s))
                    best = c;
                if (c->status == PLAN_OVER && (!least || c->peak < least->peak))
                    least = c;
            }
            if ((sp->gpus / tp) % pp || (tp == w->tp && pp == w->pp) || (pp > 1 && pp > sp->layers) ||
                (pp > 1 && !(sp->axes & 4)))
                continue;
            char why[256];
            const CostProfile *P = NULL;
            for (int i = 0; i < sp->nprof; i++)
                if (sp->prof[i].tp == tp)
                    P = &sp->prof[i];
            if (P && !P->ok)
                snprintf(why, sizeof why, "does not divide: %s", P->why);
            else if (!best && least)
                snprintf(why, sizeof why, "does not fit: at least %.2f GiB per device",
                         least->peak / GIB);
            else if (!any || !best)
                snprintf(why, sizeof why, "does not divide: the batch of %lld rows over %d data "
                                          "ranks", (long long)sp->batch, sp->gpus / tp / pp);
            else
                family_reason(sp, best, w, why, sizeof why);
            fprintf(f, "  tp %-3d pp %-4d %s\n", tp, pp, why);
        }
    }
    if (most < sp->gpus)
        fprintf(f, "  tp > %d: not considered: tensor-parallel groups over more than two nodes\n",
                most);
}

static void explain(FILE *f, const PlanSpace *sp, const PlanChoice *all, int n, const PlanChoice *w)
{
    double t = w->step_s;
    fprintf(f, "why this plan:\n");
    fprintf(f, "  its step: compute %.1f%%, pipeline bubble %.1f%%, exposed data-parallel "
               "communication %.1f%%, optimizer %.1f%%\n",
            100 * w->compute_s / t, 100 * w->bubble_s / t, 100 * w->comm_s / t, 100 * w->opt_s / t);
    fprintf(f, "  memory: %.2f of %.2f GiB per device (%.0f%% used)\n", w->peak / GIB,
            sp->budget / GIB, 100 * w->peak / sp->budget);
    /* what binds: the faster candidates of any layout that do not fit */
    const PlanChoice *faster = NULL;
    for (int i = 0; i < n; i++)
        if (all[i].status == PLAN_OVER && all[i].step_s < t && (!faster || all[i].step_s < faster->step_s))
            faster = &all[i];
    if (faster)
        fprintf(f, "  memory binds: the fastest layout over it (tp %d, pp %d, dp %d, %d x %d rows, "
                   "zero %d, recompute %s) would take %.4g s but needs %.2f GiB\n",
                faster->tp, faster->pp, faster->dp, faster->m, faster->mbs, faster->zero,
                rc_name(faster->rc), faster->step_s, faster->peak / GIB);
    else
        fprintf(f, "  memory does not bind: no faster layout was over the budget\n");
    if (w->bubble_s > w->comm_s && w->bubble_s > 0.02 * t)
        fprintf(f, "  the bubble binds next: %d microbatches of %d rows per data rank (the batch "
                   "of %lld rows over %d data ranks)\n",
                w->m, w->mbs, (long long)sp->batch, w->dp);
    else if (w->comm_s > 0.02 * t)
        fprintf(f, "  exposed communication binds next: the gradients' reduction over %d data "
                   "ranks outlasts the last backward\n", w->dp);
    else
        fprintf(f, "  compute binds: %.1f%% of the step is the devices' own work\n",
                100 * w->compute_s / t);
    for (int i = 0; i < n; i++)
        if (all[i].status == PLAN_FITS && (all[i].tp != w->tp || all[i].pp != w->pp)) {
            fprintf(f, "  the fastest other layout (tp %d, pp %d) is predicted %.1f%% %s\n",
                    all[i].tp, all[i].pp, 100 * fabs(all[i].step_s / t - 1),
                    all[i].step_s >= t ? "slower" : "faster (it lost when compiled)");
            break;
        }
}

static double plan_ms(void);

#define PLAN_CHECKS 3 /* layouts compiled to check the search's best */

/* Candidate i has the mesh and rows of one already compiled that fit (only
 * ZeRO, recompute or the schedule differ): compiling it tells little more. */
static int same_layout(const PlanChoice *all, const char *fitted, int i)
{
    for (int j = 0; j < i; j++)
        if (fitted[j] && all[j].tp == all[i].tp && all[j].pp == all[i].pp &&
            all[j].mbs == all[i].mbs)
            return 1;
    return 0;
}

/* Choose the plan: profiles at each tensor-parallel size, the analytic search,
 * the best checked by compiling it; then c and o say that plan. */
static int plan_auto(Ctx *c, Options *o)
{
    double t0 = plan_ms();
    ModelShape ms;
    CostDevice d;
    cost_device_of_cluster(&o->cluster_spec, &d);
    if (model_shape(c, o, &ms) != 0)
        return -1;
    CostProfile prof[16];
    int nprof = 0;
    for (int tp = 1; tp <= o->gpus && tp <= 2 * d.per_node && nprof < 16; tp *= 2) {
        if (o->gpus % tp || (tp > 1 && !ms.axis[ROLE_TENSOR]))
            continue;
        /* two data ranks, so the gradients' shardings are a data-parallel step's; the
         * step three times: without recomputation and ZeRO (times, what is held),
         * selective under ZeRO 1 (what is held then), full (recompute's times) */
        int dp = ms.axis[ROLE_DATA] && ms.batch % 2 == 0 && o->gpus >= 2 * tp ? 2 : 1;
        char mesh[128] = "";
        if (dp > 1)
            snprintf(mesh, sizeof mesh, "%s=%d", ms.axis[ROLE_DATA], dp);
        if (tp > 1)
            snprintf(mesh + strlen(mesh), sizeof mesh - strlen(mesh), "%s%s=%d", dp > 1 ? "," : "",
                     ms.axis[ROLE_TENSOR], tp);
        static const char *const modes[3][2] = {
            {"recompute=none", "zero=0"}, {"recompute=selective", "zero=1"}, {"recompute=full", "zero=0"}};
        Trial t[3];
        for (int k = 0; k < 3; k++) {
            const char *sets[5] = {arena_printf(c->arena, "microbatches=%lld", (long long)ms.batch / dp),
                                   modes[k][0], dp > 1 ? modes[k][1] : "zero=0",
                                   tp > 1 ? "sequence_parallel=true" : "sequence_parallel=false",
                                   "schedule=1f1b"};
            Options q = with_sets(o, sets, 5);
            trial(c, &q, *mesh ? intern(c->strings, mesh) : NULL, 1, &d, &t[k]);
        }
        CostProfile *P = &prof[nprof];
        *P = t[0].prof;
        P->tp = tp;
        P->ok = t[0].ok && t[1].ok && t[2].ok;
        snprintf(P->why, sizeof P->why, "%s", !t[0].ok ? t[0].why : !t[1].ok ? t[1].why : t[2].why);
        /* held per microbatch by a layer, by the memory model of each (one layer, one row) */
        P->act_none = t[0].saved_layers, P->act_sel = t[1].saved_layers, P->act_full = t[2].saved_layers;
        P->t_r = t[2].prof.t_r, P->t_rsel = t[1].prof.t_r;
        P->params1 = dp > 1 ? t[1].prof.params : P->params;
        nprof++;
    }
    PlanSpace sp = {.gpus = o->gpus, .layers = ms.layers, .batch = ms.batch, .d = &d,
                    .budget = budget_of(o), .prof = prof, .nprof = nprof};
    sp.axes = (ms.axis[ROLE_DATA] ? 1 : 0) | (ms.axis[ROLE_TENSOR] ? 2 : 0) |
              (ms.axis[ROLE_PIPELINE] ? 4 : 0);
    PlanChoice *all;
    int n;
    pass_plan_search(c->arena, &sp, &all, &n);
    double searched = plan_ms() - t0;
    int nfit = 0;
    while (nfit < n && all[nfit].status == PLAN_FITS)
        nfit++;
    fprintf(stderr, "plan: %d candidates for %d %s on %d devices in %.0f ms, %d fit %.2f GiB\n", n,
            ms.layers, ms.layers == 1 ? "layer" : "layers", o->gpus, searched, nfit,
            sp.budget / GIB);
    if (!n) {
        diag_error(&c->diag, LOC_NONE, "--plan=auto: no layout spreads %d devices over the "
                   "model's %s%s%s axis", o->gpus, ms.axis[ROLE_DATA] ? "data" : "(no data)",
                   ms.axis[ROLE_TENSOR] ? ", tensor" : ", (no tensor)",
                   ms.axis[ROLE_PIPELINE] ? " and pipeline" : " and (no pipeline)");
        diag_note(&c->diag, LOC_NONE, "a layout needs tensor x pipeline x data = %d, with the "
                  "batch of %lld rows a multiple of data x rows per microbatch, at most one "
                  "pipeline stage per layer (%d), tensor sizes a power of two up to %d, and every "
                  "axis at most 65536", o->gpus, (long long)ms.batch, ms.layers, 2 * d.per_node);
        return -1;
    }
    if (!nfit) {
        diag_error(&c->diag, LOC_NONE, "--plan=auto: no layout of %d devices fits %.2f GiB",
                   o->gpus, sp.budget / GIB);
        const PlanChoice *least = NULL;
        for (int i = 0; i < n; i++)
            if (all[i].status == PLAN_OVER && (!least || all[i].peak < least->peak))
                least = &all[i];
        if (least)
            diag_note(&c->diag, LOC_NONE, "the least memory: %.2f GiB (tp %d, pp %d, dp %d)",
                      least->peak / GIB, least->tp, least->pp, least->dp);
        return -1;
    }
    fprintf(stderr, "the five fastest predicted to fit:\n");
    for (int i = 0; i < nfit && i < 5; i++)
        print_choice(stderr, i + 1, &all[i]);
    /* The fastest that the compiled plan's own models confirm: the first
     * PLAN_CHECKS distinct layouts predicted to fit are compiled, and the
     * fastest compiled one that fits wins. A candidate that does not fit when
     * compiled teaches how far the analytic peak was under for its (tensor,
     * pipeline) family: the family's next ones must fit with that margin. */
    struct { int tp, pp; double under; } learnt[8];
    int nlearnt = 0, best = -1, checked = 0;
    char *fitted = arena_alloc(c->arena, (size_t)n + 1); /* zeroed */
    Trial won = {0};
    for (int i = 0, tries = 0; i < nfit && tries < 8 && checked < PLAN_CHECKS; i++) {
        double under = 1;
        for (int k = 0; k < nlearnt; k++)
            if (learnt[k].tp == all[i].tp && learnt[k].pp == all[i].pp)
                under = learnt[k].under;
        if (all[i].peak * under > sp.budget || same_layout(all, fitted, i))
            continue;
        tries++;
        const char *mesh, *sets[8];
        int nsets;
        choice_args(c, &ms, &all[i], &mesh, sets, &nsets);
        Options q = with_sets(o, sets, nsets);
        Trial t;
        trial(c, &q, mesh, 0, &d, &t);
        if (!t.ok || t.mm.peak > sp.budget) {
            fprintf(stderr, "plan: candidate %d %s when compiled%s%s%s\n", i + 1,
                    t.ok ? "does not fit" : "fails", t.ok ? "" : ": ", t.ok ? "" : t.why,
                    t.ok ? arena_printf(c->arena, " (%.2f GiB against %.2f predicted)",
                                        t.mm.peak / GIB, all[i].peak / GIB) : "");
            if (t.ok && nlearnt < 8)
                learnt[nlearnt].tp = all[i].tp, learnt[nlearnt].pp = all[i].pp,
                learnt[nlearnt++].under = t.mm.peak / all[i].peak;
            continue;
        }
        checked++;
        fitted[i] = 1;
        fprintf(stderr, "plan: candidate %d compiled: step %.4g s, peak %.2f GiB (predicted %.4g s, "
                        "%.2f GiB)\n", i + 1, t.cm.step_s, t.mm.peak / GIB, all[i].step_s,
                all[i].peak / GIB);
        if (best < 0 || t.cm.step_s < won.cm.step_s)
            best = i, won = t;
    }
    if (best < 0) {
        diag_error(&c->diag, LOC_NONE, "--plan=auto: none of the best candidates fits when compiled");
        return -1;
    }
    /* The winner recomputes uniformly: the compiler's per-layer choice
     * (recompute = auto, from the compiled plan's own memory model) may fit
     * with less recomputation than the analytic peak allowed. */
    if (all[best].rc == RC_SELECTIVE || all[best].rc == RC_FULL) {
        PlanChoice ch = all[best];
        ch.rc = PLAN_RC_AUTO;
        const char *m2, *s2[8];
        int n2;
        choice_args(c, &ms, &ch, &m2, s2, &n2);
        Options q = with_sets(o, s2, n2);
        Trial t;
        trial(c, &q, m2, 0, &d, &t);
        int better = t.ok && t.mm.peak <= sp.budget && t.cm.step_s < won.cm.step_s;
        fprintf(stderr, "plan: candidate %d with recompute = auto: %s", best + 1,
                !t.ok ? "fails: " : better ? "step " : "no faster: step ");
        if (t.ok)
            fprintf(stderr, "%.4g s, peak %.2f GiB\n", t.cm.step_s, t.mm.peak / GIB);
        else
            fprintf(stderr, "%s\n", t.why);
        if (better)
            all[best].rc = PLAN_RC_AUTO, won = t;
    }
    const char *mesh, *sets[8];
    int nsets;
    choice_args(c, &ms, &all[best], &mesh, sets, &nsets);
    print_families(stderr, &sp, all, n, &all[best]);
    if (o->explain)
        explain(stderr, &sp, all, n, &all[best]);
    fprintf(stderr, "plan: chose candidate %d:%s%s", best + 1, mesh ? " --mesh " : "",
            mesh ? mesh : "");
    for (int k = 0; k < nsets; k++)
        fprintf(stderr, " --set %s", sets[k]);
    fprintf(stderr, "\nplan: compiled: step %.4g s, MFU %.1f%%, peak %.2f GiB (predicted %.4g s, "
                    "%.2f GiB)\n",
            won.cm.step_s, 100 * won.cm.mfu, won.mm.peak / GIB, all[best].step_s,
            all[best].peak / GIB);
    c->mesh_spec = mesh;
    *o = with_sets(o, sets, nsets);
    return 0;
}

static double plan_ms(void) { return now_ms(); }

/* --why needs a mesh that splits something, and a graph not yet partitioned. */
static int why_graph(const Ctx *c, const Options *o, const Graph *g)
{
    int split = 0;
    for (int ax = 0; ax < g->mesh.naxes; ax++)
        split |= g->mesh.axes[ax].size > 1 && g->mesh.axes[ax].role != ROLE_PIPELINE;
    if (!split && !c->mesh_spec && !o->from_ir)
        return fail("%s", "--why explains how values are split over the mesh: give its sizes "
                          "with --mesh (e.g. --mesh 2x2); without it every axis has size 1");
    if (!split)
        return fail("--why: on the mesh %s no value is split (every axis but the pipeline's has "
                    "size 1): give larger sizes",
                    c->mesh_spec ? c->mesh_spec : "of the IR file");
    for (int i = 0; i < g->ops.len; i++)
        if (g->ops.data[i]->kind >= OP_ALL_REDUCE && g->ops.data[i]->kind <= OP_SHARD_SLICE)
            return fail("--why %s: the IR is partitioned already; give one dumped before the "
                        "partition pass (--dump-after=shard)",
                        o->why[0]);
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
    if (o->plan_auto && plan_auto(c, o) != 0)
        return -1;
    Graph *g = load(c, o);
    if (!g || apply_settings(c, o, g) != 0 || verify(c, o, g, o->from_ir ? "parse-ir" : "lower") != 0)
        return -1;
    if (o->emit && !strcmp(o->emit, "trace"))
        return o->from_ir ? fail("%s", "--emit=trace compiles the TDL input: give a TDL file")
                          : emit_trace(c, o);
    if (o->emit && !strcmp(o->emit, "schedule"))
        return emit_schedule(c, o, g);
    if (!o->from_ir && fit_budget(c, o, g) != 0)
        return -1;
    if (o->emit && !strcmp(o->emit, "memory") && !o->from_ir)
        return emit_memory(c, o, budget_of(o));
    if (o->emit && !strcmp(o->emit, "cost"))
        return o->from_ir ? fail("%s", "--emit=cost compiles the TDL input: give a TDL file")
                          : emit_cost(c, o);
    WhyChain *why[MAX_WHY];
    if (o->nwhy && why_graph(c, o, g) != 0)
        return -1;
    if (run_passes(c, o, g, o->nwhy ? why : NULL) != 0)
        return -1;
    for (int i = 0; i < o->nwhy; i++) {
        if (i)
            putchar('\n');
        pass_why_print(stdout, why[i]);
    }
    if (o->nwhy)
        return fflush(stdout) == 0 ? 0 : -1;
    if (o->verify)
        return verify_mesh(c, o, g);
    if ((o->emit && strcmp(o->emit, "ir") != 0) || (!o->emit && o->out))
        return write_plan(c, o, g);
    return o->emit ? write_ir(o, g) : 0;
}

int main(int argc, char **argv)
{
    Ctx *c = ctx_new(stderr);
    c->unroll = getenv("TCC_TEST_UNROLL") != NULL; /* tests: the step with every microbatch a copy */
    Options o = {0};
    o.zero = -1;
    int ok = parse_args(c, &o, argc, argv) == 0;
    if (ok && measures_cpu(&o))
        rt_cpu_quiet_threads(argv); /* measure as the trainers run */
    int rc = ok && (o.calibrate_cpu ? calibrate_cpu(c, &o) : run(c, &o)) == 0 ? 0 : 1;
    if (c->diag.nerrors)
        fprintf(stderr, "%d error%s generated.\n", c->diag.nerrors, c->diag.nerrors > 1 ? "s" : "");
    ctx_free(c);
    return rc;
}
