/*
 * fallback.c — what happens when a CUDA op cannot run as the one library
 * call it asked for: the fallback policy (allow, warn, raise), and the
 * per-op-family call counters (matmul_stats(), conv_stats()) whose
 * fallbacks it answers.
 */
#include "fallback.h"

#include <stdlib.h>
#include <string.h>

#include "args.h"

/* What a fallback the kernels report (ga_op_report.reason) leads to.  Only
 * the reasons from GA_FALLBACK_NO_ENGINE on are subject to it: the others
 * are limits the libraries document, counted in the stats and otherwise
 * silent, since warning about them would warn on every GPU. */
enum { POLICY_ALLOW, POLICY_WARN, POLICY_RAISE };
static const char *const policy_names[] = {"allow", "warn", "raise"};
static int fallback_policy = POLICY_WARN;

static const char *const reason_names[GA_FALLBACK_REASON_COUNT] = {
    "none",      "layout",    "epilogue",          "deterministic",      "not_supported",
    "no_engine", "bad_param", "sublibrary_failed", "compilation_failed", "execution_failed",
};

/* What each reason that the policy covers means for the user. */
static const char *reason_advice(ga_fallback_reason reason)
{
    switch (reason) {
    case GA_FALLBACK_NO_ENGINE:
        return "the library has no algorithm even for the plain operation here, so gpuaccel's own, "
               "far slower kernels ran";
    case GA_FALLBACK_BAD_PARAM:
        return "the library rejected gpuaccel's description of a valid call, which may be a "
               "gpuaccel bug: please report this message";
    case GA_FALLBACK_SUBLIBRARY:
        return "cuDNN could not load one of its engine libraries: check the installation "
               "(python -m gpuaccel doctor)";
    case GA_FALLBACK_COMPILATION:
        return "cuDNN could not compile a fused kernel at run time (NVRTC): check that libnvrtc "
               "matches the CUDA runtime (python -m gpuaccel doctor)";
    case GA_FALLBACK_EXECUTION: return "the library's plans were built but none of them ran";
    default: return "";
    }
}

static int parse_policy(const char *text)
{
    for (int k = 0; k < 3; k++)
        if (text && strcmp(text, policy_names[k]) == 0)
            return k;
    return -1;
}

int ga_fallback_policy_init(void)
{
    const char *env = getenv("GPUACCEL_FALLBACK");
    if (!env || !*env)
        return 0;
    int policy = parse_policy(env);
    if (policy >= 0) {
        fallback_policy = policy;
        return 0;
    }
    return PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                            "GPUACCEL_FALLBACK=%.100s is not a fallback policy: accepted are "
                            "'allow', 'warn' and 'raise'; using 'warn'",
                            env);
}

PyObject *ga_py_set_fallback_policy(PyObject *module, PyObject *arg)
{
    (void)module;
    int policy = parse_policy(ga_exact_utf8(arg));
    if (policy < 0) {
        PyErr_Format(PyExc_ValueError,
                     "set_fallback_policy: policy must be 'allow' (count fallbacks only), 'warn' "
                     "(a FallbackWarning once per op and reason) or 'raise' (FallbackError), got "
                     "%R",
                     arg);
        return NULL;
    }
    fallback_policy = policy;
    Py_RETURN_NONE;
}

PyObject *ga_py_get_fallback_policy(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return PyUnicode_FromString(policy_names[fallback_policy]);
}

PyObject *ga_fallback_reason_names(void)
{
    PyObject *names = PyTuple_New(GA_FALLBACK_REASON_COUNT);
    for (int k = 0; names && k < GA_FALLBACK_REASON_COUNT; k++) {
        PyObject *name = PyUnicode_FromString(reason_names[k]);
        if (!name) {
            Py_CLEAR(names);
            break;
        }
        PyTuple_SET_ITEM(names, k, name);
    }
    return names;
}

/* The fallback the policy has yet to answer, of this thread's op under
 * way: ga_op_count notes it, ga_op_settle_fallbacks answers it once the
 * op has recorded its arrays' stream uses (an exception raised before
 * that would free outputs the queued kernels still write). */
static _Thread_local struct {
    ga_op_counters *counters;
    const char *op;
    ga_op_report report;
} pending;

/* The policy's answer to a reported fallback: -1 with FallbackError (or a
 * FallbackWarning made an error by the warnings filter) set. */
static int apply_fallback_policy(ga_state *st, ga_op_counters *c, const char *op,
                                 const ga_op_report *report)
{
    ga_fallback_reason reason = report->reason;
    if (reason < GA_FALLBACK_NO_ENGINE || reason >= GA_FALLBACK_REASON_COUNT ||
        fallback_policy == POLICY_ALLOW)
        return 0;
    const char *detail = report->detail[0] ? report->detail : "no message from the library";
    if (fallback_policy == POLICY_RAISE) {
        PyObject *msg = PyUnicode_FromFormat(
            "%s: the library call fell back (reason '%s': %s): %s.  "
            "gpuaccel.set_fallback_policy('warn') or GPUACCEL_FALLBACK=warn lets the fallback run "
            "with a warning instead",
            op, reason_names[reason], reason_advice(reason), detail);
        if (!msg)
            return -1;
        PyObject *exc = PyObject_CallOneArg(st->FallbackError, msg);
        Py_DECREF(msg);
        if (!exc)
            return -1;
        PyObject *code = PyLong_FromLong(report->library_status);
        PyObject *name = PyUnicode_FromString(reason_names[reason]);
        PyObject *call = PyUnicode_FromString(op);
        int bad = !code || !name || !call || PyObject_SetAttrString(exc, "code", code) < 0 ||
                  PyObject_SetAttrString(exc, "name", name) < 0 ||
                  PyObject_SetAttrString(exc, "call", call) < 0;
        Py_XDECREF(code);
        Py_XDECREF(name);
        Py_XDECREF(call);
        if (!bad)
            PyErr_SetObject(st->FallbackError, exc);
        Py_DECREF(exc);
        return -1;
    }
    unsigned bit = 1u << reason;
    if (c->warned & bit)
        return 0;
    c->warned |= bit;
    return PyErr_WarnFormat(st->FallbackWarning, 1,
                            "%s: the library call fell back (reason '%s': %s): %s.  Shown once "
                            "per op and reason; gpuaccel.set_fallback_policy('allow') or "
                            "GPUACCEL_FALLBACK=allow silences it, 'raise' makes it an error",
                            op, reason_names[reason], reason_advice(reason), detail);
}

/* ---------------------------------------------------------- statistics */

void ga_op_count(ga_op_counters *c, const char *op, int cuda, const ga_op_report *report)
{
    c->calls++;
    if (!cuda) {
        c->cpu_calls++;
        return;
    }
    c->cuda_calls++;
    c->fused += report->fused;
    c->fallback += report->fallback;
    c->tuned += report->tuned;
    if (report->reason <= GA_FALLBACK_NONE || report->reason >= GA_FALLBACK_REASON_COUNT)
        return;
    c->reasons[report->reason]++;
    if (report->reason >= GA_FALLBACK_NO_ENGINE && fallback_policy != POLICY_ALLOW &&
        (!pending.counters || report->reason > pending.report.reason)) {
        pending.counters = c;
        pending.op = op;
        pending.report = *report;
    }
}

PyObject *ga_op_settle_fallbacks(ga_state *st, PyObject *result)
{
    if (!pending.counters)
        return result;
    ga_op_counters *c = pending.counters;
    pending.counters = NULL;
    if (result && apply_fallback_policy(st, c, pending.op, &pending.report) < 0)
        Py_CLEAR(result);
    return result;
}

PyObject *ga_op_counters_dict(const ga_op_counters *c, uint64_t hits, uint64_t misses)
{
    PyObject *reasons = PyDict_New();
    for (int k = GA_FALLBACK_NONE + 1; reasons && k < GA_FALLBACK_REASON_COUNT; k++) {
        PyObject *n = PyLong_FromUnsignedLongLong(c->reasons[k]);
        if (!n || PyDict_SetItemString(reasons, reason_names[k], n) < 0)
            Py_CLEAR(reasons);
        Py_XDECREF(n);
    }
    if (!reasons)
        return NULL;
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:N}", "calls", (unsigned long long)c->calls,
        "cpu_calls", (unsigned long long)c->cpu_calls, "cuda_calls",
        (unsigned long long)c->cuda_calls, "fused", (unsigned long long)c->fused, "fallback",
        (unsigned long long)c->fallback, "tuned", (unsigned long long)c->tuned, "tuning_reused",
        (unsigned long long)c->tuning_reused, "plan_cache_hits", (unsigned long long)hits,
        "plan_cache_misses", (unsigned long long)misses, "fallback_reasons", reasons);
}
