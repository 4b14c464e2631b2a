"""`harnessrl intercept`: mitmdump from its own environment with the package's addon
(harnessrl/intercept_addon.py), and the environment a client needs to go through it.

mitmproxy pins versions that clash with this project's HTTP stack, so it lives in its own venv
(`.venv-mitm`, made by scripts/install.sh) and is only ever run as a program, never imported.
The CA that mitmproxy makes lives in `$HARNESSRL_HOME/mitmproxy` (default ~/.harnessrl), owner-only.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import quote, urlsplit

import yaml

import harnessrl
from harnessrl.errors import UserError

ADDON = Path(harnessrl.__file__).with_name("intercept_addon.py")
MITM_VENV = ".venv-mitm"
INSTALL_HINT = ("install it in its own environment with `bash scripts/install.sh` (it makes .venv-mitm), or "
                "`python3 -m venv .venv-mitm && .venv-mitm/bin/pip install 'mitmproxy>=11.0.2,<13'`, then pass "
                "--mitmdump PATH or set HARNESSRL_MITMDUMP")
CA_CERT = "mitmproxy-ca-cert.pem"  # the public certificate mitmproxy writes into its confdir
CA_BUNDLE = "ca-bundle.pem"  # the system's CAs plus mitmproxy's: what SSL_CERT_FILE replaces the store with


def find_mitmdump(explicit: str | None = None) -> str:
    """--mitmdump, $HARNESSRL_MITMDUMP, .venv-mitm beside the source tree or in the working
    directory, or a mitmdump on PATH."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise UserError(f"--mitmdump {explicit}: no such file; {INSTALL_HINT}")
        return str(path)
    root = Path(harnessrl.__file__).resolve().parents[1]
    for candidate in (os.environ.get("HARNESSRL_MITMDUMP"), root / MITM_VENV / "bin" / "mitmdump",
                      Path.cwd() / MITM_VENV / "bin" / "mitmdump", shutil.which("mitmdump")):
        if candidate and Path(candidate).expanduser().is_file():
            return str(Path(candidate).expanduser())
    raise UserError(f"mitmproxy (mitmdump) not found: {INSTALL_HINT}")


def ca_dir(explicit: Path | None = None) -> Path:
    """Where the CA key lives: created owner-only (and made so if it was not)."""
    path = explicit or Path(os.environ.get("HARNESSRL_HOME") or Path.home() / ".harnessrl") / "mitmproxy"
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def read_hosts(path: Path | None) -> list[str]:
    """A YAML or JSON list of host names or `*` patterns (or `{hosts: [...]}`)."""
    if path is None:
        return []
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"--hosts {path}: cannot read it ({exc.__class__.__name__})") from None
    if isinstance(data, dict):
        data = data.get("hosts")
    if not isinstance(data, list) or not all(isinstance(h, str) and h.strip() and "," not in h for h in data):
        raise UserError(f"--hosts {path}: expected a list of host names or patterns (e.g. [llm.example.com, '*.corp'])")
    return [h.strip().lower() for h in data]


@dataclass
class InterceptConfig:
    proxy: str  # the recording proxy, http://host:port
    port: int = 8080  # 0: a free one
    rollout: str | None = None  # identity of calls that carry none
    agent: str | None = None
    hosts: list[str] = field(default_factory=list)
    only_llm: bool = False
    mitmdump: str | None = None
    ca_dir: Path | None = None
    # the key of calls that carry no identity, and added to one that carries no key of its own:
    # the recording proxy's --api-key for `harnessrl intercept`; a rollout's own key under `run`
    proxy_key: str | None = None


@dataclass
class Interceptor:
    url: str  # http://127.0.0.1:port, the value of HTTPS_PROXY
    ca_cert: Path
    ca_bundle: Path
    process: subprocess.Popen

    def env(self, identity: str | None = None) -> dict[str, str]:
        """The variables that send a client through mitmdump and make it trust the CA. `identity`
        (`hrl-<rollout>-<agent>`, or a rollout's key `hrl-…:rk_…`, which `run` and `loop --cmd` pass) goes
        in the proxy URL's username, so one mitmdump can serve many rollouts."""
        url = self.url
        if identity:
            parts = urlsplit(url)
            url = f"{parts.scheme}://{quote(identity, safe='')}:x@{parts.netloc}"
        no_proxy = ",".join(h for h in (os.environ.get("NO_PROXY") or os.environ.get("no_proxy"),
                                         "127.0.0.1,localhost,::1") if h)
        env = {name: url for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}
        env.update(NO_PROXY=no_proxy, no_proxy=no_proxy, NODE_EXTRA_CA_CERTS=str(self.ca_cert))
        env.update({name: str(self.ca_bundle) for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")})
        return env


def mitmdump_argv(binary: str, cfg: InterceptConfig, port: int, confdir: Path, quiet: bool) -> list[str]:
    argv = [binary, "--listen-host", "127.0.0.1", "--listen-port", str(port), "-s", str(ADDON),
            "--set", f"confdir={confdir}",
            "--set", "connection_strategy=lazy",  # never dial api.openai.com: the call goes to the proxy
            "--set", "upstream_cert=false",
            "--set", f"hrl_proxy={cfg.proxy}", "--set", f"hrl_hosts={','.join(cfg.hosts)}",
            "--set", f"hrl_only_llm={'true' if cfg.only_llm else 'false'}"]
    for option, value in (("hrl_rollout", cfg.rollout), ("hrl_agent", cfg.agent)):
        if value:
            argv += ["--set", f"{option}={value}"]
    if quiet:
        argv += ["--set", "termlog_verbosity=warn", "--set", "flow_detail=0"]
    return argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_bundle(confdir: Path) -> Path:
    """The system's trusted CAs plus mitmproxy's, so SSL_CERT_FILE breaks no pass-through TLS."""
    paths = ssl.get_default_verify_paths()
    system = next((Path(p) for p in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt")
                   if p and Path(p).is_file()), None)
    bundle = confdir / CA_BUNDLE
    parts = [system.read_text()] if system else []
    bundle.write_text("".join(parts) + "\n" + (confdir / CA_CERT).read_text())
    return bundle


@contextmanager
def start_intercept(cfg: InterceptConfig, log: IO | None = None, quiet: bool = True,
                    timeout: float = 60.0) -> Iterator[Interceptor]:
    """mitmdump in the background for the block; its output goes to `log` (None: this terminal).
    The proxy key travels in the environment, not on the command line (`ps` shows that)."""
    binary = find_mitmdump(cfg.mitmdump)
    confdir = ca_dir(cfg.ca_dir)
    port = cfg.port or _free_port()
    # the key is the one given (under `run`/`loop`: a rollout's, or none), never one inherited
    env = {k: v for k, v in os.environ.items() if k != "HARNESSRL_PROXY_API_KEY"}
    if cfg.proxy_key:
        env["HARNESSRL_PROXY_API_KEY"] = cfg.proxy_key
    proc = subprocess.Popen(mitmdump_argv(binary, cfg, port, confdir, quiet), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT if log else None, env=env)
    try:
        _wait_ready(proc, port, confdir / CA_CERT, timeout)
        yield Interceptor(f"http://127.0.0.1:{port}", confdir / CA_CERT, _write_bundle(confdir), proc)
    finally:
        proc.send_signal(signal.SIGINT)  # mitmdump's clean shutdown (SIGTERM prints tracebacks of open connections)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(proc: subprocess.Popen, port: int, cert: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"mitmdump exited with status {proc.returncode} before it listened on port {port}")
        if cert.is_file():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                pass
        time.sleep(0.05)
    raise UserError(f"mitmdump did not listen on port {port} within {timeout:.0f} s")


def describe(icpt: Interceptor) -> str:
    """What `harnessrl intercept` prints on start: the CA and the variables to export."""
    lines = [f"harnessrl intercept on {icpt.url}", f"CA certificate: {icpt.ca_cert}", "set in the harness's shell:"]
    lines += [f"  export {k}={v}" for k, v in icpt.env().items() if not k.islower()]
    return "\n".join(lines)
