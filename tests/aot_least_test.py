"""scalerl_jax.jobs.planner.aot_least: the TPU compiler's refusal and memory
stats read, and the search for a program's least peak, against a stand-in
compiler (no libtpu).

Fixtures are qwen3_0.6b's `prepare` on tpu7x:4x4x4 (libtpu 0.0.50.1,
docs/runs/tpu/2026-11-28_prepare_cast), its train step there (the memory
stats read, 2026-11-28_tpu7x_prepare_term) and its `prepare` on v6e:16x16
(docs/runs/tpu/resident_weights).
"""

import types

import pytest

from scalerl_jax import sharding
from scalerl_jax.jobs.planner import aot_least
from scalerl_jax.jobs.planner.program_estimates import Memory

GiB = 2**30
# The refusal within the arguments, outputs and 1 MiB (1.835 GB), its first
# line verbatim (launch.compile --check_planner, 2026-11-28).
TPU7X_REFUSAL = (
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, "
    "the total memory required for HLO temporaries (3.41G) exceeds available "
    "HBM (1.71G). HLO module: jit_prepare."
)
# Arguments and outputs as compiled, and the compile within 5.6 GB: its
# memory-usage report's total is 3,661,547,616 bytes (3.41 GiB).
TPU7X_FIXED = 18_923_520 + 1_814_561_792
TPU7X_REPORT_TOTAL = 3_661_547_616
TPU7X_PLANNER = 18_886_656 + 1_814_560_768 + 622_329_856  # 2.456 GB


def test_the_refusal_names_the_whole_program_not_its_temporaries():
  required, available = aot_least.refusal_bytes(TPU7X_REFUSAL)
  # "Available" is the budget given: the flag takes whole MiB.
  budget = TPU7X_FIXED + 2**20
  flag = sharding.hbm_budget_options("tpu", budget)
  (mib,) = flag.values()
  assert 1.705 * GiB <= mib * 2**20 <= available == int(1.715 * GiB) + 1
  # So "required" is on the same scale: arguments, outputs and temporaries,
  # the memory-usage report's total, not temporaries to add them to (which
  # read 1.833 + 3.661 = 5.495 GB).
  assert 3.405 * GiB <= TPU7X_REPORT_TOTAL <= required
  assert required - TPU7X_REPORT_TOTAL < 0.01 * GiB


def test_the_final_allocations_refusal_is_read_too():
  # Within the 3.41 GiB named (3.667 GB), the buffer assignment fit and the
  # final allocation did not: 3.46 GiB used, 3.715 GB; the search compiles
  # within that next.
  message = (
      "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent "
      "error. Ran out of memory in memory space hbm. Used 3.46G of 3.41G hbm. "
      "Exceeded hbm capacity by 51.39M."
  )
  assert aot_least.refusal_bytes(message) == (
      int(3.465 * GiB) + 1,
      int(3.415 * GiB) + 1,
  )


def test_refusal_bytes_reads_binary_units_and_rounds_up():
  # v6e's figures (libtpu 0.0.42.1): M is MiB, G is GiB; each the most its
  # two decimals can stand for.
  message = (
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
      "required for HLO temporaries (623.39M) exceeds available HBM (190.00M)."
  )
  # 623.395 MiB, 190.005 MiB.
  assert aot_least.refusal_bytes(message) == (653_677_036, 199_234_683)
  assert aot_least.refusal_bytes("RESOURCE_EXHAUSTED: out of memory") is None


class StandIn:
  """A compiler that fits the program in `least` bytes at the least, and
  within a larger budget takes `roomy` (at most the budget); refused, it
  names `named` GiB."""

  def __init__(self, least, roomy, named):
    self.least, self.roomy, self.named, self.budgets = least, roomy, named, []

  def __call__(self, budget):
    self.budgets.append(budget)
    if budget < self.least:
      return None, (
          "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
          f"required for HLO temporaries ({self.named:.2f}G) exceeds "
          f"available HBM ({budget / GiB:.2f}G)."
      )
    peak = min(self.roomy, budget)
    return Memory(TPU7X_FIXED, 0, 0, int(peak) - TPU7X_FIXED), ""


USED_REFUSAL = (
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent "
    "error. Ran out of memory in memory space hbm. Used 3.46G of 3.41G hbm. "
    "Exceeded hbm capacity by 51.39M."
)


def test_the_tpu7x_search_replayed():
  # launch.compile --check_planner on tpu7x:4x4x4, 2026-11-28: refused
  # within the fixed bytes (3.41 GiB named), then within that (3.46 GiB
  # used: too near to be worth a compile), then fit within the middle
  # (5.099 GB) at a 3.675 GB peak. The least lies in (3.667, 3.675] GB; the
  # old reading was 1.833 + 3.661 = 5.495 GB.
  least = Memory(18_923_520, 1_814_561_792, 0, 1_841_794_656)
  replies = iter([(None, TPU7X_REFUSAL), (None, USED_REFUSAL), (least, "")])
  budgets = []

  def compiler(budget):
    budgets.append(budget)
    return next(replies)

  first = Memory(18_923_520, 1_814_561_792, 0, 4_697_230_944)
  b = aot_least.search(compiler, TPU7X_FIXED, first, 1.2 * TPU7X_PLANNER)
  assert budgets == [
      TPU7X_FIXED + 2**20,
      int(3.415 * GiB) + 1,
      (int(3.415 * GiB) + 1 + first.peak) / 2,
  ]
  assert budgets[-1] == pytest.approx(5.099e9, rel=1e-4)
  assert b.least is least and least.peak == 3_675_279_968
  assert b.refused == int(3.415 * GiB) + 1 and b.compiles == 3
  # Planner / least: 2.456 / 3.675.
  assert TPU7X_PLANNER / least.peak == pytest.approx(0.668, abs=1e-3)


def test_a_refusal_is_compiled_within_then_the_planners_check_decides():
  # A stand-in for TPU7x's prepare: refused within the fixed bytes naming
  # 3.41 GiB, which fits; refused within 1.2x the planner (2.947 GB).
  # Here the least is 3.4 GB and a fit takes the report's total: the fourth
  # compile, the bracket's middle (3.304 GB), is refused, and (3.304, 3.662]
  # is within the tolerance.
  compiler = StandIn(least=3.4e9, roomy=TPU7X_REPORT_TOTAL, named=3.41)
  first = Memory(TPU7X_FIXED, 0, 0, int(6.531e9) - TPU7X_FIXED)
  held = 1.2 * TPU7X_PLANNER
  b = aot_least.search(compiler, TPU7X_FIXED, first, held)
  top = int(3.415 * GiB) + 1
  assert compiler.budgets == [
      TPU7X_FIXED + 2**20,
      top,
      held,
      (held + TPU7X_REPORT_TOTAL) / 2,
  ]
  assert b.least.peak == TPU7X_REPORT_TOTAL
  assert b.refused == pytest.approx(3.304e9, rel=1e-3)
  assert b.least.peak - b.refused <= aot_least.LEAST_TOLERANCE * b.least.peak
  assert b.compiles == 4 and "3.41G" in b.refusal


def test_a_refusal_above_the_first_peak_is_not_compiled_within():
  # v6e 16x16's prepare (libtpu 0.0.50.1): the first compile's 2.453 GB is
  # already below what the refusal names (2.28 GiB, 2.453 GB rounded up)
  # and 1.2x the planner; the search halves the bracket to within the
  # tolerance and the first compile stands (planner / least 1.00).
  fixed = int(1.824e9)
  compiler = StandIn(least=2.44e9, roomy=2.453e9, named=2.28)
  first = Memory(fixed, 0, 0, int(2.453e9) - fixed)
  b = aot_least.search(compiler, fixed, first, 1.2 * 2.456e9)
  assert compiler.budgets[0] == fixed + 2**20
  assert compiler.budgets[1] == pytest.approx((fixed + 2**20 + 2.453e9) / 2)
  assert len(compiler.budgets) == 3 and b.least is first
  assert b.least.peak - b.refused <= aot_least.LEAST_TOLERANCE * b.least.peak


def test_a_program_that_fits_its_fixed_bytes_takes_one_compile():
  compiler = StandIn(least=0, roomy=TPU7X_FIXED + 2**10, named=0)
  first = Memory(TPU7X_FIXED, 0, 0, 10**9)
  b = aot_least.search(compiler, TPU7X_FIXED, first, 1.2 * TPU7X_PLANNER)
  assert len(compiler.budgets) == 1
  assert b.least.temporaries == 2**10 and b.refused == TPU7X_FIXED


def test_without_a_fit_it_tries_what_the_refusal_names_then_stops():
  # Refused within the fixed bytes and then within the 9 GiB named: nothing
  # is left to try, and no least peak is claimed.
  compiler = StandIn(least=float("inf"), roomy=0, named=9.0)
  b = aot_least.search(compiler, TPU7X_FIXED, None, 1.2 * TPU7X_PLANNER)
  assert compiler.budgets == [TPU7X_FIXED + 2**20, int(9.005 * GiB) + 1]
  assert b.least is None and b.refused == compiler.budgets[-1]


def _stats(arguments, outputs, aliased, temp, total):
  """A stand-in for `compiled.memory_analysis()`'s stats."""
  return types.SimpleNamespace(
      argument_size_in_bytes=arguments,
      output_size_in_bytes=outputs,
      alias_size_in_bytes=aliased,
      temp_size_in_bytes=temp,
      total_allocation_bytes=total,
  )


def test_hbm_memory_reads_the_tpu_total_not_the_doubled_fragmentation():
  # By hand: arguments 100, outputs 40 of which 30 written into the
  # arguments, and a temporaries' block of 1,000 of which 600 is
  # fragmentation. libtpu's temp_size is 1,000 + 600 = 1,600; its total
  # allocation is 100 + (40 - 30) + 1,000 + 2 (a constant) = 1,112.
  stats = _stats(100, 40, 30, temp=1_600, total=1_112)
  tpu = aot_least.hbm_memory(stats, "tpu")
  assert tpu == Memory(100, 40, 30, 1_002) and tpu.peak == 1_112
  # Other platforms' temp_size stands (no fragmentation is added there).
  assert aot_least.hbm_memory(stats, "gpu") == Memory(100, 40, 30, 1_600)
  # jaxlib 0.10 reports no total: temp_size as it is.
  del stats.total_allocation_bytes
  assert aot_least.hbm_memory(stats, "tpu").temporaries == 1_600


def test_hbm_memory_of_the_tpu7x_train_step_is_its_usage_report():
  # qwen3_0.6b's train step on tpu7x:4x4x4 within 3.205 GB (libtpu
  # 0.0.50.1, docs/runs/tpu/2026-11-28_tpu7x_prepare_term): the compiler's
  # log gives an HLO temp block of 2.72 GiB with 1.31 GiB fragmentation,
  # the buffer assignment a block of 2,925,953,408 bytes, and temp_size is
  # that plus 1,408,651,744.
  stats = _stats(
      58_353_152, 56_780_032, 56_772_096, 4_334_605_152, 2_984_658_048
  )
  m = aot_least.hbm_memory(stats, "tpu")
  # The block, 93,184 bytes of constants and 250,368 thread-local.
  assert m.temporaries == 2_925_953_408 + 93_184 + 250_368
  # The memory-usage report's default memory space total.
  assert m.peak == 2_984_658_048
  # Planner / least: 2.955 / 2.985 GB, against 2.955 / 4.393 read from
  # temp_size.
  planner = 57_842_696 + 56_659_976 - 56_659_976 + 2_896_728_064
  assert planner / m.peak == pytest.approx(0.990, abs=1e-3)
