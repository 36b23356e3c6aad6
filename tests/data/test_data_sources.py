"""Data sources as a registry (eagle3/data/sources/): each source's schema holds its rules, so the launcher, the
sweepers' check of every job and plan=true refuse the same configs; and a new source is one module-sized class and
one option file, trained on end to end."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from commands import launch
from eagle3.config import TokenRows, validate
from eagle3.data.sources import SOURCES, registered, source_of
from eagle3.data.sources.online import TokenRowsSource
from eagle3.errors import ConfigError
from factories import CONF, compose_cfg, read_rows
from hydra_plugins.eagle3_basic_sweeper.sweeper import job_config_problem


def typed(overrides: list[str], dataset_required: bool = True):
    plain = OmegaConf.to_container(compose_cfg(overrides), resolve=True, enum_to_str=True)
    return validate({str(k): v for k, v in plain.items()}, dataset_required)


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        typed(overrides)
    return str(e.value)


@pytest.fixture
def rows_jsonl(tmp_path) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]}) + "\n"
                            for _ in range(4)))
    return rows


def test_a_synth_override_beside_online_rows_fails_every_jobs_check(rows_jsonl):
    """The sweeper's check of a job is the run's: a data.synth value with data=online's own rows describes rows
    nobody samples, and is refused there (before: only the launcher refused it, each job after the check)."""
    online = ["data=online", f"data.path={rows_jsonl}"]
    for num_samples in (64, 128):
        problem = job_config_problem(compose_cfg([*online, f"data.synth.num_samples={num_samples}"],
                                                 return_hydra_config=True))
        assert problem is not None and problem.startswith("data.synth.num_samples: describes the rows data=online "
                                                          "samples without a data.path"), problem
    assert job_config_problem(compose_cfg(online, return_hydra_config=True)) is None  # the default synth: no value


@pytest.mark.slow
def test_a_sweep_with_such_a_job_starts_no_job(rows_jsonl, tmp_path):
    sweep = tmp_path / "sweep"
    proc = launch(["-m", "data=online", f"data.path={rows_jsonl}", "data.synth.num_samples=64,128",
                   f"hydra.sweep.dir={sweep}"], tmp_path / "cache")
    assert proc.returncode != 0
    assert "error: 2 of 2 sweep jobs have an invalid config; no job was started" in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("data.synth.num_samples: describes the rows") == 2
    assert "Traceback" not in proc.stderr
    assert not sweep.exists() or not any(p.is_dir() for p in sweep.iterdir())  # no job's run dir


@pytest.mark.parametrize(("overrides", "message"), [
    (["data=online", "data.shard_verifier=true", "eval.accept.enabled=true"],
     "eval.accept.enabled: measures on rank 0 with the whole verifier, and data.shard_verifier=true shards it"),
    (["data=online", "data.synth.temperature=0"], "data.synth.temperature: must be > 0"),
    (["data=online", "data.cache_gb=-1"], "data.cache_gb: must be >= 0 (0: off) and finite, got -1.0"),
    (["data=online", "data.cache_gb=nan"], "data.cache_gb: must be >= 0 (0: off) and finite, got nan"),
    (["data=online", "data.cache_gb=1", "data.shard_verifier=true"],
     "data.cache_gb: keeps hidden states a rank computed alone, and data.shard_verifier=true makes each forward"),
    (["data.synth.num_samples=0"], "data.synth.num_samples: must be >= 1, got 0"),
    (["data.prefetch=-1"], "data.prefetch: must be >= 0, got -1"),
    (["data.train_ratio=1.0"], "data.train_ratio: must be in (0, 1)"),
    (["data=offline", "data.path=/nonexistent/dataset"], "data.path: /nonexistent/dataset does not exist"),
])
def test_each_sources_rules_are_its_schemas(overrides, message):
    assert message in refusal(overrides)


def test_online_rows_that_are_not_jsonl_are_refused_and_plan_true_waits_for_a_dataset_dir(tmp_path):
    binary = tmp_path / "rows.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    assert "data.path: " + str(binary) + " is not a JSONL file" in refusal(["data=online", f"data.path={binary}"])
    empty_dir = tmp_path / "to-come"
    empty_dir.mkdir()
    assert typed(["data=offline", f"data.path={empty_dir}"], dataset_required=False).data.path == str(empty_dir)
    assert "has no hidden_states" in refusal(["data=offline", f"data.path={empty_dir}"])


@pytest.mark.parametrize("overrides", [
    ["data=tiny", "data.shard_verifier=true"],      # online's knob
    ["data=offline", "data.synth.num_samples=8"],   # offline samples nothing
    ["data=online", "data.prefetch=4"],             # online reads no files ahead
    ["data=tiny", "data.cache_gb=1"],               # offline data has its hidden states on disk already
    ["data=online", "data.online.enabled=true"],    # the flag that was the option's name in disguise
    ["data.hidden_states_dtype=bf16"],              # an Enum: a typo is no dtype
])
def test_a_key_another_source_has_fails_at_composition(overrides):
    with pytest.raises(ConfigCompositionException):
        compose_cfg(overrides)


def test_each_source_is_typed_by_its_name_and_an_unknown_name_is_one_message():
    from eagle3.config import OfflineDataConfig, OnlineDataConfig, TinyDataConfig

    assert type(typed([]).data) is TinyDataConfig and typed([]).data.verifier_in_rank() is None
    online = typed(["data=online", "data.shard_verifier=true"]).data
    assert type(online) is OnlineDataConfig and online.verifier_in_rank() == "sharded"
    assert type(typed(["data=offline", "data.path=/tmp"], dataset_required=False).data) is OfflineDataConfig
    plain = OmegaConf.to_container(compose_cfg([]), resolve=True, enum_to_str=True)
    plain["data"]["name"] = "regenerated"  # e.g. a run dir's resolved config from a checkout with that source
    with pytest.raises(ConfigError, match=r"data.name: 'regenerated' is no data source; known: .*offline, online"):
        validate(plain)


# A new source: rows of a fixed pattern (token i of row r is (r + i) % period + 1), whose hidden states the
# verifier computes in the loop, as data=online's; its option file sets one field.
PATTERN_YAML = "defaults:\n  - base_pattern\n\nperiod: 5\n"


@dataclass
class PatternRows(TokenRows):
    name: str = "pattern"
    num_rows: int = 48
    row_len: int = 40
    period: int = 7


class PatternSource(TokenRowsSource):
    def token_rows(self, cfg, verifier_dir):
        from eagle3.data.token_rows import save_rows
        from eagle3.formats.cache import build_once

        d = self.data
        rows = [([(r + i) % d.period + 1 for i in range(d.row_len)], [0] + [1] * (d.row_len - 1))
                for r in range(d.num_rows)]
        return build_once(Path(cfg.cache_dir) / "datasets" / f"pattern-{d.num_rows}-{d.row_len}-{d.period}",
                          lambda out: save_rows(rows, out), what="pattern rows")


@pytest.fixture
def pattern_source():
    """The pattern source registered for one test (eagle3.data.sources.registered): no other test sees it."""
    with registered(PatternRows, PatternSource) as source:
        yield source


def test_a_source_registered_for_a_block_is_gone_after_it_with_its_schema():
    from hydra.core.config_store import ConfigStore

    from eagle3.config import data_schema

    def stored() -> bool:
        return "base_pattern.yaml" in ConfigStore.instance().repo.get("data", {})

    before = dict(SOURCES)
    with registered(PatternRows, PatternSource):
        assert SOURCES["pattern"] is PatternSource and data_schema("pattern") is PatternRows and stored()
        assert type(source_of(PatternRows())) is PatternSource
    assert SOURCES == before and not stored()
    with pytest.raises(ConfigError, match="'pattern' is no data source"):
        data_schema("pattern")


@pytest.mark.slow
def test_a_source_registered_in_a_few_lines_trains_the_tiny_draft(pattern_source, tmp_path, monkeypatch):
    import hydra

    from eagle3.config import register_configs
    from eagle3.formats.arrow_rows import ArrowRows
    from eagle3.run.launch import launch as launch_job

    register_configs()
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "pattern.yaml").write_text(PATTERN_YAML)
    run_dir = tmp_path / "run"
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(sys, "argv", ["launch.py", "data=pattern", f"hydra.searchpath=[file://{conf}]",
                                      f"hydra.run.dir={run_dir}", "data.total_seq_len=256", "logger.mode=disabled"])
    hydra.main(version_base="1.3", config_path=str(CONF), config_name="train")(launch_job)()

    rows = read_rows(run_dir)
    assert [r for r in rows if r.get("split") == "train"] and [r for r in rows if r.get("split") == "val"]
    check = json.loads((run_dir / "data_check.json").read_text())
    assert Path(check["data_dir"]).name == "pattern-48-40-5" and check["rows"] == 48 and check["bad"] == 0
    first = ArrowRows(check["data_dir"])
    assert len(first) == 48 and first.seq_len.tolist() == [40] * 48
    resolved = OmegaConf.load(run_dir / "resolved_config.yaml")
    assert resolved.data.name == "pattern" and resolved.data.period == 5
