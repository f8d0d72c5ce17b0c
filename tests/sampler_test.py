"""Sampler: greedy == argmax of full forwards,
log-probs == trainer's, slots, errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import sharding
from scalerl_jax.models import kv_cache
from scalerl_jax.models.lm_head import token_logprobs
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.sampling import windows
from scalerl_jax.sampling.sampler import Sampler
from scalerl_jax.sampling.settings import SamplingSettings
from tests import helpers

PAD = 0
PROMPT_LENS = np.array([1, 5, 16, 9, 3, 12])


@pytest.fixture(scope="module")
def setup():
  config = helpers.tiny_config()
  config.sampling.max_prompt_len = 16
  config.sampling.max_new_tokens = 24
  config.sampling.decode_steps_per_call = 5
  cfg = ModelConfig.from_config(config.model)
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  model = Transformer(cfg)
  params, _ = sharding.init_model_params(model, jax.random.key(0), mesh, rules)
  other, _ = sharding.init_model_params(model, jax.random.key(1), mesh, rules)
  base = SamplingSettings.from_config(config.sampling, eos_ids=(), pad_id=PAD)
  prompts = np.random.RandomState(0).randint(
      1, cfg.vocab_size, (len(PROMPT_LENS), 16)
  )

  samplers = {}

  def make(**overrides):
    """One sampler per settings, shared across tests
    (its programs compile once)."""
    settings = dataclasses.replace(base, **overrides)
    if settings not in samplers:
      samplers[settings] = Sampler(cfg, settings, mesh, rules)
    return samplers[settings]

  return dict(
      cfg=cfg,
      model=model,
      params=params,
      other=other,
      make=make,
      prompts=prompts,
      mesh_rules=(mesh, rules),
  )


def _full_forward(model, params, tokens_BxS):
  return jax.jit(model.apply)({"params": params}, jnp.asarray(tokens_BxS))


# "pallas": the TPU's decode kernel, in Pallas' interpreter here.
@pytest.mark.parametrize("decode_attention", ["plain", "pallas"])
def test_greedy_equals_repeated_argmax_of_full_forward(setup, decode_attention):
  sampler = setup["make"](temperature=0.0, decode_attention=decode_attention)
  assert sampler.settings.decode_attention == decode_attention
  out = sampler.generate(
      setup["params"], setup["prompts"], PROMPT_LENS, jax.random.key(0)
  )
  # Reference: grow each sequence by the argmax of a full (cache-free) forward
  # pass over everything so far; rows are padded on the right, which a causal
  # model cannot see.
  tokens = np.full((len(PROMPT_LENS), 40), PAD, np.int32)
  for i, n in enumerate(PROMPT_LENS):
    tokens[i, :n] = setup["prompts"][i, :n]
  forward = jax.jit(
      lambda t: setup["model"].apply({"params": setup["params"]}, t)
  )
  for step in range(24):
    logits = np.asarray(forward(tokens))
    for i, n in enumerate(PROMPT_LENS):
      tokens[i, n + step] = logits[i, n + step - 1].argmax()
  np.testing.assert_array_equal(out.tokens, tokens)
  np.testing.assert_array_equal(out.seq_len, PROMPT_LENS + 24)
  assert out.truncated.all()


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (20, 0.9)])
def test_logprobs_equal_trainer_recomputation(setup, top_k, top_p):
  temperature = 0.7
  out = setup["make"](
      temperature=temperature, top_k=top_k, top_p=top_p
  ).generate(setup["params"], setup["prompts"], PROMPT_LENS, jax.random.key(3))
  logits = _full_forward(setup["model"], setup["params"], out.tokens)
  recomputed = np.asarray(
      token_logprobs(
          logits[:, :-1], jnp.asarray(out.tokens[:, 1:]), temperature
      )
  )
  mask = out.mask[:, 1:]
  assert mask.sum() == 24 * len(PROMPT_LENS)
  np.testing.assert_allclose(
      out.gen_logp[:, 1:][mask], recomputed[mask], atol=1e-5, rtol=0
  )
  assert (out.gen_logp[~out.mask] == 0).all() and (
      out.version[~out.mask] == -1
  ).all()
  assert (out.version[out.mask] == 0).all()

  # Independent reference of the truncated distribution: sort, keep top-k,
  # then the smallest prefix reaching top_p, renormalise.
  scaled = np.asarray(logits, np.float64)[:, :-1] / temperature
  expected = np.zeros_like(out.logp_sampling[:, 1:])
  for i, t in zip(*np.nonzero(mask)):
    row = scaled[i, t]
    order = np.argsort(-row, kind="stable")[: top_k or len(row)]
    probs = np.exp(row[order] - row[order].max())
    probs /= probs.sum()
    keep = order[(np.cumsum(probs) - probs) < top_p]
    token = out.tokens[i, t + 1]
    assert token in keep
    expected[i, t] = row[token] - np.log(np.exp(row[keep]).sum())
  np.testing.assert_allclose(
      out.logp_sampling[:, 1:][mask], expected[mask], atol=1e-5
  )
  if top_k or top_p < 1:
    # Truncation can only raise a kept token's probability.
    assert (out.logp_sampling[out.mask] >= out.gen_logp[out.mask] - 1e-6).all()
  else:
    np.testing.assert_array_equal(out.logp_sampling, out.gen_logp)


def test_fixed_key_is_deterministic(setup):
  sampler = setup["make"](temperature=0.7)
  run = lambda seed: sampler.generate(
      setup["params"], setup["prompts"], PROMPT_LENS, jax.random.key(seed)
  )
  first, again, other = run(7), run(7), run(8)
  np.testing.assert_array_equal(first.tokens, again.tokens)
  np.testing.assert_array_equal(first.gen_logp, again.gen_logp)
  assert (first.tokens != other.tokens).any()


def test_top_k_one_equals_greedy(setup):
  greedy = setup["make"](temperature=0.0).generate(
      setup["params"], setup["prompts"], PROMPT_LENS, jax.random.key(0)
  )
  top1 = setup["make"](temperature=1.0, top_k=1).generate(
      setup["params"], setup["prompts"], PROMPT_LENS, jax.random.key(5)
  )
  np.testing.assert_array_equal(top1.tokens, greedy.tokens)
  np.testing.assert_allclose(top1.gen_logp, greedy.gen_logp, atol=1e-6)
  assert (top1.logp_sampling == 0).all()  # One candidate: probability 1.


def _greedy_with_eos(setup):
  """The greedy run without EOS, and a greedy sampler whose EOS id is the 4th
  token that run generated for prompt 1 (so some sequences stop early)."""
  free = setup["make"](temperature=0.0).generate(
      setup["params"], setup["prompts"], PROMPT_LENS, jax.random.key(0)
  )
  eos = int(free.tokens[1, PROMPT_LENS[1] + 3])
  return free, setup["make"](temperature=0.0, eos_ids=(eos,)), eos


def test_eos_stops_and_the_rest_is_padding(setup):
  free, sampler, eos = _greedy_with_eos(setup)
  out = sampler.generate(
      setup["params"], setup["prompts"], PROMPT_LENS, jax.random.key(0)
  )
  stopped = 0
  for i, n in enumerate(PROMPT_LENS):
    completion = free.tokens[i, n : n + 24]
    hits = np.flatnonzero(completion == eos)
    end = n + (hits[0] + 1 if hits.size else 24)
    stopped += bool(hits.size)
    assert out.seq_len[i] == end and out.truncated[i] == (not hits.size)
    np.testing.assert_array_equal(out.tokens[i, :end], free.tokens[i, :end])
    assert (out.tokens[i, end:] == PAD).all()
    assert not out.mask[i, end:].any() and (out.version[i, end:] == -1).all()
    assert (out.gen_logp[i, end:] == 0).all()
    assert out.mask[i, n:end].all() and not out.mask[i, :n].any()
  assert (
      1 <= stopped < len(PROMPT_LENS) and out.seq_len[1] == PROMPT_LENS[1] + 4
  )


def _run_slots(sampler, params, prompts, lens, num_slots, seeds):
  """Staggered continuous batching: at most one new prompt per advance call."""
  state = sampler.init_state(num_slots, meta_width=1)
  queue, results, slot_of, running_at_harvest = (
      list(range(len(lens))),
      {},
      {},
      [],
  )
  while len(results) < len(lens):
    free = sampler.free_slots(state)
    if queue and free.size:
      i = queue.pop(0)
      state = sampler.start(
          state,
          params,
          free[:1],
          prompts[i : i + 1],
          lens[i : i + 1],
          jax.random.key(seeds[i]),
          meta=np.array([i]),
      )
    state = sampler.advance(state, params, version=0)
    state, done = sampler.harvest(state)
    if len(done.slot):
      running_at_harvest.append(num_slots - len(sampler.free_slots(state)))
    for row, i in enumerate(done.meta[:, 0]):
      results[int(i)] = jax.tree.map(lambda x: x[row], done)
      slot_of.setdefault(int(done.slot[row]), []).append(int(i))
  return results, slot_of, running_at_harvest


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_continuous_batching_equals_prompts_run_alone(setup, temperature):
  # Sampled too: a sequence's key stream depends only on its start call's key
  # and its row there, never on its slot or its neighbours.
  _, _, eos = _greedy_with_eos(setup)
  sampler = setup["make"](temperature=temperature, eos_ids=(eos,))
  prompts, params = setup["prompts"], setup["params"]
  alone = [
      _run_slots(
          sampler, params, prompts[i : i + 1], PROMPT_LENS[i : i + 1], 3, [i]
      )[0][0]
      for i in range(len(PROMPT_LENS))
  ]
  results, slot_of, running = _run_slots(
      sampler, params, prompts, PROMPT_LENS, 3, range(len(PROMPT_LENS))
  )
  assert max(len(v) for v in slot_of.values()) >= 2  # Slots were refilled.
  assert max(running) >= 1  # Others kept running while a slot was harvested.
  if temperature == 0:
    # EOS varied.
    assert len({int(r.seq_len) - n for r, n in zip(alone, PROMPT_LENS)}) > 1
  for i, ref in enumerate(alone):
    got = results[i]
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_array_equal(got.mask, ref.mask)
    assert got.seq_len == ref.seq_len and got.truncated == ref.truncated
    np.testing.assert_allclose(got.gen_logp, ref.gen_logp, atol=1e-5)


def test_prefill_of_slots_in_order_leaves_a_running_slot_alone(setup):
  # Rows 0..2 go to slots 0..2 and row 3 is padding: `start` selects rows into
  # place (`in_order`) instead of scattering them, and must keep slot 3,
  # which is mid-sequence, as it is.
  sampler = setup["make"](temperature=1.0)
  prompts, params = setup["prompts"], setup["params"]
  state = sampler.init_state(4, meta_width=1)
  state = sampler.start(
      state,
      params,
      [3],
      prompts[3:4],
      PROMPT_LENS[3:4],
      jax.random.key(7),
      meta=np.array([3]),
  )
  state = sampler.advance(state, params, version=0, num_steps=2)
  state = sampler.start(
      state,
      params,
      [0, 1, 2],
      prompts[:3],
      PROMPT_LENS[:3],
      jax.random.key(8),
      meta=np.arange(3),
  )
  results = {}
  # Each call decodes several tokens; 64 calls end every sequence.
  for _ in range(64):
    state = sampler.advance(state, params, version=0)
    state, done = sampler.harvest(state)
    for row, i in enumerate(done.meta[:, 0]):
      results[int(i)] = jax.tree.map(lambda x: x[row], done)
  assert sorted(results) == [0, 1, 2, 3]
  refs = [
      sampler.generate(params, prompts[:3], PROMPT_LENS[:3], jax.random.key(8)),
      sampler.generate(
          params, prompts[3:4], PROMPT_LENS[3:4], jax.random.key(7)
      ),
  ]
  for i in range(4):
    ref = jax.tree.map(lambda x: x[i % 3], refs[i // 3])
    np.testing.assert_array_equal(results[i].tokens, ref.tokens)
    np.testing.assert_array_equal(results[i].mask, ref.mask)
    np.testing.assert_allclose(results[i].gen_logp, ref.gen_logp, atol=1e-5)


def test_in_flight_weight_update(setup):
  sampler = setup["make"](temperature=0.0)
  lens, prompts = PROMPT_LENS, setup["prompts"]
  old_only = sampler.generate(
      setup["params"], prompts, lens, jax.random.key(0), version=3
  )
  state = sampler.init_state(8)
  state = sampler.start(
      state, setup["params"], np.arange(6), prompts, lens, jax.random.key(0)
  )
  state = sampler.advance(state, setup["params"], version=3, num_steps=6)
  state = sampler.advance(state, setup["other"], version=4, num_steps=100)
  state, out = sampler.harvest(state)
  assert sorted(out.slot) == list(range(6))
  for row, (slot, n) in enumerate(zip(out.slot, lens[out.slot])):
    np.testing.assert_array_equal(
        out.tokens[row, : n + 6], old_only.tokens[slot, : n + 6]
    )
    assert (
        out.tokens[row, n + 6 : n + 24] != old_only.tokens[slot, n + 6 : n + 24]
    ).any()
    np.testing.assert_array_equal(
        out.version[row, n : n + 24], [3] * 6 + [4] * 18
    )
    assert (out.version[row, :n] == -1).all()


def test_prepared_params_are_regrouped_once_and_sample_the_same(setup):
  sampler = setup["make"](temperature=1.0)
  params, prompts, key = setup["params"], setup["prompts"], jax.random.key(5)
  prepares = []
  call = sampler._call

  def spy(fn, *args, **static):
    prepares.extend([fn] if fn is sampler.programs.prepare else [])
    return call(fn, *args, **static)

  sampler._call = spy
  raw = sampler.generate(params, prompts, PROMPT_LENS, key)
  # One regrouping for the prefill and every decode call.
  assert len(prepares) == 1
  prepared = sampler.prepare(params)
  assert sampler.prepare(prepared) is prepared and len(prepares) == 2
  again = sampler.generate(prepared, prompts, PROMPT_LENS, key)
  state = sampler.init_state(8)
  state = sampler.start(
      state, prepared, np.arange(6), prompts, PROMPT_LENS, key
  )
  for _ in range(5):
    state = sampler.advance(state, prepared, version=0)
  _, slots = sampler.harvest(state)
  assert len(prepares) == 2
  for out in (again, slots):
    np.testing.assert_array_equal(out.tokens, raw.tokens)
    np.testing.assert_array_equal(out.gen_logp, raw.gen_logp)


# On TPU the cache's positions are allocated in whole 128-lane tiles
# (kv_cache.cache_align); asked for here, on the CPU.
@pytest.mark.parametrize("decode_attention", ["plain", "pallas"])
def test_a_cache_padded_past_its_positions_samples_the_same(
    setup, decode_attention
):
  plain = setup["make"](decode_attention=decode_attention)
  padded = setup["make"](decode_attention=decode_attention, cache_align=128)
  assert plain.settings.cache_positions == 40  # 16 + 24
  assert padded.settings.cache_positions == 128
  assert padded.init_state(2).cache["k"][0].shape[-1] == 128
  outs = [
      s.generate(
          setup["params"], setup["prompts"], PROMPT_LENS, jax.random.key(3)
      )
      for s in (plain, padded)
  ]
  np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
  np.testing.assert_array_equal(outs[0].seq_len, outs[1].seq_len)
  np.testing.assert_allclose(
      outs[0].gen_logp, outs[1].gen_logp, atol=1e-5, rtol=0
  )
  assert outs[1].tokens.shape == (len(PROMPT_LENS), 40)


def test_generate_in_attention_windows_equals_whole_cache_decoding(setup):
  """With a long budget, generate runs its first steps on the first
  part of the cache only."""
  sampler = setup["make"](max_new_tokens=112, temperature=0.0)  # Cache 128.
  spans = windows.attention_windows(sampler.settings)
  assert spans == [64, 96]
  # Hand-worked below: 49 + 32 + 31 = 112 steps.
  assert windows.generate_calls(spans, 16, 112) == [(64, 49), (96, 32), (0, 31)]
  assert windows.window_for(spans, 64, 1) == 64
  assert windows.window_for(spans, 64, 2) == 96
  assert windows.window_for(spans, 96, 2) == 0
  windows_used = []
  call = sampler._call

  def spy(fn, *args, **static):
    if fn is sampler.programs.advance:
      windows_used.append(static["window"])
    return call(fn, *args, **static)

  sampler._call = spy
  params, prompts, key = setup["params"], setup["prompts"], jax.random.key(2)
  out = sampler.generate(params, prompts, PROMPT_LENS, key)
  # The longest prompt has 16 tokens: steps 0..48 fit the 64 window, the next 32
  # the 96 one, the last 31 neither.
  assert windows_used == [64, 96, 0]
  # Reference: the slot interface in one call, which cannot fit the window.
  state = sampler.init_state(8)
  state = sampler.start(state, params, np.arange(6), prompts, PROMPT_LENS, key)
  _, ref = sampler.harvest(sampler.advance(state, params, 0, 112))
  # The 64 and 96 windows and the whole cache.
  assert sampler.programs.advance._cache_size() == 3
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.seq_len, PROMPT_LENS + 112)
  np.testing.assert_allclose(out.gen_logp, ref.gen_logp, atol=1e-5, rtol=0)
  # The slot interface picks the window itself while the longest sequence
  # (16 tokens) + the call's steps fit: 48 steps do, the rest do not.
  state = sampler.init_state(8)
  state = sampler.start(state, params, np.arange(6), prompts, PROMPT_LENS, key)
  state = sampler.advance(state, params, 0, 48)
  assert int(sampler._call(sampler.programs.longest, state)) == 64
  _, split = sampler.harvest(sampler.advance(state, params, 0, 64))
  assert windows_used == [64, 96, 0, 0, 64, 0]
  assert sampler.programs.advance._cache_size() == 3
  np.testing.assert_array_equal(split.tokens, ref.tokens)
  np.testing.assert_allclose(split.gen_logp, ref.gen_logp, atol=1e-5, rtol=0)


def test_compiled_once_per_bucket_and_cache_donated(setup):
  sampler = Sampler(
      setup["cfg"], setup["make"]().settings, *setup["mesh_rules"]
  )
  for b in (3, 4):  # Both use 4 slots and the 16-token prompt bucket.
    sampler.generate(
        setup["params"],
        setup["prompts"][:b],
        PROMPT_LENS[:b],
        jax.random.key(b),
    )
  assert sampler.programs.advance._cache_size() == 1
  assert sampler.programs.start._cache_size() == 1
  state = sampler.init_state(4)
  old = jax.tree.leaves(state.cache)
  state = sampler.advance(state, setup["params"], version=0)
  assert len(old) == 2 * setup["cfg"].num_layers and all(
      x.is_deleted() for x in old
  )


def test_bad_input_is_a_clear_error_before_compiling(setup):
  sampler = Sampler(
      setup["cfg"], setup["make"]().settings, *setup["mesh_rules"]
  )
  params, prompts = setup["params"], setup["prompts"]
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="max_prompt_len 16"):
    sampler.generate(params, np.ones((1, 20), np.int32), [17], key)
  with pytest.raises(ValueError, match="empty batch"):
    sampler.generate(
        params, np.zeros((0, 4), np.int32), np.zeros((0,), np.int32), key
    )
  with pytest.raises(ValueError, match="outside the vocabulary"):
    sampler.generate(params, np.array([[5, 128, 0]]), [2], key)
  with pytest.raises(ValueError, match="outside the vocabulary"):
    sampler.generate(params, np.array([[5, -1, 0]]), [2], key)
  with pytest.raises(ValueError, match="at least one token"):
    sampler.generate(params, prompts[:2], [3, 0], key)
  with pytest.raises(ValueError, match="prompt_lens"):
    sampler.generate(params, prompts[:2], [3], key)
  assert (
      sampler.programs.advance._cache_size() == 0
      and sampler.programs.start._cache_size() == 0
  )

  with pytest.raises(
      ValueError, match="exceeds the KV cache limit model.max_seq_len 256"
  ):
    setup["make"](max_new_tokens=241)
  with pytest.raises(ValueError, match="outside the vocabulary"):
    setup["make"](eos_ids=(500,))
  with pytest.raises(ValueError, match="top_k"):
    setup["make"](top_k=1000)

  state = sampler.init_state(2)
  state = sampler.start(state, params, [1], prompts[:1], [4], key)
  with pytest.raises(ValueError, match=r"slots \[1\] still hold sequences"):
    sampler.start(state, params, [1], prompts[:1], [4], key)
  with pytest.raises(ValueError, match="must lie in"):
    sampler.start(state, params, [2], prompts[:1], [4], key)
  with pytest.raises(ValueError, match="duplicates"):
    sampler.start(state, params, [0, 0], prompts[:2], [4, 4], key)
  with pytest.raises(ValueError, match="meta"):
    sampler.start(
        state,
        params,
        [0],
        prompts[:1],
        [4],
        key,
        meta=np.zeros((1, 3), np.int32),
    )


@pytest.mark.parametrize("every", [4, 7])
def test_checking_every_few_steps_decodes_the_same(setup, every):
  """A fixed-trip inner loop of `every` steps between the loop's checks:
  the same tokens, log-probs and lengths as a check every step, with calls
  of 5 steps (not a multiple), slots ending at EOS inside the inner loop,
  refilled slots, and attention windows."""
  _, _, eos = _greedy_with_eos(setup)
  prompts, params = setup["prompts"], setup["params"]
  runs, five = {}, {}
  for check in (1, every):
    sampler = setup["make"](
        temperature=1.0, eos_ids=(eos,), decode_steps_per_check=check
    )
    runs[check] = _run_slots(
        sampler, params, prompts, PROMPT_LENS, 3, range(len(PROMPT_LENS))
    )[0]
    # One call stops at its 5 steps, wherever the inner loop is.
    state = sampler.init_state(8)
    state = sampler.start(
        state, params, np.arange(6), prompts, PROMPT_LENS, jax.random.key(3)
    )
    state = sampler.advance(state, params, 0, 5)
    five[check] = np.asarray(sampler._call(sampler.programs.progress, state)[1])
  # 5 tokens each (the prompt's last re-read first), none past them.
  np.testing.assert_array_equal(five[1][:6], PROMPT_LENS + 5)
  np.testing.assert_array_equal(five[every], five[1])
  assert runs[1].keys() == runs[every].keys()
  for i, ref in runs[1].items():
    got = runs[every][i]
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_array_equal(got.mask, ref.mask)
    np.testing.assert_array_equal(got.gen_logp, ref.gen_logp)
    assert got.seq_len == ref.seq_len and got.truncated == ref.truncated
  # Attention windows: generate's calls stop where the window is full.
  outs = [
      setup["make"](
          max_new_tokens=112, temperature=0.0, decode_steps_per_check=check
      ).generate(params, prompts, PROMPT_LENS, jax.random.key(2))
      for check in (1, every)
  ]
  np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
  np.testing.assert_array_equal(outs[0].gen_logp, outs[1].gen_logp)
