"""A user's estimator reaches every process: an import path ``package.module:function`` or a
``slca.estimators`` entry point, resolved (and refused, in one line, before any work) the same way in
``slca train``, ``slca compare`` and its runs, and the TRL config (verl: tests/test_integration_verl.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

import slca
import slca.core.registry as adv
from slca.core.advantages import slca_advantages
from slca.core.registry import AdvantageInputs, compute_advantages, get_estimator, resolve_estimator
from slca.core.segments import segment_masks
from slca.training.config import load_config

SRC = Path(slca.__file__).resolve().parents[1]  # the slca under test, for the subprocesses

ESTIMATORS_PY = '''
"""A user's estimators: registered when this module is imported."""
import os

import slca
from slca.core.advantages import grpo_advantages, slca_advantages
from slca.core.registry import EstimatorSpec


def _log(name):
    if os.environ.get("USER_EST_LOG"):  # proves the user's code ran, in whatever process
        with open(os.environ["USER_EST_LOG"], "a") as f:
            f.write(f"{{name}} {{os.getpid()}}\\n")


@slca.register_estimator("{prefix}_half_slca")
def half_slca(inputs, *, scale="group", eps=1e-6):
    """SLCA at half strength."""
    _log("{prefix}_half_slca")
    return 0.5 * slca_advantages(inputs.tool_rewards, inputs.summary_rewards, inputs.group_ids, inputs.tool_mask,
                                 inputs.summary_mask, scale=scale, eps=eps)


@slca.register_estimator("{prefix}_double_grpo", trajectory=True)
def _double_grpo(inputs, *, scale="group", eps=1e-6):
    """GRPO at double strength."""
    _log("{prefix}_double_grpo")
    return 2 * grpo_advantages(inputs.total_rewards, inputs.group_ids, inputs.model_mask, scale=scale, eps=eps)


def _neg(inputs):
    """Minus GRPO (as a spec object)."""
    return -grpo_advantages(inputs.total_rewards, inputs.group_ids, inputs.model_mask)


NEG = EstimatorSpec("{prefix}_neg", _neg)


def helper(inputs):
    """Not registered."""
'''

DUPLICATE_PY = '''
import slca

@slca.register_estimator("slca")
def mine(inputs):
    """Takes a name slca's own estimator holds."""
'''


def write_user_package(root: Path, prefix: str, entry_points: dict[str, str] | None = None) -> str:
    """A package ``<prefix>pkg`` under ``root`` (estimators named ``<prefix>_...``), optionally with an installed
    distribution's metadata declaring ``entry_points`` in the ``slca.estimators`` group; returns the package name."""
    pkg = root / f"{prefix}pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "estimators.py").write_text(ESTIMATORS_PY.format(prefix=prefix))
    (pkg / "duplicate.py").write_text(DUPLICATE_PY)
    if entry_points:
        info = root / f"{prefix}pkg-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {prefix}pkg\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text("[slca.estimators]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    return pkg.name


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """A fresh user package on sys.path (a unique name: modules stay imported), with one entry point;
    the registry is restored afterwards."""
    prefix = "u" + uuid.uuid4().hex[:8]
    name = write_user_package(tmp_path / "site", prefix, {f"{prefix}_ep": f"{prefix}pkg.estimators:_double_grpo"})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(adv, "_REGISTRY", dict(adv._REGISTRY))
    monkeypatch.setattr(adv, "_ALIASES", {})
    return prefix, name


def _inputs():
    model = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1], [1, 0, 0, 1], [1, 1, 0, 1]])
    tm, sm = segment_masks(model, torch.ones_like(model))
    return AdvantageInputs(torch.tensor([1.0, 0.0, 0.5, 0.2]), torch.tensor([0.0, 1.0, 0.2, 0.9]), [0, 0, 1, 1], model, tm, sm)


# ----------------------------------------------------------------------------- resolution, in this process


def test_import_path_imports_the_module_and_finds_the_registered_function(user_pkg):
    prefix, pkg = user_pkg
    path = f"{pkg}.estimators:half_slca"
    assert f"{prefix}_half_slca" not in slca.list_estimators()  # not imported yet
    spec = resolve_estimator(path)
    assert spec.name == f"{prefix}_half_slca" and spec is get_estimator(path) is get_estimator(spec.name)
    inp = _inputs()
    want = 0.5 * slca_advantages(inp.tool_rewards, inp.summary_rewards, inp.group_ids, inp.tool_mask, inp.summary_mask)
    torch.testing.assert_close(compute_advantages(path, inp), want)
    # the registered name instead of the attribute, and an EstimatorSpec object, also resolve
    assert resolve_estimator(f"{pkg}.estimators:{prefix}_double_grpo").name == f"{prefix}_double_grpo"
    assert resolve_estimator(f"{pkg}.estimators:NEG").name == f"{prefix}_neg"
    # a config names it; validation imports it
    assert load_config(None, [f"estimator={path}"]).estimator == path


def test_the_spec_is_found_again_after_the_registry_was_reset(user_pkg):
    """A module imported once is not imported again: its function carries its spec."""
    _, pkg = user_pkg
    spec = resolve_estimator(f"{pkg}.estimators:half_slca")
    adv._REGISTRY.pop(spec.name)
    adv._ALIASES.clear()
    assert resolve_estimator(f"{pkg}.estimators:half_slca") is spec


@pytest.mark.parametrize("ref, message", [
    ("{pkg}.nomodule:fn", "estimator '{pkg}.nomodule:fn': no module named '{pkg}.nomodule' (install its package, or put the folder"),
    ("nopkg_{prefix}:fn", "estimator 'nopkg_{prefix}:fn': no module named 'nopkg_{prefix}'"),
    ("{pkg}.estimators:nothing", "estimator '{pkg}.estimators:nothing': module '{pkg}.estimators' has no attribute 'nothing'; "
                                 "estimators it registered: ['{prefix}_double_grpo', '{prefix}_half_slca']"),
    ("{pkg}.estimators:helper", "estimator '{pkg}.estimators:helper': {pkg}.estimators.helper is not a registered estimator: "
                                "decorate it with @slca.register_estimator(\"NAME\")"),
    ("{pkg}.estimators:os", "estimator '{pkg}.estimators:os': {pkg}.estimators.os is a module, not an estimator function"),
    ("{pkg}.duplicate:mine", "estimator '{pkg}.duplicate:mine': importing module '{pkg}.duplicate' failed: ValueError: an estimator "
                             "named 'slca' is already registered (slca.core.registry._slca)"),
    ("{pkg}.estimators:", "estimator '{pkg}.estimators:': an import path must look like 'package.module:function'"),
    ("my-pkg:fn", "estimator 'my-pkg:fn': an import path must look like 'package.module:function'"),
    ("nope_{prefix}", "unknown estimator 'nope_{prefix}'"),  # then the closest name (this test's own are close), the registered ones
])
def test_each_failure_is_one_line_naming_what_is_wrong(user_pkg, ref, message):
    prefix, pkg = user_pkg
    ref, message = ref.format(pkg=pkg, prefix=prefix), message.format(pkg=pkg, prefix=prefix)
    with pytest.raises(ValueError) as e:
        resolve_estimator(ref)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ValueError) as e:  # the config names the field, then the same reason
        load_config(None, [f"estimator={ref}"])
    assert str(e.value).startswith("estimator: ") and "\n" not in str(e.value)


def test_entry_point_name_resolves_and_duplicates_are_refused(user_pkg, tmp_path, monkeypatch):
    prefix, pkg = user_pkg
    with pytest.raises(ValueError) as e:
        resolve_estimator(f"{prefix}_nope")
    assert f"; installed (slca.estimators entry points): ['{prefix}_ep']; user code: give its import path" in str(e.value)
    spec = resolve_estimator(f"{prefix}_ep")  # [slca.estimators] <prefix>_ep = <pkg>.estimators:_double_grpo
    assert spec.name == f"{prefix}_double_grpo" and spec.trajectory
    assert load_config(None, [f"estimator={prefix}_ep"]).estimator == f"{prefix}_ep"
    # a second package declaring the same entry-point name for another function
    other = tmp_path / "other"
    write_user_package(other, prefix + "b", {f"{prefix}_ep": f"{prefix}bpkg.estimators:half_slca"})
    monkeypatch.syspath_prepend(str(other))
    adv._ALIASES.clear()
    with pytest.raises(ValueError, match=f"estimator entry point '{prefix}_ep' \\(slca.estimators\\) is declared twice: "):
        resolve_estimator(f"{prefix}_ep")


# ----------------------------------------------------------------------------- slca train, a fresh process

TINY_SETS = ["steps=2", "tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=10", "minibatches=1",
             "eval_every=0", "eval_tasks=1", "save_every=0", "sample_html_every=0", "diag_every=0", "summary_noise=0.5",
             "report_to=none"]


def _env(*paths: Path, **extra: str) -> dict[str, str]:
    """This environment with only ``paths`` and the slca under test on PYTHONPATH (not this process's sys.path)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *map(str, paths)]), "OMP_NUM_THREADS": "1", **extra}


def _slca(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slca.cli", *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def test_train_cli_refuses_a_bad_path_in_one_line_before_a_run_folder(tmp_path):
    site = tmp_path / "site"
    pkg = write_user_package(site, "v")
    documented = next(ln for ln in (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text().splitlines()
                      if ln.startswith("error: estimator: no module named"))
    for ref, why in [("my_estimators:slca_call_cost", documented[len("error: "):]),  # docs/training.md's line, exactly
                     ("vpkg.missing:fn", "estimator: no module named 'vpkg.missing'"),
                     ("vpkg.estimators:helper", "estimator: vpkg.estimators.helper is not a registered estimator"),
                     ("vpkg.duplicate:mine", "estimator: importing module 'vpkg.duplicate' failed: ValueError: an estimator named 'slca'")]:
        r = _slca(["train", "--set", f"estimator={ref}", "--set", f"run_dir={tmp_path / 'run'}"], _env(site), tmp_path)
        assert r.returncode == 2 and r.stderr.startswith(f"error: {why}") and r.stderr.count("\n") == 1, (ref, r.stderr)
        assert not (tmp_path / "run").exists()
    assert pkg == "vpkg"


@pytest.mark.slow
def test_train_cli_runs_a_user_estimator_by_import_path(tmp_path, tiny_model_dir):
    """`slca train --set estimator=pkg.module:fn` in a fresh process: the module is imported there, its function computes the advantages."""
    site = tmp_path / "site"
    write_user_package(site, "w")
    log = tmp_path / "calls.txt"
    run = tmp_path / "run"
    sets = [f"model={tiny_model_dir}", f"run_dir={run}", "estimator=wpkg.estimators:half_slca", *TINY_SETS]
    r = _slca(["train", *[x for s in sets for x in ("--set", s)]], _env(site, USER_EST_LOG=str(log)), tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert json.loads((run / "config.json").read_text())["estimator"] == "wpkg.estimators:half_slca"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [x["step"] for x in rows] == [1, 2] and all(math.isfinite(x["loss"]) for x in rows)
    calls = log.read_text().split()
    assert calls[0::2] == ["w_half_slca"] * 2 and len(set(calls[1::2])) == 1  # once per step, in the run's own process


# ----------------------------------------------------------------------------- slca compare


def _top_level(inputs, *, scale="group"):
    return slca.grpo_advantages(inputs.total_rewards, inputs.group_ids, inputs.model_mask, scale=scale)


def test_compare_refuses_at_the_start_what_its_runs_could_not_resolve(user_pkg, tmp_path):
    """Before any run trains: a name registered only in this process, an unresolvable path, one estimator twice."""
    from slca.training.experiments import run_compare

    prefix, pkg = user_pkg
    out = tmp_path / "cmp"

    @slca.register_estimator(f"{prefix}_here_only")
    def here_only(inputs, *, scale="group"):
        return slca.grpo_advantages(inputs.total_rewards, inputs.group_ids, inputs.model_mask, scale=scale)

    slca.register_estimator("spec_only", _top_level)
    cases = [
        (["grpo", f"{prefix}_here_only"], f"--estimators: '{prefix}_here_only' is registered in this process only (by {__name__}); each run "
         "trains in a fresh `slca train` process, which cannot see it: pass its import path 'package.module:function' (define it "
         "at the top level of a module"),
        (["grpo", "spec_only"], f"--estimators: 'spec_only' is registered in this process only (by {__name__}); each run trains in a "
         f"fresh `slca train` process, which cannot see it: pass its import path '{__name__}:_top_level'"),
        (["grpo", "nowhere_mod:fn"], "--estimators: estimator 'nowhere_mod:fn': no module named 'nowhere_mod'"),
        (["grpo", f"{pkg}.estimators:half_slca", f"{pkg}.estimators:{prefix}_half_slca"], f"--estimators: '{pkg}.estimators:half_slca' "
         f"and '{pkg}.estimators:{prefix}_half_slca' are the same estimator '{prefix}_half_slca'"),
    ]
    for ests, message in cases:
        with pytest.raises(ValueError) as e:
            run_compare(ests, [0], out, ["steps=1", "model=/nonexistent"])
        assert str(e.value).startswith(message), str(e.value)
        assert not out.exists()  # nothing trained, not even the runs that could


def test_compare_runs_get_the_folder_this_process_imported_a_path_from(user_pkg, tmp_path):
    """A folder added to sys.path in this process (a notebook) reaches the runs' PYTHONPATH; the installation's do not."""
    from slca.training.experiments import _import_roots

    _, pkg = user_pkg
    resolve_estimator(f"{pkg}.estimators:half_slca")
    assert _import_roots(["grpo", f"{pkg}.estimators:half_slca", "slca.core.registry:_slca"]) == [str((tmp_path / "site").resolve())]


@pytest.mark.slow
def test_compare_cli_trains_user_estimators_by_path_and_entry_point(tmp_path, tiny_model_dir):
    """Two runs, each a user estimator: one by import path, one by entry point; each resolved in its own process."""
    site = tmp_path / "site"
    write_user_package(site, "x", {"x_ep": "xpkg.estimators:_double_grpo"})
    log = tmp_path / "calls.txt"
    out = tmp_path / "cmp"
    sets = [f"model={tiny_model_dir}", *TINY_SETS, "steps=1"]
    cmd = ["compare", "--estimators", "xpkg.estimators:half_slca,x_ep", "--seeds", "0", "--out", str(out), "--jobs", "1"]
    r = _slca(cmd + [x for s in sets for x in ("--set", s)], _env(site, USER_EST_LOG=str(log)), tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["logs", "x_ep-seed0", "x_half_slca-seed0"]
    assert json.loads((out / "x_half_slca-seed0" / "config.json").read_text())["estimator"] == "xpkg.estimators:half_slca"
    assert json.loads((out / "x_ep-seed0" / "config.json").read_text())["estimator"] == "x_ep"
    lines = [x.split() for x in log.read_text().splitlines()]
    assert sorted(name for name, _ in lines) == ["x_double_grpo", "x_half_slca"]
    assert len({pid for _, pid in lines}) == 2  # two runs, two processes
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(x["estimator"] for x in summary["runs"]) == ["x_ep", "xpkg.estimators:half_slca"]


def test_compare_cli_refuses_an_unresolvable_estimator_in_one_line(tmp_path):
    r = _slca(["compare", "--estimators", "grpo,nowhere_mod:fn", "--seeds", "0", "--out", str(tmp_path / "cmp")], _env(), tmp_path)
    assert r.returncode == 2 and r.stderr == ("error: --estimators: estimator 'nowhere_mod:fn': no module named 'nowhere_mod' "
                                              "(install its package, or put the folder that holds it on PYTHONPATH)\n"), r.stderr
    assert not (tmp_path / "cmp").exists()


# ----------------------------------------------------------------------------- TRL


def test_trl_config_resolves_an_import_path_before_any_model(user_pkg, tmp_path):
    pytest.importorskip("trl")
    from slca.integrations.trl import SLCAGRPOConfig, trl_batch_advantages

    prefix, pkg = user_pkg
    kw = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    cfg = SLCAGRPOConfig(advantage_estimator=f"{pkg}.estimators:_double_grpo", **kw)
    r = torch.tensor([[1.0, 0.2], [0.0, 0.9], [0.5, 0.5], [0.2, 0.0]])
    mask = torch.ones(4, 3)
    got, _ = trl_batch_advantages(r, ["tool", "summary"], torch.ones(2), mask, None, 4, estimator=cfg.advantage_estimator)
    want, _ = trl_batch_advantages(r, ["tool", "summary"], torch.ones(2), mask, None, 4, estimator="grpo")
    torch.testing.assert_close(got, 2 * want)
    with pytest.raises(ValueError, match=f"estimator '{pkg}.nomodule:fn': no module named '{pkg}.nomodule'"):
        SLCAGRPOConfig(advantage_estimator=f"{pkg}.nomodule:fn", **kw)
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        SLCAGRPOConfig(advantage_estimator="nope", **kw)


TRL_STEP = """
import sys
sys.path.insert(0, {tests!r})
from test_integration_trl import base_args, build_policy, build_tokenizer, dataset, execution_reward, summary_reward
from slca.integrations.trl import SLCAGRPOConfig, SLCAGRPOTrainer

tok = build_tokenizer()
args = base_args({out!r}, advantage_estimator="ypkg.estimators:half_slca", max_completion_length=16)
t = SLCAGRPOTrainer(model=build_policy(tok), processing_class=tok, reward_funcs=[execution_reward, summary_reward],
                    args=args, train_dataset=dataset(8))
t.train()
print("ESTIMATOR", t.slca_estimator)
"""


@pytest.mark.slow
def test_trl_trainer_takes_a_step_with_an_import_path_in_a_fresh_process(tmp_path):
    pytest.importorskip("trl")
    site = tmp_path / "site"
    write_user_package(site, "y")
    log = tmp_path / "calls.txt"
    script = tmp_path / "step.py"
    script.write_text(TRL_STEP.format(tests=str(Path(__file__).parent), out=str(tmp_path / "out")))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                       env=_env(site, USER_EST_LOG=str(log), TRL_EXPERIMENTAL_SILENCE="1"), cwd=tmp_path)
    assert r.returncode == 0, textwrap.shorten(r.stderr[-3000:], 3000)
    assert "ESTIMATOR ypkg.estimators:half_slca" in r.stdout
    assert log.read_text().split()[0] == "y_half_slca"
