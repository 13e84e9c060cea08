/* test_cmath.c: the C rendering's f32 exp and tanh (tcc_expf, tcc_tanhf in
 * the kernel prelude of codegen/groups.c). The prelude is compiled with the
 * kernels' own flags (runtime/cpu.c) and two kinds of wrappers: one call per
 * value, and a loop over an array that the compiler vectorizes. Each is held
 * to the float64 C library within 2 ulp of the result (Cephes' polynomials
 * are about 1 ulp; the rest is the few roundings around them) over random
 * inputs across their ranges and near the switch points, the edge cases are
 * exact (zeros, infinities, NaN, overflow, underflow), and the loop's bits
 * equal the calls' bits: a kernel's result does not depend on whether its
 * loop ran as vectors. */
#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "tests/support/cload.h"
#include "tests/support/tmpdir.h"

typedef float (*Fn)(float);
typedef void (*LoopFn)(const float *, float *, long);

static char dir[64];
static void *so;

static const char *wrappers =
    "\nfloat test_exp(float x) { return tcc_expf(x); }\n"
    "float test_tanh(float x) { return tcc_tanhf(x); }\n"
    "void test_exp_loop(const float *restrict x, float *restrict y, long n)\n"
    "{ for (long i = 0; i < n; i++) y[i] = tcc_expf(x[i]); }\n"
    "void test_tanh_loop(const float *restrict x, float *restrict y, long n)\n"
    "{ for (long i = 0; i < n; i++) y[i] = tcc_tanhf(x[i]); }\n";

static void setup(void)
{
    tmpdir_make(dir, "cmath");
    so = cload(dir, cg_c_prelude(), wrappers,
               "-O3 -march=native -fno-math-errno -ffp-contract=off -std=c99 -Wall -Werror");
}

static void teardown(void)
{
    if (so)
        dlclose(so);
    tmpdir_remove(dir);
}

static void *sym(const char *name)
{
    void *p = dlsym(so, name);
    cr_assert_not_null(p, "%s", name);
    return p;
}

/* |got - want| in units of the last place of the float nearest want (the
 * smallest subnormal's below the normal range). */
static double ulps(float got, double want)
{
    double w = fabs(want), ulp = w < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(w) - 23);
    return fabs((double)got - want) / ulp;
}

static uint64_t state = 0x9e3779b97f4a7c15ULL;
static double uniform(double lo, double hi) /* xorshift64*, in [lo, hi) */
{
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return lo + (hi - lo) * (double)((state * 0x2545f4914f6cdd1dULL) >> 11) * 0x1p-53;
}

/* The worst error of f against ref over n values in [lo, hi), and that the
 * vectorized loop gives the same bits as the calls. */
static double worst(Fn f, LoopFn loop, double (*ref)(double), double lo, double hi, int n)
{
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    cr_assert(x && y);
    for (int i = 0; i < n; i++)
        x[i] = (float)uniform(lo, hi);
    loop(x, y, n);
    double w = 0;
    for (int i = 0; i < n; i++) {
        float one = f(x[i]);
        cr_assert(!memcmp(&one, &y[i], 4), "x = %a: loop %a, call %a", (double)x[i], (double)y[i],
                  (double)one);
        double e = ulps(one, ref((double)x[i]));
        cr_assert(e <= 2.0, "x = %a: %a, want %a (%.2f ulp)", (double)x[i], (double)one,
                  ref((double)x[i]), e);
        w = e > w ? e : w;
    }
    free(x), free(y);
    return w;
}

TestSuite(cmath, .init = setup, .fini = teardown);

Test(cmath, expf_within_2_ulp_and_vectors_give_the_same_bits)
{
    Fn f = (Fn)sym("test_exp");
    LoopFn loop = (LoopFn)sym("test_exp_loop");
    double w = worst(f, loop, exp, -103.9, 88.72, 200000);
    w = fmax(w, worst(f, loop, exp, -1.0, 1.0, 100000));
    w = fmax(w, worst(f, loop, exp, -0.35, 0.35, 100000)); /* n = 0, r = x */
    w = fmax(w, worst(f, loop, exp, -103.9, -87.0, 50000)); /* subnormal results */
    cr_log_info("tcc_expf: worst %.2f ulp", w);
}

Test(cmath, tanhf_within_2_ulp_and_vectors_give_the_same_bits)
{
    Fn f = (Fn)sym("test_tanh");
    LoopFn loop = (LoopFn)sym("test_tanh_loop");
    double w = worst(f, loop, tanh, -10.0, 10.0, 200000);
    w = fmax(w, worst(f, loop, tanh, -0.7, 0.7, 100000));   /* both sides of 0.625 */
    w = fmax(w, worst(f, loop, tanh, -1e-3, 1e-3, 50000)); /* the polynomial, small x */
    cr_log_info("tcc_tanhf: worst %.2f ulp", w);
}

Test(cmath, edge_cases_are_exact)
{
    Fn e = (Fn)sym("test_exp"), t = (Fn)sym("test_tanh");
    cr_assert_eq(e(0.0f), 1.0f);
    cr_assert_eq(e(-0.0f), 1.0f);
    cr_assert(isinf(e(INFINITY)) && e(INFINITY) > 0);
    cr_assert_eq(e(-INFINITY), 0.0f);
    cr_assert(isnan(e(NAN)));
    cr_assert(isinf(e(88.8f)), "exp(88.8) overflows: %a", (double)e(88.8f));
    cr_assert(isfinite(e(88.72f)));
    cr_assert_eq(e(-200.0f), 0.0f);
    cr_assert_gt(e(-100.0f), 0.0f); /* a subnormal, not zero */
    float pz = t(0.0f), nz = t(-0.0f);
    cr_assert(pz == 0.0f && !signbit(pz) && nz == 0.0f && signbit(nz));
    cr_assert_eq(t(INFINITY), 1.0f);
    cr_assert_eq(t(-INFINITY), -1.0f);
    cr_assert_eq(t(30.0f), 1.0f);
    cr_assert(isnan(t(NAN)));
}
