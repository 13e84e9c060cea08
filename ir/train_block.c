/* train.c: the meaning of the train block. Reads the keyed Attrs of
 * Graph.train; writes a TrainConfig with every default filled in. The frontend
 * checks each setting here so its errors point at the TDL; the passes read the
 * config. Key idea: one table of settings, one checker per value shape. */
#include "ir.h"

#include <string.h>

static int fail(char *err, size_t n, const char *fmt, ...) PRINTF_LIKE(3, 4);
static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

static int is_num(const Attr *a) { return a && (a->kind == ATTR_INT || a->kind == ATTR_FLOAT); }
static double num(const Attr *a) { return a->kind == ATTR_INT ? (double)a->i : a->f; }

/* A number in [lo, hi]. */
static int get_num(const Attr *a, const char *what, double lo, double hi, double *out, char *err,
                   size_t n)
{
    if (!is_num(a) || num(a) < lo || num(a) > hi)
        return fail(err, n, "'%s' must be a number in [%g, %g]", what, lo, hi);
    *out = num(a);
    return 0;
}

static int get_int(const Attr *a, const char *what, int64_t lo, int64_t hi, int64_t *out,
                   char *err, size_t n)
{
    if (!a || a->kind != ATTR_INT || a->i < lo || a->i > hi)
        return fail(err, n, "'%s' must be an integer in [%lld, %lld]", what, (long long)lo,
                    (long long)hi);
    *out = a->i;
    return 0;
}

/* A name out of choices (NULL-terminated); its index in *out. */
static int get_choice(const Attr *a, const char *what, const char *const *choices, int *out,
                      char *err, size_t n)
{
    const char *s = a && (a->kind == ATTR_STR || a->kind == ATTR_CALL) ? a->s : NULL;
    for (int i = 0; s && choices[i]; i++)
        if (strcmp(s, choices[i]) == 0) {
            *out = i;
            return 0;
        }
    char list[200] = "";
    for (int i = 0; choices[i]; i++) {
        size_t k = strlen(list);
        snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", choices[i]);
    }
    return fail(err, n, "'%s' must be one of %s", what, list);
}

static const char *const optimizers[] = {"sgd", "adamw", NULL};
static const char *const schedules[] = {"constant", "cosine", "linear", NULL};
static const char *const recomputes[] = {"none", "full", "selective", "auto", NULL};
static const char *const precisions[] = {"f32", "bf16", "f64", NULL};
static const char *const pipelines[] = {"gpipe", "1f1b", "interleaved", "zb", NULL};

static int optimizer_arg(TrainConfig *tc, const Attr *x, char *err, size_t n)
{
    const char *k = x->key ? x->key : "";
    if (!strcmp(k, "lr"))
        return get_num(x, "lr", 1e-12, 1e6, &tc->lr, err, n);
    if (!strcmp(k, "weight_decay"))
        return get_num(x, k, 0, 1e6, &tc->weight_decay, err, n);
    if (tc->optimizer == OPT_SGD && !strcmp(k, "momentum"))
        return get_num(x, k, 0, 1, &tc->momentum, err, n);
    if (tc->optimizer == OPT_ADAMW && !strcmp(k, "eps"))
        return get_num(x, k, 0, 1, &tc->eps, err, n);
    if (tc->optimizer == OPT_ADAMW && !strcmp(k, "betas")) {
        if (x->kind != ATTR_LIST || x->nitems != 2)
            return fail(err, n, "'betas' must be a pair of numbers, like (0.9, 0.95)");
        if (get_num(x->items[0], "betas", 0, 0.999999, &tc->beta1, err, n) != 0)
            return -1;
        return get_num(x->items[1], "betas", 0, 0.999999, &tc->beta2, err, n);
    }
    return fail(err, n, "unknown %s argument '%s'%s", optimizers[tc->optimizer], k,
                tc->optimizer == OPT_SGD ? " (sgd takes lr, momentum, weight_decay)"
                                         : " (adamw takes lr, betas, eps, weight_decay)");
}

static int set_optimizer(TrainConfig *tc, const Attr *a, char *err, size_t n)
{
    int which;
    if (get_choice(a, "optimizer", optimizers, &which, err, n) != 0)
        return -1;
    tc->optimizer = (OptimizerKind)which;
    if (which == OPT_ADAMW) {
        tc->lr = 1e-3;
        tc->weight_decay = 0.01;
    }
    for (int i = 0; a->kind == ATTR_CALL && i < a->nitems; i++)
        if (optimizer_arg(tc, a->items[i], err, n) != 0)
            return -1;
    return 0;
}

static int set_schedule(TrainConfig *tc, const Attr *a, char *err, size_t n)
{
    int which;
    if (get_choice(a, "lr_schedule", schedules, &which, err, n) != 0)
        return -1;
    tc->schedule = (ScheduleKind)which;
    for (int i = 0; a->kind == ATTR_CALL && i < a->nitems; i++) {
        const Attr *x = a->items[i];
        const char *k = x->key ? x->key : "";
        int rc = !strcmp(k, "warmup")   ? get_int(x, k, 0, INT32_MAX, &tc->warmup, err, n)
                 : !strcmp(k, "min_lr") ? get_num(x, k, 0, 1e6, &tc->min_lr, err, n)
                 : !strcmp(k, "steps")  ? get_int(x, k, 1, INT32_MAX, &tc->total_steps, err, n)
                                        : fail(err, n, "unknown lr_schedule argument '%s' "
                                                       "(it takes warmup, min_lr, steps)", k);
        if (rc != 0)
            return -1;
    }
    return 0;
}

int ir_train_set(TrainConfig *tc, const Attr *a, char *err, size_t n)
{
    const char *k = a->key ? a->key : "";
    int choice;
    if (!strcmp(k, "optimizer"))
        return set_optimizer(tc, a, err, n);
    if (!strcmp(k, "lr_schedule"))
        return set_schedule(tc, a, err, n);
    if (!strcmp(k, "lr"))
        return get_num(a, k, 1e-12, 1e6, &tc->lr_override, err, n);
    if (!strcmp(k, "weight_decay"))
        return get_num(a, k, 0, 1e6, &tc->wd_override, err, n);
    if (!strcmp(k, "grad_clip"))
        return get_num(a, k, 0, 1e12, &tc->grad_clip, err, n);
    if (!strcmp(k, "microbatches"))
        return get_int(a, k, 1, 1 << 20, &tc->microbatches, err, n);
    if (!strcmp(k, "virtual_stages"))
        return get_int(a, k, 1, 1024, &tc->virtual_stages, err, n);
    if (!strcmp(k, "zero"))
        return get_int(a, k, 0, 3, &tc->zero, err, n);
    if (!strcmp(k, "stage_starts")) { /* read by the pipeline pass */
        for (int i = 0; a && a->kind == ATTR_LIST && i < a->nitems; i++)
            if (a->items[i]->kind != ATTR_INT || a->items[i]->i < 0)
                return fail(err, n, "'stage_starts' must be a list of layer indices");
        if (!a || a->kind != ATTR_LIST)
            return fail(err, n, "'stage_starts' must be a list of layer indices");
        tc->stage_starts = a;
        return 0;
    }
    if (!strcmp(k, "grad_accumulation_fusion")) {
        if (!a || (a->kind != ATTR_BOOL && a->kind != ATTR_INT) || a->i < 0 || a->i > 1)
            return fail(err, n, "'grad_accumulation_fusion' must be true or false");
        tc->grad_accumulation_fusion = a->i;
        return 0;
    }
    if (!strcmp(k, "sequence_parallel")) {
        if (!a || (a->kind != ATTR_BOOL && a->kind != ATTR_INT) || a->i < 0 || a->i > 1)
            return fail(err, n, "'sequence_parallel' must be true or false");
        tc->sequence_parallel = a->i;
        return 0;
    }
    if (!strcmp(k, "steps"))
        return get_int(a, k, 1, INT32_MAX, &tc->steps, err, n);
    if (!strcmp(k, "seed"))
        return get_int(a, k, 0, ((int64_t)1 << 53) - 1, &tc->seed, err, n); /* exact in JSON */
    if (!strcmp(k, "recompute"))
        return get_choice(a, k, recomputes, &choice, err, n) ? -1 : (tc->recompute = recomputes[choice], 0);
    if (!strcmp(k, "precision"))
        return get_choice(a, k, precisions, &choice, err, n) ? -1 : (tc->precision = precisions[choice], 0);
    if (!strcmp(k, "schedule"))
        return get_choice(a, k, pipelines, &choice, err, n) ? -1 : (tc->pipeline = pipelines[choice], 0);
    return fail(err, n, "unknown training setting '%s'", k);
}

int ir_regathers(const Graph *g, const TrainConfig *tc)
{
    int r = tc->zero >= 3;
    for (int i = 0; i < g->mesh.naxes; i++)
        r |= g->mesh.axes[i].role == ROLE_FSDP && g->mesh.axes[i].size > 1;
    return r;
}

void ir_train_defaults(TrainConfig *tc)
{
    memset(tc, 0, sizeof *tc);
    tc->optimizer = OPT_SGD;
    tc->lr = 0.01;
    tc->beta1 = 0.9;
    tc->beta2 = 0.999;
    tc->eps = 1e-8;
    tc->lr_override = tc->wd_override = -1;
    tc->microbatches = tc->virtual_stages = 1;
    tc->grad_accumulation_fusion = 1;
    tc->seed = -1; /* not set: the program's own default */
    tc->recompute = "none";
    tc->precision = "f32";
    tc->pipeline = "1f1b";
}

int ir_train_config(const Graph *g, TrainConfig *tc, char *err, size_t n)
{
    ir_train_defaults(tc);
    for (int i = 0; i < g->train.len; i++)
        if (ir_train_set(tc, g->train.data[i], err, n) != 0)
            return -1;
    return ir_train_finish(tc, err, n);
}

int ir_train_finish(TrainConfig *tc, char *err, size_t n)
{
    if (tc->lr_override > 0)
        tc->lr = tc->lr_override;
    if (tc->wd_override >= 0)
        tc->weight_decay = tc->wd_override;
    if (!tc->total_steps)
        tc->total_steps = tc->steps;
    if (tc->schedule != SCHED_CONSTANT && !tc->total_steps)
        return fail(err, n, "the %s schedule needs the number of steps: 'steps = N' or "
                    "lr_schedule = %s(steps = N)", schedules[tc->schedule], schedules[tc->schedule]);
    if (tc->warmup && tc->total_steps && tc->warmup >= tc->total_steps)
        return fail(err, n, "warmup (%lld) must be shorter than the schedule (%lld steps)",
                    (long long)tc->warmup, (long long)tc->total_steps);
    return 0;
}
