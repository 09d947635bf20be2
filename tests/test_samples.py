"""Recorded sample groups (slca.training.samples): their JSON layout, old files read back, bad files refused."""

import json
import math
from pathlib import Path

import pytest

from slca.training.samples import SampleGroup, SampleRollout, read_samples, samples_from_json, samples_to_json

PIN = Path(__file__).parent / "fixtures" / "train_pin"


def _group():
    r = SampleRollout(tokens=["<tool_call>", "x", "\n", "It"], model_mask=[1, 1, 0, 1], tool_mask=[1, 1, 0, 0], summary_mask=[0, 0, 0, 1],
                      adv={"grpo": [0.5, 0.5, 0.0, 0.5], "slca": [-1.0, -1.0, 0.0, 1.0]}, tool_reward=0.25, summary_reward=math.nan,
                      stop_reason="final_answer")
    return SampleGroup(step=3, task="t1", kind="parallel", prompt="<|im_start|>user\nweather?", rollouts=[r, r])


def test_a_record_round_trips_through_its_json_layout():
    g = _group()
    d = g.to_json()
    assert list(d) == ["step", "task", "kind", "prompt", "rollouts"]
    assert list(d["rollouts"][0]) == ["tokens", "model_mask", "tool_mask", "summary_mask", "adv", "tool_reward", "summary_reward", "stop_reason"]
    back = SampleGroup.from_json(json.loads(json.dumps(d)))
    assert json.dumps(back.to_json()) == json.dumps(d)  # (NaN rewards make == on the records useless)
    assert back.rollouts[0].adv == g.rollouts[0].adv and back.step == 3 and back.estimators() == ["grpo", "slca"]


@pytest.mark.parametrize("run", ["grpo", "slca_turn"])
def test_sample_files_written_before_the_records_read_back_unchanged(run):
    """The pin's samples.json files were written by the trainer before it built typed records: same layout, byte for byte."""
    text = (PIN / run / "samples.json").read_text()
    groups = read_samples(PIN / run / "samples.json")
    assert groups and all(isinstance(g, SampleGroup) for g in groups)
    assert json.dumps(samples_to_json(groups)) == text


def test_segment_means_and_fields_missing_from_a_hand_written_file():
    g = samples_from_json([{"rollouts": [{"tokens": ["a", "b", "c"], "model_mask": [1, 0, 1], "tool_mask": [1, 0, 0],
                                          "adv": {"slca": [-1, 0, 3]}}]}])[0]
    r = g.rollouts[0]
    assert (g.step, g.task, g.kind, g.prompt, r.stop_reason, r.tool_reward) == ("", "", "", "", "", None)
    assert r.summary_mask == [0, 0, 1]  # the policy tokens outside the tool segment
    assert r.segment_mean("slca", tool=True) == -1.0 and r.segment_mean("slca", tool=False) == 3.0
    assert math.isnan(r.segment_mean("grpo", tool=True))


@pytest.mark.parametrize("data,msg", [
    ({}, "s: expected a list of recorded groups, got dict"),
    ([{"rollouts": 1}], "s: group 0: field 'rollouts' must be a list"),
    ([{"rollouts": [1]}], "s: group 0 rollout 0: expected an object"),
    ([{"rollouts": [{"tokens": ["a"], "model_mask": [1], "tool_mask": []}]}], "field 'tool_mask' must be a list as long as 'tokens' (1)"),
    ([{"rollouts": [{"tokens": ["a"], "model_mask": [1], "tool_mask": [1], "adv": {"x": [True]}}]}], "field 'adv.x' must be a list of finite numbers"),
])
def test_unusable_sample_json_is_refused_naming_the_field(data, msg):
    with pytest.raises(ValueError) as e:
        samples_from_json(data, "s")
    assert msg in str(e.value)


def test_read_samples_names_a_file_that_is_not_json(tmp_path):
    (tmp_path / "samples.json").write_text("[{")
    with pytest.raises(ValueError, match="samples.json is not valid JSON"):
        read_samples(tmp_path / "samples.json")
