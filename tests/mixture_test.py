"""Tests of data.mixture: config, records, shares,
per-domain curricula and metrics."""

import collections
import json
import types

import numpy as np
import pytest

from configs import multitask
from configs import scalerl
from scalerl_jax import evaluation
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.data import curriculum as curriculum_lib
from scalerl_jax.data import mixture
from scalerl_jax.data import pipeline
from scalerl_jax.data import sources
from scalerl_jax.data import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def config():
  c = multitask.get_config()
  with c.unlocked():
    c.data.mixture.math.builtin_num_train = 40
    c.data.mixture.code.builtin_num_train = 24
  return c


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok") / workdir_lib.TOKENIZER_FILE
  return tokenizer_lib.train_builtin_tokenizer(str(path), 512, code=True)


def test_records_carry_their_domain_prefix_and_verifier(config):
  records = sources.load_prompts(config, "train")
  by_domain = collections.Counter(r["domain"] for r in records)
  assert by_domain == {"math": 40, "code": 24}
  for r in records:
    assert r["id"].startswith(r["domain"] + "/")
    assert r["verifier"] == {"math": "builtin", "code": "code"}[r["domain"]]
  val = sources.load_prompts(config, "val")
  assert not {r["id"] for r in val} & {r["id"] for r in records}
  head = mixture.head_per_domain(val, 5)
  assert [r["domain"] for r in head] == [val[0]["domain"]] * 5 + [
      d for d in ("math", "code") if d != val[0]["domain"]
  ] * 5


def test_a_single_source_config_is_untouched():
  c = scalerl.get_config()
  assert mixture.names(c) == [] and mixture.weights(c) == {}
  assert isinstance(mixture.make_curriculum(c), curriculum_lib.Curriculum)
  records = sources.load_prompts(c, "val")
  assert (
      "domain" not in records[0]
      and mixture.head_per_domain(records, 7) == records[:7]
  )


def test_bad_domains_fail_naming_the_field(config):
  c = multitask.get_config()
  with c.unlocked():
    c.data.mixture.code.weight = 0.0
  with pytest.raises(ValueError, match=r"data.mixture.code.weight"):
    sources.load_prompts(c, "train")
  c = multitask.get_config()
  with c.unlocked():
    c.data.mixture.code.jsonl_tain = "x"
  with pytest.raises(
      ValueError, match=r"data.mixture.code.jsonl_tain: not a data"
  ):
    sources.load_prompts(c, "train")


def test_every_batch_holds_each_domains_share(config, tok):
  # Weights 0.5/0.5 and P=16: grain's mix interleaves, so every
  # batch holds 8 of each.
  stream = pipeline.make_pipeline(
      config, sources.load_prompts(config, "train"), tok
  )
  for _ in range(20):
    counts = collections.Counter(r["domain"] for r in next(stream).records)
    assert counts == {"math": 8, "code": 8}


def test_curricula_keep_each_domains_state_and_round_trip(config):
  c = multitask.get_config()
  with c.unlocked():
    # Code retires earlier than math.
    c.data.mixture.code.retire_threshold = 0.5
  curricula = mixture.make_curriculum(c)
  scores = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
  retired = curricula.update(["code/a", "math/a", "math/b"], scores)
  assert retired == ["code/a", "math/b"]
  m = curricula.metrics()
  assert m["groups_seen"] == 3 and m["prompts_retired"] == 2
  assert (
      m["curriculum/code/prompts_retired"] == 1
      and m["curriculum/math/groups_seen"] == 2
  )
  assert m["zero_variance_fraction"] == pytest.approx(1 / 3)
  restored = mixture.restore_curriculum(
      json.loads(json.dumps(curricula.state_dict()))
  )
  assert restored.metrics() == m and restored.is_retired("code/a")
  assert not restored.is_retired("math/a")
  with pytest.raises(ValueError, match="no domain"):
    curricula.is_retired("other/x")


def _group(domain, scores, lengths):
  """What train_metrics reads of a `buffer.Group`."""
  return types.SimpleNamespace(
      record={"id": f"{domain}/x", "domain": domain},
      scores_G=np.asarray(scores, np.float32),
      completions=types.SimpleNamespace(
          completion_len=np.asarray(lengths, np.int32)
      ),
  )


def test_train_metrics_per_domain():
  groups = [
      _group("math", [1, 0], [4, 6]),
      _group("math", [1, 1], [2, 2]),
      _group("code", [0, 0], [10, 20]),
  ]
  m = mixture.train_metrics(groups)
  # math: scores 1,0,1,1 -> 0.75; one of two groups zero-variance;
  # lengths 4,6,2,2 -> 3.5.
  assert m == {
      "train/code/count": 1.0,
      "train/code/reward_mean": 0.0,
      "train/code/zero_variance_frac": 1.0,
      "train/code/mean_length": 15.0,
      "train/math/count": 2.0,
      "train/math/reward_mean": 0.75,
      "train/math/zero_variance_frac": 0.5,
      "train/math/mean_length": 3.5,
  }
  assert mixture.train_metrics([_group("", [1, 0], [1, 1])]) == {}


def test_validation_metrics_per_domain():
  scores = np.array([[1, 0], [0, 0], [1, 1]], np.float32)
  out = evaluation.summarize_domains(
      scores,
      np.array([1, 2, 3, 4, 5, 6]),
      np.zeros(6, bool),
      ["math", "code", "math"],
  )
  assert out["val/mean_at_k"] == pytest.approx(0.5)
  assert (
      out["val/math/mean_at_k"] == pytest.approx(0.75)
      and out["val/math/pass_at_k"] == 1.0
  )
  assert out["val/code/mean_at_k"] == 0.0 and out["val/code/pass_at_k"] == 0.0
  # Rows 0 and 2: 1, 2, 5, 6.
  assert out["val/math/mean_length"] == pytest.approx(3.5)
  assert out["val/code/num_prompts"] == 1.0
  single = evaluation.summarize_domains(
      scores, np.arange(6), np.zeros(6, bool), [""] * 3
  )
  assert single == evaluation.summarize(scores, np.arange(6), np.zeros(6, bool))
