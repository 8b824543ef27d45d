// Observability of the entry points: an NVTX range per public call (in CUDA
// builds; nvtx3 is header-only and costs nothing without a profiler), and the
// documented switch FLASHQLA_PRINT_PLAN=1, which prints each call's resolved
// plan (backend, sizes, kernel grid) to stderr.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef FLASHQLA_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace flashqla {

class TraceRange {
 public:
  explicit TraceRange(const char* name) {
#ifdef FLASHQLA_WITH_CUDA
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~TraceRange() {
#ifdef FLASHQLA_WITH_CUDA
    nvtxRangePop();
#endif
  }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

inline bool print_plan_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FLASHQLA_PRINT_PLAN");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// printf-style line on stderr, prefixed "flashqla plan: ", when the switch is on.
#define FLASHQLA_PLAN(...)                                   \
  do {                                                       \
    if (::flashqla::print_plan_enabled()) {                  \
      std::fprintf(stderr, "flashqla plan: " __VA_ARGS__);   \
      std::fputc('\n', stderr);                              \
    }                                                        \
  } while (0)

}  // namespace flashqla
