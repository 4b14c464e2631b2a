"""The commands that trace a harness from outside: `intercept`, `run -- CMD`, `reward`."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
from pathlib import Path

import typer

from harnessrl.cli_options import old_spelling, renamed, warn_deprecated
from harnessrl.errors import UserError

_HOSTS_HELP = "YAML/JSON list of more LLM API hosts: names such as llm.corp.example or patterns such as *.gw.example."
_MITM_HELP = "The mitmdump of mitmproxy's own venv (default: $HARNESSRL_MITMDUMP, .venv-mitm, PATH)."
_CA_HELP = "Directory of the interception CA (default: $HARNESSRL_HOME/mitmproxy, ~/.harnessrl/mitmproxy)."


# the help panels of `run`
ROLLOUT, PROXY, INTERCEPTION, LIMITS = "Rollout", "Proxy", "Interception", "Limits"
# the per-rollout options of `run` and `loop --cmd` (limited_run.RolloutFlags)
SANDBOX_HELP = ("bwrap (bubblewrap: read-only system, writable workspace, no network but the proxy) | none; "
                "default: bwrap for tasks with a workspace, else none. An unusable bwrap is an error, never skipped.")
MEMORY_HELP = "Memory per process of the command (RLIMIT_DATA), e.g. 8G or 512M; 0: unlimited."
CPU_HELP = "CPU seconds per process of the command (RLIMIT_CPU)."
# the caps a policy hits as its own failure (scored, never a failed rollout): docs/coding.md, "Sandbox and rewards"
PROCS_HELP = ("Processes and threads of the whole rollout (a pids cgroup where one can be made, else RLIMIT_NPROC in "
              "the sandbox); 0: no cap.")
FILE_SIZE_HELP = "Size of any file the command writes (RLIMIT_FSIZE), e.g. 1G; 0: unlimited."
DISK_HELP = ("--sandbox bwrap: size of the tmpfs holding the workspace, HOME and TMPDIR (and of /dev/shm), e.g. 2G; "
             "0: unlimited.")
OUTPUT_HELP = "Of the command's stdout and stderr, what the host keeps (the start and the end), e.g. 4M; 0: all."
REWARD_CMD_HELP = ("Shell line run in the workspace (in the sandbox) after the command to score it; default for "
                   "tasks with hidden tests: python -m pytest -q hidden_tests.")
REWARD_MODE_HELP = "Reward from the tests: pass-fraction (passed / run) | all-pass (1 only if all pass)."
# `run` and `loop --cmd`: one spelling of the command's own outcome (a file: `file`, one per rollout)
REWARD_FROM_HELP = ("Outcome: exit-code (0 → 1.0, else 0.0) | stdout-json (last line: 0.7 or {\"reward\": 0.7}) | "
                    "file (written by the command, one per rollout; its path is in $HARNESSRL_REWARD_FILE).")


def rollout_flags(sandbox: str | None, timeout: float | None, memory: str, cpu_time: int | None,
                  reward_cmd: str | None, reward_mode: str, procs: int = 1024, file_size: str = "1G",
                  disk: str = "2G", output: str = "4M"):
    from harnessrl.app.rollouts.limited_run import RolloutFlags
    from harnessrl.app.sandbox.run import parse_size

    if procs < 0:
        raise UserError(f"--max-procs {procs}: a number of processes, or 0 for no cap")
    return RolloutFlags(sandbox, timeout, parse_size(memory), cpu_time, reward_cmd, reward_mode, procs=procs or None,
                        file_size=parse_size(file_size, "--file-size"), disk=parse_size(disk, "--disk"),
                        output=parse_size(output, "--max-output"))


_CAPS = {"procs": (1024, "--max-procs", PROCS_HELP), "file_size": ("1G", "--file-size", FILE_SIZE_HELP),
         "disk": ("2G", "--disk", DISK_HELP), "output": ("4M", "--max-output", OUTPUT_HELP)}


def cap_option(key: str, panel: str, prefix: str = ""):
    """One cap option of `run` and `loop --cmd`, with Limits' default (`key`: its RolloutFlags field)."""
    default, flag, text = _CAPS[key]
    return typer.Option(default, flag, rich_help_panel=panel, help=prefix + text)


def _exit_on_sigterm() -> None:
    """A SIGTERM unwinds like Ctrl-C, so mitmdump is stopped and the rollout finished, not orphaned."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def register(app: typer.Typer) -> None:
    @app.command("intercept")
    def intercept(
        proxy: str = typer.Option("http://127.0.0.1:8000", "--proxy", help="The recording proxy."),
        port: int = typer.Option(8080, "--port", help="Port of the interception proxy (HTTPS_PROXY)."),
        rollout: str = typer.Option(None, "--rollout", help="Rollout of calls that carry no hrl- key."),
        agent: str = typer.Option(None, "--agent", help="Agent name of calls that carry no hrl- key."),
        hosts: Path = typer.Option(None, "--hosts", help=_HOSTS_HELP),
        only_llm: bool = typer.Option(False, "--only-llm", help="Refuse (403) all traffic that is not an LLM API call."),
        mitmdump: str = typer.Option(None, "--mitmdump", help=_MITM_HELP),
        ca: Path = typer.Option(None, "--ca-dir", help=_CA_HELP),
    ) -> None:
        """Route the LLM API calls of any program (api.openai.com, api.anthropic.com, Azure OpenAI,
        OpenRouter, the Gemini API, --hosts) into the recording proxy, with mitmproxy; the client's keys are dropped."""
        from harnessrl.app.rollouts.intercept import InterceptConfig, describe, read_hosts, start_intercept
        from harnessrl.app.rollouts.run_cmd import proxy_key

        cfg = InterceptConfig(proxy=proxy.rstrip("/"), port=port, rollout=rollout, agent=agent, hosts=read_hosts(hosts),
                              only_llm=only_llm, mitmdump=mitmdump, ca_dir=ca, proxy_key=proxy_key())
        _exit_on_sigterm()
        with start_intercept(cfg, log=None, quiet=False) as icpt:
            print(describe(icpt), file=sys.stderr, flush=True)
            try:
                icpt.process.wait()
            except KeyboardInterrupt:
                pass  # start_intercept stops mitmdump

    @app.command("run", context_settings={"ignore_unknown_options": True})
    def run(
        cmd: list[str] = typer.Argument(None, help="The command and its arguments, after --."),
        task: str = typer.Option(None, "--task", rich_help_panel=ROLLOUT,
                                 help="Task id of the rollout (with --tasks: the task to run)."),
        tasks: Path = typer.Option(None, "--tasks", rich_help_panel=ROLLOUT,
                                   help="A tasks JSONL (e.g. `harnessrl tasks coding`): run --task of it, in a fresh "
                                   "copy of its workspace, scored by its hidden tests."),
        group_id: str = typer.Option(None, "--group-id", rich_help_panel=ROLLOUT,
                                     help="Group id of the rollout (GRPO group)."),
        group_old: str = old_spelling("--group"),
        run_tag: str = typer.Option(None, "--run", rich_help_panel=ROLLOUT, help="Run tag of the rollout."),
        agent: str = typer.Option("main", "--agent", rich_help_panel=ROLLOUT,
                                  help="Agent name of the command's calls."),
        reward_from: str = typer.Option(None, "--reward-from", rich_help_panel=ROLLOUT, help=REWARD_FROM_HELP),
        proxy: str = typer.Option(None, "--proxy", rich_help_panel=PROXY,
                                  help="A running proxy (default: start one with --model, --db)."),
        model: Path = typer.Option(None, "--model", rich_help_panel=PROXY,
                                   help="Without --proxy: checkpoint of the local backend."),
        db: str = typer.Option("runs.db", "--db", rich_help_panel=PROXY, help="Without --proxy: the records DB."),
        # the embedded proxy's upstream: the `harnessrl proxy` names (a teacher, in the run tag)
        teacher: str = typer.Option(None, "--upstream", rich_help_panel=PROXY,
                                    help="Without --proxy: record the command against this stronger model (its base "
                                    "URL) instead of --model; run tag 'teacher' unless --run."),
        teacher_key: str = typer.Option(None, "--upstream-api-key", rich_help_panel=PROXY,
                                        envvar=["HARNESSRL_UPSTREAM_API_KEY", "HARNESSRL_TEACHER_API_KEY"],
                                        help="The upstream's API key (never recorded)."),
        teacher_dialect: str = typer.Option("openai-chat", "--upstream-dialect", rich_help_panel=PROXY,
                                            help="openai-chat | openai-responses | anthropic."),
        teacher_model: str = typer.Option(None, "--upstream-model", rich_help_panel=PROXY,
                                          help="Model name to ask the upstream for."),
        teacher_old: str = old_spelling("--teacher"),
        teacher_key_old: str = old_spelling("--teacher-key"),
        teacher_dialect_old: str = old_spelling("--teacher-dialect"),
        teacher_model_old: str = old_spelling("--teacher-model"),
        intercept: bool = typer.Option(True, "--intercept/--no-intercept", rich_help_panel=INTERCEPTION,
                                       help="Route hard-coded LLM API hosts through mitmproxy (default: on)."),
        only_llm: bool = typer.Option(False, "--only-llm", rich_help_panel=INTERCEPTION,
                                      help="With interception: refuse all other traffic (403)."),
        hosts: Path = typer.Option(None, "--hosts", rich_help_panel=INTERCEPTION, help=_HOSTS_HELP),
        mitmdump: str = typer.Option(None, "--mitmdump", rich_help_panel=INTERCEPTION, help=_MITM_HELP),
        ca: Path = typer.Option(None, "--ca-dir", rich_help_panel=INTERCEPTION, help=_CA_HELP),
        sandbox: str = typer.Option(None, "--sandbox", rich_help_panel=LIMITS, help=SANDBOX_HELP),
        timeout: float = typer.Option(None, "--timeout", rich_help_panel=LIMITS,
                                      help="Seconds the command may run; then its whole process tree is killed and the "
                                      "rollout fails (default: no limit)."),
        memory: str = typer.Option("8G", "--memory", rich_help_panel=LIMITS,
                                   help=MEMORY_HELP + " Applied with --sandbox, --timeout or --tasks."),
        cpu_time: int = typer.Option(3600, "--cpu-time", rich_help_panel=LIMITS, help=CPU_HELP),
        max_procs: int = cap_option("procs", LIMITS),
        file_size: str = cap_option("file_size", LIMITS),
        disk: str = cap_option("disk", LIMITS),
        max_output: str = cap_option("output", LIMITS),
        reward_cmd: str = typer.Option(None, "--reward-cmd", rich_help_panel=LIMITS, help=REWARD_CMD_HELP),
        reward_mode: str = typer.Option("pass-fraction", "--reward-mode", rich_help_panel=LIMITS,
                                        help=REWARD_MODE_HELP),
    ) -> None:
        """Run CMD as one rollout: base-URL variables (and a Codex provider, CODEX_HOME) and
        (default) interception set, outcome reported, rollout finished; exits with CMD's exit code."""
        from harnessrl.app.rollouts.command import REWARD_SOURCES, RunOptions
        from harnessrl.app.rollouts.intercept import InterceptConfig, read_hosts
        from harnessrl.app.rollouts.run_cmd import run_command
        from harnessrl.app.sandbox.run import db_files

        group_id = renamed(group_id, group_old, "--group", "--group-id")
        teacher = renamed(teacher, teacher_old, "--teacher", "--upstream")
        teacher_key = renamed(teacher_key, teacher_key_old, "--teacher-key", "--upstream-api-key")
        teacher_dialect = renamed(teacher_dialect, teacher_dialect_old, "--teacher-dialect", "--upstream-dialect")
        teacher_model = renamed(teacher_model, teacher_model_old, "--teacher-model", "--upstream-model")
        icfg = InterceptConfig(proxy="", port=0, hosts=read_hosts(hosts), only_llm=only_llm, mitmdump=mitmdump,
                               ca_dir=ca) if intercept else None
        if not intercept and (only_llm or hosts):
            raise UserError("--only-llm and --hosts need interception (drop --no-intercept)")
        _exit_on_sigterm()
        if teacher and (proxy or model):
            raise UserError("--upstream starts a proxy in front of that model: give it without --proxy and --model")
        reward_dir = tempfile.mkdtemp(prefix="harnessrl-reward-") if reward_from == "file" else None
        if reward_dir is not None:
            reward_from = str(Path(reward_dir) / "reward")
        elif reward_from not in (None, *REWARD_SOURCES):
            warn_deprecated(f"--reward-from {reward_from}", "--reward-from file (the command finds the file's path "
                            "in $HARNESSRL_REWARD_FILE)")
        opts = RunOptions(task=task, group=group_id, run=run_tag or ("teacher" if teacher else None), agent=agent,
                          reward_from=reward_from, hidden=() if proxy else db_files(db))
        if tasks is not None or sandbox is not None or timeout is not None or reward_cmd is not None:
            from harnessrl.app.rollouts.limited_run import limit_run

            flags = rollout_flags(sandbox, timeout, memory, cpu_time, reward_cmd, reward_mode, max_procs, file_size,
                                  disk, max_output)
            opts = limit_run(opts, tasks, flags)
        mentor = (teacher, teacher_key, teacher_dialect, teacher_model) if teacher else None
        try:
            code = run_command(list(cmd or []), opts, proxy, model, db, icfg, teacher=mentor)
        finally:
            if reward_dir is not None:
                shutil.rmtree(reward_dir, ignore_errors=True)
        raise typer.Exit(code)

    @app.command("reward")
    def reward(
        rollout: str = typer.Argument(..., help="The rollout id (`harnessrl run` prints it)."),
        value: float = typer.Argument(..., help="The outcome reward."),
        proxy: str = typer.Option("http://127.0.0.1:8000", "--proxy", envvar="HARNESSRL_PROXY",
                                  help="The proxy that recorded the rollout (default: $HARNESSRL_PROXY or :8000)."),
        name: str = typer.Option("outcome", "--name", help="Reward name."),
        finish: bool = typer.Option(True, "--finish/--keep-open", help="Finish the rollout once its outcome is "
                                    "recorded (a finished rollout takes no more calls or rewards)."),
        db: str | None = typer.Option(None, "--db", help="Record it in this records DB (SQLite path or "
                                      "postgresql+psycopg:// URL) directly, not through a proxy: for a rollout whose "
                                      "proxy no longer runs."),
    ) -> None:
        """Report a running rollout's outcome (for example after grading it), then finish it."""
        if db is not None:
            _reward_in_db(db, rollout, value, name, finish)
            return
        from harnessrl.app.rollouts.run_cmd import report_reward

        report_reward(proxy.rstrip("/"), rollout, value, name, finish)


def _reward_in_db(db: str, rollout: str, value: float, name: str, finish: bool) -> None:
    """`harnessrl reward --db`: the rollout API's own rules (a running rollout, or one the proxy
    finished for being idle), on the DB itself."""
    import math

    from harnessrl.db import open_db
    from harnessrl.proxy.errors import ProxyError
    from harnessrl.proxy.identity import check_id
    from harnessrl.proxy.rollouts.store import Rollouts

    if not math.isfinite(value):
        raise UserError("the reward must be a finite number")
    if "://" not in db and not Path(db).is_file():
        raise UserError(f"no records DB at {db}")
    engine, Session = open_db(db)
    try:
        check_id("rollout", rollout)
        store = Rollouts(Session)
        store.outcome(rollout, value, name, None)
        if finish:
            store.finish(rollout)
    except ProxyError as exc:
        raise UserError(exc.message) from None
    finally:
        engine.dispose()

