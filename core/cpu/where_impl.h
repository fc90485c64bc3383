/*
** where_impl.h -- the where loop of elementwise.c for one element size: T is
** the unsigned integer of that size and FN(name) gives the suffix (where_4,
** ...). where selects bits, so elementwise.c includes this file once per size
** (1, 2, 4 and 8 bytes) and each copy serves every dtype of that size; T and FN
** are undefined at the end. The file is part of elementwise.c and nothing else
** includes it.
*/

/* o[i] = c[i] ? a[i] : b[i]: p and s are the pointers and strides of o, the bool
** condition c, a and b. */
static void FN(where)(char *const *p, const int64_t *s, int64_t n) {
  char *o = p[0];
  const char *c = p[1], *a = p[2], *b = p[3];
  if (s[0] == sizeof(T) && s[1] == 1 && s[2] == sizeof(T) && s[3] == sizeof(T)) {
    T *oo = (T *)o;
    const T *aa = (const T *)a, *bb = (const T *)b;
    const uint8_t *cc = (const uint8_t *)c;
    for (int64_t i = 0; i < n; i++) oo[i] = cc[i] ? aa[i] : bb[i];
  } else {
    for (int64_t i = 0; i < n; i++)
      *(T *)(o + i * s[0]) = *(const uint8_t *)(c + i * s[1])
                                 ? *(const T *)(a + i * s[2])
                                 : *(const T *)(b + i * s[3]);
  }
}

#undef T
#undef FN
