"""Compiler throughput: synthesise a records DB of linear agent sessions with tiny-tokenizer ids,
compile it, and compare with the naive one-sample-per-call baseline built in the same run.

    python bench/compile_throughput.py [--rollouts 2020] [--keep]

Prints compile time, recorded tokens/s (Σ|S_c| / compile seconds), peak memory of the compile
process, and token saving (Σ|S_c| / emitted tokens) next to the baseline's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np


_WORDS = ("the city river capital founded author book company search find answer value planner worker "
          "alpha beta gamma delta first then next finally result number year born").split()


def _texts(rng: random.Random, n: int) -> list[str]:
    """Assistant turns (think + a hermes tool call + EOS) and tool observations, as text."""
    out = []
    for _ in range(n):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 40)))
        key, num = rng.choice(_WORDS), rng.randint(0, 9999)
        out.append(f"<think>\nI should {words}.\n</think>\n\n<tool_call>\n"
                   f'{{"name": "search", "arguments": {{"query": "{key} {words[:40]}", "n": {num}}}}}\n</tool_call><|im_end|>')
        out.append(f"\n<|im_start|>user\n<tool_response>\n{{\"value\": \"{words} {num}\"}}\n</tool_response><|im_end|>\n"
                   "<|im_start|>assistant\n")
    return out


def synthesise(db: str, tok_dir: str, rollouts: int, seed: int = 0) -> dict:
    from harnessrl.db import open_db
    from harnessrl.records import pack_ids, pack_logprobs
    from harnessrl.tiny_model import build_tokenizer

    tok = build_tokenizer()
    tok.save_pretrained(tok_dir)
    open_db(db)  # schema via the migrations
    rng = random.Random(seed)
    lines = _texts(rng, 1500)
    chunks = [np.asarray(tok.encode(x, add_special_tokens=False), dtype=np.int32) for x in lines]
    completions = [c for c, x in zip(chunks, lines) if x.startswith("<think>")]
    observations = [c for c, x in zip(chunks, lines) if x.startswith("\n<|im_start|>user")]

    def text_ids(n_tokens: int) -> np.ndarray:
        out, n = [], 0
        while n < n_tokens:
            c = rng.choice(chunks)
            out.append(c)
            n += len(c)
        return np.concatenate(out)[:n_tokens]

    system_pool = text_ids(5000)
    conn = sqlite3.connect(db)
    now = time.time()
    n_calls = recorded = turns_total = 0
    for r in range(rollouts):
        rid = f"r{r:05d}"
        turns = rng.randint(8, 12)
        turns_total += turns
        start = rng.randint(0, 900)
        prompt = system_pool[start:start + rng.randint(1000, 4000)]
        rows = []
        for t in range(turns):
            completion = rng.choice(completions)
            logprobs = -np.abs(np.random.default_rng(n_calls).standard_normal(len(completion))).astype(np.float32)
            rows.append((f"{rid}-{t}", rid, t, "agent", "chat", 0, json.dumps({"messages": []}),
                         "", "ok", pack_ids(prompt), pack_ids(completion), pack_logprobs(logprobs), "v0", now))
            recorded += len(prompt) + len(completion)
            prompt = np.concatenate([prompt, completion, rng.choice(observations)])
            n_calls += 1
        conn.execute("INSERT INTO rollouts (id, task_id, group_id, status, next_seq, created_at) VALUES (?,?,?,?,?,?)",
                     (rid, f"t{r // 8}", f"g{r // 8}", "finished", turns, now))
        conn.executemany(
            "INSERT INTO calls (id, rollout_id, seq, agent, endpoint, stream, request, response_text, status, "
            "prompt_ids, completion_ids, completion_logprobs, weight_version, created_at) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        conn.execute("INSERT INTO rewards (rollout_id, kind, name, value, created_at) VALUES (?,?,?,?,?)",
                     (rid, "outcome", "outcome", float(rng.random() < 0.5), now))
    conn.commit()
    conn.close()
    return {"calls": n_calls, "rollouts": rollouts, "recorded": recorded, "mean_turns": turns_total / rollouts}


def run_compile(db: str, tok_dir: str, out: str, jobs: int, queue) -> None:
    from harnessrl.compiler.pipeline import CompileOptions, Compiler

    start, cpu = time.perf_counter(), _cpu()
    stats = Compiler(db, CompileOptions(out=Path(out), tokenizer=tok_dir, jobs=jobs)).run()
    queue.put({"seconds": time.perf_counter() - start, "cpu": _cpu() - cpu, "totals": stats["totals"],
               "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "worker_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024})


def _cpu() -> float:
    """CPU seconds of this process and its finished workers."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_naive(db: str, tok_dir: str, out: str, queue) -> None:
    """Baseline: one sample per call (S_c with its completion trainable), same reader and writer."""
    from harnessrl.compiler.reader import Reader
    from harnessrl.compiler.writer import SampleWriter
    from harnessrl.db import open_db

    start, cpu = time.perf_counter(), time.process_time()
    reader = Reader(open_db(db)[0], tok_dir)
    Path(out).mkdir(parents=True, exist_ok=True)
    writer = SampleWriter(Path(out) / "naive.parquet", 4_000_000)
    emitted = 0
    rollouts = reader.select_rollouts()
    for i in range(0, len(rollouts), 256):
        for w in reader.read_batch(rollouts[i:i + 256]):
            for u in w.units.values():
                c = u.call
                n = c.s_len
                mask = np.zeros(n, dtype=np.int8)
                mask[len(c.prompt):] = 1
                cls = np.zeros(n, dtype=np.int8)
                cls[len(c.prompt):] = u.classes
                blp = np.zeros(n, dtype=np.float32)
                blp[len(c.prompt):] = c.logprobs
                emitted += writer.add({
                    "sample_id": c.call_id, "rollout_id": w.id, "task_id": w.task_id, "group_id": w.group_id,
                    "agent": c.agent, "session_id": c.session_id, "input_ids": np.concatenate([c.prompt, c.completion]),
                    "loss_mask": mask, "token_class": cls, "advantage": mask.astype(np.float32),
                    "behaviour_logprob": (blp, mask.astype(bool)), "turn_index": np.full(n, -1, dtype=np.int16),
                    "call_ids": [c.call_id], "call_versions": [c.weight_version], "call_turns": [-1],
                    "prompt_len": len(c.prompt), "weight_version": c.weight_version,
                    "outcome_reward": 0.0, "reward_breakdown": "{}", "retokenized": False})
    writer.close()
    queue.put({"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "emitted": emitted,
               "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def in_child(fn, *args) -> dict:
    ctx = mp.get_context("spawn")  # a fresh process: its peak memory is the compile's own
    q = ctx.Queue()
    p = ctx.Process(target=fn, args=(*args, q))
    p.start()
    result = q.get()
    p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=2020)  # 8–12 turns each: > 20,000 calls
    ap.add_argument("--keep", action="store_true", help="keep the synthesised DB and outputs")
    ap.add_argument("--jobs", type=int, default=0, help="compile worker processes (0: one per CPU)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hrl-compile-bench-"))
    try:
        run(work, args.rollouts, args.jobs)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, rollouts: int, jobs: int) -> None:
    db = str(work / "bench.db")
    tok_dir = str(work / "tokenizer")
    t0 = time.perf_counter()
    info = synthesise(db, tok_dir, rollouts)
    print(f"synthesised {info['calls']:,} calls in {info['rollouts']:,} rollouts "
          f"({info['mean_turns']:.2f} turns, {info['recorded'] / 1e6:.1f}M recorded tokens, "
          f"{Path(db).stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f}s")
    one = in_child(run_compile, db, tok_dir, str(work / "compiled1"), 1)
    c = in_child(run_compile, db, tok_dir, str(work / "compiled"), jobs)
    n = in_child(run_naive, db, tok_dir, str(work / "naive"))
    t = c["totals"]
    saving = t["token_saving"]
    size_c = (work / "compiled" / "samples.parquet").stat().st_size
    size_n = (work / "naive" / "naive.parquet").stat().st_size
    print(f"load average (1 min) {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: wall time counts other "
          "processes, CPU time does not")
    print(f"compile: {c['seconds']:.2f}s wall, {c['cpu']:.2f}s CPU, {t['samples']:,} samples; recorded tokens/s "
          f"{t['tokens_recorded'] / c['seconds'] / 1e6:.1f}M (wall), {t['tokens_recorded'] / c['cpu'] / 1e6:.1f}M (CPU); "
          f"peak memory {c['peak_mb']:.0f} MB (parent), {c['worker_peak_mb']:.0f} MB (largest worker); "
          f"{jobs or os.cpu_count()} jobs")
    print(f"same compile in one process (--jobs 1): {one['seconds']:.2f}s wall, {one['cpu']:.2f}s CPU, recorded "
          f"tokens/s {t['tokens_recorded'] / one['seconds'] / 1e6:.1f}M (wall); peak memory {one['peak_mb']:.0f} MB; "
          f"--jobs speed-up {one['seconds'] / c['seconds']:.2f}x")
    print(f"naive one-sample-per-call baseline: {n['seconds']:.2f}s wall, {n['cpu']:.2f}s CPU, {info['calls']:,} "
          f"samples, {n['emitted'] / 1e6:.1f}M tokens, peak memory {n['peak_mb']:.0f} MB")
    print(f"token saving (Σ|S_c| / emitted): {saving:.2f}x vs naive {info['recorded'] / n['emitted']:.2f}x; "
          f"{saving / info['mean_turns']:.2f} × turns (target ≥ 0.8)")
    print(f"emitted tokens: {t['tokens_emitted'] / n['emitted']:.3f} of naive; Parquet size "
          f"{size_c / 1e6:.0f} MB vs {size_n / 1e6:.0f} MB ({size_n / size_c:.1f}x smaller); "
          f"compile CPU time {c['cpu'] / n['cpu']:.2f}x the naive build's")


if __name__ == "__main__":
    main()
