// The torch binding: registers flashqla's ops with explicit schemas through
// PyTorch's stable ABI (one build serves every torch from 2.10 on) and turns
// tensors into C API params. It computes nothing and compiles no CUDA.
//
//   flashqla::gdn_fwd  -> (o, final_state)
//   flashqla::gdn_fwd_pooled -> (): the serving entry, o into the caller's tensor,
//                                   the state pool read at state_indices and
//                                   written back there in place
//   flashqla::gdn_bwd  -> (dq, dk, dv, dg, dbeta, dh0)
//   flashqla::gdn_fwd_kernel_choice -> (kernel, pieces, piece_chunks, lengths_guessed,
//                                       workspace_bytes, reason): what gdn_fwd with the
//                                       same arguments runs (flashqla_gdn_fwd_kernel_choice)
//   flashqla::gdn_bwd_kernel_choice -> (kernel, piece_chunks, workspace_bytes, reason): what gdn_bwd
//                                       after that forward runs (flashqla_gdn_bwd_kernel_choice)
//
// Outputs are allocated here on the inputs' device; final_state / dh0 are fp32
// (fp64 for fp64 inputs), 0-element when not requested / without an initial state.
// The Python layer adds fake (meta) implementations and autograd.
#include <dlfcn.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include "flashqla/flashqla.h"

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Errors reach Python as RuntimeError (the stable ABI carries a message, not a
// type), as "flashqla: <category>: <what>". The category is the status's, so the
// Python layer can raise ValueError / NotImplementedError (flashqla/_errors.py);
// <what> is the C API's message without the C entry point's name, which a
// Python caller never called, and with C field names that have a Python
// argument of another name renamed to it.
const char* error_category(flashqla_status_t status) {
  switch (status) {
    case FLASHQLA_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case FLASHQLA_STATUS_NOT_SUPPORTED: return "not supported";
    case FLASHQLA_STATUS_INVALID_CU_SEQLENS: return "invalid cu_seqlens";
    case FLASHQLA_STATUS_WORKSPACE_TOO_SMALL: return "workspace too small";
    case FLASHQLA_STATUS_CUDA_ERROR: return "CUDA error";
    case FLASHQLA_STATUS_OUT_OF_MEMORY: return "out of memory";
    default: return "internal error";
  }
}

std::string python_facing(std::string message) {
  // "flashqla_gdn_fwd_workspace_size: cu_seqlens: ..." or "flashqla: ..." -> "cu_seqlens: ..."
  for (const char* prefix : {"flashqla_", "flashqla: "}) {
    const std::string p(prefix);
    if (message.compare(0, p.size(), p) != 0) continue;
    const size_t colon = message.find(": ");
    if (colon != std::string::npos) message.erase(0, colon + 2);
    break;
  }
  const std::pair<const char*, const char*> renames[] = {{"cu_seqlens_host", "cu_seqlens_cpu"},
                                                         {"d_o", "do"},
                                                         {"d_final_state", "dht"}};
  for (const auto& [c_name, py_name] : renames) {
    const std::string c(c_name);
    if (message.compare(0, c.size(), c) == 0 &&
        (message.size() == c.size() || message[c.size()] == ':' || message[c.size()] == '.' ||
         message[c.size()] == '[')) {
      message.replace(0, c.size(), py_name);
    }
  }
  return message;
}

[[noreturn]] void raise(flashqla_status_t status, const std::string& message) {
  const std::string category = error_category(status);
  std::string what = python_facing(message);
  if (what.compare(0, category.size() + 2, category + ": ") == 0) what.erase(0, category.size() + 2);
  throw std::runtime_error("flashqla: " + category + ": " + what);
}

[[noreturn]] void raise_invalid(const std::string& message) {
  raise(FLASHQLA_STATUS_INVALID_ARGUMENT, message);
}

void check(flashqla_status_t status) {
  if (status != FLASHQLA_STATUS_SUCCESS) raise(status, flashqla_last_error_message());
}

flashqla_dtype_t to_flashqla_dtype(ScalarType t, const char* name) {
  switch (t) {
    case ScalarType::Float: return FLASHQLA_DTYPE_FLOAT32;
    case ScalarType::Half: return FLASHQLA_DTYPE_FLOAT16;
    case ScalarType::BFloat16: return FLASHQLA_DTYPE_BFLOAT16;
    case ScalarType::Double: return FLASHQLA_DTYPE_FLOAT64;
    case ScalarType::Int: return FLASHQLA_DTYPE_INT32;
    case ScalarType::Long: return FLASHQLA_DTYPE_INT64;
    default: break;
  }
  raise(FLASHQLA_STATUS_NOT_SUPPORTED, std::string(name) +
                                           ": unsupported dtype (expected float32, float16, bfloat16, float64, "
                                           "or int32/int64 for cu_seqlens)");
}

// A tensor as the C API sees it: pointer, dtype and `rank` strides.
flashqla_tensor_t describe(const Tensor& t, const char* name, int64_t rank) {
  if (t.dim() != rank) {
    raise_invalid(std::string(name) + ": expected a " +
                             std::to_string(rank) + "-d tensor, got " + std::to_string(t.dim()) +
                             "-d");
  }
  flashqla_tensor_t d{};
  d.data = t.numel() == 0 ? nullptr : t.data_ptr();
  d.dtype = to_flashqla_dtype(t.scalar_type(), name);
  for (int64_t i = 0; i < rank; ++i) d.stride[i] = t.stride(i);
  // Size-1 dimensions may carry any stride in torch; the C API only reads
  // strides, so a trailing size-1 dim is reported as contiguous.
  if (t.size(rank - 1) == 1) d.stride[rank - 1] = 1;
  return d;
}

// The C API reads sizes from the params and strides from each tensor, so
// every tensor's shape must be checked against those sizes here.
void expect_shape(const Tensor& t, const char* name, const std::vector<int64_t>& shape) {
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = t.size(static_cast<int64_t>(i)) == shape[i];
  if (ok) return;
  auto fmt = [](auto&& sizes, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(sizes(i));
    return s + "]";
  };
  raise_invalid(
      std::string(name) + ": expected shape " +
      fmt([&](size_t i) { return shape[i]; }, shape.size()) + ", got " +
      fmt([&](size_t i) { return t.size(static_cast<int64_t>(i)); }, static_cast<size_t>(t.dim())));
}


// The current CUDA stream of `device`, from torch's CUDA library when torch
// has loaded one (resolved at run time so this binding also loads with
// CPU-only torch builds).
flashqla_stream_t current_cuda_stream(int32_t device) {
  using GetStream = AOTITorchError (*)(int32_t, void**);
  static GetStream get = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<GetStream>(dlsym(lib, "aoti_torch_get_current_cuda_stream"))
               : nullptr;
  }();
  if (get == nullptr) raise(FLASHQLA_STATUS_CUDA_ERROR, "CUDA tensor but torch has no CUDA library loaded");
  void* stream = nullptr;
  if (get(device, &stream) != AOTI_TORCH_SUCCESS) raise(FLASHQLA_STATUS_CUDA_ERROR, "cannot read the current CUDA stream");
  return static_cast<flashqla_stream_t>(stream);
}

// The C API needs a unit stride in each tensor's last dimension; the rare input
// without one (a column-major view, an expanded scalar) is copied here, as FLA
// makes every input contiguous. Views with a contiguous last dimension — slices
// of a packed qkv projection — are passed through without a copy.
Tensor unit_last_stride(const Tensor& t) {
  const int64_t d = t.dim();
  return d > 0 && t.size(d - 1) > 1 && t.stride(d - 1) != 1 ? torch::stable::contiguous(t) : t;
}

std::optional<Tensor> unit_last_stride(const std::optional<Tensor>& t) {
  return t.has_value() ? std::optional<Tensor>(unit_last_stride(*t)) : std::nullopt;
}

bool copied_for_unit_last_stride(const Tensor& t) {
  const int64_t d = t.dim();
  return d > 0 && t.size(d - 1) > 1 && t.stride(d - 1) != 1;
}

// The kernel choice judges the tensors the forward hands the C API without
// making them: a tensor the forward allocates (o, final_state) or copies
// (unit_last_stride) is described with contiguous strides at the address of a
// fresh allocation on the same device (`fresh`), which is how the real one lands
// (the allocators align every block to at least 64 bytes).
flashqla_tensor_t describe_fresh(const char* name, int64_t rank, const Tensor& fresh,
                                 const std::vector<int64_t>& shape, ScalarType dtype) {
  flashqla_tensor_t d{};
  d.dtype = to_flashqla_dtype(dtype, name);
  int64_t elements = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    d.stride[i] = elements;
    elements *= shape[static_cast<size_t>(i)];
  }
  d.data = elements == 0 ? nullptr : fresh.data_ptr();
  return d;
}

std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < t.dim(); ++i) sizes.push_back(t.size(i));
  return sizes;
}

// The sizes and inputs shared by forward and backward. Inputs without a unit
// last stride are replaced by contiguous copies (kept alive by the caller), or,
// given `fresh` (the kernel choice), described as such copies without making them.
flashqla_gdn_fwd_params_t common_params(Tensor& q, Tensor& k, Tensor& v, Tensor& g, Tensor& beta,
                                        double scale, std::optional<Tensor>& initial_state,
                                        const std::optional<Tensor>& cu_seqlens,
                                        const std::optional<Tensor>& cu_seqlens_cpu,
                                        bool state_v_first, bool use_qk_l2norm,
                                        int64_t beta_activation, const Tensor* fresh = nullptr) {
  if (fresh == nullptr) {
    for (Tensor* t : {&q, &k, &v, &g, &beta}) *t = unit_last_stride(*t);
    initial_state = unit_last_stride(initial_state);
  }
  auto describe = [fresh](const Tensor& t, const char* name, int64_t rank) {
    if (fresh == nullptr || t.dim() != rank || !copied_for_unit_last_stride(t)) return ::describe(t, name, rank);
    return describe_fresh(name, rank, *fresh, sizes_of(t), t.scalar_type());
  };
  flashqla_gdn_fwd_params_t p;
  flashqla_gdn_fwd_params_init(&p);
  if (q.dim() != 4 || v.dim() != 4) {
    raise_invalid("q and v must be 4-d ([B, T, H, K] and [B, T, HV, V])");
  }
  const int64_t B = q.size(0), T = q.size(1), HV = v.size(2);
  expect_shape(k, "k", {B, T, q.size(2), q.size(3)});
  expect_shape(v, "v", {B, T, HV, v.size(3)});
  expect_shape(g, "g", {B, T, HV});
  expect_shape(beta, "beta", {B, T, HV});
  p.q = describe(q, "q", 4);
  p.k = describe(k, "k", 4);
  p.v = describe(v, "v", 4);
  p.g = describe(g, "g", 3);
  p.beta = describe(beta, "beta", 3);
  p.B = q.size(0);
  p.T = q.size(1);
  p.H = q.size(2);
  p.K = q.size(3);
  p.HV = v.size(2);
  p.V = v.size(3);
  if (cu_seqlens.has_value()) {
    p.cu_seqlens = ::describe(*cu_seqlens, "cu_seqlens", 1);  // never copied: judged as given
    p.N = cu_seqlens->size(0) - 1;
    if (cu_seqlens_cpu.has_value()) {
      if (!cu_seqlens_cpu->is_cpu() || cu_seqlens_cpu->scalar_type() != cu_seqlens->scalar_type() ||
          cu_seqlens_cpu->numel() != cu_seqlens->numel() || !cu_seqlens_cpu->is_contiguous()) {
        raise_invalid(
            "cu_seqlens_cpu: must be a contiguous CPU tensor with the dtype and length "
            "of cu_seqlens");
      }
      p.cu_seqlens_host = cu_seqlens_cpu->data_ptr();
    }
  }
  if (initial_state.has_value()) {
    const int64_t n = initial_state->dim() > 0 ? initial_state->size(0) : 0;
    expect_shape(*initial_state, "initial_state", state_v_first ? std::vector<int64_t>{n, HV, p.V, p.K}
                                                                : std::vector<int64_t>{n, HV, p.K, p.V});
    p.initial_state = describe(*initial_state, "initial_state", 4);
    p.initial_state_n = initial_state->size(0);
  }
  p.scale = scale;
  p.state_v_first = state_v_first ? 1 : 0;
  p.use_qk_l2norm = use_qk_l2norm ? 1 : 0;
  p.beta_activation = static_cast<flashqla_beta_activation_t>(beta_activation);
  if (q.is_cuda()) {
    p.backend = FLASHQLA_BACKEND_CUDA;
    p.stream = current_cuda_stream(q.get_device_index());
  } else {
    p.backend = FLASHQLA_BACKEND_CPU;
    p.cpu_num_threads = static_cast<int>(torch::stable::get_num_threads());
  }
  return p;
}

// States (final_state, dh0) are fp32, or fp64 when the inputs are fp64.
ScalarType state_dtype(const Tensor& q) {
  return q.scalar_type() == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
}

std::vector<int64_t> state_shape(const flashqla_gdn_fwd_params_t& p, int64_t n, bool v_first) {
  return v_first ? std::vector<int64_t>{n, p.HV, p.V, p.K} : std::vector<int64_t>{n, p.HV, p.K, p.V};
}

// Allocates the workspace the call reports and stores it in the params.
template <typename Params, typename SizeFn>
std::optional<Tensor> attach_workspace(Params& params, flashqla_gdn_fwd_params_t& fwd,
                                       const Tensor& like, SizeFn size_fn) {
  size_t bytes = 0;
  check(size_fn(&params, &bytes));
  if (bytes == 0) return std::nullopt;
  Tensor ws = torch::stable::new_empty(like, {static_cast<int64_t>(bytes)}, ScalarType::Byte);
  fwd.workspace = ws.data_ptr();
  fwd.workspace_bytes = bytes;
  return ws;
}

std::tuple<Tensor, Tensor> gdn_fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta,
                                   double scale, std::optional<Tensor> initial_state,
                                   std::optional<Tensor> cu_seqlens,
                                   std::optional<Tensor> cu_seqlens_cpu, bool output_final_state,
                                   bool state_v_first, bool use_qk_l2norm,
                                   int64_t beta_activation) {
  flashqla_gdn_fwd_params_t p =
      common_params(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
                    state_v_first, use_qk_l2norm, beta_activation);
  const int64_t N = cu_seqlens.has_value() ? p.N : p.B;
  Tensor o = torch::stable::new_empty(q, {p.B, p.T, p.HV, p.V});
  Tensor final_state = torch::stable::new_empty(
      q, output_final_state ? state_shape(p, N, state_v_first) : std::vector<int64_t>{0},
      state_dtype(q));
  p.o = describe(o, "o", 4);
  if (output_final_state) {
    p.final_state = describe(final_state, "final_state", 4);
    p.output_final_state = 1;
  }
  std::optional<Tensor> ws = attach_workspace(p, p, q, flashqla_gdn_fwd_workspace_size);
  check(flashqla_gdn_fwd(&p));
  return {o, final_state};
}

// The serving entry: each sequence starts from its slot of `state_pool`
// ([slots, HV, K, V] or, state_v_first, [slots, HV, V, K]; fp32, bf16 or any
// float) at state_indices ([N] int32 / int64; negative: from zero, nothing
// written), o goes into `o` ([B, T, HV, V]), and with write_back every final
// state into its slot, in place. Nothing is copied: the pool and o must have a
// unit last stride.
void gdn_fwd_pooled(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, double scale, Tensor state_pool,
                    Tensor state_indices, std::optional<Tensor> cu_seqlens, std::optional<Tensor> cu_seqlens_cpu,
                    Tensor o, bool write_back, bool state_v_first, bool use_qk_l2norm, int64_t beta_activation,
                    std::optional<Tensor> checkpoints, int64_t checkpoint_chunks) {
  if (state_pool.dim() != 4 || state_pool.stride(3) != 1) {
    raise_invalid("state_pool: must be 4-d with a unit last stride (it is updated in place, never copied)");
  }
  if (o.dim() != 4 || o.stride(3) != 1) {
    raise_invalid("output: must be 4-d with a unit last stride (it is written in place, never copied)");
  }
  if (state_indices.dim() != 1 || !state_indices.is_contiguous()) {
    raise_invalid("state_indices: must be a contiguous 1-d tensor of one slot per sequence");
  }
  std::optional<Tensor> pool = state_pool;
  flashqla_gdn_fwd_params_t p = common_params(q, k, v, g, beta, scale, pool, cu_seqlens, cu_seqlens_cpu,
                                              state_v_first, use_qk_l2norm, beta_activation);
  const int64_t N = cu_seqlens.has_value() ? p.N : p.B;
  expect_shape(state_indices, "state_indices", {N});
  expect_shape(o, "output", {p.B, p.T, p.HV, p.V});
  p.state_indices = describe(state_indices, "state_indices", 1);
  p.o = describe(o, "output", 4);
  if (write_back) {
    p.final_state = p.initial_state;
    p.output_final_state = 1;
  }
  if (checkpoints.has_value()) {
    if (checkpoints->dim() != 4 || checkpoints->stride(3) != 1) {
      raise_invalid("checkpoints: must be 4-d with a unit last stride (written in place, never copied)");
    }
    p.checkpoints = describe(*checkpoints, "checkpoints", 4);
    p.checkpoints_n = checkpoints->size(0);
  }
  p.checkpoint_chunks = checkpoint_chunks;
  std::optional<Tensor> ws = attach_workspace(p, p, q, flashqla_gdn_fwd_workspace_size);
  check(flashqla_gdn_fwd(&p));
}

// What gdn_fwd with the same arguments runs: the C API's kernel choice over the
// tensors gdn_fwd would hand it (inputs it would copy and the outputs it would
// allocate judged as those fresh contiguous tensors), without running anything,
// copying anything or synchronising. Returns (kernel name, pieces ("none",
// "passes", "chained"), chunks a piece, lengths guessed, workspace bytes, why not
// the fused kernel ("" when it runs)).
std::tuple<std::string, std::string, int64_t, bool, int64_t, std::string> gdn_fwd_kernel_choice(
    Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, double scale, std::optional<Tensor> initial_state,
    std::optional<Tensor> cu_seqlens, std::optional<Tensor> cu_seqlens_cpu, bool output_final_state,
    bool state_v_first, bool use_qk_l2norm, int64_t beta_activation) {
  const Tensor fresh = torch::stable::new_empty(q, {1});
  flashqla_gdn_fwd_params_t p =
      common_params(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu, state_v_first,
                    use_qk_l2norm, beta_activation, &fresh);
  const int64_t N = cu_seqlens.has_value() ? p.N : p.B;
  p.o = describe_fresh("o", 4, fresh, {p.B, p.T, p.HV, p.V}, q.scalar_type());
  if (output_final_state) {
    p.final_state = describe_fresh("final_state", 4, fresh, state_shape(p, N, state_v_first), state_dtype(q));
    p.output_final_state = 1;
  }
  flashqla_gdn_fwd_kernel_choice_t choice;
  check(flashqla_gdn_fwd_kernel_choice(&p, &choice));
  const char* pieces = choice.pieces == FLASHQLA_FWD_PIECES_PASSES    ? "passes"
                       : choice.pieces == FLASHQLA_FWD_PIECES_CHAINED ? "chained"
                                                                       : "none";
  return {choice.kernel_name, pieces, choice.piece_chunks, choice.lengths_guessed != 0,
          static_cast<int64_t>(choice.workspace_bytes), choice.reason};
}

// What gdn_bwd with the forward's arguments runs: the C API's backward kernel
// choice over the tensors gdn_bwd would hand it, the inputs judged as in
// gdn_fwd_kernel_choice, do (which autograd hands over fresh) and the gradients
// it would allocate as fresh contiguous tensors; without running, copying or
// synchronising anything. Returns (kernel name, the chains' piece length (0:
// whole sequences), workspace bytes, why not the tensor-core backward ("" when
// it runs)).
std::tuple<std::string, int64_t, int64_t, std::string> gdn_bwd_kernel_choice(
    Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, double scale, std::optional<Tensor> initial_state,
    std::optional<Tensor> cu_seqlens, std::optional<Tensor> cu_seqlens_cpu, bool state_v_first, bool use_qk_l2norm,
    int64_t beta_activation) {
  const Tensor fresh = torch::stable::new_empty(q, {1});
  flashqla_gdn_bwd_params_t p;
  flashqla_gdn_bwd_params_init(&p);
  p.fwd = common_params(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu, state_v_first,
                        use_qk_l2norm, beta_activation, &fresh);
  const flashqla_gdn_fwd_params_t& f = p.fwd;
  p.d_o = describe_fresh("do", 4, fresh, {f.B, f.T, f.HV, f.V}, q.scalar_type());
  p.dq = describe_fresh("dq", 4, fresh, {f.B, f.T, f.H, f.K}, q.scalar_type());
  p.dk = describe_fresh("dk", 4, fresh, {f.B, f.T, f.H, f.K}, k.scalar_type());
  p.dv = describe_fresh("dv", 4, fresh, {f.B, f.T, f.HV, f.V}, v.scalar_type());
  p.dg = describe_fresh("dg", 3, fresh, {f.B, f.T, f.HV}, g.scalar_type());
  p.dbeta = describe_fresh("dbeta", 3, fresh, {f.B, f.T, f.HV}, beta.scalar_type());
  if (initial_state.has_value()) {
    p.d_initial_state =
        describe_fresh("dh0", 4, fresh, state_shape(f, initial_state->size(0), state_v_first), state_dtype(q));
  }
  flashqla_gdn_bwd_kernel_choice_t choice;
  check(flashqla_gdn_bwd_kernel_choice(&p, &choice));
  return {choice.kernel_name, choice.piece_chunks, static_cast<int64_t>(choice.workspace_bytes), choice.reason};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> gdn_bwd(
    Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, double scale,
    std::optional<Tensor> initial_state, std::optional<Tensor> cu_seqlens,
    std::optional<Tensor> cu_seqlens_cpu, Tensor d_o, std::optional<Tensor> d_final_state,
    bool state_v_first, bool use_qk_l2norm, int64_t beta_activation) {
  // Incoming gradients are often expanded views (stride 0, e.g. from .sum()).
  d_o = unit_last_stride(d_o);
  d_final_state = unit_last_stride(d_final_state);
  flashqla_gdn_bwd_params_t p;
  flashqla_gdn_bwd_params_init(&p);
  p.fwd = common_params(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
                        state_v_first, use_qk_l2norm, beta_activation);
  expect_shape(d_o, "do", {p.fwd.B, p.fwd.T, p.fwd.HV, p.fwd.V});
  p.d_o = describe(d_o, "do", 4);
  if (d_final_state.has_value()) {
    const int64_t N = cu_seqlens.has_value() ? p.fwd.N : p.fwd.B;
    expect_shape(*d_final_state, "dht", state_shape(p.fwd, N, state_v_first));
    p.d_final_state = describe(*d_final_state, "dht", 4);
  }
  Tensor dq = torch::stable::new_empty(q, {p.fwd.B, p.fwd.T, p.fwd.H, p.fwd.K});
  Tensor dk = torch::stable::new_empty(k, {p.fwd.B, p.fwd.T, p.fwd.H, p.fwd.K});
  Tensor dv = torch::stable::new_empty(v, {p.fwd.B, p.fwd.T, p.fwd.HV, p.fwd.V});
  Tensor dg = torch::stable::new_empty(g, {p.fwd.B, p.fwd.T, p.fwd.HV});
  Tensor dbeta = torch::stable::new_empty(beta, {p.fwd.B, p.fwd.T, p.fwd.HV});
  Tensor dh0 = torch::stable::new_empty(
      q, initial_state.has_value() ? state_shape(p.fwd, initial_state->size(0), state_v_first)
                                   : std::vector<int64_t>{0},
      state_dtype(q));
  p.dq = describe(dq, "dq", 4);
  p.dk = describe(dk, "dk", 4);
  p.dv = describe(dv, "dv", 4);
  p.dg = describe(dg, "dg", 3);
  p.dbeta = describe(dbeta, "dbeta", 3);
  if (initial_state.has_value()) p.d_initial_state = describe(dh0, "dh0", 4);
  std::optional<Tensor> ws = attach_workspace(p, p.fwd, q, flashqla_gdn_bwd_workspace_size);
  check(flashqla_gdn_bwd(&p));
  return {dq, dk, dv, dg, dbeta, dh0};
}

}  // namespace

STABLE_TORCH_LIBRARY(flashqla, m) {
  m.def(
      "gdn_fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, "
      "Tensor? initial_state, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, "
      "bool output_final_state, bool state_v_first, bool use_qk_l2norm, int beta_activation) "
      "-> (Tensor o, Tensor final_state)");
  m.def(
      "gdn_fwd_pooled(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, "
      "Tensor(a!) state_pool, Tensor state_indices, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, "
      "Tensor(b!) o, bool write_back, bool state_v_first, bool use_qk_l2norm, int beta_activation, "
      "Tensor(c!)? checkpoints, int checkpoint_chunks) -> ()");
  m.def(
      "gdn_bwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, "
      "Tensor? initial_state, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, Tensor do, "
      "Tensor? dht, bool state_v_first, bool use_qk_l2norm, int beta_activation) "
      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dh0)");
  m.def(
      "gdn_fwd_kernel_choice(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, "
      "Tensor? initial_state, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, "
      "bool output_final_state, bool state_v_first, bool use_qk_l2norm, int beta_activation) "
      "-> (str kernel, str pieces, int piece_chunks, bool lengths_guessed, int workspace_bytes, str reason)");
  m.def(
      "gdn_bwd_kernel_choice(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, "
      "Tensor? initial_state, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, "
      "bool state_v_first, bool use_qk_l2norm, int beta_activation) "
      "-> (str kernel, int piece_chunks, int workspace_bytes, str reason)");
}

// The same functions serve both devices: the C API picks its backend from
// where the tensors live.
STABLE_TORCH_LIBRARY_IMPL(flashqla, CPU, m) {
  m.impl("gdn_fwd", TORCH_BOX(&gdn_fwd));
  m.impl("gdn_fwd_pooled", TORCH_BOX(&gdn_fwd_pooled));
  m.impl("gdn_bwd", TORCH_BOX(&gdn_bwd));
  m.impl("gdn_fwd_kernel_choice", TORCH_BOX(&gdn_fwd_kernel_choice));
  m.impl("gdn_bwd_kernel_choice", TORCH_BOX(&gdn_bwd_kernel_choice));
}

STABLE_TORCH_LIBRARY_IMPL(flashqla, CUDA, m) {
  m.impl("gdn_fwd", TORCH_BOX(&gdn_fwd));
  m.impl("gdn_fwd_pooled", TORCH_BOX(&gdn_fwd_pooled));
  m.impl("gdn_bwd", TORCH_BOX(&gdn_bwd));
  m.impl("gdn_fwd_kernel_choice", TORCH_BOX(&gdn_fwd_kernel_choice));
  m.impl("gdn_bwd_kernel_choice", TORCH_BOX(&gdn_bwd_kernel_choice));
}
