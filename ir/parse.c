/* parse.c: the text form of docs/ir.md -> Graph. Reads a buffer that need not be
 * NUL-terminated, writes a Graph into c->arena and errors to c->diag. Key idea:
 * the format is one statement per line, so each line is read on its own by a
 * small tokenizer bounded by the line's end and a recursive-descent parser; the
 * first error on a line is reported, the rest of the line is dropped, and
 * parsing goes on with the next line. An op is built only once its whole line
 * has been read, so the Graph only ever holds well-formed ops. */
#include "ir.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAX_LINE = 1 << 20, /* bytes per line */
    MAX_DEPTH = 64,     /* nesting of attribute lists and calls */
    MAX_NUMBER = 64,    /* bytes in a float literal */
    MAX_MESH_SIZE = 1 << 20,
};

typedef enum { T_EOL, T_ERR, T_IDENT, T_INT, T_FLOAT, T_STR, T_VALUE, T_PUNCT } TokKind;

typedef struct Tok {
    TokKind kind;
    const char *start; /* spelling in the line */
    size_t len;
    int col;
    char c;        /* PUNCT */
    int64_t i;     /* INT, VALUE */
    double f;      /* FLOAT */
    const char *s; /* IDENT: the spelling; STR: the decoded text; both interned */
} Tok;

/* One result of the op line being read, built into a Value at the line's end. */
typedef struct Pending {
    int64_t num;
    int col;
    const char *name;
    DType dtype;
    int rank;
    int64_t shape[IR_MAX_RANK];
    Sharding shard;
} Pending;

/* Value number -> Value, open addressing; only looked up, never walked. */
typedef struct IdSlot {
    int64_t num; /* -1: empty */
    Value *v;
    Loc where; /* the definition in the text */
} IdSlot;

typedef struct P {
    Ctx *c;
    Graph *g;
    const char *file;
    const char *bol, *pos, *eol; /* the current line */
    int line;
    Tok tok;
    char *scratch; /* decoded strings, one line long at most */
    IdSlot *ids;
    size_t idcap, idcount;
    int seen_op, have_module, have_mesh, depth;
    VEC(Pending) res;
    VEC(Value *) args;
    VEC(Attr *) attrs;
} P;

/* Report an error at column col of the current line; returns -1. */
static int error_at(P *p, int col, const char *fmt, ...) PRINTF_LIKE(3, 4);

static int error_at(P *p, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(&p->c->diag, SEV_ERROR, (Loc){p->file, p->line, col}, 1, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- tokenizer ---- */

/* Character classes: plain ASCII whatever the locale. Arguments are evaluated
 * more than once. */
#define is_digit(ch) ((ch) >= '0' && (ch) <= '9')
#define is_ident_start(ch) ((((ch) | 0x20) >= 'a' && ((ch) | 0x20) <= 'z') || (ch) == '_')
#define is_ident_char(ch) (is_ident_start(ch) || is_digit(ch) || (ch) == '.')
#define is_space(ch) ((ch) == ' ' || (ch) == '\t' || (ch) == '\r' || (ch) == '\v' || (ch) == '\f')

static int col_of(const P *p, const char *s)
{
    return (int)(s - p->bol) + 1;
}

/* Report a lexical error at s; the token becomes T_ERR until the line ends. A
 * message with a %.*s gets the token's spelling so far. Returns -1. */
static int lex_fail(P *p, const char *s, const char *msg)
{
    int n = (int)(p->pos - p->tok.start);
    p->tok.kind = T_ERR;
    if (strstr(msg, "%.*s"))
        return error_at(p, col_of(p, s), msg, n > 32 ? 32 : n, p->tok.start);
    return error_at(p, col_of(p, s), "%s", msg);
}

/* Digits in [s, e), the sign already stripped; -1 on overflow. */
static int parse_digits(const char *s, const char *e, int neg, int64_t *out)
{
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
    for (; s < e; s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (limit - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = !neg ? (int64_t)v : v > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)v;
    return 0;
}

static int lex_float(P *p, Tok *t)
{
    char buf[MAX_NUMBER];
    size_t n = (size_t)(p->pos - t->start);
    if (n >= sizeof(buf))
        return lex_fail(p, t->start, "number too long");
    memcpy(buf, t->start, n);
    buf[n] = 0;
    errno = 0;
    t->f = strtod(buf, NULL);
    t->kind = T_FLOAT;
    if (errno == ERANGE && isinf(t->f))
        return lex_fail(p, t->start, "float '%.*s' out of range");
    return 0;
}

/* -?DIGITS(.DIGITS*)?([eE][+-]?DIGITS)? or -inf, -nan; a lone '-' is punctuation. */
static int lex_number(P *p, Tok *t)
{
    const char *q = p->pos + (*p->pos == '-'), *e = p->eol, *digits = q;
    int bad = 0, is_float = 0;
    if (q > p->pos && e - q >= 3 && (!memcmp(q, "inf", 3) || !memcmp(q, "nan", 3)) &&
        (e - q == 3 || !is_ident_char(q[3]))) {
        p->pos = q + 3;
        return lex_float(p, t);
    }
    if (q == e || !is_digit(*q)) {
        t->kind = T_PUNCT;
        t->c = *p->pos++;
        return 0;
    }
    while (q < e && is_digit(*q))
        q++;
    const char *digits_end = q;
    if (q < e && *q == '.')
        for (is_float = 1, q++; q < e && is_digit(*q);)
            q++;
    if (q < e && (*q == 'e' || *q == 'E')) {
        is_float = 1;
        q += q + 1 < e && (q[1] == '+' || q[1] == '-') ? 2 : 1;
        bad = q == e || !is_digit(*q);
        while (q < e && is_digit(*q))
            q++;
    }
    for (; q < e && is_ident_char(*q); q++)
        bad = 1;
    p->pos = q;
    if (bad)
        return lex_fail(p, t->start, "malformed number '%.*s'");
    if (is_float)
        return lex_float(p, t);
    t->kind = T_INT;
    if (parse_digits(digits, digits_end, digits > t->start, &t->i))
        return lex_fail(p, t->start, "integer '%.*s' out of range");
    return 0;
}

static int hex_value(char ch)
{
    if (is_digit(ch))
        return ch - '0';
    ch |= 0x20; /* lower case */
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* The escape whose backslash is at *q: the byte it stands for, or -1; *q moves past it. */
static int lex_escape(const char **q, const char *e)
{
    const char *s = *q + 1;
    *q = s + (s < e);
    if (s == e)
        return -1;
    switch (*s) {
    case '"':
    case '\\':
        return *s;
    case 'n':
        return '\n';
    case 't':
        return '\t';
    case 'x':
        if (e - s < 3 || hex_value(s[1]) < 0 || hex_value(s[2]) < 0)
            return -1;
        *q = s + 3;
        return hex_value(s[1]) * 16 + hex_value(s[2]);
    }
    return -1;
}

/* "..." decoded into the scratch buffer (never longer than the line), then interned. */
static int lex_string(P *p, Tok *t)
{
    const char *q = p->pos + 1, *e = p->eol;
    size_t n = 0;
    while (q < e && *q != '"') {
        const char *bs = q;
        int ch = *q == '\\' ? lex_escape(&q, e) : (unsigned char)*q++;
        p->pos = q;
        if (ch < 0)
            return lex_fail(p, bs, "invalid escape sequence in string");
        if (ch == 0)
            return lex_fail(p, bs, "NUL byte in string");
        p->scratch[n++] = (char)ch;
    }
    p->pos = q + (q < e);
    if (q == e)
        return lex_fail(p, t->start, "unterminated string");
    t->kind = T_STR;
    t->s = intern_n(p->c->strings, p->scratch, n);
    return 0;
}

/* %DIGITS */
static int lex_value(P *p, Tok *t)
{
    const char *d = ++p->pos, *q = d, *e = p->eol;
    while (q < e && is_digit(*q))
        q++;
    const char *digits_end = q;
    while (q < e && is_ident_char(*q))
        q++;
    p->pos = q;
    if (digits_end == d || digits_end != q)
        return lex_fail(p, t->start, "malformed value number '%.*s'");
    t->kind = T_VALUE;
    if (parse_digits(d, q, 0, &t->i))
        return lex_fail(p, t->start, "value number '%.*s' out of range");
    return 0;
}

/* The next token of the line. After an error the token stays T_ERR. */
static void lex(P *p)
{
    Tok *t = &p->tok;
    if (t->kind == T_ERR)
        return;
    while (p->pos < p->eol && is_space(*p->pos))
        p->pos++;
    *t = (Tok){.kind = T_EOL, .start = p->pos, .col = col_of(p, p->pos)};
    if (p->pos == p->eol)
        return;
    char ch = *p->pos;
    if (is_ident_start(ch)) {
        while (p->pos < p->eol && is_ident_char(*p->pos))
            p->pos++;
        t->kind = T_IDENT;
        t->s = intern_n(p->c->strings, t->start, (size_t)(p->pos - t->start));
    } else if (is_digit(ch) || ch == '-') {
        lex_number(p, t);
    } else if (ch == '"') {
        lex_string(p, t);
    } else if (ch == '%') {
        lex_value(p, t);
    } else {
        t->kind = T_PUNCT;
        t->c = *p->pos++;
    }
    t->len = (size_t)(p->pos - t->start);
}

/* ---- parser helpers ---- */

static int is_punct(const P *p, char ch)
{
    return p->tok.kind == T_PUNCT && p->tok.c == ch;
}

static int is_word(const P *p, const char *w)
{
    return p->tok.kind == T_IDENT && strcmp(p->tok.s, w) == 0;
}

/* Report "expected WHAT, found TOKEN" (nothing after a lexical error). */
static int fail(P *p, const char *what)
{
    const Tok *t = &p->tok;
    char found[48];
    if (t->kind == T_ERR)
        return -1;
    if (t->kind == T_EOL) {
        snprintf(found, sizeof(found), "end of line");
    } else if (t->kind == T_PUNCT && (t->c < 0x20 || t->c >= 0x7f)) {
        snprintf(found, sizeof(found), "byte 0x%02x", (unsigned char)t->c);
    } else {
        size_t n = t->len > 32 ? 32 : t->len, k = 0;
        found[k++] = '\'';
        for (size_t i = 0; i < n; i++)
            found[k++] = t->start[i] >= 0x20 && t->start[i] < 0x7f ? t->start[i] : '?';
        snprintf(found + k, sizeof(found) - k, "%s'", t->len > n ? "..." : "");
    }
    return error_at(p, t->col, "expected %s, found %s", what, found);
}

static int accept(P *p, char ch)
{
    if (!is_punct(p, ch))
        return 0;
    lex(p);
    return 1;
}

static int expect(P *p, char ch)
{
    char what[8] = {'\'', ch, '\'', 0};
    return accept(p, ch) ? 0 : fail(p, what);
}

/* An identifier: its interned spelling, or NULL after reporting. */
static const char *expect_ident(P *p, const char *what)
{
    if (p->tok.kind != T_IDENT) {
        fail(p, what);
        return NULL;
    }
    const char *s = p->tok.s;
    lex(p);
    return s;
}

/* An identifier that lookup knows: its index, or -1 after reporting. */
static int parse_known(P *p, int (*lookup)(const char *), const char *what)
{
    char buf[48];
    if (p->tok.kind != T_IDENT) {
        snprintf(buf, sizeof(buf), "%s %s", strchr("aeiou", what[0]) ? "an" : "a", what);
        return fail(p, buf);
    }
    int k = lookup(p->tok.s);
    if (k < 0)
        error_at(p, p->tok.col, "unknown %s '%s'", what, p->tok.s);
    else
        lex(p);
    return k;
}

/* An integer in [lo, hi] into *out, or -1 after reporting. */
static int expect_int(P *p, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
    if (p->tok.kind != T_INT)
        return fail(p, what);
    if (p->tok.i < lo || p->tok.i > hi)
        return error_at(p, p->tok.col, "%s %lld out of range [%lld, %lld]", what,
                        (long long)p->tok.i, (long long)lo, (long long)hi);
    *out = p->tok.i;
    lex(p);
    return 0;
}

/* ---- value numbers ---- */

static size_t id_slot(const P *p, int64_t num)
{
    uint64_t h = (uint64_t)num * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 20) & (p->idcap - 1);
    while (p->ids[i].num >= 0 && p->ids[i].num != num)
        i = (i + 1) & (p->idcap - 1);
    return i;
}

static void id_grow(P *p)
{
    IdSlot *old = p->ids;
    size_t ocap = p->idcap;
    p->idcap = ocap ? ocap * 2 : 64;
    p->ids = arena_alloc(p->c->arena, sizeof(IdSlot) * p->idcap);
    for (size_t i = 0; i < p->idcap; i++)
        p->ids[i].num = -1;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].num >= 0)
            p->ids[id_slot(p, old[i].num)] = old[i];
}

static const IdSlot *id_find(const P *p, int64_t num)
{
    if (!p->idcap)
        return NULL;
    const IdSlot *s = &p->ids[id_slot(p, num)];
    return s->num >= 0 ? s : NULL;
}

static void id_put(P *p, int64_t num, Value *v, Loc where)
{
    if (2 * (p->idcount + 1) > p->idcap)
        id_grow(p);
    p->ids[id_slot(p, num)] = (IdSlot){num, v, where};
    p->idcount++;
}

/* A %N operand that is already defined, or NULL after reporting. */
static Value *parse_use(P *p)
{
    if (p->tok.kind != T_VALUE) {
        fail(p, "a value");
        return NULL;
    }
    const IdSlot *s = id_find(p, p->tok.i);
    if (!s) {
        error_at(p, p->tok.col, "undefined value '%%%lld'", (long long)p->tok.i);
        return NULL;
    }
    lex(p);
    return s->v;
}

/* ---- attributes ---- */

static Attr *parse_value(P *p, const char *key);

/* ITEM {, ITEM} up to `close` (the opener already read); ITEM is KEY = VALUE or
 * VALUE. 0, or -1 after reporting. */
static int parse_items(P *p, char close, Attr ***items, int *n)
{
    VEC(Attr *) v = {0};
    char what[8] = {'\'', close, '\'', 0};
    if (++p->depth > MAX_DEPTH)
        return error_at(p, p->tok.col, "attribute nested more than %d deep", MAX_DEPTH);
    while (!is_punct(p, close)) {
        Attr *a = parse_value(p, NULL);
        if (!a)
            return -1;
        VEC_PUSH(p->c->arena, v, a);
        if (!accept(p, ','))
            break;
    }
    if (!accept(p, close))
        return fail(p, what);
    p->depth--;
    *items = v.data;
    *n = v.len;
    return 0;
}

/* A value that starts with the identifier w (already consumed) at col. */
static Attr *parse_word_value(P *p, const char *key, const char *w, int col)
{
    Arena *a = p->c->arena;
    if (!strcmp(w, "true") || !strcmp(w, "false"))
        return ir_attr_bool(a, key, w[0] == 't');
    if (!strcmp(w, "inf") || !strcmp(w, "nan"))
        return ir_attr_float(a, key, w[0] == 'i' ? INFINITY : NAN);
    if (is_punct(p, '(')) {
        Attr **items = NULL;
        int n = 0;
        lex(p);
        return parse_items(p, ')', &items, &n) ? NULL : ir_attr_call(a, key, w, items, n);
    }
    error_at(p, col, "bare word '%s' is not a value (strings are quoted)", w);
    return NULL;
}

/* VALUE, or KEY = VALUE when key is NULL and an identifier is followed by '='. */
static Attr *parse_value(P *p, const char *key)
{
    Arena *a = p->c->arena;
    Attr **items = NULL;
    int n = 0;
    Tok t = p->tok;
    switch (t.kind) {
    case T_INT:
        lex(p);
        return ir_attr_int(a, key, t.i);
    case T_FLOAT:
        lex(p);
        return ir_attr_float(a, key, t.f);
    case T_STR:
        lex(p);
        return ir_attr_str(a, key, t.s);
    case T_IDENT:
        lex(p);
        if (!key && is_punct(p, '=')) {
            lex(p);
            return parse_value(p, t.s);
        }
        return parse_word_value(p, key, t.s, t.col);
    default:
        break;
    }
    if (accept(p, '['))
        return parse_items(p, ']', &items, &n) ? NULL : ir_attr_list(a, key, items, n);
    fail(p, "a value");
    return NULL;
}

/* KEY = VALUE with a required key. */
static Attr *parse_keyed(P *p)
{
    const char *key = expect_ident(p, "an attribute name");
    if (!key || expect(p, '='))
        return NULL;
    return parse_value(p, key);
}

/* ---- types: DTYPE[DIMS] [partial(AXES)] [why(...)] ---- */

/* A mesh axis named by the current identifier: its index, or -1 after reporting. */
static int parse_axis(P *p)
{
    if (p->tok.kind != T_IDENT)
        return fail(p, "a mesh axis name");
    int ax = ir_mesh_axis(&p->g->mesh, p->tok.s);
    if (ax < 0)
        return error_at(p, p->tok.col, "unknown mesh axis '%s'", p->tok.s);
    lex(p);
    return ax;
}

static int parse_dim_axis(P *p, Sharding *s, int dim)
{
    int col = p->tok.col, ax = parse_axis(p);
    if (ax < 0)
        return -1;
    if (s->naxes[dim] == IR_MAX_AXES)
        return error_at(p, col, "more than %d axes on one dimension", IR_MAX_AXES);
    ir_shard_add(s, dim, ax);
    return 0;
}

/* SIZE, SIZE@AXIS or SIZE@(AXIS, ...). */
static int parse_dim(P *p, Pending *r)
{
    int64_t size;
    if (r->rank == IR_MAX_RANK)
        return error_at(p, p->tok.col, "more than %d dimensions", IR_MAX_RANK);
    if (expect_int(p, "dimension size", 0, INT64_MAX, &size))
        return -1;
    int d = r->rank++;
    r->shape[d] = size;
    if (!accept(p, '@'))
        return 0;
    if (!accept(p, '('))
        return parse_dim_axis(p, &r->shard, d);
    do {
        if (parse_dim_axis(p, &r->shard, d))
            return -1;
    } while (accept(p, ','));
    return expect(p, ')');
}

static int parse_partial(P *p, Sharding *s)
{
    lex(p);
    if (expect(p, '('))
        return -1;
    do {
        int ax = parse_axis(p);
        if (ax < 0)
            return -1;
        s->partial |= UINT32_C(1) << ax;
    } while (accept(p, ','));
    return expect(p, ')');
}

/* :LINE:COL after a file name already read; "" means no file. */
static int parse_loc_rest(P *p, const char *file, Loc *loc)
{
    int64_t line, col;
    if (expect(p, ':') || expect_int(p, "line", 0, INT_MAX, &line) || expect(p, ':') ||
        expect_int(p, "column", 0, INT_MAX, &col))
        return -1;
    *loc = (Loc){*file ? file : NULL, (int)line, (int)col};
    return 0;
}

/* why(KIND[, "FILE":LINE:COL][, "DETAIL"]) */
static int parse_why(P *p, Why *w)
{
    lex(p);
    if (expect(p, '('))
        return -1;
    int k = parse_known(p, ir_why_lookup, "why kind");
    if (k < 0)
        return -1;
    w->kind = (WhyKind)k;
    if (accept(p, ',')) {
        if (p->tok.kind != T_STR)
            return fail(p, "a location or a detail string");
        const char *s = p->tok.s;
        lex(p);
        if (!is_punct(p, ':'))
            w->detail = s;
        else if (parse_loc_rest(p, s, &w->loc))
            return -1;
        if (!w->detail && accept(p, ',')) {
            if (p->tok.kind != T_STR)
                return fail(p, "a detail string");
            w->detail = p->tok.s;
            lex(p);
        }
    }
    return expect(p, ')');
}

static int parse_type(P *p, Pending *r)
{
    int dt = parse_known(p, ir_dtype_lookup, "dtype");
    if (dt < 0 || expect(p, '['))
        return -1;
    r->dtype = (DType)dt;
    if (!is_punct(p, ']')) {
        do {
            if (parse_dim(p, r))
                return -1;
        } while (accept(p, ','));
    }
    if (expect(p, ']'))
        return -1;
    if (is_word(p, "partial") && parse_partial(p, &r->shard))
        return -1;
    if (is_word(p, "why") && parse_why(p, &r->shard.why))
        return -1;
    return 0;
}

/* ---- op lines ---- */

static int check_fresh(P *p, int64_t num, int col)
{
    const IdSlot *s = id_find(p, num);
    Loc prev = s ? s->where : LOC_NONE;
    for (int i = 0; !s && i < p->res.len; i++)
        if (p->res.data[i].num == num)
            prev = (Loc){p->file, p->line, p->res.data[i].col};
    if (!prev.file)
        return 0;
    error_at(p, col, "value '%%%lld' defined twice", (long long)num);
    diag_note(&p->c->diag, prev, "first definition of '%%%lld' is here", (long long)num);
    return -1;
}

/* %N ["NAME"] : TYPE {, ...} */
static int parse_results(P *p)
{
    do {
        Pending r = {.num = p->tok.i, .col = p->tok.col};
        if (p->tok.kind != T_VALUE)
            return fail(p, "a value");
        if (check_fresh(p, r.num, r.col))
            return -1;
        lex(p);
        if (p->tok.kind == T_STR) {
            r.name = p->tok.s;
            lex(p);
        }
        if (expect(p, ':') || parse_type(p, &r))
            return -1;
        VEC_PUSH(p->c->arena, p->res, r);
    } while (accept(p, ','));
    return 0;
}

static int parse_attrs(P *p)
{
    if (!accept(p, '{'))
        return 0;
    if (!is_punct(p, '}')) {
        do {
            int col = p->tok.col;
            Attr *a = parse_keyed(p);
            if (!a)
                return -1;
            for (int i = 0; i < p->attrs.len; i++) {
                if (!strcmp(p->attrs.data[i]->key, a->key))
                    return error_at(p, col, "attribute '%s' given twice", a->key);
            }
            VEC_PUSH(p->c->arena, p->attrs, a);
        } while (accept(p, ','));
    }
    return expect(p, '}');
}

/* An optional `WORD N` with N in [lo, INT_MAX] into *out. */
static int tail_int(P *p, const char *word, int64_t lo, int *out)
{
    int64_t n;
    if (!is_word(p, word))
        return 0;
    lex(p);
    if (expect_int(p, word, lo, INT_MAX, &n))
        return -1;
    *out = (int)n;
    return 0;
}

/* [loc("FILE":LINE:COL)] [layer N] [phase P] [stage N] [mb N] [tick N], in this order. */
static int parse_op_tail(P *p, Op *op)
{
    if (is_word(p, "loc")) {
        lex(p);
        if (expect(p, '('))
            return -1;
        if (p->tok.kind != T_STR)
            return fail(p, "a file name");
        const char *file = p->tok.s;
        lex(p);
        if (parse_loc_rest(p, file, &op->loc) || expect(p, ')'))
            return -1;
    }
    if (tail_int(p, "layer", 0, &op->layer))
        return -1;
    if (is_word(p, "phase")) {
        lex(p);
        int ph = parse_known(p, ir_phase_lookup, "phase");
        if (ph < 0)
            return -1;
        op->phase = (Phase)ph;
    }
    if (tail_int(p, "stage", INT_MIN, &op->stage) || tail_int(p, "mb", 0, &op->mb) ||
        tail_int(p, "tick", 0, &op->tick))
        return -1;
    return 0;
}

/* Everything is read and checked: now the op and its results enter the graph. */
static void build_op(P *p, OpKind kind, const Op *tail)
{
    Op *op = ir_op_new(p->g, kind, p->args.data, p->args.len, tail->loc);
    op->layer = tail->layer;
    op->phase = tail->phase;
    op->stage = tail->stage;
    op->mb = tail->mb;
    op->tick = tail->tick;
    for (int i = 0; i < p->res.len; i++) {
        const Pending *r = &p->res.data[i];
        Value *v = ir_op_result(p->g, op, r->dtype, r->rank, r->shape);
        v->name = r->name;
        v->shard = r->shard;
        id_put(p, r->num, v, (Loc){p->file, p->line, r->col});
    }
    for (int i = 0; i < p->attrs.len; i++)
        ir_op_set_attr(p->g, op, p->attrs.data[i]);
}

/* [RESULTS =] OPNAME [OPERANDS] [ATTRS] [TAIL] */
static int parse_op(P *p)
{
    Op tail = {.layer = -1, .phase = PH_FWD, .mb = -1};
    p->seen_op = 1;
    p->res.len = p->args.len = p->attrs.len = 0;
    if (p->tok.kind == T_VALUE && (parse_results(p) || expect(p, '=')))
        return -1;
    int kind = parse_known(p, ir_op_lookup, "op");
    if (kind < 0)
        return -1;
    if (p->tok.kind == T_VALUE) {
        do {
            Value *v = parse_use(p);
            if (!v)
                return -1;
            VEC_PUSH(p->c->arena, p->args, v);
        } while (accept(p, ','));
    }
    if (parse_attrs(p) || parse_op_tail(p, &tail))
        return -1;
    if (p->tok.kind != T_EOL)
        return fail(p, "end of line");
    build_op(p, (OpKind)kind, &tail);
    return 0;
}

/* ---- header lines ---- */

static int parse_module(P *p)
{
    int col = p->tok.col;
    const char *name = p->tok.s;
    if (p->tok.kind != T_IDENT && p->tok.kind != T_STR)
        return fail(p, "a module name");
    if (p->have_module)
        return error_at(p, col, "duplicate 'module' line");
    p->have_module = 1;
    p->g->name = name;
    lex(p);
    return 0;
}

/* NAME: ROLE = SIZE */
static int parse_mesh_axis(P *p)
{
    Mesh *m = &p->g->mesh;
    int col = p->tok.col, role;
    int64_t size;
    const char *name = expect_ident(p, "a mesh axis name");
    if (!name || expect(p, ':') || (role = parse_known(p, ir_role_lookup, "axis role")) < 0)
        return -1;
    if (expect(p, '=') || expect_int(p, "mesh axis size", 1, MAX_MESH_SIZE, &size))
        return -1;
    if (m->naxes == IR_MAX_AXES)
        return error_at(p, col, "more than %d mesh axes", IR_MAX_AXES);
    if (ir_mesh_axis(m, name) >= 0)
        return error_at(p, col, "mesh axis '%s' declared twice", name);
    m->axes[m->naxes++] = (MeshAxis){name, (int)size, (AxisRole)role, LOC_NONE};
    return 0;
}

static int parse_mesh(P *p)
{
    if (p->have_mesh)
        return error_at(p, p->tok.col, "duplicate 'mesh' line");
    p->have_mesh = 1;
    do {
        if (parse_mesh_axis(p))
            return -1;
    } while (accept(p, ','));
    return 0;
}

static int parse_config(P *p)
{
    do {
        Attr *a = parse_keyed(p);
        if (!a)
            return -1;
        VEC_PUSH(p->g->arena, p->g->config, a);
    } while (accept(p, ','));
    return 0;
}

static int parse_train(P *p)
{
    Attr *a = parse_keyed(p);
    if (a)
        VEC_PUSH(p->g->arena, p->g->train, a);
    return a ? 0 : -1;
}

/* schedule STAGE: TICK MB, TICK MB, ... (one stage's entries of Graph.sched, in order) */
static int parse_schedule(P *p)
{
    int64_t stage, tick, mb;
    if (expect_int(p, "a stage", 0, MAX_MESH_SIZE, &stage) || expect(p, ':'))
        return -1;
    do {
        if (expect_int(p, "a tick", 1, INT32_MAX, &tick) ||
            expect_int(p, "a microbatch", 0, INT32_MAX, &mb))
            return -1;
        SchedStep st = {(int)stage, (int)tick, (int)mb};
        VEC_PUSH(p->g->arena, p->g->sched, st);
    } while (accept(p, ','));
    return 0;
}

static int parse_output(P *p)
{
    Value *v = parse_use(p);
    if (v)
        VEC_PUSH(p->g->arena, p->g->outputs, v);
    return v ? 0 : -1;
}

/* ---- lines ---- */

static int parse_statement(P *p)
{
    static const struct {
        const char *word;
        int (*parse)(P *p);
        int header; /* must come before the first op */
    } stmts[] = {{"module", parse_module, 1},
                 {"config", parse_config, 1},
                 {"mesh", parse_mesh, 1},
                 {"train", parse_train, 1},
                 {"schedule", parse_schedule, 1},
                 {"output", parse_output, 0}};
    if (p->tok.kind == T_VALUE)
        return parse_op(p);
    if (p->tok.kind != T_IDENT)
        return fail(p, "a value, an op or a keyword");
    for (size_t i = 0; i < sizeof(stmts) / sizeof(stmts[0]); i++) {
        if (strcmp(p->tok.s, stmts[i].word) != 0)
            continue;
        if (stmts[i].header && p->seen_op)
            return error_at(p, p->tok.col, "'%s' must come before the first op", stmts[i].word);
        lex(p);
        return stmts[i].parse(p);
    }
    return parse_op(p); /* an op without results */
}

static void parse_line(P *p, const char *s, const char *eol)
{
    p->bol = p->pos = s;
    p->eol = eol;
    p->depth = 0;
    p->tok.kind = T_EOL;
    const char *nul = memchr(s, 0, (size_t)(eol - s));
    if (eol - s > MAX_LINE) {
        error_at(p, 1, "line longer than %d bytes", MAX_LINE);
        return;
    }
    if (nul) {
        error_at(p, col_of(p, nul), "NUL byte in input");
        return;
    }
    while (p->pos < eol && is_space(*p->pos))
        p->pos++;
    if (p->pos == eol || *p->pos == '#')
        return;
    lex(p);
    if (parse_statement(p) == 0 && p->tok.kind != T_EOL)
        fail(p, "end of line");
}

Graph *ir_parse(Ctx *c, const char *name, const char *text, size_t len)
{
    P p = {.c = c};
    int nerrors = c->diag.nerrors;
    char *copy = arena_alloc(c->arena, len + 1); /* diagnostics keep pointing at it */
    if (len)
        memcpy(copy, text, len);
    p.file = intern(c->strings, name ? name : "<ir>");
    diag_add_source(&c->diag, p.file, copy, len);
    p.scratch = arena_alloc(c->arena, (len < MAX_LINE ? len : MAX_LINE) + 1);
    p.g = ir_graph_new(c->arena, c->strings, NULL);
    for (const char *s = copy, *end = copy + len; s < end;) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        if (p.line == INT_MAX) {
            error_at(&p, 0, "more than %d lines", INT_MAX - 1);
            break;
        }
        p.line++;
        parse_line(&p, s, nl ? nl : end);
        s = nl ? nl + 1 : end;
    }
    return c->diag.nerrors > nerrors ? NULL : p.g;
}
