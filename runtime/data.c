/* data.c: token data in llm.c's shard format: the loader and the writer.
 * Reads: the shards matching a glob pattern, each mapped read-only and checked
 * whole at open (header, size, every token against the vocabulary). Writes:
 * batches of int32 inputs and targets into the caller's arrays (nothing is
 * allocated per batch); rt_data_write writes one shard under a temporary name
 * and renames it into place.
 * Key idea: the shards in name order are one token stream that repeats
 * forever, so a position is one token offset in [0, tokens): a batch may cross
 * shard boundaries and the end, and a checkpoint saves a single integer.
 *
 * Layout of a batch (rows R per rank, sequence length S, ranks K, rank k):
 * the global batch at position p has R*K rows; global row g holds the S+1
 * tokens at stream offsets p + g*(S+1) ... p + g*(S+1) + S (modulo the stream
 * length); its inputs are the first S, its targets the last S. Rank k takes
 * global rows k, k+K, k+2K, ...: its row r is global row r*K + k. The next
 * global batch starts at p + R*K*(S+1).
 * The shards must not change while they are open: a mapped file cut short
 * under the loader would fault. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/files.h"
#include "runtime/runtime.h"

enum {
    DATA_MAGIC = 20240520,
    DATA_VERSION = 1, /* uint16 tokens (llm.c's version 2 holds uint32 ones) */
    HEADER_INTS = 256,
    HEADER_BYTES = HEADER_INTS * 4,
    MIN_TOKENS = 2, /* one input and its target */
};

typedef RtFile Shard; /* its tokens from HEADER_BYTES */

struct DataLoader {
    glob_t files;
    Shard *shards;
    size_t nshards;
    int64_t total; /* tokens in all shards */
    int64_t pos;   /* stream offset of the next global batch, in [0, total) */
    int rank, ranks;
};

/* A position in the stream: token i of shard s. */
typedef struct Cursor {
    size_t s;
    int64_t i;
} Cursor;

static uint32_t get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t get_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> 8 * i);
}

/* ---- open: list, map and check the shards ---- */

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int rt_files_glob(const char *pattern, glob_t *g, char *err, size_t n)
{
    if (!pattern || !*pattern)
        return plan_errorf(err, n, "no data file pattern given");
    int rc = glob(pattern, 0, NULL, g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g->gl_pathc == 0))
        return plan_errorf(err, n, "no file matches '%s'", pattern);
    if (rc == GLOB_NOSPACE)
        return plan_errorf(err, n, "glob '%s': out of memory", pattern);
    if (rc != 0)
        return plan_errorf(err, n, "glob '%s': read error", pattern);
    qsort(g->gl_pathv, g->gl_pathc, sizeof *g->gl_pathv, compare_names);
    return 0;
}

size_t rt_files_find(const RtFile *f, size_t n, int64_t p)
{
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (f[mid].start <= p)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void rt_files_close(RtFile *f, size_t n, glob_t *g)
{
    for (size_t i = 0; f && i < n; i++)
        if (f[i].map)
            munmap((void *)f[i].map, f[i].size); /* fails only on a bad range */
    free(f);
    globfree(g);
}

int rt_file_map(const char *path, size_t min, const char *what, const unsigned char **map,
                size_t *size, char *err, size_t n)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *map = NULL;
    if (fd < 0)
        return plan_errorf(err, n, "cannot open %s: %s", path, strerror(errno));
    int rc = -1;
    void *m;
    if (fstat(fd, &st))
        plan_errorf(err, n, "fstat %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        plan_errorf(err, n, "%s: not a regular file", path);
    else if ((size_t)st.st_size < min)
        plan_errorf(err, n, "%s: truncated %s (%lld bytes, a %s has %zu)", path, what,
                    (long long)st.st_size, what, min);
    else if ((m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)
        plan_errorf(err, n, "mmap %s: %s", path, strerror(errno));
    else {
        *map = m, *size = (size_t)st.st_size;
        rc = 0;
    }
    if (close(fd) && rc == 0)
        rc = plan_errorf(err, n, "close %s: %s", path, strerror(errno));
    return rc;
}

/* Magic, version, and a size that holds exactly the header's count of tokens. */
static int check_header(Shard *s, char *err, size_t n)
{
    int32_t magic = (int32_t)get_le32(s->map), version = (int32_t)get_le32(s->map + 4);
    int64_t count = (int32_t)get_le32(s->map + 8);
    int64_t body = (int64_t)s->size - HEADER_BYTES;
    if (magic != DATA_MAGIC)
        return plan_errorf(err, n, "%s: not a token file (magic %" PRId32 ", expected %d)", s->path, magic,
                    DATA_MAGIC);
    if (version != DATA_VERSION)
        return plan_errorf(err, n, "%s: unsupported version %" PRId32 " (expected %d: uint16 tokens)",
                    s->path, version, DATA_VERSION);
    if (count < 0)
        return plan_errorf(err, n, "%s: negative token count %" PRId64 " in the header", s->path, count);
    if (body < 2 * count)
        return plan_errorf(err, n, "%s: truncated: header says %" PRId64 " tokens, file holds %" PRId64,
                    s->path, count, body / 2);
    if (body > 2 * count)
        return plan_errorf(err, n,
                    "%s: too long: header says %" PRId64 " tokens, file holds %" PRId64
                    " bytes after the header, not %" PRId64,
                    s->path, count, body, 2 * count);
    if (count < MIN_TOKENS)
        return plan_errorf(err, n, "%s: %" PRId64 " token%s, a shard needs at least %d", s->path, count,
                    count == 1 ? "" : "s", MIN_TOKENS);
    s->count = count;
    return 0;
}

/* Every token below vocab; the first one that is not is named. */
static int check_tokens(const Shard *s, int64_t vocab, char *err, size_t n)
{
    const unsigned char *t = s->map + HEADER_BYTES;
    if (vocab > UINT16_MAX)
        return 0;
    for (int64_t i = 0; i < s->count; i++) {
        uint16_t v = get_le16(t + 2 * i);
        if (v >= vocab)
            return plan_errorf(err, n,
                        "%s: token %u at index %" PRId64
                        " is outside the vocabulary of size %" PRId64,
                        s->path, (unsigned)v, i, vocab);
    }
    return 0;
}

static int open_shards(DataLoader *d, int64_t vocab, char *err, size_t n)
{
    d->nshards = d->files.gl_pathc;
    d->shards = calloc(d->nshards, sizeof *d->shards);
    if (!d->shards)
        return plan_errorf(err, n, "calloc: out of memory for %zu shards", d->nshards);
    for (size_t i = 0; i < d->nshards; i++) {
        Shard *s = &d->shards[i];
        s->path = d->files.gl_pathv[i];
        if (rt_file_map(s->path, HEADER_BYTES, "header", &s->map, &s->size, err, n) ||
            check_header(s, err, n) || check_tokens(s, vocab, err, n))
            return -1;
        s->start = d->total;
        d->total += s->count; /* < 2^31 per shard, so no overflow before 2^32 shards */
    }
    return 0;
}

DataLoader *rt_data_open(const char *pattern, int64_t vocab, int rank, int ranks, char *err,
                         size_t n)
{
    if (vocab < 1) {
        plan_errorf(err, n, "vocabulary size %" PRId64 " is not positive", vocab);
        return NULL;
    }
    if (ranks < 1 || rank < 0 || rank >= ranks) {
        plan_errorf(err, n, "rank %d is not in [0, %d)", rank, ranks);
        return NULL;
    }
    DataLoader *d = calloc(1, sizeof *d);
    if (!d) {
        plan_errorf(err, n, "calloc: out of memory for a data loader");
        return NULL;
    }
    d->rank = rank;
    d->ranks = ranks;
    if (rt_files_glob(pattern, &d->files, err, n) || open_shards(d, vocab, err, n)) {
        rt_data_close(d);
        return NULL;
    }
    return d;
}

void rt_data_close(DataLoader *d)
{
    if (!d)
        return;
    rt_files_close(d->shards, d->nshards, &d->files);
    free(d);
}

/* ---- reading ---- */

/* The cursor at stream offset p in [0, total): the last shard starting at or before p. */
static Cursor cursor_at(const DataLoader *d, int64_t p)
{
    size_t s = rt_files_find(d->shards, d->nshards, p);
    return (Cursor){s, p - d->shards[s].start};
}

/* The token under c, and c moved to the next one (to the first shard after the last). */
static int32_t cursor_next(const DataLoader *d, Cursor *c)
{
    const Shard *s = &d->shards[c->s];
    int32_t t = get_le16(s->map + HEADER_BYTES + 2 * c->i);
    if (++c->i == s->count) {
        c->i = 0;
        c->s = (c->s + 1) % d->nshards;
    }
    return t;
}

/* One row from stream offset start: in[0..seq) = tokens start.., tg[j] = the token after in[j]. */
static void read_row(const DataLoader *d, int64_t start, int64_t seq, int32_t *in, int32_t *tg)
{
    Cursor c = cursor_at(d, start);
    int32_t prev = cursor_next(d, &c);
    for (int64_t j = 0; j < seq; j++) {
        in[j] = prev;
        tg[j] = prev = cursor_next(d, &c);
    }
}

int rt_data_next(DataLoader *d, int64_t rows, int64_t seq, int32_t *inputs, int32_t *targets,
                 char *err, size_t n)
{
    if (!d || !inputs || !targets)
        return plan_errorf(err, n, "rt_data_next: no loader or no output arrays");
    if (rows < 1 || seq < 1)
        return plan_errorf(err, n, "a batch needs at least 1 row of 1 token, not %" PRId64 " x %" PRId64,
                    rows, seq);
    /* The global batch's tokens, rows*ranks*(seq+1), and p below plus it, fit in int64_t. */
    if (seq > INT64_MAX / 4 || rows > (INT64_MAX / 2) / d->ranks / (seq + 1))
        return plan_errorf(err, n, "a batch of %" PRId64 " x %" PRId64 " tokens on %d ranks is too large",
                    rows, seq, d->ranks);
    int64_t row_tokens = seq + 1, global = rows * d->ranks * row_tokens;
    for (int64_t r = 0; r < rows; r++) {
        int64_t g = r * d->ranks + d->rank;
        int64_t start = (d->pos + g * row_tokens % d->total) % d->total;
        read_row(d, start, seq, inputs + r * seq, targets + r * seq);
    }
    d->pos = (d->pos + global % d->total) % d->total;
    return 0;
}

int64_t rt_data_tell(const DataLoader *d)
{
    return d ? d->pos : -1;
}

int rt_data_seek(DataLoader *d, int64_t position, char *err, size_t n)
{
    if (!d)
        return plan_errorf(err, n, "rt_data_seek: no loader");
    if (position < 0 || position >= d->total)
        return plan_errorf(err, n, "data position %" PRId64 " is outside the stream of %" PRId64 " tokens",
                    position, d->total);
    d->pos = position;
    return 0;
}

int64_t rt_data_tokens(const DataLoader *d)
{
    return d ? d->total : 0;
}

/* ---- writing ---- */

/* All of len bytes, through short writes and interruptions. */
static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* The header, then the tokens as little-endian uint16, a block at a time. */
static int write_shard(int fd, const uint16_t *tokens, int64_t count)
{
    unsigned char buf[8192] = {0};
    put_le32(buf, DATA_MAGIC);
    put_le32(buf + 4, DATA_VERSION);
    put_le32(buf + 8, (uint32_t)count);
    if (write_all(fd, buf, HEADER_BYTES))
        return -1;
    for (int64_t i = 0; i < count;) {
        size_t k = 0;
        for (; i < count && k + 2 <= sizeof buf; i++, k += 2) {
            buf[k] = (unsigned char)(tokens[i] & 0xff);
            buf[k + 1] = (unsigned char)(tokens[i] >> 8);
        }
        if (write_all(fd, buf, k))
            return -1;
    }
    return 0;
}

/* fsync the directory holding path, so that the rename survives a crash. */
static int sync_dir(const char *path, char *err, size_t n)
{
    char dir[4096] = ".";
    const char *slash = strrchr(path, '/');
    if (slash == path)
        strcpy(dir, "/");
    else if (slash && (size_t)(slash - path) >= sizeof dir)
        return plan_errorf(err, n, "%s: path too long", path);
    else if (slash)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return plan_errorf(err, n, "open %s: %s", dir, strerror(errno));
    int rc = 0;
    /* Some file systems cannot sync a directory (EINVAL); the file itself is synced. */
    if (fsync(fd) && errno != EINVAL)
        rc = plan_errorf(err, n, "fsync %s: %s", dir, strerror(errno));
    if (close(fd) && rc == 0)
        rc = plan_errorf(err, n, "close %s: %s", dir, strerror(errno));
    return rc;
}

int rt_data_write(const char *path, const uint16_t *tokens, int64_t count, char *err, size_t n)
{
    char tmp[4096];
    if (!path || !*path || (count > 0 && !tokens))
        return plan_errorf(err, n, "rt_data_write: no path or no tokens");
    if (count < 0 || count > INT32_MAX)
        return plan_errorf(err, n, "%s: %" PRId64 " tokens do not fit in a shard (at most %d)", path,
                    count, INT32_MAX);
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return plan_errorf(err, n, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return plan_errorf(err, n, "cannot write %s (open %s: %s)", path, tmp, strerror(errno));
    const char *call = NULL;
    if (write_shard(fd, tokens, count))
        call = "write";
    else if (fsync(fd))
        call = "fsync";
    int e = errno;
    if (close(fd) && !call) {
        call = "close";
        e = errno;
    }
    if (!call && rename(tmp, path)) {
        call = "rename";
        e = errno;
    }
    if (call) {
        unlink(tmp); /* best effort: the error to report is the one above */
        return plan_errorf(err, n, "cannot write %s (%s %s: %s)", path, call, tmp, strerror(e));
    }
    return sync_dir(path, err, n);
}
