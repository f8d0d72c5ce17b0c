"""The parity task with chains that may skip even digits, at the short
budget: the loss-type pilot (issue 49, docs/parity_task.md).

The warm start leaves out each even digit of a chain with probability
`trainer.warm_start_skip_prob` = 0.1: an even digit does not change the
parity, so a chain that skips it is just as right and 4 tokens shorter. At
the short budget (25 tokens: 4 steps), a level 3-4 chain fits only when it
writes at most 4 digits, so a policy that learns to skip every even digit
solves the level 3-4 problems with at most 4 odd digits (89% and 64% of
them) where one that reads every digit must guess. The skip is a decision
at a low-probability token (about 0.1 in the base), the kind the paper says
DAPO's clip holds back; the pilot compares CISPO (ScaleRL's loss) with DAPO
from one base per seed:

  python -m launch.sweep --sweep=configs/parity_skip.py \
      --workdir=/tmp/parity/skip/seed=0 --set=seed=0
  python -m launch.paired --workdirs=/tmp/parity/skip \
      --first=cispo --second=dapo --last=2
"""

from configs import parity
from configs import search

SKIP_PROB = 0.1


def get_config(arg=None):
  """configs/parity.py's config at the short budget, with skipping chains."""
  c = parity.get_config(arg)
  c.update_from_flattened_dict(parity.budget(parity.SHORT))
  c.trainer.warm_start_skip_prob = SKIP_PROB
  return c


def get_sweep(arg=None):
  """The pilot: CISPO against DAPO on the same base (configs/search.py)."""
  return search.get_sweep(arg)
