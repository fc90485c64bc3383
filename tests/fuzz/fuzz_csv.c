/*
** fuzz_csv.c -- libFuzzer harness for the numeric CSV reader. The input's
** length picks one of three ways to read it (header and label by name, no
** header and label column 0, header and no label): every way is reached, and a
** finding replays the same way. Samples are then read back.
*/
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  em_state *S = fuzz_state();
  const char *path = fuzz_file(0, data, n);
  em_dataset *d = NULL;
  em_status st;
  switch (n % 3) {
  case 0: st = em_data_csv(S, path, 1, "label", -1, &d); break;
  case 1: st = em_data_csv(S, path, 0, NULL, 0, &d); break;
  default: st = em_data_csv(S, path, 1, NULL, -1, &d); break;
  }
  if (st == EM_OK) {
    int64_t len = em_dataset_len(d);
    int nf = em_dataset_nfields(d);
    if (len < 1 || nf < 1 || nf > 2) fuzz_fail("%lld samples of %d fields", (long long)len, nf);
    em_tensor *s[EM_DATA_MAX_FIELDS] = {0};
    for (int64_t i = 0; i < len; i += len - 1 > 0 ? len - 1 : 1) {
      if (em_dataset_get(S, d, i, 0, s) != EM_OK) fuzz_fail("sample %lld unreadable", (long long)i);
      for (int k = 0; k < nf; k++) em_tensor_release(s[k]);
    }
    em_tensor *x = NULL;
    if (em_dataset_tensor(S, d, 0, &x) != EM_OK) fuzz_fail("no features tensor");
    fuzz_touch(x);
    em_tensor_release(x);
    em_dataset_release(d);
  }
  fuzz_end();
  return 0;
}
