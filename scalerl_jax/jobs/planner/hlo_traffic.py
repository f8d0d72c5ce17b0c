"""HBM traffic of one iteration of a compiled TPU loop, from its buffers.

`cost_analysis()["bytes accessed"]` of a TPU decode step counts every
operand and output of every instruction, wherever it lives. The compiled
step stages weights into on-chip memory (asynchronous copies and slices, then
fusions that read the staged copy), so each staged byte is counted two or
three times, and an asynchronous slice is counted at its whole source buffer
(docs/tpu.md, "Decode bytes from the compiled loop's buffers").

This module reads the optimized HLO text (`compiled.as_text()`) instead. In
the body of the program's largest while loop (the decode step), it sums:

- each instruction's operands and outputs that live in HBM (memory space 0:
  the layout of an on-chip buffer is annotated S(n), n >= 1);
- each asynchronous copy or slice: the bytes it reads from HBM (a slice
  reads only its destination's bytes of the source) and the bytes it writes
  back to HBM.

Left out: Pallas kernels (custom calls), whose reads are counted by
construction (`aot.Result.kernel_reads`), and loops nested in the body (the
cache's row-by-row writes, a few bytes per slot). Where the compiler stages
a kernel's cache operand in on-chip memory, its HBM reads are the staging's,
counted here; `LoopTraffic.staged_kernel_bytes` gives what to take off the
kernel's reads. A fusion is taken to read
each HBM operand whole, so a fusion that slices one is over-counted: the sum
bounds the step's HBM traffic from above, as far as the schedule is the one
the compiler printed. It is a count from the compiled program, not a
profile of a TPU.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
}
# dtype[dims]{layout}: the layout names an on-chip memory space as S(n).
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\](\{[^}]*\})?")
_ON_CHIP = re.compile(r"S\([1-9]\d*\)")
# A Pallas TPU kernel in compiled HLO text.
PALLAS_CALL = 'custom_call_target="tpu_custom_call"'
# %name = shape opcode(operands), attributes
_INSTRUCTION = re.compile(r"(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)")
# Instructions that move no data of their own (aliases, control, bookkeeping;
# and every asynchronous "-done"), and the ones counted elsewhere (see the
# module docstring).
_SKIP = frozenset(
    {
        "after-all",
        "bitcast",
        "constant",
        "custom-call",
        "get-tuple-element",
        "parameter",
        "partition-id",
        "replica-id",
        "tuple",
        "while",
    }
)


def _arrays(shape: str) -> list[tuple[int, bool]]:
  """(bytes, on chip) of each array in an HLO shape (a tuple's in order)."""
  out = []
  for dtype, dims, layout in _ARRAY.findall(shape):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    out.append((n * _BYTES[dtype], bool(_ON_CHIP.search(layout or ""))))
  return out


def _computations(hlo_text: str) -> dict[str, list[str]]:
  """Instruction lines of each computation, by name."""
  comps, current = {}, None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      name = re.match(r"(?:ENTRY )?%?([\w.\-]+)", line)
      current = name.group(1) if name else None
      if current:
        comps[current] = []
    elif current and line.startswith("  "):
      comps[current].append(line.strip())
  return comps


def _loop_body(hlo_text: str) -> tuple[list[str], dict[str, str]]:
  """The largest while loop body's instruction lines, and every value's
  shape by name. Raises ValueError if the program has no loop."""
  comps = _computations(hlo_text)
  shapes = {}
  for lines in comps.values():
    for line in lines:
      m = _INSTRUCTION.match(line)
      if m:
        shapes[m.group(1)] = m.group(2)
  bodies = [
      re.search(r"body=%?([\w.\-]+)", line).group(1)
      for lines in comps.values()
      for line in lines
      if " while(" in line and "body=" in line
  ]
  if not bodies:
    raise ValueError("the compiled program has no while loop")
  return comps[max(bodies, key=lambda b: len(comps.get(b, ())))], shapes


def _operands(
    rest: str, shapes: dict[str, str]
) -> list[list[tuple[int, bool]]]:
  """Each operand's arrays, from the text after an instruction's opcode."""
  names = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
  return [_arrays(shapes.get(name, "")) for name in names]


class LoopTraffic(NamedTuple):
  """What one iteration of a compiled loop moves (module docstring)."""

  # HBM bytes of the body outside its Pallas kernels.
  hbm_bytes: int
  # What the Pallas kernels read of operands the compiler staged on chip;
  # their HBM reads are in `hbm_bytes` already, in the staging.
  staged_kernel_bytes: int


def loop_traffic(hlo_text: str, kernel_skip: int = 2) -> LoopTraffic:
  """The traffic of one iteration of the largest while loop's body in
  `hlo_text`, read once. A Pallas kernel's first `kernel_skip` operands are
  not its staged reads (the decode kernel's lengths and queries; then its
  keys and values). Raises ValueError if the program has no loop."""
  body, shapes = _loop_body(hlo_text)
  hbm = staged = 0
  for line in body:
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    _, shape, opcode, rest = m.groups()
    if opcode == "custom-call" and PALLAS_CALL in line:
      for arrays in _operands(rest, shapes)[kernel_skip:]:
        staged += sum(n for n, on_chip in arrays if on_chip)
    if opcode in _SKIP or opcode.endswith("-done"):
      continue
    operands = [a for arrays in _operands(rest, shapes) for a in arrays]
    from_hbm = not any(on_chip for _, on_chip in operands)
    if opcode.endswith("-start"):
      # copy-start: (destination, source, context); async-start and its
      # printed forms (slice-start, ...): ((source), destination, context).
      # Each reads its destination's bytes of the source (an asynchronous
      # slice reads only its slice) and writes them.
      outputs = _arrays(shape)
      dest = outputs[0] if opcode == "copy-start" else outputs[len(operands)]
      hbm += dest[0] * (from_hbm + (not dest[1]))
    else:
      hbm += sum(n for n, on_chip in operands if not on_chip)
      hbm += sum(n for n, on_chip in _arrays(shape) if not on_chip)
  return LoopTraffic(hbm, staged)
