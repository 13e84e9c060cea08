/* test_data.c: the token data loader and writer (runtime/data.c) on shards
 * written here, with rt_data_write or by hand for corrupt ones, in a fresh
 * temporary directory. Batches are compared with the token stream itself (the
 * shards' tokens in name order, repeated) for odd sizes that cross shard
 * boundaries and wrap around; tell/seek must give identical next batches; ranks
 * must take the global batch's rows as runtime.h documents; every bad input
 * must give its one-line message naming the file. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "tests/support/tmpdir.h"

enum { HEADER = 1024, MAX_TOKENS = 4096 };

static char dir[64];
static char err[1024];

static void make_dir(void)
{
    tmpdir_make(dir, "data");
}

static void remove_dir(void)
{
    tmpdir_remove(dir);
}

TestSuite(data, .init = make_dir, .fini = remove_dir);

/* ---- helpers ---- */

static const char *path_of(const char *name)
{
    static char path[4][256];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", dir, name);
    return p;
}

/* Shard name with count tokens first, first+1, ... (mod 256). */
static void write_shard(const char *name, int64_t count, int first, uint16_t *stream, int64_t *len)
{
    uint16_t t[MAX_TOKENS];
    for (int64_t i = 0; i < count; i++)
        t[i] = (uint16_t)((first + i) % 256);
    cr_assert_eq(rt_data_write(path_of(name), t, count, err, sizeof err), 0, "%s", err);
    if (stream) {
        memcpy(stream + *len, t, (size_t)count * sizeof *t);
        *len += count;
    }
}

static void put32(unsigned char *p, int32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)((uint32_t)v >> 8 * i);
}

/* A file of len bytes: a header (magic, version, count), then tokens 1, 2, ... as uint16 LE. */
static void write_raw(const char *name, int32_t magic, int32_t version, int32_t count, size_t len)
{
    static unsigned char buf[HEADER + 2 * MAX_TOKENS];
    cr_assert(len <= sizeof buf);
    memset(buf, 0, sizeof buf);
    put32(buf, magic);
    put32(buf + 4, version);
    put32(buf + 8, count);
    for (size_t i = HEADER; i + 1 < sizeof buf; i += 2)
        buf[i] = (unsigned char)((i - HEADER) / 2 + 1);
    FILE *f = fopen(path_of(name), "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

/* Opening pattern (relative to dir) must fail with a message holding want and want2. */
static void expect_open_error(const char *pattern, int64_t vocab, const char *want,
                              const char *want2)
{
    err[0] = '\0';
    DataLoader *d = rt_data_open(*pattern ? path_of(pattern) : "", vocab, 0, 1, err, sizeof err);
    cr_assert_null(d, "opening '%s' should fail with '%s'", pattern, want);
    cr_assert_not_null(strstr(err, want), "message '%s' lacks '%s'", err, want);
    if (want2)
        cr_assert_not_null(strstr(err, want2), "message '%s' lacks '%s'", err, want2);
    cr_assert_null(strchr(err, '\n'), "message '%s' is not one line", err);
}

static DataLoader *open_ok(const char *pattern, int rank, int ranks)
{
    DataLoader *d = rt_data_open(path_of(pattern), 256, rank, ranks, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    return d;
}

/* One batch of d against the stream, from position p: row r starts at p + r*(seq+1). */
static void check_batch(DataLoader *d, const uint16_t *stream, int64_t len, int64_t rows,
                        int64_t seq, int64_t p)
{
    int32_t in[256], tg[256];
    cr_assert_eq(rt_data_tell(d), p);
    cr_assert_eq(rt_data_next(d, rows, seq, in, tg, err, sizeof err), 0, "%s", err);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < seq; j++) {
            int64_t at = p + r * (seq + 1) + j;
            cr_assert_eq(in[r * seq + j], stream[at % len], "input row %ld col %ld at %ld", r, j,
                         p);
            cr_assert_eq(tg[r * seq + j], stream[(at + 1) % len], "target row %ld col %ld at %ld",
                         r, j, p);
        }
    cr_assert_eq(rt_data_tell(d), (p + rows * (seq + 1)) % len);
}

/* ---- reading ---- */

Test(data, write_gives_the_llmc_layout)
{
    uint16_t t[3] = {1, 0x1234, 65535};
    unsigned char buf[HEADER + 8];
    cr_assert_eq(rt_data_write(path_of("x.bin"), t, 3, err, sizeof err), 0, "%s", err);
    FILE *f = fopen(path_of("x.bin"), "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fread(buf, 1, sizeof buf, f), HEADER + 6);
    fclose(f);
    int32_t h[3];
    for (int i = 0; i < 3; i++)
        h[i] = buf[4 * i] | buf[4 * i + 1] << 8 | buf[4 * i + 2] << 16 | buf[4 * i + 3] << 24;
    cr_assert_eq(h[0], 20240520);
    cr_assert_eq(h[1], 1);
    cr_assert_eq(h[2], 3);
    for (int i = 12; i < HEADER; i++)
        cr_assert_eq(buf[i], 0, "header byte %d", i);
    cr_assert_eq(buf[HEADER + 2], 0x34); /* little-endian */
    cr_assert_eq(buf[HEADER + 3], 0x12);
    DataLoader *d = rt_data_open(path_of("x.bin"), 65536, 0, 1, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    int32_t in[2], tg[2];
    cr_assert_eq(rt_data_next(d, 1, 2, in, tg, err, sizeof err), 0, "%s", err);
    cr_assert(in[0] == 1 && in[1] == 0x1234 && tg[0] == 0x1234 && tg[1] == 65535);
    rt_data_close(d);
}

Test(data, batches_cross_shards_and_wrap)
{
    uint16_t stream[64];
    int64_t len = 0;
    write_shard("shard-000.bin", 7, 10, stream, &len);
    write_shard("shard-001.bin", 11, 50, stream, &len);
    DataLoader *d = open_ok("shard-*.bin", 0, 1);
    cr_assert_eq(rt_data_tokens(d), 18);
    static const int64_t shapes[][2] = {{3, 5}, {2, 5}, {1, 1}, {4, 7}, {3, 5}, {5, 2}};
    int64_t p = 0;
    for (int k = 0; k < 40; k++) {
        int64_t rows = shapes[k % 6][0], seq = shapes[k % 6][1];
        check_batch(d, stream, len, rows, seq, p);
        p = (p + rows * (seq + 1)) % len;
    }
    rt_data_close(d);
}

Test(data, three_shards_in_name_order)
{
    uint16_t stream[64];
    int64_t len = 0;
    /* Written out of order: the stream follows the names. */
    write_shard("c.bin", 13, 200, NULL, NULL);
    write_shard("a.bin", 7, 10, stream, &len);
    write_shard("b.bin", 11, 50, stream, &len);
    write_shard("c.bin", 13, 200, stream, &len);
    DataLoader *d = open_ok("*.bin", 0, 1);
    cr_assert_eq(rt_data_tokens(d), 31);
    int64_t p = 0;
    for (int k = 0; k < 40; k++) {
        check_batch(d, stream, len, 3, 5, p);
        p = (p + 18) % len;
    }
    rt_data_close(d);
}

Test(data, batch_larger_than_the_data_repeats_it)
{
    uint16_t stream[8];
    int64_t len = 0;
    write_shard("s.bin", 2, 7, stream, &len);
    DataLoader *d = open_ok("s.bin", 0, 1);
    check_batch(d, stream, len, 3, 5, 0);
    check_batch(d, stream, len, 1, 2, 0);
    check_batch(d, stream, len, 1, 2, 1);
    rt_data_close(d);
}

/* The next three batches of d (rows 3, seq 5) into out. */
static void next_three(DataLoader *d, int32_t out[3][2][15])
{
    for (int k = 0; k < 3; k++)
        cr_assert_eq(rt_data_next(d, 3, 5, out[k][0], out[k][1], err, sizeof err), 0, "%s", err);
}

Test(data, tell_seek_round_trip)
{
    write_shard("shard-000.bin", 7, 10, NULL, NULL);
    write_shard("shard-001.bin", 11, 50, NULL, NULL);
    write_shard("shard-002.bin", 13, 100, NULL, NULL);
    DataLoader *d = open_ok("shard-*.bin", 0, 1);
    int32_t skip[2][15], first[3][2][15], again[3][2][15], fresh[3][2][15];
    for (int k = 0; k < 4; k++)
        cr_assert_eq(rt_data_next(d, 3, 5, skip[0], skip[1], err, sizeof err), 0, "%s", err);
    int64_t pos = rt_data_tell(d);
    cr_assert_eq(pos, 4 * 18 % 31);
    next_three(d, first);
    cr_assert_eq(rt_data_seek(d, pos, err, sizeof err), 0, "%s", err);
    next_three(d, again);
    cr_assert_eq(memcmp(first, again, sizeof first), 0);
    /* A new loader (a restart from a checkpoint) continues the same way. */
    DataLoader *e = open_ok("shard-*.bin", 0, 1);
    cr_assert_eq(rt_data_seek(e, pos, err, sizeof err), 0, "%s", err);
    next_three(e, fresh);
    cr_assert_eq(memcmp(first, fresh, sizeof first), 0);
    cr_assert_eq(rt_data_tell(e), rt_data_tell(d));
    /* Out of range: refused, the position unchanged. */
    int64_t bad[] = {-1, 31, 1000, INT64_MIN};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(rt_data_seek(e, bad[i], err, sizeof err), -1);
        cr_assert_not_null(strstr(err, "outside the stream of 31 tokens"), "%s", err);
    }
    cr_assert_eq(rt_data_tell(e), rt_data_tell(d));
    cr_assert_eq(rt_data_seek(e, 30, err, sizeof err), 0, "%s", err);
    rt_data_close(d);
    rt_data_close(e);
}

/* With ranks K, rank k's row r is row r*K + k of the single-rank batch of rows*K rows. */
static void check_ranks(int ranks, int64_t rows, int64_t seq, int batches)
{
    DataLoader *all = open_ok("shard-*.bin", 0, 1), *d[4];
    for (int k = 0; k < ranks; k++)
        d[k] = open_ok("shard-*.bin", k, ranks);
    for (int b = 0; b < batches; b++) {
        int32_t gin[256], gtg[256], in[64], tg[64];
        cr_assert_eq(rt_data_next(all, rows * ranks, seq, gin, gtg, err, sizeof err), 0);
        for (int k = 0; k < ranks; k++) {
            cr_assert_eq(rt_data_next(d[k], rows, seq, in, tg, err, sizeof err), 0, "%s", err);
            for (int64_t r = 0; r < rows; r++) {
                int64_t g = r * ranks + k;
                cr_assert_eq(memcmp(in + r * seq, gin + g * seq, (size_t)seq * 4), 0,
                             "batch %d rank %d row %ld", b, k, r);
                cr_assert_eq(memcmp(tg + r * seq, gtg + g * seq, (size_t)seq * 4), 0,
                             "batch %d rank %d row %ld targets", b, k, r);
            }
            cr_assert_eq(rt_data_tell(d[k]), rt_data_tell(all), "every rank at the same place");
        }
    }
    for (int k = 0; k < ranks; k++)
        rt_data_close(d[k]);
    rt_data_close(all);
}

Test(data, ranks_take_interleaved_rows_of_the_global_batch)
{
    write_shard("shard-000.bin", 7, 10, NULL, NULL);
    write_shard("shard-001.bin", 11, 50, NULL, NULL);
    check_ranks(2, 3, 5, 10);
    check_ranks(3, 2, 4, 10);
    check_ranks(4, 1, 1, 10);
}

Test(data, ranks_two_rows_explicitly)
{
    /* 18 tokens 10..16, 50..60; rows 3 per rank, seq 5, 2 ranks: global rows of 6 tokens
     * from 0, 6, 12, 18=0, 24=6, 30=12; rank 1 takes global rows 1, 3, 5. */
    uint16_t stream[32];
    int64_t len = 0;
    write_shard("shard-000.bin", 7, 10, stream, &len);
    write_shard("shard-001.bin", 11, 50, stream, &len);
    DataLoader *d = open_ok("shard-*.bin", 1, 2);
    int32_t in[15], tg[15];
    cr_assert_eq(rt_data_next(d, 3, 5, in, tg, err, sizeof err), 0, "%s", err);
    static const int64_t starts[3] = {6, 0, 12};
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 5; j++) {
            cr_assert_eq(in[r * 5 + j], stream[(starts[r] + j) % len]);
            cr_assert_eq(tg[r * 5 + j], stream[(starts[r] + j + 1) % len]);
        }
    cr_assert_eq(rt_data_tell(d), 36 % 18);
    rt_data_close(d);
}

/* ---- bad input ---- */

Test(data, wrong_magic)
{
    write_raw("m.bin", 1234, 1, 4, HEADER + 8);
    expect_open_error("m.bin", 256, "not a token file (magic 1234, expected 20240520)", "m.bin");
}

Test(data, wrong_version)
{
    write_raw("v.bin", 20240520, 2, 4, HEADER + 8);
    expect_open_error("v.bin", 256, "unsupported version 2", "v.bin");
}

Test(data, truncated_header)
{
    size_t cuts[] = {0, 1, 12, 100, HEADER - 1};
    for (int i = 0; i < 5; i++) {
        write_raw("h.bin", 20240520, 1, 4, cuts[i]);
        expect_open_error("h.bin", 256, "truncated header", "h.bin");
    }
}

Test(data, truncated_body_at_several_points)
{
    char want[128];
    size_t cuts[] = {HEADER, HEADER + 1, HEADER + 2, HEADER + 9, HEADER + 20, HEADER + 21};
    for (int i = 0; i < 6; i++) {
        write_raw("t.bin", 20240520, 1, 11, cuts[i]);
        snprintf(want, sizeof want, "truncated: header says 11 tokens, file holds %zu",
                 (cuts[i] - HEADER) / 2);
        expect_open_error("t.bin", 256, want, "t.bin");
    }
    write_raw("t.bin", 20240520, 1, 11, HEADER + 22);
    DataLoader *d = open_ok("t.bin", 0, 1);
    rt_data_close(d);
}

Test(data, longer_than_its_header_says)
{
    write_raw("l.bin", 20240520, 1, 3, HEADER + 7);
    expect_open_error("l.bin", 256, "too long: header says 3 tokens", "l.bin");
    write_raw("l.bin", 20240520, 1, -5, HEADER + 8);
    expect_open_error("l.bin", 256, "negative token count -5", "l.bin");
}

Test(data, token_outside_the_vocabulary)
{
    uint16_t t[8] = {1, 2, 3, 4, 300, 5, 400, 6};
    write_shard("a.bin", 5, 0, NULL, NULL);
    cr_assert_eq(rt_data_write(path_of("b.bin"), t, 8, err, sizeof err), 0, "%s", err);
    expect_open_error("*.bin", 256, "token 300 at index 4 is outside the vocabulary of size 256",
                      "b.bin");
    expect_open_error("*.bin", 4, "token 4 at index 4 is outside the vocabulary of size 4",
                      "a.bin");
    DataLoader *d = rt_data_open(path_of("*.bin"), 401, 0, 1, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    rt_data_close(d);
}

Test(data, shard_with_fewer_than_two_tokens)
{
    uint16_t t[1] = {7};
    cr_assert_eq(rt_data_write(path_of("one.bin"), t, 1, err, sizeof err), 0, "%s", err);
    expect_open_error("one.bin", 256, "1 token, a shard needs at least 2", "one.bin");
    cr_assert_eq(rt_data_write(path_of("zero.bin"), NULL, 0, err, sizeof err), 0, "%s", err);
    expect_open_error("zero.bin", 256, "0 tokens, a shard needs at least 2", "zero.bin");
}

Test(data, no_match_and_empty_pattern)
{
    char want[256];
    snprintf(want, sizeof want, "no file matches '%s/*.nothing'", dir);
    expect_open_error("*.nothing", 256, want, NULL);
    cr_assert_eq(mkdir(path_of("empty"), 0755), 0);
    snprintf(want, sizeof want, "no file matches '%s/empty/*'", dir);
    expect_open_error("empty/*", 256, want, NULL);
    expect_open_error("", 256, "no data file pattern given", NULL);
    cr_assert_null(rt_data_open(NULL, 256, 0, 1, err, sizeof err));
    cr_assert_not_null(strstr(err, "no data file pattern given"), "%s", err);
}

Test(data, cannot_open_or_not_a_file)
{
    write_shard("a.bin", 5, 0, NULL, NULL);
    cr_assert_eq(symlink(path_of("missing"), path_of("b.bin")), 0);
    expect_open_error("*.bin", 256, "cannot open", "b.bin: No such file or directory");
    cr_assert_eq(unlink(path_of("b.bin")), 0);
    cr_assert_eq(mkdir(path_of("c.bin"), 0755), 0);
    expect_open_error("*.bin", 256, "c.bin: not a regular file", NULL);
}

Test(data, bad_arguments)
{
    write_shard("a.bin", 5, 0, NULL, NULL);
    cr_assert_null(rt_data_open(path_of("a.bin"), 256, 2, 2, err, sizeof err));
    cr_assert_not_null(strstr(err, "rank 2 is not in [0, 2)"), "%s", err);
    cr_assert_null(rt_data_open(path_of("a.bin"), 256, 0, 0, err, sizeof err));
    cr_assert_null(rt_data_open(path_of("a.bin"), 0, 0, 1, err, sizeof err));
    cr_assert_not_null(strstr(err, "vocabulary size 0"), "%s", err);
    DataLoader *d = open_ok("a.bin", 0, 1);
    int32_t in[4], tg[4];
    cr_assert_eq(rt_data_next(d, 0, 2, in, tg, err, sizeof err), -1);
    cr_assert_eq(rt_data_next(d, 2, 0, in, tg, err, sizeof err), -1);
    cr_assert_eq(rt_data_next(d, 2, 2, NULL, tg, err, sizeof err), -1);
    cr_assert_eq(rt_data_next(d, INT64_MAX / 2, 2, in, tg, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "too large"), "%s", err);
    cr_assert_eq(rt_data_next(d, 1, INT64_MAX, in, tg, err, sizeof err), -1);
    cr_assert_eq(rt_data_tell(d), 0, "a refused batch does not move");
    cr_assert_eq(rt_data_next(NULL, 1, 1, in, tg, err, sizeof err), -1);
    cr_assert_eq(rt_data_seek(NULL, 0, err, sizeof err), -1);
    cr_assert_eq(rt_data_tell(NULL), -1);
    cr_assert_eq(rt_data_tokens(NULL), 0);
    rt_data_close(NULL);
    rt_data_close(d);
}

Test(data, write_errors)
{
    uint16_t t[2] = {1, 2};
    cr_assert_eq(rt_data_write(path_of("no/such/dir.bin"), t, 2, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "cannot write"), "%s", err);
    cr_assert_not_null(strstr(err, "No such file or directory"), "%s", err);
    cr_assert_eq(rt_data_write(path_of("x.bin"), t, -1, err, sizeof err), -1);
    cr_assert_eq(rt_data_write(path_of("x.bin"), NULL, 2, err, sizeof err), -1);
    cr_assert_eq(rt_data_write(NULL, t, 2, err, sizeof err), -1);
    cr_assert_eq(access(path_of("x.bin"), F_OK), -1, "nothing written");
    /* Over an existing shard: replaced whole. */
    write_shard("x.bin", 9, 0, NULL, NULL);
    cr_assert_eq(rt_data_write(path_of("x.bin"), t, 2, err, sizeof err), 0, "%s", err);
    struct stat st;
    cr_assert_eq(stat(path_of("x.bin"), &st), 0);
    cr_assert_eq(st.st_size, HEADER + 4);
}
