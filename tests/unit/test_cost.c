/* test_cost.c: the cost model's formulas (model/cost_model.c, docs/cost.md) on
 * hand-made plans: a collective's time by ring and tree over the link its
 * group crosses (the mesh numbered row-major, the last axis innermost), a
 * GEMM's time from its FLOPs, shape and dtype, a memory-bound kernel's from
 * its bytes, and a cluster file's keys and errors. Each expected value is
 * computed here from the formula, independently of the code's arithmetic
 * order (1e-12 relative). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "plan/plan.h"

#define REL(a, b) (fabs((a) - (b)) <= 1e-12 * fabs(b))

static PlanAxis axes[2] = {{"dp", "data", 4, 0}, {"tp", "tensor", 8, 0}}; /* 32 devices, tp inner */
static PlanTensor tensors[4];
static Plan plan;

static void setup(void)
{
    memset(&plan, 0, sizeof plan);
    memset(tensors, 0, sizeof tensors);
    plan.naxes = 2, plan.axes = axes;
    plan.ntensors = 4, plan.tensors = tensors;
    tensors[0] = (PlanTensor){.dtype = PD_F32, .bytes = 1 << 26};  /* 64 MiB */
    tensors[1] = (PlanTensor){.dtype = PD_F32, .bytes = 1 << 26};
    tensors[2] = (PlanTensor){.dtype = PD_BF16, .bytes = 4096 * 4096 * 2};
    tensors[3] = (PlanTensor){.dtype = PD_F32, .bytes = 1 << 28}; /* a gathered output */
}

static CostDevice device(void)
{
    CostDevice d;
    cost_device_of_cluster(dev_cluster_lookup("dgx-a100"), &d);
    return d;
}

static PlanInstr coll(PlanCollKind op, int axis, int out)
{
    static int args[2];
    args[0] = 0, args[1] = out;
    PlanInstr in = {.kind = PI_COLL, .nargs = 2, .args = args};
    in.coll.op = op, in.coll.naxes = 1, in.coll.axes[0] = (int8_t)axis;
    return in;
}

TestSuite(cost, .init = setup);

Test(cost, all_reduce_inside_a_node_takes_nvlink)
{
    CostDevice d = device();
    PlanInstr in = coll(PC_ALL_REDUCE, 1, 1); /* tp: 8 neighbours */
    double S = 1 << 26, W = 300e9 * d.k.link_eff, l = 2e-6, n = 8;
    double ring = 2 * (n - 1) / n * S / W + 2 * (n - 1) * l, tree = 2 * S / W + 2 * 3 * l;
    cr_assert(REL(cost_coll_time(&plan, &d, &in), fmin(ring, tree)), "%g vs %g",
              cost_coll_time(&plan, &d, &in), fmin(ring, tree));
}

Test(cost, all_reduce_across_nodes_takes_the_network)
{
    CostDevice d = device();
    PlanInstr in = coll(PC_ALL_REDUCE, 0, 1); /* dp: stride 8, four nodes */
    double S = 1 << 26, W = 25e9 * d.k.link_eff, l = 6e-6, n = 4;
    double ring = 2 * (n - 1) / n * S / W + 2 * (n - 1) * l, tree = 2 * S / W + 2 * 2 * l;
    cr_assert(REL(cost_coll_time(&plan, &d, &in), fmin(ring, tree)));
    /* the same group with dp innermost stays in a node */
    PlanAxis swapped[2] = {{"tp", "tensor", 8, 0}, {"dp", "data", 4, 0}};
    plan.axes = swapped;
    in = coll(PC_ALL_REDUCE, 1, 1);
    W = 300e9 * d.k.link_eff, l = 2e-6;
    ring = 2 * (n - 1) / n * S / W + 2 * (n - 1) * l, tree = 2 * S / W + 2 * 2 * l;
    cr_assert(REL(cost_coll_time(&plan, &d, &in), fmin(ring, tree)));
    /* and so does it placed innermost by the plan's strides, in the first order of the axes */
    PlanAxis placed[2] = {{"dp", "data", 4, 1}, {"tp", "tensor", 8, 4}};
    plan.axes = placed;
    in = coll(PC_ALL_REDUCE, 0, 1);
    cr_assert(REL(cost_coll_time(&plan, &d, &in), fmin(ring, tree)));
    plan.axes = axes;
}

Test(cost, gather_scatter_and_messages)
{
    CostDevice d = device();
    double W = 300e9 * d.k.link_eff, l = 2e-6;
    PlanInstr in = coll(PC_ALL_GATHER, 1, 3); /* S: the output, 256 MiB */
    cr_assert(REL(cost_coll_time(&plan, &d, &in), 7.0 / 8 * (1 << 28) / W + 7 * l));
    in = coll(PC_REDUCE_SCATTER, 1, 1); /* S: the input */
    cr_assert(REL(cost_coll_time(&plan, &d, &in), 7.0 / 8 * (1 << 26) / W + 7 * l));
    in = coll(PC_SEND, 0, 1);
    in.nargs = 1;
    cr_assert(REL(cost_coll_time(&plan, &d, &in), (1 << 26) / (25e9 * d.k.link_eff) + 6e-6));
    PlanAxis one[2] = {{"dp", "data", 1, 0}, {"tp", "tensor", 1, 0}};
    plan.axes = one;
    in = coll(PC_ALL_REDUCE, 1, 1);
    cr_assert_eq(cost_coll_time(&plan, &d, &in), 0, "a group of one moves nothing");
    plan.axes = axes;
}

Test(cost, gemm_time_from_flops_shape_and_dtype)
{
    CostDevice d = device();
    int64_t m = 4096, n = 4096, k = 4096;
    PlanInstr in = {.kind = PI_GEMM, .flops = 2.0 * m * n * k};
    in.gemm = (PlanGemm){.a = 2, .b = 2, .c = 2, .m = m, .n = n, .k = k, .batch = 1};
    double e = d.k.gemm_eff * pow(4096.0 / (4096 + d.k.gemm_dim), 3);
    double want = 2.0 * m * n * k / (312e12 * e) + d.k.launch_s;
    cr_assert(REL(cost_compute_time(&plan, &d, &in), want), "%g vs %g",
              cost_compute_time(&plan, &d, &in), want);
    tensors[2].dtype = PD_F32; /* f32 operands: the f32 peak, 16x slower on an A100 */
    cr_assert(cost_compute_time(&plan, &d, &in) > 10 * want);
    /* a thin GEMM (n = 8) is memory-bound or pays for its shape */
    tensors[2].dtype = PD_BF16;
    in.gemm.n = 8, in.flops = 2.0 * m * 8 * k;
    double thin = cost_compute_time(&plan, &d, &in);
    cr_assert(thin > in.flops / (312e12 * d.k.gemm_eff), "a thin GEMM is not at full rate");
}

Test(cost, memory_bound_kernel_time_from_bytes)
{
    CostDevice d = device();
    int args[2] = {0, 1};
    PlanInstr in = {.kind = PI_KERNEL, .nargs = 2, .args = args};
    double want = 2.0 * (1 << 26) / (2039e9 * d.k.mem_eff) + d.k.launch_s;
    cr_assert(REL(cost_compute_time(&plan, &d, &in), want));
}

static const char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/tcc-cluster-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

Test(cost, cluster_file_keys_act_and_errors_are_located)
{
    Arena *a = arena_new();
    ClusterSpec c;
    char err[256];
    const char *p = write_tmp("# four per node\ngpu = h100-sxm\ngpus_per_node = 4\n"
                              "network_gbs = 12.5 # slower\ngemm_efficiency = 0.5\nlaunch_us = 10\n");
    cr_assert_eq(dev_cluster_read(a, p, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.gpu, dev_lookup("h100-sxm"));
    cr_assert_eq(c.gpus_per_node, 4);
    cr_assert_eq(c.network_gbs, 12.5);
    cr_assert_eq(c.nvlink_gbs, 450, "the rest from the GPU's own cluster");
    cr_assert_eq(c.k.gemm_eff, 0.5);
    cr_assert(REL(c.k.launch_s, 10e-6));
    static const struct { const char *text, *msg; } bad[] = {
        {"gpus_per_node = 4\n", ":1: the first setting must be gpu"},
        {"gpu = h100-sxm\nnvlink_gbs = fast\n", ":2: expected a positive number"},
        {"gpu = h100-sxm\n\nmemory_efficiency = 1.5\n", ":3: an efficiency is a fraction"},
        {"gpu = tpu\n", ":1: unknown gpu"},
        {"gpu = h100-sxm\ngpu = a100-80gb\n", ":2: gpu given twice"},
        {"gpu = h100-sxm\nbandwidth = 3\n", ":2: unknown key"},
        {"gpu = h100-sxm\ngpus_per_node = 2.5\n", ":2: gpus_per_node: expected a whole number"},
        {"# nothing\n", "no gpu = NAME line"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = write_tmp(bad[i].text);
        cr_assert_eq(dev_cluster_read(a, p, &c, err, sizeof err), -1, "%s", bad[i].text);
        cr_assert(strstr(err, bad[i].msg), "'%s' lacks '%s'", err, bad[i].msg);
    }
    cr_assert_eq(dev_cluster_read(a, "/nonexistent/cluster", &c, err, sizeof err), -1);
    cr_assert(strstr(err, "cannot read"));
    remove(p);
    arena_free(a);
}

Test(cost, cluster_file_values_too_small_are_refused)
{
    Arena *a = arena_new();
    ClusterSpec c;
    char err[256];
    const char *p = write_tmp("gpu = a100-80gb\nnvlink_gbs = 1e-300\n");
    cr_assert_eq(dev_cluster_read(a, p, &c, err, sizeof err), -1);
    cr_assert(strstr(err, ":2: too small"), "%s", err);
    remove(p);
    arena_free(a);
}

/* ---- the CPU (model/cpu_cost.c): devices that share the cores ---- */

static CpuSpec cpu_spec(void)
{
    CpuSpec s = {.given = (1u << CPU_NKEYS) - 1, .what = "a test machine"};
    double v[CPU_NKEYS] = {[CPU_CORES] = 2,    [CPU_GEMM1] = 100,  [CPU_CONVERT] = 1.5,
                           [CPU_OP] = 0.25,    [CPU_CHAIN] = 1,    [CPU_DIV] = 2,
                           [CPU_CALL] = 4,     [CPU_TANH] = 16,    [CPU_STREAM] = 10,
                           [CPU_SPEEDUP] = 1.5, [CPU_FORK] = 8,    [CPU_MEMORY] = 16,
                           [CPU_VOP] = 0.05,   [CPU_LOOP_SPEEDUP] = 1.25,
                           [CPU_STREAM_PAR] = 15, [CPU_CHAIN64] = 0.4};
    memcpy(s.v, v, sizeof v);
    return s;
}

Test(cost, cpu_devices_share_the_cores)
{
    CpuSpec s = cpu_spec();
    CostDevice d;
    static const struct { int devices, threads; double share; } want[] = {
        {1, 2, 1}, {2, 1, 1}, {3, 1, 2.0 / 3}, {4, 1, 0.5}, {32, 1, 1.0 / 16},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cost_device_of_cpu(&s, want[i].devices, &d);
        cr_assert(d.cpu, "collectives block on the CPU");
        cr_assert_eq(d.threads, want[i].threads, "%d devices", want[i].devices);
        cr_assert(REL(d.share, want[i].share), "%d devices: share %g", want[i].devices, d.share);
    }
}

static CostDevice cpu_device(CpuSpec *s, int devices)
{
    CostDevice d;
    cost_device_of_cpu(s, devices, &d);
    return d;
}

Test(cost, cpu_kernel_time_from_its_work_and_bytes)
{
    CpuSpec s = cpu_spec();
    CostDevice one = cpu_device(&s, 1), four = cpu_device(&s, 4);
    int args[2] = {0, 1};
    PlanInstr in = {.kind = PI_KERNEL, .kernel = 0, .nargs = 2, .args = args};
    in.work = (PlanWork){.ops = 1e6, .chain = 1e5, .divs = 1e4, .calls = 1e3, .tanh = 1e2};
    double work = (1e6 * 0.25 + 1e5 * 1 + 1e4 * 2 + 1e3 * 4 + 1e2 * 16) * 1e-9;
    double bytes = 2.0 * (1 << 26);
    /* one device: its loop on both threads, 1.25 times one; the bytes at both
     * threads' bandwidth (15 GB/s); a parallel region's wake-up */
    double want = work / 1.25 + bytes / 15e9 + 8e-6;
    cr_assert(REL(cost_cpu_compute_time(&plan, &one, &in), want), "%g vs %g",
              cost_cpu_compute_time(&plan, &one, &in), want);
    cr_assert(REL(cost_compute_time(&plan, &one, &in), want), "the model's entry takes it");
    /* four devices on two cores: one thread each, at half a core; the two
     * cores' bandwidth shared by the four */
    cr_assert(REL(cost_cpu_compute_time(&plan, &four, &in), work / 0.5 + bytes / (15e9 / 4)));
    /* a loop that runs on one thread (its if clause) gains nothing from the
     * second, and streams at one thread's bandwidth */
    in.work.serial = 1;
    cr_assert(REL(cost_cpu_compute_time(&plan, &one, &in), work + bytes / 10e9));
    /* chains 64 long or shorter cost their measured step (0.4 ns), longer ones
     * the difference to one long chain (1 ns) scaled by 64 / length */
    static const struct { double len, ns; } chains[] = {{32, 0.4}, {64, 0.4}, {128, 0.7}, {0, 1}};
    for (size_t i = 0; i < sizeof chains / sizeof chains[0]; i++) {
        in.work.chain_len = chains[i].len;
        double w = work + 1e5 * (chains[i].ns - 1) * 1e-9;
        cr_assert(REL(cost_cpu_compute_time(&plan, &one, &in), w + bytes / 10e9), "length %g",
                  chains[i].len);
    }
}

Test(cost, cpu_gemm_time_from_the_sgemm_rate)
{
    CpuSpec s = cpu_spec();
    CostDevice one = cpu_device(&s, 1), four = cpu_device(&s, 4);
    tensors[2].dtype = PD_F32;
    PlanInstr in = {.kind = PI_GEMM};
    in.gemm = (PlanGemm){.a = 2, .b = 2, .c = 2, .m = 512, .n = 512, .k = 512, .batch = 1};
    double F = 2.0 * 512 * 512 * 512;
    double want = F / (100e9 * 1.5) + 8e-6;
    cr_assert(REL(cost_cpu_compute_time(&plan, &one, &in), want), "%g vs %g",
              cost_cpu_compute_time(&plan, &one, &in), want);
    cr_assert(REL(cost_cpu_compute_time(&plan, &four, &in), F / (100e9 * 0.5)),
              "one thread at half a core");
    /* on 8 cores measured at 3 times one, a device of 4 threads: 1 + 3 (3 - 1) / 7 */
    s.v[CPU_CORES] = 8, s.v[CPU_SPEEDUP] = 3;
    CostDevice half = cpu_device(&s, 2);
    cr_assert_eq(half.threads, 4);
    cr_assert(REL(cost_cpu_compute_time(&plan, &half, &in), F / (100e9 * (1 + 3 * 2.0 / 7)) + 8e-6));
    s = cpu_spec();
    /* bf16: A and B widened an element at a time, C rounded back; at half a core */
    tensors[2].dtype = PD_BF16;
    double elems = 4096.0 * 4096, c = 512.0 * 512;
    cr_assert(REL(cost_cpu_compute_time(&plan, &four, &in),
                  F / (100e9 * 0.5) + (2 * elems + c) * 1.5e-9 / 0.5));
}

Test(cost, cpu_collectives_copy_between_the_members)
{
    CpuSpec s = cpu_spec();
    CostDevice d = cpu_device(&s, 32); /* the test plan's 32 devices on 2 cores */
    double S = 1 << 26, n = 8, bw = 15e9 / 32; /* both cores' bandwidth, shared by 32 */
    PlanInstr in = coll(PC_ALL_REDUCE, 1, 1); /* tp: 8 members */
    double copied = 2 * S + S / n, summed = (n - 1) * S / n;
    cr_assert(REL(cost_coll_time(&plan, &d, &in), (2 * copied + summed) / bw + 3 * 8e-6), "%g",
              cost_coll_time(&plan, &d, &in));
    in = coll(PC_ALL_GATHER, 1, 3); /* 256 MiB out */
    cr_assert(REL(cost_coll_time(&plan, &d, &in), 2.0 * (1 << 28) / bw + 2 * 8e-6));
    PlanAxis one[2] = {{"dp", "data", 1, 0}, {"tp", "tensor", 1, 0}};
    plan.axes = one;
    in = coll(PC_ALL_REDUCE, 1, 1);
    cr_assert_eq(cost_coll_time(&plan, &d, &in), 0, "a group of one copies nothing");
    plan.axes = axes;
}

Test(cost, cpu_file_round_trip_and_errors_are_located)
{
    Arena *a = arena_new();
    CpuSpec s = cpu_spec(), back;
    char err[256], path[64];
    snprintf(path, sizeof path, "/tmp/tcc-cpu-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    cpu_spec_write(f, &s);
    fclose(f);
    cr_assert_eq(cpu_spec_read(a, path, &back, err, sizeof err), 0, "%s", err);
    cr_assert_eq(back.given, s.given, "every key written is read");
    for (int k = 0; k < CPU_NKEYS; k++)
        cr_assert_eq(back.v[k], s.v[k], "%s", cpu_spec_key((CpuKey)k));
    cr_assert_str_eq(back.what, s.what);
    const char *p = write_tmp("# two cores\ngpu = cpu\ncores = 2 # of four\n");
    cr_assert_eq(cpu_spec_read(a, p, &back, err, sizeof err), 0, "%s", err);
    cr_assert_eq(back.given, 1u << CPU_CORES, "the rest is measured");
    cr_assert_eq(back.v[CPU_CORES], 2);
    p = write_tmp("gpu = h100-sxm\n");
    cr_assert_eq(cpu_spec_read(a, p, &back, err, sizeof err), 1, "a cluster of GPUs");
    static const struct { const char *text, *msg; } bad[] = {
        {"gpu = cpu\nop_ns = fast\n", ":2: expected a positive number"},
        {"gpu = cpu\ncores = 1.5\n", ":2: cores: expected a whole number"},
        {"gpu = cpu\n\nparallel_speedup = 0.5\n", ":3: parallel_speedup: expected at least 1"},
        {"gpu = cpu\nloop_speedup = 0.9\n", ":2: loop_speedup: expected at least 1"},
        {"gpu = cpu\ngpu = cpu\n", ":2: gpu given twice"},
        {"gpu = cpu\nflops = 3\n", ":2: unknown key"},
        {"gpu = cpu\nop_ns\n", ":2: expected KEY = VALUE"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = write_tmp(bad[i].text);
        cr_assert_eq(cpu_spec_read(a, p, &back, err, sizeof err), -1, "%s", bad[i].text);
        cr_assert(strstr(err, bad[i].msg), "'%s' lacks '%s'", err, bad[i].msg);
        cr_assert(!strncmp(err, p, strlen(p)), "'%s' names the file", err);
    }
    remove(p);
    remove(path);
    arena_free(a);
}
