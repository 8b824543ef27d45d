/*
 * Driver for README.md's C snippet (the `readme_c_snippet` test, run by
 * tests/readme/run_c_snippet.cmake). The snippet, extracted from the ```c block
 * under "## Using the C API", is included as the very first line, so it must
 * compile with its own includes alone. This file relies on what the snippet
 * defines: run_gdn_forward() and the sizes H, HV, K, V.
 *
 * It runs the snippet on host buffers (the CPU backend, chosen by AUTO):
 * two sequences of 37 and 63 tokens with initial states, and checks that the
 * call returned 0 and wrote finite values to every element of o and of the
 * final states (both start as NaN), not all of them zero.
 */
#include "readme_c_snippet.c"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NSEQ = 2, NTOK = 100 };

static uint16_t to_bf16(float f) { /* round to nearest even; inputs are finite */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The snippet's `alloc`: host scratch, kept until main frees it. */
static void* workspace = NULL;

static void* alloc_workspace(size_t bytes) {
  free(workspace);
  workspace = malloc(bytes);
  return workspace;
}

static void* xmalloc(size_t bytes) {
  void* p = malloc(bytes);
  if (p == NULL) {
    fprintf(stderr, "readme C snippet FAILED: out of host memory\n");
    exit(1);
  }
  return p;
}

int main(void) {
  const int32_t cu_seqlens[NSEQ + 1] = {0, 37, NTOK};
  const size_t n_qk = (size_t)NTOK * H * K, n_v = (size_t)NTOK * HV * V;
  const size_t n_gate = (size_t)NTOK * HV, n_state = (size_t)NSEQ * HV * K * V;
  uint16_t* q = xmalloc(n_qk * sizeof *q);
  uint16_t* k = xmalloc(n_qk * sizeof *k);
  uint16_t* v = xmalloc(n_v * sizeof *v);
  uint16_t* o = xmalloc(n_v * sizeof *o);
  float* g = xmalloc(n_gate * sizeof *g);
  float* beta = xmalloc(n_gate * sizeof *beta);
  float* h0 = xmalloc(n_state * sizeof *h0);
  float* ht = xmalloc(n_state * sizeof *ht);
  double o_abs = 0.0, ht_abs = 0.0;
  size_t i, bad = 0;
  int rc;

  for (i = 0; i < n_qk; ++i) {
    q[i] = to_bf16(sinf(0.37f * (float)i));
    k[i] = to_bf16(cosf(0.23f * (float)i));
  }
  for (i = 0; i < n_v; ++i) v[i] = to_bf16(sinf(0.11f * (float)i + 1.0f));
  for (i = 0; i < n_gate; ++i) {
    g[i] = -0.05f - 0.01f * (float)(i % 7);  /* log decay */
    beta[i] = 0.3f + 0.05f * (float)(i % 9); /* in (0, 1) */
  }
  for (i = 0; i < n_state; ++i) h0[i] = 0.01f * sinf(0.05f * (float)i);
  for (i = 0; i < n_v; ++i) o[i] = 0x7fc0; /* bf16 NaN */
  for (i = 0; i < n_state; ++i) ht[i] = NAN;

  rc = run_gdn_forward(q, k, v, g, beta, cu_seqlens, NSEQ, NTOK, h0, o, ht, NULL,
                       alloc_workspace);
  if (rc != 0) {
    fprintf(stderr, "readme C snippet FAILED: run_gdn_forward returned %d\n", rc);
    return 1;
  }
  for (i = 0; i < n_v; ++i) {
    float x = from_bf16(o[i]);
    bad += !isfinite(x);
    o_abs += fabs(x);
  }
  for (i = 0; i < n_state; ++i) {
    bad += !isfinite(ht[i]);
    ht_abs += fabs(ht[i]);
  }
  if (bad != 0 || o_abs == 0.0 || ht_abs == 0.0) {
    fprintf(stderr, "readme C snippet FAILED: %zu non-finite outputs, sum |o| = %g, "
            "sum |final_state| = %g\n", bad, o_abs, ht_abs);
    return 1;
  }
  printf("readme C snippet OK: %d sequences, %d tokens, mean |o| %.6f, mean |final_state| %.6f\n",
         NSEQ, NTOK, o_abs / (double)n_v, ht_abs / (double)n_state);
  free(workspace);
  free(q);
  free(k);
  free(v);
  free(o);
  free(g);
  free(beta);
  free(h0);
  free(ht);
  return 0;
}
