/*
 * activation.h — the activations and their derivatives, shared by the CPU
 * and CUDA backends (one source, so both compute the same function).
 *
 * gelu is the tanh approximation, as cuBLASLt's GELU epilogues compute it
 * and as torch's F.gelu(x, approximate="tanh"):
 *   gelu(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))
 */
#ifndef GPUACCEL_ACTIVATION_H
#define GPUACCEL_ACTIVATION_H

#include <math.h>

#include "kernels.h"

GA_HD int ga_activation_is_valid(ga_activation act)
{
    return act == GA_ACT_NONE || act == GA_ACT_RELU || act == GA_ACT_GELU;
}

#define GA_GELU_SQRT_2_OVER_PI 0.7978845608028654
#define GA_GELU_COEFF 0.044715

GA_HD float ga_gelu_f(float z)
{
    float inner = (float)GA_GELU_SQRT_2_OVER_PI * (z + (float)GA_GELU_COEFF * z * z * z);
    return 0.5f * z * (1.0f + tanhf(inner));
}

GA_HD double ga_gelu_d(double z)
{
    double inner = GA_GELU_SQRT_2_OVER_PI * (z + GA_GELU_COEFF * z * z * z);
    return 0.5 * z * (1.0 + tanh(inner));
}

/* d gelu / dz */
GA_HD float ga_gelu_grad_f(float z)
{
    float inner = (float)GA_GELU_SQRT_2_OVER_PI * (z + (float)GA_GELU_COEFF * z * z * z);
    float t = tanhf(inner);
    float dinner = (float)GA_GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * (float)GA_GELU_COEFF * z * z);
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * dinner;
}

GA_HD double ga_gelu_grad_d(double z)
{
    double inner = GA_GELU_SQRT_2_OVER_PI * (z + GA_GELU_COEFF * z * z * z);
    double t = tanh(inner);
    double dinner = GA_GELU_SQRT_2_OVER_PI * (1.0 + 3.0 * GA_GELU_COEFF * z * z);
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * dinner;
}

GA_HD float ga_activate_f(ga_activation act, float z)
{
    switch (act) {
    case GA_ACT_RELU: return z > 0.0f ? z : 0.0f;
    case GA_ACT_GELU: return ga_gelu_f(z);
    default: return z;
    }
}

GA_HD double ga_activate_d(ga_activation act, double z)
{
    switch (act) {
    case GA_ACT_RELU: return z > 0.0 ? z : 0.0;
    case GA_ACT_GELU: return ga_gelu_d(z);
    default: return z;
    }
}

/* act'(aux); for relu aux may be z or relu(z): both are > 0 exactly when
 * z > 0 (the derivative at 0 is taken as 0, as torch does). */
GA_HD float ga_activation_grad_f(ga_activation act, float aux)
{
    switch (act) {
    case GA_ACT_RELU: return aux > 0.0f ? 1.0f : 0.0f;
    case GA_ACT_GELU: return ga_gelu_grad_f(aux);
    default: return 1.0f;
    }
}

GA_HD double ga_activation_grad_d(ga_activation act, double aux)
{
    switch (act) {
    case GA_ACT_RELU: return aux > 0.0 ? 1.0 : 0.0;
    case GA_ACT_GELU: return ga_gelu_grad_d(aux);
    default: return 1.0;
    }
}

#endif
