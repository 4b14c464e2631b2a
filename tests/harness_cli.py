"""The real harnesses of the compatibility suite (tests/test_harness_cli.py): where
scripts/install_harnesses.sh put them (harnesses.lock), how each is run in its default
configuration, and what a run must leave behind.

Each harness runs three times, in a network namespace with only loopback up
(tests/harness_cli_session.py), against the proxy in prefix mode in front of the scripted vLLM
stand-in (tests/scripted_agent.py): `base-url`, pointed at the proxy by its own setting; `run`,
under `harnessrl run` (interception on, base-URL variables set); `intercept`, under `harnessrl
run` with every base-URL setting removed, so its calls reach the proxy only through mitmdump;
smolagents once more by base URL through the proxy in pass-through mode. Its task asks for
SHELL_COMMAND; the scripted model calls the harness's shell tool, then answers quoting the output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
LOCK = ROOT / "harnesses.lock"
UNAVAILABLE = ROOT / ".harnesses" / "unavailable"
MODES = ("base-url", "run", "intercept")
PASS_THROUGH = "pass-through"  # base-URL mode again, the proxy without --prefix (Harness.pass_through)
# the stand-in's one served model name: like vLLM it refuses others, and the proxy in prefix mode
# sends it whatever the harness asks for (claude-opus-…, gpt-…); the litellm-based harnesses ask for it
MODEL = "hrl-scripted"
TASK = "Run the shell command printf 'hrl-%s\\n' tool-ran and tell me what it printed."
# What a harness could leak: these fake keys are in every harness's environment, and must
# appear nowhere in the records DB, the logs or the CA directory.
KEYS = {"OPENAI_API_KEY": "sk-proj-hrlSecretOpenAI7xkLmQp2RvN9wEaYc4uD6sG",
        "ANTHROPIC_API_KEY": "sk-ant-api03-hrlSecretAnthropicWm4nB7vC2xZ9qL5k",
        "GEMINI_API_KEY": "AIzaSyHrlSecretGeminiQ8tVb3Nc6Xz1Lk4Hj7"}


@dataclass(frozen=True)
class Pin:
    name: str
    kind: str  # npm | pip
    package: str
    version: str
    where: str  # the npm prefix or the venv


def read_lock() -> dict[str, Pin]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pin = Pin(*line.split())
            pins[pin.name] = pin
    return pins


@dataclass
class Harness:
    name: str
    binary: str  # the program (npm: in the prefix's .bin; pip: in the venv's bin)
    argv: list[str]  # after the program
    base_env: dict[str, str] = field(default_factory=dict)  # base-URL mode: how a user points it at the proxy
    env: dict[str, str] = field(default_factory=dict)  # both modes: default configuration, non-interactive
    files: dict[str, str] = field(default_factory=dict)  # the work directory's files (a git repo)
    base_files: dict[str, str] = field(default_factory=dict)  # base-URL mode: its config files under HOME
    prints_answer: bool = True  # the final answer is on stdout
    pin: str = ""  # its harnesses.lock entry, where not its name (one package run two ways)
    pass_through: bool = False  # also run by base URL through a proxy in pass-through mode (PASS_THROUGH)

    def __post_init__(self) -> None:
        self.pin = self.pin or self.name


CODEX_CONFIG = """model_provider = "proxy"
[model_providers.proxy]
name = "harnessrl proxy"
base_url = "{v1}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
"""

# base-URL mode: Gemini CLI takes GOOGLE_GEMINI_BASE_URL only with API-key auth selected (else it
# exits 41, "Invalid auth method selected."); `harnessrl run` writes this itself (gemini_settings.py)
GEMINI_SETTINGS = '{{"security": {{"auth": {{"selectedType": "gemini-api-key"}}}}}}'  # (a format string)
# base-URL mode: the OpenAI-compatible provider a user writes into Kilo's config (its braces doubled:
# a format string, of which only {v1} is a field; Kilo itself reads the key from {env:OPENAI_API_KEY})
KILO_CONFIG = json.dumps({"model": f"proxy/{MODEL}", "provider": {"proxy": {
    "npm": "@ai-sdk/openai-compatible", "name": "harnessrl proxy", "models": {MODEL: {"name": MODEL}},
    "options": {"baseURL": "{v1}", "apiKey": "{env:OPENAI_API_KEY}"}}}}).replace("{", "{{").replace(
    "}", "}}").replace("{{v1}}", "{v1}")
# smolagents: four runs of the command and the answer, five steps (a session long enough to show
# what merging saves); its client is tests/harness_clients/smolagents_agent.py
SMOL_TASK = TASK.replace("and tell me", "4 times, one run per step, and tell me")
SMOL = str(TESTS / "harness_clients" / "smolagents_agent.py")

HARNESSES = {
    # -p: print mode (non-interactive); Bash allowed, as a user answers its permission prompt
    "claude-code": Harness("claude-code", "claude", ["-p", TASK, "--allowedTools", "Bash"],
                           base_env={"ANTHROPIC_BASE_URL": "{root}"}),
    # base-URL mode: the provider a user writes into ~/.codex/config.toml (Codex ignores OPENAI_BASE_URL)
    "codex": Harness("codex", "codex", ["exec", TASK], base_files={".codex/config.toml": CODEX_CONFIG}),
    "opencode": Harness("opencode", "opencode", ["run", TASK], base_env={"ANTHROPIC_BASE_URL": "{root}"}),
    # MSWEA_CONFIGURED skips the first-run wizard; cost tracking knows no local model's price
    # (`harnessrl run` sets MSWEA_COST_TRACKING itself)
    "mini-swe-agent": Harness("mini-swe-agent", "mini", ["-m", f"openai/{MODEL}", "-t", TASK, "-y",
                                                         "--exit-immediately"],
                              base_env={"OPENAI_API_BASE": "{v1}", "MSWEA_COST_TRACKING": "ignore_errors"},
                              env={"MSWEA_CONFIGURED": "true"},
                              prints_answer=False),  # it ends on its submit command, not an answer
    "aider": Harness("aider", "aider", ["--model", f"openai/{MODEL}", "--yes-always", "--message",
                                        'In hello.py replace "hello" with "hrl-aider-ok"', "hello.py"],
                     base_env={"OPENAI_API_BASE": "{v1}"}, files={"hello.py": 'print("hello")\n'},
                     prints_answer=False),  # its result is the edited file
    "openai-agents": Harness("openai-agents", "python", [str(TESTS / "harness_clients" / "agents_triage.py"), TASK],
                             base_env={"OPENAI_BASE_URL": "{v1}"}),
    # -p: headless; --skip-trust: a headless run refuses an untrusted folder; the shell tool allowed,
    # as a user answers its permission prompt (headless, it is not even offered otherwise)
    "gemini-cli": Harness("gemini-cli", "gemini", ["--skip-trust", "--allowed-tools", "run_shell_command", "-p", TASK],
                          base_env={"GOOGLE_GEMINI_BASE_URL": "{root}"},
                          base_files={".gemini/settings.json": GEMINI_SETTINGS}),
    # base-URL mode: an OpenAI-compatible provider; under `run`, its Anthropic provider (ANTHROPIC_BASE_URL)
    "kilocode": Harness("kilocode", "kilo", ["run", "--auto", TASK], base_files={".config/kilo/kilo.json": KILO_CONFIG}),
    "smolagents-tool": Harness("smolagents-tool", "python", [SMOL, "tool", SMOL_TASK],
                               base_env={"OPENAI_BASE_URL": "{v1}"}, pin="smolagents", pass_through=True),
    "smolagents-code": Harness("smolagents-code", "python", [SMOL, "code", SMOL_TASK],
                               base_env={"OPENAI_BASE_URL": "{v1}"}, pin="smolagents", pass_through=True),
}


def _pin(name: str) -> Pin:
    """The harnesses.lock entry of a harness of HARNESSES (or of a lock name)."""
    return read_lock()[HARNESSES[name].pin if name in HARNESSES else name]


def program(name: str) -> Path:
    pin = _pin(name)
    if pin.kind == "npm":
        return ROOT / pin.where / "node_modules" / ".bin" / HARNESSES[name].binary
    return ROOT / pin.where / "bin" / HARNESSES[name].binary


def installed_version(name: str) -> str | None:
    pin = _pin(name)
    if pin.kind == "npm":
        package = ROOT / pin.where / "node_modules" / pin.package / "package.json"
        return json.loads(package.read_text())["version"] if package.is_file() else None
    python = ROOT / pin.where / "bin" / "python"
    if not python.is_file():
        return None
    got = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({pin.package!r}))"],
                         capture_output=True, text=True)
    return got.stdout.strip() or None


def require(name: str) -> None:
    """Skip with install_harnesses.sh's reason where it could not install the harness; fail where
    the harness is missing or not at its pinned version (the install makes it)."""
    reasons = dict(line.split(": ", 1) for line in UNAVAILABLE.read_text().splitlines()
                   if ": " in line) if UNAVAILABLE.is_file() else {}
    pin = _pin(name)
    if pin.name in reasons:
        pytest.skip(f"{name} could not be installed here: {reasons[pin.name]}")
    have = installed_version(name)
    if have != pin.version or not program(name).is_file():
        pytest.fail(f"{name} {pin.version} is not installed ({program(name)}: found version {have}): run "
                    f"bash scripts/install_harnesses.sh (make install runs it)")
    if shutil.which("node") is None and pin.kind == "npm":
        pytest.fail(f"{name} needs Node.js: install it, then bash scripts/install_harnesses.sh")


def netns_reason() -> str | None:
    """Why a network namespace cannot be used here (None: it can)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2) for a network namespace"
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces unavailable here (unshare -rn: {probe.stderr.strip()[:120]})"
    return None


def mitmdump() -> str | None:
    for candidate in (os.environ.get("HARNESSRL_MITMDUMP"), ROOT / ".venv-mitm" / "bin" / "mitmdump"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


# ---- the session and what the tests check in it ----------------------------------------------

def session(name: str, tokenizer_dir: Path, out: Path) -> dict:
    """Runs tests/harness_cli_session.py for `name` in a network namespace; its results, the
    records DB and the compile output, all under `out`."""
    require(name)
    if (reason := netns_reason()) is not None:
        pytest.skip(reason)
    if (mitm := mitmdump()) is None:  # the README's install makes it: its absence is a failure
        pytest.fail("mitmproxy not installed: run scripts/install.sh (it makes .venv-mitm) or set HARNESSRL_MITMDUMP")
    env = {**os.environ, "HARNESSRL_MITMDUMP": mitm, "PYTHONPATH": str(TESTS)}
    proc = subprocess.run(["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable,
                           str(TESTS / "harness_cli_session.py"), str(out), name, str(tokenizer_dir)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    compiled = subprocess.run([sys.executable, "-m", "harnessrl", "compile", "--db", str(out / "runs.db"), "--out",
                               str(out / "samples"), "--tokenizer", str(tokenizer_dir)],
                              capture_output=True, text=True, timeout=300)
    return {"name": name, "out": out, "results": results, "compile": compiled}


def _explain(session: dict, mode: str) -> str:
    r = session["results"][mode]
    return f"{session['name']} ({mode}) exit {r['rc']} in {r['seconds']} s\n--- stdout\n{r['stdout'][-2500:]}\n" \
           f"--- stderr\n{r['stderr'][-2500:]}"


def calls(session: dict, mode: str) -> list:
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Call

    _, Session = open_db(str(session["out"] / "runs.db"))
    with Session() as s:
        return list(s.scalars(select(Call).where(Call.rollout_id == session["results"][mode]["rollout"])
                              .order_by(Call.seq)))


def check_completed(session: dict, mode: str) -> None:
    """The harness exited 0 and (where it prints one) its answer quotes the tool's output."""
    r = session["results"][mode]
    assert r["rc"] == 0 and r["rollout"], _explain(session, mode)
    if HARNESSES[session["name"]].prints_answer:  # the scripted model's answer, quoting what the tool returned
        assert "hrl-tool-ran" in r["stdout"].rpartition("The command printed:")[2], _explain(session, mode)


def check_calls(session: dict, mode: str, min_calls: int = 2, tool: bool = True) -> None:
    """Every call recorded ok with prompt and completion ids; the tool's output came back in one."""
    got = calls(session, mode)
    summary = [(c.seq, c.surface, c.status, (c.error or "")[:200]) for c in got]
    assert len(got) >= min_calls, f"{summary}\n{_explain(session, mode)}"
    assert all(c.status == "ok" for c in got), f"{summary}\n{_explain(session, mode)}"
    assert all(c.prompt_ids and c.completion_ids for c in got), summary
    assert not tool or any("hrl-tool-ran" in json.dumps(c.request["messages"]) for c in got), \
        "no call carries the tool's output: the tool call never ran"


def check_merged(session: dict, mode: str) -> None:
    """The call that carries the tool's output extends the call that asked for the tool: its
    prompt is that call's exact ids plus the new messages (one sequence for training). A side call
    that offers no tools where the agent's calls do (Kilo's title generator, reading the
    conversation) is another session, not that call."""
    got = calls(session, mode)
    agent_has_tools = any(c.request.get("tools") for c in got)
    after_tool = [c for c in got if "hrl-tool-ran" in json.dumps(c.request["messages"])
                  and (c.request.get("tools") or not agent_has_tools)]
    paths = [(c.seq, c.prompt_path, c.prefix_call_id is not None) for c in got]
    assert after_tool and all(c.prompt_path == "prefix" and c.prefix_call_id for c in after_tool), paths


def check_compiled(session: dict) -> None:
    """`harnessrl compile` makes samples of every run's rollout."""
    import pyarrow.parquet as pq

    compiled = session["compile"]
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    rollouts = set(pq.read_table(session["out"] / "samples" / "samples.parquet",
                                 columns=["rollout_id"]).column("rollout_id").to_pylist())
    for mode, result in session["results"].items():
        assert result["rollout"] in rollouts, (mode, compiled.stdout[-2000:])


def check_no_keys(session: dict) -> None:
    """The harness's API keys reached neither the records DB nor any log (the harness's own HOME
    and work directory are its business)."""
    out = session["out"]
    files = [p for p in out.rglob("*")
             if p.is_file() and not p.relative_to(out).parts[0].startswith(("home-", "work-"))]
    assert any(p.name == "runs.db" for p in files)
    texts = [p.read_bytes() for p in files]
    texts += [(r["stdout"] + r["stderr"]).encode() for r in session["results"].values()]
    for name, key in KEYS.items():
        assert not any(key.encode() in t for t in texts), f"{name} was stored or logged"
