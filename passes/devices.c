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
#include "passes.h"

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

const DeviceSpec *pass_device_lookup(const char *name)
{
    for (const DeviceSpec *d = devices; d->name; d++)
        if (!strcmp(d->name, name))
            return d;
    return NULL;
}

const DeviceSpec *pass_device_table(void) { return devices; }
