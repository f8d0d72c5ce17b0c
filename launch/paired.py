"""Compares two points of a grid seed by seed: the paired verdict.

  python -m launch.paired --workdirs=docs/runs/search/pilot \
      --first=cispo --second=dapo --last=2

The runs are named `seed=N/<point>` below --workdirs, as `launch.sweep`
lays out one sweep per seed. Prints each seed's end points and difference,
their mean ± sigma, the verdict at --z sigma, and the seeds that an effect of
--effect would need at the measured spread (scalerl_jax/scaling/paired.py).
"""

from absl import app
from absl import flags

from scalerl_jax.scaling import paired
from scalerl_jax.scaling import runs

_WORKDIRS = flags.DEFINE_list(
    "workdirs", None, "Directories holding seed=N/<point> runs.", required=True
)
_FIRST = flags.DEFINE_string("first", None, "Point name.", required=True)
_SECOND = flags.DEFINE_string("second", None, "Point name.", required=True)
_Y = flags.DEFINE_string("y", "val/mean_at_k", "Validation score key.")
_LAST = flags.DEFINE_integer(
    "last", 1, "Validation scores averaged at each run's end."
)
_Z = flags.DEFINE_float("z", 2.0, "Sigmas a difference must clear.")
_FLOOR = flags.DEFINE_float(
    "floor", 0.0, "Smallest mean difference that counts."
)
_EFFECT = flags.DEFINE_float(
    "effect", 0.05, "Effect to size the number of seeds for."
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  workdirs = runs.find_workdirs(_WORKDIRS.value)
  found = [
      runs.read_run(w, x_key="step", y_key=_Y.value, name=n)
      for w, n in zip(workdirs, runs.labels(workdirs))
  ]
  try:
    p = paired.paired(
        paired.by_seed(found, _FIRST.value, _LAST.value),
        paired.by_seed(found, _SECOND.value, _LAST.value),
    )
  except ValueError as e:
    raise SystemExit(f"launch.paired: {e}") from None
  first, second = _FIRST.value, _SECOND.value
  print(f"seed  {first:>8}  {second:>8}  difference")
  for s, v1, v2, d in zip(p.seeds, p.first, p.second, p.differences):
    print(f"{s:>4}  {v1:8.4f}  {v2:8.4f}  {d:+.4f}")
  print(
      f"{first} - {second}: {p.mean:+.4f} ± {p.sigma:.4f} (sd {p.sd:.4f} over "
      f"{len(p.seeds)} seeds): {first} "
      f"{paired.verdict(p, _Z.value, _FLOOR.value)} at {_Z.value:g} sigma"
  )
  print(
      f"seeds for an effect of {_EFFECT.value:g} at {_Z.value:g} sigma: "
      f"{paired.seeds_needed(p.sd, _EFFECT.value, _Z.value)}"
  )


if __name__ == "__main__":
  app.run(main)
