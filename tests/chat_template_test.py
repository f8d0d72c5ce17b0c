"""Chat templates render as transformers' `apply_chat_template` renders them."""

import json

import jinja2
import pytest
import transformers

from scalerl_jax.data import chat_template
from scalerl_jax.data import tokenizer as tokenizer_lib
from tests import instruct_checkpoint

_QUESTION = "Tom has 6 bags of 7 apples. How many apples? Résumé ∑ 中文"
_CONVERSATIONS = {
    "user": [{"role": "user", "content": _QUESTION}],
    "system_user": [
        {"role": "system", "content": "You are a careful solver."},
        {"role": "user", "content": _QUESTION},
    ],
    # Reasoning is shown for the assistant turn after the last user turn only;
    # a tool call goes through tojson with its non-ASCII text kept.
    "multi_turn": [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n2"},
        {"role": "user", "content": _QUESTION},
        {
            "role": "assistant",
            "content": "<think>\n6*7\n</think>\n\n42",
            "tool_calls": [
                {"name": "check", "arguments": {"x": 42, "note": "é ∑"}}
            ],
        },
    ],
    "system_not_first": [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "c"},
    ],
}
_TEMPLATES = {
    "qwen3": instruct_checkpoint.QWEN3_TEMPLATE,
    "thinking": instruct_checkpoint.THINKING_TEMPLATE,
    "named_tokens": instruct_checkpoint.NAMED_TOKENS_TEMPLATE,
}


@pytest.fixture(
    scope="module", params=[False, True], ids=["in_config", "jinja_file"]
)
def checkpoints(request, tmp_path_factory):
  """template name -> (our tokenizer, transformers' tokenizer)
  of one directory."""
  out = {}
  for name, template in _TEMPLATES.items():
    directory = tmp_path_factory.mktemp(name)
    instruct_checkpoint.write_tokenizer(
        directory,
        template,
        template_file=request.param,
        extra_settings={"bos_token": "<|endoftext|>"},
    )
    out[name] = (
        tokenizer_lib.load_tokenizer(str(directory)),
        transformers.AutoTokenizer.from_pretrained(str(directory)),
    )
  return out


@pytest.mark.parametrize("template", sorted(_TEMPLATES))
@pytest.mark.parametrize("conversation", sorted(_CONVERSATIONS))
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"enable_thinking": True},
        {"enable_thinking": False},
        {"add_generation_prompt": False},
    ],
)
def test_rendering_equals_transformers(
    checkpoints, template, conversation, kwargs
):
  ours, reference = checkpoints[template]
  messages = _CONVERSATIONS[conversation]
  kwargs = {"add_generation_prompt": True, **kwargs}
  expected = reference.apply_chat_template(messages, tokenize=False, **kwargs)
  assert ours.chat_template.render(messages, **kwargs) == expected


def test_rendered_text_by_hand(checkpoints):
  # The undashed block is indented and ends its lines: only trim_blocks and
  # lstrip_blocks render it as a clean turn. The thinking template opens the
  # thinking in the prompt; enable_thinking=False closes an empty one.
  long = [
      {"role": "user", "content": "a"},
      {"role": "assistant", "content": "b"},
      {"role": "user", "content": "c"},
      {"role": "assistant", "content": "d"},
  ]
  ours = {name: tok.chat_template for name, (tok, _) in checkpoints.items()}
  assert ours["qwen3"].render(long, add_generation_prompt=False) == (
      "<|im_start|>system\nA long conversation.<|im_end|>\n"
      "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
      "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\nd<|im_end|>\n"
  )
  user = [{"role": "user", "content": "q"}]
  turn = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
  assert ours["qwen3"].render(user) == turn
  assert (
      ours["qwen3"].render(user, enable_thinking=False)
      == turn + "<think>\n\n</think>\n\n"
  )
  assert ours["thinking"].render(user) == turn + "<think>\n"
  # Special tokens are variables, and a keyword argument overrides one.
  year = ours["named_tokens"].render(user).split(" ", 1)[1][:4]
  assert (
      ours["named_tokens"].render(user)
      == f"<|endoftext|>[user {year}]q<|im_end|>[assistant]"
  )
  assert (
      ours["named_tokens"]
      .render(user, eos_token="</s>")
      .endswith("q</s>[assistant]")
  )


def test_template_errors_name_the_file(checkpoints, tmp_path):
  ours, reference = checkpoints["qwen3"]
  bad = [{"role": "tool", "content": "x"}]
  with pytest.raises(
      jinja2.exceptions.TemplateError, match="Unknown role: tool"
  ):
    reference.apply_chat_template(bad, tokenize=False)
  with pytest.raises(
      ValueError,
      match=f"{ours.chat_template.where}: chat template failed: "
      "Unknown role: tool",
  ):
    ours.chat_template.render(bad)
  with pytest.raises(
      ValueError, match=r"config.json: chat template does not parse \(line 1"
  ):
    chat_template.ChatTemplate("{% if %}", "config.json", {})


def _load(directory, settings):
  (directory / "tokenizer_config.json").write_text(json.dumps(settings))
  return chat_template.load(directory, settings)


def test_where_templates_are_read_from(tmp_path):
  user = [{"role": "user", "content": "q"}]
  assert _load(tmp_path, {"eos_token": "E"}) is None
  named = [
      {"name": "tool_use", "template": "tools"},
      {
          "name": "default",
          "template": "{{ messages[0].content }}{{ eos_token }}",
      },
  ]
  assert (
      _load(
          tmp_path, {"chat_template": named, "eos_token": {"content": "E"}}
      ).render(user)
      == "qE"
  )
  with pytest.raises(
      ValueError, match=r"names \['tool_use'\] and no 'default'"
  ):
    _load(tmp_path, {"chat_template": named[:1]})
  with pytest.raises(ValueError, match="must be a string or a list"):
    _load(tmp_path, {"chat_template": {"default": "x"}})
  # chat_template.jinja wins over tokenizer_config.json, as in transformers.
  (tmp_path / chat_template.TEMPLATE_FILE).write_text(
      "file {{ messages | length }}"
  )
  template = _load(tmp_path, {"chat_template": "config"})
  assert template.render(user) == "file 1"
  assert template.where == str(tmp_path / chat_template.TEMPLATE_FILE)
