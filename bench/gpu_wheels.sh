#!/usr/bin/env bash
# Builds the wheel folder that bench/gpu_check.sh installs on the GPU machine, which reaches no package registry.
# Run it where pip reaches PyPI, from the repo root:
#
#   bench/gpu_wheels.sh            # -> .whl/ (git-ignored; copy it to the GPU machine with the checkout)
#   bench/gpu_wheels.sh DIR        # another folder
#
# The GPU machine this targets runs Python 3.12 on x86-64 and already holds torch, triton,
# transformers, tokenizers, safetensors, numpy, pyarrow, pandas, huggingface-hub, httpx, aiohttp, rich, typer,
# click, psutil, protobuf, tqdm, matplotlib, pyyaml and pytest. What it lacks is fetched here, pinned, without
# dependencies (so pip never replaces the machine's torch): speculators, hydra, omegaconf, datasets, pytest-xdist and their own
# pure-Python needs, at the versions this project is tested with here. PYTHON_VERSION overrides the target Python (default 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
py=${PYTHON_VERSION:-3.12}
mkdir -p "$dest"
PINNED=(
  speculators==0.9.0 hs-connectors==0.9.0                       # the draft model, losses, metrics, checkpoint format
  hydra-core==1.3.8 omegaconf==2.3.1                            # config (the tests compose conf/)
  datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19             # speculators-format data (Arrow rows)
  pydantic==2.13.4 pydantic-core==2.46.4 pydantic-settings==2.14.1 annotated-types==0.7.0
  typing-inspection==0.4.2 python-dotenv==1.2.2                 # speculators' config classes
  loguru==0.7.3                                                 # speculators' logging
  openai==3.57.0 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1     # imported by speculators' data generation
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0
  pytest-xdist==3.8.0 execnet==2.1.2                            # pyproject's addopts run the tests in two workers
)
# Binary wheels for the device's Python and platform (pydantic-core and jiter are compiled; the rest are
# pure Python and match any platform).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${PINNED[@]}"
# hydra's grammar runtime is published as a source distribution only; it is pure Python, so a wheel built here
# installs there.
python3 -m pip wheel -q --no-deps -w "$dest" antlr4-python3-runtime==4.9.3
ls -1 "$dest"
du -sh "$dest"
