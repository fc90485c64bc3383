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

/* Decodes a JPEG or PNG held in buf[0 .. n) (told apart by signature) into a new
** uint8 (C, H, W) tensor: C = 3 (RGB; gray expanded, alpha dropped) when channels
** is 3, the file's own (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA) when channels is 0.
** 16-bit PNG samples keep their high byte; palettes are expanded. A corrupt or
** truncated file is EM_ERR_IO with "<op>: '<name>': <why>" in c->err. */
em_status emi_image_decode(emi_dctx *c, const char *op, const char *name,
                           const unsigned char *buf, size_t n, int channels,
                           em_tensor **out);

#endif
