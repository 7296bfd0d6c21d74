/*
 * dlpack_abi.h — the DLPack ABI (dmlc/dlpack, version 1.3), written from the
 * specification: the structs and constants gpuaccel exchanges, and the C
 * exchange API (`__dlpack_c_exchange_api__`), nothing more.
 */
#ifndef GPUACCEL_DLPACK_ABI_H
#define GPUACCEL_DLPACK_ABI_H

#include <stdint.h>

#define DLPACK_MAJOR_VERSION 1
/* what gpuaccel's managed tensors say they follow: nothing they carry is
 * newer than 1.1 */
#define DLPACK_MINOR_VERSION 1

/* DLManagedTensorVersioned.flags */
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17,
} DLDeviceType;

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0U,
    kDLUInt = 1U,
    kDLFloat = 2U,
    kDLOpaqueHandle = 3U,
    kDLBfloat = 4U,
    kDLComplex = 5U,
    kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} DLTensor;

/* Legacy (pre-1.0) managed tensor: capsule name "dltensor". */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* Versioned managed tensor: capsule name "dltensor_versioned". */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* ---- the C exchange API (DLPack 1.3): a table of C functions that a
 * tensor type publishes as a capsule named "dlpack_exchange_api" in its
 * type's __dlpack_c_exchange_api__, so that a C consumer exchanges tensors
 * without calling Python.  None of these synchronizes streams: the consumer
 * asks current_work_stream and queues its work there. */

/* A new tensor of the producer's, with the prototype's dtype, ndim, shape
 * and device; 0, or -1 after calling set_error(error_ctx, kind, message)
 * (kind: a Python exception name such as "MemoryError"). */
typedef int (*DLPackManagedTensorAllocator)(DLTensor *prototype, DLManagedTensorVersioned **out,
                                            void *error_ctx,
                                            void (*set_error)(void *error_ctx, const char *kind,
                                                              const char *message));
/* An owning managed tensor for a Python object of the producer's type; 0,
 * or -1 with a Python exception set. */
typedef int (*DLPackManagedTensorFromPyObjectNoSync)(void *py_object,
                                                     DLManagedTensorVersioned **out);
/* A non-owning view, valid while py_object lives and only until control
 * returns to Python; 0, or -1 with a Python exception set. */
typedef int (*DLPackDLTensorFromPyObjectNoSync)(void *py_object, DLTensor *out);
/* The producer's current work stream of a device (NULL for the CPU); 0, or
 * -1 with a Python exception set. */
typedef int (*DLPackCurrentWorkStream)(DLDeviceType device_type, int32_t device_id,
                                       void **out_current_stream);
/* A Python object of the producer's type taking over an owning managed
 * tensor; 0, or -1 with a Python exception set. */
typedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned *tensor,
                                                   void **out_py_object);

typedef struct DLPackExchangeAPIHeader {
    DLPackVersion version;
    struct DLPackExchangeAPIHeader *prev_api; /* an older version's table, or NULL */
} DLPackExchangeAPIHeader;

typedef struct DLPackExchangeAPI {
    DLPackExchangeAPIHeader header;
    DLPackManagedTensorAllocator managed_tensor_allocator;
    DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
    DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync;
    DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync; /* may be NULL */
    DLPackCurrentWorkStream current_work_stream;
} DLPackExchangeAPI;

#define DLPACK_EXCHANGE_API_CAPSULE "dlpack_exchange_api"
#define DLPACK_EXCHANGE_API_MINOR_VERSION 3

#endif
