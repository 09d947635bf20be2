"""The Schema-Guided LLM Simulator (SGLS, arXiv 2609.29050 Sec. 4.1): an LLM plays the tool.

Any OpenAI-compatible chat-completions endpoint works (a vLLM or SGLang
server in production). For each call the simulator sends the tool's schema
(description, parameters, response schema), the episode's earlier calls and
their results, and the current call; asks for one JSON object; validates it
against the response schema with ``jsonschema``; and retries with the
validation error as feedback when the output is not valid. Answers are cached
per episode (stateless tools) so a repeated call gets the same answer.

The HTTP client (:class:`ChatClient`, shared with :class:`slca.rewards.OpenAIJudge`)
is ``httpx`` with ``tenacity``:

* each request (one :meth:`ChatClient.complete`: every HTTP attempt, the waits
  between them, and setting up the connection pool) has a **total deadline** of
  ``timeout`` seconds from the call; httpx's own timeouts are per read, so a
  server dripping a byte at a time would hold them forever. Each attempt runs as
  a coroutine under ``asyncio.wait_for`` on a private event-loop thread with the
  time that is left, and is cancelled when it runs out; the calling thread waits
  at most :data:`DEADLINE_SLACK` seconds more (for the cancelled attempt to let
  go of its connection), then gives up on it. A request therefore returns or
  raises within ``timeout + DEADLINE_SLACK`` seconds, and an attempt cut off by
  the deadline is a ``timeout`` fault;
* failed attempts are retried while the deadline allows, ``http_attempts`` in
  all, with exponential backoff and jitter (``backoff``, doubling, at most
  ``max_backoff`` seconds): timeouts, refused / closed / reset connections,
  short bodies, HTTP 5xx, 408 and 429, malformed replies; other 4xx statuses are
  not retried. No attempt starts, and no wait is taken, that would end after the
  deadline (tenacity's ``upcoming_sleep``), so a timed-out attempt, which spent
  the request's time, is the request's last;
* replies are read up to ``max_response_bytes`` and decoded with the JSON limits
  of :func:`slca._limits.loads` (a reply nested 5,000 deep is a ``bad_response``,
  not a ``RecursionError``);
* credentials never reach the model or a report: the URL is shown without its
  user info and query values, server bodies never go into an error message (a
  redacted excerpt goes to the ``slca.env`` logger), and the API key and any
  ``Bearer`` / ``sk-`` / ``api_key=`` token are masked there.

Failures never raise into the rollout: they become ``ToolResult(ok=False,
error=...)`` and are counted in ``metrics``: one count per failed HTTP attempt by
kind (``timeouts``, ``connection_errors``, ``incomplete_responses``,
``http_errors``, ``bad_responses``), ``requests`` (attempts sent),
``http_retries``, ``tool_call_replies`` (replies whose server parsed the model's turn into
OpenAI ``tool_calls`` with no text: returned as the ``<tool_call>`` text the model wrote), and per
call ``invalid_json``, ``schema_violations``, ``retries`` (answers asked again with feedback) and
``failed``. One simulated tool call sends at most ``max_retries + 1`` requests, so it takes at
most ``(max_retries + 1) * (timeout + DEADLINE_SLACK)`` seconds.

A real server on loopback: ``slca export-model --model smollm2 --out DIR`` then
``transformers serve --host 127.0.0.1 --port 8000``; requests name the folder as the model
(docs/environment.md). A server whose response template parses ``<tool_call>`` blocks answers
HTTP 500 to a malformed call from its model; that is an ``http_error`` here like any other 5xx
(retried, then a ``ToolResult(ok=False)`` naming the status), and the folder
:func:`slca.models.serving.export_for_serving` writes avoids it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx
import tenacity

from slca._limits import loads as _bounded_loads
from slca.env.schema import ToolBox
from slca.env.simulators import BaseSimulator
from slca.types import ToolResult

__all__ = ["DEADLINE_SLACK", "EndpointError", "ChatClient", "parse_json_reply", "redact", "safe_url", "LLMSimulator"]

log = logging.getLogger("slca.env")

DEADLINE_SLACK = 0.25
"""Seconds a request may run past its ``timeout``: after the deadline the calling thread waits this
long for the cancelled attempt to close its connection, then returns without it (the attempt is
cancelled either way). Only thread scheduling on a busy machine adds to it."""

FAULT_METRICS = {
    "timeout": "timeouts",
    "connection_error": "connection_errors",
    "incomplete_response": "incomplete_responses",
    "http_error": "http_errors",
    "bad_response": "bad_responses",
}
"""EndpointError kind -> the metrics key it is counted under (once per failed HTTP attempt)."""


class EndpointError(RuntimeError):
    """A chat-completions request failed.

    ``kind`` is one of :data:`FAULT_METRICS`' keys; ``status`` the HTTP status
    (``http_error`` only); ``retryable`` whether another attempt may succeed;
    ``attempts`` how many HTTP attempts the request made (set by
    :meth:`ChatClient.complete`). The message names the (redacted) URL, never the
    server's body.
    """

    def __init__(self, kind: str, message: str, *, status: int | None = None, retryable: bool = True):
        super().__init__(message)
        self.kind, self.status, self.retryable = kind, status, retryable
        self.attempts = 1


# ------------------------------------------------------------------ redaction

_TOKEN_PATTERNS = (
    (re.compile(r"(?i)(bearer\s+)[^\s\"',;]+"), r"\1***"),
    (re.compile(r"(?i)\b(api[_-]?key|access[_-]?token|token|secret|password|passwd)(\"?\s*[:=]\s*\"?)[^\s\"',;&}]+"), r"\1\2***"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"), "sk-***"),
)


def safe_url(url: str) -> str:
    """``url`` without user info and with query values masked (``http://***@host/v1?key=***``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    netloc = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc:
        netloc = "***@" + netloc
    query = "&".join(f"{k}=***" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _url_secrets(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.username or "", parts.password or ""] + [v for _, v in parse_qsl(parts.query)]
    return [x for x in found if len(x) >= 3]


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with each of ``secrets`` and anything that looks like a credential replaced by ``***``."""
    for sec in sorted((x for x in secrets if x and len(x) >= 3), key=len, reverse=True):
        text = text.replace(sec, "***")
    for rx, sub in _TOKEN_PATTERNS:
        text = rx.sub(sub, text)
    return text


# ------------------------------------------------------------------ the client

_LOOP_LOCK = threading.Lock()
_LOOP: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None


def _event_loop() -> asyncio.AbstractEventLoop:
    """The private event loop that runs every request (one daemon thread per process, made again after fork)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid() or not _LOOP[2].is_alive():
            loop = asyncio.new_event_loop()
            th = threading.Thread(target=loop.run_forever, name="slca-http", daemon=True)
            th.start()
            _LOOP = (os.getpid(), loop, th)
        return _LOOP[1]


class _NoTimeLeft(tenacity.stop.stop_base):
    """tenacity stop: no further attempt when the wait before it would end at or after ``deadline``
    (``time.monotonic()``; tenacity's ``stop_before_delay``, measured to the request's own deadline)."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return time.monotonic() + retry_state.upcoming_sleep >= self.deadline


def _retryable_status(status: int) -> bool:
    return status >= 500 or status in (408, 425, 429)


class ChatClient:
    """An OpenAI-compatible ``/chat/completions`` client with a total deadline per request and bounded retries.

    Args:
        base_url: endpoint root, e.g. ``http://127.0.0.1:8000/v1`` (user info in it is sent as basic auth).
        api_key: sent as ``Authorization: Bearer``; optional for local servers.
        timeout: total deadline of one request (:meth:`complete`) in seconds: all its attempts
            (connect, send, headers, body) and the waits between them; it returns or raises within
            ``timeout + DEADLINE_SLACK``.
        http_attempts: attempts per :meth:`complete` in all (>= 1), as far as the deadline allows.
        backoff: first wait between attempts in seconds; doubles each time (plus up to ``backoff`` jitter).
        max_backoff: longest wait between attempts.
        max_response_bytes: longest reply body read.
        metrics: counter the faults are counted in (see :data:`FAULT_METRICS`); a new one when None.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        http_attempts: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_response_bytes: int = 1 << 20,
        metrics: Counter[str] | None = None,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {safe_url(str(base_url))!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if int(http_attempts) < 1:
            raise ValueError(f"http_attempts must be >= 1, got {http_attempts}")
        if not backoff >= 0 or not max_backoff >= 0:
            raise ValueError(f"backoff and max_backoff must be >= 0, got {backoff}, {max_backoff}")
        self.base_url, self.api_key = base_url, api_key
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.shown_url = safe_url(self.url)
        self.timeout, self.http_attempts = float(timeout), int(http_attempts)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.max_response_bytes = int(max_response_bytes)
        self.metrics: Counter[str] = metrics if metrics is not None else Counter()
        self._secrets = [api_key, *_url_secrets(base_url)]
        self._client: tuple[int, httpx.AsyncClient] | None = None

    def __getstate__(self) -> dict[str, Any]:  # picklable (Ray, multiprocessing): the connection pool is not sent
        return {**self.__dict__, "_client": None}

    def redact(self, text: str) -> str:
        """``text`` with this client's credentials and anything credential-like masked."""
        return redact(text, self._secrets)

    def complete(self, model: str, messages: list[dict[str, Any]], **params: Any) -> str:
        """POST the chat request and return ``choices[0].message.content``, retrying transient faults.

        The request ends within ``timeout + DEADLINE_SLACK`` seconds of this call (see the module docstring).

        Raises:
            EndpointError: the last attempt's fault, after ``http_attempts`` attempts, when the
                deadline leaves no time for another (kind ``timeout`` if the deadline cut the last
                attempt off), or at once for a non-retryable fault such as HTTP 401.
        """
        deadline = time.monotonic() + self.timeout
        body = json.dumps({"model": model, "messages": messages, **params}).encode()  # ASCII: any str encodes
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.http_attempts) | _NoTimeLeft(deadline),
            wait=tenacity.wait_exponential_jitter(multiplier=self.backoff, max=self.max_backoff, jitter=self.backoff),
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, EndpointError) and e.retryable),
            before_sleep=lambda state: self.metrics.update(["http_retries"]),
            reraise=True,
        )
        try:
            return retrying(self._attempt, body, deadline)
        except EndpointError as e:
            e.attempts = retrying.statistics.get("attempt_number", 1)
            raise

    def _attempt(self, body: bytes, deadline: float) -> str:
        self.metrics["requests"] += 1
        try:
            return self._run(body, deadline)
        except EndpointError as e:
            self.metrics[FAULT_METRICS[e.kind]] += 1
            log.warning("chat endpoint fault (%s): %s", e.kind, self.redact(str(e)))
            raise

    def _timeout_error(self) -> EndpointError:
        return EndpointError("timeout", f"no complete answer from {self.shown_url} within {self.timeout} s")

    def _run(self, body: bytes, deadline: float) -> str:
        """One attempt on the private loop, cancelled at the deadline."""
        if self._client is None or self._client[0] != os.getpid():  # inside the deadline: it loads TLS certificates
            limits = httpx.Limits(max_connections=32, max_keepalive_connections=8)
            self._client = (os.getpid(), httpx.AsyncClient(timeout=self.timeout, limits=limits, follow_redirects=False))
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._timeout_error()
        fut = asyncio.run_coroutine_threadsafe(self._bounded(self._client[1], body, left), _event_loop())
        try:
            status, raw = fut.result(timeout=left + DEADLINE_SLACK)  # the coroutine itself stops at the deadline
        except concurrent.futures.TimeoutError:
            fut.cancel()  # the attempt is cancelled on the loop; this thread does not wait for it
            raise self._timeout_error() from None
        return self._content(status, raw)

    async def _bounded(self, client: httpx.AsyncClient, body: bytes, left: float) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._post(client, body, left), left)
        except asyncio.TimeoutError:
            raise self._timeout_error() from None

    async def _post(self, client: httpx.AsyncClient, body: bytes, left: float) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            async with client.stream("POST", self.url, content=body, headers=headers, timeout=left) as resp:
                chunks, size = [], 0
                try:
                    async for chunk in resp.aiter_bytes():
                        size += len(chunk)
                        if size > self.max_response_bytes:
                            raise EndpointError("bad_response", f"reply from {self.shown_url} is longer than {self.max_response_bytes} bytes")
                        chunks.append(chunk)
                except httpx.TimeoutException:
                    raise
                except (httpx.HTTPError, OSError) as e:
                    raise EndpointError(
                        "incomplete_response", f"reply from {self.shown_url} cut off after {size} bytes ({type(e).__name__})"
                    ) from None
                return resp.status_code, b"".join(chunks)
        except httpx.TimeoutException:
            raise self._timeout_error() from None
        except (httpx.HTTPError, OSError) as e:
            raise EndpointError("connection_error", f"cannot talk to {self.shown_url}: {type(e).__name__}") from None

    def _content(self, status: int, raw: bytes) -> str:
        if status >= 400:
            log.warning("HTTP %d from %s: %s", status, self.shown_url, self.redact(raw[:300].decode("utf-8", "replace")))
            raise EndpointError("http_error", f"HTTP {status} from {self.shown_url}", status=status, retryable=_retryable_status(status))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise EndpointError("bad_response", f"reply from {self.shown_url} is not UTF-8") from None
        doc, reason = _bounded_loads(text)
        if reason is not None:
            raise EndpointError("bad_response", f"reply from {self.shown_url} is not JSON: {reason}")
        try:
            message = doc["choices"][0]["message"]
            content = message["content"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError("bad_response", f"reply from {self.shown_url} has no choices[0].message.content") from None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls and not content:
            # The server parsed the model's turn into OpenAI tool calls (its response template reads <tool_call>
            # blocks). Here a text answer was asked for: the calls come back as the text the model wrote, so the
            # caller sees what the model said (and, for a simulator or a judge, that it is not the answer asked).
            self.metrics["tool_call_replies"] += 1
            return _calls_as_text(calls)
        if not isinstance(content, str):
            raise EndpointError("bad_response", f"message content is {type(content).__name__}, expected a string")
        return content

    def close(self) -> None:
        """Close the connection pool (the client can still be used: a new pool opens)."""
        held, self._client = self._client, None
        if held is not None and held[0] == os.getpid():
            fut = asyncio.run_coroutine_threadsafe(held[1].aclose(), _event_loop())
            try:
                fut.result(timeout=5.0)
            except Exception:  # closing is best effort: the pool is dropped either way
                pass


def _calls_as_text(calls: Any) -> str:
    """OpenAI ``tool_calls`` as hermes text (``<tool_call>{"name", "arguments"}</tool_call>`` per call); never raises."""
    out = []
    for c in calls if isinstance(calls, list) else [calls]:
        fn = c.get("function", c) if isinstance(c, dict) else c
        name = fn.get("name") if isinstance(fn, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(args, str):
            decoded, reason = _bounded_loads(args)
            args = decoded if reason is None else args
        try:
            body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
        except (TypeError, ValueError):
            body = json.dumps({"name": str(name), "arguments": str(args)}, ensure_ascii=False)
        out.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(out)


def parse_json_reply(text: str) -> Any:
    """The JSON value in a model reply (a surrounding Markdown code fence is allowed).

    Decoded with the limits of :func:`slca._limits.loads`; raises ValueError with the reason.
    """
    s = text.strip()
    if s.startswith("```") and s.endswith("```") and len(s) >= 6:
        s = s[3:-3]
        if s.startswith("json"):
            s = s[4:]
        s = s.strip()
    value, reason = _bounded_loads(s)
    if reason is not None:
        raise ValueError(reason)
    return value


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
        max_retries: extra answers asked for (with the error as feedback) after an
            answer that is not JSON or violates the response schema.
        temperature: sampling temperature sent to the endpoint (0 for repeatability).
        seed: sent as the request ``seed`` (servers that honour it are reproducible).
        max_history: how many earlier calls of the episode go into the prompt.
        max_tokens: longest answer in tokens, sent as ``max_tokens`` (None: the server's default;
            ``transformers serve`` allows 1,024, minutes on a CPU when a small model rambles).
        **http: the HTTP options of :class:`ChatClient` (``api_key``, ``timeout``: a total
            deadline per request, ``http_attempts`` per answer, ``backoff``, ``max_backoff``,
            ``max_response_bytes``), its defaults when not given.
    """

    def __init__(
        self,
        tools: Iterable[Any] | ToolBox,
        base_url: str,
        model: str,
        *,
        max_retries: int = 2,
        temperature: float = 0.0,
        seed: int = 0,
        max_history: int = 8,
        max_tokens: int | None = None,
        **http: Any,
    ):
        super().__init__(tools)
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_tokens is not None and int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
        self.client = ChatClient(base_url, metrics=self.metrics, **http)
        self.model, self.max_retries = model, int(max_retries)
        self.temperature, self.seed, self.max_history = float(temperature), int(seed), int(max_history)
        self.max_tokens = None if max_tokens is None else int(max_tokens)

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @property
    def timeout(self) -> float:
        return self.client.timeout

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
            try:
                text = self.client.complete(
                    self.model, messages,
                    temperature=self.temperature, seed=self.seed, response_format={"type": "json_object"},
                    **({"max_tokens": self.max_tokens} if self.max_tokens is not None else {}),
                )
            except EndpointError as e:
                # What the model reads: the kind of fault, never a URL or a server's body.
                what = f"HTTP {e.status}" if e.status is not None else e.kind.replace("_", " ")
                tries = e.attempts
                return ToolResult(ok=False, error=f"tool simulator unavailable for {name!r}: {what} (after {tries} HTTP attempt{'s' * (tries > 1)})")
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
        return ToolResult(ok=False, error=f"tool simulator failed for {name!r} after {self.max_retries + 1} attempts: {self.client.redact(last)[:500]}")
