"""Tests of grouping runs by seed, the mean curve over seeds and the
spread of their fits."""

import numpy as np
import pytest

from scalerl_jax.scaling import runs
from scalerl_jax.scaling import seeds
from scalerl_jax.scaling import sigmoid


def _run(
    name,
    steps=(0, 5, 10),
    compute=(0.0, 1.0, 2.0),
    score=(0.2, 0.3, 0.5),
    workdir=None,
):
  return runs.Run(
      name=name,
      workdir=workdir or f"/sweeps/{name}",
      steps=np.array(steps),
      compute=np.array(compute, dtype=float),
      score=np.array(score, dtype=float),
      problems=(),
  )


def _fit(a, b, c_mid):
  return sigmoid.SigmoidFit(
      a=a,
      b=b,
      c_mid=c_mid,
      r0=0.2,
      r0_source="given",
      rmse=0.0,
      num_points=10,
      compute_range=(1.0, 10.0),
  )


@pytest.mark.parametrize(
    "name, expected",
    [
        ("cispo_seed1", ("cispo", 1)),
        ("seed=2/cispo", ("cispo", 2)),
        ("cispo/seed_3", ("cispo", 3)),
        ("loss_type_seed0/cispo", ("loss_type/cispo", 0)),
        ("cispo_seed-4_lr3", ("cispo_lr3", 4)),
        ("seed12_cispo", ("cispo", 12)),
        ("seed1", ("", 1)),
        ("cispo", ("cispo", None)),
        ("myseed1", ("myseed1", None)),  # Not a separate part of the name.
        ("seeded_run", ("seeded_run", None)),
    ],
)
def test_split_seed(name, expected):
  assert seeds.split_seed(name) == expected


def test_group_runs_keeps_first_appearance_and_names_bare_seeds_by_parent():
  members = [
      _run("cispo_seed0"),
      _run("dapo"),
      _run("cispo_seed1"),
      _run("seed=0", workdir="/sweeps/gspo/seed=0"),
      _run("seed=1", workdir="/sweeps/gspo/seed=1"),
  ]
  groups = seeds.group_runs(members)
  assert [(name, [r.name for r in rs]) for name, rs in groups] == [
      ("cispo", ["cispo_seed0", "cispo_seed1"]),
      ("dapo", ["dapo"]),
      ("gspo", ["seed=0", "seed=1"]),
  ]


def test_mean_curve_by_hand():
  # Step 15 is only in the first run and step 20 only in the second: left out.
  # At step 5: compute (1 + 3) / 2 = 2, score (0.3 + 0.5) / 2 = 0.4, sample std
  # |0.5 - 0.3| / sqrt(2) = 0.14142; at step 10: (2 + 4) / 2 = 3, 0.55, 0.07071.
  first = _run(
      "a_seed0", (0, 5, 10, 15), (0.0, 1.0, 2.0, 2.5), (0.2, 0.3, 0.5, 0.9)
  )
  second = _run(
      "a_seed1", (0, 5, 10, 20), (0.0, 3.0, 4.0, 5.0), (0.2, 0.5, 0.6, 0.9)
  )
  m = seeds.mean_curve([first, second])
  np.testing.assert_array_equal(m.steps, [0, 5, 10])
  np.testing.assert_allclose(m.compute, [0.0, 2.0, 3.0])
  np.testing.assert_allclose(m.score, [0.2, 0.4, 0.55])
  np.testing.assert_allclose(
      m.score_std, [0.0, 0.2 / np.sqrt(2), 0.1 / np.sqrt(2)]
  )
  np.testing.assert_allclose(m.score_min, [0.2, 0.3, 0.5])
  np.testing.assert_allclose(m.score_max, [0.2, 0.5, 0.6])
  assert m.num_seeds == 2 and m.steps_left_out == (15, 20)


def test_mean_curve_needs_two_runs_sharing_a_step():
  with pytest.raises(ValueError, match="at least 2"):
    seeds.mean_curve([_run("a")])
  with pytest.raises(ValueError, match="share no evaluated step"):
    seeds.mean_curve([_run("a", steps=(0, 5, 10)), _run("b", steps=(1, 6, 11))])


def test_spread_by_hand():
  # A 0.60, 0.62, 0.61: mean 0.61,
  # sample std sqrt((0.01^2 + 0.01^2) / 2) = 0.01;
  # likewise B 1.9 +- 0.1 and C_mid 200 +- 100.
  s = seeds.spread(
      [_fit(0.60, 1.8, 100.0), _fit(0.62, 2.0, 300.0), _fit(0.61, 1.9, 200.0)]
  )
  assert (s.a_mean, s.a_std) == pytest.approx((0.61, 0.01))
  assert (s.b_mean, s.b_std) == pytest.approx((1.9, 0.1))
  assert (s.c_mid_mean, s.c_mid_std) == pytest.approx((200.0, 100.0))
  assert s.num_runs == 3
  with pytest.raises(ValueError, match="at least 2"):
    seeds.spread([_fit(0.6, 1.9, 100.0)])
