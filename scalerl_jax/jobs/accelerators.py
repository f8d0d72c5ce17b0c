"""Published per-chip figures of the accelerators the planner knows."""

from __future__ import annotations

import dataclasses
from typing import Sequence

GB = 1e9  # Vendors state HBM capacity in GB of 10^9 bytes; so does the report.


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """Published per-chip figures of one accelerator."""

  name: str
  hbm_bytes: float  # HBM capacity per chip.
  peak_flops: float  # Dense bf16 FLOP/s per chip.
  source: str


# Published per-chip figures: HBM capacity and dense bf16 peak. NVIDIA's
# datasheets list 1,979 bf16 TFLOP/s "with sparsity"; dense is half.
ACCELERATORS = {
    "tpu_v5e": Accelerator(
        "TPU v5e", 16 * GB, 197e12, 'Google Cloud TPU docs, "TPU v5e"'
    ),
    "tpu_v5p": Accelerator(
        "TPU v5p", 95 * GB, 459e12, 'Google Cloud TPU docs, "TPU v5p"'
    ),
    "tpu_v6e": Accelerator(
        "TPU v6e", 32 * GB, 918e12, 'Google Cloud TPU docs, "TPU v6e"'
    ),
    "h100": Accelerator(
        "NVIDIA H100 SXM", 80 * GB, 989e12, "NVIDIA H100 datasheet"
    ),
    "h200": Accelerator(
        "NVIDIA H200 SXM", 141 * GB, 989e12, "NVIDIA H200 datasheet"
    ),
}


def accelerators_named(names: Sequence[str]) -> list[Accelerator]:
  """`ACCELERATORS` entries by key, in order; ValueError names unknown ones."""
  unknown = [n for n in names if n not in ACCELERATORS]
  if unknown:
    raise ValueError(
        f"unknown accelerators {unknown}; choose from {sorted(ACCELERATORS)}"
    )
  return [ACCELERATORS[n] for n in names]
