/*
 * matmul_unfused.cu — the unfused paths of ga_cuda_matmul (matmul.cu): a
 * tiled GEMM for any strides, any float dtype and a K of zero, and the
 * epilogue applied to D after a plain GEMM by epilogue.cu's kernels (bias +
 * activation, activation gradient + column sums, row sums of A); and the
 * activation after the split route's GEMM + bias.  No cuBLASLt here (see
 * fallback.h).
 */
#include <stdint.h>
#include <string.h>

#include "../activation.h"
#include "../kernels.h"
#include "common.cuh"
#include "elem.cuh"
#include "fallback.h"

namespace
{

constexpr int kTile = 16;

/* ------------------------------------------------------- generic GEMM */

struct GenericArgs {
    int64_t batch, M, N, K;
    const char *a, *b;
    char *d;
    ga_dtype a_dtype, b_dtype, d_dtype;
    int64_t a_rs, a_cs, a_bs, b_rs, b_cs, b_bs, d_rs, d_cs, d_bs; /* elements */
};

/* One 16 x 16 tile of D per block and pass, K walked in 16-wide slabs
 * through shared memory.  Every stride may be anything (zero, negative,
 * unaligned): elements go through elem.cuh's loads. */
template <typename Acc> __global__ void gemm_generic_kernel(GenericArgs g)
{
    __shared__ Acc as[kTile][kTile + 1], bs[kTile][kTile + 1];
    size_t ai = ga_dtype_itemsize(g.a_dtype), bi = ga_dtype_itemsize(g.b_dtype),
           di = ga_dtype_itemsize(g.d_dtype);
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t bt = blockIdx.z; bt < g.batch; bt += gridDim.z)
        for (int64_t rt = blockIdx.y; rt * kTile < g.M; rt += gridDim.y) {
            int64_t row = rt * kTile + ty, col = (int64_t)blockIdx.x * kTile + tx;
            Acc acc = 0;
            for (int64_t k0 = 0; k0 < g.K; k0 += kTile) {
                int64_t ka = k0 + tx, kb = k0 + ty;
                as[ty][tx] = row < g.M && ka < g.K
                                 ? (Acc)load_f(g.a_dtype,
                                               g.a + (bt * g.a_bs + row * g.a_rs + ka * g.a_cs) *
                                                         (int64_t)ai,
                                               false)
                                 : (Acc)0;
                bs[ty][tx] = kb < g.K && col < g.N
                                 ? (Acc)load_f(g.b_dtype,
                                               g.b + (bt * g.b_bs + kb * g.b_rs + col * g.b_cs) *
                                                         (int64_t)bi,
                                               false)
                                 : (Acc)0;
                __syncthreads();
#pragma unroll
                for (int kk = 0; kk < kTile; kk++)
                    acc += as[ty][kk] * bs[kk][tx];
                __syncthreads();
            }
            if (row < g.M && col < g.N)
                store_bits(g.d + (bt * g.d_bs + row * g.d_rs + col * g.d_cs) * (int64_t)di,
                           encode_f(g.d_dtype, (double)acc), di, false);
        }
}

ga_status run_generic(const ga_matmul_desc *desc, cudaStream_t s)
{
    const ga_matrix &A = desc->a, &B = desc->b, &D = desc->d;
    GenericArgs g = {
        desc->batch,          D.rows,         D.cols,         A.cols,        (const char *)A.data,
        (const char *)B.data, (char *)D.data, A.dtype,        B.dtype,       D.dtype,
        A.row_stride,         A.col_stride,   A.batch_stride, B.row_stride,  B.col_stride,
        B.batch_stride,       D.row_stride,   D.col_stride,   D.batch_stride};
    int64_t col_tiles = (g.N + kTile - 1) / kTile, row_tiles = (g.M + kTile - 1) / kTile;
    if (col_tiles > INT32_MAX)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: too many columns for the generic kernel");
    dim3 grid((unsigned)col_tiles, (unsigned)(row_tiles < 65535 ? row_tiles : 65535),
              (unsigned)(g.batch < 65535 ? g.batch : 65535));
    dim3 block(kTile, kTile);
    bool f64 = A.dtype == GA_FLOAT64 || B.dtype == GA_FLOAT64 || D.dtype == GA_FLOAT64;
    if (f64)
        GA_LAUNCH(grid, block, 0, s, gemm_generic_kernel<double>)(g);
    else
        GA_LAUNCH(grid, block, 0, s, gemm_generic_kernel<float>)(g);
    GA_CUDA_LAUNCH_CHECK("gemm_generic_kernel");
    return ga_ok();
}

/* ------------------------------------------------------- the epilogue */

/* A batch of matrices as a 3-D strided tensor (batch, rows, cols), strides
 * in bytes, for epilogue.cu's kernels. */
ga_tensor as_tensor(const ga_matrix &m, int64_t batch)
{
    ga_tensor t;
    memset(&t, 0, sizeof t);
    int64_t item = (int64_t)ga_dtype_itemsize(m.dtype);
    t.data = m.data;
    t.dtype = m.dtype;
    t.ndim = 3;
    t.shape[0] = batch;
    t.shape[1] = m.rows;
    t.shape[2] = m.cols;
    t.strides[0] = m.batch_stride * item;
    t.strides[1] = m.row_stride * item;
    t.strides[2] = m.col_stride * item;
    return t;
}

/* a_row_sums[i] = sum over k of A[i, k] (batch 1): it does not depend on B
 * or D, so it is computed even when D is empty. */
ga_status row_sums_of_a(int device, const ga_matmul_desc *desc, ga_stream stream)
{
    ga_act_backward_desc rs;
    memset(&rs, 0, sizeof rs);
    rs.grad_y = as_tensor(desc->a, 1);
    rs.activation = GA_ACT_NONE;
    rs.dz.dtype = desc->a.dtype;
    rs.bias_grad = desc->a_row_sums;
    rs.bias_grad_dtype = desc->a_row_sums_dtype;
    rs.channel_dim = 1;
    return ga_cuda_activation_backward(device, &rs, stream);
}

/* Everything the descriptor asks of the epilogue, applied to D in place
 * after a plain GEMM (paths 2 and 3). */
ga_status run_epilogue(int device, const ga_matmul_desc *desc, ga_stream stream)
{
    ga_tensor d = as_tensor(desc->d, desc->batch);
    if (desc->dact != GA_ACT_NONE || desc->col_sums) {
        ga_act_backward_desc bw;
        memset(&bw, 0, sizeof bw);
        bw.grad_y = d;
        bw.activation = desc->dact;
        if (desc->dact != GA_ACT_NONE) {
            bw.aux = as_tensor(desc->dact_aux, desc->batch);
            bw.dz = d;
        } else {
            bw.dz.dtype = d.dtype; /* only the sums: no dz written */
        }
        bw.bias_grad = desc->col_sums;
        bw.bias_grad_dtype = desc->col_sums_dtype;
        bw.channel_dim = 2;
        GA_TRY_STATUS(ga_cuda_activation_backward(device, &bw, stream));
    }
    if (desc->bias || desc->activation != GA_ACT_NONE || desc->preact.data) {
        ga_bias_act_desc fw;
        memset(&fw, 0, sizeof fw);
        fw.x = d;
        fw.y = d;
        if (desc->preact.data)
            fw.preact = as_tensor(desc->preact, desc->batch);
        fw.bias = desc->bias;
        fw.bias_dtype = desc->bias_dtype;
        fw.channel_dim = 2;
        fw.activation = desc->activation;
        GA_TRY_STATUS(ga_cuda_bias_activation(device, &fw, stream));
    }
    if (desc->a_row_sums)
        GA_TRY_STATUS(row_sums_of_a(device, desc, stream));
    return ga_ok();
}

/* ------------------------------------------------------------- checks */

ga_status validate(const ga_matmul_desc *d)
{
    const ga_matrix &A = d->a, &B = d->b, &D = d->d;
    int64_t M = A.rows, K = A.cols, N = B.cols;
    if (d->batch < 0 || M < 0 || K < 0 || N < 0)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: negative size");
    if (!ga_dtype_is_float(A.dtype) || B.dtype != A.dtype)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: A and B must share one float dtype");
    if (!(D.dtype == A.dtype ||
          (D.dtype == GA_FLOAT32 && (A.dtype == GA_FLOAT16 || A.dtype == GA_BFLOAT16))))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: D must be A's dtype, or float32 for "
                                               "16-bit inputs");
    if (B.rows != K || D.rows != M || D.cols != N)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: shapes do not match");
    bool empty = d->batch == 0 || M == 0 || N == 0;
    if (!empty && (!D.data || (K > 0 && (!A.data || !B.data))))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a matrix has no data");
    if (d->bias && !(d->bias_dtype == A.dtype || d->bias_dtype == D.dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: bias must have A's or D's dtype");
    if (d->preact.data &&
        (d->preact.rows != M || d->preact.cols != N || d->preact.dtype != D.dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: preact must be M x N of D's dtype");
    if (!ga_activation_is_valid(d->activation) || !ga_activation_is_valid(d->dact))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: unknown activation");
    if (d->dact != GA_ACT_NONE) {
        if (d->bias || d->activation != GA_ACT_NONE || d->preact.data)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a backward epilogue excludes the "
                                                   "forward one");
        if (d->dact_aux.rows != M || d->dact_aux.cols != N ||
            !ga_dtype_is_float(d->dact_aux.dtype) || (!empty && !d->dact_aux.data))
            return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: dact_aux must be M x N");
    }
    if (d->col_sums && !ga_dtype_is_float(d->col_sums_dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: col_sums must have a float dtype");
    if (d->col_sums && (d->bias || d->activation != GA_ACT_NONE || d->preact.data))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: col_sums excludes a forward epilogue");
    if (d->a_row_sums) {
        if (d->batch != 1 || d->bias || d->activation != GA_ACT_NONE || d->preact.data ||
            d->dact != GA_ACT_NONE || d->col_sums)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a_row_sums only with no other "
                                                   "epilogue and batch 1");
        if (!ga_dtype_is_float(d->a_row_sums_dtype))
            return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a_row_sums must have a float dtype");
    }
    return ga_ok();
}

/* Zeros a float vector (the sums over an empty matrix). */
ga_status zero_vector(int device, void *data, ga_dtype dtype, int64_t n, cudaStream_t s)
{
    ga_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = 1;
    t.shape[0] = n;
    t.strides[0] = (int64_t)ga_dtype_itemsize(dtype);
    ga_scalar zero = {0, 0, 0.0};
    return ga_cuda_fill(device, &t, zero, (ga_stream)s);
}

} // namespace

extern "C" ga_status ga_cuda_matmul_check(const ga_matmul_desc *desc)
{
    return validate(desc);
}

extern "C" ga_status ga_cuda_matmul_activation(int device, const ga_matrix *z, const ga_matrix *d,
                                               int64_t batch, ga_activation act, ga_stream stream)
{
    ga_bias_act_desc fw;
    memset(&fw, 0, sizeof fw);
    fw.x = as_tensor(*z, batch);
    fw.y = as_tensor(*d, batch);
    fw.bias_dtype = d->dtype;
    fw.channel_dim = 2;
    fw.activation = act;
    GA_WITH_DEVICE(device);
    return ga_cuda_bias_activation(device, &fw, stream);
}

extern "C" ga_status ga_cuda_matmul_unfused(int device, const ga_matmul_desc *desc, int gemm_done,
                                            ga_stream stream)
{
    const ga_matrix &A = desc->a, &D = desc->d;
    if (desc->batch == 0 || D.rows == 0 || D.cols == 0) {
        /* nothing to compute; an empty a_row_sums/col_sums still has length */
        if (desc->a_row_sums && A.rows > 0) {
            GA_WITH_DEVICE(device);
            if (A.cols > 0) /* N == 0: the sums over A's rows are still due */
                return row_sums_of_a(device, desc, stream);
            return zero_vector(device, desc->a_row_sums, desc->a_row_sums_dtype, A.rows,
                               ga_cu_stream(stream));
        }
        if (desc->col_sums && D.cols > 0) {
            GA_WITH_DEVICE(device);
            return zero_vector(device, desc->col_sums, desc->col_sums_dtype, D.cols,
                               ga_cu_stream(stream));
        }
        return ga_ok();
    }
    GA_WITH_DEVICE(device);
    if (!gemm_done)
        GA_TRY_STATUS(run_generic(desc, ga_cu_stream(stream)));
    return run_epilogue(device, desc, stream);
}
