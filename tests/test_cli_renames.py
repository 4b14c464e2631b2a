"""One name per concept across commands (issue 32): the new spellings, and the old ones still accepted
for one release (a one-line deprecation warning on stderr, the same result as the new spelling);
the command panels of `harnessrl --help`; `harnessrl vllm --dry-run` without vLLM."""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

from harnessrl.app.cli import PANELS, app
from harnessrl.app.loop.config import LoopConfig, Teacher
from harnessrl.errors import UserError
from harnessrl.trainer.config import TrainConfig
from test_cli_options import _distinct_argv

pytestmark = pytest.mark.unit


class _Stop(Exception):
    pass


def _invoke(argv: list[str]):
    return CliRunner().invoke(app, argv)


def _same_with_warning(new, old, old_spelling: str, new_spelling: str) -> None:
    """The old spelling gave the same result as the new one, and said which spelling to use instead."""
    assert "deprecated" not in new.stderr
    line = next(ln for ln in old.stderr.splitlines() if "deprecated" in ln)
    assert old_spelling in line and f"use {new_spelling}" in line


@pytest.mark.parametrize("command", [["compile"], ["inspect", "--rollout", "r"],
                                     ["traces", "from-rollouts", "--into-db"]])
def test_the_records_db_is_db_and_the_positional_one_is_deprecated(tmp_path, command):
    db = str(tmp_path / "none.db")
    new, old = _invoke([*command, "--db", db]), _invoke([*command, db])
    assert isinstance(new.exception, UserError) and "records DB not found" in str(new.exception)
    assert str(old.exception) == str(new.exception)
    _same_with_warning(new, old, "the records DB as an argument", "--db")
    neither = _invoke(command)
    assert isinstance(neither.exception, UserError) and "--db" in str(neither.exception)


@pytest.fixture
def ran(monkeypatch):
    """What `harnessrl run` hands to run_command: (options, teacher)."""
    got = []

    def run_command(argv, opts, proxy, model, db, icfg, teacher=None):
        got.append((opts, teacher))
        return 0

    monkeypatch.setattr("harnessrl.app.rollouts.run_cmd.run_command", run_command)
    return got


def test_run_group_id_and_the_embedded_proxys_upstream_names(ran):
    base = ["run", "--no-intercept", "--task", "t"]
    new = _invoke([*base, "--group-id", "g1", "--upstream", "http://u", "--upstream-api-key", "k",
                   "--upstream-dialect", "anthropic", "--upstream-model", "m", "--", "true"])
    old = _invoke([*base, "--group", "g1", "--teacher", "http://u", "--teacher-key", "k",
                   "--teacher-dialect", "anthropic", "--teacher-model", "m", "--", "true"])
    assert new.exit_code == old.exit_code == 0, (new.output, old.output)
    assert ran[0] == ran[1]
    opts, teacher = ran[0]
    assert opts.group == "g1" and opts.run == "teacher" and teacher == ("http://u", "k", "anthropic", "m")
    for old_name, new_name in [("--group", "--group-id"), ("--teacher", "--upstream"),
                               ("--teacher-key", "--upstream-api-key"), ("--teacher-dialect", "--upstream-dialect"),
                               ("--teacher-model", "--upstream-model")]:
        assert any(f"{old_name} is deprecated" in ln and f"use {new_name}" in ln for ln in old.stderr.splitlines())


def test_run_reward_from_file_is_one_spelling_and_a_path_is_deprecated(ran, tmp_path):
    new = _invoke(["run", "--no-intercept", "--reward-from", "file", "--", "true"])
    assert new.exit_code == 0 and "deprecated" not in new.stderr
    path = ran[0][0].reward_from
    assert path.endswith("reward") and "harnessrl-reward-" in path
    old = _invoke(["run", "--no-intercept", "--reward-from", str(tmp_path / "r.txt"), "--", "true"])
    assert old.exit_code == 0 and ran[1][0].reward_from == str(tmp_path / "r.txt")
    _same_with_warning(new, old, f"--reward-from {tmp_path / 'r.txt'}", "--reward-from file")


@pytest.fixture
def looped(monkeypatch):
    got = []

    def run_loop(cfg):
        got.append(cfg)

    monkeypatch.setattr("harnessrl.app.loop.sync.run_loop", run_loop)
    return got


def test_every_loop_flag_fills_its_config_field(looped):
    argv, want = _distinct_argv(LoopConfig)
    teacher_argv, teacher_want = _distinct_argv(Teacher)
    res = _invoke(["loop", *argv, *teacher_argv, "--timeout", "7", "--memory", "1G"])
    assert res.exit_code == 0, res.output
    cfg = looped[0]
    assert {k: getattr(cfg, k) for k in want} == want
    assert dataclasses.asdict(cfg.teacher) == teacher_want
    assert (cfg.cmd_flags.timeout, cfg.cmd_flags.memory) == (7.0, 1024 ** 3)
    assert _invoke(["loop", "--model", "m"]).exit_code == 0 and looped[1].teacher is None  # no --teacher: none
    assert looped[1] == LoopConfig(model="m", cmd_flags=looped[1].cmd_flags)


def test_loop_group_size_and_teacher_api_key(looped, tmp_path):
    base = ["loop", "--harness", "lookup", "--model", str(tmp_path), "--teacher", "http://t"]
    new = _invoke([*base, "--group-size", "3", "--teacher-api-key", "k"])
    old = _invoke([*base, "--group", "3", "--teacher-key", "k"])
    assert new.exit_code == old.exit_code == 0, (new.output, old.output)
    assert looped[0] == looped[1] and looped[0].group == 3 and looped[0].teacher.key == "k"
    _same_with_warning(new, old, "--group", "--group-size")
    assert "--teacher-key is deprecated" in old.stderr


@pytest.fixture
def trained(monkeypatch):
    """The flags `harnessrl train` hands to load_config (training itself stubbed out)."""
    got = []

    def load_config(path, overrides):
        got.append(overrides)
        raise _Stop

    monkeypatch.setattr("harnessrl.trainer.config.load_config", load_config)
    return got


def test_every_train_flag_fills_its_config_field(trained, tmp_path):
    argv, want = _distinct_argv(TrainConfig)
    assert len(want) >= 20
    res = _invoke(["train", str(tmp_path), *argv])
    assert isinstance(res.exception, _Stop), res.output
    assert trained[0] == {**want, "samples": str(tmp_path)}
    _invoke(["train", str(tmp_path)])
    assert trained[1] == {"samples": str(tmp_path)}  # unset flags leave the YAML's and the defaults


def test_train_weight_version_and_the_deprecated_version(trained, tmp_path):
    new = _invoke(["train", str(tmp_path), "--weight-version", "v1"])
    old = _invoke(["train", str(tmp_path), "--version", "v1"])
    assert trained[0] == trained[1] == {"samples": str(tmp_path), "version": "v1"}
    _same_with_warning(new, old, "--version", "--weight-version")


def test_commands_are_listed_in_panels_in_work_order():
    root = typer.main.get_command(app)
    assert set(root.commands) == {name for names in PANELS.values() for name in names}
    assert list(root.commands)[:2] == ["proxy", "run"]
    out = CliRunner().invoke(app, ["--help"], terminal_width=150).output
    assert [out.index(f"─ {title} ") for title in PANELS] == sorted(out.index(f"─ {title} ") for title in PANELS)


def test_vllm_dry_run_prints_the_command_without_vllm(monkeypatch, tmp_path):
    monkeypatch.setattr("harnessrl.trainer.vllm.DEFAULT_BINS", ())
    monkeypatch.delenv("HARNESSRL_VLLM_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no vllm on it
    res = _invoke(["vllm", "org/model", "--port", "8123", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "vllm serve org/model --host 127.0.0.1 --port 8123" in res.stdout
    assert "VLLM_SERVER_DEV_MODE=1" in res.stdout
    real = _invoke(["vllm", "org/model"])
    assert isinstance(real.exception, UserError) and "no vLLM found" in str(real.exception)



@pytest.mark.parametrize("example", ["react", "planner_worker", "langgraph_search", "bfcl_multiturn"])
def test_the_search_examples_call_rollouts_per_task_group_size(example, monkeypatch):
    """The example harnesses' command lines use the loop's name for rollouts per task; `--group` still works."""
    module = importlib.import_module(f"harnessrl.harness_examples.{example}.__main__")
    groups: list[int] = []

    def run_many(fn, tasks, group, concurrency):  # the rollouts themselves are not run
        groups.append(group)
        raise _Stop

    monkeypatch.setattr(module, "run_many", run_many)
    monkeypatch.setattr(module.o, "prepare", lambda *a, **k: SimpleNamespace(tasks=[], env=None))
    monkeypatch.setattr(module.o, "model_name", lambda proxy, model: "m")
    if hasattr(module, "load_tasks"):
        monkeypatch.setattr(module, "load_tasks", lambda *a, **k: [])
    new = CliRunner().invoke(module.app, ["--proxy", "http://x", "--group-size", "3"])
    old = CliRunner().invoke(module.app, ["--proxy", "http://x", "--group", "3"])
    assert isinstance(new.exception, _Stop) and isinstance(old.exception, _Stop), (new.output, old.output)
    assert groups == [3, 3]
    _same_with_warning(new, old, "--group", "--group-size")
