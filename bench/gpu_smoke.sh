#!/usr/bin/env bash
# GPU smoke test (< 10 min on one GPU): vLLM + proxy + a real small model, one round of rollouts,
# compile, one CAPO step, push the weights into vLLM, one more round on the new weights; then a
# short version of the coding recipe (docs/coding.md): generated repositories, the built-in coding
# agent on the same vLLM, hidden-test rewards, one loop round with configs/coding_gpu.yaml.
#
#   bench/gpu_smoke.sh MODEL_DIR [VLLM_BIN]
#
# MODEL_DIR: a local chat model with tool calling (e.g. Qwen2.5-0.5B-Instruct); VLLM_BIN: the
# `vllm` executable of vLLM's own environment (default: $HARNESSRL_VLLM_BIN or `vllm` on PATH).
# A MODEL_DIR without weights (`harnessrl smollm2 DIR --shape-only --vllm`: SmolLM2-135M's config
# and tokenizer, 4 MB, where its 98 MB GGUF cannot travel) gets seeded random weights of its shape.
set -euo pipefail
MODEL=$(realpath "${1:?usage: bench/gpu_smoke.sh MODEL_DIR [VLLM_BIN]}")
VLLM_BIN=${2:-${HARNESSRL_VLLM_BIN:-$(command -v vllm || true)}}
[ -x "$VLLM_BIN" ] || { echo "no vllm executable (pass it as the second argument)" >&2; exit 2; }
HRL=${HRL:-harnessrl}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/harnessrl-gpu-smoke.XXXX)
VLLM_PORT=${VLLM_PORT:-8101}
PROXY_PORT=${PROXY_PORT:-8100}
START=$(date +%s)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
say() { echo "[$(( $(date +%s) - START ))s] $*"; }

wait_http() {  # URL SECONDS
  for _ in $(seq "$2"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done
  echo "timed out waiting for $1" >&2; exit 1
}

if ! compgen -G "$MODEL/*.safetensors" >/dev/null; then
  say "no weights in $MODEL: random ones of its config's shape (seed 0)"
  python - "$MODEL" <<'PY'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1])).save_pretrained(sys.argv[1])
PY
fi

say "vLLM on :$VLLM_PORT (full-weight reload mode), log $WORK/vllm.log"
# The trainer shares the GPU: vLLM gets a third of it.
$HRL vllm "$MODEL" --port "$VLLM_PORT" --vllm-bin "$VLLM_BIN" --served-model-name policy \
  --gpu-memory-utilization 0.3 --max-model-len 4096 >"$WORK/vllm.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$VLLM_PORT/v1/models" 300

say "proxy on :$PROXY_PORT"
$HRL proxy --db "$WORK/runs.db" --upstream "http://127.0.0.1:$VLLM_PORT" --tokenizer "$MODEL" \
  --served-model-name policy --port "$PROXY_PORT" >"$WORK/proxy.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$PROXY_PORT/v1/models" 60

rollouts() {  # RUN_NAME: 4 tasks × 4 rollouts of a one-tool harness, outcome = the answer contains the value
  python - "$PROXY_PORT" "$1" <<'PY'
import json, sys
from concurrent.futures import ThreadPoolExecutor
from openai import OpenAI
from harnessrl.client import HarnessRL

port, run = sys.argv[1], sys.argv[2]
hrl = HarnessRL(f"http://127.0.0.1:{port}")
values = {"paris": "France", "lima": "Peru", "oslo": "Norway", "hanoi": "Vietnam"}
tools = [{"type": "function", "function": {"name": "lookup", "description": "Country of a capital city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

def episode(city: str) -> float:
    with hrl.rollout(task_id=city, group_id=f"{run}-{city}", run=run) as ro:
        client = OpenAI(base_url=ro.base_url("planner"), api_key="x")
        msgs = [{"role": "user", "content": f"Which country has the capital {city.title()}? Use the lookup tool, then answer."}]
        for _ in range(3):
            r = client.chat.completions.create(model="policy", messages=msgs, tools=tools, max_tokens=256, temperature=1.0)
            m = r.choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            if not m.tool_calls:
                break
            for tc in m.tool_calls:
                try:
                    arg = json.loads(tc.function.arguments).get("city", "")
                except (json.JSONDecodeError, AttributeError):
                    arg = ""
                msgs.append({"role": "tool", "tool_call_id": tc.id, "content": values.get(str(arg).lower(), "unknown city")})
        reward = float(values[city].lower() in (msgs[-1].get("content") or "").lower())
        ro.reward(reward)
        return reward

with ThreadPoolExecutor(16) as pool:
    rewards = list(pool.map(episode, [c for c in values for _ in range(4)]))
print(f"{run}: {len(rewards)} rollouts, success {sum(rewards) / len(rewards):.2f}")
PY
}

say "round 1"
rollouts round-1
say "compile"
$HRL compile --db "$WORK/runs.db" --out "$WORK/compiled" --tokenizer "$MODEL" --advantage harness --run round-1
say "CAPO partition"
$HRL capo-partition "$WORK/compiled" --model "$MODEL" --out "$WORK/partition.pt" --threshold 0 || {
  # no successful rollout yet: probe all of them rather than stop the smoke test
  echo "(no success to probe; using every rollout)"; $HRL capo-partition "$WORK/compiled" --model "$MODEL" --out "$WORK/partition.pt" --threshold -1e9; }
cat >"$WORK/train.yaml" <<YAML
algo: capo
partition: $WORK/partition.pt
steps: 1
batch_size: 8
lr: 1.0e-6
bf16: true
gradient_checkpointing: true
YAML
say "one CAPO step + push into vLLM"
$HRL train "$WORK/compiled" --model "$MODEL" --config "$WORK/train.yaml" --out "$WORK/ck" --weight-version capo-1 \
  --push "http://127.0.0.1:$VLLM_PORT" --db "$WORK/runs.db"
say "round 2 (new weights)"
rollouts round-2
$HRL compile --db "$WORK/runs.db" --out "$WORK/compiled-2" --tokenizer "$MODEL" --run round-2 >/dev/null
python - "$WORK/runs.db" <<'PY'
import sys
from harnessrl.db import open_db
from harnessrl.records import WeightVersion
_, Session = open_db(sys.argv[1])
with Session() as s:
    versions = [w.version for w in s.query(WeightVersion).all()]
assert "capo-1" in versions, versions
print("weight versions recorded:", versions)
PY
say "coding recipe (short): 6 generated tasks, the built-in agent on vLLM, one GRPO round"
$HRL tasks coding --out "$WORK/coding" --n-train 4 --n-eval 2 --seed 0
# bubblewrap where the machine has it, as the recipe runs; without it the rollouts run unsandboxed
SANDBOX=$(command -v bwrap >/dev/null && echo bwrap || echo none)
$HRL loop --cmd "$(command -v python) -m harnessrl.harness_examples.coding.agent {task} --max-turns 6 --max-tokens 512" \
  --tasks "$WORK/coding/coding.jsonl" --n-tasks 6 --eval-fraction 0.34 --sandbox "$SANDBOX" \
  --model "$MODEL" --upstream "http://127.0.0.1:$VLLM_PORT" --algo grpo --group-size 4 --rounds 1 --steps 1 \
  --batch-size 8 --lr 1e-6 --concurrency 8 --train-config "$ROOT/configs/coding_gpu.yaml" --out "$WORK/coding-run"
python - "$WORK/coding-run" <<'PY'
import json, sys
from pathlib import Path
state = json.loads((Path(sys.argv[1]) / "loop_state.json").read_text())
assert len(state["rounds"]) == 1, state
r = state["rounds"][0]
print(f"coding: held-out success {state['initial_eval']:.2f} -> {r['eval_success']:.2f}, "
      f"train reward {r['train_reward']:.2f}, {r['samples']} samples, checkpoint {r['checkpoint']}")
PY
say "long sessions: peak memory and step time against sample length, random Qwen2.5-0.5B shape (issue 33)"
python "$ROOT/bench/long_sessions.py" --model "$MODEL" --shape 0.5b --lengths 4096,16384,40960,102400 --timeout 600
say "ok: $WORK"
