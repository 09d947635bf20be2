"""Value normalisation and extraction shared by the reward tiers.

* :func:`normalize` makes argument values comparable: numbers (and numeric
  strings) become floats rounded to 6 significant decimals, strings are
  case-folded with whitespace collapsed, containers are normalised recursively.
* :func:`extract_values` finds the checkable values a free-text answer states:
  ISO dates, clock times, scores (``2-1``), ids (``FL482``) and numbers
  (``1,250`` and ``-3.5`` included), each in a canonical string form.
* :func:`extract_entities` finds the named things a free-text answer states
  (capitalised names, all-caps codes, a unit letter after a number), and
  :func:`tokens` / :func:`leaf_tokens` give the words a text or a JSON object
  supports, so an entity can be looked up in them (:func:`entity_supported`).
"""

from __future__ import annotations

import re
from typing import Any

from slca.types import ToolCall, call_key

__all__ = ["normalize", "normalized_call_key", "extract_values", "leaf_values", "canon_number", "tokens", "leaf_tokens",
           "extract_entities", "entity_supported", "contains_phrase"]

_NUM_STR = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def canon_number(x: float) -> str:
    """Canonical text of a number: ``182``, ``167.44``, ``-3`` (no trailing ``.0``)."""
    x = round(float(x), 6)
    if x == int(x):
        return str(int(x))
    return f"{x:.6f}".rstrip("0").rstrip(".")


def normalize(v: Any) -> Any:
    """Canonical form of an argument value for equality checks."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return round(float(v), 6)
    if isinstance(v, str):
        s = " ".join(v.split()).casefold()
        if _NUM_STR.match(s.replace(",", "")) and s.count(",") == len(re.findall(r"\d,\d{3}", s)):
            return round(float(s.replace(",", "")), 6)
        return s
    if isinstance(v, dict):
        return {str(k): normalize(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [normalize(x) for x in v]
    return v


def normalized_call_key(call: ToolCall) -> str:
    """:func:`slca.types.call_key` of the call with its argument values normalised (:func:`normalize`)."""
    return call_key(call.name, normalize(call.arguments))


_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_TIME = re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b")
_SCORE = re.compile(r"(?<![\w.-])\d{1,2}-\d{1,2}(?![\w-]|\.\d)")
_ID = re.compile(r"\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z][A-Za-z0-9_-]*\d[A-Za-z0-9_-]*\b")
_NUMBER = re.compile(r"(?<![\w.])[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


def extract_values(text: str) -> set[str]:
    """The checkable values stated in ``text``, canonicalised.

    Dates, times, scores and ids are taken first and masked so their digits are
    not read again as numbers. Returns strings such as ``"date:2025-07-03"``,
    ``"time:06:12"``, ``"score:2-1"``, ``"id:fl482"``, ``"num:167.44"``.
    """
    out: set[str] = set()
    for kind, pat in (("date", _DATE), ("time", _TIME), ("score", _SCORE), ("id", _ID)):
        for m in pat.finditer(text):
            tok = m.group(0)
            if kind == "time":
                tok = ":".join(p.zfill(2) for p in tok.split(":")[:2])
            out.add(f"{kind}:{tok.casefold()}")
        text = pat.sub(" ", text)
    for m in _NUMBER.finditer(text):
        tok = m.group(0).rstrip(".")
        out.add("num:" + canon_number(float(tok.replace(",", ""))))
    return out


def leaf_values(obj: Any) -> tuple[set[str], set[str]]:
    """Values and words an object (a tool result, a message) supports.

    Returns ``(values, words)``: ``values`` as :func:`extract_values` writes them
    (numbers from numeric leaves, values found inside string leaves), ``words``
    the case-folded string leaves and their words.
    """
    values: set[str] = set()
    words: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, bool) or x is None:
            return
        if isinstance(x, (int, float)):
            values.add("num:" + canon_number(x))
        elif isinstance(x, str):
            values.update(extract_values(x))
            s = x.casefold()
            words.add(s)
            words.update(re.findall(r"[a-z]+", s))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(obj)
    return values, words


_TOKEN = re.compile(r"[^\W_]+")
# a word of letters (apostrophes and hyphens inside), not glued to digits or underscores: "FL482", "BK-7781",
# "temp_c" hold no word here (ids and keys are values or tokens, not entities)
_WORD = re.compile(r"(?<![\w'’-])[^\W\d_]+(?:['’-][^\W\d_]+)*(?![\w'’-])")
# what may sit between a sentence boundary and the sentence's first word: spaces, quotes, brackets, markdown
_LEAD = " \t\"'“‘([{*_#>•-"
_AFTER_NUMBER = re.compile(r"\d\s?°?\s?$")


def tokens(text: str) -> list[str]:
    """The case-folded letter/digit runs of ``text``, in order (``"temp_c: 14"`` -> ``["temp", "c", "14"]``)."""
    return _TOKEN.findall(text.casefold())


def leaf_tokens(obj: Any, *, keys: bool = False) -> set[str]:
    """The :func:`tokens` of every string leaf of a JSON-like object (and of every dict key when ``keys``)."""
    out: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, str):
            out.update(tokens(x))
        elif isinstance(x, dict):
            for k, v in x.items():
                if keys:
                    out.update(tokens(str(k)))
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(obj)
    return out


def contains_phrase(text: str, phrase: str) -> bool:
    """Whether the :func:`tokens` of ``phrase`` occur, contiguous and in order, among those of ``text``."""
    p, t = tokens(phrase), tokens(text)
    return bool(p) and any(t[i : i + len(p)] == p for i in range(len(t) - len(p) + 1))


def _sentence_initial(text: str, start: int) -> bool:
    before = text[:start].rstrip(_LEAD)
    return not before or before[-1] in ".!?:\n"


def extract_entities(text: str) -> set[str]:
    """The entities ``text`` names, each as ``"ent:"`` + its case-folded words joined by one space.

    An entity is a run of capitalised words (``Paris``, ``Golden Fork``, ``StellarPay``)
    and all-caps codes (``USD``, ``AAPL``) joined by single spaces, or a single
    capital letter right after a number (the unit in ``14 C``). A capitalised
    word that opens a sentence (after ``.``, ``!``, ``?``, ``:``, a line break or
    the start of the text) is not read as a name, since any word is capitalised
    there; an all-caps code is read wherever it stands. Words holding digits are
    values (:func:`extract_values`), not entities.
    """
    out: set[str] = set()
    run: list[str] = []
    last_end = -1
    for m in _WORD.finditer(text):
        w = m.group(0)
        letters = [c for c in w if c.isalpha()]
        code = len(letters) >= 2 and all(c.isupper() for c in letters)
        if len(letters) == 1 and w.isupper():
            if _AFTER_NUMBER.search(text[: m.start()]):
                out.add("ent:" + w.casefold())
            name = False
        else:
            name = code or (w[0].isupper() and not _sentence_initial(text, m.start()))
        if name and run and text[last_end : m.start()] == " ":
            run.append(w)
        else:
            if run:
                out.add("ent:" + " ".join(tokens(" ".join(run))))
            run = [w] if name else []
        last_end = m.end()
    if run:
        out.add("ent:" + " ".join(tokens(" ".join(run))))
    return out


def entity_supported(entity: str, evidence: set[str]) -> bool:
    """Whether every word of ``entity`` (as :func:`extract_entities` writes it) is among the ``evidence`` tokens."""
    return all(t in evidence for t in entity.removeprefix("ent:").split(" "))
