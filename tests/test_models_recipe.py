"""slca.models.recipe: finding and importing the warm-start recipe, which lives in the repository.

On this checkout and on fake checkouts in temporary folders (a ``recipes``
package with a ``warmstart`` subpackage that only defines a marker), with
``sys.modules`` restored after each test that imports one. Building with the
recipe: tests/test_warmstart_build.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slca.models import recipe as R
from slca.models.recipe import RecipeNotFoundError, find_recipe, import_recipe

ROOT = Path(__file__).resolve().parents[1]


def fake_checkout(root: Path, init: str = "") -> Path:
    """``root/recipes/warmstart`` as packages (``recipes/__init__.py`` holds ``init``); returns ``root``."""
    (root / "recipes" / "warmstart").mkdir(parents=True)
    (root / "recipes" / "__init__.py").write_text(init)
    (root / "recipes" / "warmstart" / "__init__.py").write_text(f"MARK = {str(root)!r}\n")
    return root


def test_build_model_names_where_the_recipe_is_when_it_is_missing(tmp_path):
    """A pip install has no recipes/: `slca build-model` says so in one line, before anything is built."""
    from typer.testing import CliRunner

    from slca.cli import app
    from slca.models import find_recipe

    assert find_recipe() == ROOT / "recipes" / "warmstart" and find_recipe(ROOT) == find_recipe()  # a checkout finds its own
    res = CliRunner().invoke(app, ["build-model", "--out", str(tmp_path / "m"), "--recipe", str(tmp_path / "clone")])
    assert res.exit_code == 2 and "not part of the installed slca package" in res.output, res.output
    assert not (tmp_path / "m").exists()



def test_find_recipe_takes_the_recipe_folder_or_a_checkouts_root(tmp_path):
    co = fake_checkout(tmp_path / "co")
    folder = (co / "recipes" / "warmstart").resolve()
    assert find_recipe(co) == find_recipe(co / "recipes" / "warmstart") == folder
    assert find_recipe(ROOT / "recipes" / "warmstart") == ROOT / "recipes" / "warmstart"
    loose = tmp_path / "loose" / "warmstart"  # a warmstart package whose parent is no package
    loose.mkdir(parents=True)
    (loose / "__init__.py").write_text("")
    with pytest.raises(RecipeNotFoundError) as e:
        find_recipe(loose)
    assert str(loose) in str(e.value) and str(loose / "recipes" / "warmstart") in str(e.value)  # both folders tried
    assert "not part of the installed slca package" in str(e.value) and "--recipe" in str(e.value)
    assert isinstance(e.value, ModuleNotFoundError)


def test_an_installed_slca_looks_in_the_working_folder(tmp_path, monkeypatch):
    """Imported from site-packages (no checkout around it), the recipe is ./recipes/warmstart or nowhere."""
    monkeypatch.setattr(R, "__file__", str(tmp_path / "venv" / "lib" / "site-packages" / "slca" / "models" / "recipe.py"))
    co = fake_checkout(tmp_path / "co")
    monkeypatch.chdir(co)
    assert find_recipe() == (co / "recipes" / "warmstart").resolve()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeNotFoundError) as e:
        find_recipe()
    tried = [tmp_path / "venv" / "lib" / "recipes" / "warmstart", tmp_path / "recipes" / "warmstart"]  # beside slca, then ./
    assert str(e.value).startswith(f"no recipe package at {tried[0]}, {tried[1]}: the warm-start recipe is not part of")


def test_import_recipe_gives_the_one_already_imported():
    recipe = import_recipe()
    assert recipe is sys.modules["recipes.warmstart"] and import_recipe(ROOT) is recipe
    assert Path(recipe.__file__).parent == ROOT / "recipes" / "warmstart"
    assert all(callable(getattr(recipe, name)) for name in ("BuildConfig", "fingerprint", "build_default"))


def test_import_recipe_refuses_a_second_recipes_package(tmp_path):
    import_recipe()  # this checkout's `recipes` is imported
    with pytest.raises(ImportError, match="a different 'recipes' package is already imported"):
        import_recipe(fake_checkout(tmp_path / "co"))


def test_import_recipe_imports_a_named_checkout_without_touching_sys_path(tmp_path, monkeypatch):
    for name in ("recipes", "recipes.warmstart"):  # restored after the test
        monkeypatch.delitem(sys.modules, name, raising=False)
    path = list(sys.path)
    co = fake_checkout(tmp_path / "co")
    recipe = import_recipe(co)
    assert recipe.MARK == str(co) and sys.modules["recipes.warmstart"] is recipe and sys.path == path
    assert import_recipe() is recipe  # later calls without a path: the one imported


def test_a_recipes_package_that_fails_to_import_is_not_left_half_imported(tmp_path, monkeypatch):
    for name in ("recipes", "recipes.warmstart"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    co = fake_checkout(tmp_path / "co", init="raise RuntimeError('broken recipes package')\n")
    with pytest.raises(RuntimeError, match="broken recipes package"):
        import_recipe(co)
    assert "recipes" not in sys.modules
    (co / "recipes" / "__init__.py").write_text("")  # fixed: the next try imports it
    assert import_recipe(co).MARK == str(co)
