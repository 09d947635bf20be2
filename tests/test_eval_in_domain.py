"""In-domain evaluation on Toucan rows: the paper's metrics per Toucan subset, with a real (tiny, random) Qwen2 policy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _tok import tiny_qwen2

from slca.env import SchemaSimulator, load_tasks
from slca.eval.agent import GenerationConfig, PolicyAgent
from slca.eval.in_domain import METRICS, group_of, run_in_domain
from slca.eval.report import mean

FIX = Path(__file__).parent / "fixtures" / "env"


@pytest.fixture(scope="module")
def agent(qwen_tokenizer):
    tok = qwen_tokenizer
    return PolicyAgent(tiny_qwen2(len(tok)), tok, gen=GenerationConfig(max_new_tokens=6, batch_size=8))


def test_toucan_reports_each_subset(agent):
    tasks = load_tasks(FIX / "toucan_small.parquet")
    rep = run_in_domain(agent, tasks, lambda t: SchemaSimulator(t.tools), suite="toucan", max_turns=2, progress=False)
    assert rep.counts == {"irrelevant": 1, "multi-turn": 1, "single-turn-diversify": 2, "single-turn-original": 2}
    assert set(rep.metrics) == set(METRICS) and rep.config["group_by"] == "subset"
    for g, vals in rep.groups.items():  # each subset's figure is the mean of its own records
        mine = [r for r in rep.records if r.group == g]
        for k in METRICS:
            want = mean(r.scores[k] for r in mine)
            assert (math.isnan(want) and math.isnan(vals[k])) or vals[k] == pytest.approx(want)
    assert {r.detail["kind"] for r in rep.records} == {"single", "chain", "parallel", "unservable"}
    assert "| single-turn-original | 2 |" in rep.to_markdown()


def test_group_by_kind_and_long_prompts(agent, caplog):
    tasks = load_tasks(FIX / "verl_small.jsonl")
    assert [group_of(t, "subset") for t in tasks] == [t.kind for t in tasks]  # rows without a subset fall back to the kind
    rep = run_in_domain(agent, tasks, lambda t: SchemaSimulator(t.tools), suite="toucan", group_by="kind", max_turns=1,
                        max_total_tokens=64, progress=False)
    assert rep.counts == {"chain": 1, "no_tool": 1, "parallel": 1, "single": 1}
    assert rep.config["prompts_too_long"] == 4 and any("4 of 4 prompts reach max_total_tokens=64" in n for n in rep.notes)
    assert "score as failures" in caplog.text
    with pytest.raises(ValueError, match="group_by must be one of"):
        run_in_domain(agent, tasks, lambda t: SchemaSimulator(t.tools), suite="toucan", group_by="domain", progress=False)
