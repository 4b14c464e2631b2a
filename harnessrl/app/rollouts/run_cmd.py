"""`harnessrl run -- CMD` and `harnessrl reward`: one rollout around any program.

A rollout is created, the program runs with the variables that point a harness at it (the
base-URL variables SDKs honour, and with interception the proxy and CA variables), the outcome
is taken from the program (`--reward-from`) and the rollout is finished. Without an outcome
source, `harnessrl run` leaves the rollout running for its outcome: a finished rollout takes no
more rewards, so `harnessrl reward ROLLOUT VALUE` records the outcome and then finishes it.
`loop --cmd` runs each of its rollouts through `run_in_rollout` too.

The command gets its rollout's own key, never the operator's: a program under training could
otherwise list, score and finish any rollout. When the outcome is taken here (`--reward-from`, a
coding task's tests), the rollout is created `outcome_by: scorer`, so that key cannot set it either.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO

import httpx

from harnessrl.app.rollouts.codex_home import KEY_ENV, codex_home
from harnessrl.app.rollouts.command import RunOptions, RunResult, check_reward_from, outcome_of, reward_file_of
from harnessrl.app.rollouts.gemini_home import HOME_ENV as GEMINI_HOME_ENV, write_gemini_home
from harnessrl.app.rollouts.intercept import InterceptConfig, Interceptor, ca_dir, find_mitmdump, start_intercept
from harnessrl.app.rollouts.limited_run import run_limited_rollout
from harnessrl.client import OPERATOR_KEY_ENV, HarnessRL, HarnessRLError, Rollout, forget_key, remember_key
from harnessrl.console import Console
from harnessrl.errors import UserError

# the operator's keys (the proxy's, the viewer's): never in a rollout's environment
OPERATOR_ENV = (OPERATOR_KEY_ENV, "HARNESSRL_UI_API_KEY")
_err = Console(stderr=True, soft_wrap=True, highlight=False)


def proxy_key() -> str | None:
    return os.environ.get(OPERATOR_KEY_ENV) or None


@contextmanager
def owned_proxy(cfg) -> Iterator:
    """`run_proxy(cfg)` for an embedded proxy: with no key given (--api-key, $HARNESSRL_PROXY_API_KEY),
    one made here, so that only this process (which holds it, `remember_key`) can create, list,
    score and finish rollouts, and each rollout's key is checked."""
    from harnessrl.proxy.server import run_proxy

    cfg.api_key = cfg.api_key or proxy_key() or secrets.token_urlsafe(32)
    with run_proxy(cfg) as proxy:
        remember_key(proxy.url, cfg.api_key)
        try:
            yield proxy
        finally:
            forget_key(proxy.url)


def command_env(base: dict[str, str]) -> dict[str, str]:
    """`base` less the operator's keys."""
    return {k: v for k, v in base.items() if k not in OPERATOR_ENV}


def rollout_env(ro: Rollout, proxy_url: str, agent: str, interceptor: Interceptor | None) -> dict[str, str]:
    """What the command gets on top of this environment (less the operator's keys, `command_env`).
    Its own API keys are left alone with interception (they never leave mitmdump); otherwise, and
    where it has none, the rollout's own key (for OpenAI, Anthropic and Gemini clients), which is
    also in HARNESSRL_KEY (what the Codex provider of `codex_home` sends, and `harnessrl reward`
    inside the rollout)."""
    base = ro.base_url(agent)
    key = ro.api_key(agent)
    # ANTHROPIC_BASE_URL without /v1: the official SDKs append /v1/messages, the Vercel AI SDK
    # (OpenCode) appends /messages, and the proxy serves both paths; Google's SDKs append /v1beta/…
    env = {"HARNESSRL_PROXY": proxy_url, "HARNESSRL_ROLLOUT": ro.id, "HARNESSRL_AGENT": agent,
           "HARNESSRL_BASE_URL": base, KEY_ENV: key, "OPENAI_BASE_URL": base, "OPENAI_API_BASE": base,
           "ANTHROPIC_BASE_URL": base.removesuffix("/v1"), "GOOGLE_GEMINI_BASE_URL": base.removesuffix("/v1")}
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        if interceptor is None or not os.environ.get(name):
            env[name] = key  # (without interception its own key would reach the proxy: refused)
    if interceptor is None and os.environ.get("GOOGLE_API_KEY"):
        env["GOOGLE_API_KEY"] = key  # Google's SDKs prefer it to GEMINI_API_KEY
    if not os.environ.get("MSWEA_COST_TRACKING"):
        # mini-swe-agent stops on a model litellm has no price for, as a model behind the proxy usually is
        env["MSWEA_COST_TRACKING"] = "ignore_errors"
    if interceptor is not None:
        env.update(interceptor.env(key))
    return env


def _execute(cmd: list[str] | str, env: dict[str, str], stdout: IO | None, tee_last_line: bool) -> tuple[int, str | None]:
    """Run the command (argv, or a shell line), stdin and stderr inherited (stderr joins `stdout`
    when that is a file). Returns its exit code and, if asked, the last non-empty stdout line."""
    shell = isinstance(cmd, str)
    if stdout is not None:
        code = subprocess.run(cmd, shell=shell, env=env, stdout=stdout, stderr=subprocess.STDOUT).returncode
        last = None
        if tee_last_line:
            stdout.flush()
            lines = [ln for ln in Path(stdout.name).read_text(errors="replace").splitlines() if ln.strip()]
            last = lines[-1] if lines else None
        return code, last
    if not tee_last_line:
        return subprocess.run(cmd, shell=shell, env=env).returncode, None
    last = None
    with subprocess.Popen(cmd, shell=shell, env=env, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # passed on as it comes: the command's output is still the user's
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            if line.strip():
                last = line.decode(errors="replace").strip()
    return proc.returncode, last


def run_in_rollout(client: HarnessRL, cmd: list[str] | str | Callable[[Rollout], str], opts: RunOptions,
                   interceptor: Interceptor | Callable[[Rollout], AbstractContextManager[Interceptor]] | None,
                   stdout: IO | None = None, on_created=None, extra_env: dict[str, str] | None = None,
                   keep_open: bool = False) -> RunResult:
    """Create a rollout, run `cmd` in it (argv, shell line, or a function of the rollout giving the
    shell line), report its outcome, finish it (also when the command could not start or was interrupted;
    as failed when it crashed or timed out under `opts.limits`). `interceptor`: a running one, or a
    function that starts one for this rollout. `keep_open`: a rollout whose command ran to its end
    stays running (its outcome comes later)."""
    check_reward_from(opts.reward_from)
    scored = opts.reward_from is not None or opts.coding is not None
    ro = client.create_rollout(opts.task, opts.group, opts.run, opts.metadata, "scorer" if scored else "harness")
    if on_created is not None:
        on_created(ro)
    try:
        with ExitStack() as stack:
            if callable(interceptor):
                interceptor = stack.enter_context(interceptor(ro))
            result = _run_and_score(ro, client.url, cmd, opts, interceptor, stdout, extra_env)
    except BaseException as exc:
        try:  # failed, with why: a rollout that ended without its outcome must not pass for a finished one
            ro.finish(error=f"the rollout raised {type(exc).__name__}: {str(exc)[:200]}".encode(
                "utf-8", "backslashreplace").decode())
        except Exception:  # noqa: BLE001 - the proxy is gone too: `jobs.settle` fails it later
            pass
        raise
    if result.error is not None and result.outcome is None:
        ro.finish(error=result.error)  # failed: no outcome to learn from (one with an outcome keeps it)
    elif not keep_open:
        ro.finish()
    return result


def _run_and_score(ro: Rollout, proxy_url: str, cmd, opts: RunOptions, interceptor: Interceptor | None,
                   stdout: IO | None, extra_env: dict[str, str] | None) -> RunResult:
    if callable(cmd):
        cmd = cmd(ro)
    env = {**command_env(dict(os.environ)), **rollout_env(ro, proxy_url, opts.agent, interceptor), **(extra_env or {})}
    with codex_home(ro.base_url(opts.agent), env) as home:
        env["CODEX_HOME"] = str(home)  # Codex ignores OPENAI_BASE_URL: a provider config instead
        # Gemini CLI takes GOOGLE_GEMINI_BASE_URL only with API-key auth selected in its settings
        env[GEMINI_HOME_ENV] = str(write_gemini_home(home, env))
        if opts.limits is not None:
            urls = [proxy_url] + ([interceptor.url] if interceptor is not None else [])
            return run_limited_rollout(ro, cmd, opts, env, stdout, urls, home)
        code, outcome, warning = _score(ro, cmd, opts, env, stdout)
        return RunResult(ro.id, code, outcome, [warning] if warning else [])


def _score(ro: Rollout, cmd, opts: RunOptions, env: dict[str, str],
           stdout: IO | None) -> tuple[int, float | None, str | None]:
    reward_file = reward_file_of(opts, env)
    try:
        code, last = _execute(cmd, env, stdout, opts.reward_from == "stdout-json")
    except OSError as exc:
        raise UserError(f"cannot run {cmd if isinstance(cmd, str) else cmd[0]!r}: {exc.strerror}") from None
    outcome, warning = outcome_of(opts.reward_from, code, last, reward_file)
    if outcome is not None:
        ro.reward(outcome)
    return code, outcome, warning


@contextmanager
def proxy_for(url: str | None, model: Path | None, db: str,
              teacher: tuple[str, str | None, str, str | None] | None = None) -> Iterator[str]:
    """The given proxy, or one on the embedded default (SQLite, local backend) for the block; with
    `teacher` (url, key, dialect, model name), one whose upstream is that stronger model."""
    if url:
        yield url.rstrip("/")
        return
    if teacher is not None:
        from harnessrl.proxy.server import ProxyConfig

        t_url, key, dialect, name = teacher
        with owned_proxy(ProxyConfig(db=db, upstream=t_url, upstream_api_key=key, upstream_dialect=dialect,
                                     upstream_model=name, port=0)) as proxy:
            yield proxy.url
        return
    if model is None:
        raise UserError("give --proxy URL (a running harnessrl proxy) or --model DIR (start one here, recording to --db)")
    from transformers.utils import logging as hf_logging

    from harnessrl.proxy.server import ProxyConfig

    hf_logging.disable_progress_bar()  # stderr is the command's: no weight-loading bar in it
    with owned_proxy(ProxyConfig(db=db, backend="local", model=str(model), port=0)) as proxy:
        yield proxy.url


def run_command(argv: list[str], opts: RunOptions, proxy: str | None, model: Path | None, db: str,
                intercept: InterceptConfig | None, teacher: tuple[str, str | None, str, str | None] | None = None) -> int:
    """`harnessrl run`: the command's exit code."""
    if not argv:
        raise UserError("give the command after --, e.g. harnessrl run --model DIR -- python agent.py")
    check_reward_from(opts.reward_from)
    with ExitStack() as stack:
        starter = None
        if intercept is not None:
            intercept.mitmdump = find_mitmdump(intercept.mitmdump)  # before any rollout is made
            # mitmdump's own output goes to a log beside the CA, not into the command's terminal
            log = stack.enter_context(open(ca_dir(intercept.ca_dir) / "mitmdump.log", "a"))

            def starter(ro: Rollout) -> AbstractContextManager[Interceptor]:
                # the rollout is also mitmdump's default identity, for clients that drop the proxy URL's username
                # its key for calls that name no identity: the rollout's own, never the operator's
                return start_intercept(replace(intercept, proxy=url, proxy_key=ro.api_key(opts.agent),
                                               rollout=ro.id, agent=opts.agent), log=log)
        url = stack.enter_context(proxy_for(proxy, model, db, teacher))
        client = stack.enter_context(HarnessRL(url))  # the operator's key (`client.default_key`)
        try:
            result = run_in_rollout(client, argv, opts, starter,
                                    on_created=lambda ro: _err.print(f"harnessrl run: rollout {ro.id}"),
                                    keep_open=opts.reward_from is None and opts.coding is None)
        except HarnessRLError as exc:
            raise UserError(f"the proxy at {url} refused: {exc}") from None
        except httpx.TransportError as exc:
            raise UserError(f"cannot reach the proxy at {url}: {exc}") from None
        except OSError as exc:  # the sandbox or the command could not start: one line, the rollout failed
            raise UserError(f"cannot run the command: {exc.strerror or exc}") from None
    for warning in result.warnings:
        _err.print(f"[yellow]warning:[/yellow] {warning}")
    if result.outcome is not None:
        _err.print(f"harnessrl run: rollout {result.rollout_id} outcome {result.outcome:g}")
    elif opts.reward_from is None and opts.coding is None:
        _err.print(f"harnessrl run: rollout {result.rollout_id} stays running for its outcome: "
                   f"harnessrl reward {result.rollout_id} VALUE (records it and finishes the rollout)")
    return result.exit_code


def report_reward(proxy: str, rollout: str, value: float, name: str, finish: bool = True) -> None:
    """`harnessrl reward ROLLOUT VALUE`: the outcome, then (unless `finish` is off) the finish; with
    the operator's key, or inside a rollout its own ($HARNESSRL_KEY, `client.default_key`)."""
    with HarnessRL(proxy) as client:
        try:
            client.reward(rollout, value, name)
            if finish:
                client.finish(rollout)
        except HarnessRLError as exc:
            raise UserError(f"the proxy at {proxy} refused: {exc}") from None
