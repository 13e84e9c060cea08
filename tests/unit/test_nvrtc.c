/* test_nvrtc.c: CUDA C -> cubin with NVRTC (runtime/gpu/nvrtc.c), which needs
 * no GPU: kernels compiled for sm_80 and sm_90 with ptxas' report read back
 * (registers, shared memory, barriers, spills forced by --maxrregcount), the
 * disk cache (a hit is byte-identical, a corrupt file is compiled again, the
 * architecture and the options are part of the key), refusals with their
 * message (a bad or unsupported architecture, a syntax error), and the log
 * parsers on hand-written logs; ./tccnvrtc on plans built here by hand (the
 * plan path: its kernels are checked against ptxas' report). Without the CUDA
 * toolkit the suite skips. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/command.h"
#include "tests/support/tmpdir.h"

#ifdef TCC_HAVE_CUDA
#include "runtime/gpu/nvrtc.h"
#include "plan/plan.h"

static char dir[64];

static void make_dir(void)
{
    tmpdir_make(dir, "nvrtc");
}

static void remove_dir(void)
{
    tmpdir_remove(dir);
}

TestSuite(nvrtc, .init = make_dir, .fini = remove_dir);

/* A block of 256 threads reverses 256 floats through shared memory (1024
 * bytes, one barrier) and scales them. */
static const char *REVERSE = "extern \"C\" __global__ void tcc_reverse(float *y, const float *x,\n"
                             "                                         float s)\n"
                             "{\n"
                             "    __shared__ float t[256];\n"
                             "    int i = blockIdx.x * 256 + threadIdx.x;\n"
                             "    t[threadIdx.x] = x[i];\n"
                             "    __syncthreads();\n"
                             "    y[i] = s * t[255 - threadIdx.x];\n"
                             "}\n";

/* 64 accumulators live across a loop: 72 registers unbounded, so a limit of 32
 * registers per thread must spill. */
static const char *SPILL = "extern \"C\" __global__ void tcc_spill(float *out, const float *in,\n"
                           "                                       int n)\n"
                           "{\n"
                           "    float acc[64];\n"
                           "#pragma unroll\n"
                           "    for (int j = 0; j < 64; j++)\n"
                           "        acc[j] = in[j * n + threadIdx.x];\n"
                           "    for (int it = 0; it < n; it++) {\n"
                           "#pragma unroll\n"
                           "        for (int j = 0; j < 64; j++)\n"
                           "            acc[j] = acc[j] * acc[(j + 1) & 63] + in[it];\n"
                           "    }\n"
                           "    float s = 0;\n"
                           "#pragma unroll\n"
                           "    for (int j = 0; j < 64; j++)\n"
                           "        s += acc[j];\n"
                           "    out[threadIdx.x] = s;\n"
                           "}\n";

static const RtKernelUse *the_kernel(const RtCubin *c, RtKernelUse **use)
{
    int n = rt_nvrtc_usage(c->log, use);
    cr_assert_eq(n, 1, "one kernel in the log, not %d:\n%s", n, c->log);
    return &(*use)[0];
}

static void assert_elf(const RtCubin *c)
{
    cr_assert_not_null(c->image);
    cr_assert_gt(c->size, 64);
    cr_assert_eq(memcmp(c->image, "\177ELF", 4), 0, "a cubin is an ELF image");
}

/* ---- compiling ---- */

Test(nvrtc, compiles_for_sm80_and_sm90_with_its_usage)
{
    const char *archs[] = {"sm_80", "sm_90"};
    for (int a = 0; a < 2; a++) {
        RtCubin c;
        RtKernelUse *use;
        char err[512] = "";
        cr_assert_eq(rt_nvrtc_compile(REVERSE, archs[a], NULL, &c, err, sizeof err), 0, "%s: %s",
                     archs[a], err);
        assert_elf(&c);
        cr_assert_eq(c.from_cache, 0);
        cr_assert(strstr(c.log, archs[a]), "ptxas compiled for %s:\n%s", archs[a], c.log);
        const RtKernelUse *u = the_kernel(&c, &use);
        cr_assert_str_eq(u->name, "tcc_reverse");
        cr_assert(u->regs > 0 && u->regs <= 255, "%s: %d registers", archs[a], u->regs);
        cr_assert_eq(u->smem, 1024, "%s: 256 floats of shared memory, not %ld", archs[a], u->smem);
        cr_assert_eq(u->barriers, 1, "%s: one __syncthreads barrier", archs[a]);
        cr_assert_eq(u->spill_stores + u->spill_loads + u->stack, 0);
        cr_assert_eq(u->is_function, 0);
        free(use);
        rt_cubin_free(&c);
        cr_assert_null(c.image, "rt_cubin_free clears");
    }
}

Test(nvrtc, maxrregcount_forces_spills_that_the_report_shows)
{
    const char *limit[] = {"--maxrregcount=32"};
    RtCubin free_c, tight;
    RtKernelUse *u1, *u2;
    char err[512] = "";
    cr_assert_eq(rt_nvrtc_compile(SPILL, "sm_80", NULL, &free_c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rt_nvrtc_compile_with(SPILL, "sm_80", limit, 1, NULL, &tight, err, sizeof err), 0,
                 "%s", err);
    const RtKernelUse *a = the_kernel(&free_c, &u1), *b = the_kernel(&tight, &u2);
    cr_assert_eq(a->spill_stores + a->spill_loads, 0, "no limit, no spill:\n%s", free_c.log);
    cr_assert_gt(a->regs, 32, "the kernel needs more than 32 registers unbounded");
    cr_assert_eq(b->regs, 32, "the limit holds:\n%s", tight.log);
    cr_assert(b->spill_stores > 0 && b->spill_loads > 0 && b->stack > 0, "32 registers spill:\n%s",
              tight.log);
    free(u1), free(u2);
    rt_cubin_free(&free_c), rt_cubin_free(&tight);
}

/* The cubins in the cache folder: how many, and the path of the last. */
static int cached_files(char *path, size_t n)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int count = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, "nv-", 3) && strstr(e->d_name, ".cubin")) {
            snprintf(path, n, "%s/%s", dir, e->d_name);
            count++;
        }
    closedir(d);
    return count;
}

Test(nvrtc, second_compile_comes_from_the_cache_byte_identical)
{
    RtCubin first, again;
    char err[512] = "", path[256];
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_90", dir, &first, err, sizeof err), 0, "%s", err);
    cr_assert_eq(first.from_cache, 0);
    cr_assert_eq(cached_files(path, sizeof path), 1);
    cr_assert(strstr(path, "-sm_90.cubin"), "%s", path);
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_90", dir, &again, err, sizeof err), 0, "%s", err);
    cr_assert_eq(again.from_cache, 1);
    cr_assert_eq(again.size, first.size);
    cr_assert_eq(memcmp(again.image, first.image, first.size), 0, "the cached cubin is the same");
    cr_assert_str_eq(again.log, "", "a cached cubin comes without a log");
    rt_cubin_free(&first), rt_cubin_free(&again);
}

Test(nvrtc, architecture_options_and_source_are_in_the_cache_key)
{
    const char *limit[] = {"--maxrregcount=64"};
    RtCubin c;
    char err[512] = "", path[256];
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_80", dir, &c, err, sizeof err), 0, "%s", err);
    rt_cubin_free(&c);
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_90", dir, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.from_cache, 0, "another architecture compiles");
    rt_cubin_free(&c);
    cr_assert_eq(rt_nvrtc_compile_with(REVERSE, "sm_80", limit, 1, dir, &c, err, sizeof err), 0);
    cr_assert_eq(c.from_cache, 0, "another option compiles");
    rt_cubin_free(&c);
    char *edited = strdup(REVERSE);
    *strstr(edited, "255") = '1'; /* t[155 - threadIdx.x] */
    cr_assert_eq(rt_nvrtc_compile(edited, "sm_80", dir, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.from_cache, 0, "another source compiles");
    rt_cubin_free(&c);
    free(edited);
    cr_assert_eq(cached_files(path, sizeof path), 4);
}

Test(nvrtc, corrupt_cache_file_is_compiled_again)
{
    RtCubin first, c;
    char err[512] = "", path[256];
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_80", dir, &first, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cached_files(path, sizeof path), 1);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs("not a cubin at all", f);
    fclose(f);
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_80", dir, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.from_cache, 0, "a corrupt file is not loaded");
    assert_elf(&c);
    cr_assert_eq(c.size, first.size);
    cr_assert_eq(memcmp(c.image, first.image, c.size), 0);
    rt_cubin_free(&c);
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_80", dir, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.from_cache, 1, "the compile repaired the cache file");
    rt_cubin_free(&c), rt_cubin_free(&first);
}

Test(nvrtc, cache_file_cut_short_is_compiled_again)
{
    RtCubin first, c;
    char err[512] = "", path[256];
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_90", dir, &first, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cached_files(path, sizeof path), 1);
    cr_assert_eq(truncate(path, (off_t)first.size / 2), 0);
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_90", dir, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.from_cache, 0, "half a cubin (its ELF header whole) is not loaded");
    cr_assert_eq(c.size, first.size);
    cr_assert_eq(memcmp(c.image, first.image, c.size), 0);
    rt_cubin_free(&c), rt_cubin_free(&first);
}

/* ---- refusals ---- */

Test(nvrtc, bad_architecture_is_refused_with_a_message)
{
    RtCubin c;
    char err[512] = "";
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "compute_80", NULL, &c, err, sizeof err), -1);
    cr_assert_str_eq(err, "nvrtc: \"compute_80\" is not an architecture (sm_80, sm_90, ...)");
    cr_assert_null(c.image);
    cr_assert_null(c.log);
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_70", NULL, &c, err, sizeof err), -1);
    cr_assert(strstr(err, "does not compile for sm_70 (it does for ") && strstr(err, " sm_80 ") &&
                  strstr(err, " sm_90"),
              "%s", err);
    cr_assert_null(c.image);
    const char *many[17] = {0};
    cr_assert_eq(rt_nvrtc_compile_with(REVERSE, "sm_80", many, 17, NULL, &c, err, sizeof err), -1);
    cr_assert_str_eq(err, "nvrtc: 17 extra options (at most 16)");
}

Test(nvrtc, syntax_error_returns_the_error_line)
{
    const char *bad = "extern \"C\" __global__ void tcc_bad(float *a)\n"
                      "{\n"
                      "    a[threadIdx.x] = 1.0f\n"
                      "}\n";
    RtCubin c;
    char err[512] = "";
    cr_assert_eq(rt_nvrtc_compile(bad, "sm_80", dir, &c, err, sizeof err), -1);
    cr_assert_str_eq(err, "nvrtc (sm_80): NVRTC_ERROR_COMPILATION: " RT_NVRTC_PROGRAM
                          "(4): error: expected a \";\"");
    cr_assert_null(c.image);
    char path[256];
    cr_assert_eq(cached_files(path, sizeof path), 0, "nothing cached");
}

/* ---- the log parsers ---- */

/* ptxas -v of two kernels (one with static shared memory, one spilling, whose
 * name has "warning" in it) and a device function that was not inlined, whose
 * frame line must not overwrite its caller's. */
static const char *LOG =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'k_rows' for 'sm_80'\n"
    "ptxas info    : Function properties for k_rows\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 30 registers, used 1 barriers, 2048 bytes smem, 380 bytes cmem[0]\n"
    "ptxas info    : Compile time = 2.079 ms\n"
    "ptxas info    : Compiling entry function 'warning_k' for 'sm_80'\n"
    "ptxas info    : Function properties for warning_k\n"
    "ptxas         .     304 bytes stack frame, 588 bytes spill stores, 612 bytes spill loads\n"
    "ptxas info    : Used 24 registers, used 0 barriers, 304 bytes cumulative stack size, "
    "372 bytes cmem[0]\n"
    "ptxas info    : Compile time = 20.552 ms\n"
    "ptxas info    : Function properties for _Z6helperPfi\n"
    "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n";

Test(nvrtc, usage_reads_a_hand_written_log)
{
    RtKernelUse *u;
    int n = rt_nvrtc_usage(LOG, &u);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(u[0].name, "k_rows");
    cr_assert(u[0].regs == 30 && u[0].barriers == 1 && u[0].smem == 2048 && u[0].cmem == 380);
    cr_assert(u[0].stack == 0 && u[0].spill_stores == 0 && u[0].spill_loads == 0);
    cr_assert_str_eq(u[1].name, "warning_k");
    cr_assert(u[1].regs == 24 && u[1].barriers == 0 && u[1].smem == 0 && u[1].cmem == 372);
    cr_assert(u[1].stack == 304 && u[1].spill_stores == 588 && u[1].spill_loads == 612,
              "the kernel keeps its own frame line, not the device function's");
    cr_assert_str_eq(u[2].name, "_Z6helperPfi");
    cr_assert(u[2].is_function && !u[0].is_function && !u[1].is_function);
    cr_assert(u[2].stack == 16 && u[2].spill_stores == 8 && u[2].spill_loads == 4);
    free(u);
    cr_assert_eq(rt_nvrtc_usage("", &u), 0);
    free(u);
}

Test(nvrtc, warnings_finds_nvrtc_and_ptxas_warnings_only)
{
    const char *log = "k.cu(2): warning #177-D: variable \"x\" was declared but never referenced\n"
                      "      int x;\n"
                      "Remark: The warnings can be suppressed with \"-diag-suppress <number>\"\n"
                      "ptxas warning : For profile sm_80 adjusting per thread register count\n";
    char *w = rt_nvrtc_warnings(log);
    cr_assert_str_eq(w, "k.cu(2): warning #177-D: variable \"x\" was declared but never "
                        "referenced\nptxas warning : For profile sm_80 adjusting per thread "
                        "register count\n");
    free(w);
    w = rt_nvrtc_warnings(LOG);
    cr_assert_str_eq(w, "", "a kernel named warning_k is no warning");
    free(w);
}

Test(nvrtc, unreferenced_variable_draws_a_real_warning)
{
    const char *src = "extern \"C\" __global__ void tcc_warn(float *a)\n"
                      "{\n"
                      "    int unused;\n"
                      "    a[threadIdx.x] = 1.0f;\n"
                      "}\n";
    RtCubin c;
    char err[512] = "";
    cr_assert_eq(rt_nvrtc_compile(src, "sm_90", NULL, &c, err, sizeof err), 0, "%s", err);
    char *w = rt_nvrtc_warnings(c.log);
    cr_assert_str_eq(w,
                     RT_NVRTC_PROGRAM "(3): warning #177-D: variable \"unused\" was declared "
                                      "but never referenced\n",
                     "log:\n%s", c.log);
    free(w);
    rt_cubin_free(&c);
    cr_assert_eq(rt_nvrtc_compile(REVERSE, "sm_90", NULL, &c, err, sizeof err), 0, "%s", err);
    w = rt_nvrtc_warnings(c.log);
    cr_assert_str_eq(w, "", "a clean kernel has none:\n%s", c.log);
    free(w);
    rt_cubin_free(&c);
}

/* ---- ./tccnvrtc on a plan ---- */

/* DIR/plan.json: y = 2 x over 256 floats, one kernel "k_twice" launched as one
 * block of `block` threads, with gpu_source as given. */
static void write_plan_block(const char *gpu_source, int block)
{
    Plan p = {.version = PLAN_VERSION, .loss = -1, .lr = -1, .grad_norm = -1};
    PlanTensor t[2] = {{0}};
    for (int i = 0; i < 2; i++)
        t[i] = (PlanTensor){.name = i ? "" : "x",
                            .dtype = PD_F32,
                            .rank = 1,
                            .shape = {256},
                            .offset = 1024 * (uint64_t)i,
                            .bytes = 1024,
                            .role = i ? PT_TEMP : PT_INPUT,
                            .init = "",
                            .layer = -1,
                            .value = i,
                            .stage = -1};
    PlanKernel k = {.name = "k_twice", .nargs = 2, .grid = 1, .block = block};
    PlanInstr in = {.kind = PI_KERNEL, .nargs = 2, .args = (int[]){1, 0}, .layer = -1};
    p.model = "twice", p.slab_bytes = 2048, p.ntensors = 2, p.tensors = t;
    p.ninstrs = 1, p.instrs = &in, p.nkernels = 1, p.kernels = &k;
    p.kernel_source = "void k_twice(char *const *a) { float *y = (float *)a[0]; "
                      "const float *x = (const float *)a[1]; for (int i = 0; i < 256; i++) "
                      "y[i] = 2 * x[i]; }\n";
    p.gpu_source = (char *)gpu_source;
    char path[128], err[512] = "";
    snprintf(path, sizeof path, "%s/plan.json", dir);
    cr_assert_eq(plan_write(path, &p, err, sizeof err), 0, "%s", err);
}

static void write_plan(const char *gpu_source)
{
    write_plan_block(gpu_source, 256);
}

/* Run ./tccnvrtc with args; its exit status, stdout and stderr in out. */
static int tccnvrtc(const char *args, char *out, size_t size)
{
    char cmd[512];
    cr_assert_eq(access("./tccnvrtc", X_OK), 0, "./tccnvrtc is not built");
    snprintf(cmd, sizeof cmd, "./tccnvrtc %s 2>&1", args);
    return run_command(cmd, out, size);
}

static const char *TWICE = "extern \"C\" __global__ void k_twice(float *__restrict__ a0,\n"
                           "                                   const float *__restrict__ a1)\n"
                           "{\n"
                           "    a0[threadIdx.x] = 2.0f * a1[threadIdx.x];\n"
                           "}\n";

Test(nvrtc, tccnvrtc_reports_every_kernel_of_a_plan)
{
    char out[8192], args[256], report[128];
    write_plan(TWICE);
    snprintf(report, sizeof report, "%s/report.txt", dir);
    snprintf(args, sizeof args, "--report=%s %s", report, dir);
    cr_assert_eq(tccnvrtc(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "# NVRTC ") && strstr(out, "resource report of plan "), "%s", out);
    cr_assert(strstr(out, "(model twice, 1 kernel), for sm_80, sm_90\n"), "%s", out);
    const char *row80 = strstr(out, "\nk_twice  sm_80  "),
               *row90 = strstr(out, "\nk_twice  sm_90  ");
    cr_assert(row80 && row90 && row80 < row90, "one row per architecture:\n%s", out);
    cr_assert(strstr(out, "total sm_80: 1 kernel, at most "), "%s", out);
    cr_assert(strstr(out, "tccnvrtc: 1 kernel x 2 architectures, ") &&
                  strstr(out, "every kernel compiled, no warnings, no spills\n"),
              "%s", out);
    FILE *f = fopen(report, "r");
    cr_assert_not_null(f, "--report wrote no file");
    char text[8192];
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    cr_assert(strstr(text, "\nk_twice  sm_90  "), "%s", text);
    cr_assert_eq(strncmp(out, text, strlen(text)), 0, "the file is the report printed:\n%s", text);
}

Test(nvrtc, tccnvrtc_fails_on_a_plan_without_cuda_or_a_missing_kernel)
{
    char out[8192];
    write_plan("");
    cr_assert_eq(tccnvrtc(dir, out, sizeof out), 1);
    cr_assert(strstr(out, "tccnvrtc: error: ") && strstr(out, "/plan.json: the plan has no CUDA "
                                                              "kernels"),
              "%s", out);
    char *other = strdup(TWICE);
    memcpy(strstr(other, "k_twice"), "k_other", 7);
    write_plan(other);
    free(other);
    cr_assert_eq(tccnvrtc(dir, out, sizeof out), 1);
    cr_assert(strstr(out, "tccnvrtc: error: kernel 'k_twice' of the plan was not compiled for "
                          "sm_80: ptxas did not report it"),
              "%s", out);
    cr_assert(strstr(out, "was not compiled for sm_90"), "%s", out);
    cr_assert(strstr(out, "\nk_twice  sm_80   (not compiled)\n"), "%s", out);
    cr_assert(strstr(out, "FAILED, 2 problems"), "%s", out);
}

Test(nvrtc, tccnvrtc_names_the_kernel_of_a_compile_error_in_a_plan)
{
    char out[8192], *bad = strdup(TWICE);
    *strstr(bad, ";") = ' ';
    write_plan(bad);
    free(bad);
    cr_assert_eq(tccnvrtc(dir, out, sizeof out), 1);
    cr_assert(strstr(out, "/plan.json:gpu_source:5: error: expected a \";\" (kernel 'k_twice', "
                          "sm_80)"),
              "%s", out);
    cr_assert(strstr(out, "total sm_90: did not compile"), "%s", out);
}

/* SPILL's 72 registers (rounded to 2304 a warp) for 32 warps are 73728 of a
 * block's 65536: the launch would fail. 16 warps (36864) fit. */
Test(nvrtc, tccnvrtc_refuses_a_launch_with_more_registers_than_a_block_has)
{
    char out[8192], *heavy = strdup(SPILL);
    memcpy(strstr(heavy, "tcc_spill"), "k_twice__", 9);
    char *pad = strstr(heavy, "k_twice__");
    memmove(pad + 7, pad + 9, strlen(pad + 9) + 1);
    write_plan_block(heavy, 1024);
    cr_assert_eq(tccnvrtc(dir, out, sizeof out), 1, "%s", out);
    /* 72 registers with this NVRTC: more would need more; 64 or less would fit. */
    cr_assert(strstr(out, "tccnvrtc: error: kernel 'k_twice' cannot be launched with 1024 threads "
                          "a block on sm_80: ") &&
                  strstr(out, "registers, a block has 65536\n"),
              "%s", out);
    write_plan_block(heavy, 512);
    cr_assert_eq(tccnvrtc(dir, out, sizeof out), 0, "%s", out);
    free(heavy);
}

#else

Test(nvrtc, skipped_without_the_cuda_toolkit)
{
    cr_skip_test("built without the CUDA toolkit (CUDA_HOME)");
}

#endif
