/* cpu.c: this machine's CPU as a device of the cost model. Reads a CPU file
 * (KEY = VALUE lines, as --calibrate-cpu writes them) or the figures tcc.c
 * measured, and a plan's instructions; writes each instruction's time as the
 * CPU runtime runs it (runtime/exec.c, cpu.c, mesh.c, comm/threads.c).
 * Key idea: the runtime runs a step as plain code on the cores, so each
 * instruction costs the scalar work its C rendering does (codegen counts it:
 * cg_c_work) at rates measured on this machine by the same kind of code; the
 * devices of a threads mesh are threads of one process that share the cores,
 * so a device with more threads than its share of cores runs slower by that
 * share. docs/cost.md ("The CPU") has every formula. */
#include "model/model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the file ---- */

static const struct {
    const char *key, *meaning;
} keys[CPU_NKEYS] = {
    [CPU_CORES] = {"cores", "OpenMP threads a program runs"},
    [CPU_GEMM1] = {"gemm1_gflops", "sgemm 512^3 on one thread"},
    [CPU_CONVERT] = {"convert_ns", "an element of the GEMM wrapper's loops (bf16 to f32 and back)"},
    [CPU_OP] = {"op_ns", "a kernel's operation on one thread"},
    [CPU_CHAIN] = {"chain_ns", "a step of a running sum, beyond its operation"},
    [CPU_DIV] = {"div_ns", "a float division or square root"},
    [CPU_CALL] = {"call_ns", "a call of expf (logf, powf, fmaxf alike)"},
    [CPU_TANH] = {"tanh_ns", "a call of tanhf"},
    [CPU_STREAM] = {"stream_gbs", "a kernel's tensors out of cache, read and written, one thread"},
    [CPU_SPEEDUP] = {"parallel_speedup", "sgemm 512^3 on every core against one"},
    [CPU_FORK] = {"fork_us", "a parallel region (OpenMP threads woken and joined)"},
    [CPU_MEMORY] = {"memory_gib", "physical memory"},
    [CPU_VOP] = {"vop_ns", "an operation of a kernel whose loop runs as vectors, one thread"},
    [CPU_LOOP_SPEEDUP] = {"loop_speedup",
                          "a parallel kernel's arithmetic on every core against one"},
    [CPU_STREAM_PAR] = {"stream_par_gbs", "a parallel kernel's tensors out of cache, every core"},
    [CPU_CHAIN64] = {"chain64_ns", "a step of running sums 64 long, one after another, beyond "
                                   "its operations"},
};

const char *cpu_spec_key(CpuKey k)
{
    return keys[k].key;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    for (char *e = s + strlen(s); e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r');)
        *--e = 0;
    return s;
}

/* One "KEY = VALUE" line (gpu done) into out; NULL, or why not. */
static const char *cpu_line(Arena *a, char *line, CpuSpec *out)
{
    char *eq = strchr(line, '='), *end;
    if (!eq)
        return "expected KEY = VALUE";
    *eq = 0;
    char *key = trim(line), *val = trim(eq + 1);
    if (!strcmp(key, "what"))
        return out->what = arena_strdup(a, val), NULL;
    for (int k = 0; k < CPU_NKEYS; k++) {
        if (strcmp(key, keys[k].key))
            continue;
        double x = strtod(val, &end);
        if (end == val || *end || !(x > 0) || x > 1e9)
            return "expected a positive number";
        if (k == CPU_CORES && (x != floor(x) || x > 4096))
            return "cores: expected a whole number in [1, 4096]";
        if (k == CPU_SPEEDUP && x < 1)
            return "parallel_speedup: expected at least 1";
        if (k == CPU_LOOP_SPEEDUP && x < 1)
            return "loop_speedup: expected at least 1";
        out->v[k] = x;
        out->given |= 1u << k;
        return NULL;
    }
    return "unknown key (what, cores, gemm1_gflops, convert_ns, op_ns, chain_ns, div_ns, call_ns, "
           "tanh_ns, stream_gbs, parallel_speedup, fork_us, memory_gib, vop_ns, loop_speedup, "
           "stream_par_gbs, chain64_ns)";
}

/* The line's first setting is gpu = NAME: NAME's first character, else NULL. */
static const char *gpu_value(char *q)
{
    if (strncmp(q, "gpu", 3) || (q[3] != ' ' && q[3] != '=' && q[3] != '\t'))
        return NULL;
    const char *v = q + 3;
    while (*v == ' ' || *v == '\t')
        v++;
    if (*v++ != '=')
        return NULL;
    while (*v == ' ' || *v == '\t')
        v++;
    return v;
}

static int is_cpu(const char *v)
{
    return !strncmp(v, "cpu", 3) && !*trim((char *)v + 3);
}

int cpu_spec_read(Arena *a, const char *path, CpuSpec *out, char *err, size_t n)
{
    size_t len;
    char *text = read_file(a, path, &len);
    memset(out, 0, sizeof *out);
    if (!text)
        return snprintf(err, n, "cannot read the cluster file '%s'", path), -1;
    int line = 1, seen = 0;
    for (char *p = text; *p; line++) {
        char *nl = strchr(p, '\n'), *hash;
        if (nl)
            *nl = 0;
        if ((hash = strchr(p, '#')))
            *hash = 0;
        char *q = trim(p);
        const char *why = NULL, *gpu = *q ? gpu_value(q) : NULL;
        if (*q && !seen && !(gpu && is_cpu(gpu)))
            return 1; /* not a CPU file: a cluster of GPUs, or no file of ours */
        if (*q && gpu)
            why = seen++ ? "gpu given twice" : NULL;
        else if (*q)
            why = cpu_line(a, q, out);
        if (why)
            return snprintf(err, n, "%s:%d: %s", path, line, why), -1;
        if (!nl)
            break;
        p = nl + 1;
    }
    return seen ? 0 : 1;
}

void cpu_spec_write(FILE *f, const CpuSpec *s)
{
    fprintf(f, "# this machine's CPU for the cost model: tcc --calibrate-cpu (docs/cost.md)\n");
    fprintf(f, "gpu = cpu\n");
    if (s->what)
        fprintf(f, "what = %s\n", s->what);
    for (int k = 0; k < CPU_NKEYS; k++)
        fprintf(f, "%s = %.6g  # %s\n", keys[k].key, s->v[k], keys[k].meaning);
}

/* ---- the device ---- */

/* Cores' worth of T threads of one device on its GEMMs (k: CPU_SPEEDUP) or
 * parallel loops (CPU_LOOP_SPEEDUP): each thread beyond the first adds what
 * the measured speed-up on every core says one adds, (S - 1) / (cores - 1). */
static double threads_speedup(const CpuSpec *s, int threads, CpuKey k)
{
    double cores = s->v[CPU_CORES];
    return threads <= 1 || cores <= 1 ? 1 : 1 + (threads - 1) * (s->v[k] - 1) / (cores - 1);
}

/* Bytes per second out of cache that one device gets from a kernel on t of
 * its threads: the machine's on the threads that all devices run at once
 * (a mesh's devices do the same work at the same time), between one thread's
 * and every core's, shared by the devices. */
static double device_bw(const CostDevice *d, int t)
{
    const CpuSpec *s = d->host;
    double cores = s->v[CPU_CORES], devices = d->per_node;
    double used = fmin(cores, t * devices);
    double bw = cores <= 1
                    ? s->v[CPU_STREAM]
                    : s->v[CPU_STREAM] +
                          (used - 1) * (s->v[CPU_STREAM_PAR] - s->v[CPU_STREAM]) / (cores - 1);
    return bw * 1e9 / devices;
}

void cost_device_of_cpu(const CpuSpec *s, int64_t devices, CostDevice *d)
{
    int cores = (int)s->v[CPU_CORES];
    memset(d, 0, sizeof *d);
    d->name = "cpu";
    d->what = s->what ? s->what : "this machine's CPU";
    d->cpu = 1;
    d->host = s;
    d->threads = cores / devices > 1 ? (int)(cores / devices) : 1; /* as runtime/train.c */
    d->share = fmin(1, (double)cores / ((double)devices * d->threads));
    d->per_node = (int)devices;
    d->peak16 = d->peak32 =
        s->v[CPU_GEMM1] * 1e9 * threads_speedup(s, d->threads, CPU_SPEEDUP) * d->share;
    d->mem_bw = device_bw(d, d->threads);
}

/* Cores' worth that an instruction gets: a GEMM (CPU_SPEEDUP) or a parallel
 * loop (CPU_LOOP_SPEEDUP) its device's threads, anything else (0) one
 * thread; each at the device's share. */
static double speed(const CostDevice *d, CpuKey k)
{
    return (k ? threads_speedup(d->host, d->threads, k) : 1) * d->share;
}

/* Seconds of a step of chains `len` steps long (0: one long chain), beyond
 * its operations: the out-of-order core starts the next chain while one
 * ends, which hides the more of each the shorter they are; measured at 64
 * and for one long chain, between them as 64 / len of the difference. */
static double chain_ns(const CpuSpec *s, double len)
{
    double lo = s->v[CPU_CHAIN64], hi = s->v[CPU_CHAIN];
    if (len <= 0 || hi <= lo)
        return len > 0 && len <= 64 ? lo : hi;
    return hi - (hi - lo) * fmin(1, 64 / len);
}

/* Seconds of a kernel's scalar work on one thread. */
static double work_s(const CpuSpec *s, const PlanWork *k)
{
    return (k->ops * s->v[CPU_OP] + k->vops * s->v[CPU_VOP] + k->chain * chain_ns(s, k->chain_len) +
            k->divs * s->v[CPU_DIV] + k->calls * s->v[CPU_CALL] + k->tanh * s->v[CPU_TANH]) *
           1e-9;
}

/* A parallel region on more than one thread wakes them and joins them. */
static double fork_s(const CostDevice *d)
{
    return d->threads > 1 ? d->host->v[CPU_FORK] * 1e-6 : 0;
}

/* sgemm (dgemm at half the rate) on the device's threads; around it the
 * wrapper's loops (runtime/cpu.c): a bf16 GEMM widens A and B to f32 first
 * and rounds a bf16 C back, on the device's threads once they pass 65,536
 * elements, and the bias epilogue adds to every element of C on one. */
static double gemm_s(const Plan *p, const CostDevice *d, const PlanInstr *in)
{
    const CpuSpec *s = d->host;
    const PlanGemm *g = &in->gemm;
    PlanDType t = p->tensors[g->a].dtype;
    double rate = s->v[CPU_GEMM1] * 1e9 * (t == PD_F64 ? 0.5 : 1);
    double flops = 2.0 * (double)g->m * (double)g->n * (double)g->k * (double)g->batch;
    double c = (double)g->m * (double)g->n * (double)g->batch, wide = 0,
           ns = s->v[CPU_CONVERT] * 1e-9;
    if (t == PD_BF16 || t == PD_F16) {
        double a = (double)p->tensors[g->a].bytes / 2, b = (double)p->tensors[g->b].bytes / 2;
        double r = p->tensors[g->c].dtype == PD_F32 ? 0 : c;
        wide = (a + b + r) * ns;
        wide = a > 65536 && b > 65536 && (r == 0 || r > 65536) ? wide / speed(d, CPU_LOOP_SPEEDUP)
                                                               : wide / d->share;
    }
    double bias = g->epilogue == PE_BIAS ? c * ns / d->share : 0;
    return flops / rate / speed(d, CPU_SPEEDUP) + wide + bias + fork_s(d);
}

double cost_cpu_compute_time(const Plan *p, const CostDevice *d, const PlanInstr *in)
{
    if (in->kind == PI_GEMM)
        return gemm_s(p, d, in);
    if (in->kind == PI_COPY) /* memmove on the device's thread: read and written */
        return 2.0 * (double)p->tensors[in->args[0]].bytes / device_bw(d, 1);
    if (in->kind != PI_KERNEL)
        return 0;
    const PlanWork *k = &in->work;
    double bytes = 0;
    for (int a = 0; a < in->nargs; a++)
        bytes += (double)p->tensors[in->args[a]].bytes;
    /* in a kernel group (codegen/groups.c) every member shares its loop among
     * the threads, and only the group's first opens the region */
    if (k->serial && !in->group && !in->grouped)
        return work_s(d->host, k) / speed(d, 0) + bytes / device_bw(d, 1);
    return work_s(d->host, k) / speed(d, CPU_LOOP_SPEEDUP) + bytes / device_bw(d, d->threads) +
           (in->grouped ? 0 : fork_s(d));
}

/* ---- collectives of the threads backend ---- */

/* Each member copies between the members' buffers on its own thread
 * (runtime/comm/threads.c): a collective is the bytes one member copies (read
 * and written, out of cache), the bytes it sums (the other members' parts
 * read), and a wake-up of the sleeping members per barrier. */
double cost_cpu_coll_time(const Plan *p, const CostDevice *d, const PlanInstr *in)
{
    const PlanColl *c = &in->coll;
    const CpuSpec *s = d->host;
    int n = (int)plan_axes_size(p, c->axes, c->naxes);
    if (n <= 1 && c->op != PC_SEND && c->op != PC_RECV && c->op != PC_SLICE)
        return 0;
    double S = 0, out = in->nargs > 1 ? (double)p->tensors[in->args[1]].bytes : 0;
    for (int a = 0; a < in->nargs; a += c->op == PC_ALL_REDUCE && in->nargs > 2 ? 2 : in->nargs)
        S += (double)p->tensors[in->args[a]].bytes;
    double copied = 0, summed = 0, barriers = 0;
    switch (c->op) {
    case PC_ALL_REDUCE: /* in to out (a bucket: packed), a share summed, every share back */
    case PC_ALL_REDUCE_MAX:
        copied = (in->nargs > 2 ? 3 : 2) * S + S / n, summed = (n - 1) * S / n, barriers = 3;
        break;
    case PC_ALL_GATHER:
        copied = out, barriers = 2;
        break;
    case PC_REDUCE_SCATTER:
        copied = out, summed = (n - 1) * out, barriers = 2;
        break;
    case PC_ALL_TO_ALL:
        copied = 3 * S, barriers = 2;
        break;
    case PC_SLICE:
        copied = out;
        break;
    case PC_SEND:
    case PC_RECV:
        copied = S, barriers = 1;
        break;
    default:
        return 0;
    }
    return (2 * copied + summed) / device_bw(d, 1) + barriers * s->v[CPU_FORK] * 1e-6;
}
