#include "weightsync/status.h"

#include <cstring>

namespace weightsync {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kAlreadyExists:
      return "already_exists";
    case StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case StatusCode::kBusy:
      return "busy";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kPeerLost:
      return "peer_lost";
    case StatusCode::kCorruption:
      return "corruption";
    case StatusCode::kProtocolError:
      return "protocol_error";
    case StatusCode::kUnauthenticated:
      return "unauthenticated";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kIoError:
      return "io_error";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kNotSupported:
      return "not_supported";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message)});
  }
}

Status Status::FromErrno(int err, std::string_view context) {
  char buf[128];
  // GNU strerror_r returns the message pointer (may not use buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  StatusCode code = StatusCode::kIoError;
  if (err == ECONNRESET || err == EPIPE || err == ECONNREFUSED) code = StatusCode::kPeerLost;
  if (err == ENOENT) code = StatusCode::kNotFound;
  if (err == ENOMEM || err == EMFILE || err == ENFILE || err == ENOSPC) {
    code = StatusCode::kResourceExhausted;
  }
  if (err == ETIMEDOUT) code = StatusCode::kTimeout;
  return Make(code, context, ": ", text, " (errno ", err, ")");
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(StatusCodeName(code())) + ": " + state_->message;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code(), std::string(context) + ": " + state_->message);
}

void Status::Update(const Status& other) {
  if (other.ok()) return;
  if (ok()) {
    *this = other;
    return;
  }
  *this = Status(code(), state_->message + "; also " + other.ToString());
}

std::ostream& operator<<(std::ostream& os, const Status& status) { return os << status.ToString(); }

}  // namespace weightsync
