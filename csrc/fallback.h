/*
 * fallback.h — the fallback policy and the per-op-family call counters
 * (fallback.c).
 */
#ifndef GPUACCEL_FALLBACK_H
#define GPUACCEL_FALLBACK_H

#include "errors.h"

/* ---- fallbacks: set_fallback_policy("allow" | "warn" | "raise") */
PyObject *ga_py_set_fallback_policy(PyObject *module, PyObject *arg);
PyObject *ga_py_get_fallback_policy(PyObject *module, PyObject *unused);
/* The policy from GPUACCEL_FALLBACK (at import); a value it does not know
 * is reported with a RuntimeWarning and ignored.  -1 when that warning
 * was turned into an exception. */
int ga_fallback_policy_init(void);
/* ("none", "layout", ...): the names of ga_fallback_reason, by value. */
PyObject *ga_fallback_reason_names(void);

/* ---- statistics (matmul_stats(), conv_stats()) */
typedef struct {
    uint64_t calls, cpu_calls, cuda_calls, fused, fallback, tuned, tuning_reused;
    uint64_t reasons[GA_FALLBACK_REASON_COUNT]; /* CUDA calls by fallback reason */
    unsigned warned;                            /* reasons already warned about (bit per reason) */
} ga_op_counters;

/* Counts a call on the CPU or, with what the backend reported, on CUDA,
 * and notes a fallback the policy covers for ga_op_settle_fallbacks (`op`
 * names the op in its message). */
void ga_op_count(ga_op_counters *counters, const char *op, int cuda, const ga_op_report *report);
/* At the end of an op (every path): answers the fallback its calls noted —
 * a FallbackWarning once per counters (op family) and reason, or
 * FallbackError — and returns `result`, or NULL (result released) when
 * that raised.  A NULL result only forgets the note. */
PyObject *ga_op_settle_fallbacks(ga_state *st, PyObject *result);
/* The counters and the backend's plan-cache hits and misses as a dict. */
PyObject *ga_op_counters_dict(const ga_op_counters *counters, uint64_t plan_hits,
                              uint64_t plan_misses);

#endif
