"""The documentation cannot rot silently: every command it shows composes and passes the run's checks, every error
example it shows is refused with the message it shows, every verb it names answers --help (the older
`python -m` paths: tests/test_cli.py), every link
resolves.

Commands are taken from the fenced code blocks of README.md and docs/*.md. `eagle3 train ...` (or `eagle3 plan ...`,
train with plan=true) in a bash (or unlabelled) block is composed in process with Hydra's compose API and put
through the checks a sweep applies to each job before the first starts (`job_config_problem`: the typed config, its
range checks, the device checks); a multirun (`-m`) command is composed once per sweep cell (an interval's two
ends). `$ eagle3 train ...` in a console block is an error example: it must be refused, with the first line shown
after it. Every other `eagle3 VERB` they run must be a verb that answers --help. Paths that are
placeholders (`/data/ds`, `/models/verifier`, ...) are replaced by this test's own tiny files; a path not in
PLACEHOLDERS stays as written, so a new placeholder fails here until it is added.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep

from factories import ROOT, compose_cfg, verifier_config_dir
from hydra_plugins.eagle3_basic_sweeper.sweeper import job_config_problem

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Documented placeholder -> the kind of tiny input that stands in for it.
PLACEHOLDERS = {
    "/models/verifier": "verifier", "/models/big": "verifier", "/models/Kimi-K2.5": "verifier",
    "/models/Llama-3.1-8B-Instruct": "verifier",
    "/data/ds": "dataset", "/data/k25": "dataset", "/data/k25_hs": "dataset",
    "rows.jsonl": "rows", "/ckpt/drafter": "drafter",
}
CI_COMMANDS = ["pip install -e . && eagle3 train", "pip install -e '.[test]' && python -m pytest -q"]
TRAIN = ("eagle3 train", "eagle3 plan")  # the verbs whose words are Hydra overrides
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block of a page."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text())]


def command_lines(body: str) -> list[str]:
    """The block's lines with backslash continuations joined."""
    return body.replace("\\\n", " ").splitlines()


def documented(prefix: str | tuple[str, ...], console: bool) -> list[tuple[str, str]]:
    """(page name, command) for every command starting with `prefix` (`eagle3 train` ...) of the pages' bash blocks, or
    with `console` the error examples (`$ eagle3 train ...`) of their console blocks."""
    found = []
    for page in PAGES:
        for lang, body in blocks(page):
            if (lang == "console") != console:
                continue
            for line in command_lines(body):
                line = line.strip()
                if console:
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                if line.startswith(prefix):
                    found.append((page.relative_to(ROOT).as_posix(), line))
    return found


LAUNCH = documented(TRAIN, console=False)
ERRORS = documented(TRAIN, console=True)


def shown_error(command: str) -> str:
    """The first line a console block shows after the command, without the `error: ` prefix and a trailing `...`."""
    for page in PAGES:
        for lang, body in blocks(page):
            lines = body.splitlines()
            if lang == "console" and f"$ {command}" in lines:
                shown = lines[lines.index(f"$ {command}") + 1]
                return shown.removeprefix("error: ").removesuffix("...").strip()
    raise AssertionError(command)


@pytest.fixture(scope="session")  # not module: a few small files, so the commands need not share one worker
def inputs(tmp_path_factory) -> dict[str, str]:
    """Tiny stand-ins for the placeholders: a verifier dir (a config.json deep enough for every preset's aux layer
    ids), a dataset dir (Arrow rows and hidden states, for offline and online), a JSONL of rows, a drafter dir
    (a config.json: a new run's init.path is looked at before it starts), and a cache dir holding the drafters
    the presets name there."""
    root = tmp_path_factory.mktemp("docs_inputs")
    verifier, dataset, drafter = root / "verifier", root / "dataset", root / "drafter"
    verifier_config_dir(verifier, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=152064,
                        num_hidden_layers=61, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6)
    (dataset / "hidden_states").mkdir(parents=True)
    (dataset / "data-00000-of-00001.arrow").write_bytes(b"")
    cache = root / "cache"
    # the drafters init=aq_medai_k2 and experiment=k2_to_k25/finetune read (the study's export step writes the second)
    for checkpoint in (drafter, cache / "drafters" / "Kimi-K2-Instruct-eagle3", cache / "drafters" / "tiny-k2-eagle3"):
        checkpoint.mkdir(parents=True)
        (checkpoint / "config.json").write_text("{}")
    rows = root / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) + "\n")
    # the reference verifier and data experiment=smollm2_sharegpt reads (python -m eagle3.reference --install)
    reference = cache / "reference"
    shutil.copytree(verifier, reference / "SmolLM2-135M-Instruct")
    (reference / "sharegpt").mkdir()
    shutil.copy(rows, reference / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json")
    return {"verifier": str(verifier), "dataset": str(dataset), "rows": str(rows), "drafter": str(drafter),
            "cache": str(cache)}


def launch_args(command: str, inputs: dict[str, str]) -> tuple[list[str], bool]:
    """(overrides with placeholders replaced, multirun) of an `eagle3 train ...` or `eagle3 plan ...` command."""
    verb, *words = shlex.split(command, comments=True)[1:]
    words = ["plan=true", *words] if verb == "plan" else words
    multirun = bool({"-m", "--multirun"} & set(words))
    flags = {"-m", "--multirun", "--cfg", "job", "--resolve", "--help", "-h"}
    overrides = []
    for word in words:
        if word in flags:
            continue
        key, sep, value = word.partition("=")
        overrides.append(f"{key}={inputs[PLACEHOLDERS[value]]}" if sep and value in PLACEHOLDERS else word)
    return [*overrides, f"cache_dir={inputs['cache']}"], multirun


def sweep_cells(overrides: list[str]) -> list[list[str]]:
    """One override list per cell of the sweep: each value of a choice or range, each end of an interval."""
    options = []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        if not override.is_sweep_override():
            options.append([override.input_line])
        elif isinstance(override.value(), IntervalSweep):
            options.append([f"{key}={override.value().start}", f"{key}={override.value().end}"])
        else:
            options.append([f"{key}={v}" for v in override.sweep_string_iterator()])
    return [list(cell) for cell in itertools.product(*options)]


def problem(overrides: list[str]) -> str | None:
    """Why the composed job would be refused before it starts, or None."""
    return cell_problem(tuple(overrides))


@functools.cache  # a cell that several commands share is composed once
def cell_problem(overrides: tuple[str, ...]) -> str | None:
    try:
        cfg = compose_cfg(list(overrides), return_hydra_config=True)
    except Exception as e:  # composition: Hydra's own message
        return str(e)
    if cfg.resume:  # a resumed run reads its own resolved config and takes no other overrides
        return None
    return job_config_problem(cfg)


def test_the_docs_show_commands():
    assert len(LAUNCH) > 30 and len(ERRORS) >= 4


@pytest.mark.parametrize("page,command", LAUNCH, ids=[f"{p}:{c[13:70]}" for p, c in LAUNCH])
def test_a_documented_command_composes(page, command, inputs):
    overrides, multirun = launch_args(command, inputs)
    for cell in sweep_cells(overrides) if multirun else [overrides]:
        assert problem(cell) is None, f"{page}: {command}\n  job {cell}: {problem(cell)}"


@pytest.mark.parametrize("page,command", ERRORS, ids=[f"{p}:{c[13:70]}" for p, c in ERRORS])
def test_a_documented_error_is_refused_as_shown(page, command, inputs):
    found = problem(launch_args(command, inputs)[0])
    assert found is not None, f"{page}: {command} is shown failing, and it composes"
    assert shown_error(command) in found, f"{page}: {command}\n  shown: {shown_error(command)}\n  got: {found}"


def verbs() -> list[str]:
    """Every `eagle3 VERB` the pages' code blocks run."""
    return sorted({m.group(1) for page in PAGES for lang, body in blocks(page) if lang in ("", "bash", "console")
                   for m in re.finditer(r"(?:^|\$ |&& )eagle3 (\w[\w-]*)", body, re.M)})


def test_the_docs_run_their_tasks_as_eagle3_verbs():
    assert {"train", "prepare", "check", "accept", "speedup", "serve", "export", "compare"} <= set(verbs())


@pytest.mark.parametrize("verb", verbs())
def test_a_documented_verb_is_one_and_answers_help(verb):
    from eagle3.cli.__main__ import main
    from eagle3.cli.verbs import available

    assert verb in available(), f"the docs run `eagle3 {verb}`, which is no verb (eagle3/cli/verbs.py)"
    if verb in TRAIN_VERBS:  # Hydra's --help composes the whole config: the compose tests above cover these
        return
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([verb, "--help"])
    assert exited.value.code in (0, None) and f"usage: eagle3 {verb}" in out.getvalue(), verb


TRAIN_VERBS = {prefix.split()[1] for prefix in TRAIN}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


LINKS = [(page, target) for page in PAGES for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text())
         if not re.match(r"\w+:", target)]


@pytest.mark.parametrize("page,target", LINKS, ids=[f"{p.name}->{t}" for p, t in LINKS])
def test_a_link_between_pages_resolves(page, target):
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    assert file.exists(), f"{page.name}: {target} does not exist"
    if anchor:
        assert anchor in anchors(file), f"{page.name}: {target}: no heading with that anchor in {file.name}"


def test_the_readme_opens_with_the_ci_commands():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 250
    assert [body.strip() for lang, body in blocks(readme)[:2]] == CI_COMMANDS
    assert "python -m pytest -q" in (ROOT / ".ci" / "run").read_text()


def config_group_table() -> dict[str, list[str]]:
    """README's config-group table: {group: the options its row lists, the backticked names of its second column}."""
    section = (ROOT / "README.md").read_text().split("## Config groups", 1)[1].split("\n## ", 1)[0]
    return {group: re.findall(r"`([^`]+)`", options)
            for group, options in re.findall(r"^\| `([\w/]+)` \| ([^|]*) \|", section, re.M)}


def hydra_options(group: str) -> list[str]:
    """The options Hydra finds for `group`: conf/'s files, the schemas stored in code, the plugins' (eagle3_basic)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from factories import CONF, registered_configs

    registered_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return GlobalHydra.instance().config_loader().get_group_options(group)


def test_the_readme_config_group_table_lists_every_option_file_of_conf_and_nothing_else():
    """Each group's row lists every conf/<group>/*.yaml (`sub/*`: the files of a folder of them), and every option
    it lists exists: a file, or an option Hydra finds elsewhere (the default sweeper, a plugin's)."""
    from factories import CONF

    table = config_group_table()
    assert {"model", "data", "experiment", "hydra/sweeper"} <= set(table)
    groups = {d.relative_to(CONF).as_posix() for d in CONF.rglob("*") if d.is_dir() and any(d.glob("*.yaml"))}
    # conf/hydra holds Hydra's own settings (train.yaml's `hydra: default`); a folder inside a group listed as
    # `sub/*` holds options of that group.
    folders = {f"{g}/{o[:-2]}" for g, listed in table.items() for o in listed if o.endswith("/*")}
    assert groups - {"hydra"} - folders == set(table), "conf/'s groups against README's table"
    for group, listed in table.items():
        files = {p.relative_to(CONF / group).with_suffix("").as_posix() for p in (CONF / group).rglob("*.yaml")}
        unlisted = sorted(f for f in files if f not in listed and not any(
            o.endswith("/*") and f.startswith(o[:-1]) for o in listed))
        assert not unlisted, f"README's config-group table: the {group} row lacks {unlisted}"
        absent = [o for o in listed if o not in files and not (o.endswith("/*") and any(
            f.startswith(o[:-1]) for f in files))]
        if absent:
            assert not set(absent) - set(hydra_options(group)), f"the {group} row lists options that do not exist"
