"""Loads the compiled binding (``libflashqla_torch``) into torch's op registry.

The binding registers ``torch.ops.flashqla.gdn_fwd``, ``gdn_fwd_pooled``, ``gdn_bwd``,
``gdn_fwd_kernel_choice`` and ``gdn_bwd_kernel_choice`` through PyTorch's stable ABI. It lives in ``flashqla/_lib`` next to ``libflashqla``;
``FLASHQLA_TORCH_LIBRARY`` may point at another build of it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

_LIB_DIR = Path(__file__).resolve().parent / "_lib"
_BINDING_NAME = "libflashqla_torch.so"


def _binding_path() -> Path:
    override = os.environ.get("FLASHQLA_TORCH_LIBRARY")
    path = Path(override) if override else _LIB_DIR / _BINDING_NAME
    if not path.is_file():
        raise ImportError(
            f"flashqla: compiled binding not found at {path}; install the package with "
            "`pip install .` from the repository root (it builds the C++ core and the binding)"
        )
    return path


def load() -> None:
    if hasattr(torch.ops, "flashqla") and hasattr(torch.ops.flashqla, "gdn_bwd_kernel_choice"):
        return
    torch.ops.load_library(str(_binding_path()))


load()

# What the CUDA backend of this version computes. The forward runs on every
# supported shape (the fused sm_90a kernel where it covers the call, the simple
# one elsewhere: flashqla.kernel_choice() tells which, and why); so does the
# backward (torch.ops.flashqla.gdn_bwd on CUDA tensors: it recomputes the states
# from the inputs and takes every option the forward takes), so autograd works on
# CUDA. Nothing is ever computed on the CPU for CUDA tensors.
CUDA_FORWARD_AVAILABLE = True
CUDA_BACKWARD_AVAILABLE = True
# Whether the FLA backend may take CUDA calls at all: flashqla's forward beats
# FLA's own kernels on every published shape in the same run (v3.9,
# benchmarks/results/h200.csv; docs/perf.md). Even then it takes only the calls
# the core's kernel choice gives the fused kernel, on sm_90 (fla_backend._cuda_refusal),
# so FLA's users never get a slower path through dispatch.
CUDA_FORWARD_BEATS_FLA = True
# Whether it also takes calls with FLA's fused gate (use_gate_in_kernel, A_log, dt_bias:
# what FLA's GatedDeltaNet layer passes). flashqla computes that gate in fp32 before
# its kernel (three elementwise kernels), FLA inside its own. Measured with
# `bench_fwd.py --fused-gate` on an H100 on the rows where that fixed cost weighs
# most (the smallest of the published table): 397B TP8 1x2048 1.10x FLA, TP4 1x2048
# 1.17x, TP8 1024x8 2.31x (docs/perf.md).
CUDA_FUSED_GATE_BEATS_FLA = True
# Whether the FLA backend also takes training calls on CUDA (inputs that require
# gradients, under grad mode: FLA's autograd then runs flashqla's backward as well),
# where the tensor-core backward runs them (flashqla.backward_kernel_choice(); the
# simple backward is far slower than FLA's, so those stay with FLA). On once the
# measured backward beat FLA's on the published rows
# (benchmarks/anchors/flashqla_h200_bwd.csv, FLA timed in the same run). Measured (H100,
# bench_bwd.py, all 32 rows, FlashQLA's sequence splits): 1.51x FLA's backward in
# geomean, 1.25-2.28x, faster on every row; the training step 1.64x (1.34-2.51x). Not yet
# measured on the H200, where FLA runs about 13% faster than on the H100 and our kernels
# do not: the slowest row's margin (1.25x) covers that (docs/perf_backward.md).
CUDA_BACKWARD_BEATS_FLA = True
