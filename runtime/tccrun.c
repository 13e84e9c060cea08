/* tccrun.c: the tccrun command: run the training step of a compiled plan.
 * Reads: DIR/plan.json. Writes: one line per step to stdout (loss, learning
 * rate, gradient norm, time) and a summary; errors to stderr, exit status 1.
 * Key idea: with no data loader yet, the inputs are drawn once from the seed
 * and reused every step, so a model that learns shows a falling loss. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/runtime.h"

static const char *USAGE =
    "usage: tccrun DIR [--steps N] [--seed S] [--print-every K] [--help]\n"
    "Runs N training steps (default 10) of the plan DIR/plan.json on the CPU, with\n"
    "parameters initialised from seed S (default 1) and one batch of random inputs\n"
    "drawn from S and reused every step. Prints a line every K steps (default 1).\n"
    "Kernels are compiled into $TCC_CACHE (default ~/.cache/tcc).\n";

typedef struct Options {
    const char *dir;
    int64_t steps, every;
    uint64_t seed;
} Options;

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

/* 0 to run, 1 to exit with 0 (--help), -1 to exit with 1. */
static int parse_options(int argc, char **argv, Options *o)
{
    uint64_t v;
    *o = (Options){NULL, 10, 1, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return 1;
        }
        if (!strcmp(a, "--steps")) {
            if (parse_count(a, val, 0, INT64_MAX, &v))
                return -1;
            o->steps = (int64_t)v;
            i++;
        } else if (!strcmp(a, "--print-every")) {
            if (parse_count(a, val, 1, INT64_MAX, &v))
                return -1;
            o->every = (int64_t)v;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (parse_count(a, val, 0, UINT64_MAX, &o->seed))
                return -1;
            i++;
        } else if (a[0] == '-' || o->dir) {
            fprintf(stderr, "tccrun: %s '%s' (try --help)\n",
                    a[0] == '-' ? "unknown option" : "one plan directory only, not also", a);
            return -1;
        } else {
            o->dir = a;
        }
    }
    if (!o->dir) {
        fprintf(stderr, "tccrun: no plan directory given (try --help)\n");
        return -1;
    }
    return 0;
}

static Plan *load(const char *dir)
{
    char path[4096], err[1024];
    struct stat st;
    if (stat(dir, &st)) {
        fprintf(stderr, "tccrun: %s: %s\n", dir, strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "tccrun: %s: not a directory\n", dir);
        return NULL;
    }
    if (snprintf(path, sizeof path, "%s/plan.json", dir) >= (int)sizeof path) {
        fprintf(stderr, "tccrun: %s: path too long\n", dir);
        return NULL;
    }
    Plan *p = plan_load(path, err, sizeof err);
    if (!p)
        fprintf(stderr, "tccrun: %s\n", err);
    return p;
}

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

static int train(Runtime *rt, const Options *o)
{
    const Plan *p = rt_plan(rt);
    char err[1024];
    double first = NAN, total = 0;
    for (int64_t s = 1; s <= o->steps; s++) {
        double t0 = now_ms();
        if (rt_step(rt, s, err, sizeof err)) {
            fprintf(stderr, "tccrun: %s\n", err);
            return -1;
        }
        double ms = now_ms() - t0;
        total += ms;
        if (s == 1)
            first = rt_scalar(rt, p->loss);
        if (s % o->every == 0 || s == o->steps)
            print_step(rt, s, ms);
    }
    printf("%" PRId64 " steps of %s in %.3f s (%.1f ms/step", o->steps, p->model, total / 1e3,
           o->steps ? total / (double)o->steps : 0.0);
    if (p->flops > 0 && total > 0)
        printf(", %.3g GFLOP/s", p->flops * (double)o->steps / (total * 1e6));
    printf(")");
    if (p->loss >= 0 && o->steps > 0)
        printf(", loss %.6f -> %.6f", first, rt_scalar(rt, p->loss));
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    Options o;
    char err[1024];
    int rc = parse_options(argc, argv, &o);
    if (rc)
        return rc > 0 ? 0 : 1;
    Plan *p = load(o.dir);
    if (!p)
        return 1;
    Runtime *rt = rt_open(p, NULL, err, sizeof err);
    if (!rt) {
        fprintf(stderr, "tccrun: %s\n", err);
        plan_free(p);
        return 1;
    }
    rt_init_params(rt, o.seed);
    rt_random_inputs(rt, o.seed);
    rc = train(rt, &o);
    rt_close(rt);
    plan_free(p);
    return rc ? 1 : 0;
}
