"""A `loop --async --cmd` harness for the Ray node-loss test (tests/test_loop_async_ray.py).

    python async_agent.py TASK_JSON MARKERS

It leaves MARKERS/<rollout>.start (JSON: its run tag, the Ray raylet's pid when a Ray worker runs
it), asks the proxy one question with the OpenAI SDK (the base URL and key `harnessrl run` put in
the environment); in a training group's run (`async-*`) it then holds until MARKERS/release exists
(the test makes it once it has killed a node under rollouts held in flight; it gives up after
300 s), and prints its reward: 1 when the answer has an even number of characters (some variety
within a group), else 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
from openai import OpenAI


def main() -> int:
    task, markers = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    rollout, key = os.environ["HARNESSRL_ROLLOUT"], os.environ.get("HARNESSRL_KEY")
    run = httpx.get(f"{os.environ['HARNESSRL_PROXY']}/harnessrl/rollouts/{rollout}",
                    headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=60).json()["run"]
    markers.mkdir(parents=True, exist_ok=True)
    (markers / f"{rollout}.start").write_text(json.dumps({"run": run, "raylet": os.environ.get("RAY_RAYLET_PID")}))
    answer = OpenAI(max_retries=0, timeout=120).chat.completions.create(
        model="policy", max_tokens=8, temperature=1.0, messages=[{"role": "user", "content": task["input"]}])
    text = answer.choices[0].message.content or ""
    if run.startswith("async-"):
        deadline = time.time() + 300
        while not (markers / "release").exists():
            if time.time() > deadline:
                print("never released", file=sys.stderr)
                return 3
            time.sleep(0.1)
    print(json.dumps({"reward": float(len(text) % 2 == 0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
