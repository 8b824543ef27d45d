// Helpers of the GPU tests (built only with the CUDA backend).
#pragma once

#include <cuda_runtime_api.h>

namespace flashqla_test {

// Whether this machine has a CUDA device (GPU tests skip without one).
inline bool have_cuda_device() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

}  // namespace flashqla_test
