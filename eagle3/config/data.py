"""The data part's schemas: what every data source's options have (DataConfig) and one schema per source, named by
`data.name` in DATA_SCHEMAS, each with its own fields and checks; and the look at a rows file's first bytes (or a
dataset dir's marks) that those checks make, before any rank reads a row. What a source does (its rows, its
hidden states, its plan terms) is eagle3/data/sources/."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import ClassVar

from omegaconf import MISSING

from eagle3.config.checks import path_kind, require, require_dir, require_temperature
from eagle3.errors import ConfigError


class BadSamplePolicy(str, Enum):
    error = "error"
    skip = "skip"


class RowFormat(str, Enum):
    """What a data file's rows hold (eagle3/formats/row_formats.py reads each): `auto` takes the first row's format."""

    auto = "auto"
    tokens = "tokens"       # {"input_ids": [...], "loss_mask": [...]} (speculators' rows)
    messages = "messages"   # {"messages": [{"role", "content"}, ...]} (OpenAI's chat format)
    sharegpt = "sharegpt"   # {"conversations": [{"from", "value"}, ...]} (ShareGPT's)


@dataclass
class SynthConfig:
    """Sequences sampled from the verifier itself (like regenerated responses): a random prompt masked out of the
    loss, then a sampled response."""

    num_samples: int = 512          # sequences
    prompt_len: int = 16            # tokens of random prompt, excluded from the loss
    response_len: int = 112         # tokens sampled from the verifier, trained on
    temperature: float = 1.0        # sampling temperature of the responses
    batch_size: int = 64            # sequences per verifier forward while sampling
    seed: int = 0

    def check(self) -> None:
        for key in ("num_samples", "prompt_len", "response_len", "batch_size"):
            value = getattr(self, key)
            require(value >= 1, f"data.synth.{key}", f"must be >= 1, got {value}")
        require_temperature("data.synth.temperature", self.temperature, greedy=False)  # responses are sampled


class HiddenStatesDtype(str, Enum):
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


MIN_SEQ_LEN = 2  # data.total_seq_len: one input token and its next token, the shortest pair training shifts


def check_total_seq_len(value: int) -> None:
    """data.total_seq_len's range (DataConfig.check; eagle3 check --total-seq-len)."""
    require(value >= MIN_SEQ_LEN, "data.total_seq_len",
            f"must be at least {MIN_SEQ_LEN}, got {value}: a packed micro-batch must hold one token and the next one "
            f"it predicts (training shifts each row by one)")


@dataclass
class DataConfig:
    """What every data source's options have. `name` selects the source: one schema per source (below, named in
    DATA_SCHEMAS as INIT_SCHEMAS names the initializers'), with its own fields and checks; what the launcher, the
    ranks and the plan ask of a source is its behaviour, eagle3/data/sources/ (a `Source` looked up by name)."""

    name: str = MISSING
    # tokens packed into one batch (per rank). On SmolLM2 at ~55k tokens, 1,024-token steps reached accept_len 1.16
    # where 3,072-token ones reached 1.04-1.09: more updates for the same tokens (docs/learning_curve.md)
    total_seq_len: int = 1024
    train_ratio: float = 0.9        # the first share of the rows trains, the rest validates
    # The dtype hidden states are stored in (offline files) or rounded to (computed in the loop, as files store them)
    hidden_states_dtype: HiddenStatesDtype = HiddenStatesDtype.bfloat16
    # A row that cannot be used (no usable hidden states, tokens or loss mask; ids outside the vocabulary; longer
    # than the verifier's positions): error (stop before training, listing them) | skip (leave it out, counted in
    # data_check.json). NaN/inf hidden states met in a val pass: error (stop the run) | skip (leave the row out of
    # val, counted as skipped_rows in the val row).
    on_bad_sample: BadSamplePolicy = BadSamplePolicy.error

    # Materializing the source writes into cache_dir (the launcher checks it is writable first).
    writes_cache: ClassVar[bool] = True

    def check(self, dataset_required: bool = True) -> None:
        """The source's own rules (those that involve other parts of the run config are TrainConfig.check's).
        `dataset_required=False` (plan=true, which reads no data): a dataset path need only name a directory, so a
        run can be planned before its dataset is prepared into it."""
        require(0 < self.train_ratio < 1, "data.train_ratio", f"must be in (0, 1), got {self.train_ratio}")
        check_total_seq_len(self.total_seq_len)

    def verifier_in_rank(self) -> str | None:
        """"full" (every rank holds a copy) or "sharded" (across the ranks) when the ranks hold the verifier and
        compute the hidden states in the loop; None when the hidden states come from files."""
        return None


@dataclass
class HiddenStateFiles(DataConfig):
    """Rows whose hidden states are files (hidden_states/hs_<i>.safetensors), read ahead by the reader thread."""

    # Micro-batches the reader thread reads ahead (each holds one buffer of (total_seq_len + 1) x (aux layers + 1)
    # x hidden values)
    prefetch: int = 2

    def check(self, dataset_required: bool = True) -> None:
        super().check(dataset_required)
        require(self.prefetch >= 0, "data.prefetch", f"must be >= 0, got {self.prefetch}")


@dataclass
class OfflineDataConfig(HiddenStateFiles):
    name: str = "offline"
    # Required: eagle3 train data=offline data.path=/data/my_dataset; <path>/data-*.arrow (input_ids,
    # loss_mask, seq_len), <path>/hidden_states/hs_<i>.safetensors, token_freq.pt
    path: str = MISSING

    writes_cache: ClassVar[bool] = False

    def check(self, dataset_required: bool = True) -> None:
        super().check(dataset_required)
        require_dir(self.path, "data.path", ["hidden_states"] if dataset_required else [],
                    "a speculators-format dataset: Arrow rows (input_ids, loss_mask, seq_len) saved with "
                    "datasets.save_to_disk, hidden_states/hs_<i>.safetensors and token_freq.pt")


@dataclass
class TokenRows(DataConfig):
    """Token rows whose hidden states the verifier, held by every rank, computes in the loop."""

    # true: shard the verifier across the job's ranks (FSDP2, forward only), for one that does not fit a device;
    # false: a full copy per rank (bf16 on CUDA, fp32 on CPU)
    shard_verifier: bool = False
    # What data.path's rows hold: auto (the first row's format, recorded with the rows) | tokens ({"input_ids",
    # "loss_mask"}) | messages ({"messages": [{"role", "content"}]}) | sharegpt ({"conversations": [{"from",
    # "value"}]}); a row of another format is a bad row
    format: RowFormat = RowFormat.auto
    # Only the first records of data.path are read (bad ones counted among them), the rest of the file never is:
    # the head of a large file such as ShareGPT's 125 MB JSON array. null: every record
    max_records: int | None = None
    # Conversations (messages, ShareGPT rows) whose turns hold more than this many characters in all are left out
    # before they are tokenized, counted in the rows' record (over_max_chars) and the log: a selection by length,
    # such as docs/sharegpt_split.py's (<= 4,000). null: every conversation. Token rows have no characters: refused
    max_chars: int | None = None
    # Tokens a row keeps (a regenerated row: its prompt and response): a longer row is cut, counted in the rows'
    # record as truncated, as `eagle3 prepare --max-len` cuts them; data.total_seq_len + 1 lets a step hold each
    # row whole, where the trainer would cut a longer one itself and refuse data with more than 10% of such rows.
    # A prompt to regenerate that is max_len tokens or longer is a bad sample (data.on_bad_sample), never answered.
    # null: every row as it is
    max_len: int | None = None
    # Disk (GB, 1e9 bytes) for the train rows' hidden states of the first epoch, read back by the later epochs
    # instead of running the verifier again (in the run dir, removed when the run ends; rows beyond it are computed
    # at every epoch). 0: off, every epoch runs the verifier over every row, nothing is written (a run with one
    # epoch gains nothing from it)
    cache_gb: float = 0.0

    def check(self, dataset_required: bool = True) -> None:
        super().check(dataset_required)
        require(self.max_records is None or 1 <= self.max_records < 2**63, "data.max_records",
                f"must be null (every record) or at least 1 and below 2**63, got {self.max_records}")
        require(self.max_chars is None or self.max_chars >= 1, "data.max_chars",
                f"must be null (every conversation) or at least 1, got {self.max_chars}")
        require(self.max_len is None or self.max_len >= MIN_SEQ_LEN, "data.max_len",
                f"must be null (rows as they are) or at least {MIN_SEQ_LEN}, got {self.max_len}")
        require(math.isfinite(self.cache_gb) and self.cache_gb >= 0, "data.cache_gb",
                f"must be >= 0 (0: off) and finite, got {self.cache_gb}")
        require(not (self.shard_verifier and self.cache_gb > 0), "data.cache_gb",
                "keeps hidden states a rank computed alone, and data.shard_verifier=true makes each forward a "
                "collective every rank must join at every micro-batch: drop data.cache_gb, or the sharding")

    def verifier_in_rank(self) -> str | None:
        return "sharded" if self.shard_verifier else "full"


@dataclass
class OnlineDataConfig(TokenRows):
    """Rows from data.path, or without one sampled from the verifier as data.synth says (the tiny default's: the
    same rows data=tiny trains on; cached under cache_dir, keyed by their content)."""

    name: str = "online"
    # Token rows: {"input_ids", "loss_mask"} rows, or conversations ({"messages"}, ShareGPT's {"conversations"};
    # rendered with the verifier's chat template, every assistant turn trained) in a JSONL file, a JSON array, a
    # Parquet file or a datasets dir (save_to_disk); a speculators-format dataset dir's Arrow rows are read as they
    # are (hidden states are not read). null: rows sampled as data.synth says
    path: str | None = None
    synth: SynthConfig = field(default_factory=SynthConfig)   # only without data.path

    def check(self, dataset_required: bool = True) -> None:
        super().check(dataset_required)
        self.synth.check()
        if self.path is None:
            require(self.format == RowFormat.auto, "data.format",
                    f"describes data.path's rows, and there is no data.path (rows are sampled from the verifier): "
                    f"drop data.format={self.format.value}, or give data.path")
            require(self.max_records is None, "data.max_records",
                    "bounds the records read from data.path, and there is no data.path (rows are sampled from the "
                    "verifier; data.synth.num_samples says how many): drop data.max_records, or give data.path")
            require(self.max_chars is None, "data.max_chars",
                    "selects conversations read from data.path, and there is no data.path (rows are sampled from "
                    "the verifier): drop data.max_chars, or give data.path")
            require(self.max_len is None, "data.max_len",
                    "cuts the rows read from data.path, and there is no data.path (rows are sampled from the "
                    "verifier, data.synth.prompt_len + response_len tokens each): drop data.max_len, or give data.path")
            return
        changed = [f"data.synth.{k}" for k, v in vars(self.synth).items() if v != getattr(SynthConfig(), k)]
        require(not changed, changed[0] if changed else "data.synth",
                f"describes the rows data=online samples without a data.path, and data.path={self.path} gives the "
                f"rows: drop the data.synth override, or data.path to sample rows")
        if dataset_required:
            self._check_path(Path(self.path))

    def _check_path(self, p: Path) -> None:
        # Under on_bad_sample=skip a bad first line is a counted skip like any other, not a wrong file.
        problem = rows_path_problem(p, first_line=self.on_bad_sample == BadSamplePolicy.error)
        require(problem is None, "data.path",
                f"{self.path} {problem}; data=online reads token rows: {ROWS_FILES} (a speculators-format dataset "
                f"dir's Arrow rows are read as they are; its hidden states are not read)")


class RegenerationEngine(str, Enum):
    auto = "auto"                   # vllm when its engine environment is there, else transformers (the log says which)
    transformers = "transformers"   # the verifier in this process: transformers' batched, KV-cached generate
    vllm = "vllm"                   # the verifier served by vLLM (eagle3 serve --install builds its venv)


@dataclass
class Regeneration:
    """How the responses are regenerated (the settings the cached rows are keyed by)."""

    temperature: float = 0.0     # 0: greedy; above: sampled at this temperature from the full distribution
    max_new_tokens: int = 256    # tokens per response at most (fewer where the verifier's positions end)
    seed: int = 0                # with the prompt's index, seeds each prompt's draws (temperature > 0)
    batch_size: int = 16         # prompts per batched generation, and per chunk saved (a stopped run resumes there)
    engine: RegenerationEngine = RegenerationEngine.auto

    def check(self) -> None:
        for key in ("max_new_tokens", "batch_size"):
            value = getattr(self, key)
            require(value >= 1, f"data.regenerate.{key}", f"must be >= 1, got {value}")
        require_temperature("data.regenerate.temperature", self.temperature)


@dataclass
class RegenerateDataConfig(TokenRows):
    """Rows = each prompt of data.path (prompt ids, out of the loss) + the verifier's response (trained on)."""

    name: str = "regenerate"
    # The prompt set, in any file data=online reads: conversations ({"messages"}, ShareGPT's {"conversations"};
    # rendered with the verifier's chat template; every assistant turn, and a last user turn, is a response to
    # regenerate) or {"input_ids", "loss_mask"} rows (every span of loss mask 1 is a response to regenerate; the
    # tokens before it are its prompt)
    path: str = MISSING
    regenerate: Regeneration = field(default_factory=Regeneration)

    def check(self, dataset_required: bool = True) -> None:
        super().check(dataset_required)
        self.regenerate.check()
        if dataset_required:
            problem = rows_path_problem(Path(self.path), self.on_bad_sample == BadSamplePolicy.error)
            require(problem is None, "data.path", f"{self.path} {problem}; data=regenerate reads a prompt set: "
                                                 f"{ROWS_FILES}")


@dataclass
class TinyDataConfig(HiddenStateFiles):
    name: str = "tiny"
    synth: SynthConfig = field(default_factory=SynthConfig)

    def check(self, dataset_required: bool = True) -> None:
        super().check(dataset_required)
        self.synth.check()


# The data sources' schemas by `data.name`; eagle3.data.sources.registry adds a new source's (add_data_schema).
DATA_SCHEMAS: dict[str, type[DataConfig]] = {
    "offline": OfflineDataConfig, "online": OnlineDataConfig, "regenerate": RegenerateDataConfig,
    "tiny": TinyDataConfig,
}


def data_schema(name: object) -> type[DataConfig]:
    """The schema of the data source `name`; one ConfigError naming the known ones for another."""
    if not isinstance(name, str) or name not in DATA_SCHEMAS:
        raise ConfigError(f"data.name: {name!r} is no data source; known: {', '.join(sorted(DATA_SCHEMAS))}")
    return DATA_SCHEMAS[name]


ROWS_FILES = ("a JSONL file or JSON array of {\"input_ids\", \"loss_mask\"}, {\"messages\"} or ShareGPT "
              "{\"conversations\"} rows, a Parquet file or a datasets dir (save_to_disk) of such rows")


def rows_path_problem(p: Path, first_line: bool = True) -> str | None:
    """Why `p` holds no data rows (eagle3.formats.row_files reads them), said after its name, judged by its first bytes
    (a binary file, an empty one, and with `first_line` text that opens neither a JSON object nor an array) or,
    for a Parquet file or a `datasets` dir, by their marks (PAR1 at both ends; *.arrow files); None when it looks
    like rows. The rows themselves are checked one by one when they are read."""
    import codecs

    if p.is_dir():
        if (p / "dataset_dict.json").is_file():  # a DatasetDict: one dir per split
            splits = sorted(d.name for d in p.iterdir() if d.is_dir())
            return (f"holds the splits {', '.join(splits)} (a datasets DatasetDict); give one split's dir, e.g. "
                    f"{p / (splits or ['train'])[0]}")
        return None if any(p.glob("*.arrow")) else "is a dir without Arrow rows (no *.arrow file)"
    if not p.is_file():
        return path_kind(p, "a regular file or a dataset dir")
    with open(p, "rb") as f:
        head = f.read(4096)
        if p.suffix.lower() == ".parquet":
            f.seek(max(0, p.stat().st_size - 4))
            ok = head[:4] == b"PAR1" and f.read(4) == b"PAR1" and len(head) > 8
            return None if ok else "is not a Parquet file (no PAR1 mark at its start and end)"
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head)  # a character cut at 4096 bytes is no error
    except UnicodeDecodeError:
        return "is not a JSONL file or JSON array (not UTF-8 text: a binary file? Parquet files end in .parquet)"
    text = text.removeprefix("\ufeff").lstrip()  # a byte order mark, as Windows tools write one, is read past
    if not text:
        return "is empty" if not head or len(head) < 4096 else "starts with 4096 bytes of whitespace"
    if first_line and not text.startswith(("{", "[")):
        return (f"is not a JSONL file or JSON array (its first line opens neither a JSON object nor an array: "
                f"{text.splitlines()[0][:40]!r})")
    return None
