/*
 * driver.cpp — runs kernel calls described by tests/test_kernels_on_cpu.py
 * through the CUDA backend (kernels/cuda compiled by kernels/cudacpu, so
 * the kernels' own source runs on fibers) and through the CPU backend
 * (kernels/cpu, its twin), on separate copies of the same buffers.
 *
 *   cudacpu_driver CASE_DIR...
 *
 * Each CASE_DIR holds case.txt (below) and one <name>.bin per buffer.  For
 * each side ("cuda", "cpu") the driver writes every buffer as the call left
 * it (<name>.<side>.out) and the call's status (status.<side>: "ok", or the
 * error).  Every buffer lies between two guard zones at least as large as
 * itself: AddressSanitizer reports any access to them (they are poisoned),
 * and the other builds check after the call that no byte of them changed
 * (a write past a buffer makes the status an error).  At the end it prints
 * "launched KERNEL COUNT" for every kernel that ran.
 *
 * case.txt, one directive per line:
 *   op NAME                        copy fill bias_act act_backward matmul
 *                                  conv_fwd conv_bwd_data conv_bwd_filter
 *                                  normalize logger_update logger_reset resize
 *                                  selftest
 *   sides cuda [cpu]               which sides run (default both)
 *   buffer NAME BYTES
 *   tensor FIELD BUF OFF DTYPE NDIM SHAPE... STRIDES...   (BUF "-": no data)
 *   matrix FIELD BUF OFF DTYPE ROWS COLS ROW_STRIDE COL_STRIDE BATCH_STRIDE
 *   ptr FIELD BUF OFF
 *   int FIELD VALUE...
 *   float FIELD VALUE...
 *   dtype FIELD DTYPE
 *   text FIELD WORD
 *   limit_grid KERNEL X Y Z        see cudacpu::limit_grid
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/fallback.h"
#include "kernels/cudacpu/cudacpu.h"
#include "kernels/kernels.h"

extern "C" cudaError_t cudacpu_selftest(const char *name, void *out, const void *in, int n);

namespace
{

const char *const kDtypeNames[GA_NUM_DTYPES] = {"bool",    "uint8",  "int8",    "int16",
                                                "int32",   "int64",  "float16", "bfloat16",
                                                "float32", "float64"};

struct Fail {
    std::string what;
};

ga_dtype parse_dtype(const std::string &s)
{
    for (int k = 0; k < GA_NUM_DTYPES; k++)
        if (s == kDtypeNames[k])
            return (ga_dtype)k;
    throw Fail{"unknown dtype " + s};
}

struct Ref {
    std::string buffer; /* empty: no data */
    int64_t offset = 0;
};

struct TensorSpec {
    Ref ref;
    ga_tensor t;
};

struct MatrixSpec {
    Ref ref;
    ga_matrix m;
};

struct Case {
    std::string dir, op;
    bool run_cuda = true, run_cpu = true;
    std::vector<std::string> buffer_order;
    std::map<std::string, std::vector<char>> buffers;
    std::map<std::string, TensorSpec> tensors;
    std::map<std::string, MatrixSpec> matrices;
    std::map<std::string, Ref> ptrs;
    std::map<std::string, std::vector<int64_t>> ints;
    std::map<std::string, std::vector<double>> floats;
    std::map<std::string, ga_dtype> dtypes;
    std::map<std::string, std::string> texts;
    struct Limit {
        std::string kernel;
        unsigned x, y, z;
    };
    std::vector<Limit> limits;
};

std::vector<char> read_file(const std::string &path, size_t expect)
{
    std::ifstream f(path, std::ios::binary);
    if (!f)
        throw Fail{"cannot read " + path};
    std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (data.size() != expect)
        throw Fail{path + ": size differs from case.txt"};
    return data;
}

Ref read_ref(std::istringstream &in)
{
    Ref r;
    in >> r.buffer >> r.offset;
    if (r.buffer == "-")
        r.buffer.clear();
    return r;
}

Case read_case(const std::string &dir)
{
    Case c;
    c.dir = dir;
    std::ifstream f(dir + "/case.txt");
    if (!f)
        throw Fail{"cannot read " + dir + "/case.txt"};
    std::string line;
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string kind, field;
        if (!(in >> kind))
            continue;
        if (kind == "op") {
            in >> c.op;
        } else if (kind == "sides") {
            c.run_cuda = c.run_cpu = false;
            std::string side;
            while (in >> side) {
                c.run_cuda = c.run_cuda || side == "cuda";
                c.run_cpu = c.run_cpu || side == "cpu";
            }
            in.clear(in.eof() ? std::ios::goodbit : std::ios::failbit);
        } else if (kind == "buffer") {
            size_t bytes;
            in >> field >> bytes;
            c.buffers[field] = read_file(dir + "/" + field + ".bin", bytes);
            c.buffer_order.push_back(field);
        } else if (kind == "tensor") {
            TensorSpec s;
            in >> field;
            s.ref = read_ref(in);
            std::string dtype;
            memset(&s.t, 0, sizeof s.t);
            in >> dtype >> s.t.ndim;
            s.t.dtype = parse_dtype(dtype);
            if (s.t.ndim < 0 || s.t.ndim > GA_MAX_NDIM)
                throw Fail{"bad ndim in " + line};
            for (int d = 0; d < s.t.ndim; d++)
                in >> s.t.shape[d];
            for (int d = 0; d < s.t.ndim; d++)
                in >> s.t.strides[d];
            c.tensors[field] = s;
        } else if (kind == "matrix") {
            MatrixSpec s;
            in >> field;
            s.ref = read_ref(in);
            std::string dtype;
            memset(&s.m, 0, sizeof s.m);
            in >> dtype >> s.m.rows >> s.m.cols >> s.m.row_stride >> s.m.col_stride >>
                s.m.batch_stride;
            s.m.dtype = parse_dtype(dtype);
            c.matrices[field] = s;
        } else if (kind == "ptr") {
            in >> field;
            c.ptrs[field] = read_ref(in);
        } else if (kind == "int") {
            in >> field;
            int64_t v;
            while (in >> v)
                c.ints[field].push_back(v);
            in.clear(in.eof() ? std::ios::goodbit : std::ios::failbit);
        } else if (kind == "float") {
            in >> field;
            double v;
            while (in >> v)
                c.floats[field].push_back(v);
            in.clear(in.eof() ? std::ios::goodbit : std::ios::failbit);
        } else if (kind == "dtype") {
            std::string dtype;
            in >> field >> dtype;
            c.dtypes[field] = parse_dtype(dtype);
        } else if (kind == "text") {
            in >> field;
            in >> c.texts[field];
        } else if (kind == "limit_grid") {
            Case::Limit l;
            in >> l.kernel >> l.x >> l.y >> l.z;
            c.limits.push_back(l);
        } else {
            throw Fail{"unknown directive " + line};
        }
        if (in.fail())
            throw Fail{"malformed line: " + line};
    }
    return c;
}

constexpr unsigned char kGuardByte = 0xa5;

/* A buffer between two guard zones. */
struct Guarded {
    char *base = nullptr;
    size_t guard = 0, size = 0;
    char *data() const
    {
        return base + guard;
    }
};

/* One side's copy of the buffers, and the case's fields resolved in it. */
class Side
{
  public:
    Side(const Case &c) : c_(c)
    {
        for (const auto &kv : c.buffers) {
            Guarded g;
            g.size = kv.second.size();
            g.guard = (g.size + 63) / 64 * 64 + 4096;
            g.base = (char *)malloc(g.size + 2 * g.guard);
            if (!g.base)
                throw Fail{"out of memory"};
            memset(g.base, kGuardByte, g.size + 2 * g.guard);
            if (g.size)
                memcpy(g.data(), kv.second.data(), g.size);
#if defined(__SANITIZE_ADDRESS__)
            ASAN_POISON_MEMORY_REGION(g.base, g.guard);
            ASAN_POISON_MEMORY_REGION(g.data() + g.size, g.guard);
#endif
            memory_[kv.first] = g;
        }
    }
    ~Side()
    {
        for (auto &kv : memory_) {
#if defined(__SANITIZE_ADDRESS__)
            ASAN_UNPOISON_MEMORY_REGION(kv.second.base, kv.second.size + 2 * kv.second.guard);
#endif
            free(kv.second.base);
        }
    }
    Side(const Side &) = delete;
    Side &operator=(const Side &) = delete;

    /* "" when every guard zone is intact, else what was written where. */
    std::string guards_broken() const
    {
        for (const auto &kv : memory_) {
            const Guarded &g = kv.second;
            for (size_t k = 0; k < g.guard; k++) {
                if ((unsigned char)g.base[g.guard - 1 - k] != kGuardByte)
                    return "wrote " + std::to_string(k + 1) + " bytes before buffer " + kv.first;
                if ((unsigned char)g.data()[g.size + k] != kGuardByte)
                    return "wrote past the end of buffer " + kv.first + " (at byte " +
                           std::to_string(g.size + k) + ")";
            }
        }
        return "";
    }

    void *at(const Ref &r) const
    {
        if (r.buffer.empty())
            return nullptr;
        auto it = memory_.find(r.buffer);
        if (it == memory_.end())
            throw Fail{"unknown buffer " + r.buffer};
        return it->second.data() + r.offset;
    }

    ga_tensor tensor(const char *field) const
    {
        return resolve(c_.tensors, field, &TensorSpec::t);
    }

    ga_matrix matrix(const char *field) const
    {
        return resolve(c_.matrices, field, &MatrixSpec::m);
    }

    void *ptr(const std::string &field) const
    {
        auto it = c_.ptrs.find(field);
        return it == c_.ptrs.end() ? nullptr : at(it->second);
    }

    int64_t integer(const std::string &field, int64_t fallback = 0, size_t k = 0) const
    {
        auto it = c_.ints.find(field);
        return it == c_.ints.end() || it->second.size() <= k ? fallback : it->second[k];
    }

    double real(const std::string &field, size_t k = 0) const
    {
        auto it = c_.floats.find(field);
        if (it == c_.floats.end() || it->second.size() <= k)
            throw Fail{"missing float " + field};
        return it->second[k];
    }

    ga_dtype dtype(const std::string &field, ga_dtype fallback = GA_FLOAT32) const
    {
        auto it = c_.dtypes.find(field);
        return it == c_.dtypes.end() ? fallback : it->second;
    }

    std::string text(const std::string &field) const
    {
        auto it = c_.texts.find(field);
        return it == c_.texts.end() ? "" : it->second;
    }

    void write(const std::string &side) const
    {
        for (const std::string &name : c_.buffer_order) {
            std::string path = c_.dir + "/" + name + "." + side + ".out";
            std::ofstream f(path, std::ios::binary);
            f.write(memory_.at(name).data(), (std::streamsize)c_.buffers.at(name).size());
            if (!f)
                throw Fail{"cannot write " + path};
        }
    }

  private:
    /* A tensor or matrix field with its data pointer in this side's
     * buffers; all zeros when the case does not name it. */
    template <class Spec, class T>
    T resolve(const std::map<std::string, Spec> &specs, const char *field, T Spec::*value) const
    {
        T v;
        memset(&v, 0, sizeof v);
        auto it = specs.find(field);
        if (it == specs.end())
            return v;
        v = it->second.*value;
        v.data = at(it->second.ref);
        return v;
    }

    const Case &c_;
    std::map<std::string, Guarded> memory_;
};

ga_conv_geometry geometry(const Side &s)
{
    ga_conv_geometry g;
    memset(&g, 0, sizeof g);
    for (int i = 0; i < 2; i++) {
        g.stride[i] = (int)s.integer("stride", 1, (size_t)i);
        g.padding[i] = (int)s.integer("padding", 0, (size_t)i);
        g.dilation[i] = (int)s.integer("dilation", 1, (size_t)i);
    }
    g.groups = (int)s.integer("groups", 1);
    g.deterministic = 1;
    return g;
}

std::string status_text(const ga_status &st)
{
    if (!st.error)
        return "ok";
    std::string text = "error " + std::to_string((int)st.error);
    if (st.name)
        text += std::string(" ") + st.name;
    if (st.message)
        text += std::string(": ") + st.message;
    if (st.call)
        text += std::string(" [") + st.call + "]";
    return text;
}

ga_status selftest(const Side &s)
{
    cudaError_t err =
        cudacpu_selftest(s.text("name").c_str(), s.ptr("out"), s.ptr("in"), (int)s.integer("n"));
    if (err == cudaSuccess)
        return ga_ok();
    return ga_status_make(GA_ERR_CUDA, (int)err, cudaGetErrorName(err), cudaGetErrorString(err),
                          "cudacpu_selftest", __FILE__, __LINE__);
}

ga_matmul_desc matmul_desc(const Side &s)
{
    ga_matmul_desc d;
    memset(&d, 0, sizeof d);
    d.batch = s.integer("batch", 1);
    d.a = s.matrix("a");
    d.b = s.matrix("b");
    d.d = s.matrix("d");
    d.bias = s.ptr("bias");
    d.bias_dtype = s.dtype("bias_dtype");
    d.activation = (ga_activation)s.integer("activation");
    d.preact = s.matrix("preact");
    d.dact = (ga_activation)s.integer("dact");
    d.dact_aux = s.matrix("dact_aux");
    d.col_sums = s.ptr("col_sums");
    d.col_sums_dtype = s.dtype("col_sums_dtype");
    d.a_row_sums = s.ptr("a_row_sums");
    d.a_row_sums_dtype = s.dtype("a_row_sums_dtype");
    d.deterministic = 1;
    return d;
}

/* The call of `op` on one side. */
ga_status run(const std::string &op, const Side &s, bool cuda)
{
    const int device = 0;
    const ga_stream stream = nullptr;
    if (op == "copy") {
        ga_tensor dst = s.tensor("dst"), src = s.tensor("src");
        return cuda ? ga_cuda_copy(device, &dst, &src, stream) : ga_cpu_copy(&dst, &src);
    }
    if (op == "fill") {
        ga_tensor dst = s.tensor("dst");
        ga_scalar v;
        v.is_integer = (int)s.integer("is_integer");
        v.i = s.integer("i");
        v.f = v.is_integer ? 0.0 : s.real("f");
        return cuda ? ga_cuda_fill(device, &dst, v, stream) : ga_cpu_fill(&dst, v);
    }
    if (op == "bias_act") {
        ga_bias_act_desc d;
        memset(&d, 0, sizeof d);
        d.x = s.tensor("x");
        d.y = s.tensor("y");
        d.preact = s.tensor("preact");
        d.bias = s.ptr("bias");
        d.bias_dtype = s.dtype("bias_dtype");
        d.channel_dim = (int)s.integer("channel_dim");
        d.activation = (ga_activation)s.integer("activation");
        return cuda ? ga_cuda_bias_activation(device, &d, stream) : ga_cpu_bias_activation(&d);
    }
    if (op == "act_backward") {
        ga_act_backward_desc d;
        memset(&d, 0, sizeof d);
        d.grad_y = s.tensor("grad_y");
        d.aux = s.tensor("aux");
        d.dz = s.tensor("dz");
        d.activation = (ga_activation)s.integer("activation");
        d.bias_grad = s.ptr("bias_grad");
        d.bias_grad_dtype = s.dtype("bias_grad_dtype");
        d.channel_dim = (int)s.integer("channel_dim");
        return cuda ? ga_cuda_activation_backward(device, &d, stream)
                    : ga_cpu_activation_backward(&d);
    }
    if (op == "matmul") {
        ga_matmul_desc d = matmul_desc(s);
        if (!cuda)
            return ga_cpu_matmul(&d);
        GA_TRY_STATUS(ga_cuda_matmul_check(&d));
        return ga_cuda_matmul_unfused(device, &d, 0, stream);
    }
    if (op == "matmul_split") {
        /* matmul.cu's split route: the GEMM and its bias into the
         * pre-activation z (kept) or D — cuBLASLt's half, done here by the
         * generic kernel — then D = act(z) */
        ga_matmul_desc d = matmul_desc(s);
        if (!cuda)
            return ga_cpu_matmul(&d);
        GA_TRY_STATUS(ga_cuda_matmul_check(&d));
        ga_matmul_desc z = d;
        z.activation = GA_ACT_NONE;
        if (d.preact.data)
            z.d = d.preact;
        memset(&z.preact, 0, sizeof z.preact);
        GA_TRY_STATUS(ga_cuda_matmul_unfused(device, &z, 0, stream));
        return ga_cuda_matmul_activation(device, &z.d, &d.d, d.batch, d.activation, stream);
    }
    if (op == "conv_fwd") {
        ga_conv_desc d;
        memset(&d, 0, sizeof d);
        d.geom = geometry(s);
        d.x = s.tensor("x");
        d.w = s.tensor("w");
        d.y = s.tensor("y");
        d.bias = s.ptr("bias");
        d.activation = (ga_activation)s.integer("activation");
        d.preact = s.tensor("preact");
        return cuda ? ga_cuda_conv2d_forward_direct(device, &d, stream) : ga_cpu_conv2d_forward(&d);
    }
    if (op == "conv_bwd_data") {
        ga_conv_geometry g = geometry(s);
        ga_tensor dy = s.tensor("dy"), w = s.tensor("w"), dx = s.tensor("dx");
        return cuda ? ga_cuda_conv2d_backward_data_direct(device, &g, &dy, &w, &dx, stream)
                    : ga_cpu_conv2d_backward_data(&g, &dy, &w, &dx);
    }
    if (op == "conv_bwd_filter") {
        ga_conv_geometry g = geometry(s);
        ga_tensor x = s.tensor("x"), dy = s.tensor("dy"), dw = s.tensor("dw");
        return cuda ? ga_cuda_conv2d_backward_filter_direct(device, &g, &x, &dy, &dw, stream)
                    : ga_cpu_conv2d_backward_filter(&g, &x, &dy, &dw);
    }
    if (op == "normalize") {
        ga_normalize_desc d;
        memset(&d, 0, sizeof d);
        d.src = (const uint8_t *)s.ptr("src");
        d.dst = s.ptr("dst");
        d.dtype = s.dtype("dtype");
        d.n = s.integer("n");
        d.h = s.integer("h");
        d.w = s.integer("w");
        d.c = s.integer("c");
        d.nchw = (int)s.integer("nchw");
        d.src_chw = (int)s.integer("src_chw");
        for (int64_t ch = 0; ch < d.c && ch < GA_NORMALIZE_MAX_CHANNELS; ch++) {
            d.scale[ch] = s.real("scale", (size_t)ch);
            d.shift[ch] = s.real("shift", (size_t)ch);
        }
        return cuda ? ga_cuda_normalize_images(device, &d, stream) : ga_cpu_normalize_images(&d);
    }
    if (op == "resize") {
        ga_resize_job job;
        memset(&job, 0, sizeof job);
        job.src = (const uint8_t *)s.ptr("src");
        job.src_h = s.integer("src_h");
        job.src_w = s.integer("src_w");
        job.src_pitch = s.integer("src_pitch");
        job.dst = (uint8_t *)s.ptr("dst");
        ga_image_geometry &g = job.g;
        g.out_h = s.integer("out", 0, 0), g.out_w = s.integer("out", 0, 1);
        g.y0 = s.integer("placed", 0, 0), g.x0 = s.integer("placed", 0, 1);
        g.ny = s.integer("placed", 0, 2), g.nx = s.integer("placed", 0, 3);
        g.flip = (int)s.integer("flip");
        g.ry.origin = s.real("ry", 0), g.ry.scale = s.real("ry", 1);
        g.ry.lo = s.integer("ry_span", 0, 0), g.ry.hi = s.integer("ry_span", 0, 1);
        g.rx.origin = s.real("rx", 0), g.rx.scale = s.real("rx", 1);
        g.rx.lo = s.integer("rx_span", 0, 0), g.rx.hi = s.integer("rx_span", 0, 1);
        if (cuda)
            return ga_cuda_resize_images(device, &job, 1, stream);
        ga_image_workspace *ws = ga_cpu_image_workspace_new();
        ga_status st =
            ga_cpu_resize_image(job.src, job.src_h, job.src_w, job.src_pitch, &g, job.dst, ws);
        ga_cpu_image_workspace_free(ws);
        return st;
    }
    if (op == "logger_update") {
        ga_logger_update u;
        memset(&u, 0, sizeof u);
        u.state = s.ptr("state");
        u.capacity = s.integer("capacity");
        u.max_metrics = (int)s.integer("max_metrics");
        u.n = (int)s.integer("n");
        for (int k = 0; k < u.n && k < GA_LOGGER_MAX_PER_CALL; k++) {
            u.metric[k] = (int)s.integer("metric", 0, (size_t)k);
            u.value[k] = s.ptr("value" + std::to_string(k));
            u.dtype[k] = s.dtype("dtype" + std::to_string(k));
        }
        u.present = (uint64_t)s.integer("present");
        u.step = s.integer("step");
        return cuda ? ga_cuda_logger_update(device, &u, stream) : ga_cpu_logger_update(&u);
    }
    if (op == "logger_reset") {
        void *state = s.ptr("state");
        int max_metrics = (int)s.integer("max_metrics");
        int64_t capacity = s.integer("capacity"), first = s.integer("first_step"),
                nsteps = s.integer("nsteps");
        if (cuda)
            return ga_cuda_logger_reset_window(device, state, max_metrics, capacity, first, nsteps,
                                               stream);
        ga_cpu_logger_reset_window(state, max_metrics, capacity, first, nsteps);
        return ga_ok();
    }
    if (op == "selftest") {
        if (!cuda)
            throw Fail{"selftest runs on the cuda side only"};
        return selftest(s);
    }
    throw Fail{"unknown op " + op};
}

void run_case(const std::string &dir)
{
    Case c = read_case(dir);
    for (const Case::Limit &l : c.limits)
        cudacpu::limit_grid(l.kernel.c_str(), dim3(l.x, l.y, l.z));
    for (int cuda = 1; cuda >= 0; cuda--) {
        if (cuda ? !c.run_cuda : !c.run_cpu)
            continue;
        const char *side = cuda ? "cuda" : "cpu";
        Side s(c);
        std::string status = status_text(run(c.op, s, cuda));
#if !defined(__SANITIZE_ADDRESS__)
        std::string broken = s.guards_broken();
        if (!broken.empty())
            status = "error: " + broken;
#endif
        s.write(side);
        std::ofstream f(dir + "/status." + side);
        f << status << "\n";
    }
    cudacpu::limit_grid(nullptr, dim3());
}

void print_launched(const char *kernel, unsigned long long launches, void *)
{
    printf("launched %s %llu\n", kernel, launches);
}

} // namespace

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        try {
            run_case(argv[i]);
        } catch (const Fail &f) {
            fprintf(stderr, "cudacpu_driver: %s: %s\n", argv[i], f.what.c_str());
            return 2;
        }
    }
    cudacpu::for_each_launched(print_launched, nullptr);
    return 0;
}
