"""CUDA tensors. These run wherever CUDA exists (marked ``gpu``; skipped only on
machines without a GPU). Until the sm_90a kernels land, CUDA tensors must be refused
clearly — never computed on the CPU behind the caller's back."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import flashqla
from conftest import make_inputs, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]


def test_cuda_tensors_raise_not_implemented():
    x = make_inputs(T=64, H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError, match="sm_90a kernels"):
        flashqla.chunk_gated_delta_rule(**x, output_final_state=True)


def test_op_on_cuda_reports_missing_kernel():
    x = make_inputs(T=64, H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="sm_90a GDN forward kernel is not part of this version"):
        flashqla.chunk_gated_delta_rule_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.1, x["initial_state"], True)


def test_mixed_devices_are_rejected():
    x = make_inputs(T=16, H=1, HV=1, K=16, V=16, device="cuda")
    with pytest.raises(ValueError, match="v is on cpu but q is on cuda"):
        flashqla.chunk_gated_delta_rule(**{**x, "v": x["v"].cpu()})


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="flash-linear-attention not installed")
def test_fla_backend_declines_cuda_until_kernels_exist():
    pytest.importorskip("fla.ops.gated_delta_rule")
    from fla.ops.gated_delta_rule.backends import gdr_registry

    backend = gdr_registry._backends["flashqla"]
    x = make_inputs(T=64, H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    ok, reason = backend.verify("chunk_gated_delta_rule", **x, output_final_state=True)
    assert not ok and "sm_90a kernels" in reason
