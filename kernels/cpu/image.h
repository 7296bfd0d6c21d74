/*
 * image.h — the CPU image decoder's internals shared by image.c (the
 * resize) and jpeg.c (libjpeg-turbo): a decoded row goes to the resizer as
 * soon as libjpeg hands it over, so only the rows the crop needs are ever
 * held, and each only once.
 */
#ifndef GPUACCEL_CPU_IMAGE_H
#define GPUACCEL_CPU_IMAGE_H

#include "../kernels.h"

/* Fixed-point weights, as PIL's resize: 22 fraction bits leave room for
 * 255 times a sum of weights of 1 in an int32. */
#define GA_RESIZE_BITS 22

typedef struct {
    int64_t first; /* local input pixel of the first tap */
    int64_t count;
    int64_t weights; /* index of its first weight in the axis's weight array */
} ga_resize_tap;

/* One axis's taps for every output pixel, and the input pixels they span. */
typedef struct {
    ga_resize_tap *taps;
    int32_t *weights; /* fixed point (the vertical pass) */
    float *fweights;  /* the same, as floats (the horizontal pass) */
    int64_t ntaps_cap, nweights_cap;
    int64_t lo, hi;   /* local input pixels any tap reads */
    int64_t taps_max; /* weights per output pixel (zeros past a pixel's count) */
} ga_resize_plan;

struct ga_image_workspace {
    ga_resize_plan y, x;
    uint8_t *rows; /* horizontally resized rows [y.lo, y.hi), nx * 3 bytes each */
    size_t rows_cap;
    int32_t *acc; /* one output row's vertical sums */
    size_t acc_cap;
    uint8_t *line; /* one decoded row (RGB or CMYK) */
    size_t line_cap;
    float *fline; /* the columns the horizontal pass reads, as floats */
    size_t fline_cap;
    int64_t nx, row_bytes;
    int flip;
    char message[512]; /* the last error's text (a status points at it) */
};

/* Grows *buf to at least `size` bytes; 0, or -1 when out of memory. */
int ga_image_reserve(void **buf, size_t *cap, size_t size);

/* Computes both axes' taps for geometry g; -1 when out of memory. */
int ga_image_resizer_begin(ga_image_workspace *ws, const ga_image_geometry *g);
/* Local source row `row` (from ws->y.lo to ws->y.hi - 1, in order),
 * RGB pixels starting at local column `col0` (<= ws->x.lo). */
void ga_image_resizer_row(ga_image_workspace *ws, int64_t row, const uint8_t *rgb, int64_t col0);
/* The vertical pass into dst (g->out_h x g->out_w x 3), zeros around. */
void ga_image_resizer_finish(ga_image_workspace *ws, const ga_image_geometry *g, uint8_t *dst);

ga_status ga_image_error(ga_image_workspace *ws, ga_error error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
