/*
** loop_types.h -- loop_impl.h's loops instantiated for every element type the
** element-wise files compute in (float, double, int32, int64, uint8; bool is
** stored as uint8): binary.c and unary.c each include it once, where their
** element functions follow.
*/
#define T float
#define OT float
#define FN(name) name##_f32
#include "loop_impl.h"
#define T double
#define OT double
#define FN(name) name##_f64
#include "loop_impl.h"
#define T int32_t
#define OT int32_t
#define FN(name) name##_i32
#include "loop_impl.h"
#define T int64_t
#define OT int64_t
#define FN(name) name##_i64
#include "loop_impl.h"
#define T uint8_t
#define OT uint8_t
#define FN(name) name##_u8
#include "loop_impl.h"
