/* binary.c: a plan -> an executable that trains the model.
 * Reads the plan; writes one C file (the kernels, the plan as a string, a
 * table of the kernel functions and a main that calls the runtime's training
 * loop) and has the system compiler build and link it with the runtime
 * library, OpenBLAS, cJSON, OpenMPI and (when the runtime has them) the CUDA
 * libraries. Key idea: the program carries everything it
 * needs, so it runs where the compiler is not installed (mpirun, srun). */
#ifndef TCC_MPI_LIBS /* OpenMPI's link flags (mpicc --showme:link), from the Makefile */
#define TCC_MPI_LIBS "-lmpi"
#endif
#ifndef TCC_CUDA_LIBS /* the CUDA libraries the runtime was built with ("" without CUDA) */
#define TCC_CUDA_LIBS ""
#endif

#include "codegen.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The plan text as C string literals, one line each. */
static void put_string(FILE *f, const char *s)
{
    fputs("    \"", f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '\n')
            fputs("\\n\"\n    \"", f);
        else if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            fprintf(f, "\\%03o", ch);
        else
            fputc(ch, f);
    }
    fputs("\"", f);
}

static int write_source(const char *path, const Plan *p, const char *json)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(p->kernel_source, f);
    fputs("\n/* ---- the program: the plan, its kernels and the training loop ---- */\n"
          "#include <stddef.h>\n"
          "typedef void (*tcc_kernel)(char *const *);\n"
          "int rt_train_main(int, char **, const char *, size_t, tcc_kernel const *);\n\n"
          "static const char tcc_plan[] =\n",
          f);
    put_string(f, json);
    fputs(";\n\nstatic tcc_kernel const tcc_kernels[] = {\n", f);
    int groups = 0;
    for (int i = 0; i < p->ninstrs; i++)
        groups |= p->instrs[i].group > 1;
    for (int i = 0; i < p->nkernels; i++)
        fprintf(f, "    %s,\n", p->kernels[i].name);
    for (int i = 0; groups && i < p->nkernels; i++) /* then each NAME_ws, and the group runner */
        fprintf(f, cg_pattern_workshared(p->kernels[i].pattern) ? "    %s_ws,\n" : "    0, /* %s */\n",
                p->kernels[i].name);
    if (groups)
        fputs("    (tcc_kernel)tcc_run_group,\n", f);
    if (!p->nkernels)
        fputs("    0,\n", f);
    fputs("};\n\nint main(int argc, char **argv)\n{\n"
          "    return rt_train_main(argc, argv, tcc_plan, sizeof tcc_plan - 1, tcc_kernels);\n"
          "}\n",
          f);
    int bad = ferror(f);
    return fclose(f) == 0 && !bad ? 0 : -1;
}

static const char *libdir(void)
{
    const char *env = getenv("TCC_LIBDIR");
#ifdef TCC_LIBDIR
    return env && *env ? env : TCC_LIBDIR;
#else
    return env && *env ? env : "build";
#endif
}

/* Shell-quote s into buf. */
static const char *quoted(Arena *a, const char *s)
{
    size_t n = strlen(s);
    char *q = arena_alloc(a, 4 * n + 3), *w = q;
    *w++ = '\'';
    for (; *s; s++) {
        if (*s == '\'') {
            memcpy(w, "'\\''", 4);
            w += 4;
        } else {
            *w++ = *s;
        }
    }
    *w++ = '\'';
    return q;
}

/* -o out can be written: its folder is one and takes files, and out is not a
 * folder. Asked before the C compile, which would fail after minutes with the
 * linker's words. */
static int output_ok(Ctx *c, const char *out)
{
    struct stat st;
    const char *slash = strrchr(out, '/');
    char *folder = slash ? arena_printf(c->arena, "%.*s", (int)(slash - out), out) : ".";
    if (!*folder)
        folder = "/";
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
        diag_error(&c->diag, LOC_NONE, "-o %s: a folder; the program needs a file's name", out);
    else if (stat(folder, &st) != 0 || !S_ISDIR(st.st_mode))
        diag_error(&c->diag, LOC_NONE, "-o %s: no folder '%s' to write it in", out, folder);
    else if (access(folder, W_OK | X_OK) != 0)
        diag_error(&c->diag, LOC_NONE, "-o %s: the folder '%s' is not writable", out, folder);
    else
        return 0;
    return -1;
}

int cg_write_program(Ctx *c, Plan *p, const char *out, int print_commands, int portable)
{
    char err[512], dir[] = "/tmp/tcc-build-XXXXXX";
    if (output_ok(c, out) != 0)
        return -1;
    char *json = plan_to_json(p, err, sizeof err);
    if (!json) {
        diag_error(&c->diag, LOC_NONE, "%s", err);
        return -1;
    }
    if (!mkdtemp(dir)) {
        free(json);
        diag_error(&c->diag, LOC_NONE, "mkdtemp %s: %s", dir, strerror(errno));
        return -1;
    }
    char *src = arena_printf(c->arena, "%s/program.c", dir);
    int rc = write_source(src, p, json);
    free(json);
    if (rc != 0) {
        diag_error(&c->diag, LOC_NONE, "cannot write %s: %s", src, strerror(errno));
        return -1;
    }
    const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
    const char *extra = getenv("TCC_KERNEL_CFLAGS"); /* after -O3, as the runtime's builds */
    char *cmd = arena_printf(c->arena,
                             "%s -O3%s -fno-math-errno -ffp-contract=off -fopenmp %s -o %s %s "
                             "%s/libtccrt.a -lopenblas -lcjson -ldl -lm "
                             TCC_MPI_LIBS " -pthread " TCC_CUDA_LIBS,
                             cc, portable ? "" : " -march=native", extra ? extra : "",
                             quoted(c->arena, out), quoted(c->arena, src), libdir());
    if (print_commands)
        fprintf(stderr, "%s\n", cmd);
    int status = system(cmd);
    if (status != 0) {
        diag_error(&c->diag, LOC_NONE, "building %s failed (%s exited with status %d); the "
                   "source is kept in %s", out, cc, status, dir);
        return -1;
    }
    unlink(src);
    rmdir(dir);
    return 0;
}
