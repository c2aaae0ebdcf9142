"""The torch device an engine runs on (the engine spec's `device` key), checked once where the engine starts.

The trainer, the zero-mismatch reference and everything that reaches a byte of
training stay on the CPU; an engine on a GPU (PyTorch's CUDA kernels, or a CUDA
vLLM) is one more mismatch condition measured against them. Only the model's
arithmetic runs on the device: sampling noise, top-p and the returned logprobs
come back to host memory, so the keyed sampler is the same code on every device.
"""

from __future__ import annotations

import torch


def resolve_device(name: str, what: str = "engine spec") -> torch.device:
    """`cpu`, `cuda` or `cuda:N` as a torch.device; a one-line error (prefixed with `what`, the spec that named it)
    when this torch cannot reach it."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{what}: device={name} but this torch ({torch.__version__}) sees no CUDA device; "
                f"valid here: device=cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{what}: device={name} but only {torch.cuda.device_count()} CUDA device(s) exist; "
                f"valid: cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return device


def describe(device: torch.device) -> dict:
    """What a result must record about the device: its name, CUDA and cuDNN versions and the math-mode flags
    that change a GPU's numerics (TF32 in matmuls, reduced-precision reductions). Empty for the CPU."""
    if device.type != "cuda":
        return {}
    m = torch.backends.cuda.matmul
    flags = (
        "allow_tf32",
        "fp32_precision",
        "allow_bf16_reduced_precision_reduction",
        "allow_fp16_reduced_precision_reduction",
    )
    info = {
        "device": torch.cuda.get_device_name(device),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
    for flag in flags:  # the flags this torch has (fp32_precision is the newer name of the TF32 switch)
        try:
            info[f"matmul_{flag}"] = getattr(m, flag)
        except (AttributeError, RuntimeError):
            pass
    return info
