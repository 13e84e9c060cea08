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
#include "tests/support/interp.h"

static Graph *build(Ctx *c, const char *src, const char *define1, const char *define2)
{
    const char *defs[2] = {define1, define2};
    for (int i = 0; i < 2; i++) {
        if (!defs[i])
            continue;
        const char *eq = strchr(defs[i], '=');
        Define d = {intern_n(c->strings, defs[i], (size_t)(eq - defs[i])), atoll(eq + 1), 0};
        VEC_PUSH(c->arena, c->defines, d);
    }
    Graph *g = fe_compile(c, "t.tdl", src, strlen(src));
    cr_assert_not_null(g, "the test program does not compile");
    cr_assert_eq(pass_autodiff(c, g), 0);
    cr_assert_eq(ir_verify(c, g), 0, "the differentiated graph does not verify");
    return g;
}

static double loss_of(Interp *in)
{
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

GRAD_TEST(arithmetic_with_broadcasting,
          "input r : f32[3, 5]\n"
          "param a : f32[3, 5] = normal(1)\n"
          "param b : f32[5] = normal(1)\n"
          "param s : f32[] = normal(1)\n"
          "y = (a + b) * (a - b) / (b * b + 2) - a * s + 0.5 / (a * a + 1)\n"
          "loss = sum(sum(y * r))\n")

GRAD_TEST(unary_functions,
          "input r : f32[3, 7]\n"
          "param a : f32[3, 7] = normal(1)\n"
          "y = exp(a * 0.3) + log(a * a + 1) + sqrt(a * a + 1) + rsqrt(a * a + 1) + tanh(a)\n"
          "z = sigmoid(a) + relu(a) + gelu(a) + silu(a) - a\n"
          "loss = sum(sum((y + z) * r))\n")

GRAD_TEST(matmul_shared_and_batched,
          "input r : f32[2, 3, 5]\n"
          "param x : f32[2, 3, 4] = normal(1)\n"
          "param w : f32[4, 5] = normal(1)\n"
          "param b : f32[2, 4, 5] = normal(1)\n"
          "loss = sum(sum(sum((x @ w + x @ b) * r)))\n")

GRAD_TEST(softmax_over_each_dim,
          "input r : f32[3, 5]\n"
          "param a : f32[3, 5] = normal(1)\n"
          "loss = sum(sum((softmax(a) + softmax(a, dim = 0)) * r))\n")

GRAD_TEST(layernorm_and_rmsnorm,
          "input r : f32[3, 7]\n"
          "param x : f32[3, 7] = normal(1)\n"
          "param g : f32[7] = normal(1)\n"
          "param b : f32[7] = normal(1)\n"
          "param h : f32[7] = normal(1)\n"
          "loss = sum(sum((layernorm(x, g, b) + rmsnorm(x * 0.7, h, eps = 1e-3)) * r))\n")

GRAD_TEST(reductions,
          "input r : f32[3]\n"
          "input q : f32[5]\n"
          "input k : f32[3, 1]\n"
          "param a : f32[3, 5] = normal(1)\n"
          "y = sum(sum(a, dim = 1) * r) + sum(mean(a, dim = 0) * q) + sum(max(a) * r)\n"
          "loss = y + sum(sum(max(a, dim = 1, keepdim = true) * k))\n")

GRAD_TEST(embedding_gather,
          "input ids : i32[2, 3]\n"
          "input r : f32[2, 3, 4]\n"
          "param t : f32[5, 4] = normal(1)\n"
          "loss = sum(sum(sum(embed(t, ids) * r)))\n")

GRAD_TEST(rotary_embedding,
          "input r : f32[2, 3, 8]\n"
          "param x : f32[2, 3, 8] = normal(1)\n"
          "loss = sum(sum(sum(rope(x, heads = 2, theta = 100) * r)))\n")

GRAD_TEST(causal_attention,
          "input r : f32[2, 5, 6]\n"
          "param q : f32[2, 5, 6] = normal(1)\n"
          "param k : f32[2, 5, 6] = normal(1)\n"
          "param v : f32[2, 5, 6] = normal(1)\n"
          "loss = sum(sum(sum(attention(q, k, v, heads = 2, causal) * r)))\n")

GRAD_TEST(grouped_query_attention_non_causal,
          "input r : f32[2, 5, 8]\n"
          "param q : f32[2, 5, 8] = normal(1)\n"
          "param k : f32[2, 5, 4] = normal(1)\n"
          "param v : f32[2, 5, 4] = normal(1)\n"
          "loss = sum(sum(sum(attention(q, k, v, heads = 4, kv_heads = 2) * r)))\n")

GRAD_TEST(fused_qkv_attention,
          "input r : f32[1, 4, 6]\n"
          "param x : f32[1, 4, 18] = normal(1)\n"
          "loss = sum(sum(sum(attention(x, heads = 3, causal) * r)))\n")

GRAD_TEST(cross_entropy,
          "input t : i32[3, 2]\n"
          "param z : f32[3, 2, 5] = normal(1)\n"
          "loss = cross_entropy(z * 2, t)\n")

GRAD_TEST(data_movement,
          "input r : f32[5, 6]\n"
          "input q : f32[3, 2, 5]\n"
          "param a : f32[6, 5] = normal(1)\n"
          "param b : f32[2, 5] = normal(1)\n"
          "y = transpose(a) + reshape(transpose(a, perm = [1, 0]), [5, 6]) * 0.5\n"
          "z = concat(slice(a, 0, 3, dim = 0), b * 2, slice(a, 4, 6, dim = 0), dim = 0)\n"
          "loss = sum(sum(y * r)) + sum(sum(sum(reshape(slice(z, 1, 7, dim = 0), [3, 2, 5]) * q)))\n")

/* The same rules at other odd shapes: size-1 dimensions, one-token
 * sequences, a single head dimension, many heads sharing one kv head. */
GRAD_TEST(matmul_other_shapes,
          "input r : f32[1, 1]\n"
          "input q : f32[3, 5, 9]\n"
          "param a : f32[1, 7] = normal(1)\n"
          "param w : f32[7, 1] = normal(1)\n"
          "param x : f32[3, 5, 2] = normal(1)\n"
          "param b : f32[3, 2, 9] = normal(1)\n"
          "loss = sum(sum(a @ w * r)) + sum(sum(sum(x @ b * q)))\n")

GRAD_TEST(rows_of_one_three_and_thirteen,
          "input r : f32[4, 13]\n"
          "input q : f32[2, 3]\n"
          "param a : f32[4, 13] = normal(1)\n"
          "param c : f32[2, 3] = normal(1)\n"
          "param g : f32[3] = normal(1)\n"
          "param one : f32[5, 1] = normal(1)\n"
          "y = sum(sum(softmax(a) * r)) + sum(sum(layernorm(c, g, g) * q))\n"
          "loss = y + sum(sum(softmax(one) * 3)) + sum(sum(rmsnorm(c, g) * q))\n")

GRAD_TEST(attention_one_token_and_one_shared_kv_head,
          "input r : f32[3, 1, 6]\n"
          "input u : f32[1, 9, 6]\n"
          "param q : f32[3, 1, 6] = normal(1)\n"
          "param k : f32[3, 1, 6] = normal(1)\n"
          "param v : f32[3, 1, 6] = normal(1)\n"
          "param q2 : f32[1, 9, 6] = normal(1)\n"
          "param k2 : f32[1, 9, 2] = normal(1)\n"
          "param v2 : f32[1, 9, 2] = normal(1)\n"
          "y = sum(sum(sum(attention(q, k, v, heads = 6, causal) * r)))\n"
          "loss = y + sum(sum(sum(attention(q2, k2, v2, heads = 3, kv_heads = 1, causal) * u)))\n")

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
    Graph *g = fe_compile(c, "t.tdl", src, strlen(src));
    cr_assert_not_null(g);
    cr_assert_eq(pass_autodiff(c, g), -1);
    fflush(f);
    cr_assert(strstr(buf, "scalar float loss"), "%s", buf);
    ctx_free(c);
    fclose(f);
    free(buf);
}

static char *read_sample(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "samples/%s", name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s (run the tests from the project root)", path);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* Whole models, shrunk: a sample of elements of every parameter. */
Test(autodiff, mlp_sample_whole_model)
{
    check_grads(read_sample("mlp.tdl"), 3, 4, "I=5", "H=6");
}

Test(autodiff, tiny_gpt2_whole_model)
{
    char src[65536];
    snprintf(src, sizeof src, "%s", read_sample("gpt2.tdl"));
    /* -D only sets two at a time here: shrink the rest in the source */
    char *p = strstr(src, "model gpt2(");
    cr_assert_not_null(p);
    const char *small = "model gpt2(V = 11, S = 5, D = 12, H = 3, L = 2, B = 2)";
    char *end = strchr(p, ')');
    memmove(p + strlen(small), end + 1, strlen(end + 1) + 1);
    memcpy(p, small, strlen(small));
    check_grads(src, 11, 3, NULL, NULL);
}

Test(autodiff, tiny_llama_whole_model)
{
    char src[65536];
    snprintf(src, sizeof src, "%s", read_sample("llama.tdl"));
    char *p = strstr(src, "model llama(");
    cr_assert_not_null(p);
    const char *small = "model llama(V = 13, S = 5, D = 16, H = 4, KV = 2, F = 10, L = 2, B = 2)";
    char *end = strchr(p, ')');
    memmove(p + strlen(small), end + 1, strlen(end + 1) + 1);
    memcpy(p, small, strlen(small));
    check_grads(src, 13, 3, NULL, NULL);
}
