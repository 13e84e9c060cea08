/* nvrtc.c: CUDA C -> cubin with NVRTC, a disk cache, and ptxas' report.
 * Reads: the source, the cache folder. Writes: CACHE/nv-HASH-ARCH.cubin.
 * Key idea: the cache key is the source, the architecture, the options and
 * NVRTC's version, so a cubin is reused only where it was built for exactly
 * this; a cached file that is not a whole ELF image is compiled again. */
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

/* A little-endian field of the ELF header. */
static uint64_t elf_field(const unsigned char *b, size_t at, size_t bytes)
{
    uint64_t v = 0;
    for (size_t i = bytes; i-- > 0;)
        v = v << 8 | b[at + i];
    return v;
}

/* A 64-bit ELF image whose header's tables of program and section headers lie
 * inside it: a file cut short, or any other file, is not a cubin. */
static int elf_whole(const unsigned char *b, size_t size)
{
    if (size < 64 || memcmp(b, "\177ELF", 4) || b[4] != 2 || b[5] != 1)
        return 0;
    uint64_t phoff = elf_field(b, 0x20, 8), shoff = elf_field(b, 0x28, 8);
    uint64_t ph = elf_field(b, 0x36, 2) * elf_field(b, 0x38, 2);
    uint64_t sh = elf_field(b, 0x3a, 2) * elf_field(b, 0x3c, 2);
    return phoff <= size && ph <= size - phoff && shoff <= size && sh <= size - shoff;
}

static int read_cached(const char *path, RtCubin *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    unsigned char *buf = size > 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)size) : NULL;
    int ok = buf && fread(buf, 1, (size_t)size, f) == (size_t)size && elf_whole(buf, (size_t)size);
    fclose(f);
    char *log = ok ? calloc(1, 1) : NULL;
    if (!log) {
        free(buf);
        return -1;
    }
    out->image = buf;
    out->size = (size_t)size;
    out->log = log;
    out->from_cache = 1;
    return 0;
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
    const char *e = strstr(log, ": error");
    const char *start = e ? e : strstr(log, "error");
    start = start ? start : log;
    while (start > log && start[-1] != '\n')
        start--;
    size_t len = strcspn(start, "\n");
    snprintf(out, size, "%.*s", (int)(len < 300 ? len : 300), start);
}

/* 0 when this NVRTC compiles for arch (sm_90a: for 90), else -1 and the list
 * of those it does. When NVRTC cannot say, the compile will. */
static int supported_arch(const char *arch, int major, int minor, char *err, size_t n)
{
    int num = 0, archs[256], want = atoi(arch + 3);
    if (nvrtcGetNumSupportedArchs(&num) != NVRTC_SUCCESS || num <= 0 || num > 256 ||
        nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
        return 0;
    char list[1024] = "";
    size_t at = 0;
    for (int i = 0; i < num; i++) {
        if (archs[i] == want)
            return 0;
        if (at < sizeof list)
            at += (size_t)snprintf(list + at, sizeof list - at, "%ssm_%d", i ? " " : "", archs[i]);
    }
    return plan_errorf(err, n, "nvrtc: NVRTC %d.%d does not compile for %s (it does for %s)", major,
                       minor, arch, list);
}

/* CACHE/nv-HASH-ARCH.cubin for this source, architecture, options and NVRTC
 * into path[size]; 0, or -1 when the folder cannot be had. */
static int cache_path(const char *cache_dir, const char *src, const char *arch,
                      const char *const *opts, int nopts, char *path, size_t size, char *err,
                      size_t n)
{
    char dir[4000], ver[32];
    int major = 0, minor = 0;
    if (rt_cache_dir(cache_dir, dir, sizeof dir, err, n))
        return -1;
    nvrtcVersion(&major, &minor);
    snprintf(ver, sizeof ver, "nvrtc %d.%d", major, minor);
    uint64_t h = fnv(fnv(fnv(0xcbf29ce484222325ULL, src), ver), arch);
    for (int i = 0; i < nopts; i++)
        h = fnv(h, opts[i]);
    snprintf(path, size, "%s/nv-%016" PRIx64 "-%s.cubin", dir, h, arch);
    return 0;
}

/* NVRTC's log of prog into out->log (malloc'ed; "" when it cannot be read). */
static void take_log(nvrtcProgram prog, RtCubin *out)
{
    size_t len = 0;
    if (nvrtcGetProgramLogSize(prog, &len) != NVRTC_SUCCESS)
        len = 0;
    if (!(out->log = malloc(len + 1)))
        return;
    if (len && nvrtcGetProgramLog(prog, out->log) != NVRTC_SUCCESS)
        len = 0;
    out->log[len] = 0;
}

/* The cubin of a compiled prog into out->image; 0, or -1 with a message. */
static int take_cubin(nvrtcProgram prog, const char *arch, RtCubin *out, char *err, size_t n)
{
    nvrtcResult r = nvrtcGetCUBINSize(prog, &out->size);
    if (r == NVRTC_SUCCESS && !(out->image = malloc(out->size ? out->size : 1)))
        r = NVRTC_ERROR_OUT_OF_MEMORY;
    if (r == NVRTC_SUCCESS)
        r = nvrtcGetCUBIN(prog, out->image);
    if (r == NVRTC_SUCCESS && out->log)
        return 0;
    return plan_errorf(err, n, "nvrtcGetCUBIN (%s): %s", arch,
                       r != NVRTC_SUCCESS ? nvrtcGetErrorString(r) : "out of memory");
}

/* Compile src with opts into out (image and log); 0, or -1 with NVRTC's first
 * error line and out freed. */
static int compile(const char *src, const char *arch, const char **opts, int nopts, RtCubin *out,
                   char *err, size_t n)
{
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, RT_NVRTC_PROGRAM, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return plan_errorf(err, n, "nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
    r = nvrtcCompileProgram(prog, nopts, opts);
    take_log(prog, out);
    int rc = 0;
    if (r != NVRTC_SUCCESS) {
        char line[320];
        first_error_line(out->log ? out->log : "", line, sizeof line);
        rc = plan_errorf(err, n, "nvrtc (%s): %s: %s", arch, nvrtcGetErrorString(r), line);
    } else {
        rc = take_cubin(prog, arch, out, err, n);
    }
    nvrtcDestroyProgram(&prog);
    if (rc)
        rt_cubin_free(out);
    return rc;
}

int rt_nvrtc_compile_with(const char *src, const char *arch, const char *const *extra, int nextra,
                          const char *cache_dir, RtCubin *out, char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    if (!is_arch(arch))
        return plan_errorf(err, n, "nvrtc: \"%s\" is not an architecture (sm_80, sm_90, ...)",
                           arch);
    if (nextra < 0 || nextra > 16)
        return plan_errorf(err, n, "nvrtc: %d extra options (at most 16)", nextra);
    if (supported_arch(arch, major, minor, err, n))
        return -1;
    char opt_arch[32], path[4096] = "";
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", arch);
    const char *opts[20] = {opt_arch, "--std=c++17", "-default-device", "-Xptxas=-v"};
    int nopts = 4;
    for (int i = 0; i < nextra; i++)
        opts[nopts++] = extra[i];
    if (cache_dir && cache_path(cache_dir, src, arch, opts, nopts, path, sizeof path, err, n))
        return -1;
    if (*path && read_cached(path, out) == 0)
        return 0;
    if (compile(src, arch, opts, nopts, out, err, n))
        return -1;
    if (*path)
        write_cached(path, out);
    return 0;
}

int rt_nvrtc_compile(const char *src, const char *arch, const char *cache_dir, RtCubin *out,
                     char *err, size_t n)
{
    return rt_nvrtc_compile_with(src, arch, NULL, 0, cache_dir, out, err, n);
}

void rt_nvrtc_version(int *major, int *minor)
{
    *major = *minor = 0;
    nvrtcVersion(major, minor);
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

/* The name in quotes after `key` on the line into name[128] ("Compiling entry
 * function 'k0'"), or after it up to the line's end ("Function properties for
 * k0"); 0, or -1 when the line does not have key. */
static int name_after(const char *line, size_t len, const char *key, char *name)
{
    const char *at = strstr(line, key);
    if (!at || at >= line + len)
        return -1;
    at += strlen(key);
    size_t k = strcspn(at, "'\n");
    snprintf(name, 128, "%.*s", (int)(k < 127 ? k : 127), at);
    return 0;
}

/* A new zeroed record at the end of *u; NULL when out of memory. */
static RtKernelUse *push_use(RtKernelUse **u, int *len, int *cap)
{
    if (*len == *cap) {
        int bigger = *cap ? 2 * *cap : 16;
        RtKernelUse *v = realloc(*u, sizeof **u * (size_t)bigger);
        if (!v)
            return NULL;
        *u = v;
        *cap = bigger;
    }
    RtKernelUse *c = &(*u)[(*len)++];
    memset(c, 0, sizeof *c);
    return c;
}

/* The frame line of a function ("0 bytes stack frame, 0 bytes spill stores, ..."). */
static void frame_line(RtKernelUse *c, const char *line, size_t k)
{
    long v;
    if ((v = number_before(line, k, "bytes stack frame")) >= 0)
        c->stack = v;
    if ((v = number_before(line, k, "bytes spill stores")) >= 0)
        c->spill_stores = v;
    if ((v = number_before(line, k, "bytes spill loads")) >= 0)
        c->spill_loads = v;
}

/* The usage line of a kernel ("Used 10 registers, used 0 barriers, 1024 bytes smem, ..."). */
static void used_line(RtKernelUse *c, const char *line, size_t k)
{
    long v;
    if ((v = number_before(line, k, "registers")) >= 0)
        c->regs = (int)v;
    if ((v = number_before(line, k, "barriers")) >= 0)
        c->barriers = (int)v;
    if ((v = number_before(line, k, "bytes smem")) >= 0)
        c->smem = v;
    if ((v = number_before(line, k, "bytes cmem[0]")) >= 0)
        c->cmem = v;
}

/* ptxas reports a kernel as "Compiling entry function 'K'", "Function
 * properties for K", its frame line, "Used N registers, ..."; a device function
 * that was not inlined only as "Function properties for F" and a frame line. */
int rt_nvrtc_usage(const char *log, RtKernelUse **out)
{
    int len = 0, cap = 0, entry = -1, props = -1;
    RtKernelUse *u = NULL;
    char name[128];
    for (const char *line = log; *line;) {
        size_t k = strcspn(line, "\n");
        if (!name_after(line, k, "Compiling entry function '", name)) {
            RtKernelUse *c = push_use(&u, &len, &cap);
            if (!c)
                break;
            snprintf(c->name, sizeof c->name, "%s", name);
            entry = props = len - 1;
        } else if (!name_after(line, k, "Function properties for ", name)) {
            props = entry >= 0 && !strcmp(u[entry].name, name) ? entry : -1;
            RtKernelUse *c = props < 0 ? push_use(&u, &len, &cap) : NULL;
            if (c) {
                snprintf(c->name, sizeof c->name, "%s", name);
                c->is_function = 1;
                props = len - 1;
            }
        } else if (props >= 0 && number_before(line, k, "bytes stack frame") >= 0) {
            frame_line(&u[props], line, k);
        } else if (entry >= 0 && number_before(line, k, "registers") >= 0) {
            used_line(&u[entry], line, k);
        }
        line += k + (line[k] == '\n');
    }
    *out = u;
    return len;
}

/* NVRTC's "FILE(LINE): warning #N-D: ..." and ptxas' "ptxas warning : ...":
 * the word warning after a blank or at the line's start, then a blank, ':' or
 * '#' (not a kernel named warning_k in an info line). */
static int is_warning_line(const char *line, size_t k)
{
    for (const char *p = line; p + 7 <= line + k; p++)
        if (!strncmp(p, "warning", 7) && (p == line || p[-1] == ' ') &&
            (p + 7 == line + k || strchr(" :#", p[7])))
            return 1;
    return 0;
}

char *rt_nvrtc_warnings(const char *log)
{
    size_t total = strlen(log), at = 0;
    char *w = malloc(total + 2);
    if (!w)
        return NULL;
    for (const char *line = log; *line;) {
        size_t k = strcspn(line, "\n");
        if (is_warning_line(line, k)) {
            memcpy(w + at, line, k);
            at += k;
            w[at++] = '\n';
        }
        line += k + (line[k] == '\n');
    }
    w[at] = 0;
    return w;
}
