"""Build, cache and load the embedded default policy.

``load_default()`` gives a small Qwen2 model and its tokenizer, built by the
project from nothing (no hub download):

1. demonstrations: toolworld train tasks played against the toolworld
   environment (real tool results), with a configurable quality mix
   (:mod:`slca.models.demos`);
2. tokenizer: byte-level BPE trained on the rendered demonstrations, Qwen2.5
   special tokens and the project's chat template (:mod:`slca.models.tokenizer`);
3. model: ``Qwen2ForCausalLM`` at :class:`~slca.models.config.ModelSize`,
   randomly initialised and warm-started by SFT on the demonstrations,
   loss on assistant tokens only (:mod:`slca.models.sft`);
4. cache: ``save_pretrained`` of both into
   ``<root>/default-model/<fingerprint[:16]>``, where ``<root>`` is
   ``$SLCA_CACHE`` or ``~/.cache/slca``; later calls load it with
   ``AutoModelForCausalLM`` / ``AutoTokenizer``. The fingerprint covers the
   build config, the recipe version, the chat template and a digest of the data
   the recipe generates (:func:`_data_digest`), so a change to any of them builds
   a new model, and an edit that changes none of them (a comment) does not.

The default build takes longer than a demo should wait, so its result ships
with the package (:func:`shipped_model_dir`, a ``save_pretrained`` folder of
about 7 MB): ``load_default()`` with the default config loads it when its
recorded fingerprint is the current recipe's, and builds otherwise.
``slca build-model --out src/slca/models/shipped`` rebuilds it from the recipe;
a test checks that the shipped fingerprint matches the recipe, so a recipe
change cannot silently keep stale weights.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from slca.models.config import BuildConfig, ModelSize
from slca.models.tokenizer import chat_template, train_tokenizer

__all__ = [
    "RESPONSE_TEMPLATE",
    "BuildReport",
    "add_response_template",
    "build_default",
    "default_cache_root",
    "default_model_dir",
    "load_default",
    "make_model",
    "prepare_build",
    "shipped_model_dir",
    "resolve_default_dir",
    "check_tokenizer_round_trip",
    "TokenizerRoundTripError",
]

#: How a generated assistant turn of the project's chat template parses back into a message
#: (transformers' ``response_template``, read by ``tokenizer.parse_response``; TRL's tool loop
#: needs it). The template renders turns as Qwen2.5 does (hermes ``<tool_call>`` JSON blocks,
#: ``<|im_end|>``), so this is the Qwen2.5/Qwen3 template TRL 1.16 ships for those.
RESPONSE_TEMPLATE: dict = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def add_response_template(tokenizer):
    """Give a tokenizer with the project's chat template its :data:`RESPONSE_TEMPLATE` (in place).

    The build calls it before saving the tokenizer (``save_pretrained`` stores it in
    ``tokenizer_config.json``) and :func:`load_default` on every load, so a model built
    before it existed gets it too. A tokenizer with another chat template, or one that
    already has a response template, is returned unchanged. Not part of the cache
    fingerprint: it only tells parsers how to read the model's output.
    """
    if tokenizer.chat_template == chat_template() and getattr(tokenizer, "response_template", None) is None:
        import copy

        tokenizer.response_template = copy.deepcopy(RESPONSE_TEMPLATE)
    return tokenizer

_INFO = "slca_build.json"


def default_cache_root() -> Path:
    """``$SLCA_CACHE`` or ``~/.cache/slca``."""
    env = os.environ.get("SLCA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "slca"


_DIGEST_SAMPLE = 256
"""Demonstrations (and drills) generated for :func:`_data_digest`: enough to hold every task type and every flaw."""


@functools.lru_cache(maxsize=8)
def _data_digest(cfg: BuildConfig) -> str:
    """What decides the built model besides its config: the chat template and the data the recipe generates.

    A digest of the chat template and of the first :data:`_DIGEST_SAMPLE`
    demonstrations (messages and tools) and copy drills that ``cfg``'s recipe
    generates (about a second): a change to toolworld, the demonstrations, the
    entity synthesis or the drills that changes what they produce changes the
    fingerprint; a comment or a refactoring that changes no output does not.
    Changes to the SFT or tokenizer *code* bump :data:`~slca.models.config.RECIPE_VERSION`.
    """
    from slca.models.demos import make_demonstrations

    h = hashlib.sha256(chat_template().encode())
    for d in make_demonstrations(min(cfg.n_tasks, _DIGEST_SAMPLE), cfg.mix, seed=cfg.data_seed, synthetic=cfg.synthetic_entities):
        h.update(json.dumps([d.messages, d.tools], sort_keys=True, default=str).encode())
    if cfg.drills:
        from slca.models.drills import make_drills

        h.update(json.dumps(make_drills(min(cfg.drills, _DIGEST_SAMPLE), seed=cfg.data_seed), sort_keys=True, default=str).encode())
    return h.hexdigest()


def default_model_dir(cache_dir: str | Path | None = None, config: BuildConfig | None = None) -> Path:
    """Where the model for ``config`` is (or will be) cached.

    ``cache_dir`` (default ``default_cache_root() / "default-model"``) holds one
    sub-folder per config fingerprint.
    """
    cfg = config or BuildConfig()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root() / "default-model"
    return root / cfg.fingerprint(_data_digest(cfg))[:16]


def shipped_model_dir() -> Path:
    """The default model built by the recipe and shipped in the package (may be absent in a source tree)."""
    return Path(str(resources.files("slca.models").joinpath("shipped")))


def _recorded_fingerprint(path: Path) -> str | None:
    try:
        return json.loads((path / _INFO).read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def resolve_default_dir(cache_dir: str | Path | None = None, config: BuildConfig | None = None) -> tuple[Path, bool]:
    """Where the model for ``config`` is loaded from, and whether it must be built first.

    The shipped weights are used when their recorded fingerprint is the one the
    current recipe gives (only the default config can match); otherwise the cache
    entry, built on first use.
    """
    path = default_model_dir(cache_dir, config)
    if (path / _INFO).exists():
        return path, False
    shipped = shipped_model_dir()
    if _recorded_fingerprint(shipped) == path.name:
        return shipped, False
    return path, True


def make_model(size: ModelSize, tokenizer, seed: int = 0):
    """A randomly initialised ``Qwen2ForCausalLM`` of ``size`` for ``tokenizer`` (tied embeddings)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_key_value_heads,
        max_position_embeddings=size.max_position_embeddings,
        rope_theta=size.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, do_sample=True, temperature=1.0, top_p=1.0)
    return model


@dataclass
class BuildReport:
    """What a build did (also written to ``slca_build.json`` in the cache entry)."""

    n_demos: int
    n_params: int
    vocab_size: int
    sft_steps: int
    first_loss: float
    last_loss: float
    sft_tokens: int
    sft_seconds: float
    sft_cpu_seconds: float
    total_seconds: float
    total_cpu_seconds: float
    dropped: int
    mean_length: float
    max_length: int


def prepare_build(cfg: BuildConfig, console=None):
    """The warm-start data of ``cfg``: ``(demonstrations, tokenizer, examples, dropped)``.

    Demonstrations (with their quality mix and synthetic entities), the BPE
    tokenizer trained on them, and the encoded SFT examples (demonstrations
    first, then ``cfg.drills`` copy drills); ``dropped`` counts demonstrations
    over ``cfg.sft.max_length`` tokens.
    """
    from contextlib import nullcontext

    from slca.models.demos import make_demonstrations, render_texts
    from slca.models.sft import encode_examples

    status = console.status if console is not None else (lambda _: nullcontext())
    log = console.log if console is not None else (lambda *_: None)
    with status("toolworld demonstrations"):
        demos = make_demonstrations(cfg.n_tasks, cfg.mix, seed=cfg.data_seed, synthetic=cfg.synthetic_entities)
    log(f"{len(demos)} demonstrations from toolworld train tasks")
    with status("training the tokenizer"):
        tokenizer = train_tokenizer(render_texts(demos), vocab_size=cfg.vocab_size, model_max_length=cfg.model.max_position_embeddings,
                                    digit_runs=cfg.digit_runs)
    log(f"tokenizer: {len(tokenizer)} tokens")
    with status("encoding demonstrations"):
        examples, dropped = encode_examples(tokenizer, [(d.messages, d.tools) for d in demos], cfg.sft.max_length,
                                            with_copy_mask=cfg.sft.copy_weight != 1.0)
    if cfg.drills:
        from slca.models.drills import make_drills

        drill_examples, _ = encode_examples(tokenizer, [(c, None) for c in make_drills(cfg.drills, seed=cfg.data_seed)], cfg.sft.max_length,
                                            with_copy_mask=cfg.sft.copy_weight != 1.0)
        log(f"{len(drill_examples)} copy drills")
        examples += drill_examples
    return demos, tokenizer, examples, dropped


def induction_vocab(tokenizer) -> list[int]:
    """Token ids the induction warm-up draws from: every id but the special and added tokens."""
    special = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(t) for t in tokenizer.get_added_vocab()}
    return [i for i in range(len(tokenizer)) if i not in special]


def warm_start(model, tokenizer, examples, cfg: BuildConfig, *, on_step=None, console=None):
    """Train ``model`` in place by the recipe's warm start; returns ``(SFTStats, induction losses)``.

    The induction warm-up (``cfg.sft.induction_steps``), then SFT on ``examples`` with one
    induction batch every ``cfg.sft.induction_every`` steps. ``on_step(step, loss)`` is
    called after each SFT step (0-based); it may evaluate the model (it is put back in
    train mode). The build and ``scripts/warmstart_sweep.py`` both train through here.
    """
    from slca.models.sft import induction_loss_fn, induction_warmup, sft_train

    bos, sep = tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    ind: list[float] = []
    if cfg.sft.induction_steps:
        ind = induction_warmup(model, induction_vocab(tokenizer), cfg.sft.induction_steps, lr=cfg.sft.lr, seed=cfg.sft.seed,
                               bos_id=bos, sep_id=sep)
        if console is not None:
            console.log(f"induction warm-up: {len(ind)} steps, copy loss {ind[0]:.2f} -> {ind[-1]:.3f}")
    aux = None
    if cfg.sft.induction_every:
        aux = induction_loss_fn(induction_vocab(tokenizer), bos_id=bos, sep_id=sep, seed=cfg.sft.seed + 1)
    stats = sft_train(model, examples, cfg.sft, pad_id=tokenizer.pad_token_id, progress=on_step, aux_loss=aux)
    return stats, ind


class TokenizerRoundTripError(ValueError):
    """The tokenizer a build trained does not tokenize the same once saved and loaded with ``AutoTokenizer``."""


def check_tokenizer_round_trip(tokenizer, model, texts) -> None:
    """Raise :class:`TokenizerRoundTripError` unless ``AutoTokenizer`` loads ``tokenizer`` (saved beside
    ``model``'s config) into one that encodes every text of ``texts`` to the same ids.

    Why: transformers 5 loads a folder whose ``config.json`` says ``model_type: qwen2`` with
    ``Qwen2Tokenizer``, which rebuilds the pre-tokenizer from Qwen2's own regex instead of the
    one in ``tokenizer.json``. The project's split survives that (its merges never join a space
    to a letter, so both splits give the same tokens), but ``BuildConfig.digit_runs`` does not:
    a model trained on ``2025`` as one token would be fed single digits by every loader that
    uses ``AutoTokenizer`` (TRL, vLLM, ``slca.models.load_default``). Checked before training.
    """
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        model.config.save_pretrained(d)
        tokenizer.save_pretrained(d)
        loaded = AutoTokenizer.from_pretrained(d)
    for text in texts:
        a = tokenizer(text, add_special_tokens=False)["input_ids"]
        b = loaded(text, add_special_tokens=False)["input_ids"]
        if a != b:
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise TokenizerRoundTripError(
                f"the trained tokenizer does not survive AutoTokenizer ({type(loaded).__name__}): "
                f"{tokenizer.convert_ids_to_tokens(a[i:i + 6])} became {loaded.convert_ids_to_tokens(b[i:i + 6])}; "
                "BuildConfig.digit_runs=True cannot be loaded as a Qwen2 tokenizer by transformers 5, use digit_runs=False")


def build_default(out_dir: str | Path, config: BuildConfig | None = None, *, progress: bool = True, on_step=None) -> BuildReport:
    """Build tokenizer + model + warm start for ``config`` and ``save_pretrained`` both to ``out_dir``.

    Writes to a temporary sibling folder and renames it into place at the end,
    so an interrupted build never leaves a half-written cache entry.
    ``on_step(step, loss, model, tokenizer)``, if given, is called after every SFT step
    (the sweep script evaluates the model there; it must not change the model).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    cfg = config or BuildConfig()
    out = Path(out_dir)
    console = Console(stderr=True, quiet=not progress)
    t0, c0 = time.perf_counter(), time.process_time()
    demos, tokenizer, examples, dropped = prepare_build(cfg, console)
    lengths = [len(e.input_ids) for e in examples]
    console.log(f"encoded: mean {sum(lengths) / len(lengths):.0f} tokens, max {max(lengths)}, dropped {dropped} over {cfg.sft.max_length}")
    model = make_model(cfg.model, tokenizer, seed=cfg.model_seed)
    from slca.models.demos import render_texts

    check_tokenizer_round_trip(tokenizer, model, render_texts(demos[:50]))
    n_params = sum(p.numel() for p in model.parameters())
    console.log(f"Qwen2ForCausalLM: {n_params / 1e6:.2f}M parameters")
    columns = [TextColumn("SFT warm start"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, disable=not progress) as bar:
        job = bar.add_task("sft", total=cfg.sft.steps, loss=float("nan"))

        def step_done(step: int, loss: float) -> None:
            bar.update(job, advance=1, loss=loss)
            if on_step is not None:
                with torch.random.fork_rng():
                    on_step(step, loss, model, tokenizer)

        stats, ind = warm_start(model, tokenizer, examples, cfg, on_step=step_done, console=console)
    report = BuildReport(
        n_demos=len(demos), n_params=n_params, vocab_size=len(tokenizer), sft_steps=cfg.sft.steps,
        first_loss=stats.losses[0], last_loss=stats.losses[-1], sft_tokens=stats.tokens, sft_seconds=stats.seconds,
        sft_cpu_seconds=stats.cpu_seconds, total_seconds=time.perf_counter() - t0, total_cpu_seconds=time.process_time() - c0,
        dropped=dropped,
        mean_length=sum(lengths) / len(lengths), max_length=max(lengths),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    from slca.runs import temp_dir, umask_modes

    tmp = temp_dir(out.name + ".tmp-", out.parent)  # the mode mkdir gives, not mkdtemp's 0700
    model.save_pretrained(tmp)
    add_response_template(tokenizer).save_pretrained(tmp)
    info = {"fingerprint": default_model_dir(None, cfg).name, "config": cfg.to_dict(), "report": report.__dict__, "losses": stats.losses,
            "induction_losses": ind}
    (tmp / _INFO).write_text(json.dumps(info, indent=1))
    umask_modes(tmp)  # safetensors writes 0600
    if (out / _INFO).exists():
        shutil.rmtree(tmp)  # another process finished the same build first
    else:
        shutil.rmtree(out, ignore_errors=True)  # a half-written entry from an older layout
        os.replace(tmp, out)
    console.log(f"built in {report.total_seconds:.0f}s wall, {report.total_cpu_seconds:.0f}s CPU (SFT {report.sft_seconds:.0f}s), saved to {out}")
    return report


def load_default(cache_dir: str | Path | None = None, *, rebuild: bool = False, progress: bool = True,
                 config: BuildConfig | None = None):
    """The embedded default policy: ``(model, tokenizer)``: the shipped build, or built and cached on first use.

    Args:
        cache_dir: folder of cache entries (default ``$SLCA_CACHE/default-model``
            or ``~/.cache/slca/default-model``).
        rebuild: build again (into the cache) even if a cache entry or shipped weights exist.
        progress: show rich progress while building.
        config: the build config (default :class:`BuildConfig()`).

    Returns:
        ``(Qwen2ForCausalLM in eval mode, PreTrainedTokenizerFast)`` loaded with
        ``AutoModelForCausalLM`` / ``AutoTokenizer`` from the cache entry.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if rebuild:
        path = default_model_dir(cache_dir, config)
        shutil.rmtree(path, ignore_errors=True)
        build_default(path, config, progress=progress)
    else:
        path, missing = resolve_default_dir(cache_dir, config)
        if missing:
            build_default(path, config, progress=progress)
    tokenizer = add_response_template(AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer
