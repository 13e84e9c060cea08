/* metrics.h: a run's metrics as JSON lines (--metrics FILE.jsonl). */
#ifndef TCC_METRICS_H
#define TCC_METRICS_H

#include <stdint.h>
#include <stdio.h>

/* One training step's line. A value the plan does not have (lr, grad norm)
 * is NAN: left out. Tokens per second 0: left out. */
typedef struct RtStepMetrics {
    int64_t step, steps;
    double loss, lr, grad_norm, ms, tokens_per_s, gflops;
    int skipped; /* the update was not applied (non-finite loss or norm) */
} RtStepMetrics;

/* The file, created (or truncated) for writing; NULL with err set. */
FILE *rt_metrics_open(const char *path, char *err, size_t n);
/* A line, written and flushed, so the file follows the run; 0, or -1 when the
 * write failed. */
int rt_metrics_step(FILE *f, const RtStepMetrics *m);
int rt_metrics_val(FILE *f, int64_t step, double val_loss);

#endif
