"""moekit: the MoE block of today's LLMs as PyTorch ops.

    torch.ops.moekit.route / fused_experts / moe_layer    the ops (CPU; CUDA in a CUDA build)
    torch.ops.moekit.fused_experts_mx                     fused_experts on OCP MX experts (CPU)
    moekit.MoeSpec                                         a model's MoE spec from its config
    moekit.route / fused_experts / moe_layer               the ops on a MoeSpec, any leading dims
    moekit.read_status / check_status                      what the calls on a device saw
    moekit.integrations.transformers.patch(model)          a transformers model on moekit's ops

The ops library is the package's _moekit_ops.so, or the file $MOEKIT_TORCH_OPS names (a CMake
build's python/_moekit_ops.so, for a source tree used without installing).
"""

import os
from pathlib import Path

import torch


def _ops_library() -> Path:
    given = os.environ.get("MOEKIT_TORCH_OPS")
    path = Path(given) if given else Path(__file__).with_name("_moekit_ops.so")
    if not path.is_file():
        raise ImportError(
            f"moekit: the ops library {path} does not exist "
            + ("($MOEKIT_TORCH_OPS)" if given else "(pip install . builds it)")
        )
    return path


torch.ops.load_library(str(_ops_library()))

from . import _fake  # noqa: E402,F401  (registers the fake kernels)
from .ops import (STATUS_EXPERT_ID_OUT_OF_RANGE, check_status, fused_experts,  # noqa: E402
                  fused_experts_mx, moe_layer, read_status, route)
from .spec import MoeSpec  # noqa: E402

__all__ = ["MoeSpec", "route", "fused_experts", "fused_experts_mx", "moe_layer", "read_status",
           "check_status", "STATUS_EXPERT_ID_OUT_OF_RANGE"]
