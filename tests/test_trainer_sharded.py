"""The sharded configs run (issue 55 §4): `accelerate launch` with configs/fsdp.yaml (FSDP2),
configs/deepspeed_zero2.yaml (ZeRO-2) and _zero3.yaml (ZeRO-3), 2 processes on this machine's CPUs
over gloo, one optimizer step of grpo, matpo and pact with shared prefixes on, against one process.

The step is SGD at lr 1 (clipped at the configs' 1.0, as both runs are), so each weight moves by its
gradient: the weights after the step, gathered from the shards, compare the gradients as well as
the optimizer's sharded state. bf16 is overridden to fp32 (`--mixed_precision no`): no bf16 arithmetic
on this CPU, and the comparison is exact in fp32.

accelerate 1.16 sets up FSDP only on accelerator devices (AcceleratorState takes the FSDP plugin for
MULTI_GPU, MULTI_XPU, … and not MULTI_CPU); on CPU the trainer refuses an FSDP config in one line
rather than train plain data parallel under its name (the first test). To run FSDP2's sharding
here all the same, the worker turns accelerate's CPU state into FSDP (`_force_fsdp_on_cpu`):
`fully_shard` over gloo is real, only accelerate's device check is bypassed.

Run as a script, this file is the worker (started by `accelerate launch`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"fsdp": ROOT / "configs" / "fsdp.yaml", "zero2": ROOT / "configs" / "deepspeed_zero2.yaml",
           "zero3": ROOT / "configs" / "deepspeed_zero3.yaml"}
ALGOS = ("grpo", "matpo", "pact")

pytestmark = pytest.mark.sharded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(config: str, tmp: Path, model: Path, samples: Path, algos: str, force_fsdp: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS[config]), "--num_processes", "2",
           "--mixed_precision", "no", "--main_process_port", str(_free_port()),
           __file__, str(model), str(samples), str(tmp), algos, "force" if force_fsdp else "as-is"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def samples(tmp_path_factory, tiny_model_dir) -> Path:
    from transformers import AutoTokenizer
    from trainer_fixtures import EXPERT_TRACE, make_rows, prepend_prompt, write_samples

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = make_rows(tok, n_tasks=2, k=4, rewards=[1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.75, 0.5])
    system = rows[1]["input_ids"][:60]  # a common system prompt: every process's micro-batch shares a prefix
    rows = [prepend_prompt(r, system) for r in rows]
    return write_samples(tmp_path_factory.mktemp("sharded"), rows, {r["task_id"]: EXPERT_TRACE for r in rows})


def step(algo: str, model_dir: Path, samples: Path, out: Path) -> dict:
    """One SGD step (lr 1) of `algo`; on every process: the logged loss, the tokens the first
    micro-batch computed and would without sharing prefixes, and the weights after the step (whole)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import harnessrl.trainer.run as run
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import load_samples

    extra = {"pact": {"pact_q": 0.5, "beta": 0.0}, "capo": {"capo_gamma": 0.5, "partition": str(samples / "partition.pt")}}.get(algo, {})
    cfg = TrainConfig(samples=str(samples), model=str(model_dir), out=str(out), algo=algo, steps=1, batch_size=8, lr=1.0,
                      optim="sgd", report_to="none", **extra).validate()
    torch.manual_seed(0)
    tr = run.TRAINERS[algo](AutoModelForCausalLM.from_pretrained(model_dir), cfg, load_samples(samples),
                            AutoTokenizer.from_pretrained(model_dir), trl_args=dict(max_grad_norm=1.0, disable_tqdm=True))
    mine = tr.plan.micro_batches(0, tr.accelerator.process_index)[0]  # this process's first micro-batch
    shared = tr.fixed_batch(mine)["packed"].tokens
    whole = sum(len(tr.data.samples[i].input_ids) for i in mine)
    tr.train()
    state = tr.accelerator.get_state_dict(tr.model_wrapped)
    return {"loss": tr.state.log_history[0]["loss"], "tokens": (shared, whole), "kind": tr.accelerator.distributed_type.name,
            "state": {k: v.detach().cpu().clone() for k, v in state.items()} if state else {}}


def test_fsdp_on_cpu_is_refused_in_one_line(samples, tiny_model_dir, tmp_path):
    r = _launch("fsdp", tmp_path, tiny_model_dir, samples, "grpo", force_fsdp=False)
    assert r.returncode != 0
    assert "FSDP needs a GPU" in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "result.pt").exists()


def test_capo_sharded_is_refused(samples, tiny_model_dir, tmp_path):
    # Let through, capo under ZeRO-2 trained without an error and moved the weights by up to 0.0125
    # away from one process's step (its routed .grad is not what ZeRO reduces), and under FSDP2 it
    # failed inside its routing (aten.index_add_ "got mixed torch.Tensor and DTensor").
    step("capo", tiny_model_dir, samples, tmp_path / "partition")  # makes the partition file the workers would load
    r = _launch("zero2", tmp_path, tiny_model_dir, samples, "capo", force_fsdp=False)
    assert r.returncode != 0
    assert "capo cannot run under DEEPSPEED" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_two_sharded_processes_step_as_one(config, samples, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    r = _launch(config, tmp_path, tiny_model_dir, samples, ",".join(ALGOS), force_fsdp=config == "fsdp")
    assert r.returncode == 0, r.stderr[-3000:]
    two = torch.load(tmp_path / "result.pt")
    start = load_file(tiny_model_dir / "model.safetensors")
    for algo in ALGOS:
        got = two[algo]
        assert got["kind"] == {"fsdp": "FSDP"}.get(config, "DEEPSPEED")
        shared, whole = got["tokens"]
        assert shared <= whole - 60, (algo, shared, whole)  # rank 0's micro-batch computed a shared prefix once
        one = step(algo, tiny_model_dir, samples, tmp_path / f"one-{algo}")
        assert got["loss"] == pytest.approx(one["loss"], abs=1e-6), algo
        assert got["state"].keys() == one["state"].keys()
        moved = 0.0
        for name, w0 in start.items():
            g_one, g_two = w0 - one["state"][name], w0 - got["state"][name]  # lr 1: the (clipped) gradient
            moved = max(moved, float(g_one.abs().max()))
            assert torch.allclose(g_two, g_one, atol=1e-6, rtol=1e-4), (algo, name, float((g_two - g_one).abs().max()))
        assert moved > 1e-3, algo  # the step did move the weights: the comparison is not of two no-ops


def _force_fsdp_on_cpu() -> None:
    """Make accelerate's CPU data-parallel state FSDP, with the plugin the launcher's config put in the
    environment (see the module's docstring)."""
    import accelerate.state as state
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    init = state.AcceleratorState.__init__

    def fsdp_init(self, *a, **kw):
        init(self, *a, **kw)
        if self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = FullyShardedDataParallelPlugin()

    state.AcceleratorState.__init__ = fsdp_init


if __name__ == "__main__":  # the worker of test_two_sharded_processes_step_as_one
    model_dir, samples_dir, out_dir, algos, force = sys.argv[1:6]
    if force == "force":
        _force_fsdp_on_cpu()
    rank = os.environ["RANK"]
    results = {a: step(a, Path(model_dir), Path(samples_dir), Path(out_dir) / f"{a}-rank{rank}") for a in algos.split(",")}
    if rank == "0":
        torch.save(results, Path(out_dir) / "result.pt")
    # gloo's threads must be stopped before the interpreter exits, or a rank can abort after its work
    torch.distributed.destroy_process_group()
