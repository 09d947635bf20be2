"""The test suite's spine: every module of the package has a test file of its own name.

A module ``slca/<folder>/<name>.py`` owns ``tests/test_<folder>_<name>.py`` or ``tests/test_<name>.py``; a
module whose tests are split by theme owns each ``test_<name>_<theme>.py`` too (``test_config_validation.py``
is ``training/config.py``'s). A leading underscore is dropped (``_limits.py`` -> ``test_limits.py``). A file
belongs to the module with the longest matching name: ``test_integration_verl_cpu.py`` is ``verl_cpu.py``'s,
not ``verl.py``'s. Where two modules share a name (``eval/report.py``, ``reporting/report.py``) the bare
``test_<name>.py`` belongs to the one ``SHARED_OWNER`` names, and the other needs its folder-qualified file.

Tests that cross modules live in theme files (``test_fuzz.py``, ``test_train_pin.py``, ...); this only checks
that no module is left without a file of its own to look in first.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "slca"
TESTS = ROOT / "tests"

# folder names as the test files spell them: the integration tests were named before the folder was
FOLDER_SPELLING = {"integrations": "integration"}
# a bare test file name shared by two modules belongs to this one
SHARED_OWNER = {"report": "reporting/report.py", "fields": "_fields.py"}
NOT_MODULES = {"__init__.py", "__main__.py"}


def package_modules() -> list[Path]:
    """Every module of the package, relative to it (the shipped model's folder holds data, not modules)."""
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if p.name not in NOT_MODULES and "shipped" not in p.parts)


def own_stems(module: Path, shared: set[str]) -> list[str]:
    """The test file stems ``module`` may own, e.g. ``["test_rewards_summary", "test_summary"]``."""
    name = module.stem.lstrip("_")
    folder = FOLDER_SPELLING.get(module.parent.name, module.parent.name)
    stems = [f"test_{folder}_{name}"] if module.parent.parts else []
    if name not in shared or SHARED_OWNER.get(name) == module.as_posix():
        stems.append(f"test_{name}")
    return stems


def owners(modules: list[Path], files: list[str]) -> dict[Path, list[str]]:
    """Each module's test files: a file goes to the module with the longest stem it equals or extends by ``_``."""
    shared = {n for n, k in Counter(m.stem.lstrip("_") for m in modules).items() if k > 1}
    stems = [(s, m) for m in modules for s in own_stems(m, shared)]
    owned: dict[Path, list[str]] = {m: [] for m in modules}
    for f in files:
        match = [(len(s), m) for s, m in stems if f == s or f.startswith(s + "_")]
        if match:
            owned[max(match, key=lambda x: x[0])[1]].append(f)
    return owned


def test_every_module_has_a_test_file_of_its_own_name():
    modules = package_modules()
    shared = {n for n, k in Counter(m.stem.lstrip("_") for m in modules).items() if k > 1}
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
