/*
 * activation.h — the activations and their derivatives, shared by the CPU
 * and CUDA backends (one source, so both compute the same function).
 *
 * Each is torch's own definition, written in the order of operations of
 * torch's kernels (ATen's CPU and CUDA activation kernels), so that a
 * float64 result agrees with torch's to a few ulps and the derivative at a
 * breakpoint is the one torch's autograd takes:
 *   relu       max(z, 0); relu'(0) = 0
 *   gelu       exact GELU, nn.GELU():  z/2 (1 + erf(z / sqrt 2));
 *              gelu' = Phi(z) + z phi(z), phi(z) = exp(-z^2/2) / sqrt(2 pi)
 *   gelu_tanh  the tanh approximation, F.gelu(z, approximate="tanh") and
 *              cuBLASLt's GELU epilogues:
 *              z/2 (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))
 *   silu       z / (1 + exp(-z)); silu' = s (1 + z (1 - s)), s = sigmoid(z)
 *   hardswish  z min(max(z + 3, 0), 6) / 6; hardswish' = 0 for z <= -3,
 *              z/3 + 1/2 for -3 < z < 3, 1 for z >= 3 (torch's
 *              hardswish_backward: 0 at -3 and 1 at 3)
 *   sigmoid    1 / (1 + exp(-z)); sigmoid' = (1 - s) s
 * The derivative reads the pre-activation z, except relu's, which may read
 * y = relu(z) as well (its sign is z's; kernels.h's
 * ga_activation_grad_reads_output).
 */
#ifndef GPUACCEL_ACTIVATION_H
#define GPUACCEL_ACTIVATION_H

#include <math.h>

#include "kernels.h"

/* A few comparisons per element (none, relu, hardswish) rather than a
 * transcendental function: the CPU kernels' tasks are sized by it. */
GA_HD int ga_activation_is_cheap(ga_activation act)
{
    return act == GA_ACT_NONE || act == GA_ACT_RELU || act == GA_ACT_HARDSWISH;
}

#define GA_GELU_SQRT_2_OVER_PI 0.7978845608028654 /* M_SQRT2 * M_2_SQRTPI * 0.5 */
#define GA_GELU_COEFF 0.044715
#define GA_SQRT1_2 0.7071067811865476      /* M_SQRT1_2 */
#define GA_INV_SQRT_2PI 0.3989422804014327 /* M_2_SQRTPI * M_SQRT1_2 * 0.5 */

/* ------------------------------------------------------------ gelu (erf) */

GA_HD float ga_gelu_erf_f(float z)
{
    return z * 0.5f * (1.0f + erff(z * (float)GA_SQRT1_2));
}

GA_HD double ga_gelu_erf_d(double z)
{
    return z * 0.5 * (1.0 + erf(z * GA_SQRT1_2));
}

GA_HD float ga_gelu_erf_grad_f(float z)
{
    float cdf = 0.5f * (1.0f + erff(z * (float)GA_SQRT1_2));
    float pdf = (float)GA_INV_SQRT_2PI * expf(z * z * -0.5f);
    return cdf + z * pdf;
}

GA_HD double ga_gelu_erf_grad_d(double z)
{
    double cdf = 0.5 * (1.0 + erf(z * GA_SQRT1_2));
    double pdf = GA_INV_SQRT_2PI * exp(z * z * -0.5);
    return cdf + z * pdf;
}

/* ----------------------------------------------------------- gelu (tanh) */

GA_HD float ga_gelu_tanh_f(float z)
{
    float inner = (float)GA_GELU_SQRT_2_OVER_PI * (z + (float)GA_GELU_COEFF * z * z * z);
    return 0.5f * z * (1.0f + tanhf(inner));
}

GA_HD double ga_gelu_tanh_d(double z)
{
    double inner = GA_GELU_SQRT_2_OVER_PI * (z + GA_GELU_COEFF * z * z * z);
    return 0.5 * z * (1.0 + tanh(inner));
}

GA_HD float ga_gelu_tanh_grad_f(float z)
{
    float inner = (float)GA_GELU_SQRT_2_OVER_PI * (z + (float)GA_GELU_COEFF * z * z * z);
    float t = tanhf(inner);
    float dinner = (float)GA_GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * (float)GA_GELU_COEFF * z * z);
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * dinner;
}

GA_HD double ga_gelu_tanh_grad_d(double z)
{
    double inner = GA_GELU_SQRT_2_OVER_PI * (z + GA_GELU_COEFF * z * z * z);
    double t = tanh(inner);
    double dinner = GA_GELU_SQRT_2_OVER_PI * (1.0 + 3.0 * GA_GELU_COEFF * z * z);
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * dinner;
}

/* ------------------------------------------------------ sigmoid and silu */

GA_HD float ga_sigmoid_f(float z)
{
    return 1.0f / (1.0f + expf(-z));
}

GA_HD double ga_sigmoid_d(double z)
{
    return 1.0 / (1.0 + exp(-z));
}

GA_HD float ga_silu_f(float z)
{
    return z / (1.0f + expf(-z));
}

GA_HD double ga_silu_d(double z)
{
    return z / (1.0 + exp(-z));
}

GA_HD float ga_silu_grad_f(float z)
{
    float s = ga_sigmoid_f(z);
    return s * (1.0f + z * (1.0f - s));
}

GA_HD double ga_silu_grad_d(double z)
{
    double s = ga_sigmoid_d(z);
    return s * (1.0 + z * (1.0 - s));
}

/* ------------------------------------------------------------- hardswish */

GA_HD float ga_hardswish_f(float z)
{
    return z * fminf(fmaxf(z + 3.0f, 0.0f), 6.0f) / 6.0f;
}

GA_HD double ga_hardswish_d(double z)
{
    return z * fmin(fmax(z + 3.0, 0.0), 6.0) / 6.0;
}

GA_HD float ga_hardswish_grad_f(float z)
{
    return z <= -3.0f ? 0.0f : z < 3.0f ? z / 3.0f + 0.5f : 1.0f;
}

GA_HD double ga_hardswish_grad_d(double z)
{
    return z <= -3.0 ? 0.0 : z < 3.0 ? z / 3.0 + 0.5 : 1.0;
}

/* ------------------------------------------------------------ dispatch */

GA_HD float ga_activate_f(ga_activation act, float z)
{
    switch (act) {
    case GA_ACT_RELU: return z > 0.0f ? z : 0.0f;
    case GA_ACT_GELU: return ga_gelu_erf_f(z);
    case GA_ACT_GELU_TANH: return ga_gelu_tanh_f(z);
    case GA_ACT_SILU: return ga_silu_f(z);
    case GA_ACT_HARDSWISH: return ga_hardswish_f(z);
    case GA_ACT_SIGMOID: return ga_sigmoid_f(z);
    default: return z;
    }
}

GA_HD double ga_activate_d(ga_activation act, double z)
{
    switch (act) {
    case GA_ACT_RELU: return z > 0.0 ? z : 0.0;
    case GA_ACT_GELU: return ga_gelu_erf_d(z);
    case GA_ACT_GELU_TANH: return ga_gelu_tanh_d(z);
    case GA_ACT_SILU: return ga_silu_d(z);
    case GA_ACT_HARDSWISH: return ga_hardswish_d(z);
    case GA_ACT_SIGMOID: return ga_sigmoid_d(z);
    default: return z;
    }
}

/* act'(aux): aux is z (for relu z or relu(z): both are > 0 exactly when
 * z > 0, and the derivative at 0 is taken as 0, as torch does). */
GA_HD float ga_activation_grad_f(ga_activation act, float aux)
{
    switch (act) {
    case GA_ACT_RELU: return aux > 0.0f ? 1.0f : 0.0f;
    case GA_ACT_GELU: return ga_gelu_erf_grad_f(aux);
    case GA_ACT_GELU_TANH: return ga_gelu_tanh_grad_f(aux);
    case GA_ACT_SILU: return ga_silu_grad_f(aux);
    case GA_ACT_HARDSWISH: return ga_hardswish_grad_f(aux);
    case GA_ACT_SIGMOID: {
        float s = ga_sigmoid_f(aux);
        return (1.0f - s) * s;
    }
    default: return 1.0f;
    }
}

GA_HD double ga_activation_grad_d(ga_activation act, double aux)
{
    switch (act) {
    case GA_ACT_RELU: return aux > 0.0 ? 1.0 : 0.0;
    case GA_ACT_GELU: return ga_gelu_erf_grad_d(aux);
    case GA_ACT_GELU_TANH: return ga_gelu_tanh_grad_d(aux);
    case GA_ACT_SILU: return ga_silu_grad_d(aux);
    case GA_ACT_HARDSWISH: return ga_hardswish_grad_d(aux);
    case GA_ACT_SIGMOID: {
        double s = ga_sigmoid_d(aux);
        return (1.0 - s) * s;
    }
    default: return 1.0;
    }
}

#endif
