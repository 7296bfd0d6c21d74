/*
 * jpeg.cu — JPEG decoding on the GPU with nvJPEG, for the image loader's
 * decode="gpu".
 *
 * A batch goes through nvjpegDecodeBatched: on the hardware decoder of
 * A100/H100-class GPUs (NVJPEG_BACKEND_HARDWARE) for the files it takes
 * (baseline, single scan, no 4:1:0 or 4:1:1), on the default (hybrid)
 * backend for the rest (progressive files among them).  A batch nvJPEG
 * refuses is decoded again one image at a time, so that the images it
 * cannot decode are named (bad[i]) and the others still come out: the
 * loader raises for them or leaves them out, as on the CPU.
 *
 * nvJPEG allocates its own staging (its default allocators): that memory
 * is the library's, as cuDNN's handles are; the images it writes are in
 * buffers from gpuaccel's device pool.
 *
 * Optional twice over: built when setup.py finds nvjpeg.h (the CUDA
 * toolkit, or PyPI's nvidia-nvjpeg wheel), and libnvjpeg is loaded at the
 * first use rather than linked (torch's wheels do not bring it), so a
 * build with it still imports without it and decodes on the CPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <new>
#include <vector>

#include "common.cuh"

#ifdef GPUACCEL_WITH_NVJPEG

#include <dlfcn.h>
#include <mutex>

#include <nvjpeg.h>

namespace
{

/* libnvjpeg's entry points, typed by nvjpeg.h's own declarations. */
struct NvjpegApi {
    decltype(&nvjpegGetProperty) GetProperty;
    decltype(&nvjpegCreateEx) CreateEx;
    decltype(&nvjpegDestroy) Destroy;
    decltype(&nvjpegJpegStateCreate) JpegStateCreate;
    decltype(&nvjpegJpegStateDestroy) JpegStateDestroy;
    decltype(&nvjpegGetImageInfo) GetImageInfo;
    decltype(&nvjpegDecode) Decode;
    decltype(&nvjpegDecodeBatchedInitialize) DecodeBatchedInitialize;
    decltype(&nvjpegDecodeBatched) DecodeBatched;
    decltype(&nvjpegJpegStreamCreate) JpegStreamCreate;
    decltype(&nvjpegJpegStreamDestroy) JpegStreamDestroy;
    decltype(&nvjpegJpegStreamParse) JpegStreamParse;
    decltype(&nvjpegDecodeBatchedSupported) DecodeBatchedSupported;
};

#define GA_STR2(x) #x
#define GA_STR(x) GA_STR2(x)

/* Loaded once: the wheel's copy (gpuaccel/_libs.py preloads it, and the
 * extension's run path names the wheels' folder), else the system's.
 * NULL when there is none. */
const NvjpegApi *nvjpeg()
{
    static NvjpegApi api;
    static bool loaded = false;
    static std::once_flag once;
    std::call_once(once, [] {
        void *lib = dlopen("libnvjpeg.so." GA_STR(NVJPEG_VER_MAJOR), RTLD_NOW | RTLD_GLOBAL);
        if (!lib)
            return;
        bool all = true;
#define GA_NVJPEG_SYMBOL(name) \
    all = all && (api.name = (decltype(api.name))dlsym(lib, "nvjpeg" #name)) != nullptr
        GA_NVJPEG_SYMBOL(GetProperty);
        GA_NVJPEG_SYMBOL(CreateEx);
        GA_NVJPEG_SYMBOL(Destroy);
        GA_NVJPEG_SYMBOL(JpegStateCreate);
        GA_NVJPEG_SYMBOL(JpegStateDestroy);
        GA_NVJPEG_SYMBOL(GetImageInfo);
        GA_NVJPEG_SYMBOL(Decode);
        GA_NVJPEG_SYMBOL(DecodeBatchedInitialize);
        GA_NVJPEG_SYMBOL(DecodeBatched);
        GA_NVJPEG_SYMBOL(JpegStreamCreate);
        GA_NVJPEG_SYMBOL(JpegStreamDestroy);
        GA_NVJPEG_SYMBOL(JpegStreamParse);
        GA_NVJPEG_SYMBOL(DecodeBatchedSupported);
#undef GA_NVJPEG_SYMBOL
        loaded = all;
    });
    return loaded ? &api : nullptr;
}

const char *nvjpeg_status_name(nvjpegStatus_t status)
{
    switch (status) {
    case NVJPEG_STATUS_SUCCESS: return "NVJPEG_STATUS_SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG: return "NVJPEG_STATUS_BAD_JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "NVJPEG_STATUS_ARCH_MISMATCH";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
        return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
    default: return "NVJPEG_STATUS_UNKNOWN";
    }
}

/* A status that says the data, not the device, is at fault. */
bool about_the_file(nvjpegStatus_t status)
{
    return status == NVJPEG_STATUS_BAD_JPEG || status == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
           status == NVJPEG_STATUS_INCOMPLETE_BITSTREAM ||
           status == NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
}

ga_status nvjpeg_error(nvjpegStatus_t status, const char *call, const char *file, int line)
{
    if (status == NVJPEG_STATUS_SUCCESS)
        return ga_ok();
    ga_error kind = status == NVJPEG_STATUS_ALLOCATOR_FAILURE ? GA_ERR_OUT_OF_MEMORY : GA_ERR_CUDA;
    return ga_status_make(kind, (int)status, nvjpeg_status_name(status), "nvJPEG call failed", call,
                          file, line);
}

#define GA_NVJPEG_TRY(call)                                             \
    do {                                                                \
        nvjpegStatus_t ga_nvjpeg_ = (call);                             \
        if (ga_nvjpeg_ != NVJPEG_STATUS_SUCCESS)                        \
            return nvjpeg_error(ga_nvjpeg_, #call, __FILE__, __LINE__); \
    } while (0)

/* One backend: its handle, its decode state and the batch size the state
 * was initialized for. */
struct Backend {
    nvjpegHandle_t handle = nullptr;
    nvjpegJpegState_t state = nullptr;
    int batch = -1;
};

} // namespace

struct ga_jpeg_decoder {
    int device;
    Backend hardware; /* handle null: no hardware decoder */
    Backend hybrid;
    nvjpegJpegStream_t parsed; /* for asking the hardware backend */
};

namespace
{

ga_status open_backend(Backend &b, nvjpegBackend_t kind)
{
    GA_NVJPEG_TRY(nvjpeg()->CreateEx(kind, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &b.handle));
    GA_NVJPEG_TRY(nvjpeg()->JpegStateCreate(b.handle, &b.state));
    return ga_ok();
}

void close_backend(Backend &b)
{
    if (b.state)
        nvjpeg()->JpegStateDestroy(b.state);
    if (b.handle)
        nvjpeg()->Destroy(b.handle);
    b = Backend();
}

nvjpegImage_t rgb_destination(uint8_t *dst, int64_t width)
{
    nvjpegImage_t image;
    memset(&image, 0, sizeof image);
    image.channel[0] = dst;
    image.pitch[0] = (size_t)width * 3;
    return image;
}

/* The images `which` of the call through one backend, batched; on a
 * refusal that is about the data, one by one, marking those that fail. */
ga_status decode_with(Backend &b, const std::vector<int> &which, const uint8_t *const *data,
                      const size_t *sizes, uint8_t *const *dst, const int64_t *widths, int *bad,
                      cudaStream_t stream)
{
    if (which.empty())
        return ga_ok();
    int n = (int)which.size();
    std::vector<const unsigned char *> in(n);
    std::vector<size_t> lengths(n);
    std::vector<nvjpegImage_t> out(n);
    for (int k = 0; k < n; k++) {
        in[k] = data[which[k]];
        lengths[k] = sizes[which[k]];
        out[k] = rgb_destination(dst[which[k]], widths[which[k]]);
    }
    if (b.batch != n) {
        GA_NVJPEG_TRY(
            nvjpeg()->DecodeBatchedInitialize(b.handle, b.state, n, 1, NVJPEG_OUTPUT_RGBI));
        b.batch = n;
    }
    nvjpegStatus_t status =
        nvjpeg()->DecodeBatched(b.handle, b.state, in.data(), lengths.data(), out.data(), stream);
    if (status == NVJPEG_STATUS_SUCCESS)
        return ga_ok();
    if (!about_the_file(status))
        return nvjpeg_error(status, "nvjpegDecodeBatched", __FILE__, __LINE__);
    b.batch = -1; /* a failed batch leaves the state to be initialized again */
    for (int k = 0; k < n; k++) {
        nvjpegStatus_t one = nvjpeg()->Decode(b.handle, b.state, in[k], lengths[k],
                                              NVJPEG_OUTPUT_RGBI, &out[k], stream);
        if (one == NVJPEG_STATUS_SUCCESS)
            continue;
        if (!about_the_file(one))
            return nvjpeg_error(one, "nvjpegDecode", __FILE__, __LINE__);
        bad[which[k]] = 1;
    }
    return ga_ok();
}

} // namespace

extern "C" int ga_cuda_nvjpeg_available(void)
{
    return nvjpeg() != nullptr;
}

extern "C" const char *ga_cuda_nvjpeg_version(void)
{
    if (!nvjpeg())
        return "";
    static char text[32];
    int major = 0, minor = 0, patch = 0;
    if (nvjpeg()->GetProperty(MAJOR_VERSION, &major) != NVJPEG_STATUS_SUCCESS ||
        nvjpeg()->GetProperty(MINOR_VERSION, &minor) != NVJPEG_STATUS_SUCCESS ||
        nvjpeg()->GetProperty(PATCH_LEVEL, &patch) != NVJPEG_STATUS_SUCCESS)
        return "unknown";
    snprintf(text, sizeof text, "%d.%d.%d", major, minor, patch);
    return text;
}

extern "C" ga_status ga_cuda_jpeg_decoder_create(int device, ga_jpeg_decoder **out, int *hardware)
{
    if (!nvjpeg())
        return GA_STATUS(
            GA_ERR_NOT_SUPPORTED,
            "libnvjpeg.so." GA_STR(
                NVJPEG_VER_MAJOR) " could not be loaded: pip install "
                                  "nvidia-nvjpeg, or decode on the CPU (decode=\"cpu\")");
    GA_WITH_DEVICE(device);
    ga_jpeg_decoder *d = new (std::nothrow) ga_jpeg_decoder();
    if (!d)
        return GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "no memory for a JPEG decoder");
    d->device = device;
    /* the hardware decoder where the GPU has one: the call says it has not */
    if (open_backend(d->hardware, NVJPEG_BACKEND_HARDWARE).error)
        close_backend(d->hardware);
    ga_status status = open_backend(d->hybrid, NVJPEG_BACKEND_DEFAULT);
    if (!status.error && d->hardware.handle) {
        nvjpegStatus_t s = nvjpeg()->JpegStreamCreate(d->hardware.handle, &d->parsed);
        status = nvjpeg_error(s, "nvjpegJpegStreamCreate", __FILE__, __LINE__);
    }
    if (status.error) {
        ga_cuda_jpeg_decoder_destroy(d);
        return status;
    }
    *hardware = d->hardware.handle != nullptr;
    *out = d;
    return ga_ok();
}

extern "C" void ga_cuda_jpeg_decoder_destroy(ga_jpeg_decoder *d)
{
    if (!d)
        return;
    GaDeviceGuard guard(d->device);
    if (d->parsed)
        nvjpeg()->JpegStreamDestroy(d->parsed);
    close_backend(d->hardware);
    close_backend(d->hybrid);
    delete d;
}

extern "C" ga_status ga_cuda_jpeg_image_size(ga_jpeg_decoder *d, const uint8_t *data, size_t size,
                                             int64_t *width, int64_t *height)
{
    int components = 0;
    nvjpegChromaSubsampling_t subsampling;
    int widths[NVJPEG_MAX_COMPONENT], heights[NVJPEG_MAX_COMPONENT];
    GA_NVJPEG_TRY(nvjpeg()->GetImageInfo(d->hybrid.handle, data, size, &components, &subsampling,
                                         widths, heights));
    *width = widths[0];
    *height = heights[0];
    return ga_ok();
}

extern "C" ga_status ga_cuda_decode_jpegs(ga_jpeg_decoder *d, int n, const uint8_t *const *data,
                                          const size_t *sizes, uint8_t *const *dst,
                                          const int64_t *widths, const int64_t *heights, int *bad,
                                          ga_stream stream)
{
    GA_NVTX_RANGE("decode_jpegs");
    GA_WITH_DEVICE(d->device);
    (void)heights; /* the destinations are sized for them by the caller */
    std::vector<int> on_hardware, on_hybrid;
    for (int i = 0; i < n; i++) {
        bad[i] = 0;
        int unsupported = 1;
        if (d->hardware.handle &&
            nvjpeg()->JpegStreamParse(d->hardware.handle, data[i], sizes[i], 0, 0, d->parsed) ==
                NVJPEG_STATUS_SUCCESS &&
            nvjpeg()->DecodeBatchedSupported(d->hardware.handle, d->parsed, &unsupported) ==
                NVJPEG_STATUS_SUCCESS &&
            unsupported == 0)
            on_hardware.push_back(i);
        else
            on_hybrid.push_back(i);
    }
    cudaStream_t s = ga_cu_stream(stream);
    GA_TRY_STATUS(decode_with(d->hardware, on_hardware, data, sizes, dst, widths, bad, s));
    GA_TRY_STATUS(decode_with(d->hybrid, on_hybrid, data, sizes, dst, widths, bad, s));
    return ga_ok();
}

#else /* this CUDA build has no nvJPEG */

#define GA_NVJPEG_INSTALL                                                                       \
    "this gpuaccel was built without nvJPEG: pip install nvidia-nvjpeg (or use a CUDA toolkit " \
    "that has it) and reinstall gpuaccel, or decode on the CPU (decode=\"cpu\")"

extern "C" int ga_cuda_nvjpeg_available(void)
{
    return 0;
}

extern "C" const char *ga_cuda_nvjpeg_version(void)
{
    return "";
}

extern "C" ga_status ga_cuda_jpeg_decoder_create(int device, ga_jpeg_decoder **out, int *hardware)
{
    (void)device, (void)out, (void)hardware;
    return GA_STATUS(GA_ERR_NOT_SUPPORTED, GA_NVJPEG_INSTALL);
}

extern "C" void ga_cuda_jpeg_decoder_destroy(ga_jpeg_decoder *decoder)
{
    (void)decoder;
}

extern "C" ga_status ga_cuda_jpeg_image_size(ga_jpeg_decoder *decoder, const uint8_t *data,
                                             size_t size, int64_t *width, int64_t *height)
{
    (void)decoder, (void)data, (void)size, (void)width, (void)height;
    return GA_STATUS(GA_ERR_NOT_SUPPORTED, GA_NVJPEG_INSTALL);
}

extern "C" ga_status ga_cuda_decode_jpegs(ga_jpeg_decoder *decoder, int n,
                                          const uint8_t *const *data, const size_t *sizes,
                                          uint8_t *const *dst, const int64_t *widths,
                                          const int64_t *heights, int *bad, ga_stream stream)
{
    (void)decoder, (void)n, (void)data, (void)sizes, (void)dst, (void)widths, (void)heights;
    (void)bad, (void)stream;
    return GA_STATUS(GA_ERR_NOT_SUPPORTED, GA_NVJPEG_INSTALL);
}

#endif
