// fp32 to the 16-bit training dtypes, rounding to nearest even exactly as torch's .to() does
// (c10::BFloat16 and c10::Half): what the layer files of a resharded checkpoint hold.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pt/value.h"

namespace ucp::pt {

uint16_t Fp32ToBf16(float value);  // NaN becomes 0x7FC0
uint16_t Fp32ToFp16(float value);  // IEEE half: subnormals, overflow to infinity, quiet NaN 0x7E00

// And back: every bf16 and fp16 value is an fp32 value, widened exactly (subnormals normalized, NaN
// payloads kept).
float Bf16ToFp32(uint16_t bits);
float Fp16ToFp32(uint16_t bits);

// The same over n values: one call per run, the loop where the compiler can vectorize it.
void Fp32ToBf16(const float* in, uint16_t* out, size_t n);
void Fp32ToFp16(const float* in, uint16_t* out, size_t n);

// n values of `dtype` (F32, BF16 or F16) at `bytes`, little-endian, of any alignment (a tensor record
// inside a mapped file), as fp32: exactly. Throws ucp::Error for another dtype.
void ToFp32(const uint8_t* bytes, DType dtype, size_t n, float* out);

}  // namespace ucp::pt
