"""Token batches: padding, positions, log-prob gathering."""

import pytest
import torch

from slca.core.losses import token_logprobs
from slca.generation.batching import collate, pad, positions
from slca.types import Task, Trajectory


def test_pad_left_and_right():
    ids, att = pad([[1, 2, 3], [4]], 0, left=True)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and att.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, att = pad([[1.5], []], -1.0, width=2, dtype=torch.float32)
    assert ids.tolist() == [[1.5, -1.0], [-1.0, -1.0]] and att.tolist() == [[1, 0], [0, 0]]
    with pytest.raises(ValueError, match="sequence 0 has 3 entries, more than width 2"):
        pad([[1, 2, 3]], 0, width=2)


def test_positions_skip_left_padding():
    assert positions(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_token_logprobs_is_log_softmax_at_targets():
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]]])
    got = token_logprobs(logits, torch.tensor([[0, 2]]), temperature=2.0)
    want = torch.log_softmax(logits / 2.0, -1)[0, [0, 1], [0, 2]]
    assert torch.allclose(got[0], want)


def test_collate_aligns_responses_at_the_prompt_length():
    task = Task(id="t", messages=[{"role": "user", "content": "x"}], tools=[])
    a = Trajectory(task=task, prompt_ids=[5, 6], response_ids=[7, 8, 9], model_mask=[1, 0, 1], logprobs=[-0.5, 0.0, -0.25], turns=[], final_text="", stop_reason="final_answer")
    b = Trajectory(task=task, prompt_ids=[5], response_ids=[], model_mask=[], logprobs=[], turns=[], final_text="", stop_reason="final_answer")
    batch = collate([a, b], pad_id=0)
    assert batch.prompt_len == 2
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [0, 5, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    assert batch.model_mask.tolist() == [[1, 0, 1], [0, 0, 0]] and batch.valid_mask.tolist() == [[1, 1, 1], [0, 0, 0]]
    assert batch.old_logprobs.tolist() == [[-0.5, 0.0, -0.25], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="trajs is empty"):
        collate([], 0)
