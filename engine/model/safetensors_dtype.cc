// Safetensors element types: names, sizes, and exact conversion of float types to fp32.
#include "engine/model/safetensors_dtype.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/common/bf16.h"
#include "kernels/common/fp16.h"

namespace megatrain::engine {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader assumes a little-endian host");

struct DtypeInfo {
  SafetensorsDtype dtype;
  std::string_view name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::kF64, "F64", 8}, {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF16, "F16", 2}, {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kI64, "I64", 8}, {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kI16, "I16", 2}, {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kU8, "U8", 1},   {SafetensorsDtype::kBool, "BOOL", 1},
};

const DtypeInfo& Info(SafetensorsDtype dtype) { return kDtypes[static_cast<int>(dtype)]; }

template <typename T>
T LoadUnaligned(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace

std::optional<SafetensorsDtype> ParseSafetensorsDtype(std::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::string_view SafetensorsDtypeName(SafetensorsDtype dtype) { return Info(dtype).name; }

size_t SafetensorsDtypeSize(SafetensorsDtype dtype) { return Info(dtype).size; }

bool IsFloatingDtype(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF64 || dtype == SafetensorsDtype::kF32 ||
         dtype == SafetensorsDtype::kF16 || dtype == SafetensorsDtype::kBF16;
}

absl::Status ConvertToFloat32(SafetensorsDtype dtype, absl::Span<const uint8_t> bytes,
                              absl::Span<float> out) {
  if (!IsFloatingDtype(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", std::string(SafetensorsDtypeName(dtype)), " is not a floating-point type"));
  }
  const size_t item = SafetensorsDtypeSize(dtype);
  if (bytes.size() != out.size() * item) {
    return absl::InvalidArgumentError(absl::StrCat(
        "conversion of ", bytes.size(), " bytes of ", std::string(SafetensorsDtypeName(dtype)),
        " into ", out.size(), " floats: sizes disagree"));
  }
  const uint8_t* src = bytes.data();
  float* dst = out.data();
  const size_t n = out.size();
  switch (dtype) {
    case SafetensorsDtype::kF32:
      if (n != 0) std::memcpy(dst, src, n * sizeof(float));
      break;
    case SafetensorsDtype::kBF16:
      for (size_t i = 0; i < n; ++i) {
        dst[i] = kernels::Bf16BitsToFloat32(LoadUnaligned<uint16_t>(src + 2 * i));
      }
      break;
    case SafetensorsDtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        dst[i] = kernels::Float16BitsToFloat32(LoadUnaligned<uint16_t>(src + 2 * i));
      }
      break;
    case SafetensorsDtype::kF64:
      for (size_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(LoadUnaligned<double>(src + 8 * i));
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

std::vector<uint8_t> EncodeBf16(absl::Span<const float> values) {
  std::vector<uint8_t> bytes(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = kernels::Float32ToBf16Bits(values[i]);
    std::memcpy(bytes.data() + 2 * i, &bits, 2);
  }
  return bytes;
}

std::vector<uint8_t> EncodeF16(absl::Span<const float> values) {
  std::vector<uint8_t> bytes(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = kernels::Float32ToFloat16Bits(values[i]);
    std::memcpy(bytes.data() + 2 * i, &bits, 2);
  }
  return bytes;
}

}  // namespace megatrain::engine
