"""The figures README.md, docs/results.md, docs/beyond.md and docs/demo.md quote for study 25 are the records'.

Every ``mean ± half-width`` quoted in the study-25 passages of those pages is read from the page, in page
order, and compared, at the precision it is quoted with, with the figure ``scripts/study25_tables.py``
computes from the committed records in ``docs/results/study25/`` (:func:`figures`, by name). A seed count
written right after a figure (``(9/10)``, ``(lower in 7/10)``, ``(2 ahead, 8 behind``) is checked against
the same per-seed values, and the plain numbers of the prose (``2.4% and GRPO 11.6%``) by the patterns in
:data:`PROSE`. A passage whose figures change in number or order fails with the list to update.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_tables():
    spec = importlib.util.spec_from_file_location("study25_tables", ROOT / "scripts" / "study25_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


T = _load_tables()

FIGURE = re.compile(r"(?P<m>[+-]?\d+\.\d+)(?P<pct>%)? ± (?P<h>\d+\.\d+)%?")
# a seed count written right after a figure: "(9/10", "(lower in 7/10", ", 6 ahead, 3 behind", ", lower in 9 seeds of 10",
# "(8 of 10 seeds behind"
COUNT_SLASH = re.compile(r"(?:\*\*)? \((?P<lower>lower in )?(?P<k>\d+)/(?P<n>\d+)")
COUNT_AHEAD = re.compile(r"(?:\*\*)?(?:,| \() ?(?P<a>\d+) (?:seeds )?ahead, (?P<b>\d+) behind")
COUNT_LOWER = re.compile(r"(?:\*\*)?,? lower in (?P<k>\d+) seeds of (?P<n>\d+)")
COUNT_BEHIND = re.compile(r"(?:\*\*)? \((?P<k>\d+) of (?P<n>\d+) seeds behind")

SG = "A/slca - A/grpo: "  # the primary pair
TEST = "eval_test/tool_tasks/success"

# (page, start of the passage, its end) -> the names of the figures it quotes, in page order
PASSAGES: dict[tuple[str, str, str], list[str]] = {
    ("README.md", "- [docs/results.md](docs/results.md): the pre-registered", "\n- [docs/released.md]"): [
        SG + "auc", SG + "step8/eval/tool_tasks/success", "interaction: auc", SG + TEST,
    ],
    ("docs/results.md", "### Study 25, results (stage A", "### Study 25, results (stage B"): [
        # short answer
        SG + "auc", SG + "eval/tool_tasks/success", SG + "step8/eval/tool_tasks/success",
        # held out in distribution, per step
        "A/grpo: step0/eval/tool_tasks/success", "A/grpo: step8/eval/tool_tasks/success", "A/grpo: eval/tool_tasks/success", "A/grpo: auc",
        "A/slca: step0/eval/tool_tasks/success", "A/slca: step8/eval/tool_tasks/success", "A/slca: eval/tool_tasks/success", "A/slca: auc",
        SG + "step8/eval/tool_tasks/success", SG + "eval/tool_tasks/success", SG + "auc",
        "A/grpo: step0/eval/parallel_split", "A/grpo: step8/eval/parallel_split", "A/grpo: eval/parallel_split",
        "A/slca: step0/eval/parallel_split", "A/slca: step8/eval/parallel_split", "A/slca: eval/parallel_split",
        SG + "step8/eval/parallel_split", SG + "eval/parallel_split",
        "A/grpo: step0/eval/reward_summary", "A/grpo: step8/eval/reward_summary", "A/grpo: eval/reward_summary",
        "A/slca: step0/eval/reward_summary", "A/slca: step8/eval/reward_summary", "A/slca: eval/reward_summary",
        SG + "step8/eval/reward_summary", SG + "eval/reward_summary",
        # secondary endpoints
        "A/grpo: eval/kind/single/success", "A/slca: eval/kind/single/success", SG + "eval/kind/single/success",
        "A/grpo: eval/kind/parallel/success", "A/slca: eval/kind/parallel/success", SG + "eval/kind/parallel/success",
        "A/grpo: eval/kind/chain/success", "A/slca: eval/kind/chain/success", SG + "eval/kind/chain/success",
        "A/grpo: train/reward/tool", "A/slca: train/reward/tool", SG + "train/reward/tool",
        "A/grpo: train/adv/contamination", SG + "train/adv/contamination",
        "A/grpo: train/grad/cosine_tool_summary", "A/slca: train/grad/cosine_tool_summary", SG + "train/grad/cosine_tool_summary",
        "A/grpo: train/grad/volatility", "A/slca: train/grad/volatility", SG + "train/grad/volatility",
        "A/grpo: " + TEST, "A/slca: " + TEST, SG + TEST,
        # the paper's claims, out of distribution
        SG + "auc", SG + "train/grad/volatility", SG + "eval/parallel_split", SG + "step8/eval/parallel_split", SG + TEST,
    ],
    ("docs/results.md", "### Study 25, results (stage B", "### Study 25, results (stage C"): [
        "interaction: auc", "interaction: train/reward/tool",
        "B/grpo - A/grpo: auc", "B/grpo - A/grpo: train/reward/tool", "B/grpo - A/grpo: eval/tool_tasks/success",
        "B/grpo - A/grpo: eval/reward_summary",
        "B/slca - A/slca: auc", "B/slca - A/slca: train/reward/tool", "B/slca - A/slca: eval/tool_tasks/success",
        "B/slca - A/slca: eval/reward_summary",
        "interaction: auc", "interaction: train/reward/tool", "interaction: eval/tool_tasks/success", "interaction: eval/reward_summary",
        "B/slca - B/grpo: auc", "B/slca - B/grpo: eval/tool_tasks/success", "B/slca - B/grpo: eval/parallel_split",
        "B/slca - B/grpo: train/reward/tool", "B/slca - B/grpo: train/adv/contamination", "B/slca - B/grpo: train/grad/volatility",
        "B/slca - A/slca: auc", "B/slca - A/slca: eval/tool_tasks/success", "B/slca - B/grpo: train/grad/volatility",
    ],
    ("docs/results.md", "### Study 25, results (stage C", "### Study 25, results (stage D"): [
        "C/slca_cond - A/grpo: auc", "C/gdpo - A/grpo: auc", "C/slca_turn - A/grpo: auc",
        "C/slca_cond - A/slca: auc", "C/gdpo - A/slca: auc", "C/slca_turn - A/slca: auc",
        *[f"{arm}: {k}" for arm in ("A/grpo", "A/slca", "C/gdpo", "C/slca_cond", "C/slca_turn")
          for k in ("auc", "eval/tool_tasks/success", "eval/kind/single/success", "eval/kind/parallel/success",
                    "eval/kind/chain/success", "eval/parallel_split", "eval/reward_summary", "train/adv/contamination",
                    "train/grad/volatility")
          if not (k == "train/grad/volatility" and arm.startswith("A/")) and not (k == "train/adv/contamination" and arm not in ("A/grpo", "C/gdpo"))],
        "C/slca_cond - C/gdpo: train/grad/volatility", "C/slca_turn - C/gdpo: train/grad/volatility",
        "C/slca_cond - C/slca_turn: train/grad/volatility",
        "C/slca_cond - A/grpo: auc", SG + "auc", "C/slca_cond - A/slca: auc", "C/slca_cond - A/slca: eval/reward_summary",
        "C/slca_turn - A/grpo: auc", "C/slca_turn - A/grpo: eval/kind/chain/success", "C/slca_turn - A/slca: eval/kind/chain/success",
        "C/slca_turn - A/slca: eval/kind/parallel/success", "C/slca_turn - A/slca: auc",
        "C/gdpo - A/grpo: auc", "C/gdpo - A/slca: auc",
        "C/gdpo - A/grpo: " + TEST, "C/slca_cond - A/grpo: " + TEST, "C/slca_turn - A/grpo: " + TEST,
    ],
    ("docs/results.md", "### Study 25, results (stage D", "### Study 25: what changed after the runs"): [
        "D/slca - A/slca: auc", "D/slca - A/slca: eval/tool_tasks/success", "D/slca - A/slca: eval/parallel_split",
        "D/slca - A/slca: eval/reward_summary", "D/slca - A/slca: train/reward/tool", "D/slca - A/slca: " + TEST,
        "D/slca: train/rollout/no_tool_segment", "D/slca: train/rollout/mixed_call_groups", "D/slca: train/rollout/no_summary_segment",
        "D/slca: train/adv/contamination", "D/slca - A/slca: auc",
    ],
    ("docs/beyond.md", "### Held out in distribution (study 25)", "### Training, on build J's warm start"): [
        SG + "auc", SG + "step8/eval/parallel_split", SG + "eval/parallel_split", "interaction: auc",
        "C/slca_cond - A/grpo: auc", "C/gdpo - A/grpo: auc", "C/slca_turn - A/grpo: auc",
        "C/slca_cond - A/slca: auc", "C/gdpo - A/slca: auc", "C/slca_turn - A/slca: auc", "C/slca_turn - A/slca: eval/kind/chain/success",
        "D/slca - A/slca: auc", "D/slca: train/rollout/no_tool_segment",
    ],
    ("docs/demo.md", "- **The clean pair does not rank", "- **The mechanism shows"): [SG + "auc"],
    ("docs/demo.md", "- **The mechanism shows", "- **Out of distribution nothing moved"): ["interaction: auc"],
}


def mean(name: str, scale: float = 1.0, negate: bool = False):
    """The mean of a named figure's per-seed values (times ``scale``; negated: a loss quoted as a positive amount)."""
    return lambda F: (-1 if negate else 1) * scale * sum(F[name]) / len(F[name])


def above(name: str):
    return lambda F: sum(x > 0 for x in F[name])


def below(name: str):
    return lambda F: sum(x < 0 for x in F[name])


def n_of(name: str):
    return lambda F: len(F[name])


def lowest(*names: str):
    return lambda F: min(sum(F[n]) / len(F[n]) for n in names)


def highest(*names: str):
    return lambda F: max(sum(F[n]) / len(F[n]) for n in names)


D = r"\d+(?:\.\d+)?"  # a number as the prose writes it: 12, 0.93, 2.4 (not the full stop after it)
N = f"({D})"
STEP8_SPLIT = rf"after 8 steps SLCA splits {N}% and GRPO {N}%"
C_TEST = [f"C/{e}: {TEST}" for e in ("gdpo", "slca_cond", "slca_turn")]
D_AUC = "D/slca - A/slca: auc"

# (page, pattern on the page's text with runs of white space made one space) -> what each group must equal.
# A group that holds a decimal is compared at its own precision ("0.93": two decimals); "none" reads as 0.
PROSE: list[tuple[str, str, list]] = [
    ("README.md", r"in (\d+)% of parallel steps and GRPO in (\d+)%",
     [mean("A/slca: step8/eval/parallel_split", 100), mean("A/grpo: step8/eval/parallel_split", 100)]),
    ("README.md", rf"both end at {N}-{N};",
     [lowest("A/grpo: eval/tool_tasks/success", "A/slca: eval/tool_tasks/success"),
      highest("A/grpo: eval/tool_tasks/success", "A/slca: eval/tool_tasks/success")]),
    ("README.md", r"small next to the (\d+)% of its tool tasks build J solves", [mean("A/grpo: step0/" + TEST, 100)]),
    ("docs/results.md", r"SLCA ahead on (\d+) of (\d+)\)", [above(SG + "auc"), n_of(SG + "auc")]),
    ("docs/results.md", r"at step 8 SLCA is \S+ ± \S+ ahead \((\d+) seeds ahead, (none|\d+) behind\)",
     [above(SG + "step8/eval/tool_tasks/success"), below(SG + "step8/eval/tool_tasks/success")]),
    ("docs/results.md", r"the warm start splits (\d+)% of parallel steps", [mean("A/grpo: step0/eval/parallel_split", 100)]),
    ("docs/results.md", STEP8_SPLIT, [mean("A/slca: step8/eval/parallel_split", 100), mean("A/grpo: step8/eval/parallel_split", 100)]),
    ("docs/results.md", rf"\({N} at step 0\)", [mean("A/grpo: step0/" + TEST)]),
    ("docs/results.md", r"an interval that excludes 0 \((\d+) seeds ahead, (none|\d+) behind\)", [above(SG + TEST), below(SG + TEST)]),
    ("docs/results.md", rf"tool-task success {N} at step 0, then {N} \(GRPO\) and {N} \(SLCA\)",
     [mean("A/grpo: step0/" + TEST), mean("A/grpo: " + TEST), mean("A/slca: " + TEST)]),
    ("docs/results.md", rf"contamination rises from {N} to {N}",
     [mean("A/grpo: train/adv/contamination"), mean("B/grpo: train/adv/contamination")]),
    ("docs/results.md", rf"held-out tool-task success ends {N} lower \({N} -> {N}\)",
     [mean("B/grpo - A/grpo: eval/tool_tasks/success", negate=True), mean("A/grpo: eval/tool_tasks/success"),
      mean("B/grpo: eval/tool_tasks/success")]),
    ("docs/results.md", rf"split at step 16 rises from {N} to {N}",
     [mean("A/grpo: eval/parallel_split"), mean("B/grpo: eval/parallel_split")]),
    ("docs/results.md", rf"held-out summary reward ([+-]{D}) vs ([+-]{D})\)",
     [mean("B/slca - A/slca: eval/reward_summary"), mean("B/grpo - A/grpo: eval/reward_summary")]),
    ("docs/results.md", r"it gave (\d+)% of rollouts", [mean("C/slca_cond: train/adv/cond_subgroup_frac", 100)]),
    ("docs/results.md", rf"ends highest on chain tasks \({N};", [mean("C/slca_turn: eval/kind/chain/success")]),
    ("docs/results.md", rf"split rate {N} vs {N}\)", [mean("C/slca_turn: eval/parallel_split"), mean("A/slca: eval/parallel_split")]),
    ("docs/results.md", rf"contamination {N}, more than GRPO's {N}",
     [mean("C/gdpo: train/adv/contamination"), mean("A/grpo: train/adv/contamination")]),
    ("docs/results.md", rf"the final split is {N} vs {N}", [mean("C/gdpo: eval/parallel_split"), mean("A/slca: eval/parallel_split")]),
    ("docs/results.md", rf"means {N}-{N} against GRPO's {N} and SLCA's {N}",
     [lowest(*C_TEST), highest(*C_TEST), mean("A/grpo: " + TEST), mean("A/slca: " + TEST)]),
    ("docs/results.md", rf"\((\d+) seeds ahead, (\d+) behind, (\d+) equal; every difference within ±{N}\)",
     [above(D_AUC), below(D_AUC), lambda F: sum(x == 0 for x in F[D_AUC]), lambda F: max(abs(x) for x in F[D_AUC])]),
    ("docs/results.md", r"on the (\d+)% of steps with such a rollout", [mean("D/slca: steps_without_answer", 100)]),
    ("docs/beyond.md", r"gave (\d+)% of rollouts another summary baseline", [mean("C/slca_cond: train/adv/cond_subgroup_frac", 100)]),
    ("docs/beyond.md", rf"ends highest \({N} vs SLCA's {N},",
     [mean("C/slca_turn: eval/kind/chain/success"), mean("A/slca: eval/kind/chain/success")]),
    ("docs/beyond.md", rf"costs GRPO {N} of final held-out success", [mean("B/grpo - A/grpo: eval/tool_tasks/success", negate=True)]),
    ("docs/beyond.md", rf"\((\d+) of (\d+) seeds behind; p = {N} unadjusted",
     [below("C/slca_turn - A/slca: auc"), n_of("C/slca_turn - A/slca: auc"), lambda F: _p_value(F["C/slca_turn - A/slca: auc"])]),
    ("docs/beyond.md", rf"; {N}% of groups mixed callers with non-callers\), and {N}% of rollouts ended",
     [mean("D/slca: train/rollout/mixed_call_groups", 100), mean("D/slca: train/rollout/no_summary_segment", 100)]),
    ("docs/results.md", rf"the interval just excludes 0, p = {N} unadjusted", [lambda F: _p_value(F["C/slca_turn - A/slca: auc"])]),
]


def _p_value(xs: list[float]) -> float:
    from scipy import stats

    return float(stats.ttest_1samp(xs, 0.0).pvalue)


@pytest.fixture(scope="module")
def F() -> dict[str, list[float]]:
    return T.figures()


def _page(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def _passage(doc: str, start: str, end: str) -> str:
    text = _page(doc)
    assert start in text, f"{doc}: the passage starting {start!r} is gone; update PASSAGES in {Path(__file__).name}"
    i = text.index(start)
    j = text.index(end, i + len(start)) if end in text[i + len(start):] else -1
    assert j > 0, f"{doc}: the passage starting {start!r} has no end {end!r}"
    return " ".join(text[i:j].split())


def _at_precision(value: float, quoted: str, percent: bool = False) -> str:
    """``value`` written as ``quoted`` is: its decimals, its sign if it has one."""
    d = len(quoted.split(".")[1]) if "." in quoted else 0
    v = 100 * value if percent else value
    return f"{v:+.{d}f}" if quoted[:1] in "+-" else f"{v:.{d}f}"


def check_passage(text: str, names: list[str], F: dict[str, list[float]]) -> list[str]:
    """The differences between the figures ``text`` quotes and the named ones (empty when they agree)."""
    quoted = list(FIGURE.finditer(text))
    if len(quoted) != len(names):
        return [f"the passage quotes {len(quoted)} figures, the test names {len(names)}: "
                + ", ".join(q.group(0) for q in quoted)]
    bad = []
    for q, name in zip(quoted, names):
        xs = F.get(name)
        if xs is None:
            bad.append(f"{q.group(0)}: no figure named {name!r}")
            continue
        m = q.group("m")
        want = T.fmt(xs, sign=m[0] in "+-", decimals=len(m.split(".")[1]), percent=bool(q.group("pct")))
        if q.group(0) != want:
            bad.append(f"{q.group(0)} quoted, the records give {want} ({name})")
        after = text[q.end(): q.end() + 60]
        up, down, n = sum(x > 0 for x in xs), sum(x < 0 for x in xs), len(xs)
        mu = sum(xs) / n
        if c := COUNT_SLASH.match(after):
            k = down if (c.group("lower") or mu < 0) else up
            if (int(c.group("k")), int(c.group("n"))) != (k, n):
                bad.append(f"{q.group(0)} {c.group(0).strip()}: the records give {k}/{n} ({name})")
        elif c := COUNT_AHEAD.match(after):
            if (int(c.group("a")), int(c.group("b"))) != (up, down):
                bad.append(f"{q.group(0)}{c.group(0)}: the records give {up} ahead, {down} behind ({name})")
        elif (c := COUNT_LOWER.match(after)) or (c := COUNT_BEHIND.match(after)):
            if (int(c.group("k")), int(c.group("n"))) != (down, n):
                bad.append(f"{q.group(0)}{c.group(0)}: the records give {down} of {n} below 0 ({name})")
    return bad


def check_prose(text: str, pattern: str, expect: list, F: dict[str, list[float]]) -> list[str]:
    hits = list(re.finditer(pattern, text))
    if not hits:
        return [f"pattern {pattern!r} not found: update PROSE in {Path(__file__).name}"]
    bad = []
    for h in hits:
        for quoted, f in zip(h.groups(), expect):
            value = f(F)
            if quoted == "none":
                quoted = "0"
            want = str(value) if isinstance(value, int) else _at_precision(value, quoted)
            if quoted != want:
                bad.append(f"{h.group(0)!r}: {quoted} quoted, the records give {want}")
    return bad


@pytest.mark.parametrize("passage", list(PASSAGES), ids=[f"{d}:{s[:40]}" for d, s, _ in PASSAGES])
def test_the_figures_each_passage_quotes_are_the_records(passage, F):
    doc, start, end = passage
    bad = check_passage(_passage(doc, start, end), PASSAGES[passage], F)
    assert not bad, f"{doc}, passage {start!r}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("doc,pattern,expect", PROSE, ids=[f"{d}:{p[:40]}" for d, p, _ in PROSE])
def test_the_plain_numbers_of_the_prose_are_the_records(doc, pattern, expect, F):
    bad = check_prose(" ".join(_page(doc).split()), pattern, expect, F)
    assert not bad, f"{doc}:\n  " + "\n  ".join(bad)


def test_stage_d_premise_seeds_are_the_records():
    """The plan's correction names the seeds where empty_tool alone changed step 1's summary advantages."""
    by_arm = T.arms(T.DEFAULT_ROOT)
    seeds = T.empty_tool_only(by_arm["A/slca"], by_arm["D/slca"])
    text = " ".join(_page("docs/results.md").split())
    m = re.search(r"seeds (\d+) and (\d+) already differ in their summary advantages", text)
    assert m, "the stage-D correction no longer names its seeds"
    assert [int(m.group(1)), int(m.group(2))] == seeds


def test_the_check_fails_on_a_doctored_figure_or_count(F):
    """A figure one unit off in its last digit, or a seed count off by one, is caught."""
    names = [SG + "auc", SG + "step8/eval/tool_tasks/success"]
    good = "SLCA learns faster, +0.020 ± 0.013 (9/10), and at step 8 +0.036 ± 0.018."
    assert check_passage(good, names, F) == []
    assert check_passage(good.replace("+0.020", "+0.021"), names, F)
    assert check_passage(good.replace("± 0.013", "± 0.012"), names, F)
    assert check_passage(good.replace("(9/10)", "(8/10)"), names, F)
    assert check_passage(good.replace(" ± 0.018", ""), names, F)  # a figure dropped: the count differs
    expect = next(e for _, p, e in PROSE if p == STEP8_SPLIT)
    assert not check_prose("after 8 steps SLCA splits 2.4% and GRPO 11.6%", STEP8_SPLIT, expect, F)
    assert check_prose("after 8 steps SLCA splits 2.5% and GRPO 11.6%", STEP8_SPLIT, expect, F)
    assert check_prose("after 8 steps SLCA splits 2% and GRPO 11.6%", STEP8_SPLIT, expect, F) == []  # 2.4 at no decimals is 2


def test_every_study25_run_folder_names_build_j():
    """The records carry the model they were trained from (added afterwards; docs/results.md, what changed after the runs)."""
    runs = sorted(p for p in (ROOT / "docs" / "results" / "study25").glob("*/*-seed*") if (p / "metrics.jsonl").exists())
    assert len(runs) == 80
    for run in runs:
        rec = json.loads((run / "model.json").read_text())
        assert rec == {"model": "default", "fingerprint": "default:802a004aea881d79"}, run
        assert json.loads((run / "config.json").read_text())["model"] == "default", run


# --------------------------------------------------------------------------- study 41


def _load_study41():
    spec = importlib.util.spec_from_file_location("study41_tables", ROOT / "scripts" / "study41_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


S41_ROWS = {  # the row labels of study 41's tables in docs/results.md -> the tables script's keys
    "parallel-split area (primary; lower is better)": "split_auc", "parallel split at step 8": "step8/eval/parallel_split",
    "parallel split at step 16": "eval/parallel_split", "tool-task Success area": "auc",
    "tool-task Success at step 16": "eval/tool_tasks/success", "the authors' Success@0.9 at step 16": "eval/paper_success",
    "the authors' Success@0.9 at step 16 (rule stand-in for their judge)": "eval/paper_success",
    "held-out summary reward": "eval/reward_summary", "gradient-norm volatility": "train/grad/volatility",
    "advantage contamination": "train/adv/contamination", "`test` (OOD) tool-task Success": "eval_test/tool_tasks/success",
}
S41_COUNT = re.compile(r"\((?:lower|higher) in (\d+)(?: of (\d+))?")


def table_rows(text: str):
    """``(cells, arms)`` for each row of the markdown tables in ``text``: a row's cells, and the arms its table's
    header names (a header row of an empty cell then `arm` cells), None under any other header."""
    arms = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if not cells:
            arms = None
        elif cells[0] == "" and all(c.startswith("`") for c in cells[1:]):
            arms = [c.strip("`") for c in cells[1:]]
        else:
            yield cells, arms


def study41_table_problems(text: str, figures: dict[str, list[float]], fmt) -> tuple[int, list[str]]:
    """Check every cell of study 41's arm tables and contrast tables in ``text`` against the records: returns
    (cells checked, differences). An arm table's header names the arms; a contrast row names ``(x) `a` - `b```
    and quotes the split area then the Success area, with an optional "(lower in k of n)" seed count."""
    checked, bad = 0, []
    for cells, arms in table_rows(text):
        if m := re.match(r"\([a-e]\) `(\w+)` - `(\w+)`", cells[0]):
            for key, cell in zip(("split_auc", "auc"), cells[1:3]):
                xs = figures[f"{m.group(1)} - {m.group(2)}: {key}"]
                want = fmt(xs, sign=True)
                got = FIGURE.search(cell)
                checked += 1
                if not got or got.group(0) != want:
                    bad.append(f"{cells[0]} {key}: {cell!r} quoted, the records give {want}")
                if c := S41_COUNT.search(cell):
                    k = sum(x < 0 for x in xs) if "lower" in c.group(0) else sum(x > 0 for x in xs)
                    if int(c.group(1)) != k or (c.group(2) and int(c.group(2)) != len(xs)):
                        bad.append(f"{cells[0]} {key}: {c.group(0)} quoted, the records give {k} of {len(xs)}")
            continue
        if arms and cells[0] in S41_ROWS:
            for arm, cell in zip(arms, cells[1:]):
                want = fmt(figures[f"{arm}: {S41_ROWS[cells[0]]}"])
                checked += 1
                if cell.replace("**", "") != want:
                    bad.append(f"{cells[0]} / {arm}: {cell!r} quoted, the records give {want}")
    return checked, bad


def test_study41_tables_in_results_are_the_records():
    """Every cell of study 41's tables (stages 1 and 2) is what scripts/study41_tables.py computes from the committed
    records, seed counts included; a doctored cell is caught."""
    T41 = _load_study41()
    F41 = T41.figures()
    page = _page("docs/results.md")
    text = page[page.index("### Study 41, results (stage 1"): page.index("## Study 25:")]
    checked, bad = study41_table_problems(text, F41, T41.fmt)
    assert checked >= 60 and not bad, "\n".join(bad)
    doctored = text.replace("| 0.428 ± 0.195 |", "| 0.427 ± 0.195 |").replace("(lower in 8 of 10)", "(lower in 7 of 10)")
    assert len(study41_table_problems(doctored, F41, T41.fmt)[1]) >= 2


def test_every_study41_run_folder_names_the_plans_build():
    runs = sorted(p for p in (ROOT / "docs" / "results" / "study41" / "main").glob("*-seed*") if (p / "metrics.jsonl").exists())
    assert len(runs) == 50
    assert {json.loads((p / "model.json").read_text())["fingerprint"] for p in runs} == {_load_study41().FINGERPRINT}


S42_ROWS = {  # the row labels of study 42's arm table in docs/results.md -> scripts/study42_tables.py's keys
    "tool-task Success area (primary)": "auc", "tool-task Success at step 0": "step0/eval/tool_tasks/success",
    "tool-task Success at step 12": "eval/tool_tasks/success", "parallel-split area (lower is better)": "split_auc",
    "`test` (OOD) tool-task Success at step 12": "eval_test/tool_tasks/success",
    "advantage contamination (mean of 12 steps)": "train/adv/contamination",
    "tool/summary gradient cosine": "train/grad/cosine_tool_summary",
}


def _load_tables_script(name: str):
    """``scripts/<name>.py`` as a module (study 42's and 47's table scripts import study41_tables beside them)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return mod


def _load_study42():
    return _load_tables_script("study42_tables")


def study42_table_problems(text: str, T) -> tuple[int, list[str]]:
    """Every cell of study 42's arm table and contrast table in ``text`` against the records (the contrast rows:
    the primary area, its per-seed differences and the plan's reading): (cells checked, differences)."""
    by = T.arms(T.DEFAULT_ROOT)
    checked, bad = 0, []
    for cells, arms in table_rows(text):
        if m := re.match(r"\([a-c]\) `(\w+)` - `(\w+)`", cells[0]):
            d, _ = T.paired(by[m.group(1)], by[m.group(2)], "auc")
            want = [T.fmt(d, sign=True), ", ".join("0.000" if round(x, 3) == 0 else f"{x:+.3f}" for x in d), T.reading(d)]
            for got, w in zip(cells[1:4], want):
                checked += 1
                if got != w:
                    bad.append(f"{cells[0]}: {got!r} quoted, the records give {w!r}")
        elif arms and cells[0] in S42_ROWS:
            for arm, cell in zip(arms, cells[1:]):
                want = T.fmt([by[arm][s][S42_ROWS[cells[0]]] for s in sorted(by[arm])])
                checked += 1
                if cell != want:
                    bad.append(f"{cells[0]} / {arm}: {cell!r} quoted, the records give {want}")
    return checked, bad


def test_study42_tables_in_results_are_the_records():
    """Every cell of study 42's tables is what scripts/study42_tables.py computes from the committed records; a
    doctored cell is caught."""
    T42 = _load_study42()
    page = _page("docs/results.md")
    text = page[page.index("### Study 42, results"): page.index("## Study 41:")]
    checked, bad = study42_table_problems(text, T42)
    assert checked >= 30 and not bad, "\n".join(bad)
    doctored = text.replace("| -0.002 ± 0.012 |", "| -0.001 ± 0.012 |").replace("| better |", "| no difference detected at this budget |")
    assert len(study42_table_problems(doctored, T42)[1]) >= 2


def test_study42_bfcl_against_the_start_is_what_the_records_say():
    """The post-hoc BFCL sentence (RL runs change 6 to 10 of 250 outputs and no score) is the records' count."""
    T42 = _load_study42()
    root = ROOT / "docs" / "results" / "study42"
    lines = T42.bfcl_against_start(root)
    counts = [int(re.search(r": (\d+) of 250 outputs differ", x).group(1)) for x in lines]
    scores = [int(re.search(r", (\d+) scores", x).group(1)) for x in lines]
    assert len(lines) >= 7 and not any(scores)
    page = " ".join(_page("docs/results.md").split())
    assert f"only {min(counts)} to {max(counts)} of the 250 records and changes no record's score" in page


def test_study42_cpu_keeps_the_reruns_and_other_folders_apart_from_the_studys_runs(tmp_path):
    """cpu_watch.log samples every training process on the machine: a rerun, or a test's run folder of the same name
    (``cmp/slca-seed0``), is not the study's ``main/slca-seed0``; a run resumed by a new process counts both parts."""
    T42 = _load_study42()
    (tmp_path / "cpu_watch.log").write_text(
        "# cpu: some CPU\n"
        "1 10 /x/study42/main/slca-seed0 100\n1 10 /x/study42/main/slca-seed0 250\n"  # one process, its last sample
        "2 11 /x/study42/main/slca-seed0 40\n"  # resumed by another process
        "2 12 /x/study42/rerun/slca-seed0 999\n3 13 /tmp/pytest-1/cmp/slca-seed0 7\n")
    assert T42.cpu_seconds(tmp_path) == {"main/slca-seed0": 290, "rerun/slca-seed0": 999, "cmp/slca-seed0": 7}


def test_study47_table_in_results_is_the_records():
    """Study 47's contrast row and per-seed differences in docs/results.md are what scripts/study47_tables.py computes
    from the committed records; a doctored cell is caught."""
    T47 = _load_tables_script("study47_tables")
    lines = T47.table({"turn_mean": str(T47.ARMS["turn_mean"])})
    row = next(x for x in lines if x.startswith("| turn_mean | 10 |"))
    seeds = next(x for x in lines if x.startswith("turn_mean - control")).split(": ", 1)[1]
    page = _page("docs/results.md")
    text = page[page.index("### Study 47, results"): page.index("## Study 42:")]
    assert row in text
    assert seeds in " ".join(text.split())
    assert row not in text.replace("| +0.034 ± 0.049 |", "| +0.030 ± 0.049 |")  # a doctored cell is caught
