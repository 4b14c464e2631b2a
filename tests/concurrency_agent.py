"""A minimal CLI harness for the concurrency and Ray tests (`loop --cmd`, one rollout per run).

    python concurrency_agent.py TASK_JSON MARKERS [--barrier N] [--sleep S]

It leaves MARKERS/<run>/<rollout>.start (JSON: pid, the Ray raylet's pid when run by a Ray
worker), asks the proxy one question with the OpenAI SDK (the base URL and key `harnessrl run`
put in the environment); in a training round's run (`round-*`) it then waits until N rollouts
of its run have started (a barrier: it fails after 120 s, which only rollouts that run at once
can pass) and sleeps S seconds (a task whose input is "hang" sleeps an hour); it leaves .end,
and prints its reward: 1 when the answer has an even number of characters (some variety within
a group), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx
from openai import OpenAI


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("task")
    p.add_argument("markers", type=Path)
    p.add_argument("--barrier", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()
    task = json.loads(Path(a.task).read_text())
    rollout = os.environ["HARNESSRL_ROLLOUT"]
    key = os.environ.get("HARNESSRL_KEY")  # its rollout's own key (`harnessrl run`)
    run = httpx.get(f"{os.environ['HARNESSRL_PROXY']}/harnessrl/rollouts/{rollout}",
                    headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=60).json()["run"]
    mine = a.markers / run
    mine.mkdir(parents=True, exist_ok=True)
    # which keys it was given: its rollout's own, never the operator's (issue 42)
    keys = {"operator": os.environ.get("HARNESSRL_PROXY_API_KEY"), "openai": os.environ.get("OPENAI_API_KEY")}
    (mine / f"{rollout}.start").write_text(json.dumps({"pid": os.getpid(), "task": task["id"],
                                                       "raylet": os.environ.get("RAY_RAYLET_PID"), "keys": keys}))
    client = OpenAI(max_retries=0, timeout=120)  # OPENAI_BASE_URL and OPENAI_API_KEY: the rollout's
    answer = client.chat.completions.create(model="policy", max_tokens=8, temperature=1.0,
                                            messages=[{"role": "user", "content": task["input"]}])
    text = answer.choices[0].message.content or ""
    if a.barrier and run.startswith("round-"):
        deadline = time.time() + 120
        while len(list(mine.glob("*.start"))) < a.barrier:
            if time.time() > deadline:
                print("barrier: the other rollouts never started alongside this one", file=sys.stderr)
                return 3
            time.sleep(0.1)
    time.sleep(3600 if task["input"] == "hang" else a.sleep if run.startswith("round-") else 0)
    (mine / f"{rollout}.end").write_text("")
    print(json.dumps({"reward": float(len(text) % 2 == 0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
