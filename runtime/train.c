/* train.c: the training loop of a generated program (tcc model.tdl -o NAME).
 * Reads the command line, the plan embedded in the program, token shards and
 * checkpoints; writes logs and checkpoints. Key idea: a step is the plan's
 * instruction list; everything around it -- data, learning-rate override,
 * evaluation (the forward instructions only), checkpoints and exact resume --
 * lives here, so the program is the plan plus this loop. A plan for a mesh of
 * N devices runs as N ranks, threads of this process (--comm threads) or one
 * process each under mpirun (--comm mpi), each with its own Runtime and its
 * rows of every batch; rank 0 prints. A rank that fails must not leave the
 * others waiting in a collective, so every fallible step that is not itself
 * collective is followed by an agreement (agree) that fails every rank. Two
 * agreements of a step also carry the decisions the ranks must take together:
 * the one in the middle (after the gradient norm, before the update), whether
 * the loss or the norm is not finite, which drops the update; the one after
 * it, whether SIGTERM, SIGINT or SIGUSR1 reached any rank, which ends the run
 * with a checkpoint of that step. */
#include "runtime/exec.h"
#include "runtime/metrics.h"

#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_FILE_INPUTS = 16 };

typedef struct Options {
    const char *data, *val, *ckpt, *comm, *device, *metrics, *init_from, *export_hf;
    char input[MAX_FILE_INPUTS][128];     /* --input NAME=PATTERN: the name */
    const char *pattern[MAX_FILE_INPUTS]; /* and the pattern (in argv) */
    int ninputs;
    int64_t steps, ckpt_every, log_every, eval_every, eval_batches, keep, skip_nonfinite;
    uint64_t seed;
    double lr;
    int resume, exact, report_memory, help;
    int steps_given, seed_given; /* --steps, --seed: else the train block's, else defaults */
} Options;

/* What every rank shares, read-only once the ranks run but for `stopped`. */
typedef struct Job {
    const char *prog;
    const Plan *p;
    RtKernel const *kernels;
    Options o;
    int nranks;
    int omp_threads; /* per rank of the threads backend; 0: as the process has */
    RtDeviceKind device; /* resolved from --device */
    char device_note[600]; /* "device cpu (auto: ...)": why it was chosen */
    int stopped;           /* the threads backend: 128 + the stop signal that ended the run, else
                              0 (written by rank 0 alone, read once every rank is done) */
} Job;

typedef struct Loop {
    const char *prog;
    const Plan *p;
    const Options *o;
    const char *device_note; /* printed before the first step on one device */
    Runtime *rt;
    RtComm *all;       /* every rank, for agree; NULL on one device */
    int rank, nranks;  /* in the world (0 and 1 on one device) */
    int lead;          /* world rank 0: the rank that prints */
    int culprit;       /* the first failing rank once agree saw a failure, else -1 */
    int stop;          /* the stop signal the ranks agreed on after the last step, else 0 */
    int64_t skipped;   /* steps whose update was dropped (non-finite loss or norm) */
    int64_t last_ckpt; /* the step of the last checkpoint written or resumed, -1: none */
    DataLoader *train, *val;
    NpyLoader *npy[MAX_FILE_INPUTS]; /* by --input */
    int npy_t[MAX_FILE_INPUTS];      /* their tensors */
    void *npy_buf[MAX_FILE_INPUTS];  /* this rank's rows of a batch */
    size_t npy_bytes[MAX_FILE_INPUTS]; /* their size */
    int64_t npy_rows[MAX_FILE_INPUTS], npy_global[MAX_FILE_INPUTS]; /* a batch's, of its rank, of
                                                                       all */
    int tokens, targets;  /* the plan's i32 [B, S] inputs, -1 when absent */
    int64_t rows, seq;    /* this rank's rows of a batch, the whole sequence */
    int64_t batch_tokens; /* of the global batch */
    int32_t *in_buf, *tgt_buf;
    FILE *metrics; /* --metrics: rank 0's, else NULL */
    char err[1024]; /* this rank's first failure */
} Loop;

static void usage(const char *prog, FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "  --data PATTERN      training token shards (llm.c format; a glob)\n"
            "  --val PATTERN       validation token shards\n"
            "  --input NAME=PATTERN  the input NAME from NumPy .npy files (a glob), one\n"
            "                      example per row of its batch; repeat for each input\n"
            "  --steps N           steps to train (default: the train block's steps, else 100)\n"
            "  --lr X              peak learning rate (default: the model's)\n"
            "  --seed S            seed of the parameter init and of random data (default:\n"
            "                      the train block's seed, else 1337)\n"
            "  --ckpt DIR          write checkpoints to DIR\n"
            "  --ckpt-every N      a checkpoint every N steps (default: only at the end)\n"
            "  --resume            continue from the newest checkpoint in --ckpt DIR\n"
            "  --init-from DIR     start from a Hugging Face model directory (config.json,\n"
            "                      model.safetensors or its shards): GPT-2\n"
            "  --export-hf DIR     after the last step, write the parameters as a Hugging\n"
            "                      Face model directory (GPT-2)\n"
            "  --keep N            keep only the newest N checkpoints in --ckpt DIR\n"
            "                      (default: all)\n"
            "  --log-every N       a log line every N steps (default 1)\n"
            "  --eval-every N      validation loss every N steps (default: at the end)\n"
            "  --eval-batches N    validation batches per evaluation (default 4)\n"
            "  --metrics FILE      every step's loss, lr, grad norm, ms, tokens/s and GFLOP/s\n"
            "                      (and every validation loss) as JSON lines, written as it goes\n"
            "  --exact             log each loss also as a hexadecimal float (every bit)\n"
            "  --skip-nonfinite N  drop the update of up to N steps whose loss or gradient\n"
            "                      norm is not finite (default 0: stop at the first)\n"
            "  --report-memory     after the steps, each rank's memory: its slab (bytes\n"
            "                      touched) and its other buffers (high-water mark)\n"
            "  --comm threads|mpi  how the ranks of a mesh run: threads of this process, or\n"
            "                      one process each (default: mpi under mpirun, else threads)\n"
            "  --device auto|cpu|cuda  where the plan runs (default auto: cuda when there is\n"
            "                      a GPU, else cpu); cuda: one GPU per process (its local rank)\n"
            "  --timeout S         the watchdog: a collective or receive that waits S seconds\n"
            "                      fails the run, naming the ranks that have not come\n"
            "                      (default: $TCC_COMM_TIMEOUT, else 300)\n"
            "  --help              this text\n"
            "Without --data or --input, the model trains on one fixed batch of random inputs.\n"
            "SIGTERM, SIGINT or SIGUSR1: every rank finishes its step, a checkpoint is\n"
            "written to --ckpt DIR, and the program exits with status 128 + the signal\n"
            "(143, 130, 138); a second signal ends it at once.\n",
            prog);
}

static int die(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One write of the whole line: under mpirun the lines of several ranks must not mix. */
static int die(const char *prog, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: error: %s\n", prog, msg);
    return 1;
}

/* The message into msg[n] (kept for whoever reports it); 1. */
static int failf(char *msg, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failf(char *msg, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, n, fmt, ap);
    va_end(ap);
    return 1;
}

static int parse_int(const char *opt, const char *s, int64_t lo, int64_t *out, char *msg, size_t n)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo)
        return failf(msg, n, "%s expects an integer >= %lld, got '%s'", opt, (long long)lo, s);
    *out = v;
    return 0;
}

/* A flag, or an option with a value: 0, or 1 with the message in msg. */
static int parse_one(Options *o, const char *a, const char *v, char *msg, size_t n)
{
    static const char *names[] = {"--steps",     "--seed",          "--ckpt-every",
                                  "--log-every", "--eval-every",    "--eval-batches",
                                  "--keep",      "--skip-nonfinite"};
    int64_t *dst[] = {&o->steps,        NULL,     &o->ckpt_every,    &o->log_every, &o->eval_every,
                      &o->eval_batches, &o->keep, &o->skip_nonfinite};
    int64_t x = 0;
    int k = 0;
    if (!strcmp(a, "--data")) {
        o->data = v;
    } else if (!strcmp(a, "--input")) {
        const char *eq = strchr(v, '=');
        if (!eq || eq == v || !eq[1] || (size_t)(eq - v) >= sizeof o->input[0])
            return failf(msg, n, "--input expects NAME=PATTERN, got '%s'", v);
        if (o->ninputs == MAX_FILE_INPUTS)
            return failf(msg, n, "--input: at most %d inputs", MAX_FILE_INPUTS);
        char *name = o->input[o->ninputs];
        snprintf(name, sizeof o->input[0], "%.*s", (int)(eq - v), v);
        for (int i = 0; i < o->ninputs; i++)
            if (!strcmp(o->input[i], name))
                return failf(msg, n, "--input: '%s' given twice", name);
        o->pattern[o->ninputs++] = eq + 1;
    } else if (!strcmp(a, "--val")) {
        o->val = v;
    } else if (!strcmp(a, "--metrics")) {
        o->metrics = v;
    } else if (!strcmp(a, "--ckpt")) {
        o->ckpt = v;
    } else if (!strcmp(a, "--init-from")) {
        o->init_from = v;
    } else if (!strcmp(a, "--export-hf")) {
        o->export_hf = v;
    } else if (!strcmp(a, "--comm")) {
        if (strcmp(v, "threads") && strcmp(v, "mpi"))
            return failf(msg, n, "--comm expects 'threads' or 'mpi', got '%s'", v);
        o->comm = v;
    } else if (!strcmp(a, "--device")) {
        if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda"))
            return failf(msg, n, "--device expects 'auto', 'cpu' or 'cuda', got '%s'", v);
        o->device = v;
    } else if (!strcmp(a, "--timeout")) {
        if (rt_comm_set_timeout(v))
            return failf(msg, n, "--timeout expects a number of seconds > 0, got '%s'", v);
    } else if (!strcmp(a, "--lr")) {
        char *end;
        o->lr = strtod(v, &end);
        if (*end || end == v || !(o->lr > 0) || !isfinite(o->lr))
            return failf(msg, n, "--lr expects a positive number, got '%s'", v);
    } else {
        while (k < 8 && strcmp(a, names[k]))
            k++;
        if (k == 8)
            return failf(msg, n, "unknown option '%s' (see --help)", a);
        if (parse_int(a, v, k == 1 || k == 4 || k == 7 ? 0 : 1, &x, msg, n))
            return 1;
        if (k == 1)
            o->seed = (uint64_t)x, o->seed_given = 1;
        else
            *dst[k] = x;
        o->steps_given |= k == 0;
    }
    return 0;
}

/* The options into o: 0, or 1 with the message in msg (o->help: print the usage). */
static int parse_args(Options *o, int argc, char **argv, char *msg, size_t n)
{
    *o = (Options){.steps = 100, .log_every = 1, .eval_batches = 4, .seed = 1337, .lr = -1,
                   .device = "auto"};
    static const char *const known[] = {
        "--data",          "--val",          "--ckpt",           "--lr",           "--input",
        "--steps",         "--seed",         "--ckpt-every",     "--log-every",
        "--eval-every",    "--eval-batches", "--comm",           "--device",
        "--resume",        "--exact",        "--help",           "-h",
        "--report-memory", "--keep",         "--skip-nonfinite", "--timeout",          "--metrics",
        "--init-from",     "--export-hf"};
    const size_t nknown = sizeof known / sizeof *known;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t w = 0;
        while (w < nknown && strcmp(a, known[w]))
            w++;
        if (w == nknown)
            return failf(msg, n, "unknown option '%s' (see --help)", a);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            o->help = 1;
            return 0;
        } else if (!strcmp(a, "--resume")) {
            o->resume = 1;
        } else if (!strcmp(a, "--exact")) {
            o->exact = 1;
        } else if (!strcmp(a, "--report-memory")) {
            o->report_memory = 1;
        } else if (!v) {
            return failf(msg, n, "%s needs a value", a);
        } else if (parse_one(o, a, v, msg, n)) {
            return 1;
        } else {
            i++;
        }
    }
    if (o->resume && !o->ckpt)
        return failf(msg, n, "--resume needs --ckpt DIR");
    if (o->resume && o->init_from)
        return failf(msg, n, "--init-from and --resume: a run starts from one of them");
    if (o->keep && !o->ckpt)
        return failf(msg, n, "--keep needs --ckpt DIR");
    if (o->eval_every && !o->val)
        return failf(msg, n, "--eval-every needs --val PATTERN: validation shards to evaluate on");
    return 0;
}

/* ---- failures on a mesh ---- */

static int fail(Loop *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Loop *L, const char *fmt, ...)
{
    va_list ap;
    if (L->err[0])
        return 1;
    va_start(ap, fmt);
    vsnprintf(L->err, sizeof L->err, fmt, ap);
    va_end(ap);
    return 1;
}

/* A failure that every rank meets alike (they agreed on what it is): rank 0 tells it. */
static int fail_all(Loop *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_all(Loop *L, const char *fmt, ...)
{
    va_list ap;
    L->culprit = 0;
    va_start(ap, fmt);
    vsnprintf(L->err, sizeof L->err, fmt, ap);
    va_end(ap);
    return 1;
}

/* rc: this rank's outcome (nonzero: failed, its message in L->err). 1 on
 * every rank when any rank failed, else 0; the first failing rank reports.
 * The same all-reduce takes the maximum over the ranks of v[0..nv) (nv <= 3). */
static int agree_max(Loop *L, int rc, int32_t *v, int nv)
{
    char msg[512];
    int32_t buf[4] = {rc ? L->nranks - L->rank : 0}; /* the largest: the first failing rank */
    memcpy(buf + 1, v, (size_t)nv * sizeof *v);
    if (L->all && rt_comm_all_reduce_max(L->all, buf, (size_t)nv + 1, PD_I32, msg, sizeof msg))
        return rc ? 1 : fail(L, "%s", msg);
    memcpy(v, buf + 1, (size_t)nv * sizeof *v);
    if (buf[0] && L->all)
        L->culprit = L->nranks - buf[0];
    return buf[0] != 0;
}

static int agree(Loop *L, int rc)
{
    return agree_max(L, rc, NULL, 0);
}

/* ---- stop signals ----
 * The one mutable global of the program: a signal handler can reach nothing
 * else, and may do nothing but set it. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

static const int stop_signals[] = {SIGTERM, SIGINT, SIGUSR1};

/* The first stop signal sets stop_signal and no more: SA_RESETHAND gives that
 * signal its default action back, so a second one ends the program at once. */
static int catch_stop_signals(char *msg, size_t n)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART; /* no EINTR in the middle of a write */
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        if (sigaction(stop_signals[i], &sa, NULL))
            return failf(msg, n, "sigaction: %s", strerror(errno));
    return 0;
}

/* Once the ranks agreed to stop: any stop signal ends the program at once. */
static void release_stop_signals(void)
{
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        signal(stop_signals[i], SIG_DFL);
}

static const char *signal_name(int sig)
{
    return sig == SIGTERM   ? "SIGTERM"
           : sig == SIGINT  ? "SIGINT"
           : sig == SIGUSR1 ? "SIGUSR1"
                            : "a signal";
}

/* The data contract: the first two i32 inputs of shape [B, S] are the tokens
 * and the next-token targets. */
static void find_token_inputs(Loop *L)
{
    L->tokens = L->targets = -1;
    for (int i = 0; i < L->p->ntensors; i++) {
        const PlanTensor *t = &L->p->tensors[i];
        if (t->role != PT_INPUT || t->dtype != PD_I32 || t->rank != 2)
            continue;
        if (L->tokens < 0) {
            L->tokens = i;
        } else if (L->targets < 0 && t->shape[0] == L->p->tensors[L->tokens].shape[0] &&
                   t->shape[1] == L->p->tensors[L->tokens].shape[1]) {
            L->targets = i;
        }
    }
    if (L->targets < 0)
        L->tokens = -1;
    if (L->tokens >= 0) {
        int64_t whole[PLAN_MAX_RANK];
        rt_global_shape(L->p, &L->p->tensors[L->tokens], whole);
        L->rows = L->p->tensors[L->tokens].shape[0]; /* this device's rows */
        L->seq = whole[1];
        L->batch_tokens = whole[0] * whole[1];
    }
}

/* The --input loaders: each names an input of the model that the token
 * files do not feed; its files give this rank's rows, whole in the other
 * dimensions (rt_set_input keeps this device's block). */
static int open_inputs(Loop *L)
{
    char err[512], names[256];
    const Plan *p = L->p;
    for (int k = 0; k < L->o->ninputs; k++) {
        const char *name = L->o->input[k];
        int t = 0, rank, ranks;
        while (t < p->ntensors && (p->tensors[t].role != PT_INPUT || plan_is_keys(&p->tensors[t]) ||
                                   strcmp(p->tensors[t].name, name)))
            t++;
        if (t == p->ntensors) {
            size_t at = 0;
            names[0] = 0;
            for (int i = 0; i < p->ntensors && at < sizeof names; i++)
                if (p->tensors[i].role == PT_INPUT && !plan_is_keys(&p->tensors[i]))
                    at += (size_t)snprintf(names + at, sizeof names - at, "%s'%s'", at ? ", " : "",
                                           p->tensors[i].name);
            return fail(L, "--input: the model has no input '%s' (its inputs: %s)", name, names);
        }
        if (L->o->data && (t == L->tokens || t == L->targets))
            return fail(L, "--input: '%s' is fed by the token files of --data", name);
        const PlanTensor *pt = &p->tensors[t];
        int64_t whole[PLAN_MAX_RANK];
        rt_global_shape(p, pt, whole);
        if (pt->rank < 1)
            return fail(L, "--input: '%s' is a scalar; .npy files feed inputs with a batch "
                           "dimension", name);
        rt_data_split(L->rt, name, &rank, &ranks);
        L->npy_t[k] = t;
        L->npy_rows[k] = pt->shape[0];
        L->npy_global[k] = whole[0];
        if (!(L->npy[k] = rt_npy_open(L->o->pattern[k], name, pt->dtype, whole + 1, pt->rank - 1,
                                      pt->dtype == PD_I32 ? pt->limit : 0, rank, ranks, err,
                                      sizeof err)))
            return fail(L, "--input %s: %s", name, err);
        size_t bytes = plan_dtype_size(pt->dtype) * (size_t)pt->shape[0];
        for (int d = 1; d < pt->rank; d++)
            bytes *= (size_t)whole[d];
        L->npy_bytes[k] = bytes;
        if (!(L->npy_buf[k] = malloc(bytes + 1)))
            return fail(L, "malloc: out of memory");
        /* the inputs pair by example: files of unlike counts would pair wrongly, wrapping apart */
        if (k > 0 && rt_npy_examples(L->npy[k]) != rt_npy_examples(L->npy[0]))
            return fail(L, "--input: '%s' has %lld examples and '%s' %lld: the inputs pair example "
                           "by example, so they need as many",
                        name, (long long)rt_npy_examples(L->npy[k]), p->tensors[L->npy_t[0]].name,
                        (long long)rt_npy_examples(L->npy[0]));
    }
    return 0;
}

/* Whether input t is fed by a file: the token files' pair, or an --input. */
static int fed(const Loop *L, int t)
{
    int yes = plan_is_keys(&L->p->tensors[t]) || /* dropout's keys: the seed's */
              ((L->o->data || L->o->val) && (t == L->tokens || t == L->targets));
    for (int k = 0; k < L->o->ninputs; k++)
        yes |= L->npy_t[k] == t;
    return yes;
}

/* A stream shorter than one global batch (rows x ranks x (S + 1) tokens)
 * repeats within every batch: said once, by rank 0, as a warning. */
static void short_stream(const Loop *L, const DataLoader *d, const char *what, int ranks)
{
    int64_t batch = L->rows * ranks * (L->seq + 1);
    if (d && rt_data_tokens(d) < batch && L->rank == 0)
        fprintf(stderr, "%s: warning: %s holds %lld tokens, fewer than one batch of %lld: every "
                        "batch repeats them\n",
                L->prog, what, (long long)rt_data_tokens(d), (long long)batch);
}

/* The loaders: this rank reads the rows of its data-parallel rank. */
static int open_data(Loop *L)
{
    char err[512];
    int rank, ranks;
    if (!L->o->data && !L->o->val && !L->o->ninputs)
        return 0;
    if (L->o->val && L->o->ninputs)
        return fail(L, "--val: validation reads token files only, and --input feeds '%s' "
                       "(validation of other inputs is not supported yet)",
                    L->o->input[0]);
    if ((L->o->data || L->o->val) && L->tokens < 0)
        return fail(L, "--data: the model has no token inputs (two i32 inputs [B, S])");
    if (open_inputs(L))
        return 1;
    for (int i = 0; i < L->p->ntensors; i++) /* every input is fed, or none */
        if (L->p->tensors[i].role == PT_INPUT && !fed(L, i) && !L->o->ninputs)
            return fail(L, "--data: the token files feed '%s' and '%s' only, and the model "
                           "has the input '%s' besides (give it --input %s=PATTERN; without "
                           "--data every input is random)",
                        L->p->tensors[L->tokens].name, L->p->tensors[L->targets].name,
                        L->p->tensors[i].name, L->p->tensors[i].name);
        else if (L->p->tensors[i].role == PT_INPUT && !fed(L, i))
            return fail(L, "--input: the model's input '%s' is fed by no file (give --input "
                           "%s=PATTERN; without --data or --input every input is random)",
                        L->p->tensors[i].name, L->p->tensors[i].name);
    if (!L->o->data && !L->o->val)
        return 0;
    const PlanTensor *t = &L->p->tensors[L->tokens];
    rt_data_split(L->rt, t->name, &rank, &ranks);
    if (L->o->data &&
        !(L->train = rt_data_open(L->o->data, t->limit, rank, ranks, err, sizeof err)))
        return fail(L, "%s", err);
    if (L->o->val && !(L->val = rt_data_open(L->o->val, t->limit, rank, ranks, err, sizeof err)))
        return fail(L, "%s", err);
    short_stream(L, L->train, "--data", ranks);
    short_stream(L, L->val, "--val", ranks);
    size_t n = (size_t)(L->rows * L->seq);
    L->in_buf = malloc(n * sizeof(int32_t));
    L->tgt_buf = malloc(n * sizeof(int32_t));
    if (!L->in_buf || !L->tgt_buf)
        return fail(L, "malloc: out of memory");
    return 0;
}

/* This rank's rows of the next batch of every --input into its tensor. */
static int load_inputs(Loop *L)
{
    char err[512];
    for (int k = 0; k < L->o->ninputs; k++) {
        const PlanTensor *pt = &L->p->tensors[L->npy_t[k]];
        if (rt_npy_next(L->npy[k], L->npy_rows[k], L->npy_buf[k], err, sizeof err) ||
            rt_set_input(L->rt, pt->name, L->npy_buf[k], L->npy_bytes[k], err, sizeof err))
            return fail(L, "--input %s: %s", pt->name, err);
    }
    return 0;
}

/* This rank's rows of the next batch of d into the token inputs. */
static int load_batch(Loop *L, DataLoader *d)
{
    char err[512];
    size_t bytes = (size_t)(L->rows * L->seq) * sizeof(int32_t);
    if (rt_data_next(d, L->rows, L->seq, L->in_buf, L->tgt_buf, err, sizeof err) ||
        rt_set_input(L->rt, L->p->tensors[L->tokens].name, L->in_buf, bytes, err, sizeof err) ||
        rt_set_input(L->rt, L->p->tensors[L->targets].name, L->tgt_buf, bytes, err, sizeof err))
        return fail(L, "%s", err);
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A metrics line that could not be written (a full disk): said once, and
 * the run goes on without the file (the other ranks know nothing of it, so
 * failing here alone would leave them waiting). */
static void metrics_failed(Loop *L)
{
    fprintf(stderr, "%s: warning: --metrics %s: %s; no more metrics are written\n", L->prog,
            L->o->metrics, strerror(errno));
    fclose(L->metrics);
    L->metrics = NULL;
}

/* Mean loss over eval_batches validation batches, parameters untouched. */
static int evaluate(Loop *L, int64_t step, double *loss)
{
    char err[512];
    double sum = 0;
    int64_t pos = rt_data_tell(L->val);
    for (int64_t b = 0; b < L->o->eval_batches; b++) {
        if (agree(L, load_batch(L, L->val)))
            return 1;
        if (agree(L, rt_forward(L->rt, err, sizeof err) ? fail(L, "%s", err) : 0))
            return 1;
        sum += rt_scalar(L->rt, L->p->loss);
    }
    /* the same batches every time */
    if (agree(L, rt_data_seek(L->val, pos, err, sizeof err) ? fail(L, "%s", err) : 0))
        return 1;
    if (!L->train) /* training goes on with its fixed random batch */
        rt_random_inputs(L->rt, L->o->seed + 1);
    *loss = sum / (double)L->o->eval_batches;
    if (L->lead && L->o->exact)
        printf("step %5" PRId64 "  val loss %.6f (%a)\n", step, *loss, *loss);
    else if (L->lead)
        printf("step %5" PRId64 "  val loss %.6f\n", step, *loss);
    if (L->metrics && rt_metrics_val(L->metrics, step, *loss) != 0)
        metrics_failed(L);
    return 0;
}

/* --export-hf: collective on a mesh, as a checkpoint: every rank gathers, rank 0 writes. */
static int export_hf(Loop *L)
{
    char err[512];
    if (agree(L, rt_sync_host(L->rt, err, sizeof err) ? fail(L, "--export-hf: %s", err) : 0))
        return 1;
    if (agree(L, rt_hf_export(L->rt, L->o->export_hf, L->lead, err, sizeof err)
                     ? fail(L, "--export-hf: %s", err)
                     : 0))
        return 1;
    if (L->lead)
        printf("exported to %s\n", L->o->export_hf);
    return 0;
}

/* Collective on a mesh: every rank gathers, rank 0 writes. */
static int save(Loop *L, int64_t step)
{
    char err[512];
    CkptMeta m = {step, L->train ? rt_data_tell(L->train) : -1, L->o->seed};
    /* on the cuda device the slab comes to the host here, where a failure can be told */
    if (agree(L, rt_sync_host(L->rt, err, sizeof err) ? fail(L, "checkpoint: %s", err) : 0))
        return 1;
    if (agree(L, rt_ckpt_save(L->rt, L->o->ckpt, &m, err, sizeof err) ? fail(L, "%s", err) : 0))
        return 1;
    L->last_ckpt = step;
    if (L->lead)
        printf("step %5" PRId64 "  checkpoint written to %s\n", step, L->o->ckpt);
    /* a checkpoint that cannot be removed is no reason to stop training */
    if (L->lead && L->o->keep && rt_ckpt_prune(L->o->ckpt, step, L->o->keep, err, sizeof err))
        fprintf(stderr, "%s: warning: --keep: %s\n", L->prog, err);
    return 0;
}

/* The checkpoint folder must be usable before the first step, not after the last. */
static int check_ckpt_dir(Loop *L)
{
    struct stat st;
    if (!L->o->ckpt || !L->lead)
        return 0;
    if (stat(L->o->ckpt, &st) == 0)
        return S_ISDIR(st.st_mode) ? 0 : fail(L, "--ckpt %s: not a directory", L->o->ckpt);
    if (errno != ENOENT || mkdir(L->o->ckpt, 0777) != 0)
        return fail(L, "--ckpt %s: %s", L->o->ckpt, strerror(errno));
    return 0;
}

/* Parameters from the seed, or from the newest checkpoint with --resume (every
 * rank reads it and keeps its block). */
/* The device line, once nothing before the first step can fail any more
 * (errors leave stdout empty); a mesh says it on its mesh line instead. */
static void say_device(const Loop *L)
{
    if (L->nranks == 1)
        printf("%s\n", L->device_note);
}

static int start(Loop *L, int64_t *first)
{
    char err[512];
    int rc = check_ckpt_dir(L);
    rt_init_params(L->rt, L->o->seed);
    if (!rc && L->o->lr > 0 && rt_set_hyper(L->rt, "lr", L->o->lr, err, sizeof err))
        rc = fail(L, "--lr: %s", err);
    if (!rc && L->o->skip_nonfinite && !rt_step_holds_update(L->rt))
        rc = fail(L, "--skip-nonfinite: this plan cannot hold its update back (it updates "
                     "parameters before its loss or gradient norm is known)");
    *first = 1;
    if (!rc && L->o->init_from && rt_hf_init(L->rt, L->o->init_from, err, sizeof err))
        rc = fail(L, "--init-from %s", err);
    if (agree(L, rc))
        return 1;
    if (!L->o->resume) {
        say_device(L);
        if (L->o->init_from && L->lead)
            printf("initialized from %s\n", L->o->init_from);
        return 0;
    }
    CkptMeta m;
    rc = rt_ckpt_load_latest(L->rt, L->o->ckpt, &m, err, sizeof err);
    if (agree(L, rc < 0 ? fail(L, "--resume: %s", err) : 0))
        return 1;
    if (rc == 0) {
        say_device(L);
        if (L->lead)
            printf("no checkpoint in %s: starting from step 1\n", L->o->ckpt);
        return 0;
    }
    if (agree(L, L->train && m.data_position >= 0 &&
                         rt_data_seek(L->train, m.data_position, err, sizeof err)
                     ? fail(L, "--resume: %s", err)
                     : 0))
        return 1;
    /* an --input's position after step s: s global batches of rows, whatever the mesh */
    for (int k = 0; k < L->o->ninputs; k++) {
        uint64_t at = (uint64_t)m.step * (uint64_t)L->npy_global[k];
        rt_npy_seek(L->npy[k], (int64_t)(at % (uint64_t)rt_npy_examples(L->npy[k])), err,
                    sizeof err);
    }
    rt_init_keys(L->rt, m.seed); /* the run's dropout stream goes on */
    *first = m.step + 1;
    L->last_ckpt = m.step;
    say_device(L);
    if (L->lead)
        printf("resumed from step %" PRId64 " in %s\n", m.step, L->o->ckpt);
    return 0;
}

/* GFLOP/s: every device runs the plan's flops (its share of the model's). */
static double gflops(const Loop *L, double steps, double ms)
{
    return L->p->flops * (double)L->nranks * steps / (ms * 1e-3) / 1e9;
}

static void log_step(Loop *L, int64_t step, double ms, double t0, int64_t first)
{
    double tok = (double)L->batch_tokens;
    double loss = rt_scalar(L->rt, L->p->loss);
    printf("step %5" PRId64 "/%" PRId64 "  loss %.6f", step, L->o->steps, loss);
    if (L->o->exact)
        printf(" (%a)", loss);
    if (L->p->lr >= 0)
        printf("  lr %.3e", rt_scalar(L->rt, L->p->lr));
    if (L->p->grad_norm >= 0)
        printf("  grad norm %.4f", rt_scalar(L->rt, L->p->grad_norm));
    printf("  %.1f ms", ms);
    if (tok > 0)
        printf("  %.0f tok/s", tok / (ms * 1e-3));
    printf("  %.2f GFLOP/s", gflops(L, 1, ms));
    double done = (double)(step - first + 1), left = (double)(L->o->steps - step);
    if (left > 0)
        printf("  eta %.0f s", (now_s() - t0) / done * left);
    printf("\n");
    fflush(stdout);
}

/* " (the last checkpoint, step 4 in DIR, is as it was)", or "". */
static const char *last_ckpt_text(const Loop *L, char *out, size_t n)
{
    out[0] = 0;
    if (L->last_ckpt >= 0)
        snprintf(out, n, "; the last checkpoint, step %" PRId64 " in %s, is as it was",
                 L->last_ckpt, L->o->ckpt);
    return out;
}

/* What was not finite, with the values: "the gradient of 'w' is not finite
 * (loss 2.302585, grad norm nan)". param: the first such gradient, or -1. */
static void nonfinite_text(Loop *L, const int32_t *bad, int param, char *out, size_t n)
{
    const Plan *p = L->p;
    int len;
    if (param >= 0)
        len = snprintf(out, n, "the gradient of '%s' is not finite", p->tensors[param].name);
    else
        len = snprintf(out, n, "the %s is not finite", bad[0] ? "loss" : "gradient norm");
    if (len < 0 || (size_t)len >= n)
        return;
    len += snprintf(out + len, n - (size_t)len, " (loss %.6f", rt_scalar(L->rt, p->loss));
    if (p->grad_norm >= 0 && (size_t)len < n)
        len += snprintf(out + len, n - (size_t)len, ", grad norm %.4f",
                        rt_scalar(L->rt, p->grad_norm));
    if ((size_t)len < n)
        snprintf(out + len, n - (size_t)len, ")");
}

/* A step whose loss or gradient norm is not finite (bad: as the ranks agreed):
 * its update is dropped, and the step's first part runs again to find the
 * first parameter whose gradient is not finite. Within --skip-nonfinite the
 * step is logged as skipped (0); else every rank fails before any checkpoint
 * of this state is written (1). */
static int nonfinite(Loop *L, int64_t step, const int32_t *bad)
{
    char err[512], what[768], last[600];
    int param = -1, held = rt_step_holds_update(L->rt);
    /* a non-finite loss makes every gradient so: the first would tell nothing */
    if (held && !bad[0] &&
        agree(L, rt_step_blame(L->rt, &param, err, sizeof err) ? fail(L, "%s", err) : 0))
        return 1;
    if (agree(L, rt_step_end(L->rt, 0, err, sizeof err) ? fail(L, "%s", err) : 0))
        return 1;
    nonfinite_text(L, bad, param, what, sizeof what);
    if (!held)
        return fail_all(L,
                        "step %" PRId64 ": %s; this plan updates its parameters before its "
                        "gradient norm is known, so the update was applied: no checkpoint "
                        "written%s",
                        step, what, last_ckpt_text(L, last, sizeof last));
    if (L->skipped < L->o->skip_nonfinite) {
        L->skipped++;
        if (L->lead)
            printf("step %5" PRId64 "/%" PRId64 "  skipped: %s, the update not applied (%" PRId64
                   " of --skip-nonfinite %" PRId64 ")\n",
                   step, L->o->steps, what, L->skipped, L->o->skip_nonfinite);
        return 0;
    }
    if (L->skipped)
        return fail_all(L,
                        "step %" PRId64 ": %s: the update was not applied, no checkpoint "
                        "written (%" PRId64 " step%s skipped already: --skip-nonfinite %" PRId64
                        ")%s",
                        step, what, L->skipped, L->skipped == 1 ? "" : "s", L->o->skip_nonfinite,
                        last_ckpt_text(L, last, sizeof last));
    return fail_all(L, "step %" PRId64 ": %s: the update was not applied, no checkpoint written%s",
                    step, what, last_ckpt_text(L, last, sizeof last));
}

/* One step: this rank's batch; the plan's instructions up to the update; the
 * ranks agree on whether the loss and the gradient norm are finite; the update
 * (or not: *skipped); and they agree on whether a stop signal came (L->stop). */
static int step_once(Loop *L, int64_t step, double *ms, int *skipped)
{
    char err[512];
    int32_t bad[2] = {0, 0}, sig = 0;
    *skipped = 0;
    if (L->train && agree(L, load_batch(L, L->train)))
        return 1;
    if (L->o->ninputs && agree(L, load_inputs(L)))
        return 1;
    double s0 = now_s();
    int rc = rt_step_begin(L->rt, step, err, sizeof err) ? fail(L, "%s", err) : 0;
    int flags = rc ? 0 : rt_step_nonfinite(L->rt);
    bad[0] = (flags & RT_BAD_LOSS) != 0, bad[1] = (flags & RT_BAD_NORM) != 0;
    if (agree_max(L, rc, bad, 2))
        return 1;
    if (bad[0] || bad[1]) {
        if (nonfinite(L, step, bad))
            return 1;
        *skipped = 1;
    } else if (rt_step_end(L->rt, 1, err, sizeof err)) {
        rc = fail(L, "%s", err);
    }
    sig = stop_signal;
    if (agree_max(L, rc, &sig, 1))
        return 1;
    L->stop = sig;
    *ms = (now_s() - s0) * 1e3;
    return 0;
}

/* What happens after a step: the log (a skipped step logged itself), an
 * evaluation, a checkpoint. */
static int after_step(Loop *L, int64_t step, double ms, double t0, int64_t first, int skipped,
                      double *vloss)
{
    if (L->lead && !skipped &&
        (step % L->o->log_every == 0 || step == first || step == L->o->steps))
        log_step(L, step, ms, t0, first);
    if (L->metrics) {
        RtStepMetrics m = {step, L->o->steps, rt_scalar(L->rt, L->p->loss),
                           L->p->lr >= 0 ? rt_scalar(L->rt, L->p->lr) : NAN,
                           L->p->grad_norm >= 0 ? rt_scalar(L->rt, L->p->grad_norm) : NAN, ms,
                           (double)L->batch_tokens / (ms * 1e-3), gflops(L, 1, ms), skipped};
        if (rt_metrics_step(L->metrics, &m) != 0)
            metrics_failed(L);
    }
    if (L->val && L->o->eval_every && step % L->o->eval_every == 0 && evaluate(L, step, vloss))
        return 1;
    if (L->o->ckpt && L->o->ckpt_every && step % L->o->ckpt_every == 0 && save(L, step))
        return 1;
    return 0;
}

/* The ranks agreed on a stop signal after step (not the last): a checkpoint
 * of that step unless one was just written; the exit status 128 + signal. */
static int stop_run(Loop *L, int64_t step)
{
    const char *sig = signal_name(L->stop);
    release_stop_signals();
    if (L->o->ckpt && L->last_ckpt != step && save(L, step))
        return 1;
    if (L->lead && L->o->ckpt)
        printf("stopped by %s after step %" PRId64 ": the checkpoint of step %" PRId64
               " is in %s\n",
               sig, step, step, L->o->ckpt);
    else if (L->lead)
        printf("stopped by %s after step %" PRId64 ": no --ckpt DIR, so no checkpoint was "
               "written\n",
               sig, step);
    return 128 + L->stop;
}

/* 0 when the run is done, 1 on failure, 128 + a signal when a stop signal ended it. */
static int train(Loop *L)
{
    int64_t first;
    int skipped, have0 = 0;
    if (start(L, &first))
        return 1;
    if (!L->train && !L->o->ninputs)
        rt_random_inputs(L->rt, L->o->seed + 1);
    double t0 = now_s(), sum_ms = 0, ms = 0, loss0 = 0, loss = 0, vloss = 0;
    for (int64_t step = first; step <= L->o->steps; step++) {
        if (step_once(L, step, &ms, &skipped))
            return 1;
        sum_ms += ms;
        if (!skipped) {
            loss = rt_scalar(L->rt, L->p->loss);
            if (!have0)
                loss0 = loss, have0 = 1;
        }
        if (after_step(L, step, ms, t0, first, skipped, &vloss))
            return 1;
        if (L->stop && step < L->o->steps) /* a signal in the last step: the run ends anyway */
            return stop_run(L, step);
    }
    int64_t ran = L->o->steps - first + 1;
    if (ran <= 0) {
        if (L->lead)
            printf("nothing to do: the checkpoint is at step %" PRId64 "\n", first - 1);
        return 0;
    }
    if (L->val && (!L->o->eval_every || L->o->steps % L->o->eval_every) &&
        evaluate(L, L->o->steps, &vloss))
        return 1;
    if (L->o->ckpt && (!L->o->ckpt_every || L->o->steps % L->o->ckpt_every) && save(L, L->o->steps))
        return 1;
    if (L->o->export_hf && export_hf(L))
        return 1;
    if (L->lead)
        printf("trained %" PRId64 " step%s of %s in %.2f s: %.1f ms/step, %.2f GFLOP/s, loss "
               "%.4f -> %.4f",
               ran, ran == 1 ? "" : "s", L->p->model, now_s() - t0, sum_ms / (double)ran,
               gflops(L, (double)ran, sum_ms), loss0, loss);
    if (L->lead && L->skipped)
        printf(", %" PRId64 " skipped (not finite)", L->skipped);
    if (L->lead)
        printf("\n");
    return 0;
}

/* ---- ranks ---- */

/* "dp=2 x tp=2": the axes of more than one device. */
static void mesh_text(const Plan *p, char *out, size_t n)
{
    size_t len = 0;
    out[0] = 0;
    for (int a = 0; a < p->naxes && len < n; a++)
        if (p->axes[a].size > 1)
            len += (size_t)snprintf(out + len, n - len, "%s%s=%d", len ? " x " : "",
                                    p->axes[a].name, p->axes[a].size);
}

/* One rank's run, w NULL on one device: open, attach, data, the loop. 0, 1
 * on failure, or 128 + the stop signal that ended it. */
static int run_rank(const Job *J, RtWorld *w, Loop *L)
{
    char err[512];
    *L = (Loop){.prog = J->prog, .p = J->p, .o = &J->o, .device_note = J->device_note,
                .nranks = 1, .lead = 1, .culprit = -1, .last_ckpt = -1};
    if (w) {
        L->rank = rt_world_rank(w), L->nranks = rt_world_size(w), L->lead = L->rank == 0;
        if (!(L->all = rt_comm_split(w, 0, L->rank, err, sizeof err)))
            return fail(L, "%s", err);
        rt_comm_name(L->all, "world"); /* the agreements' */
    }
    if (!(L->rt = rt_open_device(J->p, J->kernels, J->device, NULL, err, sizeof err)))
        fail(L, "%s", err);
    if (agree(L, !L->rt))
        return 1;
    if (w && agree(L, rt_attach(L->rt, w, err, sizeof err) ? fail(L, "%s", err) : 0))
        return 1;
    find_token_inputs(L);
    if (agree(L, open_data(L)))
        return 1;
    if (L->lead && L->o->metrics && !(L->metrics = rt_metrics_open(L->o->metrics, err, sizeof err)))
        fail(L, "%s", err);
    if (agree(L, L->lead && L->o->metrics && !L->metrics))
        return 1;
    int rc = train(L);
    if (rc)
        return rc;
    if (L->o->report_memory &&
        agree(L, rt_memory_report(L->rt, L->lead ? stdout : NULL, err, sizeof err)
                     ? fail(L, "--report-memory: %s", err)
                     : 0))
        return 1;
    return 0;
}

static void close_rank(Loop *L)
{
    if (L->metrics)
        fclose(L->metrics);
    rt_close(L->rt);
    rt_comm_free(L->all);
    rt_data_close(L->train);
    for (int k = 0; k < L->o->ninputs; k++)
        rt_npy_close(L->npy[k]), free(L->npy_buf[k]);
    rt_data_close(L->val);
    free(L->in_buf);
    free(L->tgt_buf);
}

/* Whether this rank tells the failure: the first failing rank, or one that
 * failed on its own before any agreement. */
static int reports(const Loop *L)
{
    return L->err[0] && (L->culprit < 0 || L->culprit == L->rank);
}

/* A rank of the threads backend: its share of the OpenMP threads, its run. */
static int thread_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    Job *J = arg;
    Loop L;
    if (J->omp_threads > 0)
        omp_set_num_threads(J->omp_threads);
    int rc = run_rank(J, w, &L);
    close_rank(&L);
    if (rc > 1 && L.rank == 0)
        J->stopped = rc;
    if (!reports(&L))
        return 0; /* fine, or another rank tells */
    snprintf(err, n, "%s", L.err);
    return -1;
}

/* The mesh as threads of this process: OpenMP and OpenBLAS threads shared out. */
static int run_threads(Job *J)
{
    char err[1024], mesh[128];
    int total = omp_get_max_threads();
    J->omp_threads = total / J->nranks > 1 ? total / J->nranks : 1;
    openblas_set_num_threads(J->omp_threads);
    mesh_text(J->p, mesh, sizeof mesh);
    printf("mesh %s, %d ranks, comm threads (%d OpenMP thread%s per rank), %s\n", mesh,
           J->nranks, J->omp_threads, J->omp_threads == 1 ? "" : "s", J->device_note);
    fflush(stdout);
    if (rt_run_threads(J->nranks, thread_rank, J, err, sizeof err))
        return die(J->prog, "%s", err);
    return J->stopped;
}

/* This process as one rank of w (mpi): the world must be the plan's mesh. */
static int run_world(Job *J, RtWorld *w)
{
    char mesh[128];
    int rank = rt_world_rank(w), size = rt_world_size(w);
    mesh_text(J->p, mesh, sizeof mesh);
    if (size != J->nranks) {
        if (rank == 0 && J->nranks == 1)
            die(J->prog, "the plan is for one device, but mpirun started %d ranks", size);
        else if (rank == 0)
            die(J->prog, "the plan is for a mesh of %d devices (%s), but mpirun started %d ranks",
                J->nranks, mesh, size);
        return 1;
    }
    if (rank == 0 && J->nranks > 1) {
        printf("mesh %s, %d ranks, comm %s, %s\n", mesh, size, rt_world_backend(w),
               J->device_note);
        fflush(stdout);
    }
    Loop L;
    int rc = run_rank(J, w, &L);
    fflush(stdout);
    close_rank(&L);
    if (rc == 1 && reports(&L))
        die(J->prog, "%s", L.err);
    return rc;
}

/* One device, no world. */
static int run_alone(Job *J)
{
    Loop L;
    int rc = run_rank(J, NULL, &L);
    close_rank(&L);
    if (rc == 1)
        die(J->prog, "%s", L.err);
    return rc;
}

/* The plan has kernels but no CUDA rendering of them. */
static int no_gpu_kernels(const Plan *p)
{
    return p->nkernels > 0 && (!p->gpu_source || !*p->gpu_source);
}

/* --device into J->device and J->device_note: 0, or 1 with the one line in
 * msg. auto takes cuda when the runtime has it, a GPU is there and the plan
 * has CUDA kernels; cuda insists (one process per GPU: mpirun for a mesh). */
static int choose_device(Job *J, int mpi, char *msg, size_t n)
{
    char why[512];
    const char *opt = J->o.device;
    int graphs;
    if (rt_cuda_graphs_setting(&graphs, msg, n)) /* the cuda device's; refused on any */
        return 1;
    const char *how = graphs ? ", CUDA graphs" : ", no CUDA graphs (TCC_CUDA_GRAPHS=0)";
    int gpus = strcmp(opt, "cpu") ? rt_cuda_devices(why, sizeof why) : 0;
    J->device = RT_CPU;
    if (!strcmp(opt, "cpu")) {
        snprintf(J->device_note, sizeof J->device_note, "device cpu");
        return 0;
    }
    if (!strcmp(opt, "auto")) {
        if (gpus > 0 && no_gpu_kernels(J->p))
            snprintf(why, sizeof why, "the plan has no CUDA kernels");
        else if (gpus > 0 && J->nranks > 1 && !mpi)
            snprintf(why, sizeof why, "a mesh on GPUs runs under mpirun");
        else if (gpus > 0)
            J->device = RT_CUDA;
        else /* the driver's words stay for --device cuda, which fails with them */
            snprintf(why, sizeof why, "no GPU");
        if (J->device == RT_CUDA)
            snprintf(J->device_note, sizeof J->device_note, "device cuda (auto)%s", how);
        else
            snprintf(J->device_note, sizeof J->device_note, "device cpu (auto: %s)", why);
        return 0;
    }
    if (gpus < 1)
        return failf(msg, n, "--device cuda: no CUDA device found (%s)", why);
    if (no_gpu_kernels(J->p))
        return failf(msg, n, "--device cuda: the plan has no CUDA kernels: rebuild it with a tcc "
                             "that renders them");
    if (J->nranks > 1 && !mpi)
        return failf(msg, n, "--device cuda: the plan's %d devices run one process per GPU "
                             "(mpirun -np %d %s --device cuda); the threads backend is CPU-only",
                     J->nranks, J->nranks, J->prog);
    J->device = RT_CUDA;
    snprintf(J->device_note, sizeof J->device_note, "device cuda%s", how);
    return 0;
}

/* The options and the plan, then the run on the backend they ask for; under
 * mpirun only rank 0 prints an option or plan error. mpi: the mpi backend was
 * asked for (w is NULL when this process was not started by mpirun). */
static int run_job(Job *J, int mpi, RtWorld *w, int bad, const char *msg, const char *plan_json,
                   size_t len)
{
    char err[1024];
    int lead = !w || rt_world_rank(w) == 0;
    if (J->o.help) {
        if (lead)
            usage(J->prog, stdout);
        return 0;
    }
    if (bad)
        return lead ? die(J->prog, "%s", msg) : 1;
    Plan *p = plan_parse(J->prog, plan_json, len, err, sizeof err);
    if (!p)
        return lead ? die(J->prog, "the embedded plan: %s", err) : 1;
    J->p = p;
    J->nranks = (int)plan_mesh_size(p);
    if (!J->o.steps_given && p->steps > 0) /* the train block's steps and seed */
        J->o.steps = p->steps;
    if (!J->o.seed_given && p->seed >= 0)
        J->o.seed = (uint64_t)p->seed;
    int rc;
    if (choose_device(J, mpi, err, sizeof err) || catch_stop_signals(err, sizeof err))
        rc = lead ? die(J->prog, "%s", err) : 1;
    else if (mpi && !w)
        rc = die(J->prog, "--comm mpi: not started by mpirun or srun (mpirun -np %d %s ...)",
                 J->nranks, J->prog);
    else
        rc = w ? run_world(J, w) : J->nranks > 1 ? run_threads(J) : run_alone(J);
    plan_free(p);
    return rc;
}

int rt_train_main(int argc, char **argv, const char *plan_json, size_t len, RtKernel const *kernels)
{
    char msg[512] = "", err[512];
    rt_cpu_quiet_threads(argv);
    Job J = {.prog = argc > 0 ? argv[0] : "train", .kernels = kernels};
    int bad = parse_args(&J.o, argc, argv, msg, sizeof msg);
    int launched = rt_mpi_launched();
    int mpi = J.o.comm ? !strcmp(J.o.comm, "mpi") : launched;
    RtWorld *w = NULL;
    if (mpi && launched && !(w = rt_world_mpi(err, sizeof err)))
        return die(J.prog, "%s", err);
    int rc = run_job(&J, mpi, w, bad, msg, plan_json, len);
    fflush(stdout);
    rt_world_close(w);
    return rc;
}
