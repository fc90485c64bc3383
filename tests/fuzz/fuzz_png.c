/*
** fuzz_png.c -- libFuzzer harness for PNG decoding (em_image_load). Inputs
** without PNG's signature are rejected (-1 keeps them out of the corpus).
**
** libpng checks every chunk's CRC and is not instrumented, so the fuzzer could
** not learn to fix them: nearly every mutation would die at the CRC check. The
** harness rewrites each whole chunk's CRC before the decoder sees the file.
*/
#include "fuzz.h"
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  if (n < 8 || memcmp(data, "\x89PNG\r\n\x1a\n", 8) != 0) return -1;
  uint8_t *buf = malloc(n);
  if (!buf) return 0;
  memcpy(buf, data, n);
  /* Chunks: 4-byte length, 4-byte type, the data, the CRC of type and data. */
  for (size_t at = 8; at + 12 <= n;) {
    uint32_t len = be32(buf + at);
    if (len > n - at - 12) break;   /* a chunk cut short: left as it is */
    uint32_t crc = (uint32_t)crc32(0, buf + at + 4, len + 4);
    uint8_t *c = buf + at + 8 + len;
    c[0] = (uint8_t)(crc >> 24), c[1] = (uint8_t)(crc >> 16), c[2] = (uint8_t)(crc >> 8);
    c[3] = (uint8_t)crc;
    at += 12 + (size_t)len;
  }
  int r = fuzz_image_one(buf, n);
  free(buf);
  return r;
}
