/* test_cost.c: the cost model's formulas (passes/cost.c, docs/cost.md) on
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

#include "passes/passes.h"
#include "runtime/plan.h"

#define REL(a, b) (fabs((a) - (b)) <= 1e-12 * fabs(b))

static PlanAxis axes[2] = {{"dp", "data", 4}, {"tp", "tensor", 8}}; /* 32 devices, tp inner */
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
    cost_device_of_cluster(pass_cluster_lookup("dgx-a100"), &d);
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
    PlanAxis swapped[2] = {{"tp", "tensor", 8}, {"dp", "data", 4}};
    plan.axes = swapped;
    in = coll(PC_ALL_REDUCE, 1, 1);
    W = 300e9 * d.k.link_eff, l = 2e-6;
    ring = 2 * (n - 1) / n * S / W + 2 * (n - 1) * l, tree = 2 * S / W + 2 * 2 * l;
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
    PlanAxis one[2] = {{"dp", "data", 1}, {"tp", "tensor", 1}};
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
    cr_assert_eq(pass_cluster_read(a, p, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.gpu, pass_device_lookup("h100-sxm"));
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
        cr_assert_eq(pass_cluster_read(a, p, &c, err, sizeof err), -1, "%s", bad[i].text);
        cr_assert(strstr(err, bad[i].msg), "'%s' lacks '%s'", err, bad[i].msg);
    }
    cr_assert_eq(pass_cluster_read(a, "/nonexistent/cluster", &c, err, sizeof err), -1);
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
    cr_assert_eq(pass_cluster_read(a, p, &c, err, sizeof err), -1);
    cr_assert(strstr(err, ":2: too small"), "%s", err);
    remove(p);
    arena_free(a);
}
