"""The transformers `generate` arguments the sampler benchmarks compare with
(benchmarks/sampler.py on CPU, sampler_gpu.py on GPU); a module of its own
because each benchmark defines its own absl flags."""


def kwargs(attention_mask) -> dict:
  """transformers `generate` arguments that sample as the sampler does here:
  temperature 1, no top-k/top-p, no EOS stop (with min_new_tokens)."""
  return dict(
      attention_mask=attention_mask,
      do_sample=True,
      temperature=1.0,
      top_k=0,
      top_p=1.0,
      pad_token_id=0,
  )
