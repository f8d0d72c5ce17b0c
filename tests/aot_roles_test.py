"""scalerl_jax.jobs.planner.aot_roles, roles_report and weight_sync: a
disaggregated run's programs compiled for a TPU slice split between the roles.

libtpu compiles for a v5e 2x2 slice on this CPU machine: tiny_cpu with
mesh.layout='disaggregated', two chips a role, its train step on the
trainer's and its regroup and decode step on the generator's; the weight
sync between them counted exactly. They need libtpu, as tests/aot_test.py's;
without it they skip, saying so.
"""

import importlib.util
import json

import jax
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import aot
from scalerl_jax.jobs.planner import aot_report
from scalerl_jax.jobs.planner import aot_roles
from scalerl_jax.jobs.planner import roles_report
from scalerl_jax.jobs.planner import roofline
from scalerl_jax.jobs.planner import step_estimate
from scalerl_jax.jobs.planner import time_report
from scalerl_jax.jobs.planner import topology
from scalerl_jax.jobs.planner import weight_sync
from scalerl_jax.jobs.planner.program_estimates import Memory

_NO_LIBTPU = importlib.util.find_spec("libtpu") is None
needs_libtpu = pytest.mark.skipif(
    _NO_LIBTPU,
    reason=f"libtpu (the TPU compiler) is not installed: {topology.INSTALL}",
)
# The fixture's compiles, 128 s on 2 busy cores (the train step 95 s).
slow = pytest.mark.slow(seconds=140)

# tiny_cpu's parameters (configs/scalerl.py): a layer's attention 128 x 32 x
# (4 + 2 + 2 + 4) heads = 49,152 and MLP 3 x 128 x 384 = 147,456 weights,
# split over fsdp by their embed axis, and two norms of 128 replicated; 4
# layers, the tied 512 x 128 embedding (split over fsdp too) and the final
# norm: 11 leaves.
_SPLIT = 4 * (49_152 + 147_456) + 512 * 128  # 851,968
_REPLICATED = 4 * 2 * 128 + 128  # 1,152
_PARAMS = _SPLIT + _REPLICATED  # 853,120
# One of two generator devices: half of each split leaf, every norm whole.
_PER_DEVICE = _SPLIT // 2 + _REPLICATED  # 427,136


def _disaggregated(variant="tiny_cpu"):
  config = scalerl.get_config(variant)
  config.mesh.layout = "disaggregated"  # generator_devices 0: half.
  return config


@pytest.fixture(scope="module")
def roles():
  if _NO_LIBTPU:
    pytest.skip(
        f"libtpu (the TPU compiler) is not installed: {topology.INSTALL}"
    )
  return aot_roles.compile_roles_for_slice(
      _disaggregated(), "v5e:2x2", only=["train_step", "prepare", "decode"]
  )


@slow
@needs_libtpu
def test_each_role_compiles_its_programs_for_its_own_devices(roles):
  two = {"data": 1, "fsdp": 2, "tensor": 1}
  assert roles.meshes == {"trainer": two, "generator": two}
  names = {r: [x.name for x in xs] for r, xs in roles.results.items()}
  assert names == {
      "trainer": ["train_step"],
      "generator": ["prepare", "decode"],
  }
  for results in roles.results.values():
    for r in results:
      assert r.compiled is not None and r.fits(roles.chip.hbm_bytes), r.error
  (train,) = roles.results["trainer"]
  prepare, decode = roles.results["generator"]
  # Per device over 2, not 4: the train step's FLOPs, twice
  # tests/aot_test.py's over the whole slice, and its compiled arguments
  # hold at least the train state (parameters and Adam's two moments, 12 B
  # each) split two ways; over four they would take 2.6 MB with the batch.
  assert train.model_flops == 2 * 57_409_536_000
  assert train.compiled.arguments >= 12 * _PER_DEVICE
  # The decode step's slots: 512 / 2 x 2 kv heads x 32 x 256 positions x 4 B
  # x keys and values x 4 layers, all in the compiled arguments per device.
  assert decode.kernel_reads == 256 * 2 * 32 * 256 * 4 * 2 * 4
  assert decode.kernel_reads <= decode.compiled.arguments
  # Beside: nothing of the generator's on the trainer's devices; the moved
  # float32 parameters beside the decode step; the slots beside the regroup.
  assert train.beside == 0
  assert decode.beside == 4 * _PER_DEVICE
  assert prepare.beside > decode.kernel_reads


@slow
@needs_libtpu
def test_the_weight_sync_is_counted_exactly(roles):
  sync = roles.sync
  assert (sync.leaves, sync.num_params) == (11, _PARAMS)
  assert sync.bytes == {"float32": 4 * _PARAMS, "bfloat16": 2 * _PARAMS}
  assert sync.device_bytes == {
      "float32": 4 * _PER_DEVICE,
      "bfloat16": 2 * _PER_DEVICE,
  }
  assert sync.shard_to_shard  # 2 + 2, laid out alike.
  # v5e's published 400 GB/s of ICI both ways, one way.
  assert roles.chip.ici_bandwidth == sync.bandwidth == 200e9
  for dtype in weight_sync.DTYPES:
    assert sync.seconds(dtype) == sync.device_bytes[dtype] / 200e9
  assert sync.seconds("float32") == pytest.approx(8.54272e-6)


@slow
@needs_libtpu
def test_the_report_prints_each_role_and_the_sync_beside_the_anchors(roles):
  counts = step_estimate.step_counts(_disaggregated())
  report = roles_report.format_roles_report(roles, "v5e:2x2", counts)
  for line in (
      "The trainer: 2 devices, mesh {'data': 1, 'fsdp': 2, 'tensor': 1}",
      "The generator: 2 devices, mesh {'data': 1, 'fsdp': 2, 'tensor': 1}",
      "not a compiled program",
      "shard for shard, device to device",
      "Tunix Raiden, direct TPU-to-TPU weight sync: 0.09-0.42 s",
      f"One RL step, {roofline.LABEL}",
  ):
    assert line in report
  data = json.loads(
      json.dumps(roles_report.roles_json(roles, "v5e:2x2", counts))
  )
  assert data["weight_sync"]["compiled"] is False
  assert data["weight_sync"]["bytes"]["float32"] == 4 * _PARAMS
  trainer = data["roles"]["trainer"]["estimate"]
  assert trainer["step_seconds"] == pytest.approx(
      roles.results["trainer"][0].roofline.seconds
  )
  assert "decode" not in trainer["runs_per_step"]


@pytest.mark.slow(seconds=10)
@needs_libtpu
def test_jit_refuses_a_move_between_the_roles_devices():
  # Why the sync is counted, not compiled: a program's inputs and outputs
  # share one device set, so no jit moves the trainer's shard to the
  # generator's devices (jax.device_put does, at run time).
  devices, _ = topology.slice_devices("v5e:2x2")
  trainer, generator = (
      sharding.make_mesh(_disaggregated().mesh, d)
      for d in sharding.role_devices(_disaggregated().mesh, devices)
  )
  spec = jax.sharding.PartitionSpec("fsdp")
  x = jax.ShapeDtypeStruct(
      (128,), "float32", sharding=jax.sharding.NamedSharding(trainer, spec)
  )
  move = jax.jit(
      lambda a: a, out_shardings=jax.sharding.NamedSharding(generator, spec)
  )
  with pytest.raises(ValueError, match="incompatible devices"):
    move.lower(x)


def test_each_compile_refuses_the_other_layout():
  with pytest.raises(config_lib.ConfigError, match="mesh.layout"):
    aot.compile_for_slice(_disaggregated(), "v5e:2x2")
  with pytest.raises(config_lib.ConfigError, match="mesh.layout"):
    aot_roles.compile_roles_for_slice(scalerl.get_config("tiny_cpu"), "v5e:2x2")


def _colocated_results(chip):
  """Results as a colocated compile of tiny_cpu on v5e 2x2 leaves them: a
  train step with its least peak, a decode step with its traffic, and a
  program refused for lack of HBM."""
  gb = lambda *x: Memory(*(int(v * 1e9) for v in x))
  train = aot.Result("train_step", gb(0.006, 0.005, 0.005, 1.1), 140_000_000)
  train.least_temporaries, train.least_refused = 900_000_000, 7e8
  train.least_compiles = 3
  decode = aot.Result("decode", gb(0.137, 0.135, 0.135, 0.004), 2_000_000)
  decode.decode_floor, decode.kernel_reads = 86_000_000, 134_000_000
  decode.loop_hbm_bytes, decode.kernel_staged_bytes = 136_000_000, 67_000_000
  # Compiled: memory, seconds, then flops, bytes accessed, optimal_seconds,
  # and attention and model FLOPs.
  for r, memory, seconds, *cost, attention, flops in (
      (train, gb(0.007, 0.006, 0.006, 1.8), 95.0, 1.056e11, 2.216e10, -1,
       10_130_000_000, 57_409_536_000),
      (decode, decode.estimate, 8.6, 4.472e8, 6.34e8, 8.6e-4, 83_890_000,
       260_046_848),
  ):  # fmt: skip
    r.compiled, r.compile_s = memory, seconds
    r.attention_flops, r.model_flops = attention, flops
    r.cost = dict(zip(("flops", "bytes accessed", "optimal_seconds"), cost))
    r.roofline = roofline.program_roofline(
        r.cost, chip, r.attention_flops, r.kernel_hbm_reads(), r.model_flops
    )
  refused = aot.Result(
      "val_decode",
      Memory(1, 2, 0, 3),
      16_500_000_000,
      error="what the run holds beside it fills the chip",
  )
  return [train, decode, refused]


# What `aot_report.format_report` printed for `_colocated_results` before the
# roles' split (at fa1febb), but for its last line, time_report.LEFT_OUT.
_COLOCATED_REPORT = [
    "v5e:2x2: 4 devices of TPU v5e (16 GB HBM each), mesh {'data': 1, 'fsdp': 4, 'tensor': 1}",
    "",
    "Per device, GB (compiler | planner estimate):",
    "  program          args  outputs  aliased    temps     peak |     plan  ratio |   beside    total  fits  compile",
    "  train_step      0.007    0.006    0.006    1.800    1.807 |    1.106   0.61 |    0.140    1.947   yes    95.0s",
    "  decode          0.137    0.135    0.135    0.004    0.141 |    0.141   1.00 |    0.002    0.143   yes     8.6s",
    "  val_decode    refused                                     |    0.000        |   16.500             no     0.0s",
    "      compiler: what the run holds beside it fills the chip",
    "  train_step: the compiler's least peak 0.907 GB (temps 0.900, refused within 0.700; 3 compiles): planner / least 1.22, NOT within 1.2x",
    "  decode: the compiler's bytes accessed per decode step 0.634 GB + 0.134 GB its Pallas kernel reads (the allocated cache at full length, once: the cost analysis does not see them) = 8.93x the floor (weights + the filled cache read once, 0.086 GB)",
    "  decode: counted from the compiled loop's HBM buffers (jobs/planner/hlo_traffic.py; on-chip copies not counted again) 0.136 GB + 0.067 GB the kernel reads from HBM = 2.36x the floor",
    "",
    "The run does NOT fit on v5e:2x2: every program's peak plus what the run holds beside it must be within 16 GB per device.",
    "ratio = planner / compiler peak. 'beside': bytes the other phase keeps allocated (exact, from the shardings). On TPU each program is compiled within the HBM less 'beside'.",
    "",
    "Roofline of one run, per device: estimate (compiler roofline, not measured); TPU v5e at 197 TFLOP/s bf16, 819 GB/s HBM. Kernel work: the attention FLOPs and decode-cache reads of Pallas kernels, which the cost analysis does not see. And",
    "the cost analysis counts a loop's body once (a remat model's layers), so a run is never taken as less than its FLOPs (metrics.compute) at peak: 'floor s'.",
    "  program         TFLOPs   GB read  +kern TF  +kern GB    kern s   floor s    seconds  from",
    "  train_step      0.1056     22.16   0.01013         0  5.14e-05  0.000291    0.02706  max(flops/peak, bytes/bandwidth)",
    "  decode       0.0004472     0.634 8.389e-05     0.067  8.18e-05  1.32e-06  0.0009418  optimal_seconds",
    "  val_decode   no roofline: refused by the compiler",
    "",
    "One RL step, estimate (compiler roofline, not measured):",
    "  every completion 96 tokens, 512 rollout slots busy: 48 decode steps a step (3.0 sampler calls); validation every 10 steps, amortised. decode and the train step count per decode step and per microbatch (a loop's body is what the cost analysis counts).",
    "  program        runs/step      s/run     s/step",
    "  train_step             1    0.02706    0.02706",
    "  prepare              1.1    missing",
    "  prefill              0.5    missing",
    "  decode                48  0.0009418    0.04521",
    "  val_prefill          1.3    missing",
    "  val_decode         124.8    missing",
    "  per RL step: 0.07226 s (PARTIAL: no roofline for prefill, prepare, val_decode, val_prefill)",
    "  whole run (60 steps, 7 validations): 4 s = 0.0 h = 0.00 days; x 4 chips = 0 chip-hours (PARTIAL: no roofline for prefill, prepare, val_decode, val_prefill)",
]


def test_the_colocated_report_is_unchanged():
  chip = accelerators.ACCELERATORS["tpu_v5e"]
  results = _colocated_results(chip)
  counts = step_estimate.step_counts(scalerl.get_config("tiny_cpu"))
  mesh = {"data": 1, "fsdp": 4, "tensor": 1}
  report = aot_report.format_report(results, chip, mesh, "v5e:2x2", counts)
  assert report.splitlines() == _COLOCATED_REPORT + [
      "  " + time_report.LEFT_OUT
  ]
  data = aot_report.results_json(results, chip, mesh, "v5e:2x2", counts)
  assert sorted(data) == [
      "chip",
      "estimate",
      "hbm_bandwidth",
      "hbm_bytes",
      "mesh_shape",
      "peak_flops",
      "programs",
      "topology",
  ]
  assert sorted(data["programs"][0]) == sorted(
      [
          "name",
          "estimate",
          "beside",
          "compiled",
          "compile_s",
          "error",
          "cost",
          "decode_floor",
          "kernel_reads",
          "pallas_calls",
          "loop_hbm_bytes",
          "kernel_staged_bytes",
          "budget",
          "least_temporaries",
          "least_refused",
          "least_compiles",
          "least_refusal",
          "attention_flops",
          "model_flops",
          "roofline",
          "fits",
          "planner_ratio",
          "least_peak",
      ]
  )
  assert [p["beside"] for p in data["programs"]] == [
      140_000_000,
      2_000_000,
      16_500_000_000,
  ]
  assert data["estimate"]["step_seconds"] == pytest.approx(0.07226, rel=1e-4)
