"""Prints (or submits) what runs a config on a cluster: xpk, SLURM or JobSet.

  python -m launch.cluster --config=configs/scalerl.py:variant=llama3_8b \
      --target=xpk --name=scalerl-8b --workdir=/mnt/shared/scalerl-8b \
      --tpu_type=v5p-64 --num_slices=1 --cluster=my-cluster \
      --project=my-project --zone=us-east5-a \
      --docker_image=gcr.io/my-project/scalerl:latest \
      --config.model.hf_path=/ckpts/Llama-3.1-8B
  python -m launch.cluster --config=configs/scalerl.py:variant=llama3_8b \
      --target=slurm --name=scalerl-8b --workdir=/shared/scalerl-8b \
      --num_nodes=2 --gpus_per_node=8 --config.mesh.shape='(1,8,2)' > run.sbatch
  python -m launch.cluster ... --target=jobset --docker_image=... > jobset.yaml

Each --config.<field> goes on to `launch.train`, with the mesh fields that
multi-host runs need. --nodry_run submits with xpk, sbatch or kubectl.
"""

import dataclasses
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from launch import REPO_ROOT
from scalerl_jax.jobs import cluster

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file (e.g. configs/scalerl.py:variant=llama3_8b).",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory that every host sees.", required=True
)
_TARGET = flags.DEFINE_enum(
    "target",
    None,
    cluster.TARGETS.names(),
    "xpk (TPU slices), slurm or jobset (GPU hosts).",
    required=True,
)
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", True, "Print only; --nodry_run submits with the tool."
)
# One flag per cluster.Options field, with its default.
flags.DEFINE_string(
    "name",
    None,
    "Workload / job name (lower case, digits, '-').",
    required=True,
)
flags.DEFINE_string("python", "python", "Interpreter in the train command.")
flags.DEFINE_string(
    "tpu_type", "", "xpk: TPU type, e.g. v5p-64, v5litepod-16 or tpu7x-8."
)
flags.DEFINE_integer("num_slices", 1, "xpk: TPU slices.")
flags.DEFINE_string("cluster", "", "xpk: GKE cluster.")
flags.DEFINE_string("project", "", "xpk: GCP project (default: gcloud's).")
flags.DEFINE_string("zone", "", "xpk: GCP zone (default: gcloud's).")
flags.DEFINE_string(
    "docker_image", "", "xpk, jobset: image with the repository as workdir."
)
flags.DEFINE_string(
    "base_docker_image", "", "xpk: base image that xpk adds --repo_dir to."
)
flags.DEFINE_integer("num_nodes", 0, "slurm, jobset: GPU hosts.")
flags.DEFINE_integer("gpus_per_node", 8, "slurm, jobset: GPUs per host.")
flags.DEFINE_string(
    "partition", "", "slurm: partition (default: the cluster's)."
)
flags.DEFINE_string("time_limit", "", "slurm: time limit, e.g. 2-00:00:00.")
flags.DEFINE_string(
    "repo_dir",
    REPO_ROOT,
    "Repository root: slurm runs there; xpk copies it (--base_docker_image).",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise app.UsageError(
        "--config is required, e.g. --config=configs/scalerl.py:variant=llama3_8b"
    )
  options = cluster.Options(
      **{
          f.name: flags.FLAGS[f.name].value
          for f in dataclasses.fields(cluster.Options)
      }
  )
  config_flag = flags.FLAGS["config"]
  try:
    job = cluster.build(
        _TARGET.value,
        _CONFIG.value,
        config_flags.get_config_filename(config_flag),
        config_flags.get_override_values(config_flag),
        _WORKDIR.value,
        options,
    )
  except ValueError as e:
    raise SystemExit(f"launch.cluster: {e}") from None
  print(
      f"launch.cluster: mesh {tuple(_CONFIG.value.mesh.axes)} = {job.mesh_shape} over "
      f"{job.num_devices} devices",
      file=sys.stderr,
  )
  if _DRY_RUN.value:
    print(job.text, end="" if job.text.endswith("\n") else "\n")
    return
  try:
    code = cluster.submit(job)
  except FileNotFoundError as e:
    raise SystemExit(f"launch.cluster: {e}") from None
  if code:
    raise SystemExit(f"launch.cluster: {job.argv[0]} exited with code {code}")


if __name__ == "__main__":
  app.run(main)
