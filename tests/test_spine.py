"""The test suite's spine: every module of the package, and of the recipes beside it, has a test file of its own name.

A module ``slca/<folder>/<name>.py`` owns ``tests/test_<folder>_<name>.py`` or ``tests/test_<name>.py``; a
module whose tests are split by theme owns each ``test_<name>_<theme>.py`` too (``test_config_validation.py``
is ``training/config.py``'s). A leading underscore is dropped (``_limits.py`` -> ``test_limits.py``). A file
belongs to the module with the longest matching name: ``test_integration_verl_cpu.py`` is ``verl_cpu.py``'s,
not ``verl.py``'s. Where two modules share a name (``eval/report.py``, ``reporting/report.py``) the bare
``test_<name>.py`` belongs to the one ``SHARED_OWNER`` names, and the other needs its folder-qualified file.

A recipe's module ``recipes/<folder>/<name>.py`` (outside the package: ``recipes/warmstart``,
``recipes/smollm2_toolworld``) owns ``tests/test_<folder>_<name>.py`` and its theme files
``test_<folder>_<name>_<theme>.py``, always named with its folder: two recipes share module names (``build.py``,
``config.py``, ``sft.py``) and so do the recipes and the package. The recipes' names take no part in the package's
shared names, and a file still goes to the longest name it matches: ``test_smollm2_toolworld_build.py`` is
``recipes/smollm2_toolworld/build.py``'s, not ``models/smollm2_toolworld.py``'s.

Tests that cross modules live in theme files (``test_fuzz.py``, ``test_train_pin.py``, ...); this only checks
that no module is left without a file of its own to look in first.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "slca"
RECIPES = ROOT / "recipes"
TESTS = ROOT / "tests"

# folder names as the test files spell them: the integration tests were named before the folder was
FOLDER_SPELLING = {"integrations": "integration"}
# a bare test file name shared by two modules belongs to this one
SHARED_OWNER = {"report": "reporting/report.py", "fields": "_fields.py"}
NOT_MODULES = {"__init__.py", "__main__.py"}


def package_modules() -> list[Path]:
    """Every module of the package, relative to it (the shipped model's folder holds data, not modules)."""
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if p.name not in NOT_MODULES and "shipped" not in p.parts)


def recipe_modules() -> list[Path]:
    """Every module of the recipes, relative to the repository root (``recipes/warmstart/build.py``)."""
    return sorted(p.relative_to(ROOT) for p in RECIPES.rglob("*.py") if p.name not in NOT_MODULES)


def is_recipe(module: Path) -> bool:
    """Whether ``module`` (as :func:`package_modules` or :func:`recipe_modules` gives it) is a recipe's."""
    return module.parts[0] == RECIPES.name


def shared_names(modules: list[Path]) -> set[str]:
    """The package's module names that more than one of its modules has (the recipes' names do not count)."""
    return {n for n, k in Counter(m.stem.lstrip("_") for m in modules if not is_recipe(m)).items() if k > 1}


def own_stems(module: Path, shared: set[str]) -> list[str]:
    """The test file stems ``module`` may own, e.g. ``["test_rewards_summary", "test_summary"]``."""
    name = module.stem.lstrip("_")
    if is_recipe(module):
        return [f"test_{module.parent.name}_{name}"]
    folder = FOLDER_SPELLING.get(module.parent.name, module.parent.name)
    stems = [f"test_{folder}_{name}"] if module.parent.parts else []
    if name not in shared or SHARED_OWNER.get(name) == module.as_posix():
        stems.append(f"test_{name}")
    return stems


def owners(modules: list[Path], files: list[str]) -> dict[Path, list[str]]:
    """Each module's test files: a file goes to the module with the longest stem it equals or extends by ``_``."""
    shared = shared_names(modules)
    stems = [(s, m) for m in modules for s in own_stems(m, shared)]
    owned: dict[Path, list[str]] = {m: [] for m in modules}
    for f in files:
        match = [(len(s), m) for s, m in stems if f == s or f.startswith(s + "_")]
        if match:
            owned[max(match, key=lambda x: x[0])[1]].append(f)
    return owned


def test_every_module_has_a_test_file_of_its_own_name():
    modules = package_modules() + recipe_modules()
    assert any(is_recipe(m) for m in modules) and not any(is_recipe(m) for m in package_modules())
    shared = shared_names(modules)
    owned = owners(modules, sorted(p.stem for p in TESTS.glob("test_*.py")))
    missing = [f"{m.as_posix()} (expected one of: {', '.join(s + '.py' for s in own_stems(m, shared))})"
               for m, files in owned.items() if not files]
    assert not missing, "modules without a test file of their own name:\n  " + "\n  ".join(missing)


def test_the_rule_reads_folders_shared_names_and_themes():
    modules = [Path(p) for p in ("eval/report.py", "reporting/report.py", "training/config.py", "integrations/verl.py",
                                 "integrations/verl_cpu.py", "_limits.py", "core/segments.py")]
    files = ["test_eval_report", "test_report", "test_config_validation", "test_integration_verl",
             "test_integration_verl_cpu", "test_limits", "test_fuzz"]
    assert owners(modules, files) == {
        Path("eval/report.py"): ["test_eval_report"],
        Path("reporting/report.py"): ["test_report"],
        Path("training/config.py"): ["test_config_validation"],
        Path("integrations/verl.py"): ["test_integration_verl"],          # not verl_cpu's file
        Path("integrations/verl_cpu.py"): ["test_integration_verl_cpu"],
        Path("_limits.py"): ["test_limits"],
        Path("core/segments.py"): [],                                       # a theme file belongs to no module
    }


def test_the_rule_reads_recipes_by_their_folder():
    modules = [Path(p) for p in ("training/config.py", "models/smollm2_toolworld.py", "recipes/warmstart/config.py",
                                 "recipes/warmstart/build.py", "recipes/smollm2_toolworld/build.py",
                                 "recipes/smollm2_toolworld/sft.py")]
    files = ["test_config", "test_config_validation", "test_build", "test_warmstart_config", "test_warmstart_build_cache",
             "test_smollm2_toolworld", "test_smollm2_toolworld_recipe", "test_smollm2_toolworld_build"]
    assert owners(modules, files) == {
        Path("training/config.py"): ["test_config", "test_config_validation"],  # a recipe's config.py shares no name
        Path("models/smollm2_toolworld.py"): ["test_smollm2_toolworld", "test_smollm2_toolworld_recipe"],
        Path("recipes/warmstart/config.py"): ["test_warmstart_config"],
        Path("recipes/warmstart/build.py"): ["test_warmstart_build_cache"],  # a theme file; never the bare test_build
        Path("recipes/smollm2_toolworld/build.py"): ["test_smollm2_toolworld_build"],  # the longest name wins
        Path("recipes/smollm2_toolworld/sft.py"): [],
    }
    assert [m.as_posix() for m in recipe_modules() if m.parent.name == "smollm2_toolworld"] == [
        "recipes/smollm2_toolworld/build.py", "recipes/smollm2_toolworld/config.py", "recipes/smollm2_toolworld/evaluate.py",
        "recipes/smollm2_toolworld/sft.py"]  # __init__ and __main__ are not modules to test
