/*
** fuzz_safetensors.c -- libFuzzer harness for the safetensors reader: the input
** is a whole file; every entry it declares is inspected and read, and the
** metadata walked, so the header's validation is tested against what the
** readers after it rely on.
*/
#include "fuzz.h"
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  em_state *S = fuzz_state();
  em_safetensors *f = NULL;
  if (em_safetensors_open(S, fuzz_file(0, data, n), &f) != EM_OK) {
    fuzz_end();
    return 0;
  }
  int64_t count = em_safetensors_count(f);
  for (int64_t i = 0; i < count; i++) {
    const char *name = em_safetensors_name(f, i);
    if (!name) fuzz_fail("entry %lld has no name", (long long)i);
    /* The header was checked for duplicates, so a name finds its own entry. */
    if (em_safetensors_find(f, name) != i) fuzz_fail("entry %lld: find disagrees", (long long)i);
    em_dtype dt;
    int ndim = -1;
    int64_t shape[EM_MAX_DIMS];
    if (em_safetensors_info(S, f, i, &dt, &ndim, shape) == EM_OK &&
        (ndim < 0 || ndim > EM_MAX_DIMS))
      fuzz_fail("entry %lld: %d dims", (long long)i, ndim);
    em_tensor *t = NULL;
    if (em_safetensors_get(S, f, i, &t) == EM_OK) {
      fuzz_touch(t);
      em_tensor_release(t);
    }
  }
  for (int64_t i = 0; i < em_safetensors_metadata_count(f); i++) {
    const char *k = em_safetensors_metadata_key(f, i), *v = em_safetensors_metadata_value(f, i);
    if (!k || !v) fuzz_fail("metadata pair %lld is missing", (long long)i);
    (void)(strlen(k) + strlen(v));   /* NUL-terminated inside the header buffer */
  }
  em_safetensors_close(f);
  fuzz_end();
  return 0;
}
