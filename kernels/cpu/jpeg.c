/*
 * jpeg.c — JPEG decoding on the CPU with libjpeg-turbo, of only what a
 * sample's crop needs.
 *
 * RandomResizedCrop keeps a fraction of the image: the rows above the crop
 * are skipped (jpeg_skip_scanlines: entropy-decoded, never transformed or
 * color-converted), its columns alone are transformed (jpeg_crop_scanline,
 * widened to whole iMCUs), and decoding stops after its last row.  Where
 * the crop is at least twice the output size along both axes, the IDCT
 * itself scales by 1/2, 1/4 or 1/8 (its reduced transforms are cheaper
 * than the full one; the 5/8..7/8 scales are not, and are not used).  Each
 * row goes to the resizer as it comes out (image.c), so no full image is
 * ever held.
 *
 * A damaged file is an error, never a partly gray image: libjpeg's
 * warnings about corrupt data (a premature end fills the rest with gray)
 * are errors here, all but "extraneous bytes before marker", which real
 * files carry harmlessly.  Stopping after the crop's last row would miss a
 * file cut below it, so a file whose end-of-image marker is not within its
 * last bytes is decoded to the end before it counts as whole.
 *
 * Built only when setup.py finds libjpeg-turbo (jpeglib.h with
 * jpeg_crop_scanline); otherwise decoding says what to install.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "image.h"

#define GA_JPEG_INSTALL                                                                          \
    "this gpuaccel was built without libjpeg-turbo; install it (Debian/Ubuntu: apt-get install " \
    "libjpeg62-turbo-dev, or libjpeg-turbo8-dev; Fedora: libjpeg-turbo-devel) and rebuild"

#ifdef GPUACCEL_WITH_JPEG

#include <setjmp.h>

#include <jerror.h>
#include <jpeglib.h>

/* Bytes after the end-of-image marker that still count as a whole file
 * (padding, trailers some cameras write). */
#define GA_JPEG_TAIL_BYTES 4096
/* Pixels decoded past each side of the region the resize reads (an iMCU
 * of 4:2:0 is 16 pixels). */
#define GA_JPEG_MARGIN 16

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf env;
    char text[JMSG_LENGTH_MAX];
} decode_errors;

static void on_error_exit(j_common_ptr cinfo)
{
    decode_errors *e = (decode_errors *)cinfo->err;
    e->pub.format_message(cinfo, e->text);
    longjmp(e->env, 1);
}

/* Level -1 is a warning, which for libjpeg means damaged data it papered
 * over. */
static void on_message(j_common_ptr cinfo, int level)
{
    decode_errors *e = (decode_errors *)cinfo->err;
    if (level < 0 && e->pub.msg_code != JWRN_EXTRANEOUS_DATA) {
        e->pub.format_message(cinfo, e->text);
        longjmp(e->env, 1);
    }
}

static int ends_with_eoi(const uint8_t *data, size_t size)
{
    size_t stop = size > GA_JPEG_TAIL_BYTES ? size - GA_JPEG_TAIL_BYTES : 0;
    for (size_t i = size; i >= stop + 2; i--)
        if (data[i - 2] == 0xFF && data[i - 1] == 0xD9)
            return 1;
    return 0;
}

static inline uint8_t mul255(int a, int b)
{
    int x = a * b + 128;
    return (uint8_t)((x + (x >> 8)) >> 8);
}

/* CMYK as libjpeg returns it to RGB, as PIL and torchvision convert it:
 * Adobe's files store the inks inverted (255 = none). */
static void cmyk_to_rgb(const uint8_t *cmyk, uint8_t *rgb, int64_t n, int inverted)
{
    for (int64_t i = 0; i < n; i++) {
        int c = cmyk[4 * i], m = cmyk[4 * i + 1], y = cmyk[4 * i + 2], k = cmyk[4 * i + 3];
        if (!inverted)
            c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
        rgb[3 * i] = mul255(c, k);
        rgb[3 * i + 1] = mul255(m, k);
        rgb[3 * i + 2] = mul255(y, k);
    }
}

/* An axis of the geometry in the coordinates of a 1/denom-scale decode of
 * `scaled` pixels. */
static void scale_axis(ga_resize_axis *a, int denom, int64_t scaled)
{
    double d = (double)denom;
    a->origin /= d;
    a->scale /= d;
    a->lo = (int64_t)floor((double)a->lo / d);
    a->hi = (int64_t)ceil((double)a->hi / d);
    a->hi = a->hi > scaled ? scaled : a->hi;
}

/* The largest of 8, 4, 2 that keeps the crop at least the output size
 * along both axes, or 1. */
static int dct_denominator(const ga_image_transform *t, const ga_image_geometry *g)
{
    if (!t->dct_scaling || g->ny <= 0 || g->nx <= 0)
        return 1;
    for (int d = 8; d >= 2; d /= 2)
        if (g->ry.scale >= d && g->rx.scale >= d)
            return d;
    return 1;
}

static ga_status not_jpeg(ga_image_workspace *ws, const uint8_t *data, size_t size)
{
    ga_image_format format = ga_image_format_of(data, size);
    if (size == 0)
        return ga_image_error(ws, GA_ERR_NOT_SUPPORTED, "the file is empty");
    if (format == GA_IMAGE_PNG)
        return ga_image_error(ws, GA_ERR_NOT_SUPPORTED,
                              "this is a PNG image, and the loader decodes JPEG only: convert it "
                              "to JPEG, or load it with a torch DataLoader and give that to "
                              "PinnedLoader");
    char start[64] = "";
    for (size_t i = 0; i < size && i < 8; i++)
        snprintf(start + strlen(start), sizeof start - strlen(start), "%s%02x", i ? " " : "",
                 data[i]);
    return ga_image_error(ws, GA_ERR_NOT_SUPPORTED,
                          "not a JPEG file: it starts with bytes %s, a JPEG with ff d8 ff", start);
}

int ga_cpu_jpeg_available(void)
{
    return 1;
}

const char *ga_cpu_jpeg_version(void)
{
#ifdef LIBJPEG_TURBO_VERSION
#define GA_STR2(x) #x
#define GA_STR(x) GA_STR2(x)
    return GA_STR(LIBJPEG_TURBO_VERSION);
#else
    return "unknown libjpeg";
#endif
}

ga_status ga_cpu_image_size(const uint8_t *data, size_t size, int64_t *width, int64_t *height,
                            ga_image_workspace *ws)
{
    if (ga_image_format_of(data, size) != GA_IMAGE_JPEG)
        return not_jpeg(ws, data, size);
    struct jpeg_decompress_struct cinfo;
    decode_errors err;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error_exit;
    err.pub.emit_message = on_message;
    if (setjmp(err.env)) {
        jpeg_destroy_decompress(&cinfo);
        return ga_image_error(ws, GA_ERR_INVALID_VALUE, "damaged JPEG header: %s", err.text);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    *width = cinfo.image_width;
    *height = cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    return ga_ok();
}

/* The decode proper; returns 0, or -1 with ws->message set (the caller
 * has already set up the error jump). */
static int decode(struct jpeg_decompress_struct *cinfo, const uint8_t *data, size_t size,
                  const ga_image_transform *t, int64_t index, uint8_t *dst, ga_image_workspace *ws,
                  ga_image_geometry *geometry)
{
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    int cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
    cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    ga_image_geometry g;
    ga_image_plan(t, index, cinfo->image_width, cinfo->image_height, &g);
    if (geometry)
        *geometry = g;
    int denom = dct_denominator(t, &g);
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned)denom;
    jpeg_start_decompress(cinfo);
    if (denom > 1) {
        scale_axis(&g.ry, denom, cinfo->output_height);
        scale_axis(&g.rx, denom, cinfo->output_width);
    }
    if (ga_image_resizer_begin(ws, &g) < 0) {
        snprintf(ws->message, sizeof ws->message, "out of memory for the decoder's buffers");
        return -1;
    }
    int64_t row_lo = g.ry.lo + ws->y.lo, row_hi = g.ry.lo + ws->y.hi;
    if (row_hi > row_lo && ws->x.hi > ws->x.lo) {
        /* libjpeg's chroma upsampling treats the edges of a cropped or
         * skipped-to region as the image's edges: a margin past each keeps
         * the pixels the resize reads as a full decode gives them */
        int64_t col_lo = g.rx.lo + ws->x.lo - GA_JPEG_MARGIN;
        int64_t col_hi = g.rx.lo + ws->x.hi + GA_JPEG_MARGIN;
        col_lo = col_lo < 0 ? 0 : col_lo;
        col_hi = col_hi > (int64_t)cinfo->output_width ? (int64_t)cinfo->output_width : col_hi;
        JDIMENSION xoff = (JDIMENSION)col_lo;
        JDIMENSION width = (JDIMENSION)(col_hi - col_lo);
        if (width < cinfo->output_width)
            jpeg_crop_scanline(cinfo, &xoff, &width);
        int64_t comps = cinfo->output_components;
        size_t line_bytes = (size_t)cinfo->output_width * (size_t)(comps + 3);
        if (ga_image_reserve((void **)&ws->line, &ws->line_cap, line_bytes) < 0) {
            snprintf(ws->message, sizeof ws->message, "out of memory for the decoder's buffers");
            return -1;
        }
        JSAMPROW line = ws->line;
        uint8_t *rgb = ws->line + (size_t)cinfo->output_width * (size_t)comps;
        int64_t first = row_lo - GA_JPEG_MARGIN > 0 ? row_lo - GA_JPEG_MARGIN : 0;
        if (first > 0)
            jpeg_skip_scanlines(cinfo, (JDIMENSION)first);
        for (int64_t r = first; r < row_lo; r++) /* the margin: decoded, not used */
            jpeg_read_scanlines(cinfo, &line, 1);
        for (int64_t r = row_lo; r < row_hi; r++) {
            jpeg_read_scanlines(cinfo, &line, 1);
            if (cmyk)
                cmyk_to_rgb(line, rgb, cinfo->output_width, cinfo->saw_Adobe_marker);
            ga_image_resizer_row(ws, r - g.ry.lo, cmyk ? rgb : line, (int64_t)xoff - g.rx.lo);
        }
    }
    if (ends_with_eoi(data, size)) {
        jpeg_abort_decompress(cinfo);
    } else {
        /* no end marker near the end: decode the rest to see it is whole.
         * The last row is read, not skipped: skipping to the very end
         * marks the input finished without reading it. */
        JDIMENSION left = cinfo->output_height - cinfo->output_scanline;
        if (left > 1)
            jpeg_skip_scanlines(cinfo, left - 1);
        if (left > 0) {
            JSAMPROW line = ws->line;
            size_t bytes = (size_t)cinfo->output_width * (size_t)(cinfo->output_components + 3);
            if (ga_image_reserve((void **)&ws->line, &ws->line_cap, bytes) < 0) {
                snprintf(ws->message, sizeof ws->message,
                         "out of memory for the decoder's buffers");
                return -1;
            }
            line = ws->line;
            jpeg_read_scanlines(cinfo, &line, 1);
        }
        jpeg_finish_decompress(cinfo);
    }
    ga_image_resizer_finish(ws, &g, dst);
    return 0;
}

ga_status ga_cpu_decode_image(const uint8_t *data, size_t size, const ga_image_transform *t,
                              int64_t index, uint8_t *dst, ga_image_workspace *ws,
                              ga_image_geometry *geometry)
{
    if (ga_image_format_of(data, size) != GA_IMAGE_JPEG)
        return not_jpeg(ws, data, size);
    struct jpeg_decompress_struct cinfo;
    decode_errors err;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error_exit;
    err.pub.emit_message = on_message;
    if (setjmp(err.env)) {
        jpeg_destroy_decompress(&cinfo);
        return ga_image_error(ws, GA_ERR_INVALID_VALUE, "damaged JPEG data: %s", err.text);
    }
    jpeg_create_decompress(&cinfo);
    int rc = decode(&cinfo, data, size, t, index, dst, ws, geometry);
    jpeg_destroy_decompress(&cinfo);
    if (rc < 0)
        return ga_status_make(GA_ERR_HOST_OUT_OF_MEMORY, 0, NULL, ws->message, "decode", __FILE__,
                              __LINE__);
    return ga_ok();
}

#else /* no libjpeg-turbo in this build */

int ga_cpu_jpeg_available(void)
{
    return 0;
}

const char *ga_cpu_jpeg_version(void)
{
    return "";
}

ga_status ga_cpu_image_size(const uint8_t *data, size_t size, int64_t *width, int64_t *height,
                            ga_image_workspace *ws)
{
    (void)data, (void)size, (void)width, (void)height, (void)ws;
    return GA_STATUS(GA_ERR_NOT_SUPPORTED, GA_JPEG_INSTALL);
}

ga_status ga_cpu_decode_image(const uint8_t *data, size_t size, const ga_image_transform *t,
                              int64_t index, uint8_t *dst, ga_image_workspace *ws,
                              ga_image_geometry *geometry)
{
    (void)data, (void)size, (void)t, (void)index, (void)dst, (void)ws, (void)geometry;
    return GA_STATUS(GA_ERR_NOT_SUPPORTED, GA_JPEG_INSTALL);
}

#endif
