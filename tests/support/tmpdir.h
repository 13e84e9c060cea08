/* tmpdir.h: each test of a suite in a fresh directory under /tmp, removed
 * with everything in it afterwards. The including file defines _XOPEN_SOURCE
 * 700 (nftw) before any include, and includes Criterion first. */
#ifndef TCC_TEST_TMPDIR_H
#define TCC_TEST_TMPDIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

static int tmpdir_remove_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    return remove(p);
}

/* /tmp/tcc-test-TAG-XXXXXX, made, into dir[64]. */
static void tmpdir_make(char *dir, const char *tag)
{
    snprintf(dir, 64, "/tmp/tcc-test-%s-XXXXXX", tag);
    cr_assert_not_null(mkdtemp(dir));
}

static void tmpdir_remove(const char *dir) { nftw(dir, tmpdir_remove_one, 8, FTW_DEPTH | FTW_PHYS); }

#endif
