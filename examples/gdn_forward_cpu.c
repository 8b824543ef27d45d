/*
 * gdn_forward_cpu — one Gated Delta Network forward on the CPU backend.
 *
 * Two variable-length sequences packed into one batch row (cu_seqlens
 * {0, 300, 700}), 2 q/k heads shared by 4 value heads (GQA), head dims 64:
 *
 *   q, k, v        bf16  [1, 700, H|HV, 64]   (q, k l2-normalised by the op)
 *   g              fp32  [1, 700, 4]          logsigmoid(randn) / 16
 *   beta           fp32  [1, 700, 4]          sigmoid(randn)
 *   initial_state  fp32  [2, 4, 64, 64]
 *   o              bf16  [1, 700, 4, 64]
 *   final_state    fp32  [2, 4, 64, 64]
 *
 * Usage: gdn_forward_cpu [--algorithm recurrent|chunked] [--threads N]
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flashqla/flashqla.h>

enum { NSEQ = 2, NTOK = 700, NH = 2, NHV = 4, DK = 64, DV = 64 };

/* --- deterministic random numbers (xorshift64* + Box-Muller) -------------- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double rng_uniform(void) { /* in (0, 1) */
  uint64_t x = rng_state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  rng_state = x;
  return ((double)((x * 0x2545F4914F6CDD1Dull) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_normal(void) {
  const double two_pi = 6.283185307179586;
  return sqrt(-2.0 * log(rng_uniform())) * cos(two_pi * rng_uniform());
}

/* --- bf16 stored as uint16 bit patterns ----------------------------------- */
static uint16_t float_to_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Contiguous row-major descriptor for a tensor of `ndim` dims. */
static flashqla_tensor_t make_tensor(void* data, flashqla_dtype_t dtype, int ndim,
                                     const int64_t* shape) {
  flashqla_tensor_t t;
  int64_t s = 1;
  int d;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  for (d = ndim - 1; d >= 0; --d) {
    t.stride[d] = s;
    s *= shape[d];
  }
  return t;
}

static void* xcalloc(size_t n, size_t size) {
  void* p = calloc(n, size);
  if (p == NULL) {
    fprintf(stderr, "gdn_forward_cpu: out of host memory\n");
    exit(1);
  }
  return p;
}

static int check(flashqla_status_t st, const char* what) {
  if (st == FLASHQLA_STATUS_SUCCESS) return 0;
  fprintf(stderr, "gdn_forward_cpu: %s failed: %s: %s\n", what, flashqla_status_string(st),
          flashqla_last_error_message());
  return 1;
}

static void usage(const char* argv0) {
  fprintf(stderr, "usage: %s [--algorithm recurrent|chunked] [--threads N]\n", argv0);
}

int main(int argc, char** argv) {
  flashqla_cpu_algorithm_t algorithm = FLASHQLA_CPU_ALGORITHM_CHUNKED;
  int threads = 0;
  int i;

  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--algorithm") == 0 && i + 1 < argc) {
      const char* a = argv[++i];
      if (strcmp(a, "chunked") == 0) {
        algorithm = FLASHQLA_CPU_ALGORITHM_CHUNKED;
      } else if (strcmp(a, "recurrent") == 0) {
        algorithm = FLASHQLA_CPU_ALGORITHM_RECURRENT;
      } else {
        usage(argv[0]);
        return 2;
      }
    } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      char* end = NULL;
      long n = strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || n < 0 || n > 4096) {
        usage(argv[0]);
        return 2;
      }
      threads = (int)n;
    } else {
      usage(argv[0]);
      return (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) ? 0 : 2;
    }
  }

  const int32_t cu_seqlens[NSEQ + 1] = {0, 300, 700};
  const int64_t qk_shape[4] = {1, NTOK, NH, DK};
  const int64_t v_shape[4] = {1, NTOK, NHV, DV};
  const int64_t gate_shape[3] = {1, NTOK, NHV};
  const int64_t state_shape[4] = {NSEQ, NHV, DK, DV};
  const int64_t cu_shape[1] = {NSEQ + 1};
  const size_t n_qk = (size_t)NTOK * NH * DK, n_v = (size_t)NTOK * NHV * DV;
  const size_t n_gate = (size_t)NTOK * NHV, n_state = (size_t)NSEQ * NHV * DK * DV;

  uint16_t* q = xcalloc(n_qk, sizeof *q);
  uint16_t* k = xcalloc(n_qk, sizeof *k);
  uint16_t* v = xcalloc(n_v, sizeof *v);
  uint16_t* o = xcalloc(n_v, sizeof *o);
  float* g = xcalloc(n_gate, sizeof *g);
  float* beta = xcalloc(n_gate, sizeof *beta);
  float* h0 = xcalloc(n_state, sizeof *h0);
  float* ht = xcalloc(n_state, sizeof *ht);
  size_t j;

  for (j = 0; j < n_qk; ++j) q[j] = float_to_bf16((float)rng_normal());
  for (j = 0; j < n_qk; ++j) k[j] = float_to_bf16((float)rng_normal());
  for (j = 0; j < n_v; ++j) v[j] = float_to_bf16((float)rng_normal());
  for (j = 0; j < n_gate; ++j) {
    double x = rng_normal(); /* logsigmoid(x) = -log1p(exp(-x)), computed stably */
    g[j] = (float)((x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x))) / 16.0);
  }
  for (j = 0; j < n_gate; ++j) beta[j] = (float)(1.0 / (1.0 + exp(-rng_normal())));
  for (j = 0; j < n_state; ++j) h0[j] = (float)(0.1 * rng_normal());

  flashqla_gdn_fwd_params_t p;
  flashqla_gdn_fwd_params_init(&p);
  p.B = 1;
  p.T = NTOK;
  p.H = NH;
  p.HV = NHV;
  p.K = DK;
  p.V = DV;
  p.N = NSEQ;
  p.q = make_tensor(q, FLASHQLA_DTYPE_BFLOAT16, 4, qk_shape);
  p.k = make_tensor(k, FLASHQLA_DTYPE_BFLOAT16, 4, qk_shape);
  p.v = make_tensor(v, FLASHQLA_DTYPE_BFLOAT16, 4, v_shape);
  p.g = make_tensor(g, FLASHQLA_DTYPE_FLOAT32, 3, gate_shape);
  p.beta = make_tensor(beta, FLASHQLA_DTYPE_FLOAT32, 3, gate_shape);
  p.initial_state = make_tensor(h0, FLASHQLA_DTYPE_FLOAT32, 4, state_shape);
  p.initial_state_n = NSEQ;
  p.cu_seqlens = make_tensor((void*)cu_seqlens, FLASHQLA_DTYPE_INT32, 1, cu_shape);
  p.cu_seqlens_host = cu_seqlens;
  p.o = make_tensor(o, FLASHQLA_DTYPE_BFLOAT16, 4, v_shape);
  p.final_state = make_tensor(ht, FLASHQLA_DTYPE_FLOAT32, 4, state_shape);
  p.output_final_state = 1;
  p.use_qk_l2norm = 1;
  p.beta_activation = FLASHQLA_BETA_IDENTITY;
  p.backend = FLASHQLA_BACKEND_CPU;
  p.cpu_algorithm = algorithm;
  p.cpu_num_threads = threads;

  size_t ws_bytes = 0;
  if (check(flashqla_gdn_fwd_workspace_size(&p, &ws_bytes), "flashqla_gdn_fwd_workspace_size"))
    return 1;
  void* ws = ws_bytes ? xcalloc(ws_bytes, 1) : NULL;
  p.workspace = ws;
  p.workspace_bytes = ws_bytes;

  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  flashqla_status_t st = flashqla_gdn_fwd(&p);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (check(st, "flashqla_gdn_fwd")) return 1;
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;

  double o_sum = 0.0, o_abs = 0.0, ht_abs = 0.0;
  int finite = 1;
  for (j = 0; j < n_v; ++j) {
    double x = bf16_to_float(o[j]);
    finite &= isfinite(x) != 0;
    o_sum += x;
    o_abs += fabs(x);
  }
  for (j = 0; j < n_state; ++j) {
    finite &= isfinite(ht[j]) != 0;
    ht_abs += fabs(ht[j]);
  }

  printf("flashqla %s, GDN forward on the CPU backend\n", flashqla_version_string());
  printf("  shape       B=1 T=%d (sequences of 300 and 400 tokens via cu_seqlens) H=%d HV=%d K=%d V=%d\n",
         NTOK, NH, NHV, DK, DV);
  printf("  dtypes      q/k/v/o bf16, g/beta fp32, initial/final state fp32, qk l2norm on\n");
  printf("  algorithm   %s\n",
         algorithm == FLASHQLA_CPU_ALGORITHM_CHUNKED ? "chunked (64-token chunks)" : "recurrent");
  if (threads == 0)
    printf("  threads     auto (FLASHQLA_NUM_THREADS or all hardware threads)\n");
  else
    printf("  threads     %d\n", threads);
  printf("  time        %.3f ms\n", ms);
  printf("  checksum    sum(o) = %.6f\n", o_sum);
  printf("  mean |o|    %.6f\n", o_abs / (double)n_v);
  printf("  mean |S_T|  %.6f\n", ht_abs / (double)n_state);
  printf("  o[0,0,0,:4] %.6f %.6f %.6f %.6f\n", bf16_to_float(o[0]), bf16_to_float(o[1]),
         bf16_to_float(o[2]), bf16_to_float(o[3]));

  free(ws);
  free(q);
  free(k);
  free(v);
  free(o);
  free(g);
  free(beta);
  free(h0);
  free(ht);
  if (!finite) {
    fprintf(stderr, "gdn_forward_cpu: non-finite values in the outputs\n");
    return 1;
  }
  return 0;
}
