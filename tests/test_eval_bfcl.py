"""BFCL through bfcl-eval's own checkers: gold answers pass, wrong answers fail.

Gold single-turn answers are built from BFCL's possible answers (first option of
each parameter, optional ones left out); gold multi-turn answers replay BFCL's
ground-truth calls through :class:`BFCLMultiTurnEpisode` (executed on BFCL's
simulators, then ``multi_turn_checker``).
"""

from __future__ import annotations

import ast

import pytest

pytestmark = pytest.mark.eval

pytest.importorskip("bfcl_eval")

from slca.eval import bfcl  # noqa: E402
from slca.eval.agent import AgentTurn  # noqa: E402
from slca.types import ParsedTurn, ToolCall  # noqa: E402

N = 5


def _resolve(option):
    if isinstance(option, dict):
        return {k: _resolve(v[0]) for k, v in option.items() if v and v[0] != ""}
    return option


def gold_calls(ground_truth) -> list[ToolCall]:
    return [ToolCall(name, _resolve(args)) for item in ground_truth for name, args in item.items()]


def _parse_gt_call(s: str, functions: list[dict]) -> ToolCall:
    node = ast.parse(s, mode="eval").body
    doc = next(f for f in functions if f["name"] == node.func.id)
    params = list(doc["parameters"]["properties"])
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return ToolCall(node.func.id, args)


AST_WITH_GT = [c for c in bfcl.AST_CATEGORIES if "relevance" not in c]


@pytest.mark.parametrize("category", AST_WITH_GT)
def test_ast_gold_passes_and_wrong_fails(category):
    pairs = bfcl.load_category(category, N)
    assert len(pairs) == N
    gold = [bfcl.score_single_turn(e, g, category, gold_calls(g))[0] for e, g in pairs]
    assert sum(gold) == N, [bfcl.score_single_turn(e, g, category, gold_calls(g))[1] for e, g in pairs]
    renamed = [bfcl.score_single_turn(e, g, category, [ToolCall(c.name + "_x", c.arguments) for c in gold_calls(g)])[0] for e, g in pairs]
    dropped_arg = [
        bfcl.score_single_turn(e, g, category, [ToolCall(c.name, {k: v for k, v in list(c.arguments.items())[1:]}) for c in gold_calls(g)])[0]
        for e, g in pairs
    ]
    undecodable = [bfcl.score_single_turn(e, g, category, None)[0] for e, g in pairs]
    assert sum(renamed) == 0 and sum(undecodable) == 0
    assert sum(dropped_arg) < N


@pytest.mark.parametrize("category", ["irrelevance", "live_irrelevance", "live_relevance"])
def test_relevance_categories(category):
    pairs = bfcl.load_category(category, N)
    call = [ToolCall("some_function", {"x": 1})]
    no_call, with_call = [bfcl.score_single_turn(e, g, category, [])[0] for e, g in pairs], [bfcl.score_single_turn(e, g, category, call)[0] for e, g in pairs]
    if category == "live_relevance":
        assert sum(with_call) == N and sum(no_call) == 0
    else:
        assert sum(no_call) == N and sum(with_call) == 0
    # An undecodable answer is "no call": right for irrelevance, wrong for relevance.
    assert bfcl.score_single_turn(*pairs[0], category, None)[0] == (category != "live_relevance")


def _replay(entry, gt, tag, drop_last=False) -> bfcl.BFCLMultiTurnEpisode:
    ep = bfcl.BFCLMultiTurnEpisode(entry, gt, 0, tag)
    for turn in gt:
        calls = [_parse_gt_call(s, entry["function"]) for s in turn]
        if drop_last:
            calls = calls[:-1]
        if calls:
            ep.step(AgentTurn("calls", ParsedTurn(calls=calls)))
            assert ep.messages[-1]["role"] == "tool"  # results went back to the model
        ep.step(AgentTurn("done", ParsedTurn(content="done")))
    assert ep.done
    return ep


def test_multi_turn_gold_passes_wrong_fails():
    pairs = bfcl.load_category("multi_turn_base", N)
    gold = [_replay(e, g, f"gold{i}").record() for i, (e, g) in enumerate(pairs)]
    wrong = [_replay(e, g, f"wrong{i}", drop_last=True).record() for i, (e, g) in enumerate(pairs)]
    assert [r.scores["accuracy"] for r in gold] == [1.0] * N, [r.error for r in gold]
    assert sum(r.scores["accuracy"] for r in wrong) == 0
    assert all(r.error for r in wrong)


def test_multi_turn_rollouts_of_one_entry_do_not_share_simulators():
    """Two interleaved rollouts of one entry (one gold, one wrong) keep separate state."""
    b = bfcl.import_bfcl()
    e, g = bfcl.load_category("multi_turn_base", 1)[0]
    good = bfcl.BFCLMultiTurnEpisode(e, g, 0, "shared")
    bad = bfcl.BFCLMultiTurnEpisode(e, g, 1, "shared")  # same run tag, different sample
    for turn in g:
        calls = [_parse_gt_call(s, e["function"]) for s in turn]
        good.step(AgentTurn("c", ParsedTurn(calls=calls)))
        if len(calls) > 1:
            bad.step(AgentTurn("c", ParsedTurn(calls=calls[:-1])))
        good.step(AgentTurn("d", ParsedTurn(content="d")))
        bad.step(AgentTurn("d", ParsedTurn(content="d")))
    assert good.record().scores["accuracy"] == 1.0
    assert bad.record().scores["accuracy"] == 0.0
    assert not [k for k in vars(b.multi_turn_utils) if k.startswith("slca_shared")]  # released


def test_multi_turn_force_terminated_after_20_steps():
    e, g = bfcl.load_category("multi_turn_base", 1)[0]
    ep = bfcl.BFCLMultiTurnEpisode(e, g, 0, "loop")
    call = _parse_gt_call(g[0][0], e["function"])
    for _ in range(bfcl.MAX_STEPS_PER_TURN):
        ep.step(AgentTurn("c", ParsedTurn(calls=[call])))
    assert ep.done and ep.force_quit
    rec = ep.record()
    assert rec.scores["accuracy"] == 0.0 and "force_terminated" in rec.error


def test_execution_strings_match_bfcl_format():
    assert bfcl.to_execution_strings([ToolCall("mv", {"source": "a.pdf", "destination": "temp"}), ToolCall("ls", {})]) == [
        "mv(source='a.pdf',destination='temp')",
        "ls()",
    ]


def test_resolve_categories():
    assert bfcl.resolve_categories(["simple", "multi_turn"]) == ["simple_python", "multi_turn_base"]
    assert bfcl.resolve_categories(None) == ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"]
    assert set(bfcl.resolve_categories(["all"])) == set(bfcl.CATEGORIES)
    with pytest.raises(ValueError, match="unknown BFCL category 'nope'"):
        bfcl.resolve_categories(["nope"])
    with pytest.raises(ValueError, match="unknown BFCL category"):
        bfcl.load_category("multi_turn_miss_func")


def test_summary_follows_bfcl_grouping():
    from slca.eval.report import Record

    recs = [Record(f"s{i}", "simple_python", 0, {"accuracy": float(i < 3)}) for i in range(4)]
    recs += [Record("m0", "multiple", 0, {"accuracy": 0.0})]
    recs += [Record(f"l{i}", "live_simple", 0, {"accuracy": 1.0}) for i in range(3)] + [Record("lm", "live_multiple", 0, {"accuracy": 0.0})]
    metrics, groups, counts = bfcl.summarize(recs, ["simple_python", "multiple", "live_simple", "live_multiple"])
    assert metrics["non_live_ast"] == pytest.approx((0.75 + 0.0) / 2)  # unweighted over categories
    assert metrics["live_ast"] == pytest.approx(3 / 4)  # weighted by entries
    assert metrics["overall"] == pytest.approx((0.75 + 0 + 1 + 0) / 4)
    assert counts["simple_python"] == 4
