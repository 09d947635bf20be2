"""Test-wide settings.

* One torch thread: two OpenMP threads on two busy cores run ten times slower.
* With SLCA_REQUIRE_EXTRAS=1 (CI), a test skipped because an optional extra is
  missing (``pytest.importorskip``) fails instead: CI must exercise everything.
Session fixtures (built once; treat them as read-only, ``copy.deepcopy`` one to change it):

* ``tiny_model_dir``: one random tiny Qwen2 policy folder (toolworld tokenizer), the
  ``--set model=`` of the tests that run ``slca train`` as a process.
* ``qwen_tokenizer``: the small Qwen-style tokenizer of ``tests/_tok.py`` with TRL's
  Qwen2.5 chat template.
* ``train_tasks`` (a fresh list per test, so it may be changed): 50 toolworld ``train``
  tasks, seed 0.
* ``judge_server`` (per test): a real OpenAI-compatible chat endpoint on loopback that answers
  the replies a test queues, for the judge tests.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


# The main line's heaviest files, heaviest first (seconds summed over a file's tests, `make test` on 2 cores,
# 2026-12-04). Under `--dist loadfile` a file is one unit of work handed to the next free worker in collection order,
# so a heavy file collected last leaves the other worker idle at the end; these go first. A file missing here only
# runs in its usual place: the list orders, it selects nothing.
HEAVY_FIRST = ("test_integration_trl", "test_compare", "test_faults_disk", "test_demo_cli", "test_unattended",
               "test_kill_resume", "test_serve_real", "test_smollm2", "test_smollm2_toolworld", "test_estimator_paths",
               "test_benchmarks", "test_trl_first_hour", "test_warmstart_build", "test_smollm2_toolworld_build")


def pytest_collection_modifyitems(config, items):
    """Heaviest files first (:data:`HEAVY_FIRST`), the rest in collection order; a stable sort, the same on every
    worker, so xdist's scheduler sees one order."""
    rank = {name: k for k, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if os.environ.get("SLCA_REQUIRE_EXTRAS") != "1" or not rep.skipped:
        return
    longrepr = rep.longrepr
    msg = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    if "could not import" in msg or "No module named" in msg:
        rep.outcome = "failed"
        rep.longrepr = f"SLCA_REQUIRE_EXTRAS=1 but an optional extra is missing: {msg}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Qwen2 policy saved as a model folder (hidden 32, 2 layers, 2 heads, 1 KV head), built once."""
    from _tok import save_tiny_policy

    return save_tiny_policy(tmp_path_factory.mktemp("tiny-model"), hidden=32, heads=2, kv_heads=1, intermediate=64)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """``_tok.make_qwen_tokenizer()``: Qwen's special tokens, TRL's ``qwen2_5.jinja`` template (needs trl)."""
    pytest.importorskip("trl")
    from _tok import make_qwen_tokenizer

    return make_qwen_tokenizer()


@pytest.fixture
def train_tasks():
    """50 toolworld ``train`` tasks, seed 0: the small standard task set."""
    from slca.env import toolworld

    return toolworld.make_tasks("train", n=50, seed=0)


@pytest.fixture()
def judge_server():
    """A real OpenAI-compatible chat endpoint on loopback for the judge tests: yields ``(base_url, replies, seen)``.

    Each request pops the next of ``replies``: ``("content", text)`` answers with a completion holding
    ``text``, ``("status", code)`` with that HTTP status; ``seen`` collects the request bodies (JSON).
    """
    replies: list = []
    seen: list = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            kind, value = replies.pop(0)
            if kind == "status":
                self.send_response(value)
                self.end_headers()
                return
            raw = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": value}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", replies, seen
    httpd.shutdown()
    httpd.server_close()
