#include "cuda_test_support.h"

namespace flashqla_test {

DeviceForwardCall::DeviceForwardCall(GdnCase& c) {
  for (HostTensor* t : {&c.q, &c.k, &c.v, &c.g, &c.beta, &c.h0, &c.o, &c.ht, &c.cu})
    dev.emplace_back(std::make_unique<DeviceTensor>(*t));
  p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.backend = FLASHQLA_BACKEND_AUTO;
  flashqla_tensor_t* slots[] = {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.initial_state, &p.o, &p.final_state,
                                &p.cu_seqlens};
  for (size_t i = 0; i < dev.size(); ++i) *slots[i] = dev[i]->desc;
  if (!c.with_h0) p.initial_state = flashqla_tensor_t{};
  if (c.cu_seqlens.empty()) p.cu_seqlens = flashqla_tensor_t{};
}

DeviceBackwardCall::DeviceBackwardCall(GdnCase& c)
    : host{&c.q, &c.k, &c.v, &c.g, &c.beta, &c.h0, &c.cu, &c.d_o, &c.dht,
           &c.dq, &c.dk, &c.dv, &c.dg, &c.dbeta, &c.dh0} {
  for (HostTensor* t : host) dev.emplace_back(std::make_unique<DeviceTensor>(*t));
  p = c.bwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.fwd.backend = FLASHQLA_BACKEND_AUTO;
  flashqla_tensor_t* slots[] = {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.g, &p.fwd.beta, &p.fwd.initial_state,
                                &p.fwd.cu_seqlens, &p.d_o, &p.d_final_state, &p.dq, &p.dk, &p.dv, &p.dg,
                                &p.dbeta, &p.d_initial_state};
  for (size_t i = 0; i < dev.size(); ++i) *slots[i] = dev[i]->desc;
  if (!c.with_h0) p.fwd.initial_state = p.d_initial_state = flashqla_tensor_t{};
  if (!c.with_dht) p.d_final_state = flashqla_tensor_t{};
  if (c.cu_seqlens.empty()) p.fwd.cu_seqlens = flashqla_tensor_t{};
}

void run_forward_on_device(GdnCase& c, const std::string& what, cudaStream_t stream) {
  DeviceForwardCall call(c);
  flashqla_gdn_fwd_params_t& p = call.p;
  size_t ws_bytes = 0;
  ASSERT_EQ(flashqla_gdn_fwd_workspace_size(&p, &ws_bytes), FLASHQLA_STATUS_SUCCESS)
      << what << ": " << flashqla_last_error_message();
  const DeviceWorkspace workspace(ws_bytes);
  p.workspace = workspace.ptr;
  p.workspace_bytes = workspace.bytes;
  p.stream = stream;
  poison(call.o(), c.o.bytes.size(), stream);
  poison(call.ht(), c.ht.bytes.size(), stream);
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << what << ": " << flashqla_last_error_message();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
  c.o = with_bytes(c.o, download(call.o(), c.o.bytes.size()));
  c.ht = with_bytes(c.ht, download(call.ht(), c.ht.bytes.size()));
}

void run_backward_on_device(GdnCase& c, const std::string& what, cudaStream_t stream) {
  DeviceBackwardCall call(c);
  flashqla_gdn_bwd_params_t& p = call.p;
  size_t ws_bytes = 0;
  ASSERT_EQ(flashqla_gdn_bwd_workspace_size(&p, &ws_bytes), FLASHQLA_STATUS_SUCCESS)
      << what << ": " << flashqla_last_error_message();
  const DeviceWorkspace workspace(ws_bytes);
  p.fwd.workspace = workspace.ptr;
  p.fwd.workspace_bytes = workspace.bytes;
  p.fwd.stream = stream;
  for (size_t i = DeviceBackwardCall::kFirstOutput; i < call.dev.size(); ++i)
    poison(*call.dev[i], call.host[i]->bytes.size(), stream);
  ASSERT_EQ(flashqla_gdn_bwd(&p), FLASHQLA_STATUS_SUCCESS) << what << ": " << flashqla_last_error_message();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
  for (size_t i = DeviceBackwardCall::kFirstOutput; i < call.dev.size(); ++i) {
    *call.host[i] = with_bytes(*call.host[i], download(*call.dev[i], call.host[i]->bytes.size()));
  }
}

}  // namespace flashqla_test
