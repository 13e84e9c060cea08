/* test_rounding.c: the rounding estimate behind --verify=native's
 * tolerances (explain/rounding.c), on small graphs written as IR: a chain of
 * n bf16 ops carries sqrt(n) units of bf16, a sum of K terms adds sqrt(K)
 * units of its f32 accumulator, a value that is not stored (computed inside
 * its reader's kernel) rounds to f32 only, data movement and widening casts
 * round nothing, and two operands that share an ancestor count it once. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "explain/explain.h"

static Ctx *c;
static void setup(void) { c = ctx_new(stderr); }
static void teardown(void) { ctx_free(c); }
TestSuite(rounding, .init = setup, .fini = teardown);

#define HEAD "# tcc ir v1\nmodule r\nmesh dp: data = 1\n"

static const double U16 = 0x1p-8, U32 = 0x1p-24;

static const double *estimate(const char *body, const char *stored)
{
    char text[4096];
    snprintf(text, sizeof text, "%s%s", HEAD, body);
    Graph *g = ir_parse(c, "r.tir", text, strlen(text));
    cr_assert_not_null(g, "%s", text);
    return ex_rounding_error(c->arena, g, stored);
}

static void near(double got, double want, const char *what)
{
    cr_expect(fabs(got - want) <= 1e-12 * want, "%s: %.6g, want %.6g", what, got, want);
}

Test(rounding, a_chain_of_bf16_ops_carries_root_n_units)
{
    const double *e = estimate("%0 \"x\" : bf16[4,8] = input\n"
                               "%1 : bf16[4,8] = exp %0\n"
                               "%2 : bf16[4,8] = tanh %1\n"
                               "%3 : bf16[4,8] = mul %2, %1\n"
                               "%4 : bf16[4,8] = neg %3\n"
                               "%5 : bf16[8,4] = transpose %4 {perm = [1, 0]}\n"
                               "output %5\n",
                               NULL);
    near(e[0], 0, "an input");
    near(e[1], U16, "one op");
    near(e[2], sqrt(2) * U16, "two ops");
    near(e[3], sqrt(3) * U16, "mul of both: the longer chain, its ancestor %1 once");
    near(e[4], e[3], "neg is exact");
    near(e[5], e[3], "transpose moves bits");
}

Test(rounding, a_sum_of_k_terms_adds_root_k_units_of_its_accumulator)
{
    const double *e = estimate("%0 \"a\" : bf16[4,64] = input\n"
                               "%1 \"b\" : bf16[64,8] = input\n"
                               "%2 : bf16[4,8] = matmul %0, %1\n"
                               "%3 \"x\" : f32[4,100] = input\n"
                               "%4 : f32[4] = sum %3 {dim = 1}\n"
                               "%5 : f32[4,100] = cast %0\n"
                               "output %2\n",
                               NULL);
    near(e[2], sqrt(U16 * U16 + 64 * U32 * U32), "bf16 matmul over 64: f32 accumulation");
    near(e[4], sqrt(U32 * U32 + 100 * U32 * U32), "f32 sum of 100");
    (void)e;
}

Test(rounding, casts_round_only_when_they_narrow)
{
    const double *e = estimate("%0 \"x\" : f32[4] = input\n"
                               "%1 : bf16[4] = cast %0 {dtype = \"bf16\"}\n"
                               "%2 : f32[4] = cast %1 {dtype = \"f32\"}\n"
                               "%3 : f64[4] = cast %2 {dtype = \"f64\"}\n"
                               "output %3\n",
                               NULL);
    near(e[1], U16, "f32 to bf16");
    near(e[2], U16, "bf16 to f32: exact");
    near(e[3], U16, "widening keeps the error its operand carries");
}

Test(rounding, a_value_computed_inside_its_readers_kernel_rounds_to_f32)
{
    char stored[8] = {1, 0, 1};
    const double *e = estimate("%0 \"x\" : bf16[4] = input\n"
                               "%1 : bf16[4] = exp %0\n"
                               "%2 : bf16[4] = tanh %1\n"
                               "output %2\n",
                               stored);
    near(e[1], U32, "fused: kept in f32");
    near(e[2], sqrt(U32 * U32 + U16 * U16), "stored: rounded to bf16");
}
