"""What launches a config on a cluster, for the cluster's own tools.

`build` writes what an existing tool takes (xpk's command line for TPU
slices, an sbatch script or a Kubernetes JobSet manifest for GPU hosts) and
`submit` hands it over; nothing here schedules work. Every target checks
that the config's mesh uses exactly the devices it provides, and adds the
`config.mesh` fields a multi-host run needs.

Design: docs/design/cluster.md.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import shutil
import subprocess
from typing import Any, Callable, Optional

import ml_collections
import yaml  # PyYAML, a dependency of ml_collections.

from scalerl_jax import config as config_lib
from scalerl_jax import registry
from scalerl_jax import sharding
from scalerl_jax.jobs import sweep
from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import topology

# xpk's rule for workload names; also valid Kubernetes names and hostnames.
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_MAX_NAME = 40

# xpk's TPU generations -> (TensorCores per chip, the generation's name in
# `launch.compile`'s slices, None where the planner does not know it). xpk's
# `<generation>-<n>` names count TensorCores, its topologies chips; JAX
# devices per chip are the planner's (accelerators.Accelerator): v4 and v5p
# drive a chip's two TensorCores as one (megacore) device, TPU7x as two.
_XPK_TPUS = {
    "v4": (2, None),
    "v5p": (2, "v5p"),
    "v5litepod": (1, "v5e"),
    "v6e": (1, "v6e"),
    "tpu7x": (2, "tpu7x"),
}
_TPU_TYPE = re.compile(r"(?P<gen>[a-z0-9]+)-(?P<size>\d+(?:x\d+)*)")
# Names xpk does not use, and what it calls them.
_XPK_CALLS = {"v5e": "v5litepod", "v7x": "tpu7x", "ironwood": "tpu7x"}

COORDINATOR_PORT = 1234  # jobset: port of the JAX coordinator on pod 0.
_WORKERS = "workers"  # jobset: name of its one replicated job.
# jobset: the environment variable holding the completion index.
_PROCESS_ID_ENV = "SCALERL_PROCESS_ID"
# xpk, slurm: what the train command adds; JAX reads the rest from the cluster.
_AUTO_DETECTED = {"mesh.distributed": True}


@dataclasses.dataclass(frozen=True)
class Options:
  """Where and how to run; `launch/cluster.py` has one flag per field."""

  name: str  # Workload / job / JobSet name.
  python: str = "python"  # Interpreter in the train command.
  # xpk: e.g. v5p-64 or tpu7x-8 (TensorCores), v5litepod-16 (chips).
  tpu_type: str = ""
  num_slices: int = 1  # xpk: TPU slices.
  cluster: str = ""  # xpk: GKE cluster name.
  project: str = ""  # xpk: GCP project; "" = gcloud's default.
  zone: str = ""  # xpk: GCP zone; "" = gcloud's default.
  # xpk, jobset: image holding the repository as its working directory.
  docker_image: str = ""
  base_docker_image: str = ""  # xpk: base image xpk adds this repository to.
  num_nodes: int = 0  # slurm, jobset: GPU hosts.
  gpus_per_node: int = 8  # slurm, jobset: GPUs per host.
  partition: str = ""  # slurm: partition; "" = the cluster's default.
  # slurm: --time, e.g. 2-00:00:00; "" = the partition's default.
  time_limit: str = ""
  # Repository root: slurm runs there on the hosts; xpk adds it to
  # --base_docker_image. launch/cluster.py defaults it to its checkout.
  repo_dir: str = ""


@dataclasses.dataclass(frozen=True)
class Job:
  """What a target emits, and how its tool takes it."""

  text: str  # The xpk command line, the sbatch script or the JobSet manifest.
  argv: list[str]  # The tool invocation that submits it.
  # Fed to `argv` (script or manifest); None when `argv` is all.
  stdin: Optional[str]
  mesh_shape: tuple[int, ...]  # config.mesh.shape with its -1 resolved.
  num_devices: int  # Devices the target provides.


def _devices_per_chip(generation: str) -> int:
  """JAX devices per chip of an xpk generation, as the planner counts them."""
  compile_name = _XPK_TPUS[generation][1]
  if compile_name is None:
    return 1  # v4: one (megacore) device per chip.
  key = topology.GENERATIONS[compile_name]
  return accelerators.ACCELERATORS[key].devices_per_chip


def tpu_devices(tpu_type: str) -> int:
  """JAX devices of one slice of an xpk TPU type.

  Args:
    tpu_type: `<generation>-<n>`, n TensorCores (e.g. v5p-64, tpu7x-8), or
      `<generation>-<topology>`, counting chips (e.g. v5p-2x2x4, tpu7x-2x2x1).

  Returns:
    The slice's chips times the generation's devices per chip: v5p-64 is 32
    devices, tpu7x-8 is 8, tpu7x-2x2x1 is 8.

  Raises:
    ValueError: a name xpk does not use, or a TensorCore count that is not a
      whole number of chips.
  """
  match = _TPU_TYPE.fullmatch(tpu_type)
  gen = match and match["gen"]
  if gen not in _XPK_TPUS:
    calls = next(
        (
            f" (xpk calls {name} '{xpk}')"
            for name, xpk in _XPK_CALLS.items()
            if tpu_type.startswith(name)
        ),
        "",
    )
    raise ValueError(
        f"--tpu_type={tpu_type!r}: expected <generation>-<size> as xpk names it, e.g. "
        f"v5p-64 or v5litepod-16, generation one of {sorted(_XPK_TPUS)}{calls}"
    )
  sizes = [int(s) for s in match["size"].split("x")]
  if len(sizes) > 1:  # A topology counts chips.
    return math.prod(sizes) * _devices_per_chip(gen)
  cores = _XPK_TPUS[gen][0]
  if not sizes[0] or sizes[0] % cores:
    raise ValueError(
        f"--tpu_type={tpu_type!r}: {gen} counts {cores} TensorCores per chip; "
        f"{sizes[0]} is not a multiple"
    )
  return sizes[0] // cores * _devices_per_chip(gen)


def check_mesh(
    config: ml_collections.ConfigDict, num_devices: int, where: str
) -> tuple[int, ...]:
  """`config.mesh.shape` with its -1 resolved for the target's `num_devices`.

  ValueError names the config field that is invalid or does not fit, and the
  target (`where`).
  """
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    raise ValueError(f"config.{e}") from None
  try:
    # The trainer's checks for this device count: mesh size, sharded dimensions.
    config_lib.validate(config, num_devices)
  except config_lib.ConfigError as e:
    hint = ""
    if str(e).startswith("mesh.shape"):
      hint = f"; set --config.mesh.shape so that its product is {num_devices}, or -1 on one axis"
    raise ValueError(f"config.{e} ({where}){hint}") from None
  return sharding.resolve_mesh_shape(config.mesh.shape, num_devices)


def train_argv(
    config_arg: str,
    workdir: str,
    overrides: dict[str, Any],
    target_fields: dict[str, Any],
    python: str,
    escape: Callable[[str], str] = lambda s: s,
) -> list[str]:
  """The `launch.train` argv: user config and overrides, then `target_fields`.

  `escape` is applied to every argument that comes from the user. ValueError
  when the user set a field of `target_fields` to another value.
  """
  for field, value in target_fields.items():
    if field in overrides and overrides[field] != value:
      raise ValueError(
          f"--config.{field}={sweep.format_value(overrides[field])}: the target "
          f"sets it to {sweep.format_value(value)}; drop the flag"
      )
  user = [f"--config={config_arg}", f"--workdir={workdir}"] + [
      f"--config.{k}={sweep.format_value(v)}"
      for k, v in overrides.items()
      if k not in target_fields
  ]
  return (
      [python, "-m", "launch.train"]
      + [escape(a) for a in user]
      + [
          f"--config.{k}={sweep.format_value(v)}"
          for k, v in target_fields.items()
      ]
  )


def _require(options, target, *fields):
  missing = [f"--{f}" for f in fields if not getattr(options, f)]
  if missing:
    raise ValueError(f"--target={target} needs {', '.join(missing)}")


def _xpk(config, config_arg, overrides, workdir, o: Options) -> Job:
  _require(o, "xpk", "tpu_type", "cluster")
  if bool(o.docker_image) == bool(o.base_docker_image):
    raise ValueError(
        "--target=xpk needs one of --docker_image (used as is) or "
        "--base_docker_image (xpk adds this repository to it)"
    )
  if o.num_slices < 1:
    raise ValueError(f"--num_slices must be >= 1; got {o.num_slices}")
  devices = tpu_devices(o.tpu_type) * o.num_slices
  shape = check_mesh(
      config, devices, f"{o.num_slices} x {o.tpu_type} = {devices} TPU devices"
  )
  train = train_argv(config_arg, workdir, overrides, _AUTO_DETECTED, o.python)
  argv = [
      "xpk",
      "workload",
      "create",
      f"--cluster={o.cluster}",
      f"--workload={o.name}",
      f"--tpu-type={o.tpu_type}",
      f"--num-slices={o.num_slices}",
  ]
  if o.project:
    argv.append(f"--project={o.project}")
  if o.zone:
    argv.append(f"--zone={o.zone}")
  if o.docker_image:
    argv.append(f"--docker-image={o.docker_image}")
  else:
    argv += [
        f"--base-docker-image={o.base_docker_image}",
        f"--script-dir={o.repo_dir}",
    ]
  argv.append(f"--command={shlex.join(train)}")
  return Job(shlex.join(argv), argv, None, shape, devices)


def _gpu_hosts(config, o: Options, target) -> tuple[int, tuple[int, ...]]:
  if o.num_nodes < 1 or o.gpus_per_node < 1:
    raise ValueError(
        f"--target={target} needs --num_nodes and --gpus_per_node >= 1; got "
        f"{o.num_nodes} and {o.gpus_per_node}"
    )
  devices = o.num_nodes * o.gpus_per_node
  where = f"{o.num_nodes} nodes x {o.gpus_per_node} GPUs = {devices} devices"
  return devices, check_mesh(config, devices, where)


def _slurm(config, config_arg, overrides, workdir, o: Options) -> Job:
  devices, shape = _gpu_hosts(config, o, "slurm")
  train = train_argv(config_arg, workdir, overrides, _AUTO_DETECTED, o.python)
  lines = [
      "#!/bin/bash",
      f"#SBATCH --job-name={o.name}",
      f"#SBATCH --nodes={o.num_nodes}",
      f"#SBATCH --ntasks-per-node={o.gpus_per_node}",
      f"#SBATCH --gpus-per-node={o.gpus_per_node}",
  ]
  if o.partition:
    lines.append(f"#SBATCH --partition={o.partition}")
  if o.time_limit:
    lines.append(f"#SBATCH --time={o.time_limit}")
  lines += [
      "# One process per GPU: jax.distributed.initialize reads srun's SLURM_* variables.",
      "set -euo pipefail",
      f"cd {shlex.quote(o.repo_dir)}",
      # One failed process would leave the others waiting in a collective.
      f"srun --kill-on-bad-exit=1 {shlex.join(train)}",
  ]
  script = "\n".join(lines) + "\n"
  return Job(script, ["sbatch"], script, shape, devices)


def _jobset(config, config_arg, overrides, workdir, o: Options) -> Job:
  devices, shape = _gpu_hosts(config, o, "jobset")
  _require(o, "jobset", "docker_image")
  fields = {
      "mesh.distributed": True,
      # Pod 0 of job 0, through the headless service JobSet names
      # after itself.
      "mesh.coordinator_address": f"{o.name}-{_WORKERS}-0-0.{o.name}:{COORDINATOR_PORT}",
      "mesh.num_processes": o.num_nodes,
      # Kubernetes expands $(VAR).
      "mesh.process_id": f"$({_PROCESS_ID_ENV})",
  }
  # Kubernetes would also expand a user's "$(X)" and turn "$$" into "$".
  command = train_argv(
      config_arg,
      workdir,
      overrides,
      fields,
      o.python,
      escape=lambda s: s.replace("$", "$$"),
  )
  index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
  container = {
      "name": "train",
      "image": o.docker_image,
      "command": command,
      "env": [
          {
              "name": _PROCESS_ID_ENV,
              "valueFrom": {"fieldRef": {"fieldPath": index}},
          }
      ],
      "ports": [{"containerPort": COORDINATOR_PORT}],
      "resources": {"limits": {"nvidia.com/gpu": o.gpus_per_node}},
      # NCCL exchanges data through /dev/shm, which container runtimes cap
      # at 64 MB.
      "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
  }
  pod = {
      "restartPolicy": "Never",
      "containers": [container],
      "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
  }
  job = {
      "parallelism": o.num_nodes,
      "completions": o.num_nodes,
      "completionMode": "Indexed",
      "backoffLimit": 0,
      "template": {"spec": pod},
  }
  manifest = {
      "apiVersion": "jobset.x-k8s.io/v1alpha2",
      "kind": "JobSet",
      "metadata": {"name": o.name},
      "spec": {
          "network": {
              "enableDNSHostnames": True,
              "publishNotReadyAddresses": True,
          },
          "replicatedJobs": [
              {"name": _WORKERS, "replicas": 1, "template": {"spec": job}}
          ],
      },
  }
  text = yaml.safe_dump(manifest, sort_keys=False)
  return Job(text, ["kubectl", "apply", "-f", "-"], text, shape, devices)


# What `--target` names: the tools `build` writes for.
TARGETS: registry.Registry[Callable[..., Job]] = registry.Registry("--target")
TARGETS.register("xpk", _xpk)
TARGETS.register("slurm", _slurm)
TARGETS.register("jobset", _jobset)


def build(
    target: str,
    config: ml_collections.ConfigDict,
    config_arg: str,
    overrides: dict[str, Any],
    workdir: str,
    options: Options,
) -> Job:
  """What `target` runs: the train command of `config` wrapped for its tool.

  `config` has the user's `overrides` (dotted field -> value, in flag order)
  applied; `config_arg` is the `--config` value as given; `workdir` must be a
  path every host sees. ValueError names the flag or field that does not fit.
  """
  write = TARGETS.get(target)  # ValueError naming the choices.
  if not _NAME.fullmatch(options.name) or len(options.name) > _MAX_NAME:
    raise ValueError(
        f"--name={options.name!r}: use at most {_MAX_NAME} characters matching "
        f"{_NAME.pattern} (xpk and Kubernetes names)"
    )
  return write(config, config_arg, overrides, workdir, options)


def submit(job: Job) -> int:
  """Hands `job` to its tool (xpk, sbatch or kubectl); returns its exit code."""
  tool = job.argv[0]
  if shutil.which(tool) is None:
    raise FileNotFoundError(
        f"{tool} is not installed or not on PATH; run with --dry_run to "
        "print what it would be given"
    )
  return subprocess.run(
      job.argv, input=job.stdin, text=True, check=False
  ).returncode
