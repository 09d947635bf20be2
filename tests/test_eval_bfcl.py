"""BFCL through bfcl-eval's own checkers: gold answers pass, wrong answers fail.

Gold single-turn answers are built from BFCL's possible answers (first option of
each parameter, optional ones left out; for Java and JavaScript written as the
language's literals, as the policy must write them); gold multi-turn answers
replay BFCL's ground-truth calls through :class:`BFCLMultiTurnEpisode`
(executed on BFCL's simulators, then ``multi_turn_checker``).
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


# Java / JavaScript: the policy sees every parameter as a string and writes the literal; BFCL's
# type converters (java_type_converter / js_type_converter) read it back.
def _java_untyped(v) -> str:  # parse_java_value / parse_js_value: an element without a declared type
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_java_untyped(x) for x in v) + "]"
    return str(v)


def _element(x, it, lit) -> str:
    if it in ("String", "char"):
        return f'"{x}"'
    return lit(x, it) if it not in (None, "any") else _java_untyped(x)


def java_literal(v, t, it=None) -> str:
    if isinstance(v, str) and t not in ("String", "any", "char"):
        return v  # a variable name in the possible answers
    if t == "boolean":
        return "true" if v else "false"
    if t in ("long", "float"):
        return f"{v}{'L' if t == 'long' else 'f'}"
    if t in ("byte", "short", "integer", "double"):
        return str(v)
    if t in ("String", "any", "char"):
        return v if isinstance(v, str) else _java_untyped(v)
    if t == "Array":  # parse_array converts elements with java_type_converter, which keeps quotes on a String: bare
        jt = {"integer": "int", "long": "long", "String": "String", "char": "char"}.get(it, "Object")
        return f"new {jt}[]{{" + ", ".join(str(x) if it in ("String", "char") else _element(x, it, java_literal) for x in v) + "}"
    if t == "ArrayList":
        return "new ArrayList<>(Arrays.asList(" + ", ".join(_element(x, it, java_literal) for x in v) + "))"
    if t == "HashMap":
        return "new HashMap<String, Object>() {{ " + " ".join(f'put("{k}", {_java_untyped(o[0])});' for k, o in v.items() if o) + " }}"
    raise ValueError(f"no Java literal for type {t}")


def js_literal(v, t, it=None) -> str:
    if isinstance(v, str) and t not in ("String", "any"):
        return v
    if t == "Boolean":
        return "true" if v else "false"
    if t == "Bigint":
        return f"{v}n"
    if t in ("integer", "float"):
        return str(v)
    if t in ("String", "any"):
        return v if isinstance(v, str) else _java_untyped(v)
    if t == "array":
        return "[" + ", ".join(_element(x, it, js_literal) for x in v) + "]"
    if t == "dict":
        return "{" + ", ".join(f'"{k}": {_java_untyped(o[0])}' for k, o in v.items() if o) + "}"
    raise ValueError(f"no JavaScript literal for type {t}")


def gold_calls_typed(entry, ground_truth, category) -> list[ToolCall]:
    lit = java_literal if category == "simple_java" else js_literal
    docs = {f["name"]: f["parameters"]["properties"] for f in entry["checker_function"]}
    return [
        ToolCall(name, {k: lit(o[0], docs[name][k]["type"], docs[name][k].get("items", {}).get("type")) for k, o in args.items() if o and o[0] != ""})
        for item in ground_truth
        for name, args in item.items()
    ]


# BFCL data faults: ArrayList<any> answers holding non-strings (42, True), which BFCL's converter
# reads back only as strings ("any" -> str), so no answer can match.
JAVA_DATA_FAULTS = {"simple_java_36", "simple_java_65"}


@pytest.mark.parametrize("category", ["simple_java", "simple_javascript"])
def test_java_javascript_gold_passes_and_wrong_fails(category):
    pairs = bfcl.load_category(category)  # every entry (100 Java, 50 JavaScript)
    assert bfcl.language_of(category) == {"simple_java": "JAVA", "simple_javascript": "JAVASCRIPT"}[category]
    verdicts = {e["id"]: bfcl.score_single_turn(e, g, category, gold_calls_typed(e, g, category)) for e, g in pairs}
    failed = {i: err for i, (ok, err) in verdicts.items() if not ok}
    assert set(failed) == (JAVA_DATA_FAULTS if category == "simple_java" else set()), failed
    assert all("value_error:list/tuple" in failed[i] for i in failed)
    # the policy sees strings (BFCL's hint); the checker reads the Java / JavaScript types
    e = pairs[0][0]
    assert all(p["type"] == "string" for p in e["function"][0]["parameters"]["properties"].values())
    assert "Note that the provided function is in Java" in e["function"][0]["description"] or category == "simple_javascript"
    # Python values where literals are due are refused by the language's type check
    if category == "simple_javascript":
        e, g = next((e, g) for e, g in pairs if e["id"] == "simple_javascript_0")  # isComplete: Boolean
        assert not bfcl.score_single_turn(e, g, category, gold_calls(g))[0]
    sub = pairs[:N]
    renamed = [bfcl.score_single_turn(e, g, category, [ToolCall(c.name + "_x", c.arguments) for c in gold_calls_typed(e, g, category)])[0] for e, g in sub]
    dropped = [bfcl.score_single_turn(e, g, category, [ToolCall(c.name, dict(list(c.arguments.items())[1:])) for c in gold_calls_typed(e, g, category)])[0] for e, g in sub]
    assert sum(renamed) == 0 and sum(dropped) < N and not any(bfcl.score_single_turn(e, g, category, None)[0] for e, g in sub)


def _parse_gt_call(s: str, functions: list[dict]) -> ToolCall:
    node = ast.parse(s, mode="eval").body
    doc = next(f for f in functions if f["name"] == node.func.id)
    params = list(doc["parameters"]["properties"])
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return ToolCall(node.func.id, args)


AST_WITH_GT = [c for c in bfcl.AST_CATEGORIES if "relevance" not in c and bfcl.language_of(c) == "PYTHON"]


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
        calls = [_parse_gt_call(s, [t["function"] for t in ep.tools]) for s in turn]  # the tools on offer at this turn
        if drop_last:
            calls = calls[:-1]
        if calls:
            ep.step(AgentTurn("calls", ParsedTurn(calls=calls)))
            assert ep.messages[-1]["role"] == "tool"  # results went back to the model
        ep.step(AgentTurn("done", ParsedTurn(content="done")))
    assert ep.done
    return ep


@pytest.mark.parametrize("category", bfcl.MULTI_TURN_CATEGORIES)
def test_multi_turn_gold_passes_wrong_fails(category):
    pairs = bfcl.load_category(category, N)
    assert len(pairs) == N
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


def test_miss_func_functions_join_at_their_turn():
    e, g = bfcl.load_category("multi_turn_miss_func", 1)[0]
    (turn, held), = e["missed_function"].items()
    names = [f["name"] for f in held]
    ep = bfcl.BFCLMultiTurnEpisode(e, g, 0, "missfunc")
    for t in range(int(turn)):
        assert not set(names) & {x["function"]["name"] for x in ep.tools}  # held out until their turn
        calls = [_parse_gt_call(s, [x["function"] for x in ep.tools]) for s in g[t]]
        if calls:
            ep.step(AgentTurn("c", ParsedTurn(calls=calls)))
        ep.step(AgentTurn("d", ParsedTurn(content="d")))
    assert set(names) <= {x["function"]["name"] for x in ep.tools}
    assert ep.messages[-1] == {"role": "user", "content": "I have updated some more functions you can choose from. What about now?"}
    ep.release()


def test_multi_turn_force_terminated_after_20_steps():
    e, g = bfcl.load_category("multi_turn_base", 1)[0]
    ep = bfcl.BFCLMultiTurnEpisode(e, g, 0, "loop")
    call = _parse_gt_call(g[0][0], e["function"])
    for _ in range(bfcl.MAX_STEPS_PER_TURN):  # BFCL allows 20 steps with calls in a turn ...
        ep.step(AgentTurn("c", ParsedTurn(calls=[call])))
    assert not ep.done
    ep.step(AgentTurn("c", ParsedTurn(calls=[call])))  # ... and quits on the 21st
    assert ep.done and ep.force_quit
    rec = ep.record()
    assert rec.scores["accuracy"] == 0.0 and "force_terminated" in rec.error


def test_execution_strings_match_bfcl_format():
    assert bfcl.to_execution_strings([ToolCall("mv", {"source": "a.pdf", "destination": "temp"}), ToolCall("ls", {})]) == [
        "mv(source='a.pdf',destination='temp')",
        "ls()",
    ]


def test_resolve_categories():
    assert bfcl.resolve_categories(["simple", "multi_turn"]) == [
        "simple_python", "simple_java", "simple_javascript", "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
    assert bfcl.resolve_categories(None) == ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple", "irrelevance"]
    assert set(bfcl.resolve_categories(["all"])) == set(bfcl.CATEGORIES)
    with pytest.raises(ValueError, match="unknown BFCL category 'nope'"):
        bfcl.resolve_categories(["nope"])
    with pytest.raises(ValueError, match="unknown BFCL category"):
        bfcl.load_category("multi_turn_composite")


def test_groups_match_bfcl():
    from bfcl_eval.constants.category_mapping import TEST_COLLECTION_MAPPING

    for group in ("non_live", "live", "multi_turn", "non_python"):
        assert set(bfcl.resolve_categories([group])) == set(TEST_COLLECTION_MAPPING[group]), group
    assert set(bfcl.resolve_categories(["python"])) == set(TEST_COLLECTION_MAPPING["python"])


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


def test_summary_simple_is_the_mean_over_languages():
    from slca.eval.report import Record

    recs = [Record("p", "simple_python", 0, {"accuracy": 1.0}), Record("j", "simple_java", 0, {"accuracy": 0.0})]
    recs += [Record(f"js{i}", "simple_javascript", 0, {"accuracy": float(i == 0)}) for i in range(2)] + [Record("m", "multiple", 0, {"accuracy": 1.0})]
    recs += [Record(f"mt{i}", c, 0, {"accuracy": float(i == 0)}) for i, c in enumerate(("multi_turn_base", "multi_turn_miss_func"))]
    metrics, _, _ = bfcl.summarize(recs, ["simple_python", "simple_java", "simple_javascript", "multiple", "multi_turn_base", "multi_turn_miss_func"])
    assert metrics["simple_ast"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert metrics["non_live_ast"] == pytest.approx((0.5 + 1.0) / 2)  # simple (over languages), multiple
    assert metrics["multi_turn"] == pytest.approx(0.5)
