/*
** inline.h -- what the inlined element-wise loops share (loop_impl.h, copy.c).
**
** EMI_INLINE marks the functions that exist only to be inlined: a loop written
** once as a function of the op's element function, and the element functions
** themselves. Forced inlining makes the element function a constant in each
** op's copy of the loop, so each copy vectorizes as if written for that op
** alone; plain `inline` leaves the choice to gcc's size limits, which the
** vmath.h bodies exceed.
*/
#ifndef EMBER_CPU_INLINE_H
#define EMBER_CPU_INLINE_H
#include "loops.h"

#define EMI_INLINE static inline __attribute__((always_inline))

/* A loop's own copy of its parameters, err cleared. A store to the output
** cannot alias a local, so what the element function reads from the copy
** stays in a register; err is not read, as other workers may be writing it. */
EMI_INLINE emi_kparams emi_kparams_local(const emi_kparams *p) {
  emi_kparams k = {.d0 = p->d0, .d1 = p->d1, .f0 = p->f0, .f1 = p->f1,
                   .i0 = p->i0, .i1 = p->i1, .err = 0};
  return k;
}

#endif
