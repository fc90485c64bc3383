/*
** json.c -- the pull parser of json.h: strict RFC 8259 JSON, read straight out
** of a buffer that may hold anything. Nothing here allocates or recurses more
** than max_depth levels, so a hostile text costs at most one pass over its bytes.
*/
#include "json.h"
#include "ember.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void emi_json_init(emi_json *j, char *text, size_t len, int max_depth) {
  j->begin = j->p = text;
  j->end = text + len;
  j->depth = 0;
  j->max_depth = max_depth;
  j->err_at = 0;
  j->err[0] = 0;
}

bool emi_json_fail(emi_json *j, const char *fmt, ...) {
  if (j->err[0]) return false;      /* keep the first, innermost message */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->err, sizeof j->err, fmt, ap);
  va_end(ap);
  j->err_at = (size_t)(j->p - j->begin);
  return false;
}

int emi_json_peek(emi_json *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
  return j->p < j->end ? (unsigned char)*j->p : -1;
}

/* A printable description of byte c for messages. */
static const char *show(int c, char *buf, size_t n) {
  if (c < 0) snprintf(buf, n, "the end of the header");
  else if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
  else snprintf(buf, n, "byte 0x%02x", c);
  return buf;
}

const char *emi_json_kind(emi_json *j) {
  switch (emi_json_peek(j)) {
  case '{': return "an object";
  case '[': return "an array";
  case '"': return "a string";
  case 't': case 'f': return "a boolean";
  case 'n': return "null";
  case -1: return "nothing";
  default: {
    int c = (unsigned char)*j->p;
    return (c == '-' || (c >= '0' && c <= '9')) ? "a number" : "an invalid value";
  }
  }
}

bool emi_json_open(emi_json *j, char open) {
  char b[32];
  int c = emi_json_peek(j);
  if (c != open)
    return emi_json_fail(j, "expected '%c', found %s", open, show(c, b, sizeof b));
  if (j->depth >= j->max_depth)
    return emi_json_fail(j, "nesting deeper than %d levels", j->max_depth);
  j->depth++;
  j->p++;
  return true;
}

bool emi_json_more(emi_json *j, char close, int64_t *count, bool *more) {
  char b[32];
  int c = emi_json_peek(j);
  if (c == close) {
    j->p++;
    j->depth--;
    *more = false;
    return true;
  }
  if (*count > 0) {
    if (c != ',')
      return emi_json_fail(j, "expected ',' or '%c', found %s", close, show(c, b, sizeof b));
    j->p++;
    if (emi_json_peek(j) == close) return emi_json_fail(j, "trailing comma before '%c'", close);
  }
  (*count)++;
  *more = true;
  return true;
}

bool emi_json_colon(emi_json *j) {
  char b[32];
  int c = emi_json_peek(j);
  if (c != ':') return emi_json_fail(j, "expected ':', found %s", show(c, b, sizeof b));
  j->p++;
  return true;
}

/* -- Strings ------------------------------------------------------------------------ */

/* Length of the UTF-8 sequence at s (at most n bytes available), 0 if malformed. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned cp, min;
  if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; min = 0x80; }
  else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; min = 0x800; }
  else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; min = 0x10000; }
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

bool emi_utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq(u + i, n - i);
    if (!k) return false;
    i += k;
  }
  return true;
}

static int hex4(const char *p) {
  int v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

static char *put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) { *o++ = (char)cp; }
  else if (cp < 0x800) { *o++ = (char)(0xc0 | cp >> 6); *o++ = (char)(0x80 | (cp & 0x3f)); }
  else if (cp < 0x10000) {
    *o++ = (char)(0xe0 | cp >> 12); *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
    *o++ = (char)(0x80 | (cp & 0x3f));
  } else {
    *o++ = (char)(0xf0 | cp >> 18); *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
    *o++ = (char)(0x80 | ((cp >> 6) & 0x3f)); *o++ = (char)(0x80 | (cp & 0x3f));
  }
  return o;
}

bool emi_json_string(emi_json *j, char **s, size_t *len) {
  char b[32];
  int c = emi_json_peek(j);
  if (c != '"') return emi_json_fail(j, "expected a string, found %s", show(c, b, sizeof b));
  char *start = ++j->p, *o = start;    /* o trails j->p: decoding never grows */
  for (;;) {
    if (j->p >= j->end) return emi_json_fail(j, "unterminated string");
    unsigned char u = (unsigned char)*j->p;
    if (u == '"') break;
    if (u < 0x20) return emi_json_fail(j, "control character 0x%02x in a string", u);
    if (u >= 0x80) {
      size_t k = utf8_seq((const unsigned char *)j->p, (size_t)(j->end - j->p));
      if (!k) return emi_json_fail(j, "invalid UTF-8 in a string");
      memmove(o, j->p, k);
      o += k;
      j->p += k;
      continue;
    }
    if (u != '\\') { *o++ = *j->p++; continue; }
    if (j->end - j->p < 2) { j->p = j->end; return emi_json_fail(j, "unterminated string"); }
    char e = j->p[1];
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      static const char map[] = "\"\\/\b\f\n\r\t";
      *o++ = map[simple - "\"\\/bfnrt"];
      j->p += 2;
      continue;
    }
    if (e != 'u') {
      if (e > 0x20 && e < 0x7f) return emi_json_fail(j, "invalid escape '\\%c' in a string", e);
      return emi_json_fail(j, "invalid escape (backslash before %s) in a string",
                           show((unsigned char)e, b, sizeof b));
    }
    int cp = j->end - j->p >= 6 ? hex4(j->p + 2) : -1;
    if (cp < 0) return emi_json_fail(j, "invalid \\u escape (four hex digits expected)");
    j->p += 6;
    if (cp >= 0xdc00 && cp <= 0xdfff) {
      j->p -= 6;
      return emi_json_fail(j, "lone low surrogate \\u%04x in a string", cp);
    }
    if (cp >= 0xd800 && cp <= 0xdbff) {
      int lo = j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u' ? hex4(j->p + 2) : -1;
      if (lo < 0xdc00 || lo > 0xdfff) {
        j->p -= 6;
        return emi_json_fail(j, "lone high surrogate \\u%04x in a string", cp);
      }
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      j->p += 6;
    }
    if (cp == 0) {
      j->p -= 6;
      return emi_json_fail(j, "\\u0000 in a string (names and metadata can't hold NUL)");
    }
    o = put_utf8(o, (unsigned)cp);
  }
  j->p++;         /* the closing quote */
  *o = 0;         /* o <= the closing quote's position, so this stays in the string */
  *s = start;
  *len = (size_t)(o - start);
  return true;
}

/* -- Numbers ------------------------------------------------------------------------ */

/* The extent of a JSON number token at the cursor (grammar checked); sets the
** flags describing it. */
static bool number_token(emi_json *j, char **tok_end, bool *neg, bool *integral) {
  char *q = j->p;
  *neg = false;
  *integral = true;
  if (q < j->end && *q == '-') { *neg = true; q++; }
  if (q >= j->end || *q < '0' || *q > '9') return emi_json_fail(j, "invalid number");
  if (*q == '0') {
    q++;
    if (q < j->end && *q >= '0' && *q <= '9')
      return emi_json_fail(j, "invalid number (leading zero)");
  } else {
    while (q < j->end && *q >= '0' && *q <= '9') q++;
  }
  if (q < j->end && *q == '.') {
    *integral = false;
    q++;
    if (q >= j->end || *q < '0' || *q > '9') return emi_json_fail(j, "invalid number");
    while (q < j->end && *q >= '0' && *q <= '9') q++;
  }
  if (q < j->end && (*q == 'e' || *q == 'E')) {
    *integral = false;
    q++;
    if (q < j->end && (*q == '+' || *q == '-')) q++;
    if (q >= j->end || *q < '0' || *q > '9') return emi_json_fail(j, "invalid number");
    while (q < j->end && *q >= '0' && *q <= '9') q++;
  }
  *tok_end = q;
  return true;
}

bool emi_json_uint(emi_json *j, int64_t *v) {
  int c = emi_json_peek(j);
  if (c != '-' && (c < '0' || c > '9'))
    return emi_json_fail(j, "expected a non-negative integer, found %s", emi_json_kind(j));
  char *q;
  bool neg, integral;
  if (!number_token(j, &q, &neg, &integral)) return false;
  int n = (int)(q - j->p < 40 ? q - j->p : 40);
  if (neg) return emi_json_fail(j, "%.*s is negative", n, j->p);
  if (!integral) return emi_json_fail(j, "%.*s is not an integer", n, j->p);
  uint64_t x = 0;
  for (char *r = j->p; r < q; r++) {
    unsigned d = (unsigned)(*r - '0');
    if (x > (UINT64_C(0x7fffffffffffffff) - d) / 10)
      return emi_json_fail(j, "%.*s%s is too large", n, j->p, q - j->p > 40 ? "..." : "");
    x = x * 10 + d;
  }
  *v = (int64_t)x;
  j->p = q;
  return true;
}

/* -- Skipping ------------------------------------------------------------------------ */

static bool literal(emi_json *j, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
    return emi_json_fail(j, "invalid value");
  j->p += n;
  return true;
}

bool emi_json_skip(emi_json *j) {
  int c = emi_json_peek(j);
  char *s;
  size_t len;
  int64_t count = 0;
  bool more;
  switch (c) {
  case '"': return emi_json_string(j, &s, &len);
  case 't': return literal(j, "true");
  case 'f': return literal(j, "false");
  case 'n': return literal(j, "null");
  case '{':
    if (!emi_json_open(j, '{')) return false;
    for (;;) {
      if (!emi_json_more(j, '}', &count, &more)) return false;
      if (!more) return true;
      if (!emi_json_string(j, &s, &len) || !emi_json_colon(j) || !emi_json_skip(j))
        return false;
    }
  case '[':
    if (!emi_json_open(j, '[')) return false;
    for (;;) {
      if (!emi_json_more(j, ']', &count, &more)) return false;
      if (!more) return true;
      if (!emi_json_skip(j)) return false;
    }
  case -1: return emi_json_fail(j, "unexpected end of the header");
  default: {
    char *q;
    bool neg, integral;
    if (c != '-' && (c < '0' || c > '9')) return emi_json_fail(j, "invalid value");
    if (!number_token(j, &q, &neg, &integral)) return false;
    j->p = q;
    return true;
  }
  }
}

bool emi_json_finish(emi_json *j) {
  char b[32];
  int c = emi_json_peek(j);
  if (c >= 0) return emi_json_fail(j, "trailing characters after the JSON object (%s)",
                                   show(c, b, sizeof b));
  return true;
}

/* -- Writing ---------------------------------------------------------------------------- */

size_t emi_json_quote(char *dst, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  size_t k = 0;
#define PUT(ch) do { if (dst) dst[k] = (ch); k++; } while (0)
  PUT('"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') { PUT('\\'); PUT((char)c); }
    else if (c == '\n') { PUT('\\'); PUT('n'); }
    else if (c == '\t') { PUT('\\'); PUT('t'); }
    else if (c == '\r') { PUT('\\'); PUT('r'); }
    else if (c < 0x20) {
      PUT('\\'); PUT('u'); PUT('0'); PUT('0'); PUT(hex[c >> 4]); PUT(hex[c & 15]);
    } else PUT((char)c);
  }
  PUT('"');
#undef PUT
  return k;
}

/* The public names (ember.h): one quoting and one UTF-8 check for every JSON
** ember writes, the safetensors header here and the Lua layer's checkpoint
** document alike. */
size_t em_json_quote(char *dst, const char *s, size_t n) { return emi_json_quote(dst, s, n); }
int em_utf8_valid(const char *s, size_t n) { return emi_utf8_valid(s, n); }
