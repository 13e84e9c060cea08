/* test_schedule.c: the static pipeline schedules of passes/schedule.c over
 * p in {1, 2, 4}, m in {1, 2, 4, 8}, every kind (v in {2, 3} for interleaved):
 * each list holds every piece once in dependency order, the simulator runs it
 * without deadlock, peaks and unit-cost bubble fractions match the closed forms
 * of docs/schedules.md exactly (1e-12), the Chrome trace parses back, and bad
 * arguments and orders fail with their exact messages. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

static const int PS[] = {1, 2, 4}, MS[] = {1, 2, 4, 8};

/* Position of (kind, mb, chunk) in rank r's list; -1 when absent. */
static int find(const Schedule *s, int r, PieceKind k, int mb, int c)
{
    for (int i = 0; i < s->ranks[r].n; i++) {
        const Piece *pc = &s->ranks[r].pieces[i];
        if (pc->kind == k && pc->mb == mb && pc->chunk == c)
            return i;
    }
    return -1;
}

static int count(const Schedule *s, int r, PieceKind k, int mb, int c)
{
    int n = 0;
    for (int i = 0; i < s->ranks[r].n; i++) {
        const Piece *pc = &s->ranks[r].pieces[i];
        n += pc->kind == k && pc->mb == mb && pc->chunk == c;
    }
    return n;
}

/* Every piece once per global stage; F < B < W and chunk order on each rank. */
static void check_lists(const Schedule *s)
{
    int zb = s->kind == SCHED_ZB_H1, total = 0;
    for (int r = 0; r < s->p; r++) {
        total += s->ranks[r].n;
        for (int mb = 0; mb < s->m; mb++)
            for (int c = 0; c < s->v; c++) {
                cr_assert_eq(count(s, r, PIECE_F, mb, c), 1);
                cr_assert_eq(count(s, r, PIECE_B, mb, c), 1);
                cr_assert_eq(count(s, r, PIECE_W, mb, c), zb);
                int f = find(s, r, PIECE_F, mb, c), b = find(s, r, PIECE_B, mb, c);
                cr_assert_lt(f, b);
                if (zb)
                    cr_assert_lt(b, find(s, r, PIECE_W, mb, c));
                if (c > 0) {
                    cr_assert_lt(find(s, r, PIECE_F, mb, c - 1), f);
                    cr_assert_gt(find(s, r, PIECE_B, mb, c - 1), b);
                }
            }
    }
    cr_assert_eq(total, s->p * s->m * s->v * (zb ? 3 : 2));
}

static double frac(int p, double work)
{
    return (p - 1) / (work + p - 1);
}

/* The bubble with unit costs (docs/schedules.md). ZB-H1 with m < p is not covered. */
static double want_bubble(const Schedule *s)
{
    switch (s->kind) {
    case SCHED_GPIPE:
    case SCHED_1F1B:
        return frac(s->p, s->m);
    case SCHED_INTERLEAVED:
        return frac(s->p, (double)s->v * s->m);
    case SCHED_ZB_H1:
        return frac(s->p, 3.0 * s->m);
    }
    return -1;
}

static void check_one(Arena *a, SchedKind k, int p, int m, int v)
{
    Schedule s;
    SchedTimes t;
    char err[256] = "";
    cr_assert_eq(sched_build(a, k, p, m, v, &s, err, sizeof err), 0, "%s", err);
    check_lists(&s);
    cr_assert_eq(sched_simulate(a, &s, NULL, NULL, 0, &t, err, sizeof err), 0, "%s", err);
    if (k == SCHED_GPIPE)
        cr_assert_eq(t.peak[0], m);
    if (k == SCHED_1F1B || k == SCHED_ZB_H1)
        cr_assert_eq(t.peak[0], m < p ? m : p);
    if (k != SCHED_ZB_H1 || m >= p)
        cr_assert_float_eq(t.bubble, want_bubble(&s), 1e-12, "%s p=%d m=%d v=%d: %.17g",
                           sched_kind_name(k), p, m, v, t.bubble);
    Schedule o;
    SchedTimes ot;
    sched_build(a, SCHED_1F1B, p, m, 1, &o, err, sizeof err);
    sched_simulate(a, &o, NULL, NULL, 0, &ot, err, sizeof err);
    if (p >= 2 && (k == SCHED_INTERLEAVED || (k == SCHED_ZB_H1 && m >= p)))
        cr_assert_lt(t.bubble, ot.bubble);
}

Test(schedule, all_kinds_valid_and_bubbles_exact)
{
    Arena *a = arena_new();
    for (size_t i = 0; i < sizeof PS / sizeof *PS; i++)
        for (size_t j = 0; j < sizeof MS / sizeof *MS; j++) {
            int p = PS[i], m = MS[j];
            check_one(a, SCHED_GPIPE, p, m, 1);
            check_one(a, SCHED_1F1B, p, m, 1);
            check_one(a, SCHED_ZB_H1, p, m, 1);
            for (int v = 2; v <= 3 && m % p == 0; v++)
                check_one(a, SCHED_INTERLEAVED, p, m, v);
        }
    arena_free(a);
}

/* ZB-H1 with m < p has no steady state; it still beats 1F1B here. */
Test(schedule, zb_h1_few_microbatches)
{
    Arena *a = arena_new();
    Schedule z, o;
    SchedTimes tz, to;
    char err[256];
    for (int m = 1; m < 4; m++) {
        cr_assert_eq(sched_build(a, SCHED_ZB_H1, 4, m, 1, &z, err, sizeof err), 0);
        cr_assert_eq(sched_build(a, SCHED_1F1B, 4, m, 1, &o, err, sizeof err), 0);
        cr_assert_eq(sched_simulate(a, &z, NULL, NULL, 0, &tz, err, sizeof err), 0);
        cr_assert_eq(sched_simulate(a, &o, NULL, NULL, 0, &to, err, sizeof err), 0);
        cr_assert_lt(tz.bubble, to.bubble, "m=%d %g %g", m, tz.bubble, to.bubble);
    }
    arena_free(a);
}

static void expect_error(SchedKind k, int p, int m, int v, const char *want)
{
    Arena *a = arena_new();
    Schedule s;
    char err[256] = "";
    cr_assert_eq(sched_build(a, k, p, m, v, &s, err, sizeof err), -1);
    cr_assert_str_eq(err, want);
    arena_free(a);
}

Test(schedule, errors)
{
    expect_error(SCHED_1F1B, 0, 4, 1, "pipeline stages p must be >= 1 (got 0)");
    expect_error(SCHED_GPIPE, 2, 0, 1, "microbatches m must be >= 1 (got 0)");
    expect_error(SCHED_INTERLEAVED, 2, 4, 0, "virtual stages v must be >= 1 (got 0)");
    expect_error(SCHED_1F1B, 2, 4, 2,
                 "v = 2 virtual stages need the interleaved schedule, not 1f1b");
    expect_error(SCHED_ZB_H1, 2, 4, 3,
                 "v = 3 virtual stages need the interleaved schedule, not zb-h1");
    expect_error(SCHED_INTERLEAVED, 4, 6, 2,
                 "the interleaved schedule needs m divisible by p (m = 6, p = 4)");
    expect_error(SCHED_INTERLEAVED, 4, 2, 2,
                 "the interleaved schedule needs m divisible by p (m = 2, p = 4)");
}

static void expect_sim_error(Schedule *s, const char *want)
{
    Arena *a = arena_new();
    SchedTimes t;
    char err[256] = "";
    cr_assert_eq(sched_simulate(a, s, NULL, NULL, 0, &t, err, sizeof err), -1);
    cr_assert_str_eq(err, want);
    arena_free(a);
}

Test(schedule, bad_orders_are_reported)
{
    Piece r0[] = {{PIECE_B, 0, 0}, {PIECE_F, 0, 0}}, r1[] = {{PIECE_F, 0, 0}, {PIECE_B, 0, 0}};
    SchedRank ranks[] = {{r0, 2}, {r1, 2}};
    Schedule s = {SCHED_1F1B, 2, 1, 1, ranks};
    expect_sim_error(&s, "deadlock: rank 0 waits at piece 0 (B0.0)");
    Piece twice[] = {{PIECE_F, 0, 0}, {PIECE_F, 0, 0}, {PIECE_B, 0, 0}};
    ranks[0] = (SchedRank){twice, 3};
    expect_sim_error(&s, "rank 0: piece F0.0 appears twice");
    Piece none[] = {{PIECE_F, 0, 0}};
    ranks[0] = (SchedRank){none, 1};
    expect_sim_error(&s, "piece B0 of stage 0 is missing");
    Piece cross[] = {{PIECE_B, 0, 0}, {PIECE_F, 0, 0}};
    ranks[0] = (SchedRank){r1, 2};
    ranks[1] = (SchedRank){cross, 2};
    expect_sim_error(&s, "deadlock: rank 0 waits at piece 1 (B0.0)");
    Piece w[] = {{PIECE_F, 0, 0}, {PIECE_B, 0, 0}, {PIECE_W, 0, 0}};
    ranks[0] = (SchedRank){w, 3};
    ranks[1] = (SchedRank){r1, 2};
    expect_sim_error(&s, "rank 0: piece W0.0 out of range");
}

/* Caller costs and a transfer time: 1F1B on 2 ranks, 1 microbatch, F = 1,
 * B = 2, xfer = 0.5: F0 [0,1], F1 [1.5,2.5], B1 [2.5,4.5], B0 [5,7]. */
static double double_cost(const Piece *pc, int rank, void *user)
{
    return pc->kind == PIECE_F ? 1.0 : 2.0;
}

Test(schedule, caller_costs_and_transfer)
{
    Arena *a = arena_new();
    Schedule s;
    SchedTimes t;
    char err[256];
    cr_assert_eq(sched_build(a, SCHED_1F1B, 2, 1, 1, &s, err, sizeof err), 0);
    cr_assert_eq(sched_simulate(a, &s, double_cost, NULL, 0.5, &t, err, sizeof err), 0);
    cr_assert_float_eq(t.start[1][0], 1.5, 1e-12);
    cr_assert_float_eq(t.start[0][1], 5.0, 1e-12);
    cr_assert_float_eq(t.makespan, 7.0, 1e-12);
    cr_assert_float_eq(t.bubble, (7.0 - 3.0) * 2 / 14.0, 1e-12);
    arena_free(a);
}

static char *print_to_string(const Schedule *s)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    sched_print(s, f);
    fclose(f);
    return buf;
}

Test(schedule, text_table)
{
    Arena *a = arena_new();
    Schedule s;
    char err[256];
    sched_build(a, SCHED_1F1B, 2, 3, 1, &s, err, sizeof err);
    char *t = print_to_string(&s);
    cr_assert_str_eq(t, "rank 0: F0 F1 B0 F2 B1 B2\nrank 1: F0 B0 F1 B1 F2 B2\n");
    free(t);
    sched_build(a, SCHED_ZB_H1, 2, 2, 1, &s, err, sizeof err);
    t = print_to_string(&s);
    cr_assert_str_eq(t, "rank 0: F0 F1 B0 W0 B1 W1\nrank 1: F0 B0 F1 B1 W0 W1\n");
    free(t);
    sched_build(a, SCHED_INTERLEAVED, 1, 1, 2, &s, err, sizeof err);
    t = print_to_string(&s);
    cr_assert_str_eq(t, "rank 0: F0.0 F0.1 B0.1 B0.0\n");
    free(t);
    arena_free(a);
}

/* Count events of phase ph; mark the tids seen. */
static int count_events(cJSON *ev, const char *ph, int *seen, int p)
{
    int n = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, ev)
    {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, ph) != 0)
            continue;
        int tid = cJSON_GetObjectItem(e, "tid")->valueint;
        cr_assert(tid >= 0 && tid < p);
        seen[tid] = 1;
        n++;
    }
    return n;
}

Test(schedule, chrome_trace_round_trips)
{
    Arena *a = arena_new();
    Schedule s;
    SchedTimes t;
    char err[256], *buf = NULL;
    size_t n = 0;
    sched_build(a, SCHED_INTERLEAVED, 4, 8, 2, &s, err, sizeof err);
    cr_assert_eq(sched_simulate(a, &s, NULL, NULL, 0, &t, err, sizeof err), 0);
    FILE *f = open_memstream(&buf, &n);
    cr_assert_eq(sched_write_trace(&s, &t, 1000, f), 0);
    fclose(f);
    cJSON *root = cJSON_Parse(buf);
    cr_assert_not_null(root);
    cJSON *ev = cJSON_GetObjectItem(root, "traceEvents");
    int seen_x[4] = {0}, seen_m[4] = {0};
    cr_assert_eq(count_events(ev, "X", seen_x, 4), 4 * 8 * 2 * 2);
    cr_assert_eq(count_events(ev, "M", seen_m, 4), 4);
    for (int r = 0; r < 4; r++)
        cr_assert(seen_x[r] && seen_m[r]);
    cr_assert_str_eq(cJSON_GetObjectItem(root, "displayTimeUnit")->valuestring, "ms");
    cJSON_Delete(root);
    free(buf);
    arena_free(a);
}
