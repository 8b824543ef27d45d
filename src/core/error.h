// Internal error type and the thread-local "last error" behind
// flashqla_last_error_message(). Errors are C++ exceptions inside the
// library and become a status plus a message at the C API boundary
// (see api/api.cpp); nothing escapes an extern "C" function.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "flashqla/flashqla.h"

namespace flashqla {

class Error : public std::runtime_error {
 public:
  Error(flashqla_status_t status, std::string message)
      : std::runtime_error(std::move(message)), status_(status) {}
  flashqla_status_t status() const { return status_; }

 private:
  flashqla_status_t status_;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from its pieces: str("q.stride[3]: expected 1, got ", s).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

[[noreturn]] inline void fail(flashqla_status_t status, const std::string& message) {
  throw Error(status, message);
}

// Records the message for flashqla_last_error_message() on this thread.
void set_last_error(const std::string& message);
void clear_last_error();

}  // namespace flashqla

// Throws an INVALID_ARGUMENT (or the given status) error when cond is false.
#define FLASHQLA_REQUIRE(cond, ...)                                                 \
  do {                                                                            \
    if (!(cond)) ::flashqla::fail(FLASHQLA_STATUS_INVALID_ARGUMENT, ::flashqla::str(__VA_ARGS__)); \
  } while (0)
