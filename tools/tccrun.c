/* tccrun.c: the tccrun command: run the training step of a compiled plan, or
 * check a mesh plan against the one-device plan of the same model.
 * Reads: DIR/plan.json (and ONE/plan.json with --verify). Writes: one line per
 * step to stdout (loss, learning rate, gradient norm, time) and a summary, or
 * the contract check's report; errors to stderr, exit status 1.
 * Key idea: with no data loader, the inputs are drawn once from the seed and
 * reused every step, so a model that learns shows a falling loss. A plan for
 * a mesh of N devices runs as N ranks (threads of this process, or one process
 * each under mpirun), each with its block of the same parameters and inputs,
 * so its losses are those of the one-device plan up to rounding. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/comm/comm.h"
#include "runtime/runtime.h"

static const char *USAGE =
    "usage: tccrun DIR [--steps N] [--seed S] [--print-every K] [--comm threads|mpi]\n"
    "              [--timeout S] [--report-memory] [--help]\n"
    "       tccrun DIR --verify ONE [--steps N] [--seed S] [--tol X] [--comm threads|mpi]\n"
    "              [--timeout S]\n"
    "Runs N training steps (default: the train block's steps, else 10) of the plan\n"
    "DIR/plan.json on the CPU, with parameters initialised from seed S (default:\n"
    "the train block's seed, else 1) and one batch of random inputs\n"
    "drawn from S and reused every step. Prints a line every K steps (default 1);\n"
    "--report-memory then prints each rank's slab (bytes touched) and other buffers.\n"
    "A plan for a mesh runs its ranks as threads of this process (--comm threads, the\n"
    "default) or one process each under mpirun (--comm mpi, the default there).\n"
    "--timeout S: a collective or receive that waits S seconds fails the run, naming\n"
    "the ranks that have not come (default: $TCC_COMM_TIMEOUT, else 300).\n"
    "--verify ONE: run N steps (default 3) of the mesh plan DIR and of the plan ONE\n"
    "(the same model on one device) from the same parameters and inputs, and compare\n"
    "the losses and every parameter and optimizer state; exit 1 when a relative\n"
    "difference exceeds X (default 1e-9 for an f64 model, 1e-3 for f32).\n"
    "Kernels are compiled into $TCC_CACHE (default ~/.cache/tcc).\n";

typedef struct Options {
    const char *dir, *one, *comm;
    int64_t steps, every;
    uint64_t seed;
    double tol;
    int steps_given, seed_given;
    int report_memory; /* --report-memory: each rank's memory after the steps */
} Options;

/* What every rank shares. */
typedef struct Job {
    const Options *o;
    const Plan *p;
    int omp_threads; /* per rank of the threads backend; 0: as the process has */
} Job;

static double now_ms(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts)) {
        perror("tccrun: clock_gettime");
        exit(1);
    }
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A whole decimal number in [lo, hi], or -1 after a message. */
static int parse_count(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s && *s != '-' ? strtoull(s, &end, 10) : 0;
    if (!s || *s == '-' || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "tccrun: %s needs a whole number in [%" PRIu64 ", %" PRIu64 "]%s%s%s\n",
                opt, lo, hi, s ? ", not '" : "", s ? s : "", s ? "'" : "");
        return -1;
    }
    *out = v;
    return 0;
}

/* "tccrun: --tol needs a positive number, not 'x'"; -1. */
static int bad_value(const char *opt, const char *what, const char *val)
{
    fprintf(stderr, "tccrun: %s needs %s%s%s%s\n", opt, what, val ? ", not '" : "", val ? val : "",
            val ? "'" : "");
    return -1;
}

/* An option with a value (i is moved past it): 0, 1 when a is no such option, -1. */
static int parse_valued(Options *o, const char *a, const char *val, int *i)
{
    uint64_t v = 0;
    char *end;
    int rc = 0;
    if (!strcmp(a, "--steps")) {
        rc = parse_count(a, val, 0, INT64_MAX, &v);
        o->steps = (int64_t)v, o->steps_given = 1;
    } else if (!strcmp(a, "--print-every")) {
        rc = parse_count(a, val, 1, INT64_MAX, &v);
        o->every = (int64_t)v;
    } else if (!strcmp(a, "--seed")) {
        rc = parse_count(a, val, 0, UINT64_MAX, &o->seed);
        o->seed_given = 1;
    } else if (!strcmp(a, "--comm")) {
        if (!val || (strcmp(val, "threads") && strcmp(val, "mpi")))
            return bad_value(a, "'threads' or 'mpi'", val);
        o->comm = val;
    } else if (!strcmp(a, "--verify")) {
        if (!val)
            return bad_value(a, "the one-device plan's directory", val);
        o->one = val;
    } else if (!strcmp(a, "--timeout")) {
        if (!val || rt_comm_set_timeout(val))
            return bad_value(a, "a number of seconds > 0", val);
    } else if (!strcmp(a, "--tol")) {
        o->tol = val ? strtod(val, &end) : 0;
        if (!val || *end || end == val || !(o->tol > 0))
            return bad_value(a, "a positive number", val);
    } else {
        return 1;
    }
    (*i)++;
    return rc;
}

/* 0 to run, 1 to exit with 0 (--help), -1 to exit with 1. */
static int parse_options(int argc, char **argv, Options *o)
{
    *o = (Options){.steps = 10, .every = 1, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return 1;
        }
        if (!strcmp(a, "--report-memory")) {
            o->report_memory = 1;
            continue;
        }
        int rc = parse_valued(o, a, val, &i);
        if (rc < 0)
            return -1;
        if (rc == 0)
            continue;
        if (a[0] == '-' || o->dir) {
            fprintf(stderr, "tccrun: %s '%s' (try --help)\n",
                    a[0] == '-' ? "unknown option" : "one plan directory only, not also", a);
            return -1;
        }
        o->dir = a;
    }
    if (!o->dir) {
        fprintf(stderr, "tccrun: no plan directory given (try --help)\n");
        return -1;
    }
    if (o->one && !o->steps_given)
        o->steps = 3;
    return 0;
}

/* DIR/plan.json; NULL with a message in err. */
static Plan *load(const char *dir, char *err, size_t n)
{
    char path[4096];
    struct stat st;
    if (stat(dir, &st)) {
        snprintf(err, n, "%s: %s", dir, strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, n, "%s: not a directory", dir);
        return NULL;
    }
    if (snprintf(path, sizeof path, "%s/plan.json", dir) >= (int)sizeof path) {
        snprintf(err, n, "%s: path too long", dir);
        return NULL;
    }
    return plan_load(path, err, n);
}

/* ---- training ---- */

/* One line: the outputs the plan has, and the step's time. */
static void print_step(Runtime *rt, int64_t step, double ms)
{
    const Plan *p = rt_plan(rt);
    printf("step %" PRId64, step);
    if (p->loss >= 0)
        printf("  loss %.6f", rt_scalar(rt, p->loss));
    if (p->lr >= 0)
        printf("  lr %.3g", rt_scalar(rt, p->lr));
    if (p->grad_norm >= 0)
        printf("  grad_norm %.4g", rt_scalar(rt, p->grad_norm));
    printf("  %.1f ms\n", ms);
    fflush(stdout);
}

/* The steps; lead prints. A failing step fails on every rank (its collectives do). */
static int train(Runtime *rt, const Options *o, int nranks, int lead, char *err, size_t n)
{
    const Plan *p = rt_plan(rt);
    double first = NAN, total = 0;
    for (int64_t s = 1; s <= o->steps; s++) {
        double t0 = now_ms();
        if (rt_step(rt, s, err, n))
            return -1;
        double ms = now_ms() - t0;
        total += ms;
        if (s == 1)
            first = rt_scalar(rt, p->loss);
        if (lead && (s % o->every == 0 || s == o->steps))
            print_step(rt, s, ms);
    }
    if (!lead)
        return 0;
    printf("%" PRId64 " steps of %s in %.3f s (%.1f ms/step", o->steps, p->model, total / 1e3,
           o->steps ? total / (double)o->steps : 0.0);
    if (p->flops > 0 && total > 0) /* every device runs the plan's share */
        printf(", %.3g GFLOP/s", p->flops * nranks * (double)o->steps / (total * 1e6));
    printf(")");
    if (p->loss >= 0 && o->steps > 0)
        printf(", loss %.6f -> %.6f", first, rt_scalar(rt, p->loss));
    printf("\n");
    return 0;
}

/* rc of this rank -> -1 on every rank when any failed; a rank that did not
 * fail itself says so in err (the first failing rank's message is reported). */
static int agree(RtComm *all, int rc, char *err, size_t n)
{
    int32_t bad = rc != 0;
    char msg[512];
    if (!all)
        return rc;
    if (rt_comm_all_reduce_max(all, &bad, 1, PD_I32, msg, sizeof msg))
        return rc ? rc : plan_errorf(err, n, "%s", msg);
    if (bad && !rc)
        *err = 0; /* not this rank's failure: nothing to report */
    return bad ? -1 : 0;
}

/* Open rt: rank 0 first (it compiles the kernels into the cache), then the
 * others (they find them there); then join the world. */
static int open_rank(const Job *J, RtWorld *w, RtComm *all, Runtime **rt, char *err, size_t n)
{
    int rank = all ? rt_comm_rank(all) : 0, rc = 0;
    if (rank == 0 && !(*rt = rt_open(J->p, NULL, err, n)))
        rc = -1;
    if (agree(all, rc, err, n))
        return -1;
    if (rank != 0 && !(*rt = rt_open(J->p, NULL, err, n)))
        rc = -1;
    if (agree(all, rc, err, n))
        return -1;
    return agree(all, w ? rt_attach(*rt, w, err, n) : 0, err, n);
}

/* One rank (w NULL: the only device): open, the same parameters and inputs as
 * one device, the steps. -1 with the message in err; err empty when another
 * rank failed and reports. */
static int run_rank(const Job *J, RtWorld *w, char *err, size_t n)
{
    RtComm *all = NULL;
    Runtime *rt = NULL;
    int rank = w ? rt_world_rank(w) : 0;
    if (w && !(all = rt_comm_split(w, 0, rank, err, n)))
        return -1;
    if (all)
        rt_comm_name(all, "world");
    int rc = open_rank(J, w, all, &rt, err, n);
    if (!rc) {
        rt_init_params(rt, J->o->seed);
        rt_random_inputs(rt, J->o->seed);
        rc = train(rt, J->o, w ? rt_world_size(w) : 1, rank == 0, err, n);
    }
    if (!rc && J->o->report_memory)
        rc = agree(all, rt_memory_report(rt, rank == 0 ? stdout : NULL, err, n), err, n);
    rt_close(rt);
    rt_comm_free(all);
    return rc;
}

/* A rank of the threads backend, with its share of the OpenMP threads. */
static int thread_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    const Job *J = arg;
    if (J->omp_threads > 0)
        omp_set_num_threads(J->omp_threads);
    int rc = run_rank(J, w, err, n);
    return rc && *err ? -1 : 0; /* a rank with nothing to say lets the failing one report */
}

/* ---- the mesh ---- */

/* "dp=2 x tp=2": the axes of more than one device ("one device" when none). */
static void mesh_text(const Plan *p, char *out, size_t n)
{
    size_t len = 0;
    snprintf(out, n, "one device");
    for (int a = 0; a < p->naxes && len < n; a++)
        if (p->axes[a].size > 1)
            len += (size_t)snprintf(out + len, n - len, "%s%s=%d", len ? " x " : "",
                                    p->axes[a].name, p->axes[a].size);
}

/* The world must be the plan's mesh: 0, or -1 after rank 0 said why. */
static int check_world(const Plan *p, RtWorld *w)
{
    char mesh[128];
    int size = rt_world_size(w);
    if (size == plan_mesh_size(p))
        return 0;
    mesh_text(p, mesh, sizeof mesh);
    if (rt_world_rank(w) == 0)
        fprintf(stderr,
                "tccrun: the plan is for %s%" PRId64 " devices%s%s%s, but mpirun started %d "
                "ranks\n",
                plan_mesh_size(p) > 1 ? "a mesh of " : "", plan_mesh_size(p),
                plan_mesh_size(p) > 1 ? " (" : "", plan_mesh_size(p) > 1 ? mesh : "",
                plan_mesh_size(p) > 1 ? ")" : "", size);
    return -1;
}

/* Train the plan: alone, as threads, or as this rank of w. */
static int run(const Options *o, const Plan *p, RtWorld *w)
{
    char err[1024] = "", mesh[128];
    Job J = {o, p, 0};
    int nranks = (int)plan_mesh_size(p), lead = !w || rt_world_rank(w) == 0, rc;
    mesh_text(p, mesh, sizeof mesh);
    if (w && check_world(p, w))
        return -1;
    if (nranks > 1 && lead)
        printf("mesh %s, %d ranks, comm %s\n", mesh, nranks, w ? rt_world_backend(w) : "threads");
    if (w) {
        rc = run_rank(&J, w, err, sizeof err);
    } else if (nranks > 1) {
        int total = omp_get_max_threads();
        J.omp_threads = total / nranks > 1 ? total / nranks : 1;
        rc = rt_run_threads(nranks, thread_rank, &J, err, sizeof err);
    } else {
        rc = run_rank(&J, NULL, err, sizeof err);
    }
    if (rc && *err)
        fprintf(stderr, "tccrun: %s\n", err);
    return rc;
}

/* --verify: the contract check, threads or this rank of w; 0, 1 (differs), -1. */
static int verify(const Options *o, const Plan *mesh, const Plan *one, RtWorld *w)
{
    char err[1024] = "";
    int lead = !w || rt_world_rank(w) == 0;
    if (plan_mesh_size(one) != 1 || strcmp(one->model, mesh->model)) {
        if (lead && plan_mesh_size(one) != 1)
            fprintf(stderr, "tccrun: --verify %s: the plan runs on %" PRId64 " devices, not one\n",
                    o->one, plan_mesh_size(one));
        else if (lead)
            fprintf(stderr, "tccrun: --verify %s: a plan of model '%s', not '%s'\n", o->one,
                    one->model, mesh->model);
        return -1;
    }
    if (w && check_world(mesh, w))
        return -1;
    int f64 = one->loss >= 0 && one->tensors[one->loss].dtype == PD_F64;
    double tol = o->tol > 0 ? o->tol : f64 ? 1e-9 : 1e-3;
    if (lead) {
        printf("verify: %s on %" PRId64 " devices (comm %s) against one device, %" PRId64
               " steps\n",
               mesh->model, plan_mesh_size(mesh), w ? rt_world_backend(w) : "threads", o->steps);
        fflush(stdout);
    }
    int steps = o->steps > 100000 ? 100000 : (int)o->steps;
    int rc = w ? rt_verify_world(w, mesh, one, steps, o->seed, tol, NULL, stdout, err, sizeof err)
               : rt_verify(mesh, one, steps, o->seed, tol, NULL, stdout, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "tccrun: --verify: %s\n", err);
    return rc;
}

/* The plans (rank 0 says what is wrong with them), then the run or the check. */
static int run_plans(const Options *o, RtWorld *w)
{
    char err[1024];
    int lead = !w || rt_world_rank(w) == 0, rc = -1;
    Plan *p = load(o->dir, err, sizeof err), *one = NULL;
    if (p && o->one && !(one = load(o->one, err, sizeof err)))
        plan_free(p), p = NULL;
    if (!p && lead)
        fprintf(stderr, "tccrun: %s\n", err);
    Options with = *o; /* the train block's steps and seed, unless given here */
    if (p && !o->one && !o->steps_given && p->steps > 0)
        with.steps = p->steps;
    if (p && !o->seed_given && p->seed >= 0)
        with.seed = (uint64_t)p->seed;
    if (p)
        rc = one ? verify(&with, p, one, w) : run(&with, p, w);
    plan_free(one);
    plan_free(p);
    return rc;
}

int main(int argc, char **argv)
{
    Options o;
    char err[1024];
    int rc = parse_options(argc, argv, &o);
    if (rc)
        return rc > 0 ? 0 : 1;
    int launched = rt_mpi_launched();
    int mpi = o.comm ? !strcmp(o.comm, "mpi") : launched;
    RtWorld *w = NULL;
    if (mpi && !launched) {
        fprintf(stderr, "tccrun: --comm mpi: not started by mpirun or srun\n");
        return 1;
    }
    if (mpi && !(w = rt_world_mpi(err, sizeof err))) {
        fprintf(stderr, "tccrun: %s\n", err);
        return 1;
    }
    rc = run_plans(&o, w);
    fflush(stdout);
    rt_world_close(w);
    return rc ? 1 : 0;
}
