// Safetensors element types: names, sizes, and exact conversion of float types to fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace megatrain::engine {

// The dtypes megatrain reads. Others in the format (U16..U64, F8_*) are refused.
enum class SafetensorsDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

std::optional<SafetensorsDtype> ParseSafetensorsDtype(std::string_view name);
std::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
size_t SafetensorsDtypeSize(SafetensorsDtype dtype);
bool IsFloatingDtype(SafetensorsDtype dtype);  // F64, F32, F16, BF16

// Converts little-endian elements of a floating dtype to fp32. BF16, F16 and
// F32 are exact (every value, including subnormals, infinities and NaNs); F64
// rounds to the nearest float (ties to even). `bytes` may be unaligned and
// must hold exactly out.size() elements. InvalidArgument for non-float dtypes
// or a size mismatch.
absl::Status ConvertToFloat32(SafetensorsDtype dtype, absl::Span<const uint8_t> bytes,
                              absl::Span<float> out);

// fp32 -> little-endian bf16 / f16 bytes, round to nearest even.
std::vector<uint8_t> EncodeBf16(absl::Span<const float> values);
std::vector<uint8_t> EncodeF16(absl::Span<const float> values);

}  // namespace megatrain::engine
