/* plan_impl.h: what the files of plan/ share and nothing else includes: the
 * JSON names of the format's enums, the largest integer JSON holds exactly,
 * three small predicates, and the quoting of a name read from a file.
 * The runtime and the compiler see plan.h alone. */
#ifndef TCC_PLAN_IMPL_H
#define TCC_PLAN_IMPL_H

#include "plan/plan.h"

#include <string.h>

#define PLAN_JSON_EXACT ((int64_t)1 << 53) /* larger integers are not exact as JSON numbers */

/* The names the JSON gives each dtype, role, instruction kind and collective,
 * indexed by the enum (basics.c). */
extern const char *const plan_dtype_names[PD_COUNT];
extern const char *const plan_role_names[PT_COUNT];
extern const char *const plan_kind_names[PI_COUNT];
extern const char *const plan_coll_names[PC_COUNT];

/* s, or "" for NULL (a string field not set). */
static inline const char *plan_str_or_empty(const char *s)
{
    return s ? s : "";
}

/* Whether k is point to point: only send and recv have a peer and a tag. */
static inline int plan_is_p2p(PlanCollKind k)
{
    return k == PC_SEND || k == PC_RECV;
}

/* Whether axis a is a pipeline axis (its role is "pipeline"). */
static inline int plan_is_pipeline(const PlanAxis *a)
{
    return a->role && !strcmp(a->role, "pipeline");
}

/* A name from the file, fit to quote in a one-line message: control bytes
 * become '?', and a long one is cut. b has room for PLAN_SHOWN bytes. */
#define PLAN_SHOWN 48
const char *plan_shown(char *b, const char *s);

#endif
