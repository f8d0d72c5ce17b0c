"""One controller of tests/multi_controller_test.py: a short RL run,
its host decisions dumped.

  python -m tests.scripts.multi_controller --workdir=W --out=O --tag=p0 \
      --warm_start_dir=B --num_steps=1,2 --num_processes=2 --process_id=0 \
      --coordinator=localhost:PORT

runs `trainer.train_and_evaluate` once per entry of --num_steps in `W`: with
`1,2` it trains one step, then resumes from that step's checkpoint for the
second. The base policy is the one cached in `B` (`trainer.warm_start_dir`;
trained there first if missing). With --num_processes > 1 it joins the
multi-controller runtime through the config (`mesh.distributed`) and, after
training, exports the final checkpoint to `O/export_<tag>` (process 0 alone
writes there).

It writes `O/decisions_<tag>.json`: the topology, how many completions this
process's own reward pool verified, and every host-side decision
in the order it was taken: the prompts started (their ids), the groups
harvested (index, prompt id, verifier scores), the groups the buffer handed
out, the curriculum and data-iterator state and the loss after each step, and
each validation's metrics. `O/params_<tag>.npz` holds the parameters gathered
from every process when each Trainer was built (`init<run>/...`, the base
policy or the restored checkpoint) and when it closed (`final<run>/...`).
"""

import argparse
import functools
import json
import os

import jax
from jax.experimental import multihost_utils
import numpy as np

from scalerl_jax import trainer as trainer_lib
from scalerl_jax.checkpoint import policy
from scalerl_jax.rewards.workers import pool as pool_lib
from scalerl_jax.rl import buffer as buffer_lib
from scalerl_jax.rl import slot_runner as slot_runner_lib
from tests import helpers


def make_config(
    num_steps: int,
    warm_start_dir: str,
    num_processes: int = 1,
    process_id: int = 0,
    coordinator: str = "",
):
  """The run: helpers.rl_test_config on a (2, 2, 2) mesh, validated and
  checkpointed every step.

  The learning rate is 10x the helper's, so that 2 steps move the parameters
  far beyond the 1e-5 the test compares them to.
  """
  config = helpers.rl_test_config("pipeline_rl", num_steps=num_steps)
  # data x fsdp x tensor: data splits the two processes.
  config.mesh.shape = (2, 2, 2)
  config.optim.learning_rate = 1e-3
  t = config.trainer
  t.eval_every = t.checkpoint_every = 1
  t.eval_num_prompts = 8
  t.warm_start_dir = warm_start_dir
  if num_processes > 1:
    m = config.mesh
    m.distributed, m.coordinator_address = True, coordinator
    m.num_processes, m.process_id = num_processes, process_id
  return config


class Recorder:
  """Wraps the trainer's decision points and logs what each returns."""

  def __init__(self):
    self.events: list[list] = []
    self.params: dict[str, np.ndarray] = {}
    self.run = 0
    # Completions this process's own reward pool verified.
    self.verified_here = 0

  def _wrap(self, cls, name, after):
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapped(obj, *args, **kwargs):
      result = original(obj, *args, **kwargs)
      after(obj, result, *args)
      return result

    setattr(cls, name, wrapped)

  def install(self) -> None:
    """Patches SlotRunner, RolloutBuffer, RewardPool and Trainer methods
    to log what they do."""
    self._wrap(
        slot_runner_lib.SlotRunner,
        "_next_prompt",
        lambda r, out: self.events.append(["start", out[0]["id"]]),
    )
    self._wrap(
        slot_runner_lib.SlotRunner,
        "collect",
        lambda r, _, groups, *__: self.events.append(
            [
                "harvest",
                [
                    [g.index, g.record["id"], g.scores_G.tolist()]
                    for g in groups
                ],
            ]
        ),
    )
    self._wrap(
        buffer_lib.RolloutBuffer,
        "take",
        lambda b, groups, n, version, k: self.events.append(
            [
                "take",
                version,
                None if groups is None else [g.index for g in groups],
            ]
        ),
    )
    self._wrap(
        trainer_lib.Trainer,
        "run_step",
        lambda t, row: self.events.append(
            [
                "after_step",
                t.step,
                t.generation.curriculum.state_dict(),
                t.generation.pipeline.get_state(),
                row["train/loss"],
            ]
        ),
    )
    self._wrap(
        trainer_lib.Trainer,
        "evaluate",
        lambda t, metrics: self.events.append(["validation", t.step, metrics]),
    )
    self._wrap(pool_lib.RewardPool, "score", self._count_verified)
    self._wrap(
        trainer_lib.Trainer,
        "__init__",
        lambda t, _, *a: self._gather(t, "init"),
    )
    original_close = trainer_lib.Trainer.close

    def close(trainer):
      self._gather(trainer, "final")
      original_close(trainer)

    trainer_lib.Trainer.close = close

  def _count_verified(self, pool, result, completions, records) -> None:
    del pool, result, records
    self.verified_here += len(completions)

  def _gather(self, trainer, when: str) -> None:
    """The parameters as every process sees them
    (a collective: all call it together)."""
    params = trainer.state.params
    # One process: device_get; process_allgather would stack
    # a leading axis of 1.
    params = (
        jax.device_get(params)
        if jax.process_count() == 1
        else multihost_utils.process_allgather(params, tiled=True)
    )
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
      self.params[f"{when}{self.run}/{jax.tree_util.keystr(path)}"] = (
          np.asarray(leaf)
      )
    self.events.append([when, self.run, trainer.step])


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--tag", required=True)
  parser.add_argument("--warm_start_dir", required=True)
  parser.add_argument(
      "--num_steps", default="2", help="comma-separated: one run per entry"
  )
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  parser.add_argument("--coordinator", default="")
  args = parser.parse_args()
  recorder = Recorder()
  recorder.install()
  for run, num_steps in enumerate(int(n) for n in args.num_steps.split(",")):
    recorder.run = run
    config = make_config(
        num_steps,
        args.warm_start_dir,
        args.num_processes,
        args.process_id,
        args.coordinator,
    )
    trainer_lib.train_and_evaluate(config, args.workdir)
  if args.num_processes > 1:
    # Each process reads the record process 0 wrote, with its own index (the
    # runtime is already up here, so a wrong one would go unnoticed).
    policy.export_checkpoint(
        args.workdir,
        os.path.join(args.out, f"export_{args.tag}"),
        process_id=args.process_id,
    )
  topology = {
      "process_index": jax.process_index(),
      "process_count": jax.process_count(),
      "local_devices": jax.local_device_count(),
      "devices": jax.device_count(),
  }
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"decisions_{args.tag}.json"), "w") as f:
    json.dump(
        {
            "topology": topology,
            "events": recorder.events,
            "verified_here": recorder.verified_here,
        },
        f,
    )
  np.savez(os.path.join(args.out, f"params_{args.tag}.npz"), **recorder.params)


if __name__ == "__main__":
  main()
