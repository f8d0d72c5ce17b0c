"""The search task with a budget of one try: pilot C (issue 49).

configs/search.py's task and pilot, with `sampling.max_new_tokens` cut from
18 (two tries) to 13: "<think> 8=0 </think>\nAnswer: 9" and EOS. A problem
is solved only when the first pick is the odd digit, so the base solves
1/3, 1/4 and 1/6 of the problems of levels 1-3, a second try no longer
hides mass the policy leaves on even digits, and the end point is the mass
the policy puts on the odd digit at one token (docs/search_task.md,
"Pilot C"). The warm start truncates its targets at the same length, so the
base is its own (a new warm-start fingerprint).

  python -m launch.sweep --sweep=configs/search_one_try.py \
      --workdir=/tmp/search/pilot_c/seed=0 --set=seed=0
"""

from configs import search

# "<think> " + one try ("8=0 ": 4 tokens) + "</think>\nAnswer: 9" + EOS.
_ONE_TRY = 13


def get_config(arg=None):
  """configs/search.py's config with a budget of one try."""
  c = search.get_config(arg)
  c.sampling.max_new_tokens = _ONE_TRY
  # The generator still runs ahead until k binds.
  c.buffer.decode_steps_per_train_step = (
      search.RUN_AHEAD * c.sampling.max_new_tokens
  )
  return c


def get_sweep(arg=None):
  """The pilot of configs/search.py: CISPO against DAPO on the same base."""
  return search.get_sweep(arg)
