#!/usr/bin/env bash
# The whole CUDA path in one command: installs the wheels (speculators and the pure-Python packages
# the GPU machine lacks, built by bench/gpu_wheels.sh) into a temporary folder without any network, prints the
# device, runs the GPU tier (python -m pytest -m gpu), then bench/gpu.py with a short budget, and writes a JSON
# summary (to $OUT/gpu_check.json when OUT is set, plus the logs beside it). A few minutes on one GPU.
#
#   bench/gpu_check.sh                 # on the GPU machine, from the repo root, with .whl/ copied there
#   bench/gpu_check.sh --dry-run       # on any CPU machine: the same steps, the GPU tier skipped by pytest and
#                                      # bench/gpu.py at its CPU shape; tests/test_gpu_check.py runs this
#
# Options: --wheels DIR (default .whl), --tier-timeout S (default 270), --bench-timeout S (default 150),
# --summary PATH (also write the summary there). PYTHON picks the interpreter (default python3).
# Exit status: 0 when the install, the GPU tier and the benchmark all passed; 1 otherwise (all steps still run).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=${PYTHON:-python3}
dry_run=0 wheels=.whl tier_timeout=270 bench_timeout=150 summary_path=
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --wheels) wheels=$2; shift ;;
    --tier-timeout) tier_timeout=$2; shift ;;
    --bench-timeout) bench_timeout=$2; shift ;;
    --summary) summary_path=$2; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
wheels=$(cd "$wheels" 2>/dev/null && pwd) || { echo "gpu_check.sh: no wheel folder $wheels (bench/gpu_wheels.sh builds it)" >&2; exit 2; }
shopt -s nullglob
wheel_files=("$wheels"/*.whl)
[ ${#wheel_files[@]} -gt 0 ] || { echo "gpu_check.sh: $wheels holds no .whl files" >&2; exit 2; }

work=$(mktemp -d)
site=$work/site
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }

step "install ${#wheel_files[@]} wheels from $wheels into $site (no index)"
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --find-links "$wheels" --target "$site" "${wheel_files[@]}" 2>&1 | tee "$work/install.log"
install_rc=${PIPESTATUS[0]}
# The checkout first (its eagle3), then the wheels' packages, then the machine's own site-packages.
export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}"

step "imports from $site"
"$python" - "$site" "$work/imports.json" <<'EOF' 2>&1 | tee "$work/imports.log"
"""Imports every top-level module the wheels installed and checks that it comes from the target folder."""
import importlib, json, sys
from pathlib import Path

site, out = Path(sys.argv[1]), Path(sys.argv[2])
names = sorted({p.stem if p.suffix == ".py" else p.name for p in site.iterdir()
                if not p.name.endswith((".dist-info", ".data")) and p.name not in ("bin", "__pycache__")
                and (p.suffix == ".py" or (p / "__init__.py").is_file())})
result = {}
for name in names:
    try:
        module = importlib.import_module(name)
        origin = str(Path(module.__file__).resolve()) if getattr(module, "__file__", None) else ""
        result[name] = {"ok": origin.startswith(str(site.resolve())), "from": origin,
                        "version": str(getattr(module, "__version__", ""))}
    except Exception as e:  # a missing dependency shows up here, before the tests
        result[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    print(f"{name:28s} {'ok' if result[name]['ok'] else 'FAILED'}  {result[name].get('version') or result[name].get('error') or result[name]['from']}")
out.write_text(json.dumps(result, indent=2))
EOF

step "device"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$python" - "$work/device.json" <<'EOF'
import json, platform, sys
import torch
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
# Its version as installed, not imported: the import check above imports the wheels' speculators, and the GPU tier
# and the benchmark import it again (each import costs seconds of CPU on top of torch's).
from importlib import metadata
try:
    info["speculators"] = metadata.version("speculators")
except metadata.PackageNotFoundError:
    info["speculators"] = "not installed"
print(json.dumps(info, indent=2))
open(sys.argv[1], "w").write(json.dumps(info))
EOF

step "GPU tier: python -m pytest -q -m gpu (timeout ${tier_timeout}s)"
tier_start=$(date +%s)
# SIGINT at the time limit: pytest stops like at Ctrl-C and still writes its report (the tests run so far).
# --continue-on-collection-errors: a test module that cannot be imported there (a package the machine lacks) is
# reported as an error without keeping the gpu tests from running. -n 0: one process (the suite's two xdist workers
# would share the one GPU, and each would collect every module first).
PYTHONUNBUFFERED=1 timeout -s INT -k 30 "$tier_timeout" "$python" -m pytest -q -n 0 -m gpu -rs -p no:cacheprovider \
  --durations=0 \
  --continue-on-collection-errors --junitxml="$work/gpu_tier.xml" 2>&1 | tee "$work/gpu_tier.log"
tier_rc=${PIPESTATUS[0]}
tier_s=$(( $(date +%s) - tier_start ))

if [ "$dry_run" = 1 ]; then bench_args=(--small --steps 1 --warmup 1); else bench_args=(--steps 10 --warmup 3); fi
step "bench/gpu.py ${bench_args[*]} (timeout ${bench_timeout}s)"
bench_start=$(date +%s)
PYTHONUNBUFFERED=1 timeout -s INT -k 30 "$bench_timeout" "$python" bench/gpu.py "${bench_args[@]}" --json "$work/gpu_bench.json" \
  2>&1 | tee "$work/gpu_bench.log"
bench_rc=${PIPESTATUS[0]}
bench_s=$(( $(date +%s) - bench_start ))

step "summary"
"$python" - "$work" "$dry_run" "$install_rc" "$tier_rc" "$tier_s" "$bench_rc" "$bench_s" "$(( $(date +%s) - start ))" \
  "${wheel_files[@]}" > "$work/gpu_check.json" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path

work = Path(sys.argv[1])
dry_run, install_rc, tier_rc, tier_s, bench_rc, bench_s, total_s = (int(a) for a in sys.argv[2:9])


def read_json(name):
    path = work / name
    return json.loads(path.read_text()) if path.is_file() else None


tier = {"exit_code": tier_rc, "seconds": tier_s}
if (work / "gpu_tier.xml").is_file():
    suite = ET.parse(work / "gpu_tier.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    tier.update(counts, passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"])
    tier["failed"] = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                      if case.find("failure") is not None or case.find("error") is not None]
imports = read_json("imports.json") or {}
summary = {
    "dry_run": bool(dry_run),
    "device": read_json("device.json"),
    "wheels": sorted(Path(w).name for w in sys.argv[9:]),
    "install": {"exit_code": install_rc, "target": str(work / "site"),
                "imports": imports, "imports_failed": sorted(n for n, r in imports.items() if not r["ok"])},
    "gpu_tier": tier,
    "bench": {"exit_code": bench_rc, "seconds": bench_s, "result": read_json("gpu_bench.json")},
    "seconds": total_s,
}
summary["ok"] = (install_rc == 0 and not summary["install"]["imports_failed"] and tier_rc == 0 and bench_rc == 0)
print(json.dumps(summary, indent=2))
EOF
cat "$work/gpu_check.json"
[ -n "$summary_path" ] && cp "$work/gpu_check.json" "$summary_path"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$work"/gpu_check.json "$work"/gpu_tier.log "$work"/gpu_tier.xml "$work"/gpu_bench.log "$OUT"/ 2>/dev/null
  [ -f "$work/gpu_bench.json" ] && cp "$work/gpu_bench.json" "$OUT"/
  echo "summary and logs in $OUT"
fi
ok=$("$python" -c "import json,sys; print(int(json.load(open(sys.argv[1]))['ok']))" "$work/gpu_check.json")
echo "gpu_check: $([ "$ok" = 1 ] && echo passed || echo FAILED) in $(( $(date +%s) - start )) s"
[ "$ok" = 1 ]
