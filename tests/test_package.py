import subprocess
import sys

import slca


def test_public_api_importable_without_extras():
    # `import slca` must not pull trl / verl / bfcl / tau2
    code = "import sys, slca; bad = [m for m in ('trl', 'verl', 'bfcl_eval', 'tau2') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_all_names_exist():
    for name in slca.__all__:
        assert hasattr(slca, name), name


def test_the_warmstart_recipe_is_not_part_of_the_package():
    """recipes/ (the default model's build) stays in the repository: the wheel takes packages from src/ only,
    and importing the library (its CLI and model loading included) imports no recipe."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    find = re.search(r"\[tool\.setuptools\.packages\.find\]\s*\nwhere = (\[[^\]]*\])", (root / "pyproject.toml").read_text())
    assert find and find.group(1) == '["src"]', "package discovery must stay under src/"
    assert not (root / "src" / "recipes").exists() and (root / "recipes" / "warmstart").is_dir()
    code = "import sys, slca, slca.models, slca.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'recipes'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout.strip()
    assert out == "[]"
