"""A tiny Qwen3-style instruct checkpoint written offline, for the
chat-template tests.

`write_tokenizer` trains a small byte-level BPE with the `tokenizers` library
and writes it as Qwen3 ships its tokenizer: `<|endoftext|>`, `<|im_start|>`
and `<|im_end|>` special, `<think>` and `</think>` plain added tokens,
eos_token `<|im_end|>`, pad_token `<|endoftext|>`, generation_config.json
stopping at both. The templates below are written here in the Qwen3 style:
ChatML turns, a system turn, reasoning split off assistant turns, the
`enable_thinking` switch, `raise_exception` on an unknown role, `tojson` of
tool calls, a namespace and `{% break %}`, and one block written with plain
(undashed) tags so that trim_blocks and lstrip_blocks change the text.
`NAMED_TOKENS_TEMPLATE` covers special tokens by name, `strftime_now` and
`{% generation %}`.
"""

import json

import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")

_TURNS = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
    {% if messages[0].role != 'system' and messages | length > 3 %}
<|im_start|>system
A long conversation.<|im_end|>
    {% endif %}
{%- set ns = namespace(last_user=messages | length - 1) %}
{%- for message in messages[::-1] %}
    {%- if message.role == 'user' %}
        {%- set ns.last_user = messages | length - 1 - loop.index0 %}
        {% break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('Unknown role: ' + message.role) }}
    {%- endif %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n')
                                      .split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if loop.index0 > ns.last_user and reasoning %}
            {{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- content }}
        {%- for call in message.tool_calls | default([]) %}
            {{- '\\n<tool_call>\\n' + call | tojson + '\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
"""

# Qwen3 (hybrid thinking): the model opens its own thinking; enable_thinking
# false closes an empty one in the prompt.
QWEN3_TEMPLATE = _TURNS + """\
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# Thinking-only models (DeepSeek-R1, Qwen3 *-Thinking): the prompt opens the
# thinking and the reply starts inside it.
THINKING_TEMPLATE = _TURNS + """\
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n' }}
{%- endif %}"""

# A template that prints special tokens by name and today's date (Llama 3
# style), and marks assistant text with `{% generation %}` (as templates for
# assistant-only losses do).
NAMED_TOKENS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m.role }} {{ strftime_now('%Y') }}]"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% else %}{{ m.content }}{% endif %}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)

_CORPUS = [
    "<|im_start|>system\nYou are a careful solver.<|im_end|>\n",
    "<|im_start|>user\nTom has 6 bags of 7 apples. How many apples does he have?\n"
    "Please reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n",
    "<|im_start|>assistant\n<think>\n6 * 7 = 42\n</think>\n\nThe answer is \\boxed{42}.",
    "Natalia sold clips to 48 of her friends in April, and then half as many in May.",
    "A long conversation. Résumé ∑ 中文 tool_call arguments name",
]


def write_tokenizer(
    directory,
    chat_template=QWEN3_TEMPLATE,
    template_file=False,
    extra_settings=None,
):
  """Writes tokenizer.json, tokenizer_config.json and generation_config.json.

  Args:
    directory: a pathlib.Path; created if missing.
    chat_template: the template text, or None for none.
    template_file: write the template to chat_template.jinja instead of
      tokenizer_config.json.
    extra_settings: more tokenizer_config.json entries.

  Returns:
    The `tokenizers.Tokenizer` written.
  """
  directory.mkdir(parents=True, exist_ok=True)
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=400,
      special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
  tok.add_tokens(list(THINK_TOKENS))
  tok.save(str(directory / "tokenizer.json"))
  settings = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "bos_token": None,
      "eos_token": "<|im_end|>",
      "pad_token": "<|endoftext|>",
      **(extra_settings or {}),
  }
  if chat_template is not None and template_file:
    (directory / "chat_template.jinja").write_text(chat_template)
  elif chat_template is not None:
    settings["chat_template"] = chat_template
  (directory / "tokenizer_config.json").write_text(json.dumps(settings))
  stops = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
  (directory / "generation_config.json").write_text(
      json.dumps(
          {
              "bos_token_id": stops[1],
              "eos_token_id": stops,
              "pad_token_id": stops[1],
              "temperature": 0.6,
              "top_p": 0.95,
          }
      )
  )
  return tok
