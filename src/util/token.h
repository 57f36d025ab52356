// The shared secret TCP peers authenticate with. Never logged.
#pragma once

#include <string>

#include "weightsync/status.h"

namespace weightsync::util {

inline constexpr size_t kMinTokenBytes = 16;

// First of: `token` (an option), `token_file` (an option), $WEIGHTSYNC_TOKEN_FILE,
// $WEIGHTSYNC_TOKEN. "" when none is configured. A token file must be a regular file owned by this
// user with no group/other permission bits (0600 or stricter); one trailing newline is stripped.
// Tokens shorter than kMinTokenBytes are refused.
Result<std::string> LoadToken(const std::string& token, const std::string& token_file);

}  // namespace weightsync::util
