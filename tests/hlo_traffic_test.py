"""scalerl_jax.jobs.planner.hlo_traffic: HBM bytes of a compiled loop's
iteration, counted by hand on a small optimized-HLO text in the TPU compiler's
syntax."""

import pytest

from scalerl_jax.jobs.planner import hlo_traffic

# The decode loop's body (the larger of two loops): a weight w staged into
# on-chip memory (S(1)) by an asynchronous copy, two slices of it by
# asynchronous slices (as async-start and, as `as_text()` prints them,
# slice-start), a fusion reading x from HBM and the staged copies, a
# result made on chip and copied back to HBM, a Pallas kernel and a nested
# loop (both left out).
HLO = """\
HloModule jit_advance, entry_computation_layout={()->()}

%small_body (q: (s32[], f32[4])) -> (s32[], f32[4]) {
  %q = (s32[], f32[4]{0}) parameter(0)
  %y = f32[4]{0} get-tuple-element(%q), index=1
  %z = f32[4]{0} add(%y, %y)
  ROOT %u = (s32[], f32[4]{0}) tuple(%i, %z)
}

%step_body (p: (s32[], f32[8,128], bf16[64,128])) -> (s32[], f32[8,128], bf16[64,128]) {
  %p = (s32[], f32[8,128]{1,0:T(8,128)}, bf16[64,128]{1,0:T(8,128)(2,1)}) parameter(0)
  %x = f32[8,128]{1,0:T(8,128)} get-tuple-element(%p), index=1
  %w = bf16[64,128]{1,0:T(8,128)(2,1)} get-tuple-element(%p), index=2
  %copy-start = (bf16[64,128]{1,0:T(8,128)(2,1)S(1)}, bf16[64,128]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%w)
  %copy-done = bf16[64,128]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
  %slice-start = ((bf16[64,128]{1,0:T(8,128)(2,1)}), bf16[8,128]{1,0:T(8,128)(2,1)S(1)}, s32[]{:S(2)}) async-start(%w), calls=%async_computation
  %slice-done = bf16[8,128]{1,0:T(8,128)(2,1)S(1)} async-done(%slice-start)
  %slice-start.1 = ((bf16[64,128]{1,0:T(8,128)(2,1)}), bf16[16,128]{1,0:T(8,128)(2,1)S(1)}, s32[]{:S(2)}) slice-start(%w), slice={[8:24], [0:128]}
  %slice-done.1 = bf16[16,128]{1,0:T(8,128)(2,1)S(1)} slice-done(%slice-start.1)
  %fusion = f32[8,128]{1,0:T(8,128)} fusion(%x, %copy-done, %slice-done, %slice-done.1), kind=kOutput, calls=%fused_computation
  %fusion.2 = f32[8,128]{1,0:T(8,128)S(1)} fusion(%x), kind=kLoop, calls=%fused_computation.2
  %copy-start.1 = (f32[8,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)S(1)}, u32[]{:S(2)}) copy-start(%fusion.2)
  %copy-done.1 = f32[8,128]{1,0:T(8,128)} copy-done(%copy-start.1)
  %kernel = f32[8,128]{1,0:T(8,128)} custom-call(%i, %x, %copy-done, %w), custom_call_target="tpu_custom_call"
  %concat = bf16[64,128]{1,0:T(8,128)(2,1)S(1)} custom-call(%copy-done), custom_call_target="ConcatBitcast"
  %rows = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%small_body
  %bitcast = f32[1024]{0} bitcast(%fusion)
  ROOT %t = (s32[], f32[8,128]{1,0:T(8,128)}, bf16[64,128]{1,0:T(8,128)(2,1)}) tuple(%i, %fusion, %w)
}

ENTRY %main (a: (s32[], f32[8,128], bf16[64,128])) -> (s32[], f32[8,128], bf16[64,128]) {
  %a = (s32[], f32[8,128]{1,0}, bf16[64,128]{1,0}) parameter(0)
  ROOT %loop = (s32[], f32[8,128]{1,0}, bf16[64,128]{1,0}) while(%a), condition=%cond, body=%step_body
}
"""


def test_counts_what_crosses_hbm_by_hand():
  w, w_slice, x = 64 * 128 * 2, 8 * 128 * 2, 8 * 128 * 4
  assert hlo_traffic.loop_traffic(HLO).hbm_bytes == (
      w  # copy-start: w read from HBM into on-chip memory, once
      + w_slice  # async slice: only its 2,048 B of w read
      + 2 * w_slice  # the same as the compiler prints it (slice-start)
      + x
      + x  # fusion: x read from HBM, its output written to HBM
      + x  # fusion.2: x read (its output is on chip)
      + x  # copy-start.1: that output written back to HBM
  )  # The staged reads, the kernel, the nested loop and aliases: nothing.


def test_an_operand_in_hbm_is_counted_where_on_chip_it_is_not():
  on_chip = HLO.replace(
      "%x = f32[8,128]{1,0:T(8,128)}", "%x = f32[8,128]{1,0:T(8,128)S(1)}"
  )
  hbm = lambda text: hlo_traffic.loop_traffic(text).hbm_bytes
  # x's reads by fusion and fusion.2.
  assert hbm(HLO) - hbm(on_chip) == 2 * (8 * 128 * 4)


def test_a_kernel_operand_staged_on_chip_is_read_from_the_staging():
  # The Pallas kernel (lengths, queries, keys, values) reads w's staged copy
  # (copy-done, on chip) and w in HBM: the staged one is counted in the
  # copy-start already. ConcatBitcast is no Pallas kernel.
  assert hlo_traffic.loop_traffic(HLO).staged_kernel_bytes == 64 * 128 * 2
  assert hlo_traffic.loop_traffic(HLO, kernel_skip=3).staged_kernel_bytes == 0


def test_a_program_without_a_loop_is_refused():
  with pytest.raises(ValueError, match="no while loop"):
    hlo_traffic.loop_traffic(HLO.replace("while(", "call("))
