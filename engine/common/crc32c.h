// CRC32C (Castagnoli, the iSCSI/ext4 checksum): streaming, with an SSE4.2 path and a table
// fallback.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace megatrain::engine {

// Extends `crc` (the value returned for the bytes so far; 0 for none) over
// `data`. Crc32cExtend(Crc32cExtend(0, a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, absl::Span<const uint8_t> data);
inline uint32_t Crc32c(absl::Span<const uint8_t> data) { return Crc32cExtend(0, data); }

// The portable table-driven (slicing-by-8) implementation, always available;
// Crc32cExtend uses the CPU's crc32 instruction when the build targets SSE4.2.
uint32_t Crc32cExtendPortable(uint32_t crc, absl::Span<const uint8_t> data);

}  // namespace megatrain::engine
