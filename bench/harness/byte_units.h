// Byte counts as text: the sizes a report prints and the sizes a flag accepts.
#pragma once

#include <cstdint>
#include <string>

#include "weightsync/status.h"

namespace weightsync::bench {

// "1GiB" → 1073741824: a plain number or one with a suffix K, M, G (powers of 1024; "KiB" and
// "KB" are also accepted), fractions allowed ("1.5G"). InvalidArgument names the text.
Result<uint64_t> ParseBytes(const std::string& text);
// 1073741824 → "1.00 GiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace weightsync::bench
