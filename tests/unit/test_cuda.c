/* test_cuda.c: the cuda device as far as a machine without a GPU takes it
 * (runtime/gpu/cuda.c through runtime.h): the device count fails with the
 * CUDA runtime's own reason on one line, opening a plan on the cuda device
 * fails with one line that says why (no device; a plan whose kernels have no
 * CUDA rendering), and the CPU device of the same library still runs the
 * plan. On a machine with a GPU the no-device tests skip. The ASan build links
 * cudart, cuBLASLt, NVRTC and NCCL: these runs also check that loading them
 * leaves the sanitizers quiet. */
#define _XOPEN_SOURCE 700 /* nftw, for tmpdir.h */
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "tests/support/tmpdir.h"

static char dir[64];

static void make_dir(void)
{
    tmpdir_make(dir, "cuda");
}

static void remove_dir(void)
{
    tmpdir_remove(dir);
}

TestSuite(cuda, .init = make_dir, .fini = remove_dir);

/* c[2,2] = a[2,2] @ b[2,2], then with_kernel: one kernel on c (C source only). */
static Plan *gemm_plan(int with_kernel)
{
    Plan *p = calloc(1, sizeof *p);
    p->version = PLAN_VERSION;
    p->model = strdup("cuda");
    p->kernel_source = strdup(with_kernel ? "void k_neg(char *const *a)\n"
                                            "{ float *c = (float *)a[0];\n"
                                            "  for (int i = 0; i < 4; i++) c[i] = -c[i]; }\n"
                                          : "");
    p->gpu_source = strdup("");
    p->loss = p->lr = p->grad_norm = -1;
    p->ntensors = 3;
    p->tensors = calloc(3, sizeof *p->tensors);
    const char *names[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        PlanTensor *t = &p->tensors[i];
        *t = (PlanTensor){.name = strdup(names[i]),
                          .dtype = PD_F32,
                          .rank = 2,
                          .shape = {2, 2},
                          .offset = (uint64_t)i * PLAN_ALIGN,
                          .bytes = 16,
                          .role = i < 2 ? PT_INPUT : PT_TEMP,
                          .init = strdup(""),
                          .layer = -1,
                          .value = -1,
                          .stage = -1};
    }
    p->slab_bytes = 3 * PLAN_ALIGN;
    p->ninstrs = with_kernel ? 2 : 1;
    p->instrs = calloc(2, sizeof *p->instrs);
    p->instrs[0] = (PlanInstr){.kind = PI_GEMM, .layer = -1};
    p->instrs[0].gemm = (PlanGemm){.a = 0,
                                   .b = 1,
                                   .c = 2,
                                   .m = 2,
                                   .n = 2,
                                   .k = 2,
                                   .lda = 2,
                                   .ldb = 2,
                                   .ldc = 2,
                                   .batch = 1,
                                   .alpha = 1};
    if (with_kernel) {
        p->nkernels = 1;
        p->kernels = calloc(1, sizeof *p->kernels);
        p->kernels[0] = (PlanKernel){strdup("k_neg"), 1, 0, 1, 32};
        p->instrs[1] = (PlanInstr){.kind = PI_KERNEL, .kernel = 0, .nargs = 1, .layer = -1};
        p->instrs[1].args = calloc(1, sizeof(int));
        p->instrs[1].args[0] = 2;
    }
    return p;
}

static void skip_with_gpu(void)
{
    char err[512] = "";
    if (rt_cuda_devices(err, sizeof err) > 0)
        cr_skip_test("this machine has a CUDA device");
}

Test(cuda, device_count_says_why_there_is_none)
{
    char err[512] = "";
    skip_with_gpu();
    cr_assert_eq(rt_cuda_devices(err, sizeof err), 0);
    cr_assert(!strncmp(err, "cudaGetDeviceCount: ", 20) || !strcmp(err, "built without CUDA"), "%s",
              err);
    cr_assert(strlen(err) > 20 && !strchr(err, '\n'), "not one line of reason: '%s'", err);
}

Test(cuda, open_without_a_device_fails_on_one_line)
{
    char err[512] = "";
    skip_with_gpu();
    Plan *p = gemm_plan(0);
    Runtime *rt = rt_open_device(p, NULL, RT_CUDA, NULL, err, sizeof err);
    cr_assert_null(rt);
    cr_assert(!strncmp(err, "no CUDA device found (", 22) && err[strlen(err) - 1] == ')', "%s",
              err);
    cr_assert(!strchr(err, '\n'), "%s", err);
    plan_free(p);
}

Test(cuda, open_a_plan_without_cuda_kernels_is_refused)
{
    char err[512] = "";
    Plan *p = gemm_plan(1);
    Runtime *rt = rt_open_device(p, NULL, RT_CUDA, NULL, err, sizeof err);
    cr_assert_null(rt);
    cr_assert_str_eq(err, "the plan has no CUDA kernels: rebuild it with a tcc that renders them");
    plan_free(p);
}

/* TCC_PROFILE is taken on the cuda device too (each instruction waited
 * for): asking for it changes nothing of why the device will not open here,
 * and no profile is written. */
Test(cuda, instruction_times_ask_nothing_of_a_machine_without_a_gpu)
{
    char err[512] = "", plain[512] = "";
    Plan *p = gemm_plan(0);
    Runtime *rt = rt_open_device(p, NULL, RT_CUDA, NULL, plain, sizeof plain);
    cr_assert_null(rt);
    setenv("TCC_PROFILE", "/tmp/tcc-profile-never-written", 1);
    rt = rt_open_device(p, NULL, RT_CUDA, NULL, err, sizeof err);
    unsetenv("TCC_PROFILE");
    cr_assert_null(rt);
    cr_assert_str_eq(err, plain);
    cr_assert_eq(access("/tmp/tcc-profile-never-written", F_OK), -1, "nothing written");
    plan_free(p);
}

/* The same plan on the CPU device of the same library: c = -(a @ b). */
Test(cuda, the_cpu_device_still_runs_the_plan)
{
    char err[512] = "";
    Plan *p = gemm_plan(1);
    Runtime *rt = rt_open_device(p, NULL, RT_CPU, dir, err, sizeof err);
    cr_assert_not_null(rt, "%s", err);
    cr_assert_str_eq(rt_device_name(rt), "cpu");
    float a[4] = {1.5f, -2, 0.25f, 3}, b[4] = {-1, 0.5f, 2, 4};
    cr_assert_eq(rt_set_input(rt, "a", a, sizeof a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rt_set_input(rt, "b", b, sizeof b, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rt_step(rt, 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rt_sync_host(rt, err, sizeof err), 0, "%s", err);
    const float *c = rt_tensor_data(rt, 2);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) { /* products of small binary fractions: exact */
            double ref = -((double)a[i * 2] * b[j] + (double)a[i * 2 + 1] * b[2 + j]);
            cr_assert_eq(c[i * 2 + j], (float)ref, "c[%d][%d] = %g, want %g", i, j, c[i * 2 + j],
                         ref);
        }
    rt_close(rt);
    plan_free(p);
}
