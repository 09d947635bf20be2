"""The Schema-Guided LLM Simulator (SGLS, arXiv 2609.29050 Sec. 4.1): an LLM plays the tool.

Any OpenAI-compatible chat-completions endpoint works (a vLLM or SGLang
server in production). For each call the simulator sends the tool's schema
(description, parameters, response schema), the episode's earlier calls and
their results, and the current call; asks for one JSON object; validates it
against the response schema with ``jsonschema``; and retries with the
validation error as feedback when the output is not valid. Answers are cached
per episode (stateless tools) so a repeated call gets the same answer.

Failures never raise into the rollout: timeouts, HTTP errors, unreachable
servers and output that stays invalid after the retries become
``ToolResult(ok=False, error=...)`` and are counted in ``metrics``
(``timeouts``, ``http_errors``, ``connection_errors``, ``bad_responses``,
``invalid_json``, ``schema_violations``, ``retries``, ``requests``, ``failed``).
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

from slca.env.schema import ToolBox
from slca.env.simulators import BaseSimulator
from slca.types import ToolResult

__all__ = ["EndpointError", "chat_completion", "parse_json_reply", "LLMSimulator"]


class EndpointError(RuntimeError):
    """A chat-completions request failed; ``kind`` is timeout / http_error / connection_error / bad_response."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def chat_completion(
    base_url: str,
    model: str,
    messages: list[dict[str, Any]],
    *,
    api_key: str | None = None,
    timeout: float = 30.0,
    **params: Any,
) -> str:
    """POST ``{base_url}/chat/completions`` and return the first choice's message content.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model's name.
        messages: OpenAI chat messages.
        api_key: sent as ``Authorization: Bearer``; optional for local servers.
        timeout: seconds for the whole request.
        **params: extra request fields (``temperature``, ``seed``, ``response_format``, ...).

    Raises:
        EndpointError: on timeout, HTTP error status, connection failure or a
            response without ``choices[0].message.content``.
    """
    body = json.dumps({"model": model, "messages": messages, **params}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        detail = e.read()[:200].decode("utf-8", "replace")
        raise EndpointError("http_error", f"HTTP {e.code} from {base_url}: {detail}") from e
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            raise EndpointError("timeout", f"no answer from {base_url} within {timeout} s") from e
        raise EndpointError("connection_error", f"cannot reach {base_url}: {e.reason}") from e
    except (socket.timeout, TimeoutError) as e:
        raise EndpointError("timeout", f"no answer from {base_url} within {timeout} s") from e
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise EndpointError("bad_response", f"not a chat-completions response: {raw[:200]!r}") from e
    if not isinstance(content, str):
        raise EndpointError("bad_response", f"message content is {type(content).__name__}, expected a string")
    return content


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def parse_json_reply(text: str) -> Any:
    """The JSON value in a model reply (a surrounding Markdown code fence is allowed). Raises ValueError."""
    s = text.strip()
    m = _FENCE.match(s)
    if m:
        s = m.group(1)
    return json.loads(s)


_SYSTEM = (
    "You are a tool simulator. You play the tool described below and answer each call with what the real tool "
    "would return. Reply with one JSON value only, no prose, conforming to the response schema. Stay consistent "
    "with the earlier calls of this episode (ids, bookings, and other state they created)."
)


class LLMSimulator(BaseSimulator):
    """Tool simulator backed by an OpenAI-compatible chat endpoint (the paper's SGLS).

    Args:
        tools: OpenAI tool dicts (with optional ``response`` schemas) or ToolSpecs.
        base_url: endpoint root, e.g. ``http://127.0.0.1:8000/v1``.
        model: served model name.
        api_key: optional bearer token.
        timeout: seconds per request.
        max_retries: extra attempts after a failed or invalid answer.
        temperature: sampling temperature sent to the endpoint (0 for repeatability).
        seed: sent as the request ``seed`` (servers that honour it are reproducible).
        max_history: how many earlier calls of the episode go into the prompt.
    """

    def __init__(
        self,
        tools: Iterable[Any] | ToolBox,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        temperature: float = 0.0,
        seed: int = 0,
        max_history: int = 8,
    ):
        super().__init__(tools)
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.timeout, self.max_retries = float(timeout), int(max_retries)
        self.temperature, self.seed, self.max_history = float(temperature), int(seed), int(max_history)

    def prompt(self, name: str, arguments: dict, episode: str | int = 0) -> list[dict[str, Any]]:
        """The chat messages sent for one call."""
        spec = self.specs[name]
        tool = {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
        if spec.response is not None:
            tool["response_schema"] = spec.response
        history = self.state(episode).get("history", [])[-self.max_history :]
        lines = [f"Tool:\n{json.dumps(tool, ensure_ascii=False)}"]
        if history:
            lines.append("Earlier calls in this episode:")
            lines += [json.dumps(h, ensure_ascii=False) for h in history]
        lines.append(f"Call:\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}")
        lines.append("Reply with the tool's JSON result only.")
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "\n".join(lines)}]

    def _execute(self, name: str, arguments: dict, episode: str | int) -> ToolResult:
        messages = self.prompt(name, arguments, episode)
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.metrics["retries"] += 1
            self.metrics["requests"] += 1
            try:
                text = chat_completion(
                    self.base_url, self.model, messages, api_key=self.api_key, timeout=self.timeout,
                    temperature=self.temperature, seed=self.seed, response_format={"type": "json_object"},
                )
            except EndpointError as e:
                self.metrics[{"timeout": "timeouts", "http_error": "http_errors", "connection_error": "connection_errors"}.get(e.kind, "bad_responses")] += 1
                last = str(e)
                continue
            try:
                content = parse_json_reply(text)
            except ValueError as e:
                self.metrics["invalid_json"] += 1
                last = f"output is not JSON ({e})"
            else:
                bad = self.toolbox.response_error(name, content)
                if bad is None:
                    self.state(episode).setdefault("history", []).append({"name": name, "arguments": arguments, "result": content})
                    return ToolResult(ok=True, content=content)
                self.metrics["schema_violations"] += 1
                last = f"output violates the response schema: {bad}"
            messages = messages + [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"Invalid: {last}. Reply with one JSON value that conforms to the response schema."},
            ]
        return ToolResult(ok=False, error=f"tool simulator failed for {name!r} after {self.max_retries + 1} attempts: {last}")
