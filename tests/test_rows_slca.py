"""slca's own rows (slca.env.rows.slca): the task's fields a file keeps in ``meta`` come back as fields."""

from __future__ import annotations

import json

import pytest

from slca.env import toolworld as tw
from slca.env.loaders import RowError, task_from_row, task_to_row
from slca.types import Task


def test_reference_answer_and_refusal_are_fields_files_keep_in_meta(tmp_path):
    """A task file keeps both in its meta object (as before they were Task fields): an old file loads into the
    fields, a written one stores them there, and a wrong type is refused naming the field."""
    t = tw.make_tasks("train", n=1, seed=0)[0]
    row = task_to_row(t)
    meta = json.loads(row["meta"])
    assert meta["reference_answer"] == t.reference_answer and meta["refusal"] is t.refusal is False
    old = {**row, "meta": json.dumps({"split": "train", "reference_answer": "It is 3 C.", "refusal": True})}
    back = task_from_row(old, "slca")
    assert (back.reference_answer, back.refusal, back.meta) == ("It is 3 C.", True, {"split": "train"})
    assert task_from_row({**row, "meta": "{}"}, "slca").reference_answer is None
    with pytest.raises(RowError, match=r"field 'meta.refusal': must be true or false"):
        task_from_row({**row, "meta": json.dumps({"refusal": "yes"})}, "slca")
    with pytest.raises(ValueError, match=r"meta\['reference_answer'\] is a Task field now"):
        Task(id="x", messages=[], tools=[], meta={"reference_answer": "hi"})
    assert Task(id="x", messages=[], tools=[], kind="unservable").refusal is True
