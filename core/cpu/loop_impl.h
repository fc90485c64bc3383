/*
** loop_impl.h -- the 1-D loops of unary.c and binary.c for one operand type T
** and result type OT. Each of those files includes this one once per pair it
** needs, with T, OT and FN(name) defined (FN gives the suffix: loop1_f32,
** loop2_f32_b, ...); T, OT and FN are undefined at the end.
**
** A loop takes the op's element function f as an argument and is always
** inlined (inline.h), as f is: an op's kernel is a two-line function that
** calls loop1 or loop2 with its own f, and comes out as that op's own
** vectorized loop. C has no templates; a file included per type keeps the loop
** ordinary code, which compiler messages and debuggers see line by line, where
** a macro stamping out a loop per op would be one line.
**
** The unit-stride branches are the ones gcc vectorizes; everything else takes
** the strided branch. f sees k, the loop's own copy of the parameters
** (inline.h), so what f reads from it (alpha, clamp bounds) stays in a
** register. An element function that hits an error sets k.err; the loop
** reports it in p->err once, at the end (several workers may write it).
*/

/* o[i] = f(a[i]) for n elements. vec, when not NULL, does a hand-vectorized
** prefix of the contiguous case and returns how many elements it did. */
EMI_INLINE void FN(loop1)(char *o_, const char *a_, int64_t n, int64_t so, int64_t sa,
                          emi_kparams *p, OT (*f)(T, emi_kparams *),
                          int64_t (*vec)(OT *, const T *, int64_t)) {
  emi_kparams k = emi_kparams_local(p);
  int64_t i = 0;
  if (so == sizeof(OT) && sa == sizeof(T)) {
    OT *o = (OT *)o_;
    const T *a = (const T *)a_;
    if (vec) i = vec(o, a, n);
    for (; i < n; i++) o[i] = f(a[i], &k);
  } else {
    for (; i < n; i++) *(OT *)(o_ + i * so) = f(*(const T *)(a_ + i * sa), &k);
  }
  if (k.err) __atomic_store_n(&p->err, 1, __ATOMIC_RELAXED);
}

/* o[i] = f(a[i], b[i]) for n elements; a stride-0 operand (a scalar) is read
** once, before the loop. */
EMI_INLINE void FN(loop2)(char *o_, const char *a_, const char *b_, int64_t n, int64_t so,
                          int64_t sa, int64_t sb, emi_kparams *p,
                          OT (*f)(T, T, emi_kparams *)) {
  emi_kparams k = emi_kparams_local(p);
  if (so == sizeof(OT) && sa == sizeof(T) && sb == sizeof(T)) {
    OT *o = (OT *)o_;
    const T *a = (const T *)a_, *b = (const T *)b_;
    for (int64_t i = 0; i < n; i++) o[i] = f(a[i], b[i], &k);
  } else if (so == sizeof(OT) && sa == sizeof(T) && sb == 0) {
    OT *o = (OT *)o_;
    const T *a = (const T *)a_;
    const T y = *(const T *)b_;
    for (int64_t i = 0; i < n; i++) o[i] = f(a[i], y, &k);
  } else if (so == sizeof(OT) && sa == 0 && sb == sizeof(T)) {
    OT *o = (OT *)o_;
    const T *b = (const T *)b_;
    const T x = *(const T *)a_;
    for (int64_t i = 0; i < n; i++) o[i] = f(x, b[i], &k);
  } else {
    for (int64_t i = 0; i < n; i++)
      *(OT *)(o_ + i * so) = f(*(const T *)(a_ + i * sa), *(const T *)(b_ + i * sb), &k);
  }
  if (k.err) __atomic_store_n(&p->err, 1, __ATOMIC_RELAXED);
}

#undef T
#undef OT
#undef FN
