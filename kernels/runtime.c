/*
** runtime.c -- what every runtime implementation shares: error messages.
*/
#include "runtime.h"
#include <stdarg.h>
#include <stdio.h>

em_status emk_fail(emk_runtime *rt, em_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rt->errmsg, sizeof rt->errmsg, fmt, ap);
  va_end(ap);
  return code;
}

em_status emk_errf(char *err, size_t errlen, em_status code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}
