/* fuzz_npy.c: libFuzzer harness for the .npy loader (runtime/npy.c). Reads
 * arbitrary bytes as one .npy file, for an f32 input of examples [2, 3] and
 * an i32 input of examples [3] whose ids lie in [0, 5). The loader must
 * refuse bad input with a message, never crash or leak; a file it accepts
 * must give two batches (reading wraps around its examples), the i32 ids
 * in range. */
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char path[64];

static void remove_file(void)
{
    unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    strcpy(path, "/tmp/fuzz_npy_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("fuzz_npy: mkstemp");
        abort();
    }
    close(fd);
    atexit(remove_file);
    return 0;
}

/* Two batches of 5 rows through loader l of examples of `each` elements. */
static void read_batches(NpyLoader *l, size_t each, int ids)
{
    char err[512];
    int32_t out[5 * 6];
    for (int b = 0; b < 2; b++) {
        if (rt_npy_next(l, 5, out, err, sizeof err)) {
            fprintf(stderr, "fuzz_npy: next after a good open: %s\n", err);
            abort();
        }
        for (size_t e = 0; ids && e < 5 * each; e++)
            if (out[e] < 0 || out[e] >= 5) {
                fprintf(stderr, "fuzz_npy: id %d outside [0, 5) in a checked file\n", (int)out[e]);
                abort();
            }
    }
}

/* The file opened for input `name` of dtype dt, examples `example` (erank
 * dims, `each` elements), rank of ranks; if accepted, two batches read. */
static void try_open(const char *name, PlanDType dt, const int64_t *example, int erank,
                     size_t each, int64_t limit, int rank, int ranks)
{
    char err[512];
    NpyLoader *l = rt_npy_open(path, name, dt, example, erank, limit, rank, ranks, err, sizeof err);
    if (l) {
        read_batches(l, each, dt == PD_I32);
        rt_npy_close(l);
    } else if (!err[0]) {
        fprintf(stderr, "fuzz_npy: refused without a message\n");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) {
        perror("fuzz_npy: writing the input");
        abort();
    }
    const int64_t pair[2] = {2, 3}, three[1] = {3};
    try_open("x", PD_F32, pair, 2, 6, 0, 1, 2);
    try_open("y", PD_I32, three, 1, 3, 5, 0, 1);
    return 0;
}
