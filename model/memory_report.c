/* memory_report.c: the memory model's answer for people and for programs.
 * Reads a MemoryModel; writes the per-stage table of --emit=memory (bytes
 * and GiB, the moment of the peak, the five largest tensors with their TDL
 * locations) or the same as JSON. Key idea: one writer per form, the numbers
 * straight from the model, nothing recomputed here. */
#include "model/model.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

static void print_loc(FILE *f, Loc l)
{
    if (l.line > 0)
        fprintf(f, "  %s:%d:%d", l.file ? l.file : "?", l.line, l.col);
}

static void print_top(FILE *f, const StageMemory *sm)
{
    fprintf(f, "    largest tensors alive then:\n");
    for (int i = 0; i < sm->ntop; i++) {
        const MemItem *it = &sm->top[i];
        fprintf(f, "      %-28s %-12s %14.0f bytes", it->name, mem_cat_name(it->cat), it->bytes);
        if (it->count > 1)
            fprintf(f, " x %d", it->count);
        print_loc(f, it->loc);
        fputc('\n', f);
    }
}

void mem_print(FILE *f, const MemoryModel *mm, double budget, double headroom)
{
    for (int s = 0; s < mm->nstages; s++) {
        const StageMemory *sm = &mm->stage[s];
        fprintf(f, "  stage %d: peak at the %s (%d microbatch%s in flight)\n", s, sm->moment,
                sm->inflight, sm->inflight == 1 ? "" : "es");
        for (int c = 0; c < MC_COUNT; c++)
            fprintf(f, "    %-12s %16.0f bytes %9.2f GiB\n", mem_cat_name((MemCat)c), sm->cat[c],
                    sm->cat[c] / GIB);
        fprintf(f, "    %-12s %16.0f bytes %9.2f GiB\n", "peak", sm->peak, sm->peak / GIB);
        fprintf(f, "    saved for the backward per microbatch %.0f bytes, %.0f of them in layers\n",
                sm->saved, sm->saved_layers);
        print_top(f, sm);
    }
    fprintf(f, "  device peak  %16.0f bytes %9.2f GiB (stage %d)", mm->peak, mm->peak / GIB,
            mm->peak_stage);
    if (budget > 0 && headroom > 0)
        fprintf(f, " of %.2f GiB with %.2f GiB of headroom", (budget + headroom) / GIB, headroom / GIB);
    else if (budget > 0)
        fprintf(f, " of %.2f GiB", budget / GIB);
    if (budget > 0)
        fprintf(f, ": %s", mm->peak <= budget ? "fits" : "does not fit");
    fputc('\n', f);
}

static cJSON *item_json(const MemItem *it)
{
    cJSON *o = cJSON_CreateObject();
    char loc[512] = "";
    if (it->loc.line > 0)
        snprintf(loc, sizeof loc, "%s:%d:%d", it->loc.file ? it->loc.file : "?", it->loc.line,
                 it->loc.col);
    cJSON_AddStringToObject(o, "name", it->name);
    cJSON_AddStringToObject(o, "category", mem_cat_name(it->cat));
    cJSON_AddNumberToObject(o, "bytes", it->bytes);
    cJSON_AddNumberToObject(o, "count", it->count);
    cJSON_AddStringToObject(o, "loc", loc);
    return o;
}

static cJSON *stage_json(const StageMemory *sm, int s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "stage", s);
    for (int c = 0; c < MC_COUNT; c++)
        cJSON_AddNumberToObject(o, mem_cat_name((MemCat)c), sm->cat[c]);
    cJSON_AddNumberToObject(o, "peak", sm->peak);
    cJSON_AddStringToObject(o, "moment", sm->moment);
    cJSON_AddNumberToObject(o, "inflight", sm->inflight);
    cJSON_AddNumberToObject(o, "saved_per_microbatch", sm->saved);
    cJSON_AddNumberToObject(o, "saved_in_layers", sm->saved_layers);
    cJSON *top = cJSON_AddArrayToObject(o, "largest");
    for (int i = 0; i < sm->ntop; i++)
        cJSON_AddItemToArray(top, item_json(&sm->top[i]));
    return o;
}

char *mem_json(const MemoryModel *mm, const char *model, const char *device, double budget,
               double headroom)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", model ? model : "");
    cJSON_AddStringToObject(root, "device", device ? device : "cpu");
    cJSON_AddNumberToObject(root, "budget", budget);
    cJSON_AddNumberToObject(root, "headroom", headroom);
    cJSON_AddNumberToObject(root, "microbatches", mm->microbatches);
    cJSON_AddStringToObject(root, "schedule", mm->schedule ? mm->schedule : "");
    cJSON *st = cJSON_AddArrayToObject(root, "stages");
    for (int s = 0; s < mm->nstages; s++)
        cJSON_AddItemToArray(st, stage_json(&mm->stage[s], s));
    cJSON_AddNumberToObject(root, "peak", mm->peak);
    cJSON_AddNumberToObject(root, "peak_stage", mm->peak_stage);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text; /* malloc'ed */
}
