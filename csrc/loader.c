/*
 * loader.c — the engine of gpuaccel.PinnedLoader (gpuaccel/loader.py holds
 * the Python side: arguments, epochs, shards, torch, progress bars).
 *
 * One _LoaderIter per epoch.  Native worker threads (no GIL) take the
 * epoch's batches in order; for each, a ring slot provides pinned staging
 * buffers allocated once with the iterator.  The workers gather rows into
 * them in chunks, then the worker finishing a batch queues the
 * host-to-device copies and the fused normalize kernel on the device's
 * loader copy stream and records the batch's event.  __next__ waits only
 * for the workers (never for the GPU), makes the consumer's stream wait on
 * that event, and returns.
 *
 * Outputs stay valid while the user holds them: every batch's outputs are
 * fresh blocks from gpuaccel's stream-ordered pool, allocated on the copy
 * stream and marked ready by the batch's event; when the consumer drops
 * them, the free waits for the consumer streams that used them (recorded by
 * gpuaccel's ops and by the DLPack deleter when torch lets go).
 *
 * On the CPU device the workers write straight into the outputs (pinned
 * when CUDA is usable), applying the transform with the C loop.
 */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "array.h"
#include "image.h"
#include "loader.h"

#define GA_LOADER_MAX_SOURCES 16
#define GA_LOADER_MAX_THREADS 64
/* rows gathered per task: enough bytes that handing out a task is cheap */
#define GA_LOADER_CHUNK_BYTES (256 * 1024)
/* skipped files whose reasons stats() lists (the count covers them all) */
#define GA_LOADER_SKIP_TEXTS 8

typedef struct {
    int is_file;
    const char *base;   /* memory: row 0 */
    int64_t row_stride; /* memory: bytes from one row to the next */
    int fd;             /* file */
    int64_t offset;     /* file: byte offset of row 0 */
    int64_t file_size;  /* file: size when opened */
    char path[512];     /* file, for messages */
    const char *map;    /* file: row 0 in a mapping of it (NULL: read with pread) */
    PyObject *mapping;  /* file: the capsule holding that mapping (see map_source) */
    int64_t nrows;
    int64_t row_bytes;
    ga_dtype dtype;
    int row_ndim;
    int64_t row_shape[GA_MAX_NDIM];
    int is_images;            /* encoded image files, one per row, decoded into it */
    const char *paths;        /* images: NUL-terminated paths back to back */
    const int64_t *path_at;   /* images: where each row's path starts in `paths` */
    ga_image_transform image; /* images: what each sample becomes */
    int skip_bad;             /* images: on_error="skip" */
    int gpu_decode;           /* images: decoded by nvJPEG on the device (decode="gpu") */
} loader_source;

/* decode="gpu": a row's encoded file, kept from its read by a worker to
 * the batch's decode on the device (and until the slot is reused, after
 * its copies completed: nvJPEG reads it from the stream's work). */
typedef struct {
    uint8_t *data;
    size_t size, cap;
    int64_t width, height;
} loader_file;

/* What a worker thread keeps between rows: its encoded file and its
 * decoder's buffers, grown to the largest image it met. */
typedef struct {
    uint8_t *file;
    size_t file_cap;
    ga_image_workspace *ws;
} loader_worker;

typedef struct {
    ga_block *pinned[GA_LOADER_MAX_SOURCES]; /* CUDA: host staging, one per source */
    ga_block *staging;                       /* CUDA + transform: raw rows of source 0 */
    ga_event copy_start, copied;             /* CUDA: around the batch's copies */
    int copied_pending;                      /* copied was recorded and not yet waited for */
    int64_t batch;                           /* the batch held, -1 when free */
    int64_t rows;
    int64_t nchunks, next_chunk, done_chunks;
    int opening; /* a worker is preparing the slot */
    int ready;   /* outputs complete (CPU) or queued (CUDA) */
    ga_block *out[GA_LOADER_MAX_SOURCES];
    uint8_t *skipped;   /* per row: a file left out under on_error="skip" */
    int64_t nskipped;   /* (under mu) */
    loader_file *files; /* decode="gpu": per row */
} loader_slot;

typedef struct {
    PyObject_HEAD
    int nsources;
    loader_source src[GA_LOADER_MAX_SOURCES];
    PyObject *owners;      /* the NumPy arrays backing memory sources */
    PyObject *indices_obj; /* int64 NumPy array: the epoch's samples, in order */
    const int64_t *indices;
    int64_t nindices;
    int64_t batch_size;
    int64_t num_batches;
    int64_t next_out;  /* next batch __next__ returns */
    int64_t next_fill; /* next batch a worker opens */
    int has_transform;
    ga_normalize_desc transform; /* src/dst/n filled per batch */
    int64_t transform_row_bytes;
    ga_device device;
    int pinned_out;
    ga_stream copy_stream;
    int nslots;
    loader_slot *slots;
    int nthreads, started_threads;
    pthread_t threads[GA_LOADER_MAX_THREADS];
    atomic_int worker_ids; /* hands each worker its index */
    /* CPU + transform: each worker's gather buffer, from the pageable pool
     * like the outputs (a new epoch's workers reuse the last one's pages);
     * the iterator owns them, so a forked child frees them too */
    ga_block *scratch[GA_LOADER_MAX_THREADS];
    loader_worker workers[GA_LOADER_MAX_THREADS];
    int has_images;
    int gpu_decode;              /* source 0 is decoded on the device */
    ga_jpeg_decoder *decoder;    /* decode="gpu": the device's (loader_jpeg_decoder) */
    pthread_mutex_t *decoder_mu; /* its lock: one batch at a time */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv, consumer_cv;
    pid_t owner_pid;   /* the process whose threads these are (see forked()) */
    int consumer_busy; /* a thread is inside next_batch (under mu) */
    int stopping;
    int closed;   /* (GIL) no batch will be returned any more */
    int joined;   /* (GIL) the workers are gone */
    int released; /* (GIL) the ring's memory is back in the pool */
    int has_error;
    ga_status error_status; /* GA_OK with error_errno for I/O errors */
    int error_errno;
    char error_text[768];
    /* statistics (under mu) */
    int64_t batches_out, samples_out;
    double gather_seconds, copy_seconds, wait_seconds, started_at;
    int64_t skipped;
    int nskip_texts;
    char skip_texts[GA_LOADER_SKIP_TEXTS][640];
} LoaderIterObject;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ errors */

/* Keeps the first error (with its message copied: a status's message may
 * live in the worker's thread-local storage) and stops the workers. */
static void fail(LoaderIterObject *it, ga_status status, int err, const char *text)
{
    pthread_mutex_lock(&it->mu);
    if (!it->has_error) {
        it->has_error = 1;
        it->error_status = status;
        it->error_errno = err;
        snprintf(it->error_text, sizeof it->error_text, "%s",
                 text             ? text
                 : status.message ? status.message
                                  : "unknown error");
        it->error_status.message = it->error_text;
    }
    it->stopping = 1;
    pthread_cond_broadcast(&it->work_cv);
    pthread_cond_broadcast(&it->ready_cv);
    pthread_mutex_unlock(&it->mu);
}

static PyObject *raise_worker_error(ga_state *st, LoaderIterObject *it)
{
    if (it->error_status.error) {
        ga_raise(st, it->error_status);
    } else {
        PyObject *args = Py_BuildValue("(is)", it->error_errno, it->error_text);
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ gather */

/* A source file is shorter than row `row` (bytes [offset, offset + size))
 * needs: the error next() raises. */
static void file_ended(LoaderIterObject *it, const loader_source *s, int64_t offset, int64_t size,
                       int64_t row)
{
    char text[700];
    off_t end = lseek(s->fd, 0, SEEK_END);
    snprintf(text, sizeof text,
             "'%s' ended early: row %lld needs bytes up to %lld, but the file has %lld "
             "(it was %lld bytes when the loader opened it; was it truncated?)",
             s->path, (long long)row, (long long)(offset + size), (long long)end,
             (long long)s->file_size);
    fail(it, ga_ok(), EIO, text);
}

/* Reads `size` bytes at `offset` of a source file, however many calls it
 * takes; a short file is an error, not a silent partial row. */
static int read_file(LoaderIterObject *it, const loader_source *s, char *dst, int64_t offset,
                     int64_t size, int64_t first_row)
{
    int64_t done = 0;
    while (done < size) {
        ssize_t n = pread(s->fd, dst + done, (size_t)(size - done), (off_t)(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            char text[700];
            snprintf(text, sizeof text, "reading row %lld of '%s' failed: %s", (long long)first_row,
                     s->path, strerror(err));
            fail(it, ga_ok(), err, text);
            return -1;
        }
        if (n == 0) {
            file_ended(it, s, offset, size, first_row);
            return -1;
        }
        done += n;
    }
    return 0;
}

/* ----------------------------------------------------- mapped files
 *
 * Each epoch maps its source files, or reuses the last epoch's mapping of
 * the same file (PinnedLoader keeps it, gpuaccel/loader.py).  Rows are then
 * copied out of the mapping: no system call and no page-cache lookup per
 * row, under half the CPU time of pread() per row, none of it in the
 * kernel.  But a file truncated under the copy turns the access into a
 * SIGBUS, which would kill the process.  So the copies are guarded: the
 * handler below turns a SIGBUS inside a worker's guarded copy into an error
 * return (the same OSError as a short pread), and hands every other SIGBUS
 * to the handler it replaced.  Each epoch puts it back on top if something
 * installed another handler since; one installed while an epoch runs gets
 * that epoch's SIGBUS (and typically ends the process, as it would without
 * gpuaccel).  Bytes past the new end of the file in its last page read as
 * zeros without a signal: an fstat() after each chunk catches those. */

/* A read-only shared mapping of a whole source file, owned by a capsule:
 * the epoch's iterator holds it while its workers copy from it, and
 * PinnedLoader keeps the last epoch's for the next one (gpuaccel/loader.py),
 * whose pages are then already mapped.  No descriptor stays open for it. */
#define GA_MAPPING_CAPSULE "gpuaccel._loader_file_mapping"

typedef struct {
    void *addr;
    size_t size;
    unsigned long long dev, ino; /* which file: reused only for the same one */
} file_mapping;

static void file_mapping_destroy(PyObject *capsule)
{
    file_mapping *m = PyCapsule_GetPointer(capsule, GA_MAPPING_CAPSULE);
    if (m) {
        munmap(m->addr, m->size);
        free(m);
    }
}

typedef struct {
    sigjmp_buf *env; /* where a SIGBUS in [lo, hi) jumps; NULL outside a copy */
    const char *lo, *hi;
} mapped_guard;

static __thread mapped_guard guard;
static struct sigaction sigbus_previous;
static pthread_mutex_t sigbus_mu = PTHREAD_MUTEX_INITIALIZER;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    sigjmp_buf *env = guard.env;
    const char *addr = (const char *)info->si_addr;
    if (env && info->si_code > 0 && addr >= guard.lo && addr < guard.hi) {
        guard.env = NULL;
        siglongjmp(*env, 1);
    }
    /* not a guarded copy: what would have happened without this handler */
    if (sigbus_previous.sa_flags & SA_SIGINFO) {
        sigbus_previous.sa_sigaction(sig, info, context);
        return;
    }
    if (sigbus_previous.sa_handler != SIG_DFL && sigbus_previous.sa_handler != SIG_IGN) {
        sigbus_previous.sa_handler(sig);
        return;
    }
    /* the default action: a fault is raised again when the access is
     * retried on return; a signal sent by someone is sent again */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    if (info->si_code <= 0)
        raise(sig);
}

/* Puts on_sigbus in place unless it is (someone may have installed a
 * handler over it since the last epoch: it then becomes the one chained
 * to).  Needs the GIL (Python's signal module changes handlers under it). */
static int ensure_sigbus_handler(void)
{
    int rc = 0;
    pthread_mutex_lock(&sigbus_mu);
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0) {
        rc = -1;
    } else if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus)) {
        struct sigaction ours;
        memset(&ours, 0, sizeof ours);
        ours.sa_sigaction = on_sigbus;
        ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&ours.sa_mask);
        sigbus_previous = current;
        rc = sigaction(SIGBUS, &ours, NULL);
    }
    pthread_mutex_unlock(&sigbus_mu);
    return rc;
}

/* Copies rows [r0, r1) of the batch starting at sample `first` out of the
 * source's mapping into dst (rows back to back). */
static int gather_mapped(LoaderIterObject *it, const loader_source *s, int64_t first, int64_t r0,
                         int64_t r1, char *dst)
{
    const int64_t *idx = it->indices + first;
    volatile int64_t row = -1; /* read after a jump: must live in memory */
    sigjmp_buf env;
    /* no signal mask saved: that would cost a system call per chunk */
    if (sigsetjmp(env, 0)) {
        /* out of the handler, which runs with SIGBUS blocked */
        sigset_t bus;
        sigemptyset(&bus);
        sigaddset(&bus, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
        struct stat now;
        int64_t end = s->offset + (row + 1) * s->row_bytes;
        if (fstat(s->fd, &now) == 0 && (int64_t)now.st_size >= end) {
            /* the file is long enough: the page could not be read */
            char text[700];
            snprintf(text, sizeof text,
                     "reading row %lld of '%s' failed: %s (a SIGBUS reading "
                     "its mapped page)",
                     (long long)row, s->path, strerror(EIO));
            fail(it, ga_ok(), EIO, text);
        } else {
            file_ended(it, s, s->offset + row * s->row_bytes, s->row_bytes, row);
        }
        return -1;
    }
    const file_mapping *m = PyCapsule_GetPointer(s->mapping, GA_MAPPING_CAPSULE);
    guard.lo = (const char *)m->addr;
    guard.hi = guard.lo + m->size;
    atomic_signal_fence(memory_order_seq_cst);
    guard.env = &env;
    atomic_signal_fence(memory_order_seq_cst);
    int64_t last = 0;
    for (int64_t r = r0; r < r1; r++) {
        row = idx[r];
        last = idx[r] > last ? idx[r] : last;
        memcpy(dst + (r - r0) * s->row_bytes, s->map + idx[r] * s->row_bytes, (size_t)s->row_bytes);
    }
    atomic_signal_fence(memory_order_seq_cst);
    guard.env = NULL;
    atomic_signal_fence(memory_order_seq_cst);
    /* a file cut inside its last page: the bytes past the end read as 0 */
    struct stat st;
    int64_t needed = s->offset + (last + 1) * s->row_bytes;
    if (fstat(s->fd, &st) == 0 && (int64_t)st.st_size < needed) {
        file_ended(it, s, s->offset + last * s->row_bytes, s->row_bytes, last);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- images */

/* Reads a whole file into *buf (grown as needed); 0, or an errno. */
static int read_image_file(uint8_t **buf, size_t *cap, const char *path, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    struct stat st;
    int err = 0;
    size_t done = 0;
    uint8_t *grown = NULL;
    if (fstat(fd, &st) != 0) {
        err = errno;
    } else if (!S_ISREG(st.st_mode)) {
        err = EISDIR;
    } else if ((size_t)st.st_size > *cap &&
               !(grown = realloc(*buf, (size_t)st.st_size + (size_t)st.st_size / 2))) {
        err = ENOMEM;
    } else {
        if (grown) {
            *buf = grown;
            *cap = (size_t)st.st_size + (size_t)st.st_size / 2;
        }
        while (done < (size_t)st.st_size) {
            ssize_t n = read(fd, *buf + done, (size_t)st.st_size - done);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) { /* n == 0: cut shorter since the fstat; decoding says so */
                err = n < 0 ? errno : 0;
                break;
            }
            done += (size_t)n;
        }
    }
    close(fd);
    *size = done;
    return err;
}

/* Row `row` of the slot's batch: sample `sample` decoded into dst.  A file
 * that cannot be read or decoded fails the epoch, or under
 * on_error="skip" is left out of the batch (compact_slot), counted, and
 * its reason kept for stats(). */
static int row_failed(LoaderIterObject *it, loader_slot *slot, const loader_source *s, int64_t row,
                      int err, char *text, size_t size, uint8_t *dst);

static int decode_row(LoaderIterObject *it, loader_slot *slot, loader_worker *w,
                      const loader_source *s, int64_t row, int64_t sample, uint8_t *dst)
{
    const char *path = s->paths + s->path_at[sample];
    char text[640];
    size_t size = 0;
    loader_file *file = s->gpu_decode ? &slot->files[row] : NULL;
    int err = file ? read_image_file(&file->data, &file->cap, path, &size)
                   : read_image_file(&w->file, &w->file_cap, path, &size);
    if (err == ENOMEM) {
        fail(it, GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "no memory to read an image file"), 0, NULL);
        return -1;
    }
    if (err) {
        snprintf(text, sizeof text, "reading '%s' (sample %lld) failed: %s", path,
                 (long long)sample, strerror(err));
    } else {
        ga_status status;
        if (file) { /* the header now; the pixels with the batch, on the device */
            file->size = size;
            status = ga_cpu_jpeg_available()
                         ? ga_cpu_image_size(file->data, size, &file->width, &file->height, w->ws)
                         : ga_cuda_jpeg_image_size(it->decoder, file->data, size, &file->width,
                                                   &file->height);
        } else {
            status = ga_cpu_decode_image(w->file, size, &s->image, sample, dst, w->ws, NULL);
        }
        if (!status.error)
            return 0;
        if (status.error == GA_ERR_HOST_OUT_OF_MEMORY ||
            (!ga_cpu_jpeg_available() && !s->gpu_decode)) {
            fail(it, status, 0, NULL);
            return -1;
        }
        err = EIO;
        snprintf(text, sizeof text, "'%s' (sample %lld): %s", path, (long long)sample,
                 status.message);
    }
    return row_failed(it, slot, s, row, err, text, sizeof text, dst);
}

/* A row whose file could not be read or decoded: fails the epoch with
 * `text`, or under on_error="skip" marks the row to be left out. */
static int row_failed(LoaderIterObject *it, loader_slot *slot, const loader_source *s, int64_t row,
                      int err, char *text, size_t size, uint8_t *dst)
{
    if (!s->skip_bad) {
        size_t n = strlen(text);
        snprintf(text + n, size - n,
                 " (PinnedLoader(..., on_error=\"skip\") leaves such files out of their batch "
                 "and counts them in stats())");
        fail(it, ga_ok(), err, text);
        return -1;
    }
    if (dst)
        memset(dst, 0, (size_t)s->row_bytes);
    pthread_mutex_lock(&it->mu);
    slot->skipped[row] = 1;
    slot->nskipped++;
    it->skipped++;
    if (it->nskip_texts < GA_LOADER_SKIP_TEXTS)
        snprintf(it->skip_texts[it->nskip_texts++], sizeof it->skip_texts[0], "%s", text);
    pthread_mutex_unlock(&it->mu);
    return 0;
}

/* Drops the rows of skipped files from every source's rows of the batch
 * (the staging buffers on CUDA, the outputs on the CPU), keeping the
 * others in order. */
static void compact_slot(LoaderIterObject *it, loader_slot *slot)
{
    int cuda = it->device.type == GA_DEVICE_CUDA;
    /* decoded on the device: its rows were written compacted (decode_on_device) */
    for (int i = it->gpu_decode ? 1 : 0; i < it->nsources; i++) {
        char *base = cuda ? slot->pinned[i]->ptr : slot->out[i]->ptr;
        int64_t bytes =
            cuda || !(i == 0 && it->has_transform) ? it->src[i].row_bytes : it->transform_row_bytes;
        int64_t kept = 0;
        for (int64_t r = 0; r < slot->rows; r++) {
            if (slot->skipped[r])
                continue;
            if (kept != r)
                memmove(base + kept * bytes, base + r * bytes, (size_t)bytes);
            kept++;
        }
    }
    slot->rows -= slot->nskipped;
}

/* Gathers rows [r0, r1) of the batch starting at sample `first` into dst
 * (rows back to back), reading runs of consecutive indices at once. */
static int gather_rows(LoaderIterObject *it, loader_slot *slot, loader_worker *w,
                       const loader_source *s, int64_t first, int64_t r0, int64_t r1, char *dst)
{
    if (s->is_images) {
        const int64_t *idx = it->indices + first;
        for (int64_t r = r0; r < r1; r++)
            if (decode_row(it, slot, w, s, r, idx[r], (uint8_t *)dst + (r - r0) * s->row_bytes) < 0)
                return -1;
        return 0;
    }
    if (s->map)
        return gather_mapped(it, s, first, r0, r1, dst);
    const int64_t *idx = it->indices + first;
    int64_t r = r0;
    while (r < r1) {
        int64_t run = 1;
        while (r + run < r1 && idx[r + run] == idx[r] + run)
            run++;
        char *out = dst + (r - r0) * s->row_bytes;
        if (s->is_file) {
            if (read_file(it, s, out, s->offset + idx[r] * s->row_bytes, run * s->row_bytes,
                          idx[r]) < 0)
                return -1;
        } else if (s->row_stride == s->row_bytes) {
            memcpy(out, s->base + idx[r] * s->row_bytes, (size_t)(run * s->row_bytes));
        } else {
            for (int64_t k = 0; k < run; k++)
                memcpy(out + k * s->row_bytes, s->base + (idx[r] + k) * s->row_stride,
                       (size_t)s->row_bytes);
        }
        r += run;
    }
    return 0;
}

static int64_t chunk_rows(LoaderIterObject *it)
{
    if (it->has_images)
        return 1; /* a decode takes about a millisecond: share them out one by one */
    int64_t bytes = 0;
    for (int i = 0; i < it->nsources; i++)
        bytes += it->src[i].row_bytes;
    int64_t rows = bytes > 0 ? GA_LOADER_CHUNK_BYTES / bytes : it->batch_size;
    return rows < 1 ? 1 : rows;
}

static int gather_chunk_rows(LoaderIterObject *it, loader_slot *slot, int64_t chunk,
                             loader_worker *w, char *scratch)
{
    int64_t per = chunk_rows(it);
    int64_t r0 = chunk * per, r1 = r0 + per < slot->rows ? r0 + per : slot->rows;
    int64_t first = slot->batch * it->batch_size;
    for (int i = 0; i < it->nsources; i++) {
        const loader_source *s = &it->src[i];
        int cuda = it->device.type == GA_DEVICE_CUDA;
        if (cuda) {
            char *dst = slot->pinned[i] ? (char *)slot->pinned[i]->ptr + r0 * s->row_bytes : NULL;
            if (gather_rows(it, slot, w, s, first, r0, r1, dst) < 0)
                return -1;
        } else if (i == 0 && it->has_transform) {
            /* raw rows into scratch, normalized straight into the output */
            if (gather_rows(it, slot, w, s, first, r0, r1, scratch) < 0)
                return -1;
            ga_normalize_desc d = it->transform;
            d.src = (const uint8_t *)scratch;
            d.dst = (char *)slot->out[0]->ptr + r0 * it->transform_row_bytes;
            d.n = r1 - r0;
            d.in_caller = 1; /* the workers split the batch between them */
            ga_cuda_range_push("gpuaccel::normalize");
            ga_status status = ga_cpu_normalize_images(&d);
            ga_cuda_range_pop();
            if (status.error) {
                fail(it, status, 0, NULL);
                return -1;
            }
        } else {
            char *dst = (char *)slot->out[i]->ptr + r0 * s->row_bytes;
            if (gather_rows(it, slot, w, s, first, r0, r1, dst) < 0)
                return -1;
        }
    }
    return 0;
}

/* A chunk of the batch gathered inside an NVTX range (the workers' share of
 * the loader's work, beside the copies of finish_slot). */
static int gather_chunk(LoaderIterObject *it, loader_slot *slot, int64_t chunk, loader_worker *w,
                        char *scratch)
{
    ga_cuda_range_push("gpuaccel::loader_gather");
    int rc = gather_chunk_rows(it, slot, chunk, w, scratch);
    ga_cuda_range_pop();
    return rc;
}

/* ---------------------------------------------------------- the ring */

static int64_t out_row_bytes(LoaderIterObject *it, int source)
{
    return source == 0 && it->has_transform ? it->transform_row_bytes : it->src[source].row_bytes;
}

/* Prepares a slot for batch `batch` (called without mu): outputs from the
 * pool, and the slot's pinned buffers free of their previous copy. */
static int open_slot(LoaderIterObject *it, loader_slot *slot, int64_t batch)
{
    int cuda = it->device.type == GA_DEVICE_CUDA;
    int64_t first = batch * it->batch_size;
    int64_t rows = it->nindices - first < it->batch_size ? it->nindices - first : it->batch_size;
    if (cuda && slot->copied_pending) {
        ga_status status = ga_cuda_event_synchronize(it->device.index, slot->copied);
        float ms = 0.0f;
        if (!status.error)
            status =
                ga_cuda_event_elapsed_ms(it->device.index, slot->copy_start, slot->copied, &ms);
        if (status.error) {
            fail(it, status, 0, NULL);
            return -1;
        }
        pthread_mutex_lock(&it->mu);
        it->copy_seconds += ms / 1000.0;
        pthread_mutex_unlock(&it->mu);
        slot->copied_pending = 0;
    }
    for (int i = 0; cuda && i < it->nsources; i++) {
        if (!slot->pinned[i]) /* decode="gpu": source 0 has none */
            continue;
        /* the workers write the staging buffers next */
        ga_status status = ga_cuda_host_access(slot->pinned[i]->ptr, slot->pinned[i]->size, 1);
        if (status.error) {
            fail(it, status, 0, NULL);
            return -1;
        }
    }
    ga_mem_kind kind = cuda ? GA_MEM_DEVICE : it->pinned_out ? GA_MEM_PINNED : GA_MEM_HOST;
    for (int i = 0; i < it->nsources; i++) {
        ga_status status = ga_block_alloc_status(kind, cuda ? it->device.index : -1,
                                                 (size_t)(rows * out_row_bytes(it, i)),
                                                 it->copy_stream, &slot->out[i]);
        if (status.error) {
            fail(it, status, 0, NULL);
            return -1;
        }
    }
    slot->rows = rows;
    slot->nchunks = (rows + chunk_rows(it) - 1) / chunk_rows(it);
    if (slot->skipped)
        memset(slot->skipped, 0, (size_t)it->batch_size);
    slot->nskipped = 0;
    return 0;
}

/* decode="gpu": the batch's files (read by the workers, rows not skipped)
 * decoded by nvJPEG into one device buffer from the pool, then each
 * cropped, resized and flipped by the resize kernel into the batch's
 * uint8 rows on the device (the staging buffer the normalize reads, or
 * the output), skipped rows left out — all queued on the copy stream.  A
 * file nvJPEG cannot decode fails the epoch or is skipped, as on the CPU. */
static int decode_on_device(LoaderIterObject *it, loader_slot *slot)
{
    const loader_source *s = &it->src[0];
    int dev = it->device.index;
    int64_t n = slot->rows, first = slot->batch * it->batch_size;
    const uint8_t **data = calloc((size_t)n + 1, sizeof *data);
    size_t *sizes = calloc((size_t)n + 1, sizeof *sizes);
    uint8_t **dst = calloc((size_t)n + 1, sizeof *dst);
    int64_t *widths = calloc((size_t)n + 1, sizeof *widths), *heights = calloc((size_t)n + 1, 8);
    int64_t *rows = calloc((size_t)n + 1, sizeof *rows);
    int *bad = calloc((size_t)n + 1, sizeof *bad);
    ga_resize_job *jobs = calloc((size_t)n + 1, sizeof *jobs);
    ga_block *decoded = NULL;
    int rc = -1;
    if (!data || !sizes || !dst || !widths || !heights || !rows || !bad || !jobs) {
        fail(it, GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "no memory to decode a batch"), 0, NULL);
        goto done;
    }
    int m = 0;
    size_t total = 0;
    for (int64_t r = 0; r < n; r++) {
        if (slot->skipped[r])
            continue;
        const loader_file *f = &slot->files[r];
        data[m] = f->data, sizes[m] = f->size, widths[m] = f->width, heights[m] = f->height;
        rows[m++] = r;
        total += (size_t)(f->width * f->height * 3);
    }
    ga_status status =
        ga_block_alloc_status(GA_MEM_DEVICE, dev, total ? total : 1, it->copy_stream, &decoded);
    size_t at = 0;
    for (int k = 0; k < m && !status.error; k++) {
        dst[k] = (uint8_t *)decoded->ptr + at;
        at += (size_t)(widths[k] * heights[k] * 3);
    }
    if (!status.error && m > 0) {
        pthread_mutex_lock(it->decoder_mu);
        status = ga_cuda_decode_jpegs(it->decoder, m, data, sizes, dst, widths, heights, bad,
                                      it->copy_stream);
        pthread_mutex_unlock(it->decoder_mu);
    }
    if (status.error) {
        fail(it, status, 0, NULL);
        goto done;
    }
    uint8_t *target = it->has_transform ? slot->staging->ptr : slot->out[0]->ptr;
    int kept = 0;
    for (int k = 0; k < m; k++) {
        int64_t sample = it->indices[first + rows[k]];
        if (bad[k]) {
            char text[640];
            snprintf(text, sizeof text,
                     "'%s' (sample %lld): nvJPEG cannot decode it (damaged, or a kind it does not "
                     "take, such as CMYK; decode=\"cpu\" decodes every JPEG libjpeg-turbo does)",
                     s->paths + s->path_at[sample], (long long)sample);
            if (row_failed(it, slot, s, rows[k], EIO, text, sizeof text, NULL) < 0)
                goto done;
            continue;
        }
        ga_resize_job *job = &jobs[kept];
        job->src = dst[k];
        job->src_h = heights[k], job->src_w = widths[k], job->src_pitch = widths[k] * 3;
        job->dst = target + (size_t)kept * (size_t)s->row_bytes;
        ga_image_plan(&s->image, sample, widths[k], heights[k], &job->g);
        kept++;
    }
    status = ga_cuda_resize_images(dev, jobs, kept, it->copy_stream);
    if (status.error) {
        fail(it, status, 0, NULL);
        goto done;
    }
    rc = 0;
done:
    if (decoded) /* allocated and used on the copy stream: reused in its order */
        ga_block_free(decoded);
    free(data), free(sizes), free(dst), free(widths), free(heights), free(rows), free(bad);
    free(jobs);
    return rc;
}

/* The batch in the slot is gathered: queue its copies (CUDA). */
static int finish_slot(LoaderIterObject *it, loader_slot *slot)
{
    if (it->device.type != GA_DEVICE_CUDA)
        return 0;
    int dev = it->device.index;
    ga_stream s = it->copy_stream;
    /* the batch's host-to-device copies and normalize, queued */
    ga_cuda_range_push("gpuaccel::loader_copy");
    ga_status status = ga_cuda_event_record(dev, slot->copy_start, s);
    for (int i = 0; i < it->nsources && !status.error; i++) {
        size_t bytes = (size_t)(slot->rows * it->src[i].row_bytes);
        if (i == 0 && it->has_transform) {
            if (!it->gpu_decode) /* decoded on the device: already in staging */
                status =
                    ga_cuda_memcpy_async(dev, slot->staging->ptr, slot->pinned[0]->ptr, bytes, s);
            if (!status.error) {
                ga_normalize_desc d = it->transform;
                d.src = (const uint8_t *)slot->staging->ptr;
                d.dst = slot->out[0]->ptr;
                d.n = slot->rows;
                status = ga_cuda_normalize_images(dev, &d, s);
            }
        } else if (!(i == 0 && it->gpu_decode)) {
            status = ga_cuda_memcpy_async(dev, slot->out[i]->ptr, slot->pinned[i]->ptr, bytes, s);
        }
    }
    if (!status.error)
        status = ga_cuda_event_record(dev, slot->copied, s);
    for (int i = 0; i < it->nsources && !status.error; i++)
        status = ga_block_set_ready(slot->out[i], s);
    ga_cuda_range_pop();
    if (status.error) {
        fail(it, status, 0, NULL);
        return -1;
    }
    slot->copied_pending = 1;
    return 0;
}

static void *worker_main(void *arg)
{
    LoaderIterObject *it = (LoaderIterObject *)arg;
    int worker = atomic_fetch_add(&it->worker_ids, 1);
    char *scratch = it->scratch[worker] ? it->scratch[worker]->ptr : NULL;
    loader_worker *w = &it->workers[worker];
    if (it->device.type == GA_DEVICE_CUDA) {
        ga_status status = ga_cuda_thread_init(it->device.index);
        if (status.error) {
            fail(it, status, 0, NULL);
            return NULL;
        }
    }
    pthread_mutex_lock(&it->mu);
    while (!it->stopping) {
        /* oldest batch with chunks left to claim */
        loader_slot *slot = NULL;
        for (int64_t b = it->next_out; b < it->next_fill && !slot; b++) {
            loader_slot *s = &it->slots[b % it->nslots];
            if (s->batch == b && !s->opening && s->next_chunk < s->nchunks)
                slot = s;
        }
        if (!slot && it->next_fill < it->num_batches) {
            loader_slot *s = &it->slots[it->next_fill % it->nslots];
            if (s->batch < 0) {
                int64_t b = it->next_fill++;
                s->batch = b;
                s->opening = 1;
                pthread_mutex_unlock(&it->mu);
                int rc = open_slot(it, s, b);
                pthread_mutex_lock(&it->mu);
                s->opening = 0;
                s->next_chunk = s->done_chunks = 0;
                if (rc < 0)
                    break;
                pthread_cond_broadcast(&it->work_cv);
                continue;
            }
        }
        if (!slot) {
            pthread_cond_wait(&it->work_cv, &it->mu);
            continue;
        }
        int64_t chunk = slot->next_chunk++;
        pthread_mutex_unlock(&it->mu);
        double t0 = now_seconds();
        int rc = gather_chunk(it, slot, chunk, w, scratch);
        double spent = now_seconds() - t0;
        pthread_mutex_lock(&it->mu);
        it->gather_seconds += spent;
        if (rc < 0)
            break;
        if (++slot->done_chunks == slot->nchunks) {
            pthread_mutex_unlock(&it->mu);
            /* every row is gathered: nobody else touches the slot */
            rc = it->gpu_decode ? decode_on_device(it, slot) : 0;
            if (rc == 0 && slot->nskipped)
                compact_slot(it, slot);
            if (rc == 0)
                rc = finish_slot(it, slot);
            pthread_mutex_lock(&it->mu);
            if (rc < 0)
                break;
            slot->ready = 1;
            pthread_cond_broadcast(&it->ready_cv);
        }
    }
    pthread_mutex_unlock(&it->mu);
    return NULL;
}

/* -------------------------------------------------------- lifecycle */

/* After fork() the child has a copy of the iterator but none of its worker
 * threads, and `mu` may have been held by one of them at the fork: the
 * child never locks, joins or frees anything of a parent's epoch. */
static int forked(const LoaderIterObject *it)
{
    return getpid() != it->owner_pid;
}

/* Closes the files and lets go of their mappings (PinnedLoader may hold
 * them for the next epoch).  Needs the GIL and the workers joined. */
static void release_sources(LoaderIterObject *it)
{
    for (int i = 0; i < it->nsources; i++) {
        loader_source *s = &it->src[i];
        if (s->is_file && s->fd >= 0)
            close(s->fd);
        s->fd = -1;
        s->map = NULL;
        Py_CLEAR(s->mapping);
    }
}

static void release_scratch(LoaderIterObject *it)
{
    for (int t = 0; t < GA_LOADER_MAX_THREADS; t++) {
        ga_block_free(it->scratch[t]);
        it->scratch[t] = NULL;
        free(it->workers[t].file);
        ga_cpu_image_workspace_free(it->workers[t].ws);
        memset(&it->workers[t], 0, sizeof it->workers[t]);
    }
    for (int k = 0; it->slots && k < it->nslots; k++) {
        free(it->slots[k].skipped);
        it->slots[k].skipped = NULL;
        for (int64_t r = 0; it->slots[k].files && r < it->batch_size; r++)
            free(it->slots[k].files[r].data);
        free(it->slots[k].files);
        it->slots[k].files = NULL;
    }
}

/* Returns unused outputs, the staging buffers and the events to the pool.
 * Needs the GIL, the workers joined and no consumer inside next_batch. */
static void release_ring(LoaderIterObject *it)
{
    if (it->released)
        return;
    it->released = 1;
    int cuda = it->device.type == GA_DEVICE_CUDA;
    if (forked(it)) {
        /* The pool came through the fork consistent (alloc.c's fork
         * handlers) and pageable host blocks are plain memory: give them
         * back.  Pinned and device memory belong to the parent's CUDA
         * context, which this process cannot use: left alone. */
        for (int k = 0; it->slots && k < it->nslots; k++) {
            for (int i = 0; i < it->nsources; i++) {
                ga_block *b = it->slots[k].out[i];
                if (b && b->kind == GA_MEM_HOST) {
                    ga_block_free(b);
                    it->slots[k].out[i] = NULL;
                }
            }
        }
        release_scratch(it);
        release_sources(it); /* this process's copies of the descriptors */
        return;
    }
    for (int k = 0; it->slots && k < it->nslots; k++) {
        loader_slot *slot = &it->slots[k];
        for (int i = 0; i < it->nsources; i++) {
            if (slot->out[i])
                ga_block_free(slot->out[i]);
            slot->out[i] = NULL;
            if (slot->pinned[i]) {
                /* reused by the pool only after the copies queued from it */
                if (cuda)
                    (void)ga_block_record_use_status(slot->pinned[i], it->device.index,
                                                     it->copy_stream);
                ga_block_free(slot->pinned[i]);
                slot->pinned[i] = NULL;
            }
        }
        if (slot->staging)
            ga_block_free(slot->staging); /* allocated on the copy stream: freed in its order */
        slot->staging = NULL;
        if (slot->copy_start)
            ga_cuda_event_destroy(it->device.index, slot->copy_start);
        if (slot->copied)
            ga_cuda_event_destroy(it->device.index, slot->copied);
        slot->copy_start = slot->copied = NULL;
    }
    release_sources(it);
    release_scratch(it);
}

/* Ends the epoch: stops and joins the workers (GIL released while joining),
 * wakes a consumer waiting in another thread, and releases the ring once
 * no consumer is inside next_batch (that one releases it on its way out).
 * Safe to call from any thread, any number of times.  Needs the GIL. */
static void close_iterator(LoaderIterObject *it)
{
    if (!it->closed) {
        it->closed = 1;
        if (!forked(it)) {
            pthread_mutex_lock(&it->mu);
            it->stopping = 1;
            pthread_cond_broadcast(&it->work_cv);
            pthread_cond_broadcast(&it->ready_cv);
            pthread_cond_broadcast(&it->consumer_cv);
            pthread_mutex_unlock(&it->mu);
            int n = it->started_threads;
            Py_BEGIN_ALLOW_THREADS
            for (int t = 0; t < n; t++)
                pthread_join(it->threads[t], NULL);
            Py_END_ALLOW_THREADS
        }
        it->started_threads = 0;
        it->joined = 1;
    }
    if (!it->joined || it->released)
        return;
    int busy = 0;
    if (!forked(it)) {
        pthread_mutex_lock(&it->mu);
        busy = it->consumer_busy;
        pthread_mutex_unlock(&it->mu);
    }
    if (!busy)
        release_ring(it);
}

/* One copy stream per device for every loader of the process: outputs are
 * allocated on it and freed in its order long after an iterator is gone,
 * so it is never destroyed. */
static ga_status loader_copy_stream(int device, ga_stream *out)
{
    static ga_stream streams[GA_MAX_DEVICES];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    ga_status status = ga_ok();
    pthread_mutex_lock(&mu);
    if (!streams[device])
        status = ga_cuda_stream_acquire(device, 0, &streams[device]);
    *out = streams[device];
    pthread_mutex_unlock(&mu);
    return status;
}

/* One nvJPEG decoder per device for every loader of the process, made at
 * the first decode="gpu" epoch (its hardware backend takes a while to
 * start) and kept, like the copy stream; loaders take turns with it. */
static ga_status loader_jpeg_decoder(int device, ga_jpeg_decoder **out, pthread_mutex_t **mu)
{
    static ga_jpeg_decoder *decoders[GA_MAX_DEVICES];
    static pthread_mutex_t locks[GA_MAX_DEVICES];
    static int hardware[GA_MAX_DEVICES];
    static pthread_mutex_t made = PTHREAD_MUTEX_INITIALIZER;
    ga_status status = ga_ok();
    pthread_mutex_lock(&made);
    if (!decoders[device]) {
        status = ga_cuda_jpeg_decoder_create(device, &decoders[device], &hardware[device]);
        if (!status.error)
            pthread_mutex_init(&locks[device], NULL);
    }
    *out = decoders[device];
    *mu = &locks[device];
    pthread_mutex_unlock(&made);
    return status;
}

/* ------------------------------------------------------- construction */

/* Maps the opened source file for copying rows out of it, reusing the last
 * epoch's mapping (`previous`: a capsule or None) when it is of this very
 * file (not one that replaced it since) and covers every row.  A file that
 * cannot be mapped is read with pread(): not an error. */
static int map_source(loader_source *s, PyObject *previous)
{
    struct stat st;
    int64_t needed = s->offset + s->nrows * s->row_bytes;
    if (needed <= 0 || fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    if (previous && PyCapsule_IsValid(previous, GA_MAPPING_CAPSULE)) {
        const file_mapping *m = PyCapsule_GetPointer(previous, GA_MAPPING_CAPSULE);
        if (m->dev == (unsigned long long)st.st_dev && m->ino == (unsigned long long)st.st_ino &&
            (int64_t)m->size >= needed) {
            s->mapping = Py_NewRef(previous);
            s->map = (const char *)m->addr + s->offset;
            return 0;
        }
    }
    file_mapping *m = calloc(1, sizeof *m);
    if (!m) {
        PyErr_NoMemory();
        return -1;
    }
    m->size = (size_t)needed;
    m->dev = (unsigned long long)st.st_dev;
    m->ino = (unsigned long long)st.st_ino;
    m->addr = mmap(NULL, m->size, PROT_READ, MAP_SHARED, s->fd, 0);
    if (m->addr == MAP_FAILED) {
        free(m);
        return 0;
    }
    s->mapping = PyCapsule_New(m, GA_MAPPING_CAPSULE, file_mapping_destroy);
    if (!s->mapping) {
        munmap(m->addr, m->size);
        free(m);
        return -1;
    }
    s->map = (const char *)m->addr + s->offset;
    return 0;
}

/* ("images", paths, offsets, transform spec, epoch, skip): `paths` a uint8
 * array of NUL-terminated paths back to back, `offsets` an int64 array of
 * where each sample's starts (gpuaccel/images.py builds both once). */
static int parse_images(LoaderIterObject *it, PyObject *spec, loader_source *s, int index)
{
    const char *kind;
    PyObject *paths, *offsets, *transform;
    long long epoch;
    int skip, gpu = 0;
    if (!PyArg_ParseTuple(spec, "sOOOLp|p", &kind, &paths, &offsets, &transform, &epoch, &skip,
                          &gpu))
        return -1;
    if (gpu && index != 0) {
        PyErr_SetString(PyExc_ValueError, "decode=\"gpu\" applies to the first source");
        return -1;
    }
    if (!PyArray_Check(paths) || PyArray_TYPE((PyArrayObject *)paths) != NPY_UINT8 ||
        PyArray_NDIM((PyArrayObject *)paths) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)paths) || !PyArray_Check(offsets) ||
        PyArray_TYPE((PyArrayObject *)offsets) != NPY_INT64 ||
        PyArray_NDIM((PyArrayObject *)offsets) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)offsets)) {
        PyErr_Format(PyExc_TypeError,
                     "source %d: images need a contiguous uint8 array of paths "
                     "and an int64 array of their offsets",
                     index);
        return -1;
    }
    s->paths = (const char *)PyArray_DATA((PyArrayObject *)paths);
    s->path_at = (const int64_t *)PyArray_DATA((PyArrayObject *)offsets);
    s->nrows = PyArray_DIM((PyArrayObject *)offsets, 0);
    int64_t blob = PyArray_DIM((PyArrayObject *)paths, 0);
    if (blob < 1 || s->paths[blob - 1] != '\0') {
        PyErr_Format(PyExc_ValueError, "source %d: the paths must end with a NUL byte", index);
        return -1;
    }
    for (int64_t k = 0; k < s->nrows; k++) {
        if (s->path_at[k] < 0 || s->path_at[k] >= blob) {
            PyErr_Format(PyExc_ValueError, "source %d: path offset %lld is outside the paths",
                         index, (long long)s->path_at[k]);
            return -1;
        }
    }
    if (ga_image_transform_from_object(transform, epoch, &s->image) < 0)
        return -1;
    s->is_images = 1;
    s->skip_bad = skip;
    s->gpu_decode = gpu;
    it->gpu_decode = gpu;
    s->dtype = GA_UINT8;
    s->row_ndim = 3;
    s->row_shape[0] = s->image.out_h, s->row_shape[1] = s->image.out_w, s->row_shape[2] = 3;
    s->row_bytes = s->image.out_h * s->image.out_w * 3;
    it->has_images = 1;
    if (PyList_Append(it->owners, paths) < 0 || PyList_Append(it->owners, offsets) < 0)
        return -1;
    return 0;
}

static int parse_source(ga_state *st, LoaderIterObject *it, PyObject *spec, loader_source *s,
                        int index, PyObject *previous_mapping)
{
    /* ("memory", ndarray) or ("file", path, offset, nrows, dtype, row_shape) */
    const char *kind;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2 ||
        !(kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0)))) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "source %d must be ('memory', array) or ('file', ...)",
                     index);
        return -1;
    }
    s->fd = -1;
    PyObject *dtype_obj, *shape_obj;
    if (strcmp(kind, "memory") == 0) {
        PyObject *arr = PyTuple_GET_ITEM(spec, 1);
        if (!PyArray_Check(arr) || PyArray_NDIM((PyArrayObject *)arr) < 1) {
            PyErr_Format(PyExc_TypeError, "source %d must be a NumPy array with a first dimension",
                         index);
            return -1;
        }
        PyArrayObject *a = (PyArrayObject *)arr;
        if (ga_dtype_from_numpy_descr(st, (PyObject *)PyArray_DESCR(a), &s->dtype) < 0) {
            PyErr_Format(PyExc_TypeError, "source %d: dtype %R is not supported", index,
                         (PyObject *)PyArray_DESCR(a));
            return -1;
        }
        s->nrows = PyArray_DIM(a, 0);
        s->row_ndim = PyArray_NDIM(a) - 1;
        if (s->row_ndim > GA_MAX_NDIM - 1) {
            PyErr_Format(PyExc_ValueError, "source %d has too many dimensions", index);
            return -1;
        }
        s->row_bytes = (int64_t)ga_dtype_itemsize(s->dtype);
        for (int d = 0; d < s->row_ndim; d++) {
            s->row_shape[d] = PyArray_DIM(a, d + 1);
            s->row_bytes *= s->row_shape[d];
        }
        /* rows must be dense (the Python side copies other layouts) */
        int64_t expected = (int64_t)ga_dtype_itemsize(s->dtype);
        for (int d = PyArray_NDIM(a) - 1; d >= 1; d--) {
            if (PyArray_DIM(a, d) != 1 && PyArray_STRIDE(a, d) != expected) {
                PyErr_Format(PyExc_ValueError, "source %d: each row must be C-contiguous", index);
                return -1;
            }
            expected *= PyArray_DIM(a, d);
        }
        s->base = PyArray_DATA(a);
        s->row_stride = PyArray_STRIDE(a, 0);
        if (PyList_Append(it->owners, arr) < 0)
            return -1;
        return 0;
    }
    if (strcmp(kind, "file") == 0) {
        const char *path;
        long long offset, nrows;
        if (!PyArg_ParseTuple(spec, "ssLLOO", &kind, &path, &offset, &nrows, &dtype_obj,
                              &shape_obj))
            return -1;
        int ndim;
        if (ga_dtype_from_object(st, dtype_obj, &s->dtype, "dtype") < 0 ||
            ga_shape_from_object(shape_obj, s->row_shape, &ndim, "row shape") < 0)
            return -1;
        s->row_ndim = ndim;
        s->row_bytes = (int64_t)ga_dtype_itemsize(s->dtype);
        for (int d = 0; d < ndim; d++)
            s->row_bytes *= s->row_shape[d];
        s->is_file = 1;
        s->offset = offset;
        s->nrows = nrows;
        snprintf(s->path, sizeof s->path, "%s", path);
        s->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (s->fd < 0) {
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
            return -1;
        }
        off_t end = lseek(s->fd, 0, SEEK_END);
        s->file_size = end;
        if (end < offset + nrows * s->row_bytes) {
            PyErr_Format(PyExc_ValueError,
                         "'%s' is %lld bytes, but its header describes %lld rows of %lld bytes "
                         "after byte %lld: the file is truncated",
                         path, (long long)end, nrows, (long long)s->row_bytes, offset);
            return -1;
        }
        return map_source(s, previous_mapping);
    }
    if (strcmp(kind, "images") == 0)
        return parse_images(it, spec, s, index);
    PyErr_Format(PyExc_TypeError, "source %d: unknown kind '%s'", index, kind);
    return -1;
}

static int parse_transform(ga_state *st, LoaderIterObject *it, PyObject *obj)
{
    /* (scale list, shift list, dtype, nchw[, src_chw]) applied to source 0 */
    PyObject *scale, *shift, *dtype_obj;
    int nchw, src_chw = 0;
    if (!PyArg_ParseTuple(obj, "OOOp|p", &scale, &shift, &dtype_obj, &nchw, &src_chw))
        return -1;
    loader_source *s = &it->src[0];
    if (s->dtype != GA_UINT8 || s->row_ndim != 3) {
        PyErr_SetString(PyExc_ValueError,
                        "ImageNormalize applies to uint8 images of shape (N, H, W, C)");
        return -1;
    }
    ga_normalize_desc *d = &it->transform;
    memset(d, 0, sizeof *d);
    d->src_chw = src_chw;
    d->h = s->row_shape[src_chw ? 1 : 0];
    d->w = s->row_shape[src_chw ? 2 : 1];
    d->c = s->row_shape[src_chw ? 0 : 2];
    d->nchw = nchw;
    if (ga_dtype_from_object(st, dtype_obj, &d->dtype, "dtype") < 0)
        return -1;
    Py_ssize_t n1 = PySequence_Length(scale), n2 = PySequence_Length(shift);
    if (n1 != d->c || n2 != d->c || d->c > GA_NORMALIZE_MAX_CHANNELS) {
        PyErr_Format(PyExc_ValueError,
                     "ImageNormalize: the images have %lld channels, but mean/std have %zd",
                     (long long)d->c, n1);
        return -1;
    }
    for (Py_ssize_t c = 0; c < n1; c++) {
        PyObject *a = PySequence_GetItem(scale, c), *b = PySequence_GetItem(shift, c);
        d->scale[c] = a ? PyFloat_AsDouble(a) : 0.0;
        d->shift[c] = b ? PyFloat_AsDouble(b) : 0.0;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (PyErr_Occurred())
            return -1;
    }
    it->has_transform = 1;
    it->transform_row_bytes = d->h * d->w * d->c * (int64_t)ga_dtype_itemsize(d->dtype);
    return 0;
}

static int allocate_ring(ga_state *st, LoaderIterObject *it, int nslots)
{
    it->slots = calloc((size_t)nslots, sizeof *it->slots);
    if (!it->slots) {
        PyErr_NoMemory();
        return -1;
    }
    it->nslots = nslots;
    for (int k = 0; k < nslots; k++)
        it->slots[k].batch = -1;
    if (it->device.type != GA_DEVICE_CUDA)
        return 0;
    int dev = it->device.index;
    for (int k = 0; k < nslots; k++) {
        loader_slot *slot = &it->slots[k];
        for (int i = it->gpu_decode ? 1 : 0; i < it->nsources; i++) {
            slot->pinned[i] = ga_block_alloc(st, GA_MEM_PINNED, -1,
                                             (size_t)(it->batch_size * it->src[i].row_bytes), NULL);
            if (!slot->pinned[i])
                return -1;
        }
        if (it->has_transform) {
            slot->staging =
                ga_block_alloc(st, GA_MEM_DEVICE, dev,
                               (size_t)(it->batch_size * it->src[0].row_bytes), it->copy_stream);
            if (!slot->staging)
                return -1;
        }
        GA_CHECK(st, ga_cuda_event_create(dev, 1, &slot->copy_start));
        GA_CHECK(st, ga_cuda_event_create(dev, 1, &slot->copied));
    }
    return 0;
error:
    return -1;
}

static PyObject *LoaderIter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"sources",  "indices",   "batch_size",  "device",   "num_threads",
                             "prefetch", "transform", "start_batch", "mappings", NULL};
    PyObject *sources, *indices, *device_obj, *transform = Py_None, *mappings = Py_None;
    long long batch_size, start_batch = 0;
    int num_threads, prefetch;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOLOii|OLO:_LoaderIter", kwlist, &sources,
                                     &indices, &batch_size, &device_obj, &num_threads, &prefetch,
                                     &transform, &start_batch, &mappings))
        return NULL;
    ga_state *st = ga_state_from_type(type);
    if (!st)
        return NULL;
    LoaderIterObject *it = (LoaderIterObject *)type->tp_alloc(type, 0);
    if (!it)
        return NULL;
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->work_cv, NULL);
    pthread_cond_init(&it->ready_cv, NULL);
    pthread_cond_init(&it->consumer_cv, NULL);
    it->owner_pid = getpid();
    for (int i = 0; i < GA_LOADER_MAX_SOURCES; i++)
        it->src[i].fd = -1;
    it->owners = PyList_New(0);
    if (!it->owners)
        goto error;
    if (!PyList_Check(sources) || PyList_GET_SIZE(sources) < 1 ||
        PyList_GET_SIZE(sources) > GA_LOADER_MAX_SOURCES) {
        PyErr_Format(PyExc_ValueError, "a loader takes 1 to %d arrays", GA_LOADER_MAX_SOURCES);
        goto error;
    }
    it->nsources = (int)PyList_GET_SIZE(sources);
    if (mappings != Py_None &&
        !(PyTuple_Check(mappings) && PyTuple_GET_SIZE(mappings) == it->nsources)) {
        PyErr_SetString(PyExc_TypeError, "mappings must be None or the `mappings` of an earlier "
                                         "epoch's iterator over the same sources");
        goto error;
    }
    for (int i = 0; i < it->nsources; i++) {
        PyObject *previous = mappings == Py_None ? NULL : PyTuple_GET_ITEM(mappings, i);
        if (parse_source(st, it, PyList_GET_ITEM(sources, i), &it->src[i], i, previous) < 0)
            goto error;
    }
    for (int i = 0; i < it->nsources; i++) {
        if (it->src[i].map && ensure_sigbus_handler() < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto error;
        }
    }
    if (!PyArray_Check(indices) || PyArray_TYPE((PyArrayObject *)indices) != NPY_INT64 ||
        PyArray_NDIM((PyArrayObject *)indices) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)indices)) {
        PyErr_SetString(PyExc_TypeError, "indices must be a contiguous 1-D int64 array");
        goto error;
    }
    it->indices_obj = Py_NewRef(indices);
    it->indices = (const int64_t *)PyArray_DATA((PyArrayObject *)indices);
    it->nindices = PyArray_DIM((PyArrayObject *)indices, 0);
    for (int64_t k = 0; k < it->nindices; k++) {
        for (int i = 0; i < it->nsources; i++) {
            if (it->indices[k] < 0 || it->indices[k] >= it->src[i].nrows) {
                PyErr_Format(PyExc_IndexError,
                             "sample index %lld is out of range for array %d "
                             "with %lld rows",
                             (long long)it->indices[k], i, (long long)it->src[i].nrows);
                goto error;
            }
        }
    }
    if (batch_size < 1 || num_threads < 1 || num_threads > GA_LOADER_MAX_THREADS || prefetch < 0 ||
        prefetch > 64) {
        PyErr_SetString(PyExc_ValueError, "bad batch_size, num_threads or prefetch");
        goto error;
    }
    it->batch_size = batch_size;
    it->num_batches = (it->nindices + batch_size - 1) / batch_size;
    if (start_batch < 0 || start_batch > it->num_batches) {
        PyErr_Format(PyExc_ValueError, "start_batch %lld is outside 0..%lld", start_batch,
                     (long long)it->num_batches);
        goto error;
    }
    it->next_out = it->next_fill = start_batch;
    if (ga_device_from_object(st, device_obj, &it->device, "device") < 0)
        goto error;
    if (transform != Py_None && parse_transform(st, it, transform) < 0)
        goto error;
    if (it->gpu_decode && it->device.type != GA_DEVICE_CUDA) {
        PyErr_SetString(PyExc_ValueError, "decode=\"gpu\" needs a CUDA device");
        goto error;
    }
    if (it->device.type == GA_DEVICE_CUDA) {
        if (ga_ensure_cuda_device(st, it->device.index) < 0)
            goto error;
        GA_CHECK(st, loader_copy_stream(it->device.index, &it->copy_stream));
        if (it->gpu_decode)
            GA_CHECK(st, loader_jpeg_decoder(it->device.index, &it->decoder, &it->decoder_mu));
    } else {
        it->pinned_out = ga_cuda_usable();
    }
    if (allocate_ring(st, it, prefetch + 2) < 0)
        goto error;
    for (int t = 0; t < num_threads && it->has_transform && it->device.type == GA_DEVICE_CPU; t++) {
        it->scratch[t] = ga_block_alloc(st, GA_MEM_HOST, -1,
                                        (size_t)(chunk_rows(it) * it->src[0].row_bytes), NULL);
        if (!it->scratch[t])
            goto error;
    }
    for (int t = 0; t < num_threads && it->has_images; t++) {
        it->workers[t].ws = ga_cpu_image_workspace_new();
        if (!it->workers[t].ws) {
            PyErr_NoMemory();
            goto error;
        }
    }
    for (int k = 0; k < it->nslots && it->has_images; k++) {
        it->slots[k].skipped = calloc((size_t)it->batch_size, 1);
        if (it->gpu_decode)
            it->slots[k].files = calloc((size_t)it->batch_size, sizeof(loader_file));
        if (!it->slots[k].skipped || (it->gpu_decode && !it->slots[k].files)) {
            PyErr_NoMemory();
            goto error;
        }
    }
    it->nthreads = num_threads;
    it->started_at = now_seconds();
    for (int t = 0; t < num_threads; t++) {
        if (pthread_create(&it->threads[t], NULL, worker_main, it) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "PinnedLoader: could not start a worker thread");
            goto error;
        }
        it->started_threads++;
    }
    return (PyObject *)it;
error:
    Py_DECREF(it);
    return NULL;
}

/* --------------------------------------------------------------- next */

static void deadline_in(struct timespec *until, long ms)
{
    clock_gettime(CLOCK_REALTIME, until);
    until->tv_nsec += ms * 1000 * 1000;
    if (until->tv_nsec >= 1000000000L) {
        until->tv_sec++;
        until->tv_nsec -= 1000000000L;
    }
}

/* One consumer at a time: threads sharing an epoch's iterator take turns,
 * each batch going to exactly one of them.  Waits with the GIL released,
 * waking up for signals; -1 with an exception set on Ctrl-C. */
static int enter_consumer(LoaderIterObject *it)
{
    for (;;) {
        int entered = 0;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&it->mu);
        struct timespec until;
        deadline_in(&until, 50);
        int timed_out = 0;
        while (it->consumer_busy && !timed_out)
            timed_out = pthread_cond_timedwait(&it->consumer_cv, &it->mu, &until) == ETIMEDOUT;
        if (!it->consumer_busy)
            it->consumer_busy = entered = 1;
        pthread_mutex_unlock(&it->mu);
        Py_END_ALLOW_THREADS
        if (entered)
            return 0;
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

static void leave_consumer(LoaderIterObject *it)
{
    pthread_mutex_lock(&it->mu);
    it->consumer_busy = 0;
    pthread_cond_signal(&it->consumer_cv);
    pthread_mutex_unlock(&it->mu);
    if (it->closed)
        close_iterator(it); /* releases the ring if it was closed meanwhile */
}

/* Waits (GIL released, waking up for signals) until batch `b` is ready, a
 * worker failed or the iterator is closed.  -1 with an exception set on
 * Ctrl-C. */
static int wait_for_batch(LoaderIterObject *it, loader_slot *slot, int64_t b)
{
    for (;;) {
        int done = 0;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&it->mu);
        struct timespec until;
        deadline_in(&until, 50);
        while (!(slot->batch == b && slot->ready) && !it->has_error && !it->stopping && !done) {
            if (pthread_cond_timedwait(&it->ready_cv, &it->mu, &until) == ETIMEDOUT)
                done = -1;
        }
        if (done == 0)
            done = 1;
        pthread_mutex_unlock(&it->mu);
        Py_END_ALLOW_THREADS
        if (done == 1)
            return 0;
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

/* A fresh (N, H, W, C) root array, shown as (N, C, H, W) with the strides
 * of torch's channels_last format: what a channels_last model takes, with
 * no transpose anywhere. */
static void as_channels_last(ArrayObject *a)
{
    int64_t h = a->shape[1], w = a->shape[2], c = a->shape[3];
    int64_t sh = a->strides[1], sw = a->strides[2], sc = a->strides[3];
    a->shape[1] = c, a->shape[2] = h, a->shape[3] = w;
    a->strides[1] = sc, a->strides[2] = sh, a->strides[3] = sw;
}

/* next_batch for the one consumer inside (consumer_busy set). */
static PyObject *take_batch(ga_state *st, LoaderIterObject *it, PyObject *stream_obj)
{
    if (it->closed || it->next_out >= it->num_batches) {
        close_iterator(it);
        PyErr_SetNone(PyExc_StopIteration);
        return NULL;
    }
    int64_t b = it->next_out;
    loader_slot *slot = &it->slots[b % it->nslots];
    double t0 = now_seconds();
    if (wait_for_batch(it, slot, b) < 0) {
        close_iterator(it); /* Ctrl-C: stop the workers before unwinding */
        return NULL;
    }
    if (it->has_error) {
        close_iterator(it);
        return raise_worker_error(st, it);
    }
    if (it->closed) { /* by another thread while this one waited */
        PyErr_SetNone(PyExc_StopIteration);
        return NULL;
    }
    double waited = now_seconds() - t0;
    int cuda = it->device.type == GA_DEVICE_CUDA;
    if (cuda) {
        ga_stream consumer;
        if (ga_stream_from_object(st, stream_obj, it->device.index, &consumer, "stream") < 0)
            return NULL;
        GA_CHECK(st, ga_cuda_stream_wait_event(it->device.index, consumer, slot->copied));
    }
    PyObject *result = PyTuple_New(it->nsources);
    if (!result)
        return NULL;
    for (int i = 0; i < it->nsources; i++) {
        int64_t shape[GA_MAX_NDIM];
        int ndim = 1 + it->src[i].row_ndim;
        ga_dtype dtype = it->src[i].dtype;
        shape[0] = slot->rows;
        memcpy(shape + 1, it->src[i].row_shape, (size_t)it->src[i].row_ndim * sizeof(int64_t));
        if (i == 0 && it->has_transform) {
            const ga_normalize_desc *d = &it->transform;
            dtype = d->dtype;
            int64_t c = d->c, h = d->h, w = d->w;
            shape[1] = d->nchw ? c : h;
            shape[2] = d->nchw ? h : w;
            shape[3] = d->nchw ? w : c; /* NHWC memory: made (N, C, H, W) below */
        }
        int flags = !cuda && it->pinned_out ? GA_ARRAY_PINNED : 0;
        ArrayObject *arr =
            ga_array_from_block(st, slot->out[i], dtype, ndim, shape, it->device, flags);
        if (!arr) {
            Py_DECREF(result);
            return NULL;
        }
        slot->out[i] = NULL; /* the Array owns it now */
        if (i == 0 && it->has_transform && !it->transform.nchw)
            as_channels_last(arr);
        PyTuple_SET_ITEM(result, i, (PyObject *)arr);
    }
    pthread_mutex_lock(&it->mu);
    it->batches_out++;
    it->samples_out += slot->rows;
    it->wait_seconds += waited;
    slot->batch = -1;
    slot->ready = 0;
    it->next_out++;
    pthread_cond_broadcast(&it->work_cv);
    pthread_mutex_unlock(&it->mu);
    return result;
error:
    return NULL;
}

static PyObject *LoaderIter_next_batch(LoaderIterObject *it, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:next_batch", kwlist, &stream_obj))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(it));
    if (!st)
        return NULL;
    if (forked(it)) {
        if (it->closed) {
            PyErr_SetNone(PyExc_StopIteration);
            return NULL;
        }
        PyErr_Format(PyExc_RuntimeError,
                     "this PinnedLoader epoch was started in process %ld, before fork(); its "
                     "worker threads do not exist in this process (%ld): start a new epoch here "
                     "with iter(loader)",
                     (long)it->owner_pid, (long)getpid());
        return NULL;
    }
    if (enter_consumer(it) < 0)
        return NULL;
    PyObject *result = take_batch(st, it, stream_obj);
    leave_consumer(it);
    return result;
}

static PyObject *LoaderIter_close(LoaderIterObject *it, PyObject *unused)
{
    (void)unused;
    close_iterator(it);
    Py_RETURN_NONE;
}

static PyObject *LoaderIter_stats(LoaderIterObject *it, PyObject *unused)
{
    (void)unused;
    int locked = !forked(it); /* a parent's worker may have held mu at the fork */
    if (locked)
        pthread_mutex_lock(&it->mu);
    double elapsed = now_seconds() - it->started_at;
    PyObject *skipped_files = PyList_New(it->nskip_texts);
    for (int k = 0; skipped_files && k < it->nskip_texts; k++) {
        PyObject *text = PyUnicode_DecodeUTF8(it->skip_texts[k],
                                              (Py_ssize_t)strlen(it->skip_texts[k]), "replace");
        if (!text)
            Py_CLEAR(skipped_files);
        else
            PyList_SET_ITEM(skipped_files, k, text);
    }
    PyObject *r =
        skipped_files
            ? Py_BuildValue(
                  "{s:L,s:L,s:L,s:d,s:d,s:d,s:d,s:d,s:i,s:i,s:L,s:N}", "batches",
                  (long long)it->batches_out, "samples", (long long)it->samples_out,
                  "batches_per_epoch", (long long)it->num_batches, "elapsed_seconds", elapsed,
                  "samples_per_second", elapsed > 0 ? (double)it->samples_out / elapsed : 0.0,
                  "gather_seconds", it->gather_seconds, "copy_seconds", it->copy_seconds,
                  "consumer_wait_seconds", it->wait_seconds, "threads", it->nthreads, "ring_slots",
                  it->nslots, "skipped", (long long)it->skipped, "skipped_files", skipped_files)
            : NULL;
    if (locked)
        pthread_mutex_unlock(&it->mu);
    return r;
}

static PyObject *LoaderIter_jpeg_version(PyObject *unused, PyObject *unused2)
{
    (void)unused, (void)unused2;
    if (!ga_cpu_jpeg_available())
        Py_RETURN_NONE;
    return PyUnicode_FromString(ga_cpu_jpeg_version());
}

static PyObject *LoaderIter_nvjpeg_version(PyObject *unused, PyObject *unused2)
{
    (void)unused, (void)unused2;
    if (!ga_cuda_nvjpeg_available())
        Py_RETURN_NONE;
    return PyUnicode_FromString(ga_cuda_nvjpeg_version());
}

static PyObject *LoaderIter_get_remaining(LoaderIterObject *it, void *c)
{
    (void)c;
    return PyLong_FromLongLong(it->closed ? 0 : it->num_batches - it->next_out);
}

static PyObject *LoaderIter_get_next_batch_index(LoaderIterObject *it, void *c)
{
    (void)c;
    return PyLong_FromLongLong(it->next_out);
}

static PyObject *LoaderIter_get_mappings(LoaderIterObject *it, void *c)
{
    (void)c;
    PyObject *result = PyTuple_New(it->nsources);
    for (int i = 0; result && i < it->nsources; i++)
        PyTuple_SET_ITEM(result, i, Py_NewRef(it->src[i].mapping ? it->src[i].mapping : Py_None));
    return result;
}

static int LoaderIter_traverse(LoaderIterObject *it, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(it));
    Py_VISIT(it->owners);
    Py_VISIT(it->indices_obj);
    return 0;
}

static void LoaderIter_dealloc(LoaderIterObject *it)
{
    PyTypeObject *type = Py_TYPE(it);
    PyObject_GC_UnTrack(it);
    close_iterator(it); /* nobody is inside next_batch: it holds a reference */
    release_ring(it);
    free(it->slots);
    if (!forked(it)) {
        pthread_mutex_destroy(&it->mu);
        pthread_cond_destroy(&it->work_cv);
        pthread_cond_destroy(&it->ready_cv);
        pthread_cond_destroy(&it->consumer_cv);
    }
    Py_CLEAR(it->owners);
    Py_CLEAR(it->indices_obj);
    type->tp_free(it);
    Py_DECREF(type);
}

static PyMethodDef LoaderIter_methods[] = {
    {"next_batch", (PyCFunction)(void (*)(void))LoaderIter_next_batch, METH_VARARGS | METH_KEYWORDS,
     "next_batch(stream=None) -> tuple of Arrays; the consumer stream (CUDA) waits for the "
     "batch on the GPU.  StopIteration at the end of the epoch."},
    {"close", (PyCFunction)LoaderIter_close, METH_NOARGS,
     "Stops and joins the worker threads and frees the ring."},
    {"stats", (PyCFunction)LoaderIter_stats, METH_NOARGS, NULL},
    {"image_geometry", (PyCFunction)(void (*)(void))ga_image_geometry_method,
     METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "image_geometry(width, height, spec, index, epoch=0) -> dict: the crop, resize and flip "
     "sample `index` draws"},
    {"decode_image", (PyCFunction)(void (*)(void))ga_image_decode_method,
     METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "decode_image(data, spec, index, epoch=0) -> (uint8 HWC ndarray, geometry dict)"},
    {"image_size", (PyCFunction)ga_image_size_method, METH_O | METH_STATIC,
     "image_size(data) -> (width, height) of an encoded JPEG"},
    {"nvjpeg_version", (PyCFunction)LoaderIter_nvjpeg_version, METH_NOARGS | METH_STATIC,
     "nvJPEG's version, or None in a build without it"},
    {"jpeg_version", (PyCFunction)LoaderIter_jpeg_version, METH_NOARGS | METH_STATIC,
     "libjpeg-turbo's version, or None in a build without it"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef LoaderIter_getset[] = {
    {"remaining", (getter)LoaderIter_get_remaining, NULL, "batches left in the epoch", NULL},
    {"next_batch_index", (getter)LoaderIter_get_next_batch_index, NULL,
     "index (in the epoch) of the batch next_batch() returns", NULL},
    {"mappings", (getter)LoaderIter_get_mappings, NULL,
     "per source: the mapping its file is read through (None: pread); pass them to the next "
     "epoch's iterator, which reuses those still of the same files",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot LoaderIter_slots[] = {
    {Py_tp_new, LoaderIter_new},
    {Py_tp_dealloc, LoaderIter_dealloc},
    {Py_tp_traverse, LoaderIter_traverse},
    {Py_tp_methods, LoaderIter_methods},
    {Py_tp_getset, LoaderIter_getset},
    {Py_tp_doc, "The native engine of one PinnedLoader epoch (see gpuaccel.PinnedLoader)."},
    {0, NULL},
};

PyType_Spec ga_loader_iter_spec = {
    .name = "gpuaccel._LoaderIter",
    .basicsize = sizeof(LoaderIterObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = LoaderIter_slots,
};
