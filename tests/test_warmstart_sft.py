"""Warm-start ingredients that teach copying: the induction warm-up, the env-token and copy losses (the copy
drills: tests/test_warmstart_drills.py)."""

from __future__ import annotations

import json

import pytest
import torch


def test_induction_warmup_learns_to_copy_and_only_copying_explains_it():
    """On repeated random tokens the copy loss falls far below log(V) only if the model copies."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from recipes.warmstart.sft import induction_loss_fn, induction_warmup

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
    from recipes.warmstart.sft import induction_warmup

    assert induction_warmup(torch.nn.Linear(1, 1), [1, 2], 0, lr=1e-3, bos_id=0, sep_id=1) == []


def test_build_config_fields_change_the_fingerprint():
    from dataclasses import replace

    from recipes.warmstart import BuildConfig, fingerprint

    base = BuildConfig()
    assert fingerprint(replace(base, drills=base.drills + 10)) != fingerprint(base)
    assert fingerprint(replace(base, digit_runs=not base.digit_runs)) != fingerprint(base)
    for field in ("induction_steps", "induction_every", "env_loss_weight", "copy_weight"):
        changed = replace(base.sft, **{field: getattr(base.sft, field) + 1})
        assert fingerprint(replace(base, sft=changed)) != fingerprint(base), field


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
    assert "GRPO: held-out tool-task Success on new requests of the training distribution 0.500 at step 8 (warm start 0.250); area under its curve over steps 0, 8 0.375 (+0.125 on the warm start's 0.250)" in lines[0]
    assert lines[0].endswith("did not rise.") and lines[1].endswith("rose.")
    # one seed: the signed difference on the area (steps 0 and 8 here) and at the end, and what it cannot show
    assert lines[2] == ("SLCA - GRPO on this seed: -0.100 on the area under the held-out tool-task Success curve (0.275 vs 0.375), "
                        "-0.200 at the end (0.300 vs 0.500); one seed is one draw of tasks and weights, and cannot rank the estimators.")
    assert lines[3].startswith("What 10 seeds show (docs/results.md): in study 25, on build J")
    assert len(lines) == 4  # no out-of-distribution set and no noisy-judge arms in these runs: no sentence about them
    runs = {"GRPO": _run(tmp_path / "g0", rows(0.0, [0.3] * 8)), "SLCA": _run(tmp_path / "s0", rows(0.0, [0.3] * 8))}
    # every number the verdict quotes names its metric
    assert demo_verdict(runs)[2] == "Neither run solved a held-out tool-needing task at the end (the warm start's held-out tool-task Success was 0.250)."
    runs = {"GRPO": _run(tmp_path / "g1", rows(0.1, [0.3] * 8)), "SLCA": _run(tmp_path / "s1", rows(0.4, [0.3] * 8))}
    assert demo_verdict(runs)[2].startswith("SLCA - GRPO on this seed: +0.150 on the area under the held-out tool-task Success curve (0.325 vs 0.175)")

    def with_ood(final, ood_final, split=None, ood_start=0.03):
        out = rows(final, [0.3] * 8)
        out[0].update({"eval_fresh/tool_tasks/success": ood_start, "eval/parallel_split": 0.4})
        out[-1].update({"eval_fresh/tool_tasks/success": ood_final, **({"eval/parallel_split": split} if split is not None else {})})
        return out

    # the primary endpoint first, the diagnostic case beside it, then the out-of-distribution set stated plainly
    runs = {"GRPO": _run(tmp_path / "g2", with_ood(0.9, 0.03, 0.1)), "SLCA": _run(tmp_path / "s2", with_ood(0.95, 0.04, 0.0))}
    lines = demo_verdict(runs)
    assert "parallel steps split over turns 0.100 (warm start 0.400)" in lines[0] and "0.000 (warm start 0.400)" in lines[1]
    assert lines[4].startswith("Out of distribution (toolworld's fresh split: names and phrasings new to toolworld)")
    assert "0.030 before training and GRPO 0.030, SLCA 0.040" in lines[4]
    assert "left it where it was (within 0.03)" in lines[4] and "rarely solves these" in lines[4]
    runs = {"GRPO": _run(tmp_path / "g3", with_ood(0.9, 0.30)), "SLCA": _run(tmp_path / "s3", with_ood(0.95, 0.03))}
    # one estimator moved it, the other did not: each is named, not the first's direction for both
    assert "RL on the training distribution raised it under GRPO (+0.270) and left it within 0.03 under SLCA (+0.000)." in demo_verdict(runs)[4]
    runs = {"GRPO": _run(tmp_path / "g4", with_ood(0.9, 0.1, ood_start=0.2)), "SLCA": _run(tmp_path / "s4", with_ood(0.95, 0.1, ood_start=0.2))}
    assert demo_verdict(runs)[4].endswith("GRPO 0.100, SLCA 0.100 after: RL on the training distribution lowered it.")
    runs = {"GRPO": _run(tmp_path / "g6", with_ood(0.9, 0.1, ood_start=0.2)), "SLCA": _run(tmp_path / "s6", with_ood(0.95, 0.2, ood_start=0.2))}
    assert "lowered it under GRPO (-0.100) and left it within 0.03 under SLCA (+0.000)" in demo_verdict(runs)[4]
    runs = {"GRPO": _run(tmp_path / "g5", with_ood(0.9, 0.30, ood_start=0.2)), "SLCA": _run(tmp_path / "s5", with_ood(0.95, 0.0, ood_start=0.2))}
    assert "moved it both ways" in demo_verdict(runs)[4]


def _tiny_tokenizer(digit_runs=False):
    from recipes.warmstart.demos import make_demonstrations, render_texts
    from recipes.warmstart.config import DemoMix
    from recipes.warmstart.tokenizer import train_tokenizer

    demos = make_demonstrations(120, DemoMix(), seed=0, synthetic=0.8)
    return demos, train_tokenizer(render_texts(demos), vocab_size=600, digit_runs=digit_runs)


def test_copy_mask_marks_the_request_values_the_assistant_copies():
    from recipes.warmstart.sft import copy_mask, encode_examples

    demos, tok = _tiny_tokenizer()
    conv = [{"role": "user", "content": "Weather in Zuvaka on 2025-03-14?"},
            {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zuvaka", "date": "2025-03-14"}}\n</tool_call>'}]
    tools = demos[0].tools
    (ex,), _ = encode_examples(tok, [(conv, tools)], 4096, with_copy_mask=True)
    marked = [tok.decode([t]) for t, c in zip(ex.input_ids, ex.copy_mask) if c]
    values = tok("Zuvaka", add_special_tokens=False)["input_ids"] + tok("2025-03-14", add_special_tokens=False)["input_ids"]
    # Only value pieces (no JSON, no tool name, nothing outside the assistant turn); a piece that also occurs in the
    # system turn (a one-letter token of the tool signatures) is not marked: that is the rule's known blind spot.
    assert marked and set(marked) <= {tok.decode([t]) for t in values}
    assert "".join(marked).endswith("2025-03-14")
    assert all(m for m, c in zip(ex.model_mask, ex.copy_mask) if c)
    assert copy_mask(tok, ex.input_ids, ex.model_mask, [conv[1]], tools) == [0] * len(ex.input_ids)  # no request: nothing
    (plain,), _ = encode_examples(tok, [(conv, tools)], 4096)
    assert plain.copy_mask is None and plain.input_ids == ex.input_ids


def test_copy_weight_weighs_the_copied_tokens_and_the_logged_loss_stays_the_assistant_mean():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from recipes.warmstart.sft import _collate, encode_examples, weighted_lm_loss

    demos, tok = _tiny_tokenizer()
    (ex,), _ = encode_examples(tok, [(demos[0].messages, demos[0].tools)], 4096, with_copy_mask=True)
    assert sum(ex.copy_mask) > 0
    ids, _, w = _collate([ex], tok.pad_token_id, copy_weight=4.0)
    want = [4.0 if c else float(m) for m, c in zip(ex.model_mask, ex.copy_mask)]
    assert w[0].tolist() == want
    assert torch.equal(_collate([ex], tok.pad_token_id)[2][0], torch.tensor(ex.model_mask, dtype=torch.float32))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        mask = torch.tensor([ex.model_mask], dtype=torch.float32)
        loss, logged = weighted_lm_loss(logits, ids, w, mask)
        _, plain_logged = weighted_lm_loss(logits, ids, mask)
        ce = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
        wt = w[0, 1:]
        assert torch.allclose(loss, (ce * wt).sum() / wt.sum()) and torch.allclose(logged, plain_logged)


def test_the_build_trains_with_induction_batches_when_asked(tmp_path):
    """build_default passes the induction batches of ``induction_every`` (it used to drop them)."""
    from dataclasses import replace

    from recipes.warmstart import BuildConfig, ModelSize, SFTConfig, build_default

    tiny = BuildConfig(n_tasks=40, vocab_size=400,
                       model=ModelSize(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                       intermediate_size=64),
                       sft=SFTConfig(steps=4, batch_tokens=2048, lr=1e-2, warmup_steps=1))
    seen = []
    build_default(tmp_path / "a", tiny, progress=False, on_step=lambda s, loss, m, t: seen.append((s, loss)))
    build_default(tmp_path / "b", replace(tiny, sft=replace(tiny.sft, induction_every=1)), progress=False)
    a = json.loads((tmp_path / "a" / "slca_build.json").read_text())
    b = json.loads((tmp_path / "b" / "slca_build.json").read_text())
    assert [s for s, _ in seen] == [0, 1, 2, 3] and [x for _, x in seen] == a["losses"]
    assert a["losses"][0] == b["losses"][0] and a["losses"][1:] != b["losses"][1:]  # step 0's loss is logged before the update
    from slca.models import default_model_dir

    assert a["fingerprint"] == default_model_dir(None, tiny).name  # the recipe's fingerprint, whatever the folder


def test_a_build_whose_tokenizer_autotokenizer_would_change_is_refused_before_training(tmp_path):
    """transformers 5 loads a qwen2 folder with Qwen2Tokenizer, which re-splits digits one by one:
    a digit-run tokenizer would be fed other ids than it was trained on, so the build refuses it."""
    from recipes.warmstart import BuildConfig, ModelSize, SFTConfig, build_default
    from recipes.warmstart.build import TokenizerRoundTripError

    tiny = BuildConfig(n_tasks=40, vocab_size=400, digit_runs=True,
                       model=ModelSize(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                       intermediate_size=64),
                       sft=SFTConfig(steps=2, batch_tokens=2048, lr=1e-2, warmup_steps=1))
    steps = []
    with pytest.raises(TokenizerRoundTripError, match="digit_runs"):
        build_default(tmp_path / "a", tiny, progress=False, on_step=lambda *a: steps.append(a))
    assert steps == [] and not (tmp_path / "a").exists()


def test_demo_verdict_compares_with_the_frozen_warm_start_on_the_same_tasks(tmp_path):
    from slca.cli import demo_verdict

    rows = [{"step": 0, "eval/tool_tasks/success": 0.1}]
    rows += [{"step": i + 1, "reward/tool": t} for i, t in enumerate([0.4, 0.5, 0.3, 0.4])]
    rows.append({"step": 4, "eval/tool_tasks/success": 0.1})
    runs = {"GRPO": _run(tmp_path / "g", rows), "SLCA": _run(tmp_path / "s", rows)}
    line = demo_verdict(runs, k=2, frozen=[0.4, 0.3, 0.35, float("nan")])[0]
    # steps 1-3 pair up (the NaN step is left out): 0.400 vs 0.350
    assert "over all 3 steps 0.400 vs 0.350 for the warm start left un-updated on the same tasks (+0.050: above it)" in line


@pytest.mark.slow
def test_frozen_rewards_start_where_a_run_starts_and_never_update(tmp_path):
    """Step 1 of the frozen baseline is the same rollouts as step 1 of a run (same seed, same
    weights, same tasks); the model is not changed by it."""
    from slca.cli import frozen_tool_rewards
    from slca.training.config import TrainConfig
    from recipes.warmstart.config import DemoMix, ModelSize
    from recipes.warmstart.build import make_model
    from recipes.warmstart.demos import make_demonstrations, render_texts
    from recipes.warmstart.sft import SFTConfig, encode_examples, sft_train
    from recipes.warmstart.tokenizer import train_tokenizer
    from slca.training.trainer import train

    demos = make_demonstrations(40, DemoMix(), seed=0)
    tok = train_tokenizer(render_texts(demos), vocab_size=600)
    examples, _ = encode_examples(tok, [(d.messages, d.tools) for d in demos], 512)
    model = make_model(ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=128), tok, seed=0)
    sft_train(model, examples, SFTConfig(steps=60, batch_tokens=2048, lr=1e-2, warmup_steps=5), pad_id=tok.pad_token_id)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    common = dict(steps=2, tasks_per_step=2, group_size=2, max_turns=2, max_new_tokens=40, max_total_tokens=1024,
                  eval_every=100, eval_tasks=1, save_every=0, sample_html_every=0, seed=5, report_to=[], fast_paths=False)
    frozen = frozen_tool_rewards(TrainConfig(run_dir=str(tmp_path / "f"), **common), model, tok)
    assert len(frozen) == 2 and all(isinstance(x, float) for x in frozen)
    for k, v in model.state_dict().items():
        assert torch.equal(v, init[k]), k
    train(TrainConfig(run_dir=str(tmp_path / "r"), estimator="grpo", **common), model=model, tokenizer=tok)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r.get("step") == 1 and "reward/tool" in r)
    assert first["reward/tool"] == pytest.approx(frozen[0]) or (first["reward/tool"] != first["reward/tool"] and frozen[0] != frozen[0])
