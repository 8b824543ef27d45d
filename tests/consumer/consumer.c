/* Tiny outside user of the installed flashqla: one CPU forward through the
 * public C API, float32 host arrays. Prints
 * "flashqla consumer OK version <x.y.z>" and exits 0 on success. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flashqla/flashqla.h>

enum { B = 1, T = 4, H = 1, HV = 1, K = 4, V = 4 };

static flashqla_tensor_t tensor4(void* data, int64_t d1, int64_t d2, int64_t d3) {
  /* contiguous [d0, d1, d2, d3] */
  flashqla_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = FLASHQLA_DTYPE_FLOAT32;
  t.stride[0] = d1 * d2 * d3;
  t.stride[1] = d2 * d3;
  t.stride[2] = d3;
  t.stride[3] = 1;
  return t;
}

static flashqla_tensor_t tensor3(void* data, int64_t d1, int64_t d2) {
  /* contiguous [d0, d1, d2] */
  flashqla_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = FLASHQLA_DTYPE_FLOAT32;
  t.stride[0] = d1 * d2;
  t.stride[1] = d2;
  t.stride[2] = 1;
  return t;
}

static int fail(const char* what, flashqla_status_t st) {
  fprintf(stderr, "flashqla consumer FAILED: %s: %s: %s\n", what, flashqla_status_string(st),
          flashqla_last_error_message());
  return 1;
}

int main(void) {
  float q[B * T * H * K], k[B * T * H * K], v[B * T * HV * V];
  float g[B * T * HV], beta[B * T * HV];
  float o[B * T * HV * V], ht[B * HV * K * V];
  flashqla_gdn_fwd_params_t p;
  flashqla_status_t st;
  size_t ws = 0;
  int i;

  for (i = 0; i < B * T * H * K; ++i) {
    q[i] = 0.25f * (float)((i * 7) % 5) - 0.5f;
    k[i] = 0.20f * (float)((i * 3) % 4) - 0.3f;
  }
  for (i = 0; i < B * T * HV * V; ++i) v[i] = 0.1f * (float)(i % 6) - 0.2f;
  for (i = 0; i < B * T * HV; ++i) {
    g[i] = -0.05f * (float)(i + 1);
    beta[i] = 0.5f;
  }
  for (i = 0; i < B * T * HV * V; ++i) o[i] = NAN;
  for (i = 0; i < B * HV * K * V; ++i) ht[i] = NAN;

  flashqla_gdn_fwd_params_init(&p);
  p.B = B;
  p.T = T;
  p.H = H;
  p.HV = HV;
  p.K = K;
  p.V = V;
  p.q = tensor4(q, T, H, K);
  p.k = tensor4(k, T, H, K);
  p.v = tensor4(v, T, HV, V);
  p.g = tensor3(g, T, HV);
  p.beta = tensor3(beta, T, HV);
  p.o = tensor4(o, T, HV, V);
  p.final_state = tensor4(ht, HV, K, V);
  p.output_final_state = 1;
  p.backend = FLASHQLA_BACKEND_CPU;
  p.cpu_num_threads = 1;

  st = flashqla_gdn_fwd_workspace_size(&p, &ws);
  if (st != FLASHQLA_STATUS_SUCCESS) return fail("flashqla_gdn_fwd_workspace_size", st);
  if (ws != 0) {
    p.workspace = malloc(ws);
    p.workspace_bytes = ws;
    if (p.workspace == NULL) {
      fprintf(stderr, "flashqla consumer FAILED: cannot allocate %zu workspace bytes\n", ws);
      return 1;
    }
  }
  st = flashqla_gdn_fwd(&p);
  free(p.workspace);
  if (st != FLASHQLA_STATUS_SUCCESS) return fail("flashqla_gdn_fwd", st);

  for (i = 0; i < B * T * HV * V; ++i) {
    if (!isfinite(o[i])) {
      fprintf(stderr, "flashqla consumer FAILED: o[%d] = %f is not finite\n", i, o[i]);
      return 1;
    }
  }
  for (i = 0; i < B * HV * K * V; ++i) {
    if (!isfinite(ht[i])) {
      fprintf(stderr, "flashqla consumer FAILED: final_state[%d] = %f is not finite\n", i, ht[i]);
      return 1;
    }
  }
  if (flashqla_version() != FLASHQLA_VERSION) {
    fprintf(stderr, "flashqla consumer FAILED: header version %d, library version %d\n",
            FLASHQLA_VERSION, flashqla_version());
    return 1;
  }
  printf("o[0,0,0,:4] = %.6f %.6f %.6f %.6f (cuda backend built: %s)\n", o[0], o[1], o[2], o[3],
         flashqla_has_cuda_backend() ? "yes" : "no");
  printf("flashqla consumer OK version %s\n", flashqla_version_string());
  return 0;
}
