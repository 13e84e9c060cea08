/* runtime.h: the runtime's public API: run the training step of a plan on the CPU.
 * A Runtime owns one slab of memory that holds every tensor of the plan at its
 * planned offset, and the plan's kernels compiled by the system C compiler
 * into a shared object (cached on disk by content). It borrows the plan, which
 * must outlive it. Nothing is allocated inside rt_step. */
#ifndef TCC_RUNTIME_H
#define TCC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

typedef struct Runtime Runtime;

/* Check p (plan_check), allocate its zeroed slab, compile or reuse its kernels
 * in cache_dir (NULL: $TCC_CACHE, else ~/.cache/tcc, else /tmp/tcc-cache-$UID)
 * and resolve every kernel symbol. NULL with a one-line message in err. */
Runtime *rt_open(const Plan *p, const char *cache_dir, char *err, size_t n);

/* Free the slab, unload the kernels. rt may be NULL. */
void rt_close(Runtime *rt);

/* The plan rt runs. */
const Plan *rt_plan(const Runtime *rt);

/* Parameters from their init (the same values for the same seed and tensor
 * name, whatever the order of the tensors); optimizer state to zeros. */
void rt_init_params(Runtime *rt, uint64_t seed);

/* Copy bytes of data into the input tensor called name. The size must be the
 * tensor's; i32 ids of an input with a limit must lie in [0, limit). 0, or -1
 * with a message naming the first bad element (nothing is copied then). */
int rt_set_input(Runtime *rt, const char *name, const void *data, size_t bytes, char *err,
                 size_t n);

/* Every input at random from seed: i32 ids uniform in [0, limit) ([0, 2) with
 * no limit), floats standard normal. */
void rt_random_inputs(Runtime *rt, uint64_t seed);

/* One training step: the step number into every step tensor, then the
 * instructions in order. 0, or -1 with a message naming the instruction. */
int rt_step(Runtime *rt, int64_t step, char *err, size_t n);

/* The value of a rank-0 f32 or f64 tensor (NaN for any other, or for -1). */
double rt_scalar(Runtime *rt, int tensor);

/* The first byte of a tensor in the slab (NULL when tensor is out of range). */
void *rt_tensor_data(Runtime *rt, int tensor);

/* The index of the first tensor called name, or -1. */
int rt_find_tensor(const Plan *p, const char *name);

/* bf16 and f16 from f32 by round-to-nearest-even (NaN stays NaN, overflow
 * gives infinity), and back (exact). */
uint16_t rt_f32_to_bf16(float x);
float rt_bf16_to_f32(uint16_t h);
uint16_t rt_f32_to_f16(float x);
float rt_f16_to_f32(uint16_t h);

#endif
