"""A small local tokenizer with Qwen2.5/Qwen3's special tokens, for tests.

Built with the ``tokenizers`` library (byte-level BPE with Qwen2's
pre-tokenizer regex, trained on a few lines of text), so no hub download is
needed. Special tokens follow Qwen: ``<|endoftext|>`` (pad), ``<|im_start|>``,
``<|im_end|>`` (eos / end of turn) are special; ``<tool_call>``,
``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``,
``</think>`` are added non-special tokens, as in Qwen's own tokenizer.json.

Qwen's chat templates are read from where TRL ships them
(``trl/chat_templates/``); :func:`trl_template` returns one by name.
"""

from __future__ import annotations

import functools
import pathlib

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers import AddedToken

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
# Qwen2's pre-tokenizer split pattern (tokenizer.json of Qwen2.5).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

DEFAULT_CORPUS = [
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "# Tools\n\nYou may call one or more functions to assist with the user query.",
    'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{"type": "function"}',
    'For each function call, return a json object with function name and arguments within XML tags:',
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"temperature": 21, "condition": "sunny", "error": "unknown tool"}',
    "The weather in Paris is sunny and 21 degrees. What is the weather like in Berlin and Rome?",
    "user assistant system tool function description parameters properties type object string number",
]


def trl_template_dir() -> pathlib.Path:
    """Folder where the installed TRL ships its chat templates."""
    import trl

    return pathlib.Path(trl.__file__).parent / "chat_templates"


def trl_template(name: str) -> str:
    """The text of ``trl/chat_templates/<name>.jinja`` (e.g. ``qwen2_5``, ``qwen3``)."""
    return (trl_template_dir() / f"{name}.jinja").read_text()


@functools.lru_cache(maxsize=8)
def _build(corpus: tuple[str, ...], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=QWEN_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED])
    return tok


LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]


def make_llama3_tokenizer(chat_template: str | None = None, corpus: list[str] | None = None, vocab_size: int = 600):
    """A fast tokenizer with Llama 3.1's special tokens and TRL's ``llama3_1.jinja`` template (same BPE recipe)."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(_build(tuple(corpus or DEFAULT_CORPUS), vocab_size).to_str())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
    )
    hf.chat_template = chat_template if chat_template is not None else trl_template("llama3_1")
    return hf


def make_qwen_tokenizer(chat_template: str | None = None, corpus: list[str] | None = None, vocab_size: int = 600):
    """A ``transformers`` fast tokenizer with Qwen's special tokens.

    Args:
        chat_template: Jinja chat template text; defaults to TRL's ``qwen2_5.jinja``.
        corpus: lines to train the BPE merges on (defaults to a few tool-use lines).
        vocab_size: BPE vocabulary size before the special / added tokens.
    """
    from transformers import PreTrainedTokenizerFast

    tok = _build(tuple(corpus or DEFAULT_CORPUS), vocab_size)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tok.to_str()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    hf.chat_template = chat_template if chat_template is not None else trl_template("qwen2_5")
    return hf


def tiny_qwen2(vocab_size: int, seed: int = 0, hidden: int = 64, layers: int = 2):
    """A random tiny ``Qwen2ForCausalLM`` (about 100K parameters at the defaults), in eval mode."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).eval()


def memorise(model, tokenizer, conversations, max_steps: int = 400, lr: float = 1e-2):
    """Train ``model`` until greedy decoding reproduces every assistant token of ``conversations``.

    ``conversations`` is a list of ``(messages, tools)``; the loss is on the
    policy tokens of ``slca.encode_conversation``. Stops as soon as the argmax
    of every policy position is its label (checked on the current weights).
    Returns the model in eval mode; raises AssertionError if it never gets there.
    """
    import torch

    from slca.chat import encode_conversation

    encs = [encode_conversation(tokenizer, msgs, tools) for msgs, tools in conversations]
    T = max(len(e.input_ids) for e in encs)
    ids = torch.full((len(encs), T), tokenizer.pad_token_id)
    labels = torch.full((len(encs), T), -100)
    att = torch.zeros(len(encs), T, dtype=torch.long)
    for i, e in enumerate(encs):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        att[i, :n] = 1
        labels[i, :n] = torch.where(torch.tensor(e.model_mask).bool(), torch.tensor(e.input_ids), -100)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(max_steps):
        out = model(input_ids=ids, attention_mask=att, labels=labels)
        pred, lab = out.logits[:, :-1].argmax(-1), labels[:, 1:]
        if bool(((pred == lab) | (lab == -100)).all()) and out.loss.item() < 0.05:
            return model.eval()
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    raise AssertionError(f"the model did not memorise the conversations (loss {out.loss.item():.3f})")


def spans(tok, ids, mask):
    """Decoded runs of consecutive 1s in ``mask`` (e.g. the assistant turns of a policy mask)."""
    out, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            out.append(tok.decode(cur))
            cur = []
    if cur:
        out.append(tok.decode(cur))
    return out


def gold_demo_messages(task):
    """Gold demonstration of a toolworld task: one hermes turn per gold step, answered by
    ``toolworld.make_env``, then the task's reference answer."""
    from slca.chat import get_format
    from slca.env import toolworld
    from slca.generation.rollout import answer_turn, assistant_message

    fmt, env = get_format("hermes"), toolworld.make_env(task)
    msgs = [dict(m) for m in task.messages]
    for step in task.gold:
        text = fmt.render(step)
        parsed = fmt.parse(text)
        msgs.append(assistant_message(text, parsed))
        msgs += answer_turn(parsed, env, 0)[1]
    msgs.append({"role": "assistant", "content": task.reference_answer})
    return msgs


def save_tiny_policy(d: pathlib.Path, hidden: int = 64, heads: int = 4, kv_heads: int = 2, intermediate: int = 128) -> pathlib.Path:
    """A random tiny Qwen2 policy with a toolworld tokenizer, saved to ``d`` (a ``--set model=`` folder)."""
    from slca.env import toolworld
    from recipes.warmstart.config import ModelSize
    from recipes.warmstart.build import make_model
    from recipes.warmstart.tokenizer import train_tokenizer

    tasks = toolworld.make_tasks("train", n=30, seed=0)
    tok = train_tokenizer([m["content"] for t in tasks for m in t.messages] * 3, vocab_size=400)
    size = ModelSize(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate)
    model = make_model(size, tok)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def random_qwen2(vocab=300, seed=0, bias_free=False):
    """A random tiny ``Qwen2ForCausalLM`` with grouped KV heads (4 query heads, 2 KV heads), in eval mode:
    the fast paths' Qwen2 test model (tests/test_fastpath_decode.py, test_fastpath_logprobs.py, test_kvcache.py)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return Qwen2ForCausalLM(cfg).eval()


def random_llama(vocab=300, seed=0):
    """A random tiny ``LlamaForCausalLM`` (one KV head, attention biases, untied LM head), in eval mode:
    the fast paths' Llama test model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, max_position_embeddings=1024, attention_bias=True, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def real_tokenizer(name: str):
    """A real tokenizer available offline: ``"default"`` (the embedded model's) or ``"smollm2"`` (SmolLM2's, from
    the smollm2 extra, with slca's tool-calling template). Skips the calling test when it is not there."""
    import pytest
    from transformers import AutoTokenizer

    if name == "default":
        from slca.models.default import resolve_default_dir

        path, must_build = resolve_default_dir()
        if must_build:
            pytest.skip("the embedded default model is not built here (no shipped weights)")
        return AutoTokenizer.from_pretrained(path)
    if name == "smollm2":
        from slca.models import smollm2 as S

        problem = S.smollm2_problem()
        if problem is not None:
            pytest.skip(f"could not import the smollm2 extra ({problem}); {S.INSTALL_HINT}")
        return S.prepare_smollm2_tokenizer(AutoTokenizer.from_pretrained(S.smollm2_dir(progress=False)))
    raise ValueError(f"real_tokenizer: unknown name {name!r} (default, smollm2)")
