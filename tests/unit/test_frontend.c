/* test_frontend.c: the TDL frontend through its public API (fe_compile):
 * lowering results, parameter naming, mesh binding, -D, error recovery and
 * robustness on hostile input. Diagnostics are captured in memory. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"

typedef struct Run {
    Ctx *c;
    Graph *g;
    char *diag;
    size_t diag_len;
    FILE *out;
} Run;

/* The memory stream writes through &r->diag, so a Run lives on the heap. */
static Run *compile(const char *src, const char *mesh, const char *define)
{
    Run *r = calloc(1, sizeof(Run));
    r->out = open_memstream(&r->diag, &r->diag_len);
    r->c = ctx_new(r->out);
    if (define) {
        const char *eq = strchr(define, '=');
        Define d = {.name = intern_n(r->c->strings, define, (size_t)(eq - define)),
                    .value = atoll(eq + 1), .fvalue = (double)atoll(eq + 1)};
        VEC_PUSH(r->c->arena, r->c->defines, d);
    }
    r->g = fe_compile(r->c, "t.tdl", src, strlen(src), &(FeOptions){.mesh = mesh});
    fflush(r->out);
    return r;
}

static void done(Run *r)
{
    ctx_free(r->c);
    fclose(r->out);
    free(r->diag);
    free(r);
}

static const Value *find_value(const Graph *g, const char *name)
{
    const Value *last = NULL;
    for (int i = 0; i < g->values.len; i++)
        if (g->values.data[i]->name && strcmp(g->values.data[i]->name, name) == 0)
            last = g->values.data[i];
    return last;
}

static int count_ops(const Graph *g, OpKind k)
{
    int n = 0;
    for (int i = 0; i < g->ops.len; i++)
        n += g->ops.data[i]->kind == k;
    return n;
}

static const char *MLP = "model m(B = 6, I = 10, H = 12, C = 5)\n"
                         "mesh dp: data, tp: tensor\n"
                         "input x : f32[B@dp, I]\n"
                         "input y : i32[B@dp]\n"
                         "param w1 : f32[I, H@tp] = normal(0.1)\n"
                         "param w2 : f32[H@tp, C] = zeros\n"
                         "loss = cross_entropy(relu(x @ w1) @ w2, y)\n";

Test(frontend, lowers_mlp_with_shapes_and_annotations)
{
    Run *r = compile(MLP, "3x2", NULL);
    cr_assert_not_null(r->g, "diagnostics: %s", r->diag);
    cr_assert_eq(r->g->mesh.naxes, 2);
    cr_assert_eq(r->g->mesh.axes[0].size, 3);
    cr_assert_eq(r->g->mesh.axes[1].size, 2);
    cr_assert_eq(count_ops(r->g, OP_MATMUL), 2);
    const Value *w1 = find_value(r->g, "w1");
    cr_assert_not_null(w1);
    cr_assert_eq(w1->shape[0], 10);
    cr_assert_eq(w1->shape[1], 12);
    cr_assert_eq(w1->shard.naxes[1], 1);
    cr_assert_eq(w1->shard.axes[1][0], 1);
    cr_assert_eq(w1->shard.why.kind, WHY_ANNOTATION);
    cr_assert_eq(w1->shard.why.loc.line, 5);
    cr_assert_eq(r->g->outputs.len, 1);
    cr_assert_eq(r->g->outputs.data[0]->rank, 0);
    cr_assert_eq(ir_verify(r->c, r->g), 0);
    done(r);
}

Test(frontend, repeat_names_parameters_by_layer)
{
    const char *src = "model m(L = 3, D = 4)\n"
                      "input x : f32[2, D]\n"
                      "repeat L as h {\n"
                      "  param w : f32[D, D] = normal(0.02 / sqrt(2 * L))\n"
                      "  x = x @ w\n"
                      "}\n"
                      "loss = sum(sum(x))\n";
    Run *r = compile(src, NULL, NULL);
    cr_assert_not_null(r->g, "diagnostics: %s", r->diag);
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "h.%d.w", i);
        const Value *w = find_value(r->g, name);
        cr_assert_not_null(w, "missing %s", name);
        cr_assert_eq(w->def->layer, i);
        const Attr *init = ir_op_attr(w->def, "init");
        cr_assert_eq(init->kind, ATTR_CALL);
        cr_assert_float_eq(init->items[0]->f, 0.02 / sqrt(6.0), 1e-15);
    }
    cr_assert_eq(count_ops(r->g, OP_MATMUL), 3);
    done(r);
}

Test(frontend, block_calls_get_distinct_parameter_prefixes)
{
    const char *src = "model m(D = 4)\n"
                      "block lin(x, n) {\n"
                      "  param w : f32[D, n] = zeros\n"
                      "  return x @ w\n"
                      "}\n"
                      "input x : f32[2, D]\n"
                      "a = lin(x, D)\n"
                      "b = lin(a, 2 * D)\n"
                      "loss = sum(sum(b))\n";
    Run *r = compile(src, NULL, NULL);
    cr_assert_not_null(r->g, "diagnostics: %s", r->diag);
    cr_assert_eq(find_value(r->g, "lin.w")->shape[1], 4);
    cr_assert_eq(find_value(r->g, "lin_1.w")->shape[1], 8);
    cr_assert_eq(find_value(r->g, "b")->shape[1], 8);
    done(r);
}

Test(frontend, define_overrides_model_parameter)
{
    Run *r = compile(MLP, NULL, "H=20");
    cr_assert_not_null(r->g, "diagnostics: %s", r->diag);
    cr_assert_eq(find_value(r->g, "w1")->shape[1], 20);
    done(r);
}

/* By name, the axes take the order given (the last innermost in the device
 * numbering); an axis not named keeps size 1 and goes first. */
Test(frontend, mesh_binds_by_name_in_the_order_given)
{
    Run *r = compile(MLP, "tp=4,dp=2", NULL);
    cr_assert_not_null(r->g, "diagnostics: %s", r->diag);
    cr_assert_str_eq(r->g->mesh.axes[0].name, "tp");
    cr_assert_eq(r->g->mesh.axes[0].size, 4);
    cr_assert_eq(r->g->mesh.axes[0].role, ROLE_TENSOR);
    cr_assert_str_eq(r->g->mesh.axes[1].name, "dp");
    cr_assert_eq(r->g->mesh.axes[1].size, 2);
    done(r);
    r = compile(MLP, "tp=3", NULL);
    cr_assert_not_null(r->g, "diagnostics: %s", r->diag);
    cr_assert_str_eq(r->g->mesh.axes[0].name, "dp");
    cr_assert_eq(r->g->mesh.axes[0].size, 1);
    cr_assert_str_eq(r->g->mesh.axes[1].name, "tp");
    cr_assert_eq(r->g->mesh.axes[1].size, 3);
    done(r);
    r = compile(MLP, "3x2", NULL); /* sizes alone: the declaration's order */
    cr_assert_not_null(r->g, "diagnostics: %s", r->diag);
    cr_assert_str_eq(r->g->mesh.axes[0].name, "dp");
    cr_assert_eq(r->g->mesh.axes[0].size, 3);
    done(r);
}

Test(frontend, fused_qkv_attention_splits_into_three_slices)
{
    const char *src = "model m(B = 2, S = 5, D = 12, H = 3)\n"
                      "input x : f32[B, S, 3*D]\n"
                      "loss = sum(sum(sum(attention(x, heads = H, causal))))\n";
    Run *r = compile(src, NULL, NULL);
    cr_assert_not_null(r->g, "diagnostics: %s", r->diag);
    cr_assert_eq(count_ops(r->g, OP_SLICE), 3);
    cr_assert_eq(count_ops(r->g, OP_ATTENTION), 1);
    done(r);
}

/* Each source must fail with a message containing the given text. */
static void expect_error(const char *src, const char *mesh, const char *define, const char *msg)
{
    Run *r = compile(src, mesh, define);
    cr_assert_null(r->g, "expected an error for:\n%s", src);
    cr_assert(strstr(r->diag, msg), "expected '%s' in:\n%s", msg, r->diag);
    cr_assert(strstr(r->diag, "t.tdl:") || strstr(r->diag, "tcc: error"), "no location: %s",
              r->diag);
    done(r);
}

Test(frontend, errors_name_the_problem)
{
    expect_error(MLP, "4", NULL, "not divisible by 4 (mesh axis dp)");
    expect_error(MLP, "2x2x2", NULL, "more sizes than the model's 2 mesh axes");
    expect_error(MLP, "dp=2,zz=3", NULL, "no mesh axis 'zz'");
    expect_error(MLP, "0", NULL, "expected sizes");
    expect_error(MLP, NULL, "Q=1", "model 'm' has no parameter 'Q'");
    expect_error("input x : f32[2]\nloss = y\n", NULL, NULL, "undefined name 'y'");
    expect_error("input x : f32[2]\ninput x : f32[2]\nloss = x\n", NULL, NULL,
                 "duplicate name 'x'");
    expect_error("input x : f33[2]\nloss = x\n", NULL, NULL, "unknown dtype 'f33'");
    expect_error("input x : f32[2]\nloss = frob(x)\n", NULL, NULL, "unknown function 'frob'");
    expect_error("input x : f32[2]\nloss = softmax(x, axis = 0)\n", NULL, NULL,
                 "unknown keyword argument 'axis'");
    expect_error("input x : f32[2]\ninput y : f32[3]\nloss = x + y\n", NULL, NULL,
                 "f32[2] and f32[3]");
    expect_error("input x : f32[2]\ninput y : bf16[2]\nloss = x + y\n", NULL, NULL,
                 "dtype mismatch");
    expect_error("mesh dp: data\ninput x : f32[2@tp]\nloss = x\n", NULL, NULL,
                 "unknown mesh axis 'tp'");
    expect_error("mesh dp: data, tp: tensor\ninput x : f32[4@(dp,dp)]\nloss = x\n", NULL, NULL,
                 "used twice in one sharding");
    expect_error("mesh dp: weird\ninput x : f32[2]\nloss = x\n", NULL, NULL,
                 "unknown mesh axis role 'weird'");
    expect_error("model m(D = 5)\ninput x : f32[D / 2]\nloss = x\n", NULL, NULL,
                 "must be an integer, got 2.5");
    expect_error("input x : f32[2]\ny = x\n", NULL, NULL, "has no output");
    expect_error("input x : f32[2]\nloss = x\nrepeat 2 { param w : f32[2] = ones\n"
                 " param w : f32[2] = ones }\n",
                 NULL, NULL, "duplicate name 'w'");
    expect_error("block f(a) {\n return f(a)\n}\ninput x : f32[2]\nloss = f(x)\n", NULL, NULL,
                 "nest deeper than");
    expect_error("train {\n  optimiser = sgd\n}\ninput x : f32[2]\nloss = x\n", NULL, NULL,
                 "unknown training setting 'optimiser'");
}

Test(frontend, reports_every_error_in_one_run)
{
    const char *src = "input x : f32[4]\n"
                      "a = x +\n"            /* syntax error */
                      "b = (x\n"             /* unbalanced: swallows to the end? no: ')' */
                      ")\n"
                      "c = x $ x\n"          /* bad character */
                      "loss = x\n";
    Run *r = compile(src, NULL, NULL);
    cr_assert_null(r->g);
    cr_assert(strstr(r->diag, "t.tdl:2:8: error: syntax error"), "%s", r->diag);
    cr_assert(strstr(r->diag, "t.tdl:5:7: error: unexpected character '$'"), "%s", r->diag);
    done(r);

    const char *three = "input x : f32[4]\n"
                        "a = undefined_thing\n"
                        "b = x + x @ x\n"
                        "c = softmax(x, foo = 1)\n"
                        "loss = x\n";
    r = compile(three, NULL, NULL);
    cr_assert_null(r->g);
    cr_assert_eq(r->c->diag.nerrors, 3, "%s", r->diag);
    done(r);
}

/* Hostile bytes: NULs, no final newline, deep nesting, huge numbers. */
Test(frontend, survives_hostile_input)
{
    static const char nul[] = "input x : f32[2]\0\nloss = x";
    Run *r = calloc(1, sizeof(Run));
    r->out = open_memstream(&r->diag, &r->diag_len);
    r->c = ctx_new(r->out);
    r->g = fe_compile(r->c, "t.tdl", nul, sizeof nul - 1, NULL);
    cr_assert_null(r->g);
    done(r);

    char deep[6000];
    size_t n = 0;
    n += (size_t)sprintf(deep, "loss = ");
    for (int i = 0; i < 2000; i++)
        deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 2000; i++)
        deep[n++] = ')';
    deep[n] = 0;
    r = compile(deep, NULL, NULL);
    cr_assert_null(r->g); /* a number is not a tensor output, and nothing crashed */
    done(r);

    expect_error("model m(D = 99999999999999999999)\n", NULL, NULL, "too large");
    expect_error("model m(D = 4611686018427387904)\ninput x : f32[D * 4]\nloss = x\n", NULL,
                 NULL, "integer overflow");
    expect_error("model m(L = 1000000)\ninput x : f32[2]\nrepeat L { x = x + 1 }\nloss = x\n",
                 NULL, NULL, "out of range");
}
