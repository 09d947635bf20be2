"""Warm-start ingredients that teach copying: drills, the induction warm-up, the env-token loss."""

from __future__ import annotations

import json
import random

import pytest
import torch

from slca.models.drills import call_drill, echo_drill, make_drills


def test_echo_drill_repeats_the_request_items():
    rng = random.Random(0)
    for _ in range(50):
        user, asst = echo_drill(rng)
        assert user["role"] == "user" and asst["role"] == "assistant"
        assert user["content"].endswith(": " + asst["content"])


def test_call_drill_arguments_come_from_the_request():
    from slca.chat import get_format
    from slca.env import toolworld

    rng = random.Random(1)
    tasks = [t for t in toolworld.make_tasks("train", n=60) if t.gold and t.kind == "single"]
    seen = 0
    for i, t in enumerate(tasks[:20]):
        conv = call_drill(t, toolworld.make_env(t), rng, episode=f"t{i}")
        if conv is None:
            continue
        seen += 1
        calls = get_format("hermes").parse(conv[1]["content"]).calls
        assert calls and conv[0]["content"] != t.messages[-1]["content"]  # fresh entities
        for c in calls:
            for v in c.arguments.values():
                if isinstance(v, str) and v.isalpha() and v[0].isupper() and len(v) > 3:
                    assert v in conv[0]["content"]
    assert seen >= 10
    drills = make_drills(10, seed=3)
    assert len(drills) == 10 and drills == make_drills(10, seed=3)


def test_induction_warmup_learns_to_copy_and_only_copying_explains_it():
    """On repeated random tokens the copy loss falls far below log(V) only if the model copies."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from slca.models.sft import induction_loss_fn, induction_warmup

    torch.manual_seed(0)
    V = 64
    cfg = Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    vocab = list(range(2, V))
    losses = induction_warmup(model, vocab, 150, lr=3e-3, bos_id=0, sep_id=1, rows=32, min_len=8, max_len=8)
    assert losses[0] > 3.5  # about log(62): nothing to copy yet
    assert sum(losses[-10:]) / 10 < 0.5
    # A batch where the second half is NOT a copy stays at chance: the model copies, it did not memorise.
    with torch.no_grad():
        x, y = torch.randint(2, V, (16, 8)), torch.randint(2, V, (16, 8))
        seq = torch.cat([torch.zeros(16, 1, dtype=torch.long), x, torch.ones(16, 1, dtype=torch.long), y], 1)
        ce = torch.nn.functional.cross_entropy(model(seq).logits[:, 9:-1].flatten(0, 1), y.flatten())
        assert float(ce) > 3.0
        assert float(induction_loss_fn(vocab, bos_id=0, sep_id=1, rows=16, min_len=8, max_len=8, seed=5)(model)) < 0.5


def test_induction_warmup_zero_steps_is_a_no_op():
    from slca.models.sft import induction_warmup

    assert induction_warmup(torch.nn.Linear(1, 1), [1, 2], 0, lr=1e-3, bos_id=0, sep_id=1) == []


def test_build_config_fields_change_the_fingerprint():
    from dataclasses import replace

    from slca.models import BuildConfig

    base = BuildConfig()
    assert replace(base, drills=10).fingerprint() != base.fingerprint()
    assert replace(base, sft=replace(base.sft, induction_steps=5)).fingerprint() != base.fingerprint()
    assert replace(base, sft=replace(base.sft, env_loss_weight=0.5)).fingerprint() != base.fingerprint()


def _run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_demo_verdict_reads_the_warm_start_and_says_who_did_better(tmp_path):
    from slca.cli import demo_verdict

    def rows(final, tool):
        out = [{"step": 0, "eval/tool_tasks/success": 0.25}]
        out += [{"step": i + 1, "loss": 0.1, "reward/tool": t} for i, t in enumerate(tool)]
        out.append({"step": len(tool), "eval/tool_tasks/success": final})
        return out

    runs = {"GRPO": _run(tmp_path / "g", rows(0.5, [0.3] * 4 + [0.2] * 4)), "SLCA": _run(tmp_path / "s", rows(0.3, [0.3] * 4 + [0.4] * 4))}
    lines = demo_verdict(runs)
    assert "GRPO: held-out success on tool-needing tasks 0.500 vs the warm start's 0.250" in lines[0]
    assert lines[0].endswith("did not rise.") and lines[1].endswith("rose.")
    assert lines[2].startswith("GRPO did as well as or better than SLCA") and "(0.500 vs 0.300)" in lines[2]
    runs = {"GRPO": _run(tmp_path / "g0", rows(0.0, [0.3] * 8)), "SLCA": _run(tmp_path / "s0", rows(0.0, [0.3] * 8))}
    assert demo_verdict(runs)[2].startswith("Neither run solved a tool-needing task")
    runs = {"GRPO": _run(tmp_path / "g1", rows(0.1, [0.3] * 8)), "SLCA": _run(tmp_path / "s1", rows(0.4, [0.3] * 8))}
    assert demo_verdict(runs)[2] == "SLCA ended above GRPO on tool-needing tasks (0.400 vs 0.100)."
