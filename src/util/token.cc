#include "util/token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "util/knobs.h"
#include "util/unique_fd.h"

namespace weightsync::util {
namespace {

Result<std::string> ReadTokenFile(const std::string& path) {
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (raw < 0) return Status::FromErrno(errno, "token file '" + path + "'");
  UniqueFd fd(raw);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0)
    return Status::FromErrno(errno, "stat token file '" + path + "'");
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("token file '", path, "' is not a regular file");
  }
  if (st.st_uid != ::getuid()) {
    return Status::Unauthenticated("token file '", path, "' is owned by uid ", st.st_uid,
                                   ", not by this user");
  }
  if ((st.st_mode & 077) != 0) {
    return Status::Unauthenticated("token file '", path, "' has mode ", std::oct,
                                   (st.st_mode & 0777), std::dec,
                                   ": it must not be readable by group or others (chmod 600)");
  }
  if (st.st_size > 4096) {
    return Status::InvalidArgument("token file '", path, "' is ", st.st_size,
                                   " bytes; a token is at most 4096");
  }
  std::string token(static_cast<size_t>(st.st_size), '\0');
  ssize_t n = ::read(fd.get(), token.data(), token.size());
  if (n < 0) return Status::FromErrno(errno, "reading token file '" + path + "'");
  token.resize(static_cast<size_t>(n));
  if (!token.empty() && token.back() == '\n') token.pop_back();
  return token;
}

}  // namespace

Result<std::string> LoadToken(const std::string& token, const std::string& token_file) {
  std::string value;
  std::string source;
  if (!token.empty()) {
    value = token;
    source = "the token option";
  } else if (!token_file.empty()) {
    WS_ASSIGN_OR_RETURN(value, ReadTokenFile(token_file));
    source = "token file '" + token_file + "'";
  } else if (std::optional<std::string> f = KnobValue(Knob::kTokenFile)) {
    WS_ASSIGN_OR_RETURN(value, ReadTokenFile(*f));
    source = "WEIGHTSYNC_TOKEN_FILE";
  } else if (std::optional<std::string> t = KnobValue(Knob::kToken)) {
    value = *t;
    source = "WEIGHTSYNC_TOKEN";
  } else {
    return std::string();
  }
  if (value.size() < kMinTokenBytes) {
    return Status::InvalidArgument("the token from ", source, " is ", value.size(),
                                   " bytes; at least ", kMinTokenBytes, " are required");
  }
  return value;
}

}  // namespace weightsync::util
