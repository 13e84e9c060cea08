/* samples.c: a sample model's source for the tests, its model line (the
 * parameter defaults) optionally replaced to shrink it. Reads samples/ from
 * the project root (where the tests run). */
#include "tests/support/programs.h"

#include <stdio.h>
#include <string.h>

const char *test_sample(const char *file, const char *model_line)
{
    static char buf[65536];
    char path[256];
    snprintf(path, sizeof path, "samples/%s", file);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = !strncmp(buf, "model ", 6) ? buf : strstr(buf, "\nmodel "); /* a line's start */
    p = p && p != buf ? p + 1 : p;
    char *end = p ? strchr(p, ')') : NULL;
    if (!model_line)
        return buf;
    if (!end || n - (size_t)(end - buf) + strlen(model_line) >= sizeof buf)
        return NULL;
    memmove(p + strlen(model_line), end + 1, strlen(end + 1) + 1);
    memcpy(p, model_line, strlen(model_line));
    return buf;
}
