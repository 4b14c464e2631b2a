"""One harness of the compatibility suite (tests/harness_cli.py), run inside a network namespace
with only loopback up: the scripted vLLM stand-in, the proxy in prefix mode in front of it, then
the harness pointed at the proxy by its own base-URL setting, then under `harnessrl run` (with
interception; base-URL variables set), then under `harnessrl run` with no base-URL setting (its
calls go to the vendor's host, where mitmdump catches them); for a harness that asks for it, once
more by base URL through a proxy in pass-through mode (`pass-through`). Writes OUT/results.json:
per mode the exit code, output, rollout id and seconds.

    python harness_cli_session.py OUT HARNESS TOKENIZER
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harness_cli import HARNESSES, KEYS, MODEL, MODES, PASS_THROUGH, TESTS, program
from harnessrl.client import HarnessRL

HARNESSRL = [sys.executable, "-m", "harnessrl"]
TIMEOUT = 150  # one harness run; each takes seconds when it works
UNPOINTED = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_BASE_URL", "GOOGLE_GEMINI_BASE_URL", "CODEX_HOME")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not answer within 120 s")


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> dict:
    """The harness with no terminal, killed (its whole process group) after TIMEOUT."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n[killed after {TIMEOUT} s]"
    return {"rc": proc.returncode, "stdout": stdout, "stderr": stderr, "seconds": round(time.monotonic() - start, 1)}


def _workdir(out: Path, mode: str, files: dict[str, str]) -> Path:
    work = out / f"work-{mode}"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    git = ["git", "-c", "user.name=hrl", "-c", "user.email=hrl@example.invalid"]
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], cwd=work, check=True)
    return work


def _env(out: Path, mode: str, extra: dict[str, str]) -> dict[str, str]:
    """A clean environment: a fresh HOME (no user config leaks in), the fake keys, the harness's own settings."""
    home = out / f"home-{mode}"
    home.mkdir()
    # Codex refuses to make its sandbox helper under the temporary directory, and the session runs
    # under pytest's (in /tmp): a temporary directory of its own, beside the home, lets it
    tmp = out / f"tmp-{mode}"
    tmp.mkdir()
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "HARNESSRL_MITMDUMP") if k in os.environ}
    return {**keep, "HOME": str(home), "TMPDIR": str(tmp), "TERM": "dumb", "NO_COLOR": "1", "GIT_AUTHOR_NAME": "hrl",
            "GIT_AUTHOR_EMAIL": "hrl@example.invalid", "GIT_COMMITTER_NAME": "hrl",
            "GIT_COMMITTER_EMAIL": "hrl@example.invalid", **KEYS, **extra}


def _by_base_url(url: str, name: str, mode: str, out: Path, work: Path) -> dict:
    """The harness pointed at a rollout's path by its own setting (variables, config files)."""
    spec = HARNESSES[name]
    with HarnessRL(url) as client:
        ro = client.create_rollout(f"t-{name}", f"g-{name}", mode)
        root = f"{url}/r/{ro.id}/a/main"
        env = _env(out, mode, {**spec.env, **{k: v.format(root=root, v1=f"{root}/v1")
                                              for k, v in spec.base_env.items()}})
        for path, text in spec.base_files.items():
            (Path(env["HOME"]) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(env["HOME"]) / path).write_text(text.format(root=root, v1=f"{root}/v1"))
        result = _run([str(program(name)), *spec.argv], env, work)
        ro.reward(1.0 if result["rc"] == 0 else 0.0)
        ro.finish()
    return {**result, "rollout": ro.id}


def _proxy(out: Path, sport: int, pport: int, tokenizer: str, prefix: bool) -> subprocess.Popen:
    log = open(out / ("proxy.log" if prefix else "proxy-pass-through.log"), "w")
    return subprocess.Popen(HARNESSRL + ["proxy", "--db", str(out / "runs.db"), "--upstream", f"http://127.0.0.1:{sport}",
                                         "--tokenizer", tokenizer, "--port", str(pport), *(["--prefix"] if prefix else [])],
                            stdout=log, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(out: Path, name: str, tokenizer: str) -> None:
    spec = HARNESSES[name]
    argv = [str(program(name)), *spec.argv]
    sport, pport = _free_port(), _free_port()
    standin = subprocess.Popen([sys.executable, str(TESTS / "vllm_standin.py"), "--tokenizer", tokenizer,
                                "--port", str(sport), "--scripted", "--served-model-name", MODEL],
                               stdout=open(out / "standin.log", "w"), stderr=subprocess.STDOUT)
    proxy = _proxy(out, sport, pport, tokenizer, prefix=True)
    url = f"http://127.0.0.1:{pport}"
    results: dict = {}
    try:
        _wait(f"http://127.0.0.1:{sport}/v1/models", standin, "the stand-in")
        _wait(f"{url}/health", proxy, "the proxy")
        for mode in MODES:
            work = _workdir(out, mode, spec.files)
            if mode == "base-url":
                result = _by_base_url(url, name, mode, out, work)
            else:
                env = _env(out, mode, {**spec.env, "HARNESSRL_HOME": str(out / "hrl-home")})
                # intercept: the harness unpointed (as if it ignored every base-URL setting), so its
                # calls reach the proxy only through mitmdump, to the vendor's host it defaults to
                unpointed = ["env", *(f"-u{v}" for v in UNPOINTED)] if mode == "intercept" else []
                result = _run(HARNESSRL + ["run", "--proxy", url, "--task", f"t-{name}", "--group-id", f"g-{name}",
                                           "--run", mode, "--reward-from", "exit-code", "--", *unpointed, *argv],
                              env, work)
                found = re.search(r"harnessrl run: rollout (\S+)", result["stderr"])
                result["rollout"] = found.group(1) if found else None
            result["files"] = {f: (work / f).read_text() for f in spec.files}
            results[mode] = result
        if spec.pass_through:  # once more by base URL, through a proxy in pass-through mode on the same DB
            _stop(proxy)
            proxy = _proxy(out, sport, pport, tokenizer, prefix=False)
            _wait(f"{url}/health", proxy, "the pass-through proxy")
            work = _workdir(out, PASS_THROUGH, spec.files)
            results[PASS_THROUGH] = {**_by_base_url(url, name, PASS_THROUGH, out, work),
                                     "files": {f: (work / f).read_text() for f in spec.files}}
    finally:
        for proc in (proxy, standin):
            _stop(proc)
    (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
