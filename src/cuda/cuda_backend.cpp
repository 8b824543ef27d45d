#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"
#include "cuda/sm90/cu_seqlens_check_sm90.h"

namespace flashqla::cuda {
namespace {

// Bytes of workspace the debug check of cu_seqlens uses (one result word,
// padded to an alignment every later workspace user can build on).
constexpr size_t kCuSeqlensCheckBytes = 256;

void check_cuda(cudaError_t err, const char* entry, const char* what) {
  if (err != cudaSuccess) {
    fail(FLASHQLA_STATUS_CUDA_ERROR,
         str(entry, ": ", what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
}

// The kernels are compiled for sm_90a only (WGMMA / TMA); anything else has
// no kernel image to run.
void require_sm90(const char* entry) {
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), entry, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), entry,
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), entry,
             "cudaDeviceGetAttribute");
  if (major != 9 || minor != 0) {
    fail(FLASHQLA_STATUS_NOT_SUPPORTED,
         str(entry, ": device ", device, ": flashqla's CUDA kernels need an sm_90 GPU (H100/H200), "
                    "found compute capability ", major, ".", minor));
  }
}

// The documented debug switch: checks cu_seqlens on the device and
// synchronises the stream to read the verdict.
void debug_check_cu_seqlens(const flashqla_gdn_fwd_params_t& p, const Problem& pr,
                            const char* entry) {
  auto* result = static_cast<uint32_t*>(p.workspace);
  check_cuda(launch_check_cu_seqlens(p.cu_seqlens.data, p.cu_seqlens.dtype == FLASHQLA_DTYPE_INT64,
                                     pr.N, pr.T, result, p.stream),
             entry, "cu_seqlens debug check launch");
  uint32_t issues = 0;
  check_cuda(cudaMemcpyAsync(&issues, result, sizeof(issues), cudaMemcpyDeviceToHost, p.stream),
             entry, "cu_seqlens debug check copy");
  check_cuda(cudaStreamSynchronize(p.stream), entry, "cu_seqlens debug check sync");
  if (issues == kCuSeqlensOk) return;
  std::string what;
  if (issues & kCuSeqlensBadStart) what += " must start at 0;";
  if (issues & kCuSeqlensDecreasing) what += " must be non-decreasing;";
  if (issues & kCuSeqlensBadEnd) what += str(" must end at T = ", pr.T, ";");
  what.pop_back();
  fail(FLASHQLA_STATUS_INVALID_CU_SEQLENS,
       str(entry, ": cu_seqlens (checked on the device):", what));
}

[[noreturn]] void kernels_not_built(const char* entry, const char* direction) {
  fail(FLASHQLA_STATUS_NOT_SUPPORTED,
       str(entry, ": the sm_90a GDN ", direction,
           " kernel is not part of this version of flashqla yet; pass host tensors to use the "
           "CPU backend"));
}

}  // namespace

size_t forward_workspace_bytes(const Problem& pr, const flashqla_gdn_fwd_params_t&) {
  return pr.debug_check_cu_seqlens ? kCuSeqlensCheckBytes : 0;
}

size_t backward_workspace_bytes(const Problem& pr, const flashqla_gdn_bwd_params_t&) {
  return pr.debug_check_cu_seqlens ? kCuSeqlensCheckBytes : 0;
}

void gdn_forward(const Problem& pr, const flashqla_gdn_fwd_params_t& p) {
  constexpr const char* entry = "flashqla_gdn_fwd";
  require_sm90(entry);
  if (pr.debug_check_cu_seqlens) debug_check_cu_seqlens(p, pr, entry);
  kernels_not_built(entry, "forward");
}

void gdn_backward(const Problem& pr, const flashqla_gdn_bwd_params_t& p) {
  constexpr const char* entry = "flashqla_gdn_bwd";
  require_sm90(entry);
  if (pr.debug_check_cu_seqlens) debug_check_cu_seqlens(p.fwd, pr, entry);
  kernels_not_built(entry, "backward");
}

}  // namespace flashqla::cuda
