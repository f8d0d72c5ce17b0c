"""The least peak the TPU compiler fits a program in (`check_planner`).

Held to too small a budget, the TPU compiler refuses: "... the total memory
required for HLO temporaries (3.41G) exceeds available HBM (1.71G)".
Despite the words, both figures count the program's whole default memory
space, arguments and outputs included: the available figure is the budget it
was given, and the required one is the total of its memory-usage report for
the schedule it gave up on (docs/tpu.md, TPU7x). A refusal so names a peak
worth a compile, not temporaries to add to the arguments and outputs.

The compiler's figure for a program that fits is `hbm_memory`'s: on TPU
`memory_analysis()`'s temporaries add the fragmentation of their HBM block
(the block's unused part) a second time, and the block itself is read from
the program's total allocation instead.

`search` brackets the least peak between the largest budget the compiler
refused and the least peak it compiled to, compiling within a budget at a
time, at most LEAST_COMPILES times, until the bracket is narrower than
LEAST_TOLERANCE of its top.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Optional

from scalerl_jax.jobs.planner.program_estimates import Memory

# The bracket's top is the least peak to within this fraction: half the
# planner's tolerance (aot.PLANNER_TOLERANCE, 20%).
LEAST_TOLERANCE = 0.1
# Compiles per program at most (a large program's takes minutes).
LEAST_COMPILES = 4

# Its units are binary (M: MiB), its figures rounded to two decimals. The
# buffer assignment's refusal, then the final allocation's ("Ran out of
# memory in memory space hbm. Used 3.46G of 3.41G hbm."), each naming what
# it needs of what it was given.
_REFUSALS = (
    re.compile(
        r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds "
        r"available HBM \(([\d.]+)([KMGT]?)\)"
    ),
    re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm"),
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_ROUNDING = 0.005


def refusal_bytes(message: str) -> Optional[tuple[int, int]]:
  """(required, available) bytes a TPU compiler refusal names, each the
  most its rounded figure can stand for; None for another message."""
  match = next(filter(None, (r.search(message) for r in _REFUSALS)), None)
  if match is None:
    return None
  required, available = (
      math.ceil((float(value) + _ROUNDING) * _UNITS[unit])
      for value, unit in (match.group(1, 2), match.group(3, 4))
  )
  return required, available


def hbm_memory(stats: Any, platform: str) -> Memory:
  """Per-chip `Memory` from the compiler's memory stats (`memory_analysis()`).

  On TPU the temporaries are the HBM the program is given for them:
  `total_allocation_bytes` (every buffer of the default memory space, the
  memory-usage report's total) less the arguments and the outputs not
  written into them. libtpu's `temp_size_in_bytes` is the temporaries'
  block plus the block's fragmentation, which the block already holds
  (docs/tpu.md, TPU7x). Elsewhere, and where jaxlib does not report the
  total (0.10), `temp_size_in_bytes` is read as it is.
  """
  arguments = int(stats.argument_size_in_bytes)
  outputs = int(stats.output_size_in_bytes)
  aliased = int(stats.alias_size_in_bytes)
  temporaries = int(stats.temp_size_in_bytes)
  total = getattr(stats, "total_allocation_bytes", None)
  if platform == "tpu" and total is not None:
    temporaries = int(total) - arguments - (outputs - aliased)
  return Memory(arguments, outputs, aliased, temporaries)


# Compiles the program within a budget of bytes: (its memory, "") or (None,
# the compiler's refusal).
CompileWithin = Callable[[float], tuple[Optional[Memory], str]]


@dataclasses.dataclass
class Bracket:
  """The least peak lies in (refused, least.peak]."""

  least: Optional[Memory]  # The compile of least peak; None when none fit.
  refused: float  # The largest budget refused; the fixed bytes when none.
  compiles: int
  refusal: str = ""  # The last refusal.


def search(
    compile_within: CompileWithin,
    fixed: int,
    first: Optional[Memory],
    held: float,
) -> Bracket:
  """Brackets the least peak of a program whose arguments and outputs take
  `fixed` bytes, `first` compiled with room (None if refused).

  The first budget is `fixed` and 1 MiB; after a refusal, the peak it names;
  where that would not narrow the bracket, `held` (the budget that decides
  the planner's check), then the bracket's middle.
  """
  b = Bracket(first, float(fixed), 0)
  budget = fixed + 2**20
  while budget is not None and b.compiles < LEAST_COMPILES:
    memory, refusal = compile_within(budget)
    b.compiles += 1
    named = None
    if memory is None:
      b.refused, b.refusal = max(b.refused, budget), refusal
      named = (refusal_bytes(refusal) or (None,))[0]
    elif b.least is None or memory.peak < b.least.peak:
      b.least = memory
    budget = _next_budget(b, named, held)
  return b


def _next_budget(
    b: Bracket, named: Optional[int], held: float
) -> Optional[float]:
  """The next budget to compile within, or None once the bracket is narrow."""
  if b.least is None:
    top = math.inf
  elif b.least.peak - b.refused <= LEAST_TOLERANCE * b.least.peak:
    return None
  else:
    top = b.least.peak
  # A budget worth a compile narrows the bracket by more than the tolerance,
  # from above and from below (the final allocation's refusals name a few
  # MiB over the budget).
  margin = LEAST_TOLERANCE * top if math.isfinite(top) else 0.0
  worth = lambda x: x is not None and b.refused + margin < x < top - margin
  for candidate in (named, held):
    if worth(candidate):
      return candidate
  return (b.refused + top) / 2 if math.isfinite(top) else None
