/* tccdata.c: the tccdata command: text files to byte-level token shards.
 * Reads: the text files named on the command line. Writes: PREFIX_train.bin
 * and PREFIX_val.bin in llm.c's token format (rt_data_write), statistics to
 * stdout; errors to stderr, exit status 1.
 * Key idea: every byte is one token (vocabulary 256), and the split is by one
 * contiguous chunk per file: the val part of a file is round(F * its size)
 * consecutive bytes, at the end of the file, or with --seed S at an offset
 * drawn from S and the file's place on the command line; the bytes before and
 * after it, in order, go to train. Files follow each other in the order given. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

static const char *USAGE =
    "usage: tccdata [-o PREFIX] [--val-fraction F] [--seed S] FILE... [--help]\n"
    "Turns text files into byte-level tokens (vocabulary 256: each byte is one token)\n"
    "and writes PREFIX_train.bin and PREFIX_val.bin (default prefix 'data') in llm.c's\n"
    "token format. Of each file, one contiguous chunk of round(F * size) bytes goes\n"
    "to val (F in [0, 1), default 0.1; with 0 no val file is written): the end of\n"
    "the file, or with --seed S a chunk at an offset drawn from S. The rest of the\n"
    "file goes to train, in order. Prints the files, bytes, tokens of each split,\n"
    "the 10 most frequent bytes and the byte entropy.\n";

enum { TOP_BYTES = 10, MIN_TOKENS = 2 };

typedef struct Options {
    const char *prefix;
    double val_fraction;
    int seeded;
    uint64_t seed;
    char **files;
    int nfiles;
} Options;

/* A growing array of tokens. */
typedef struct Tokens {
    uint16_t *t;
    size_t len, cap;
} Tokens;

typedef struct Stats {
    int64_t bytes;
    int64_t count[256];
} Stats;

/* ---- options ---- */

static int parse_seed(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s && *s && *s != '-' ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *s == '-' || *end || errno) {
        fprintf(stderr, "tccdata: --seed needs a whole number%s%s%s\n", s ? ", not '" : "",
                s ? s : "", s ? "'" : "");
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_fraction(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = s && *s ? strtod(s, &end) : -1;
    if (!s || !*s || *end || errno || !(v >= 0 && v < 1)) {
        fprintf(stderr, "tccdata: --val-fraction needs a number in [0, 1)%s%s%s\n",
                s ? ", not '" : "", s ? s : "", s ? "'" : "");
        return -1;
    }
    *out = v;
    return 0;
}

/* One option at argv[*i] (its value, if any, after it). 0, 1 for --help, -1 after a message. */
static int parse_option(int argc, char **argv, int *i, Options *o)
{
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        fputs(USAGE, stdout);
        return 1;
    }
    int rc;
    if (!strcmp(a, "-o")) {
        rc = val && *val ? 0 : -1;
        if (rc)
            fprintf(stderr, "tccdata: -o needs an output prefix\n");
        o->prefix = val;
    } else if (!strcmp(a, "--val-fraction")) {
        rc = parse_fraction(val, &o->val_fraction);
    } else if (!strcmp(a, "--seed")) {
        rc = parse_seed(val, &o->seed);
        o->seeded = 1;
    } else {
        fprintf(stderr, "tccdata: unknown option '%s' (try --help)\n", a);
        return -1;
    }
    *i += 1;
    return rc;
}

/* 0 to run, 1 to exit with 0 (--help), -1 to exit with 1. o->files points into argv. */
static int parse_options(int argc, char **argv, Options *o)
{
    *o = (Options){"data", 0.1, 0, 0, NULL, 0};
    o->files = calloc((size_t)argc, sizeof *o->files);
    if (!o->files) {
        fprintf(stderr, "tccdata: calloc: out of memory\n");
        return -1;
    }
    int options = 1;
    for (int i = 1; i < argc; i++) {
        if (options && !strcmp(argv[i], "--")) {
            options = 0;
        } else if (options && argv[i][0] == '-' && argv[i][1]) {
            int rc = parse_option(argc, argv, &i, o);
            if (rc)
                return rc;
        } else {
            o->files[o->nfiles++] = argv[i];
        }
    }
    if (!o->nfiles) {
        fprintf(stderr, "tccdata: no input file given (try --help)\n");
        return -1;
    }
    return 0;
}

/* ---- reading and splitting ---- */

/* Room for at least one more byte in *buf (cap bytes now). -1 after a message. */
static int grow(const char *path, unsigned char **buf, size_t *cap)
{
    size_t want = *cap ? 2 * *cap : 65536;
    unsigned char *b = *cap < SIZE_MAX / 4 ? realloc(*buf, want) : NULL;
    if (!b) {
        fprintf(stderr, "tccdata: %s: out of memory\n", path);
        return -1;
    }
    *buf = b;
    *cap = want;
    return 0;
}

/* The whole of path in *buf (malloc'ed) and *len; on error a message, -1 and *buf NULL. */
static int read_file(const char *path, unsigned char **buf, size_t *len)
{
    size_t cap = 0, got;
    int bad = 0;
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tccdata: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    do {
        if (*len == cap && grow(path, buf, &cap)) {
            bad = 1;
            break;
        }
        got = fread(*buf + *len, 1, cap - *len, f);
        *len += got;
    } while (*len == cap);
    if (!bad && ferror(f)) {
        fprintf(stderr, "tccdata: read %s: %s\n", path, strerror(errno));
        bad = 1;
    }
    if (fclose(f) && !bad) {
        fprintf(stderr, "tccdata: fclose %s: %s\n", path, strerror(errno));
        bad = 1;
    }
    if (bad) {
        free(*buf);
        *buf = NULL;
    }
    return -bad;
}

static int push(Tokens *v, const unsigned char *bytes, size_t k)
{
    if (v->len + k > v->cap) {
        size_t cap = v->cap ? v->cap : 65536;
        while (cap < v->len + k)
            cap *= 2;
        uint16_t *t = cap < SIZE_MAX / 4 ? realloc(v->t, cap * sizeof *t) : NULL;
        if (!t) {
            fprintf(stderr, "tccdata: out of memory for %zu tokens\n", v->len + k);
            return -1;
        }
        v->t = t;
        v->cap = cap;
    }
    for (size_t i = 0; i < k; i++)
        v->t[v->len++] = bytes[i];
    return 0;
}

/* splitmix64: the seeded offsets of the val chunks. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* File number i (len bytes): its val chunk into val, the bytes around it into train. */
static int split(const Options *o, int i, const unsigned char *b, size_t len, Tokens *train,
                 Tokens *val)
{
    size_t k = (size_t)floor(o->val_fraction * (double)len + 0.5);
    if (k > len)
        k = len;
    size_t at = len - k;
    if (o->seeded)
        at = (size_t)(mix(o->seed ^ mix((uint64_t)i)) % ((uint64_t)(len - k) + 1));
    return push(train, b, at) || push(val, b + at, k) || push(train, b + at + k, len - at - k);
}

static int read_all(const Options *o, Tokens *train, Tokens *val, Stats *st)
{
    for (int i = 0; i < o->nfiles; i++) {
        unsigned char *b;
        size_t len;
        if (read_file(o->files[i], &b, &len))
            return -1;
        for (size_t j = 0; j < len; j++)
            st->count[b[j]]++;
        st->bytes += (int64_t)len;
        int rc = split(o, i, b, len, train, val);
        free(b);
        if (rc)
            return -1;
    }
    return 0;
}

/* ---- writing and statistics ---- */

static int check_sizes(const Options *o, const Stats *st, const Tokens *train, const Tokens *val)
{
    if (st->bytes == 0) {
        fprintf(stderr, "tccdata: empty input: the files hold no bytes\n");
        return -1;
    }
    const char *name = train->len < MIN_TOKENS ? "train" : "val";
    size_t len = train->len < MIN_TOKENS ? train->len : val->len;
    if (train->len >= MIN_TOKENS && (o->val_fraction == 0 || val->len >= MIN_TOKENS))
        return 0;
    fprintf(stderr,
            "tccdata: the %s split holds %zu token%s, a shard needs at least %d "
            "(more text, or another --val-fraction)\n",
            name, len, len == 1 ? "" : "s", MIN_TOKENS);
    return -1;
}

static int write_split(const char *prefix, const char *name, const Tokens *v, char *path,
                       size_t size)
{
    char err[1024];
    if (snprintf(path, size, "%s_%s.bin", prefix, name) >= (int)size) {
        fprintf(stderr, "tccdata: output prefix '%s' too long\n", prefix);
        return -1;
    }
    if (rt_data_write(path, v->t, (int64_t)v->len, err, sizeof err)) {
        fprintf(stderr, "tccdata: %s\n", err);
        return -1;
    }
    return 0;
}

/* A byte as text: 'c' when printable, an escape for the usual controls, else 0xNN. */
static const char *show_byte(int c, char *buf, size_t size)
{
    static const char *esc[] = {['\n'] = "'\\n'", ['\t'] = "'\\t'", ['\r'] = "'\\r'"};
    if (c < (int)(sizeof esc / sizeof *esc) && esc[c])
        snprintf(buf, size, "%s", esc[c]);
    else if (c >= 0x20 && c < 0x7f)
        snprintf(buf, size, "'%c'", c);
    else
        snprintf(buf, size, "0x%02x", c);
    return buf;
}

typedef struct ByteCount {
    int64_t count;
    int byte;
} ByteCount;

/* The most frequent first; ties by byte value. */
static int compare_counts(const void *pa, const void *pb)
{
    const ByteCount *a = pa, *b = pb;
    if (a->count != b->count)
        return a->count > b->count ? -1 : 1;
    return a->byte - b->byte;
}

static void print_top(const Stats *st)
{
    ByteCount bc[256];
    for (int c = 0; c < 256; c++)
        bc[c] = (ByteCount){st->count[c], c};
    qsort(bc, 256, sizeof *bc, compare_counts);
    printf("most frequent bytes:\n");
    for (int i = 0; i < TOP_BYTES && bc[i].count > 0; i++) {
        char buf[8];
        printf("  %-6s %3d %12" PRId64 " %6.2f%%\n", show_byte(bc[i].byte, buf, sizeof buf),
               bc[i].byte, bc[i].count, 100.0 * (double)bc[i].count / (double)st->bytes);
    }
}

static double entropy_bits(const Stats *st)
{
    double h = 0;
    for (int c = 0; c < 256; c++)
        if (st->count[c]) {
            double p = (double)st->count[c] / (double)st->bytes;
            h -= p * log2(p);
        }
    return h;
}

static int run(const Options *o)
{
    Tokens train = {0}, val = {0};
    Stats st = {0};
    char train_path[4096], val_path[4096];
    int rc =
        read_all(o, &train, &val, &st) || check_sizes(o, &st, &train, &val) ||
        write_split(o->prefix, "train", &train, train_path, sizeof train_path) ||
        (o->val_fraction > 0 && write_split(o->prefix, "val", &val, val_path, sizeof val_path));
    if (rc == 0) {
        printf("files: %d\nbytes: %" PRId64 "\n", o->nfiles, st.bytes);
        printf("train: %zu tokens in %s\n", train.len, train_path);
        if (o->val_fraction > 0)
            printf("val: %zu tokens in %s\n", val.len, val_path);
        else
            printf("val: 0 tokens (--val-fraction 0: no file written)\n");
        print_top(&st);
        printf("entropy: %.4f bits per byte\n", entropy_bits(&st));
    }
    free(train.t);
    free(val.t);
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    Options o;
    int rc = parse_options(argc, argv, &o);
    if (rc == 0)
        rc = run(&o);
    free(o.files);
    if (rc >= 0 && fflush(stdout)) {
        fprintf(stderr, "tccdata: writing to stdout: %s\n", strerror(errno));
        rc = -1;
    }
    return rc < 0 ? 1 : 0;
}
