// The tensor-core backward's chains by sequence pieces (src/cuda/backward_chain_pieces.h):
// the two passes and the scan between them walked on the host with a scalar
// chain in place of the 128 x 128 one (each chunk's step affine, S' = a_c S + b_c
// and dS = a_c dS' + e_c, the transposes then no-ops), against the whole
// sequence run in one pass. Every chunk's state and gradient stored exactly once
// and equal to the sequential ones, d_initial_state written once, every piece
// state read only after it was written. The GPU suite checks the kernels.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cuda/backward_chain_pieces.h"

namespace flashqla_test {
namespace {

using flashqla::cuda::BackwardArgs;
using flashqla::cuda::ChainRun;
using flashqla::cuda::plan_chain_run;
using flashqla::cuda::sequence_piece_count;
namespace fc = flashqla::cuda;

struct Walk {
  std::vector<double> a, b, e;      // the chunks' affine steps
  double h0 = 0.7, dht = -1.3;
  std::vector<double> states, dstates;  // per chunk, as stored
  std::vector<int> state_stores, dstate_stores;
  int dh0_writes = 0;
  double dh0 = 0;
  std::map<std::pair<int, int64_t>, double> piece;  // (kind, piece) -> value
};

// One CTA's chunks, as the kernel runs them: role 0 the gradient chain (last
// to first), 1 the state chain, 2 the transition (b taken as zero).
double run_chain(Walk& w, const ChainRun& r, int role, double x) {
  const bool grad = role == 0;
  const int64_t n = r.c_end - r.c_begin;
  for (int64_t ci = 0; ci < n; ++ci) {
    const int64_t c = grad ? r.c_end - 1 - ci : r.c_begin + ci;
    if (r.store_chunks) {
      (grad ? w.dstates : w.states)[c] = x;
      ++(grad ? w.dstate_stores : w.state_stores)[c];
    }
    x = grad ? w.a[c] * x + w.e[c] : w.a[c] * x + (r.zero_in ? 0.0 : w.b[c]);
  }
  return x;
}

void pass(Walk& w, const BackwardArgs& args, int64_t n_chunks, int roles) {
  for (int role = 0; role < roles; ++role) {
    for (int64_t j = 0; j < (args.piece_chunks > 0 ? args.max_pieces : 1); ++j) {
      const ChainRun r = plan_chain_run(args, role, j, n_chunks, n_chunks * 64);
      if (!r.active) continue;
      ASSERT_TRUE(role < 2 || r.zero_in) << "only the transition takes U0 as zero";
      double x = 0;
      if (r.init == ChainRun::kFromPiece) {
        auto it = w.piece.find({r.init_kind, j});
        ASSERT_NE(it, w.piece.end()) << "piece " << j << " reads state kind " << r.init_kind << " before it is written";
        x = it->second;
      } else {
        x = r.init == ChainRun::kFromInput ? (role == 0 ? w.dht : w.h0) : r.init == ChainRun::kFromIdentity ? 1.0 : 0.0;
      }
      const double end = run_chain(w, r, role, x);
      if (r.end == ChainRun::kToPiece) {
        ASSERT_TRUE(w.piece.emplace(std::make_pair(r.end_kind, r.end_piece), end).second)
            << "state kind " << r.end_kind << " of piece " << r.end_piece << " written twice";
      } else if (r.end == ChainRun::kDh0) {
        w.dh0 = end;
        ++w.dh0_writes;
      }
    }
  }
}

// The scan kernel's steps (gdn_bwd_tc_piece_scan_sm90.cu), on scalars.
void scan(Walk& w, int64_t P) {
  if (P < 3) return;
  auto get = [&](int kind, int64_t j) {
    auto it = w.piece.find({kind, j});
    EXPECT_NE(it, w.piece.end()) << "the scan reads state kind " << kind << " of piece " << j << " unwritten";
    return it == w.piece.end() ? 0.0 : it->second;
  };
  double s = get(fc::kBwdStateStart, 1), ds = get(fc::kBwdGradEnd, P - 2);
  for (int64_t step = 1; step <= P - 2; ++step) {
    const int64_t js = step, jg = P - 1 - step;
    s = get(fc::kBwdTransition, js) * s + get(fc::kBwdStateLocal, js);
    ds = get(fc::kBwdTransition, jg) * ds + get(fc::kBwdGradLocal, jg);
    EXPECT_TRUE(w.piece.emplace(std::make_pair(int(fc::kBwdStateStart), js + 1), s).second);
    EXPECT_TRUE(w.piece.emplace(std::make_pair(int(fc::kBwdGradEnd), jg - 1), ds).second);
  }
}

TEST(BackwardChainPieces, PassesMatchTheWholeSequence) {
  for (int64_t n_chunks : {0, 1, 2, 3, 5, 8, 16, 17, 33}) {
    for (int64_t pc : {0, 1, 2, 3, 5, 8, 40}) {
      SCOPED_TRACE("chunks " + std::to_string(n_chunks) + ", piece chunks " + std::to_string(pc));
      Walk w;
      for (int64_t c = 0; c < n_chunks; ++c) {
        w.a.push_back(0.9 - 0.01 * double(c % 7));
        w.b.push_back(0.3 + 0.05 * double(c % 5));
        w.e.push_back(-0.2 + 0.07 * double(c % 3));
      }
      w.states.assign(n_chunks, 0), w.dstates.assign(n_chunks, 0);
      w.state_stores.assign(n_chunks, 0), w.dstate_stores.assign(n_chunks, 0);
      BackwardArgs args{};
      args.piece_chunks = pc;
      args.max_pieces = pc > 0 ? sequence_piece_count(n_chunks * 64, pc) : 0;
      if (pc == 0) {
        pass(w, args, n_chunks, 2);
      } else {
        args.chain_pass = 1;
        pass(w, args, n_chunks, 3);
        scan(w, sequence_piece_count(n_chunks * 64, pc));
        args.chain_pass = 2;
        pass(w, args, n_chunks, 2);
      }
      // The whole sequence, one chain after the other.
      std::vector<double> s(n_chunks), ds(n_chunks);
      double x = w.h0;
      for (int64_t c = 0; c < n_chunks; ++c) s[c] = x, x = w.a[c] * x + w.b[c];
      x = w.dht;
      for (int64_t c = n_chunks - 1; c >= 0; --c) ds[c] = x, x = w.a[c] * x + w.e[c];
      EXPECT_EQ(w.dh0_writes, 1);
      EXPECT_NEAR(w.dh0, x, 1e-12);
      for (int64_t c = 0; c < n_chunks; ++c) {
        EXPECT_EQ(w.state_stores[c], 1) << "chunk " << c;
        EXPECT_EQ(w.dstate_stores[c], 1) << "chunk " << c;
        EXPECT_NEAR(w.states[c], s[c], 1e-12) << "chunk " << c;
        EXPECT_NEAR(w.dstates[c], ds[c], 1e-12) << "chunk " << c;
      }
    }
  }
}

}  // namespace
}  // namespace flashqla_test
