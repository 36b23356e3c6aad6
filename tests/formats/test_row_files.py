"""Data rows as users have them (eagle3.formats.row_files, eagle3.formats.row_formats): token rows, OpenAI `messages`
and ShareGPT `conversations`, in a JSONL file, a JSON array (streamed; a file cut mid-record keeps its complete
records), a Parquet file and a `datasets` dir; the format detected from the first row and recorded, or set by
data.format; a row of another format, an unknown speaker and a cut file are bad rows with their number; every
assistant turn of a conversation is trained, its end-of-turn token included and the template's default system
prompt left out; and prompts (eval.accept, serve, data=regenerate) are a conversation up to its first answer.

The fast tests use a word-level tokenizer (no model) whose chat template, like SmolLM2's, inserts a default system
prompt when there is no system turn and ends each turn with `<|im_end|>` and a newline (`nl`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eagle3.config import RowFormat
from eagle3.errors import DataError
from eagle3.formats.row_formats import BadSamples, ChatTokenizer, read_rows
from eagle3.verifier.model import Verifier
from factories import chat_tokenizer, verifier_config_dir

WORDS = ["[UNK]", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "default", "nl"] + \
    [f"w{i}" for i in range(60)]
TEMPLATE = ("{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "<|im_start|> system default <|im_end|> nl {% endif %}"
            "<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> nl {% endfor %}"
            "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")

# Two conversations in ShareGPT's form: the second starts with the assistant (ShareGPT splits long ones so).
SHAREGPT = [
    {"id": "a_0", "conversations": [{"from": "human", "value": "w1 w2"}, {"from": "gpt", "value": "w3 w4 w5"},
                                    {"from": "user", "value": "w6"}, {"from": "assistant", "value": "w7"}]},
    {"id": "a_1", "conversations": [{"from": "gpt", "value": "w8 w9"}, {"from": "human", "value": "w10"},
                                    {"from": "gpt", "value": "w11"}]},
    {"id": "b_0", "conversations": [{"from": "system", "value": "w12"}, {"from": "human", "value": "w13"},
                                    {"from": "gpt", "value": "w14 w15"}]},
]
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
MESSAGES = [{"messages": [{"role": ROLES[t["from"]], "content": t["value"]} for t in r["conversations"]]}
            for r in SHAREGPT]
TOKENS = [{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}, {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory) -> Path:
    """A tokenizer dir (no model): word-level, with the chat template above, eos `<|im_end|>`."""
    path = tmp_path_factory.mktemp("chat") / "tokenizer"
    chat_tokenizer(WORDS, TEMPLATE, eos_token="<|im_end|>").save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def chat(chat_dir) -> ChatTokenizer:
    return Verifier(chat_dir).chat_tokenizer()


def words(ids) -> list[str]:
    return [WORDS[t] for t in ids]


def trained(row) -> list[list[str]]:
    """The words of each run of loss mask 1."""
    ids, mask = row
    spans: list[list[str]] = []
    for i, (t, m) in enumerate(zip(ids, mask)):
        if m and (i == 0 or not mask[i - 1]):
            spans.append([])
        if m:
            spans[-1].append(WORDS[t])
    return spans


def write(path: Path, rows: list, kind: str) -> Path:
    """`rows` as a file or dir of `kind`: jsonl (str rows written as they are), json_array, parquet, dataset."""
    if kind == "jsonl":
        path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    elif kind == "json_array":
        path.write_text(json.dumps(rows, indent=2))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        from datasets import Dataset

        Dataset.from_list(rows).save_to_disk(str(path))
    return path


def read(path: Path, chat: ChatTokenizer | None, policy: str = "error", row_format: str = "auto", vocab=len(WORDS)):
    bad = BadSamples(policy)
    return read_rows(path, 10_000, vocab, bad, chat, row_format), bad


@pytest.mark.parametrize("kind", ["jsonl", "json_array", "parquet", "dataset"])
@pytest.mark.parametrize("form, rows", [("tokens", TOKENS), ("messages", MESSAGES), ("sharegpt", SHAREGPT)])
def test_every_file_and_row_format_reads_the_same_rows(kind, form, rows, chat, tmp_path):
    """Each row format in each file format: the rows, and the format detected from the first row, recorded."""
    suffix = {"parquet": ".parquet", "dataset": "", "jsonl": ".jsonl", "json_array": ".json"}[kind]
    got, bad = read(write(tmp_path / f"rows{suffix}", rows, kind), chat)
    expected = [(r["input_ids"], r["loss_mask"]) for r in TOKENS] if form == "tokens" else \
        [chat(m["messages"]) for m in MESSAGES]
    assert list(got) == expected and not bad.skipped
    assert got.record() == {"row_format": form, "row_format_from": f"detected from the first row ({tmp_path}/rows"
                            + suffix + (":1)" if kind == "jsonl" else ": record 1)" if kind == "json_array" else
                                        ": row 1)")}


def test_every_assistant_turn_is_trained_with_its_end_token_and_no_default_system_prompt(chat):
    rows = [chat(m["messages"]) for m in MESSAGES]
    ids = words(rows[0][0])
    # The template's default system prompt is rendered (there is no system turn) and never trained.
    assert ids[:5] == ["<|im_start|>", "system", "default", "<|im_end|>", "nl"]
    assert trained(rows[0]) == [["w3", "w4", "w5", "<|im_end|>"], ["w7", "<|im_end|>"]]
    # A conversation that starts with the assistant: its first turn is trained, the system prompt and header not.
    assert words(rows[1][0])[:8] == ["<|im_start|>", "system", "default", "<|im_end|>", "nl", "<|im_start|>",
                                     "assistant", "w8"]
    assert trained(rows[1]) == [["w8", "w9", "<|im_end|>"], ["w11", "<|im_end|>"]]
    assert words(rows[2][0])[:3] == ["<|im_start|>", "system", "w12"]  # its own system turn: no default one
    assert trained(rows[2]) == [["w14", "w15", "<|im_end|>"]]


@pytest.mark.parametrize("cut", ["inside", "between"])
def test_a_cut_json_array_reads_its_complete_records_and_the_cut_is_a_bad_row(cut, chat, tmp_path):
    text = json.dumps(SHAREGPT, indent=2)
    end = text.index('"id": "b_0"') + 30 if cut == "inside" else text.rindex("}") + 1
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:end])
    says = (r"record 3: the file ends inside this record \(cut short\?\); the 2 complete records before it are read"
            if cut == "inside" else r"record 3: the file ends after this record, without closing the array")
    with pytest.raises(DataError, match="sharegpt.json: " + says):
        read(path, chat)
    rows, bad = read(path, chat, "skip")
    assert len(rows) == (2 if cut == "inside" else 3) and bad.skipped == {"truncated": 1}


def test_a_json_array_larger_than_a_read_is_streamed_record_by_record(chat, tmp_path, monkeypatch):
    """Records cut by the read size, strings included, are decoded whole."""
    import eagle3.formats.row_files as row_files

    monkeypatch.setattr(row_files, "CHUNK", 7)
    rows, bad = read(write(tmp_path / "rows.json", SHAREGPT * 3, "json_array"), chat)
    assert list(rows) == [chat(m["messages"]) for m in MESSAGES] * 3 and not bad.skipped


def test_max_records_reads_only_the_head_of_a_file_bad_records_counted_among_them(chat, tmp_path):
    """data.max_records: a file cut after its first records reads them whole, the cut never reached."""
    text = json.dumps(SHAREGPT, indent=2)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:text.index('"id": "b_0"')])
    bad = BadSamples("error")
    rows = read_rows(path, 10_000, len(WORDS), bad, chat, max_records=2)
    assert list(rows) == [chat(m["messages"]) for m in MESSAGES[:2]] and not bad.skipped
    jsonl = write(tmp_path / "rows.jsonl", ["{not json", *SHAREGPT], "jsonl")
    bad = BadSamples("skip")
    assert list(read_rows(jsonl, 10_000, len(WORDS), bad, chat, max_records=2)) == [chat(MESSAGES[0]["messages"])]
    assert bad.skipped == {"not_json": 1}


@pytest.mark.parametrize("overrides, says", [
    (["data.path=rows.jsonl", "data.max_records=0"], "data.max_records: must be null (every record) or at least 1"),
    ([], "data.max_records: bounds the records read from data.path, and there is no data.path")])
def test_a_max_records_below_one_or_without_a_data_path_is_refused(overrides, says):
    import re

    from omegaconf import OmegaConf

    from eagle3.config import ConfigError, validate
    from factories import compose_cfg

    plain = OmegaConf.to_container(compose_cfg(["data=online", "data.max_records=3", *overrides]), resolve=True,
                                   enum_to_str=True)
    with pytest.raises(ConfigError, match="^" + re.escape(says)):
        validate(plain, dataset_required=False)


def test_max_chars_leaves_out_longer_conversations_untokenized_and_counts_them_not_as_bad_rows(chat, tmp_path):
    """data.max_chars: a selection by length (docs/sharegpt_split.py's <= 4,000 characters), over every turn's text;
    the conversations left out are counted apart from bad rows, so on_bad_sample=error does not stop on them."""
    lengths = [sum(len(t["value"]) for t in r["conversations"]) for r in SHAREGPT]
    assert lengths == [17, 11, 13]
    path = write(tmp_path / "rows.jsonl", SHAREGPT, "jsonl")
    bad = BadSamples("error")
    tokenized = []

    def counting(messages):
        tokenized.append(messages)
        return chat(messages)

    rows = read_rows(path, 10_000, len(WORDS), bad, counting, max_chars=13)
    assert list(rows) == [chat(m["messages"]) for m in MESSAGES[1:]]
    assert tokenized == [m["messages"] for m in MESSAGES[1:]]  # the long one is never rendered
    assert bad.over_max_chars == 1 and not bad.skipped and bad.as_dict()["over_max_chars"] == 1
    assert "over_max_chars" not in BadSamples("error").as_dict()
    with pytest.raises(DataError, match=r"holds no usable rows \(3 conversations longer than data.max_chars=10 "):
        read_rows(path, 10_000, len(WORDS), BadSamples("skip"), chat, max_chars=10)


def test_max_chars_refuses_token_rows_which_have_no_characters(tmp_path):
    path = write(tmp_path / "rows.jsonl", TOKENS, "jsonl")
    with pytest.raises(DataError, match=r"rows.jsonl:1: a token row, and data.max_chars=5 selects conversations by "
                                        r"their characters; token rows have none: drop data.max_chars"):
        read_rows(path, 10_000, len(WORDS), BadSamples("skip"), max_chars=5)


@pytest.mark.parametrize("overrides, says", [
    (["data.path=rows.jsonl", "data.max_chars=0"], "data.max_chars: must be null (every conversation) or at least 1"),
    (["data.max_chars=4000"], "data.max_chars: selects conversations read from data.path, and there is no data.path"),
    (["data.path=rows.jsonl", "data.max_len=1"], "data.max_len: must be null (rows as they are) or at least 2"),
    (["data.max_len=769"], "data.max_len: cuts the rows read from data.path, and there is no data.path")])
def test_a_max_chars_or_max_len_out_of_range_or_without_a_data_path_is_refused(overrides, says):
    from omegaconf import OmegaConf

    from eagle3.config import ConfigError, validate
    from factories import compose_cfg

    plain = OmegaConf.to_container(compose_cfg(["data=online", *overrides]), resolve=True, enum_to_str=True)
    with pytest.raises(ConfigError, match="^" + re.escape(says)):
        validate(plain, dataset_required=False)


def test_an_unknown_role_is_a_bad_row_with_its_number(chat, tmp_path):
    bot = {"id": "c", "conversations": [{"from": "human", "value": "w1"}, {"from": "bot", "value": "w2"}]}
    path = write(tmp_path / "rows.jsonl", [SHAREGPT[0], bot, SHAREGPT[2]], "jsonl")
    # Turns count from 1, as records and lines do: the second turn is turn 2.
    with pytest.raises(DataError, match=r"rows.jsonl:2: turn 2 is from 'bot'; ShareGPT speakers are human, user, "
                                        r"gpt, assistant, system \(on_bad_sample=skip"):
        read(path, chat)
    rows, bad = read(path, chat, "skip")
    assert len(rows) == 2 and bad.skipped == {"unknown_role": 1}
    odd = {"messages": [{"role": "user", "content": "w1"}, {"role": "bot", "content": "w2"}]}
    with pytest.raises(DataError, match=r"rows.jsonl:2: turn 2 has the role 'bot'"):
        read(write(tmp_path / "rows.jsonl", [MESSAGES[0], odd], "jsonl"), chat)


@pytest.mark.parametrize("mask, value, at", [([0, 2, -1, 1], 2, 1), ([-100, -100, 1, 1], -100, 0),
                                            ([0, 1, 1, -1], -1, 3)])
def test_a_loss_mask_value_other_than_0_or_1_is_a_bad_row_with_its_number(mask, value, at, tmp_path):
    """-100 (Hugging Face's ignore label), -1 or 2 became 1 and were trained: [0, 2, -1, 1] read as [0, 1, 1, 1]."""
    path = write(tmp_path / "rows.jsonl", [TOKENS[0], {"input_ids": [5, 6, 7, 8], "loss_mask": mask}, TOKENS[1]],
                 "jsonl")
    with pytest.raises(DataError, match=rf"rows.jsonl:2: loss_mask holds {value} at position {at}; its values are 1 "
                                        r"\(trained\) and 0 \(not trained\) \(on_bad_sample=skip leaves"):
        read(path, None)
    rows, bad = read(path, None, "skip")
    assert list(rows) == [(r["input_ids"], r["loss_mask"]) for r in TOKENS] and bad.skipped == {"bad_loss_mask": 1}


@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_a_syntax_error_inside_a_json_array_is_refused_with_how_much_of_the_file_it_leaves_unread(policy, chunk, chat,
                                                                                                  tmp_path,
                                                                                                  monkeypatch):
    """No record past a syntax error can be found: under on_bad_sample=skip the rest of the file was dropped as
    "1 skipped". Refused under either policy, naming the record, its line and byte, and what follows."""
    import eagle3.formats.row_files as row_files

    monkeypatch.setattr(row_files, "CHUNK", chunk)
    text = json.dumps(SHAREGPT * 4, indent=2)
    error = text.index('"id": "b_0"', text.index('"id": "b_0"') + 1) + len('"id"')  # record 6's first key
    path = tmp_path / "rows.json"
    path.write_text(text[:error] + " " + text[error + 1:])  # its colon gone: the decoder stops at "b_0" after it
    size, line, at = len(text), text[:error].count("\n") + 1, error + 2
    says = (f"rows.json: record 6: not JSON (Expecting ':' delimiter) at line {line}, byte {at:,} of {size:,}. A "
            f"JSON array cannot be read past an error in it, so the {size - at:,} bytes after it "
            f"({(size - at) / size:.0%} of the file) would go unread: refused, whatever the bad-row policy")
    with pytest.raises(DataError, match=re.escape(says)):
        read(path, chat, policy)
    comma = text.index("\n  },", text.index('"id": "a_1"')) + 4  # after record 2
    path.write_text(text[:comma] + ";" + text[comma + 1:])
    with pytest.raises(DataError, match=r"record 3: not JSON \(expected , or \] after record 2, found ';"):
        read(path, chat, policy)


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_bytes_that_are_not_utf8_inside_a_json_array_are_refused_at_their_record(chunk, chat, tmp_path, monkeypatch):
    import eagle3.formats.row_files as row_files

    monkeypatch.setattr(row_files, "CHUNK", chunk)
    data = json.dumps(SHAREGPT * 3, indent=2).encode()
    at = data.index(b"w7", data.index(b"w7") + 1)  # in record 4
    path = tmp_path / "rows.json"
    path.write_bytes(data[:at] + b"\xff" + data[at:])
    with pytest.raises(DataError, match=rf"rows.json: record 4: not UTF-8 text \(invalid start byte\), byte {at:,} "
                                        rf"of {len(data) + 1:,}\. A JSON array cannot be read past"):
        read(path, chat, "skip")


@pytest.mark.parametrize("kind", ["jsonl", "json_array"])
def test_a_utf8_byte_order_mark_at_the_start_of_a_file_is_read_past(kind, chat, tmp_path):
    """Windows tools write one: a JSON array was read as JSONL, and a JSONL file's first row was a bad row."""
    from eagle3.config import rows_path_problem

    path = write(tmp_path / "rows.json", SHAREGPT, kind)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    rows, bad = read(path, chat)
    assert list(rows) == [chat(m["messages"]) for m in MESSAGES] and not bad.skipped
    assert rows_path_problem(path) is None  # the run's check before it starts reads it as rows too


def test_messages_name_prepares_flags_when_read_for_prepare(chat, tmp_path):
    from eagle3.formats.row_formats import PREPARE

    path = write(tmp_path / "rows.jsonl", SHAREGPT, "jsonl")
    with pytest.raises(DataError, match=r"rows.jsonl:1: a sharegpt row among messages rows \(the format was set by "
                                        r"--format\) \(--on-bad-sample skip leaves such rows out"):
        read_rows(path, 10_000, len(WORDS), BadSamples("error", PREPARE), chat, "messages")


def test_a_row_of_another_format_than_the_first_is_a_bad_row(chat, tmp_path):
    path = write(tmp_path / "rows.json", [SHAREGPT[0], MESSAGES[1], TOKENS[0], SHAREGPT[2]], "json_array")
    with pytest.raises(DataError, match=r"rows.json: record 2: a messages row among sharegpt rows \(the format was "
                                        r"detected from the first row \(.*rows.json: record 1\)\)"):
        read(path, chat)
    rows, bad = read(path, chat, "skip")
    assert len(rows) == 2 and bad.skipped == {"other_format": 2} and rows.format == RowFormat.sharegpt


def test_a_format_set_refuses_rows_of_another_and_is_recorded(chat, tmp_path):
    path = write(tmp_path / "rows.jsonl", SHAREGPT, "jsonl")
    with pytest.raises(DataError, match=r"rows.jsonl:1: a sharegpt row among messages rows \(the format was set by "
                                        r"data.format\)"):
        read(path, chat, row_format="messages")
    rows, _ = read(path, chat, row_format="sharegpt")
    assert rows.record() == {"row_format": "sharegpt", "row_format_from": "set"}


def test_a_mistyped_or_pointless_data_format_is_refused_by_name(tmp_path):
    from omegaconf import OmegaConf

    from eagle3.config import ConfigError, validate
    from factories import compose_cfg
    from hydra_plugins.eagle3_basic_sweeper.sweeper import composition_problem

    with pytest.raises(Exception) as e:
        compose_cfg(["data=online", "data.format=sharegtp"])
    allowed = "Invalid value 'sharegtp', expected one of [auto, tokens, messages, sharegpt]"
    assert allowed in composition_problem(e.value)
    plain = OmegaConf.to_container(compose_cfg(["data=online", "data.format=sharegpt"]), resolve=True,
                                   enum_to_str=True)
    with pytest.raises(ConfigError, match=r"^data.format: describes data.path's rows, and there is no data.path"):
        validate(plain, dataset_required=False)


def test_a_datasets_dir_of_token_rows_refuses_a_conversation_format(tmp_path):
    from eagle3.data.token_rows import speculators_rows

    path = write(tmp_path / "ds", [{**r, "seq_len": len(r["input_ids"])} for r in TOKENS], "dataset")
    assert speculators_rows(path) and speculators_rows(path, RowFormat.tokens)
    with pytest.raises(DataError, match=r"holds token rows \(input_ids, loss_mask\), and data.format=sharegpt"):
        speculators_rows(path, RowFormat.sharegpt)
    assert not speculators_rows(write(tmp_path / "chat", SHAREGPT, "dataset"))  # read as a rows file's rows


def test_max_records_max_chars_and_max_len_are_refused_for_a_speculators_dataset_dir_read_whole(tmp_path):
    from eagle3.config import OnlineDataConfig
    from eagle3.data.token_rows import token_rows_dir

    path = write(tmp_path / "ds", [{**r, "seq_len": len(r["input_ids"])} for r in TOKENS], "dataset")
    with pytest.raises(DataError, match=r"^data.max_records: .*ds is a speculators-format dataset dir, whose rows are "
                                        r"read as they are, all of them; drop data.max_records"):
        token_rows_dir(OnlineDataConfig(path=str(path), max_records=1), tmp_path / "verifier", str(tmp_path / "c"))
    with pytest.raises(DataError, match=r"^data.max_chars: .*ds is a speculators-format dataset dir, whose rows are "
                                        r"read as they are, all of them; drop data.max_chars \(it selects"):
        token_rows_dir(OnlineDataConfig(path=str(path), max_chars=9), tmp_path / "verifier", str(tmp_path / "c"))
    with pytest.raises(DataError, match=r"^data.max_len: .*ds is a speculators-format dataset dir, whose rows are "
                                        r"read as they are, all of them; drop data.max_len \(it cuts"):
        token_rows_dir(OnlineDataConfig(path=str(path), max_len=9), tmp_path / "verifier", str(tmp_path / "c"))


def test_max_records_with_a_speculators_dataset_dir_is_refused_before_the_run_dir_is_made(tmp_path):
    """The refusal came after the run dir was made (failure.json, launch.log, resolved_config.yaml left behind)."""
    from commands import launch

    path = write(tmp_path / "ds", [{**r, "seq_len": len(r["input_ids"])} for r in TOKENS], "dataset")
    run_dir = tmp_path / "run"
    proc = launch(["data=online", f"data.path={path}", "data.max_records=1", f"hydra.run.dir={run_dir}"],
                  tmp_path / "cache")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"error: data.max_records: {path} is a speculators-format dataset dir, whose rows are read as they are" \
        in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists() and not (tmp_path / "cache").exists()


def test_a_datasets_dir_of_several_splits_names_the_dir_of_one(chat, tmp_path):
    from datasets import Dataset, DatasetDict

    from eagle3.config import rows_path_problem

    path = tmp_path / "dd"
    DatasetDict({"train": Dataset.from_list(SHAREGPT), "test": Dataset.from_list(SHAREGPT[:1])}).save_to_disk(str(path))
    says = f"holds the splits test, train (a datasets DatasetDict); give one split's dir, e.g. {path / 'test'}"
    assert rows_path_problem(path) == says  # refused by the config's check before a run starts
    with pytest.raises(DataError, match=r"holds the splits test, train \(a DatasetDict\); give one split's dir"):
        read(path, chat)  # and by the reader (prepare --data)
    rows, _ = read(path / "train", chat)
    assert len(rows) == 3 and rows.format == RowFormat.sharegpt


def test_prompts_are_each_conversation_up_to_its_first_answer(chat_dir, chat, tmp_path):
    """eval.accept's and serve's prompts: the first N rows (the file streamed, so a cut end after them is never
    read); data=regenerate's: every assistant turn's prompt."""
    from eagle3.data.regenerate import read_prompts
    from eagle3.eval.prompts import read_prompts_file

    text = json.dumps(SHAREGPT, indent=2)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:text.index('"id": "b_0"')])
    prompts = read_prompts_file(path, chat_dir, limit=2)
    assert [words(p)[5:] for p in prompts] == [["<|im_start|>", "user", "w1", "w2", "<|im_end|>", "nl",
                                               "<|im_start|>", "assistant"],
                                              ["<|im_start|>", "assistant", "w8", "w9", "<|im_end|>", "nl",
                                               "<|im_start|>", "user", "w10", "<|im_end|>", "nl", "<|im_start|>",
                                               "assistant"]]
    assert prompts[1].where == f"prompts: {path}: record 2"
    with pytest.raises(DataError, match=r"prompts: .*sharegpt.json: record 3: the file ends inside this record"):
        read_prompts_file(path, chat_dir)
    regenerated, record = read_prompts(path, chat_dir, len(WORDS), BadSamples("skip"))
    assert len(regenerated) == 4 and record["row_format"] == "sharegpt"
    whole = words(chat(MESSAGES[0]["messages"])[0])
    assert words(regenerated[1]) == whole[:whole.index("w7")]


@pytest.mark.slow
def test_chat_rows_read_into_the_cache_record_their_detected_format(chat_dir, tmp_path):
    """data=online's token rows from a datasets dir of ShareGPT rows: tokenized, saved, the format recorded."""
    import shutil

    from eagle3.config import OnlineDataConfig
    from eagle3.data.token_rows import read_rows_record, token_rows_dir

    verifier = tmp_path / "verifier"
    shutil.copytree(chat_dir, verifier)
    verifier_config_dir(verifier, model_type="llama", vocab_size=len(WORDS))
    data = write(tmp_path / "ds", SHAREGPT, "dataset")
    rows_dir = token_rows_dir(OnlineDataConfig(path=str(data)), verifier, str(tmp_path / "cache"))
    record = read_rows_record(rows_dir)
    assert record is not None and record["row_format"] == "sharegpt" and record["skipped"] == {}
    assert record["row_format_from"] == f"detected from the first row ({data}: row 1)"
    with pytest.raises(DataError, match=r"ds: row 1: a sharegpt row among messages rows"):
        token_rows_dir(OnlineDataConfig(path=str(data), format=RowFormat.messages), verifier, str(tmp_path / "c2"))


def test_max_len_cuts_the_rows_read_into_the_cache_and_counts_them(chat_dir, tmp_path):
    """data.max_len: rows cut as `eagle3 prepare --max-len` cuts them (the reference recipe's total_seq_len + 1),
    counted in the rows' record; another max_len is another cache entry, never the uncut rows."""
    import shutil

    from datasets import load_from_disk

    from eagle3.config import OnlineDataConfig
    from eagle3.data.token_rows import read_rows_record, token_rows_dir

    verifier = tmp_path / "verifier"
    shutil.copytree(chat_dir, verifier)
    verifier_config_dir(verifier, model_type="llama", vocab_size=len(WORDS))
    data = write(tmp_path / "rows.jsonl", SHAREGPT, "jsonl")
    whole = token_rows_dir(OnlineDataConfig(path=str(data)), verifier, str(tmp_path / "cache"))
    lengths = [int(n) for n in load_from_disk(str(whole))["seq_len"]]
    cut_at = sorted(lengths)[len(lengths) // 2]
    cut = token_rows_dir(OnlineDataConfig(path=str(data), max_len=cut_at), verifier, str(tmp_path / "cache"))
    assert cut != whole
    rows = load_from_disk(str(cut))
    assert [int(n) for n in rows["seq_len"]] == [min(n, cut_at) for n in lengths]
    assert [list(map(int, r)) for r in rows["input_ids"]] == [
        list(map(int, r))[:cut_at] for r in load_from_disk(str(whole))["input_ids"]]
    record = read_rows_record(cut)
    assert record is not None and record["truncated"] == sum(n > cut_at for n in lengths) > 0


@pytest.mark.slow
def test_real_sharegpt_trains_only_smollm2s_assistant_tokens(sharegpt_file, smollm2_dir, tmp_path):
    """The first 20 records of ShareGPT V3 with SmolLM2's chat template (tokenizer only): every masked span decodes
    to exactly one assistant turn's text and its `<|im_end|>`; SmolLM2's default system prompt is rendered where
    there is no system turn and never trained."""
    import itertools

    from eagle3.formats.row_files import records
    from eagle3.formats.row_formats import conversation

    head = list(itertools.islice(records(sharegpt_file), 20))
    path = write(tmp_path / "head.json", [item for _, item in head], "json_array")
    chat = Verifier(smollm2_dir).chat_tokenizer()
    rows, bad = read(path, chat, policy="skip", vocab=49152)
    assert rows.format == RowFormat.sharegpt and bad.skipped == {} and len(rows) == 20
    decode = chat.tokenizer.decode
    for (_, item), (ids, mask) in zip(head, rows):
        turns = conversation(item, RowFormat.sharegpt)
        spans, start = [], None
        for i, m in enumerate([*mask, 0]):
            if m and start is None:
                start = i
            elif not m and start is not None:
                spans.append(decode(ids[start:i]))
                start = None
        assert spans == [t["content"] + "<|im_end|>" for t in turns if t["role"] == "assistant"]
        text = decode(ids)
        default = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"
        assert text.startswith(default) == (turns[0]["role"] != "system")
