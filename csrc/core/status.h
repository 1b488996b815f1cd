// One error policy: exceptions (BluefogError) inside the core, converted to a Status at the
// C API and TF kernel boundaries. Messages name the rank, the op and the tensor.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace bluefog {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's own input is wrong; found before any communication
  kPrecondition,     // ranks disagree, or the library is not in a state to run the op
  kAborted,          // the library was shut down, or a peer failed
  kInternal,         // a bug or an MPI failure
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

class BluefogError : public std::runtime_error {
 public:
  BluefogError(StatusCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }
  Status ToStatus() const { return Status(code_, what()); }

 private:
  StatusCode code_;
};

// A transport whose connections broke (a peer died, or did not answer in time): the channel
// must stop, failing every request, rather than fail only the requests of the collective that
// threw and go on. Thrown by the Gloo backend; the executors let it through.
class TransportError : public BluefogError {
 public:
  using BluefogError::BluefogError;
};

// Builds a message from streamable parts: Concat("rank ", r, ": ", what).
template <typename... Args>
std::string Concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

#define BF_ENFORCE(cond, code, ...)                                                     \
  do {                                                                                  \
    if (!(cond)) throw ::bluefog::BluefogError((code), ::bluefog::Concat(__VA_ARGS__)); \
  } while (0)

}  // namespace bluefog
