/*
** image.c -- JPEG (libjpeg-turbo) and PNG (libpng) decoding into uint8 (C, H, W)
** tensors, and em_image_save / em_image_load.
**
** Both libraries report errors by calling a function that must not return; their
** defaults print to stderr and end the process. Here every decoder and encoder installs an
** error function that keeps the message and longjmps back to the call, which
** frees what it holds and returns EM_ERR_IO. Locals changed after setjmp and read
** on the error path are volatile, as C requires.
**
** The decoder runs on loader worker threads (image_folder), so it reports through
** emi_dfail and allocates with emi_dtensor_new; scratch memory comes from malloc.
** JPEG is decoded with the library defaults PIL uses (JDCT_ISLOW, fancy
** upsampling) so pixels match PIL's exactly; rows are scattered straight from
** libjpeg's interleaved scanlines into the CHW planes while still in cache.
**
** Decompression bombs: a few hundred bytes of header can claim 60000x60000
** pixels. Both decoders read the header first and refuse an image of more than
** max_pixels pixels (PIL's default limit, about 89M, unless told otherwise)
** before anything sized by the image is allocated; the error names the file and
** the size.
**
** Reduced decode: when the caller will shrink the image anyway (image_folder
** with a size), a JPEG is decoded with libjpeg's DCT scaling at the smallest
** scale n/8 whose output is still at least the wanted size, as PIL's draft()
** does. The IDCT then works on fewer coefficients and the colour conversion and
** resize on fewer pixels: several times faster, and the scaled IDCT averages
** the pixels it drops, which the plain bilinear resize would alias.
*/
#include "image.h"
#include <stdio.h>
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>

/* -- Reading files ------------------------------------------------------------ */
em_status emi_read_file(emi_dctx *c, const char *op, const char *path,
                        unsigned char **buf, size_t *n) {
  *buf = NULL;
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return emi_dfail(c, EM_ERR_IO, "%s: can't open '%s'", op, path);
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    return emi_dfail(c, EM_ERR_IO, "%s: '%s' is not a regular file", op, path);
  }
  size_t size = (size_t)sb.st_size;
  unsigned char *p = malloc(size ? size : 1);
  if (!p) {
    fclose(f);
    return emi_dfail(c, EM_ERR_NOMEM, "%s: '%s': out of memory reading %zu bytes", op,
                     path, size);
  }
  size_t got = size ? fread(p, 1, size, f) : 0;
  int bad = ferror(f);
  fclose(f);
  if (bad || got != size) {
    free(p);
    return emi_dfail(c, EM_ERR_IO, "%s: '%s': read error (%zu of %zu bytes)", op, path,
                     got, size);
  }
  *buf = p;
  *n = size;
  return EM_OK;
}

/* Interleaved rows (H rows of W pixels of C bytes, `pitch` bytes apart) into the
** planes of a contiguous uint8 (C, H, W) tensor starting at row y0. */
static void scatter_rows(uint8_t *chw, int64_t H, int64_t W, int C, int64_t y0,
                         const uint8_t *rows, size_t pitch, int64_t nrows) {
  for (int64_t r = 0; r < nrows; r++) {
    const uint8_t *s = rows + (size_t)r * pitch;
    uint8_t *d = chw + (y0 + r) * W;
    if (C == 1) {
      memcpy(d, s, (size_t)W);
    } else if (C == 3) {
      uint8_t *d0 = d, *d1 = d + H * W, *d2 = d + 2 * H * W;
      for (int64_t x = 0; x < W; x++) {
        d0[x] = s[3 * x];
        d1[x] = s[3 * x + 1];
        d2[x] = s[3 * x + 2];
      }
    } else {
      for (int ch = 0; ch < C; ch++) {
        uint8_t *dc = d + ch * H * W;
        for (int64_t x = 0; x < W; x++) dc[x] = s[C * x + ch];
      }
    }
  }
}

/* Puts the file's name into a message "<op>: <why>" from emi_dtensor_new, which
** knows only the shape: "<op>: '<name>': <why>". */
static em_status rename_err(emi_dctx *c, em_status st, const char *op, const char *name) {
  char why[sizeof c->err];
  size_t k = strlen(op);
  snprintf(why, sizeof why, "%s", strncmp(c->err, op, k) == 0 && c->err[k] == ':'
                                   ? c->err + k + 2 : c->err);
  return emi_dfail(c, st, "%s: '%s': %s", op, name, why);
}

/* -- JPEG ----------------------------------------------------------------------- */
typedef struct jerr_mgr {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
} jerr_mgr;

static void jpeg_on_error(j_common_ptr cinfo) {
  jerr_mgr *e = (jerr_mgr *)cinfo->err;
  cinfo->err->format_message(cinfo, e->msg);
  longjmp(e->jb, 1);
}

/* Keeps the text instead of printing it (libjpeg's default writes to stderr). */
static void jpeg_on_output(j_common_ptr cinfo) {
  jerr_mgr *e = (jerr_mgr *)cinfo->err;
  cinfo->err->format_message(cinfo, e->msg);
}

/* Warnings (level -1) are ignored as libjpeg does, except running out of data:
** libjpeg would pad the image with grey, PIL refuses a truncated file, so do we. */
static void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  int code = cinfo->err->msg_code;
  if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER) {
    jerr_mgr *e = (jerr_mgr *)cinfo->err;
    if (code == JWRN_JPEG_EOF)
      snprintf(e->msg, sizeof e->msg, "truncated file");
    else
      cinfo->err->format_message(cinfo, e->msg);
    longjmp(e->jb, 1);
  }
  cinfo->err->num_warnings++;
}

static void jpeg_errors(struct jpeg_error_mgr *pub) {
  pub->error_exit = jpeg_on_error;
  pub->output_message = jpeg_on_output;
  pub->emit_message = jpeg_on_message;
}

/* Adobe CMYK (stored inverted) to RGB the way PIL converts it:
** r = (255 - c)(255 - k) / 255 with PIL's rounding. */
static inline uint8_t muldiv255(unsigned a, unsigned b) {
  unsigned t = a * b + 128;
  return (uint8_t)(((t >> 8) + t) >> 8);
}

/* The limit a max_pixels setting means: > 0 itself, 0 the default, < 0 none. */
int64_t emi_image_pixel_limit(int64_t max_pixels) {
  return max_pixels > 0 ? max_pixels : max_pixels == 0 ? EM_IMAGE_MAX_PIXELS : INT64_MAX;
}

static em_status too_big(emi_dctx *c, const char *op, const char *name, const char *kind,
                         int64_t w, int64_t h, int64_t limit) {
  return emi_dfail(c, EM_ERR_IO, "%s: '%s': %s of %lldx%lld = %lld pixels is over the "
                   "limit of %lld pixels (max_pixels; a decompression bomb?)", op, name,
                   kind, (long long)w, (long long)h, (long long)(w * h), (long long)limit);
}

static em_status decode_jpeg(emi_dctx *c, const char *op, const char *name,
                             const unsigned char *buf, size_t n, int channels,
                             const emi_image_want *want, em_tensor **out) {
  struct jpeg_decompress_struct cinfo;
  jerr_mgr jerr;
  em_tensor *volatile t = NULL;
  unsigned char *volatile scratch = NULL;
  cinfo.err = jpeg_std_error(&jerr.pub);
  jpeg_errors(&jerr.pub);
  jerr.msg[0] = 0;
  if (setjmp(jerr.jb)) {
    jpeg_destroy_decompress(&cinfo);
    free(scratch);
    em_tensor_release(t);
    return emi_dfail(c, EM_ERR_IO, "%s: '%s': corrupt JPEG (%s)", op, name, jerr.msg);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, buf, (unsigned long)n);
  jpeg_read_header(&cinfo, TRUE);
  int cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  int C = 3;
  if (cmyk) cinfo.out_color_space = JCS_CMYK;
  else if (channels == 0 && cinfo.num_components == 1) {
    cinfo.out_color_space = JCS_GRAYSCALE;
    C = 1;
  } else cinfo.out_color_space = JCS_RGB;
  cinfo.dct_method = JDCT_ISLOW;
  /* dimensions are < 2^16 each in JPEG, so the product can't overflow */
  int64_t limit = emi_image_pixel_limit(want->max_pixels);
  if ((int64_t)cinfo.image_width * cinfo.image_height > limit) {
    int64_t w = cinfo.image_width, h = cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    return too_big(c, op, name, "a JPEG", w, h, limit);
  }
  if (want->min_h > 0 && want->min_w > 0) {
    /* the smallest n/8 whose output still covers the wanted size; 8/8 at worst */
    for (unsigned num = 1; num <= 8; num++) {
      cinfo.scale_num = num;
      cinfo.scale_denom = 8;
      jpeg_calc_output_dimensions(&cinfo);
      if ((int64_t)cinfo.output_width >= want->min_w &&
          (int64_t)cinfo.output_height >= want->min_h)
        break;
    }
  }
  jpeg_start_decompress(&cinfo);
  int64_t H = cinfo.output_height, W = cinfo.output_width;
  int comps = cinfo.output_components;
  int batch = cinfo.rec_outbuf_height > 0 ? cinfo.rec_outbuf_height : 1;
  size_t pitch = (size_t)W * (size_t)comps;
  scratch = malloc(pitch * (size_t)batch);
  if (!scratch) {
    jpeg_destroy_decompress(&cinfo);
    return emi_dfail(c, EM_ERR_NOMEM, "%s: '%s': out of memory decoding a %lldx%lld JPEG",
                     op, name, (long long)W, (long long)H);
  }
  em_tensor *tt;
  em_status st = emi_dtensor_new(c, op, (const int64_t[]){C, H, W}, 3, EM_UINT8, &tt);
  if (st) {   /* the message names the file, not just the shape */
    jpeg_destroy_decompress(&cinfo);
    free(scratch);
    return rename_err(c, st, op, name);
  }
  t = tt;
  uint8_t *chw = em_tensor_data(tt);
  JSAMPROW rows[16];
  if (batch > 16) batch = 16;
  for (int r = 0; r < batch; r++) rows[r] = scratch + (size_t)r * pitch;
  while (cinfo.output_scanline < cinfo.output_height) {
    int64_t y0 = cinfo.output_scanline;
    int64_t got = jpeg_read_scanlines(&cinfo, rows, (JDIMENSION)batch);
    if (got <= 0) break;   /* cannot happen with a memory source; be safe */
    if (cmyk) {
      int inv = cinfo.saw_Adobe_marker;   /* Adobe writes CMYK inverted */
      for (int64_t r = 0; r < got; r++) {
        uint8_t *s = rows[r];
        for (int64_t x = 0; x < W; x++) {
          unsigned cc[3], k = inv ? s[4 * x + 3] : 255u - s[4 * x + 3];
          for (int ch = 0; ch < 3; ch++) cc[ch] = inv ? 255u - s[4 * x + ch] : s[4 * x + ch];
          /* compacted in place to 3 bytes a pixel: 3x+2 < 4x+4, nothing unread is hit */
          for (int ch = 0; ch < 3; ch++) s[3 * x + ch] = (uint8_t)(k - muldiv255(cc[ch], k));
        }
      }
      scatter_rows(chw, H, W, 3, y0, scratch, pitch, got);
    } else {
      scatter_rows(chw, H, W, C, y0, scratch, pitch, got);
    }
  }
  if (cinfo.output_scanline < cinfo.output_height) {
    snprintf(jerr.msg, sizeof jerr.msg, "truncated file");
    longjmp(jerr.jb, 1);
  }
  /* No jpeg_finish_decompress: the pixels are all here, and a file missing only
  ** its end marker still loads (as in PIL). */
  jpeg_destroy_decompress(&cinfo);
  free(scratch);
  *out = tt;
  return EM_OK;
}

/* -- PNG -------------------------------------------------------------------------- */
typedef struct png_io {
  const unsigned char *p;
  size_t left;
  char msg[256];
} png_io;

static void png_on_error(png_structp png, png_const_charp msg) {
  png_io *io = png_get_error_ptr(png);
  snprintf(io->msg, sizeof io->msg, "%s", msg);
  png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
  (void)png;
  (void)msg;
}

static void png_read_mem(png_structp png, png_bytep dst, size_t n) {
  png_io *io = png_get_io_ptr(png);
  if (n > io->left) png_error(png, "truncated file");
  memcpy(dst, io->p, n);
  io->p += n;
  io->left -= n;
}

static em_status decode_png(emi_dctx *c, const char *op, const char *name,
                            const unsigned char *buf, size_t n, int channels,
                            const emi_image_want *want, em_tensor **out) {
  png_io io = {buf, n, ""};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &io, png_on_error,
                                           png_on_warning);
  if (!png) return emi_dfail(c, EM_ERR_NOMEM, "%s: '%s': out of memory", op, name);
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, NULL, NULL);
    return emi_dfail(c, EM_ERR_NOMEM, "%s: '%s': out of memory", op, name);
  }
  em_tensor *volatile t = NULL;
  unsigned char *volatile scratch = NULL;
  png_bytep *volatile rowp = NULL;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, NULL);
    free(scratch);
    free(rowp);
    em_tensor_release(t);
    return emi_dfail(c, EM_ERR_IO, "%s: '%s': corrupt PNG (%s)", op, name, io.msg);
  }
  png_set_read_fn(png, &io, png_read_mem);
  png_read_info(png, info);
  png_uint_32 w, h;
  int depth, ctype, interlace;
  png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
  int64_t limit = emi_image_pixel_limit(want->max_pixels);
  if ((int64_t)w * (int64_t)h > limit) {   /* only IHDR was read: nothing big yet */
    png_destroy_read_struct(&png, &info, NULL);
    return too_big(c, op, name, "a PNG", w, h, limit);
  }
  if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);  /* + tRNS alpha */
  if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);          /* the high byte, as PIL */
  if (channels == 3) {
    if (ctype & PNG_COLOR_MASK_ALPHA ||
        (ctype == PNG_COLOR_TYPE_PALETTE && png_get_valid(png, info, PNG_INFO_tRNS)))
      png_set_strip_alpha(png);
    if (!(ctype & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  }
  int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  int C = png_get_channels(png, info);
  int64_t H = h, W = w;
  size_t pitch = png_get_rowbytes(png, info);
  if (pitch != (size_t)W * (size_t)C) png_error(png, "unexpected row layout");
  em_tensor *tt;
  em_status st = emi_dtensor_new(c, op, (const int64_t[]){C, H, W}, 3, EM_UINT8, &tt);
  if (st) {
    png_destroy_read_struct(&png, &info, NULL);
    return rename_err(c, st, op, name);
  }
  t = tt;
  uint8_t *chw = em_tensor_data(tt);
  if (C == 1 || passes > 1) {
    /* Whole image at once: rows straight into the tensor (gray) or into an HWC
    ** scratch that is scattered after (interlaced colour). */
    uint8_t *base = chw;
    if (C > 1) {
      scratch = malloc(pitch * (size_t)H);
      if (!scratch) png_error(png, "out of memory");
      base = scratch;
    }
    rowp = malloc(sizeof(png_bytep) * (size_t)(H ? H : 1));
    if (!rowp) png_error(png, "out of memory");
    for (int64_t y = 0; y < H; y++) rowp[y] = base + (size_t)y * pitch;
    png_read_image(png, rowp);
    if (C > 1) scatter_rows(chw, H, W, C, 0, scratch, pitch, H);
  } else {
    scratch = malloc(pitch);
    if (!scratch) png_error(png, "out of memory");
    for (int64_t y = 0; y < H; y++) {
      png_read_row(png, scratch, NULL);
      scatter_rows(chw, H, W, C, y, scratch, pitch, 1);
    }
  }
  png_destroy_read_struct(&png, &info, NULL);
  free(scratch);
  free(rowp);
  *out = tt;
  return EM_OK;
}

/* -- Entry points ------------------------------------------------------------------- */
em_status emi_image_decode(emi_dctx *c, const char *op, const char *name,
                           const unsigned char *buf, size_t n, int channels,
                           const emi_image_want *want, em_tensor **out) {
  *out = NULL;
  static const emi_image_want plain = {0, 0, 0};
  if (!want) want = &plain;
  static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (n >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff)
    return decode_jpeg(c, op, name, buf, n, channels, want, out);
  if (n >= 8 && memcmp(buf, png_sig, 8) == 0)
    return decode_png(c, op, name, buf, n, channels, want, out);
  return emi_dfail(c, EM_ERR_IO, "%s: '%s': not a JPEG or PNG file%s", op, name,
                   n == 0 ? " (empty)" : "");
}

void em_image_set_max_pixels(em_state *S, int64_t max_pixels) {
  S->image_max_pixels = max_pixels < 0 ? -1 : max_pixels;
}

int64_t em_image_max_pixels(em_state *S) {
  int64_t m = S->image_max_pixels;
  return m < 0 ? -1 : emi_image_pixel_limit(m);
}

/* The state's setting, unless the call's own max_pixels (non-zero) says otherwise. */
int64_t emi_image_resolve_max(em_state *S, int64_t max_pixels) {
  return max_pixels ? max_pixels : S->image_max_pixels;
}

em_status em_image_load(em_state *S, const char *path, int channels, em_tensor **out) {
  return em_image_load_opts(S, path, channels, NULL, out);
}

em_status em_image_load_opts(em_state *S, const char *path, int channels,
                             const em_image_opts *o, em_tensor **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "image_load: out is required");
  *out = NULL;
  if (!path) return emi_error(S, EM_ERR_ARG, "image_load: path is required");
  if (channels != 0 && channels != 3)
    return emi_error(S, EM_ERR_ARG, "image_load: channels must be 0 (as stored) or 3, not %d",
                     channels);
  emi_dctx c;
  emi_dctx_init(&c, S, -1, 0);
  unsigned char *buf;
  size_t n;
  em_status st = emi_read_file(&c, "image_load", path, &buf, &n);
  if (!st) {
    emi_image_want want = {emi_image_resolve_max(S, o ? o->max_pixels : 0), 0, 0};
    st = emi_image_decode(&c, "image_load", path, buf, n, channels, &want, out);
    free(buf);
  }
  if (st) return emi_error(S, st, "%s", c.err);
  return EM_OK;
}

/* -- Saving ---------------------------------------------------------------------------- */
/* Row y of a strided uint8 (C, H, W) image, interleaved into dst (W*C bytes). */
static void gather_row(const em_tensor *img, int C, int64_t y, uint8_t *dst) {
  const uint8_t *base = em_tensor_data(img);
  int nd = img->ndim;
  int64_t sc = nd == 3 ? img->strides[0] : 0;
  int64_t sy = img->strides[nd - 2], sx = img->strides[nd - 1];
  int64_t W = img->sizes[nd - 1];
  for (int ch = 0; ch < C; ch++) {
    const uint8_t *s = base + ch * sc + y * sy;
    for (int64_t x = 0; x < W; x++) dst[x * C + ch] = s[x * sx];
  }
}

static em_status save_png(em_state *S, const char *path, FILE *f, const em_tensor *img,
                          int C, int64_t H, int64_t W) {
  png_io io = {NULL, 0, ""};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &io, png_on_error,
                                            png_on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info) {
    png_destroy_write_struct(&png, NULL);
    return emi_error(S, EM_ERR_NOMEM, "image_save: '%s': out of memory", path);
  }
  uint8_t *volatile row = NULL;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    free(row);
    return emi_error(S, EM_ERR_IO, "image_save: '%s': %s", path, io.msg);
  }
  row = malloc((size_t)W * (size_t)C);
  if (!row) png_error(png, "out of memory");
  png_init_io(png, f);
  png_set_IHDR(png, info, (png_uint_32)W, (png_uint_32)H, 8,
               C == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < H; y++) {
    gather_row(img, C, y, row);
    png_write_row(png, row);
  }
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  free(row);
  return EM_OK;
}

static em_status save_jpeg(em_state *S, const char *path, FILE *f, const em_tensor *img,
                           int C, int64_t H, int64_t W, int quality) {
  struct jpeg_compress_struct cinfo;
  jerr_mgr jerr;
  uint8_t *volatile row = NULL;
  cinfo.err = jpeg_std_error(&jerr.pub);
  jpeg_errors(&jerr.pub);
  jerr.msg[0] = 0;
  if (setjmp(jerr.jb)) {
    jpeg_destroy_compress(&cinfo);
    free(row);
    return emi_error(S, EM_ERR_IO, "image_save: '%s': %s", path, jerr.msg);
  }
  jpeg_create_compress(&cinfo);
  row = malloc((size_t)W * (size_t)C);
  if (!row) {
    snprintf(jerr.msg, sizeof jerr.msg, "out of memory");
    longjmp(jerr.jb, 1);
  }
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = (JDIMENSION)W;
  cinfo.image_height = (JDIMENSION)H;
  cinfo.input_components = C;
  cinfo.in_color_space = C == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  for (int64_t y = 0; y < H; y++) {
    gather_row(img, C, y, row);
    JSAMPROW rp = row;
    jpeg_write_scanlines(&cinfo, &rp, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  free(row);
  return EM_OK;
}

static int has_ext(const char *path, const char *ext) {
  size_t n = strlen(path), e = strlen(ext);
  return n > e && strcasecmp(path + n - e, ext) == 0;
}

em_status em_image_save(em_state *S, const char *path, const em_tensor *img, int quality) {
  if (!path) return emi_error(S, EM_ERR_ARG, "image_save: path is required");
  em_status st = emi_check_tensor(S, "image_save", img);
  if (st) return st;
  if (img->dtype != EM_UINT8)
    return emi_error(S, EM_ERR_DTYPE, "image_save: the image must be uint8, not %s",
                     em_dtype_name(img->dtype));
  if (img->device != EM_CPU)
    return emi_error(S, EM_ERR_DEVICE, "image_save: the image must be on the CPU");
  int C = img->ndim == 3 ? (int)img->sizes[0] : 1;
  if ((img->ndim != 3 && img->ndim != 2) || (C != 1 && C != 3))
    return emi_error(S, EM_ERR_SHAPE,
                     "image_save: the image must be (C, H, W) with C 1 or 3 (or (H, W)), "
                     "not %s", emi_tshape(S, img));
  int64_t H = img->sizes[img->ndim - 2], W = img->sizes[img->ndim - 1];
  if (H < 1 || W < 1 || H > 65500 || W > 65500)
    return emi_error(S, EM_ERR_SHAPE, "image_save: can't save an image of %s",
                     emi_tshape(S, img));
  int jpeg = has_ext(path, ".jpg") || has_ext(path, ".jpeg");
  if (!jpeg && !has_ext(path, ".png"))
    return emi_error(S, EM_ERR_ARG,
                     "image_save: '%s': the name must end in .png, .jpg or .jpeg", path);
  if (quality == 0) quality = 90;
  if (quality < 1 || quality > 100)
    return emi_error(S, EM_ERR_ARG, "image_save: quality must be 1..100, not %d", quality);
  FILE *f = fopen(path, "wb");
  if (!f) return emi_error(S, EM_ERR_IO, "image_save: can't create '%s'", path);
  st = jpeg ? save_jpeg(S, path, f, img, C, H, W, quality)
            : save_png(S, path, f, img, C, H, W);
  int bad = fclose(f) != 0;
  if (!st && bad) st = emi_error(S, EM_ERR_IO, "image_save: '%s': write error", path);
  if (st) remove(path);   /* no half-written image left behind */
  return st;
}
