#include "pt/low_precision.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"

namespace ucp::pt {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

uint16_t Fp32ToBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t u = Bits(f);
  return static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7FFF) >> 16);
}

// The float arithmetic does the rounding: scaling by 2^112 then 2^-110 brings the value to where
// adding the exponent bias leaves the half's mantissa in the float's top bits, rounded to even.
uint16_t Fp32ToFp16(float f) {
  const float scale_to_inf = FromBits(0x77800000), scale_to_zero = FromBits(0x08800000);  // 2^112, 2^-110
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = Bits(f), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = Bits(base), nonsign = ((b >> 13) & 0x00007C00u) + (b & 0x00000FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

void Fp32ToBf16(const float* in, uint16_t* out, size_t n) {
  // The scalar rule above, branch-free, in blocks of 8 that -O2 vectorizes (SSE2, NEON).
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint32_t u[8];
    uint16_t r[8];
    std::memcpy(u, in + i, sizeof u);
    for (int k = 0; k < 8; ++k) {
      const uint32_t rounded = (u[k] + ((u[k] >> 16) & 1) + 0x7FFF) >> 16;
      r[k] = static_cast<uint16_t>((u[k] & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);  // NaN: 0x7FC0
    }
    std::memcpy(out + i, r, sizeof r);
  }
  for (; i < n; ++i) out[i] = Fp32ToBf16(in[i]);
}

void Fp32ToFp16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp32ToFp16(in[i]);
}

float Bf16ToFp32(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13);  // infinity, NaN (payload kept)
  else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
  else if (mant == 0) bits = sign;
  else {  // subnormal: normalized in fp32
    int shift = 0;
    uint32_t m = mant;
    while (!(m & 0x400)) m <<= 1, ++shift;
    bits = sign | (uint32_t(113 - shift) << 23) | ((m & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void ToFp32(const uint8_t* bytes, DType dtype, size_t n, float* out) {
  if (dtype == DType::F32) {
    std::memcpy(out, bytes, 4 * n);
    return;
  }
  if (dtype == DType::BF16) {
    // Blocks of 8 that -O2 vectorizes as they are (SSE2 on x86-64, NEON's shll on aarch64), whatever
    // the alignment: a plain loop is left scalar there (bytes may alias out), a call per value.
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint16_t half[8];
      uint32_t wide[8];
      std::memcpy(half, bytes + 2 * i, sizeof half);
      for (int k = 0; k < 8; ++k) wide[k] = uint32_t{half[k]} << 16;
      std::memcpy(out + i, wide, sizeof wide);
    }
    for (; i < n; ++i) out[i] = Bf16ToFp32(static_cast<uint16_t>(bytes[2 * i] | bytes[2 * i + 1] << 8));
    return;
  }
  if (dtype != DType::F16)
    throw Error("a " + std::string(DTypeName(dtype)) + " tensor where float32, bfloat16 or float16 was expected");
  for (size_t i = 0; i < n; ++i) {
    uint16_t half;
    std::memcpy(&half, bytes + 2 * i, 2);
    out[i] = Fp16ToFp32(half);
  }
}

}  // namespace ucp::pt
