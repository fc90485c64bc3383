/*
** fuzz_cifar.c -- libFuzzer harness for the CIFAR-10 reader. The first byte
** says into how many batch files (1..3) the rest is cut, so the files' sizes
** and the concatenation of several are fuzzed too; a first and last sample are
** then read back from the dataset.
*/
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  if (n < 1) return 0;
  em_state *S = fuzz_state();
  int nfiles = 1 + data[0] % 3;
  data++, n--;
  const char *files[3];
  /* Cut at whole records where the input allows, so that valid seeds stay valid. */
  size_t rec = 3073, per = n / (size_t)nfiles, at = 0;
  if (per >= rec) per -= per % rec;
  for (int k = 0; k < nfiles; k++) {
    size_t len = k == nfiles - 1 ? n - at : per;
    files[k] = fuzz_file(k, data + at, len);
    at += len;
  }
  em_dataset *d = NULL;
  if (em_data_cifar10(S, files, nfiles, 0, &d) == EM_OK) {
    int64_t len = em_dataset_len(d);
    em_tensor *s[EM_DATA_MAX_FIELDS] = {0};
    for (int64_t i = 0; i < len; i += len - 1 > 0 ? len - 1 : 1) {
      if (em_dataset_get(S, d, i, 0, s) != EM_OK) fuzz_fail("sample %lld unreadable", (long long)i);
      int64_t label = *(const int64_t *)em_tensor_data(s[1]);
      if (label < 0 || label > 9) fuzz_fail("label %lld", (long long)label);
      fuzz_touch(s[0]);
      em_tensor_release(s[0]);
      em_tensor_release(s[1]);
    }
    em_dataset_release(d);
  }
  fuzz_end();
  return 0;
}
