/*
** binary.c -- CPU kernels of the binary element-wise ops: tensor op tensor,
** tensor op scalar, and a + alpha*b.
**
** One loop per (op, dtype), collected in the table BIN[op][dtype]; float16 and
** bfloat16 entries widen to float32 through the adapters of elementwise.c. The
** ops layer has already promoted both operands to the compute dtype, so a loop
** reads two values of one type T and writes T (or bool for comparisons and the
** logical ops). Integer arithmetic wraps (done in the unsigned type: signed
** overflow is undefined in C), as PyTorch's does on every platform it runs on.
**
** A loop is written once per type, in loop_impl.h; an op is an element function
** (an expression of x and y) that the short BIN_FN macro wraps in it, one line
** per op and dtype family below.
*/
#include "loops.h"
#include "inline.h"
#include <tgmath.h>

/* -- Loops ----------------------------------------------------------------------------
** The loops themselves are loop_impl.h's, one copy per operand type and result
** type (T, or bool stored as uint8 for comparisons and the logical ops). */
#include "loop_types.h"
#define T float
#define OT uint8_t
#define FN(name) name##_f32_b
#include "loop_impl.h"
#define T double
#define OT uint8_t
#define FN(name) name##_f64_b
#include "loop_impl.h"
#define T int32_t
#define OT uint8_t
#define FN(name) name##_i32_b
#include "loop_impl.h"
#define T int64_t
#define OT uint8_t
#define FN(name) name##_i64_b
#include "loop_impl.h"
#define loop2_u8_b loop2_u8                 /* bool is stored as uint8 */
#define loop2_b loop2_u8

/* The loop of a result that is T (OB 0) or bool (OB 1). */
#define OUT_0(T) T
#define OUT_1(T) uint8_t
#define LOOP2_0(SFX) loop2_##SFX
#define LOOP2_1(SFX) loop2_##SFX##_b

/* NAME_SFX, the kernel of one op and dtype: the element function NAME_SFX_x
** computes EXPR of x and y (of type T; U is T's unsigned twin, for wrapping
** integer arithmetic; p_ the parameters). ELEM_TYPES names T and U for EXPR,
** which may use either or neither. */
#define ELEM_TYPES(T_, U_) typedef T_ T; typedef U_ U; (void)sizeof(T); (void)sizeof(U)
#define BIN_FN(NAME, SFX, OB, T_, U_, EXPR)                                            \
  EMI_INLINE OUT_##OB(T_) NAME##_##SFX##_x(T_ x, T_ y, emi_kparams *p_) {              \
    ELEM_TYPES(T_, U_); (void)p_; return (OUT_##OB(T))(EXPR); }                        \
  static void NAME##_##SFX(char *o, const char *a, const char *b, int64_t n, int64_t so, \
                           int64_t sa, int64_t sb, emi_kparams *p) {                   \
    LOOP2_##OB(SFX)(o, a, b, n, so, sa, sb, p, NAME##_##SFX##_x); }

/* float32, float64, and the half adapters built on the float32 loop. */
#define HALF2_FN(NAME, OB, SFX, DT)                                                    \
  static void NAME##_##SFX(char *o, const char *a, const char *b, int64_t n, int64_t so, \
                           int64_t sa, int64_t sb, emi_kparams *p) {                   \
    emi_half_loop2(NAME##_f32, DT, OB, o, a, b, n, so, sa, sb, 0, 0, p); }
#define HALF2(NAME, OB) HALF2_FN(NAME, OB, f16, EM_FLOAT16) HALF2_FN(NAME, OB, bf16, EM_BFLOAT16)
#define FLOAT_OP(NAME, OB, EXPR)                                                       \
  BIN_FN(NAME, f32, OB, float, float, EXPR)                                            \
  BIN_FN(NAME, f64, OB, double, double, EXPR)                                          \
  HALF2(NAME, OB)
#define INT_OP(NAME, OB, EXPR)                                                         \
  BIN_FN(NAME, i32, OB, int32_t, uint32_t, EXPR)                                       \
  BIN_FN(NAME, i64, OB, int64_t, uint64_t, EXPR)                                       \
  BIN_FN(NAME, u8, OB, uint8_t, uint32_t, EXPR)
#define BOOL_OP(NAME, EXPR) BIN_FN(NAME, b, 0, uint8_t, uint8_t, EXPR)

/* -- Element functions that need more than an expression ------------------------- */

/* torch.remainder: the result takes the sign of the divisor (Python's %). */
#define FREM_FN(T, F)                                                                  \
  static inline T frem_##F(T x, T y) {                                                 \
    T m = fmod(x, y);                                                                  \
    if (m != 0 && ((y < 0) != (m < 0))) m += y;                                        \
    return m; }
FREM_FN(float, f32)
FREM_FN(double, f64)
#define FREM(x, y) _Generic((x), float: frem_f32, default: frem_f64)(x, y)

/* Integer remainder: division by zero is reported (PyTorch raises
** ZeroDivisionError); INT_MIN % -1 is undefined in C, and 0 anyway. p is the
** loop's own copy of the parameters (loop_impl.h), so a plain store does. */
static inline int64_t rem_int(int64_t x, int64_t y, emi_kparams *p) {
  if (y == 0) { p->err = 1; return 0; }
  if (y == -1) return 0;
  int64_t r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}

/* Integer power by squaring, wrapping; negative exponents give what integer
** division would: 1 for base 1, +-1 for base -1, 0 otherwise (as PyTorch). */
static inline int64_t ipow(int64_t b, int64_t e) {
  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, x = (uint64_t)b;
  while (e) {
    if (e & 1) r *= x;
    x *= x;
    e >>= 1;
  }
  return (int64_t)r;
}

/* NaN-propagating maximum / minimum (torch.maximum). */
#define FMAX(x, y) ((x) != (x) ? (x) : (y) != (y) ? (y) : (x) > (y) ? (x) : (y))
#define FMIN(x, y) ((x) != (x) ? (x) : (y) != (y) ? (y) : (x) < (y) ? (x) : (y))

/* -- The loops ------------------------------------------------------------------------ */

FLOAT_OP(add, 0, x + y)
INT_OP(add, 0, (U)x + (U)y)
BOOL_OP(add, x | y)

FLOAT_OP(sub, 0, x - y)
INT_OP(sub, 0, (U)x - (U)y)

FLOAT_OP(mul, 0, x * y)
INT_OP(mul, 0, (U)x * (U)y)
BOOL_OP(mul, x & y)

FLOAT_OP(div, 0, x / y)

FLOAT_OP(pow, 0, pow(x, y))
INT_OP(pow, 0, ipow(x, y))

FLOAT_OP(max, 0, FMAX(x, y))
INT_OP(max, 0, x > y ? x : y)
BOOL_OP(max, x | y)

FLOAT_OP(min, 0, FMIN(x, y))
INT_OP(min, 0, x < y ? x : y)
BOOL_OP(min, x & y)

#define CMP_OP(NAME, OPR)                                                              \
  FLOAT_OP(NAME, 1, x OPR y) INT_OP(NAME, 1, x OPR y) BOOL_OP(NAME, x OPR y)
CMP_OP(eq, ==)
CMP_OP(ne, !=)
CMP_OP(lt, <)
CMP_OP(le, <=)
CMP_OP(gt, >)
CMP_OP(ge, >=)

FLOAT_OP(rem, 0, FREM(x, y))
INT_OP(rem, 0, rem_int(x, y, p_))

FLOAT_OP(atan2, 0, atan2(x, y))

FLOAT_OP(land, 1, x != 0 && y != 0)
INT_OP(land, 1, x != 0 && y != 0)
BOOL_OP(land, x & y)

FLOAT_OP(lor, 1, x != 0 || y != 0)
INT_OP(lor, 1, x != 0 || y != 0)
BOOL_OP(lor, x | y)

/* a + alpha*b: alpha arrives in the params as float / double / int64. */
BIN_FN(adds, f32, 0, float, float, x + p_->f0 * y)
BIN_FN(adds, f64, 0, double, double, x + p_->d0 * y)
HALF2(adds, 0)
INT_OP(adds, 0, (U)x + (U)p_->i0 * (U)y)
BOOL_OP(adds, x | (y & (p_->d0 != 0)))

/* -- Tables --------------------------------------------------------------------------- */

#define FLOATS(N)                                                                      \
  [EM_FLOAT32] = N##_f32, [EM_FLOAT64] = N##_f64, [EM_FLOAT16] = N##_f16,              \
  [EM_BFLOAT16] = N##_bf16
#define INTS(N) [EM_INT32] = N##_i32, [EM_INT64] = N##_i64, [EM_UINT8] = N##_u8

/* NULL: not defined for that dtype (the ops layer converts or rejects first). */
static const emi_loop2 BIN[EM_NUM_BINOPS][EM_NUM_DTYPES] = {
  [EM_ADD] = {FLOATS(add), INTS(add), [EM_BOOL] = add_b},
  [EM_SUB] = {FLOATS(sub), INTS(sub)},
  [EM_MUL] = {FLOATS(mul), INTS(mul), [EM_BOOL] = mul_b},
  [EM_DIV] = {FLOATS(div)},
  [EM_POW] = {FLOATS(pow), INTS(pow)},
  [EM_MAXIMUM] = {FLOATS(max), INTS(max), [EM_BOOL] = max_b},
  [EM_MINIMUM] = {FLOATS(min), INTS(min), [EM_BOOL] = min_b},
  [EM_EQ] = {FLOATS(eq), INTS(eq), [EM_BOOL] = eq_b},
  [EM_NE] = {FLOATS(ne), INTS(ne), [EM_BOOL] = ne_b},
  [EM_LT] = {FLOATS(lt), INTS(lt), [EM_BOOL] = lt_b},
  [EM_LE] = {FLOATS(le), INTS(le), [EM_BOOL] = le_b},
  [EM_GT] = {FLOATS(gt), INTS(gt), [EM_BOOL] = gt_b},
  [EM_GE] = {FLOATS(ge), INTS(ge), [EM_BOOL] = ge_b},
  [EM_REMAINDER] = {FLOATS(rem), INTS(rem)},
  [EM_ATAN2] = {FLOATS(atan2)},
  [EM_LOGICAL_AND] = {FLOATS(land), INTS(land), [EM_BOOL] = land_b},
  [EM_LOGICAL_OR] = {FLOATS(lor), INTS(lor), [EM_BOOL] = lor_b},
};

static const emi_loop2 ADDS[EM_NUM_DTYPES] = {FLOATS(adds), INTS(adds), [EM_BOOL] = adds_b};

static int out_is_bool(em_binop op) {
  return (op >= EM_EQ && op <= EM_GE) || op == EM_LOGICAL_AND || op == EM_LOGICAL_OR;
}

static int64_t grain_of(em_binop op) {
  return op == EM_POW || op == EM_ATAN2 || op == EM_REMAINDER ? EMI_GRAIN_COSTLY
                                                              : EMI_GRAIN_CHEAP;
}

static em_status unsupported(em_state *S, const char *what, em_binop op, em_dtype dt) {
  return emi_error(S, EM_ERR_DTYPE, "%s: %s is not supported for %s tensors on cpu",
                   what, em_binop_name(op), em_dtype_name(dt));
}

static em_status check_err(em_state *S, const emi_kparams *kp, em_binop op) {
  if (!kp->err) return EM_OK;
  return emi_error(S, EM_ERR_ARG, "%s: integer division by zero",
                   em_binop_name(op));
}

/* -- tensor op tensor ---------------------------------------------------------------- */

typedef struct bin_ctx { emi_loop2 f; emi_kparams kp; } bin_ctx;

static void bin_row(void *ctx, char *const *p, const int64_t *s, int64_t n) {
  bin_ctx *c = ctx;
  c->f(p[0], p[1], p[2], n, s[0], s[1], s[2], &c->kp);
}

em_status emi_cpu_binary(emi_device *dev, em_binop op, em_tensor *out, const em_tensor *a,
                         const em_tensor *b) {
  em_state *S = dev->S;
  if ((unsigned)op >= EM_NUM_BINOPS)
    return emi_error(S, EM_ERR_ARG, "binary: invalid op %d", (int)op);
  bin_ctx c;
  c.f = BIN[op][a->dtype];
  if (!c.f) return unsupported(S, "binary", op, a->dtype);
  c.kp.err = 0;
  em_tensor *ops[3] = {out, (em_tensor *)a, (em_tensor *)b};
  emi_cpu_foreach(S, ops, 3, grain_of(op), bin_row, &c);
  return check_err(S, &c.kp, op);
}

/* -- a + alpha*b ----------------------------------------------------------------------- */

em_status emi_cpu_add_scaled(emi_device *dev, em_tensor *out, const em_tensor *a,
                             const em_tensor *b, double alpha) {
  em_state *S = dev->S;
  bin_ctx c;
  c.f = ADDS[out->dtype];
  if (!c.f) return unsupported(S, "add", EM_ADD, out->dtype);
  c.kp.d0 = alpha;
  c.kp.f0 = (float)alpha;
  c.kp.i0 = emi_f2i(alpha);
  c.kp.err = 0;
  em_tensor *ops[3] = {out, (em_tensor *)a, (em_tensor *)b};
  emi_cpu_foreach(S, ops, 3, EMI_GRAIN_CHEAP, bin_row, &c);
  return EM_OK;
}

/* -- tensor op scalar -----------------------------------------------------------------
** The scalar becomes a stride-0 operand of the dtype's loop, converted to T. For
** float16/bfloat16 it is rounded to the dtype and then widened, as PyTorch does
** (half(x) * 0.1 computes float(x) * float(half(0.1)) and rounds once). */

typedef struct sc_ctx {
  emi_loop2 f;        /* the loop (for halves: the float32 loop) */
  emi_loop1 u;        /* or a unary loop replacing pow by a special exponent */
  em_dtype half;      /* EM_FLOAT16 / EM_BFLOAT16, or -1 */
  int reverse, out_bool;
  union { float f; double d; int64_t i64; int32_t i32; uint8_t u8; } s;
  emi_kparams kp;
} sc_ctx;

static void sc_row(void *ctx, char *const *p, const int64_t *s, int64_t n) {
  sc_ctx *c = ctx;
  const char *sp = (const char *)&c->s;
  if (c->u) {
    if ((int)c->half >= 0) emi_half_loop1(c->u, c->half, 0, p[0], p[1], n, s[0], s[1], &c->kp);
    else c->u(p[0], p[1], n, s[0], s[1], &c->kp);
  } else if ((int)c->half >= 0) {
    if (c->reverse)
      emi_half_loop2(c->f, c->half, c->out_bool, p[0], sp, p[1], n, s[0], 0, s[1], 1, 0, &c->kp);
    else
      emi_half_loop2(c->f, c->half, c->out_bool, p[0], p[1], sp, n, s[0], s[1], 0, 0, 1, &c->kp);
  } else if (c->reverse) {
    c->f(p[0], sp, p[1], n, s[0], 0, s[1], &c->kp);
  } else {
    c->f(p[0], p[1], sp, n, s[0], s[1], 0, &c->kp);
  }
}

/* x^3 and x^-2 have their own loops in PyTorch (as x^2, x^0.5, x^-1, x^-0.5 map to
** square, sqrt, reciprocal, rsqrt): the products are not always what pow rounds to. */
#define POW_FN(NAME, SFX, T, EXPR)                                                     \
  EMI_INLINE T NAME##_##SFX##_x(T x, emi_kparams *p) { (void)p; return EXPR; }         \
  static void NAME##_##SFX(char *o, const char *a, int64_t n, int64_t so, int64_t sa,  \
                           emi_kparams *p) {                                           \
    loop1_##SFX(o, a, n, so, sa, p, NAME##_##SFX##_x, NULL); }
POW_FN(cube, f32, float, x * x * x)
POW_FN(cube, f64, double, x * x * x)
POW_FN(rsq, f32, float, 1 / (x * x))
POW_FN(rsq, f64, double, 1 / (x * x))

static emi_loop1 pow_special(em_dtype ct, double s) {
  em_dtype ft = ct == EM_FLOAT64 ? EM_FLOAT64 : EM_FLOAT32;
  if (s == 2) return emi_cpu_unary_loop(EM_SQUARE, ft);
  if (s == 0.5) return emi_cpu_unary_loop(EM_SQRT, ft);
  if (s == -1) return emi_cpu_unary_loop(EM_RECIPROCAL, ft);
  if (s == -0.5) return emi_cpu_unary_loop(EM_RSQRT, ft);
  if (s == 3) return ft == EM_FLOAT64 ? cube_f64 : cube_f32;
  if (s == -2) return ft == EM_FLOAT64 ? rsq_f64 : rsq_f32;
  return NULL;
}

em_status emi_cpu_binary_scalar(emi_device *dev, em_binop op, em_tensor *out,
                                const em_tensor *a, double s, int reverse) {
  em_state *S = dev->S;
  if ((unsigned)op >= EM_NUM_BINOPS)
    return emi_error(S, EM_ERR_ARG, "binary: invalid op %d", (int)op);
  em_dtype dt = a->dtype;
  sc_ctx c;
  c.half = (em_dtype)-1;
  c.reverse = reverse;
  c.out_bool = out_is_bool(op);
  c.u = NULL;
  c.kp.err = 0;
  switch (dt) {
  case EM_FLOAT16:
    c.half = dt;
    c.f = BIN[op][EM_FLOAT32];
    c.s.f = emi_half_to_float(emi_float_to_half((float)s));
    break;
  case EM_BFLOAT16:
    c.half = dt;
    c.f = BIN[op][EM_FLOAT32];
    c.s.f = emi_bf16_to_float(emi_float_to_bf16((float)s));
    break;
  case EM_FLOAT32: c.f = BIN[op][dt]; c.s.f = (float)s; break;
  case EM_FLOAT64: c.f = BIN[op][dt]; c.s.d = s; break;
  case EM_INT32: c.f = BIN[op][dt]; c.s.i32 = (int32_t)emi_f2i(s); break;
  case EM_INT64: c.f = BIN[op][dt]; c.s.i64 = emi_f2i(s); break;
  case EM_UINT8: c.f = BIN[op][dt]; c.s.u8 = (uint8_t)emi_f2i(s); break;
  case EM_BOOL: c.f = BIN[op][dt]; c.s.u8 = s != 0; break;
  default: c.f = NULL;
  }
  if (!c.f) return unsupported(S, "binary", op, dt);
  /* PyTorch 1.13 takes these shortcuts for float32/float64/bfloat16 but computes
  ** float16 with pow itself (they differ at -0 and -inf) */
  if (op == EM_POW && !reverse && em_dtype_is_floating(dt) && dt != EM_FLOAT16)
    c.u = pow_special(dt, s);
  em_tensor *ops[2] = {out, (em_tensor *)a};
  emi_cpu_foreach(S, ops, 2, grain_of(op), sc_row, &c);
  return check_err(S, &c.kp, op);
}
