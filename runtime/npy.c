/* npy.c: the examples of one model input from NumPy .npy files (--input).
 * Reads: the files matching a glob pattern, in name order, each mapped
 * read-only and checked whole at open: the magic and version (1.0, 2.0 or
 * 3.0), the header's dict (its dtype the input's, little-endian, C order; its
 * shape (N, example...) where the example is the input's shape without the
 * batch dimension), the size (exactly the header and N examples), and for an
 * i32 input with a limit every element in [0, limit).
 * Writes: rows of examples into the caller's array.
 * Key idea: as the token files (data.c), the files in name order are one
 * stream of examples that repeats forever. The global batch at position p
 * has R*K rows, global row g being example p + g (modulo the examples); rank
 * k takes global rows k, k+K, ... (its row r is global row r*K + k), and the
 * next global batch starts at p + R*K. A position is one example index. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/files.h"
#include "runtime/runtime.h"

enum { PREFIX = 8 }; /* "\x93NUMPY", major, minor; then the header's length */

typedef RtFile NpyFile; /* its items: examples */

struct NpyLoader {
    glob_t files;
    NpyFile *f;
    size_t nf;
    size_t example; /* bytes */
    int64_t total;  /* examples in all files */
    int64_t pos;
    int rank, ranks;
};

static const char *descr_of(PlanDType dt)
{
    switch (dt) {
    case PD_F32: return "<f4";
    case PD_F64: return "<f8";
    case PD_I32: return "<i4";
    default: return NULL;
    }
}

/* The value of 'key' in the header's dict: the text after "'key':" and blanks. */
static const char *dict_value(const char *h, const char *key)
{
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", key);
    const char *at = strstr(h, quoted);
    if (!at)
        return NULL;
    at += strlen(quoted);
    while (*at == ' ')
        at++;
    if (*at++ != ':')
        return NULL;
    while (*at == ' ')
        at++;
    return at;
}

/* The header of f: version, length, dict; f->count and f->data set when the
 * dtype and the example shape (erank dims) are the input's. */
static int read_header(NpyFile *f, const char *input, PlanDType dt, const int64_t *example,
                       int erank, size_t ebytes, char *err, size_t n)
{
    const unsigned char *m = f->map;
    if (memcmp(m, "\x93NUMPY", 6) != 0)
        return plan_errorf(err, n, "%s: not a .npy file (no \\x93NUMPY magic)", f->path);
    if (m[6] < 1 || m[6] > 3)
        return plan_errorf(err, n, "%s: .npy version %d.%d (1.0, 2.0 and 3.0 are read)", f->path,
                           m[6], m[7]);
    size_t at = PREFIX + (m[6] == 1 ? 2 : 4); /* the header's length: 2 bytes, or 4 */
    if (f->size < at)
        return plan_errorf(err, n, "%s: truncated header (the file ends within it)", f->path);
    size_t len = m[6] == 1 ? (size_t)m[8] | (size_t)m[9] << 8
                           : (size_t)m[8] | (size_t)m[9] << 8 | (size_t)m[10] << 16 |
                                 (size_t)m[11] << 24;
    if (len > f->size - at)
        return plan_errorf(err, n, "%s: truncated header (the file ends within it)", f->path);
    char *h = malloc(len + 1);
    if (!h)
        return plan_errorf(err, n, "malloc: out of memory");
    memcpy(h, m + at, len);
    h[len] = 0;
    const char *descr = dict_value(h, "descr"), *order = dict_value(h, "fortran_order");
    const char *shape = dict_value(h, "shape"), *want = descr_of(dt);
    int rc = -1;
    int64_t dims[PLAN_MAX_RANK + 1];
    int nd = 0;
    if (!descr || !*descr || !order || !shape || *shape != '(') {
        plan_errorf(err, n, "%s: the header has no 'descr', 'fortran_order' or 'shape'", f->path);
    } else if (descr[0] != '\'' || strncmp(descr + 1, want, 3) != 0 || descr[4] != '\'') {
        const char *q = descr[0] ? strchr(descr + 1, '\'') : NULL; /* the quoted dtype */
        int w = q && q - descr < 16 ? (int)(q - descr + 1) : (int)strnlen(descr, 8);
        plan_errorf(err, n, "%s: dtype %.*s, the input '%s' is %s (numpy '%s')", f->path, w, descr,
                    input, plan_dtype_name(dt), want);
    } else if (strncmp(order, "False", 5) != 0) {
        plan_errorf(err, n, "%s: Fortran order; write the array in C order", f->path);
    } else {
        const char *p = shape + 1;
        rc = 0;
        while (rc == 0 && *p != ')') {
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p || v < 0 || nd > PLAN_MAX_RANK)
                rc = plan_errorf(err, n, "%s: cannot read the shape %.40s", f->path, shape);
            else
                dims[nd++] = v;
            p = end;
            while (rc == 0 && (*p == ',' || *p == ' ' || *p == 'L'))
                p++;
        }
        int same = rc == 0 && nd == erank + 1;
        for (int d = 0; same && d < erank; d++)
            same = dims[d + 1] == example[d];
        if (rc == 0 && !same) {
            char want_s[160] = "(N", *w = want_s + 2;
            for (int d = 0; d < erank; d++)
                w += snprintf(w, (size_t)(want_s + sizeof want_s - w), ", %" PRId64, example[d]);
            snprintf(w, (size_t)(want_s + sizeof want_s - w), ")");
            rc = plan_errorf(err, n, "%s: shape %.*s, the input '%s' takes examples of shape %s",
                             f->path, (int)(strchr(shape, ')') ? strchr(shape, ')') - shape + 1 : 8),
                             shape, input, want_s);
        }
    }
    free(h);
    if (rc)
        return -1;
    f->count = dims[0];
    f->data = m + at + len;
    uint64_t body = (uint64_t)(f->size - at - len), want_b = (uint64_t)f->count * ebytes;
    if (f->count < 1)
        return plan_errorf(err, n, "%s: no examples (shape starts with 0)", f->path);
    if (body < want_b)
        return plan_errorf(err, n, "%s: truncated: the header says %" PRId64 " examples, the file "
                                   "holds %" PRIu64 " bytes of data, not %" PRIu64,
                           f->path, f->count, body, want_b);
    if (body > want_b)
        return plan_errorf(err, n, "%s: too long: %" PRIu64 " bytes of data after the header, "
                                   "%" PRId64 " examples take %" PRIu64,
                           f->path, body, f->count, want_b);
    return 0;
}

/* Every id of an i32 file in [0, limit); the first one that is not is named. */
static int check_ids(const NpyFile *f, size_t ebytes, int64_t limit, char *err, size_t n)
{
    int64_t count = f->count * (int64_t)(ebytes / 4);
    for (int64_t i = 0; i < count; i++) {
        int32_t v;
        memcpy(&v, f->data + 4 * i, 4);
        if (v < 0 || v >= limit)
            return plan_errorf(err, n, "%s: element %" PRId64 " is %" PRId32 ", outside [0, %" PRId64
                                       ")",
                               f->path, i, v, limit);
    }
    return 0;
}

NpyLoader *rt_npy_open(const char *pattern, const char *input, PlanDType dt,
                       const int64_t *example, int erank, int64_t limit, int rank, int ranks,
                       char *err, size_t n)
{
    if (!descr_of(dt)) {
        plan_errorf(err, n, "input '%s' is %s: .npy files feed f32, f64 and i32 inputs", input,
                    plan_dtype_name(dt));
        return NULL;
    }
    if (ranks < 1 || rank < 0 || rank >= ranks) {
        plan_errorf(err, n, "rank %d is not in [0, %d)", rank, ranks);
        return NULL;
    }
    NpyLoader *l = calloc(1, sizeof *l);
    if (!l) {
        plan_errorf(err, n, "calloc: out of memory for a loader");
        return NULL;
    }
    l->rank = rank, l->ranks = ranks;
    l->example = plan_dtype_size(dt);
    for (int d = 0; d < erank; d++)
        l->example *= (size_t)example[d];
    int rc = rt_files_glob(pattern, &l->files, err, n);
    l->nf = rc ? 0 : l->files.gl_pathc;
    if (!rc && !(l->f = calloc(l->nf, sizeof *l->f)))
        rc = plan_errorf(err, n, "calloc: out of memory");
    for (size_t i = 0; !rc && i < l->nf; i++) {
        NpyFile *f = &l->f[i];
        f->path = l->files.gl_pathv[i];
        rc = rt_file_map(f->path, PREFIX + 2, "header", &f->map, &f->size, err, n) ||
             read_header(f, input, dt, example, erank, l->example, err, n) ||
             (dt == PD_I32 && limit > 0 && check_ids(f, l->example, limit, err, n));
        f->start = l->total;
        l->total += f->count;
    }
    if (rc) {
        rt_npy_close(l);
        return NULL;
    }
    return l;
}

void rt_npy_close(NpyLoader *l)
{
    if (!l)
        return;
    rt_files_close(l->f, l->nf, &l->files);
    free(l);
}

/* Example e (in [0, total)) of the stream. */
static const unsigned char *example_at(const NpyLoader *l, int64_t e)
{
    const NpyFile *f = &l->f[rt_files_find(l->f, l->nf, e)];
    return f->data + (size_t)(e - f->start) * l->example;
}

int rt_npy_next(NpyLoader *l, int64_t rows, void *out, char *err, size_t n)
{
    if (rows < 1)
        return plan_errorf(err, n, "rows %" PRId64 " is not positive", rows);
    for (int64_t r = 0; r < rows; r++) {
        int64_t g = r * l->ranks + l->rank;
        memcpy((char *)out + (size_t)r * l->example, example_at(l, (l->pos + g) % l->total),
               l->example);
    }
    l->pos = (int64_t)(((uint64_t)l->pos + (uint64_t)rows * (uint64_t)l->ranks) %
                       (uint64_t)l->total);
    return 0;
}

int64_t rt_npy_tell(const NpyLoader *l)
{
    return l->pos;
}

int rt_npy_seek(NpyLoader *l, int64_t position, char *err, size_t n)
{
    if (position < 0 || position >= l->total)
        return plan_errorf(err, n, "example position %" PRId64 " is outside [0, %" PRId64 ")",
                           position, l->total);
    l->pos = position;
    return 0;
}

int64_t rt_npy_examples(const NpyLoader *l)
{
    return l->total;
}
