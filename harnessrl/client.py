"""A few lines for harness authors: create a rollout, point the harness at its base_url,
report rewards, finish.

    from harnessrl.client import HarnessRL
    hrl = HarnessRL("http://127.0.0.1:8000")  # the operator's key: api_key=, else $HARNESSRL_PROXY_API_KEY
    with hrl.rollout(task_id="t1", group_id="g1") as ro:
        client = openai.OpenAI(base_url=ro.base_url("planner"), api_key=ro.api_key("planner"))
        ...                                   # run the harness
        ro.reward(1.0)                        # outcome reward

Keys: the client that creates rollouts holds the proxy's operator key; each rollout hands its
harness the rollout's own key (`Rollout.api_key`), which grants that rollout's model calls only
(docs/proxy.md, "Keys"), so a harness never holds the operator's key.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import os
from typing import Any

import httpx

OPERATOR_KEY_ENV = "HARNESSRL_PROXY_API_KEY"
ROLLOUT_KEY_ENV = "HARNESSRL_KEY"  # a rollout's own key, in its harness's environment (`harnessrl run`)
# The operator keys of the proxies this process started (an embedded proxy makes a secret of its
# own when it is given none: only its owner holds it). Never written to an environment.
_OWN_KEYS: dict[str, str] = {}


def remember_key(url: str, key: str) -> None:
    """`key` is the operator key of the proxy at `url`, which this process started."""
    _OWN_KEYS[url.rstrip("/")] = key


def forget_key(url: str) -> None:
    _OWN_KEYS.pop(url.rstrip("/"), None)


def default_key(url: str) -> str | None:
    """The key a client of `url` sends when given none: the operator key of a proxy this process
    started, else $HARNESSRL_PROXY_API_KEY, else $HARNESSRL_KEY (inside a rollout: its own key)."""
    return _OWN_KEYS.get(url.rstrip("/")) or os.environ.get(OPERATOR_KEY_ENV) or os.environ.get(ROLLOUT_KEY_ENV) or None


class HarnessRLError(RuntimeError):
    """The proxy answered with an error (its OpenAI-shaped message)."""


class Rollout:
    def __init__(self, client: HarnessRL, data: dict[str, Any]) -> None:
        self._client = client
        self.data = data
        self.id: str = data["id"]
        self._template: str = data["base_url_template"]
        # (a proxy older than rollout keys answers without one: the bare identity, as it took then)
        self._key_template: str = data.get("api_key_template") or f"hrl-{self.id}-{{agent}}"

    def base_url(self, agent: str) -> str:
        """The OpenAI `base_url` that records calls as this rollout's `agent`."""
        return self._template.replace("{agent}", agent)

    def api_key(self, agent: str) -> str:
        """The rollout's own key, as `agent`: what its harness sends (OPENAI_API_KEY). It grants
        this rollout's model calls only, never another rollout's nor the operator's routes."""
        return self._key_template.replace("{agent}", agent)

    def reward(self, value: float, name: str = "outcome", metadata: dict | None = None) -> None:
        self._client.reward(self.id, value, name, metadata)

    def process_reward(self, call_id: str, value: float, name: str = "process", metadata: dict | None = None) -> None:
        self._client.process_reward(call_id, value, name, metadata)

    def finish(self, error: str | None = None) -> dict:
        return self._client.finish(self.id, error)

    def get(self) -> dict:
        """The rollout with its calls and rewards (no token arrays)."""
        return self._client.get_rollout(self.id)


class HarnessRL:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        api_key = api_key or default_key(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def _check(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            try:
                msg = resp.json()["error"]["message"]
            except Exception:  # noqa: BLE001 - not an OpenAI error body
                msg = resp.text[:300]
            raise HarnessRLError(f"HTTP {resp.status_code}: {msg}")
        return resp.json()

    def _post(self, path: str, body: dict) -> Any:
        return self._check(self._http.post(path, json=body))

    def create_rollout(self, task_id: str | None = None, group_id: str | None = None, run: str | None = None,
                       metadata: dict | None = None, outcome_by: str | None = None) -> Rollout:
        """`outcome_by="scorer"`: the outcome is the creator's to report (tests, a reward command),
        and the proxy refuses the rollout's own key an outcome, process reward or finish."""
        body = {"task_id": task_id, "group_id": group_id, "run": run, "metadata": metadata}
        if outcome_by:
            body["outcome_by"] = outcome_by
        return Rollout(self, self._post("/harnessrl/rollouts", body))

    @contextmanager
    def rollout(self, task_id: str | None = None, group_id: str | None = None, run: str | None = None,
                metadata: dict | None = None, outcome_by: str | None = None) -> Iterator[Rollout]:
        """Creates a rollout; finishes it when the block ends (also on an exception)."""
        ro = self.create_rollout(task_id, group_id, run, metadata, outcome_by)
        try:
            yield ro
        finally:
            ro.finish()

    def reward(self, rollout_id: str, value: float, name: str = "outcome", metadata: dict | None = None) -> None:
        """The outcome reward of a running rollout (a finished one takes no more: 409)."""
        self._post(f"/harnessrl/rollouts/{rollout_id}/reward", {"value": value, "name": name, "metadata": metadata})

    def finish(self, rollout_id: str, error: str | None = None) -> dict:
        """Finish the rollout; with `error` (a crash, a timeout, a lost node), as `failed`: compile leaves it out."""
        return self._post(f"/harnessrl/rollouts/{rollout_id}/finish", {"error": error} if error else {})

    def process_reward(self, call_id: str, value: float, name: str = "process", metadata: dict | None = None) -> None:
        self._post(f"/harnessrl/calls/{call_id}/reward", {"value": value, "name": name, "metadata": metadata})

    def get_rollout(self, rollout_id: str) -> dict:
        return self._check(self._http.get(f"/harnessrl/rollouts/{rollout_id}"))

    def list_rollouts(self, task_id: str | None = None, group_id: str | None = None, run: str | None = None) -> list:
        params = {k: v for k, v in (("task_id", task_id), ("group_id", group_id), ("run", run)) if v is not None}
        return self._check(self._http.get("/harnessrl/rollouts", params=params))["data"]

    def push_weights(self, path: str, version: str | None = None, lora: bool = False) -> str:
        """Have the proxy's backend load a checkpoint (with several upstreams: drain and reload
        each, `lora`: as a LoRA adapter); returns the new weight version."""
        body = {"path": str(path), "version": version, **({"lora": True} if lora else {})}
        return self._post("/harnessrl/weights", body)["version"]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HarnessRL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
