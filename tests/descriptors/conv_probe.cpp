/*
 * conv_probe.cpp — kernels/cuda/conv.cu's graphs, built by its own code
 * against the real cuDNN with no GPU and read back (see probe.h).
 *
 * conv.cu is included, not linked, so that its anonymous namespace
 * (init_problem, build_graph, make_variant_pack, rules_of) is in reach, and
 * cudnn_graph.cu (the graph code it uses) with it; the link keeps only what the probe reaches
 * (--gc-sections), so the execution paths, which need the direct kernels and a device, stay out.
 * Graphs are built without a cuDNN handle, which cuDNN >= 9.8 does not need and which cannot be
 * created without a GPU.
 *
 * cuDNN reads back tensors and convolution descriptors, not pointwise
 * operations, operation graphs or variant packs (NOT_SUPPORTED), and it
 * hands an operation's tensors back in its own grouped 5-D form without
 * their ids.  So the probe also records every descriptor call conv.cu
 * makes (the link wraps cudnnBackendCreateDescriptor, SetAttribute,
 * Finalize and DestroyDescriptor, --wrap): the graph as conv.cu described
 * it, each call's status from the real library, and, where cuDNN can, the
 * attributes read back from the finalized descriptors beside it.
 */
#include "kernels/cuda/cudnn_graph.cu"
#include "kernels/cuda/conv.cu"

#include "probe.h"

namespace conv_probe
{

/* ----------------------------------------------------------- recording */

/* One descriptor conv.cu created, with every attribute it set (in order,
 * each with the real library's status) and how its finalization went. */
struct Recorded {
    cudnnBackendDescriptor_t handle = nullptr; /* null once destroyed */
    int type = -1;
    std::vector<std::string> attrs;
    int finalized = -1; /* the status of the last cudnnBackendFinalize, -1: never */
};

bool g_recording = false;
std::vector<Recorded> g_log;

/* the log index of a live descriptor, -1 for one not recorded */
int64_t recorded_id(cudnnBackendDescriptor_t d)
{
    for (size_t i = g_log.size(); i-- > 0;)
        if (g_log[i].handle == d)
            return (int64_t)i;
    return -1;
}

/* Attribute values by their declared type: enums and int32 as 4-byte
 * integers, descriptors as log ids, pointers as addresses. */
std::string values_json(cudnnBackendAttributeType_t type, int64_t count, const void *values)
{
    std::vector<std::string> out;
    for (int64_t i = 0; i < count && values; i++) {
        switch (type) {
        case CUDNN_TYPE_INT64: out.push_back(std::to_string(((const int64_t *)values)[i])); break;
        case CUDNN_TYPE_FLOAT: {
            char buf[64];
            snprintf(buf, sizeof buf, "%.9g", (double)((const float *)values)[i]);
            out.push_back(buf);
            break;
        }
        case CUDNN_TYPE_DOUBLE: {
            char buf[64];
            snprintf(buf, sizeof buf, "%.17g", ((const double *)values)[i]);
            out.push_back(buf);
            break;
        }
        case CUDNN_TYPE_BOOLEAN: out.push_back(((const bool *)values)[i] ? "true" : "false"); break;
        case CUDNN_TYPE_BACKEND_DESCRIPTOR:
            out.push_back(
                std::to_string(recorded_id(((const cudnnBackendDescriptor_t *)values)[i])));
            break;
        case CUDNN_TYPE_VOID_PTR:
        case CUDNN_TYPE_HANDLE:
            out.push_back(std::to_string((uint64_t)(uintptr_t)((void *const *)values)[i]));
            break;
        case CUDNN_TYPE_CHAR: out.push_back(std::to_string((int)((const char *)values)[i])); break;
        default: /* the enum types and INT32 */
            out.push_back(std::to_string(((const int32_t *)values)[i]));
            break;
        }
    }
    return json_array(out);
}

} // namespace conv_probe

/* What conv.cu calls, through the linker's --wrap: forwarded unchanged to
 * the real library, recorded on the way. */
extern "C" {
cudnnStatus_t __real_cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t,
                                                  cudnnBackendDescriptor_t *);
cudnnStatus_t __real_cudnnBackendSetAttribute(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                              cudnnBackendAttributeType_t, int64_t, const void *);
cudnnStatus_t __real_cudnnBackendFinalize(cudnnBackendDescriptor_t);
cudnnStatus_t __real_cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t);

cudnnStatus_t __wrap_cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                                  cudnnBackendDescriptor_t *out)
{
    cudnnStatus_t s = __real_cudnnBackendCreateDescriptor(type, out);
    if (conv_probe::g_recording && s == CUDNN_STATUS_SUCCESS) {
        conv_probe::Recorded r;
        r.handle = *out;
        r.type = (int)type;
        conv_probe::g_log.push_back(r);
    }
    return s;
}

cudnnStatus_t __wrap_cudnnBackendSetAttribute(cudnnBackendDescriptor_t d,
                                              cudnnBackendAttributeName_t name,
                                              cudnnBackendAttributeType_t type, int64_t count,
                                              const void *values)
{
    cudnnStatus_t s = __real_cudnnBackendSetAttribute(d, name, type, count, values);
    int64_t id = conv_probe::g_recording ? conv_probe::recorded_id(d) : -1;
    if (id >= 0) {
        JsonObject a;
        a.integer("name", (int)name).integer("type", (int)type).integer("count", count);
        a.raw("values", conv_probe::values_json(type, count, values)).integer("status", (int)s);
        conv_probe::g_log[(size_t)id].attrs.push_back(a.str());
    }
    return s;
}

cudnnStatus_t __wrap_cudnnBackendFinalize(cudnnBackendDescriptor_t d)
{
    cudnnStatus_t s = __real_cudnnBackendFinalize(d);
    int64_t id = conv_probe::g_recording ? conv_probe::recorded_id(d) : -1;
    if (id >= 0)
        conv_probe::g_log[(size_t)id].finalized = (int)s;
    return s;
}

cudnnStatus_t __wrap_cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d)
{
    int64_t id = conv_probe::recorded_id(d);
    if (id >= 0)
        conv_probe::g_log[(size_t)id].handle = nullptr; /* the address may come back */
    return __real_cudnnBackendDestroyDescriptor(d);
}
}

namespace conv_probe
{

/* cuDNN's explanation of the failure just seen, and the string cleared
 * (reading it clears it), so that no later failure is blamed on it. */
std::string last_error()
{
    char text[1024];
    text[0] = '\0';
    cudnnGetLastErrorString(text, sizeof text);
    return text;
}

/* An attribute read back: its elements, or the failure with cuDNN's text. */
struct Read {
    bool ok = false;
    std::string error;
};

Read read_status(cudnnStatus_t s)
{
    Read r;
    r.ok = s == CUDNN_STATUS_SUCCESS;
    if (!r.ok)
        r.error = std::string(cudnnGetErrorString(s)) + ": " + last_error();
    return r;
}

/* An int64 array attribute (at most `max` elements: cuDNN wants exactly 1
 * asked for a scalar), or the failure as a string. */
std::string read_int64s(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        int64_t max = 16)
{
    int64_t values[16];
    int64_t n = 0;
    Read r = read_status(cudnnBackendGetAttribute(d, name, CUDNN_TYPE_INT64, max, &n, values));
    if (!r.ok)
        return json_string(r.error);
    std::vector<std::string> items;
    for (int64_t i = 0; i < std::min<int64_t>(n, max); i++)
        items.push_back(std::to_string(values[i]));
    return json_array(items);
}

std::string tensor_json(cudnnBackendDescriptor_t t)
{
    JsonObject o;
    int64_t n = 0, uid = 0, align = 0;
    cudnnDataType_t type = CUDNN_DATA_FLOAT;
    bool is_virtual = false;
    Read r = read_status(
        cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &uid));
    o.raw("uid", r.ok ? std::to_string(uid) : json_string(r.error));
    r = read_status(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE,
                                             1, &n, &type));
    o.raw("data_type", r.ok ? std::to_string((int)type) : json_string(r.error));
    o.raw("dims", read_int64s(t, CUDNN_ATTR_TENSOR_DIMENSIONS));
    o.raw("strides", read_int64s(t, CUDNN_ATTR_TENSOR_STRIDES));
    r = read_status(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64,
                                             1, &n, &align));
    o.raw("alignment", r.ok ? std::to_string(align) : json_string(r.error));
    r = read_status(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1,
                                             &n, &is_virtual));
    o.raw("virtual", r.ok ? (is_virtual ? "true" : "false") : json_string(r.error));
    return o.str();
}

std::string conv_json(cudnnBackendDescriptor_t c)
{
    JsonObject o;
    int64_t n = 0;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    Read r = read_status(cudnnBackendGetAttribute(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
                                                  CUDNN_TYPE_DATA_TYPE, 1, &n, &comp));
    o.raw("comp_type", r.ok ? std::to_string((int)comp) : json_string(r.error));
    /* (cuDNN 9 refuses to read CONV_MODE back: the recorded call shows it) */
    o.raw("spatial_dims", read_int64s(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 1));
    o.raw("dilations", read_int64s(c, CUDNN_ATTR_CONVOLUTION_DILATIONS));
    o.raw("filter_strides", read_int64s(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES));
    o.raw("pre_paddings", read_int64s(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS));
    o.raw("post_paddings", read_int64s(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS));
    return o.str();
}

/* How many engine configs cuDNN's heuristic `mode` offers for the graph
 * with no device, and how many of those it hands out pass conv.cu's
 * numerical-note filter (engine_allowed). */
std::string heuristics_json(const Graph &g, const Problem &p, cudnnBackendHeurMode_t mode)
{
    Desc heur;
    if (make_desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur).error)
        return json_string("cannot create a heuristics descriptor: " + last_error());
    cudnnBackendDescriptor_t og = g.op_graph.get();
    JsonObject o;
    Read r = read_status(cudnnBackendSetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og));
    if (r.ok)
        r = read_status(cudnnBackendSetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE,
                                                 CUDNN_TYPE_HEUR_MODE, 1, &mode));
    if (r.ok)
        r = read_status(cudnnBackendFinalize(heur.get()));
    if (!r.ok)
        return o.string("error", r.error).str();
    int64_t count = 0;
    r = read_status(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    if (!r.ok)
        return o.string("error", r.error).str();
    std::vector<Desc> cfgs((size_t)count);
    std::vector<cudnnBackendDescriptor_t> raw((size_t)count);
    for (int64_t i = 0; i < count; i++) {
        make_desc(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[(size_t)i]);
        raw[(size_t)i] = cfgs[(size_t)i].get();
    }
    int64_t got = 0;
    if (count > 0) {
        r = read_status(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                                 raw.data()));
        if (!r.ok)
            return o.string("error", r.error).str();
    }
    int64_t allowed = 0;
    std::vector<int64_t> engines;
    for (int64_t i = 0; i < std::min(got, count); i++) {
        Desc engine;
        make_desc(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine);
        cudnnBackendDescriptor_t e = engine.get();
        int64_t n = 0, index = -1;
        if (cudnnBackendGetAttribute(raw[(size_t)i], CUDNN_ATTR_ENGINECFG_ENGINE,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                     &e) != CUDNN_STATUS_SUCCESS) {
            return o.string("error", "engine of config: " + last_error()).str();
        }
        cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                 &index);
        engines.push_back(index);
        bool ok = false;
        ga_status st = engine_allowed(e, rules_of(p), &ok);
        if (st.error)
            return o.raw("error", json_status(st)).str();
        allowed += ok;
    }
    /* offered: the heuristic's count; materialized: the configs it then
     * hands out, which without a device is none (each is checked against
     * the device's properties) */
    o.integer("offered", count).integer("materialized", got).integer("allowed", allowed);
    o.integers("engines", engines.data(), (int64_t)engines.size());
    return o.str();
}

/* The recorded descriptors, with what cuDNN reads back from the finalized
 * tensors and convolutions (which must still be alive). */
std::string log_json()
{
    std::vector<std::string> items;
    for (size_t i = 0; i < g_log.size(); i++) {
        const Recorded &r = g_log[i];
        JsonObject o;
        o.integer("id", (int64_t)i).integer("type", r.type).raw("attrs", json_array(r.attrs));
        o.integer("finalized", r.finalized);
        if (r.handle && r.finalized == CUDNN_STATUS_SUCCESS) {
            if (r.type == CUDNN_BACKEND_TENSOR_DESCRIPTOR)
                o.raw("readback", tensor_json(r.handle));
            else if (r.type == CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
                o.raw("readback", conv_json(r.handle));
        }
        items.push_back(o.str());
    }
    return json_array(items);
}

/* Runs conv.cu's `build` with its descriptor calls recorded. */
template <typename F> ga_status recorded(F &&build)
{
    g_log.clear();
    g_recording = true;
    ga_status st = build();
    g_recording = false;
    return st;
}

std::string graph_json(const Problem &p, GraphKind kind)
{
    JsonObject o;
    o.string("kind", kind == GRAPH_FUSED ? "fused" : kind == GRAPH_BIAS ? "split" : "conv");
    std::shared_ptr<Graph> g;
    ga_status st = recorded([&] { return build_graph(nullptr, p, kind, &g); });
    o.raw("status", json_status(st));
    if (st.error)
        return o.raw("descriptors", log_json()).str();
    /* first: reading attributes back may leave cuDNN's graph in another state */
    o.raw("heuristics_a", heuristics_json(*g, p, CUDNN_HEUR_MODE_A));
    o.raw("heuristics_fallback", heuristics_json(*g, p, CUDNN_HEUR_MODE_FALLBACK));
    o.raw("descriptors", log_json());
    o.integer("op_graph", recorded_id(g->op_graph.get()));
    o.integers("real_uids", g->uids.data(), (int64_t)g->uids.size());
    int64_t n = 0, engines = 0;
    Read r = read_status(cudnnBackendGetAttribute(g->op_graph.get(),
                                                  CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
                                                  CUDNN_TYPE_INT64, 1, &n, &engines));
    o.raw("engine_global_count", r.ok ? std::to_string(engines) : json_string(r.error));
    {
        Desc pack;
        ga_status vs = recorded([&] { return make_variant_pack(*g, p, &pack); });
        o.raw("variant_pack",
              JsonObject().raw("status", json_status(vs)).raw("descriptors", log_json()).str());
    }
    return o.str();
}

/* "x=ptr:n,c,h,w:s0,s1,s2,s3" (byte strides) */
bool parse_tensor(const ProbeCase &c, const char *key, ga_dtype dtype, ga_tensor *t)
{
    memset(t, 0, sizeof *t);
    std::string s = c.text(key);
    if (s.empty())
        return false;
    size_t a = s.find(':'), b = s.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos)
        return false;
    ProbeCase parts;
    parts.fields["shape"] = s.substr(a + 1, b - a - 1);
    parts.fields["strides"] = s.substr(b + 1);
    std::vector<int64_t> shape = parts.integers("shape"), strides = parts.integers("strides");
    if (shape.size() != 4 || strides.size() != 4)
        return false;
    t->data = (void *)(uintptr_t)strtoull(s.substr(0, a).c_str(), nullptr, 0);
    t->dtype = dtype;
    t->ndim = 4;
    for (int d = 0; d < 4; d++) {
        t->shape[d] = shape[(size_t)d];
        t->strides[d] = strides[(size_t)d];
    }
    return true;
}

} // namespace conv_probe

std::string probe_conv(const ProbeCase &c)
{
    using namespace conv_probe;
    JsonObject o;
    o.string("id", c.text("id"));
    ga_dtype dtype = c.dtype("dtype");
    ga_tensor x, w, y, preact;
    if (!parse_tensor(c, "x", dtype, &x) || !parse_tensor(c, "w", dtype, &w) ||
        !parse_tensor(c, "y", dtype, &y))
        return o.string("protocol_error", "x, w and y are ptr:n,c,h,w:s0,s1,s2,s3").str();
    bool has_preact = parse_tensor(c, "preact", dtype, &preact);
    std::string op_name = c.text("op");
    GaConvOp op = op_name == "bwd_data"     ? GA_CONV_BWD_DATA
                  : op_name == "bwd_filter" ? GA_CONV_BWD_FILTER
                                            : GA_CONV_FWD;
    std::string act_name = c.text("act");
    ga_activation act = activation_by_name(act_name);
    ga_conv_geometry g;
    memset(&g, 0, sizeof g);
    std::vector<int64_t> stride = c.integers("stride"), padding = c.integers("padding"),
                         dilation = c.integers("dilation");
    if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2)
        return o.string("protocol_error", "stride, padding and dilation are h,w").str();
    for (int i = 0; i < 2; i++) {
        g.stride[i] = (int)stride[(size_t)i];
        g.padding[i] = (int)padding[(size_t)i];
        g.dilation[i] = (int)dilation[(size_t)i];
    }
    g.groups = (int)c.integer("groups", 1);
    g.allow_tf32 = (int)c.integer("tf32", 0);
    g.deterministic = (int)c.integer("deterministic", 0);
    const void *bias = (const void *)(uintptr_t)c.integer("bias", 0);
    void *ws = (void *)(uintptr_t)c.integer("ws", 0);
    size_t ws_size = (size_t)c.integer("ws_size", 0);
    Problem p;
    init_problem(&p, op, &g, &x, &w, &y, bias, act, has_preact ? &preact : nullptr, ws, ws_size);
    o.boolean("eligible", p.eligible).boolean("nhwc", p.nhwc);
    o.boolean("has_epilogue", has_epilogue(p)).boolean("fusable", fusable(p));
    std::vector<std::string> graphs;
    graphs.push_back(graph_json(p, GRAPH_CONV));
    if (fusable(p))
        graphs.push_back(graph_json(p, GRAPH_FUSED));
    if (can_split(p))
        graphs.push_back(graph_json(p, GRAPH_BIAS));
    o.raw("graphs", json_array(graphs));
    o.string("last_error_left", last_error());
    if (c.integer("run", 0)) {
        /* conv.cu's driver on a problem it has not met: with no device
         * cudaStreamIsCapturing cannot tell, which conv.cu treats as a
         * capture, so this shows what a capturing call of a cold problem
         * gets — and that it gets it before any cuDNN handle or plan */
        ga_conv_tuning tuning;
        memset(&tuning, 0, sizeof tuning);
        if (c.text("cached") == "direct") {
            /* a problem an earlier call found no cuDNN engine for: the
             * direct kernels run, without a handle (creating one allocates,
             * which a capture must not see) */
            auto e = std::make_shared<Entry>();
            e->route = ROUTE_DIRECT;
            e->chosen = "direct";
            ga_conv_plan_cache().insert(make_key(0, p), e);
        }
        uint64_t before = ga_conv_plan_cache().misses();
        ga_status st = run(0, p, (ga_stream)0, &tuning);
        o.raw("run_status", json_status(st));
        o.integer("run_cache_lookups", (int64_t)(ga_conv_plan_cache().misses() - before));
        o.boolean("run_took_handle", held_handle(0) != nullptr);
    }
    return o.str();
}

/* Which text a cuDNN failure in conv.cu is reported with, when an earlier
 * call left text behind (a failure nobody read, or the warnings a
 * successful heuristics query leaves): build_graph on a convolution cuDNN
 * refuses (dilation 0).  Replies with the status and what is left of
 * cuDNN's last-error string afterwards. */
std::string probe_cudnn_last_error(const ProbeCase &c)
{
    using namespace conv_probe;
    JsonObject o;
    o.string("id", c.text("id"));
    /* the stale text: a failure whose text nobody reads */
    cudnnBackendDescriptor_t og = nullptr;
    cudnnHandle_t no_handle = nullptr;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &og);
    cudnnBackendSetAttribute(og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
                             &no_handle);
    cudnnBackendDestroyDescriptor(og);
    ga_conv_geometry g;
    memset(&g, 0, sizeof g);
    g.stride[0] = g.stride[1] = 1;
    g.dilation[0] = g.dilation[1] = 0; /* cuDNN wants >= 1 */
    g.groups = 1;
    ga_tensor x, w, y;
    const int64_t dims[3][4] = {{1, 4, 5, 5}, {4, 4, 1, 1}, {1, 4, 5, 5}};
    ga_tensor *ts[3] = {&x, &w, &y};
    for (int i = 0; i < 3; i++) {
        memset(ts[i], 0, sizeof(ga_tensor));
        ts[i]->data = (void *)(uintptr_t)(0x100000 * (i + 1));
        ts[i]->dtype = GA_FLOAT32;
        ts[i]->ndim = 4;
        int64_t stride = 4;
        for (int d = 3; d >= 0; d--) {
            ts[i]->shape[d] = dims[i][d];
            ts[i]->strides[d] = stride;
            stride *= dims[i][d];
        }
    }
    Problem p;
    init_problem(&p, GA_CONV_FWD, &g, &x, &w, &y, nullptr, GA_ACT_NONE, nullptr, nullptr, 0);
    std::shared_ptr<Graph> graph;
    ga_status st = build_graph(nullptr, p, GRAPH_CONV, &graph);
    o.raw("status", json_status(st));
    o.string("left", last_error());
    return o.str();
}

/* What conv.cu makes of a sequence of refusals met in one search (the
 * statuses in order; -1: plans that finalized but did not run): the
 * reason it reports, with the status and text of the most severe. */
std::string probe_cudnn_refusal(const ProbeCase &c)
{
    JsonObject o;
    o.string("id", c.text("id"));
    Refusal why;
    std::vector<int64_t> statuses = c.integers("statuses");
    for (size_t i = 0; i < statuses.size(); i++) {
        std::string text = "refusal " + std::to_string(i);
        ga_status st = ga_status_make(GA_ERR_NOT_SUPPORTED, (int)statuses[i], "STATUS",
                                      text.c_str(), "call", __FILE__, __LINE__);
        why.keep(st, (ga_fallback_reason)c.integer("floor", 0));
    }
    o.integer("reason", (int64_t)why.reason).integer("status", why.status).string("text", why.text);
    return o.str();
}

/* conv.cu's search bound: how many finalizations a search makes when every
 * one yields a plan (`yield=1`) or none does, deterministic or timed. */
std::string probe_search_budget(const ProbeCase &c)
{
    JsonObject o;
    o.string("id", c.text("id"));
    SearchBudget budget(c.integer("deterministic", 0) != 0);
    int plans = 0, finalizations = 0;
    bool yield = c.integer("yield", 1) != 0;
    while (budget.allows(plans) && finalizations < 1000) {
        budget.finalizations--;
        finalizations++;
        plans += yield;
    }
    o.integer("finalizations", finalizations).integer("plans", plans);
    return o.str();
}

/* conv.cu's persisted engine choice: `text` parsed, and written again. */
std::string probe_choice(const ProbeCase &c)
{
    JsonObject o;
    o.string("id", c.text("id"));
    Route route = ROUTE_DIRECT;
    EngineChoice choice;
    bool ok = parse_choice(c.text("text").c_str(), &route, &choice);
    o.boolean("parsed", ok);
    if (ok)
        o.integer("route", (int64_t)route).string("written", choice_string(route, choice));
    return o.str();
}
