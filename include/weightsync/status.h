// Status and Result<T>: errors are values at every API boundary.
// A Status carries a code and a message that names the thing, the expected and the actual.
// Nothing in weightsync throws across its public API; the Python module converts Status into
// typed exceptions in one place.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace weightsync {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // caller passed something malformed or inconsistent
  kNotFound,            // unknown name, step no longer held, endpoint absent
  kAlreadyExists,       // endpoint already served by a live publisher
  kFailedPrecondition,  // call not valid in this state (stale step, closed object)
  kBusy,                // another update is in flight on this subscriber
  kTimeout,             // a deadline passed while the peer stayed silent
  kPeerLost,            // the peer closed its end or died
  kCorruption,          // bytes arrived but do not match their digest
  kProtocolError,       // a frame broke the wire format (magic, version, bounds)
  kUnauthenticated,     // peer identity (uid, token) not accepted
  kResourceExhausted,   // memory, fds, connection cap
  kIoError,             // an OS call failed; message carries errno text
  kUnavailable,         // capability not built or not present at run time
  kNotSupported,        // operation not offered by this transport
  kCancelled,           // interrupted by the caller
  kInternal,            // a bug in weightsync
};

// Stable lower_snake name of a code, e.g. "peer_lost".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK; allocation-free
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }
  template <typename... Args>
  static Status InvalidArgument(Args&&... args) {
    return Make(StatusCode::kInvalidArgument, args...);
  }
  template <typename... Args>
  static Status NotFound(Args&&... args) {
    return Make(StatusCode::kNotFound, args...);
  }
  template <typename... Args>
  static Status AlreadyExists(Args&&... args) {
    return Make(StatusCode::kAlreadyExists, args...);
  }
  template <typename... Args>
  static Status FailedPrecondition(Args&&... args) {
    return Make(StatusCode::kFailedPrecondition, args...);
  }
  template <typename... Args>
  static Status Busy(Args&&... args) {
    return Make(StatusCode::kBusy, args...);
  }
  template <typename... Args>
  static Status Timeout(Args&&... args) {
    return Make(StatusCode::kTimeout, args...);
  }
  template <typename... Args>
  static Status PeerLost(Args&&... args) {
    return Make(StatusCode::kPeerLost, args...);
  }
  template <typename... Args>
  static Status Corruption(Args&&... args) {
    return Make(StatusCode::kCorruption, args...);
  }
  template <typename... Args>
  static Status ProtocolError(Args&&... args) {
    return Make(StatusCode::kProtocolError, args...);
  }
  template <typename... Args>
  static Status Unauthenticated(Args&&... args) {
    return Make(StatusCode::kUnauthenticated, args...);
  }
  template <typename... Args>
  static Status ResourceExhausted(Args&&... args) {
    return Make(StatusCode::kResourceExhausted, args...);
  }
  template <typename... Args>
  static Status IoError(Args&&... args) {
    return Make(StatusCode::kIoError, args...);
  }
  template <typename... Args>
  static Status Unavailable(Args&&... args) {
    return Make(StatusCode::kUnavailable, args...);
  }
  template <typename... Args>
  static Status NotSupported(Args&&... args) {
    return Make(StatusCode::kNotSupported, args...);
  }
  template <typename... Args>
  static Status Cancelled(Args&&... args) {
    return Make(StatusCode::kCancelled, args...);
  }
  template <typename... Args>
  static Status Internal(Args&&... args) {
    return Make(StatusCode::kInternal, args...);
  }
  // errno-based failure: "<context>: <strerror> (errno N)".
  static Status FromErrno(int err, std::string_view context);

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  std::string ToString() const;  // "peer_lost: message"

  // Returns a copy with "context: " prepended to the message (code unchanged).
  Status WithContext(std::string_view context) const;

  // Keeps the first error; later errors are appended to its message. Used when a cleanup
  // continues past a failure and must report all of them.
  void Update(const Status& other);

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  template <typename... Args>
  static Status Make(StatusCode code, Args&&... args) {
    std::ostringstream os;
    (os << ... << args);
    return Status(code, os.str());
  }
  std::shared_ptr<const State> state_;  // null means OK; copies share the immutable state
};

std::ostream& operator<<(std::ostream& os, const Status& status);

// Result<T> holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : repr_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : repr_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(repr_).ok()) {
      repr_ = Status::Internal("Result constructed from an OK Status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(repr_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(repr_); }
  T& value() & { return std::get<T>(repr_); }
  const T& value() const& { return std::get<T>(repr_); }
  T&& value() && { return std::get<T>(std::move(repr_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> repr_;
};

}  // namespace weightsync

#define WS_CONCAT_INNER_(a, b) a##b
#define WS_CONCAT_(a, b) WS_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define WS_RETURN_IF_ERROR(expr)                                    \
  do {                                                              \
    ::weightsync::Status ws_status_ = ::weightsync::ToStatus(expr); \
    if (!ws_status_.ok()) return ws_status_;                        \
  } while (0)

// `WS_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define WS_ASSIGN_OR_RETURN(lhs, expr) \
  WS_ASSIGN_OR_RETURN_IMPL_(WS_CONCAT_(ws_result_, __LINE__), lhs, expr)
#define WS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

namespace weightsync {
inline const Status& ToStatus(const Status& s) { return s; }
template <typename T>
Status ToStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace weightsync
