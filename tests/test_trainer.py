"""Trainer: smoke run on a tiny model, stop-and-resume equality, contamination on real rollouts."""

import json
import math

import pytest
import torch

from slca.env import toolworld
from slca.training.config import TrainConfig, validate
from recipes.warmstart.config import ModelSize
from recipes.warmstart.build import make_model
from recipes.warmstart.tokenizer import train_tokenizer
from slca.generation.batching import collate, response_logprobs
from slca.training.samples import SampleGroup, read_samples, samples_to_json
from slca.training.trainer import Trainer, train

TINY = ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def tiny():
    tasks = toolworld.make_tasks("train", n=40, seed=0)
    texts = [m["content"] for t in tasks for m in t.messages] + [json.dumps(t.tools) for t in tasks[:5]]
    tok = train_tokenizer(texts * 3, vocab_size=400)
    return tok, tasks, toolworld.make_tasks("test", n=6, seed=0)


def _cfg(tmp_path, **kw):
    base = dict(run_dir=str(tmp_path / "run"), steps=3, tasks_per_step=2, group_size=2, max_turns=2, max_new_tokens=12,
                max_total_tokens=1024, minibatches=2, eval_every=2, eval_tasks=2, save_every=1, sample_html_every=1, lr=1e-3, kl_coef=0.05,
                summary_noise=0.5)  # a random model earns equal rewards; noise gives the groups variance
    base.update(kw)
    return validate(TrainConfig(**base))


def _trainer_kwargs(tiny, seed=0):
    tok, tasks, test = tiny
    return dict(model=make_model(TINY, tok, seed=seed), tokenizer=tok, train_tasks=tasks, eval_tasks=test,
                make_env=lambda task: toolworld.make_env(task, seed=0))


def _comparable(rows):
    # timing figures differ between any two runs; everything else must match
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def _read(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["slca", "grpo"])
def test_smoke_parameters_move_and_metrics_finite(tmp_path, tiny, estimator):
    import time

    kw = _trainer_kwargs(tiny)
    before = {k: v.clone() for k, v in kw["model"].state_dict().items()}
    cpu = time.process_time()
    tr = train(_cfg(tmp_path, estimator=estimator), **kw)
    cpu = time.process_time() - cpu
    after = tr.model.state_dict()
    moved = sum(int(not torch.equal(before[k], after[k])) for k in before)
    assert moved > len(before) // 2
    rows = _read(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]  # the update just taken, 1-based (TRL's global_step)
    for r in rows:
        for k, v in r.items():
            if k in ("adv/contamination", "grad/cosine_tool_summary", "grad/volatility") or k.startswith(("adv/tool_", "probe/")):
                continue  # NaN by definition when a tiny random model makes no call / too few steps
            assert v is not None and math.isfinite(v), (k, v)
    assert any(k.startswith("eval/") for k in rows[-1])
    # each row's CPU seconds: positive, and together no more than the process spent in train() (its start aside)
    spent = [r["perf/cpu_s"] for r in rows]
    assert all(s > 0 for s in spent) and sum(spent) <= cpu, (spent, cpu)
    run = tmp_path / "run"
    assert (run / "config.json").exists() and list((run / "tb").iterdir()) and list((run / "checkpoints").iterdir())
    assert json.loads((run / "samples.json").read_text())[0]["rollouts"]
    # one step index everywhere: checkpoints and recorded samples count as metrics.jsonl does
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["step-000002", "step-000003"]
    assert [s["step"] for s in json.loads((run / "samples.json").read_text())] == [1, 2, 3]
    # the file the trainer wrote reads back as its records, byte for byte
    assert all(isinstance(g, SampleGroup) for g in tr.samples)
    assert json.dumps(samples_to_json(read_samples(run / "samples.json"))) == (run / "samples.json").read_text()
    assert json.dumps(samples_to_json(tr.samples)) == (run / "samples.json").read_text()


@pytest.mark.slow
def test_stop_and_resume_gives_same_metrics(tmp_path, tiny):
    full = _cfg(tmp_path / "a", run_dir=str(tmp_path / "a"), steps=4, eval_every=2)
    train(full, **_trainer_kwargs(tiny))
    part = _cfg(tmp_path / "b", run_dir=str(tmp_path / "b"), steps=4, eval_every=2)
    train(part, stop_after=2, **_trainer_kwargs(tiny))
    assert len(_read(tmp_path / "b")) == 2
    # a fresh process would rebuild everything: new model object with a different init
    train(part, resume=True, **_trainer_kwargs(tiny, seed=123))
    a, b = _comparable(_read(tmp_path / "a")), _comparable(_read(tmp_path / "b"))
    assert all(r["loss"] != 0.0 for r in a)  # the runs really trained
    assert len(a) == len(b) == 4
    # the groups recorded before the stop came back from the checkpoint as records
    assert [g.step for g in read_samples(tmp_path / "b" / "samples.json")] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], float):
                assert rb[k] == pytest.approx(ra[k], rel=1e-5, abs=1e-6), k
            else:
                assert ra[k] == rb[k], k


def test_collate_and_logprobs_align(tiny):
    tok, tasks, _ = tiny
    model = make_model(TINY, tok).eval()
    from slca.generation.rollout import RolloutConfig, generate_rollouts

    res = generate_rollouts(model, tok, tasks[:2], lambda t: toolworld.make_env(t), RolloutConfig(group_size=2, max_turns=2, max_new_tokens=10, max_total_tokens=1024, seed=3))
    batch = collate(res.trajectories, tok.pad_token_id)
    with torch.no_grad():
        lp = response_logprobs(model, batch, 1.0)
    m = batch.model_mask.bool()
    assert m.sum() >= 4 * 5 and (batch.valid_mask.bool() & ~m).any() is not None
    # re-scoring the padded batch gives the sampling log-probs on every policy token
    assert torch.allclose(lp[m], batch.old_logprobs[m], atol=2e-4)


def test_trainer_refuses_bad_config_before_work(tmp_path):
    with pytest.raises(ValueError, match="estimator"):
        Trainer(TrainConfig(run_dir=str(tmp_path), estimator="nope"))


def test_toolworld_run_evaluates_in_distribution_and_out_of_distribution(tmp_path, tiny):
    """A toolworld run loads its own held-out sets: eval/* on train_heldout (new requests of the training
    distribution), eval_<split>/* on each ood split, every metric in its range, parallel_split among them."""
    tok = tiny[0]
    cfg = _cfg(tmp_path, eval_tasks=6, ood_splits=["test", "heldout_tools"], ood_eval_tasks=3, max_turns=1, max_new_tokens=8)
    tr = Trainer(cfg, model=make_model(TINY, tok, seed=0), tokenizer=tok)
    assert [t.meta["split"] for t in tr.eval_tasks] == ["train_heldout"] * 6
    assert {s: [t.meta["split"] for t in ts] for s, ts in tr.ood_tasks.items()} == {"test": ["test"] * 3, "heldout_tools": ["heldout_tools"] * 3}
    train_requests = {t.messages[0]["content"] for t in tr.train_tasks}
    assert not {t.messages[0]["content"] for t in tr.eval_tasks} & train_requests
    m = tr.evaluate()
    for prefix in ("eval", "eval_test", "eval_heldout_tools"):
        for k in ("success", "arg_match", "reward_tool", "reward_summary", "parse_ok"):
            assert 0.0 <= m[f"{prefix}/{k}"] <= 1.0, (prefix, k, m)
    split = [v for k, v in m.items() if k.endswith("/parallel_split")]
    assert split and all(math.isnan(v) or 0.0 <= v <= 1.0 for v in split)
    none = Trainer(_cfg(tmp_path / "b", eval_tasks=2, ood_splits=["none"]), model=make_model(TINY, tok, seed=0), tokenizer=tok)
    assert none.ood_tasks == {} and not any(k.startswith("eval_") for k in none.evaluate())


def test_parallel_split_counts_turns_on_parallel_tasks(train_tasks):
    from slca.chat import get_format
    from slca.rewards import parallel_split
    from slca.types import Turn

    fmt = get_format("hermes")
    par = next(t for t in train_tasks if t.kind == "parallel")
    single = next(t for t in train_tasks if t.kind == "single")

    def turn(calls):
        text = fmt.render(calls)
        return Turn(text=text, parsed=fmt.parse(text))

    step = par.gold[0]
    assert parallel_split(par, [turn(step), Turn(text="done", parsed=fmt.parse("done"))]) == 0.0
    assert parallel_split(par, [turn(step[:1]), turn(step[1:])]) == 1.0
    assert math.isnan(parallel_split(single, [turn(single.gold[0])]))


def test_trainer_evaluation_scores_as_slca_eval(tmp_path, tiny, monkeypatch):
    """The trainer's held-out metrics and ``slca eval``'s in-domain report score the same rollouts the
    same way (slca.rewards.eval_scores): overall, per kind, parse rate and parallel split agree."""
    import slca.eval.in_domain
    import slca.training.trainer
    from slca.eval.agent import GenerationConfig, PolicyAgent
    from slca.eval.in_domain import METRICS, run_in_domain
    from slca.generation.rollout import RolloutResult
    from slca.types import ParsedTurn, ParseError, Trajectory, Turn

    tasks = toolworld.make_tasks("train_heldout", n=40, seed=0)
    picked = [next(t for t in tasks if t.kind == k) for k in ("single", "parallel", "chain")]
    picked += [next(t for t in tasks if t.kind == "parallel" and t is not picked[1]), next(t for t in tasks if t.kind == "no_tool")]

    def tool_turn(calls, env):
        return Turn(text="<calls>", parsed=ParsedTurn(calls=list(calls)), results=[env.call(c.name, c.arguments) for c in calls])

    def script(i, task):
        env = toolworld.make_env(task, seed=0)
        if i == 1:  # the parallel step one call per turn: split
            return [tool_turn([c], env) for step in task.gold for c in step] + [Turn(text="done", parsed=ParsedTurn(content="done"))]
        if i == 3:  # a malformed turn
            return [Turn(text="<tool_call>{", parsed=ParsedTurn(errors=[ParseError("invalid_json", "bad json", "<tool_call>{")]))]
        turns = [tool_turn(step, env) for step in task.gold]
        return turns + [Turn(text=task.reference_answer, parsed=ParsedTurn(content=task.reference_answer))]

    def fake_rollouts(model, tok, chunk, make_env, cfg):
        trajs = [Trajectory(task=t, prompt_ids=[], response_ids=[], model_mask=[], logprobs=[], turns=script(picked.index(t), t),
                            final_text=t.reference_answer if picked.index(t) != 3 else "", stop_reason="final_answer", group_id=j)
                 for j, t in enumerate(chunk)]
        return RolloutResult(trajs, 0, 1.0)

    for user in (slca.training.trainer, slca.eval.in_domain):  # the two callers of the rollout engine
        monkeypatch.setattr(user, "generate_rollouts", fake_rollouts)
    kw = _trainer_kwargs(tiny)
    tr = Trainer(_cfg(tmp_path), **{**kw, "eval_tasks": picked})
    m = tr.evaluate_on(picked, "eval")
    agent = PolicyAgent(kw["model"], kw["tokenizer"], gen=GenerationConfig(max_new_tokens=8, batch_size=8))
    rep = run_in_domain(agent, picked, kw["make_env"], suite="toolworld", progress=False)
    for k in METRICS:
        assert m[f"eval/{k}"] == pytest.approx(rep.metrics[k]), k
    for kind, vals in rep.groups.items():
        assert m[f"eval/kind/{kind}/success"] == pytest.approx(vals["success"]), kind
    assert {r.detail["kind"] for r in rep.records if r.scores["success"] == 1.0} == {"single", "parallel", "chain", "no_tool"}
    assert m["eval/parse_ok"] == pytest.approx(4 / 5) == sum(r.scores["parse_ok"] for r in rep.records) / 5
    split = [r.scores["parallel_split"] for r in rep.records if "parallel_split" in r.scores]
    assert m["eval/parallel_split"] == pytest.approx(0.5) and sorted(split) == [0.0, 1.0]


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean", "token_sum_norm", "segment_balanced", "turn_mean"])
def test_micro_batches_give_the_minibatch_gradient(tmp_path, tiny, loss_agg):
    """micro_batch_size accumulates the gradient slice by slice: the same gradient, loss, clip fraction, KL and
    tool / summary gradient split as the whole minibatch at once, for every loss aggregation."""
    from slca.core.diagnostics import flat_grad

    def one_step(micro: int):
        cfg = _cfg(tmp_path / f"m{micro}", run_dir=str(tmp_path / f"m{micro}"), tasks_per_step=2, group_size=3, minibatches=1,
                   micro_batch_size=micro, loss_agg=loss_agg, diag_every=1, eval_every=0, save_every=0, sample_html_every=0)
        tr = Trainer(cfg, **_trainer_kwargs(tiny))
        grads, step = [], tr.opt.step
        tr.opt.step = lambda *a, **k: (grads.append(flat_grad(tr.params)), step(*a, **k))[1]
        m = tr.train_step()
        tr.close()
        return grads[0], {k: v for k, v in m.items() if not k.startswith("perf/")}

    g_whole, m_whole = one_step(0)
    assert g_whole.norm() > 0  # the step really had a gradient
    for micro in (1, 4):  # one row at a time; a slice of 4 and one of 2
        g, m = one_step(micro)
        torch.testing.assert_close(g, g_whole, rtol=1e-4, atol=1e-6 * float(g_whole.abs().max()))
        assert m.keys() == m_whole.keys()
        for k, v in m_whole.items():
            if isinstance(v, float) and math.isfinite(v):
                assert m[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (micro, k)
