"""recipes/smollm2_toolworld/build.py: the stage-1 build of the ``smollm2-toolworld`` adapter (issue 42).

Slow, on SmolLM2 itself: a smoke build (8 demonstrations, 2 optimizer steps, LoRA r 4) whose adapter moved and
whose loss is finite; a build killed after its first step resumes from the checkpoint and ends with the
adapter the uninterrupted build made; the built adapter ships and loads as ``model=smollm2-toolworld``.
The full build is a script (``scripts/build_smollm2_toolworld.sh``, about two CPU hours), not a test. The
config, the loss and the task sets: tests/test_smollm2_toolworld_{config,sft,evaluate}.py.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from recipes.smollm2_toolworld import Stage1Config
from recipes.smollm2_toolworld import sft as SFT
from slca.models import smollm2 as S
from slca.models import smollm2_toolworld as T


def _require_smollm2() -> None:
    problem = S.smollm2_problem()
    if problem is not None:
        pytest.skip(f"could not import the smollm2 extra ({problem}); {S.INSTALL_HINT}")


class _Killed(Exception):
    pass


SMOKE = Stage1Config(n_tasks=8, steps=2, lora_r=4, lora_alpha=8, batch_tokens=1200, micro_tokens=1200, warmup_steps=1,
                     checkpoint_every=1)


def _adapter_tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.slow
def test_smoke_build_moves_the_adapter_resumes_after_a_kill_and_ships(tmp_path, monkeypatch):
    _require_smollm2()
    pytest.importorskip("peft")
    from recipes.smollm2_toolworld import attach_lora, build_adapter, ship_adapter
    from slca.models import named

    # 1. uninterrupted: 2 steps on SmolLM2 with LoRA r 4; the loss is finite and the adapter moved
    rec = build_adapter(tmp_path / "a", SMOKE, progress=False)
    losses = rec["train"]["losses"]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert rec["train"]["cpu_seconds"] > 0 and rec["train"]["resumed_at"] == [] and rec["data"]["train_heldout_overlap"] == 0
    assert rec["base"]["fingerprint"] == named.model_fingerprint("smollm2") and len(rec["data"]["digest"]) == 64
    assert not (tmp_path / "a" / "state.pt").exists()
    done = _adapter_tensors(tmp_path / "a" / "adapter")
    init_model, _ = S.load_smollm2()
    init = {k: v.detach().clone() for k, v in attach_lora(init_model, SMOKE).state_dict().items() if "lora_" in k}
    del init_model
    assert len(done) == len(init) == 30 * 7 * 2
    assert all(v.abs().max() > 0 for k, v in done.items() if "lora_B" in k)  # B starts at zero
    assert sum(not torch.equal(v, init[k.replace(".weight", ".default.weight")]) for k, v in done.items() if "lora_A" in k) > 0

    # 2. killed after step 1 (its checkpoint written): no adapter; another config's build refuses the checkpoint
    def kill(step, loss, stats):
        if step == 1:
            raise _Killed

    with pytest.raises(_Killed):
        build_adapter(tmp_path / "b", SMOKE, progress=False, on_step=kill)
    assert (tmp_path / "b" / "state.pt").is_file() and not (tmp_path / "b" / "adapter").exists()
    with pytest.raises(SFT.StateMismatch, match="another build"):
        build_adapter(tmp_path / "b", dataclasses.replace(SMOKE, lr=5e-4), progress=False)
    # ... and started again it resumes at step 1 and ends with the uninterrupted build's adapter
    again = build_adapter(tmp_path / "b", SMOKE, progress=False)
    assert again["train"]["resumed_at"] == [1] and again["fingerprint"] == rec["fingerprint"]
    assert again["train"]["losses"] == pytest.approx(losses, rel=1e-5)
    resumed = _adapter_tensors(tmp_path / "b" / "adapter")
    for k in done:
        torch.testing.assert_close(resumed[k], done[k], rtol=1e-5, atol=1e-6)
    assert build_adapter(tmp_path / "b", SMOKE, progress=False)["built"] == again["built"]  # done: not trained again

    # 3. shipped, it is model=smollm2-toolworld
    dest = ship_adapter(tmp_path / "a" / "adapter", tmp_path / "shipped")
    monkeypatch.setattr(T, "shipped_adapter_dir", lambda: dest)
    assert named.named_model_problem(T.NAME) is None
    model, tok = named.load_named(T.NAME)
    assert type(model).__name__ == "LlamaForCausalLM" and tok.chat_template == S.smollm2_chat_template()
    info = json.loads((dest / T.INFO_FILE).read_text())
    assert info["fingerprint"] == rec["fingerprint"] and info["adapter"]["bytes"] <= T.MAX_ADAPTER_BYTES
    assert named.model_fingerprint(T.NAME).endswith(f"+adapter:{info['adapter']['fingerprint']}")
