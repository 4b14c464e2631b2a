"""Recording cost per call: the proxy's recorder alone (no HTTP), 64 concurrent callers, rows
shaped like the proxy benchmark's (a ~300-word prompt, 32 completion tokens with log-probs),
into a fresh SQLite file; call ids as the proxy makes them (time-ordered) against fully random
ids (the earlier scheme, the baseline), alternating, in one run.

    python bench/record_cost.py [--calls 60000] [--repeats 2]

Prints, per id scheme and repeat, committed calls/s and CPU µs per call (this process: event
loop plus writer thread), then the ratios time-ordered / random.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

_PROMPT = " ".join(["the river country keeps its capital where the two old roads cross"] * 25)


def _run(db: str, calls: int, random_ids: bool) -> tuple[float, float]:
    from harnessrl.db import open_db
    from harnessrl.proxy.record.call_rows import new_call_id
    from harnessrl.proxy.record.recorder import CallRecord, Recorder
    from harnessrl.records import UNASSIGNED_ROLLOUT, pack_ids, pack_logprobs

    engine, _ = open_db(db)
    recorder = Recorder(engine)
    request = {"model": "m", "messages": [{"role": "user", "content": _PROMPT}], "max_tokens": 32, "logprobs": True}
    response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "word " * 32},
                             "logprobs": {"content": [{"token": "word", "logprob": -0.5, "bytes": [119],
                                                       "top_logprobs": []}] * 32}}]}
    prompt, completion = pack_ids(list(range(330))), pack_ids(list(range(32)))
    logprobs = pack_logprobs([-0.5] * 32)

    def record() -> CallRecord:
        return CallRecord(id=os.urandom(16).hex() if random_ids else new_call_id(), rollout_id=UNASSIGNED_ROLLOUT,
                          endpoint="chat", request=request, response=response, prompt_ids=prompt,
                          completion_ids=completion, completion_logprobs=logprobs, created_at=time.time())

    async def caller(n: int) -> None:
        for _ in range(n):
            await asyncio.sleep(0)  # the rest of a request's work: other callers run
            await recorder.commit(record())

    async def main() -> None:
        await asyncio.gather(*(caller(calls // 64) for _ in range(64)))

    t0, c0 = time.perf_counter(), time.process_time()
    asyncio.run(main())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    recorder.close()
    engine.dispose()
    n = calls // 64 * 64
    return n / wall, cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=60_000, help="calls per measurement (the DB grows to this)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hrl-record-"))
    got: dict[str, list[tuple[float, float]]] = {"random": [], "time-ordered": []}
    for r in range(args.repeats):
        for scheme in got:
            rate, cpu = _run(str(tmp / f"{scheme}-{r}.db"), args.calls, scheme == "random")
            got[scheme].append((rate, cpu))
            print(f"{scheme:>12} ids, repeat {r}: {rate:8,.0f} calls/s, {cpu:5.1f} µs CPU per call")
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in got.items()}
    (rate_r, cpu_r), (rate_t, cpu_t) = med["random"], med["time-ordered"]
    print(f"median: calls/s time-ordered/random {rate_t / rate_r:.2f}; CPU per call {cpu_t / cpu_r:.2f} "
          f"({cpu_r:.0f} → {cpu_t:.0f} µs); {args.calls:,} calls per DB; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
