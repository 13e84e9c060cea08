/* test_recompute.c: the recompute pass against the float64 interpreter. A tiny
 * GPT-2 and a tiny Llama (2 layers, 2 microbatches, unrolled) are differentiated, then
 * recomputed (full, selective, or one layer full and the other not); the
 * interpreter runs the graph with and without the copies from the same
 * parameters and inputs, and the loss and every gradient must be equal to the
 * last bit: the copies compute what the forward computed, from the same
 * values, in the same order. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/support/settings.h"
#include "tests/support/interp.h"
#include "tests/support/programs.h"

#define GPT2_LINE "model gpt2(V = 11, S = 5, D = 12, H = 3, L = 2, B = 4)"
#define LLAMA_LINE "model llama(V = 13, S = 5, D = 16, H = 4, KV = 2, F = 10, L = 2, B = 4)"

/* The forward and backward graph of a sample with 2 microbatches, in f32. */
static Graph *build(Ctx *c, const char *file, const char *model_line)
{
    const char *src = test_sample(file, model_line);
    cr_assert_not_null(src, "cannot read samples/%s (run the tests from the project root)", file);
    Graph *g = fe_compile(c, file, src, strlen(src), NULL);
    cr_assert_not_null(g, "the sample does not compile");
    for (int i = 0; i < g->train.len; i++) {
        Attr *a = g->train.data[i];
        if (a->key && !strcmp(a->key, "microbatches"))
            a->i = 2;
        if (a->key && !strcmp(a->key, "precision"))
            a->s = "f32";
    }
    cr_assert_eq(pass_microbatch(c, g, ts_settings(c, g, 1)), 0); /* both microbatches in the graph, for the interpreter */
    cr_assert_eq(pass_autodiff(c, g, ts_settings(c, g, 0)), 0);
    return g;
}

static int count_phase(const Graph *g, Phase ph, OpKind kind)
{
    int n = 0;
    for (int i = 0; i < g->ops.len; i++)
        n += g->ops.data[i]->phase == ph && (kind == OP_COUNT || g->ops.data[i]->kind == kind);
    return n;
}

/* Outputs (loss, gradients) of g after one interpreted step. */
static double **run(const Graph *g, Interp **keep)
{
    Interp *in = interp_new(g);
    interp_init(in, 99, 11);
    cr_assert_eq(interp_run(in), 0, "%s", in->err);
    double **out = calloc((size_t)g->outputs.len, sizeof(double *));
    for (int i = 0; i < g->outputs.len; i++)
        out[i] = in->buf[g->outputs.data[i]->id];
    *keep = in;
    return out;
}

/* The sample with modes (one per layer) gives every gradient bit for bit. */
static void check_same(const char *file, const char *line, const signed char *modes, int *nrc)
{
    Ctx *c0 = ctx_new(stderr), *c1 = ctx_new(stderr);
    Graph *ref = build(c0, file, line), *g = build(c1, file, line);
    cr_assert_eq(pass_recompute_with(c1, g, modes, 2), 0);
    cr_assert_eq(ir_verify(c1, g), 0, "the graph with recompute ops does not verify");
    *nrc = count_phase(g, PH_RECOMPUTE, OP_COUNT);
    Interp *a, *b;
    double **want = run(ref, &a), **got = run(g, &b);
    cr_assert_eq(ref->outputs.len, g->outputs.len);
    for (int i = 0; i < g->outputs.len; i++) {
        const Value *v = g->outputs.data[i];
        int64_t n = interp_numel(v);
        for (int64_t j = 0; j < n; j++)
            cr_assert(!memcmp(&want[i][j], &got[i][j], sizeof(double)),
                      "output %d (%s) [%lld]: %.17g without recomputation, %.17g with", i,
                      v->name ? v->name : "loss", (long long)j, want[i][j], got[i][j]);
    }
    free(want), free(got);
    interp_free(a), interp_free(b);
    ctx_free(c0), ctx_free(c1);
}

Test(recompute, gpt2_full_same_gradients)
{
    int n;
    check_same("gpt2.tdl", GPT2_LINE, (const signed char[]){RC_FULL, RC_FULL}, &n);
    cr_assert_eq(n, 72, "18 copies per layer and microbatch, not %d", n);
}

Test(recompute, gpt2_selective_same_gradients)
{
    int n;
    check_same("gpt2.tdl", GPT2_LINE, (const signed char[]){RC_SELECTIVE, RC_SELECTIVE}, &n);
    cr_assert_eq(n, 48, "12 copies per layer and microbatch, not %d", n);
}

Test(recompute, llama_full_and_selective_same_gradients)
{
    int full, sel;
    check_same("llama.tdl", LLAMA_LINE, (const signed char[]){RC_FULL, RC_FULL}, &full);
    check_same("llama.tdl", LLAMA_LINE, (const signed char[]){RC_SELECTIVE, RC_SELECTIVE}, &sel);
    cr_assert(sel > 0 && full > sel, "full %d, selective %d copies", full, sel);
}

/* Per layer: only layer 0's ops are copied; selective copies no product. */
Test(recompute, modes_by_layer)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, "gpt2.tdl", GPT2_LINE);
    cr_assert_eq(pass_recompute_with(c, g, (const signed char[]){RC_SELECTIVE, RC_NONE}, 2), 0);
    int n = 0;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        cr_assert_eq(op->id, i, "op ids are indices after the pass");
        if (op->phase != PH_RECOMPUTE)
            continue;
        cr_assert_eq(op->layer, 0);
        cr_assert(op->kind != OP_MATMUL && op->kind != OP_ATTENTION);
        n++;
    }
    cr_assert_eq(n, 24);
    /* a second run finds the copies and changes nothing */
    int len = g->ops.len;
    cr_assert_eq(pass_recompute_with(c, g, (const signed char[]){RC_FULL, RC_FULL}, 2), 0);
    cr_assert_eq(g->ops.len, len);
    ctx_free(c);
}

/* recompute = auto without the driver's per-layer modes is refused. */
Test(recompute, auto_needs_a_budget)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    Ctx *c = ctx_new(f);
    Graph *g = build(c, "gpt2.tdl", GPT2_LINE);
    for (int i = 0; i < g->train.len; i++)
        if (g->train.data[i]->key && !strcmp(g->train.data[i]->key, "recompute"))
            g->train.data[i]->s = "auto";
    Settings *s = ts_settings(c, g, 0);
    cr_assert_eq(pass_recompute(c, g, s), -1);
    static const signed char modes[2] = {RC_FULL, RC_NONE};
    s->recompute_layers = modes;
    s->nrecompute_layers = 2;
    cr_assert_eq(pass_recompute(c, g, s), 0);
    cr_assert_eq(count_phase(g, PH_RECOMPUTE, OP_COUNT), 36);
    fflush(f);
    cr_assert(strstr(buf, "error: recompute = auto needs a device budget (--gpu NAME or "
                          "--device-memory SIZE)"),
              "%s", buf);
    ctx_free(c);
    fclose(f);
    free(buf);
}
