/* emit_gpu.c: Kernel IR -> CUDA C and OpenCL C (work in progress). */
#include "codegen.h"

CgLaunch cg_gpu_launch(const Kernel *k)
{
    (void)k;
    return (CgLaunch){1, 1};
}

const char *cg_gpu_prelude(CgLang lang)
{
    (void)lang;
    return "";
}

char *cg_emit_gpu(Arena *a, const Kernel *k, CgLang lang)
{
    (void)a, (void)k, (void)lang;
    return NULL;
}
