// GPU checks of the shared-memory operand layouts wgmma reads (sm_90a): each
// case runs one 64x128x64 bf16 GEMM with A and B in a given layout and compares
// it with a host GEMM. The kernels' operand layouts are built from these.
#pragma once

#include <string>
#include <vector>

namespace flashqla_test {

struct WgmmaLayoutResult {
  std::string name;
  double max_rel_error = 0;  // max |gpu - host| / max |host|
  std::string error;         // CUDA error text, empty on success
};

// Names of the cases, in the order run_wgmma_layout_case takes them.
std::vector<std::string> wgmma_layout_case_names();
WgmmaLayoutResult run_wgmma_layout_case(int index);

}  // namespace flashqla_test
