"""slca's trainer with segmentation='span' and estimator='slca_think' (issue 47 items 3 and 4): Trainer.credit itself on
hand-laid rollouts (no model: a tokenizer of one id per character), and the config's refusals."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from slca.core.registry import compute_advantages
from slca.core.segments import segment_masks
from slca.env import toolworld as tw
from slca.generation.batching import collate
from slca.training.config import ConfigError, TrainConfig, validate
from slca.training.trainer import Rollouts, Trainer, span_moved_share
from slca.types import Trajectory

EOT = 1
TASK = tw.make_tasks("train", n=20, seed=0)[0]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class Chars:
    eos_token_id = EOT

    def decode(self, ids, skip_special_tokens=False):
        return "".join("" if i == EOT else chr(i) for i in ids)


def _traj(turn: str, answer: str) -> Trajectory:
    env = "\n<tool_response>{}</tool_response>\n"
    ids = [ord(c) for c in turn] + [EOT] + [ord(c) for c in env] + [ord(c) for c in answer] + [EOT]
    mm = [1] * (len(turn) + 1) + [0] * len(env) + [1] * (len(answer) + 1)
    return Trajectory(TASK, [2, 3], ids, mm, [0.0] * len(ids), [], answer, "final_answer", group_id=0)


TURNS = [("<think>go</think>Let me check.\n" + CALL, "Sunny."), ("<think>hm</think>One moment.\n" + CALL, "Rainy.")]


def credit(**cfg):
    trajs = [_traj(*t) for t in TURNS]
    ns = SimpleNamespace(cfg=validate(TrainConfig(**cfg)), tok=Chars(), turn_ends=lambda: [EOT])
    ns.estimator_options = lambda name: Trainer.estimator_options(ns, name)
    scored = SimpleNamespace(tool=torch.tensor([0.0, 1.0]), summary=torch.tensor([1.0, 0.0]))
    return trajs, Trainer.credit(ns, Rollouts(trajs, collate(trajs, pad_id=0), 0.0), scored)


def test_span_segmentation_gives_the_text_around_the_call_the_summary_advantage():
    trajs, c = credit(segmentation="span")
    b = collate(trajs, pad_id=0)
    boundary = segment_masks(b.model_mask, b.valid_mask)
    assert c.boundary is not None and all(torch.equal(x, y) for x, y in zip(c.boundary, boundary))
    assert torch.equal(c.tool_mask + c.summary_mask, boundary[0] + boundary[1])
    h = 1 / math.sqrt(2)
    for i, (turn, _) in enumerate(TURNS):
        text = turn.index(">", turn.index("</think>")) + 1  # first character after the reasoning
        call = turn.index("<tool_call>")
        adv = c.advantages[i]
        a_tool, a_sum = (-h, h) if i == 0 else (h, -h)
        assert adv[:text].tolist() == pytest.approx([a_tool] * text, abs=1e-5)  # reasoning: execution
        assert adv[text:call - 1].tolist() == pytest.approx([a_sum] * (call - 1 - text), abs=1e-5)  # text: summary
        assert adv[call:len(turn) + 1].tolist() == pytest.approx([a_tool] * (len(turn) + 1 - call), abs=1e-5)  # call, eot
    assert c.inputs.span_labels is not None
    # rollout/span_moved: what the summary segment gained, over the execution tokens of the boundary split
    gained = int((c.summary_mask.bool() & ~boundary[1].bool()).sum())
    assert gained >= sum(t.index("<tool_call>") - 1 - (t.index(">", t.index("</think>")) + 1) for t, _ in TURNS)
    assert span_moved_share(c) == pytest.approx(gained / int(boundary[0].sum()))


def test_slca_think_in_the_trainer_inherits_and_boundary_is_todays_split():
    _, think = credit(estimator="slca_think")
    _, plain = credit()
    assert think.boundary is None and plain.boundary is None and plain.inputs.span_labels is None
    assert torch.equal(think.tool_mask, plain.tool_mask) and torch.equal(think.advantages, plain.advantages)
    assert torch.equal(compute_advantages("slca", think.inputs), think.advantages)


@pytest.mark.parametrize("cfg,field,needle", [
    ({"segmentation": "span", "tool_format": "openai"}, "segmentation", "segmentation='span' needs each policy token labelled"),
    ({"estimator": "slca_think", "tool_format": "openai"}, "tool_format", "estimator 'slca_think' \\(it reads span_labels\\)"),
    ({"segmentation": "spans"}, "segmentation", "spans"),
])
def test_the_config_refuses_a_run_it_cannot_label(cfg, field, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        validate(TrainConfig(**cfg))
    assert e.value.args and field in str(e.value)
