#include "fuzz_cases.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

namespace flashqla_test {
namespace {

// A sequence length: the chunk edges (0, 1, 63, 64, 65) often, otherwise odd
// or long lengths up to `longest`.
int64_t random_length(std::mt19937_64& rng, int64_t longest) {
  std::uniform_int_distribution<int> kind(0, 9);
  const int k = kind(rng);
  if (k <= 4) {
    static const int64_t edges[] = {0, 1, 63, 64, 65};
    return edges[k];
  }
  if (k <= 7) return 2 * std::uniform_int_distribution<int64_t>(1, 150)(rng) + 1;  // odd, 3..301
  return std::uniform_int_distribution<int64_t>(64, longest)(rng);
}

template <typename T>
T pick(std::mt19937_64& rng, std::initializer_list<T> options) {
  std::uniform_int_distribution<size_t> d(0, options.size() - 1);
  return *(options.begin() + d(rng));
}

bool coin(std::mt19937_64& rng, double p) { return std::bernoulli_distribution(p)(rng); }

const char* dtype_label(flashqla_dtype_t d) {
  switch (d) {
    case FLASHQLA_DTYPE_BFLOAT16: return "bf16";
    case FLASHQLA_DTYPE_FLOAT16: return "fp16";
    case FLASHQLA_DTYPE_FLOAT32: return "fp32";
    default: return "fp64";
  }
}

}  // namespace

FuzzCase fuzz_case(uint64_t seed, FuzzTarget target) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 0x5eed);
  const bool gpu = target == FuzzTarget::kGpu;
  FuzzCase f;
  f.seed = seed;
  GdnCase& c = f.c;

  // Head sizes: the fast path's 128 most often on the GPU; small ones on the CPU.
  if (gpu) {
    if (coin(rng, 0.6)) {
      c.K = c.V = 128;
    } else {
      c.K = pick<int64_t>(rng, {64, 128, 100, 256, 32, 17});
      c.V = pick<int64_t>(rng, {64, 128, 200, 256, 32, 9});
    }
  } else {
    c.K = pick<int64_t>(rng, {4, 8, 16, 33});
    c.V = pick<int64_t>(rng, {4, 8, 16, 21});
  }
  c.H = pick<int64_t>(rng, {1, 1, 2, 3});
  c.HV = c.H * pick<int64_t>(rng, {1, 1, 2, 3, 4, 16});
  if (c.HV > 16) c.HV = c.H;

  // Sequences: fixed length over a batch, or packed (varlen, empty ones too).
  const int64_t longest = gpu ? (c.K * c.V <= 128 * 128 ? 1500 : 400) : 200;
  if (coin(rng, 0.5)) {
    c.B = pick<int64_t>(rng, {1, 1, 2, 3});
    c.T = random_length(rng, longest);
  } else {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 8)(rng);
    c.B = 1;
    c.T = 0;
    c.cu_seqlens = {0};
    for (int64_t i = 0; i < n; ++i) c.cu_seqlens.push_back(c.cu_seqlens.back() + random_length(rng, longest / 2));
    c.cu_seqlens_int64 = coin(rng, 0.3);
  }

  // Bounded work (the fp64 oracle runs every case): at most about 6000 tokens ×
  // value heads at K = V = 128 on the GPU, 4000 at the CPU's sizes. Fewer value
  // heads first, then shorter sequences, the edges (0, 1, 63–65) kept.
  const int64_t budget = gpu ? 6000 * 128 * 128 : 4000 * 16 * 16;
  auto tokens = [&] { return c.cu_seqlens.empty() ? c.B * c.T : c.cu_seqlens.back(); };
  if (tokens() * c.HV * c.K * c.V > budget) c.HV = c.H;
  while (tokens() * c.HV * c.K * c.V > budget) {
    if (c.cu_seqlens.empty()) {
      c.T = c.T > 65 ? c.T / 2 : c.T;
      if (c.T <= 65 && c.B > 1) --c.B;
    } else {
      std::vector<int64_t> lengths;
      for (size_t i = 1; i < c.cu_seqlens.size(); ++i) lengths.push_back(c.cu_seqlens[i] - c.cu_seqlens[i - 1]);
      for (int64_t& l : lengths) l = l > 65 ? l / 2 : l;
      if (lengths.size() > 1 && tokens() * c.HV * c.K * c.V > 2 * budget) lengths.pop_back();
      c.cu_seqlens = {0};
      for (int64_t l : lengths) c.cu_seqlens.push_back(c.cu_seqlens.back() + l);
    }
    if (c.H > 1 && tokens() * c.HV * c.K * c.V > budget && tokens() <= 65 * 8) {
      c.H = c.HV = 1;
    }
  }

  // Options.
  c.with_h0 = coin(rng, 0.6);
  c.with_dht = coin(rng, 0.6);
  c.state_v_first = coin(rng, 0.3);
  c.l2norm = coin(rng, 0.5);
  c.beta_act = pick<flashqla_beta_activation_t>(
      rng, {FLASHQLA_BETA_IDENTITY, FLASHQLA_BETA_SIGMOID, FLASHQLA_BETA_SIGMOID_X2});
  c.scale = coin(rng, 0.8) ? NAN : pick<double>(rng, {0.5, 1.0, 0.05});
  c.row_pad = pick<int64_t>(rng, {0, 0, 0, 3, 8});
  c.o_row_pad = pick<int64_t>(rng, {0, 0, 0, 2});
  if (gpu) {
    c.dtype = pick<flashqla_dtype_t>(
        rng, {FLASHQLA_DTYPE_BFLOAT16, FLASHQLA_DTYPE_BFLOAT16, FLASHQLA_DTYPE_BFLOAT16, FLASHQLA_DTYPE_FLOAT16,
              FLASHQLA_DTYPE_FLOAT32});
    c.gate_dtype = pick<flashqla_dtype_t>(rng, {FLASHQLA_DTYPE_FLOAT32, FLASHQLA_DTYPE_FLOAT32, c.dtype});
    c.state_dtype = FLASHQLA_DTYPE_FLOAT32;
  }  // else fp64 everywhere (GdnCase's default)

  // Gates from none (g = 0) to decay within a token (g = −30); beta 0, 1 or random.
  const int gate = std::uniform_int_distribution<int>(0, 5)(rng);
  if (gate == 0) {
    f.g_value = 0.0;
  } else if (gate == 1) {
    f.g_value = -30.0;
  } else {
    f.gate_div = pick<double>(rng, {1.0, 4.0, 16.0, 64.0, 0.25});
  }
  const int b = std::uniform_int_distribution<int>(0, 7)(rng);
  if (b == 0) f.beta_value = 0.0;
  if (b == 1) f.beta_value = c.beta_act == FLASHQLA_BETA_IDENTITY ? 1.0 : 20.0;  // β = 1 (or 2 for sigmoid_x2)

  std::ostringstream d;
  d << "seed " << seed << ": K" << c.K << " V" << c.V << " H" << c.H << " HV" << c.HV;
  if (c.cu_seqlens.empty()) {
    d << " B" << c.B << " T" << c.T;
  } else {
    d << " cu_seqlens{";
    for (size_t i = 0; i < c.cu_seqlens.size(); ++i) d << (i ? "," : "") << c.cu_seqlens[i];
    d << "}" << (c.cu_seqlens_int64 ? " int64" : "");
  }
  d << " " << dtype_label(c.dtype) << (c.gate_dtype != c.dtype ? std::string("/") + dtype_label(c.gate_dtype) : "")
    << (c.with_h0 ? " h0" : "") << (c.with_dht ? " dht" : "") << (c.state_v_first ? " v_first" : "")
    << (c.l2norm ? " l2norm" : "")
    << (c.beta_act == FLASHQLA_BETA_SIGMOID ? " beta_sigmoid" : c.beta_act == FLASHQLA_BETA_SIGMOID_X2 ? " beta_sigmoid_x2" : "");
  if (std::isfinite(c.scale)) d << " scale " << c.scale;
  if (c.row_pad) d << " row_pad " << c.row_pad;
  if (c.o_row_pad) d << " o_row_pad " << c.o_row_pad;
  if (std::isfinite(f.g_value)) {
    d << " g=" << f.g_value;
  } else {
    d << " g/" << f.gate_div;
  }
  if (std::isfinite(f.beta_value)) d << " beta=" << f.beta_value;
  f.description = d.str();
  return f;
}

int64_t fuzz_case_count(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoll(v) : fallback;
}

std::vector<WorstError> fuzz_outputs() {
  std::vector<WorstError> v;
  for (const char* name : {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"}) {
    WorstError w;
    w.output = name;
    v.push_back(w);
  }
  return v;
}

void print_worst_errors(const char* title, const std::vector<WorstError>& worst) {
  std::printf("[ fuzz ] %s: worst relative error per output\n", title);
  for (const WorstError& w : worst) {
    std::printf("[ fuzz ]   %-6s %.3e  (%s)\n", w.output.c_str(), w.error,
                w.description.empty() ? "no case" : w.description.c_str());
  }
}

}  // namespace flashqla_test
