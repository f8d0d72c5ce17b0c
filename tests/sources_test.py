"""Tests of the prompt sources: built-in, JSONL,
TFDS (mock data) and reasoning-gym."""

import json
import logging

import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax.data import builtin_task
from scalerl_jax.data import readers
from scalerl_jax.data import sources


def _config(**data):
  config = scalerl.get_config()
  with config.unlocked():
    for name, value in data.items():
      config.data[name] = value
  return config


def _assert_records(records):
  for record in records:
    assert tuple(record) == readers.RECORD_FIELDS
    assert all(isinstance(v, str) for v in record.values())
    assert isinstance(json.loads(record["metadata"]), dict)
  assert len({r["id"] for r in records}) == len(records)


def test_builtin_source_follows_the_config():
  config = _config(
      builtin_num_train=500, builtin_num_val=50, builtin_difficulty=(2, 4)
  )
  train = sources.load_prompts(config, "train")
  val = sources.load_prompts(config, "val")
  assert (len(train), len(val)) == (500, 50)
  _assert_records(train)
  assert train == builtin_task.builtin_prompts(
      (2, 4), 500, config.seed, "train"
  )
  assert {json.loads(r["metadata"])["level"] for r in val} == {2, 4}
  assert {r["verifier"] for r in train} == {"builtin"}
  with pytest.raises(ValueError, match="split must be one of"):
    sources.load_prompts(config, "test")
  with pytest.raises(
      ValueError, match=r"^data\.source: 'hf' is not one of \('builtin', "
  ):
    sources.load_prompts(_config(source="hf"), "train")


def test_builtin_validation_set_is_the_same_for_every_seed():
  seeds = [_config(builtin_num_train=300, builtin_num_val=40) for _ in range(2)]
  with seeds[1].unlocked():
    seeds[1].seed = 7
  val = [sources.load_prompts(c, "val") for c in seeds]
  train = [sources.load_prompts(c, "train") for c in seeds]
  assert val[0] == val[1]
  assert train[0] != train[1]


_ROWS = [
    # 1 good
    '{"prompt": "1+1?", "answer": "2"}',
    # 2 good
    '{"prompt": "2+2?", "answer": 4, "verifier": "task", "id": "q2"}',
    # 3 bad JSON
    '{"prompt": "3+3?", "answer": "6"',
    # 4 not an object
    '["prompt", "answer"]',
    # 5 no prompt
    '{"answer": "1"}',
    # 6 bool answer
    '{"prompt": "x", "answer": true}',
    # 7 duplicate id
    '{"prompt": "other", "answer": "5", "id": "q2"}',
    # 8 bad UTF-8
    None,
    # 9 blank: ignored
    "   ",
    # 10 empty answer
    '{"prompt": "y", "answer": "  "}',
    # 11 bad verifier
    '{"prompt": "z", "answer": "1", "verifier": 3}',
    # 12 same prompt
    '{"prompt": "1+1?", "answer": "3"}',
    # 13 good, extras
    '{"prompt": "code", "answer": "ok", "tests": ["assert f()"], "n": 1}',
]


def _write_rows(path):
  lines = [b"\xff\xfe{}" if row is None else row.encode() for row in _ROWS]
  path.write_bytes(b"\n".join(lines) + b"\n")
  return path


def test_jsonl_reports_every_malformed_row_with_its_line(tmp_path):
  path = _write_rows(tmp_path / "train.jsonl")
  records, malformed = readers.read_jsonl(str(path))
  assert [r["prompt"] for r in records] == ["1+1?", "2+2?", "code"]
  assert [r["answer"] for r in records] == ["2", "4", "ok"]
  assert [r["verifier"] for r in records] == ["math", "task", "math"]
  assert records[1]["id"] == "q2"
  assert records[0]["id"].startswith("jsonl:")
  assert json.loads(records[2]["metadata"]) == {"tests": ["assert f()"], "n": 1}
  _assert_records(records)
  assert [m.location for m in malformed] == [
      f"{path}:{line}" for line in (3, 4, 5, 6, 7, 8, 10, 11, 12)
  ]
  reasons = [m.reason for m in malformed]
  assert reasons[0].startswith("invalid JSON")
  assert reasons[1] == "expected a JSON object, got list"
  assert "'prompt'" in reasons[2]
  assert "'answer'" in reasons[3]
  assert reasons[4] == "duplicate id 'q2' (first on line 2)"
  assert reasons[5].startswith("invalid UTF-8")
  assert reasons[6] == "field 'answer' is empty"
  assert reasons[7] == "field 'verifier' must be a non-empty string"
  assert reasons[8] == f"duplicate id {records[0]['id']!r} (first on line 1)"


def test_load_prompts_logs_malformed_rows(tmp_path, caplog):
  path = _write_rows(tmp_path / "train.jsonl")
  with caplog.at_level(logging.WARNING):
    records = sources.load_prompts(
        _config(source="jsonl", jsonl_train=str(path)), "train"
    )
  assert len(records) == 3
  assert f"{path}: skipped 9 malformed rows" in caplog.text
  for line in (3, 4, 5, 6, 7, 8, 10, 11, 12):
    assert f"{path}:{line}: " in caplog.text


def test_jsonl_empty_or_missing_is_an_error(tmp_path):
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(
      ValueError, match=r"data\.jsonl_train: .*empty\.jsonl has no usable train"
  ):
    sources.load_prompts(
        _config(source="jsonl", jsonl_train=str(empty)), "train"
    )
  bad = tmp_path / "bad.jsonl"
  bad.write_text("{}\n[]\n")
  with pytest.raises(
      ValueError, match=r"all 2 rows are malformed, first: .*bad\.jsonl:1: "
  ):
    sources.load_prompts(_config(source="jsonl", jsonl_train=str(bad)), "train")
  with pytest.raises(
      FileNotFoundError, match="absent.jsonl: no such JSONL file"
  ):
    sources.load_prompts(
        _config(source="jsonl", jsonl_train=str(tmp_path / "absent.jsonl")),
        "train",
    )
  with pytest.raises(ValueError, match=r"data\.jsonl_val: must be set"):
    sources.load_prompts(_config(source="jsonl", jsonl_train=str(empty)), "val")


def test_tfds_source_on_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets")
  config = _config(
      source="tfds",
      tfds_name="gsm8k",
      tfds_split="train",
      tfds_val_split="test",
      tfds_prompt_field="question",
      tfds_answer_field="answer",
  )
  with tfds.testing.mock_data(num_examples=6):
    train = sources.load_prompts(config, "train")
    val = sources.load_prompts(config, "val")
    expected = tfds.data_source("gsm8k", split="train")
    assert [r["prompt"] for r in train] == [
        expected[i]["question"] for i in range(6)
    ]
    assert [r["answer"] for r in train] == [
        expected[i]["answer"] for i in range(6)
    ]
    with pytest.raises(
        ValueError,
        match=r"data\.tfds_answer_field: 'final' is not a feature "
        r"of gsm8k; features: \['annotation', 'answer', 'question'",
    ):
      sources.load_prompts(
          _config(source="tfds", tfds_name="gsm8k", tfds_answer_field="final"),
          "train",
      )
  _assert_records(train)
  assert [r["id"] for r in val] == [f"tfds:gsm8k:test:{i}" for i in range(6)]
  assert {r["verifier"] for r in train + val} == {"math"}
  with pytest.raises(ValueError, match=r"data\.tfds_name: must be set"):
    sources.load_prompts(_config(source="tfds"), "train")


def test_reasoning_gym_source():
  reasoning_gym = pytest.importorskip("reasoning_gym")
  config = _config(
      source="reasoning_gym",
      reasoning_gym_name="basic_arithmetic",
      reasoning_gym_size=40,
      reasoning_gym_val_size=10,
  )
  train = sources.load_prompts(config, "train")
  val = sources.load_prompts(config, "val")
  _assert_records(train + val)
  assert 0 < len(train) <= 40 and 0 < len(val) <= 10
  assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
  assert train == sources.load_prompts(config, "train")
  score = reasoning_gym.get_score_answer_fn("basic_arithmetic")
  for record in train + val:
    assert record["verifier"] == "reasoning_gym:basic_arithmetic"
    entry = json.loads(record["metadata"])
    assert entry["question"] == record["prompt"]
    assert score(record["answer"], entry) == 1.0
    assert score("no answer", entry) == 0.0
  with pytest.raises(
      ValueError,
      match=r"data\.reasoning_gym_name: cannot create 'no_such_task'",
  ):
    sources.load_prompts(
        _config(source="reasoning_gym", reasoning_gym_name="no_such_task"),
        "train",
    )


def test_gsm8k_rows_through_field_mapping_and_answer_delimiter(tmp_path):
  path = tmp_path / "gsm8k.jsonl"
  path.write_text(
      "\n".join(
          json.dumps(row)
          for row in [
              {
                  "question": "6 bags of 7?",
                  "answer": "6 * 7 = <<6*7=42>>42\n#### 42",
              },
              {
                  "question": "Half of 10?",
                  "answer": "10 / 2 = 5\n#### 5",
                  "source": "gsm8k",
              },
              {"question": "No marker", "answer": "it is 3"},
              {"question": "Empty after marker", "answer": "#### "},
              {"question": "Numeric", "answer": 12},
              {"prompt": "wrong field", "answer": "#### 1"},
          ]
      )
      + "\n"
  )
  config = _config(
      source="jsonl",
      jsonl_train=str(path),
      jsonl_prompt_field="question",
      answer_delimiter="####",
  )
  records = sources.load_prompts(config, "train")
  _assert_records(records)
  assert [(r["prompt"], r["answer"]) for r in records] == [
      ("6 bags of 7?", "42"),
      ("Half of 10?", "5"),
      ("Numeric", "12"),
  ]
  assert [json.loads(r["metadata"]) for r in records] == [
      {},
      {"source": "gsm8k"},
      {},
  ]
  _, malformed = readers.read_jsonl(str(path), "question", "answer", "####")
  assert [(m.location, m.reason) for m in malformed] == [
      (
          f"{path}:3",
          "field 'answer' has no '####' before its final answer "
          "(data.answer_delimiter)",
      ),
      (f"{path}:4", "field 'answer' is empty"),
      (f"{path}:6", "field 'question' is missing or not a non-empty string"),
  ]
  # Without the delimiter the whole worked solution would be
  # the reference answer.
  whole, _ = readers.read_jsonl(str(path), "question")
  assert whole[0]["answer"] == "6 * 7 = <<6*7=42>>42\n#### 42"
  same = _config(jsonl_prompt_field="answer")
  with pytest.raises(
      config_lib.ConfigError, match="data.jsonl_answer_field: 'answer' is also"
  ):
    config_lib.validate(same)
