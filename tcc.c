/* tcc.c: the command line. Reads the arguments into Options, checks them,
 * and hands them to the compile API (driver/), the planner (planner/) and the
 * reports and --verify (explain/); writes what they give. Key idea: no policy
 * here, only the options and which room answers them. */
#include "explain/explain.h"
#include "planner/planner.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
            "  --place AXIS,...      place the mesh's axes on the ranks, innermost first (the\n"
            "                        GPUs of a server, then servers); default: by traffic,\n"
            "                        the tensor axis innermost\n"
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
            "  --memory-headroom SIZE  what a plan leaves free under the device's memory\n"
            "                        (default 2GiB of a GPU's, 0 of --device-memory's)\n"
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
    drv_print_stages(f);
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
    char *end, *fend;
    errno = 0;
    long long v = strtoll(eq + 1, &end, 10);
    int is_int = !errno && !*end && end != eq + 1;
    errno = 0;
    double f = strtod(eq + 1, &fend);
    if (!is_int && (errno || *fend || fend == eq + 1 || !isfinite(f)))
        return fail("-D %s: the value must be a number", arg);
    const char *name = intern_n(c->strings, arg, (size_t)(eq - arg));
    for (int i = 0; i < c->defines.len; i++)
        if (c->defines.data[i].name == name)
            return fail("-D %s: given twice", arg);
    Define d = {name, is_int ? v : 0, is_int ? (double)v : f, !is_int, 0};
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

/* ---- this machine's CPU (model/cpu_cost.c, runtime/calibrate.c) ---- */

/* --cluster FILE when the file is a CPU file (gpu = cpu): 0 read, 1 not a CPU
 * file, -1 refused. */
static int cpu_file(Ctx *c, Options *o)
{
    char err[512];
    int rc = cpu_spec_read(c->arena, o->cluster, &o->cpu, err, sizeof err);
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
                o->dump_after || o->stop_after || o->zero >= 0 || o->sequence_parallel >= 0 ||
                o->nroles || o->place || o->schedule || o->nsets || o->device_memory > 0 || o->has_headroom ||
                o->print_commands ||
                o->portable || o->mesh || c->defines.len || o->nwhy;
    if (other)
        return fail("%s", "--calibrate-cpu measures this machine and writes its CPU file: it "
                          "takes no input and no option but -o FILE");
    return 0;
}


/* --calibrate-cpu: the CPU file, to -o FILE or stdout. */
static int calibrate_cpu(Ctx *c, Options *o)
{
    if (drv_measure_cpu(c, o) != 0)
        return -1;
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f) {
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out, strerror(errno));
        return -1;
    }
    cpu_spec_write(f, &o->cpu);
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


/* --cluster NAME or FILE, else the server of --gpu: the devices and links the
 * cost model times. A cluster's GPU and --gpu must agree. */
static int resolve_cluster(Ctx *c, Options *o)
{
    char err[512];
    const ClusterSpec *named = o->cluster ? dev_cluster_lookup(o->cluster) : NULL;
    if (o->cluster && named) {
        o->cluster_spec = *named;
    } else if (o->cluster) {
        if (!strchr(o->cluster, '/') && !strchr(o->cluster, '.') && access(o->cluster, R_OK) != 0)
            return fail("--cluster=%s: no such cluster (dgx-a100, dgx-a100-40gb, h100-roce, "
                        "h100-pcie-ib, h200-roce) and not a file path", o->cluster);
        int cpu = cpu_file(c, o);
        if (cpu != 1)
            return cpu;
        if (dev_cluster_read(c->arena, o->cluster, &o->cluster_spec, err, sizeof err) != 0)
            return fail("--cluster: %s", err);
    } else if (o->gpu && strcmp(o->gpu, "cpu")) {
        o->cluster_spec = *dev_cluster_default(dev_lookup(o->gpu));
        o->cluster_spec.gpu = dev_lookup(o->gpu);
    } else {
        return 0;
    }
    if (o->gpu && !strcmp(o->gpu, "cpu"))
        return fail("--cluster %s: a cluster of GPUs, but --gpu cpu", o->cluster);
    if (o->gpu && dev_lookup(o->gpu) != o->cluster_spec.gpu) {
        fprintf(stderr, "tcc: error: --cluster %s has %s GPUs, not --gpu %s\n", o->cluster,
                o->cluster_spec.gpu->name, o->gpu);
        return -1;
    }
    o->gpu = o->cluster_spec.gpu->name;
    o->has_cluster = 1;
    return 0;
}

/* --memory-headroom is taken from a device's memory: it needs one (--gpu,
 * --cluster or --device-memory) and must leave some of it. */
static int check_headroom(const Options *o)
{
    char v[32];
    if (!o->has_headroom)
        return 0;
    snprintf(v, sizeof v, "%.0f", o->memory_headroom);
    if (drv_device_memory(o) <= 0)
        return fail("--memory-headroom=%s: no device memory to leave it in: give --gpu NAME, "
                    "--cluster NAME or --device-memory SIZE", v);
    if (o->memory_headroom >= drv_device_memory(o))
        return fail("--memory-headroom=%s bytes: not under the device's memory", v);
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
    if (o->mesh)
        return fail("--plan=auto chooses the mesh: drop --mesh %s", o->mesh);
    if (o->place)
        return fail("--plan=auto places the mesh it chooses (the tensor axis innermost): drop "
                    "--place %s", o->place);
    if (o->from_ir)
        return fail("%s", "--plan=auto compiles the TDL input: give a TDL file");
    if (o->zero >= 0 || o->sequence_parallel >= 0 || o->schedule)
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
    if (o->gpu || o->cluster || o->device_memory > 0 || o->has_headroom)
        return fail("%s", "--gpu, --cluster, --device-memory and --memory-headroom do not change a "
                          "sharding: drop them with --why");
    if (o->print_commands)
        return fail("%s", "--print-commands shows how an executable is built: --why builds none");
    return 0;
}

/* What a parse_*_arg helper returns for an argument it leaves to the next. */
enum { ARG_NOT_MINE = 1 };

/* Help, version, -v, --print-commands, --portable, --calibrate-cpu, the mesh,
 * ZeRO and --verify: 0 after the argument argv[*i] (*i past its value when
 * that is the next argument), -1 after an error, ARG_NOT_MINE for another. */
static int parse_build_arg(Ctx *c, Options *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
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
        o->verbose = 1;
    } else if ((v = opt_value(argc, argv, i, "--mesh"))) {
        o->mesh = v;
    } else if ((v = opt_value(argc, argv, i, "--zero"))) {
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
    } else if ((v = opt_value(argc, argv, i, "--verify-tol"))) {
        o->verify_tol = strtod(v, NULL);
        if (!(o->verify_tol > 0))
            return fail("--verify-tol=%s: expected a positive number", v);
    } else {
        return ARG_NOT_MINE;
    }
    return 0;
}

/* The devices, the planner and the train settings: as parse_build_arg. */
static int parse_device_arg(Options *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if ((v = opt_value(argc, argv, i, "--gpu"))) {
        if (strcmp(v, "cpu") && !dev_lookup(v))
            return fail("--gpu=%s: unknown GPU (a100-40gb, a100-80gb, h100-sxm, h100-pcie, "
                        "h200-sxm or cpu)", v);
        o->gpu = v;
    } else if ((v = opt_value(argc, argv, i, "--cluster"))) {
        o->cluster = v;
    } else if ((v = opt_value(argc, argv, i, "--gpus"))) {
        char *end;
        long n = strtol(v, &end, 10);
        if (*end || end == v || n < 1 || n > 1048576)
            return fail("--gpus=%s: expected a device count in [1, 1048576]", v);
        o->gpus = (int)n;
    } else if ((v = opt_value(argc, argv, i, "--plan"))) {
        if (strcmp(v, "auto"))
            return fail("--plan=%s: expected auto", v);
        o->plan_auto = 1;
    } else if (!strcmp(a, "--explain")) {
        o->explain = 1;
    } else if ((v = opt_value(argc, argv, i, "--device-memory"))) {
        if (parse_size(v, &o->device_memory) != 0)
            return fail("--device-memory=%s: expected a size like 80GiB, 40GB, 512MiB or "
                        "bytes", v);
    } else if ((v = opt_value(argc, argv, i, "--memory-headroom"))) {
        o->has_headroom = 1;
        if (strcmp(v, "0") && parse_size(v, &o->memory_headroom) != 0)
            return fail("--memory-headroom=%s: expected a size like 2GiB, 512MiB, bytes or 0", v);
    } else if ((v = opt_value(argc, argv, i, "--set"))) {
        if (o->nsets >= MAX_SETS)
            return fail("at most %s --set options", "32"); /* MAX_SETS */
        o->sets[o->nsets++] = v;
    } else if ((v = opt_value(argc, argv, i, "--schedule"))) {
        o->schedule = v;
    } else if (!strcmp(a, "--sequence-parallel")) {
        o->sequence_parallel = 1;
    } else if ((v = opt_value(argc, argv, i, "--place"))) {
        o->place = v;
    } else if ((v = opt_value(argc, argv, i, "--role"))) {
        if (o->nroles >= 8)
            return fail("%s", "at most 8 --role options");
        o->roles[o->nroles++] = v;
    } else {
        return ARG_NOT_MINE;
    }
    return 0;
}

/* The outputs, the passes to dump or stop after, the input and -D; an
 * unknown option is an error: 0 or -1. */
static int parse_output_arg(Ctx *c, Options *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if ((v = opt_value(argc, argv, i, "--emit"))) {
        if (strcmp(v, "ir") && strcmp(v, "plan") && strcmp(v, "c") && strcmp(v, "cuda") &&
            strcmp(v, "memory") && strcmp(v, "memory-plan") && strcmp(v, "schedule") &&
            strcmp(v, "trace") && strcmp(v, "cost"))
            return fail("--emit=%s: expected ir, plan, c, cuda, memory, memory-plan, cost, "
                        "schedule or trace", v);
        o->emit = v;
    } else if ((v = opt_value(argc, argv, i, "--why"))) {
        if (o->nwhy >= MAX_WHY)
            return fail("at most %s --why options", "8");
        if (!*v)
            return fail("%s", "--why needs the name of a value or parameter");
        o->why[o->nwhy++] = v;
    } else if ((v = opt_value(argc, argv, i, "--dump-after"))) {
        o->dump_after = v;
    } else if ((v = opt_value(argc, argv, i, "--stop-after"))) {
        o->stop_after = v;
    } else if ((v = opt_value(argc, argv, i, "--from-ir"))) {
        o->from_ir = v;
    } else if ((v = opt_value(argc, argv, i, "-o"))) {
        o->out = v;
    } else if (!strcmp(a, "-D") || !strncmp(a, "-D", 2)) {
        const char *d = a[2] ? a + 2 : (*i + 1 < argc ? argv[++*i] : "");
        if (add_define(c, d) != 0)
            return -1;
    } else if (a[0] == '-' && a[1]) {
        return fail("unknown option '%s'", a);
    } else if (o->input) {
        return fail("more than one input file ('%s')", a);
    } else {
        o->input = a;
    }
    return 0;
}

static int parse_args(Ctx *c, Options *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        int r = parse_build_arg(c, o, argc, argv, &i);
        if (r == ARG_NOT_MINE)
            r = parse_device_arg(o, argc, argv, &i);
        if (r == ARG_NOT_MINE)
            r = parse_output_arg(c, o, argc, argv, &i);
        if (r != 0)
            return -1;
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
    if (o->from_ir && (o->mesh || c->defines.len))
        return fail("%s", "--mesh and -D apply to TDL input; an IR file carries its own mesh");

    if (o->verify && o->from_ir)
        return fail("%s", "--verify compiles the TDL input twice (mesh and one device): give a TDL file");
    if (o->emit && !strcmp(o->emit, "plan") && !o->out)
        return fail("%s", "--emit=plan needs -o DIR");
    if (o->portable && (o->emit || o->verify || o->dump_after || o->stop_after || !o->out))
        return fail("%s", "--portable is how an executable is built (-o NAME, no --emit): a plan's "
                          "kernels are compiled where it runs, for that CPU");
    if (resolve_cluster(c, o) != 0 || check_why_options(o) != 0 || check_headroom(o) != 0)
        return -1;
    return check_plan_options(c, o);
}

/* --why needs a mesh that splits something, and a graph not yet partitioned. */
static int why_graph(const Ctx *c, const Options *o, const Graph *g)
{
    int split = 0;
    for (int ax = 0; ax < g->mesh.naxes; ax++)
        split |= g->mesh.axes[ax].size > 1 && g->mesh.axes[ax].role != ROLE_PIPELINE;
    if (!split && !o->mesh && !o->from_ir)
        return fail("%s", "--why explains how values are split over the mesh: give its sizes "
                          "with --mesh (e.g. --mesh 2x2); without it every axis has size 1");
    if (!split)
        return fail("--why: on the mesh %s no value is split (every axis but the pipeline's has "
                    "size 1): give larger sizes",
                    o->mesh ? o->mesh : "of the IR file");
    for (int i = 0; i < g->ops.len; i++)
        if (g->ops.data[i]->kind >= OP_ALL_REDUCE && g->ops.data[i]->kind <= OP_SHARD_SLICE)
            return fail("--why %s: the IR is partitioned already; give one dumped before the "
                        "partition pass (--dump-after=shard)",
                        o->why[0]);
    return 0;
}
/* --why: each name's chain, right after the shard pass (every name tried). */
typedef struct WhyAsk {
    const Options *o;
    WhyChain **out;
} WhyAsk;

static int trace_why(Ctx *c, Graph *g, const Settings *s, const char *pass, void *user)
{
    const WhyAsk *w = user;
    int bad = 0;
    for (int i = 0; strcmp(pass, "shard") == 0 && i < w->o->nwhy; i++)
        bad |= !(w->out[i] = ex_why_trace(c, g, s, w->o->why[i]));
    return bad ? -1 : 0;
}


static int run(Ctx *c, Options *o)
{
    const char *names[2] = {o->dump_after, o->stop_after};
    for (int i = 0; i < 2; i++)
        if (names[i] && (!drv_known_pass(names[i]) || (i && !strcmp(names[i], "all")))) {
            fprintf(stderr, "tcc: error: --%s=%s: no such pass (see tcc --help)\n",
                    i ? "stop-after" : "dump-after", names[i]);
            return -1;
        }
    if (o->plan_auto && pl_plan_auto(c, o) != 0)
        return -1;
    Graph *g = drv_load(c, o);
    if (!g || drv_apply_settings(c, o, g) != 0 || drv_verify(c, o, g, o->from_ir ? "parse-ir" : "lower") != 0)
        return -1;
    if (o->emit && !strcmp(o->emit, "trace"))
        return o->from_ir ? fail("%s", "--emit=trace compiles the TDL input: give a TDL file")
                          : ex_emit_trace(c, o);
    Settings s;
    if (o->emit && !strcmp(o->emit, "schedule"))
        return drv_settings(c, o, g, &s) ? -1 : ex_emit_schedule(c, o, &s.train, g);
    if (!o->from_ir && (drv_settings(c, o, g, &s) != 0 || pl_fit_budget(c, o, &s.train, g) != 0))
        return -1;
    if (o->emit && !strcmp(o->emit, "memory") && !o->from_ir)
        return ex_emit_memory(c, o, pl_budget_of(o));
    if (o->emit && !strcmp(o->emit, "cost"))
        return o->from_ir ? fail("%s", "--emit=cost compiles the TDL input: give a TDL file")
                          : ex_emit_cost(c, o);
    WhyChain *why[MAX_WHY];
    WhyAsk ask = {o, why};
    PassHook hook = {trace_why, &ask};
    if (o->nwhy && why_graph(c, o, g) != 0)
        return -1;
    if (drv_run_passes(c, o, g, o->nwhy ? &hook : NULL, NULL) != 0)
        return -1;
    for (int i = 0; i < o->nwhy; i++) {
        if (i)
            putchar('\n');
        ex_why_print(stdout, why[i]);
    }
    if (o->nwhy)
        return fflush(stdout) == 0 ? 0 : -1;
    if (o->verify)
        return ex_verify_mesh(c, o, g);
    if ((o->emit && strcmp(o->emit, "ir") != 0) || (!o->emit && o->out))
        return drv_write_plan(c, o, g);
    return o->emit ? drv_write_ir(o, g) : 0;
}

int main(int argc, char **argv)
{
    Ctx *c = ctx_new(stderr);
    Options o = {0};
    o.zero = o.sequence_parallel = -1;
    o.unroll = getenv("TCC_TEST_UNROLL") != NULL; /* tests: the step with every microbatch a copy */
    int ok = parse_args(c, &o, argc, argv) == 0;
    if (ok && measures_cpu(&o))
        rt_cpu_quiet_threads(argv); /* measure as the trainers run */
    int rc = ok && (o.calibrate_cpu ? calibrate_cpu(c, &o) : run(c, &o)) == 0 ? 0 : 1;
    if (c->diag.nerrors)
        fprintf(stderr, "%d error%s generated.\n", c->diag.nerrors, c->diag.nerrors > 1 ? "s" : "");
    ctx_free(c);
    return rc;
}

