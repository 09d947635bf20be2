"""The package's layers (docs/architecture.md, "Layers"): each is a folder, imports point down, no import
cycle, and imports sit at the top of their module except the optional extras and the few listed here.

Read from the source (ast), so nothing is imported: an import inside ``if TYPE_CHECKING:`` is not run
and does not count. A module named in a string is a route too (``importlib.import_module("slca.x")``,
``__import__("slca.x")``, a ``"slca.x:function"`` path that a registry imports on first use, ``python -m
slca.x``): it must point down the layers as an import does."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# bottom layer first; a module may import its own layer and the ones before it
LAYERS = [
    ("types", ["slca.types", "slca.metrics", "slca._checks", "slca._fields", "slca._fs", "slca._limits", "slca._procs"]),
    ("core math", ["slca.core"]),
    ("chat", ["slca.chat"]),
    ("environment", ["slca.env"]),
    ("rewards", ["slca.rewards"]),
    ("generation", ["slca.generation"]),
    ("models", ["slca.models"]),
    ("training", ["slca.training"]),
    ("reporting", ["slca.reporting"]),
    ("evaluation", ["slca.eval"]),
    ("integrations", ["slca.integrations"]),
    ("command", ["slca.cli"]),
]

# (importer, imported): imports that reach up a layer, at call time, with why (none today)
UPWARD: set[tuple[str, str]] = set()

# packages imported inside functions on purpose: optional extras, and heavy loads nothing imports up front
LAZY_PACKAGES = {
    "trl", "peft", "datasets", "wandb", "mlflow", "trackio", "verl", "transfer_queue", "bfcl_eval", "tau2", "loguru",  # extras (transfer_queue: verl's)
    "transformers", "huggingface_hub", "matplotlib", "scipy", "pyarrow",  # heavy
    "fcntl",  # POSIX only (the run-folder lock is skipped without it)
}
# modules whose imports stay inside functions, with why
LAZY_MODULES = {
    "slca.cli": "the command loads a subcommand's modules when that subcommand runs: `slca --help` and every "
                "`slca` start cost about 0.5 CPU s less (2.0 s against 2.5 s user time, measured with the imports at the top)",
}
# other imports kept inside functions, with why
LAZY_LISTED = {
    ("slca.training.tracking", "torch.utils.tensorboard"): "loads tensorboard; only for report_to=tensorboard",
    ("slca.generation.rollout", "slca.generation.fastpath"): "kvcache / fastpath import transformers at import time",
    ("slca.generation.rollout", "slca.generation.kvcache"): "the same",
    ("slca.generation.batching", "slca.generation.fastpath"): "the same",
    ("slca.generation.batching", "slca.generation.fastpath.logprobs"): "the same",
    ("slca.rewards.batch", "slca.rewards.paper"): "the package __init__ imports batch and paper; paper_rewards is read when a batch is scored",
    ("slca.rewards.execution", "slca.rewards.paper"): "paper imports execution (the in-domain Process); eval_scores reads paper_success",
    ("slca.integrations.verl", "slca.chat"): "every verl worker imports the plugin: it stays at the core math",
    ("slca.integrations.verl", "slca.env.loaders"): "the same",
    ("slca.integrations.verl", "slca.rewards"): "the same",
    ("slca.integrations.verl", "slca.rewards.messages"): "the same",
    ("slca.integrations.verl_cpu", "slca.integrations.verl_cpu_rollout"): "imports ray; registered on first use",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted((SRC / "slca").rglob("*.py")):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported module, inside a function, line) of every import that runs (TYPE_CHECKING blocks left out)."""
    out = []

    def visit(node: ast.AST, local: bool) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                continue
            inner = local or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(ch, ast.Import):
                out.extend((a.name, local, ch.lineno) for a in ch.names)
            elif isinstance(ch, ast.ImportFrom):
                assert ch.level == 0, f"{path}:{ch.lineno}: a relative import (slca imports are absolute)"
                for a in ch.names:  # `from slca.x import y`: the module slca.x.y if there is one, else slca.x
                    sub = f"{ch.module}.{a.name}"
                    out.append((sub if sub in MODULES else ch.module, local, ch.lineno))
            visit(ch, inner)

    visit(ast.parse(path.read_text()), False)
    return out


IMPORTS = {m: _imports(p) for m, p in MODULES.items()}

# a string that is a dotted slca module path, optionally ":attribute" (an import path a registry resolves)
_MODULE_STRING = re.compile(r"slca(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?")
_DYNAMIC_IMPORTS = {"import_module", "__import__"}


def _module_of(path: str) -> str | None:
    """The slca module a dotted path names: its longest prefix that is a module (``slca.a.b.Class`` -> ``slca.a.b``)."""
    parts = path.split(":")[0].strip(".").split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


def _string_routes(source: str) -> list[tuple[str, int]]:
    """(module, line) of every slca module a string names: a whole string constant that is a module path, and the
    literal head of an f-string passed to ``import_module`` / ``__import__`` (``f"slca.rewards.{name}"``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.fullmatch(node.value.strip()):
            target = _module_of(node.value.strip())
            if target:
                out.append((target, node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.JoinedStr):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            head = node.args[0].values[0] if node.args[0].values else None
            if name in _DYNAMIC_IMPORTS and isinstance(head, ast.Constant) and str(head.value).startswith("slca."):
                target = _module_of(str(head.value))
                if target:
                    out.append((target, node.lineno))
    return sorted(out, key=lambda r: r[1])


STRING_ROUTES = {m: _string_routes(p.read_text()) for m, p in MODULES.items()}

# (importer, module named in a string) that reach up a layer, with why
UPWARD_STRINGS = {
    ("slca.training.experiments", "slca.cli"): "train_command starts each run of a comparison (and each arm of slca demo) "
                                               "as its own process, `python -m slca.cli train`: a process, not an import",
}


def _layer(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS here and to docs/architecture.md")


def test_every_module_is_in_a_layer_and_the_layers_are_folders():
    for m in MODULES:
        if m != "slca":  # the package's __init__: the public API, re-exported from the layers
            _layer(m)
    for _, prefixes in LAYERS[1:-1]:
        for p in prefixes:
            assert (SRC / p.replace(".", "/") / "__init__.py").is_file(), f"{p} is not a folder"
    top = sorted(p.name for p in (SRC / "slca").glob("*.py"))
    assert top == ["__init__.py", "_checks.py", "_fields.py", "_fs.py", "_limits.py", "_procs.py", "cli.py", "metrics.py", "types.py"], top


def test_imports_point_down_the_layers():
    bad = []
    for m, imports in IMPORTS.items():
        if m == "slca":
            continue
        for target, _, line in imports:
            if target.startswith("slca.") and (m, target) not in UPWARD and _layer(target) > _layer(m):
                bad.append(f"{MODULES[m].relative_to(SRC)}:{line}: {m} ({LAYERS[_layer(m)][0]}) imports {target} ({LAYERS[_layer(target)][0]})")
    assert not bad, "imports that reach up a layer:\n" + "\n".join(bad)


def test_modules_named_in_strings_point_down_the_layers():
    """importlib strings and registry import paths are routes too: ``core`` may not reach the rewards through one."""
    bad = []
    for m, routes in STRING_ROUTES.items():
        if m == "slca":
            continue
        for target, line in routes:
            if (m, target) not in UPWARD_STRINGS and _layer(target) > _layer(m):
                bad.append(f"{MODULES[m].relative_to(SRC)}:{line}: {m} ({LAYERS[_layer(m)][0]}) names {target} "
                           f"({LAYERS[_layer(target)][0]}) in a string")
    assert not bad, "modules named in strings that reach up a layer:\n" + "\n".join(bad)


def test_string_routes_are_seen():
    """The forms a module can be reached through by name, each seen (the old ``core`` reached the rewards so)."""
    src = (
        'import importlib\n'
        'A = InputSpec("tool_signatures", "doc", "slca.rewards.turns:tool_signatures")\n'
        '_REWARDS = "slca.rewards.paper"\n'
        'importlib.import_module("slca.eval.runner")\n'
        '__import__("slca.training.trainer")\n'
        'importlib.import_module(f"slca.integrations.{name}")\n'
        'CMD = ["python", "-m", "slca.cli"]\n'
        'log = "see slca.rewards.turns for the scores"\n'  # prose, not a path
    )
    assert _string_routes(src) == [
        ("slca.rewards.turns", 2), ("slca.rewards.paper", 3), ("slca.eval.runner", 4), ("slca.training.trainer", 5),
        ("slca.integrations", 6), ("slca.cli", 7),
    ]


def test_no_import_cycle():
    """Module-level imports (those that run when a module is imported) form no cycle."""
    graph = {m: sorted({t for t, local, _ in imports if not local and t in MODULES and t != m and not m.startswith(t + ".")})
             for m, imports in IMPORTS.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def walk(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in graph[m]:
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                walk(t, path + [t])
        state[m] = 2

    for m in graph:
        if m not in state:
            walk(m, [m])


def test_imports_are_at_the_top_but_for_extras_and_the_listed_ones():
    bad = []
    for m, imports in IMPORTS.items():
        for target, local, line in imports:
            if not local or target.split(".")[0] in LAZY_PACKAGES or (m, target) in LAZY_LISTED or m in LAZY_MODULES:
                continue
            bad.append(f"{MODULES[m].relative_to(SRC)}:{line}: import {target}")
    assert not bad, "imports inside functions (move them to the top, or list them here with the reason):\n" + "\n".join(bad)


def test_the_lists_name_imports_that_exist():
    local = {(m, t) for m, imports in IMPORTS.items() for t, is_local, _ in imports if is_local}
    assert set(LAZY_LISTED) <= local, set(LAZY_LISTED) - local
    assert UPWARD <= local, UPWARD - local  # the upward import is a call-time one
    named = {(m, t) for m, routes in STRING_ROUTES.items() for t, _ in routes}
    assert set(UPWARD_STRINGS) <= named, set(UPWARD_STRINGS) - named
    assert set(LAZY_MODULES) <= set(MODULES), set(LAZY_MODULES) - set(MODULES)
