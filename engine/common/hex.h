// Lower-case hex encoding of bytes and its strict inverse (digests, keys, signatures).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace megatrain::engine {

// Lower-case hex of `bytes`.
std::string HexEncode(absl::Span<const uint8_t> bytes);
inline std::string HexEncode(std::string_view bytes) {
  return HexEncode(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

// Bytes of a hex string (either case); InvalidArgument for odd length or a non-hex digit.
absl::StatusOr<std::string> HexDecode(std::string_view hex);

}  // namespace megatrain::engine
