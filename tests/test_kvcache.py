"""slca.generation.kvcache: the rollout engine's KV cache over the transformers forward.

The chunk helpers (``pad_chunk``, ``chunk_positions``, ``merge_order``) on small
tensors; ``cache_arg`` on stand-in signatures and on a real peft wrapper;
:class:`CacheBatch` on a random tiny Qwen2: every row's logits equal those of its
own sequence fed alone through the plain forward (holes, expansion, dropped,
parked and merged rows), compared within 1e-4 (fp32), never pinned.
The fused decoder over the same batch contract: tests/test_fastpath_decode.py.
"""

from __future__ import annotations

import pytest
import torch
from _tok import random_qwen2

from slca.generation.kvcache import CacheBatch, GrowingLayer, cache_arg, chunk_positions, make_cache, merge_order, pad_chunk


def test_pad_chunk_left_aligns_each_rows_ids_and_marks_the_rest_invalid():
    ids, valid = pad_chunk([[5, 6, 7], None, [8], []], pad_id=9)
    assert ids.tolist() == [[5, 6, 7], [9, 9, 9], [8, 9, 9], [9, 9, 9]]
    assert valid.tolist() == [[True] * 3, [False] * 3, [True, False, False], [False] * 3]
    assert ids.dtype == torch.long and valid.dtype == torch.bool and ids.device.type == "cpu"
    for nothing in ([None, []], []):
        with pytest.raises(ValueError, match="at least one non-empty sequence"):
            pad_chunk(nothing, pad_id=0)


def test_chunk_positions_continue_each_rows_own_count():
    next_pos = torch.tensor([0, 3, 5, 2])
    valid = torch.tensor([[True, True, True], [False, True, True], [True, False, True], [False, False, False]])
    pos, last = chunk_positions(next_pos, valid)
    assert pos[valid].tolist() == [0, 1, 2, 3, 4, 5, 6]  # row by row: 0 1 2 | 3 4 | 5 6 (a hole does not count)
    assert pos[1, 0] == 3 and pos[3].tolist() == [2, 2, 2]  # a hole before a row's tokens, or a row without any: its next position
    assert last.tolist() == [2, 2, 2, 0]  # the last valid column; 0 for a row without one


def test_merge_order_puts_rows_back_in_id_order():
    here, there = torch.tensor([4, 0, 7]), torch.tensor([5, 2])
    ids, slot_here, slot_there = merge_order(here, there)
    assert ids.tolist() == [0, 2, 4, 5, 7]
    assert ids[slot_here].tolist() == here.tolist() and ids[slot_there].tolist() == there.tolist()
    assert sorted(slot_here.tolist() + slot_there.tolist()) == list(range(5))  # every slot once


def test_cache_arg_names_the_keyword_forward_takes_its_cache_under():
    def new(input_ids=None, cache=None): ...

    def old(input_ids=None, past_key_values=None): ...

    def anything(**kwargs): ...

    assert (cache_arg(new), cache_arg(old), cache_arg(anything)) == ("cache", "past_key_values", "past_key_values")

    class Base:
        def forward(self, input_ids=None, cache=None): ...

    class Wrapper:  # a peft-style wrapper: forward(**kwargs), passed on to its base model
        def get_base_model(self):
            return Base()

        def forward(self, **kwargs): ...

    assert cache_arg(Wrapper().forward) == "cache"
    assert cache_arg(random_qwen2().forward) in ("cache", "past_key_values")


def test_a_peft_model_gets_its_base_models_cache_argument(tiny_model_dir):
    """peft's forward takes **kwargs: the KV cache goes under the base model's own name (``cache`` in
    transformers >= 5.2x; ``past_key_values`` there is deprecated, a FutureWarning per rollout)."""
    pytest.importorskip("peft")
    import inspect

    from slca.generation.kvcache import cache_arg
    from slca.models.loading import load_policy

    model, _ = load_policy(str(tiny_model_dir), lora_r=2)
    base = model.get_base_model().forward
    assert cache_arg(model.forward) == cache_arg(base) == ("cache" if "cache" in inspect.signature(base).parameters else "past_key_values")


def alone(model, seq):
    """The logits after the last token of ``seq`` fed alone through the plain forward, (V,) float."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0, -1].float()


def close_to_alone(model, logits, seqs):
    """max |logits[b] - alone(seqs[b])| over the rows."""
    return max(float((logits[b] - alone(model, s)).abs().max()) for b, s in enumerate(seqs))


@torch.no_grad()
def test_cache_batch_rows_are_their_own_sequences_fed_alone():
    """Unequal prompts, one expansion, decode steps with holes, an environment chunk, a dropped row:
    every row's logits are those of its own tokens fed alone (positions count its own tokens only)."""
    model = random_qwen2()
    batch = CacheBatch(model, 2, 0, torch.device("cpu"))
    seqs = [[5, 6, 7, 8], [9, 10]]
    assert close_to_alone(model, batch.feed_lists(seqs), seqs) < 1e-4
    batch.expand(2)  # rows 0, 1 are prompt 0; rows 2, 3 are prompt 1
    seqs = [list(seqs[0]), list(seqs[0]), list(seqs[1]), list(seqs[1])]
    assert batch.next_pos.tolist() == [4, 4, 2, 2] and batch.attn.shape == (4, 4)
    g = torch.Generator().manual_seed(0)
    for step in range(6):
        ids = torch.randint(1, 300, (4, 1), generator=g)
        valid = torch.tensor([[True], [step % 2 == 0], [step != 3], [True]])
        logits = batch.feed(ids, valid)
        for b in range(4):
            if valid[b, 0]:
                seqs[b].append(int(ids[b, 0]))
        rows = [b for b in range(4) if valid[b, 0]]
        assert max(float((logits[b] - alone(model, seqs[b])).abs().max()) for b in rows) < 1e-4, step
    assert batch.next_pos.tolist() == [len(s) for s in seqs] and batch.attn.sum(dim=1).tolist() == [len(s) for s in seqs]
    chunk = [[1, 2, 3], None, [4], [5, 6]]  # tool results; row 1 idle
    logits = batch.feed_lists(chunk)
    for b, c in enumerate(chunk):
        seqs[b] += c or []
    assert max(float((logits[b] - alone(model, seqs[b])).abs().max()) for b in (0, 2, 3)) < 1e-4
    batch.keep([0, 2, 3])  # row 1 finished
    seqs = [seqs[0], seqs[2], seqs[3]]
    assert close_to_alone(model, batch.feed_lists([[7], [8], [9]]), [s + [t] for s, t in zip(seqs, (7, 8, 9))]) < 1e-4


@torch.no_grad()
def test_parked_rows_rejoin_in_id_order_with_holes_for_what_they_missed():
    model = random_qwen2()
    batch = CacheBatch(model, 3, 0, torch.device("cpu"))
    assert batch.park(torch.tensor([True, False, True])) is None  # nothing fed yet: nothing to park
    seqs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    batch.feed_lists(seqs)
    parked = batch.park(torch.tensor([True, False, True]))  # row 1 waits out the turn
    assert parked is not None and parked.next_pos.tolist() == [2] and parked.attn.tolist() == [[1, 1, 0, 0]]
    assert batch.next_pos.tolist() == [3, 4] and batch.attn.shape == (2, 4)
    batch.feed_lists([[20, 21], [22]])  # rows 0 and 2 go on
    seqs[0] += [20, 21]
    seqs[2] += [22]
    order = batch.unpark(parked, here=torch.tensor([0, 2]), there=torch.tensor([1]))
    assert order.tolist() == [0, 1, 2]
    assert batch.attn.tolist()[1] == [1, 1, 0, 0, 0, 0]  # holes for the two columns fed while it was out
    assert batch.next_pos.tolist() == [len(s) for s in seqs]
    nxt = [[30], [31], [32]]
    assert close_to_alone(model, batch.feed_lists(nxt), [s + n for s, n in zip(seqs, nxt)]) < 1e-4


def test_growing_layers_keep_what_was_fed_when_their_buffers_grow():
    cache = make_cache()
    layers = getattr(cache, "layers", None)
    if layers is None:  # transformers without cache layers: a DynamicCache
        pytest.skip("this transformers has no cache layers")
    layer = GrowingLayer()
    assert not layer.filled
    g = torch.Generator().manual_seed(0)
    ks, vs = [], []
    for width in (3, 50, 20, 1):  # 74 columns: past the first buffer of 64
        k, v = torch.randn(2, 1, width, 4, generator=g), torch.randn(2, 1, width, 4, generator=g)
        keys, values = layer.update(k, v)
        ks.append(k)
        vs.append(v)
        assert torch.equal(keys, torch.cat(ks, dim=2)) and torch.equal(values, torch.cat(vs, dim=2))
    assert layer.filled and layer._k.shape[-2] >= 74
    pk, pv = layer.split(torch.tensor([1]))
    assert torch.equal(pk, torch.cat(ks, dim=2)[1:]) and torch.equal(pv, torch.cat(vs, dim=2)[1:])
    layer.batch_select_indices(torch.tensor([0]))
    layer.update(torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4))  # row 0 goes on alone
    layer.merge((pk, pv), torch.tensor([0]), torch.tensor([1]))
    assert layer.keys.shape == (2, 1, 76, 4)
    assert torch.equal(layer.keys[1, :, :74], pk[0]) and bool((layer.keys[1, :, 74:] == 0).all())  # zeros while it was out
    assert torch.equal(layer.keys[0, :, :74], torch.cat(ks, dim=2)[0])
