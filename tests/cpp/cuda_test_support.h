// Helpers of the GPU tests (built only with the CUDA backend).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "test_support.h"

namespace flashqla_test {

// Whether this machine has a CUDA device (GPU tests skip without one).
inline bool have_cuda_device() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

// A device copy of a host tensor (same strides, same dtype).
struct DeviceTensor {
  void* ptr = nullptr;
  flashqla_tensor_t desc{};
  explicit DeviceTensor(const HostTensor& h) {
    desc = h.desc;
    const size_t bytes = h.bytes.size();
    if (bytes == 0) return;
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, h.bytes.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    desc.data = ptr;
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() {
    if (ptr) cudaFree(ptr);
  }
};

// Device memory of the size a workspace query reported (none for 0 bytes).
struct DeviceWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceWorkspace(size_t n) : bytes(n) {
    if (n > 0) {
      EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess);
    }
  }
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;
  ~DeviceWorkspace() {
    if (ptr) cudaFree(ptr);
  }
};

// Fills a device buffer with 0xFF bytes: NaN in bf16, fp16 and fp32, so an
// element the kernel does not write fails the comparison. Ordered on `stream`.
inline void poison(const DeviceTensor& t, size_t bytes, cudaStream_t stream = nullptr) {
  if (t.ptr) {
    ASSERT_EQ(cudaMemsetAsync(t.ptr, 0xFF, bytes, stream), cudaSuccess);
  }
}

inline std::vector<unsigned char> download(const DeviceTensor& t, size_t bytes) {
  std::vector<unsigned char> out(bytes);
  if (t.ptr) {
    EXPECT_EQ(cudaMemcpy(out.data(), t.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return out;
}

// A host tensor's layout holding bytes downloaded from its device copy.
inline HostTensor with_bytes(const HostTensor& layout, std::vector<unsigned char> bytes) {
  HostTensor t = layout;
  t.bytes = std::move(bytes);
  t.desc.data = t.bytes.empty() ? nullptr : t.bytes.data();
  return t;
}

// A forward call's tensors copied to the device and its params over them
// (backend AUTO, absent optional tensors left out, no workspace or stream yet).
struct DeviceForwardCall {
  std::vector<std::unique_ptr<DeviceTensor>> dev;  // q, k, v, g, beta, h0, o, final state, cu_seqlens
  flashqla_gdn_fwd_params_t p{};
  explicit DeviceForwardCall(GdnCase& c);
  const DeviceTensor& o() const { return *dev[6]; }
  const DeviceTensor& ht() const { return *dev[7]; }
};

// The same for a backward call.
struct DeviceBackwardCall {
  static constexpr size_t kFirstOutput = 9;  // dev[9..14]: dq, dk, dv, dg, dbeta, dh0
  std::vector<HostTensor*> host;  // the case's tensors, in dev's order
  // q, k, v, g, beta, h0, cu_seqlens, d_o, d_final_state, then the gradients
  std::vector<std::unique_ptr<DeviceTensor>> dev;
  flashqla_gdn_bwd_params_t p{};
  explicit DeviceBackwardCall(GdnCase& c);
};

// One call on the CUDA backend with the case's inputs copied to the device and
// its outputs poisoned with NaN there, then downloaded into the case's host
// tensors (c.o and c.ht, or c.dq .. c.dh0), so they hold what the GPU wrote.
// A failed call is a test failure naming `what` and the library's message.
// `stream` (default: the legacy default stream) carries the call, its copies
// and its wait.
void run_forward_on_device(GdnCase& c, const std::string& what, cudaStream_t stream = nullptr);
void run_backward_on_device(GdnCase& c, const std::string& what, cudaStream_t stream = nullptr);

}  // namespace flashqla_test
