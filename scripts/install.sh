#!/usr/bin/env bash
# Set up .venv with harnessrl and its test tools. On a machine without an NVIDIA GPU the
# CPU build of torch goes in first (pinned, so pip never pulls a multi-GB CUDA build); with
# a GPU, pip resolves torch from the project's range and takes the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "NVIDIA GPU found: torch from PyPI (CUDA build)"
  else
    echo "no NVIDIA GPU: CPU build of torch"
    $PIP install -q "torch==${HARNESSRL_CPU_TORCH:-2.13.0}"
  fi
fi
$PIP install -q -e ".[dev,examples]"
$PIP install -q --no-deps bfcl-eval==2026.3.23  # BFCL data + back-ends only; its pinned deps would clash
echo "harnessrl installed in $VENV"
