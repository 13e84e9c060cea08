/* test_autodiff.c: the autodiff pass against central finite differences in
 * float64. Each case is a small TDL program whose loss weighs the op's result
 * with a random input, so every element of every gradient matters. Sizes are
 * odd on purpose. Tolerance: with step h = 1e-5 in float64 the truncation
 * error is O(h^2 f''') ~ 1e-10 and the rounding error O(eps |L| / h) ~ 1e-11,
 * so |g - fd| <= 1e-7 + 1e-5 |fd| leaves two orders of margin and still
 * catches any wrong rule (those are off by O(1)). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/support/settings.h"
#include "tests/support/interp.h"
#include "tests/support/programs.h"

static Graph *build(Ctx *c, const char *src, const char *define1, const char *define2)
{
    const char *defs[2] = {define1, define2};
    for (int i = 0; i < 2; i++) {
        if (!defs[i])
            continue;
        const char *eq = strchr(defs[i], '=');
        Define d = {.name = intern_n(c->strings, defs[i], (size_t)(eq - defs[i])),
                    .value = atoll(eq + 1), .fvalue = (double)atoll(eq + 1)};
        VEC_PUSH(c->arena, c->defines, d);
    }
    Graph *g = fe_compile(c, "t.tdl", src, strlen(src), NULL);
    cr_assert_not_null(g, "the test program does not compile");
    cr_assert_eq(pass_autodiff(c, g, ts_settings(c, g, 0)), 0);
    cr_assert_eq(ir_verify(c, g), 0, "the differentiated graph does not verify");
    return g;
}

static double loss_of(Interp *in)
{
    in->step = 1; /* every run at step 1: dropout's masks stay put */
    cr_assert_eq(interp_run(in), 0, "%s", in->err);
    return in->buf[in->g->outputs.data[0]->id][0];
}

/* Compare every parameter's gradient with central differences; check at most
 * `per_param` elements of each (all when 0), spread over the tensor. */
static void check_grads(const char *src, int64_t vocab, int per_param, const char *d1,
                        const char *d2)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, src, d1, d2);
    Interp *in = interp_new(g);
    interp_init(in, 1234, vocab);
    loss_of(in);
    int out = 1, checked = 0;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (op->kind != OP_PARAM || op->phase != PH_FWD)
            continue;
        Value *p = op->res[0], *gv = g->outputs.data[out++];
        int64_t n = interp_numel(p), step = per_param && n > per_param ? n / per_param : 1;
        double *gbuf = malloc(sizeof(double) * (size_t)n);
        memcpy(gbuf, in->buf[gv->id], sizeof(double) * (size_t)n);
        for (int64_t j = (step > 1 ? step / 2 : 0); j < n; j += step) {
            double *x = &in->buf[p->id][j], x0 = *x, h = 1e-5;
            *x = x0 + h;
            double lp = loss_of(in);
            *x = x0 - h;
            double lm = loss_of(in);
            *x = x0;
            loss_of(in); /* the next parameter's gradient is read at the unperturbed point */
            double fd = (lp - lm) / (2 * h), err = fabs(gbuf[j] - fd);
            cr_assert(err <= 1e-7 + 1e-5 * fabs(fd),
                      "d loss / d %s[%lld]: autodiff %.12g, finite difference %.12g", p->name,
                      (long long)j, gbuf[j], fd);
            checked++;
        }
        free(gbuf);
    }
    cr_assert_gt(checked, 0);
    cr_assert_eq(out, g->outputs.len, "one gradient output per parameter");
    interp_free(in);
    ctx_free(c);
}

#define GRAD_TEST(name, src) \
    Test(autodiff, name) { check_grads(src, 5, 0, NULL, NULL); }

GRAD_TEST(arithmetic_with_broadcasting, PROG_ARITHMETIC_WITH_BROADCASTING)

GRAD_TEST(unary_functions, PROG_UNARY_FUNCTIONS)

GRAD_TEST(positions, PROG_POSITIONS)

GRAD_TEST(comparisons, PROG_COMPARISONS)

GRAD_TEST(where, PROG_WHERE)

GRAD_TEST(argmax, PROG_ARGMAX)

GRAD_TEST(gather, PROG_GATHER)

GRAD_TEST(topk, PROG_TOPK)
GRAD_TEST(scatter, PROG_SCATTER)
GRAD_TEST(dropout, PROG_DROPOUT)
/* 40 elements of each operand, spread: the scores are quadratic in S = 70 */
Test(autodiff, alibi) { check_grads(PROG_ALIBI, 5, 40, NULL, NULL); }
Test(autodiff, attention_scale) { check_grads(PROG_ATTENTION_SCALE, 5, 40, NULL, NULL); }
Test(autodiff, attention_softcap) { check_grads(PROG_ATTENTION_SOFTCAP, 5, 40, NULL, NULL); }
Test(autodiff, cross_attention) { check_grads(PROG_CROSS_ATTENTION, 5, 40, NULL, NULL); }
Test(autodiff, attention_vdim) { check_grads(PROG_ATTENTION_VDIM, 5, 40, NULL, NULL); }
Test(autodiff, attention_bias) { check_grads(PROG_ATTENTION_BIAS, 5, 40, NULL, NULL); }

GRAD_TEST(matmul_shared_and_batched, PROG_MATMUL_SHARED_AND_BATCHED)

GRAD_TEST(softmax_over_each_dim, PROG_SOFTMAX_OVER_EACH_DIM)

GRAD_TEST(layernorm_and_rmsnorm, PROG_LAYERNORM_AND_RMSNORM)

GRAD_TEST(reductions, PROG_REDUCTIONS)

GRAD_TEST(embedding_gather, PROG_EMBEDDING_GATHER)

GRAD_TEST(rotary_embedding, PROG_ROTARY_EMBEDDING)

GRAD_TEST(causal_attention,
          "input r : f32[2, 5, 6]\n"
          "param q : f32[2, 5, 6] = normal(1)\n"
          "param k : f32[2, 5, 6] = normal(1)\n"
          "param v : f32[2, 5, 6] = normal(1)\n"
          "loss = sum(sum(sum(attention(q, k, v, heads = 2, causal) * r)))\n")

/* The float64 reference's two rope layouts agree: rotate_half is the pairs
 * layout of reordered features (the program's loss, their squared
 * difference, is rounding only), and the pairs layout is not (the same
 * program with rotate_half dropped differs by O(1)). */
Test(autodiff, rope_rotate_half_is_the_pairs_layout_of_reordered_features)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = fe_compile(c, "t.tdl", PROG_ROPE_LAYOUTS, strlen(PROG_ROPE_LAYOUTS), NULL);
    cr_assert_not_null(g);
    Interp *in = interp_new(g);
    interp_init(in, 7, 5);
    double same = loss_of(in);
    interp_free(in);
    char *src = strdup(PROG_ROPE_LAYOUTS), *at = strstr(src, ", rotate_half = true");
    memmove(at, at + strlen(", rotate_half = true"), strlen(at + strlen(", rotate_half = true")) + 1);
    Graph *g2 = fe_compile(c, "t.tdl", src, strlen(src), NULL);
    cr_assert_not_null(g2);
    in = interp_new(g2);
    interp_init(in, 7, 5);
    double other = loss_of(in);
    interp_free(in);
    free(src);
    cr_assert(same < 1e-24, "the layouts differ by %g", same);
    cr_assert(other > 1e-3, "the pairs layout on unordered features: %g", other);
    ctx_free(c);
}

GRAD_TEST(grouped_query_attention_non_causal, PROG_GROUPED_QUERY_ATTENTION_NON_CAUSAL)

GRAD_TEST(attention_window_and_mask, PROG_ATTENTION_WINDOW_AND_MASK(5))

GRAD_TEST(fused_qkv_attention,
          "input r : f32[1, 4, 6]\n"
          "param x : f32[1, 4, 18] = normal(1)\n"
          "loss = sum(sum(sum(attention(x, heads = 3, causal) * r)))\n")

GRAD_TEST(cross_entropy, PROG_CROSS_ENTROPY)

GRAD_TEST(data_movement, PROG_DATA_MOVEMENT)

GRAD_TEST(expand, PROG_EXPAND)

/* The same rules at other odd shapes: size-1 dimensions, one-token
 * sequences, a single head dimension, many heads sharing one kv head. */
GRAD_TEST(matmul_other_shapes, PROG_MATMUL_OTHER_SHAPES)

GRAD_TEST(rows_of_one_three_and_thirteen, PROG_ROWS_OF_ONE_THREE_AND_THIRTEEN)

GRAD_TEST(attention_one_token_and_one_shared_kv_head, PROG_ATTENTION_ONE_TOKEN_AND_ONE_SHARED_KV_HEAD)

Test(autodiff, cross_entropy_two_classes)
{
    check_grads("input t : i32[7]\nparam z : f32[7, 2] = normal(1)\nloss = cross_entropy(z, t)\n",
                2, 0, NULL, NULL);
}

/* GPT-2 ties the embedding to the output layer: both uses must add up. */
GRAD_TEST(tied_weights_accumulate,
          "input ids : i32[2, 3]\n"
          "input t : i32[2, 3]\n"
          "param w : f32[5, 4] = normal(1)\n"
          "loss = cross_entropy(embed(w, ids) @ transpose(w), t)\n")

Test(autodiff, unused_parameter_gets_zero_gradient)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, "param a : f32[3] = ones\nparam b : f32[2] = ones\nloss = sum(a * a)\n",
                     NULL, NULL);
    Interp *in = interp_new(g);
    interp_init(in, 7, 2);
    cr_assert_eq(interp_run(in), 0);
    cr_assert_eq(g->outputs.len, 3);
    cr_assert_str_eq(g->outputs.data[2]->name, "b.grad");
    for (int i = 0; i < 2; i++)
        cr_assert_eq(in->buf[g->outputs.data[2]->id][i], 0.0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(in->buf[g->outputs.data[1]->id][i], 2.0);
    interp_free(in);
    ctx_free(c);
}

Test(autodiff, rejects_non_scalar_loss)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    Ctx *c = ctx_new(f);
    const char *src = "param a : f32[3] = ones\nloss = a * 2\n";
    Graph *g = fe_compile(c, "t.tdl", src, strlen(src), NULL);
    cr_assert_not_null(g);
    cr_assert_eq(pass_autodiff(c, g, ts_settings(c, g, 0)), -1);
    fflush(f);
    cr_assert(strstr(buf, "scalar float loss"), "%s", buf);
    ctx_free(c);
    fclose(f);
    free(buf);
}

/* Issue 19: a cast to an integer type is piecewise constant, so its gradient
 * is zero, not the float gradient passed through; a cast between float types
 * still passes it. Finite differences are 0 for w (x * 3 lands on no integer
 * within h), so the check fails on a passed-through gradient; w's gradient
 * must also be exactly zero. */
Test(autodiff, issue19_integer_cast_has_zero_gradient)
{
    const char *src = "input x : f32[4, 4]\n"
                      "input r : f32[4, 4]\n"
                      "param w : f32[4] = constant(3.0)\n"
                      "param v : f32[4] = normal(1)\n"
                      "y = cast(cast(x * w, i32), f32)\n"
                      "z = cast(cast(x * v, f64), f32) + cast(cast(x * v, bf16), f32)\n"
                      "loss = sum(sum(y)) * 10.0 + sum(sum(z * r))\n";
    check_grads(src, 5, 0, NULL, NULL);
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, src, NULL, NULL);
    Interp *in = interp_new(g);
    interp_init(in, 99, 5);
    cr_assert_eq(interp_run(in), 0, "%s", in->err);
    cr_assert_str_eq(g->outputs.data[1]->name, "w.grad");
    for (int i = 0; i < 4; i++)
        cr_assert_eq(in->buf[g->outputs.data[1]->id][i], 0.0, "w.grad[%d] is not zero", i);
    interp_free(in);
    ctx_free(c);
}

/* The gradient named name (an output after the loss). */
static const double *grad_named(Interp *in, const char *name)
{
    for (int i = 1; i < in->g->outputs.len; i++)
        if (!strcmp(in->g->outputs.data[i]->name, name))
            return in->buf[in->g->outputs.data[i]->id];
    cr_assert_fail("no gradient '%s'", name);
    return NULL;
}

/* The value named name of the forward graph. */
static const double *value_named(Interp *in, const char *name)
{
    for (int i = 0; i < in->g->values.len; i++) {
        const Value *v = in->g->values.data[i];
        if (v->name && !strcmp(v->name, name) && v->def && v->def->phase == PH_FWD)
            return in->buf[v->id];
    }
    cr_assert_fail("no value '%s'", name);
    return NULL;
}

/* Issue 19: a comparison's result is a constant to autodiff. b reaches the
 * loss only through comparisons, so its gradient is exactly zero; a's is
 * the mask times r, exactly (the masks held constant). */
Test(autodiff, issue19_comparisons_carry_no_gradient)
{
    const char *src = "input r : f32[4, 6]\n"
                      "param a : f32[4, 6] = normal(1)\n"
                      "param b : f32[6] = normal(1)\n"
                      "loss = sum(sum(a * (a > b) * r)) + sum(sum((b > 0.0) * 3.0 + (b <= a)))\n";
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, src, NULL, NULL);
    Interp *in = interp_new(g);
    interp_init(in, 77, 5);
    cr_assert_eq(interp_run(in), 0, "%s", in->err);
    const double *a = value_named(in, "a"), *b = value_named(in, "b"), *r = value_named(in, "r");
    const double *ga = grad_named(in, "a.grad"), *gb = grad_named(in, "b.grad");
    for (int i = 0; i < 24; i++)
        cr_assert_eq(ga[i], a[i] > b[i % 6] ? r[i] : 0.0, "a.grad[%d] %.17g", i, ga[i]);
    for (int j = 0; j < 6; j++)
        cr_assert_eq(gb[j], 0.0, "b.grad[%d] %.17g is not zero", j, gb[j]);
    interp_free(in);
    ctx_free(c);
}

static const char *sample(const char *file, const char *model_line)
{
    const char *src = test_sample(file, model_line);
    cr_assert_not_null(src, "cannot read samples/%s (run the tests from the project root)", file);
    return src;
}

/* Whole models, shrunk: a sample of elements of every parameter. */
Test(autodiff, mlp_sample_whole_model)
{
    check_grads(sample("mlp.tdl", NULL), 3, 4, "I=5", "H=6");
}

Test(autodiff, tiny_gpt2_whole_model)
{
    check_grads(sample("gpt2.tdl", "model gpt2(V = 11, S = 5, D = 12, H = 3, L = 2, B = 2)"), 11, 3,
                NULL, NULL);
}

Test(autodiff, tiny_llama_whole_model)
{
    check_grads(sample("llama.tdl",
                       "model llama(V = 13, S = 5, D = 16, H = 4, KV = 2, F = 10, L = 2, B = 2)"),
                13, 3, NULL, NULL);
}

/* stop_gradient passes its value forward and no gradient back. In
 * PROG_STOP_GRADIENT, h = tanh(a * b) and the loss is sum(h * sg(h) * r) +
 * 5 sum(sg(b * b)): its value counts both terms, and its gradient is that of
 * sum(h * c * r) with c = h held constant, d/da = r c (1 - h^2) b. Checked
 * against those closed forms in float64 (autodiff without the stop would
 * double the first and add 10 b to b's). */
Test(autodiff, stop_gradient_passes_the_value_and_no_gradient)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, PROG_STOP_GRADIENT, NULL, NULL);
    Interp *in = interp_new(g);
    interp_init(in, 31, 5);
    double loss = loss_of(in);
    const double *r = NULL, *a = NULL, *b = NULL, *ga = NULL, *gb = NULL;
    for (int i = 0; i < g->values.len; i++) {
        const Value *v = g->values.data[i];
        if (!v->name || !v->def || v->def->phase != PH_FWD)
            continue;
        r = !strcmp(v->name, "r") ? in->buf[v->id] : r;
        a = !strcmp(v->name, "a") ? in->buf[v->id] : a;
        b = !strcmp(v->name, "b") ? in->buf[v->id] : b;
    }
    for (int i = 1; i < g->outputs.len; i++) {
        const Value *v = g->outputs.data[i];
        ga = !strcmp(v->name, "a.grad") ? in->buf[v->id] : ga;
        gb = !strcmp(v->name, "b.grad") ? in->buf[v->id] : gb;
    }
    cr_assert(r && a && b && ga && gb);
    double want = 0, wb[7] = {0};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 7; j++) {
            double h = tanh(a[i * 7 + j] * b[j]), d = r[i * 7 + j] * h * (1 - h * h);
            want += h * h * r[i * 7 + j];
            double da = d * b[j];
            cr_assert(fabs(ga[i * 7 + j] - da) <= 1e-12 * (1 + fabs(da)), "a.grad[%d,%d] %.17g, want %.17g",
                      i, j, ga[i * 7 + j], da);
            wb[j] += d * a[i * 7 + j];
        }
    for (int j = 0; j < 7; j++) {
        want += 5 * b[j] * b[j];
        cr_assert(fabs(gb[j] - wb[j]) <= 1e-12 * (1 + fabs(wb[j])), "b.grad[%d] %.17g, want %.17g", j,
                  gb[j], wb[j]);
    }
    cr_assert(fabs(loss - want) <= 1e-12 * (1 + fabs(want)), "loss %.17g, want %.17g", loss, want);
    interp_free(in);
    ctx_free(c);
}
