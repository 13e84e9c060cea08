/* tccnvrtc.c: the tccnvrtc command: compile every CUDA kernel of a plan (or of
 * a .cu file) with NVRTC for each architecture asked, and report what ptxas
 * says each kernel uses.
 * Reads: a plan (DIR, DIR/plan.json or any plan file: its gpu_source) or a .cu
 * file. Writes: the report to stdout (and to FILE with --report): one row per
 * kernel and architecture with its registers, spill stores and loads, stack,
 * shared memory and barriers, then totals; one line per problem to stderr.
 * Key idea: no GPU is needed to find a kernel that does not compile, draws a
 * warning or spills registers to local memory; each is a defect of the kernel
 * (or of the emitter that wrote it), so each fails the run (exit status 1)
 * with the kernel named. A kernel of the plan that ptxas did not report was
 * not compiled at all, and one whose block of threads needs more registers
 * than a GPU block has would not launch: both fail it too. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/gpu/nvrtc.h"
#include "plan/plan.h"

#define MAX_ARCHS 8

static const char *USAGE =
    "usage: tccnvrtc [--arch=sm_80,sm_90] [--report=FILE] [--maxrregcount=N] INPUT\n"
    "Compiles the CUDA kernels of INPUT with NVRTC for each architecture (default\n"
    "sm_80 and sm_90) and prints what ptxas reports for each kernel: registers,\n"
    "spill stores and loads, stack, shared memory and barriers, then totals.\n"
    "INPUT is a plan (a directory DIR with DIR/plan.json from tcc --emit=plan, or a\n"
    "plan file: its gpu_source is compiled) or a CUDA source file NAME.cu.\n"
    "  --arch=LIST         comma-separated architectures (sm_80,sm_90)\n"
    "  --report=FILE       write the report to FILE too\n"
    "  --maxrregcount=N    at most N registers per thread (ptxas spills the rest)\n"
    "Exits 1, with a line naming the kernel, when a kernel does not compile, the\n"
    "compile log has a warning, a kernel spills (any bytes), a kernel of the plan\n"
    "was not compiled, or its launch (threads a block) needs more registers than a\n"
    "block has.\n";

typedef struct Options {
    const char *input, *report;
    const char *archs[MAX_ARCHS];
    int narchs;
    char arch_list[256];
    char maxrreg[40]; /* "--maxrregcount=N" or "" */
} Options;

/* What is compiled: the source, where its lines come from, the kernels expected. */
typedef struct Input {
    char where[4200]; /* "k.cu" or "DIR/plan.json:gpu_source": the file of line numbers */
    char what[4400];  /* the report's title: the file, and the plan's model */
    char *src;        /* malloc'ed */
    char **names;     /* the kernels in order: the plan's, else the source's __global__ */
    int *blocks;      /* a plan's: each kernel's threads per block */
    int nnames, from_plan;
} Input;

/* One architecture's compile. */
typedef struct ArchRun {
    const char *arch;
    int ok;
    RtKernelUse *use;
    int nuse;
    double seconds;
} ArchRun;

/* "tccnvrtc: error: ...", one line to stderr; returns 1 (one problem). */
__attribute__((format(printf, 1, 2))) static int problem(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tccnvrtc: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- options ---- */

/* --arch=sm_80,sm_90 into o->archs (pointers into o->arch_list); 0 or -1. */
static int parse_archs(Options *o, const char *list)
{
    if (snprintf(o->arch_list, sizeof o->arch_list, "%s", list) >= (int)sizeof o->arch_list)
        return -problem("--arch: the list is too long");
    o->narchs = 0;
    for (char *a = strtok(o->arch_list, ","); a; a = strtok(NULL, ",")) {
        if (o->narchs == MAX_ARCHS)
            return -problem("--arch: at most %d architectures", MAX_ARCHS);
        o->archs[o->narchs++] = a;
    }
    if (!o->narchs)
        return -problem("--arch needs a list like sm_80,sm_90, not '%s'", list);
    return 0;
}

static int parse_maxrreg(Options *o, const char *v)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 1 || n > 255)
        return -problem("--maxrregcount needs a whole number in [1, 255], not '%s'", v);
    snprintf(o->maxrreg, sizeof o->maxrreg, "--maxrregcount=%ld", n);
    return 0;
}

/* 0 to run, 1 to exit with 0 (--help), -1 to exit with 1. */
static int parse_options(int argc, char **argv, Options *o)
{
    memset(o, 0, sizeof *o);
    if (parse_archs(o, "sm_80,sm_90"))
        return -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return 1;
        } else if (!strncmp(a, "--arch=", 7)) {
            rc = parse_archs(o, a + 7);
        } else if (!strncmp(a, "--report=", 9) && a[9]) {
            o->report = a + 9;
        } else if (!strncmp(a, "--maxrregcount=", 15)) {
            rc = parse_maxrreg(o, a + 15);
        } else if (a[0] == '-' || o->input) {
            return -problem("%s '%s' (try --help)",
                            a[0] == '-' ? "unknown option" : "one input only, not also", a);
        } else {
            o->input = a;
        }
        if (rc)
            return -1;
    }
    if (!o->input)
        return -problem("no input: give a plan or a .cu file (try --help)");
    return 0;
}

/* ---- the input ---- */

/* The whole file, malloc'ed and NUL-terminated; NULL after a problem line. */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    long size = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *buf = size >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)size + 1) : NULL;
    int ok = buf && fread(buf, 1, (size_t)size, f) == (size_t)size;
    int saved = errno;
    if (f)
        fclose(f);
    if (!ok) {
        problem("%s: %s", path, f ? "cannot read it" : strerror(saved));
        free(buf);
        return NULL;
    }
    buf[size] = 0;
    return buf;
}

static int is_ident(char c)
{
    return c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z');
}

/* The name of the __global__ function declared on this line ("extern \"C\"
 * __global__ void __launch_bounds__(256) NAME(...") into name[128]: the first
 * identifier before a '(' that is not an attribute (__NAME__); 0, or -1. */
static int global_on_line(const char *line, size_t len, char *name)
{
    const char *g = strstr(line, "__global__"), *end = line + len;
    if (!g || g >= end)
        return -1;
    for (const char *p = g + 10; p < end; p++) {
        if (*p != '(')
            continue;
        const char *stop = p;
        while (stop > g && stop[-1] == ' ')
            stop--;
        const char *start = stop;
        while (start > g && is_ident(start[-1]))
            start--;
        size_t k = (size_t)(stop - start);
        if (k > 4 && !strncmp(start, "__", 2) && !strncmp(stop - 2, "__", 2))
            continue; /* an attribute: its arguments may not hold a '(' of ours */
        if (!k)
            return -1;
        snprintf(name, 128, "%.*s", (int)(k < 127 ? k : 127), start);
        return 0;
    }
    return -1;
}

/* The kernel a source line (1-based) belongs to: the last __global__ declared
 * at or before it, into name[128] ("?" when none). */
static void kernel_at_line(const char *src, long lineno, char *name)
{
    snprintf(name, 128, "?");
    long at = 1;
    for (const char *line = src; *line && at <= lineno; at++) {
        size_t k = strcspn(line, "\n");
        char found[128];
        if (!global_on_line(line, k, found))
            memcpy(name, found, 128);
        line += k + (line[k] == '\n');
    }
}

/* in->names: every __global__ of the source, in order. */
static int source_kernels(Input *in)
{
    int cap = 0;
    for (const char *line = in->src; *line;) {
        size_t k = strcspn(line, "\n");
        char name[128];
        if (!global_on_line(line, k, name)) {
            if (in->nnames == cap) {
                cap = cap ? 2 * cap : 16;
                char **bigger = realloc(in->names, sizeof *bigger * (size_t)cap);
                if (!bigger)
                    return -problem("out of memory");
                in->names = bigger;
            }
            if (!(in->names[in->nnames++] = strdup(name)))
                return -problem("out of memory");
        }
        line += k + (line[k] == '\n');
    }
    return 0;
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* A plan's gpu_source and its kernels' names; 0, or -1 after a problem line. */
static int load_plan(Input *in, const char *path)
{
    char err[1024];
    Plan *p = plan_load(path, err, sizeof err);
    if (!p)
        return -problem("%s", err);
    int rc = 0;
    if (p->nkernels > 0 && (!p->gpu_source || !*p->gpu_source))
        rc = -problem("%s: the plan has no CUDA kernels (gpu_source is empty; its %d kernels "
                      "are in C only)",
                      path, p->nkernels);
    in->src = rc ? NULL : strdup(p->gpu_source ? p->gpu_source : "");
    in->names = rc ? NULL : calloc((size_t)p->nkernels + 1, sizeof *in->names);
    in->blocks = rc ? NULL : calloc((size_t)p->nkernels + 1, sizeof *in->blocks);
    for (int i = 0; in->names && in->blocks && i < p->nkernels; i++) {
        in->blocks[i] = p->kernels[i].block;
        in->names[in->nnames++] = strdup(p->kernels[i].name);
    }
    snprintf(in->where, sizeof in->where, "%s:gpu_source", path);
    snprintf(in->what, sizeof in->what, "plan %s (model %s, %d kernel%s)", path, p->model,
             p->nkernels, p->nkernels == 1 ? "" : "s");
    plan_free(p);
    if (!rc && (!in->src || !in->names || !in->blocks))
        rc = -problem("out of memory");
    return rc;
}

/* The input as a plan (a directory, or any file but a .cu) or a CUDA source. */
static int load_input(Input *in, const char *input)
{
    struct stat st;
    char path[4096];
    memset(in, 0, sizeof *in);
    if (stat(input, &st))
        return -problem("%s: %s", input, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if (snprintf(path, sizeof path, "%s/plan.json", input) >= (int)sizeof path)
            return -problem("%s: path too long", input);
        in->from_plan = 1;
        return load_plan(in, path);
    }
    if (!ends_with(input, ".cu")) {
        in->from_plan = 1;
        return load_plan(in, input);
    }
    snprintf(in->where, sizeof in->where, "%s", input);
    snprintf(in->what, sizeof in->what, "%s", input);
    if (!(in->src = read_text(input)))
        return -1;
    return source_kernels(in);
}

static void free_input(Input *in)
{
    for (int i = 0; i < in->nnames; i++)
        free(in->names[i]);
    free(in->names);
    free(in->blocks);
    free(in->src);
}

/* ---- compiling ---- */

/* An NVRTC message "tcc_kernels.cu(LINE): TEXT" as "WHERE:LINE: TEXT (kernel
 * 'K', ARCH)", the kernel found from the line; other text as it is. */
static int source_problem(const Input *in, const char *arch, const char *msg)
{
    const char *at = strstr(msg, RT_NVRTC_PROGRAM "(");
    char *end = NULL;
    long line = at ? strtol(at + strlen(RT_NVRTC_PROGRAM "("), &end, 10) : 0;
    if (!at || !end || strncmp(end, "): ", 3))
        return strstr(msg, arch) ? problem("%s", msg) : problem("%s (%s)", msg, arch);
    char kernel[128];
    kernel_at_line(in->src, line, kernel);
    return problem("%s:%ld: %s (kernel '%s', %s)", in->where, line, end + 3, kernel, arch);
}

/* Every warning line of the log, one problem each. */
static int warning_problems(const Input *in, const char *arch, const char *log)
{
    char *w = rt_nvrtc_warnings(log);
    if (!w)
        return problem("out of memory");
    int bad = 0;
    for (char *line = strtok(w, "\n"); line; line = strtok(NULL, "\n"))
        bad += source_problem(in, arch, line);
    free(w);
    return bad;
}

/* Compile for r->arch; the problems found (compile error, warnings) counted. */
static int compile_arch(const Input *in, const Options *o, ArchRun *r)
{
    const char *extra[1] = {o->maxrreg};
    char err[1024];
    RtCubin c;
    double t0 = now_s();
    int rc = rt_nvrtc_compile_with(in->src, r->arch, extra, *o->maxrreg ? 1 : 0, NULL, &c, err,
                                   sizeof err);
    r->seconds = now_s() - t0;
    if (rc) {
        /* "nvrtc (sm_80): NVRTC_ERROR_COMPILATION: tcc_kernels.cu(3): error: ..." */
        const char *at = strstr(err, RT_NVRTC_PROGRAM "(");
        return source_problem(in, r->arch, at ? at : err);
    }
    r->ok = 1;
    r->nuse = rt_nvrtc_usage(c.log, &r->use);
    int bad = warning_problems(in, r->arch, c.log);
    rt_cubin_free(&c);
    return bad;
}

static const RtKernelUse *find_use(const ArchRun *r, const char *name)
{
    for (int i = 0; i < r->nuse; i++)
        if (!strcmp(r->use[i].name, name))
            return &r->use[i];
    return NULL;
}

/* sm_80 and sm_90 alike: 64K registers for a block, given to warps in units of 256. */
#define BLOCK_REGISTERS 65536
#define REGISTER_UNIT 256

/* A plan's launch of u with `block` threads, which the GPU refuses ("too many
 * resources requested for launch") when the block needs more registers than
 * there are, or more than 1024 threads: 1 problem, or 0. */
static int launch_problem(const RtKernelUse *u, int block, const char *arch)
{
    long per_warp = ((long)u->regs * 32 + REGISTER_UNIT - 1) / REGISTER_UNIT * REGISTER_UNIT;
    long need = per_warp * ((block + 31) / 32);
    if (block > 1024)
        return problem("kernel '%s' is launched with %d threads a block, more than 1024", u->name,
                       block);
    if (need > BLOCK_REGISTERS)
        return problem("kernel '%s' cannot be launched with %d threads a block on %s: "
                       "%d registers a thread need %ld registers, a block has %d",
                       u->name, block, arch, u->regs, need, BLOCK_REGISTERS);
    return 0;
}

/* Spills, kernels of the plan that ptxas did not report, and launches the
 * kernels' registers do not allow. */
static int usage_problems(const Input *in, const ArchRun *r)
{
    int bad = 0;
    for (int i = 0; i < r->nuse; i++) {
        const RtKernelUse *u = &r->use[i];
        if (u->spill_stores > 0 || u->spill_loads > 0)
            bad += problem("%s '%s' spills registers on %s: %ld bytes stored, %ld bytes loaded",
                           u->is_function ? "device function" : "kernel", u->name, r->arch,
                           u->spill_stores, u->spill_loads);
    }
    for (int i = 0; in->from_plan && i < in->nnames; i++) {
        const RtKernelUse *u = find_use(r, in->names[i]);
        if (!u)
            bad += problem("kernel '%s' of the plan was not compiled for %s: ptxas did not "
                           "report it (is it in gpu_source?)",
                           in->names[i], r->arch);
        else
            bad += launch_problem(u, in->blocks[i], r->arch);
    }
    return bad;
}

/* ---- the report ---- */

/* The rows' kernel names: the input's (those ptxas reported, for a .cu; all, for
 * a plan), then any other function ptxas reported, in log order. */
static int row_names(const Input *in, const ArchRun *runs, int nruns, const char ***out)
{
    int cap = in->nnames, n = 0;
    for (int a = 0; a < nruns; a++)
        cap += runs[a].nuse;
    const char **names = calloc((size_t)cap + 1, sizeof *names);
    if (!names)
        return -1;
    for (int i = 0; i < in->nnames; i++)
        for (int a = 0; a < nruns; a++)
            if (in->from_plan || find_use(&runs[a], in->names[i])) {
                names[n++] = in->names[i];
                break;
            }
    for (int a = 0; a < nruns; a++)
        for (int i = 0; i < runs[a].nuse; i++) {
            int seen = 0;
            for (int j = 0; j < n && !seen; j++)
                seen = !strcmp(names[j], runs[a].use[i].name);
            if (!seen)
                names[n++] = runs[a].use[i].name;
        }
    *out = names;
    return n;
}

static void print_row(FILE *f, int width, const char *name, const char *arch, const RtKernelUse *u)
{
    if (!u) {
        fprintf(f, "%-*s  %-6s  %s\n", width, name, arch, "(not compiled)");
        return;
    }
    char regs[16];
    snprintf(regs, sizeof regs, u->is_function ? "-" : "%d", u->regs);
    fprintf(f, "%-*s  %-6s  %9s  %12ld  %11ld  %6ld  %6ld  %8d%s\n", width, name, arch, regs,
            u->spill_stores, u->spill_loads, u->stack, u->smem, u->barriers,
            u->is_function ? "  (device function)" : "");
}

/* One arch's totals: kernels, the most registers, spills, the largest stack and smem. */
static void print_total(FILE *f, const ArchRun *r)
{
    if (!r->ok) {
        fprintf(f, "total %s: did not compile\n", r->arch);
        return;
    }
    const RtKernelUse *most = NULL;
    long stores = 0, loads = 0, stack = 0, smem = 0;
    int kernels = 0;
    for (int i = 0; i < r->nuse; i++) {
        const RtKernelUse *u = &r->use[i];
        kernels += !u->is_function;
        if (!u->is_function && (!most || u->regs > most->regs))
            most = u;
        stores += u->spill_stores, loads += u->spill_loads;
        stack = u->stack > stack ? u->stack : stack;
        smem = u->smem > smem ? u->smem : smem;
    }
    fprintf(f,
            "total %s: %d kernel%s, at most %d registers (%s), %ld bytes spill stores, "
            "%ld bytes spill loads, at most %ld bytes stack, at most %ld bytes smem\n",
            r->arch, kernels, kernels == 1 ? "" : "s", most ? most->regs : 0,
            most ? most->name : "-", stores, loads, stack, smem);
}

static void print_report(FILE *f, const Input *in, const Options *o, const ArchRun *runs, int nruns,
                         const char **names, int n)
{
    int major, minor, width = 6;
    rt_nvrtc_version(&major, &minor);
    for (int i = 0; i < n; i++)
        width = (int)strlen(names[i]) > width ? (int)strlen(names[i]) : width;
    fprintf(f, "# NVRTC %d.%d resource report of %s", major, minor, in->what);
    for (int a = 0; a < nruns; a++)
        fprintf(f, "%s%s", a ? ", " : ", for ", runs[a].arch);
    fprintf(f, "%s%s\n", *o->maxrreg ? ", " : "", o->maxrreg);
    fprintf(f, "# spill stores, spill loads, stack and smem (static shared memory) in bytes\n");
    fprintf(f, "%-*s  %-6s  %9s  %12s  %11s  %6s  %6s  %8s\n", width, "kernel", "arch", "registers",
            "spill stores", "spill loads", "stack", "smem", "barriers");
    for (int i = 0; i < n; i++)
        for (int a = 0; a < nruns; a++)
            if (runs[a].ok)
                print_row(f, width, names[i], runs[a].arch, find_use(&runs[a], names[i]));
    for (int a = 0; a < nruns; a++)
        print_total(f, &runs[a]);
}

/* The report to stdout and to o->report; 0, or 1 when the file cannot be written. */
static int write_reports(const Input *in, const Options *o, const ArchRun *runs, int nruns)
{
    const char **names = NULL;
    int n = row_names(in, runs, nruns, &names);
    if (n < 0)
        return problem("out of memory");
    print_report(stdout, in, o, runs, nruns, names, n);
    int bad = 0;
    if (o->report) {
        FILE *f = fopen(o->report, "w");
        if (f)
            print_report(f, in, o, runs, nruns, names, n);
        if (!f || ferror(f) | (fclose(f) != 0))
            bad = problem("--report=%s: cannot write it: %s", o->report, strerror(errno));
    }
    free(names);
    return bad;
}

int main(int argc, char **argv)
{
    Options o;
    Input in;
    ArchRun runs[MAX_ARCHS] = {{0}};
    int rc = parse_options(argc, argv, &o);
    if (rc)
        return rc > 0 ? 0 : 1;
    if (load_input(&in, o.input)) {
        free_input(&in);
        return 1;
    }
    int bad = 0;
    double seconds = 0;
    for (int a = 0; a < o.narchs; a++) {
        runs[a].arch = o.archs[a];
        bad += compile_arch(&in, &o, &runs[a]);
        bad += runs[a].ok ? usage_problems(&in, &runs[a]) : 0;
        seconds += runs[a].seconds;
    }
    bad += write_reports(&in, &o, runs, o.narchs);
    printf("tccnvrtc: %d kernel%s x %d architecture%s, %.2f s in NVRTC: ", in.nnames,
           in.nnames == 1 ? "" : "s", o.narchs, o.narchs == 1 ? "" : "s", seconds);
    if (bad)
        printf("FAILED, %d problem%s\n", bad, bad == 1 ? "" : "s");
    else
        printf("every kernel compiled, no warnings, no spills\n");
    for (int a = 0; a < o.narchs; a++)
        free(runs[a].use);
    free_input(&in);
    return bad ? 1 : 0;
}
