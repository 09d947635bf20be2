"""The stage-1 recipe that builds the ``smollm2-toolworld`` adapter (recipes/smollm2_toolworld, issue 42).

Fast: the config's rules, the loss (the head run only where the assistant speaks equals the full head's
masked cross-entropy), slicing (a batch in slices is the same update), the evaluation's task sets. Slow,
on SmolLM2 itself: a smoke build (8 demonstrations, 2 optimizer steps, LoRA r 4) whose adapter moved and
whose loss is finite; a build killed after its first step resumes from the checkpoint and ends with the
adapter the uninterrupted build made; the built adapter ships and loads as ``model=smollm2-toolworld``.
The full build is a script (``scripts/build_smollm2_toolworld.sh``, about two CPU hours), not a test.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from recipes.smollm2_toolworld import Stage1Config, apply_overrides, split_tasks
from recipes.smollm2_toolworld import sft as SFT
from slca.env import toolworld
from slca.models import smollm2 as S
from slca.models import smollm2_toolworld as T


def test_the_config_keeps_train_heldout_unseen_and_takes_overrides():
    with pytest.raises(ValueError, match="n_tasks"):
        Stage1Config(n_tasks=toolworld.WARMSTART_DEMOS[0] + 1)
    with pytest.raises(ValueError, match="data_seed"):
        Stage1Config(data_seed=1)
    cfg = apply_overrides(Stage1Config(), ["steps=7", "lr=5e-4", "mix.verbose=0", "lora_target_modules=q_proj,v_proj"])
    assert (cfg.steps, cfg.lr, cfg.mix.verbose, cfg.lora_target_modules) == (7, 5e-4, 0.0, ("q_proj", "v_proj"))
    assert Stage1Config.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="not a field"):
        apply_overrides(cfg, ["learning_rate=1"])
    from recipes.smollm2_toolworld import config

    assert "may only ever be chosen by tool-task success on\n``train_heldout``" in config.__doc__  # the selection rule


def test_evaluation_sets_hold_300_tool_tasks_and_extend_slca_evals():
    for split in ("test", "heldout_tools"):
        tasks = split_tasks(split, 300)
        tool = [t for t in tasks if t.kind in ("single", "parallel", "chain")]
        assert len(tool) == 300 and tasks[-1].kind in ("single", "parallel", "chain")
        default = toolworld.make_tasks(split, seed=0)  # what `slca eval --split` runs
        n = min(len(default), len(tasks))
        assert [t.id for t in tasks[:n]] == [t.id for t in default[:n]]


def _tiny_lora():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    return get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


def _examples(n: int = 6) -> list[SFT.Example]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        T_ = 8 + 3 * i
        ids = torch.randint(1, 64, (T_,), generator=g).tolist()
        mask = [0] * (T_ // 2) + [1] * (T_ - T_ // 2)
        out.append(SFT.Example(ids, mask))
    return out


def test_the_assistant_loss_runs_the_head_only_where_it_counts():
    pytest.importorskip("peft")
    model = _tiny_lora()
    ex = _examples(3)
    ids, att, mask = SFT._collate(ex, pad_id=0)
    got = SFT.assistant_ce_sum(model, ids, att, mask)
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view_as(mask)
    torch.testing.assert_close(got, (ce * mask).sum())


def test_a_batch_in_slices_is_the_same_update():
    pytest.importorskip("peft")
    ex = _examples(6)
    results = []
    for micro in (10_000, 20):  # one slice, or one row at a time
        model = _tiny_lora()
        cfg = Stage1Config(n_tasks=6, steps=2, batch_tokens=10_000, micro_tokens=micro, warmup_steps=0)
        stats = SFT.train_lora(model, ex, cfg, pad_id=0)
        results.append(({n: p.detach().clone() for n, p in SFT.trainable(model)}, stats.losses))
    (a, la), (b, lb) = results
    assert la == pytest.approx(lb, rel=1e-5)
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-5, atol=1e-6)


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
