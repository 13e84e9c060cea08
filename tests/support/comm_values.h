/* comm_values.h: the element values the collective tests send (the threads
 * unit test and the mpi checker): random values exact in each dtype, codes
 * that name where an element came from, and access by dtype. Header-only:
 * static functions, so each test program has its own copy. */
#ifndef TCC_COMM_VALUES_H
#define TCC_COMM_VALUES_H

#include <stdint.h>
#include <string.h>

#include "plan/plan.h"

static inline uint64_t cv_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A random value of dt, exact in dt, from (seed, rank, i, salt): f32 and f64
 * in [-1, 1), i32 in [-2^27, 2^27) (a sum of 6 does not overflow). */
static inline double cv_value(uint64_t seed, PlanDType dt, int rank, size_t i, int salt)
{
    uint64_t h = cv_mix(seed ^ cv_mix(((uint64_t)rank << 48) ^ ((uint64_t)salt << 40) ^ i));
    if (dt == PD_F32)
        return (double)(h >> 40) / (1 << 23) - 1.0;
    if (dt == PD_F64)
        return (double)(h >> 11) / (double)(1ull << 52) - 1.0;
    return (double)((int64_t)(h >> 37) - (1 << 26) * 2);
}

static inline void cv_put(PlanDType dt, void *buf, size_t i, double v)
{
    if (dt == PD_F32)
        ((float *)buf)[i] = (float)v;
    else if (dt == PD_F64)
        ((double *)buf)[i] = v;
    else
        ((int32_t *)buf)[i] = (int32_t)v;
}

static inline double cv_get(PlanDType dt, const void *buf, size_t i)
{
    if (dt == PD_F32)
        return ((const float *)buf)[i];
    if (dt == PD_F64)
        return ((const double *)buf)[i];
    return ((const int32_t *)buf)[i];
}

/* A code that names where an element came from; fits 2 bytes for the sizes here. */
static inline uint64_t cv_code(int rank, size_t p, size_t k, size_t q)
{
    return ((((uint64_t)rank * 4 + p) * 32 + k) * 8) + q + 1;
}

static inline void cv_put_code(void *buf, size_t i, size_t elem, uint64_t v)
{
    memcpy((char *)buf + i * elem, &v, elem); /* little-endian: the low bytes */
}

static inline uint64_t cv_get_code(const void *buf, size_t i, size_t elem)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)buf + i * elem, elem);
    return v;
}

#endif
