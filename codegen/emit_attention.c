/* emit_attention.c: the GPU renderings (CUDA C, OpenCL C) of the attention
 * kernels. Reads one Kernel of pattern attention or attention backward;
 * writes its body and says how it is launched. Key idea: templates whose
 * $NAME words are filled per language, type and options (causal, window,
 * mask, ALiBi, grouped heads, the scores' soft cap, a score bias), so one
 * text serves both languages.
 *
 * Two algorithms:
 * - scalar: a block per (batch, head, 4 query rows), a warp per row, keys
 *   and values streamed through shared memory a tile at a time, with an
 *   online softmax. The backward recomputes each row's statistics, then per
 *   tile accumulates dq in registers and adds dk, dv (and a score bias's
 *   gradient) into memory with atomics (the plan zeroes them before).
 * - tensor cores (bf16 q, k, v; a head size that is a multiple of 16, up to
 *   128): the same blocks of rows and tiles of keys, every product a
 *   warp's mma m16n8k16 (bf16 operands, f32 accumulators). See mma_* below.
 *   The OpenCL rendering runs the same text with the mma and the lane
 *   shuffles emulated through local memory (the prelude's tcc_mma_em), so
 *   PoCL checks the tiling, the fragment layouts and the online softmax.
 * The storage type of a dtype (cg_gpu_storage), which both GPU renderings
 * spell, lives here: emit_gpu.c calls this file, and this file nothing of
 * emit_gpu.c. */
#include "kgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ATT_ROWS = 4, ATT_SMEM = 40 * 1024 };

/* The C type both GPU renderings store dtype t in (bf16: its 16 bits). */
const char *cg_gpu_storage(DType t)
{
    switch (t) {
    case DT_F32: return "float";
    case DT_F64: return "double";
    case DT_I32: return "int";
    default: return "unsigned short"; /* bf16 bits */
    }
}

typedef struct At {
    FILE *f;
    const Kernel *k;
    CgLang lang;
    int f32; /* the float type is float */
} At;

static const char *ft(const At *g) { return g->f32 ? "float" : "double"; }
static const char *inf(const At *g) { return g->f32 ? "TCC_INF_F" : "TCC_INF_D"; }

/* A math function's name: CUDA spells the float ones with an f. */
static const char *mf(const At *g, Arena *a, const char *name)
{
    return g->lang == CG_CUDA && g->f32 ? arena_printf(a, "%sf", name) : name;
}

/* Keys per tile: 32 (a key per lane) unless shared memory is short. */
static int att_tile(const Kernel *k)
{
    int64_t dh = k->attn.head_dim > k->attn.head_dim_v ? k->attn.head_dim : k->attn.head_dim_v;
    int64_t size = k->ftype == DT_F64 ? 8 : 4;
    int kt = 32;
    int64_t rows = k->pattern == KP_ATTENTION ? 1 : 2; /* q (and dout) rows */
    while (kt > 1 && (rows * ATT_ROWS * dh + 2 * kt * (dh + 1) + 2 * ATT_ROWS * 32) * size > ATT_SMEM)
        kt /= 2;
    return kt;
}



typedef struct Sub {
    const char *key, *val;
} Sub;

static void fill(At *g, const char *tmpl, const Sub *subs, int nsubs)
{
    for (const char *p = tmpl; *p;) {
        if (*p != '$') {
            fputc(*p++, g->f);
            continue;
        }
        size_t n = 1;
        while ((p[n] >= 'A' && p[n] <= 'Z') || (p[n] >= '0' && p[n] <= '9'))
            n++;
        int found = 0;
        for (int i = 0; i < nsubs && !found; i++)
            if (strlen(subs[i].key) == n - 1 && !strncmp(subs[i].key, p + 1, n - 1)) {
                fputs(subs[i].val, g->f);
                found = 1;
            }
        if (!found)
            BUG("attention template: no value for %.*s", (int)n, p);
        p += n;
    }
}

/* The keys and values of tile j0 into shared memory, between barriers. */
static const char *att_tile_load =
    "        TCC_BARRIER();\n"
    "        for (int e = tid; e < KT * DH; e += ROWS * 32) {\n"
    "            const int jj = e / DH, d = e % DH;\n"
    "            const tcc_i64 j = j0 + jj, at = (b * $KS + j) * $KP + kh * $KH$KO + d;\n"
    "            Ks[jj][d] = j < $KS ? $LD1(a1[at]) : 0;\n"
    "$VLOAD"
    "        }\n"
    "$VLOADV"
    "        TCC_BARRIER();\n";

/* The block's query rows; then, tile by tile, the keys a lane each: scores,
 * the row's running max and sum, the output rescaled and accumulated. */
static const char *att_common =
    "    enum { B = $B, S = $S,$SKDECL H = $H, KV = $KV, DH = $DH,$DVDECL CAUSAL = $CAUSAL, ROWS = $ROWS,\n"
    "           KT = $KT, NA = ($NAD + 31) / 32 };\n"
    "    const $T scale = $SCALE;\n"
    "$CAPDECL"
    "    const int tid = TCC_TID, lane = tid & 31, w = tid >> 5;\n"
    "    const tcc_i64 nqb = (S + ROWS - 1) / ROWS, blk = TCC_BID;\n"
    "    const tcc_i64 qb = blk % nqb, h = blk / nqb % H, b = blk / nqb / H, kh = h / (H / KV);\n"
    "    const tcc_i64 QC = (tcc_i64)H * DH,$KCDECL$VCDECL i = qb * ROWS + w;\n"
    "$SLOPE"
    "    const int live = i < S;\n"
    "    const tcc_i64 last = CAUSAL && qb * ROWS + ROWS - 1 < $KS - 1 ? qb * ROWS + ROWS - 1 : $KS - 1;\n"
    "$RANGE"
    "    TCC_SHARED $T Qs[ROWS][DH], Ks[KT][DH + 1], Vs[KT][$VD + 1];\n"
    "$RPDECL"
    "$DOSDECL"
    "    for (int e = tid; e < ROWS * DH; e += ROWS * 32) {\n"
    "        const tcc_i64 r = qb * ROWS + e / DH;\n"
    "        Qs[e / DH][e % DH] = r < S ? $LD0(a0[(b * S + r) * $QP + h * $QH$QO + e % DH]) : 0;\n"
    "$DOSLOAD"
    "    }\n"
    "$DOSLOADV"
    "    $T m = -$INF, l = 0, acc[NA];\n"
    "    for (int r = 0; r < NA; r++)\n"
    "        acc[r] = 0;\n"
    "    for (tcc_i64 j0 = $FIRST; j0 <= $LAST; j0 += KT) {\n"
    "$TILE"
    "        const tcc_i64 j = j0 + lane;\n"
    "        $T s = -$INF;\n"
    "        if (live && lane < KT && j < $KS && $SEEN) {\n"
    "            $T dot = 0;\n"
    "            for (int d = 0; d < DH; d++)\n"
    "                dot += Qs[w][d] * Ks[lane][d];\n"
    "            s = $CAPLdot * scale$CAPR$ALIBI$BIAS;\n"
    "        }\n"
    "        const $T nm = $FMAX(m, $RMAX(s));\n"
    "        const $T p = s == -$INF ? 0 : $EXP(s - nm), corr = m == -$INF ? 0 : $EXP(m - nm);\n"
    "        l = l * corr + $RSUM(p);\n"
    "$BCAST"
    "        for (int jj = 0; jj < KT; jj++) {\n"
    "            const $T pj = TCC_PJ(p, jj);\n"
    "            for (int r = 0; r < NA; r++)\n"
    "                if (lane + 32 * r < $VD)\n"
    "                    acc[r] = (jj ? acc[r] : acc[r] * corr) + pj * Vs[jj][lane + 32 * r];\n"
    "        }\n"
    "        m = nm;\n"
    "    }\n";

static const char *att_fwd_tail =
    "    if (live)\n"
    "        for (int r = 0; r < NA; r++)\n"
    "            if (lane + 32 * r < $VD)\n"
    "                a3[(b * S + i) * $OC + h * $VD + lane + 32 * r] = $ST3($OUTR);\n";

/* The row's statistics are those of the forward above; then each tile again:
 * p and ds for the block's rows through shared memory, dq in registers, and
 * the tile's dk, dv rows summed over the block's rows and added to memory. */
static const char *att_bwd_tail =
    "    $T part = 0;\n"
    "    for (int r = 0; r < NA; r++)\n"
    "        if (lane + 32 * r < $VD)\n"
    "            part += DOs[w][lane + 32 * r] * $OUTR;\n"
    "    const $T dot_o = $RSUM(part), lse = live ? m + $LOG(l) : 0;\n"
    "    $T dq[NA];\n"
    "    for (int r = 0; r < NA; r++)\n"
    "        dq[r] = 0;\n"
    "    for (tcc_i64 j0 = $FIRST; j0 <= $LAST; j0 += KT) {\n"
    "$TILE"
    "        const tcc_i64 j = j0 + lane;\n"
    "        $T p = 0, ds = 0;\n"
    "        if (live && lane < KT && j < $KS && $SEEN) {\n"
    "            $T s = 0, dp = 0;\n"
    "$SDP"
    "$CAPT"
    "            p = $EXP($SCORE$ALIBI$BIAS - lse);\n"
    "            ds = p * (dp - dot_o)$DCAP * scale;\n"
    "$DBIAS"
    "        }\n"
    "        Ps[w][lane] = p;\n"
    "        Red[w][lane] = ds;\n"
    "        TCC_BARRIER();\n"
    "        for (int jj = 0; jj < KT; jj++)\n"
    "            for (int r = 0; r < NA; r++)\n"
    "                if (lane + 32 * r < DH)\n"
    "                    dq[r] += Red[w][jj] * Ks[jj][lane + 32 * r];\n"
    "$DKDV"
    "    }\n"
    "    if (live)\n"
    "        for (int r = 0; r < NA; r++)\n"
    "            if (lane + 32 * r < DH)\n"
    "                a4[(b * S + i) * QC + h * DH + lane + 32 * r] = $ST4(dq[r]);\n";

/* Where the values have a head size Dv of their own (latent attention), the
 * loops over the head that take both the keys' and the values' sizes run
 * in two: one over DH, one over DV. Each word's first text is the one of
 * before (Dv = Dh), the second the split. */
static const char *vload[2] = {
    "            Vs[jj][d] = j < $KS ? $LD2(a2[at$VK]) : 0;\n", ""};
static const char *vload_v[2] = {
    "", "        for (int e = tid; e < KT * DV; e += ROWS * 32) {\n"
        "            const int jj = e / DV, d = e % DV;\n"
        "            const tcc_i64 j = j0 + jj;\n"
        "            Vs[jj][d] = j < $KS ? $LD2(a2[(b * $KS + j) * $VP + kh * $VH$VO + d]) : 0;\n"
        "        }\n"};
static const char *dos_load_v =
    "    for (int e = tid; e < ROWS * DV; e += ROWS * 32) {\n"
    "        const tcc_i64 r = qb * ROWS + e / DV;\n"
    "        DOs[e / DV][e % DV] = r < S ? $LD3(a3[(b * S + r) * OC + h * DV + e % DV]) : 0;\n"
    "    }\n";
static const char *sdp[2] = {
    "            for (int d = 0; d < DH; d++) {\n"
    "                s += Qs[w][d] * Ks[lane][d];\n"
    "                dp += DOs[w][d] * Vs[lane][d];\n"
    "            }\n",
    "            for (int d = 0; d < DH; d++)\n"
    "                s += Qs[w][d] * Ks[lane][d];\n"
    "            for (int d = 0; d < DV; d++)\n"
    "                dp += DOs[w][d] * Vs[lane][d];\n"};
static const char *dkdv[2] = {
    "        for (int e = tid; e < KT * DH; e += ROWS * 32) {\n"
    "            const int jj = e / DH, d = e % DH;\n"
    "            const tcc_i64 j = j0 + jj, at = (b * $KS + j) * KC + kh * DH + d;\n"
    "            $T dk = 0, dv = 0;\n"
    "            for (int rr = 0; rr < ROWS; rr++) {\n"
    "                dv += Ps[rr][jj] * DOs[rr][d];\n"
    "                dk += Red[rr][jj] * Qs[rr][d];\n"
    "            }\n"
    "            if (j < $KS) {\n"
    "                $ADD5(&a5[at], dk);\n"
    "                $ADD6(&a6[at], dv);\n"
    "            }\n"
    "        }\n",
    "        for (int e = tid; e < KT * DH; e += ROWS * 32) {\n"
    "            const int jj = e / DH, d = e % DH;\n"
    "            const tcc_i64 j = j0 + jj;\n"
    "            $T dk = 0;\n"
    "            for (int rr = 0; rr < ROWS; rr++)\n"
    "                dk += Red[rr][jj] * Qs[rr][d];\n"
    "            if (j < $KS)\n"
    "                $ADD5(&a5[(b * $KS + j) * KC + kh * DH + d], dk);\n"
    "        }\n"
    "        for (int e = tid; e < KT * DV; e += ROWS * 32) {\n"
    "            const int jj = e / DV, d = e % DV;\n"
    "            const tcc_i64 j = j0 + jj;\n"
    "            $T dv = 0;\n"
    "            for (int rr = 0; rr < ROWS; rr++)\n"
    "                dv += Ps[rr][jj] * DOs[rr][d];\n"
    "            if (j < $KS)\n"
    "                $ADD6(&a6[(b * $KS + j) * VC + kh * DV + d], dv);\n"
    "        }\n"};

/* The values' words: their head size (VD, the enum's name; DVDECL, NAD),
 * pitches (VCDECL, OC) and the split loops above. */
static void vdim_subs(At *g, Arena *a, Sub *subs)
{
    const KAttention *at = &g->k->attn;
    int v = at->head_dim_v != at->head_dim, bwd = g->k->pattern == KP_ATTENTION_BWD;
    subs[0] = (Sub){"VD", v ? "DV" : "DH"};
    subs[1] = (Sub){"DVDECL", v ? arena_printf(a, " DV = %lld,", (long long)at->head_dim_v) : ""};
    subs[2] = (Sub){"NAD", v ? "(DH > DV ? DH : DV)" : "DH"};
    subs[3] = (Sub){"VCDECL", v ? " VC = (tcc_i64)KV * DV, OC = (tcc_i64)H * DV," : ""};
    subs[4] = (Sub){"OC", v ? "OC" : "QC"};
    subs[5] = (Sub){"VLOAD", vload[v]};
    subs[6] = (Sub){"VLOADV", vload_v[v]};
    subs[7] = (Sub){"DOSLOADV", bwd && v ? dos_load_v : ""};
    subs[8] = (Sub){"SDP", sdp[v]};
    subs[9] = (Sub){"DKDV", dkdv[v]};
}

/* The inputs' words (KAttention.in_pitch): q's pitch, head stride and
 * offset (QP, QH, QO) and its element's index where the tensor-core kernels
 * share one with dout (QAT); k's (KP, KH, KO); v's at k's index (VK: their
 * offsets apart, k and v being views alike: fusion.c) and its own (VP, VH,
 * VO); the declarations only the loads need (KCDECL, KCM, ATDECL). A tensor
 * of its own: QC, DH, nothing, and so on, the text of before. */
static void view_subs(At *g, Arena *a, Sub *subs)
{
    const KAttention *at = &g->k->attn;
    const char *P[3] = {"QC", "KC", at->head_dim_v != at->head_dim ? "VC" : "KC"};
    const char *Hd[3] = {"DH", "DH", at->head_dim_v != at->head_dim ? "DV" : "DH"};
    static const char *const key[3][3] = {{"QP", "QH", "QO"}, {"KP", "KH", "KO"}, {"VP", "VH", "VO"}};
    for (int n = 0; n < 3; n++) {
        int v = at->in_pitch[n] != 0;
        subs[3 * n] = (Sub){key[n][0], v ? arena_printf(a, "%lld", (long long)at->in_pitch[n]) : P[n]};
        subs[3 * n + 1] = (Sub){key[n][1], v ? arena_printf(a, "%lld", (long long)at->in_head[n]) : Hd[n]};
        subs[3 * n + 2] = (Sub){key[n][2], v ? arena_printf(a, " + %lld", (long long)at->in_off[n]) : ""};
    }
    subs[9] = (Sub){"QAT", at->in_pitch[0] ? arena_printf(a, "(b * S + r) * %lld + h * %lld + %lld + e %% DH",
                                                            (long long)at->in_pitch[0], (long long)at->in_head[0],
                                                            (long long)at->in_off[0])
                                          : "at"};
    /* what only loads read: k's pitch in the forward, the row's index that q
     * shares with dout (NVRTC warns of a variable declared and not used) */
    int bwd = g->k->pattern == KP_ATTENTION_BWD, kc = bwd || !at->in_pitch[1];
    subs[11] = (Sub){"KCDECL", kc ? " KC = (tcc_i64)KV * DH," : ""};
    subs[12] = (Sub){"KCM", kc ? ", KC = (tcc_i64)KV * DH" : ""};
    subs[13] = (Sub){"ATDECL", bwd || !at->in_pitch[0] ? ", at = (b * S + r) * QC + h * DH + e % DH" : ""};
    subs[10] = (Sub){"VK", at->in_pitch[2] ? arena_printf(a, " + %lld", (long long)(at->in_off[2] - at->in_off[1]))
                                          : ""};
}

static const char *ld_of(const At *g, Arena *a, int s)
{
    return g->k->arg_dtype[s] == DT_BF16 ? "tcc_bf2f" : arena_printf(a, "(%s)", ft(g));
}

static const char *st_of(const At *g, Arena *a, int s)
{
    return g->k->arg_dtype[s] == DT_BF16 ? "tcc_f2bf" : arena_printf(a, "(%s)", cg_gpu_storage(g->k->arg_dtype[s]));
}

static const char *atomic_of(const At *g, int s)
{
    switch (g->k->arg_dtype[s]) {
    case DT_F32: return "tcc_atomic_add_f";
    case DT_F64: return "tcc_atomic_add_d";
    default: return "tcc_atomic_add_bf16";
    }
}

/* Whether the mask's element of key j of row b is nonzero, -0 counting as 0
 * (the mask has the keys' length, $KS). */
static const char *mask_seen(const At *g, Arena *a, int m)
{
    switch (g->k->arg_dtype[m]) {
    case DT_BF16: return arena_printf(a, "(a%d[b * $KS + j] & 0x7fff) != 0", m);
    case DT_I32: return arena_printf(a, "a%d[b * $KS + j] != 0", m);
    default: return arena_printf(a, "a%d[b * $KS + j] != 0", m); /* a float compare: -0 == 0 */
    }
}

/* ---- tensor cores: a warp's mma m16n8k16 for every product ----
 *
 * A block takes BQ = 16 NW query rows of one (batch, head), 16 a warp; lane
 * l of a warp holds rows g = l / 4 and g + 8 of its 16 and, in each 8-wide
 * column tile of a product, columns 2t and 2t + 1 (t = l % 4): the layout of
 * the mma's accumulators. Scores s = q k^T come out so; their row max and
 * sum meet over the row's 4 lanes (shuffles by 1 and 2); the probabilities,
 * rounded to bf16, are in the layout of the next product's A operand (two
 * 8-wide tiles make one 16-wide k step), so o += p v needs no shared memory.
 * Tiles of KT keys and values come through shared memory as raw bf16, rows
 * padded by 8 to spread the banks. The backward's block recomputes its rows'
 * statistics (the forward above), then per tile of keys: s and dp = do v^T
 * (mma), p and ds = p (dp - D) scale (p (dp - D) added into a score bias's
 * gradient, where one takes it), dq += ds k (mma, registers); p and ds go
 * to shared memory, where the block's warps take 16 keys each for dv = p^T
 * do and dk = ds^T q (mma over the block's rows) and add them into dk and dv
 * with atomics (the plan zeroes them before). The unnormalised exp(s - m)
 * is rounded to bf16 once, where it is made, and the row sum l adds the
 * rounded values: o is then a weighted mean of v's rows, and the backward's
 * D = rowsum(do o) equals the sum of p dp over the same rounded p, so
 * ds = p (dp - D) keeps no residue of the rounding where dp and D are large
 * and nearly equal (their difference is the gradient). Every loop bound is the
 * block's, so every warp reaches every mma and barrier alike. */

/* A pair of bf16 along a row (adjacent, one 32-bit word) or down a column. */
static const char *mma_common =
    "    enum { B = $B, S = $S,$SKDECL H = $H, KV = $KV, DH = $DH, CAUSAL = $CAUSAL, NW = $NW,\n"
    "           BQ = NW * 16, ROWS = BQ, KT = $KT, ND = DH / 8, KD = DH / 16, NT = KT / 8,\n"
    "           KP = KT / 16, PAD = 8 };\n"
    "    const float scale = $SCALE;\n"
    "$CAPDECL"
    "    const int tid = TCC_TID, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;\n"
    "    const tcc_i64 nqb = (S + BQ - 1) / BQ, blk = TCC_BID;\n"
    "    const tcc_i64 qb = blk % nqb, h = blk / nqb % H, b = blk / nqb / H, kh = h / (H / KV);\n"
    "    const tcc_i64 QC = (tcc_i64)H * DH$KCM;\n"
    "    const tcc_i64 r0 = qb * BQ + w * 16 + g; /* this lane's rows: r0, r0 + 8 */\n"
    "$SLOPE"
    "    const tcc_i64 last = CAUSAL && qb * BQ + BQ - 1 < $KS - 1 ? qb * BQ + BQ - 1 : $KS - 1;\n"
    "$RANGE"
    "    TCC_SHARED tcc_u16 Qd[$NQD][BQ][DH + PAD], Ks[KT][DH + PAD], Vs[KT][DH + PAD];\n"
    "$PDDECL"
    "    TCC_EMDECL\n"
    "    for (int e = tid; e < BQ * DH; e += NW * 32) {\n"
    "        const tcc_i64 r = qb * BQ + e / DH$ATDECL;\n"
    "        Qd[0][e / DH][e % DH] = r < S ? a0[$QAT] : 0;\n"
    "$DOLOAD"
    "    }\n"
    "    float o[ND][4], m[2] = {-TCC_INF_F, -TCC_INF_F}, l[2] = {0, 0};\n"
    "    #pragma unroll\n"
    "    for (int nd = 0; nd < ND; nd++)\n"
    "        #pragma unroll\n"
    "        for (int e = 0; e < 4; e++)\n"
    "            o[nd][e] = 0;\n"
    "    for (tcc_i64 j0 = $FIRST; j0 <= $LAST; j0 += KT) {\n"
    "$TILE"
    "        float s[NT][4];\n"
    "$SCORES"
    "        float mx[2] = {-TCC_INF_F, -TCC_INF_F};\n"
    "        #pragma unroll\n"
    "        for (int nt = 0; nt < NT; nt++)\n"
    "            #pragma unroll\n"
    "            for (int e = 0; e < 4; e++) {\n"
    "                const tcc_i64 i = r0 + 8 * (e >> 1), j = j0 + nt * 8 + 2 * t + (e & 1);\n"
    "                float v = -TCC_INF_F;\n"
    "                if (i < S && j < $KS && $SEEN)\n"
    "                    v = $CAPLs[nt][e] * scale$CAPR$ALIBI$BIAS;\n"
    "                s[nt][e] = v;\n"
    "                mx[e >> 1] = $FMAX(mx[e >> 1], v);\n"
    "            }\n"
    "        float c[2];\n"
    "        #pragma unroll\n"
    "        for (int r = 0; r < 2; r++) {\n"
    "            mx[r] = $FMAX(mx[r], TCC_XOR(mx[r], 1));\n"
    "            mx[r] = $FMAX(mx[r], TCC_XOR(mx[r], 2));\n"
    "            const float n = $FMAX(m[r], mx[r]);\n"
    "            c[r] = m[r] == -TCC_INF_F ? 0 : $EXP(m[r] - n);\n"
    "            m[r] = n;\n"
    "            l[r] *= c[r];\n"
    "        }\n"
    "        #pragma unroll\n"
    "        for (int nd = 0; nd < ND; nd++)\n"
    "            #pragma unroll\n"
    "            for (int e = 0; e < 4; e++)\n"
    "                o[nd][e] *= c[e >> 1];\n"
    "        #pragma unroll\n"
    "        for (int nt = 0; nt < NT; nt++)\n"
    "            #pragma unroll\n"
    "            for (int e = 0; e < 4; e++) {\n"
    "                const float p = s[nt][e] == -TCC_INF_F ? 0 : TCC_BF($EXP(s[nt][e] - m[e >> 1]));\n"
    "                s[nt][e] = p;\n"
    "                l[e >> 1] += p;\n"
    "            }\n"
    "        #pragma unroll\n"
    "        for (int kp = 0; kp < KP; kp++) { /* o += p v: p's accumulators are the A operand */\n"
    "            const tcc_u32 pa[4] = {TCC_PKF(s[2 * kp][0], s[2 * kp][1]),\n"
    "                                   TCC_PKF(s[2 * kp][2], s[2 * kp][3]),\n"
    "                                   TCC_PKF(s[2 * kp + 1][0], s[2 * kp + 1][1]),\n"
    "                                   TCC_PKF(s[2 * kp + 1][2], s[2 * kp + 1][3])};\n"
    "            #pragma unroll\n"
    "            for (int nd = 0; nd < ND; nd++) {\n"
    "                const tcc_u32 vb[2] = {TCC_CPAIR(Vs, kp * 16 + 2 * t, nd * 8 + g),\n"
    "                                       TCC_CPAIR(Vs, kp * 16 + 8 + 2 * t, nd * 8 + g)};\n"
    "                TCC_MMA(o[nd], pa, vb);\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "    #pragma unroll\n"
    "    for (int r = 0; r < 2; r++) {\n"
    "        l[r] += TCC_XOR(l[r], 1);\n"
    "        l[r] += TCC_XOR(l[r], 2);\n"
    "    }\n";

/* q k^T for the tile: A from Qd[0] (rows), B from Ks (a key's row is a column of k^T). */
static const char *mma_scores =
    "        #pragma unroll\n"
    "        for (int nt = 0; nt < NT; nt++) {\n"
    "            #pragma unroll\n"
    "            for (int e = 0; e < 4; e++)\n"
    "                s[nt][e] = 0;\n"
    "            #pragma unroll\n"
    "            for (int kd = 0; kd < KD; kd++) {\n"
    "                const tcc_u32 qa[4] = {TCC_RPAIR(Qd[0], w * 16 + g, kd * 16 + 2 * t),\n"
    "                                       TCC_RPAIR(Qd[0], w * 16 + g + 8, kd * 16 + 2 * t),\n"
    "                                       TCC_RPAIR(Qd[0], w * 16 + g, kd * 16 + 8 + 2 * t),\n"
    "                                       TCC_RPAIR(Qd[0], w * 16 + g + 8, kd * 16 + 8 + 2 * t)};\n"
    "                const tcc_u32 kb[2] = {TCC_RPAIR(Ks, nt * 8 + g, kd * 16 + 2 * t),\n"
    "                                       TCC_RPAIR(Ks, nt * 8 + g, kd * 16 + 8 + 2 * t)};\n"
    "                TCC_MMA(s[nt], qa, kb);\n"
    "            }\n"
    "        }\n";

static const char *mma_tile_load =
    "        TCC_BARRIER();\n"
    "        for (int e = tid; e < KT * DH; e += NW * 32) {\n"
    "            const int jj = e / DH, d = e % DH;\n"
    "            const tcc_i64 j = j0 + jj, at = (b * $KS + j) * $KP + kh * $KH$KO + d;\n"
    "            Ks[jj][d] = j < $KS ? a1[at] : 0;\n"
    "            Vs[jj][d] = j < $KS ? a2[at$VK] : 0;\n"
    "        }\n"
    "        TCC_BARRIER();\n";

static const char *mma_fwd_tail =
    "    #pragma unroll\n"
    "    for (int nd = 0; nd < ND; nd++)\n"
    "        #pragma unroll\n"
    "        for (int e = 0; e < 4; e++) {\n"
    "            const tcc_i64 i = r0 + 8 * (e >> 1);\n"
    "            if (i < S)\n"
    "                a3[(b * S + i) * QC + h * DH + nd * 8 + 2 * t + (e & 1)] =\n"
    "                    $ST3(l[e >> 1] > 0 ? o[nd][e] / l[e >> 1] : 0);\n"
    "        }\n";

/* D = rowsum(do o) and the log-sum-exp of each row; then the tiles again. */
static const char *mma_bwd_tail =
    "    float dsum[2] = {0, 0}, dq[ND][4];\n"
    "    #pragma unroll\n"
    "    for (int nd = 0; nd < ND; nd++)\n"
    "        #pragma unroll\n"
    "        for (int e = 0; e < 4; e++) {\n"
    "            const int row = w * 16 + g + 8 * (e >> 1), col = nd * 8 + 2 * t + (e & 1);\n"
    "            dsum[e >> 1] += tcc_bf2f(Qd[1][row][col]) *\n"
    "                            (l[e >> 1] > 0 ? o[nd][e] / l[e >> 1] : 0);\n"
    "            dq[nd][e] = 0;\n"
    "        }\n"
    "    #pragma unroll\n"
    "    for (int r = 0; r < 2; r++) {\n"
    "        dsum[r] += TCC_XOR(dsum[r], 1);\n"
    "        dsum[r] += TCC_XOR(dsum[r], 2);\n"

    "    }\n"
    "    for (tcc_i64 j0 = $FIRST; j0 <= $LAST; j0 += KT) {\n"
    "$TILE"
    "        float s[NT][4], dp[NT][4];\n"
    "$SCORES"
    "        #pragma unroll\n"
    "        for (int nt = 0; nt < NT; nt++) { /* dp = do v^T */\n"
    "            #pragma unroll\n"
    "            for (int e = 0; e < 4; e++)\n"
    "                dp[nt][e] = 0;\n"
    "            #pragma unroll\n"
    "            for (int kd = 0; kd < KD; kd++) {\n"
    "                const tcc_u32 da[4] = {TCC_RPAIR(Qd[1], w * 16 + g, kd * 16 + 2 * t),\n"
    "                                       TCC_RPAIR(Qd[1], w * 16 + g + 8, kd * 16 + 2 * t),\n"
    "                                       TCC_RPAIR(Qd[1], w * 16 + g, kd * 16 + 8 + 2 * t),\n"
    "                                       TCC_RPAIR(Qd[1], w * 16 + g + 8, kd * 16 + 8 + 2 * t)};\n"
    "                const tcc_u32 vb[2] = {TCC_RPAIR(Vs, nt * 8 + g, kd * 16 + 2 * t),\n"
    "                                       TCC_RPAIR(Vs, nt * 8 + g, kd * 16 + 8 + 2 * t)};\n"
    "                TCC_MMA(dp[nt], da, vb);\n"
    "            }\n"
    "        }\n"
    "        #pragma unroll\n"
    "        for (int nt = 0; nt < NT; nt++)\n"
    "            #pragma unroll\n"
    "            for (int e = 0; e < 4; e++) {\n"
    "                const tcc_i64 i = r0 + 8 * (e >> 1), j = j0 + nt * 8 + 2 * t + (e & 1);\n"
    "                float p = 0, ds = 0;\n"
    "                if (i < S && j < $KS && $SEEN) {\n"
    "$CAPT"
    "                    p = TCC_BF($EXP($SCORE$ALIBI$BIAS - m[e >> 1])) / l[e >> 1];\n"
    "                    ds = p * (dp[nt][e] - dsum[e >> 1])$DCAP * scale;\n"
    "$DBIAS"
    "                }\n"
    "                const int row = w * 16 + g + 8 * (e >> 1), col = nt * 8 + 2 * t + (e & 1);\n"
    "                Pd[0][row][col] = tcc_f2bf(p);\n"
    "                Pd[1][row][col] = tcc_f2bf(ds);\n"
    "                dp[nt][e] = ds;\n"
    "            }\n"
    "        #pragma unroll\n"
    "        for (int kp = 0; kp < KP; kp++) { /* dq += ds k */\n"
    "            const tcc_u32 sa[4] = {TCC_PKF(dp[2 * kp][0], dp[2 * kp][1]),\n"
    "                                   TCC_PKF(dp[2 * kp][2], dp[2 * kp][3]),\n"
    "                                   TCC_PKF(dp[2 * kp + 1][0], dp[2 * kp + 1][1]),\n"
    "                                   TCC_PKF(dp[2 * kp + 1][2], dp[2 * kp + 1][3])};\n"
    "            #pragma unroll\n"
    "            for (int nd = 0; nd < ND; nd++) {\n"
    "                const tcc_u32 kb[2] = {TCC_CPAIR(Ks, kp * 16 + 2 * t, nd * 8 + g),\n"
    "                                       TCC_CPAIR(Ks, kp * 16 + 8 + 2 * t, nd * 8 + g)};\n"
    "                TCC_MMA(dq[nd], sa, kb);\n"
    "            }\n"
    "        }\n"
    "        TCC_BARRIER();\n"
    "        /* dv = p^T do (x = 0) and dk = ds^T q (x = 1), 16 keys a job */\n"
    "        for (int job = w; job < 2 * KP; job += NW) {\n"
    "            const int x = job / KP, jr = job % KP * 16;\n"
    "            float acc[ND][4];\n"
    "            #pragma unroll\n"
    "            for (int nd = 0; nd < ND; nd++)\n"
    "                #pragma unroll\n"
    "                for (int e = 0; e < 4; e++)\n"
    "                    acc[nd][e] = 0;\n"
    "            #pragma unroll\n"
    "            for (int kq = 0; kq < BQ / 16; kq++) {\n"
    "                const tcc_u32 xa[4] = {TCC_CPAIR(Pd[x], kq * 16 + 2 * t, jr + g),\n"
    "                                       TCC_CPAIR(Pd[x], kq * 16 + 2 * t, jr + g + 8),\n"
    "                                       TCC_CPAIR(Pd[x], kq * 16 + 8 + 2 * t, jr + g),\n"
    "                                       TCC_CPAIR(Pd[x], kq * 16 + 8 + 2 * t, jr + g + 8)};\n"
    "                #pragma unroll\n"
    "                for (int nd = 0; nd < ND; nd++) {\n"
    "                    const tcc_u32 yb[2] = {TCC_CPAIR(Qd[1 - x], kq * 16 + 2 * t, nd * 8 + g),\n"
    "                                           TCC_CPAIR(Qd[1 - x], kq * 16 + 8 + 2 * t, nd * 8 + g)};\n"
    "                    TCC_MMA(acc[nd], xa, yb);\n"
    "                }\n"
    "            }\n"
    "            #pragma unroll\n"
    "            for (int nd = 0; nd < ND; nd++)\n"
    "                #pragma unroll\n"
    "                for (int e = 0; e < 4; e++) {\n"
    "                    const tcc_i64 j = j0 + jr + g + 8 * (e >> 1);\n"
    "                    const tcc_i64 at = (b * $KS + j) * KC + kh * DH + nd * 8 + 2 * t + (e & 1);\n"
    "                    if (j < $KS) {\n"
    "                        if (x)\n"
    "                            $ADD5(&a5[at], acc[nd][e]);\n"
    "                        else\n"
    "                            $ADD6(&a6[at], acc[nd][e]);\n"
    "                    }\n"
    "                }\n"
    "        }\n"
    "    }\n"
    "    #pragma unroll\n"
    "    for (int nd = 0; nd < ND; nd++)\n"
    "        #pragma unroll\n"
    "        for (int e = 0; e < 4; e++) {\n"
    "            const tcc_i64 i = r0 + 8 * (e >> 1);\n"
    "            if (i < S)\n"
    "                a4[(b * S + i) * QC + h * DH + nd * 8 + 2 * t + (e & 1)] = $ST4(dq[nd][e]);\n"
    "        }\n";

/* The shared memory of the tensor-core kernel with nw warps and kt keys a tile. */
static int64_t mma_smem(const Kernel *k, int nw, int kt)
{
    int64_t dh = k->attn.head_dim, bq = 16 * nw, bwd = k->pattern == KP_ATTENTION_BWD;
    return 2 * ((1 + bwd) * bq * (dh + 8) + 2 * kt * (dh + 8) + 2 * bwd * bq * (kt + 8));
}

/* Warps a block and keys a tile: 4 and 64 where they fit in ATT_SMEM, fewer
 * where not, and 32 keys past a head size of 64 (a lane's scores, KT / 2
 * floats, beside its DH / 2 of o: 128 would spill). 0 when the kernel does
 * not take the tensor cores: q, k, v (and the backward's do) not bf16, a
 * head size that is not a multiple of 16 or over 128 (the registers of o and
 * dq), or values of a head size of their own (latent attention: the scalar
 * kernel's, which loops over each size). */
static int mma_shape(const Kernel *k, int *kt)
{
    const KAttention *a = &k->attn;
    int n = k->pattern == KP_ATTENTION ? 3 : 4;
    for (int i = 0; i < n; i++)
        if (k->arg_dtype[i] != DT_BF16)
            return 0;
    if (a->head_dim % 16 || a->head_dim > 128 || a->head_dim_v != a->head_dim)
        return 0;
    for (int nw = 4; nw >= 2; nw /= 2)
        for (*kt = a->head_dim > 64 ? 32 : 64; *kt >= 32; *kt /= 2)
            if (mma_smem(k, nw, *kt) <= ATT_SMEM)
                return nw;
    return 0;
}

/* The kernel's body: the tensor-core templates with nw warps and kt keys a
 * tile (nw > 0), else the scalar ones. */
/* The soft cap's words (KAttention.softcap; "" without one but SCORE): the
 * constant cap, the forward's cap tanh(score / cap) around a scaled score
 * (CAPL, CAPR), and the backward's tc = tanh(score / cap) (CAPT), the score
 * as capped (SCORE) and the cap's derivative 1 - tc^2 (DCAP). */
static void softcap_subs(At *g, Arena *a, int nw, Sub *subs)
{
    const KAttention *at = &g->k->attn;
    int on = at->softcap > 0;
    char cap[48];
    fmt_double(cap, sizeof cap, at->softcap);
    const char *s = nw ? "s[nt][e]" : "s";
    subs[0] = (Sub){"CAPDECL", on ? arena_printf(a, "    const %s cap = %s%s;\n", nw ? "float" : ft(g), cap,
                                                 nw || g->f32 ? "f" : "") : ""};
    subs[1] = (Sub){"CAPL", on ? arena_printf(a, "cap * %s(", mf(g, a, "tanh")) : ""};
    subs[2] = (Sub){"CAPR", on ? " / cap)" : ""};
    subs[3] = (Sub){"CAPT", on ? arena_printf(a, "%*sconst %s tc = %s(%s * scale / cap);\n", nw ? 20 : 12, "",
                                              nw ? "float" : ft(g), mf(g, a, "tanh"), s) : ""};
    subs[4] = (Sub){"SCORE", on ? "cap * tc" : arena_printf(a, "%s * scale", s)};
    subs[5] = (Sub){"DCAP", on ? " * (1 - tc * tc)" : ""};
}

/* The score bias's words (KAttention.bias, dbias; "" without one): BIAS adds
 * row i's bias of key j (bias [bias_heads][S][KS]: head h's row, or the one
 * head's) to the score after ALiBi's, through the bias's widening load;
 * DBIAS, in the backward where the bias takes a gradient, adds the biased
 * score's gradient p (dp - D) (before the cap's derivative and the scale,
 * which belong to the score before the bias) into the gradient at the same
 * place. Every batch row's block (and every head's, for one bias of all
 * heads) meets there: an atomic add, as dk's and dv's, into a gradient the
 * plan zeroes before. Both sit inside the test of a seen key of a live row,
 * so no index falls outside. */
static void bias_subs(At *g, Arena *a, int nw, Sub *subs)
{
    const KAttention *at = &g->k->attn;
    const char *row = at->bias_heads == 1 ? "i" : "(h * S + i)";
    subs[0] = (Sub){"BIAS", ""};
    subs[1] = (Sub){"DBIAS", ""};
    if (at->bias > 0)
        subs[0].val =
            arena_printf(a, " + %s(a%d[%s * $KS + j])", ld_of(g, a, at->bias), at->bias, row);
    if (at->dbias > 0)
        subs[1].val = arena_printf(a, "%*s%s(&a%d[%s * $KS + j], p * (%s - %s));\n", nw ? 20 : 12,
                                   "", atomic_of(g, at->dbias), at->dbias, row,
                                   nw ? "dp[nt][e]" : "dp", nw ? "dsum[e >> 1]" : "dot_o");
}

/* tmpl filled three times over: "$DOSLOAD", "$TILE", "$SCORES" and the
 * values' words bring words of their own, and "$TILE" brings "$VLOAD". */
static void fill_deep(At *g, const char *tmpl, const Sub *subs, int nsubs)
{
    char *text[2] = {NULL, NULL};
    FILE *save = g->f;
    for (int pass = 0; pass < 2; pass++) {
        size_t len;
        FILE *m = open_memstream(&text[pass], &len);
        if (!m)
            BUG("open_memstream failed");
        g->f = m;
        fill(g, pass ? text[0] : tmpl, subs, nsubs);
        fclose(m);
    }
    g->f = save;
    fill(g, text[1], subs, nsubs);
    free(text[0]);
    free(text[1]);
}

static void attention_body(At *g, Arena *a, int nw, int kt)
{
    const Kernel *k = g->k;
    const KAttention *at = &k->attn;
    char scale[48];
    fmt_double(scale, sizeof scale, at->scale);
    int bwd = k->pattern == KP_ATTENTION_BWD, cuda = g->lang == CG_CUDA;
    int hide = at->window > 0 || at->mask >= 0;
    char tp = g->f32 ? 'f' : 'd';
    Sub subs[] = {
        {"B", arena_printf(a, "%lld", (long long)at->batch)},
        {"S", arena_printf(a, "%lld", (long long)at->seq)},
        /* the keys' length: S, or SK of its own (cross-attention) */
        {"KS", at->seq_k != at->seq ? "SK" : "S"},
        {"SKDECL", at->seq_k != at->seq ? arena_printf(a, " SK = %lld,", (long long)at->seq_k) : ""},
        {"H", arena_printf(a, "%lld", (long long)at->heads)},
        {"KV", arena_printf(a, "%lld", (long long)at->kv_heads)},
        {"DH", arena_printf(a, "%lld", (long long)at->head_dim)},
        {"CAUSAL", at->causal ? "1" : "0"},
        /* whether query i sees key j (row b): causal, and the window and mask if any */
        {"SEEN", !hide ? "(!CAUSAL || j <= i)"
                 : arena_printf(a, "(!CAUSAL || j <= i) && (%lld == 0 || (i - j < %lld && j - i < %lld)) && %s",
                                (long long)at->window, (long long)at->window, (long long)at->window,
                                at->mask < 0 ? "1" : mask_seen(g, a, at->mask))},
        /* a window's bounds on the tiles of keys (none outside holds a key the block's rows see) */
        {"RANGE", at->window <= 0 ? ""
                  : arena_printf(a, "    const tcc_i64 wlast = !CAUSAL && qb * ROWS + ROWS + %lld - 2 < last ? "
                                    "qb * ROWS + ROWS + %lld - 2 : last;\n"
                                    "    const tcc_i64 wfirst = qb * ROWS - %lld + 1 > 0 ? "
                                    "(qb * ROWS - %lld + 1) / KT * KT : 0;\n",
                                 (long long)at->window, (long long)at->window,
                                 (long long)at->window, (long long)at->window)},
        {"FIRST", at->window <= 0 ? "0" : "wfirst"},
        /* ALiBi: head h's slope (its global index: h plus the device's first head), the bias */
        {"SLOPE", !at->alibi ? ""
                  : arena_printf(a, "    const $T slope = ($T)tcc_alibi_slope(h + %s, %lld);\n",
                                 at->hoff >= 0 ? arena_printf(a, "a%d[0] / DH", at->hoff) : "0",
                                 (long long)at->heads_whole)},
        {"ALIBI", at->alibi ? " - slope * ($T)(i > j ? i - j : j - i)" : ""},
        {"LAST", at->window <= 0 ? "last" : "wlast"},
        /* the output of row i, column r: 0 for a row that sees no key */
        {"OUTR", hide ? "(l > 0 ? acc[r] / l : 0)" : "acc[r] / l"},
        {"ROWS", arena_printf(a, "%d", ATT_ROWS)},
        {"KT", arena_printf(a, "%d", nw ? kt : att_tile(k))},
        {"NW", arena_printf(a, "%d", nw)},
        {"NQD", bwd ? "2" : "1"},
        {"PDDECL", bwd ? "    TCC_SHARED tcc_u16 Pd[2][BQ][KT + PAD];\n" : ""},
        {"DOLOAD", bwd ? "        Qd[1][e / DH][e % DH] = r < S ? a3[at] : 0;\n" : ""},
        {"SCORES", mma_scores},
        {"T", ft(g)},
        {"SCALE", arena_printf(a, "%s%s", scale, g->f32 ? "f" : "")},
        {"INF", inf(g)},
        {"FMAX", mf(g, a, "fmax")},
        {"EXP", mf(g, a, "exp")},
        {"LOG", mf(g, a, "log")},
        {"RMAX", arena_printf(a, "TCC_ROW_MAX_%c", tp - 32)},
        {"RSUM", arena_printf(a, "TCC_ROW_SUM_%c", tp - 32)},
        {"BCAST", cuda ? "" : "        Ps[w][lane] = p;\n        TCC_BARRIER();\n"},
        {"RPDECL", bwd || !cuda ? arena_printf(a, "    TCC_SHARED %s Red[ROWS][32], Ps[ROWS][32];\n", ft(g)) : ""},
        {"LD0", ld_of(g, a, 0)},
        {"LD1", ld_of(g, a, 1)},
        {"LD2", ld_of(g, a, 2)},
        {"ST3", st_of(g, a, 3)},
        {"ST4", bwd ? st_of(g, a, 4) : ""},
        {"ADD5", bwd ? atomic_of(g, 5) : ""},
        {"ADD6", bwd ? atomic_of(g, 6) : ""},
        {"DOSDECL", bwd ? arena_printf(a, "    TCC_SHARED %s DOs[ROWS][$VD];\n", ft(g)) : ""},
        {"DOSLOAD", bwd && at->head_dim_v == at->head_dim ? "        DOs[e / DH][e % DH] = r < S ? $LD3(a3[(b * S + r) * QC + h * DH + e % DH]) : 0;\n" : ""},
        {"LD3", ld_of(g, a, 3)},
        {"TILE", nw ? mma_tile_load : att_tile_load},
        {0}, {0}, {0}, {0}, {0}, {0}, /* softcap_subs */
        {0}, {0}, /* bias_subs */
        {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, /* vdim_subs */
        {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, /* view_subs */
    };
    int nsubs = (int)(sizeof subs / sizeof subs[0]);
    softcap_subs(g, a, nw, subs + nsubs - 32);
    bias_subs(g, a, nw, subs + nsubs - 26);
    vdim_subs(g, a, subs + nsubs - 24);
    view_subs(g, a, subs + nsubs - 14);
    for (int part = 0; part < 2; part++)
        fill_deep(g, nw ? (part ? (bwd ? mma_bwd_tail : mma_fwd_tail) : mma_common)
                        : (part ? (bwd ? att_bwd_tail : att_fwd_tail) : att_common),
                  subs, nsubs);
}


int cg_attention_tensor_cores(const Kernel *k)
{
    int kt;
    return (k->pattern == KP_ATTENTION || k->pattern == KP_ATTENTION_BWD) && mma_shape(k, &kt) > 0;
}

CgLaunch cg_attention_launch(const Kernel *k)
{
    const KAttention *a = &k->attn;
    int kt, nw = mma_shape(k, &kt), rows = nw ? 16 * nw : ATT_ROWS;
    return (CgLaunch){a->batch * a->heads * ((a->seq + rows - 1) / rows), (nw ? nw : ATT_ROWS) * 32};
}

void cg_attention_emit(FILE *f, Arena *a, const Kernel *k, CgLang lang)
{
    At g = {f, k, lang, k->ftype != DT_F64};
    int kt = 0, nw = mma_shape(k, &kt);
    attention_body(&g, a, nw, kt);
}
