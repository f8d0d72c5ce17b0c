"""Tests of scalerl_jax.jobs.cluster and launch/cluster.py: what each
target emits, parsed back.

The emitted train commands are parsed with ml_collections' config flags, as
`launch.train` parses them, so a forwarded override that does not survive the
quoting fails here.
"""

import os
import shlex
import stat
import subprocess
import sys

from absl import flags
from ml_collections import config_flags
import pytest
import yaml

from scalerl_jax.jobs import cluster

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_ARG = "configs/scalerl.py:variant=llama3_8b"
# Overrides whose values need quoting: a space, a quote,
# "$" (shells, Kubernetes).
OVERRIDES = [
    "--config.rl.loss=dapo",
    "--config.data.jsonl_train=/data/a b/it's.jsonl",
    "--config.model.hf_path=/ckpts/$$x$(SCALERL_PROCESS_ID)",
    "--noconfig.rl.zero_variance_filter",
]


def parse(argv):
  """Parses `argv` (program name first) as launch.train would:
  (config, overrides, flags)."""
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file(
      "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
  )
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  values(argv)
  return (
      holder.value,
      config_flags.get_override_values(values["config"]),
      values,
  )


def build(target, extra=(), **options):
  """cluster.build for llama3_8b with OVERRIDES plus `extra`,
  parsed like launch.cluster."""
  config, overrides, _ = parse(
      ["launch.cluster", f"--config={CONFIG_ARG}", *OVERRIDES, *extra]
  )
  return cluster.build(
      target,
      config,
      CONFIG_ARG,
      overrides,
      "/shared/run",
      cluster.Options(name="scalerl-8b", **{"repo_dir": REPO, **options}),
  )


def train_flags(argv):
  """The config and workdir a `python -m launch.train ...`
  argv gives launch.train."""
  assert argv[:3] == ["python", "-m", "launch.train"]
  config, _, values = parse(["launch.train"] + argv[3:])
  return config, values["workdir"].value


def check_forwarded(config):
  assert config.rl.loss == "dapo"
  assert config.data.jsonl_train == "/data/a b/it's.jsonl"
  assert config.model.hf_path == "/ckpts/$$x$(SCALERL_PROCESS_ID)"
  assert config.rl.zero_variance_filter is False
  assert config.mesh.distributed is True


def options_of(argv):
  """{'--flag': value} of `--flag=value` items."""
  return dict(a.split("=", 1) for a in argv if a.startswith("--"))


XPK = dict(
    tpu_type="v5p-64",
    cluster="c1",
    project="proj",
    zone="us-east5-a",
    docker_image="gcr.io/proj/scalerl:1",
)


def test_xpk_command_flags_and_forwarded_overrides():
  job = build("xpk", **XPK)
  argv = shlex.split(job.text)
  assert argv[:3] == ["xpk", "workload", "create"] and argv == job.argv
  opts = options_of(argv[3:])
  assert {
      k: opts[k]
      for k in (
          "--cluster",
          "--workload",
          "--tpu-type",
          "--num-slices",
          "--project",
          "--zone",
          "--docker-image",
      )
  } == {
      "--cluster": "c1",
      "--workload": "scalerl-8b",
      "--tpu-type": "v5p-64",
      "--num-slices": "1",
      "--project": "proj",
      "--zone": "us-east5-a",
      "--docker-image": "gcr.io/proj/scalerl:1",
  }
  config, workdir = train_flags(shlex.split(opts["--command"]))
  check_forwarded(config)
  assert workdir == "/shared/run"
  # Cloud TPU is auto-detected: no coordinator, count or id is passed.
  assert (
      config.mesh.coordinator_address,
      config.mesh.num_processes,
      config.mesh.process_id,
  ) == ("", 0, -1)


def test_xpk_base_image_adds_the_repository():
  job = build(
      "xpk", **{**XPK, "docker_image": "", "base_docker_image": "python:3.11"}
  )
  opts = options_of(job.argv)
  assert (
      opts["--base-docker-image"] == "python:3.11"
      and opts["--script-dir"] == REPO
  )
  assert "--docker-image" not in opts


@pytest.mark.parametrize(
    "tpu_type, num_slices, devices",
    [
        ("v5p-64", 1, 32),  # 64 TensorCores, 2 per chip.
        ("v5p-64", 2, 64),
        ("v4-16", 1, 8),
        ("v5litepod-16", 1, 16),  # v5e counts chips.
        ("v6e-256", 1, 256),
        ("v5p-2x2x4", 1, 16),  # A topology counts chips.
        # TPU7x: two TensorCores per chip, each a JAX device.
        ("tpu7x-8", 1, 8),
        ("tpu7x-2x2x1", 1, 8),
        ("tpu7x-4x4x4", 2, 256),
    ],
)
def test_tpu_devices_resolve_the_mesh(tpu_type, num_slices, devices):
  job = build("xpk", **{**XPK, "tpu_type": tpu_type, "num_slices": num_slices})
  # llama3_8b's mesh (1, -1, 1): the -1 takes every device.
  assert job.num_devices == devices and job.mesh_shape == (1, devices, 1)


@pytest.mark.parametrize(
    "tpu_type, message",
    [
        ("v5e-16", "v5litepod"),
        ("v7x-8", "xpk calls v7x 'tpu7x'"),
        ("v5p-63", "multiple"),
        ("tpu7x-6x", "generation"),
        ("tpu7x-7", "tpu7x counts 2 TensorCores per chip; 7 is not a multiple"),
        ("h100-8", "generation"),
    ],
)
def test_bad_tpu_types(tpu_type, message):
  with pytest.raises(ValueError, match=message):
    build("xpk", **{**XPK, "tpu_type": tpu_type})


def test_mesh_that_does_not_fit_names_the_field():
  with pytest.raises(
      ValueError, match=r"config\.mesh\.shape: \(1, 8, 1\) needs 8 devices, 32"
  ):
    build("xpk", ["--config.mesh.shape=(1,8,1)"], **XPK)
  with pytest.raises(
      ValueError, match=r"config\.mesh\.shape.*do not divide the 16"
  ):
    build("slurm", ["--config.mesh.shape=(1,-1,3)"], num_nodes=2)
  # Tensor parallelism over 3 would split 32 heads unevenly, even on 48 devices.
  with pytest.raises(ValueError, match=r"config\.model\.num_heads"):
    build("slurm", ["--config.mesh.shape=(1,-1,3)"], num_nodes=6)


def test_slurm_script():
  job = build(
      "slurm",
      ["--config.mesh.shape=(1,8,2)"],
      num_nodes=2,
      gpus_per_node=8,
      partition="gpu",
      time_limit="1-00:00:00",
      repo_dir="/home/me/scale rl",
  )
  lines = job.text.splitlines()
  assert (
      lines[0] == "#!/bin/bash"
      and job.argv == ["sbatch"]
      and job.stdin == job.text
  )
  sbatch = options_of(
      line.split(None, 1)[1] for line in lines if line.startswith("#SBATCH")
  )
  # One task per GPU: JAX gives each SLURM task the GPU
  # numbered by SLURM_LOCALID.
  assert sbatch == {
      "--job-name": "scalerl-8b",
      "--nodes": "2",
      "--ntasks-per-node": "8",
      "--gpus-per-node": "8",
      "--partition": "gpu",
      "--time": "1-00:00:00",
  }
  assert shlex.split(lines[-2]) == ["cd", "/home/me/scale rl"]
  srun = shlex.split(lines[-1])
  assert srun[:2] == ["srun", "--kill-on-bad-exit=1"]
  config, _ = train_flags(srun[2:])
  check_forwarded(config)
  assert config.mesh.shape == (1, 8, 2) and job.mesh_shape == (1, 8, 2)
  # srun's env decides.
  assert (config.mesh.num_processes, config.mesh.process_id) == (0, -1)


def kubernetes_expand(arg, env):
  """Kubernetes' expansion of a container command: $(VAR) from env, $$ -> $."""
  out, i = "", 0
  while i < len(arg):
    if arg.startswith("$$", i):
      out, i = out + "$", i + 2
    elif (
        arg.startswith("$(", i)
        and arg.find(")", i) > 0
        and arg[i + 2 : arg.find(")", i)] in env
    ):
      end = arg.find(")", i)
      out, i = out + env[arg[i + 2 : end]], end + 1
    else:
      out, i = out + arg[i], i + 1
  return out


def test_jobset_manifest():
  job = build(
      "jobset", num_nodes=4, gpus_per_node=8, docker_image="reg/scalerl:1"
  )
  manifest = yaml.safe_load(job.text)
  assert manifest["kind"] == "JobSet" and job.argv == [
      "kubectl",
      "apply",
      "-f",
      "-",
  ]
  assert manifest["spec"]["network"]["enableDNSHostnames"] is True
  [workers] = manifest["spec"]["replicatedJobs"]
  spec = workers["template"]["spec"]
  assert (spec["parallelism"], spec["completions"], spec["completionMode"]) == (
      4,
      4,
      "Indexed",
  )
  [container] = spec["template"]["spec"]["containers"]
  assert container["image"] == "reg/scalerl:1"
  assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
  # What pod 3 runs once Kubernetes has expanded its command.
  [env] = container["env"]
  assert env["valueFrom"]["fieldRef"]["fieldPath"] == (
      "metadata.annotations['batch.kubernetes.io/job-completion-index']"
  )
  config, workdir = train_flags(
      [kubernetes_expand(a, {env["name"]: "3"}) for a in container["command"]]
  )
  check_forwarded(config)
  assert workdir == "/shared/run"
  name = manifest["metadata"]["name"]
  # JobSet names pod 0 of job 0 <jobset>-<replicated job>-0-0
  # under subdomain <jobset>.
  assert config.mesh.coordinator_address == (
      f"{name}-{workers['name']}-0-0.{name}:{container['ports'][0]['containerPort']}"
  )
  assert (config.mesh.num_processes, config.mesh.process_id) == (4, 3)
  assert job.mesh_shape == (1, 32, 1)


def test_target_fields_conflicts():
  with pytest.raises(
      ValueError, match=r"--config\.mesh\.process_id=0: the target sets it"
  ):
    build(
        "jobset",
        ["--config.mesh.process_id=0"],
        num_nodes=2,
        docker_image="img",
    )
  with pytest.raises(ValueError, match=r"--config\.mesh\.distributed=False"):
    build("slurm", ["--noconfig.mesh.distributed"], num_nodes=1)
  # The value the target sets anyway is accepted and passed once.
  job = build("slurm", ["--config.mesh.distributed=true"], num_nodes=1)
  assert job.text.count("--config.mesh.distributed=") == 1


@pytest.mark.parametrize(
    "target, options, message",
    [
        ("xpk", dict(XPK, cluster=""), "--cluster"),
        ("xpk", dict(XPK, base_docker_image="b"), "one of --docker_image"),
        ("slurm", dict(num_nodes=0), "--num_nodes"),
        ("jobset", dict(num_nodes=1), "--docker_image"),
        (
            "pbs",
            {},
            r"^--target: 'pbs' is not one of \('jobset', 'slurm', 'xpk'\)$",
        ),
    ],
)
def test_missing_or_bad_options(target, options, message):
  with pytest.raises(ValueError, match=message):
    build(target, **options)


def test_bad_name():
  config, overrides, _ = parse(["launch.cluster", f"--config={CONFIG_ARG}"])
  with pytest.raises(ValueError, match="--name='Scale_RL'"):
    cluster.build(
        "slurm",
        config,
        CONFIG_ARG,
        overrides,
        "/w",
        cluster.Options(name="Scale_RL", num_nodes=1),
    )


def test_submit_hands_the_script_to_the_tool(tmp_path, monkeypatch):
  job = build("slurm", num_nodes=2)
  monkeypatch.setenv("PATH", str(tmp_path))
  with pytest.raises(FileNotFoundError, match="sbatch is not installed"):
    cluster.submit(job)
  fake = tmp_path / "sbatch"
  fake.write_text(
      f"#!{sys.executable}\nimport pathlib, sys\n"
      f"pathlib.Path({str(tmp_path / 'seen')!r}).write_text(repr(sys.argv[1:]) + "
      "sys.stdin.read())\nsys.exit(3)\n"
  )
  fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
  assert cluster.submit(job) == 3
  # The script on stdin, no args.
  assert (tmp_path / "seen").read_text() == "[]" + job.text


def test_launcher_prints_and_fails_clearly():
  base = [
      sys.executable,
      "-m",
      "launch.cluster",
      f"--config={CONFIG_ARG}",
      "--target=xpk",
      "--name=scalerl-8b",
      "--workdir=/shared/run",
      "--tpu_type=v5p-64",
      "--cluster=c1",
      "--docker_image=img",
      "--config.rl.loss=dapo",
  ]
  ok = subprocess.run(
      base, cwd=REPO, capture_output=True, text=True, check=False
  )
  assert ok.returncode == 0, ok.stderr
  argv = shlex.split(ok.stdout)
  config, _ = train_flags(shlex.split(options_of(argv)["--command"]))
  assert config.rl.loss == "dapo" and config.mesh.distributed is True
  bad = subprocess.run(
      base + ["--config.mesh.shape=(2,8,1)"],
      cwd=REPO,
      capture_output=True,
      text=True,
      check=False,
  )
  assert bad.returncode != 0 and not bad.stdout
  assert (
      "config.mesh.shape: (2, 8, 1) needs 16 devices, 32 available"
      in bad.stderr
  )
