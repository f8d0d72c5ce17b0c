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
  hbm_bandwidth: float = 0.0  # HBM bytes/s per chip; 0 = not known.
  # JAX devices per chip; the figures above are then per device.
  devices_per_chip: int = 1
  # Copies of the regrouped layer weights the compiler holds beside
  # `prepare`'s output, as temporaries: 1 where it stages each of the
  # regroup's all-gathers in a buffer of its own and then copies it into the
  # output (`program_estimates`); 0 where the gathers write the output.
  regroup_layer_copies: int = 0
  # Interconnect bytes/s per chip in one direction (ICI on TPU, NVLink on
  # GPU), what a device receives at most while another sends to it: half the
  # published bidirectional figure; 0 = not known. The weight sync's
  # roofline (`weight_sync`).
  ici_bandwidth: float = 0.0


# Published per-chip figures: HBM capacity, dense bf16 peak and HBM bandwidth.
# NVIDIA's datasheets list 1,979 bf16 TFLOP/s "with sparsity"; dense is half.
# Interconnect, bidirectional per chip, halved for one direction: Google Cloud
# TPU docs ("Bidirectional inter-chip interconnect (ICI) bandwidth per chip")
# v5e 400 GB/s, v5p 1,200, v6e 800, TPU7x 1,200; NVIDIA's H100 and H200
# datasheets, NVLink 900 GB/s.
ACCELERATORS = {
    "tpu_v5e": Accelerator(
        "TPU v5e",
        16 * GB,
        197e12,
        'Google Cloud TPU docs, "TPU v5e"',
        819e9,
        ici_bandwidth=400e9 / 2,
    ),
    "tpu_v5p": Accelerator(
        "TPU v5p",
        95 * GB,
        459e12,
        'Google Cloud TPU docs, "TPU v5p"',
        2765e9,
        ici_bandwidth=1200e9 / 2,
    ),
    "tpu_v6e": Accelerator(
        "TPU v6e",
        32 * GB,
        918e12,
        'Google Cloud TPU docs, "TPU v6e"',
        1640e9,
        ici_bandwidth=800e9 / 2,
    ),
    # JAX sees each TPU7x chip as two devices, one per TensorCore, and the
    # planner and the compiler count per device: the chip's published 192 GB,
    # 2,307 bf16 TFLOP/s, 7.37 TB/s and 1.2 TB/s of ICI, halved.
    "tpu_7x": Accelerator(
        "TPU7x (Ironwood), one of a chip's two TensorCores",
        192 * GB / 2,
        2307e12 / 2,
        'Google Cloud TPU docs, "TPU7x (Ironwood)", halved per TensorCore',
        7.37e12 / 2,
        devices_per_chip=2,
        regroup_layer_copies=1,
        ici_bandwidth=1200e9 / 2 / 2,
    ),
    "h100": Accelerator(
        "NVIDIA H100 SXM",
        80 * GB,
        989e12,
        "NVIDIA H100 datasheet",
        3.35e12,
        ici_bandwidth=900e9 / 2,
    ),
    "h200": Accelerator(
        "NVIDIA H200 SXM",
        141 * GB,
        989e12,
        "NVIDIA H200 datasheet",
        4.8e12,
        ici_bandwidth=900e9 / 2,
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
