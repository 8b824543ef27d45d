#include "core/error.h"

namespace flashqla {
namespace {
thread_local std::string g_last_error;
}  // namespace

void set_last_error(const std::string& message) { g_last_error = message; }
void clear_last_error() { g_last_error.clear(); }

}  // namespace flashqla

extern "C" const char* flashqla_last_error_message(void) {
  return flashqla::g_last_error.c_str();
}
