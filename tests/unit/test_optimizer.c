/* test_optimizer.c: the optimizer pass over a few steps against updates
 * computed here by hand. The model's loss is linear in its parameters, so
 * the gradients are constant (dw = x^T r, db = sum_rows r) and every step of
 * SGD, momentum, AdamW, weight decay, clipping and the schedules can be
 * written out independently. Values are float64 throughout, so the only
 * differences are rounding: |got - want| <= 1e-12 (1 + |want|). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/support/settings.h"
#include "tests/support/interp.h"

enum { N = 4, I = 2, O = 3 };

static const char *MODEL = "input x : f32[4, 2]\n"
                           "input r : f32[4, 3]\n"
                           "param w : f32[2, 3] = normal(1)\n"
                           "param b : f32[3] = normal(1)\n"
                           "loss = sum(sum((x @ w + b) * r))\n";

typedef struct Fixture {
    Ctx *c;
    Graph *g;
    Interp *in;
    double *w, *b, *x, *r;
    double gw[I * O], gb[O];
} Fixture;

static const Value *named(const Graph *g, const char *name)
{
    for (int i = 0; i < g->values.len; i++)
        if (g->values.data[i]->name && !strcmp(g->values.data[i]->name, name))
            return g->values.data[i];
    cr_assert_fail("no value '%s'", name);
    return NULL;
}

static void setup(Fixture *f, const char *train)
{
    char src[1024];
    snprintf(src, sizeof src, "%strain {\n%s\n}\n", MODEL, train);
    f->c = ctx_new(stderr);
    f->g = fe_compile(f->c, "t.tdl", src, strlen(src), NULL);
    cr_assert_not_null(f->g);
    cr_assert_eq(pass_autodiff(f->c, f->g, ts_settings(f->c, f->g, 0)), 0);
    cr_assert_eq(pass_optimizer(f->c, f->g, ts_settings(f->c, f->g, 0)), 0);
    cr_assert_eq(ir_verify(f->c, f->g), 0);
    f->in = interp_new(f->g);
    interp_init(f->in, 99, 1);
    f->w = f->in->buf[named(f->g, "w")->id];
    f->b = f->in->buf[named(f->g, "b")->id];
    f->x = f->in->buf[named(f->g, "x")->id];
    f->r = f->in->buf[named(f->g, "r")->id];
    memset(f->gw, 0, sizeof f->gw);
    memset(f->gb, 0, sizeof f->gb);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            f->gb[o] += f->r[n * O + o];
            for (int i = 0; i < I; i++)
                f->gw[i * O + o] += f->x[n * I + i] * f->r[n * O + o];
        }
}

static void teardown(Fixture *f)
{
    interp_free(f->in);
    ctx_free(f->c);
}

static void expect(double got, double want, const char *what, int step)
{
    cr_assert(fabs(got - want) <= 1e-12 * (1 + fabs(want)), "%s at step %d: got %.15g, want %.15g",
              what, step, got, want);
}

static double output(Fixture *f, int i) { return f->in->buf[f->g->outputs.data[i]->id][0]; }

Test(optimizer, sgd_with_momentum_and_weight_decay_on_matrices_only)
{
    Fixture f;
    setup(&f, "optimizer = sgd(lr = 0.1, momentum = 0.9, weight_decay = 0.5)");
    double w[I * O], b[O], mw[I * O] = {0}, mb[O] = {0};
    memcpy(w, f.w, sizeof w);
    memcpy(b, f.b, sizeof b);
    for (int step = 1; step <= 3; step++) {
        cr_assert_eq(interp_run(f.in), 0, "%s", f.in->err);
        for (int k = 0; k < I * O; k++) {
            mw[k] = 0.9 * mw[k] + f.gw[k] + 0.5 * w[k];
            w[k] -= 0.1 * mw[k];
            expect(f.w[k], w[k], "w", step);
        }
        for (int k = 0; k < O; k++) { /* a bias: no decay */
            mb[k] = 0.9 * mb[k] + f.gb[k];
            b[k] -= 0.1 * mb[k];
            expect(f.b[k], b[k], "b", step);
        }
        expect(output(&f, 1), 0.1, "lr", step);
    }
    teardown(&f);
}

Test(optimizer, plain_sgd)
{
    Fixture f;
    setup(&f, "optimizer = sgd(lr = 0.05)");
    double w0 = f.w[3], b0 = f.b[1];
    for (int step = 1; step <= 2; step++)
        cr_assert_eq(interp_run(f.in), 0);
    expect(f.w[3], w0 - 2 * 0.05 * f.gw[3], "w", 2);
    expect(f.b[1], b0 - 2 * 0.05 * f.gb[1], "b", 2);
    teardown(&f);
}

Test(optimizer, adamw_with_bias_correction_and_decoupled_decay)
{
    Fixture f;
    setup(&f, "optimizer = adamw(lr = 0.01, betas = (0.8, 0.95), eps = 1e-6, weight_decay = 0.1)");
    double w[I * O], b[O], m[I * O + O] = {0}, v[I * O + O] = {0};
    memcpy(w, f.w, sizeof w);
    memcpy(b, f.b, sizeof b);
    for (int step = 1; step <= 4; step++) {
        cr_assert_eq(interp_run(f.in), 0);
        for (int k = 0; k < I * O + O; k++) {
            int is_w = k < I * O;
            double g = is_w ? f.gw[k] : f.gb[k - I * O], *p = is_w ? &w[k] : &b[k - I * O];
            m[k] = 0.8 * m[k] + 0.2 * g;
            v[k] = 0.95 * v[k] + 0.05 * g * g;
            double mh = m[k] / (1 - pow(0.8, step)), vh = v[k] / (1 - pow(0.95, step));
            *p = *p - 0.01 * (is_w ? 0.1 : 0.0) * *p - 0.01 * mh / (sqrt(vh) + 1e-6);
            expect(is_w ? f.w[k] : f.b[k - I * O], *p, is_w ? "w" : "b", step);
        }
    }
    teardown(&f);
}

Test(optimizer, global_norm_clipping)
{
    Fixture f;
    setup(&f, "optimizer = sgd(lr = 1.0)\ngrad_clip = 0.25");
    double norm = 0, w0 = f.w[0], b0 = f.b[2];
    for (int k = 0; k < I * O; k++)
        norm += f.gw[k] * f.gw[k];
    for (int k = 0; k < O; k++)
        norm += f.gb[k] * f.gb[k];
    norm = sqrt(norm);
    cr_assert_gt(norm, 0.25, "the clip must bite for this test to mean anything");
    cr_assert_eq(interp_run(f.in), 0);
    double scale = 0.25 / (norm + 1e-6);
    expect(output(&f, 2), norm, "grad norm", 1);
    expect(f.w[0], w0 - scale * f.gw[0], "w", 1);
    expect(f.b[2], b0 - scale * f.gb[2], "b", 1);
    teardown(&f);
}

static void check_schedule(const char *train, const double *want, int n)
{
    Fixture f;
    setup(&f, train);
    for (int step = 1; step <= n; step++) {
        cr_assert_eq(interp_run(f.in), 0);
        expect(output(&f, 1), want[step - 1], "lr", step);
    }
    teardown(&f);
}

/* lr 1, warmup 2, 6 steps, floor 0.1: the warm-up ramps 0.5, 1; the decay runs
 * from full lr at the first step after warm-up to the floor at the last step. */
Test(optimizer, cosine_schedule_with_warmup)
{
    double c = 0.1 + 0.5 * (1 + cos(M_PI / 3)) * 0.9, d = 0.1 + 0.5 * (1 + cos(2 * M_PI / 3)) * 0.9;
    double want[7] = {0.5, 1.0, 1.0, c, d, 0.1, 0.1};
    check_schedule("optimizer = sgd(lr = 1)\nlr_schedule = cosine(warmup = 2, min_lr = 0.1, "
                   "steps = 6)",
                   want, 7);
}

Test(optimizer, linear_schedule)
{
    double want[6] = {1.0, 0.75, 0.5, 0.25, 0.0, 0.0};
    check_schedule("optimizer = sgd(lr = 1)\nlr_schedule = linear\nsteps = 5", want, 6);
}

Test(optimizer, errors_in_settings_point_at_the_source)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    Ctx *c = ctx_new(out);
    char src[512];
    snprintf(src, sizeof src, "%strain {\n  optimizer = adam(lr = 1)\n}\n", MODEL);
    cr_assert_null(fe_compile(c, "t.tdl", src, strlen(src), NULL));
    fflush(out);
    cr_assert(strstr(buf, "t.tdl:7:15: error: 'optimizer' must be one of sgd, adamw"), "%s", buf);
    ctx_free(c);
    fclose(out);
    free(buf);
}

/* Gradient accumulation: k microbatches of B/k rows give the step of the
 * whole batch (the loss is a per-row mean). Only summation order differs. */
static void run_steps(const char *train, int steps, double *loss, double *params, int64_t *np)
{
    char src[2048];
    snprintf(src, sizeof src,
             "model m(B = 8, D = 6, C = 5)\n"
             "input x : f32[B, 3, D]\n"
             "input t : i32[B, 3]\n"
             "param g : f32[D] = normal(1)\n"
             "param w : f32[D, C] = normal(1)\n"
             "loss = cross_entropy(layernorm(x, g, g) @ w, t)\n"
             "train {\n%s\n}\n", train);
    Ctx *c = ctx_new(stderr);
    Graph *g = fe_compile(c, "t.tdl", src, strlen(src), NULL);
    cr_assert_not_null(g);
    cr_assert_eq(pass_microbatch(c, g, ts_settings(c, g, 1)), 0); /* unrolled: the interpreter runs the whole step */
    cr_assert_eq(pass_autodiff(c, g, ts_settings(c, g, 0)), 0);
    cr_assert_eq(pass_optimizer(c, g, ts_settings(c, g, 0)), 0);
    cr_assert_eq(ir_verify(c, g), 0);
    Interp *in = interp_new(g);
    interp_init(in, 5, 5);
    for (int s = 0; s < steps; s++) {
        cr_assert_eq(interp_run(in), 0, "%s", in->err);
        loss[s] = in->buf[g->outputs.data[0]->id][0];
    }
    *np = 0;
    const char *names[2] = {"g", "w"};
    for (int k = 0; k < 2; k++) {
        const Value *v = named(g, names[k]);
        int64_t n = interp_numel(v);
        memcpy(params + *np, in->buf[v->id], sizeof(double) * (size_t)n);
        *np += n;
    }
    interp_free(in);
    ctx_free(c);
}

Test(optimizer, accumulation_over_microbatches_equals_the_whole_batch)
{
    double l1[3], l4[3], p1[64], p4[64];
    int64_t n1, n4;
    run_steps("optimizer = adamw(lr = 0.05)\nmicrobatches = 1", 3, l1, p1, &n1);
    run_steps("optimizer = adamw(lr = 0.05)\nmicrobatches = 4", 3, l4, p4, &n4);
    cr_assert_eq(n1, n4);
    for (int s = 0; s < 3; s++)
        expect(l4[s], l1[s], "loss", s + 1);
    for (int i = 0; i < n1; i++)
        cr_assert(fabs(p4[i] - p1[i]) <= 1e-10 * (1 + fabs(p1[i])), "param %d: %.15g vs %.15g", i,
                  p4[i], p1[i]);
    cr_assert_neq(l1[2], l1[0], "the steps must change something");
}

Test(optimizer, microbatches_must_divide_the_batch)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    Ctx *c = ctx_new(out);
    const char *src = "input x : f32[6, 2]\nparam w : f32[2, 3] = ones\nloss = sum(sum(x @ w))\n"
                      "train {\n  microbatches = 4\n}\n";
    Graph *g = fe_compile(c, "t.tdl", src, strlen(src), NULL);
    cr_assert_not_null(g);
    cr_assert_eq(pass_microbatch(c, g, ts_settings(c, g, 0)), -1);
    fflush(out);
    cr_assert(strstr(buf, "t.tdl:1:1: error: microbatches: the batch dimension of input 'x' (6) "
                          "is not divisible by 4 microbatches"),
              "%s", buf);
    ctx_free(c);
    fclose(out);
    free(buf);
}
