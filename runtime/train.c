/* train.c: the training loop of a generated program (tcc model.tdl -o NAME).
 * Reads the command line, the plan embedded in the program, token shards and
 * checkpoints; writes logs and checkpoints. Key idea: a step is the plan's
 * instruction list; everything around it -- data, learning-rate override,
 * evaluation (the forward instructions only), checkpoints and exact resume --
 * lives here, so the program is the plan plus this loop. */
#include "runtime/runtime.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct Options {
    const char *data, *val, *ckpt;
    int64_t steps, ckpt_every, log_every, eval_every, eval_batches;
    uint64_t seed;
    double lr;
    int resume, exact;
} Options;

typedef struct Loop {
    const char *prog;
    const Plan *p;
    Runtime *rt;
    Options o;
    DataLoader *train, *val;
    int tokens, targets; /* the plan's i32 [B, S] inputs, -1 when absent */
    int64_t rows, seq;
    int32_t *in_buf, *tgt_buf;
} Loop;

static void usage(const char *prog, FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "  --data PATTERN      training token shards (llm.c format; a glob)\n"
            "  --val PATTERN       validation token shards\n"
            "  --steps N           steps to train (default 100)\n"
            "  --lr X              peak learning rate (default: the model's)\n"
            "  --seed S            seed of the parameter init and of random data (default 1337)\n"
            "  --ckpt DIR          write checkpoints to DIR\n"
            "  --ckpt-every N      a checkpoint every N steps (default: only at the end)\n"
            "  --resume            continue from the newest checkpoint in --ckpt DIR\n"
            "  --log-every N       a log line every N steps (default 1)\n"
            "  --eval-every N      validation loss every N steps (default: at the end)\n"
            "  --eval-batches N    validation batches per evaluation (default 4)\n"
            "  --exact             log each loss also as a hexadecimal float (every bit)\n"
            "  --help              this text\n"
            "Without --data, the model trains on one fixed batch of random tokens.\n",
            prog);
}

static int die(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int die(const char *prog, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: error: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

static int parse_int(const char *prog, const char *opt, const char *s, int64_t lo, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo)
        return die(prog, "%s expects an integer >= %lld, got '%s'", opt, (long long)lo, s);
    *out = v;
    return 0;
}

static int parse_args(Loop *L, int argc, char **argv)
{
    Options *o = &L->o;
    *o = (Options){.steps = 100, .log_every = 1, .eval_batches = 4, .seed = 1337, .lr = -1};
    static const char *const known[] = {"--data", "--val", "--ckpt", "--lr", "--steps",
                                         "--seed", "--ckpt-every", "--log-every",
                                         "--eval-every", "--eval-batches", "--resume", "--exact",
                                         "--help", "-h", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x = 0;
        int w = 0;
        while (known[w] && strcmp(a, known[w]))
            w++;
        if (!known[w])
            return die(L->prog, "unknown option '%s' (see --help)", a);
        int takes = strcmp(a, "--resume") && strcmp(a, "--exact") && strcmp(a, "--help") &&
                    strcmp(a, "-h");
        if (takes && !v)
            return die(L->prog, "%s needs a value", a);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(L->prog, stdout);
            exit(0);
        } else if (!strcmp(a, "--resume")) {
            o->resume = 1;
            continue;
        } else if (!strcmp(a, "--exact")) {
            o->exact = 1;
            continue;
        } else if (!strcmp(a, "--data")) {
            o->data = v;
        } else if (!strcmp(a, "--val")) {
            o->val = v;
        } else if (!strcmp(a, "--ckpt")) {
            o->ckpt = v;
        } else if (!strcmp(a, "--lr")) {
            char *end;
            o->lr = strtod(v, &end);
            if (*end || end == v || !(o->lr > 0))
                return die(L->prog, "--lr expects a positive number, got '%s'", v);
        } else {
            static const char *names[] = {"--steps", "--seed", "--ckpt-every", "--log-every",
                                          "--eval-every", "--eval-batches"};
            int k = 0;
            while (k < 6 && strcmp(a, names[k]))
                k++;
            if (k == 6)
                return die(L->prog, "unknown option '%s' (see --help)", a);
            if (parse_int(L->prog, a, v, k == 1 || k == 4 ? 0 : 1, &x))
                return 1;
            int64_t *dst[] = {&o->steps, NULL, &o->ckpt_every, &o->log_every, &o->eval_every,
                              &o->eval_batches};
            if (k == 1)
                o->seed = (uint64_t)x;
            else
                *dst[k] = x;
        }
        i++;
    }
    if (o->resume && !o->ckpt)
        return die(L->prog, "--resume needs --ckpt DIR");
    return 0;
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
        L->rows = L->p->tensors[L->tokens].shape[0];
        L->seq = L->p->tensors[L->tokens].shape[1];
    }
}

static int open_data(Loop *L)
{
    char err[512];
    if (!L->o.data && !L->o.val)
        return 0;
    if (L->tokens < 0)
        return die(L->prog, "--data: the model has no token inputs (two i32 inputs [B, S])");
    int64_t vocab = L->p->tensors[L->tokens].limit;
    if (L->o.data && !(L->train = rt_data_open(L->o.data, vocab, 0, 1, err, sizeof err)))
        return die(L->prog, "%s", err);
    if (L->o.val && !(L->val = rt_data_open(L->o.val, vocab, 0, 1, err, sizeof err)))
        return die(L->prog, "%s", err);
    size_t n = (size_t)(L->rows * L->seq);
    L->in_buf = malloc(n * sizeof(int32_t));
    L->tgt_buf = malloc(n * sizeof(int32_t));
    if (!L->in_buf || !L->tgt_buf)
        return die(L->prog, "malloc: out of memory");
    return 0;
}

/* The next batch of d into the token inputs. */
static int load_batch(Loop *L, DataLoader *d)
{
    char err[512];
    size_t bytes = (size_t)(L->rows * L->seq) * sizeof(int32_t);
    if (rt_data_next(d, L->rows, L->seq, L->in_buf, L->tgt_buf, err, sizeof err) ||
        rt_set_input(L->rt, L->p->tensors[L->tokens].name, L->in_buf, bytes, err, sizeof err) ||
        rt_set_input(L->rt, L->p->tensors[L->targets].name, L->tgt_buf, bytes, err, sizeof err))
        return die(L->prog, "%s", err);
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Mean loss over eval_batches validation batches, parameters untouched. */
static int evaluate(Loop *L, int64_t step, double *loss)
{
    char err[512];
    double sum = 0;
    int64_t pos = rt_data_tell(L->val);
    for (int64_t b = 0; b < L->o.eval_batches; b++) {
        if (load_batch(L, L->val))
            return 1;
        if (rt_forward(L->rt, err, sizeof err))
            return die(L->prog, "%s", err);
        sum += rt_scalar(L->rt, L->p->loss);
    }
    if (rt_data_seek(L->val, pos, err, sizeof err)) /* the same batches every time */
        return die(L->prog, "%s", err);
    if (!L->train) /* training goes on with its fixed random batch */
        rt_random_inputs(L->rt, L->o.seed + 1);
    *loss = sum / (double)L->o.eval_batches;
    printf("step %5" PRId64 "  val loss %.6f\n", step, *loss);
    return 0;
}

static int save(Loop *L, int64_t step)
{
    char err[512];
    CkptMeta m = {step, L->train ? rt_data_tell(L->train) : -1, L->o.seed};
    if (rt_ckpt_save(L->rt, L->o.ckpt, &m, err, sizeof err))
        return die(L->prog, "%s", err);
    printf("step %5" PRId64 "  checkpoint written to %s\n", step, L->o.ckpt);
    return 0;
}

/* Parameters from the seed, or from the newest checkpoint with --resume. */
static int start(Loop *L, int64_t *first)
{
    char err[512];
    rt_init_params(L->rt, L->o.seed);
    if (L->o.lr > 0 && rt_set_hyper(L->rt, "lr", L->o.lr, err, sizeof err))
        return die(L->prog, "--lr: %s", err);
    *first = 1;
    if (!L->o.resume)
        return 0;
    CkptMeta m;
    int rc = rt_ckpt_load_latest(L->rt, L->o.ckpt, &m, err, sizeof err);
    if (rc < 0)
        return die(L->prog, "--resume: %s", err);
    if (rc == 0) {
        printf("no checkpoint in %s: starting from step 1\n", L->o.ckpt);
        return 0;
    }
    if (L->train && m.data_position >= 0 &&
        rt_data_seek(L->train, m.data_position, err, sizeof err))
        return die(L->prog, "--resume: %s", err);
    *first = m.step + 1;
    printf("resumed from step %" PRId64 " in %s\n", m.step, L->o.ckpt);
    return 0;
}

static void log_step(Loop *L, int64_t step, double ms, double t0, int64_t first)
{
    double tok = L->tokens >= 0 ? (double)(L->rows * L->seq) : 0;
    double loss = rt_scalar(L->rt, L->p->loss);
    printf("step %5" PRId64 "/%" PRId64 "  loss %.6f", step, L->o.steps, loss);
    if (L->o.exact)
        printf(" (%a)", loss);
    if (L->p->lr >= 0)
        printf("  lr %.3e", rt_scalar(L->rt, L->p->lr));
    if (L->p->grad_norm >= 0)
        printf("  grad norm %.4f", rt_scalar(L->rt, L->p->grad_norm));
    printf("  %.1f ms", ms);
    if (tok > 0)
        printf("  %.0f tok/s", tok / (ms * 1e-3));
    printf("  %.2f GFLOP/s", L->p->flops / (ms * 1e-3) / 1e9);
    double done = (double)(step - first + 1), left = (double)(L->o.steps - step);
    if (left > 0)
        printf("  eta %.0f s", (now_s() - t0) / done * left);
    printf("\n");
    fflush(stdout);
}

/* The checkpoint folder must be usable before the first step, not after the last. */
static int check_ckpt_dir(Loop *L)
{
    struct stat st;
    if (!L->o.ckpt)
        return 0;
    if (stat(L->o.ckpt, &st) == 0)
        return S_ISDIR(st.st_mode) ? 0 : die(L->prog, "--ckpt %s: not a directory", L->o.ckpt);
    if (errno != ENOENT || mkdir(L->o.ckpt, 0777) != 0)
        return die(L->prog, "--ckpt %s: %s", L->o.ckpt, strerror(errno));
    return 0;
}

static int train(Loop *L)
{
    char err[512];
    int64_t first;
    if (check_ckpt_dir(L) || start(L, &first))
        return 1;
    if (!L->train)
        rt_random_inputs(L->rt, L->o.seed + 1);
    double t0 = now_s(), sum_ms = 0, loss0 = 0, loss = 0, vloss = 0;
    for (int64_t step = first; step <= L->o.steps; step++) {
        if (L->train && load_batch(L, L->train))
            return 1;
        double s0 = now_s();
        if (rt_step(L->rt, step, err, sizeof err))
            return die(L->prog, "%s", err);
        double ms = (now_s() - s0) * 1e3;
        sum_ms += ms;
        loss = rt_scalar(L->rt, L->p->loss);
        if (step == first)
            loss0 = loss;
        if (step % L->o.log_every == 0 || step == first || step == L->o.steps)
            log_step(L, step, ms, t0, first);
        if (L->val && L->o.eval_every && step % L->o.eval_every == 0 && evaluate(L, step, &vloss))
            return 1;
        if (L->o.ckpt && L->o.ckpt_every && step % L->o.ckpt_every == 0 && save(L, step))
            return 1;
    }
    int64_t ran = L->o.steps - first + 1;
    if (ran <= 0) {
        printf("nothing to do: the checkpoint is at step %" PRId64 "\n", first - 1);
        return 0;
    }
    if (L->val && (!L->o.eval_every || L->o.steps % L->o.eval_every) && evaluate(L, L->o.steps, &vloss))
        return 1;
    if (L->o.ckpt && (!L->o.ckpt_every || L->o.steps % L->o.ckpt_every) && save(L, L->o.steps))
        return 1;
    printf("trained %" PRId64 " step%s of %s in %.2f s: %.1f ms/step, %.2f GFLOP/s, loss %.4f -> "
           "%.4f\n",
           ran, ran == 1 ? "" : "s", L->p->model, now_s() - t0, sum_ms / (double)ran,
           L->p->flops * (double)ran / (sum_ms * 1e-3) / 1e9, loss0, loss);
    return 0;
}

/* The OpenMP runtime reads its wait policy when it starts, before main: to
 * keep its idle threads from spinning against OpenBLAS's on the same cores
 * (measured: bench/README.md), the program starts itself again once with
 * OMP_WAIT_POLICY=passive, unless the user chose a policy. */
static void passive_openmp(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || setenv("OMP_WAIT_POLICY", "passive", 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    /* exec failed: go on with the policy the OpenMP runtime already has */
}

int rt_train_main(int argc, char **argv, const char *plan_json, size_t len,
                  RtKernel const *kernels)
{
    char err[1024];
    passive_openmp(argv);
    Loop L = {.prog = argc > 0 ? argv[0] : "train"};
    if (parse_args(&L, argc, argv))
        return 1;
    Plan *p = plan_parse(L.prog, plan_json, len, err, sizeof err);
    if (!p)
        return die(L.prog, "the embedded plan: %s", err);
    L.p = p;
    find_token_inputs(&L);
    int rc = 1;
    if (!open_data(&L)) {
        L.rt = rt_open_linked(p, kernels, NULL, err, sizeof err);
        rc = L.rt ? train(&L) : die(L.prog, "%s", err);
    }
    rt_close(L.rt);
    rt_data_close(L.train);
    rt_data_close(L.val);
    free(L.in_buf);
    free(L.tgt_buf);
    plan_free(p);
    return rc;
}
