/*
 * flashqla — Gated Delta Network (GDN) chunked prefill, forward and backward.
 *
 * Public C API. Plain C (C99 / C++), no CUDA headers required: the stream type
 * below is the same type as cudaStream_t, so a cudaStream_t converts to it
 * implicitly.
 *
 * The operation, per sequence n and value head hv (K = key dim, V = value dim,
 * state S ∈ R^{K×V}, fp32 or better), for every token t of the sequence:
 *
 *     S    = exp(g_t) · S
 *     v'   = beta_t · (v_t − Sᵀ k_t)
 *     S    = S + k_t v'ᵀ
 *     o_t  = scale · Sᵀ q_t
 *
 * with S starting from initial_state[n, hv] (or zero) and ending in
 * final_state[n, hv]. Value head hv reads q/k head hv / (HV / H): consecutive
 * value heads share one q/k head (grouped-query attention).
 *
 * Tensors (row-major logical shapes; every tensor is described by a pointer,
 * a dtype and one int64 stride per dimension, in elements; the last dimension
 * must have stride 1, every other stride is free, so views into packed
 * projections are accepted without copies):
 *
 *     q, k            [B, T, H,  K]
 *     v, o            [B, T, HV, V]
 *     g, beta         [B, T, HV]
 *     initial_state   [N, HV, K, V]   ([N, HV, V, K] when state_v_first)
 *     final_state     [N, HV, K, V]   ([N, HV, V, K] when state_v_first)
 *     cu_seqlens      [N + 1]         int32 or int64, only with B == 1
 *
 * Without cu_seqlens, sequence n is batch row n (N == B, every sequence has
 * T tokens). With cu_seqlens (B must be 1), sequence n is tokens
 * [cu_seqlens[n], cu_seqlens[n+1]) of the single batch row; sequences may have
 * any length >= 0.
 *
 * Every entry point validates its arguments before doing any work and
 * returns a status; on failure flashqla_last_error_message() names the
 * argument and what was expected. Nothing aborts the process.
 */
#ifndef FLASHQLA_FLASHQLA_H_
#define FLASHQLA_FLASHQLA_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(FLASHQLA_BUILDING_LIBRARY)
#    define FLASHQLA_API __declspec(dllexport)
#  else
#    define FLASHQLA_API __declspec(dllimport)
#  endif
#else
#  define FLASHQLA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHQLA_VERSION_MAJOR 0
#define FLASHQLA_VERSION_MINOR 1
#define FLASHQLA_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define FLASHQLA_VERSION                                                  \
  (FLASHQLA_VERSION_MAJOR * 10000 + FLASHQLA_VERSION_MINOR * 100 + \
   FLASHQLA_VERSION_PATCH)

/* Largest supported key and value head dimensions. */
#define FLASHQLA_MAX_HEAD_DIM 256

/* Same type as cudaStream_t (struct CUstream_st*); NULL is the default stream. */
typedef struct CUstream_st* flashqla_stream_t;

typedef enum flashqla_status_t {
  FLASHQLA_STATUS_SUCCESS = 0,
  /* An argument is missing, out of range or inconsistent with another. */
  FLASHQLA_STATUS_INVALID_ARGUMENT = 1,
  /* A valid request this build or backend does not support (a dtype, a head
   * size, a backend that was not compiled in). */
  FLASHQLA_STATUS_NOT_SUPPORTED = 2,
  /* The workspace passed is smaller than the size query reported. */
  FLASHQLA_STATUS_WORKSPACE_TOO_SMALL = 3,
  /* A CUDA runtime call failed; the message carries CUDA's error string. */
  FLASHQLA_STATUS_CUDA_ERROR = 4,
  /* Host memory could not be allocated (CPU backend scratch). */
  FLASHQLA_STATUS_OUT_OF_MEMORY = 5,
  /* The debug check of cu_seqlens contents found them invalid. */
  FLASHQLA_STATUS_INVALID_CU_SEQLENS = 6,
  /* A bug in flashqla; please report it with the message. */
  FLASHQLA_STATUS_INTERNAL_ERROR = 7
} flashqla_status_t;

typedef enum flashqla_dtype_t {
  FLASHQLA_DTYPE_FLOAT32 = 0,
  FLASHQLA_DTYPE_FLOAT16 = 1,
  FLASHQLA_DTYPE_BFLOAT16 = 2,
  /* CPU backend only: lets tests and oracles run end to end in fp64. */
  FLASHQLA_DTYPE_FLOAT64 = 3,
  /* Index types, for cu_seqlens only. */
  FLASHQLA_DTYPE_INT32 = 4,
  FLASHQLA_DTYPE_INT64 = 5
} flashqla_dtype_t;

typedef enum flashqla_backend_t {
  /* Decided by where q lives: device (or managed) memory -> CUDA, host -> CPU.
   * Every other pointer must live on the same side. */
  FLASHQLA_BACKEND_AUTO = 0,
  FLASHQLA_BACKEND_CPU = 1,
  FLASHQLA_BACKEND_CUDA = 2
} flashqla_backend_t;

/* How the CPU backend computes (the CUDA backend ignores this field). */
typedef enum flashqla_cpu_algorithm_t {
  /* The chunked algorithm (64-token chunks) the GPU kernels implement. */
  FLASHQLA_CPU_ALGORITHM_CHUNKED = 0,
  /* The per-token recurrence: the oracle. */
  FLASHQLA_CPU_ALGORITHM_RECURRENT = 1
} flashqla_cpu_algorithm_t;

/* Activation applied to the beta tensor before use. */
typedef enum flashqla_beta_activation_t {
  /* beta is used as given (already post-sigmoid, normally in [0, 1]). */
  FLASHQLA_BETA_IDENTITY = 0,
  /* beta := sigmoid(beta). */
  FLASHQLA_BETA_SIGMOID = 1,
  /* beta := 2 · sigmoid(beta), in [0, 2] (negative eigenvalues allowed). */
  FLASHQLA_BETA_SIGMOID_X2 = 2
} flashqla_beta_activation_t;

/* One tensor: its data, element type and strides (in elements).
 * Dimensions follow the logical shapes listed at the top of this file; only
 * as many strides as the tensor has dimensions are read, and the last of
 * them must be 1. data == NULL means "not given" for optional tensors. */
typedef struct flashqla_tensor_t {
  void* data;
  flashqla_dtype_t dtype;
  int64_t stride[4];
} flashqla_tensor_t;

/* Forward parameters. Initialise with flashqla_gdn_fwd_params_init(), then
 * set what you need. */
typedef struct flashqla_gdn_fwd_params_t {
  /* --- sizes ------------------------------------------------------------ */
  int64_t B;  /* batch rows, >= 1 (must be 1 with cu_seqlens) */
  int64_t T;  /* tokens per batch row, >= 0 */
  int64_t H;  /* q/k heads, >= 1 */
  int64_t HV; /* value heads, >= 1, HV % H == 0 */
  int64_t K;  /* key head dim, 1..FLASHQLA_MAX_HEAD_DIM */
  int64_t V;  /* value head dim, 1..FLASHQLA_MAX_HEAD_DIM */
  /* Number of sequences. With cu_seqlens: cu_seqlens has N + 1 entries
   * (N >= 1). Without: 0 or B (0 is read as B). */
  int64_t N;

  /* --- inputs ----------------------------------------------------------- */
  flashqla_tensor_t q;    /* [B,T,H,K]  bf16, fp16, fp32 (fp64 on CPU) */
  flashqla_tensor_t k;    /* [B,T,H,K]  same dtypes as q */
  flashqla_tensor_t v;    /* [B,T,HV,V] same dtypes as q */
  flashqla_tensor_t g;    /* [B,T,HV]   natural-log decay per token; any float */
  flashqla_tensor_t beta; /* [B,T,HV]   see beta_activation; any float */
  /* Optional [N,HV,K,V] (or [N,HV,V,K] with state_v_first), any float dtype,
   * read as fp32 or better. initial_state_n must equal N when given (the
   * pool's slots with state_indices, below). */
  flashqla_tensor_t initial_state;
  int64_t initial_state_n;
  /* Optional [N+1] int32 or int64, in the memory the backend computes on. */
  flashqla_tensor_t cu_seqlens;
  /* Optional host copy of cu_seqlens (same dtype as cu_seqlens, N + 1
   * entries). When given, its contents are validated on the host and no
   * device read of cu_seqlens is needed for planning or checks. */
  const void* cu_seqlens_host;
  /* Serving: optional [N] int32 or int64 slot indices, in the memory the
   * backend computes on. When given, initial_state and final_state are state
   * pools of initial_state_n rows ("slots": [slots,HV,K,V], or [slots,HV,V,K]
   * with state_v_first; the two may be the same tensor, for an update in
   * place): sequence n starts from initial_state[state_indices[n]] and, with
   * output_final_state, writes its final state to final_state[
   * state_indices[n]]. A negative index starts the sequence from zero and
   * writes nothing. The non-negative indices must be distinct and below
   * initial_state_n; checked on the host where the host can read them (CPU
   * backend, or state_indices_host given), otherwise an index >= initial_state_n
   * is taken as negative. initial_state is required (the pool), and so is
   * final_state with output_final_state. Forward only. */
  flashqla_tensor_t state_indices;
  /* Optional host copy of state_indices (same dtype, N entries). */
  const void* state_indices_host;
  /* Optional state checkpoints (prefix caching): with checkpoint_chunks = e
   * > 0, each sequence's state after every e chunks (64 e tokens) is written
   * to checkpoints ([checkpoints_n, HV, K, V], or [.., V, K] with
   * state_v_first, any float dtype). Sequence n's j-th checkpoint, the state
   * after its first 64 e j tokens (j = 1 .. floor(len_n / (64 e))), is row
   * Σ_{m<n} floor(len_m / (64 e)) + j − 1; checkpoints_n must be at least
   * floor(B T / (64 e)), which holds every sequence's whatever the lengths.
   * Forward only. */
  flashqla_tensor_t checkpoints;
  int64_t checkpoints_n;
  int64_t checkpoint_chunks;

  /* --- outputs ---------------------------------------------------------- */
  flashqla_tensor_t o; /* [B,T,HV,V] any float dtype (normally q's) */
  /* [N,HV,K,V] (or [N,HV,V,K] with state_v_first), any float dtype
   * (normally fp32). Required when output_final_state != 0. */
  flashqla_tensor_t final_state;

  /* --- options ---------------------------------------------------------- */
  /* Output scale. NaN (the value params_init sets) selects K^-1/2. */
  double scale;
  int output_final_state; /* non-zero: write final_state */
  int state_v_first;      /* non-zero: states are [.., V, K] instead of [.., K, V] */
  /* Non-zero: q and k are l2-normalised per head vector,
   * x · rsqrt(Σx² + 1e-6), before use (and the backward goes through it). */
  int use_qk_l2norm;
  flashqla_beta_activation_t beta_activation;

  /* --- execution -------------------------------------------------------- */
  flashqla_backend_t backend;
  flashqla_stream_t stream; /* CUDA backend only */
  /* Scratch memory on the backend's side (device memory for CUDA), at least
   * the size flashqla_gdn_*_workspace_size() reported; may be NULL when that
   * size is 0. Its contents need no initialisation. The call uses it until it
   * completes on `stream` (sequence pieces' states and counters): calls in
   * flight at the same time, on different streams, need separate workspaces. */
  void* workspace;
  size_t workspace_bytes;
  /* Debug switch: non-zero makes the CUDA backend check cu_seqlens contents
   * on the device and synchronise the stream to report the result (slow;
   * never use in production). The environment variable
   * FLASHQLA_DEBUG_CHECK_CU_SEQLENS=1 has the same effect. Without it, and
   * without cu_seqlens_host, the CUDA kernels stay in bounds whatever the
   * contents but compute unspecified values for invalid ones. */
  int debug_check_cu_seqlens;
  flashqla_cpu_algorithm_t cpu_algorithm;
  /* CPU backend threads; 0 = FLASHQLA_NUM_THREADS or all hardware threads. */
  int cpu_num_threads;
} flashqla_gdn_fwd_params_t;

/* Backward parameters: the forward's inputs and options plus the incoming
 * gradients and the gradient outputs. fwd.o and fwd.final_state are not
 * read or written. */
typedef struct flashqla_gdn_bwd_params_t {
  flashqla_gdn_fwd_params_t fwd;

  /* --- incoming gradients ----------------------------------------------- */
  flashqla_tensor_t d_o;  /* [B,T,HV,V] any float dtype; required */
  /* Optional gradient of final_state, [N,HV,K,V] (or [N,HV,V,K]). */
  flashqla_tensor_t d_final_state;

  /* --- gradient outputs (all required unless noted) --------------------- */
  flashqla_tensor_t dq;    /* [B,T,H,K]  w.r.t. raw q (before l2norm) */
  flashqla_tensor_t dk;    /* [B,T,H,K]  summed over each GQA group */
  flashqla_tensor_t dv;    /* [B,T,HV,V] */
  flashqla_tensor_t dg;    /* [B,T,HV]   w.r.t. the raw per-token g */
  flashqla_tensor_t dbeta; /* [B,T,HV]   w.r.t. raw beta (before activation) */
  /* [N,HV,K,V] (or [N,HV,V,K]); required when initial_state is given,
   * ignored otherwise. */
  flashqla_tensor_t d_initial_state;
} flashqla_gdn_bwd_params_t;

/* Fill params with defaults: everything zero / NULL, N = 0, scale = NaN,
 * backend AUTO, chunked CPU algorithm, identity beta. */
FLASHQLA_API void flashqla_gdn_fwd_params_init(flashqla_gdn_fwd_params_t* params);
FLASHQLA_API void flashqla_gdn_bwd_params_init(flashqla_gdn_bwd_params_t* params);

/* Workspace the call needs, in bytes, on the backend the params select
 * (validates the params first). */
FLASHQLA_API flashqla_status_t flashqla_gdn_fwd_workspace_size(
    const flashqla_gdn_fwd_params_t* params, size_t* bytes);
FLASHQLA_API flashqla_status_t flashqla_gdn_bwd_workspace_size(
    const flashqla_gdn_bwd_params_t* params, size_t* bytes);

/* Compute o (and final_state). On the CUDA backend the work is enqueued on
 * params->stream and the call returns without synchronising (unless the
 * debug switch above is on). */
FLASHQLA_API flashqla_status_t flashqla_gdn_fwd(const flashqla_gdn_fwd_params_t* params);

/* Compute dq, dk, dv, dg, dbeta (and d_initial_state). */
FLASHQLA_API flashqla_status_t flashqla_gdn_bwd(const flashqla_gdn_bwd_params_t* params);

/* Which backend the params resolve to (AUTO decided by pointer location). */
FLASHQLA_API flashqla_status_t flashqla_gdn_resolve_backend(
    const flashqla_gdn_fwd_params_t* params, flashqla_backend_t* backend);

/* The forward kernels. */
typedef enum flashqla_fwd_kernel_t {
  /* CPU backend, FLASHQLA_CPU_ALGORITHM_CHUNKED: "cpu_chunked". */
  FLASHQLA_FWD_KERNEL_CPU_CHUNKED = 0,
  /* CPU backend, FLASHQLA_CPU_ALGORITHM_RECURRENT: "cpu_recurrent". */
  FLASHQLA_FWD_KERNEL_CPU_RECURRENT = 1,
  /* CUDA backend, the tensor-core kernel (the fast one): "sm90_fused". */
  FLASHQLA_FWD_KERNEL_SM90_FUSED = 2,
  /* CUDA backend, every call the fused kernel does not cover: "sm90_simple". */
  FLASHQLA_FWD_KERNEL_SM90_SIMPLE = 3
} flashqla_fwd_kernel_t;

/* How the fused kernel spreads the (sequence, value head) chains over the GPU
 * (exact intra-card sequence parallelism). */
typedef enum flashqla_fwd_pieces_t {
  /* Whole sequences: one chain a CTA (and every kernel but the fused one). */
  FLASHQLA_FWD_PIECES_NONE = 0,
  /* Sequences cut into pieces, run in two passes with a scan between them
   * (fewer chains than SMs). */
  FLASHQLA_FWD_PIECES_PASSES = 1,
  /* Sequences cut into pieces chained in one launch (at least as many chains
   * as SMs). */
  FLASHQLA_FWD_PIECES_CHAINED = 2
} flashqla_fwd_pieces_t;

/* Capacity of flashqla_gdn_fwd_kernel_choice_t::reason, terminating NUL included. */
#define FLASHQLA_REASON_CAPACITY 256

/* What a forward call with given params runs: filled by
 * flashqla_gdn_fwd_kernel_choice(). */
typedef struct flashqla_gdn_fwd_kernel_choice_t {
  flashqla_backend_t backend;  /* the backend the params resolve to (never AUTO) */
  flashqla_fwd_kernel_t kernel;
  const char* kernel_name;     /* "cpu_chunked", ..., "sm90_simple" (static) */
  flashqla_fwd_pieces_t pieces;
  int64_t piece_chunks;        /* 64-token chunks a piece; 0 with FLASHQLA_FWD_PIECES_NONE */
  /* Non-zero when the plan rests on sequence lengths it did not know: the
   * fused kernel, with fewer (sequence, value head) chains than SMs, decides
   * whether and where to cut sequences into pieces from their lengths, and
   * packed sequences without cu_seqlens_host are taken as equal (cut or not,
   * that plan can be much slower than the one for uneven real lengths).
   * Passing cu_seqlens_host lets it plan for the real lengths. Zero otherwise
   * (chained pieces add no work whatever the lengths). */
  int lengths_guessed;
  /* What flashqla_gdn_fwd_workspace_size() reports for these params. */
  size_t workspace_bytes;
  /* "" for the fused kernel; otherwise why the call does not run it, e.g.
   * "K = 64: the fused kernel needs K = V = 128" (truncated to fit). */
  char reason[FLASHQLA_REASON_CAPACITY];
} flashqla_gdn_fwd_kernel_choice_t;

/* Which kernel a forward call with these params runs, how, and why not the
 * fused kernel when it does not. Validates the params as flashqla_gdn_fwd()
 * does (pointers included: their alignment is judged, so pass the tensors the
 * call will get; the workspace is not checked) and fails where it would fail
 * before any work (a CUDA call on a GPU other than sm_90, q, k and v in
 * different dtypes on CUDA). Cheap: reads no device memory, never synchronises
 * and launches nothing. */
FLASHQLA_API flashqla_status_t flashqla_gdn_fwd_kernel_choice(
    const flashqla_gdn_fwd_params_t* params, flashqla_gdn_fwd_kernel_choice_t* choice);

/* The kernel_name of flashqla_gdn_fwd_kernel_choice() (same checks). */
FLASHQLA_API flashqla_status_t flashqla_gdn_fwd_kernel_name(
    const flashqla_gdn_fwd_params_t* params, const char** name);

/* The backward kernels. */
typedef enum flashqla_bwd_kernel_t {
  /* CPU backend, FLASHQLA_CPU_ALGORITHM_CHUNKED: "cpu_chunked". */
  FLASHQLA_BWD_KERNEL_CPU_CHUNKED = 0,
  /* CPU backend, FLASHQLA_CPU_ALGORITHM_RECURRENT: "cpu_recurrent". */
  FLASHQLA_BWD_KERNEL_CPU_RECURRENT = 1,
  /* CUDA backend, the tensor-core backward (the fast one): "sm90_tensor_core". */
  FLASHQLA_BWD_KERNEL_SM90_TENSOR_CORE = 2,
  /* CUDA backend, every call the tensor-core backward does not cover (fp32 on
   * CUDA cores, far slower): "sm90_simple". */
  FLASHQLA_BWD_KERNEL_SM90_SIMPLE = 3
} flashqla_bwd_kernel_t;

/* What a backward call with given params runs: filled by
 * flashqla_gdn_bwd_kernel_choice(). */
typedef struct flashqla_gdn_bwd_kernel_choice_t {
  flashqla_backend_t backend;  /* the backend the params resolve to (never AUTO) */
  flashqla_bwd_kernel_t kernel;
  const char* kernel_name;     /* "cpu_chunked", ..., "sm90_simple" (static) */
  /* The tensor-core backward's chains cut into sequence pieces of this many
   * 64-token chunks (two passes and a scan); 0: whole sequences. */
  int64_t piece_chunks;
  /* What flashqla_gdn_bwd_workspace_size() reports for these params. */
  size_t workspace_bytes;
  /* "" for the tensor-core backward; otherwise why the call does not run it,
   * e.g. "q, k, v: float16: the tensor-core backward takes bfloat16". */
  char reason[FLASHQLA_REASON_CAPACITY];
} flashqla_gdn_bwd_kernel_choice_t;

/* Which kernel a backward call with these params runs, and why not the
 * tensor-core backward when it does not. Validates the params as
 * flashqla_gdn_bwd() does (pointers included: the alignment of q, k, v and
 * d_o rows is judged, so pass the tensors the call will get) and fails where
 * it would fail before any work. Cheap: reads no device memory, never
 * synchronises and launches nothing. */
FLASHQLA_API flashqla_status_t flashqla_gdn_bwd_kernel_choice(
    const flashqla_gdn_bwd_params_t* params, flashqla_gdn_bwd_kernel_choice_t* choice);

/* Message of the last failing call on this thread ("" if none). The string
 * stays valid until the next flashqla call on the same thread. */
FLASHQLA_API const char* flashqla_last_error_message(void);

/* Name of a status code, e.g. "FLASHQLA_STATUS_INVALID_ARGUMENT". */
FLASHQLA_API const char* flashqla_status_string(flashqla_status_t status);

/* FLASHQLA_VERSION of the library actually loaded, and "MAJOR.MINOR.PATCH". */
FLASHQLA_API int flashqla_version(void);
FLASHQLA_API const char* flashqla_version_string(void);

/* Non-zero if this library was built with the CUDA backend. */
FLASHQLA_API int flashqla_has_cuda_backend(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHQLA_FLASHQLA_H_ */
