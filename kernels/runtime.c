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
