// Where a pointer lives, as far as this build can tell.
#pragma once

namespace flashqla {

enum class MemoryKind { Host, Device, Managed };

// Host for every pointer when the library is built without CUDA or no CUDA
// driver/device is present.
MemoryKind pointer_memory_kind(const void* p);

inline const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::Host: return "host memory";
    case MemoryKind::Device: return "CUDA device memory";
    case MemoryKind::Managed: return "CUDA managed memory";
  }
  return "unknown memory";
}

}  // namespace flashqla
