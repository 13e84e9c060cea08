/* base.c: arena, interner, diagnostics sink and context.
 * The arena is a list of chunks; big requests get a chunk of their own.
 * Diagnostics print like clang: location, severity, message, source line, caret. */
#include "base.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void tcc_bug(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "tcc: internal error at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

/* ---- arena ---- */
typedef struct Chunk {
    struct Chunk *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} Chunk;

struct Arena {
    Chunk *head;
};

enum { CHUNK_SIZE = 64 * 1024 };

static Chunk *chunk_new(size_t size)
{
    Chunk *c = malloc(sizeof(Chunk) + size);
    if (!c) {
        fprintf(stderr, "tcc: out of memory\n");
        exit(1);
    }
    c->next = NULL;
    c->used = 0;
    c->size = size;
    return c;
}

Arena *arena_new(void)
{
    Arena *a = calloc(1, sizeof(Arena));
    if (!a) {
        fprintf(stderr, "tcc: out of memory\n");
        exit(1);
    }
    return a;
}

void arena_free(Arena *a)
{
    if (!a)
        return;
    for (Chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(a);
}

void *arena_alloc(Arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    Chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        if (n > CHUNK_SIZE / 4) {
            /* A big block gets its own chunk, kept behind the current one. */
            Chunk *big = chunk_new(n);
            big->used = n;
            if (c) {
                big->next = c->next;
                c->next = big;
            } else {
                a->head = big;
            }
            memset(big->data, 0, n);
            return big->data;
        }
        c = chunk_new(CHUNK_SIZE);
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_vprintf(Arena *a, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    char *p = arena_alloc(a, (size_t)n + 1);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    return p;
}

char *arena_printf(Arena *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *p = arena_vprintf(a, fmt, ap);
    va_end(ap);
    return p;
}

void *arena_grow(Arena *a, void *data, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return data;
    int ncap = *cap ? *cap * 2 : 8;
    while (ncap < need)
        ncap *= 2;
    void *p = arena_alloc(a, (size_t)ncap * elem);
    if (data)
        memcpy(p, data, (size_t)*cap * elem);
    *cap = ncap;
    return p;
}

/* ---- interner: open addressing over arena strings ---- */
struct Interner {
    Arena *arena;
    const char **slots;
    int cap, count;
};

Interner *intern_new(Arena *a)
{
    Interner *in = arena_alloc(a, sizeof(Interner));
    in->arena = a;
    in->cap = 256;
    in->slots = arena_alloc(a, sizeof(char *) * (size_t)in->cap);
    return in;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static void intern_rehash(Interner *in)
{
    const char **old = in->slots;
    int ocap = in->cap;
    in->cap *= 2;
    in->slots = arena_alloc(in->arena, sizeof(char *) * (size_t)in->cap);
    for (int i = 0; i < ocap; i++) {
        if (!old[i])
            continue;
        uint64_t h = hash_bytes(old[i], strlen(old[i]));
        int j = (int)(h & (uint64_t)(in->cap - 1));
        while (in->slots[j])
            j = (j + 1) & (in->cap - 1);
        in->slots[j] = old[i];
    }
}

const char *intern_n(Interner *in, const char *s, size_t n)
{
    if (2 * (in->count + 1) > in->cap)
        intern_rehash(in);
    uint64_t h = hash_bytes(s, n);
    int j = (int)(h & (uint64_t)(in->cap - 1));
    for (; in->slots[j]; j = (j + 1) & (in->cap - 1)) {
        if (strlen(in->slots[j]) == n && memcmp(in->slots[j], s, n) == 0)
            return in->slots[j];
    }
    in->slots[j] = arena_strndup(in->arena, s, n);
    in->count++;
    return in->slots[j];
}

const char *intern(Interner *in, const char *s) { return intern_n(in, s, strlen(s)); }

/* ---- diagnostics ---- */
void diag_init(Diag *d, Arena *a, FILE *out)
{
    memset(d, 0, sizeof(*d));
    d->arena = a;
    d->out = out ? out : stderr;
    d->max_errors = 50;
}

void diag_add_source(Diag *d, const char *name, const char *text, size_t len)
{
    Source s = {name, text, len};
    VEC_PUSH(d->arena, d->sources, s);
}

static const Source *find_source(const Diag *d, const char *name)
{
    if (!name)
        return NULL;
    for (int i = d->sources.len - 1; i >= 0; i--)
        if (strcmp(d->sources.data[i].name, name) == 0)
            return &d->sources.data[i];
    return NULL;
}

/* Print line `line` of src and a caret under column col. Tabs are kept in the
 * caret line so the caret lines up in a terminal. */
static void print_caret(FILE *out, const Source *src, int line, int col, int width)
{
    const char *p = src->text, *end = src->text + src->len;
    for (int l = 1; l < line && p < end; p++)
        if (*p == '\n')
            l++;
    if (p >= end && line > 1)
        return;
    const char *e = p;
    while (e < end && *e != '\n')
        e++;
    fprintf(out, "%.*s\n", (int)(e - p), p);
    for (int i = 1; i < col && p + i - 1 < e; i++)
        fputc(p[i - 1] == '\t' ? '\t' : ' ', out);
    fputc('^', out);
    for (int i = 1; i < width; i++)
        fputc('~', out);
    fputc('\n', out);
}

void diag_vreport(Diag *d, Severity sev, Loc loc, int width, const char *fmt, va_list ap)
{
    static const char *names[] = {"error", "warning", "note"};
    if (sev == SEV_ERROR)
        d->nerrors++;
    if (sev == SEV_WARNING)
        d->nwarnings++;
    if (d->max_errors && d->nerrors > d->max_errors) {
        if (sev == SEV_ERROR && d->nerrors == d->max_errors + 1)
            fprintf(d->out, "tcc: too many errors, stopping here\n");
        return;
    }
    if (loc.file && loc.line > 0)
        fprintf(d->out, "%s:%d:%d: ", loc.file, loc.line, loc.col);
    else if (loc.file)
        fprintf(d->out, "%s: ", loc.file);
    else
        fprintf(d->out, "tcc: ");
    fprintf(d->out, "%s: ", names[sev]);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    const Source *src = find_source(d, loc.file);
    if (src && loc.line > 0)
        print_caret(d->out, src, loc.line, loc.col, width);
}

void diag_report(Diag *d, Severity sev, Loc loc, int width, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(d, sev, loc, width, fmt, ap);
    va_end(ap);
}

/* ---- context ---- */
Ctx *ctx_new(FILE *out)
{
    Arena *a = arena_new();
    Ctx *c = arena_alloc(a, sizeof(Ctx));
    c->arena = a;
    c->strings = intern_new(a);
    diag_init(&c->diag, a, out);
    return c;
}

void ctx_free(Ctx *c)
{
    if (c)
        arena_free(c->arena);
}

char *read_file(Arena *a, const char *path, size_t *len)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) { /* fopen opens one; reading it fails */
        errno = EISDIR;
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            errno = ENOMEM;
            return NULL;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb)
            free(buf);
        buf = nb;
    }
    int err = ferror(f), saved = errno;
    fclose(f);
    if (err) {
        free(buf);
        errno = saved ? saved : EIO;
        return NULL;
    }
    char *p = arena_strndup(a, buf, n);
    free(buf);
    if (len)
        *len = n;
    return p;
}

void fmt_double(char *buf, size_t n, double d)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, d);
        if (strtod(buf, NULL) == d || d != d)
            break;
    }
    size_t k = strlen(buf);
    if (!strpbrk(buf, ".eEni") && k + 3 <= n) /* integral: make it read as a float */
        memcpy(buf + k, ".0", 3);
}
