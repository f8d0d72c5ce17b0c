"""Compares two points of a grid seed by seed: the paired verdict.

  python -m launch.paired --workdirs=docs/runs/search/pilot \
      --first=cispo --second=dapo --last=2

The runs are named `seed=N/<point>` below --workdirs, as `launch.sweep`
lays out one sweep per seed. Prints each seed's end points and difference,
their mean ± sigma, the verdict at --z sigma, and the seeds that an effect of
--effect would need at the measured spread (scalerl_jax/scaling/paired.py).
--param=A_fit compares each run's fitted asymptote instead of its end point,
for runs long enough to pin their sigmoids.

With --claims=<sweep file> it checks every claim of the file's CLAIMS
(`paired.GridClaim`) instead and prints one Markdown table: the claim, the
paper's numbers, the paired difference ± sigma, the verdict, the seeds the
claim would need, and each point's mechanism sizes:

  python -m launch.paired --workdirs=docs/runs/parity/grid \
      --claims=configs/parity_grid.py --last=2
"""

from absl import app
from absl import flags
import numpy as np

from scalerl_jax.jobs import sweep
from scalerl_jax.scaling import compare
from scalerl_jax.scaling import paired
from scalerl_jax.scaling import runs
from scalerl_jax.scaling import seeds

_WORKDIRS = flags.DEFINE_list(
    "workdirs", None, "Directories holding seed=N/<point> runs.", required=True
)
_FIRST = flags.DEFINE_string("first", None, "Point name.")
_SECOND = flags.DEFINE_string("second", None, "Point name.")
_CLAIMS = flags.DEFINE_string(
    "claims",
    None,
    "A sweep file whose CLAIMS to check, in place of --first/--second; "
    "<file>:NAME checks its NAME instead.",
)
_Y = flags.DEFINE_string("y", "val/mean_at_k", "Validation score key.")
_PARAM = flags.DEFINE_enum(
    "param",
    "A",
    list(paired.STATISTICS),
    "With --first/--second, the statistic compared (scaling/paired.py's "
    "STATISTICS).",
)
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


def _mechanism(found, point, key, how):
  """Mean over seeds of each run of `point`'s mechanism size, or '-'."""
  sizes = [
      paired.mechanism_size(r.workdir, key, how)
      for r in found
      if seeds.split_seed(r.name)[0] == point
  ]
  sizes = [v for v in sizes if v is not None]
  return f"{np.mean(sizes):.4g}" if sizes else "-"


def _claims_table(found, spec):
  """The Markdown table of `spec`'s claims ("<sweep file>[:NAME]", NAME
  defaulting to CLAIMS) on `found`."""
  path, _, name = spec.partition(":")
  name = name or "CLAIMS"
  claims = getattr(sweep.load_module(path), name, None)
  if not claims:
    raise SystemExit(f"launch.paired: {path} defines no {name}")
  z = _Z.value
  lines = [
      "| claim | paper | ours: first - second | seeds, steps | verdict "
      "| seeds for the claim | mechanism: first / second |",
      "|---|---|---|---|---|---|---|",
  ]
  for gc in claims:
    c = gc.claim
    try:
      p = paired.paired(
          paired.by_seed(found, c.first, _LAST.value, c.param),
          paired.by_seed(found, c.second, _LAST.value, c.param),
      )
    except ValueError as e:
      lines.append(f"| {c} | {gc.paper} | - | - | missing: {e} | - | - |")
      continue
    steps = max(
        int(r.steps[-1])
        for r in found
        if seeds.split_seed(r.name)[0] == c.first
    )
    # A "higher" claim must clear the measured difference, at least
    # compare.A_NOISE; a "same" claim's interval must fit within the noise.
    if c.relation == "same":
      room = compare.A_NOISE - abs(p.mean)
      need = paired.seeds_needed(p.sd, room, z) if room > 0 else "-"
    else:
      need = paired.seeds_needed(p.sd, max(abs(p.mean), compare.A_NOISE), z)
    mech = "; ".join(
        f"{key}{'' if how == 'mean' else f' ({how})'}: "
        f"{_mechanism(found, c.first, key, how)} / "
        f"{_mechanism(found, c.second, key, how)}"
        for key, how in gc.mechanism
    )
    lines.append(
        f"| {c} ({paired.STATISTICS[c.param].split(':')[0]}) | {gc.paper} "
        f"| {p.mean:+.3f} ± {p.sigma:.3f} | {len(p.seeds)}, {steps} "
        f"| {paired.claim_verdict(p, c, z)} | {need} | {mech or '-'} |"
    )
  print("\n".join(lines))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  workdirs = runs.find_workdirs(_WORKDIRS.value)
  found = [
      runs.read_run(w, x_key="step", y_key=_Y.value, name=n)
      for w, n in zip(workdirs, runs.labels(workdirs))
  ]
  if _CLAIMS.value:
    _claims_table(found, _CLAIMS.value)
    return
  if not (_FIRST.value and _SECOND.value):
    raise app.UsageError("--first and --second, or --claims, are required")
  try:
    p = paired.paired(
        paired.by_seed(found, _FIRST.value, _LAST.value, _PARAM.value),
        paired.by_seed(found, _SECOND.value, _LAST.value, _PARAM.value),
    )
  except ValueError as e:
    raise SystemExit(f"launch.paired: {e}") from None
  first, second = _FIRST.value, _SECOND.value
  print(f"{_PARAM.value}: {paired.STATISTICS[_PARAM.value]}")
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
