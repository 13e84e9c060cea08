/* fuzz_plan.c: libFuzzer harness for the plan loader (plan/json_read.c). Reads
 * arbitrary bytes as a plan.json file. The loader must refuse bad input with
 * a message, never crash or leak; a plan it accepts must pass plan_check,
 * and write and load back with the same hash. */
#include "plan/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char in_path[64], out_path[80];

static void remove_files(void)
{
    unlink(in_path);
    unlink(out_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    strcpy(in_path, "/tmp/fuzz_plan_XXXXXX");
    int fd = mkstemp(in_path);
    if (fd < 0) {
        perror("fuzz_plan: mkstemp");
        abort();
    }
    close(fd);
    snprintf(out_path, sizeof out_path, "%s.out", in_path);
    atexit(remove_files);
    return 0;
}

static void fail(const char *what, const char *err)
{
    fprintf(stderr, "fuzz_plan: %s: %s\n", what, err);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[1024];
    FILE *f = fopen(in_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f))
        fail("writing the input", in_path);
    Plan *p = plan_load(in_path, err, sizeof err);
    if (!p) {
        if (!*err || strchr(err, '\n'))
            fail("a refusal needs a one-line message", err);
        return 0;
    }
    if (plan_check(p, err, sizeof err))
        fail("a loaded plan fails plan_check", err);
    char hash[17];
    memcpy(hash, p->hash, sizeof hash);
    if (plan_write(out_path, p, err, sizeof err))
        fail("a loaded plan does not write", err);
    Plan *q = plan_load(out_path, err, sizeof err);
    if (!q)
        fail("a written plan does not load", err);
    if (strcmp(q->hash, hash))
        fail("the hash changed in a round trip", q->hash);
    plan_free(q);
    plan_free(p);
    return 0;
}
