// Element types of the C API on the host: names, sizes and exact
// conversions to and from double (round-to-nearest-even when narrowing).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashqla/flashqla.h"

namespace flashqla {

inline const char* dtype_name(flashqla_dtype_t d) {
  switch (d) {
    case FLASHQLA_DTYPE_FLOAT32: return "float32";
    case FLASHQLA_DTYPE_FLOAT16: return "float16";
    case FLASHQLA_DTYPE_BFLOAT16: return "bfloat16";
    case FLASHQLA_DTYPE_FLOAT64: return "float64";
    case FLASHQLA_DTYPE_INT32: return "int32";
    case FLASHQLA_DTYPE_INT64: return "int64";
  }
  return "unknown dtype";
}

inline bool is_float_dtype(flashqla_dtype_t d) {
  return d == FLASHQLA_DTYPE_FLOAT32 || d == FLASHQLA_DTYPE_FLOAT16 ||
         d == FLASHQLA_DTYPE_BFLOAT16 || d == FLASHQLA_DTYPE_FLOAT64;
}

inline bool is_index_dtype(flashqla_dtype_t d) {
  return d == FLASHQLA_DTYPE_INT32 || d == FLASHQLA_DTYPE_INT64;
}

inline size_t dtype_size(flashqla_dtype_t d) {
  switch (d) {
    case FLASHQLA_DTYPE_FLOAT16:
    case FLASHQLA_DTYPE_BFLOAT16: return 2;
    case FLASHQLA_DTYPE_FLOAT32:
    case FLASHQLA_DTYPE_INT32: return 4;
    case FLASHQLA_DTYPE_FLOAT64:
    case FLASHQLA_DTYPE_INT64: return 8;
  }
  return 0;
}

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if (std::isnan(f)) return uint16_t((bits >> 16) | 0x40);  // keep it a quiet NaN
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);           // nearest, ties to even
  return uint16_t((bits + rounding) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    // zero or subnormal: man · 2^-24
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t float_to_fp16(float f) {
  uint32_t bits = float_to_bits(f);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  if (std::isnan(f)) return uint16_t(sign | 0x7e00);
  float a = std::fabs(f);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00);  // rounds to infinity
  if (a < 6.103515625e-05f) {
    // subnormal range: quantum 2^-24; nearbyint rounds half to even.
    return uint16_t(sign | uint16_t(std::nearbyint(std::ldexp(a, 24))));
  }
  uint32_t abits = float_to_bits(a);
  uint32_t exp = (abits >> 23) - 112;
  uint32_t man = abits & 0x7fffff;
  uint32_t half = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // may carry into exp: correct
  return uint16_t(sign | half);
}

// Reads element `index` (in elements) of a buffer of dtype d as double.
inline double load_as_double(const void* base, flashqla_dtype_t d, int64_t index) {
  switch (d) {
    case FLASHQLA_DTYPE_FLOAT32: return static_cast<const float*>(base)[index];
    case FLASHQLA_DTYPE_FLOAT64: return static_cast<const double*>(base)[index];
    case FLASHQLA_DTYPE_FLOAT16: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
    case FLASHQLA_DTYPE_BFLOAT16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    case FLASHQLA_DTYPE_INT32: return static_cast<const int32_t*>(base)[index];
    case FLASHQLA_DTYPE_INT64: return double(static_cast<const int64_t*>(base)[index]);
  }
  return 0.0;
}

// Writes x, rounded to dtype d, to element `index` of a float buffer.
inline void store_from_double(void* base, flashqla_dtype_t d, int64_t index, double x) {
  switch (d) {
    case FLASHQLA_DTYPE_FLOAT32: static_cast<float*>(base)[index] = float(x); break;
    case FLASHQLA_DTYPE_FLOAT64: static_cast<double*>(base)[index] = x; break;
    case FLASHQLA_DTYPE_FLOAT16: static_cast<uint16_t*>(base)[index] = float_to_fp16(float(x)); break;
    case FLASHQLA_DTYPE_BFLOAT16: static_cast<uint16_t*>(base)[index] = float_to_bf16(float(x)); break;
    default: break;  // index dtypes are never outputs (rejected by validation)
  }
}

inline int64_t load_index(const void* base, flashqla_dtype_t d, int64_t index) {
  return d == FLASHQLA_DTYPE_INT32 ? int64_t(static_cast<const int32_t*>(base)[index])
                                   : static_cast<const int64_t*>(base)[index];
}

}  // namespace flashqla
