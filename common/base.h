/* base.h: the basics every compiler stage shares: arena, source locations,
 * the diagnostics sink, growable arrays, interned strings and the per-compilation
 * context. The runtime does not include this file. */
#ifndef TCC_BASE_H
#define TCC_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TCC_VERSION "0.1.0"

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#define NORETURN __attribute__((noreturn))
#else
#define PRINTF_LIKE(f, a)
#define NORETURN
#endif

/* Internal errors: flush, print "tcc: internal error at file:line", abort. */
NORETURN void tcc_bug(const char *file, int line, const char *fmt, ...) PRINTF_LIKE(3, 4);
#define BUG(...) tcc_bug(__FILE__, __LINE__, __VA_ARGS__)
#define UNREACHABLE() tcc_bug(__FILE__, __LINE__, "unreachable")

/* ---- arena: every AST node, IR node and string of one compilation ---- */
typedef struct Arena Arena;
Arena *arena_new(void);
void arena_free(Arena *a);
/* Zeroed, 16-byte aligned memory that lives until arena_free. */
void *arena_alloc(Arena *a, size_t n);
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) PRINTF_LIKE(2, 3);
char *arena_vprintf(Arena *a, const char *fmt, va_list ap);
/* Grow an array of `elem` bytes from *cap to hold at least need items. */
void *arena_grow(Arena *a, void *data, int *cap, int need, size_t elem);

/* Growable array in the arena: VEC(T) v = {0}; VEC_PUSH(arena, v, x); */
#define VEC(T)                                                                                     \
    struct {                                                                                       \
        T *data;                                                                                   \
        int len, cap;                                                                              \
    }
#define VEC_PUSH(A, V, X)                                                                          \
    do {                                                                                           \
        if ((V).len == (V).cap)                                                                    \
            (V).data = arena_grow((A), (V).data, &(V).cap, (V).len + 1, sizeof(*(V).data));        \
        (V).data[(V).len++] = (X);                                                                 \
    } while (0)

/* ---- interned strings: equal strings share one pointer ---- */
typedef struct Interner Interner;
Interner *intern_new(Arena *a);
const char *intern(Interner *in, const char *s);
const char *intern_n(Interner *in, const char *s, size_t n);

/* ---- source locations ---- */
typedef struct Loc {
    const char *file; /* interned; NULL when unknown */
    int line, col;    /* 1-based; line 0 means no location */
} Loc;
#define LOC_NONE ((Loc){NULL, 0, 0})

/* ---- diagnostics: one sink, clang-style messages ---- */
typedef enum { SEV_ERROR, SEV_WARNING, SEV_NOTE } Severity;

typedef struct Source {
    const char *name; /* interned */
    const char *text;
    size_t len;
} Source;

typedef struct Diag {
    Arena *arena;
    FILE *out;       /* stderr by default */
    VEC(Source) sources;
    int nerrors, nwarnings;
    int max_errors;  /* stop printing after this many errors (0: no limit) */
    int color;
} Diag;

void diag_init(Diag *d, Arena *a, FILE *out);
/* Register a buffer so messages at its locations can show the source line. */
void diag_add_source(Diag *d, const char *name, const char *text, size_t len);
/* file:line:col: severity: msg, then the source line and a caret under col
 * (and `width` tildes after it when width > 1). */
void diag_report(Diag *d, Severity sev, Loc loc, int width, const char *fmt, ...)
    PRINTF_LIKE(5, 6);
void diag_vreport(Diag *d, Severity sev, Loc loc, int width, const char *fmt, va_list ap);
#define diag_error(d, loc, ...) diag_report((d), SEV_ERROR, (loc), 1, __VA_ARGS__)
#define diag_warning(d, loc, ...) diag_report((d), SEV_WARNING, (loc), 1, __VA_ARGS__)
#define diag_note(d, loc, ...) diag_report((d), SEV_NOTE, (loc), 1, __VA_ARGS__)

/* ---- the context of one compilation ---- */
typedef struct Define {
    const char *name;  /* -D NAME=VALUE */
    int64_t value;     /* VALUE when an integer */
    double fvalue;     /* VALUE as a number (for a float parameter) */
    int is_float;      /* VALUE is not an integer (1.5, 1e-3) */
    int used;          /* set by the frontend when the model declares NAME */
} Define;

typedef struct Ctx {
    Arena *arena;
    Interner *strings;
    Diag diag;
    VEC(Define) defines;
} Ctx;

/* A fresh context writing diagnostics to `out`; ctx_free releases everything. */
Ctx *ctx_new(FILE *out);
void ctx_free(Ctx *c);

/* Read a whole file into the arena (NUL-terminated); NULL and errno on failure. */
char *read_file(Arena *a, const char *path, size_t *len);

/* Shortest decimal spelling of d that strtod reads back exactly; always has a
 * '.', an exponent, or is inf/nan, so it never reads as an integer. */
void fmt_double(char *buf, size_t n, double d);

#endif
