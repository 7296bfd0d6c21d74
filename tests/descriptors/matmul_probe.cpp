/*
 * matmul_probe.cpp — kernels/cuda/matmul.cu's cuBLASLt descriptors, built
 * by its own code (fused_epilogue, split_epilogue, describe, build_plan,
 * make_matmul_desc)
 * against the real cuBLASLt with no GPU and read back (see probe.h).
 *
 * build_plan sets every layout and preference attribute before it asks the
 * heuristic, which needs a device: with no handle that query fails, and
 * the reply says so; everything before it has been accepted by then.
 */
#include "kernels/cuda/matmul.cu"

#include "probe.h"

namespace matmul_probe
{

/* "ptr:dtype:rows,cols:row_stride,col_stride,batch_stride" */
bool parse_matrix(const ProbeCase &c, const char *key, ga_matrix *m)
{
    memset(m, 0, sizeof *m);
    std::string s = c.text(key);
    size_t a = s.find(':'), b = s.find(':', a + 1), d = s.find(':', b + 1);
    if (s.empty() || a == std::string::npos || b == std::string::npos || d == std::string::npos)
        return false;
    ProbeCase parts;
    parts.fields["dtype"] = s.substr(a + 1, b - a - 1);
    parts.fields["shape"] = s.substr(b + 1, d - b - 1);
    parts.fields["strides"] = s.substr(d + 1);
    std::vector<int64_t> shape = parts.integers("shape"), strides = parts.integers("strides");
    if (shape.size() != 2 || strides.size() != 3)
        return false;
    m->data = (void *)(uintptr_t)strtoull(s.substr(0, a).c_str(), nullptr, 0);
    m->dtype = parts.dtype("dtype");
    m->rows = shape[0];
    m->cols = shape[1];
    m->row_stride = strides[0];
    m->col_stride = strides[1];
    m->batch_stride = strides[2];
    return true;
}

/* One attribute read back as a signed integer, or its failure. */
template <typename T, typename Get> void read_attr(JsonObject &o, const char *key, Get get)
{
    T value = 0;
    size_t written = 0;
    cublasStatus_t s = get(&value, sizeof value, &written);
    if (s != CUBLAS_STATUS_SUCCESS)
        o.string(key, std::string("unreadable: ") + cublasLtGetStatusName(s));
    else if (written != sizeof value)
        o.string(key, "size " + std::to_string(written));
    else
        o.integer(key, (int64_t)value);
}

std::string layout_json(cublasLtMatrixLayout_t l)
{
    if (!l)
        return "null";
    JsonObject o;
    auto get = [l](cublasLtMatrixLayoutAttribute_t a) {
        return [l, a](void *buf, size_t size, size_t *written) {
            return cublasLtMatrixLayoutGetAttribute(l, a, buf, size, written);
        };
    };
    read_attr<int32_t>(o, "type", get(CUBLASLT_MATRIX_LAYOUT_TYPE));
    read_attr<int32_t>(o, "order", get(CUBLASLT_MATRIX_LAYOUT_ORDER));
    read_attr<uint64_t>(o, "rows", get(CUBLASLT_MATRIX_LAYOUT_ROWS));
    read_attr<uint64_t>(o, "cols", get(CUBLASLT_MATRIX_LAYOUT_COLS));
    read_attr<int64_t>(o, "ld", get(CUBLASLT_MATRIX_LAYOUT_LD));
    read_attr<int32_t>(o, "batch_count", get(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT));
    read_attr<int64_t>(o, "batch_offset", get(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET));
    return o.str();
}

std::string desc_json(cublasLtMatmulDesc_t d)
{
    JsonObject o;
    auto get = [d](cublasLtMatmulDescAttributes_t a) {
        return [d, a](void *buf, size_t size, size_t *written) {
            return cublasLtMatmulDescGetAttribute(d, a, buf, size, written);
        };
    };
    read_attr<int32_t>(o, "compute_type", get(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE));
    read_attr<int32_t>(o, "scale_type", get(CUBLASLT_MATMUL_DESC_SCALE_TYPE));
    read_attr<int32_t>(o, "transa", get(CUBLASLT_MATMUL_DESC_TRANSA));
    read_attr<int32_t>(o, "transb", get(CUBLASLT_MATMUL_DESC_TRANSB));
    read_attr<uint32_t>(o, "epilogue", get(CUBLASLT_MATMUL_DESC_EPILOGUE));
    read_attr<uint64_t>(o, "bias_pointer", get(CUBLASLT_MATMUL_DESC_BIAS_POINTER));
    read_attr<int32_t>(o, "bias_data_type", get(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE));
    read_attr<uint64_t>(o, "aux_pointer", get(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER));
    read_attr<int64_t>(o, "aux_ld", get(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD));
    read_attr<int64_t>(o, "aux_batch_stride", get(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE));
    return o.str();
}

/* matmul.cu's descriptors for the call with `epilogue`. */
std::string call_json(const ga_matmul_desc &desc, cublasLtEpilogue_t epilogue, size_t ws)
{
    JsonObject o;
    LtCall c;
    bool described = describe(&desc, epilogue, &c);
    o.boolean("described", described);
    if (!described)
        return o.str();
    LtPlan plan;
    ga_status st = build_plan(nullptr, c, &desc, ws, &plan);
    o.raw("plan_status", json_status(st));
    o.raw("a", layout_json(plan.a)).raw("b", layout_json(plan.b));
    o.raw("c", layout_json(plan.c)).raw("d", layout_json(plan.d));
    DescGuard md;
    st = make_matmul_desc(c, &md.d);
    o.raw("desc_status", json_status(st));
    if (!st.error)
        o.raw("desc", desc_json(md.d));
    return o.str();
}

ga_activation activation(const std::string &s)
{
    return activation_by_name(s);
}

} // namespace matmul_probe

std::string probe_matmul(const ProbeCase &c)
{
    using namespace matmul_probe;
    JsonObject o;
    o.string("id", c.text("id"));
    ga_matmul_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = c.integer("batch", 1);
    if (!parse_matrix(c, "a", &desc.a) || !parse_matrix(c, "b", &desc.b) ||
        !parse_matrix(c, "d", &desc.d))
        return o.string("protocol_error", "a, b, d are ptr:dtype:rows,cols:rs,cs,bs").str();
    parse_matrix(c, "preact", &desc.preact);
    parse_matrix(c, "dact_aux", &desc.dact_aux);
    desc.bias = (const void *)(uintptr_t)c.integer("bias", 0);
    desc.bias_dtype = c.has("bias_dtype") ? c.dtype("bias_dtype") : desc.d.dtype;
    desc.activation = activation(c.text("act"));
    desc.dact = activation(c.text("dact"));
    desc.col_sums = (void *)(uintptr_t)c.integer("col_sums", 0);
    desc.col_sums_dtype = c.has("col_sums_dtype") ? c.dtype("col_sums_dtype") : desc.d.dtype;
    desc.a_row_sums = (void *)(uintptr_t)c.integer("a_row_sums", 0);
    desc.a_row_sums_dtype = c.has("a_row_sums_dtype") ? c.dtype("a_row_sums_dtype") : desc.d.dtype;
    desc.allow_tf32 = (int)c.integer("tf32", 0);
    desc.deterministic = (int)c.integer("deterministic", 0);
    size_t ws = (size_t)c.integer("ws_size", 0);
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    ga_fallback_reason why = fused_epilogue(&desc, &epilogue);
    bool fused = why == GA_FALLBACK_NONE;
    o.boolean("fused", fused);
    o.integer("fallback_reason", (int64_t)why);
    if (fused)
        o.integer("epilogue", (int64_t)epilogue).raw("fused_call", call_json(desc, epilogue, ws));
    ga_matmul_desc z_desc;
    const char *split_why = nullptr;
    bool split = split_epilogue(&desc, &z_desc, &epilogue, &split_why);
    o.boolean("split", split);
    if (split)
        o.integer("split_epilogue", (int64_t)epilogue)
            .integer("split_d", (int64_t)(uintptr_t)z_desc.d.data)
            .boolean("split_keeps_activation", z_desc.activation != GA_ACT_NONE)
            .string("split_why", split_why)
            .raw("split_call", call_json(z_desc, epilogue, ws));
    o.raw("plain_call", call_json(desc, CUBLASLT_EPILOGUE_DEFAULT, ws));
    return o.str();
}
