"""`eagle3 VERB`: one front door. `eagle3 --help` lists every verb without importing a verb's module; `eagle3 VERB
--help` and a refusal of arguments import neither torch nor speculators; the older paths (`python launch.py`,
`python -m eagle3.<module>`) run the same verb."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from commands import run_in_process
from eagle3.cli.verbs import VERBS, available
from factories import ROOT

HEAVY = ("torch", "speculators", "transformers")


def eagle3(*args: str, probe: str = "") -> subprocess.CompletedProcess:
    """`eagle3 ARGS` in a process of its own (`python -m eagle3.cli`: the console script is the main() of the
    package the environment installed, maybe another checkout's), then `probe` printed: Python evaluated in it."""
    code = ("import json, sys\nfrom eagle3.cli.__main__ import main\ntry:\n    status = main(sys.argv[1:])\n"
            "except SystemExit as e:\n    status = e.code\n"
            f"print('PROBE', json.dumps({probe or 'None'}), file=sys.stderr)\n"
            "sys.exit(status if isinstance(status, int) else (print(status, file=sys.stderr) or 1))\n")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def probed(proc: subprocess.CompletedProcess):
    line = next(line for line in proc.stderr.splitlines() if line.startswith("PROBE "))
    return json.loads(line[len("PROBE "):])


LOADED = f"sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith('eagle3.cli.'))"


def test_eagle3_help_lists_every_verb_with_a_line_each_and_imports_no_verb_module():
    proc = eagle3("--help", probe=LOADED)
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(available()) and {"train", "plan", "prepare", "check", "accept", "speedup", "serve",
                                            "export", "compare", "verifier", "reference"} <= set(listed)
    assert probed(proc) == ["eagle3.cli.__main__", "eagle3.cli.verbs"]


def test_the_console_script_is_the_cli_main():
    text = (ROOT / "pyproject.toml").read_text()
    assert "[project.scripts]\neagle3 = \"eagle3.cli.__main__:main\"" in text


@pytest.mark.parametrize("verb", [v for v in VERBS if v in available()])
def test_a_verbs_help_imports_neither_torch_nor_speculators(verb):
    proc = eagle3(verb, "--help", probe=f"sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})")
    said = "eagle3 train is powered by Hydra" if verb in ("train", "plan") else f"usage: eagle3 {verb}"
    assert proc.returncode == 0 and said in proc.stdout, proc.stderr[-2000:]
    assert probed(proc) == [], f"eagle3 {verb} --help imported {probed(proc)}"


def test_train_help_lists_every_config_group_with_its_files_and_stored_schemas():
    """Hydra lists the groups from conf/ and from the ConfigStore (the base_* schemas), copying its config
    repository for each group; eagle3.cli.train has the copies share the store rather than copy it whole."""
    from hydra.core.config_store import ConfigStore

    from factories import CONF, registered_configs

    registered_configs()
    proc = run_in_process(["python", "-m", "eagle3.cli", "train", "--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    section = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    listed = dict(line.split(": ", 1) for line in section.splitlines() if ": " in line and "(" not in line)
    expected = {}
    for folder in sorted(p for p in CONF.rglob("*") if p.is_dir()):
        group = folder.relative_to(CONF).as_posix()
        if group.split("/")[0] == "hydra":  # Hydra's own groups: its --hydra-help lists them
            continue
        stored = ConfigStore.instance().repo
        for part in group.split("/"):
            stored = stored.get(part, {})
        names = {p.stem for p in folder.glob("*.yaml")}
        names |= {name.removesuffix(".yaml") for name in stored if name.endswith(".yaml")}
        if names:
            expected[group] = ", ".join(sorted(names))
    assert listed == expected and "base_tiny" in listed["data"] and "tiny" in listed["model"]


def test_copies_of_the_structured_config_source_share_the_store_and_load_copies_of_its_nodes():
    import copy

    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.config_store import ConfigStore

    import eagle3.cli.train  # noqa: F401  (sets how Hydra's structured config source is copied)

    source = SourcesRegistry.instance().resolve("structured")("schema", "structured://")
    clone = copy.deepcopy(source)
    assert clone is not source and clone.store is ConfigStore.instance() and clone.path == source.path == ""
    loaded = clone.load_config("optim/base_optim")
    loaded.config.lr = 123.0  # a test, or Hydra composing, changing what it loaded
    assert source.load_config("optim/base_optim").config.lr != 123.0


@pytest.mark.parametrize("args,message", [
    (["accept", "--temperature", "-1"], "--temperature (eval.accept.temperature): must be >= 0"),
    (["speedup", "--accept-rates", "0.5", "--measure", "--num-prompts", "0"], "--num-prompts"),
    (["check", "/nowhere", "--vocab-size", "0"], "--vocab-size must be >= 1"),
    (["reference"], "nothing to do: give --install"),
])
def test_a_refused_argument_is_one_message_and_a_nonzero_exit_without_torch(args, message):
    proc = eagle3(*args, probe=f"sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})")
    assert proc.returncode in (1, 2) and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert probed(proc) == []


def test_an_unknown_verb_and_no_verb_are_usage_errors():
    unknown, none = eagle3("trian"), eagle3()
    assert unknown.returncode == 2 and "no verb 'trian'; the verbs: train, plan" in unknown.stderr
    assert none.returncode == 2 and "usage: eagle3 VERB" in none.stderr


def test_a_user_error_is_one_message_and_exit_status_1_and_ctrl_c_is_130():
    from eagle3.cli.tail import finish
    from eagle3.errors import DataError

    def interrupted():
        raise KeyboardInterrupt

    def refused():
        raise DataError("rows.jsonl:3: not a row")

    with pytest.raises(SystemExit) as e:
        finish(refused)
    assert e.value.code == "error: rows.jsonl:3: not a row"  # the interpreter prints it and exits 1
    with pytest.raises(SystemExit) as e:
        finish(interrupted, interrupted="interrupted: nothing was written")
    assert e.value.code == 130
    assert finish(lambda: None) == 0 and finish(lambda: 3) == 3


def test_a_verb_whose_module_is_not_there_is_neither_listed_nor_run(monkeypatch):
    from eagle3.cli import __main__ as front
    from eagle3.cli import verbs

    monkeypatch.setitem(verbs.VERBS, "later", ("not_written_yet", "a verb another change adds"))
    assert "later" not in verbs.available() and "later" not in front.help_text()


OLDER_PATHS = {"eagle3.data.prepare": "prepare", "eagle3.data.check": "check", "eagle3.eval.accept": "accept",
               "eagle3.eval.speedup": "speedup", "eagle3.serve": "serve", "eagle3.serve.export": "export",
               "eagle3.sweep.compare": "compare", "eagle3.verifier": "verifier", "eagle3.reference": "reference"}


@pytest.mark.parametrize("module,verb", OLDER_PATHS.items())
def test_an_older_path_runs_the_verb(module, verb):
    proc = run_in_process(["python", "-m", module, "--help"])
    assert proc.returncode == 0 and f"usage: eagle3 {verb}" in proc.stdout, proc.stderr


def test_launch_py_and_eagle3_train_and_plan_compose_the_same_config():
    launched = run_in_process(["python", "launch.py", "--cfg", "job", "optim.lr=0.125"])
    assert launched.returncode == 0 and "lr: 0.125" in launched.stdout, launched.stderr
    proc = eagle3("train", "--cfg", "job", "optim.lr=0.125")
    assert proc.returncode == 0 and proc.stdout == launched.stdout, proc.stderr[-2000:]
    planned = eagle3("plan", "--cfg", "job")
    assert planned.returncode == 0 and "plan: true" in planned.stdout, planned.stderr[-2000:]


def test_the_accept_options_make_the_request_the_library_takes_with_the_same_defaults():
    from eagle3.cli.accept import parse_args
    from eagle3.eval.accept import AcceptRequest

    assert vars(parse_args(["--run", "r"])) == dataclasses.asdict(AcceptRequest(run="r"))


def test_the_serve_options_make_the_request_the_library_takes_with_the_same_defaults():
    from eagle3.cli.serve import parse_args
    from eagle3.serve.request import ServeRequest

    options = vars(parse_args(["r"]))
    assert options.pop("install") is None and options == dataclasses.asdict(ServeRequest(runs=["r"]))
