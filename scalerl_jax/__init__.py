"""scalerl_jax: JAX-native ScaleRL.

Shape letters. An array's name ends in its shape (`logp_BxS`, `scores_PxG`,
`q_BxTxKxQxE`), and these letters mean the same thing in every module:

  B  rows of a batch (sequences); in an RL batch B = P * G, prompt-major
  P  prompts (groups) in a batch
  G  generations (completions) per prompt; the k of mean@k and pass@k
  L  padded prompt width (prompt tokens of the widest row)
  S  sequence positions: prompt then completion, right-padded; a sampler
     slot's (and its KV cache's) positions
  T  positions in one model call: S - 1 predicted positions in the train
     step, the prompt in a prefill, 1 in a decode step
  N  sampler slots (the rows of one sampler call)
  F  finished rows harvested from the sampler
  M  microbatches of a train step
  V  vocabulary;  D  embedding width;  E  head dimension
  H  query heads;  K  key/value heads;  Q = H // K query heads per kv head

Any other letter is local: the module's docstring defines it, and it means
nothing outside that module. Counts in names spell what they count:
`prompt_len`, `completion_len` and `seq_len` are token counts, `seq_len` of
prompt and completion together.
"""
