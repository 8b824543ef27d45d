#include "core/memory_kind.h"

#ifdef FLASHQLA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace flashqla {

MemoryKind pointer_memory_kind(const void* p) {
#ifdef FLASHQLA_WITH_CUDA
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    // No driver / no device / unknown pointer: it cannot be device memory.
    (void)cudaGetLastError();  // clear the non-sticky error this call left
    return MemoryKind::Host;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice: return MemoryKind::Device;
    case cudaMemoryTypeManaged: return MemoryKind::Managed;
    default: return MemoryKind::Host;
  }
#else
  (void)p;
  return MemoryKind::Host;
#endif
}

}  // namespace flashqla
