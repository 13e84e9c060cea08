/* metrics.c: --metrics FILE.jsonl, the run's metrics as it goes. Writes one
 * JSON object a line: a training step's {"step", "steps", "loss", "lr",
 * "grad_norm", "ms", "tokens_per_s", "gflops"} (with "skipped": true for a
 * step whose update was dropped), an evaluation's {"step", "val_loss"}. Each
 * line is flushed when written, so the file can be read (plotted, tailed)
 * while the run goes on, and a killed run leaves whole lines. A number that
 * is not finite is written as null, as JSON has no NaN. */
#include "runtime/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

FILE *rt_metrics_open(const char *path, char *err, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        snprintf(err, n, "--metrics %s: %s", path, strerror(errno));
    return f;
}

static void number(cJSON *o, const char *key, double x)
{
    if (isfinite(x))
        cJSON_AddNumberToObject(o, key, x);
    else
        cJSON_AddNullToObject(o, key);
}

static int put(FILE *f, cJSON *o)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    int bad = !text || fputs(text, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0;
    free(text);
    cJSON_Delete(o);
    return bad ? -1 : 0;
}

int rt_metrics_step(FILE *f, const RtStepMetrics *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)m->step);
    cJSON_AddNumberToObject(o, "steps", (double)m->steps);
    number(o, "loss", m->loss);
    if (!isnan(m->lr))
        number(o, "lr", m->lr);
    if (!isnan(m->grad_norm))
        number(o, "grad_norm", m->grad_norm);
    number(o, "ms", m->ms);
    if (m->tokens_per_s > 0)
        number(o, "tokens_per_s", m->tokens_per_s);
    number(o, "gflops", m->gflops);
    if (m->skipped)
        cJSON_AddTrueToObject(o, "skipped");
    return put(f, o);
}

int rt_metrics_val(FILE *f, int64_t step, double val_loss)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)step);
    number(o, "val_loss", val_loss);
    return put(f, o);
}
