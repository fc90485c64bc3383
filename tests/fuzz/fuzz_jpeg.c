/*
** fuzz_jpeg.c -- libFuzzer harness for JPEG decoding (em_image_load). Inputs
** without JPEG's signature would only test the signature check, so they are
** rejected (-1 keeps them out of the corpus).
*/
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  if (n < 3 || data[0] != 0xff || data[1] != 0xd8 || data[2] != 0xff) return -1;
  return fuzz_image_one(data, n);
}
