/* test_bf16.c: the C rendering's bf16 storage. A plan whose one kernel casts
 * f32 to bf16 and back is built; its kernel source (the prelude with
 * tcc_bf2f / tcc_f2bf, and the generated kernels) is compiled to a shared
 * object with two small wrappers. Its rounding must equal rt_f32_to_bf16 bit
 * for bit: on edge cases (ties to even both ways, NaN, infinities, the largest
 * finite float, subnormals, signed zeros) and on random bit patterns. */
#define _XOPEN_SOURCE 700
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "runtime/runtime.h"
#include "tests/support/settings.h"
#include "tests/support/cload.h"
#include "tests/support/tmpdir.h"

#define N 4096

typedef uint16_t (*F2bf)(float);
typedef float (*Bf2f)(uint16_t);
typedef void (*KernelFn)(char *const *args);

static char dir[64];
static void *so;
static Plan plan;

static const char *src = "model t(N = 4096)\n"
                         "input x : f32[N]\n"
                         "y = cast(x, bf16)\n"
                         "output y\n";

static const char *wrappers = "\nuint16_t test_f2bf(float x) { return tcc_f2bf(x); }\n"
                              "float test_bf2f(uint16_t h) { return tcc_bf2f(h); }\n";

/* Build the plan, write its kernel source and the wrappers, compile, load. */
static void setup(void)
{
    tmpdir_make(dir, "bf16");
    Ctx *c = ctx_new(stderr);
    Graph *g = fe_compile(c, "t.tdl", src, strlen(src), NULL);
    cr_assert_not_null(g);
    cr_assert_eq(cg_build_plan(c, g, &ts_settings(c, g, 0)->train, 0, &plan), 0);
    cr_assert_gt(plan.nkernels, 0);
    so = cload(dir, plan.kernel_source, wrappers, "-std=c99 -O2 -fopenmp -Wall -Werror");
}

static void teardown(void)
{
    if (so)
        dlclose(so);
    tmpdir_remove(dir);
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void check_round(F2bf f2bf, uint32_t u)
{
    float x = float_of(u);
    uint16_t got = f2bf(x), want = rt_f32_to_bf16(x);
    cr_assert_eq(got, want, "bits 0x%08x (%g): tcc_f2bf 0x%04x, rt_f32_to_bf16 0x%04x", u,
                 (double)x, got, want);
}

TestSuite(bf16, .init = setup, .fini = teardown);

Test(bf16, prelude_rounding_matches_the_runtime_on_edge_cases)
{
    F2bf f2bf = (F2bf)(uintptr_t)dlsym(so, "test_f2bf");
    cr_assert_not_null(f2bf);
    static const uint32_t edge[] = {
        0x3f808000,                         /* 1 + 2^-8: a tie, the kept bit even: down to 0x3f80 */
        0x3f818000,                         /* a tie with the kept bit odd: up to 0x3f82 */
        0x3f808001,                         /* just above a tie: up */
        0x3f807fff,                         /* just below a tie: down */
        0x7f7fffff,                         /* the largest finite float: rounds up to infinity */
        0x7f7f7fff,                         /* the largest that stays finite */
        0x7f800000, 0xff800000,             /* +-inf */
        0x7fc00000, 0xffc00001, 0x7f800001, /* quiet, negative, signalling NaNs */
        0x7fffffff,                         /* NaN whose rounding would carry */
        0x00000001, 0x00008000, 0x00018000, /* subnormals: the smallest, ties */
        0x007fffff, 0x80000001,             /* the largest subnormal; a negative one */
        0x00000000, 0x80000000,             /* signed zeros */
        0x3f800000, 0xbf800000, 0x40490fdb, /* 1, -1, pi */
    };
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        check_round(f2bf, edge[i]);
    cr_assert_eq(f2bf(float_of(0x3f808000)), 0x3f80);
    cr_assert_eq(f2bf(float_of(0x3f818000)), 0x3f82);
    cr_assert_eq(f2bf(float_of(0x7f7fffff)), 0x7f80);
    uint16_t nan = f2bf(float_of(0x7f800001));
    cr_assert((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0, "NaN stays NaN: 0x%04x", nan);
}

Test(bf16, prelude_rounding_matches_the_runtime_on_random_bits)
{
    F2bf f2bf = (F2bf)(uintptr_t)dlsym(so, "test_f2bf");
    Bf2f bf2f = (Bf2f)(uintptr_t)dlsym(so, "test_bf2f");
    cr_assert(f2bf && bf2f);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        check_round(f2bf, (uint32_t)(s >> 32));
    }
    for (uint32_t h = 0; h < 0x10000; h++) { /* widening is exact: every pattern */
        float a = bf2f((uint16_t)h), b = rt_bf16_to_f32((uint16_t)h);
        cr_assert(memcmp(&a, &b, 4) == 0, "bf16 0x%04x widens differently", h);
    }
}

/* The generated cast kernel stores through tcc_f2bf: its output is the
 * runtime's rounding of every input, random values over many binades. */
Test(bf16, generated_cast_kernel_rounds_as_the_runtime)
{
    KernelFn fn = NULL;
    int out = -1;
    for (int i = 0; i < plan.nkernels && !fn; i++)
        fn = (KernelFn)(uintptr_t)dlsym(so, plan.kernels[i].name);
    cr_assert_not_null(fn);
    out = strstr(plan.kernel_source, "uint16_t *restrict a0") ? 0 : 1;
    float *x = malloc(sizeof(float) * N);
    uint16_t *y = malloc(sizeof(uint16_t) * N);
    cr_assert(x && y);
    srand(7);
    for (int i = 0; i < N; i++)
        x[i] = (float)((rand() / (double)RAND_MAX - 0.5) * ldexp(1.0, rand() % 60 - 30));
    char *args[2];
    args[out] = (char *)y;
    args[1 - out] = (char *)x;
    fn(args);
    for (int i = 0; i < N; i++)
        cr_assert_eq(y[i], rt_f32_to_bf16(x[i]), "element %d (%g): 0x%04x, want 0x%04x", i,
                     (double)x[i], y[i], rt_f32_to_bf16(x[i]));
    free(x);
    free(y);
}
