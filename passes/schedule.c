/* schedule.c: static pipeline schedules. Reads p ranks, m microbatches, v chunks
 * per rank and a kind (GPipe, 1F1B, Megatron's interleaved 1F1B, ZB-H1); writes
 * each rank's ordered list of F/B/W pieces, a simulator giving every piece's
 * start and end, the makespan, bubble fraction and peak live activations, a
 * Chrome trace writer and a text table. Key idea: a schedule is only an order
 * per rank; the times follow from the dependencies (F down the stages, B back
 * up, W after B), so one simulator checks every schedule for deadlocks and
 * measures its bubble. Depends on common/base.h, cJSON, and the train
 * block's `schedule` setting (TrainConfig). */
#include "passes.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <string.h>

typedef VEC(Piece) PieceVec;

const char *sched_kind_name(SchedKind k)
{
    switch (k) {
    case SCHED_GPIPE:
        return "gpipe";
    case SCHED_1F1B:
        return "1f1b";
    case SCHED_INTERLEAVED:
        return "interleaved";
    case SCHED_ZB_H1:
        return "zb-h1";
    }
    UNREACHABLE();
}

SchedKind sched_kind_of(const TrainConfig *tc)
{
    static const char *const names[] = {"gpipe", "1f1b", "interleaved", "zb"};
    for (int k = 0; k < 4; k++)
        if (tc->pipeline && !strcmp(tc->pipeline, names[k]))
            return (SchedKind)k;
    return SCHED_1F1B;
}

static int fail(char *err, size_t errn, const char *fmt, ...) PRINTF_LIKE(3, 4);

static int fail(char *err, size_t errn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errn)
        vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    return -1;
}

static void push(Arena *a, PieceVec *l, PieceKind k, int mb, int chunk)
{
    VEC_PUSH(a, *l, ((Piece){k, mb, chunk}));
}

/* GPipe: all forwards, then all backwards, in microbatch order. */
static void build_gpipe(Arena *a, PieceVec *l, int m)
{
    for (int i = 0; i < m; i++)
        push(a, l, PIECE_F, i, 0);
    for (int i = 0; i < m; i++)
        push(a, l, PIECE_B, i, 0);
}

/* ZB-H1: after B(i), emit the oldest pending W while more than `defer` wait. */
static void push_b(Arena *a, PieceVec *l, int mb, int *wnext, int defer)
{
    push(a, l, PIECE_B, mb, 0);
    while (defer >= 0 && mb + 1 - *wnext > defer)
        push(a, l, PIECE_W, (*wnext)++, 0);
}

/* 1F1B: p - r - 1 warm-up forwards, then F/B pairs, then the remaining Bs. ZB-H1
 * is the same order with B split: rank r holds back up to r weight gradients,
 * which fill the cool-down gaps (rank 0 runs W right after B). */
static void build_1f1b(Arena *a, PieceVec *l, int p, int m, int r, int zb)
{
    int warm = p - r - 1 < m ? p - r - 1 : m, wnext = 0, defer = zb ? r : -1;
    for (int i = 0; i < warm; i++)
        push(a, l, PIECE_F, i, 0);
    for (int i = 0; i < m - warm; i++) {
        push(a, l, PIECE_F, warm + i, 0);
        push_b(a, l, i, &wnext, defer);
    }
    for (int i = m - warm; i < m; i++)
        push_b(a, l, i, &wnext, defer);
    while (zb && wnext < m)
        push(a, l, PIECE_W, wnext++, 0);
}

/* Megatron's virtual microbatch k: groups of p microbatches go through the chunks
 * in turn; backwards visit the chunks in reverse. */
static Piece virtual_piece(PieceKind kind, int k, int p, int v)
{
    int c = k % (p * v) / p;
    return (Piece){kind, k / (p * v) * p + k % p, kind == PIECE_F ? c : v - 1 - c};
}

/* Interleaved 1F1B: 2 (p - r - 1) + (v - 1) p warm-up forwards of the m v
 * virtual microbatches, then F/B pairs, then the remaining Bs (Megatron-LM). */
static void build_interleaved(Arena *a, PieceVec *l, int p, int m, int v, int r)
{
    int total = m * v, warm = 2 * (p - r - 1) + (v - 1) * p;
    if (warm > total)
        warm = total;
    for (int k = 0; k < warm; k++)
        VEC_PUSH(a, *l, virtual_piece(PIECE_F, k, p, v));
    for (int k = 0; k < total - warm; k++) {
        VEC_PUSH(a, *l, virtual_piece(PIECE_F, k + warm, p, v));
        VEC_PUSH(a, *l, virtual_piece(PIECE_B, k, p, v));
    }
    for (int k = total - warm; k < total; k++)
        VEC_PUSH(a, *l, virtual_piece(PIECE_B, k, p, v));
}

static int check_args(SchedKind kind, int p, int m, int v, char *err, size_t errn)
{
    if (p < 1)
        return fail(err, errn, "pipeline stages p must be >= 1 (got %d)", p);
    if (m < 1)
        return fail(err, errn, "microbatches m must be >= 1 (got %d)", m);
    if (v < 1)
        return fail(err, errn, "virtual stages v must be >= 1 (got %d)", v);
    if (v > 1 && kind != SCHED_INTERLEAVED)
        return fail(err, errn, "v = %d virtual stages need the interleaved schedule, not %s", v,
                    sched_kind_name(kind));
    if (kind == SCHED_INTERLEAVED && m % p != 0)
        return fail(err, errn, "the interleaved schedule needs m divisible by p (m = %d, p = %d)",
                    m, p);
    return 0;
}

int sched_build(Arena *a, SchedKind kind, int p, int m, int v, Schedule *out, char *err,
                size_t errn)
{
    if (check_args(kind, p, m, v, err, errn) < 0)
        return -1;
    *out = (Schedule){kind, p, m, v, arena_alloc(a, (size_t)p * sizeof(SchedRank))};
    for (int r = 0; r < p; r++) {
        PieceVec l = {0};
        if (kind == SCHED_GPIPE)
            build_gpipe(a, &l, m);
        else if (kind == SCHED_INTERLEAVED)
            build_interleaved(a, &l, p, m, v, r);
        else
            build_1f1b(a, &l, p, m, r, kind == SCHED_ZB_H1);
        out->ranks[r] = (SchedRank){l.data, l.len};
    }
    return 0;
}

double sched_unit_cost(const Piece *pc, int rank, void *user)
{
    const Schedule *s = user;
    if (pc->kind == PIECE_B)
        return s->kind == SCHED_ZB_H1 ? 1.0 : 2.0;
    return 1.0;
}

/* ---- simulator ---- */

typedef struct Sim {
    const Schedule *s;
    int nstage;
    double *done[3]; /* [kind][mb * nstage + stage]: end time, -1 while not run */
    double xfer;
} Sim;

static double *done_at(Sim *sm, PieceKind k, int mb, int stage)
{
    return &sm->done[k][mb * sm->nstage + stage];
}

/* Is dependency (k, mb, stage) done? Raises *ready to its end (+ xfer off-rank). */
static int dep(Sim *sm, PieceKind k, int mb, int stage, int rank, double *ready)
{
    double t = *done_at(sm, k, mb, stage);
    if (t < 0)
        return 0;
    if (stage % sm->s->p != rank)
        t += sm->xfer;
    if (t > *ready)
        *ready = t;
    return 1;
}

/* The time piece pc of rank r may start (>= free), or -1 while an input is missing. */
static double ready_time(Sim *sm, const Piece *pc, int r, double free)
{
    int st = pc->chunk * sm->s->p + r, ok = 1;
    if (pc->kind == PIECE_F && st > 0)
        ok = dep(sm, PIECE_F, pc->mb, st - 1, r, &free);
    if (pc->kind == PIECE_B) {
        ok = dep(sm, PIECE_F, pc->mb, st, r, &free);
        if (ok && st + 1 < sm->nstage)
            ok = dep(sm, PIECE_B, pc->mb, st + 1, r, &free);
    }
    if (pc->kind == PIECE_W)
        ok = dep(sm, PIECE_B, pc->mb, st, r, &free);
    return ok ? free : -1;
}

static const char *kind_letter(PieceKind k)
{
    return k == PIECE_F ? "F" : k == PIECE_B ? "B" : "W";
}

static int check_piece(const Sim *sm, const Piece *pc, int r, char *err, size_t errn)
{
    const Schedule *s = sm->s;
    if (pc->mb < 0 || pc->mb >= s->m || pc->chunk < 0 || pc->chunk >= s->v ||
        (pc->kind == PIECE_W && s->kind != SCHED_ZB_H1))
        return fail(err, errn, "rank %d: piece %s%d.%d out of range", r, kind_letter(pc->kind),
                    pc->mb, pc->chunk);
    if (sm->done[pc->kind][pc->mb * sm->nstage + pc->chunk * s->p + r] >= 0)
        return fail(err, errn, "rank %d: piece %s%d.%d appears twice", r, kind_letter(pc->kind),
                    pc->mb, pc->chunk);
    return 0;
}

typedef struct RankState {
    int next, live;
    double free, busy;
} RankState;

/* Run rank r's list as far as its inputs allow; 1 if it ran anything, -1 on error. */
static int advance(Sim *sm, SchedCostFn cost, void *user, int r, RankState *rs, SchedTimes *out,
                   char *err, size_t errn)
{
    const SchedRank *sr = &sm->s->ranks[r];
    int ran = 0;
    while (rs->next < sr->n) {
        const Piece *pc = &sr->pieces[rs->next];
        if (check_piece(sm, pc, r, err, errn) < 0)
            return -1;
        double t = ready_time(sm, pc, r, rs->free), c = cost(pc, r, user);
        if (t < 0)
            break;
        out->start[r][rs->next] = t;
        out->end[r][rs->next] = rs->free = t + c;
        *done_at(sm, pc->kind, pc->mb, pc->chunk * sm->s->p + r) = t + c;
        rs->busy += c;
        rs->live += pc->kind == PIECE_F ? 1 : pc->kind == PIECE_B ? -1 : 0;
        if (rs->live > out->peak[r])
            out->peak[r] = rs->live;
        rs->next++;
        ran = 1;
    }
    return ran;
}

static int check_complete(Sim *sm, char *err, size_t errn)
{
    int kinds = sm->s->kind == SCHED_ZB_H1 ? 3 : 2;
    for (int k = 0; k < kinds; k++)
        for (int i = 0; i < sm->s->m * sm->nstage; i++)
            if (sm->done[k][i] < 0)
                return fail(err, errn, "piece %s%d of stage %d is missing",
                            kind_letter((PieceKind)k), i / sm->nstage, i % sm->nstage);
    return 0;
}

static void times_init(Arena *a, const Schedule *s, SchedTimes *out)
{
    *out = (SchedTimes){0};
    out->start = arena_alloc(a, (size_t)s->p * sizeof(double *));
    out->end = arena_alloc(a, (size_t)s->p * sizeof(double *));
    out->peak = arena_alloc(a, (size_t)s->p * sizeof(int));
    for (int r = 0; r < s->p; r++) {
        out->start[r] = arena_alloc(a, (size_t)s->ranks[r].n * sizeof(double) + 1);
        out->end[r] = arena_alloc(a, (size_t)s->ranks[r].n * sizeof(double) + 1);
    }
}

static Sim sim_new(Arena *a, const Schedule *s, double xfer)
{
    Sim sm = {s, s->p * s->v, {NULL, NULL, NULL}, xfer};
    size_t n = (size_t)s->m * (size_t)sm.nstage;
    for (int k = 0; k < 3; k++) {
        sm.done[k] = arena_alloc(a, n * sizeof(double));
        for (size_t i = 0; i < n; i++)
            sm.done[k][i] = -1;
    }
    return sm;
}

/* Report the first rank that still has pieces when no rank can move. */
static int deadlock(const Schedule *s, const RankState *rs, char *err, size_t errn)
{
    for (int r = 0; r < s->p; r++) {
        if (rs[r].next < s->ranks[r].n) {
            const Piece *pc = &s->ranks[r].pieces[rs[r].next];
            return fail(err, errn, "deadlock: rank %d waits at piece %d (%s%d.%d)", r, rs[r].next,
                        kind_letter(pc->kind), pc->mb, pc->chunk);
        }
    }
    return 0;
}

int sched_simulate(Arena *a, const Schedule *s, SchedCostFn cost, void *user, double xfer,
                   SchedTimes *out, char *err, size_t errn)
{
    Sim sm = sim_new(a, s, xfer);
    RankState *rs = arena_alloc(a, (size_t)s->p * sizeof(RankState));
    if (!cost) {
        cost = sched_unit_cost;
        user = (void *)s;
    }
    times_init(a, s, out);
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < s->p; r++) {
            int ran = advance(&sm, cost, user, r, &rs[r], out, err, errn);
            if (ran < 0)
                return -1;
            moved |= ran;
        }
    }
    if (deadlock(s, rs, err, errn) < 0 || check_complete(&sm, err, errn) < 0)
        return -1;
    for (int r = 0; r < s->p; r++)
        if (rs[r].free > out->makespan)
            out->makespan = rs[r].free;
    double idle = 0;
    for (int r = 0; r < s->p; r++)
        idle += out->makespan - rs[r].busy;
    out->bubble = out->makespan > 0 ? idle / (s->p * out->makespan) : 0;
    return 0;
}

/* ---- output ---- */

static void piece_name(const Schedule *s, const Piece *pc, char *buf, size_t n)
{
    if (s->v > 1)
        snprintf(buf, n, "%s%d.%d", kind_letter(pc->kind), pc->mb, pc->chunk);
    else
        snprintf(buf, n, "%s%d", kind_letter(pc->kind), pc->mb);
}

void sched_print(const Schedule *s, FILE *f)
{
    char buf[48];
    for (int r = 0; r < s->p; r++) {
        fprintf(f, "rank %d:", r);
        for (int i = 0; i < s->ranks[r].n; i++) {
            piece_name(s, &s->ranks[r].pieces[i], buf, sizeof buf);
            fprintf(f, " %s", buf);
        }
        fputc('\n', f);
    }
}

static cJSON *thread_name(int r)
{
    char buf[32];
    cJSON *e = cJSON_CreateObject(), *args = cJSON_CreateObject();
    snprintf(buf, sizeof buf, "stage %d", r);
    cJSON_AddStringToObject(e, "name", "thread_name");
    cJSON_AddStringToObject(e, "ph", "M");
    cJSON_AddNumberToObject(e, "pid", 0);
    cJSON_AddNumberToObject(e, "tid", r);
    cJSON_AddStringToObject(args, "name", buf);
    cJSON_AddItemToObject(e, "args", args);
    return e;
}

static cJSON *piece_event(const Schedule *s, const SchedTimes *t, double us, int r, int i)
{
    const Piece *pc = &s->ranks[r].pieces[i];
    char buf[48];
    cJSON *e = cJSON_CreateObject(), *args = cJSON_CreateObject();
    piece_name(s, pc, buf, sizeof buf);
    cJSON_AddStringToObject(e, "name", buf);
    cJSON_AddStringToObject(e, "ph", "X");
    cJSON_AddNumberToObject(e, "ts", t->start[r][i] * us);
    cJSON_AddNumberToObject(e, "dur", (t->end[r][i] - t->start[r][i]) * us);
    cJSON_AddNumberToObject(e, "pid", 0);
    cJSON_AddNumberToObject(e, "tid", r);
    cJSON_AddStringToObject(args, "kind", kind_letter(pc->kind));
    cJSON_AddNumberToObject(args, "microbatch", pc->mb);
    cJSON_AddNumberToObject(args, "chunk", pc->chunk);
    cJSON_AddNumberToObject(args, "stage", pc->chunk * s->p + r);
    cJSON_AddItemToObject(e, "args", args);
    return e;
}

int sched_write_trace(const Schedule *s, const SchedTimes *t, double us_per_unit, FILE *f)
{
    cJSON *root = cJSON_CreateObject(), *ev = cJSON_AddArrayToObject(root, "traceEvents");
    for (int r = 0; r < s->p; r++) {
        cJSON_AddItemToArray(ev, thread_name(r));
        for (int i = 0; i < s->ranks[r].n; i++)
            cJSON_AddItemToArray(ev, piece_event(s, t, us_per_unit, r, i));
    }
    cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return -1;
    int rc = fputs(text, f) < 0 || fputc('\n', f) == EOF ? -1 : 0;
    cJSON_free(text);
    return rc;
}

int sched_of_train(Ctx *c, const Graph *g, const TrainConfig *t, Schedule *sc, const char *who)
{
    const TrainConfig tc = *t;
    char err[256];
    int p = ir_pipeline_stages(&g->mesh);
    SchedKind kind = p > 1 ? sched_kind_of(&tc) : SCHED_1F1B;
    int v = kind == SCHED_INTERLEAVED && p > 1 ? (int)tc.virtual_stages : 1;
    if (sched_build(c->arena, kind, p, (int)tc.microbatches, v, sc, err, sizeof err) != 0)
        return diag_error(&c->diag, LOC_NONE, "%s: the %s schedule: %s", who, sched_kind_name(kind),
                          err),
               -1;
    return 0;
}
