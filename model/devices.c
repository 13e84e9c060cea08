/* devices.c: the accelerators tcc plans for. Reads nothing; one table of
 * published datasheet figures that the memory model (the device's budget)
 * and the cost model share. Key idea: a device is named once, with the
 * figures its vendor publishes, and every model reads the same row.
 *
 * Sources (vendor datasheets): NVIDIA A100 Tensor Core GPU datasheet (2021):
 * 40 GB HBM2 1,555 GB/s, 80 GB HBM2e 2,039 GB/s (SXM), 312 TFLOP/s dense
 * BF16, 19.5 TFLOP/s FP32; NVIDIA H100 datasheet (2023), SXM5: 80 GB HBM3,
 * 3.35 TB/s, 989 TFLOP/s dense BF16 (1,979 with sparsity), 67 TFLOP/s FP32;
 * NVIDIA H200 datasheet (2024), SXM: 141 GB HBM3e, 4.8 TB/s, same compute as
 * H100 SXM. Memory is the total that nvidia-smi reports for the board
 * (A100 40GB: 40,960 MiB; A100 80GB: 81,920 MiB; H100 80GB: 81,559 MiB;
 * H200: 143,771 MiB): what a process can have before the CUDA context. */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

static const DeviceSpec devices[] = {
    {"a100-40gb", "NVIDIA A100 SXM4 40GB", 40960 * MIB, 312, 19.5, 1555},
    {"a100-80gb", "NVIDIA A100 SXM4 80GB", 81920 * MIB, 312, 19.5, 2039},
    {"h100-sxm", "NVIDIA H100 SXM5 80GB", 81559 * MIB, 989, 67, 3350},
    {"h100-pcie", "NVIDIA H100 PCIe 80GB", 81559 * MIB, 756, 51, 2000},
    {"h200-sxm", "NVIDIA H200 SXM 141GB", 143771 * MIB, 989, 67, 4800},
    {NULL, NULL, 0, 0, 0, 0},
};

const DeviceSpec *dev_lookup(const char *name)
{
    for (const DeviceSpec *d = devices; d->name; d++)
        if (!strcmp(d->name, name))
            return d;
    return NULL;
}

const DeviceSpec *dev_table(void) { return devices; }

/* ---- clusters ----
 * NVLink: NVIDIA DGX A100 user guide (2020): NVLink 3 through NVSwitch, 600
 * GB/s per GPU both directions, so 300 GB/s each way; eight 200 Gb/s HDR
 * InfiniBand cards for compute traffic, one per GPU: 25 GB/s each way.
 * H100 SXM servers (HGX H100, Grand Teton in Llama Team 2024 Sec. 3.3.1):
 * NVLink 4, 900 GB/s both directions (450 each way); 400 Gb/s RoCE per GPU
 * (50 GB/s). Latencies are the cost of one step of a ring (a message through
 * NCCL's protocol): about 2 us over NVLink and 6 us across the network on
 * both systems (docs/cost.md says how they were chosen). */

/* The fitted fractions of the peaks (docs/cost.md): large GEMMs 0.74 of the
 * dense peak, a GEMM dimension d keeping d / (d + 96) of that, attention
 * kernels 0.20, memory-bound kernels 0.65 of HBM, collectives 0.80 of a
 * link, 3 us a launch. */
#define GPU_CONSTS {0.74, 96, 0.20, 0.65, 0.80, 3e-6}

static const ClusterSpec clusters[] = {
    {"dgx-a100", "NVIDIA DGX A100 (8 A100 80GB, NVSwitch, 8x200 Gb/s HDR InfiniBand)",
     &devices[1], 8, 300, 25, 2, 6, GPU_CONSTS},
    {"dgx-a100-40gb", "NVIDIA DGX A100 (8 A100 40GB, NVSwitch, 8x200 Gb/s HDR InfiniBand)",
     &devices[0], 8, 300, 25, 2, 6, GPU_CONSTS},
    {"h100-roce", "H100 SXM servers (8 GPUs, NVLink 4, 400 Gb/s RoCE per GPU)", &devices[2], 8,
     450, 50, 2, 6, GPU_CONSTS},
    {"h100-pcie-ib", "H100 PCIe servers (8 GPUs, NVLink bridges in pairs, 400 Gb/s per GPU)",
     &devices[3], 8, 64, 50, 3, 6, GPU_CONSTS},
    {"h200-roce", "H200 SXM servers (8 GPUs, NVLink 4, 400 Gb/s RoCE per GPU)", &devices[4], 8,
     450, 50, 2, 6, GPU_CONSTS},
    {NULL, NULL, NULL, 0, 0, 0, 0, 0, {0, 0, 0, 0, 0, 0}},
};

const ClusterSpec *dev_cluster_lookup(const char *name)
{
    for (const ClusterSpec *c = clusters; c->name; c++)
        if (!strcmp(c->name, name))
            return c;
    return NULL;
}

const ClusterSpec *dev_cluster_default(const DeviceSpec *gpu)
{
    for (const ClusterSpec *c = clusters; c->name; c++)
        if (c->gpu == gpu)
            return c;
    return &clusters[0];
}

/* One "KEY = VALUE" line of a cluster file into out; -1 with why. */
static int cluster_line(char *line, ClusterSpec *out, const char **why)
{
    char *eq = strchr(line, '=');
    if (!eq)
        return *why = "expected KEY = VALUE", -1;
    *eq = 0;
    char *key = line, *val = eq + 1, *e;
    while (*key == ' ' || *key == '\t')
        key++;
    for (e = key + strlen(key); e > key && (e[-1] == ' ' || e[-1] == '\t');)
        *--e = 0;
    while (*val == ' ' || *val == '\t')
        val++;
    for (e = val + strlen(val); e > val && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r');)
        *--e = 0;
    if (!strcmp(key, "gpu")) {
        const DeviceSpec *d = dev_lookup(val);
        if (!d)
            return *why = "unknown gpu (a100-40gb, a100-80gb, h100-sxm, h100-pcie, h200-sxm)", -1;
        const ClusterSpec *def = dev_cluster_default(d);
        *out = *def;
        out->gpu = d;
        return 0;
    }
    static const char *const keys[] = {
        "gpus_per_node",     "nvlink_gbs",        "network_gbs",          "nvlink_latency_us",
        "network_latency_us", "gemm_efficiency",  "gemm_dim",             "attention_efficiency",
        "memory_efficiency", "link_efficiency",   "launch_us"};
    double *fields[] = {NULL,           &out->nvlink_gbs, &out->network_gbs, &out->nvlink_us,
                        &out->network_us, &out->k.gemm_eff, &out->k.gemm_dim, &out->k.attn_eff,
                        &out->k.mem_eff, &out->k.link_eff, &out->k.launch_s};
    for (int k = 0; k < 11; k++) {
        if (strcmp(key, keys[k]))
            continue;
        char *end;
        double x = strtod(val, &end);
        if (end == val || *end || !(x > 0) || x > 1e9)
            return *why = "expected a positive number", -1;
        if (x < 1e-3)
            return *why = "too small: at least 0.001 (GB/s, us, or a fraction)", -1;
        if (k == 0 && (x != (int)x || x > 1024))
            return *why = "gpus_per_node: expected a whole number in [1, 1024]", -1;
        if (k >= 5 && k != 6 && k != 10 && x > 1)
            return *why = "an efficiency is a fraction in (0, 1]", -1;
        if (k == 0)
            out->gpus_per_node = (int)x;
        else
            *fields[k] = k == 10 ? x * 1e-6 : x;
        return 0;
    }
    return *why = "unknown key (gpu, gpus_per_node, nvlink_gbs, network_gbs, nvlink_latency_us, "
                  "network_latency_us, gemm_efficiency, gemm_dim, attention_efficiency, "
                  "memory_efficiency, link_efficiency, launch_us)",
           -1;
}

int dev_cluster_read(Arena *a, const char *path, ClusterSpec *out, char *err, size_t n)
{
    size_t len;
    char *text = read_file(a, path, &len);
    if (!text) {
        snprintf(err, n, "cannot read the cluster file '%s'", path);
        return -1;
    }
    *out = clusters[0];
    out->name = path;
    out->what = arena_printf(a, "cluster file %s", path);
    int line = 1, gpu_seen = 0;
    for (char *p = text; *p; line++) {
        char *nl = strchr(p, '\n'), *hash;
        if (nl)
            *nl = 0;
        if ((hash = strchr(p, '#')))
            *hash = 0;
        char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r')
            q++;
        const char *why = NULL;
        if (*q) {
            int is_gpu = !strncmp(q, "gpu", 3) && (q[3] == ' ' || q[3] == '=' || q[3] == '\t');
            if (is_gpu && gpu_seen++)
                why = "gpu given twice";
            else if (!is_gpu && !gpu_seen)
                why = "the first setting must be gpu (the others refine its server)";
            else if (cluster_line(q, out, &why) == 0)
                why = NULL;
            if (why) {
                snprintf(err, n, "%s:%d: %s", path, line, why);
                return -1;
            }
            if (is_gpu)
                out->name = path, out->what = arena_printf(a, "cluster file %s", path);
        }
        if (!nl)
            break;
        p = nl + 1;
    }
    if (!gpu_seen) {
        snprintf(err, n, "%s:%d: no gpu = NAME line", path, line);
        return -1;
    }
    return 0;
}
