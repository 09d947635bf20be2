"""A suite of the user's own Python tool functions: ``slca train --set tools=my_pkg.tools``.

The functions are the tools: each schema comes from the function's signature and
Google-style docstring through ``transformers.utils.get_json_schema``, as TRL
builds the schemas of ``GRPOTrainer(tools=[...])``, so one module serves both
hosts. The tasks come from a task file in slca's row format
(:func:`slca.env.loaders.load_tasks`, ``format="slca"``); a row may leave out
``tools`` (it is offered every function) or list tool names (it is offered those).
Calls are answered by :class:`slca.env.simulators.PythonSimulator` over the
functions: a fresh episode state per rollout, and a tool that raises gives the
model an error result (:func:`slca.env.simulators.tool_raised`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slca.env.loaders import RowError, read_rows, task_from_row
from slca.env.simulators import PythonSimulator
from slca.types import Task

__all__ = ["import_module_ref", "load_tool_functions", "tool_schemas", "load_python_tasks", "python_env"]

STATE_PARAMETER = "state"
"""A function parameter of this name receives the episode's state dict; it is not shown to the model."""


def import_module_ref(module_ref: str, ref: str, what: str = "tools") -> Any:
    """The module ``module_ref`` names: a ``.py`` file or an importable module path; ValueError in one line
    naming the setting ``what`` and ``ref`` (what the user gave) otherwise. The user's tools and reward functions
    (:func:`slca.rewards.batch.user_reward`) load through it."""
    if module_ref.endswith(".py"):
        path = Path(module_ref).expanduser()
        if not path.is_file():
            raise ValueError(f"{what} {ref!r}: no such file")
        spec = importlib.util.spec_from_file_location(f"slca_user_{what}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import does: a dataclass or pickle in the file looks itself up there
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(module_ref)
    except ModuleNotFoundError as e:
        raise ValueError(f"{what} {ref!r}: cannot import {e.name!r} (give a .py file, or put the package on "
                         "PYTHONPATH / install it)") from None


def load_tool_functions(ref: str) -> dict[str, Callable[..., Any]]:
    """``{name: function}`` of the tools ``ref`` names.

    ``ref`` is ``"my_pkg.tools"`` or ``"path/to/tools.py"``, optionally with
    ``":NAME"`` for a list of functions in it. Without ``NAME`` the module's
    ``TOOLS`` list is used if it has one, else every public function defined in
    the module itself (imported helpers are not tools).
    """
    module_ref, _, attr = ref.partition(":")
    module = import_module_ref(module_ref, ref)
    if attr or hasattr(module, "TOOLS"):
        name = attr or "TOOLS"
        if not isinstance(getattr(module, name, None), (list, tuple)):
            raise ValueError(f"tools {ref!r}: module {module_ref!r} has no list {name!r} of tool functions")
        funcs = list(getattr(module, name))
    else:
        funcs = [f for n, f in vars(module).items()
                 if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == module.__name__]
    bad = [f for f in funcs if not callable(f)]
    if bad or not funcs:
        raise ValueError(f"tools {ref!r}: " + (f"{bad[0]!r} is not a function" if bad else "no tool functions found"))
    return {f.__name__: f for f in funcs}


def tool_schemas(functions: dict[str, Callable[..., Any]]) -> list[dict[str, Any]]:
    """OpenAI tool schemas of ``functions`` (``get_json_schema``); the ``state`` parameter is left out."""
    from transformers.utils import get_json_schema

    out = []
    for name, fn in functions.items():
        try:
            schema = get_json_schema(fn)
        except Exception as e:  # transformers' parsing errors say which argument lacks a type hint or description
            raise ValueError(f"tool {name!r}: cannot build its schema from the signature and docstring: {e}") from None
        schema["function"].pop("return", None)  # a description of the result, not a schema slca checks
        params = schema["function"]["parameters"]
        params.get("properties", {}).pop(STATE_PARAMETER, None)
        if STATE_PARAMETER in params.get("required", []):
            params["required"] = [r for r in params["required"] if r != STATE_PARAMETER]
        out.append(schema)
    return out


def load_python_tasks(path: str | Path, functions: dict[str, Callable[..., Any]]) -> list[Task]:
    """The tasks of a task file whose tools are ``functions``: a row without ``tools`` is offered all of
    them, a row whose ``tools`` lists names is offered those (an unknown name is refused)."""
    schemas = {s["function"]["name"]: s for s in tool_schemas(functions)}

    def build(row: Any, where: str, index: int) -> Task:
        names = row.get("tools") if isinstance(row, dict) else None
        if names is None:
            names = list(schemas)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RowError(where, index, "tools", "must be a list of tool names (or left out: every function)")
        unknown = sorted(set(names) - set(schemas))
        if unknown:
            raise RowError(where, index, "tools", f"{unknown} are not among the tool functions {sorted(schemas)}")
        return task_from_row({**row, "tools": [schemas[n] for n in names]}, "slca", where=where, index=index)

    return read_rows(Path(path), build)


def python_env(functions: dict[str, Callable[..., Any]]) -> Callable[[Task], PythonSimulator]:
    """The simulator factory of a Python-tools suite: a fresh :class:`PythonSimulator` over the task's tools per rollout."""
    return lambda task: PythonSimulator(task.tools, {t["function"]["name"]: functions[t["function"]["name"]] for t in task.tools})
