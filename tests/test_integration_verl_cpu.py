"""verl's own trainer, end to end, with SLCA: ``python -m verl.trainer.main_ppo`` on CPU.

The CPU backend (:mod:`slca.integrations.verl_cpu`, :mod:`slca.integrations.verl_cpu_rollout`)
is checked piece by piece (contract with verl's internals, config schema; the
``transformers.generate`` rollout server in test_integration_verl_cpu_rollout.py), then the real trainer runs
``examples/verl/run_slca.sh`` as a user would, shrunk to 2 toolworld rows and 2
steps, and the assertions read the run's own outputs: its exit status, its
metrics file, its rollout dump, the batches the ``slca`` estimator was handed and
returned through verl's dispatch (``SLCA_VERL_DUMP_DIR``) and the rollout
server's weight-load lines.

Runs in the verl environment (``make test`` runs it with .venv-verl's Python).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.verl
torch = pytest.importorskip("torch")
pytest.importorskip("verl")

import verl  # noqa: E402

import slca  # noqa: E402
from slca.integrations import verl as sv  # noqa: E402
from slca.integrations import verl_cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "src" / "slca" / "models" / "shipped"
SCRIPT = ROOT / "examples" / "verl" / "run_slca.sh"

# examples/verl/run_slca.sh's command shrunk to a CPU test: 2 rows, 2 rollouts each, short responses, 2 steps
SHRINK = [
    "data.train_batch_size=2",
    "data.max_prompt_length=256",
    "data.max_response_length=256",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.actor.optim.lr=1e-5",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "trainer.logger=[console,file]",
    "trainer.total_epochs=2",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
]


def _script_overrides() -> list[str]:
    """The overrides of examples/verl/run_slca.sh, shell variables replaced by a placeholder."""
    out = []
    for line in SCRIPT.read_text().splitlines():
        m = re.match(r"\s+([a-z_][\w.]*=\S.*?)\s*\\?$", line)
        if m:
            out.append(re.sub(r'"?\$\{?(\w+)\}?"?', "x", m.group(1).rstrip(" \\")).replace('"', ""))
    return out


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


# ------------------------------------------------------------------------------------------ the pieces


def test_contract_holds_on_the_pinned_verl():
    assert verl.__version__ == verl_cpu.TESTED_VERL, "pyproject pins verl==0.9.1 for the verl extra"
    verl_cpu.check_verl_contract()


def test_contract_check_names_what_moved(monkeypatch):
    from verl.workers.rollout import base

    from slca.integrations.verl_cpu_rollout import HFRolloutServer

    monkeypatch.delattr(HFRolloutServer, "clear_kv_cache")
    monkeypatch.setattr(base, "get_rollout_class", lambda rollout_name, mode="async": None)
    with pytest.raises(RuntimeError) as e:
        verl_cpu.check_verl_contract()
    msg = str(e.value)
    assert f"verl {verl.__version__} changed" in msg and "verl==0.9.1" in msg
    assert "clear_kv_cache" in msg and "get_rollout_class" in msg


def test_cpu_platform_is_opt_in():
    """Importing the backend registers it; only VERL_PLATFORM=cpu selects it (auto-detection never does)."""
    from verl.plugin.platform import PlatformRegistry

    assert PlatformRegistry.get("cpu") is verl_cpu.PlatformCPU
    assert not verl_cpu.PlatformCPU().is_platform_available(use_smi_check=True)
    dev = verl_cpu.PlatformCPU().device_module
    assert dev.get_device_name() == "CPU" and dev.current_device() == "cpu"
    assert torch.ones(2).to(dev.current_device()).device.type == "cpu"  # verl's .to(get_device_id())
    free, total = dev.mem_get_info()
    assert 0 < free <= total


def test_cpu_command_composes_against_verls_config():
    """run_slca.sh's overrides, the test's shrink and the CPU backend's overrides are all keys of verl's config."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _compose(_script_overrides() + SHRINK + verl_cpu.cpu_overrides())
    assert cfg.actor_rollout_ref.rollout.name == verl_cpu.ROLLOUT and cfg.trainer.device == "cpu"
    assert cfg.ray_kwargs.ray_init.num_gpus == 1 and cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    OmegaConf.resolve(cfg)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.name == "hf" and rollout.tensor_model_parallel_size == 1 and rollout.n == 2


# ------------------------------------------------------------------------------------------ the real trainer

WEIGHT_LINE = re.compile(r"\[slca-cpu-rollout\] replica (\d+) loaded (\d+) tensors from the trainer \(step (\w+)\): "
                         r"max \|w - w_prev\| = ([0-9.e+-]+)")


class _TreeCPU:
    """CPU seconds of a process and all its descendants (Ray's daemons and workers are not all reaped by their
    parents, so ``os.times()``'s children totals miss them): /proc polled every ``every`` s, the last reading
    of each process kept (a process that ends between two polls loses at most that interval)."""

    def __init__(self, root: int, every: float = 1.0) -> None:
        import threading

        self.root, self.every, self.seen = root, every, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        parent = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                parent[int(d)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        tree, frontier = {self.root}, [self.root]
        while frontier:
            p = frontier.pop()
            kids = [c for c, (pp, _) in parent.items() if pp == p and c not in tree]
            tree.update(kids)
            frontier.extend(kids)
        for p in tree:
            if p in parent:
                self.seen[p] = max(self.seen.get(p, 0.0), parent[p][1])

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._poll()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.seen.values())


def _run_main_ppo(tmp: Path, estimator: str = "slca", slca_estimator: str | None = None
                  ) -> tuple[subprocess.CompletedProcess, float, float]:
    """examples/verl/run_slca.sh as a user runs it, with the CPU backend and the test's shrink; (result, wall s,
    CPU s of the whole process tree)."""
    import shutil
    import tempfile

    venv_bin = str(Path(sys.executable).parent)
    ray_tmp = tempfile.mkdtemp(prefix="slca-ray-", dir="/tmp")
    env = {
        **os.environ,
        **verl_cpu.cpu_env(),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "MODEL": str(MODEL), "NNODES": "1", "DATA": str(tmp / "data"), "TASKS": "2", "EXP": f"cpu-{estimator}",
        "VERL_FILE_LOGGER_PATH": str(tmp / "metrics.jsonl"),
        "SLCA_VERL_DUMP_DIR": str(tmp / "advantages"),
        "RAY_TMPDIR": ray_tmp,  # short: Ray's socket paths under it must fit AF_UNIX's 107 bytes
        "RAY_DEDUP_LOGS": "0",
        "HYDRA_FULL_ERROR": "1",
    }
    if slca_estimator is not None:
        env["SLCA_ESTIMATOR"] = slca_estimator
    args = [*SHRINK, *verl_cpu.cpu_overrides(), f"algorithm.adv_estimator={estimator}",
            f"trainer.rollout_data_dir={tmp / 'rollouts'}", f"trainer.default_local_dir={tmp / 'ckpt'}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", str(SCRIPT), *args], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    meter = _TreeCPU(proc.pid)
    try:
        out, err = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
        cpu = meter.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    wall = time.monotonic() - t0
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    (tmp / "main_ppo.log").write_text(out + "\n--- stderr ---\n" + err)
    return r, wall, cpu


@pytest.mark.slow
def test_main_ppo_trains_two_steps_with_slca_on_cpu(tmp_path):
    """The real ``python -m verl.trainer.main_ppo`` (v1 trainer, FSDP2 actor and reference, Ray, agent loop,
    transfer queue) with ``adv_estimator=slca``, ``slca_tool_agent``, the simulated tools and ``compute_score``,
    2 steps on the embedded model, asserted from the run's own outputs."""
    check_trained_with_slca(tmp_path, _main_ppo_succeeds(tmp_path))


def _main_ppo_succeeds(tmp_path: Path, slca_estimator: str | None = None) -> str:
    """Run :func:`_run_main_ppo`, print its cost, require exit 0 (a Ray node that could not start is named as such);
    the run's log."""
    r, wall, cpu = _run_main_ppo(tmp_path, slca_estimator=slca_estimator)
    log = r.stdout + r.stderr
    print(f"main_ppo ({slca_estimator or 'slca'}): {wall:.0f} s wall, {cpu:.0f} CPU s (process tree)")
    if r.returncode != 0 and "The current node timed out during startup" in log:
        pytest.fail("Ray could not start its node: its raylet waits a fixed 30 s for its Python agents, which a machine "
                    f"this busy does not give them (not a verl or slca failure); log in {tmp_path / 'main_ppo.log'}")
    assert r.returncode == 0, f"main_ppo exited {r.returncode}; log in {tmp_path / 'main_ppo.log'}:\n{log[-6000:]}"
    return log


@pytest.mark.slow
def test_main_ppo_trains_two_steps_with_the_released_slca_on_cpu(tmp_path):
    """The same real main_ppo run with ``SLCA_ESTIMATOR=slca_paper`` (SLCA as its authors released it): verl 0.9.1
    hands ``reward_extra_info`` to ``gdpo`` alone, so ``should_no_call`` (written by ``compute_score``) reaches the
    estimator from the batch verl's trainer holds (``batch_of_verl_caller``: its TransferQueue). The advantages it
    returned inside verl's trainer equal the released loop (tests/_released_reference.py) on the inputs it got."""
    from _released_reference import ref_slca

    _main_ppo_succeeds(tmp_path, slca_estimator="slca_paper")
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(np.isfinite(s["data"]["actor/grad_norm"]) for s in steps)
    dumps = sorted((tmp_path / "advantages").glob("advantages-*.pt"))
    assert len(dumps) == 2
    for p in dumps:
        b = torch.load(p)
        assert b["estimator"] == "slca_paper" and set(b["inputs"]) == {"should_no_call"}
        no_call = b["inputs"]["should_no_call"].double().tolist()
        assert len(no_call) == len(b["index"]) == 4 and set(no_call) <= {0.0, 1.0}
        # the two rewards and should_no_call came from the rows' reward_extra_info (verl's TransferQueue); the rows
        # line up with the token layout slca's agent loop wrote into the same rows' rewards
        t, s_ = sv.unpack_token_rewards(b["token_level_rewards"], b["response_mask"])
        torch.testing.assert_close(t, b["tool_rewards"])
        torch.testing.assert_close(s_, b["summary_rewards"])
        tool, summ = b["tool_rewards"].tolist(), b["summary_rewards"].tolist()
        total = [float(np.float32(t) + np.float32(s_)) for t, s_ in zip(tool, summ)]
        mask = b["response_mask"].long().tolist()
        want = ref_slca(mask, b["index"], tool, summ, total, no_call, [[0.0] * len(mask[0])] * len(mask), 1.0, 1.0, True, 1e-6)
        torch.testing.assert_close(b["advantages"].double(), torch.tensor(want, dtype=torch.float64), atol=2e-5, rtol=1e-5)


def check_trained_with_slca(tmp_path: Path, log: str) -> None:
    """What a 2-step main_ppo run with adv_estimator=slca must show in its own outputs under ``tmp_path``
    (metrics.jsonl, rollouts/, advantages/) and in its log (the rollout server's weight-load lines)."""
    # two training steps, each with a finite, non-zero actor gradient
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        gn = s["data"]["actor/grad_norm"]
        assert np.isfinite(gn) and gn > 0, s["data"]
        # slca_tool_agent checked every rollout's masks against its conversation; the estimator logged the share
        assert s["data"]["rollout/mask_mismatch"] == 0.0, s["data"]

    # the rollouts made tool calls that the environment answered
    rows = [json.loads(line) for p in sorted((tmp_path / "rollouts").glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2  # steps x prompts x rollouts
    assert any("<tool_call>" in row["output"] and "<tool_response>" in row["output"] for row in rows)

    # the estimator ran inside verl's trainer (another process), through verl's dispatch, once per step
    dumps = sorted((tmp_path / "advantages").glob("advantages-*.pt"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    assert len(dumps) == 2 and all(int(p.stem.split("-")[1]) != os.getpid() for p in dumps)
    batches = [torch.load(p) for p in dumps]
    # slca_tool_agent checked the rollouts against their conversations, and some of them whole
    checks = [c for b in batches for c in b["mask_checks"]]
    assert len(checks) == 8 and "ok" in checks and all(c == "ok" or c.startswith("unchecked: ") for c in checks), checks
    for b in batches:
        assert b["estimator"] == "slca"
        mask = b["response_mask"]
        tool, summ = slca.segment_masks(mask)
        expect = slca.slca_advantages(b["tool_rewards"], b["summary_rewards"], b["index"], tool, summ, eps=1e-6)
        torch.testing.assert_close(b["advantages"], expect.to(b["advantages"].dtype))
        # the two rewards were read back from the token layout slca's agent loop wrote
        t, s_ = sv.unpack_token_rewards(b["token_level_rewards"], mask)
        torch.testing.assert_close(t, b["tool_rewards"])
        torch.testing.assert_close(s_, b["summary_rewards"])
        assert len(set(b["index"])) == 2 and len(b["index"]) == 4

    # the SLCA split: in some row, the tool tokens and the answer tokens carry different advantages
    split = []
    for b in batches:
        tool, summ = slca.segment_masks(b["response_mask"])
        for i in range(len(b["index"])):
            if tool[i].any() and summ[i].any():
                a_tool, a_sum = b["advantages"][i][tool[i].bool()], b["advantages"][i][summ[i].bool()]
                assert torch.all(a_tool == a_tool[0]) and torch.all(a_sum == a_sum[0])  # one value per segment
                split.append((float(a_tool[0]), float(a_sum[0])))
    assert any(a != s for a, s in split), f"no row with both segments carried two advantages: {split}"

    # grpo through the same path (verl's dispatch, slca's registry) equals verl's built-in GRPO on these batches
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    for b in batches:
        data = DataProto.from_dict(tensors={"token_level_rewards": b["token_level_rewards"], "response_mask": b["response_mask"]},
                                   non_tensors={"uid": np.array(b["index"], dtype=object)})
        builtin = compute_advantage(data, adv_estimator="grpo", config=AlgoConfig(adv_estimator="grpo")).batch["advantages"]
        os.environ[sv.ESTIMATOR_ENV] = "grpo"
        try:
            ours = compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca")).batch["advantages"]
        finally:
            del os.environ[sv.ESTIMATOR_ENV]
        # verl centres in float32, slca in float64: where a group's two scores nearly tie, verl's rounding of the
        # mean is magnified by 1/std, so each row is allowed float32's error scaled by its group's conditioning
        scores = b["token_level_rewards"].double().sum(-1)
        tol = torch.empty_like(scores)
        for uid in set(b["index"]):
            rows = torch.tensor([u == uid for u in b["index"]])
            g = scores[rows]
            cond = g.abs().max() / (g.std() + 1e-6) if len(g) > 1 else torch.tensor(0.0, dtype=torch.float64)
            tol[rows] = 8 * torch.finfo(torch.float32).eps * (1 + cond)
        on = b["response_mask"].bool()
        err = (ours.double() - builtin.double()).abs()
        assert torch.all(err[on] <= (tol[:, None] + 1e-6).expand_as(err)[on]), (err.max(-1).values, tol)

    # the trainer's weights reached the rollout model: the initial sync, then one update per step
    loads = [(int(m[2]), float(m[3])) for m in WEIGHT_LINE.findall(log)]
    assert [s for s, _ in loads] == [0, 1, 2], loads
    assert all(d > 0 for _, d in loads), loads  # dummy-initialised rollout, then each optimizer step
