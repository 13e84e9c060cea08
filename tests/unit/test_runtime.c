/* test_runtime.c: the CPU runtime (runtime/exec.c, cpu.c, init.c) on plans
 * built here by hand: kernels written here and compiled by the runtime, GEMMs
 * checked against a float64 loop (every transpose, odd sizes, batches with
 * strides, alpha and beta), copies, inputs, initialisation, the kernel cache,
 * and a small least-squares model trained by SGD, also through ./tccrun.
 * Bounds: f64 GEMMs within 1e-12 relative (k <= 7 products); f32 within
 * 1e-5 (k * 2^-24 times the magnitudes, with room). */
#define _XOPEN_SOURCE 700 /* nftw */
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "tests/support/command.h"
#include "tests/support/tmpdir.h"

static char dir[64], cache[96];

static void make_dir(void)
{
    tmpdir_make(dir, "rt");
    snprintf(cache, sizeof cache, "%s/cache", dir);
}

static void remove_dir(void)
{
    tmpdir_remove(dir);
}

TestSuite(runtime, .init = make_dir, .fini = remove_dir);

/* ---- building plans ---- */

static Plan *new_plan(int ntensors, int ninstrs, int nkernels, const char *source)
{
    Plan *p = calloc(1, sizeof *p);
    p->version = PLAN_VERSION;
    p->model = strdup("test");
    p->ntensors = ntensors;
    p->tensors = calloc((size_t)ntensors, sizeof *p->tensors);
    p->ninstrs = ninstrs;
    p->instrs = calloc((size_t)ninstrs + 1, sizeof *p->instrs);
    p->nkernels = nkernels;
    p->kernels = calloc((size_t)nkernels + 1, sizeof *p->kernels);
    p->kernel_source = strdup(source ? source : "");
    p->loss = p->lr = p->grad_norm = -1;
    return p;
}

/* Tensor i after the previous ones in the slab (offsets aligned), or at offset `at`. */
static void tensor(Plan *p, int i, const char *name, PlanDType dt, PlanRole role, int rank,
                   const int64_t *shape)
{
    PlanTensor *t = &p->tensors[i];
    int64_t n = 1;
    t->name = strdup(name);
    t->init = strdup("");
    t->dtype = dt;
    t->role = role;
    t->rank = rank;
    for (int d = 0; d < rank; d++)
        n *= t->shape[d] = shape[d];
    t->bytes = (uint64_t)n * plan_dtype_size(dt);
    t->offset = p->slab_bytes;
    t->layer = t->value = -1;
    p->slab_bytes += (t->bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
}

static void param(Plan *p, int i, const char *name, PlanDType dt, int64_t n, const char *init,
                  double arg)
{
    tensor(p, i, name, dt, PT_PARAM, 1, &n);
    free(p->tensors[i].init);
    p->tensors[i].init = strdup(init);
    p->tensors[i].init_arg = arg;
}

static void kernel(Plan *p, int i, int k, const char *name, int nargs, const int *args)
{
    if (!p->kernels[k].name)
        p->kernels[k] = (PlanKernel){strdup(name), nargs, 0, 1, 256};
    p->instrs[i] = (PlanInstr){.kind = PI_KERNEL, .kernel = k, .nargs = nargs, .layer = -1};
    p->instrs[i].args = malloc(sizeof(int) * (size_t)nargs);
    memcpy(p->instrs[i].args, args, sizeof(int) * (size_t)nargs);
}

static Runtime *open_ok(const Plan *p)
{
    char err[1024] = "";
    Runtime *rt = rt_open(p, cache, err, sizeof err);
    cr_assert_not_null(rt, "%s", err);
    return rt;
}

static void step_ok(Runtime *rt, int64_t step)
{
    char err[512] = "";
    cr_assert_eq(rt_step(rt, step, err, sizeof err), 0, "%s", err);
}

/* ---- a kernel, a GEMM and a copy ---- */

static const char *SUM_SOURCE =
    "#include <stdint.h>\n"
    "/* loss = sum(y) + step */\n"
    "void k_sum(char *const *a)\n"
    "{\n"
    "    float *loss = (float *)a[0];\n"
    "    const float *y = (const float *)a[1], *step = (const float *)a[2];\n"
    "    float s = 0;\n"
    "    for (int i = 0; i < 15; i++)\n"
    "        s += y[i];\n"
    "    *loss = s + *step;\n"
    "}\n";

/* y[3,5] = x[3,4] @ w[4,5]; loss = sum(y) + step; keep = y. */
static Plan *small_plan(void)
{
    Plan *p = new_plan(6, 3, 1, SUM_SOURCE);
    tensor(p, 0, "w", PD_F32, PT_PARAM, 2, (int64_t[]){4, 5});
    free(p->tensors[0].init);
    p->tensors[0].init = strdup("ones");
    tensor(p, 1, "x", PD_F32, PT_INPUT, 2, (int64_t[]){3, 4});
    tensor(p, 2, "", PD_F32, PT_TEMP, 2, (int64_t[]){3, 5});
    tensor(p, 3, "loss", PD_F32, PT_TEMP, 0, NULL);
    tensor(p, 4, "step", PD_F32, PT_STEP, 0, NULL);
    tensor(p, 5, "keep", PD_F32, PT_TEMP, 2, (int64_t[]){3, 5});
    p->instrs[0] = (PlanInstr){.kind = PI_GEMM, .layer = -1};
    p->instrs[0].gemm = (PlanGemm){.a = 1,
                                   .b = 0,
                                   .c = 2,
                                   .m = 3,
                                   .n = 5,
                                   .k = 4,
                                   .lda = 4,
                                   .ldb = 5,
                                   .ldc = 5,
                                   .batch = 1,
                                   .alpha = 1};
    kernel(p, 1, 0, "k_sum", 3, (int[]){3, 2, 4});
    p->instrs[2] = (PlanInstr){.kind = PI_COPY, .nargs = 2, .layer = -1};
    p->instrs[2].args = malloc(2 * sizeof(int));
    p->instrs[2].args[0] = 5;
    p->instrs[2].args[1] = 2;
    p->loss = 3;
    return p;
}

Test(runtime, a_step_runs_the_gemm_the_kernel_and_the_copy)
{
    Plan *p = small_plan();
    Runtime *rt = open_ok(p);
    float x[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)(i + 1);
    rt_init_params(rt, 1);
    char err[256];
    cr_assert_eq(rt_set_input(rt, "x", x, sizeof x, err, sizeof err), 0, "%s", err);
    step_ok(rt, 7);
    const float *y = rt_tensor_data(rt, 2), *keep = rt_tensor_data(rt, 5);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 5; c++) {
            float want = x[4 * r] + x[4 * r + 1] + x[4 * r + 2] + x[4 * r + 3];
            cr_assert_eq(y[5 * r + c], want, "y[%d,%d] = %g, want %g", r, c, y[5 * r + c], want);
            cr_assert_eq(keep[5 * r + c], want);
        }
    cr_assert_eq(*(float *)rt_tensor_data(rt, 4), 7.0f, "the step tensor holds the step");
    cr_assert_eq(rt_scalar(rt, 3), 5 * 78.0 + 7, "loss = sum(y) + step");
    cr_assert(isnan(rt_scalar(rt, 2)), "a matrix is not a scalar");
    cr_assert(isnan(rt_scalar(rt, -1)));
    cr_assert_null(rt_tensor_data(rt, 6));
    cr_assert_eq(rt_find_tensor(p, "keep"), 5);
    cr_assert_eq(rt_find_tensor(p, "nope"), -1);
    cr_assert_eq(rt_plan(rt), p);
    rt_close(rt);
    plan_free(p);
}

Test(runtime, the_slab_is_aligned_and_zeroed)
{
    Plan *p = small_plan();
    Runtime *rt = open_ok(p);
    for (int t = 0; t < p->ntensors; t++) {
        cr_assert_eq((uintptr_t)rt_tensor_data(rt, t) % PLAN_ALIGN, 0);
        const unsigned char *b = rt_tensor_data(rt, t);
        for (uint64_t i = 0; i < p->tensors[t].bytes; i++)
            cr_assert_eq(b[i], 0);
    }
    rt_close(rt);
    plan_free(p);
}

/* ---- the kernel cache ---- */

static int count_files(const char *suffix)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c '%s$'", cache, suffix);
    FILE *f = popen(cmd, "r");
    int n = -1;
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%d", &n), 1);
    pclose(f);
    return n;
}

Test(runtime, kernels_are_compiled_once_and_reused_from_the_cache)
{
    Plan *p = small_plan();
    rt_close(open_ok(p));
    cr_assert_eq(count_files("\\.so"), 1);
    cr_assert_eq(count_files("\\.c"), 1);
    cr_assert_eq(setenv("CC", "/nonexistent/cc", 1), 0); /* a rebuild would fail */
    Runtime *rt = open_ok(p);
    step_ok(rt, 1);
    rt_close(rt);
    p->kernel_source[strlen(p->kernel_source) - 1] = ' '; /* new source: built again */
    char err[512] = "";
    cr_assert_null(rt_open(p, cache, err, sizeof err));
    cr_assert(strstr(err, "posix_spawnp /nonexistent/cc"), "%s", err);
    unsetenv("CC");
    rt_close(open_ok(p));
    cr_assert_eq(count_files("\\.so"), 2);
    plan_free(p);
}

Test(runtime, the_cache_folder_comes_from_tcc_cache)
{
    char where[160], so[512];
    snprintf(where, sizeof where, "%s/env/cache", dir);
    cr_assert_eq(setenv("TCC_CACHE", where, 1), 0);
    Plan *p = small_plan();
    char err[512] = "";
    Runtime *rt = rt_open(p, NULL, err, sizeof err);
    cr_assert_not_null(rt, "%s", err);
    char hash[17];
    plan_hash(p, hash);
    snprintf(so, sizeof so, "ls %s/k-%s-*.so >/dev/null", where, hash);
    cr_assert_eq(system(so), 0, "no object named by the plan hash in %s", where);
    rt_close(rt);
    plan_free(p);
}

Test(runtime, a_broken_cached_object_is_built_again)
{
    /* The name of the object: k-PLANHASH-FNV1A(SOURCE).so, with junk in it. */
    Plan *p = small_plan();
    char hash[17], path[256];
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *s = p->kernel_source; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    plan_hash(p, hash);
    cr_assert_eq(mkdir(cache, 0755), 0);
    snprintf(path, sizeof path, "%s/k-%s-%016llx.so", cache, hash, (unsigned long long)h);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("junk\n", f);
    fclose(f);
    Runtime *rt = open_ok(p);
    step_ok(rt, 1);
    rt_close(rt);
    plan_free(p);
}

Test(runtime, compile_errors_and_missing_symbols_are_reported)
{
    char err[1024] = "";
    Plan *p = small_plan();
    free(p->kernel_source);
    p->kernel_source = strdup("void k_sum(char *const *a) { this is not C; }\n");
    cr_assert_null(rt_open(p, cache, err, sizeof err));
    cr_assert(strstr(err, "compiling the kernels") && strstr(err, "error"), "%s", err);
    cr_assert(!strchr(err, '\n'), "%s", err);
    free(p->kernel_source);
    p->kernel_source = strdup("void k_other(char *const *a) { (void)a; }\n");
    cr_assert_null(rt_open(p, cache, err, sizeof err));
    cr_assert(strstr(err, "kernel \"k_sum\" not found in"), "%s", err);
    plan_free(p);
}

Test(runtime, a_plan_that_fails_its_check_is_not_opened)
{
    char err[512] = "";
    Plan *p = small_plan();
    p->tensors[2].offset = 8;
    cr_assert_null(rt_open(p, cache, err, sizeof err));
    cr_assert(strstr(err, "tensors[2].offset: 8 is not a multiple of 64"), "%s", err);
    plan_free(p);
}

/* ---- GEMM against a float64 loop ---- */

typedef struct GemmCase {
    int ta, tb;
    int64_t m, n, k, batch, pad, sa, sb, sc; /* pad: extra columns in every ld */
    double alpha, beta;
} GemmCase;

/* A[batch] rows x cols with ld = cols + pad and the given stride: elements needed. */
static int64_t extent(int64_t rows, int64_t cols, int64_t pad, int64_t stride, int64_t batch)
{
    return (batch - 1) * stride + (rows - 1) * (cols + pad) + cols;
}

static Plan *gemm_plan(const GemmCase *c, PlanDType dt)
{
    int64_t ra = c->ta ? c->k : c->m, ca = c->ta ? c->m : c->k;
    int64_t rb = c->tb ? c->n : c->k, cb = c->tb ? c->k : c->n;
    int64_t na = extent(ra, ca, c->pad, c->sa, c->batch);
    int64_t nb = extent(rb, cb, c->pad, c->sb, c->batch);
    int64_t nc = extent(c->m, c->n, c->pad, c->sc, c->batch);
    Plan *p = new_plan(3, 1, 0, NULL);
    tensor(p, 0, "a", dt, PT_INPUT, 1, &na);
    tensor(p, 1, "b", dt, PT_INPUT, 1, &nb);
    tensor(p, 2, "c", dt, PT_INPUT, 1, &nc);
    p->instrs[0] = (PlanInstr){.kind = PI_GEMM, .layer = -1};
    p->instrs[0].gemm = (PlanGemm){0,     1,     2,           c->ta,       c->tb,         c->m,
                                   c->n,  c->k,  ca + c->pad, cb + c->pad, c->n + c->pad, c->batch,
                                   c->sa, c->sb, c->sc,       c->alpha,    c->beta,       PE_NONE, 0};
    return p;
}

static double get(const void *base, PlanDType dt, int64_t i)
{
    if (dt == PD_BF16)
        return rt_bf16_to_f32(((const uint16_t *)base)[i]);
    return dt == PD_F32 ? ((const float *)base)[i] : ((const double *)base)[i];
}

/* C0 is C before the step; C after must be alpha op(A) op(B) + beta C0 in every batch member. */
static void check_gemm(Runtime *rt, const GemmCase *c, PlanDType dt, const double *c0)
{
    const PlanGemm *g = &rt_plan(rt)->instrs[0].gemm;
    const void *a = rt_tensor_data(rt, 0), *b = rt_tensor_data(rt, 1), *cc = rt_tensor_data(rt, 2);
    /* bf16: the f32 sum rounded once to 8 significant bits, at most 2^-8 of it */
    double tol = dt == PD_F32 ? 1e-5 : dt == PD_BF16 ? ldexp(1, -8) : 1e-12;
    for (int64_t q = 0; q < c->batch; q++)
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t j = 0; j < c->n; j++) {
                double s = 0;
                for (int64_t l = 0; l < c->k; l++) {
                    int64_t ia = q * c->sa + (c->ta ? l * g->lda + i : i * g->lda + l);
                    int64_t ib = q * c->sb + (c->tb ? j * g->ldb + l : l * g->ldb + j);
                    s += get(a, dt, ia) * get(b, dt, ib);
                }
                int64_t ic = q * c->sc + i * g->ldc + j;
                double want = c->alpha * s + c->beta * c0[ic], got = get(cc, dt, ic);
                cr_assert(fabs(got - want) <= tol * (1 + fabs(want)),
                          "%s ta=%d tb=%d batch %ld C[%ld,%ld] = %.17g, want %.17g",
                          plan_dtype_name(dt), c->ta, c->tb, (long)q, (long)i, (long)j, got, want);
            }
}

static void run_gemm(const GemmCase *c, PlanDType dt)
{
    Plan *p = gemm_plan(c, dt);
    Runtime *rt = open_ok(p);
    rt_random_inputs(rt, 5);
    int64_t nc = (int64_t)(p->tensors[2].bytes / plan_dtype_size(dt));
    double *c0 = malloc(sizeof(double) * (size_t)nc);
    for (int64_t i = 0; i < nc; i++)
        c0[i] = get(rt_tensor_data(rt, 2), dt, i);
    step_ok(rt, 1);
    check_gemm(rt, c, dt, c0);
    free(c0);
    rt_close(rt);
    plan_free(p);
}

Test(runtime, gemm_matches_a_float64_loop_for_every_transpose_and_dtype)
{
    for (int dt = PD_F32; dt <= PD_BF16; dt++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                GemmCase c = {ta, tb, 5, 3, 7, 1, 0, 0, 0, 0, 1, 0};
                run_gemm(&c, (PlanDType)dt);
            }
}

Test(runtime, gemm_batches_with_strides_padding_alpha_and_beta)
{
    for (int dt = PD_F32; dt <= PD_BF16; dt++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                /* A members 40 apart (gaps between them), B shared, C 19 apart. */
                GemmCase c = {ta, tb, 3, 5, 7, 2, 2, 40, 0, 3 * 7 + 19, 1.5, 0.5};
                run_gemm(&c, (PlanDType)dt);
            }
}

Test(runtime, gemm_on_f16_is_an_error_on_the_cpu)
{
    GemmCase c = {0, 0, 2, 2, 2, 1, 0, 0, 0, 0, 1, 0};
    Plan *p = gemm_plan(&c, PD_F16);
    Runtime *rt = open_ok(p);
    char err[256] = "";
    cr_assert_eq(rt_step(rt, 1, err, sizeof err), -1);
    cr_assert(strstr(err, "step 1, instrs[0] (gemm 2x2x2 f16): gemm on f16 tensors: the CPU backend does f32, f64 and bf16"),
              "%s", err);
    rt_close(rt);
    plan_free(p);
}

/* bf16 A[5,7] x B[7,3] + bias[3] into C of cdt: the sum accumulated in f32 (its
 * error at most 8 2^-24 of the sum of |terms|), the bias added, then, for a
 * bf16 C, one rounding (at most 2^-8 of the result). */
static void bias_case(PlanDType cdt)
{
    int64_t m = 5, n = 3, k = 7, na = m * k, nb = k * n, nc = m * n;
    Plan *p = new_plan(4, 1, 0, NULL);
    tensor(p, 0, "a", PD_BF16, PT_INPUT, 1, &na);
    tensor(p, 1, "b", PD_BF16, PT_INPUT, 1, &nb);
    tensor(p, 2, "c", cdt, PT_INPUT, 1, &nc);
    tensor(p, 3, "bias", cdt, PT_INPUT, 1, &n);
    p->instrs[0] = (PlanInstr){.kind = PI_GEMM, .layer = -1};
    p->instrs[0].gemm = (PlanGemm){0, 1, 2, 0, 0, m, n, k, k, n, n, 1, 0, 0, 0, 1, 0, PE_BIAS, 3};
    Runtime *rt = open_ok(p);
    rt_random_inputs(rt, 11);
    step_ok(rt, 1);
    const void *a = rt_tensor_data(rt, 0), *b = rt_tensor_data(rt, 1), *cc = rt_tensor_data(rt, 2);
    const void *bias = rt_tensor_data(rt, 3);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = get(bias, cdt, j), mag = fabs(s);
            for (int64_t l = 0; l < k; l++) {
                s += get(a, PD_BF16, i * k + l) * get(b, PD_BF16, l * n + j);
                mag += fabs(get(a, PD_BF16, i * k + l) * get(b, PD_BF16, l * n + j));
            }
            double got = get(cc, cdt, i * n + j), tol = ldexp(mag, -24) * (double)(k + 1);
            if (cdt == PD_BF16)
                tol += ldexp(fabs(s) + tol, -8);
            cr_assert(fabs(got - s) <= tol, "%s C[%ld,%ld] = %.9g, want %.9g", plan_dtype_name(cdt),
                      (long)i, (long)j, got, s);
        }
    rt_close(rt);
    plan_free(p);
}

Test(runtime, gemm_on_bf16_with_a_bias_into_bf16_or_f32)
{
    bias_case(PD_BF16);
    bias_case(PD_F32);
}

/* ---- inputs ---- */

static Plan *input_plan(void)
{
    Plan *p = new_plan(2, 0, 0, NULL);
    tensor(p, 0, "tok", PD_I32, PT_INPUT, 1, (int64_t[]){6});
    p->tensors[0].limit = 10;
    tensor(p, 1, "x", PD_F64, PT_INPUT, 2, (int64_t[]){100, 100});
    return p;
}

Test(runtime, set_input_checks_the_name_the_size_and_every_id)
{
    Plan *p = input_plan();
    Runtime *rt = open_ok(p);
    char err[256] = "";
    int32_t ok[6] = {0, 9, 3, 3, 1, 2}, bad[6] = {0, 9, 10, 3, -1, 2};
    cr_assert_eq(rt_set_input(rt, "tok", ok, sizeof ok, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(rt_tensor_data(rt, 0), ok, sizeof ok), 0);
    cr_assert_eq(rt_set_input(rt, "tok", bad, sizeof bad, err, sizeof err), -1);
    cr_assert_str_eq(err, "input \"tok\": element 2 is 10, outside [0, 10)");
    cr_assert_eq(memcmp(rt_tensor_data(rt, 0), ok, sizeof ok), 0, "nothing copied");
    bad[2] = 4;
    cr_assert_eq(rt_set_input(rt, "tok", bad, sizeof bad, err, sizeof err), -1);
    cr_assert_str_eq(err, "input \"tok\": element 4 is -1, outside [0, 10)");
    cr_assert_eq(rt_set_input(rt, "tok", ok, 5 * sizeof(int32_t), err, sizeof err), -1);
    cr_assert_str_eq(err, "input \"tok\": 20 bytes given, its i32 tensor takes 24");
    cr_assert_eq(rt_set_input(rt, "toks", ok, sizeof ok, err, sizeof err), -1);
    cr_assert_str_eq(err, "no input named \"toks\" in the plan");
    rt_close(rt);
    plan_free(p);
}

Test(runtime, random_inputs_are_ids_in_range_and_standard_normal_floats)
{
    Plan *p = input_plan();
    Runtime *rt = open_ok(p);
    rt_random_inputs(rt, 11);
    const int32_t *tok = rt_tensor_data(rt, 0);
    for (int i = 0; i < 6; i++)
        cr_assert(tok[i] >= 0 && tok[i] < 10, "tok[%d] = %d", i, tok[i]);
    const double *x = rt_tensor_data(rt, 1);
    double s = 0, ss = 0;
    for (int i = 0; i < 10000; i++)
        s += x[i], ss += x[i] * x[i];
    double mean = s / 10000, sd = sqrt(ss / 10000 - mean * mean);
    cr_assert(fabs(mean) < 0.05 && fabs(sd - 1) < 0.05, "mean %g, std %g", mean, sd);
    rt_close(rt);
    plan_free(p);
}

/* ---- initialisation ---- */

/* Parameters named a..e with every init, and a state tensor, in the given order. */
static Plan *init_plan(PlanDType dt, int reversed)
{
    Plan *p = new_plan(6, 0, 0, NULL);
    int at[6] = {0, 1, 2, 3, 4, 5};
    if (reversed)
        for (int i = 0; i < 6; i++)
            at[i] = 5 - i;
    tensor(p, at[5], "m", dt, PT_STATE, 1, (int64_t[]){100});
    param(p, at[0], "a", dt, 10000, "normal", 0.02);
    param(p, at[1], "b", dt, 1000, "uniform", 0.5);
    param(p, at[2], "c", dt, 7, "zeros", 0);
    param(p, at[3], "d", dt, 7, "ones", 0);
    param(p, at[4], "e", dt, 7, "constant", -2.5);
    return p;
}

static double value(Runtime *rt, const char *name, int64_t i)
{
    const Plan *p = rt_plan(rt);
    int t = rt_find_tensor(p, name);
    const void *b = rt_tensor_data(rt, t);
    switch (p->tensors[t].dtype) {
    case PD_F32:
        return ((const float *)b)[i];
    case PD_F64:
        return ((const double *)b)[i];
    case PD_BF16:
        return rt_bf16_to_f32(((const uint16_t *)b)[i]);
    default:
        return rt_f16_to_f32(((const uint16_t *)b)[i]);
    }
}

Test(runtime, init_follows_each_rule)
{
    for (int dt = PD_F32; dt <= PD_F16; dt++) {
        Plan *p = init_plan((PlanDType)dt, 0);
        Runtime *rt = open_ok(p);
        memset(rt_tensor_data(rt, 5), 0x5a, p->tensors[5].bytes);
        rt_init_params(rt, 3);
        double s = 0, ss = 0;
        for (int i = 0; i < 10000; i++)
            s += value(rt, "a", i), ss += value(rt, "a", i) * value(rt, "a", i);
        double mean = s / 10000, sd = sqrt(ss / 10000 - mean * mean);
        cr_assert(fabs(mean) < 0.05 * 0.02, "%s normal: mean %g", plan_dtype_name(dt), mean);
        cr_assert(fabs(sd - 0.02) < 0.05 * 0.02, "%s normal: std %g", plan_dtype_name(dt), sd);
        double lo = 1, hi = -1;
        for (int i = 0; i < 1000; i++)
            lo = fmin(lo, value(rt, "b", i)), hi = fmax(hi, value(rt, "b", i));
        cr_assert(lo >= -0.5 && hi <= 0.5 && lo < -0.45 && hi > 0.45, "uniform in [%g, %g]", lo,
                  hi);
        for (int i = 0; i < 7; i++) {
            cr_assert_eq(value(rt, "c", i), 0);
            cr_assert_eq(value(rt, "d", i), 1);
            cr_assert_eq(value(rt, "e", i), -2.5);
        }
        for (int i = 0; i < 100; i++)
            cr_assert_eq(value(rt, "m", i), 0, "state starts at zero");
        rt_close(rt);
        plan_free(p);
    }
}

static void init_bytes(PlanDType dt, int reversed, uint64_t seed, const char *name, void *out,
                       size_t size)
{
    Plan *p = init_plan(dt, reversed);
    Runtime *rt = open_ok(p);
    rt_init_params(rt, seed);
    int t = rt_find_tensor(p, name);
    memcpy(out, rt_tensor_data(rt, t), p->tensors[t].bytes < size ? p->tensors[t].bytes : size);
    rt_close(rt);
    plan_free(p);
}

Test(runtime, init_depends_on_the_seed_and_name_not_on_tensor_order)
{
    static float a[10000], b[10000];
    init_bytes(PD_F32, 0, 7, "a", a, sizeof a);
    init_bytes(PD_F32, 1, 7, "a", b, sizeof b);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "tensor order changed the values");
    init_bytes(PD_F32, 0, 7, "b", b, sizeof b);
    cr_assert_neq(memcmp(a, b, 1000 * sizeof(float)), 0, "two tensors got the same values");
    init_bytes(PD_F32, 0, 8, "a", b, sizeof b);
    cr_assert_neq(memcmp(a, b, sizeof a), 0, "the seed changed nothing");
    /* bf16 holds the f32 values rounded. */
    uint16_t h[10000];
    init_bytes(PD_BF16, 1, 7, "a", h, sizeof h);
    for (int i = 0; i < 10000; i++)
        cr_assert_eq(h[i], rt_f32_to_bf16(a[i]), "element %d", i);
}

Test(runtime, the_first_draws_are_fixed)
{
    /* The generator is part of the format (docs/plan.md), computed independently:
     * splitmix64 from fnv1a("a") ^ seed * golden, then Box-Muller. */
    float a[2];
    char got[64];
    init_bytes(PD_F32, 0, 1, "a", a, sizeof a);
    snprintf(got, sizeof got, "%.9g %.9g", a[0], a[1]);
    cr_assert_str_eq(got, "-0.0217160881 -0.0371557325");
}

/* ---- bf16 / f16 ---- */

static float f(uint32_t bits)
{
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

Test(runtime, bf16_rounds_to_nearest_even)
{
    cr_assert_eq(rt_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(rt_f32_to_bf16(f(0x3f808000)), 0x3f80, "a tie goes to the even neighbour");
    cr_assert_eq(rt_f32_to_bf16(f(0x3f818000)), 0x3f82, "a tie goes to the even neighbour");
    cr_assert_eq(rt_f32_to_bf16(f(0x3f808001)), 0x3f81);
    cr_assert_eq(rt_f32_to_bf16(-2.0f), 0xc000);
    cr_assert_eq(rt_f32_to_bf16(f(0x7f7fffff)), 0x7f80, "the largest float rounds to infinity");
    cr_assert(isnan(rt_bf16_to_f32(rt_f32_to_bf16(NAN))));
    cr_assert_eq(rt_bf16_to_f32(0x3fc0), 1.5f);
}

Test(runtime, f16_rounds_to_nearest_even_with_subnormals_and_overflow)
{
    cr_assert_eq(rt_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(rt_f32_to_f16(-2.0f), 0xc000);
    cr_assert_eq(rt_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(rt_f32_to_f16(65519.0f), 0x7bff);
    cr_assert_eq(rt_f32_to_f16(65520.0f), 0x7c00, "halfway to 65536 rounds to infinity");
    cr_assert_eq(rt_f32_to_f16(1.0f + 0x1p-11f), 0x3c00, "a tie goes to the even neighbour");
    cr_assert_eq(rt_f32_to_f16(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);
    cr_assert_eq(rt_f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02, "a tie goes to the even one");
    cr_assert_eq(rt_f32_to_f16(0x1p-24f), 0x0001, "the smallest subnormal");
    cr_assert_eq(rt_f32_to_f16(0x1p-25f), 0x0000, "a tie with zero goes to zero");
    cr_assert_eq(rt_f32_to_f16(0x1.8p-24f), 0x0002, "a tie goes to the even subnormal");
    cr_assert_eq(rt_f32_to_f16(0x1p-14f), 0x0400, "the smallest normal");
    cr_assert_eq(rt_f32_to_f16(0x1.ff8p-15f), 0x03ff, "the largest subnormal");
    cr_assert_eq(rt_f32_to_f16(0x1.ffcp-15f), 0x0400, "halfway to the smallest normal rounds up");
    cr_assert_eq(rt_f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(rt_f32_to_f16(INFINITY), 0x7c00);
    cr_assert(isnan(rt_f16_to_f32(rt_f32_to_f16(NAN))));
    /* Every f16 comes back from its f32 exactly. */
    for (uint32_t h = 0; h < 0x10000; h++)
        if ((h & 0x7c00) != 0x7c00 || !(h & 0x3ff))
            cr_assert_eq(rt_f32_to_f16(rt_f16_to_f32((uint16_t)h)), h, "f16 %04x", h);
}

/* ---- training: least squares by SGD ---- */

static const char *SGD_SOURCE =
    "/* r = 2 (pred - y) / N, loss = mean((pred - y)^2) */\n"
    "void k_residual(char *const *a)\n"
    "{\n"
    "    float *r = (float *)a[0], *loss = (float *)a[1];\n"
    "    const float *pred = (const float *)a[2], *y = (const float *)a[3];\n"
    "    float s = 0;\n"
    "    for (int i = 0; i < 16; i++) {\n"
    "        float d = pred[i] - y[i];\n"
    "        r[i] = 2 * d / 16;\n"
    "        s += d * d;\n"
    "    }\n"
    "    *loss = s / 16;\n"
    "}\n"
    "/* lr = 0.1 / sqrt(step); w -= lr g */\n"
    "#include <math.h>\n"
    "void k_sgd(char *const *a)\n"
    "{\n"
    "    float *w = (float *)a[0], *lr = (float *)a[3];\n"
    "    const float *g = (const float *)a[1], *step = (const float *)a[2];\n"
    "    *lr = 0.1f / sqrtf(*step);\n"
    "    #pragma omp parallel for\n"
    "    for (int i = 0; i < 3; i++)\n"
    "        w[i] -= *lr * g[i];\n"
    "}\n";

/* x[16,3], y[16,1] inputs; w[3,1] param. pred = x w; r, loss; g = x^T r; w -= lr g. */
static Plan *sgd_plan(void)
{
    Plan *p = new_plan(9, 4, 2, SGD_SOURCE);
    param(p, 0, "w", PD_F32, 3, "normal", 1);
    tensor(p, 1, "x", PD_F32, PT_INPUT, 2, (int64_t[]){16, 3});
    tensor(p, 2, "y", PD_F32, PT_INPUT, 2, (int64_t[]){16, 1});
    tensor(p, 3, "pred", PD_F32, PT_TEMP, 2, (int64_t[]){16, 1});
    tensor(p, 4, "r", PD_F32, PT_TEMP, 2, (int64_t[]){16, 1});
    tensor(p, 5, "loss", PD_F32, PT_TEMP, 0, NULL);
    tensor(p, 6, "g", PD_F32, PT_TEMP, 2, (int64_t[]){3, 1});
    tensor(p, 7, "step", PD_F32, PT_STEP, 0, NULL);
    tensor(p, 8, "lr", PD_F32, PT_TEMP, 0, NULL);
    p->instrs[0] = (PlanInstr){.kind = PI_GEMM, .layer = -1};
    p->instrs[0].gemm = (PlanGemm){.a = 1,
                                   .b = 0,
                                   .c = 3,
                                   .m = 16,
                                   .n = 1,
                                   .k = 3,
                                   .lda = 3,
                                   .ldb = 1,
                                   .ldc = 1,
                                   .batch = 1,
                                   .alpha = 1};
    kernel(p, 1, 0, "k_residual", 4, (int[]){4, 5, 3, 2});
    p->instrs[2] = (PlanInstr){.kind = PI_GEMM, .phase = 1, .layer = -1};
    p->instrs[2].gemm = (PlanGemm){.a = 1,
                                   .b = 4,
                                   .c = 6,
                                   .trans_a = 1,
                                   .m = 3,
                                   .n = 1,
                                   .k = 16,
                                   .lda = 3,
                                   .ldb = 1,
                                   .ldc = 1,
                                   .batch = 1,
                                   .alpha = 1};
    kernel(p, 3, 1, "k_sgd", 4, (int[]){0, 6, 7, 8});
    p->instrs[3].phase = 3;
    p->loss = 5;
    p->lr = 8;
    p->flops = 2 * (2.0 * 16 * 3);
    return p;
}

Test(runtime, sgd_on_least_squares_lowers_the_loss_every_step)
{
    Plan *p = sgd_plan();
    Runtime *rt = open_ok(p);
    rt_init_params(rt, 1);
    rt_random_inputs(rt, 1);
    double prev = INFINITY;
    for (int s = 1; s <= 20; s++) {
        step_ok(rt, s);
        double loss = rt_scalar(rt, p->loss);
        cr_assert(loss < prev, "step %d: loss %g after %g", s, loss, prev);
        cr_assert_float_eq(rt_scalar(rt, p->lr), 0.1 / sqrt(s), 1e-6);
        prev = loss;
    }
    rt_close(rt);
    plan_free(p);
}

/* ---- a step that stops before its update (runtime/guard.c) ---- */

Test(runtime, a_step_with_a_nan_loss_stops_before_its_update)
{
    char err[512] = "";
    Plan *p = sgd_plan();
    Runtime *rt = open_ok(p);
    rt_init_params(rt, 1);
    rt_random_inputs(rt, 1);
    cr_assert_eq(rt_step_holds_update(rt), 1, "the loss comes before the update kernel");
    float w[3], *x = rt_tensor_data(rt, 1), x0 = x[0];
    memcpy(w, rt_tensor_data(rt, 0), sizeof w);
    x[0] = NAN;
    cr_assert_eq(rt_step_begin(rt, 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rt_step_nonfinite(rt), RT_BAD_LOSS);
    cr_assert_eq(rt_step_end(rt, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(w, rt_tensor_data(rt, 0), sizeof w), 0, "the update was applied");
    x[0] = x0;
    cr_assert_eq(rt_step_begin(rt, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rt_step_nonfinite(rt), 0);
    cr_assert_eq(memcmp(w, rt_tensor_data(rt, 0), sizeof w), 0, "the first part updated");
    cr_assert_eq(rt_step_end(rt, 1, err, sizeof err), 0, "%s", err);
    cr_assert_neq(memcmp(w, rt_tensor_data(rt, 0), sizeof w), 0, "no update");
    rt_close(rt);
    plan_free(p);
}

Test(runtime, a_plan_whose_norm_comes_after_an_update_runs_whole_steps)
{
    char err[512] = "";
    Plan *p = sgd_plan();
    p->grad_norm = 8; /* lr: written by the update kernel itself */
    Runtime *rt = open_ok(p);
    rt_init_params(rt, 1);
    rt_random_inputs(rt, 1);
    cr_assert_eq(rt_step_holds_update(rt), 0);
    float w[3];
    memcpy(w, rt_tensor_data(rt, 0), sizeof w);
    cr_assert_eq(rt_step_begin(rt, 1, err, sizeof err), 0, "%s", err);
    cr_assert_neq(memcmp(w, rt_tensor_data(rt, 0), sizeof w), 0, "the first part is the step");
    cr_assert_eq(rt_step_end(rt, 1, err, sizeof err), 0, "%s", err);
    rt_close(rt);
    plan_free(p);
}

Test(runtime, the_nan_hook_is_refused_when_malformed_or_unknown)
{
    char err[512] = "";
    Plan *p = sgd_plan();
    free(p->tensors[6].name);
    p->tensors[6].name = strdup("w.grad");
    const char *bad[] = {"w", "0:w", "3-2:w", "1:v"};
    const char *says[] = {"expected STEP[-LAST]:PARAM, got 'w'", "expected", "expected",
                          "the plan names no gradient of 'v'"};
    for (int i = 0; i < 4; i++) {
        setenv("TCC_TEST_NAN_GRAD", bad[i], 1);
        Runtime *rt = rt_open(p, cache, err, sizeof err);
        cr_assert_null(rt, "%s accepted", bad[i]);
        cr_assert(strstr(err, says[i]), "%s: %s", bad[i], err);
    }
    setenv("TCC_TEST_NAN_GRAD", "2:w", 1);
    Runtime *rt = open_ok(p);
    unsetenv("TCC_TEST_NAN_GRAD");
    rt_init_params(rt, 1);
    rt_random_inputs(rt, 1);
    step_ok(rt, 1);
    cr_assert(isfinite(((float *)rt_tensor_data(rt, 0))[0]));
    step_ok(rt, 2); /* no norm in this plan: the NaN gradient reaches the update */
    cr_assert(isnan(((float *)rt_tensor_data(rt, 0))[0]));
    rt_close(rt);
    plan_free(p);
}

/* ---- tccrun ---- */

/* Run ./tccrun with args (TCC_CACHE set); its exit status, its output in out. */
static int tccrun(const char *args, char *out, size_t size)
{
    char cmd[512];
    cr_assert_eq(access("./tccrun", X_OK), 0, "./tccrun is not built");
    snprintf(cmd, sizeof cmd, "TCC_CACHE=%s ./tccrun %s 2>&1", cache, args);
    return run_command(cmd, out, size);
}

Test(runtime, tccrun_trains_a_plan_and_reports_each_step)
{
    char err[512] = "", path[160], args[256], out[8192];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    Plan *p = sgd_plan();
    cr_assert_eq(plan_write(path, p, err, sizeof err), 0, "%s", err);
    plan_free(p);
    snprintf(args, sizeof args, "%s --steps 12 --seed 4 --print-every 3", dir);
    cr_assert_eq(tccrun(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "step 3  loss ") && strstr(out, "  lr 0.0577  "), "%s", out);
    cr_assert(strstr(out, "step 12  loss ") && !strstr(out, "step 4 "), "%s", out);
    double first, last;
    const char *sum = strstr(out, "12 steps of test in ");
    cr_assert_not_null(sum, "%s", out);
    cr_assert_eq(sscanf(strstr(sum, ", loss ") + 7, "%lf -> %lf", &first, &last), 2, "%s", out);
    cr_assert_lt(last, first, "%s", out);
}

Test(runtime, tccrun_refuses_bad_arguments_and_bad_plans)
{
    char out[4096], args[256], path[160];
    cr_assert_eq(tccrun("--help", out, sizeof out), 0);
    cr_assert(strstr(out, "usage: tccrun DIR"), "%s", out);
    cr_assert_eq(tccrun("/nonexistent/dir", out, sizeof out), 1);
    cr_assert(strstr(out, "tccrun: /nonexistent/dir: No such file or directory"), "%s", out);
    snprintf(args, sizeof args, "%s --frobnicate", dir);
    cr_assert_eq(tccrun(args, out, sizeof out), 1);
    cr_assert(strstr(out, "tccrun: unknown option '--frobnicate'"), "%s", out);
    snprintf(args, sizeof args, "%s --steps ten", dir);
    cr_assert_eq(tccrun(args, out, sizeof out), 1);
    cr_assert(strstr(out, "--steps needs a whole number"), "%s", out);
    snprintf(path, sizeof path, "%s/plan.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"tcc-plan\", \"version\": 1, \"hash\"", f);
    fclose(f);
    cr_assert_eq(tccrun(dir, out, sizeof out), 1);
    cr_assert(strstr(out, "plan.json: unexpected end of file"), "%s", out);
}
