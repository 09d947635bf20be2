"""Encode conversations with exact policy / environment token masks, from the tokenizer's own template.

Which tokens the policy generated is decided by the chat template, not by
hard-coded markers: for each assistant message ``i`` we render

* ``P_i`` = the conversation up to (not including) message ``i`` with the
  generation prompt (what the model sees when it starts turn ``i``), and
* ``Q_i`` = the conversation up to and including message ``i``, no generation prompt.

The assistant's generated text is ``Q_i[len(P_i):]`` cut right after the
template's end-of-turn marker (found by rendering a probe conversation, e.g.
``<|im_end|>`` for Qwen, ``<|eot_id|>`` for Llama 3). Everything else (system,
user and tool messages, the assistant header, the newline after the end-of-turn
token) is template text with mask 0. This works for any Hugging Face chat
template that is *prefix-preserving*: rendering a longer conversation must not
change how its earlier messages render. Qwen3's own template is not (it drops the
``<think>`` block of earlier turns); :class:`TemplateNotPrefixPreserving` says
so and names the fix (a training template, as TRL ships for GRPO).

Token ids are the concatenation of the tokenisations of these pieces, which is
exactly the sequence a rollout builds (prompt ids, sampled ids, environment ids).
For templates whose pieces meet at special tokens or newlines (Qwen, Llama) it
equals tokenising the whole rendered text.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = [
    "EncodedConversation",
    "TemplateNotPrefixPreserving",
    "ChatRenderer",
    "encode_conversation",
    "find_training_template",
    "template_messages",
]


@dataclass
class EncodedConversation:
    """A tokenised conversation.

    ``input_ids`` (T,) token ids; ``model_mask`` (T,) 1 on every token the
    assistant generated in its turns (its end-of-turn token included), 0 on
    system, user and tool tokens and on the template's assistant header;
    ``prompt_length`` the number of tokens before the first assistant turn
    (all of them when there is none).
    """

    input_ids: list[int]
    model_mask: list[int]
    prompt_length: int

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.model_mask):
            raise ValueError(f"input_ids ({len(self.input_ids)}) and model_mask ({len(self.model_mask)}) differ in length")


def template_messages(messages: Sequence[dict]) -> list[dict]:
    """Messages as Hugging Face chat templates expect them.

    OpenAI messages carry tool-call ``arguments`` as a JSON string; templates
    such as Qwen2.5's write ``arguments | tojson`` and need the object. Strings
    that decode to a JSON object are replaced by it; everything else is kept.
    """
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls:
            new_calls = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        args = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        args = None
                    if isinstance(args, dict):
                        c = {**c, "function": {**fn, "arguments": args}}
                new_calls.append(c)
            m = {**m, "tool_calls": new_calls}
        out.append(m)
    return out


class TemplateNotPrefixPreserving(ValueError):
    """The chat template renders earlier messages differently once more messages follow."""


_PROBE = "SLCA_PROBE_7f3a"


def find_training_template(chat_template: str) -> pathlib.Path | None:
    """Path of TRL's prefix-preserving training variant of ``chat_template``, if TRL ships one.

    TRL (``trl/chat_templates/``) stores the original templates of popular models
    next to ``<name>_training.jinja`` variants that render every turn the same way.
    Returns None when TRL is not installed or the template is not one of them.
    """
    try:
        import trl
    except ImportError:
        return None
    folder = pathlib.Path(trl.__file__).parent / "chat_templates"
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.jinja")):
        if path.stem.endswith("_training"):
            continue
        if path.read_text().strip() == chat_template.strip():
            training = folder / f"{path.stem}_training.jinja"
            return training if training.exists() else None
    return None


class ChatRenderer:
    """Renders conversations with one tokenizer's chat template and cuts them into policy / template pieces.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: OpenAI tool schemas passed to the template (or None).
        chat_template: a template to use instead of ``tokenizer.chat_template``.
        end_of_turn: the text that ends an assistant turn; derived from the
            template when None (the text the template writes right after an
            assistant message, trailing whitespace stripped).
    """

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None, *, chat_template: str | None = None, end_of_turn: str | None = None):
        template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError("tokenizer has no chat_template and no `chat_template` was given")
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.chat_template = template
        self.end_of_turn = end_of_turn if end_of_turn is not None else self._probe_end_of_turn()
        if not self.end_of_turn:
            raise ValueError("could not find the template's end-of-turn marker; pass `end_of_turn` explicitly")

    # -- rendering ------------------------------------------------------------------------------
    def render(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
        """The template's text for ``messages``."""
        return self.tokenizer.apply_chat_template(
            template_messages(messages),
            tools=self.tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def _probe_end_of_turn(self) -> str:
        msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE}]
        text = self.tokenizer.apply_chat_template(msgs, chat_template=self.chat_template, tokenize=False)
        k = text.rfind(_PROBE)
        if k < 0:
            raise ValueError("the chat template does not render assistant content; cannot find its end-of-turn marker")
        return text[k + len(_PROBE):].rstrip()

    def tokenize(self, text: str) -> list[int]:
        """Token ids of a piece of text (no special tokens added: the template writes them)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def end_of_turn_id(self) -> int:
        """The single token id of the end-of-turn marker (raises if it is several tokens)."""
        ids = self.tokenize(self.end_of_turn)
        if len(ids) != 1:
            raise ValueError(f"end-of-turn marker {self.end_of_turn!r} is {len(ids)} tokens; generation needs a single stop token")
        return ids[0]

    def _not_prefix(self, earlier: str, later: str, what: str) -> TemplateNotPrefixPreserving:
        n = next((i for i, (a, b) in enumerate(zip(earlier, later)) if a != b), min(len(earlier), len(later)))
        lo = max(0, n - 60)
        training = find_training_template(self.chat_template)
        fix = (
            f"use TRL's training template {training} (slca train: --set chat_template={training}; "
            "Python: chat_template=open(path).read(), or set tokenizer.chat_template)"
            if training is not None
            else "use a training variant of the template that renders every assistant turn the same way whatever follows "
            "(TRL ships them as trl/chat_templates/<model>_training.jinja, e.g. qwen3_training.jinja; "
            "slca train: --set chat_template=PATH)"
        )
        return TemplateNotPrefixPreserving(
            f"chat template is not prefix-preserving: {what}. First difference at char {n}:\n"
            f"  before: {earlier[lo:n + 60]!r}\n  after:  {later[lo:n + 60]!r}\n"
            "Earlier turns render differently once more messages follow (Qwen3's template drops the <think> "
            "block of earlier assistant turns), so the tokens a rollout generated are not the tokens the template "
            f"would train on. Fix: {fix}."
        )

    def split_assistant(self, before: str, after: str, index: int) -> tuple[str, str]:
        """Cut ``after[len(before):]`` into (generated text incl. end-of-turn, trailing template text)."""
        if not after.startswith(before):
            raise self._not_prefix(before, after, f"the generation prompt is not a prefix of assistant message {index}")
        body = after[len(before):]
        k = body.rfind(self.end_of_turn)
        if k < 0:
            raise ValueError(f"assistant message {index} renders without the end-of-turn marker {self.end_of_turn!r}: {body[-80:]!r}")
        cut = k + len(self.end_of_turn)
        return body[:cut], body[cut:]

    def pieces(self, messages: Sequence[dict]) -> list[tuple[str, int]]:
        """The rendered conversation as ``[(text, is_policy)]`` pieces, in order."""
        out: list[tuple[str, int]] = []
        done = ""
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            if not before.startswith(done):
                raise self._not_prefix(done, before, f"messages[:{i}] renders differently from how it rendered before message {i}")
            gen, _ = self.split_assistant(before, self.render(messages[: i + 1], add_generation_prompt=False), i)
            out.append((before[len(done):], 0))
            out.append((gen, 1))
            done = before + gen
        full = self.render(messages, add_generation_prompt=False)
        if not full.startswith(done):
            raise self._not_prefix(done, full, "the full conversation renders earlier assistant turns differently")
        out.append((full[len(done):], 0))
        return [(t, p) for t, p in out if t]

    def environment_text(self, messages: Sequence[dict], new_messages: Sequence[dict]) -> str:
        """Template text between the end-of-turn token of the last assistant turn in
        ``messages`` and the generation point after ``new_messages`` (tool results).

        These are the environment tokens a rollout appends: e.g. for Qwen2.5,
        ``"\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n"``.
        """
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError("`messages` must end with the assistant turn the environment answers")
        last = self.render(messages, add_generation_prompt=False)
        nxt = self.render(list(messages) + list(new_messages), add_generation_prompt=True)
        if not nxt.startswith(last):
            raise self._not_prefix(last, nxt, "appending the tool messages re-renders the assistant turn they answer")
        k = last.rfind(self.end_of_turn)
        if k < 0:
            raise ValueError(f"the last assistant turn renders without the end-of-turn marker {self.end_of_turn!r}")
        return last[k + len(self.end_of_turn):] + nxt[len(last):]


def encode_conversation(
    tokenizer: Any,
    messages: Sequence[dict],
    tools: list[dict] | None = None,
    *,
    chat_template: str | None = None,
) -> EncodedConversation:
    """Tokenise a conversation with a mask of the tokens the assistant generated.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: OpenAI-style messages (system / user / assistant / tool).
        tools: OpenAI tool schemas, rendered by the template (or None).
        chat_template: a template to use instead of ``tokenizer.chat_template``
            (e.g. TRL's ``qwen3_training.jinja``).

    Returns:
        :class:`EncodedConversation` with ``input_ids`` (T,), ``model_mask`` (T,)
        and ``prompt_length``.

    Raises:
        TemplateNotPrefixPreserving: the template re-renders earlier turns once
            more messages follow (the message names the training template to use).
    """
    r = ChatRenderer(tokenizer, tools, chat_template=chat_template)
    ids: list[int] = []
    mask: list[int] = []
    prompt_length: int | None = None
    for text, is_policy in r.pieces(messages):
        if is_policy and prompt_length is None:
            prompt_length = len(ids)
        toks = r.tokenize(text)
        ids += toks
        mask += [is_policy] * len(toks)
    return EncodedConversation(ids, mask, len(ids) if prompt_length is None else prompt_length)
