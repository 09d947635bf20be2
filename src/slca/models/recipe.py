"""Find and import the warm-start recipe, which lives in the repository, not in the installed package.

The recipe that builds the embedded default model (``recipes/warmstart/``: demonstrations,
entity synthesis, copy drills, tokenizer training, SFT) is not part of the ``slca`` wheel:
loading the shipped weights never needs it. Building does (``slca build-model``,
``load_default(rebuild=True)`` or another build config), from a source checkout:
the one the running ``slca`` was imported from (an editable install or
``PYTHONPATH=src``), the working folder, or a folder named by ``--recipe`` /
:func:`import_recipe`. The recipe is imported as the package ``recipes.warmstart``
without putting anything on ``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["RecipeNotFoundError", "find_recipe", "import_recipe"]

_NAME = "warmstart"
_HOW = ("the warm-start recipe is not part of the installed slca package; clone the repository "
        "(git clone <slca repository> slca) and run `slca build-model` inside it, or pass --recipe CLONE/recipes/warmstart")


class RecipeNotFoundError(ModuleNotFoundError):
    """No warm-start recipe where one was looked for (the message names the folders and what to do)."""


def _candidates(path: str | Path | None) -> list[Path]:
    if path is not None:
        p = Path(path).expanduser()
        return [p, p / "recipes" / _NAME]  # the recipe folder itself, or a checkout's root
    checkout = Path(__file__).resolve().parents[3]  # src/slca/models/recipe.py -> the checkout's root
    return list(dict.fromkeys([checkout / "recipes" / _NAME, Path.cwd() / "recipes" / _NAME]))  # each folder once


def find_recipe(path: str | Path | None = None) -> Path:
    """The recipe folder (``.../recipes/warmstart``): ``path`` (the folder or a checkout's root), else the
    checkout ``slca`` was imported from, else ``./recipes/warmstart``. Raises :class:`RecipeNotFoundError`."""
    tried = _candidates(path)
    for folder in tried:
        if (folder / "__init__.py").is_file() and (folder.parent / "__init__.py").is_file():
            return folder.resolve()
    raise RecipeNotFoundError(f"no recipe package at {', '.join(str(p) for p in tried)}: {_HOW}")


def _import_recipes_package(root: Path) -> ModuleType:
    """The ``recipes`` package of folder ``root``, imported from its file (``sys.path`` untouched)."""
    loaded = sys.modules.get("recipes")
    if loaded is not None:
        where = [Path(p).resolve() for p in getattr(loaded, "__path__", [])]
        if root not in where:
            raise ImportError(f"a different 'recipes' package is already imported (from {[str(p) for p in where]}), "
                              f"not the slca checkout's {root}")
        return loaded
    spec = importlib.util.spec_from_file_location("recipes", root / "__init__.py", submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["recipes"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["recipes"]
        raise
    return module


def import_recipe(path: str | Path | None = None) -> ModuleType:
    """The warm-start recipe module ``recipes.warmstart`` (its ``BuildConfig``, ``fingerprint``, ``build_default``...).

    Without ``path``, the one already imported if any (a test or a script imported
    ``recipes.warmstart``, or an earlier call named a folder), else :func:`find_recipe`'s.
    """
    if path is None and f"recipes.{_NAME}" in sys.modules:
        return sys.modules[f"recipes.{_NAME}"]
    folder = find_recipe(path)
    _import_recipes_package(folder.parent)
    return importlib.import_module(f"recipes.{folder.name}")
