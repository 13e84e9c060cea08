/* nvrtc.c: CUDA C -> cubin with NVRTC, a disk cache, and ptxas' report.
 * Reads: the source, the cache folder. Writes: CACHE/nv-HASH-ARCH.cubin.
 * Key idea: the cache key is the source, the architecture, the options and
 * NVRTC's version, so a cubin is reused only where it was built for exactly
 * this; a cached file that is not an ELF image is compiled again. */
#include "runtime/gpu/nvrtc.h"

#include <errno.h>
#include <inttypes.h>
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cpu.h"

static uint64_t fnv(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

static int is_arch(const char *arch)
{
    size_t k = strlen(arch);
    return k >= 4 && k < 16 && !strncmp(arch, "sm_", 3) &&
           strspn(arch + 3, "0123456789abf") == k - 3;
}

static int read_cached(const char *path, RtCubin *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *buf = size > 4 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)size) : NULL;
    int ok = buf && fread(buf, 1, (size_t)size, f) == (size_t)size && !memcmp(buf, "\177ELF", 4);
    fclose(f);
    if (!ok) {
        free(buf);
        return -1;
    }
    out->image = buf;
    out->size = (size_t)size;
    out->log = calloc(1, 1);
    out->from_cache = 1;
    return out->log ? 0 : -1;
}

/* Best effort: a cache that cannot be written costs a compile next time. */
static void write_cached(const char *path, const RtCubin *c)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return;
    int ok = fwrite(c->image, 1, c->size, f) == c->size;
    if (fclose(f) || !ok || rename(tmp, path))
        unlink(tmp);
}

static void first_error_line(const char *log, char *out, size_t size)
{
    const char *e = strstr(log, "error");
    const char *start = e ? e : log;
    while (start > log && start[-1] != '\n')
        start--;
    size_t len = strcspn(start, "\n");
    snprintf(out, size, "%.*s", (int)(len < 300 ? len : 300), start);
}

int rt_nvrtc_compile(const char *src, const char *arch, const char *cache_dir, RtCubin *out,
                     char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    if (!is_arch(arch))
        return plan_errorf(err, n, "nvrtc: \"%s\" is not an architecture (sm_80, sm_90, ...)", arch);
    char opt_arch[32];
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", arch);
    const char *opts[] = {opt_arch, "--std=c++17", "-default-device", "-Xptxas=-v"};
    int nopts = (int)(sizeof opts / sizeof opts[0]), major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    char path[4096] = "", dir[4000], ver[32];
    if (cache_dir) {
        if (rt_cache_dir(cache_dir, dir, sizeof dir, err, n))
            return -1;
        uint64_t h = fnv(0xcbf29ce484222325ULL, src);
        snprintf(ver, sizeof ver, "nvrtc %d.%d", major, minor);
        h = fnv(fnv(h, ver), arch);
        for (int i = 0; i < nopts; i++)
            h = fnv(h, opts[i]);
        snprintf(path, sizeof path, "%s/nv-%016" PRIx64 "-%s.cubin", dir, h, arch);
        if (read_cached(path, out) == 0)
            return 0;
    }
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, "tcc_kernels.cu", 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return plan_errorf(err, n, "nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
    nvrtcResult rc = nvrtcCompileProgram(prog, nopts, opts);
    size_t loglen = 0;
    if (nvrtcGetProgramLogSize(prog, &loglen) == NVRTC_SUCCESS && (out->log = malloc(loglen + 1))) {
        if (nvrtcGetProgramLog(prog, out->log) != NVRTC_SUCCESS)
            out->log[0] = 0;
        out->log[loglen] = 0;
    }
    if (rc != NVRTC_SUCCESS) {
        char line[320];
        first_error_line(out->log ? out->log : "", line, sizeof line);
        nvrtcDestroyProgram(&prog);
        rt_cubin_free(out);
        return plan_errorf(err, n, "nvrtc (%s): %s: %s", arch, nvrtcGetErrorString(rc), line);
    }
    r = nvrtcGetCUBINSize(prog, &out->size);
    if (r == NVRTC_SUCCESS && !(out->image = malloc(out->size ? out->size : 1)))
        r = NVRTC_ERROR_OUT_OF_MEMORY;
    if (r == NVRTC_SUCCESS)
        r = nvrtcGetCUBIN(prog, out->image);
    nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS || !out->log) {
        rt_cubin_free(out);
        return plan_errorf(err, n, "nvrtcGetCUBIN (%s): %s", arch,
                           r != NVRTC_SUCCESS ? nvrtcGetErrorString(r) : "out of memory");
    }
    if (*path)
        write_cached(path, out);
    return 0;
}

void rt_cubin_free(RtCubin *c)
{
    free(c->image);
    free(c->log);
    memset(c, 0, sizeof *c);
}

/* The number before `word` on the line (e.g. "12 bytes spill stores"), or -1. */
static long number_before(const char *line, size_t len, const char *word)
{
    for (const char *p = line; p < line + len; p++) {
        size_t k = strlen(word);
        if (p + k <= line + len && !strncmp(p, word, k)) {
            const char *q = p;
            while (q > line && q[-1] == ' ')
                q--;
            while (q > line && q[-1] >= '0' && q[-1] <= '9')
                q--;
            return strtol(q, NULL, 10);
        }
    }
    return -1;
}

int rt_nvrtc_usage(const char *log, RtKernelUse **out)
{
    int len = 0, cap = 0;
    RtKernelUse *u = NULL;
    for (const char *line = log; *line;) {
        size_t k = strcspn(line, "\n");
        const char *entry = strstr(line, "Compiling entry function '");
        if (entry && entry < line + k) {
            if (len == cap) {
                cap = cap ? 2 * cap : 16;
                RtKernelUse *bigger = realloc(u, sizeof *u * (size_t)cap);
                if (!bigger)
                    break;
                u = bigger;
            }
            RtKernelUse *c = &u[len++];
            memset(c, 0, sizeof *c);
            const char *name = entry + strlen("Compiling entry function '");
            size_t nl = strcspn(name, "'\n");
            snprintf(c->name, sizeof c->name, "%.*s", (int)(nl < 127 ? nl : 127), name);
        } else if (len > 0) {
            RtKernelUse *c = &u[len - 1];
            long v;
            if ((v = number_before(line, k, "bytes stack frame")) >= 0)
                c->stack = v;
            if ((v = number_before(line, k, "bytes spill stores")) >= 0)
                c->spill_stores = v;
            if ((v = number_before(line, k, "bytes spill loads")) >= 0)
                c->spill_loads = v;
            if ((v = number_before(line, k, "registers")) >= 0)
                c->regs = (int)v;
            if ((v = number_before(line, k, "barriers")) >= 0)
                c->barriers = (int)v;
            if ((v = number_before(line, k, "bytes smem")) >= 0)
                c->smem = v;
            if ((v = number_before(line, k, "bytes cmem[0]")) >= 0)
                c->cmem = v;
        }
        line += k + (line[k] == '\n');
    }
    *out = u;
    return len;
}

char *rt_nvrtc_warnings(const char *log)
{
    size_t total = strlen(log), at = 0;
    char *w = malloc(total + 1);
    if (!w)
        return NULL;
    for (const char *line = log; *line;) {
        size_t k = strcspn(line, "\n");
        const char *hit = strstr(line, "warning");
        if (hit && hit < line + k) {
            memcpy(w + at, line, k);
            at += k;
            w[at++] = '\n';
        }
        line += k + (line[k] == '\n');
    }
    w[at] = 0;
    return w;
}
