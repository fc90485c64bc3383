/*
** copy_impl.h -- the same-dtype loops of copy.c for one element size: T is the
** unsigned integer of that size and FN(name) gives the suffix (move_4, fill_4,
** ...). A copy or a fill moves bits, so copy.c includes this file once per size
** (1, 2, 4 and 8 bytes) and each copy serves every dtype of that size; T and FN
** are undefined at the end. The file is part of copy.c and nothing else
** includes it.
*/

/* n elements from a (stride sa) to o (stride so): memcpy when both are
** contiguous, one load when a is a broadcast scalar. */
static void FN(move)(char *o, const char *a, int64_t n, int64_t so, int64_t sa,
                     emi_kparams *p) {
  (void)p;
  if (so == sizeof(T) && sa == sizeof(T)) {
    memcpy(o, a, (size_t)n * sizeof(T));
  } else if (sa == 0) {
    const T v = *(const T *)a;
    for (int64_t i = 0; i < n; i++) *(T *)(o + i * so) = v;
  } else {
    for (int64_t i = 0; i < n; i++) *(T *)(o + i * so) = *(const T *)(a + i * sa);
  }
}

/* n elements at o (stride so) set to the value at pv. */
static void FN(fill)(char *o, int64_t n, int64_t so, const void *pv) {
  const T v = *(const T *)pv;
  if (so == sizeof(T)) {
    T *oo = (T *)o;
    for (int64_t i = 0; i < n; i++) oo[i] = v;
  } else {
    for (int64_t i = 0; i < n; i++) *(T *)(o + i * so) = v;
  }
}

#undef T
#undef FN
