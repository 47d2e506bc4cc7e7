"""Every tensor that crosses processes goes through here, and is moved to the accelerator's device on its way.

NCCL, the GPU backend of a multi-GPU launch, only takes tensors that live on the GPU; gloo, the backend of the
two-process CPU tests, takes CPU tensors too. A CPU tensor handed to accelerator.gather would therefore pass every
CPU test and stop a cluster run at its first collective. train.py and evaluate.py call no collective of accelerate
themselves (tests/test_structure.py checks the source for it); they call `gather` and `reduce_sum` below, which
move the tensor first, so the rule holds by construction (tests/test_train.py checks the helpers against an
accelerator that, like NCCL, rejects tensors off its device).

Used by train.py (rewards, statistics, weight fingerprints; the training statistics' means and maxima over processes
below) and evaluate.py (per-image values); tested by
`python -m pytest tests/test_train.py -k collectives tests/test_structure.py`.

Shape legend: P processes; gather takes (m, ...) on each and returns (P*m, ...), reduce_sum keeps the shape.
"""

from __future__ import annotations

import torch


def gather(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """Every process's `tensor` (the same shape on each) concatenated along dim 0, on the accelerator's device."""
    return accelerator.gather(tensor.to(accelerator.device))


def reduce_sum(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of every process's `tensor`, on the accelerator's device."""
    return accelerator.reduce(tensor.to(accelerator.device), "sum")


def mean_over_processes(accelerator, sums: dict[str, float]) -> dict[str, float]:
    """{name: sum of value x rows, 'rows': rows} from every process -> {name: mean per row} over all processes."""
    keys = sorted(sums)
    total = reduce_sum(accelerator, torch.tensor([sums[k] for k in keys], dtype=torch.float64)).tolist()
    rows = max(total[keys.index("rows")], 1.0) if keys else 1.0
    return {k: v / rows for k, v in zip(keys, total) if k != "rows"}


def max_over_processes(accelerator, value: float) -> float:
    return float(gather(accelerator, torch.tensor([value])).max())
