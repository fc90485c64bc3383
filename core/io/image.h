/*
** image.h -- the image decoder shared by em_image_load (core/io/image.c) and the
** image_folder source (core/data/sources_files.c). Both entry points are safe on
** loader worker threads: they report through emi_dfail into the context and
** allocate with emi_dtensor_new, never touching S->errmsg.
*/
#ifndef EMBER_IO_IMAGE_H
#define EMBER_IO_IMAGE_H
#include "../data/data.h"

/* Reads the whole file at path into a malloc'd buffer (*buf, *n; free() it).
** Messages: "<op>: can't open '<path>'", "<op>: '<path>': read error". */
em_status emi_read_file(emi_dctx *c, const char *op, const char *path,
                        unsigned char **buf, size_t *n);

/* What a decode may produce: at most max_pixels pixels (> 0; 0 the default
** EM_IMAGE_MAX_PIXELS, < 0 no limit), checked from the header before anything is
** allocated; a JPEG decoded at the smallest DCT scale n/8 whose output is still
** at least min_h x min_w (both > 0; 0 = full size). */
typedef struct emi_image_want {
  int64_t max_pixels, min_h, min_w;
} emi_image_want;

int64_t emi_image_pixel_limit(int64_t max_pixels);
/* A call's max_pixels (0 = the state's em_image_set_max_pixels) resolved. */
int64_t emi_image_resolve_max(em_state *S, int64_t max_pixels);

/* Decodes a JPEG or PNG held in buf[0 .. n) (told apart by signature) into a new
** uint8 (C, H, W) tensor: C = 3 (RGB; gray expanded, alpha dropped) when channels
** is 3, the file's own (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA) when channels is 0.
** 16-bit PNG samples keep their high byte; palettes are expanded. A corrupt or
** truncated file, or one over the pixel limit, is EM_ERR_IO with
** "<op>: '<name>': <why>" in c->err. want may be NULL (full size, default limit). */
em_status emi_image_decode(emi_dctx *c, const char *op, const char *name,
                           const unsigned char *buf, size_t n, int channels,
                           const emi_image_want *want, em_tensor **out);

#endif
