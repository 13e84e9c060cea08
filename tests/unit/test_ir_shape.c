/* test_ir_shape.c: ir_infer, the shape and dtype rule of every op. Each case
 * builds operands from a type string, applies one op and compares the printed
 * result type ("f32[4,8]") or the error line ("error: ...") exactly. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

static Ctx *ctx;
static Graph *g;

static void setup(void)
{
    ctx = ctx_new(stderr);
    g = ir_graph_new(ctx->arena, ctx->strings, "t");
}

static void teardown(void)
{
    ctx_free(ctx);
}

TestSuite(shape, .init = setup, .fini = teardown);

/* "f32[4,8]" -> the result of a fresh input op of that type. */
static Value *in(const char *type)
{
    int64_t shape[IR_MAX_RANK];
    int rank = 0;
    const char *p = strchr(type, '[');
    char *end;
    char *dt = arena_strndup(ctx->arena, type, (size_t)(p - type));
    for (p++; *p != ']'; p = *end == ',' ? end + 1 : end)
        shape[rank++] = strtoll(p, &end, 10);
    cr_assert(ir_dtype_lookup(dt) >= 0, "bad dtype in %s", type);
    Op *op = ir_op_new(g, OP_INPUT, NULL, 0, LOC_NONE);
    return ir_op_result(g, op, (DType)ir_dtype_lookup(dt), rank, shape);
}

static Op *mk(OpKind k, Value **args, int n)
{
    return ir_op_new(g, k, args, n, LOC_NONE);
}
#define OPN(k, ...)                                                                                \
    mk(k, (Value *[]){__VA_ARGS__}, (int)(sizeof((Value *[]){__VA_ARGS__}) / sizeof(Value *)))
#define OP0(k) mk(k, NULL, 0)

static Op *ai(Op *op, const char *key, int64_t v)
{
    ir_op_set_attr(g, op, ir_attr_int(g->arena, key, v));
    return op;
}

static Op *af(Op *op, const char *key, double v)
{
    ir_op_set_attr(g, op, ir_attr_float(g->arena, key, v));
    return op;
}

static Op *ab(Op *op, const char *key, int v)
{
    ir_op_set_attr(g, op, ir_attr_bool(g->arena, key, v));
    return op;
}

static Op *as(Op *op, const char *key, const char *v)
{
    ir_op_set_attr(g, op, ir_attr_str(g->arena, key, v));
    return op;
}

static Op *al(Op *op, const char *key, const int64_t *v, int n)
{
    ir_op_set_attr(g, op, ir_attr_ints(g->arena, key, v, n));
    return op;
}
#define LIST(...)                                                                                  \
    (int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

/* The inferred type as text, or "error: " and the message. */
static const char *infer(const Op *op)
{
    char err[512], buf[200];
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    if (ir_infer(op, &dt, &rank, shape, err, sizeof(err)) != 0)
        return arena_printf(ctx->arena, "error: %s", err);
    return arena_strdup(ctx->arena, ir_type_str(buf, sizeof(buf), dt, rank, shape));
}

#define EXPECT(op, want) cr_assert_str_eq(infer(op), want)

/* ---- arity ---- */

Test(shape, arity_is_checked_before_any_rule)
{
    Value *a = in("f32[3]");
    EXPECT(OPN(OP_ADD, a, a, a), "error: 'add' takes 2 operands, got 3");
    EXPECT(OPN(OP_NEG, a, a), "error: 'neg' takes 1 operand, got 2");
    EXPECT(OPN(OP_LAYERNORM, a), "error: 'layernorm' takes 3 operands, got 1");
    EXPECT(OP0(OP_CONCAT), "error: 'concat' takes at least 1 operand, got 0");
    EXPECT(OPN(OP_INPUT, a), "error: 'input' takes 0 operands, got 1");
}

Test(shape, missing_or_malformed_operands_are_errors_not_crashes)
{
    Value *a = in("f32[3]");
    EXPECT(OPN(OP_ADD, a, NULL), "error: operand 1 of 'add' is missing");
    Value *big = in("f32[3]");
    big->rank = IR_MAX_RANK + 1;
    EXPECT(OPN(OP_NEG, big), "error: operand 0 of 'neg' has rank 9 (at most 8)");
    Value *neg = in("f32[3,5]");
    neg->shape[1] = -5;
    EXPECT(OPN(OP_NEG, neg), "error: operand 0 of 'neg' has a negative dimension: f32[3,-5]");
    Value *odd = in("f32[3]");
    odd->dtype = (DType)17;
    EXPECT(OPN(OP_NEG, odd), "error: operand 0 of 'neg' has unknown dtype 17");
    Op *op = OPN(OP_NEG, a);
    op->kind = OP_COUNT;
    EXPECT(op, arena_printf(ctx->arena, "error: unknown op kind %d", OP_COUNT));
}

/* ---- sources ---- */

Test(shape, sources_return_their_own_type)
{
    Op *op = OP0(OP_INPUT);
    ir_op_result(g, op, DT_I32, 2, (int64_t[]){6, 7});
    EXPECT(op, "i32[6,7]");
    op = OP0(OP_PARAM);
    ir_op_result(g, op, DT_BF16, 1, (int64_t[]){13});
    EXPECT(op, "bf16[13]");
    op = af(OP0(OP_CONSTANT), "value", 0.5);
    ir_op_result(g, op, DT_F32, 0, NULL);
    EXPECT(op, "f32[]");
}

Test(shape, sources_need_exactly_one_result_and_constant_a_float)
{
    EXPECT(OP0(OP_PARAM), "error: 'param' must have 1 result, got 0");
    Op *op = OP0(OP_CONSTANT);
    ir_op_result(g, op, DT_I32, 0, NULL);
    EXPECT(op, "error: 'constant' needs a float type, got i32[]");
    op = as(OP0(OP_CONSTANT), "value", "one");
    ir_op_result(g, op, DT_F32, 0, NULL);
    EXPECT(op, "error: 'value' must be a number");
}

/* ---- elementwise ---- */

Test(shape, broadcast_aligns_trailing_dims)
{
    EXPECT(OPN(OP_ADD, in("f32[5,7]"), in("f32[7]")), "f32[5,7]");
    EXPECT(OPN(OP_SUB, in("f32[7]"), in("f32[5,7]")), "f32[5,7]");
    EXPECT(OPN(OP_MUL, in("f32[3,1,6]"), in("f32[5,1]")), "f32[3,5,6]");
    EXPECT(OPN(OP_DIV, in("f32[7,1]"), in("f32[1,5]")), "f32[7,5]");
    EXPECT(OPN(OP_ADD, in("i32[3,5]"), in("i32[3,5]")), "i32[3,5]");
}

Test(shape, broadcast_scalars_and_zero_sizes)
{
    EXPECT(OPN(OP_ADD, in("f32[]"), in("f32[3,5]")), "f32[3,5]");
    EXPECT(OPN(OP_MUL, in("f32[]"), in("f32[]")), "f32[]");
    EXPECT(OPN(OP_ADD, in("f32[1]"), in("f32[0]")), "f32[0]");
    EXPECT(OPN(OP_ADD, in("f32[0,3]"), in("f32[2,1,3]")), "f32[2,0,3]");
    EXPECT(OPN(OP_ADD, in("f32[2]"), in("f32[0]")),
           "error: shapes f32[2] and f32[0] do not broadcast");
}

Test(shape, broadcast_mismatch_names_both_types)
{
    EXPECT(OPN(OP_ADD, in("f32[4,8]"), in("f32[5,8]")),
           "error: shapes f32[4,8] and f32[5,8] do not broadcast");
    EXPECT(OPN(OP_SUB, in("f32[3,6,5]"), in("f32[7,5]")),
           "error: shapes f32[3,6,5] and f32[7,5] do not broadcast");
    EXPECT(OPN(OP_MUL, in("f32[3]"), in("bf16[3]")), "error: dtype mismatch: f32 and bf16");
    EXPECT(OPN(OP_DIV, in("i32[3]"), in("f32[3]")), "error: dtype mismatch: i32 and f32");
}

/* Issue 19: a comparison is a broadcasting op whose 0 or 1 keeps the
 * operands' dtype (a float mask multiplies and sums as it is; i32 ids give
 * i32); operands of two dtypes are refused as for add. */
Test(shape, comparisons_broadcast_and_keep_the_operands_dtype)
{
    static const OpKind kinds[] = {OP_LT, OP_LE, OP_GT, OP_GE, OP_EQ, OP_NE};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        EXPECT(OPN(kinds[i], in("f32[3,1,6]"), in("f32[5,1]")), "f32[3,5,6]");
        EXPECT(OPN(kinds[i], in("bf16[4]"), in("bf16[]")), "bf16[4]");
        EXPECT(OPN(kinds[i], in("i32[2,7]"), in("i32[7]")), "i32[2,7]");
        EXPECT(OPN(kinds[i], in("i32[3]"), in("f32[3]")), "error: dtype mismatch: i32 and f32");
        EXPECT(OPN(kinds[i], in("f32[4,8]"), in("f32[5,8]")),
               "error: shapes f32[4,8] and f32[5,8] do not broadcast");
    }
}

/* where(c, a, b): the three shapes broadcast together; a and b share a dtype,
 * which the result has; c may have any dtype. */
Test(shape, where_broadcasts_three_operands)
{
    EXPECT(OPN(OP_WHERE, in("f32[3,5]"), in("f32[5]"), in("f32[]")), "f32[3,5]");
    EXPECT(OPN(OP_WHERE, in("i32[4,1,1]"), in("bf16[1,6]"), in("bf16[5,1]")), "bf16[4,5,6]");
    EXPECT(OPN(OP_WHERE, in("f32[]"), in("i32[2]"), in("i32[2]")), "i32[2]");
    EXPECT(OPN(OP_WHERE, in("f64[7]"), in("f32[1]"), in("f32[7,1]")), "f32[7,7]");
    EXPECT(OPN(OP_WHERE, in("f32[0,3]"), in("f32[1]"), in("f32[2,1,3]")), "f32[2,0,3]");
}

Test(shape, where_errors)
{
    EXPECT(OPN(OP_WHERE, in("f32[3]"), in("f32[3]"), in("bf16[3]")),
           "error: dtype mismatch: f32 and bf16");
    EXPECT(OPN(OP_WHERE, in("f32[4]"), in("f32[3]"), in("f32[3]")),
           "error: shapes f32[4], f32[3] and f32[3] do not broadcast");
    EXPECT(OPN(OP_WHERE, in("f32[3]"), in("f32[2,3]"), in("f32[3,3]")),
           "error: shapes f32[3], f32[2,3] and f32[3,3] do not broadcast");
    EXPECT(OPN(OP_WHERE, in("f32[3]"), in("f32[3]")), "error: 'where' takes 3 operands, got 2");
}

Test(shape, neg_takes_any_dtype)
{
    EXPECT(OPN(OP_NEG, in("i32[3,5]")), "i32[3,5]");
    EXPECT(OPN(OP_NEG, in("f16[]")), "f16[]");
    EXPECT(OPN(OP_STOP_GRAD, in("i32[3]")), "i32[3]"); /* any dtype, as neg */
    EXPECT(OPN(OP_STOP_GRAD, in("bf16[2,4]")), "bf16[2,4]");
}

Test(shape, float_unaries_keep_shape_and_reject_i32)
{
    static const OpKind kinds[] = {OP_EXP,     OP_LOG,  OP_SQRT, OP_RSQRT, OP_TANH,
                                   OP_SIGMOID, OP_RELU, OP_GELU, OP_SILU, OP_ERF};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        EXPECT(OPN(kinds[i], in("bf16[3,5,7]")), "bf16[3,5,7]");
        char want[128];
        snprintf(want, sizeof(want), "error: '%s' needs a float operand, got i32",
                 ir_ops[kinds[i]].name);
        EXPECT(OPN(kinds[i], in("i32[3]")), want);
    }
}

Test(shape, cast_takes_attr_dtype)
{
    EXPECT(as(OPN(OP_CAST, in("f32[3,5]")), "dtype", "bf16"), "bf16[3,5]");
    EXPECT(as(OPN(OP_CAST, in("i32[7]")), "dtype", "f64"), "f64[7]");
    EXPECT(as(OPN(OP_CAST, in("f32[3]")), "dtype", "f8"), "error: unknown dtype 'f8'");
    EXPECT(ai(OPN(OP_CAST, in("f32[3]")), "dtype", 2), "error: 'dtype' must be a dtype name");
    EXPECT(OPN(OP_CAST, in("f32[3]")), "error: 'cast' needs attr 'dtype'");
}

/* ---- matmul ---- */

Test(shape, matmul_plain_and_with_shared_weight)
{
    EXPECT(OPN(OP_MATMUL, in("f32[8,768]"), in("f32[768,3072]")), "f32[8,3072]");
    EXPECT(OPN(OP_MATMUL, in("bf16[3,5,7]"), in("bf16[7,11]")), "bf16[3,5,11]");
    EXPECT(OPN(OP_MATMUL, in("f32[2,3,5,7]"), in("f32[7,11]")), "f32[2,3,5,11]");
}

/* dtype = "f32" keeps the f32 sums of 16-bit operands (a weight gradient's) */
Test(shape, matmul_widens_16_bit_operands_to_f32_only)
{
    EXPECT(as(OPN(OP_MATMUL, in("bf16[8,4]"), in("bf16[4,3]")), "dtype", "f32"), "f32[8,3]");
    EXPECT(as(OPN(OP_MATMUL, in("f32[8,4]"), in("f32[4,3]")), "dtype", "f32"),
           "error: dtype = \"f32\" of f32 operands: only \"f32\" of bf16 ones");
    EXPECT(as(OPN(OP_MATMUL, in("bf16[8,4]"), in("bf16[4,3]")), "dtype", "f64"),
           "error: dtype = \"f64\" of bf16 operands: only \"f32\" of bf16 ones");
}

Test(shape, matmul_batched_needs_equal_leading_dims)
{
    EXPECT(OPN(OP_MATMUL, in("f32[3,5,7]"), in("f32[3,7,11]")), "f32[3,5,11]");
    EXPECT(OPN(OP_MATMUL, in("f32[3,5,7]"), in("f32[6,7,11]")),
           "error: batched matmul leading dimensions differ: f32[3,5,7] x f32[6,7,11]");
    EXPECT(OPN(OP_MATMUL, in("f32[2,3,5,7]"), in("f32[3,7,11]")),
           "error: batched matmul needs operands of equal rank: f32[2,3,5,7] x f32[3,7,11]");
}

Test(shape, matmul_errors)
{
    EXPECT(OPN(OP_MATMUL, in("f32[8,768]"), in("f32[512,3072]")),
           "error: matmul inner dimensions differ: f32[8,768] x f32[512,3072] (768 vs 512)");
    EXPECT(OPN(OP_MATMUL, in("f32[7]"), in("f32[7,3]")),
           "error: matmul operand a must have rank >= 2, got f32[7]");
    EXPECT(OPN(OP_MATMUL, in("f32[5,7]"), in("f32[7]")),
           "error: matmul operand b must have rank >= 2, got f32[7]");
    EXPECT(OPN(OP_MATMUL, in("i32[5,7]"), in("i32[7,3]")),
           "error: 'matmul' needs a float operand, got i32");
    EXPECT(OPN(OP_MATMUL, in("f32[5,7]"), in("f16[7,3]")), "error: dtype mismatch: f32 and f16");
}

Test(shape, products_past_int64_are_shape_too_large)
{
    Value *a = in("f32[1099511627776,3]"), *b = in("f32[3,1099511627776]");
    EXPECT(OPN(OP_MATMUL, a, b), "error: shape too large: f32[1099511627776,1099511627776]");
    EXPECT(OPN(OP_NEG, in("f32[4611686018427387904,4]")),
           "error: shape too large: f32[4611686018427387904,4]");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[6]")), "shape", LIST(4294967296, 4294967296)),
           "error: shape too large: [4294967296,4294967296]");
}

/* ---- row ops ---- */

Test(shape, softmax_over_any_dim)
{
    EXPECT(OPN(OP_SOFTMAX, in("f32[3,5,7]")), "f32[3,5,7]");
    EXPECT(ai(OPN(OP_SOFTMAX, in("f32[3,5]")), "dim", 0), "f32[3,5]");
    EXPECT(ai(OPN(OP_SOFTMAX, in("f32[3,5]")), "dim", -2), "f32[3,5]");
}

Test(shape, softmax_errors)
{
    EXPECT(ai(OPN(OP_SOFTMAX, in("f32[3,5]")), "dim", -3),
           "error: 'dim' -3 out of range for rank 2");
    EXPECT(ai(OPN(OP_SOFTMAX, in("f32[3,5]")), "dim", 2), "error: 'dim' 2 out of range for rank 2");
    EXPECT(OPN(OP_SOFTMAX, in("f32[]")), "error: 'dim' -1 out of range for rank 0");
    EXPECT(af(OPN(OP_SOFTMAX, in("f32[3]")), "dim", 0.5), "error: 'dim' must be an integer");
    EXPECT(ab(OPN(OP_SOFTMAX, in("f32[3]")), "dim", 1), "error: 'dim' must be an integer");
    EXPECT(OPN(OP_SOFTMAX, in("i32[3]")), "error: 'softmax' needs a float operand, got i32");
}

Test(shape, layernorm_and_rmsnorm_keep_shape)
{
    EXPECT(OPN(OP_LAYERNORM, in("f32[3,5,768]"), in("f32[768]"), in("f32[768]")), "f32[3,5,768]");
    EXPECT(af(OPN(OP_LAYERNORM, in("bf16[7]"), in("bf16[7]"), in("bf16[7]")), "eps", 1e-6),
           "bf16[7]");
    EXPECT(OPN(OP_RMSNORM, in("f32[3,5,96]"), in("f32[96]")), "f32[3,5,96]");
    EXPECT(ai(OPN(OP_RMSNORM, in("f32[5,96]"), in("f32[96]")), "eps", 1), "f32[5,96]");
}

Test(shape, layernorm_errors)
{
    Value *x = in("f32[3,768]");
    EXPECT(OPN(OP_LAYERNORM, x, in("f32[512]"), in("f32[768]")),
           "error: layernorm weight must be f32[768], got f32[512]");
    EXPECT(OPN(OP_LAYERNORM, x, in("f32[768]"), in("f32[3,768]")),
           "error: layernorm bias must be f32[768], got f32[3,768]");
    EXPECT(OPN(OP_LAYERNORM, x, in("bf16[768]"), in("f32[768]")),
           "error: layernorm weight must be f32[768], got bf16[768]");
    EXPECT(af(OPN(OP_LAYERNORM, x, in("f32[768]"), in("f32[768]")), "eps", 0),
           "error: 'eps' must be positive, got 0");
    EXPECT(as(OPN(OP_LAYERNORM, x, in("f32[768]"), in("f32[768]")), "eps", "small"),
           "error: 'eps' must be a number");
    EXPECT(OPN(OP_LAYERNORM, in("f32[]"), in("f32[1]"), in("f32[1]")),
           "error: layernorm input must have rank >= 1, got f32[]");
    EXPECT(OPN(OP_LAYERNORM, in("i32[3]"), in("i32[3]"), in("i32[3]")),
           "error: 'layernorm' needs a float operand, got i32");
}

Test(shape, rmsnorm_errors)
{
    EXPECT(OPN(OP_RMSNORM, in("f32[5,96]"), in("f32[95]")),
           "error: rmsnorm weight must be f32[96], got f32[95]");
    EXPECT(af(OPN(OP_RMSNORM, in("f32[5,96]"), in("f32[96]")), "eps", -1e-5),
           "error: 'eps' must be positive, got -1e-05");
}

/* ---- reductions ---- */

Test(shape, reductions_remove_or_keep_dim)
{
    EXPECT(OPN(OP_SUM, in("f32[3,5,7]")), "f32[3,5]");
    EXPECT(ai(OPN(OP_MEAN, in("f32[3,5,7]")), "dim", 1), "f32[3,7]");
    EXPECT(ab(ai(OPN(OP_MAX, in("f32[3,5,7]")), "dim", 0), "keepdim", 1), "f32[1,5,7]");
    EXPECT(ab(OPN(OP_SUM, in("f32[3,5]")), "keepdim", 0), "f32[3]");
    EXPECT(OPN(OP_SUM, in("i32[3,5]")), "i32[3]");
    EXPECT(OPN(OP_MEAN, in("f64[7]")), "f64[]");
}

Test(shape, reduction_errors)
{
    EXPECT(OPN(OP_MEAN, in("i32[3,5]")), "error: 'mean' needs a float operand, got i32");
    EXPECT(OPN(OP_MAX, in("i32[3,5]")), "error: 'max' needs a float operand, got i32");
    EXPECT(ai(OPN(OP_SUM, in("f32[3,5]")), "dim", 5), "error: 'dim' 5 out of range for rank 2");
    EXPECT(OPN(OP_SUM, in("f32[]")), "error: 'dim' -1 out of range for rank 0");
    EXPECT(ai(OPN(OP_SUM, in("f32[3]")), "keepdim", 1), "error: 'keepdim' must be true or false");
}

/* argmax: as max, with the i32 index along dim as its result. */
Test(shape, argmax_gives_the_i32_index)
{
    EXPECT(OPN(OP_ARGMAX, in("f32[3,5,7]")), "i32[3,5]");
    EXPECT(ab(ai(OPN(OP_ARGMAX, in("bf16[3,5,7]")), "dim", 1), "keepdim", 1), "i32[3,1,7]");
    EXPECT(ai(OPN(OP_ARGMAX, in("f64[4]")), "dim", -1), "i32[]");
}

Test(shape, argmax_errors)
{
    EXPECT(ai(OPN(OP_ARGMAX, in("f32[3,5]")), "dim", 2), "error: 'dim' 2 out of range for rank 2");
    EXPECT(ai(OPN(OP_ARGMAX, in("f32[3,5]")), "dim", -3), "error: 'dim' -3 out of range for rank 2");
    EXPECT(OPN(OP_ARGMAX, in("i32[3,5]")), "error: 'argmax' needs a float operand, got i32");
    EXPECT(OPN(OP_ARGMAX, in("f32[3,0]")),
           "error: 'argmax' over dimension 1 of f32[3,0]: its size must be in 1..2^31-1");
    EXPECT(OPN(OP_ARGMAX, in("f32[3,2147483648]")),
           "error: 'argmax' over dimension 1 of f32[3,2147483648]: its size must be in 1..2^31-1");
}

/* ---- transformer ops ---- */

Test(shape, embed_appends_the_row_width)
{
    EXPECT(OPN(OP_EMBED, in("f32[50,12]"), in("i32[3,7]")), "f32[3,7,12]");
    EXPECT(OPN(OP_EMBED, in("bf16[50,12]"), in("i32[]")), "bf16[12]");
    EXPECT(OPN(OP_EMBED, in("f32[50,12]"), in("i32[1,1,1,1,1,1,3]")), "f32[1,1,1,1,1,1,3,12]");
}

Test(shape, embed_errors)
{
    EXPECT(OPN(OP_EMBED, in("f32[50,12]"), in("f32[3,7]")),
           "error: embed ids must be i32, got f32[3,7]");
    EXPECT(OPN(OP_EMBED, in("f32[50]"), in("i32[3]")),
           "error: embed table must have rank 2, got f32[50]");
    EXPECT(OPN(OP_EMBED, in("i32[50,12]"), in("i32[3]")),
           "error: 'embed' needs a float operand, got i32");
    EXPECT(OPN(OP_EMBED, in("f32[50,12]"), in("i32[1,1,1,1,1,1,1,3]")),
           "error: embed ids must have rank <= 7, got i32[1,1,1,1,1,1,1,3]");
}

Test(shape, rope_keeps_shape)
{
    EXPECT(ai(OPN(OP_ROPE, in("f32[2,7,12]")), "heads", 3), "f32[2,7,12]");
    EXPECT(af(OPN(OP_ROPE, in("bf16[7,10]")), "theta", 500000.0), "bf16[7,10]");
}

Test(shape, rope_errors)
{
    EXPECT(ai(OPN(OP_ROPE, in("f32[2,7,12]")), "heads", 5),
           "error: 'heads' 5 does not divide 12, the last dimension of f32[2,7,12]");
    EXPECT(ai(OPN(OP_ROPE, in("f32[2,7,12]")), "heads", 4),
           "error: rope head dimension 3 is odd (f32[2,7,12], heads 4)");
    EXPECT(ai(OPN(OP_ROPE, in("f32[2,7,12]")), "heads", 0), "error: 'heads' must be >= 1, got 0");
    EXPECT(af(OPN(OP_ROPE, in("f32[7,10]")), "theta", 0), "error: 'theta' must be positive, got 0");
    EXPECT(OPN(OP_ROPE, in("f32[10]")), "error: rope input must have rank >= 2, got f32[10]");
    EXPECT(OPN(OP_ROPE, in("i32[3,10]")), "error: 'rope' needs a float operand, got i32");
}

static Op *attention(const char *q, const char *k, const char *v, int64_t heads)
{
    Op *op = OPN(OP_ATTENTION, in(q), in(k), in(v));
    return heads ? ai(op, "heads", heads) : op;
}

Test(shape, attention_grouped_query)
{
    EXPECT(attention("f32[2,7,12]", "f32[2,7,12]", "f32[2,7,12]", 4), "f32[2,7,12]");
    EXPECT(ab(ai(attention("bf16[2,7,12]", "bf16[2,7,6]", "bf16[2,7,6]", 4), "kv_heads", 2),
              "causal", 1),
           "bf16[2,7,12]");
    EXPECT(ai(attention("f32[3,5,18]", "f32[3,5,3]", "f32[3,5,3]", 6), "kv_heads", 1),
           "f32[3,5,18]");
}

Test(shape, attention_head_errors)
{
    EXPECT(attention("f32[2,7,12]", "f32[2,7,12]", "f32[2,7,12]", 0),
           "error: 'attention' needs attr 'heads'");
    EXPECT(attention("f32[2,7,12]", "f32[2,7,12]", "f32[2,7,12]", 5),
           "error: 'heads' 5 does not divide 12, the last dimension of q f32[2,7,12]");
    EXPECT(ai(attention("f32[2,7,12]", "f32[2,7,9]", "f32[2,7,9]", 4), "kv_heads", 3),
           "error: 'kv_heads' 3 does not divide 'heads' 4");
    EXPECT(ai(attention("f32[2,7,12]", "f32[2,7,12]", "f32[2,7,12]", 4), "kv_heads", 2),
           "error: attention k must have last dimension 6 (kv_heads 2 x head dim 3), got "
           "f32[2,7,12]");
    EXPECT(attention("f32[2,7,12]", "f32[2,7,12]", "f32[2,7,12]", -3),
           "error: 'heads' must be >= 1, got -3");
    EXPECT(ai(attention("f32[2,7,12]", "f32[2,7,12]", "f32[2,7,12]", 4), "causal", 1),
           "error: 'causal' must be true or false");
}

Test(shape, attention_operand_errors)
{
    EXPECT(attention("f32[2,7,12]", "f32[3,7,12]", "f32[3,7,12]", 4),
           "error: attention q and k differ in batch: f32[2,7,12] and f32[3,7,12]");
    EXPECT(attention("f32[2,7,12]", "f32[2,5,12]", "f32[2,5,12]", 4), "f32[2,7,12]");
    EXPECT(ab(attention("f32[2,7,12]", "f32[2,5,12]", "f32[2,5,12]", 4), "causal", 1),
           "error: 'causal' needs keys as long as the queries; q has 7 positions, k 5 "
           "(cross-attention)");
    EXPECT(attention("f32[2,7,12]", "f32[2,7,12]", "f32[2,5,12]", 4),
           "error: attention v must have k's batch and length f32[2,7,12], got f32[2,5,12]");
    /* values of a head size of their own (latent attention): the output H x Dv */
    EXPECT(attention("f32[2,7,12]", "f32[2,7,12]", "f32[2,7,20]", 4), "f32[2,7,20]");
    EXPECT(ai(attention("f32[2,7,12]", "f32[2,5,3]", "f32[2,5,10]", 4), "kv_heads", 1),
           "f32[2,7,40]");
    EXPECT(ai(attention("f32[2,7,12]", "f32[2,7,6]", "f32[2,7,9]", 4), "kv_heads", 2),
           "error: 'kv_heads' 2 does not divide 9, the last dimension of v f32[2,7,9]");
    EXPECT(attention("f32[7,12]", "f32[7,12]", "f32[7,12]", 4),
           "error: attention q must have rank 3, got f32[7,12]");
    EXPECT(attention("f32[2,7,12]", "bf16[2,7,12]", "f32[2,7,12]", 4),
           "error: dtype mismatch: f32 and bf16");
    EXPECT(attention("i32[2,7,12]", "i32[2,7,12]", "i32[2,7,12]", 4),
           "error: 'attention' needs a float operand, got i32");
}

/* the score bias (T5): [H, S, Sk] or [1, S, Sk], any float type, one at most */
Test(shape, attention_bias)
{
    EXPECT(ai(OPN(OP_ATTENTION, in("f32[2,7,12]"), in("f32[2,5,12]"), in("f32[2,5,12]"),
                  in("f32[4,7,5]")), "heads", 4),
           "f32[2,7,12]");
    EXPECT(ai(OPN(OP_ATTENTION, in("bf16[2,7,12]"), in("bf16[2,7,12]"), in("bf16[2,7,12]"),
                  in("f32[2,7]"), in("f32[1,7,7]")), "heads", 4),
           "bf16[2,7,12]");
    EXPECT(ai(OPN(OP_ATTENTION, in("f32[2,7,12]"), in("f32[2,5,12]"), in("f32[2,5,12]"),
                  in("f32[4,5,7]")), "heads", 4),
           "error: attention bias must be [H, S, Sk] = [4, 7, 5] or [1, 7, 5] (float), got f32[4,5,7]");
    EXPECT(ai(OPN(OP_ATTENTION, in("f32[2,7,12]"), in("f32[2,7,12]"), in("f32[2,7,12]"),
                  in("f32[2,7,7]")), "heads", 4),
           "error: attention bias must be [H, S, S] = [4, 7, 7] or [1, 7, 7] (float), got f32[2,7,7]");
    EXPECT(ai(OPN(OP_ATTENTION, in("f32[2,7,12]"), in("f32[2,7,12]"), in("f32[2,7,12]"),
                  in("i32[4,7,7]")), "heads", 4),
           "error: attention bias must be [H, S, S] = [4, 7, 7] or [1, 7, 7] (float), got i32[4,7,7]");
    EXPECT(ai(OPN(OP_ATTENTION, in("f32[2,7,12]"), in("f32[2,7,12]"), in("f32[2,7,12]"),
                  in("f32[4,7,7]"), in("f32[1,7,7]")), "heads", 4),
           "error: attention bias must be [H, S, S] = [4, 7, 7] or [1, 7, 7] (float), got f32[1,7,7]");
}

Test(shape, cross_entropy_is_a_scalar)
{
    EXPECT(OPN(OP_CROSS_ENTROPY, in("f32[3,7,50]"), in("i32[3,7]")), "f32[]");
    EXPECT(OPN(OP_CROSS_ENTROPY, in("bf16[5,50]"), in("i32[5]")), "f32[]");
    EXPECT(OPN(OP_CROSS_ENTROPY, in("f64[50]"), in("i32[]")), "f64[]");
}

Test(shape, cross_entropy_errors)
{
    EXPECT(OPN(OP_CROSS_ENTROPY, in("f32[3,7,50]"), in("i32[3,6]")),
           "error: cross_entropy targets must be i32[3,7] for logits f32[3,7,50], got i32[3,6]");
    EXPECT(OPN(OP_CROSS_ENTROPY, in("f32[3,50]"), in("f32[3]")),
           "error: cross_entropy targets must be i32[3] for logits f32[3,50], got f32[3]");
    EXPECT(OPN(OP_CROSS_ENTROPY, in("f32[]"), in("i32[]")),
           "error: cross_entropy logits must have rank >= 1, got f32[]");
    EXPECT(OPN(OP_CROSS_ENTROPY, in("i32[3,50]"), in("i32[3]")),
           "error: 'cross_entropy' needs a float operand, got i32");
}

/* ---- data movement ---- */

Test(shape, reshape_with_and_without_hole)
{
    EXPECT(al(OPN(OP_RESHAPE, in("f32[4,6]")), "shape", LIST(3, 8)), "f32[3,8]");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[4,6]")), "shape", LIST(-1, 12)), "f32[2,12]");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[4,6]")), "shape", LIST(2, -1, 3)), "f32[2,4,3]");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[]")), "shape", LIST(1, 1)), "f32[1,1]");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[3,5]")), "shape", NULL, 0),
           "error: reshape from f32[3,5] "
           "(15 elements) to [] (1 elements)");
}

Test(shape, reshape_errors)
{
    EXPECT(al(OPN(OP_RESHAPE, in("f32[4,6]")), "shape", LIST(5, 5)),
           "error: reshape from f32[4,6] (24 elements) to [5,5] (25 elements)");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[4,6]")), "shape", LIST(5, -1)),
           "error: reshape from f32[4,6] (24 elements) to [5,-1]: cannot infer the -1");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[4,6]")), "shape", LIST(-1, -1)),
           "error: 'shape' [-1,-1]: sizes must be >= 0, with at most one -1");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[4,6]")), "shape", LIST(-2, -12)),
           "error: 'shape' [-2,-12]: sizes must be >= 0, with at most one -1");
    EXPECT(OPN(OP_RESHAPE, in("f32[4,6]")), "error: 'reshape' needs attr 'shape'");
    EXPECT(ai(OPN(OP_RESHAPE, in("f32[4,6]")), "shape", 24),
           "error: 'shape' must be a list of integers");
    EXPECT(al(OPN(OP_RESHAPE, in("f32[1]")), "shape", LIST(1, 1, 1, 1, 1, 1, 1, 1, 1)),
           "error: 'shape' has 9 entries, at most 8");
}

Test(shape, reshape_list_with_non_integer_item_is_an_error)
{
    Attr *items[] = {ir_attr_int(g->arena, NULL, 4), ir_attr_float(g->arena, NULL, 6.0)};
    Op *op = OPN(OP_RESHAPE, in("f32[4,6]"));
    ir_op_set_attr(g, op, ir_attr_list(g->arena, "shape", items, 2));
    EXPECT(op, "error: 'shape' must be a list of integers");
}

Test(shape, transpose_by_perm_or_last_two)
{
    EXPECT(OPN(OP_TRANSPOSE, in("f32[3,5,7]")), "f32[3,7,5]");
    EXPECT(OPN(OP_TRANSPOSE, in("f32[50,12]")), "f32[12,50]");
    EXPECT(al(OPN(OP_TRANSPOSE, in("f32[3,5,7]")), "perm", LIST(2, 0, 1)), "f32[7,3,5]");
    EXPECT(al(OPN(OP_TRANSPOSE, in("f32[]")), "perm", NULL, 0), "f32[]");
}

Test(shape, transpose_errors)
{
    EXPECT(al(OPN(OP_TRANSPOSE, in("f32[3,5]")), "perm", LIST(0, 0)),
           "error: 'perm' [0,0] is not a permutation of the 2 dimensions of f32[3,5]");
    EXPECT(al(OPN(OP_TRANSPOSE, in("f32[3,5,7]")), "perm", LIST(1, 0)),
           "error: 'perm' [1,0] is not a permutation of the 3 dimensions of f32[3,5,7]");
    EXPECT(al(OPN(OP_TRANSPOSE, in("f32[3,5]")), "perm", LIST(0, 2)),
           "error: 'perm' [0,2] is not a permutation of the 2 dimensions of f32[3,5]");
    EXPECT(OPN(OP_TRANSPOSE, in("f32[5]")),
           "error: transpose without 'perm' needs rank >= 2, got f32[5]");
    EXPECT(as(OPN(OP_TRANSPOSE, in("f32[3,5]")), "perm", "1,0"),
           "error: 'perm' must be a list of integers");
}

Test(shape, slice_along_dim)
{
    EXPECT(ai(ai(ai(OPN(OP_SLICE, in("f32[4,6]")), "dim", 1), "start", 2), "end", 5), "f32[4,3]");
    EXPECT(ai(OPN(OP_SLICE, in("f32[4,6]")), "start", 1), "f32[4,5]");
    EXPECT(ai(ai(OPN(OP_SLICE, in("f32[7,6]")), "dim", 0), "end", 3), "f32[3,6]");
    EXPECT(OPN(OP_SLICE, in("i32[7]")), "i32[7]");
}

Test(shape, slice_errors)
{
    EXPECT(ai(ai(OPN(OP_SLICE, in("f32[4,6]")), "start", 2), "end", 9),
           "error: slice 2:9 out of range for dimension 1 of f32[4,6]");
    EXPECT(ai(OPN(OP_SLICE, in("f32[4,6]")), "start", -1),
           "error: slice -1:6 out of range for dimension 1 of f32[4,6]");
    EXPECT(ai(OPN(OP_SLICE, in("f32[4,6]")), "end", -1),
           "error: slice 0:-1 out of range for dimension 1 of f32[4,6]");
    EXPECT(ai(ai(OPN(OP_SLICE, in("f32[4,6]")), "start", 3), "end", 3),
           "error: slice 3:3 of dimension 1 of f32[4,6] is empty");
    EXPECT(ai(OPN(OP_SLICE, in("f32[4,6]")), "dim", 2), "error: 'dim' 2 out of range for rank 2");
    EXPECT(af(OPN(OP_SLICE, in("f32[4,6]")), "end", 2.0), "error: 'end' must be an integer");
}

Test(shape, concat_adds_up_dim)
{
    EXPECT(OPN(OP_CONCAT, in("f32[3,5]"), in("f32[3,7]")), "f32[3,12]");
    EXPECT(ai(OPN(OP_CONCAT, in("f32[3,5]"), in("f32[2,5]"), in("f32[6,5]")), "dim", 0),
           "f32[11,5]");
    EXPECT(OPN(OP_CONCAT, in("bf16[3,5]")), "bf16[3,5]");
}

Test(shape, concat_errors)
{
    EXPECT(OPN(OP_CONCAT, in("f32[3,5]"), in("f32[4,7]")),
           "error: concat operands differ outside dimension 1: f32[3,5] and f32[4,7]");
    EXPECT(OPN(OP_CONCAT, in("f32[3,5]"), in("f32[5]")),
           "error: concat operands differ in rank: f32[3,5] and f32[5]");
    EXPECT(OPN(OP_CONCAT, in("f32[3,5]"), in("f16[3,5]")), "error: dtype mismatch: f32 and f16");
    EXPECT(OPN(OP_CONCAT, in("f32[]"), in("f32[]")), "error: 'dim' -1 out of range for rank 0");
}

/* ---- robustness: anything the IR parser could hand over ---- */

static Attr *random_attr(unsigned *seed, const char *key)
{
    int64_t v[IR_MAX_RANK + 1];
    int n = rand_r(seed) % (IR_MAX_RANK + 2);
    for (int i = 0; i < n; i++)
        v[i] = rand_r(seed) % 9 - 2;
    switch (rand_r(seed) % 5) {
    case 0:
        return ir_attr_int(g->arena, key, rand_r(seed) % 11 - 4);
    case 1:
        return ir_attr_float(g->arena, key, (rand_r(seed) % 7 - 3) * 0.5);
    case 2:
        return ir_attr_bool(g->arena, key, rand_r(seed) % 2);
    case 3:
        return ir_attr_str(g->arena, key, rand_r(seed) % 2 ? "bf16" : "x");
    default:
        return ir_attr_ints(g->arena, key, v, n);
    }
}

static Value *random_value(unsigned *seed)
{
    int64_t shape[IR_MAX_RANK];
    int rank = rand_r(seed) % (IR_MAX_RANK + 1);
    for (int i = 0; i < rank; i++)
        shape[i] = rand_r(seed) % 5;
    Op *op = ir_op_new(g, OP_INPUT, NULL, 0, LOC_NONE);
    return ir_op_result(g, op, (DType)(rand_r(seed) % DT_COUNT), rank, shape);
}

Test(shape, random_ops_never_crash_and_errors_are_one_lowercase_line)
{
    static const char *keys[] = {"dim",      "keepdim", "perm", "shape", "start", "end",  "heads",
                                 "kv_heads", "causal",  "eps",  "theta", "dtype", "value"};
    unsigned seed = 12345;
    int accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        Value *args[5];
        int n = rand_r(&seed) % 5;
        for (int i = 0; i < n; i++)
            args[i] = random_value(&seed);
        Op *op = mk((OpKind)(rand_r(&seed) % OP_COUNT), args, n);
        for (int a = rand_r(&seed) % 4; a > 0; a--)
            ir_op_set_attr(g, op, random_attr(&seed, keys[rand_r(&seed) % 13]));
        if (rand_r(&seed) % 2)
            ir_op_result(g, op, DT_F32, 0, NULL);
        char err[256];
        DType dt;
        int rank;
        int64_t shape[IR_MAX_RANK];
        if (ir_infer(op, &dt, &rank, shape, err, sizeof(err)) == 0) {
            cr_assert(rank >= 0 && rank <= IR_MAX_RANK && (unsigned)dt < DT_COUNT);
            accepted++;
            continue;
        }
        size_t len = strlen(err);
        cr_assert(len > 0 && err[len - 1] != '.' && !strchr(err, '\n'), "bad message: %s", err);
        cr_assert(!(err[0] >= 'A' && err[0] <= 'Z'), "capitalised: %s", err);
    }
    cr_assert_gt(accepted, 100, "the random ops should sometimes be valid");
}

Test(shape, tiny_error_buffers_are_respected)
{
    char err[8];
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    Op *op = OPN(OP_ADD, in("f32[4,8]"), in("f32[5,8]"));
    cr_assert_eq(ir_infer(op, &dt, &rank, shape, err, sizeof(err)), -1);
    cr_assert_str_eq(err, "shapes ");
    cr_assert_eq(ir_infer(op, &dt, &rank, shape, NULL, 0), -1);
}
