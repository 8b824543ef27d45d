// Argument validation of every entry point: each rule of src/core/validate.cpp
// and src/core/sequences.cpp is triggered on an otherwise valid CPU problem,
// and the call must return the right status, name the entry point and the
// argument in flashqla_last_error_message(), and leave the outputs untouched.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flashqla/flashqla.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr flashqla_cpu_algorithm_t kAlgo = FLASHQLA_CPU_ALGORITHM_CHUNKED;
constexpr double kInf = std::numeric_limits<double>::infinity();

using FwdMutation = std::function<void(flashqla_gdn_fwd_params_t&)>;
using BwdMutation = std::function<void(flashqla_gdn_bwd_params_t&)>;

// What a rejected call must report. The message reads
// "<entry>: <argument>: <explanation>"; `phrase` is a stable part of the
// explanation.
struct Expected {
  flashqla_status_t status;
  std::string argument;
  std::string phrase;
};

std::string status_name(flashqla_status_t s) { return flashqla_status_string(s); }

bool all_nan(const HostTensor& t) {
  for (double x : t.to_vector()) {
    if (!std::isnan(x)) return false;
  }
  return true;
}

// fp64 problem with every optional tensor: B=2, T=5, H=2, HV=4, K=V=8.
GdnCase fixed_case() {
  GdnCase c;
  c.B = 2;
  c.T = 5;
  c.H = 2;
  c.HV = 4;
  c.K = 8;
  c.V = 8;
  c.with_h0 = true;
  c.with_dht = true;
  c.allocate_and_fill(1);
  return c;
}

// The same heads packed as three sequences (one empty) in one batch row.
GdnCase varlen_case(bool int64_offsets = false) {
  GdnCase c;
  c.B = 1;
  c.H = 2;
  c.HV = 4;
  c.K = 8;
  c.V = 8;
  c.cu_seqlens = {0, 3, 3, 7};
  c.cu_seqlens_int64 = int64_offsets;
  c.with_h0 = true;
  c.with_dht = true;
  c.allocate_and_fill(2);
  return c;
}

// Runs a forward / backward with the workspace the size query asks for.
flashqla_status_t run_fwd(flashqla_gdn_fwd_params_t p) {
  size_t bytes = 0;
  flashqla_status_t s = flashqla_gdn_fwd_workspace_size(&p, &bytes);
  if (s != FLASHQLA_STATUS_SUCCESS) return s;
  std::vector<unsigned char> workspace(bytes);
  p.workspace = bytes ? workspace.data() : nullptr;
  p.workspace_bytes = bytes;
  return flashqla_gdn_fwd(&p);
}

flashqla_status_t run_bwd(flashqla_gdn_bwd_params_t p) {
  size_t bytes = 0;
  flashqla_status_t s = flashqla_gdn_bwd_workspace_size(&p, &bytes);
  if (s != FLASHQLA_STATUS_SUCCESS) return s;
  std::vector<unsigned char> workspace(bytes);
  p.fwd.workspace = bytes ? workspace.data() : nullptr;
  p.fwd.workspace_bytes = bytes;
  return flashqla_gdn_bwd(&p);
}

void expect_success(flashqla_status_t s) {
  EXPECT_EQ(status_name(s), status_name(FLASHQLA_STATUS_SUCCESS)) << flashqla_last_error_message();
  EXPECT_STREQ(flashqla_last_error_message(), "");
}

void expect_fwd_succeeds(GdnCase& c, const FwdMutation& mutate) {
  flashqla_gdn_fwd_params_t p = c.fwd_params(kAlgo);
  mutate(p);
  expect_success(run_fwd(p));
}

void expect_bwd_succeeds(GdnCase& c, const BwdMutation& mutate) {
  flashqla_gdn_bwd_params_t p = c.bwd_params(kAlgo);
  mutate(p);
  expect_success(run_bwd(p));
}

void expect_status_and_message(flashqla_status_t got, const std::string& entry,
                               const Expected& e) {
  EXPECT_EQ(status_name(got), status_name(e.status)) << flashqla_last_error_message();
  const std::string message = flashqla_last_error_message();
  EXPECT_THAT(message, StartsWith(entry + ": " + e.argument + ":"));
  EXPECT_THAT(message, HasSubstr(e.phrase));
}

// The forward, its workspace query and the backend query reject the mutated
// params, and the forward leaves o and final_state as they were (NaN).
void expect_fwd_rejected(GdnCase& c, const FwdMutation& mutate, const Expected& e) {
  SCOPED_TRACE("forward, expecting " + e.argument + ": " + e.phrase);
  c.poison_outputs();
  flashqla_gdn_fwd_params_t p = c.fwd_params(kAlgo);
  mutate(p);
  size_t bytes = 0;
  expect_status_and_message(flashqla_gdn_fwd_workspace_size(&p, &bytes),
                            "flashqla_gdn_fwd_workspace_size", e);
  flashqla_backend_t backend = FLASHQLA_BACKEND_AUTO;
  expect_status_and_message(flashqla_gdn_resolve_backend(&p, &backend),
                            "flashqla_gdn_resolve_backend", e);
  expect_status_and_message(flashqla_gdn_fwd(&p), "flashqla_gdn_fwd", e);
  EXPECT_TRUE(all_nan(c.o)) << "a rejected forward wrote o";
  EXPECT_TRUE(all_nan(c.ht)) << "a rejected forward wrote final_state";
}

// The backward and its workspace query reject the mutated params and leave
// every gradient output as it was (NaN).
void expect_bwd_rejected(GdnCase& c, const BwdMutation& mutate, const Expected& e) {
  SCOPED_TRACE("backward, expecting " + e.argument + ": " + e.phrase);
  c.poison_outputs();
  flashqla_gdn_bwd_params_t p = c.bwd_params(kAlgo);
  mutate(p);
  size_t bytes = 0;
  expect_status_and_message(flashqla_gdn_bwd_workspace_size(&p, &bytes),
                            "flashqla_gdn_bwd_workspace_size", e);
  expect_status_and_message(flashqla_gdn_bwd(&p), "flashqla_gdn_bwd", e);
  for (const HostTensor* t : {&c.dq, &c.dk, &c.dv, &c.dg, &c.dbeta, &c.dh0}) {
    EXPECT_TRUE(all_nan(*t)) << "a rejected backward wrote a gradient output";
  }
}

// A mutation of the inputs or options the forward and the backward share:
// all four entry points reject it.
void expect_rejected(GdnCase& c, const FwdMutation& mutate, const Expected& e) {
  expect_fwd_rejected(c, mutate, e);
  expect_bwd_rejected(c, [&](flashqla_gdn_bwd_params_t& p) { mutate(p.fwd); }, e);
}

void unchanged(flashqla_gdn_fwd_params_t&) {}

Expected null_pointer(const std::string& argument) {
  return {FLASHQLA_STATUS_INVALID_ARGUMENT, argument, "pointer is NULL"};
}

Expected not_contiguous(const std::string& argument, int last_dim) {
  return {FLASHQLA_STATUS_INVALID_ARGUMENT,
          argument + ".stride[" + std::to_string(last_dim) + "]", "stride 1"};
}

Expected unsupported_dtype(const std::string& argument) {
  return {FLASHQLA_STATUS_NOT_SUPPORTED, argument, "unsupported dtype"};
}

// --- valid calls -------------------------------------------------------------

TEST(Validation, ValidFixedLengthCaseSucceeds) {
  for (flashqla_cpu_algorithm_t algo :
       {FLASHQLA_CPU_ALGORITHM_CHUNKED, FLASHQLA_CPU_ALGORITHM_RECURRENT}) {
    SCOPED_TRACE(algo == FLASHQLA_CPU_ALGORITHM_CHUNKED ? "chunked" : "recurrent");
    GdnCase c = fixed_case();
    expect_success(run_fwd(c.fwd_params(algo)));
    EXPECT_FALSE(any_nan(c.o.to_vector()));
    EXPECT_FALSE(any_nan(c.ht.to_vector()));
    expect_success(run_bwd(c.bwd_params(algo)));
    for (const HostTensor* t : {&c.dq, &c.dk, &c.dv, &c.dg, &c.dbeta, &c.dh0}) {
      EXPECT_FALSE(any_nan(t->to_vector()));
    }
  }
}

TEST(Validation, ValidVarlenCaseSucceeds) {
  for (bool int64_offsets : {false, true}) {
    SCOPED_TRACE(int64_offsets ? "int64 cu_seqlens" : "int32 cu_seqlens");
    GdnCase c = varlen_case(int64_offsets);
    expect_success(run_fwd(c.fwd_params(kAlgo)));
    EXPECT_FALSE(any_nan(c.o.to_vector()));
    EXPECT_FALSE(any_nan(c.ht.to_vector()));
    expect_success(run_bwd(c.bwd_params(kAlgo)));
    EXPECT_FALSE(any_nan(c.dq.to_vector()));
    EXPECT_FALSE(any_nan(c.dh0.to_vector()));

    // A host copy of the boundaries is accepted as well.
    const void* host = c.cu.bytes.data();
    expect_fwd_succeeds(c, [&](flashqla_gdn_fwd_params_t& p) { p.cu_seqlens_host = host; });
    expect_bwd_succeeds(c, [&](flashqla_gdn_bwd_params_t& p) { p.fwd.cu_seqlens_host = host; });
  }
}

TEST(Validation, ValidWorkspaceQueriesSucceed) {
  GdnCase c = fixed_case();
  flashqla_gdn_fwd_params_t fwd = c.fwd_params(kAlgo);
  flashqla_gdn_bwd_params_t bwd = c.bwd_params(kAlgo);
  size_t bytes = 12345;
  expect_success(flashqla_gdn_fwd_workspace_size(&fwd, &bytes));
  bytes = 12345;
  expect_success(flashqla_gdn_bwd_workspace_size(&bwd, &bytes));
}

TEST(Validation, OptionalTensorsMayBeOmitted) {
  GdnCase c = fixed_case();
  expect_fwd_succeeds(c, [](flashqla_gdn_fwd_params_t& p) {
    p.initial_state = flashqla_tensor_t{};
    p.output_final_state = 0;
    p.final_state = flashqla_tensor_t{};
  });
  expect_bwd_succeeds(c, [](flashqla_gdn_bwd_params_t& p) {
    p.fwd.initial_state = flashqla_tensor_t{};
    p.d_initial_state = flashqla_tensor_t{};
    p.d_final_state = flashqla_tensor_t{};
  });
}

TEST(Validation, SequenceCountZeroMeansBatch) {
  GdnCase c = fixed_case();
  expect_fwd_succeeds(c, [](flashqla_gdn_fwd_params_t& p) { p.N = 0; });
  expect_bwd_succeeds(c, [](flashqla_gdn_bwd_params_t& p) { p.fwd.N = 0; });
}

TEST(Validation, LargestHeadDimsAreAccepted) {
  GdnCase c;
  c.B = 1;
  c.T = 3;
  c.K = FLASHQLA_MAX_HEAD_DIM;
  c.V = FLASHQLA_MAX_HEAD_DIM;
  c.allocate_and_fill(3);
  expect_fwd_succeeds(c, unchanged);
}

TEST(Validation, NaNScaleSelectsDefaultAndFiniteScaleIsAccepted) {
  GdnCase c = fixed_case();
  for (double scale : {std::numeric_limits<double>::quiet_NaN(), 0.5, 0.0, -2.0}) {
    expect_fwd_succeeds(c, [&](flashqla_gdn_fwd_params_t& p) { p.scale = scale; });
  }
}

// --- params and required pointers ----------------------------------------------

TEST(Validation, NullParams) {
  const Expected e{FLASHQLA_STATUS_INVALID_ARGUMENT, "params", "pointer is NULL"};
  size_t bytes = 0;
  expect_status_and_message(flashqla_gdn_fwd(nullptr), "flashqla_gdn_fwd", e);
  expect_status_and_message(flashqla_gdn_bwd(nullptr), "flashqla_gdn_bwd", e);
  expect_status_and_message(flashqla_gdn_fwd_workspace_size(nullptr, &bytes),
                            "flashqla_gdn_fwd_workspace_size", e);
  expect_status_and_message(flashqla_gdn_bwd_workspace_size(nullptr, &bytes),
                            "flashqla_gdn_bwd_workspace_size", e);
  flashqla_backend_t backend = FLASHQLA_BACKEND_AUTO;
  expect_status_and_message(flashqla_gdn_resolve_backend(nullptr, &backend),
                            "flashqla_gdn_resolve_backend", e);
}

TEST(Validation, NullResultPointersOfQueries) {
  GdnCase c = fixed_case();
  flashqla_gdn_fwd_params_t fwd = c.fwd_params(kAlgo);
  flashqla_gdn_bwd_params_t bwd = c.bwd_params(kAlgo);
  const Expected bytes{FLASHQLA_STATUS_INVALID_ARGUMENT, "bytes", "pointer is NULL"};
  expect_status_and_message(flashqla_gdn_fwd_workspace_size(&fwd, nullptr),
                            "flashqla_gdn_fwd_workspace_size", bytes);
  expect_status_and_message(flashqla_gdn_bwd_workspace_size(&bwd, nullptr),
                            "flashqla_gdn_bwd_workspace_size", bytes);
  expect_status_and_message(flashqla_gdn_resolve_backend(&fwd, nullptr),
                            "flashqla_gdn_resolve_backend",
                            {FLASHQLA_STATUS_INVALID_ARGUMENT, "backend", "pointer is NULL"});
}

TEST(Validation, NullRequiredInputs) {
  GdnCase c = fixed_case();
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.q.data = nullptr; }, null_pointer("q"));
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.k.data = nullptr; }, null_pointer("k"));
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.v.data = nullptr; }, null_pointer("v"));
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.g.data = nullptr; }, null_pointer("g"));
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.beta.data = nullptr; },
                  null_pointer("beta"));
}

TEST(Validation, NullForwardOutputs) {
  GdnCase c = fixed_case();
  expect_fwd_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.o.data = nullptr; },
                      null_pointer("o"));
  expect_fwd_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.final_state.data = nullptr; },
                      null_pointer("final_state"));
  // Without output_final_state the final state is not needed.
  expect_fwd_succeeds(c, [](flashqla_gdn_fwd_params_t& p) {
    p.output_final_state = 0;
    p.final_state.data = nullptr;
  });
}

TEST(Validation, NullGradients) {
  GdnCase c = fixed_case();
  expect_bwd_rejected(c, [](flashqla_gdn_bwd_params_t& p) { p.d_o.data = nullptr; },
                      null_pointer("d_o"));
  expect_bwd_rejected(c, [](flashqla_gdn_bwd_params_t& p) { p.dq.data = nullptr; },
                      null_pointer("dq"));
  expect_bwd_rejected(c, [](flashqla_gdn_bwd_params_t& p) { p.dk.data = nullptr; },
                      null_pointer("dk"));
  expect_bwd_rejected(c, [](flashqla_gdn_bwd_params_t& p) { p.dv.data = nullptr; },
                      null_pointer("dv"));
  expect_bwd_rejected(c, [](flashqla_gdn_bwd_params_t& p) { p.dg.data = nullptr; },
                      null_pointer("dg"));
  expect_bwd_rejected(c, [](flashqla_gdn_bwd_params_t& p) { p.dbeta.data = nullptr; },
                      null_pointer("dbeta"));
  expect_bwd_rejected(c, [](flashqla_gdn_bwd_params_t& p) { p.d_initial_state.data = nullptr; },
                      null_pointer("d_initial_state"));
  // Without an initial state its gradient is not needed.
  expect_bwd_succeeds(c, [](flashqla_gdn_bwd_params_t& p) {
    p.fwd.initial_state = flashqla_tensor_t{};
    p.d_initial_state.data = nullptr;
  });
}

TEST(Validation, NullTokenPointersAreAcceptedWhenThereAreNoTokens) {
  GdnCase c;
  c.B = 2;
  c.T = 0;
  c.H = 2;
  c.HV = 4;
  c.with_h0 = true;
  c.with_dht = true;
  c.allocate_and_fill(4);
  expect_fwd_succeeds(c, [](flashqla_gdn_fwd_params_t& p) {
    for (flashqla_tensor_t* t : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.o}) t->data = nullptr;
  });
  // No tokens: the state passes through unchanged, and so does its gradient.
  EXPECT_EQ(c.ht.to_vector(), c.h0.to_vector());
  expect_bwd_succeeds(c, [](flashqla_gdn_bwd_params_t& p) {
    for (flashqla_tensor_t* t : {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.g, &p.fwd.beta, &p.d_o,
                                 &p.dq, &p.dk, &p.dv, &p.dg, &p.dbeta}) {
      t->data = nullptr;
    }
  });
  EXPECT_EQ(c.dh0.to_vector(), c.dht.to_vector());
}

TEST(Validation, NullTokenPointersAreAcceptedForEmptyVarlenBatch) {
  GdnCase c;
  c.H = 2;
  c.HV = 4;
  c.cu_seqlens = {0, 0, 0};
  c.with_h0 = true;
  c.allocate_and_fill(5);
  expect_fwd_succeeds(c, [](flashqla_gdn_fwd_params_t& p) {
    for (flashqla_tensor_t* t : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.o}) t->data = nullptr;
  });
  EXPECT_EQ(c.ht.to_vector(), c.h0.to_vector());
}

// --- sizes -------------------------------------------------------------------

TEST(Validation, BatchSizeMustBePositive) {
  GdnCase c = fixed_case();
  for (int64_t B : {0, -1}) {
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.B = B; },
                    {FLASHQLA_STATUS_INVALID_ARGUMENT, "B", "must be >= 1"});
  }
}

TEST(Validation, TokenCountMustBeNonNegative) {
  GdnCase c = fixed_case();
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.T = -1; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "T", "must be >= 0"});
}

TEST(Validation, HeadCounts) {
  GdnCase c = fixed_case();
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.H = 0; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "H", "must be >= 1"});
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.HV = 0; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "HV", "must be >= 1"});
  expect_rejected(c,
                  [](flashqla_gdn_fwd_params_t& p) {
                    p.H = 3;
                    p.HV = 4;
                  },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "HV", "must be a multiple"});
}

TEST(Validation, HeadDims) {
  GdnCase c = fixed_case();
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.K = 0; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "K", "must be in 1..256"});
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.K = FLASHQLA_MAX_HEAD_DIM + 1; },
                  {FLASHQLA_STATUS_NOT_SUPPORTED, "K", "must be in 1..256"});
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.V = 0; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "V", "must be in 1..256"});
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.V = FLASHQLA_MAX_HEAD_DIM + 1; },
                  {FLASHQLA_STATUS_NOT_SUPPORTED, "V", "must be in 1..256"});
}

// --- dtypes ------------------------------------------------------------------

TEST(Validation, UnsupportedDtypes) {
  GdnCase c = fixed_case();
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.q.dtype = FLASHQLA_DTYPE_INT32; },
                  unsupported_dtype("q"));
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.g.dtype = FLASHQLA_DTYPE_INT64; },
                  unsupported_dtype("g"));
  expect_rejected(
      c, [](flashqla_gdn_fwd_params_t& p) { p.v.dtype = static_cast<flashqla_dtype_t>(42); },
      unsupported_dtype("v"));
  expect_rejected(
      c, [](flashqla_gdn_fwd_params_t& p) { p.initial_state.dtype = FLASHQLA_DTYPE_INT32; },
      unsupported_dtype("initial_state"));
  expect_fwd_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.o.dtype = FLASHQLA_DTYPE_INT32; },
                      unsupported_dtype("o"));
  expect_fwd_rejected(
      c, [](flashqla_gdn_fwd_params_t& p) { p.final_state.dtype = FLASHQLA_DTYPE_INT64; },
      unsupported_dtype("final_state"));
  expect_bwd_rejected(c, [](flashqla_gdn_bwd_params_t& p) { p.dq.dtype = FLASHQLA_DTYPE_INT32; },
                      unsupported_dtype("dq"));
  expect_bwd_rejected(c,
                      [](flashqla_gdn_bwd_params_t& p) { p.dbeta.dtype = FLASHQLA_DTYPE_INT64; },
                      unsupported_dtype("dbeta"));
}

TEST(Validation, CuSeqlensMustBeAnIndexType) {
  GdnCase c = varlen_case();
  expect_rejected(
      c, [](flashqla_gdn_fwd_params_t& p) { p.cu_seqlens.dtype = FLASHQLA_DTYPE_FLOAT32; },
      {FLASHQLA_STATUS_NOT_SUPPORTED, "cu_seqlens", "expected int32 or int64"});
}

// --- strides -----------------------------------------------------------------

TEST(Validation, LastDimensionMustBeContiguous) {
  GdnCase c = fixed_case();
  for (int64_t bad : {0, 2}) {
    SCOPED_TRACE("last stride " + std::to_string(bad));
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.q.stride[3] = bad; },
                    not_contiguous("q", 3));
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.k.stride[3] = bad; },
                    not_contiguous("k", 3));
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.v.stride[3] = bad; },
                    not_contiguous("v", 3));
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.g.stride[2] = bad; },
                    not_contiguous("g", 2));
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.beta.stride[2] = bad; },
                    not_contiguous("beta", 2));
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.initial_state.stride[3] = bad; },
                    not_contiguous("initial_state", 3));
    expect_fwd_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.o.stride[3] = bad; },
                        not_contiguous("o", 3));
    expect_fwd_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.final_state.stride[3] = bad; },
                        not_contiguous("final_state", 3));
    expect_bwd_rejected(c, [&](flashqla_gdn_bwd_params_t& p) { p.d_o.stride[3] = bad; },
                        not_contiguous("d_o", 3));
    expect_bwd_rejected(c, [&](flashqla_gdn_bwd_params_t& p) { p.d_final_state.stride[3] = bad; },
                        not_contiguous("d_final_state", 3));
    expect_bwd_rejected(c, [&](flashqla_gdn_bwd_params_t& p) { p.dq.stride[3] = bad; },
                        not_contiguous("dq", 3));
    expect_bwd_rejected(c, [&](flashqla_gdn_bwd_params_t& p) { p.dk.stride[3] = bad; },
                        not_contiguous("dk", 3));
    expect_bwd_rejected(c, [&](flashqla_gdn_bwd_params_t& p) { p.dv.stride[3] = bad; },
                        not_contiguous("dv", 3));
    expect_bwd_rejected(c, [&](flashqla_gdn_bwd_params_t& p) { p.dg.stride[2] = bad; },
                        not_contiguous("dg", 2));
    expect_bwd_rejected(c, [&](flashqla_gdn_bwd_params_t& p) { p.dbeta.stride[2] = bad; },
                        not_contiguous("dbeta", 2));
    expect_bwd_rejected(c,
                        [&](flashqla_gdn_bwd_params_t& p) { p.d_initial_state.stride[3] = bad; },
                        not_contiguous("d_initial_state", 3));
  }
}

TEST(Validation, OuterStridesArePaddedViews) {
  GdnCase c;
  c.B = 2;
  c.T = 5;
  c.H = 2;
  c.HV = 4;
  c.row_pad = 3;
  c.allocate_and_fill(6);
  expect_fwd_succeeds(c, unchanged);
  EXPECT_FALSE(any_nan(c.o.to_vector()));
}

TEST(Validation, CuSeqlensMustBeContiguous) {
  GdnCase c = varlen_case();
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.cu_seqlens.stride[0] = 2; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "cu_seqlens.stride[0]", "stride 1"});
}

// --- sequences -----------------------------------------------------------------

TEST(Validation, InitialStateCountMustMatchSequences) {
  GdnCase fixed = fixed_case();
  for (int64_t n : {0, 1, 3}) {
    expect_rejected(fixed, [&](flashqla_gdn_fwd_params_t& p) { p.initial_state_n = n; },
                    {FLASHQLA_STATUS_INVALID_ARGUMENT, "initial_state",
                     "initial_state_n = " + std::to_string(n)});
  }
  GdnCase varlen = varlen_case();
  expect_rejected(varlen, [](flashqla_gdn_fwd_params_t& p) { p.initial_state_n = 2; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "initial_state", "len(cu_seqlens) - 1"});
  expect_rejected(varlen, [](flashqla_gdn_fwd_params_t& p) { p.initial_state_n = 1; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "initial_state", "initial_state_n = 1"});
}

TEST(Validation, CuSeqlensRequiresOneBatchRow) {
  GdnCase c = varlen_case();
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.B = 2; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "B", "must be 1 when cu_seqlens"});
}

TEST(Validation, SequenceCountWithoutCuSeqlens) {
  GdnCase c = fixed_case();
  for (int64_t n : {1, 3, -1}) {
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.N = n; },
                    {FLASHQLA_STATUS_INVALID_ARGUMENT, "N", "must be 0 or B"});
  }
}

TEST(Validation, SequenceCountWithCuSeqlens) {
  GdnCase c = varlen_case();
  for (int64_t n : {0, -1}) {
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.N = n; },
                    {FLASHQLA_STATUS_INVALID_ARGUMENT, "N", "must be >= 1 with cu_seqlens"});
  }
}

TEST(Validation, CuSeqlensHostWithoutCuSeqlens) {
  GdnCase c = fixed_case();
  const std::vector<int32_t> host = {0, 5};
  expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.cu_seqlens_host = host.data(); },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "cu_seqlens_host", "without cu_seqlens"});
}

// Bad boundaries for varlen_case() (T = 7, N = 3) and the phrase naming them.
struct BadBoundaries {
  std::vector<int64_t> cu;
  std::string phrase;
};

const std::vector<BadBoundaries>& bad_boundaries() {
  static const std::vector<BadBoundaries> cases = {
      {{1, 3, 3, 7}, "must start at 0"},
      {{0, 4, 3, 7}, "non-decreasing"},
      {{0, 3, 3, 6}, "must end at T = 7"},
      {{0, 3, 3, 8}, "must end at T = 7"},
  };
  return cases;
}

TEST(Validation, CuSeqlensContentsOnTheCpuPointer) {
  for (bool int64_offsets : {false, true}) {
    for (const BadBoundaries& bad : bad_boundaries()) {
      SCOPED_TRACE(std::string(int64_offsets ? "int64" : "int32") + " " + bad.phrase);
      GdnCase c = varlen_case(int64_offsets);
      for (size_t i = 0; i < bad.cu.size(); ++i) c.cu.set_flat(int64_t(i), double(bad.cu[i]));
      expect_rejected(c, unchanged,
                      {FLASHQLA_STATUS_INVALID_ARGUMENT, "cu_seqlens", bad.phrase});
    }
  }
}

TEST(Validation, CuSeqlensContentsOnTheHostCopy) {
  for (bool int64_offsets : {false, true}) {
    for (const BadBoundaries& bad : bad_boundaries()) {
      SCOPED_TRACE(std::string(int64_offsets ? "int64" : "int32") + " " + bad.phrase);
      GdnCase c = varlen_case(int64_offsets);
      HostTensor host = c.cu;
      for (size_t i = 0; i < bad.cu.size(); ++i) host.set_flat(int64_t(i), double(bad.cu[i]));
      const void* host_data = host.bytes.data();
      expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.cu_seqlens_host = host_data; },
                      {FLASHQLA_STATUS_INVALID_ARGUMENT, "cu_seqlens_host", bad.phrase});
    }
  }
}

// --- options -----------------------------------------------------------------

TEST(Validation, ScaleMustBeFinite) {
  GdnCase c = fixed_case();
  for (double scale : {kInf, -kInf}) {
    expect_rejected(c, [&](flashqla_gdn_fwd_params_t& p) { p.scale = scale; },
                    {FLASHQLA_STATUS_INVALID_ARGUMENT, "scale", "must be finite"});
  }
}

TEST(Validation, UnknownEnumValues) {
  GdnCase c = fixed_case();
  expect_rejected(
      c, [](flashqla_gdn_fwd_params_t& p) { p.backend = static_cast<flashqla_backend_t>(7); },
      {FLASHQLA_STATUS_INVALID_ARGUMENT, "backend", "unknown value 7"});
  expect_rejected(c,
                  [](flashqla_gdn_fwd_params_t& p) {
                    p.beta_activation = static_cast<flashqla_beta_activation_t>(9);
                  },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "beta_activation", "unknown value 9"});
  expect_rejected(c,
                  [](flashqla_gdn_fwd_params_t& p) {
                    p.cpu_algorithm = static_cast<flashqla_cpu_algorithm_t>(5);
                  },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "cpu_algorithm", "unknown value 5"});
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.cpu_num_threads = -1; },
                  {FLASHQLA_STATUS_INVALID_ARGUMENT, "cpu_num_threads", "must be >= 0"});
}

TEST(Validation, ExplicitCudaBackendOnHostMemory) {
  GdnCase c = fixed_case();
  const Expected e = flashqla_has_cuda_backend()
                         ? Expected{FLASHQLA_STATUS_INVALID_ARGUMENT, "q", "host memory"}
                         : Expected{FLASHQLA_STATUS_NOT_SUPPORTED, "backend", "no CUDA backend"};
  expect_rejected(c, [](flashqla_gdn_fwd_params_t& p) { p.backend = FLASHQLA_BACKEND_CUDA; }, e);
}

// --- behaviour around failures -----------------------------------------------------

TEST(Validation, SuccessAfterFailureClearsTheMessage) {
  GdnCase c = fixed_case();
  flashqla_gdn_fwd_params_t bad = c.fwd_params(kAlgo);
  bad.q.data = nullptr;
  EXPECT_EQ(flashqla_gdn_fwd(&bad), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_STRNE(flashqla_last_error_message(), "");
  EXPECT_TRUE(all_nan(c.o));

  expect_success(run_fwd(c.fwd_params(kAlgo)));
  EXPECT_FALSE(any_nan(c.o.to_vector()));

  flashqla_gdn_bwd_params_t bad_bwd = c.bwd_params(kAlgo);
  bad_bwd.dq.data = nullptr;
  EXPECT_EQ(flashqla_gdn_bwd(&bad_bwd), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_TRUE(all_nan(c.dk));
  expect_success(run_bwd(c.bwd_params(kAlgo)));
  EXPECT_FALSE(any_nan(c.dk.to_vector()));
}

}  // namespace
}  // namespace flashqla_test
