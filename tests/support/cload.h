/* cload.h: C text compiled to a shared object and loaded, for the tests of
 * the C rendering's helpers. The including file includes Criterion and
 * <dlfcn.h> first. */
#ifndef TCC_TEST_CLOAD_H
#define TCC_TEST_CLOAD_H

#include <stdio.h>
#include <stdlib.h>

/* dir/k.c made of head then tail, compiled by `cc FLAGS -fPIC -shared` into
 * dir/k.so, loaded. */
static void *cload(const char *dir, const char *head, const char *tail, const char *flags)
{
    char path[128], so_path[128], cmd[640];
    snprintf(path, sizeof path, "%s/k.c", dir);
    snprintf(so_path, sizeof so_path, "%s/k.so", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(head, f);
    fputs(tail, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc %s -fPIC -shared -o %s %s -lm", flags, so_path, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    void *so = dlopen(so_path, RTLD_NOW);
    cr_assert_not_null(so, "%s", dlerror());
    return so;
}

#endif
