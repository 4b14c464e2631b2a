#!/usr/bin/env bash
# Install the real harnesses of the compatibility suite (tests/test_harness_cli.py) at the
# versions pinned in harnesses.lock: the npm CLIs into one project-local prefix (.harnesses/npm),
# the pip ones into the venv the lock names (their own where their pins clash with this
# project's: aider and mini-swe-agent pin litellm/openai versions of their own). Run by
# scripts/install.sh (HARNESSES=0 skips it). A harness already at its pinned version is left alone.
# A harness that cannot be installed here (no npm, no registry) is written with the reason to
# .harnesses/unavailable: its tests skip saying why; any other missing harness fails them.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
"$PYTHON" -c "import sys" 2>/dev/null || PYTHON=python3
mkdir -p .harnesses
unavailable=.harnesses/unavailable
: > "$unavailable"

npm_specs=() npm_names=() npm_prefix=""
while read -r name kind pkg version where; do
  case "$name" in ''|'#'*) continue ;; esac
  if [ "$kind" = npm ]; then
    npm_prefix=$where
    have=$(node -p "require('./$where/node_modules/$pkg/package.json').version" 2>/dev/null || true)
    [ "$have" = "$version" ] || { npm_specs+=("$pkg@$version"); npm_names+=("$name"); }
  else
    py=$where/bin/python
    have=$("$py" -c "import importlib.metadata as m; print(m.version('$pkg'))" 2>/dev/null || true)
    [ "$have" = "$version" ] && continue
    [ -x "$py" ] || "$PYTHON" -m venv "$where"
    if "$py" -m pip install -q "$pkg==$version"; then
      echo "$name $version installed in $where"
    else
      echo "$name: pip install $pkg==$version failed" | tee -a "$unavailable"
    fi
  fi
done < harnesses.lock

if [ ${#npm_specs[@]} -gt 0 ]; then
  if ! command -v npm >/dev/null; then
    for n in "${npm_names[@]}"; do echo "$n: npm (Node.js) is not installed" >> "$unavailable"; done
  # npm 11 skips the packages' install scripts unless allowed: these CLIs run without them (their
  # platform binary comes as an optional dependency, or they are plain JavaScript), so none is allowed.
  elif npm install --prefix "$npm_prefix" --no-audit --no-fund --loglevel=error "${npm_specs[@]}"; then
    echo "installed in $npm_prefix: ${npm_specs[*]}"
  else
    for n in "${npm_names[@]}"; do echo "$n: npm install failed (see its output above)" >> "$unavailable"; done
  fi
fi
if [ -s "$unavailable" ]; then
  echo "harnesses not installed (their tests skip):"; cat "$unavailable"
fi
