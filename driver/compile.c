/* compile.c: the compile API under the command line. Reads a TDL (or IR)
 * file and the options; runs lowering, the verifier and the pass table, and
 * writes what was asked (the IR, a plan, a program, the kernels' source).
 * Key idea: the pipeline is one table; --dump-after names any entry of it,
 * and --from-ir starts after lowering. The planner, --verify and the reports
 * compile through these functions (planner/, explain/). */
#include "driver/driver.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

int drv_known_pass(const char *name)
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

double drv_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* After stage `name`: report it with -v, dump it if asked. */
static void after(Ctx *c, const Options *o, const Graph *g, const char *name, double t0)
{
    if (o->verbose)
        fprintf(stderr, "tcc: %-10s %8.2f ms  %d ops, %d values\n", name, drv_now_ms() - t0,
                g->ops.len, g->values.len);
    if (o->dump_after && (!strcmp(o->dump_after, "all") || !strcmp(o->dump_after, name))) {
        printf("# ---- after %s ----\n", name);
        ir_print(stdout, g);
    }
}

Graph *drv_load(Ctx *c, const Options *o)
{
    const char *path = o->from_ir ? o->from_ir : o->input;
    size_t len;
    char *text = read_file(c->arena, path, &len);
    if (!text) {
        fprintf(stderr, "tcc: error: cannot read '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    double t0 = drv_now_ms();
    Graph *g = o->from_ir ? ir_parse(c, path, text, len) : fe_compile(c, path, text, len, &(FeOptions){o->mesh, o->repeat_limit});
    if (g)
        after(c, o, g, o->from_ir ? "parse-ir" : "lower", t0);
    return g;
}

int drv_verify(Ctx *c, const Options *o, Graph *g, const char *after_pass)
{
    double t0 = drv_now_ms();
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

int drv_write_ir(const Options *o, const Graph *g)
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

int drv_on_gpu(const Options *o) { return o->gpu && strcmp(o->gpu, "cpu") != 0; }

double drv_device_memory(const Options *o)
{
    const DeviceSpec *d = o->gpu ? dev_lookup(o->gpu) : NULL;
    return o->device_memory > 0 ? o->device_memory : d ? d->memory : 0;
}

/* --emit=memory-plan (and --emit=memory of an IR file): each stage's largest
 * moment in the plan as compiled, every microbatch in it, and its slab. */
static int print_plan_memory(Ctx *c, const Options *o, const Plan *compact, const Graph *local)
{
    Plan x = *compact, *p = &x; /* a loop plan: as laid out (model/memory_model.c) */
    int n = plan_stages(p);
    for (int s = 0; s < n; s++) {
        double cat[MC_COUNT];
        printf("stage %d: plan peak %.0f bytes, slab %llu bytes:", s,
               mem_plan_peak(c->arena, p, local, s, drv_on_gpu(o), cat),
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

/* A program built with no budget (no --gpu, --cluster or --device-memory)
 * is checked by nobody: when its plan needs more per device than every GPU
 * of the table and this machine hold, say so (a warning: it may be meant
 * for a machine tcc does not know), naming the options that check it. */
static void warn_unrunnable(Ctx *c, const Options *o, const Plan *p, const Graph *local)
{
    double need = 0, most = 0, here = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    for (int s = 0; s < plan_stages(p); s++)
        need = fmax(need, mem_plan_peak(c->arena, p, local, s, 0, NULL));
    const DeviceSpec *big = NULL;
    for (const DeviceSpec *d = dev_table(); d->name; d++)
        if (d->memory > most)
            most = d->memory, big = d;
    if (drv_device_memory(o) > 0 || need <= most || need <= here || !big)
        return;
    diag_warning(&c->diag, LOC_NONE, "the plan needs %.0f GiB per device, more than any GPU tcc "
                                     "knows (the largest, %s, %.0f GiB) and this machine (%.0f GiB): "
                                     "--gpu NAME or --device-memory SIZE checks it against a budget",
                 need / 1073741824.0, big->name, most / 1073741824.0, here / 1073741824.0);
}

void drv_warn_placement(Ctx *c, const Options *o, const Plan *p)
{
    CostDevice d;
    char text[512];
    if (!o->has_cluster)
        return;
    cost_device_of_cluster(&o->cluster_spec, &d);
    int a = cost_placement_text(p, &d, text, sizeof text);
    if (a < 0)
        return;
    const char *why = p->axes[a].size > d.per_node ? "it has more devices than a server"
                      : o->place                   ? "--place puts it there"
                                                   : "the axes inside it fill the server";
    diag_warning(&c->diag, LOC_NONE, "the %s axis '%s' (%d devices) crosses servers of %d GPUs: its "
                                     "collectives go over the network (%s)",
                 p->axes[a].role, p->axes[a].name, p->axes[a].size, d.per_node, why);
}

/* The plan into DIR/plan.json (DIR is created), or its kernels as C or CUDA C. */
int drv_write_plan(Ctx *c, const Options *o, const Graph *g)
{
    Plan plan;
    Kernel **kernels;
    const Graph *local;
    double t0 = drv_now_ms();
    Settings s;
    if (drv_settings(c, o, g, &s) != 0 || cg_build_plan_local(c, g, &s.train, 0, &plan, &kernels, &local) != 0)
        return -1;
    if (o->verbose)
        fprintf(stderr, "tcc: %-10s %8.2f ms  %d kernels, %d instructions, %.1f MiB slab\n",
                "codegen", drv_now_ms() - t0, plan.nkernels, plan.ninstrs,
                (double)plan.slab_bytes / 1048576.0);
    if (!o->emit || !strcmp(o->emit, "plan"))
        warn_unrunnable(c, o, &plan, local);
    drv_warn_placement(c, o, &plan);
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

int drv_settings(Ctx *c, const Options *o, const Graph *g, Settings *s)
{
    if (pass_settings(c, g, s) != 0)
        return -1;
    s->recompute_layers = o->recompute_layers;
    s->nrecompute_layers = o->nrecompute_layers;
    s->unroll = o->unroll;
    s->keep_grads = o->verify != 0; /* both of --verify's plans */
    s->verbose = o->verbose;
    return 0;
}

/* The graph passes in order, each verified, up to and including --stop-after;
 * hook (or NULL) after each; the settings they read into *out (or NULL). */
int drv_run_passes(Ctx *c, const Options *o, Graph *g, const PassHook *hook, Settings *out)
{
    int stop = o->stop_after && (!strcmp(o->stop_after, "lower") ||
                                 !strcmp(o->stop_after, "parse-ir") ||
                                 !strcmp(o->stop_after, "verify"));
    Settings s;
    if ((!stop || out) && drv_settings(c, o, g, &s) != 0)
        return -1;
    if (out)
        *out = s;
    for (const Pass *p = pass_table; p->name && !stop; p++) {
        double t0 = drv_now_ms();
        if (p->run(c, g, &s) != 0)
            return -1;
        after(c, o, g, p->name, t0);
        if (drv_verify(c, o, g, p->name) != 0)
            return -1;
        if (hook && hook->after(c, g, &s, p->name, hook->user) != 0)
            return -1;
        stop = o->stop_after && !strcmp(o->stop_after, p->name);
    }
    return 0;
}

int drv_compile(Ctx *c, const Options *o, int plan, Compiled *out)
{
    memset(out, 0, sizeof *out);
    Graph *g = out->g = drv_load(c, o);
    if (!g || drv_apply_settings(c, o, g) != 0 || drv_verify(c, o, g, "lower") != 0 ||
        drv_run_passes(c, o, g, NULL, &out->s) != 0)
        return -1;
    return plan ? cg_build_plan_local(c, g, &out->s.train, 0, &out->plan, &out->kernels, &out->local)
                : 0;
}

/* The model through every pass again, on mesh (a --mesh spec), quietly. */
Graph *drv_passed(Ctx *c, const Options *o, const char *mesh)
{
    Options quiet = *o;
    quiet.dump_after = quiet.stop_after = NULL;
    quiet.mesh = mesh;
    Compiled k;
    return drv_compile(c, &quiet, 0, &k) == 0 ? k.g : NULL;
}


/* The CPU figures the CPU file did not give, measured now. */
int drv_measure_cpu(Ctx *c, Options *o)
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

/* The cost model's device: the cluster's GPUs, else this machine's CPU shared
 * by the plan's devices. */
int drv_cost_device(Ctx *c, Options *o, const Plan *p, CostDevice *d)
{
    if (o->has_cluster) {
        cost_device_of_cluster(&o->cluster_spec, d);
        return 0;
    }
    if (drv_measure_cpu(c, o) != 0)
        return -1;
    cost_device_of_cpu(&o->cpu, plan_mesh_size(p), d);
    return 0;
}

void drv_print_stages(FILE *f)
{
    for (size_t i = 0; i < sizeof front_stages / sizeof front_stages[0]; i++)
        fprintf(f, "  %-20s  %s\n", front_stages[i].name, front_stages[i].summary);
    for (const Pass *p = pass_table; p->name; p++)
        fprintf(f, "  %-20s  %s\n", p->name, p->summary);
}
