/* test_ir_text.c: the textual IR (ir/print.c, ir/parse.c). Builds a graph that
 * uses every feature of the format, checks the printed text against a golden
 * copy, the print -> parse -> print round trip, the numbering rules, every
 * parse error with its file:line:col, and that mutated inputs never crash. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* ---- helpers ---- */

static Ctx *ctx;
static char *diag_buf;
static size_t diag_len;

static void setup(void)
{
    ctx = ctx_new(open_memstream(&diag_buf, &diag_len));
}

static void teardown(void)
{
    fclose(ctx->diag.out);
    free(diag_buf);
    diag_buf = NULL;
    ctx_free(ctx);
}

/* What the diagnostics sink has received so far. */
static const char *diagnostics(void)
{
    fflush(ctx->diag.out);
    return diag_buf ? diag_buf : "";
}

/* Parse from an exact-size heap copy, so reading past len is caught by ASan. */
static Graph *parse_exact(Ctx *c, const char *text, size_t len)
{
    char *copy = malloc(len ? len : 1);
    memcpy(copy, text, len);
    Graph *g = ir_parse(c, "t.tir", copy, len);
    free(copy);
    return g;
}

static Graph *parse(const char *text)
{
    return parse_exact(ctx, text, strlen(text));
}

static void add_axis(Graph *g, const char *name, int size, AxisRole role)
{
    g->mesh.axes[g->mesh.naxes++] = (MeshAxis){intern(g->strings, name), size, role, LOC_NONE};
}

static Loc loc_at(const char *file, int line, int col)
{
    return (Loc){file ? intern(ctx->strings, file) : NULL, line, col};
}

static Value *source(Graph *g, OpKind kind, const char *name, DType t, int rank,
                     const int64_t *shape, Loc loc)
{
    Op *op = ir_op_new(g, kind, NULL, 0, loc);
    Value *v = ir_op_result(g, op, t, rank, shape);
    v->name = name ? intern(g->strings, name) : NULL;
    return v;
}

static void build_header(Graph *g)
{
    Arena *a = g->arena;
    VEC_PUSH(a, g->config, ir_attr_int(a, "V", 50304));
    VEC_PUSH(a, g->config, ir_attr_int(a, "S", 1024));
    VEC_PUSH(a, g->config, ir_attr_int(a, "D", 768));
    add_axis(g, "dp", 8, ROLE_DATA);
    add_axis(g, "tp", 4, ROLE_TENSOR);
    add_axis(g, "pp", 2, ROLE_PIPELINE);
    add_axis(g, "fs", 1, ROLE_FSDP);
    add_axis(g, "sp", 2, ROLE_SEQUENCE);
    Attr *betas[] = {ir_attr_float(a, NULL, 0.9), ir_attr_float(a, NULL, 0.95)};
    Attr *inner[] = {ir_attr_int(a, "warmup", 100), ir_attr_bool(a, NULL, 1),
                     ir_attr_list(a, "empty", NULL, 0)};
    Attr *opt[] = {ir_attr_float(a, "lr", 6e-4), ir_attr_list(a, "betas", betas, 2),
                   ir_attr_float(a, "weight_decay", 0.1), ir_attr_float(a, "eps", 1e-5),
                   ir_attr_call(a, "schedule", "cosine", inner, 3)};
    VEC_PUSH(a, g->train, ir_attr_call(a, "optimizer", "adamw", opt, 5));
    VEC_PUSH(a, g->train, ir_attr_float(a, "grad_clip", 1.0));
    VEC_PUSH(a, g->train, ir_attr_str(a, "data", "train \"shard\".bin"));
}

/* %0..%3: sources with shardings over one and several axes. */
static void build_sources(Graph *g, Value **v)
{
    Arena *a = g->arena;
    v[0] = source(g, OP_INPUT, "tokens", DT_I32, 2, (int64_t[]){8, 1024}, loc_at("gpt2.tdl", 5, 1));
    ir_shard_add(&v[0]->shard, 0, 0);
    v[0]->shard.why = (Why){WHY_ANNOTATION, loc_at("gpt2.tdl", 5, 17), NULL};
    v[1] = source(g, OP_PARAM, "wte", DT_F32, 2, (int64_t[]){50304, 768}, loc_at("gpt2.tdl", 8, 1));
    ir_shard_add(&v[1]->shard, 0, 1);
    v[1]->shard.why = (Why){WHY_ROLE, LOC_NONE, "tp"};
    Attr *std[] = {ir_attr_float(a, "std", 0.02)};
    ir_op_set_attr(g, v[1]->def, ir_attr_call(a, "init", "normal", std, 1));
    v[2] =
        source(g, OP_PARAM, "h.0.ln1.g", DT_BF16, 1, (int64_t[]){768}, loc_at("gpt2.tdl", 14, 3));
    ir_op_set_attr(g, v[2]->def, ir_attr_str(a, "init", "ones"));
    v[2]->def->layer = 0;
    v[3] = source(g, OP_CONSTANT, "a\"b\\c\n\t\x01\xc3\xa9", DT_F64, 0, NULL, loc_at(NULL, 3, 4));
    v[3]->shard.why = (Why){WHY_COST, LOC_NONE, "cheaper: 1.5e9 < 2e9"};
    ir_op_set_attr(g, v[3]->def, ir_attr_float(a, "value", -0.0));
    v[3]->def->phase = PH_RECOMPUTE;
    v[3]->def->stage = -1;
}

/* %4..%8: an op with every tail field, every float spelling, a multi-result op. */
static void build_ops(Graph *g, Value **v)
{
    Arena *a = g->arena;
    Op *op = ir_op_new(g, OP_EMBED, (Value *[]){v[1], v[0]}, 2, loc_at("gpt2.tdl", 11, 5));
    v[4] = ir_op_result(g, op, DT_F32, 3, (int64_t[]){8, 1024, 768});
    v[4]->name = intern(g->strings, "x");
    op = ir_op_new(g, OP_MATMUL, (Value *[]){v[4], v[2]}, 2, loc_at("gpt2.tdl", 20, 9));
    op->layer = 0, op->phase = PH_BWD, op->stage = 1;
    v[5] = ir_op_result(g, op, DT_F32, 3, (int64_t[]){8, 1024, 768});
    ir_shard_add(&v[5]->shard, 2, 1);
    ir_shard_add(&v[5]->shard, 2, 0);
    ir_shard_add(&v[5]->shard, 1, 4);
    v[5]->shard.partial = 1u << 2 | 1u << 3;
    v[5]->shard.why = (Why){WHY_RULE, LOC_NONE, "matmul: contracted dim"};
    op = ir_op_new(g, OP_CONSTANT, NULL, 0, LOC_NONE);
    op->phase = PH_OPT;
    v[6] = ir_op_result(g, op, DT_F32, 0, NULL);
    v[6]->shard.why = (Why){WHY_USER, LOC_NONE, NULL};
    double fs[] = {1e30, 1e-5, -1e300, 0.1, INFINITY, -INFINITY, NAN, 5e-324, 123456789.0};
    const char *keys[] = {"big", "small", "neg", "tenth", "inf", "ninf", "nan", "tiny", "whole"};
    for (int i = 0; i < 9; i++)
        ir_op_set_attr(g, op, ir_attr_float(a, keys[i], fs[i]));
    ir_op_set_attr(g, op, ir_attr_int(a, "imin", INT64_MIN));
    ir_op_set_attr(g, op, ir_attr_bool(a, "flag", 0));
    ir_op_set_attr(g, op, ir_attr_str(a, "s", ""));
    op = ir_op_new(g, OP_RMSNORM_GRAD, (Value *[]){v[5], v[2], v[5]}, 3, loc_at("gpt2.tdl", 30, 2));
    v[7] = ir_op_result(g, op, DT_F16, 1, (int64_t[]){4});
    v[7]->name = intern(g->strings, "lo");
    v[8] = ir_op_result(g, op, DT_F16, 1, (int64_t[]){4});
    v[8]->shard.why = (Why){WHY_ANNOTATION, loc_at("gpt2.tdl", 9, 3), "from block h"};
    VEC_PUSH(a, g->outputs, v[6]);
    VEC_PUSH(a, g->outputs, v[5]);
}

static Graph *build_sample(void)
{
    Value *v[9];
    Graph *g = ir_graph_new(ctx->arena, ctx->strings, "gpt2");
    build_header(g);
    build_sources(g, v);
    build_ops(g, v);
    return g;
}

/* What build_sample prints; long lines are split only to fit this file. */
static const char golden[] =
    "# tcc ir v1\n"
    "module gpt2\n"
    "config V = 50304, S = 1024, D = 768\n"
    "mesh dp: data = 8, tp: tensor = 4, pp: pipeline = 2, fs: fsdp = 1, sp: sequence = 2\n"
    "train optimizer = adamw(lr = 0.0006, betas = [0.9, 0.95], weight_decay = 0.1, "
    "eps = 1e-05, schedule = cosine(warmup = 100, true, empty = []))\n"
    "train grad_clip = 1.0\n"
    "train data = \"train \\\"shard\\\".bin\"\n"
    "%0 \"tokens\" : i32[8@dp,1024] why(annotation, \"gpt2.tdl\":5:17) = input "
    "loc(\"gpt2.tdl\":5:1)\n"
    "%1 \"wte\" : f32[50304@tp,768] why(role, \"tp\") = param {init = normal(std = 0.02)} "
    "loc(\"gpt2.tdl\":8:1)\n"
    "%2 \"h.0.ln1.g\" : bf16[768] = param {init = \"ones\"} loc(\"gpt2.tdl\":14:3) layer 0\n"
    "%3 \"a\\\"b\\\\c\\n\\t\\x01\\xc3\\xa9\" : f64[] why(cost, \"cheaper: 1.5e9 < 2e9\") = "
    "constant {value = -0.0} loc(\"\":3:4) phase recompute stage -1\n"
    "%4 \"x\" : f32[8,1024,768] = embed %1, %0 loc(\"gpt2.tdl\":11:5)\n"
    "%5 : f32[8,1024@sp,768@(tp,dp)] partial(pp,fs) why(rule, \"matmul: contracted dim\") = "
    "matmul %4, %2 loc(\"gpt2.tdl\":20:9) layer 0 phase bwd stage 1\n"
    "%6 : f32[] why(user) = constant {big = 1e+30, small = 1e-05, neg = -1e+300, tenth = 0.1, "
    "inf = inf, ninf = -inf, nan = nan, tiny = 5e-324, whole = 123456789.0, "
    "imin = -9223372036854775808, flag = false, s = \"\"} phase opt\n"
    "%7 \"lo\" : f16[4], %8 : f16[4] why(annotation, \"gpt2.tdl\":9:3, \"from block h\") = "
    "rmsnorm_grad %5, %2, %5 loc(\"gpt2.tdl\":30:2)\n"
    "output %6\n"
    "output %5\n";

/* ---- printing ---- */

TestSuite(ir_text, .init = setup, .fini = teardown);

Test(ir_text, print_matches_golden_text)
{
    cr_assert_str_eq(ir_print_string(ctx->arena, build_sample()), golden);
}

Test(ir_text, print_to_file_matches_print_string)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ir_print(f, build_sample());
    fclose(f);
    cr_assert_str_eq(buf, golden);
    free(buf);
}

Test(ir_text, print_value_type_shows_sharding_and_partial)
{
    Graph *g = ir_graph_new(ctx->arena, ctx->strings, NULL);
    add_axis(g, "dp", 2, ROLE_DATA);
    add_axis(g, "tp", 2, ROLE_TENSOR);
    Value *v = ir_value_new(g, DT_F32, 2, (int64_t[]){8, 16});
    ir_shard_add(&v->shard, 0, 0);
    v->shard.partial = 2;
    v->shard.why.kind = WHY_RULE;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ir_print_value_type(f, g, v);
    fclose(f);
    cr_assert_str_eq(buf, "f32[8@dp,16] partial(tp)");
    free(buf);
}

/* Value.id is not trusted and values no op defines are not printed. */
Test(ir_text, print_renumbers_values_in_definition_order)
{
    Graph *g = ir_graph_new(ctx->arena, ctx->strings, NULL);
    ir_value_new(g, DT_F32, 0, NULL); /* an orphan, takes id 0 */
    Value *a = source(g, OP_INPUT, NULL, DT_F32, 1, (int64_t[]){4}, LOC_NONE);
    Op *op = ir_op_new(g, OP_NEG, &a, 1, LOC_NONE);
    Value *b = ir_op_result(g, op, DT_F32, 1, (int64_t[]){4});
    a->id = 41, b->id = 7;
    VEC_PUSH(g->arena, g->outputs, b);
    cr_assert_str_eq(ir_print_string(ctx->arena, g), "# tcc ir v1\n"
                                                     "%0 : f32[4] = input\n"
                                                     "%1 : f32[4] = neg %0\n"
                                                     "output %1\n");
}

/* The driver dumps graphs the verifier rejected: the printer must not fail on
 * them, and what it cannot name reads back as an error. */
Test(ir_text, print_never_fails_on_invalid_graphs)
{
    Graph *g = ir_graph_new(ctx->arena, ctx->strings, NULL);
    add_axis(g, "dp", 2, ROLE_DATA);
    Value *orphan = ir_value_new(g, DT_F32, 1, (int64_t[]){4});
    Value *a = source(g, OP_INPUT, NULL, DT_F32, 1, (int64_t[]){4}, LOC_NONE);
    ir_shard_add(&a->shard, 0, 3);
    a->shard.partial = 1u << 5;
    Op *op = ir_op_new(g, OP_ADD, (Value *[]){orphan, NULL}, 2, LOC_NONE);
    ir_op_result(g, op, DT_F32, 1, (int64_t[]){4});
    char *s = ir_print_string(ctx->arena, g);
    cr_assert_str_eq(s, "# tcc ir v1\n"
                        "mesh dp: data = 2\n"
                        "%0 : f32[4@?3] partial(?5) = input\n"
                        "%1 : f32[4] = add %2, %?\n");
    cr_assert_null(parse(s));
    cr_assert(strstr(diagnostics(), "t.tir:3:12: error: expected a mesh axis name, found '?'\n"));
}

/* ---- round trip ---- */

Test(ir_text, print_parse_print_is_byte_identical)
{
    Graph *g = parse(golden);
    cr_assert_not_null(g, "%s", diagnostics());
    cr_assert_str_eq(ir_print_string(ctx->arena, g), golden);
    cr_assert_eq(ctx->diag.nerrors, 0);
}

Test(ir_text, parse_builds_the_same_graph)
{
    Graph *g = parse(golden);
    cr_assert_not_null(g, "%s", diagnostics());
    cr_assert_str_eq(g->name, "gpt2");
    cr_assert_eq(g->mesh.naxes, 5);
    cr_assert_eq(g->mesh.axes[4].role, ROLE_SEQUENCE);
    cr_assert_eq(g->mesh.axes[3].size, 1);
    cr_assert_eq(g->ops.len, 8);
    cr_assert_eq(g->values.len, 9);
    for (int i = 0; i < g->values.len; i++)
        cr_assert_eq(g->values.data[i]->id, i);
    const Value *v0 = g->values.data[0], *v5 = g->values.data[5];
    cr_assert_eq(v0->name, intern(ctx->strings, "tokens"), "names are interned");
    cr_assert_eq(v0->shard.why.kind, WHY_ANNOTATION);
    cr_assert_eq(v0->shard.why.loc.file, intern(ctx->strings, "gpt2.tdl"));
    cr_assert_eq(v0->shard.why.loc.col, 17);
    cr_assert_eq(v0->def->loc.line, 5);
    cr_assert_eq(g->values.data[1]->shard.why.kind, WHY_ROLE);
    cr_assert_eq(g->values.data[2]->def->layer, 0);
    cr_assert_eq(g->values.data[4]->def->layer, -1);
    cr_assert_eq(v5->def, g->ops.data[5]);
    cr_assert_eq(v5->def->args[0], g->values.data[4]);
    cr_assert_eq(v5->shard.naxes[2], 2);
    cr_assert_eq(v5->shard.axes[2][0], 1);
    cr_assert_eq(v5->shard.axes[2][1], 0);
    cr_assert_eq(v5->shard.partial, 0xcu);
    cr_assert_eq(v5->def->phase, PH_BWD);
    cr_assert_eq(v5->def->stage, 1);
    cr_assert_str_eq(g->values.data[3]->name, "a\"b\\c\n\t\x01\xc3\xa9");
    cr_assert_null(g->ops.data[3]->loc.file);
    cr_assert(signbit(ir_op_attr_float(g->ops.data[3], "value", 1.0)));
    cr_assert(isnan(ir_op_attr_float(g->ops.data[6], "nan", 0)));
    cr_assert_eq(ir_op_attr_float(g->ops.data[6], "tenth", 0), 0.1);
    cr_assert_eq(ir_op_attr_int(g->ops.data[6], "imin", 0), INT64_MIN);
    cr_assert_eq(g->ops.data[7]->nres, 2);
    cr_assert_eq(g->values.data[8]->shard.why.loc.line, 9);
    cr_assert_str_eq(g->values.data[8]->shard.why.detail, "from block h");
    cr_assert_eq(g->outputs.len, 2);
    cr_assert_eq(g->outputs.data[1], v5);
}

Test(ir_text, parse_renumbers_sparse_ids_densely)
{
    Graph *g = parse("\n  # any comment\n"
                     "%70 : f32[4] = input\n"
                     "\n"
                     "%3 : f32[4] = neg %70\r\n"
                     "%100 : f32[4] = add %3, %70\n"
                     "output %100\n");
    cr_assert_not_null(g, "%s", diagnostics());
    cr_assert_eq(g->values.data[2]->id, 2);
    cr_assert_str_eq(ir_print_string(ctx->arena, g), "# tcc ir v1\n"
                                                     "%0 : f32[4] = input\n"
                                                     "%1 : f32[4] = neg %0\n"
                                                     "%2 : f32[4] = add %1, %0\n"
                                                     "output %2\n");
}

Test(ir_text, parse_accepts_spacing_and_zero_result_ops)
{
    const char *text = "module \"my model\"\n"
                       "mesh dp:data=2\n"
                       "%0:f32[ 4 @ dp , 2 ]partial( dp )=input\n"
                       "neg %0 {k = [a = 1, -2, 3.5e2, -nan, -inf, -0]}\n";
    Graph *g = parse(text);
    cr_assert_not_null(g, "%s", diagnostics());
    cr_assert_str_eq(ir_print_string(ctx->arena, g),
                     "# tcc ir v1\n"
                     "module \"my model\"\n"
                     "mesh dp: data = 2\n"
                     "%0 : f32[4@dp,2] partial(dp) = input\n"
                     "neg %0 {k = [a = 1, -2, 3.5e+02, -nan, -inf, 0]}\n");
}

Test(ir_text, parse_of_empty_input_is_an_empty_graph)
{
    Graph *g = ir_parse(ctx, "t.tir", NULL, 0);
    cr_assert_not_null(g);
    cr_assert_str_eq(ir_print_string(ctx->arena, g), "# tcc ir v1\n");
}

/* ---- errors ---- */

/* text must fail to parse, and the diagnostics must contain each expected line. */
static void expect_errors(const char *text, size_t len, int nerrors, const char *const *expected)
{
    teardown(); /* a fresh sink per case */
    setup();
    Graph *g = parse_exact(ctx, text, len);
    const char *d = diagnostics();
    cr_expect_null(g, "parsed: %s", text);
    cr_expect_eq(ctx->diag.nerrors, nerrors, "%d errors for: %s\n%s", ctx->diag.nerrors, text, d);
    for (; *expected; expected++)
        cr_expect(strstr(d, *expected), "want '%s' for '%s', got:\n%s", *expected, text, d);
}

static void expect_error(const char *text, const char *expected)
{
    expect_errors(text, strlen(text), 1, (const char *const[]){expected, NULL});
}

Test(ir_text, error_unknown_names)
{
    expect_error("%0 : f32[] = frobnicate\n", "t.tir:1:14: error: unknown op 'frobnicate'\n");
    expect_error("%0 : f33[] = input", "t.tir:1:6: error: unknown dtype 'f33'\n");
    expect_error("mesh dp: dada = 8", "t.tir:1:10: error: unknown axis role 'dada'\n");
    expect_error("%0 : f32[] = input phase sideways",
                 "t.tir:1:26: error: unknown phase 'sideways'\n");
    expect_error("%0 : f32[] why(hunch) = input", "t.tir:1:16: error: unknown why kind 'hunch'\n");
    expect_error("mesh dp: data = 8\n%0 : f32[8@tp] = input",
                 "t.tir:2:12: error: unknown mesh axis 'tp'\n");
    expect_error("mesh dp: data = 8\n%0 : f32[8] partial(dp, x) = input",
                 "t.tir:2:25: error: unknown mesh axis 'x'\n");
}

Test(ir_text, error_shows_source_line_and_caret)
{
    expect_error("%0 : f32[] = frobnicate\n", "t.tir:1:14: error: unknown op 'frobnicate'\n"
                                              "%0 : f32[] = frobnicate\n"
                                              "             ^\n");
}

Test(ir_text, error_header_after_first_op)
{
    expect_error("%0 : f32[] = input\nmesh dp: data = 2\n",
                 "t.tir:2:1: error: 'mesh' must come before the first op\n");
    expect_error("%0 : f32[] = input\nmodule m\n",
                 "t.tir:2:1: error: 'module' must come before the first op\n");
    expect_error("module a\nmodule b\n", "t.tir:2:8: error: duplicate 'module' line\n");
    expect_error("mesh a: data = 2\nmesh b: data = 2\n",
                 "t.tir:2:6: error: duplicate 'mesh' line\n");
}

Test(ir_text, error_limits)
{
    expect_error("%0 : f32[1,1,1,1,1,1,1,1,1] = input",
                 "t.tir:1:26: error: more than 8 dimensions\n");
    expect_error("mesh a: data = 2\n%0 : f32[8@(a,a,a,a,a,a,a,a,a)] = input",
                 "t.tir:2:29: error: more than 8 axes on one dimension\n");
    expect_error("mesh a: data = 2, b: data = 2, c: data = 2, d: data = 2, e: data = 2, "
                 "f: data = 2, g: data = 2, h: data = 2, i: data = 2",
                 "t.tir:1:110: error: more than 8 mesh axes\n");
    expect_error("mesh a: data = 2, a: data = 4",
                 "t.tir:1:19: error: mesh axis 'a' declared twice\n");
    expect_error("%0 : f32[-1] = input",
                 "t.tir:1:10: error: dimension size -1 out of range [0, 9223372036854775807]\n");
    expect_error("mesh a: data = 0",
                 "t.tir:1:16: error: mesh axis size 0 out of range [1, 1048576]\n");
    expect_error("mesh a: data = 1048577", "mesh axis size 1048577 out of range [1, 1048576]\n");
    expect_error("%0 : f32[] = input layer -1", "t.tir:1:26: error: layer -1 out of range");
    expect_error("%0 : f32[] = input stage 2147483648", "t.tir:1:26: error: stage 2147483648 out");
}

Test(ir_text, error_number_overflow)
{
    expect_error("%0 : f32[9223372036854775808] = input",
                 "t.tir:1:10: error: integer '9223372036854775808' out of range\n");
    expect_error("train x = -9223372036854775809",
                 "t.tir:1:11: error: integer '-9223372036854775809' out of range\n");
    expect_error("train x = 1e999", "t.tir:1:11: error: float '1e999' out of range\n");
    expect_error("%99999999999999999999 : f32[] = input",
                 "t.tir:1:1: error: value number '%99999999999999999999' out of range\n");
    expect_error("train x = 12abc", "t.tir:1:11: error: malformed number '12abc'\n");
    expect_error("train x = 1e+", "t.tir:1:11: error: malformed number '1e+'\n");
    expect_error("%0 : f32[] = input loc(\"f\":99999999999:1)",
                 "t.tir:1:28: error: line 99999999999 out of range");
}

Test(ir_text, error_undefined_and_duplicate_values)
{
    expect_error("%0 : f32[] = neg %1\n", "t.tir:1:18: error: undefined value '%1'\n");
    expect_error("%0 : f32[] = neg %1\n%1 : f32[] = input\n",
                 "t.tir:1:18: error: undefined value '%1'\n");
    expect_error("%0 : f32[] = neg %0\n", "t.tir:1:18: error: undefined value '%0'\n");
    expect_error("output %3\n", "t.tir:1:8: error: undefined value '%3'\n");
    expect_error("%0 : f32[] = input\n%0 : f32[] = input\n",
                 "t.tir:2:1: error: value '%0' defined twice\n");
    expect_error("%0 : f32[] = input\n%0 : f32[] = input\n",
                 "t.tir:1:1: note: first definition of '%0' is here\n");
    expect_error("%4 : f32[], %4 : f32[] = input\n",
                 "t.tir:1:13: error: value '%4' defined twice\n");
}

Test(ir_text, error_garbage)
{
    expect_error("%0 : f32[] = input $", "t.tir:1:20: error: expected end of line, found '$'\n");
    expect_error("%0 : f32[] = input loc(\"f\":1:2) trailing",
                 "t.tir:1:33: error: expected end of line, found 'trailing'\n");
    expect_error("%0 f32[] = input", "t.tir:1:4: error: expected ':', found 'f32'\n");
    expect_error("%0 : f32[ = input", "t.tir:1:11: error: expected dimension size, found '='\n");
    expect_error("%0 : f32[] =", "t.tir:1:13: error: expected an op, found end of line\n");
    expect_error("% : f32[] = input", "t.tir:1:1: error: malformed value number '%'\n");
    expect_error("@", "t.tir:1:1: error: expected a value, an op or a keyword, found '@'\n");
    expect_error("\x80",
                 "t.tir:1:1: error: expected a value, an op or a keyword, found byte 0x80\n");
    expect_error("train init = ones",
                 "t.tir:1:14: error: bare word 'ones' is not a value (strings are quoted)\n");
    expect_error("train x = [1, 2", "t.tir:1:16: error: expected ']', found end of line\n");
    expect_error("train x = f(1 2)", "t.tir:1:15: error: expected ')', found '2'\n");
    expect_error("train x = true(1)", "t.tir:1:15: error: expected end of line, found '('\n");
    expect_error("%0 : f32[] = input {a = 1, a = 2}",
                 "t.tir:1:28: error: attribute 'a' given twice\n");
    expect_error("%0 : f32[] why(rule, \"a\", \"b\") = input",
                 "t.tir:1:25: error: expected ')', found ','\n");
}

Test(ir_text, error_strings)
{
    expect_error("%0 \"abc : f32[] = input", "t.tir:1:4: error: unterminated string\n");
    expect_error("module \"a\\qb\"", "t.tir:1:10: error: invalid escape sequence in string\n");
    expect_error("module \"a\\x4\"", "t.tir:1:10: error: invalid escape sequence in string\n");
    expect_error("module \"a\\", "t.tir:1:10: error: invalid escape sequence in string\n");
    expect_error("module \"a\\x00\"", "t.tir:1:10: error: NUL byte in string\n");
}

Test(ir_text, error_nul_bytes_and_long_lines)
{
    static const char nul[] = "%0 : f32[] = in\0put\n";
    expect_errors(nul, sizeof(nul) - 1, 1,
                  (const char *const[]){"t.tir:1:16: error: NUL byte in input\n", NULL});
    size_t n = (1 << 20) + 2;
    char *big = malloc(n);
    memset(big, ' ', n);
    memcpy(big + n - 2, "x\n", 2);
    expect_errors(
        big, n, 1,
        (const char *const[]){"t.tir:1:1: error: line longer than 1048576 bytes\n", NULL});
    free(big);
}

Test(ir_text, error_deep_nesting)
{
    char text[400] = "train x = ";
    memset(text + strlen(text), '[', 200);
    expect_error(text, "t.tir:1:76: error: attribute nested more than 64 deep\n");
}

/* Each bad line is reported once; the good lines around it still parse. */
Test(ir_text, errors_recover_at_the_next_line)
{
    const char *text = "%0 : f32[] = input\n"
                       "%1 : f32[] = bogus %0\n"
                       "%2 : f32[] = neg %0 $ $ $\n"
                       "%3 : f32[] = neg %0\n"
                       "%4 : q[] = neg %3\n"
                       "output %3\n";
    expect_errors(text, strlen(text), 3,
                  (const char *const[]){"t.tir:2:14: error: unknown op 'bogus'\n",
                                        "t.tir:3:21: error: expected end of line, found '$'\n",
                                        "t.tir:5:6: error: unknown dtype 'q'\n", NULL});
}

/* ---- robustness ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Parse must not crash; whatever it accepts must print, reparse and print the same. */
static void parse_must_survive(const char *text, size_t len)
{
    FILE *sink = fopen("/dev/null", "w");
    Ctx *c = ctx_new(sink);
    Graph *g = parse_exact(c, text, len);
    if (g) {
        char *s1 = ir_print_string(c->arena, g);
        Graph *g2 = parse_exact(c, s1, strlen(s1));
        cr_assert_not_null(g2, "printed text does not parse:\n%s", s1);
        cr_assert_str_eq(ir_print_string(c->arena, g2), s1);
    }
    ctx_free(c);
    fclose(sink);
}

Test(ir_text, truncated_inputs_never_crash)
{
    for (size_t n = 0; n <= strlen(golden); n++)
        parse_must_survive(golden, n);
}

Test(ir_text, mutated_inputs_never_crash)
{
    static const char alphabet[] = "%@,:=()[]{}\"\\#\n\0-.e0123456789xazf";
    size_t len = strlen(golden);
    char *buf = malloc(len);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, golden, len);
        int nflips = 1 + (int)(rng() % 4);
        for (int k = 0; k < nflips; k++) {
            uint64_t r = rng();
            size_t at = (size_t)(r % len);
            buf[at] =
                (r >> 32) & 1 ? (char)(r >> 40) : alphabet[(r >> 40) % (sizeof(alphabet) - 1)];
        }
        parse_must_survive(buf, len);
    }
    free(buf);
}
