"""Chat templates of instruct checkpoints, rendered as in transformers.

`ChatTemplate.render` gives the text (and so the ids) of transformers'
`apply_chat_template`; its `strftime_now` reads the clock, as there.
Design: docs/design/data.md.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Mapping, Optional, Sequence

from etils import epath

# data.chat_template: render prompts through the tokenizer's template when it
# ships one (auto), always (on: an error without one), or never (off).
MODES = ("auto", "on", "off")
TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
# Special tokens transformers passes to every template by name (its
# SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

Message = Mapping[str, Any]


def _jinja():
  """jinja2, imported only when a checkpoint ships a template."""
  try:
    import jinja2  # pylint: disable=g-import-not-at-top
    import jinja2.ext  # pylint: disable=g-import-not-at-top
    import jinja2.sandbox  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        "rendering chat templates needs jinja2 (pip install jinja2)"
    ) from None
  return jinja2


def _environment():
  """The Jinja environment of transformers' chat templates."""
  jinja2 = _jinja()

  class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}` block: marks assistant text; renders its body."""

    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return jinja2.nodes.CallBlock(
          self.call_method("_body"), [], [], body
      ).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(
      x, ensure_ascii=False, indent=None, separators=None, sort_keys=False
  ):
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(
        x,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True,
      lstrip_blocks=True,
      extensions=[GenerationBlock, jinja2.ext.loopcontrols],
  )
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
  return env


class ChatTemplate:
  """A checkpoint's chat template with the special-token strings it may print.

  `source` is the Jinja text, `where` its file, `special_tokens` maps those
  `SPECIAL_TOKEN_NAMES` the checkpoint defines to their text.
  """

  def __init__(
      self, source: str, where: str, special_tokens: Mapping[str, str]
  ):
    self.source = source
    self.where = where
    self.special_tokens = dict(special_tokens)
    try:
      self._template = _environment().from_string(source)
    except _jinja().exceptions.TemplateSyntaxError as e:
      raise ValueError(
          f"{where}: chat template does not parse (line {e.lineno}: {e})"
      ) from None

  def render(
      self,
      messages: Sequence[Message],
      add_generation_prompt: bool = True,
      **kwargs: Any,
  ) -> str:
    """`messages` as `apply_chat_template(..., tokenize=False)` writes them.

    `kwargs` (e.g. `enable_thinking`) override same-named special tokens.

    Raises:
      ValueError: the template rejects the messages or fails to render.
    """
    variables = {**self.special_tokens, **kwargs}
    try:
      return self._template.render(
          messages=[dict(m) for m in messages],
          tools=None,
          documents=None,
          add_generation_prompt=add_generation_prompt,
          **variables,
      )
    except _jinja().exceptions.TemplateError as e:
      raise ValueError(f"{self.where}: chat template failed: {e}") from None


def special_token_text(settings: Mapping[str, Any], name: str) -> Optional[str]:
  """Text of special token `name` (a string or AddedToken dict), or None."""
  value = settings.get(name)
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) and value else None


def _template_text(value: Any, where: str) -> Optional[str]:
  """The default template of a tokenizer_config.json `chat_template` value."""
  if value is None:
    return None
  if isinstance(value, str):
    return value
  if isinstance(value, list) and all(
      isinstance(t, dict)
      and isinstance(t.get("name"), str)
      and isinstance(t.get("template"), str)
      for t in value
  ):
    named = {t["name"]: t["template"] for t in value}
    if "default" not in named:
      raise ValueError(
          f"{where}: chat_template names {sorted(named)} and no 'default'"
      )
    return named["default"]
  raise ValueError(
      f"{where}: chat_template must be a string or a list of "
      "{'name', 'template'} objects"
  )


def load(
    directory: epath.PathLike, settings: Mapping[str, Any]
) -> Optional[ChatTemplate]:
  """`directory`'s template (chat_template.jinja, else `settings`), or None.

  Raises:
    ValueError: the template is malformed.
  """
  directory = epath.Path(directory)
  path = directory / TEMPLATE_FILE
  if path.exists():
    source, where = path.read_text(), str(path)
  else:
    where = str(directory / CONFIG_FILE)
    source = _template_text(settings.get("chat_template"), where)
    if source is None:
      return None
  special = {
      name: special_token_text(settings, name) for name in SPECIAL_TOKEN_NAMES
  }
  return ChatTemplate(
      source, where, {k: v for k, v in special.items() if v is not None}
  )
