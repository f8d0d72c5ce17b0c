"""The verdicts on an ablation grid against the paper's claims.

`estimates` reads each fitted point's A, B and C_mid with an uncertainty u;
`format_verdicts` checks a grid's claims (`compare.PAPER_CLAIMS`) on them.
Design: docs/design/scaling.md.
"""

from __future__ import annotations

import math
from typing import Sequence

from scalerl_jax.scaling import compare
from scalerl_jax.scaling import curves


def estimates(groups: Sequence[curves.GroupFit]) -> dict[str, compare.Estimate]:
  """Each fitted group's point, by the last part of its name (the point's).

  Two or more fitted seeds give the mean of their fits, u the std over seeds
  / sqrt(seeds); otherwise the group's one fit gives its values, u its
  bootstrap std (0 without one). Raises ValueError when names end alike.
  """
  out = {}
  for g in groups:
    key, s = g.name.split("/")[-1], g.spread
    if key in out:
      raise ValueError(
          f"two groups are named {key!r} below their directories: {g.name}"
      )
    if s is not None:
      reliable = all(c.fit.reliable for c in (g.mean_fit,) + g.fits if c.fit)
      n = math.sqrt(s.num_runs)
      out[key] = compare.Estimate(
          s.a_mean,
          s.a_std / n,
          s.b_mean,
          s.b_std / n,
          s.c_mid_mean,
          s.c_mid_std / n,
          f"std over {s.num_runs} seeds / sqrt({s.num_runs})",
          reliable,
      )
      continue
    curve = g.mean_fit or g.fits[0]
    f, u = curve.fit, curve.uncertainty
    if f is not None:
      out[key] = compare.Estimate(
          f.a,
          u.a_std if u else 0.0,
          f.b,
          u.b_std if u else 0.0,
          f.c_mid,
          u.c_mid_std if u else 0.0,
          "bootstrap std" if u else "none (no bootstrap)",
          f.reliable,
      )
  return out


def format_verdicts(
    grid: str,
    groups: Sequence[curves.GroupFit],
    *,
    a_noise: float = compare.A_NOISE,
) -> str:
  """One line per claim of `grid`, checked on the groups' `estimates`.

  Each line gives the verdict, d ± u and where PAPER.md says so; the text
  ends in a newline.
  """
  points = estimates(groups)
  verdicts = compare.grid_verdicts(
      points, compare.PAPER_CLAIMS[grid], a_noise=a_noise
  )
  out = [
      f"verdicts on the {grid} grid against PAPER.md: a difference d = first - second counts "
      f"when |d| > u = sqrt(u_first^2 + u_second^2), and in A when also |d| >= {a_noise}:"
  ]
  for v in verdicts:
    c = v.claim
    missing = [p for p in (c.first, c.second) if p not in points]
    if missing:
      out.append(
          f"  {c}: missing (no fit of {' or '.join(missing)}) [PAPER.md {c.source}]"
      )
      continue
    first, second = points[c.first], points[c.second]
    line = (
        f"  {c}: {v.verdict} (d {v.difference:+.4f} ± {v.difference_std:.4f}; u: {c.first} "
        f"{first.u_source}, {c.second} {second.u_source})"
    )
    shaky = [p for p in (c.first, c.second) if not points[p].reliable]
    if shaky:
      line += f"; unreliable fit of {' and '.join(shaky)}, see the notes"
    out.append(f"{line} [PAPER.md {c.source}]")
  return "\n".join(out) + "\n"
