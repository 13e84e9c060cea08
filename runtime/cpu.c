/* cpu.c: the CPU device: the slab, the plan's kernels compiled to a shared
 * object, and GEMMs through BLAS (OpenBLAS).
 * Reads: a checked Plan, $CC, $TCC_CACHE, $HOME, /proc/self/pagemap,
 * /proc/cpuinfo. Writes: CACHE/k-PLANHASH-SRCHASH.{c,so} (the kernels' source
 * and shared object, built for this host's CPU: SRCHASH covers the source, the
 * compiler's flags and the CPU's model name); the
 * slab, anonymous memory that the kernel zero-fills page by page on first touch.
 * Key idea: the kernels are compiled once per content and reused. Each build
 * happens in a private temporary folder and is renamed into place, so runs
 * that start together never see half a file; a cached object that does not
 * load is built again. */
#include "runtime/cpu.h"
#include "runtime/runtime.h"

#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define PATH_BYTES 4096
#define MAX_CC_WORDS 16

/* snprintf into a buffer that must hold the whole text: 0, or -1 when cut. */
static int fmt_path(char *out, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fmt_path(char *out, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, size, fmt, ap);
    va_end(ap);
    return k < 0 || (size_t)k >= size ? -1 : 0;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

/* ---- the cache folder ---- */

static int mkdir_p(char *path, char *err, size_t n)
{
    struct stat st;
    for (char *s = path + 1;; s++) {
        if (*s != '/' && *s)
            continue;
        char c = *s;
        *s = 0;
        int rc = mkdir(path, 0755), e = errno;
        *s = c;
        if (rc && e != EEXIST)
            return plan_errorf(err, n, "mkdir %s: %s", path, strerror(e));
        if (!c)
            break;
    }
    if (stat(path, &st) || !S_ISDIR(st.st_mode))
        return plan_errorf(err, n, "cache %s: not a directory", path);
    return 0;
}

/* cache_dir, else $TCC_CACHE, else ~/.cache/tcc, else /tmp/tcc-cache-$UID (which must
 * be ours: a shared object found there is loaded and run). */
int rt_cache_dir(const char *given, char *out, size_t size, char *err, size_t n)
{
    const char *env = getenv("TCC_CACHE"), *home = getenv("HOME");
    const char *chosen = given && *given ? given : env && *env ? env : NULL;
    struct stat st;
    if (chosen) {
        if (strlen(chosen) >= size - 80)
            return plan_errorf(err, n, "cache %s: path too long", chosen);
        fmt_path(out, size, "%s", chosen);
        return mkdir_p(out, err, n);
    }
    if (home && *home && strlen(home) < size - 80) {
        fmt_path(out, size, "%s/.cache/tcc", home);
        if (!mkdir_p(out, err, n))
            return 0;
    }
    fmt_path(out, size, "/tmp/tcc-cache-%u", (unsigned)getuid());
    if (mkdir_p(out, err, n))
        return -1;
    if (stat(out, &st) || st.st_uid != getuid())
        return plan_errorf(err, n, "cache %s: not owned by this user", out);
    return 0;
}

/* ---- compiling ---- */

static int write_text(const char *path, const char *text, char *err, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return plan_errorf(err, n, "fopen %s: %s", path, strerror(errno));
    size_t len = strlen(text);
    int ok = fwrite(text, 1, len, f) == len, e = errno;
    if (fclose(f) || !ok)
        return plan_errorf(err, n, "%s %s: %s", ok ? "fclose" : "fwrite", path, strerror(ok ? errno : e));
    return 0;
}

/* The first line of the compiler's log that says "error" (else the first line). */
static void first_error(const char *log, char *out, size_t size)
{
    char line[512];
    FILE *f = fopen(log, "r");
    *out = 0;
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!*out || strstr(line, "error")) {
            fmt_path(out, size, "%s", line); /* a long line is cut: fine */
            if (strstr(line, "error"))
                break;
        }
    }
    fclose(f);
}

/* The kernels' flags: vectorized for this host's CPU (-march=native, -O3),
 * math without errno (so sqrtf vectorizes), and no contraction of a * b + c
 * into an fma, so that every rounding is the one the C source spells: the
 * same bits as the float64-checked kernels and as codegen/binary.c's build. */
static const char *const cc_flags[] = {"-O3", "-march=native", "-fno-math-errno",
                                       "-ffp-contract=off", "-std=c99", "-fopenmp",
                                       "-fPIC", "-shared"};

/* $TCC_KERNEL_CFLAGS: words added after those flags (so "-O1" overrides
 * -O3: the test suites build their kernels so, faster, with the same bits,
 * as neither flag lets the compiler reassociate or contract). "" when unset. */
static const char *extra_flags(void)
{
    const char *e = getenv("TCC_KERNEL_CFLAGS");
    return e ? e : "";
}

/* Split text's copy in words (at most max) into argv from argc; the new argc. */
static int split_words(char *words, char **argv, int argc, int max)
{
    char *save = NULL;
    for (char *w = strtok_r(words, " \t", &save); w && argc < max; w = strtok_r(NULL, " \t", &save))
        argv[argc++] = w;
    return argc;
}

/* argv of: $CC FLAGS $TCC_KERNEL_CFLAGS -o SO SRC -lm. words holds $CC's copy, extra
 * $TCC_KERNEL_CFLAGS's. */
static int cc_argv(char *words, char *extra, char **argv, const char *so, const char *src)
{
    int argc = split_words(words, argv, 0, MAX_CC_WORDS);
    if (!argc)
        argv[argc++] = "cc";
    for (size_t i = 0; i < sizeof cc_flags / sizeof cc_flags[0]; i++)
        argv[argc++] = (char *)cc_flags[i];
    argc = split_words(extra, argv, argc, argc + MAX_CC_WORDS);
    argv[argc++] = "-o";
    argv[argc++] = (char *)so;
    argv[argc++] = (char *)src;
    argv[argc++] = "-lm";
    argv[argc] = NULL;
    return argc;
}

/* Run the compiler with its output into log; 0 when it exits with 0. */
static int run_cc(const char *so, const char *src, const char *log, char *err, size_t n)
{
    char words[1024], extra[1024], *argv[2 * MAX_CC_WORDS + 16], msg[400];
    const char *cc = getenv("CC");
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int status, rc;
    snprintf(words, sizeof words, "%s", cc && *cc ? cc : "cc");
    snprintf(extra, sizeof extra, "%s", extra_flags());
    cc_argv(words, extra, argv, so, src);
    if ((rc = posix_spawn_file_actions_init(&fa)))
        return plan_errorf(err, n, "posix_spawn_file_actions_init: %s", strerror(rc));
    rc = posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!rc)
        rc = posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (!rc)
        rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        return plan_errorf(err, n, "posix_spawnp %s: %s", argv[0], strerror(rc));
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return plan_errorf(err, n, "waitpid %s: %s", argv[0], strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    first_error(log, msg, sizeof msg);
    return plan_errorf(err, n, "compiling the kernels: %s %s %d: %s (log: %s)", argv[0],
                WIFEXITED(status) ? "exited with" : "killed by signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), msg, log);
}

/* Build dir/stem.so (and keep dir/stem.c) from src through a private folder. */
static int compile(const char *dir, const char *stem, const char *src, char *err, size_t n)
{
    char tmp[PATH_BYTES], c[PATH_BYTES], so[PATH_BYTES], log[PATH_BYTES], dst[PATH_BYTES];
    if (fmt_path(tmp, sizeof tmp, "%s/tmp.XXXXXX", dir) || !mkdtemp(tmp))
        return plan_errorf(err, n, "mkdtemp %s: %s", tmp, strerror(errno));
    if (fmt_path(c, sizeof c, "%s/%s.c", tmp, stem) ||
        fmt_path(so, sizeof so, "%s/%s.so", tmp, stem) ||
        fmt_path(log, sizeof log, "%s/cc.log", tmp))
        return plan_errorf(err, n, "%s: path too long", tmp);
    if (write_text(c, src, err, n) || run_cc(so, c, log, err, n))
        return -1; /* the folder stays, with the log */
    if (fmt_path(dst, sizeof dst, "%s/%s.c", dir, stem) || rename(c, dst))
        return plan_errorf(err, n, "rename %s: %s", c, strerror(errno));
    if (fmt_path(dst, sizeof dst, "%s/%s.so", dir, stem) || rename(so, dst))
        return plan_errorf(err, n, "rename %s: %s", so, strerror(errno));
    if (unlink(log) || rmdir(tmp))
        return plan_errorf(err, n, "removing %s: %s", tmp, strerror(errno));
    return 0;
}

/* ---- loading ---- */

static int plan_has_groups(const Plan *p)
{
    for (int i = 0; i < p->ninstrs; i++)
        if (p->instrs[i].group > 1)
            return 1;
    return 0;
}

/* Every kernel of a group has its NAME_ws. */
static int check_groups(const CpuDevice *d, const Plan *p, const char *where, char *err, size_t n)
{
    for (int i = 0; i < p->ninstrs; i++)
        for (int j = i; j < i + p->instrs[i].group; j++)
            if (!d->ws[p->instrs[j].kernel] || !d->run_group)
                return plan_errorf(err, n, "instrs[%d] is in a group, but %s has no %s%s", j, where,
                                   d->run_group ? p->kernels[p->instrs[j].kernel].name : "tcc_run_group",
                                   d->run_group ? "_ws" : "");
    return 0;
}

static int load_symbols(CpuDevice *d, const Plan *p, char *err, size_t n)
{
    char ws[300];
    d->fns = calloc((size_t)p->nkernels + 1, sizeof *d->fns);
    d->ws = calloc((size_t)p->nkernels + 1, sizeof *d->ws);
    if (!d->fns || !d->ws)
        return plan_errorf(err, n, "calloc: out of memory");
    for (int i = 0; i < p->nkernels; i++) {
        dlerror();
        void *sym = dlsym(d->so, p->kernels[i].name);
        if (!sym)
            return plan_errorf(err, n, "kernel \"%s\" not found in %s (dlsym: %s)", p->kernels[i].name,
                        d->so_path, dlerror());
        memcpy(&d->fns[i], &sym, sizeof sym); /* object to function pointer, as POSIX allows */
        snprintf(ws, sizeof ws, "%s_ws", p->kernels[i].name);
        if ((sym = dlsym(d->so, ws)))
            memcpy(&d->ws[i], &sym, sizeof sym);
    }
    void *sym = dlsym(d->so, "tcc_run_group");
    if (sym)
        memcpy(&d->run_group, &sym, sizeof sym);
    return check_groups(d, p, d->so_path, err, n);
}

/* What else decides the object: the flags, and the CPU it was built for
 * (-march=native): the model name and the feature flags (x86's "flags", ARM's
 * "Features" and "CPU part"), so that a cache shared by unlike hosts, or by
 * virtual machines of one model with features masked, keeps one each. */
static uint64_t build_id(void)
{
    char line[4096];
    uint64_t h = 0;
    int seen = 0; /* the first processor's lines: its name and its features */
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f) && seen < 2)
        if (!strncmp(line, "model name", 10) || !strncmp(line, "flags", 5) ||
            !strncmp(line, "Features", 8) || !strncmp(line, "CPU part", 8))
            h = h * 31 + fnv1a(line), seen += strncmp(line, "model name", 10) != 0;
    if (f)
        fclose(f);
    for (size_t i = 0; i < sizeof cc_flags / sizeof cc_flags[0]; i++)
        h = h * 31 + fnv1a(cc_flags[i]);
    return h * 31 + fnv1a(extra_flags()); /* a kernel built at -O1 is not one built at -O3 */
}

/* dlopen the cached object, building it first when it is absent or broken. */
static int load_kernels(CpuDevice *d, const Plan *p, const char *cache_dir, char *err, size_t n)
{
    char dir[PATH_BYTES], hash[17], stem[64];
    if (rt_cache_dir(cache_dir, dir, sizeof dir, err, n))
        return -1;
    plan_hash(p, hash);
    snprintf(stem, sizeof stem, "k-%s-%016" PRIx64, hash, fnv1a(p->kernel_source) ^ build_id());
    if (fmt_path(d->so_path, sizeof d->so_path, "%s/%s.so", dir, stem))
        return plan_errorf(err, n, "cache %s: path too long", dir);
    for (int attempt = 0; attempt < 2 && !d->so; attempt++) {
        if (attempt || access(d->so_path, F_OK)) {
            unlink(d->so_path);
            if (compile(dir, stem, p->kernel_source, err, n))
                return -1;
        }
        /* NODELETE: the OpenMP runtime the kernels pulled in keeps worker threads
         * alive after rt_close; unmapping it under them would crash. */
        d->so = dlopen(d->so_path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    }
    if (!d->so)
        return plan_errorf(err, n, "dlopen %s: %s", d->so_path, dlerror());
    return load_symbols(d, p, err, n);
}

int rt_cpu_open(CpuDevice *d, const Plan *p, const char *cache_dir, char *err, size_t n)
{
    return rt_cpu_open_linked(d, p, NULL, cache_dir, err, n);
}

/* ---- the slab ---- */

static size_t page_size(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (size_t)pg : 4096;
}

static size_t whole_pages(uint64_t bytes)
{
    size_t pg = page_size();
    return (size_t)((bytes ? bytes : 1) + pg - 1) / pg * pg;
}

/* Anonymous private memory: zero-filled by the kernel, a page at a time when
 * first touched, so pages never touched are never resident. Huge pages are
 * declined: one touched byte would make 2 MiB resident, and rt_cpu_touched
 * counts pages. */
static int map_slab(CpuDevice *d, uint64_t bytes, char *err, size_t n)
{
    if (bytes > SIZE_MAX - page_size())
        return plan_errorf(err, n, "slab of %" PRIu64 " bytes: too large", bytes);
    size_t size = whole_pages(bytes);
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return plan_errorf(err, n, "mmap(%zu bytes): %s", size, strerror(errno));
    madvise(m, size, MADV_NOHUGEPAGE); /* advice: its failure changes nothing we rely on */
    d->slab = m;
    d->slab_bytes = bytes;
    d->mapped = size;
    return 0;
}

void rt_cpu_fit(CpuDevice *d, uint64_t bytes)
{
    size_t keep = whole_pages(bytes);
    if (keep < d->mapped && munmap(d->slab + keep, d->mapped - keep) == 0)
        d->mapped = keep;
    d->slab_bytes = bytes;
}

/* A page counts when /proc/self/pagemap says it is present and mapped by this
 * process alone (bit 63 and 56), or swapped out (bit 62): a page only read is
 * mapped to the kernel's shared zero page, present but not exclusive, and
 * costs no memory. mincore(2) cannot tell the two apart, so it is only the
 * fallback where pagemap cannot be read (it then counts read pages too). */
static int touched_pages(const CpuDevice *d, unsigned char *in, size_t pages, char *err, size_t n)
{
    size_t pg = page_size();
    int fd = open("/proc/self/pagemap", O_RDONLY);
    uint64_t e[512];
    for (size_t i = 0; fd >= 0 && i < pages; i += 512) {
        size_t k = pages - i < 512 ? pages - i : 512;
        off_t at = (off_t)(((uintptr_t)d->slab / pg + i) * sizeof e[0]);
        if (pread(fd, e, k * sizeof e[0], at) != (ssize_t)(k * sizeof e[0])) {
            close(fd);
            fd = -1;
            break;
        }
        for (size_t j = 0; j < k; j++)
            in[i + j] = ((e[j] >> 63 & 1) && (e[j] >> 56 & 1)) || (e[j] >> 62 & 1);
    }
    if (fd >= 0)
        return close(fd), 0;
    if (mincore(d->slab, pages * pg, in))
        return plan_errorf(err, n, "mincore: %s", strerror(errno));
    return 0;
}

int rt_cpu_touched(const CpuDevice *d, uint64_t *bytes, char *err, size_t n)
{
    size_t pg = page_size(), pages = whole_pages(d->slab_bytes) / pg;
    unsigned char *in = calloc(pages + 1, 1);
    if (!in)
        return plan_errorf(err, n, "calloc: out of memory");
    int rc = touched_pages(d, in, pages, err, n);
    *bytes = 0;
    for (size_t i = 0; !rc && i < pages; i++) /* the slab's part of each page */
        if (in[i] & 1)
            *bytes += (i + 1) * pg <= d->slab_bytes ? pg : d->slab_bytes - i * pg;
    free(in);
    return rc;
}

int rt_cpu_open_linked(CpuDevice *d, const Plan *p, const RtKernelFn *linked,
                       const char *cache_dir, char *err, size_t n)
{
    memset(d, 0, sizeof *d);
    if (map_slab(d, p->slab_bytes, err, n))
        return -1;
    if (linked && p->nkernels > 0) { /* compiled into the program: nothing to build */
        if (!(d->fns = calloc((size_t)p->nkernels, sizeof *d->fns))) {
            rt_cpu_close(d);
            return plan_errorf(err, n, "calloc: out of memory");
        }
        memcpy(d->fns, linked, sizeof *d->fns * (size_t)p->nkernels);
        if (!plan_has_groups(p))
            return 0;
        if (!(d->ws = calloc((size_t)p->nkernels, sizeof *d->ws))) {
            rt_cpu_close(d);
            return plan_errorf(err, n, "calloc: out of memory");
        }
        memcpy(d->ws, linked + p->nkernels, sizeof *d->ws * (size_t)p->nkernels);
        d->run_group = (RtGroupFn)(void (*)(void))linked[2 * p->nkernels]; /* cast back */
        if (check_groups(d, p, "the program", err, n)) {
            rt_cpu_close(d);
            return -1;
        }
        return 0;
    }
    if (p->nkernels > 0 && load_kernels(d, p, cache_dir, err, n)) {
        rt_cpu_close(d);
        return -1;
    }
    return 0;
}

/* ---- threads ---- */

/* The OpenMP runtime reads its wait policy when it starts, before main, and
 * OpenBLAS its threads' timeout: to keep the idle threads of each from
 * spinning against the other's on the same cores (measured: bench/README.md),
 * the program starts itself again once with OPENBLAS_THREAD_TIMEOUT=4
 * (OpenBLAS's shortest: its workers sleep right after a GEMM) and OpenMP's
 * workers spinning only briefly before they sleep (OMP_WAIT_POLICY=active,
 * GOMP_SPINCOUNT=RT_OMP_SPIN: a few microseconds, enough to catch the next
 * kernel's parallel region when it follows at once, too short to hold a core
 * through a GEMM), each unless the user set it (either OpenMP variable). */
#define RT_OMP_SPIN "2000"

void rt_cpu_quiet_threads(char **argv)
{
    int again = 0;
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT") &&
        setenv("OMP_WAIT_POLICY", "active", 1) == 0 && setenv("GOMP_SPINCOUNT", RT_OMP_SPIN, 1) == 0)
        again = 1;
    if (!getenv("OPENBLAS_THREAD_TIMEOUT") && setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1) == 0)
        again = 1;
    if (!again)
        return;
    execv("/proc/self/exe", argv);
    /* exec failed: go on with the settings the runtimes already have */
}

/* ---- GEMM ---- */

static void bias_add(const PlanTensor *tb, const char *bias, float *c, int64_t m, int64_t nc,
                     int64_t ldc)
{
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < nc; j++)
            c[r * ldc + j] += tb->dtype == PD_BF16 ? rt_bf16_to_f32(((const uint16_t *)bias)[j])
                                                   : ((const float *)bias)[j];
}

/* The wrapper's loops: on every thread (as the kernels) once they are long
 * enough, a plain loop each that the compiler vectorizes. */
#define WIDE_PAR 65536

static float *widen(const PlanTensor *t, const char *src, float *dst)
{
    const uint16_t *h = (const uint16_t *)src;
    int64_t n = (int64_t)(t->bytes / 2);
#pragma omp parallel for schedule(static) if (n > WIDE_PAR)
    for (int64_t i = 0; i < n; i++)
        dst[i] = rt_bf16_to_f32(h[i]);
    return dst;
}

/* C (bf16) = round(c + beta C) over an m x n block at c16, row stride ldc. */
static void round_out(uint16_t *c16, const float *c, int64_t m, int64_t nc, int64_t ldc, float beta)
{
#pragma omp parallel for schedule(static) if (m * nc > WIDE_PAR)
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < nc; j++) {
            int64_t at = r * ldc + j;
            float prev = beta != 0 ? beta * rt_bf16_to_f32(c16[at]) : 0.0f;
            c16[at] = rt_f32_to_bf16(c[at] + prev);
        }
}

/* bf16 A and B: widened to f32, one sgemm per batch into f32 (C itself when C
 * is f32, else a copy), the bias added, then C rounded once to bf16: f32
 * accumulation, as cuBLASLt with compute type 32F. */
static int gemm_bf16(CpuDevice *d, const Plan *p, const PlanGemm *g, char *err, size_t n)
{
    const PlanTensor *ta = &p->tensors[g->a], *tb = &p->tensors[g->b], *tc = &p->tensors[g->c];
    size_t na = ta->bytes / 2, nb = tb->bytes / 2, nc = tc->dtype == PD_BF16 ? tc->bytes / 2 : 0;
    if (tb->dtype != PD_BF16 || (tc->dtype != PD_BF16 && tc->dtype != PD_F32))
        return plan_errorf(err, n, "gemm on bf16 A needs bf16 B and a bf16 or f32 C");
    if (d->wide_len < na + nb + nc) {
        free(d->wide);
        rt_account(d->account, -(int64_t)(sizeof(float) * d->wide_len));
        d->wide_len = 0;
        if (!(d->wide = malloc(sizeof(float) * (na + nb + nc))))
            return plan_errorf(err, n, "out of memory for a bf16 gemm's f32 copies");
        d->wide_len = na + nb + nc;
        rt_account(d->account, (int64_t)(sizeof(float) * d->wide_len));
    }
    float *a = widen(ta, d->slab + ta->offset, d->wide),
          *b = widen(tb, d->slab + tb->offset, a + na);
    float *c = nc ? b + nb : (float *)(d->slab + tc->offset);
    uint16_t *c16 = (uint16_t *)(d->slab + tc->offset);
    enum CBLAS_TRANSPOSE tra = g->trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE trb = g->trans_b ? CblasTrans : CblasNoTrans;
    for (int64_t i = 0; i < g->batch; i++) {
        float *ci = c + i * g->stride_c;
        cblas_sgemm(CblasRowMajor, tra, trb, (int)g->m, (int)g->n, (int)g->k, (float)g->alpha,
                    a + i * g->stride_a, (int)g->lda, b + i * g->stride_b, (int)g->ldb,
                    nc ? 0.0f : (float)g->beta, ci, (int)g->ldc);
        if (g->epilogue == PE_BIAS)
            bias_add(&p->tensors[g->bias], d->slab + p->tensors[g->bias].offset, ci, g->m, g->n,
                     g->ldc);
        if (nc)
            round_out(c16 + i * g->stride_c, ci, g->m, g->n, g->ldc, (float)g->beta);
    }
    return 0;
}

int rt_cpu_gemm(CpuDevice *d, const Plan *p, const PlanGemm *g, char *err, size_t n)
{
    const PlanTensor *ta = &p->tensors[g->a];
    char *a = d->slab + p->tensors[g->a].offset, *b = d->slab + p->tensors[g->b].offset,
         *c = d->slab + p->tensors[g->c].offset;
    size_t es = plan_dtype_size(ta->dtype);
    enum CBLAS_TRANSPOSE tra = g->trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE trb = g->trans_b ? CblasTrans : CblasNoTrans;
    if (ta->dtype != PD_F32 && ta->dtype != PD_F64 && ta->dtype != PD_BF16)
        return plan_errorf(err, n, "gemm on %s tensors: the CPU backend does f32, f64 and bf16",
                           plan_dtype_name(ta->dtype));
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX || g->lda > INT_MAX ||
        g->ldb > INT_MAX || g->ldc > INT_MAX)
        return plan_errorf(err, n, "gemm dimensions beyond the BLAS integer range");
    if (ta->dtype == PD_BF16)
        return gemm_bf16(d, p, g, err, n);
    for (int64_t i = 0; i < g->batch; i++) {
        char *ai = a + (size_t)(i * g->stride_a) * es, *bi = b + (size_t)(i * g->stride_b) * es;
        char *ci = c + (size_t)(i * g->stride_c) * es;
        if (ta->dtype == PD_F32)
            cblas_sgemm(CblasRowMajor, tra, trb, (int)g->m, (int)g->n, (int)g->k, (float)g->alpha,
                        (float *)ai, (int)g->lda, (float *)bi, (int)g->ldb, (float)g->beta,
                        (float *)ci, (int)g->ldc);
        else
            cblas_dgemm(CblasRowMajor, tra, trb, (int)g->m, (int)g->n, (int)g->k, g->alpha,
                        (double *)ai, (int)g->lda, (double *)bi, (int)g->ldb, g->beta, (double *)ci,
                        (int)g->ldc);
        if (g->epilogue == PE_BIAS) /* the bias epilogue: after the product, as cuBLASLt */
            for (int64_t r = 0; r < g->m; r++) {
                const char *bias = d->slab + p->tensors[g->bias].offset;
                if (ta->dtype == PD_F32)
                    for (int64_t j = 0; j < g->n; j++)
                        ((float *)ci)[r * g->ldc + j] += ((const float *)bias)[j];
                else
                    for (int64_t j = 0; j < g->n; j++)
                        ((double *)ci)[r * g->ldc + j] += ((const double *)bias)[j];
            }
    }
    return 0;
}

void rt_cpu_close(CpuDevice *d)
{
    if (d->so && dlclose(d->so))
        fprintf(stderr, "tcc runtime: dlclose %s: %s\n", d->so_path, dlerror());
    free(d->fns);
    free(d->ws);
    if (d->slab)
        munmap(d->slab, d->mapped);
    rt_account(d->account, -(int64_t)(sizeof(float) * d->wide_len));
    free(d->wide);
    memset(d, 0, sizeof *d);
}
