/* test_ir_verify.c: ir_verify. A small valid graph on a 3x2x2 mesh verifies
 * clean; each test breaks one invariant and compares the whole diagnostic
 * output, so both the detection and the wording are pinned. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

static char *out_buf;
static size_t out_len;
static FILE *out;
static Ctx *ctx;
static Graph *g;
/* %0 x  %1 w  %2 h  %3 r  %4 t  %5 loss  %6 s, in definition order */
static Value *x, *w, *h, *r, *t, *loss, *s;

static void add_axis(const char *name, int size, AxisRole role)
{
    MeshAxis *a = &g->mesh.axes[g->mesh.naxes++];
    a->name = intern(ctx->strings, name);
    a->size = size;
    a->role = role;
}

static Value *source(OpKind k, const char *name, DType dt, int rank, const int64_t *shape)
{
    Op *op = ir_op_new(g, k, NULL, 0, LOC_NONE);
    Value *v = ir_op_result(g, op, dt, rank, shape);
    v->name = intern(ctx->strings, name);
    return v;
}

static Value *apply(OpKind k, Value **args, int n, int rank, const int64_t *shape)
{
    Op *op = ir_op_new(g, k, args, n, LOC_NONE);
    return ir_op_result(g, op, args[0]->dtype == DT_I32 ? DT_I32 : DT_F32, rank, shape);
}

static void build(void)
{
    add_axis("dp", 3, ROLE_DATA);
    add_axis("tp", 2, ROLE_TENSOR);
    add_axis("pp", 2, ROLE_PIPELINE);
    x = source(OP_INPUT, "x", DT_F32, 2, (int64_t[]){6, 10}); /* f32[6@dp,10] */
    ir_shard_add(&x->shard, 0, 0);
    x->shard.why.kind = WHY_ANNOTATION;
    w = source(OP_PARAM, "w", DT_F32, 2, (int64_t[]){10, 14}); /* f32[10,14@tp] */
    ir_shard_add(&w->shard, 1, 1);
    h = apply(OP_MATMUL, (Value *[]){x, w}, 2, 2, (int64_t[]){6, 14}); /* f32[6@dp,14@tp] */
    h->name = intern(ctx->strings, "h");
    ir_shard_add(&h->shard, 0, 0);
    ir_shard_add(&h->shard, 1, 1);
    r = apply(OP_GELU, (Value *[]){h}, 1, 2, (int64_t[]){6, 14});
    r->shard = h->shard;
    t = source(OP_INPUT, "t", DT_I32, 1, (int64_t[]){6}); /* i32[6@dp] */
    ir_shard_add(&t->shard, 0, 0);
    loss = apply(OP_CROSS_ENTROPY, (Value *[]){r, t}, 2, 0, NULL);
    loss->name = intern(ctx->strings, "loss");
    s = apply(OP_SUM, (Value *[]){r}, 1, 1, (int64_t[]){14}); /* f32[14@tp] partial(dp) */
    s->name = intern(ctx->strings, "s");
    ir_op_set_attr(g, s->def, ir_attr_int(g->arena, "dim", 0));
    ir_shard_add(&s->shard, 0, 1);
    s->shard.partial = 1u << 0;
    for (int i = 3; i < g->ops.len; i++)
        g->ops.data[i]->stage = 1;
    VEC_PUSH(g->arena, g->outputs, loss);
    VEC_PUSH(g->arena, g->outputs, s);
}

static void setup(void)
{
    out = open_memstream(&out_buf, &out_len);
    ctx = ctx_new(out);
    g = ir_graph_new(ctx->arena, ctx->strings, "t");
    build();
}

static void teardown(void)
{
    ctx_free(ctx);
    fclose(out);
    free(out_buf);
}

TestSuite(verify, .init = setup, .fini = teardown);

/* Run the verifier; its whole output. Checks the return value matches. */
static const char *verify(void)
{
    int before = ctx->diag.nerrors;
    int rc = ir_verify(ctx, g);
    fflush(out);
    cr_assert_eq(rc, ctx->diag.nerrors > before ? -1 : 0, "return value and errors disagree");
    return out_buf;
}

#define EXPECT(msg) cr_assert_str_eq(verify(), "tcc: error: invalid IR: " msg "\n")

/* Put op b at position a and the other way round, keeping ids right. */
static void swap_ops(int a, int b)
{
    Op *tmp = g->ops.data[a];
    g->ops.data[a] = g->ops.data[b];
    g->ops.data[b] = tmp;
    g->ops.data[a]->id = a;
    g->ops.data[b]->id = b;
}

Test(verify, valid_graph_has_no_diagnostics)
{
    cr_assert_str_eq(verify(), "");
    cr_assert_eq(ctx->diag.nerrors, 0);
}

Test(verify, graph_without_mesh_is_valid)
{
    g = ir_graph_new(ctx->arena, ctx->strings, "bare");
    Value *a = source(OP_INPUT, "a", DT_F32, 1, (int64_t[]){7});
    Value *b = apply(OP_EXP, (Value *[]){a}, 1, 1, (int64_t[]){7});
    VEC_PUSH(g->arena, g->outputs, b);
    cr_assert_str_eq(verify(), "");
}

/* ---- SSA ---- */

Test(verify, use_before_def)
{
    swap_ops(2, 3); /* gelu now comes before the matmul that defines its operand */
    EXPECT("%3 'h' is used by 'gelu' defining %2 before its definition");
}

Test(verify, operand_defined_by_no_op)
{
    Value *ghost = ir_value_new(g, DT_F32, 2, (int64_t[]){10, 14});
    ghost->name = intern(ctx->strings, "ghost");
    h->def->args[1] = ghost;
    EXPECT("operand 1 ('ghost') of 'matmul' defining %2 'h' is not defined by any op");
}

Test(verify, missing_operand)
{
    r->def->args[0] = NULL;
    EXPECT("operand 0 of 'gelu' defining %3 is missing");
}

Test(verify, value_defined_twice)
{
    Op *op = ir_op_new(g, OP_NEG, (Value *[]){h}, 1, LOC_NONE);
    op->res = arena_alloc(g->arena, sizeof(Value *));
    op->res[0] = r;
    op->nres = 1;
    EXPECT("%3 is defined twice");
}

Test(verify, result_names_another_op_as_def)
{
    r->def = h->def;
    EXPECT("%3 is a result of 'gelu' but names another op as its definition");
}

Test(verify, op_id_out_of_place)
{
    g->ops.data[3]->id = 9;
    EXPECT("op at position 3 has id 9");
}

Test(verify, value_table_id_mismatch)
{
    g->values.data[4]->id = 2;
    cr_assert(strstr(verify(), "invalid IR: value table entry 4 has id 2\n"));
}

Test(verify, undefined_output)
{
    Value *ghost = ir_value_new(g, DT_F32, 0, NULL);
    ghost->name = intern(ctx->strings, "ghost");
    VEC_PUSH(g->arena, g->outputs, ghost);
    EXPECT("output 2 ('ghost') is not defined by any op");
}

Test(verify, missing_output)
{
    g->outputs.data[0] = NULL;
    EXPECT("output 0 is missing");
}

/* ---- op table ---- */

Test(verify, wrong_operand_count)
{
    Op *op = r->def;
    op->args = arena_alloc(g->arena, 2 * sizeof(Value *));
    op->args[0] = op->args[1] = h;
    op->nargs = 2;
    EXPECT("'gelu' takes 1 operand, got 2");
}

Test(verify, wrong_result_count)
{
    ir_op_result(g, loss->def, DT_F32, 0, NULL);
    EXPECT("'cross_entropy' has 2 results, expected 1");
}

Test(verify, concat_with_no_operands)
{
    Op *op = ir_op_new(g, OP_CONCAT, NULL, 0, LOC_NONE);
    ir_op_result(g, op, DT_F32, 1, (int64_t[]){3});
    EXPECT("'concat' takes at least 1 operand, got 0");
}

Test(verify, unknown_op_kind)
{
    r->def->kind = OP_COUNT;
    char want[128];
    snprintf(want, sizeof(want), "tcc: error: invalid IR: op 3 has unknown kind %d\n", OP_COUNT);
    cr_assert_str_eq(verify(), want);
}

/* ---- types ---- */

Test(verify, wrong_result_shape)
{
    loss->rank = 1;
    loss->shape[0] = 1;
    EXPECT("%5 'loss' is f32[1] but 'cross_entropy' gives f32[]");
}

Test(verify, wrong_result_dtype_is_reported_at_each_disagreement)
{
    r->dtype = DT_BF16;
    cr_assert_str_eq(verify(),
                     "tcc: error: invalid IR: %3 is bf16[6,14] but 'gelu' gives f32[6,14]\n"
                     "tcc: error: invalid IR: %6 's' is f32[14] but 'sum' gives bf16[14]\n");
}

Test(verify, shape_rule_violation_quotes_ir_infer)
{
    w->shape[0] = 11;
    EXPECT("in 'matmul' defining %2 'h': matmul inner dimensions differ: f32[6,10] x f32[11,14] "
           "(10 vs 11)");
}

Test(verify, self_typed_constant_must_be_float)
{
    Op *op = ir_op_new(g, OP_CONSTANT, NULL, 0, LOC_NONE);
    ir_op_result(g, op, DT_I32, 0, NULL);
    EXPECT("in 'constant' defining %7: 'constant' needs a float type, got i32[]");
}

Test(verify, malformed_value_is_reported_once)
{
    r->rank = IR_MAX_RANK + 1;
    EXPECT("%3 has a rank out of range");
}

/* ---- placement ---- */

Test(verify, stage_beyond_pipeline_axis)
{
    r->def->stage = 2;
    EXPECT("'gelu' defining %3 is on stage 2, but pipeline axis 'pp' has 2 stages");
}

Test(verify, negative_stage)
{
    r->def->stage = -1;
    EXPECT("'gelu' defining %3 has negative stage -1");
}

Test(verify, stage_without_pipeline_axis)
{
    g->mesh.naxes = 2;
    for (int i = 0; i < g->ops.len; i++)
        g->ops.data[i]->stage = 0;
    s->def->stage = 1;
    EXPECT("'sum' defining %6 's' is on stage 1, but the mesh has no pipeline axis");
}

Test(verify, bad_phase_and_layer)
{
    h->def->phase = PH_COUNT;
    h->def->layer = -2;
    char want[256];
    snprintf(want, sizeof(want),
             "tcc: error: invalid IR: 'matmul' defining %%2 'h' has unknown phase %d\n"
             "tcc: error: invalid IR: 'matmul' defining %%2 'h' has layer -2\n",
             PH_COUNT);
    cr_assert_str_eq(verify(), want);
}

Test(verify, location_of_the_op_is_used)
{
    r->def->loc = (Loc){intern(ctx->strings, "m.ir"), 4, 3};
    r->def->stage = 5;
    cr_assert_str_eq(verify(), "m.ir:4:3: error: invalid IR: 'gelu' defining %3 is on stage 5, but "
                               "pipeline axis 'pp' has 2 stages\n");
}

/* ---- shardings ---- */

Test(verify, axis_out_of_range)
{
    x->shard.axes[0][0] = 7;
    EXPECT("dimension 0 of %0 'x' is split over mesh axis 7, but the mesh has 3 axes");
}

Test(verify, negative_axis)
{
    t->shard.axes[0][0] = -1;
    EXPECT("dimension 0 of %4 't' is split over mesh axis -1, but the mesh has 3 axes");
}

Test(verify, axis_used_in_two_dims)
{
    ir_shard_add(&w->shard, 0, 1);
    EXPECT("%1 'w' uses mesh axis 'tp' more than once");
}

Test(verify, axis_used_twice_in_one_dim)
{
    ir_shard_add(&x->shard, 0, 0);
    EXPECT("%0 'x' uses mesh axis 'dp' more than once");
}

Test(verify, non_divisible_dim)
{
    x->shard.naxes[0] = 0;
    ir_shard_add(&x->shard, 1, 0);
    EXPECT("dimension 1 of %0 'x' (size 10) is not divisible by 3 (axes dp)");
}

Test(verify, non_divisible_by_product_of_axes)
{
    ir_shard_add(&w->shard, 1, 0);
    EXPECT("dimension 1 of %1 'w' (size 14) is not divisible by 6 (axes tp,dp)");
}

Test(verify, partial_and_split_over_same_axis)
{
    h->shard.partial = 1u << 0;
    EXPECT("%2 'h' is both split and partial over mesh axis 'dp'");
}

Test(verify, partial_bit_beyond_mesh)
{
    s->shard.partial |= 1u << 5;
    EXPECT("%6 's' is partial over mesh axis 5, but the mesh has 3 axes");
}

Test(verify, sharding_beyond_rank)
{
    ir_shard_add(&t->shard, 1, 1);
    EXPECT("%4 't' has rank 1 but its sharding splits dimension 1");
}

Test(verify, unknown_sharding_reason)
{
    x->shard.why.kind = WHY_COUNT;
    char want[128];
    snprintf(want, sizeof(want), "tcc: error: invalid IR: %%0 'x' has unknown sharding reason %d\n",
             WHY_COUNT);
    cr_assert_str_eq(verify(), want);
}

/* ---- mesh ---- */

Test(verify, mesh_axis_of_size_zero)
{
    g->mesh.axes[1].size = 0;
    EXPECT("mesh axis 'tp' has size 0");
}

Test(verify, mesh_axis_declared_twice)
{
    g->mesh.axes[1].name = intern(ctx->strings, "dp");
    EXPECT("mesh axis 'dp' is declared twice");
}

/* ---- many at once ---- */

Test(verify, every_violation_is_reported)
{
    x->shard.axes[0][0] = 7;
    r->def->stage = 2;
    loss->rank = 1;
    loss->shape[0] = 1;
    cr_assert_str_eq(
        verify(),
        "tcc: error: invalid IR: dimension 0 of %0 'x' is split over mesh axis 7, but the mesh has "
        "3 axes\n"
        "tcc: error: invalid IR: 'gelu' defining %3 is on stage 2, but pipeline axis 'pp' has 2 "
        "stages\n"
        "tcc: error: invalid IR: %5 'loss' is f32[1] but 'cross_entropy' gives f32[]\n");
    cr_assert_eq(ctx->diag.nerrors, 3);
}

/* ---- robustness: random corruptions never crash and always read the same ---- */

static void corrupt(unsigned *seed)
{
    Value *vals[] = {x, w, h, r, t, loss, s};
    Value *v = vals[rand_r(seed) % 7];
    Op *op = g->ops.data[rand_r(seed) % g->ops.len];
    switch (rand_r(seed) % 10) {
    case 0:
        v->rank = rand_r(seed) % (IR_MAX_RANK + 3) - 1;
        break;
    case 1:
        v->shard.axes[rand_r(seed) % IR_MAX_RANK][0] = (int8_t)(rand_r(seed) % 12 - 2);
        break;
    case 2:
        v->shard.naxes[rand_r(seed) % IR_MAX_RANK] = (uint8_t)(rand_r(seed) % 10);
        break;
    case 3:
        v->shard.partial = (uint32_t)rand_r(seed);
        break;
    case 4:
        op->stage = rand_r(seed) % 5 - 1;
        break;
    case 5:
        op->kind = (OpKind)(rand_r(seed) % (OP_COUNT + 2));
        break;
    case 6:
        swap_ops(rand_r(seed) % g->ops.len, rand_r(seed) % g->ops.len);
        break;
    case 7:
        g->mesh.axes[rand_r(seed) % 3].size = rand_r(seed) % 3 - 1;
        break;
    case 8:
        v->shape[rand_r(seed) % IR_MAX_RANK] = rand_r(seed) % 20 - 2;
        break;
    default:
        g->mesh.naxes = rand_r(seed) % (IR_MAX_AXES + 3) - 1;
        break;
    }
}

Test(verify, random_corruptions_never_crash)
{
    unsigned seed = 777;
    for (int iter = 0; iter < 3000; iter++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        Ctx *c = ctx_new(f);
        Ctx *saved = ctx;
        ctx = c;
        g = ir_graph_new(c->arena, c->strings, "fuzz");
        build();
        for (int k = rand_r(&seed) % 4 + 1; k > 0; k--)
            corrupt(&seed);
        int rc = ir_verify(c, g);
        fflush(f);
        cr_assert_eq(rc, c->diag.nerrors ? -1 : 0);
        for (char *line = buf; *line; line = strchr(line, '\n') + 1)
            cr_assert(strncmp(line, "tcc: error: invalid IR: ", 24) == 0 ||
                          strncmp(line, "tcc: too many errors", 20) == 0,
                      "odd line: %s", line);
        ctx = saved;
        ctx_free(c);
        fclose(f);
        free(buf);
    }
}
