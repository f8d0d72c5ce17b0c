"""Numbers that would be wrong without any error,
pinned on a real generated batch.

The trainer's sampler generates a batch at temperature 0.7 (top-k and top-p
off); the rollouts score it and the buffer collates it exactly as in a run.
Then, with the weights that generated it:
  * the train step's recomputed log-probs (`policy_logprobs`) equal the
    generator's, so every importance ratio is 1 (a temperature dropped on
    either side would skew every ratio and still train);
  * the trainer's jitted step reports those ratios, and the entropy of
    softmax(logits / T) that the entropy-collapse monitor reads, as an
    independent float64 computation gives them;
  * one step on made-up rewards raises the log-probability of the rewarded
    completions against their group: advantages reach the rows they belong to.
"""

import jax
import numpy as np
import pytest

from scalerl_jax import trainer as trainer_lib
from scalerl_jax.rl import batch as batch_lib
from scalerl_jax.rl import logprobs
from tests import helpers

TEMPERATURE = 0.7


def _sequence_logp(logp_BxS, mask_BxS):
  return np.sum(np.where(mask_BxS > 0, logp_BxS, 0.0), axis=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  config = helpers.rl_test_config("pipeline_rl")
  config.sampling.temperature, config.sampling.top_k, config.sampling.top_p = (
      TEMPERATURE,
      0,
      1.0,
  )
  # An untrained policy: its completions are diverse (a sharp test of the
  # ratios) and all score 0, so the filter is off to keep
  # every token in the loss.
  config.trainer.warm_start_steps = 0
  config.rl.zero_variance_filter = False
  trainer = trainer_lib.Trainer(
      config, str(tmp_path_factory.mktemp("on_policy"))
  )
  try:
    trainer.generate()
    p, g = config.data.prompts_per_step, config.data.generations_per_prompt
    groups = trainer.generation.take(trainer.step)
    batch = batch_lib.collate(groups)
    model, params = trainer.exp.model, jax.device_get(trainer.state.params)
    recompute = lambda params, t: np.asarray(
        logprobs.policy_logprobs(model, params, batch["tokens_BxS"], t)[0]
    )
    out = {
        "batch": batch,
        "logp": recompute(params, TEMPERATURE),
        "logp_t1": recompute(params, 1.0),
        "logits": np.asarray(
            model.apply({"params": params}, batch["tokens_BxS"][:, :-1]),
            np.float64,
        ),
    }
    out["metrics"], _ = trainer.train(groups)

    # Made-up rewards: completion 0 of every group passed, the others failed.
    rewards_PxG = np.zeros((p, g), np.float32)
    rewards_PxG[:, 0] = 1.0
    before = recompute(jax.device_get(trainer.state.params), TEMPERATURE)
    trainer.state, _ = trainer.train_step(
        trainer.state, {**batch, "rewards_PxG": rewards_PxG}
    )
    after = recompute(jax.device_get(trainer.state.params), TEMPERATURE)
    mask = batch["mask_BxS"]
    out["gain_PxG"] = (
        _sequence_logp(after, mask) - _sequence_logp(before, mask)
    ).reshape(p, g)
  finally:
    trainer.close()
  return out


def test_recomputed_logprobs_equal_the_generators_so_every_ratio_is_one(run):
  batch = run["batch"]
  mask = batch["mask_BxS"] > 0
  assert mask.sum() >= 500  # 16 completions of up to 48 sampled tokens.
  gen, logp = batch["gen_logp_BxS"][mask], run["logp"][mask]
  np.testing.assert_allclose(logp, gen, atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.exp(logp - gen), 1.0, atol=1e-5, rtol=0)
  # The check can see a missing temperature: at T = 1 the
  # same tokens are far off.
  assert np.abs(run["logp_t1"][mask] - gen).max() > 0.1


def test_the_trainers_step_reports_ratio_one_and_the_tempered_entropy(run):
  metrics = run["metrics"]
  assert metrics["loss_tokens"] == run["batch"]["mask_BxS"].sum()
  assert (
      abs(metrics["ratio_mean"] - 1.0) <= 1e-5
      and abs(metrics["ratio_max"] - 1.0) <= 1e-5
  )
  assert metrics["train_gen_logp_abs_diff"] <= 1e-5
  # Entropy of softmax(logits / T) per loss token, in float64.
  scaled = run["logits"] / TEMPERATURE
  logp_all = scaled - scaled.max(-1, keepdims=True)
  logp_all -= np.log(np.exp(logp_all).sum(-1, keepdims=True))
  entropy_BxT = -(np.exp(logp_all) * logp_all).sum(-1)
  mask = run["batch"]["mask_BxS"][:, 1:]
  expected = (entropy_BxT * mask).sum() / mask.sum()
  np.testing.assert_allclose(metrics["entropy"], expected, rtol=1e-4)


def test_a_step_raises_the_rewarded_completions_against_their_group(run):
  gain_PxG = run["gain_PxG"]
  # Every group: completion 0 (advantage > 0) gains more log-probability than
  # any failed sibling (advantage < 0).
  assert (gain_PxG[:, 0] > gain_PxG[:, 1:].max(axis=1)).all(), gain_PxG
