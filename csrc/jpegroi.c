/*
 * packer.codecs._jpegroi: decode one rectangle of a JPEG through the libjpeg API of a
 * libjpeg-turbo (>= 1.5: jpeg_crop_scanline, jpeg_skip_scanlines) loaded at run time.
 *
 * It links no JPEG library: load(path) opens the one packer.codecs.jpeg_region found (the
 * libjpeg-turbo that Pillow's wheels bundle) and looks up the ten functions it calls, so it
 * builds with a C compiler and Python's headers only (the struct layouts come from
 * libjpeg-turbo 3.2.0's headers in csrc/libjpeg, the libjpeg v6.2 ABI). Errors longjmp back
 * here; a warning stops the decode too: the caller then takes the full decoders' route.
 * The rows go straight into the caller's buffer, and the decode stops after the rectangle's
 * last row (jpeg_abort_decompress): nothing below it is read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#ifdef _WIN32
#include <windows.h>
#else
#include <dlfcn.h>
#endif
#include "jpeglib.h"

typedef struct jpeg_error_mgr *(*std_error_fn)(struct jpeg_error_mgr *);
typedef void (*create_fn)(j_decompress_ptr, int, size_t);
typedef void (*decompress_fn)(j_decompress_ptr);
typedef void (*mem_src_fn)(j_decompress_ptr, const unsigned char *, unsigned long);
typedef int (*read_header_fn)(j_decompress_ptr, boolean);
typedef boolean (*start_fn)(j_decompress_ptr);
typedef void (*crop_fn)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);
typedef JDIMENSION (*skip_fn)(j_decompress_ptr, JDIMENSION);
typedef JDIMENSION (*read_fn)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);

static struct {
    std_error_fn std_error;
    create_fn create;
    decompress_fn destroy, abort_;
    mem_src_fn mem_src;
    read_header_fn read_header;
    start_fn start;
    crop_fn crop;
    skip_fn skip;
    read_fn read;
    int loaded;
} L;

/* TJSAMP_* as TurboJPEG numbers them: 444, 422, 420, GRAY, 440, 411, 441; -1 for others */
enum { SAMP_UNKNOWN = -1, SAMP_GRAY = 3 };

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} error_mgr;

static void on_error(j_common_ptr cinfo) { longjmp(((error_mgr *)cinfo->err)->jump, 1); }

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) longjmp(((error_mgr *)cinfo->err)->jump, 1);  /* a warning: corrupt data */
}

static void on_output(j_common_ptr cinfo) { (void)cinfo; }

typedef struct {
    int width, height, subsampling, h_factor;
} header_t;

enum { OK = 0, FAILED = 1, OUTSIDE = 2 };

/* The SOF marker's type (0xC0..0xCF), 0 when none comes before SOS or the data ends. */
static int sof_type(const unsigned char *p, size_t n) {
    size_t i = 2;
    if (n < 4 || p[0] != 0xFF || p[1] != 0xD8) return 0;
    while (i + 4 <= n) {
        unsigned char m;
        if (p[i] != 0xFF) return 0;
        while (i < n && p[i] == 0xFF) i++;
        if (i >= n) return 0;
        m = p[i++];
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;
        if (m == 0xDA || m == 0xD9) return 0;
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) return m;
        if (i + 2 > n) return 0;
        i += ((size_t)p[i] << 8) | p[i + 1];
    }
    return 0;
}

static int subsampling(j_decompress_ptr d) {
    static const int h[] = {1, 2, 2, 0, 1, 4, 1}, v[] = {1, 1, 2, 0, 2, 1, 4};
    int i;
    if (d->num_components == 1 && d->jpeg_color_space == JCS_GRAYSCALE) return SAMP_GRAY;
    if (d->num_components != 3) return SAMP_UNKNOWN;
    for (i = 1; i < 3; i++)
        if (d->comp_info[i].h_samp_factor != 1 || d->comp_info[i].v_samp_factor != 1)
            return SAMP_UNKNOWN;
    for (i = 0; i < 7; i++)
        if (d->comp_info[0].h_samp_factor == h[i] && d->comp_info[0].v_samp_factor == v[i])
            return i;
    return SAMP_UNKNOWN;
}

/* Read the header into d (created) and *head; FAILED for what this path leaves to the full
   decoders: 12/16-bit, lossless, CMYK/YCCK and other colour spaces. */
static int read_header(j_decompress_ptr d, const unsigned char *data, size_t size,
                       header_t *head) {
    int sof = sof_type(data, size);
    if (sof == 0 || sof == 0xC3 || sof == 0xC7 || sof == 0xCB || sof == 0xCF) return FAILED;
    L.mem_src(d, data, (unsigned long)size);
    if (L.read_header(d, TRUE) != JPEG_HEADER_OK) return FAILED;
    if (d->data_precision != 8) return FAILED;
    if (d->jpeg_color_space != JCS_GRAYSCALE && d->jpeg_color_space != JCS_RGB &&
        d->jpeg_color_space != JCS_YCbCr)
        return FAILED;
    head->width = (int)d->image_width;
    head->height = (int)d->image_height;
    head->subsampling = subsampling(d);
    head->h_factor = d->comp_info[0].h_samp_factor;
    return OK;
}

typedef struct {
    const unsigned char *data;
    size_t size;
    unsigned char *out;
    int left, top, width, height, scale, channels, stride, offset;
    header_t head;
} job_t;

/* Runs without the GIL. */
static int run(job_t *job, int header_only) {
    struct jpeg_decompress_struct d;
    error_mgr err;
    volatile int created = 0, status = FAILED;
    int sw, sh, x0, x1, margin, got;
    JSAMPARRAY rows;

    d.err = L.std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.pub.output_message = on_output;
    if (setjmp(err.jump)) {
        if (created) L.destroy(&d);
        return FAILED;
    }
    L.create(&d, JPEG_LIB_VERSION, sizeof(d));
    created = 1;
    if (read_header(&d, job->data, job->size, &job->head) != OK) goto finish;
    if (header_only) {
        status = OK;
        goto finish;
    }
    sw = (job->head.width + job->scale - 1) / job->scale;
    sh = (job->head.height + job->scale - 1) / job->scale;
    if (job->left < 0 || job->top < 0 || job->width <= 0 || job->height <= 0 ||
        job->left + job->width > sw || job->top + job->height > sh) {
        status = OUTSIDE;
        goto finish;
    }
    d.scale_num = 1;
    d.scale_denom = (unsigned int)job->scale;
    d.out_color_space = job->channels == 4 ? JCS_EXT_RGBX : JCS_EXT_RGB;
    d.dct_method = JDCT_ISLOW;
    d.do_fancy_upsampling = TRUE;
    L.start(&d);
    if ((int)d.output_width != sw || (int)d.output_height != sh) goto finish;
    /* two more columns each side where the image has them (four for 4:1:1): fancy chroma
       upsampling at a cropped edge repeats the edge chroma sample; jpeg_crop_scanline moves
       the left edge to an iMCU boundary itself. Unusual samplings are left to the full
       decoders. */
    if (job->head.subsampling == SAMP_UNKNOWN) goto finish;
    margin = job->head.h_factor > 2 ? job->head.h_factor : 2;
    x0 = job->left - margin > 0 ? job->left - margin : 0;
    x1 = job->left + job->width + margin < sw ? job->left + job->width + margin : sw;
    if (x0 > 0 || x1 < sw) {
        JDIMENSION cx = (JDIMENSION)x0, cw = (JDIMENSION)(x1 - x0);
        L.crop(&d, &cx, &cw);
        x0 = (int)cx;
    }
    if ((int)d.output_width > job->stride || job->left - x0 + job->width > job->stride) goto finish;
    job->offset = job->left - x0;
    /* the rows go straight into out, job->stride pixels apart */
    rows = (JSAMPARRAY)(*d.mem->alloc_small)((j_common_ptr)&d, JPOOL_IMAGE,
                                              sizeof(JSAMPROW) * (size_t)job->height);
    for (got = 0; got < job->height; got++)
        rows[got] = job->out + (size_t)got * job->stride * job->channels;
    if (job->top > 0 && L.skip(&d, (JDIMENSION)job->top) != (JDIMENSION)job->top) goto finish;
    got = 0;
    while (got < job->height) {
        JDIMENSION n = L.read(&d, rows + got, (JDIMENSION)(job->height - got));
        if (n == 0) goto finish;
        got += (int)n;
    }
    status = OK;
finish:
    L.abort_(&d);  /* stop here: the rows below the rectangle are never read */
    L.destroy(&d);
    return status;
}

static PyObject *py_load(PyObject *self, PyObject *args) {
    const char *path;
    void *lib;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    if (L.loaded) Py_RETURN_TRUE;
#ifdef _WIN32
    lib = (void *)LoadLibraryA(path);
#define SYM(name) (void *)GetProcAddress((HMODULE)lib, name)
#else
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
#define SYM(name) dlsym(lib, name)
#endif
    if (lib == NULL) Py_RETURN_FALSE;
    L.std_error = (std_error_fn)SYM("jpeg_std_error");
    L.create = (create_fn)SYM("jpeg_CreateDecompress");
    L.destroy = (decompress_fn)SYM("jpeg_destroy_decompress");
    L.abort_ = (decompress_fn)SYM("jpeg_abort_decompress");
    L.mem_src = (mem_src_fn)SYM("jpeg_mem_src");
    L.read_header = (read_header_fn)SYM("jpeg_read_header");
    L.start = (start_fn)SYM("jpeg_start_decompress");
    L.crop = (crop_fn)SYM("jpeg_crop_scanline");
    L.skip = (skip_fn)SYM("jpeg_skip_scanlines");
    L.read = (read_fn)SYM("jpeg_read_scanlines");
#undef SYM
    /* the library stays open: its functions are ours until the process ends */
    if (!(L.std_error && L.create && L.destroy && L.abort_ && L.mem_src && L.read_header &&
          L.start && L.crop && L.skip && L.read))
        Py_RETURN_FALSE;
    L.loaded = 1;
    Py_RETURN_TRUE;
}

static PyObject *py_header(PyObject *self, PyObject *args) {
    Py_buffer src;
    job_t job;
    int status;
    if (!L.loaded) return PyErr_Format(PyExc_RuntimeError, "no libjpeg loaded");
    if (!PyArg_ParseTuple(args, "y*", &src)) return NULL;
    memset(&job, 0, sizeof(job));
    job.data = (const unsigned char *)src.buf;
    job.size = (size_t)src.len;
    Py_BEGIN_ALLOW_THREADS
    status = run(&job, 1);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    if (status != OK) Py_RETURN_NONE;
    return Py_BuildValue("(iii)", job.head.width, job.head.height, job.head.subsampling);
}

/* decode(data, out, stride, left, top, width, height, scale, channels) -> (status, a, b):
   out holds height rows of stride pixels. Status 0: the rectangle is out[:, a:a + width]
   (decoded from a few columns further left, where the iMCU starts); 1: refused or failed
   (out is undefined); 2: the rectangle is outside the a x b scaled image. */
static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    job_t job;
    int status;
    if (!L.loaded) return PyErr_Format(PyExc_RuntimeError, "no libjpeg loaded");
    memset(&job, 0, sizeof(job));
    if (!PyArg_ParseTuple(args, "y*w*iiiiiii", &src, &dst, &job.stride, &job.left, &job.top,
                          &job.width, &job.height, &job.scale, &job.channels))
        return NULL;
    if ((job.scale != 1 && job.scale != 2 && job.scale != 4 && job.scale != 8) ||
        (job.channels != 3 && job.channels != 4) || job.width <= 0 || job.height <= 0 ||
        job.stride < job.width || dst.len < (Py_ssize_t)job.stride * job.height * job.channels) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError, "bad scale, channels, size or output buffer");
    }
    job.data = (const unsigned char *)src.buf;
    job.size = (size_t)src.len;
    job.out = (unsigned char *)dst.buf;
    Py_BEGIN_ALLOW_THREADS
    status = run(&job, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (status == OUTSIDE)
        return Py_BuildValue("(iii)", status, (job.head.width + job.scale - 1) / job.scale,
                             (job.head.height + job.scale - 1) / job.scale);
    return Py_BuildValue("(iii)", status, job.offset, 0);
}

static PyMethodDef methods[] = {
    {"load", py_load, METH_VARARGS, "load(path) -> bool: use the libjpeg(-turbo) at path"},
    {"header", py_header, METH_VARARGS, "header(data) -> (width, height, subsampling) or None"},
    {"decode", py_decode, METH_VARARGS,
     "decode(data, out, stride, left, top, width, height, scale, channels) -> (status, a, b)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegroi",
                                    "Region-of-interest JPEG decoding (libjpeg API).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__jpegroi(void) { return PyModule_Create(&module); }
