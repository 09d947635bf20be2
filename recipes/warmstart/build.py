"""Build the embedded default policy from nothing: demonstrations -> tokenizer -> Qwen2 -> SFT warm start.

1. demonstrations: toolworld train tasks played against the toolworld
   environment (real tool results), with a configurable quality mix
   (:mod:`.demos`, synthetic entities :mod:`.augment`, copy drills :mod:`.drills`);
2. tokenizer: byte-level BPE trained on the rendered demonstrations, Qwen2.5
   special tokens and the project's chat template (:mod:`.tokenizer`);
3. model: ``Qwen2ForCausalLM`` at :class:`~.config.ModelSize`, randomly
   initialised and warm-started by SFT on the demonstrations, loss on assistant
   tokens only (:mod:`.sft`);
4. ``save_pretrained`` of both with ``slca_build.json`` (the config, its
   :func:`fingerprint`, the digest of all the data it trained on, a report and
   the loss curve), which ``slca.models.load_default`` loads.

The fingerprint names the build by what decides its weights: the config, the
recipe version and a digest of the data the recipe generates (a deterministic
sample of demonstrations, the tokenizer's training text rendered from them,
and the copy drills; about a second). An edit that generates the same data
(a comment, a refactoring) keeps it; a change to the data or the config does
not. A change to the SFT or tokenizer *code* that changes what a config
produces bumps :data:`~.config.RECIPE_VERSION`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from slca.models.default import INFO_FILE, add_response_template
from slca.models.tokenizer import chat_template
from slca._fs import replaceable_model_folder, temp_dir, umask_modes

from .config import LATER_FIELDS, RECIPE_VERSION, BuildConfig, DemoMix, ModelSize
from .demos import Demonstration, make_demonstrations, render_texts
from .drills import make_drills
from .sft import encode_examples, induction_loss_fn, induction_warmup, sft_train
from .tokenizer import train_tokenizer

__all__ = [
    "DIGEST_SAMPLE",
    "BuildReport",
    "TokenizerRoundTripError",
    "STATE_FILE",
    "build_default",
    "read_build_state",
    "build_demonstrations",
    "check_tokenizer_round_trip",
    "data_digest",
    "demonstrations_digest",
    "fingerprint",
    "make_model",
    "prepare_build",
    "warm_start",
]

DIGEST_SAMPLE = 256
"""Demonstrations (and drills) generated for :func:`data_digest`: enough to hold every task type and every flaw."""


def demonstrations_digest(demos: Sequence[Demonstration]) -> str:
    """SHA-256 of demonstrations (messages and tools) and of the tokenizer's training text rendered from them.

    The build records it for all its demonstrations (``slca_build.json``, ``data.demonstrations``),
    so a later checkout can show that it generates the data a shipped model was trained on.
    """
    h = hashlib.sha256(b"demonstrations\0")
    for d in demos:
        h.update(json.dumps([d.messages, d.tools], sort_keys=True, default=str).encode() + b"\0")
    h.update(b"tokenizer text\0")
    for text in render_texts(demos):
        h.update(text.encode() + b"\0")
    return h.hexdigest()


def build_demonstrations(cfg: BuildConfig, n_tasks: int | None = None) -> list[Demonstration]:
    """The demonstrations ``cfg``'s build trains on (the first ``n_tasks`` of them; default all ``cfg.n_tasks``)."""
    return make_demonstrations(cfg.n_tasks if n_tasks is None else n_tasks, cfg.mix, seed=cfg.data_seed, synthetic=cfg.synthetic_entities,
                               entity_style=cfg.entity_style, paraphrase=cfg.paraphrase)


def data_digest(cfg: BuildConfig) -> str:
    """What decides the built model besides its config and the recipe version: the data the recipe generates.

    A digest of the chat template, of :func:`demonstrations_digest` of the
    demonstrations ``cfg``'s recipe generates for its first :data:`DIGEST_SAMPLE`
    tasks and of as many copy drills (about a second, cached per data setting):
    a change to toolworld, the demonstrations, the entity synthesis, the chat
    template or the drills that changes what they produce changes it; a comment
    or a refactoring that changes no output does not.
    """
    return _data_digest(min(cfg.n_tasks, DIGEST_SAMPLE), cfg.mix, cfg.data_seed, cfg.synthetic_entities, min(cfg.drills, DIGEST_SAMPLE),
                        cfg.entity_style, cfg.paraphrase)


@functools.lru_cache(maxsize=8)
def _data_digest(n_tasks: int, mix: DemoMix, seed: int, synthetic: float, n_drills: int, entity_style: str, paraphrase: float) -> str:
    """Cached per data setting (the fields of :class:`BuildConfig` that decide the demonstrations and drills)."""
    data = BuildConfig(n_tasks=n_tasks, mix=mix, data_seed=seed, synthetic_entities=synthetic, entity_style=entity_style, paraphrase=paraphrase)
    h = hashlib.sha256(chat_template().encode())
    h.update(demonstrations_digest(build_demonstrations(data)).encode())
    if n_drills:
        h.update(json.dumps(make_drills(n_drills, seed=seed), sort_keys=True, default=str).encode())
    return h.hexdigest()


def fingerprint(cfg: BuildConfig) -> str:
    """The build's name (16 hex digits): a digest of ``cfg``, :data:`RECIPE_VERSION` and :func:`data_digest`.

    ``slca_build.json`` records it, and ``load_default`` names a cache entry by it.
    """
    blob = json.dumps({"recipe": RECIPE_VERSION, "config": _fingerprinted(asdict(cfg)), "data": data_digest(cfg)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _fingerprinted(config: dict) -> dict:
    """``config`` without the :data:`~.config.LATER_FIELDS` that hold their earlier-neutral value."""
    config = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for dotted, neutral in LATER_FIELDS.items():
        *parents, name = dotted.split(".")
        d = config
        for p in parents:
            d = d[p]
        if d.get(name) == neutral:
            del d[name]
    return config


def make_model(size: ModelSize, tokenizer, seed: int = 0):
    """A randomly initialised ``Qwen2ForCausalLM`` of ``size`` for ``tokenizer`` (tied embeddings)."""
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
    resumed_from: int = 0
    """The SFT step a resumed build continued from (0: built in one go); times and losses cover all of it."""


def prepare_build(cfg: BuildConfig, console=None):
    """The warm-start data of ``cfg``: ``(demonstrations, tokenizer, examples, dropped)``.

    Demonstrations (with their quality mix and synthetic entities), the BPE
    tokenizer trained on them, and the encoded SFT examples (demonstrations
    first, then ``cfg.drills`` copy drills); ``dropped`` counts demonstrations
    over ``cfg.sft.max_length`` tokens.
    """
    status = console.status if console is not None else (lambda _: nullcontext())
    log = console.log if console is not None else (lambda *_: None)
    with status("toolworld demonstrations"):
        demos = build_demonstrations(cfg)
    log(f"{len(demos)} demonstrations from toolworld train tasks")
    with status("training the tokenizer"):
        tokenizer = train_tokenizer(render_texts(demos), vocab_size=cfg.vocab_size, model_max_length=cfg.model.max_position_embeddings,
                                    digit_runs=cfg.digit_runs)
    log(f"tokenizer: {len(tokenizer)} tokens")
    with status("encoding demonstrations"):
        examples, dropped = encode_examples(tokenizer, [(d.messages, d.tools) for d in demos], cfg.sft.max_length,
                                            with_copy_mask=cfg.sft.copy_weight != 1.0)
    if cfg.drills:
        drill_examples, _ = encode_examples(tokenizer, [(c, None) for c in make_drills(cfg.drills, seed=cfg.data_seed)], cfg.sft.max_length,
                                            with_copy_mask=cfg.sft.copy_weight != 1.0)
        log(f"{len(drill_examples)} copy drills")
        examples += drill_examples
    return demos, tokenizer, examples, dropped


def induction_vocab(tokenizer) -> list[int]:
    """Token ids the induction warm-up draws from: every id but the special and added tokens."""
    special = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(t) for t in tokenizer.get_added_vocab()}
    return [i for i in range(len(tokenizer)) if i not in special]


def warm_start(model, tokenizer, examples, cfg: BuildConfig, *, on_step=None, console=None, resume=None, checkpoint=None,
               checkpoint_every: int = 0):
    """Train ``model`` in place by the recipe's warm start; returns ``(SFTStats, induction losses)``.

    The induction warm-up (``cfg.sft.induction_steps``), then SFT on ``examples`` with one
    induction batch every ``cfg.sft.induction_every`` steps. ``on_step(step, loss)`` is
    called after each SFT step (0-based); it may evaluate the model (it is put back in
    train mode). The build and ``recipes/warmstart/sweep.py`` both train through here.
    ``checkpoint(state)`` every ``checkpoint_every`` SFT steps and ``resume`` (such a state:
    the warm-up is then done already) as in :func:`~.sft.sft_train`; the state also holds the
    warm-up's losses.
    """
    bos, sep = tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    ind: list[float] = list(resume["induction_losses"]) if resume is not None else []
    if cfg.sft.induction_steps and resume is None:
        ind = induction_warmup(model, induction_vocab(tokenizer), cfg.sft.induction_steps, lr=cfg.sft.lr, seed=cfg.sft.seed,
                               bos_id=bos, sep_id=sep)
        if console is not None:
            console.log(f"induction warm-up: {len(ind)} steps, copy loss {ind[0]:.2f} -> {ind[-1]:.3f}")
    aux = None
    if cfg.sft.induction_every:
        aux = induction_loss_fn(induction_vocab(tokenizer), bos_id=bos, sep_id=sep, seed=cfg.sft.seed + 1)
    save = None if checkpoint is None else (lambda state: checkpoint({**state, "induction_losses": ind}))
    stats = sft_train(model, examples, cfg.sft, pad_id=tokenizer.pad_token_id, progress=on_step, aux_loss=aux, resume=resume,
                      checkpoint=save, checkpoint_every=checkpoint_every)
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


STATE_FILE = "state.pt"
"""The file of a resumable build's state in its ``state_dir``."""


def read_build_state(state_dir: str | Path | None, cfg: BuildConfig) -> dict | None:
    """The partial build of ``cfg`` saved in ``state_dir`` (None when there is none); a state of another
    config is refused (its fingerprint is named), never resumed or deleted."""
    f = Path(state_dir) / STATE_FILE if state_dir is not None else None
    if f is None or not f.is_file():
        return None
    state = torch.load(f, weights_only=True)
    if state.get("fingerprint") != fingerprint(cfg):
        raise ValueError(f"{f}: the partial build of another config (fingerprint {state.get('fingerprint')}, this build "
                         f"{fingerprint(cfg)}); delete {state_dir} to start this one")
    return state


def _state_saver(state_dir: Path, cfg: BuildConfig, spent):
    """``save(state)``: the state with the config's fingerprint and the build's time so far (``spent()``), written
    atomically to ``state_dir/state.pt`` (a kill mid-write leaves the previous state)."""
    def save(state: dict) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / (STATE_FILE + ".tmp")
        torch.save({**state, "fingerprint": fingerprint(cfg), "spent": spent()}, tmp)
        os.replace(tmp, state_dir / STATE_FILE)

    return save


def build_default(out_dir: str | Path, config: BuildConfig | None = None, *, progress: bool = True, on_step=None,
                  state_dir: str | Path | None = None, checkpoint_every: int = 20) -> BuildReport:
    """Build tokenizer + model + warm start for ``config`` and ``save_pretrained`` both to ``out_dir``.

    ``slca_build.json`` records the config, its :func:`fingerprint` and the
    :func:`demonstrations_digest` of all the demonstrations it trained on.
    ``on_step(step, loss, model, tokenizer)``, if given, is called after every SFT step
    (the sweep script evaluates the model there; it must not change the model).

    Resumable with ``state_dir``: every ``checkpoint_every`` SFT steps the whole training state
    goes to ``state_dir/state.pt``; a build that finds a state of its config there continues from
    it (the data, which is deterministic, is generated again) and gives the weights the build in
    one go gives; the folder is removed when the model is saved.
    """
    cfg = config or BuildConfig()
    out = Path(out_dir)
    console = Console(stderr=True, quiet=not progress)
    resume = read_build_state(state_dir, cfg)
    before = resume["spent"] if resume is not None else {"wall": 0.0, "cpu": 0.0}
    t0, c0 = time.perf_counter() - before["wall"], time.process_time() - before["cpu"]
    if resume is not None:
        console.log(f"resuming the build at SFT step {resume['step']} of {cfg.sft.steps} ({Path(state_dir) / STATE_FILE})")
    demos, tokenizer, examples, dropped = prepare_build(cfg, console)
    lengths = [len(e.input_ids) for e in examples]
    console.log(f"encoded: mean {sum(lengths) / len(lengths):.0f} tokens, max {max(lengths)}, dropped {dropped} over {cfg.sft.max_length}")
    model = make_model(cfg.model, tokenizer, seed=cfg.model_seed)
    check_tokenizer_round_trip(tokenizer, model, render_texts(demos[:50]))
    n_params = sum(p.numel() for p in model.parameters())
    console.log(f"Qwen2ForCausalLM: {n_params / 1e6:.2f}M parameters")
    columns = [TextColumn("SFT warm start"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, disable=not progress) as bar:
        job = bar.add_task("sft", total=cfg.sft.steps, loss=float("nan"), completed=resume["step"] if resume is not None else 0)

        def step_done(step: int, loss: float) -> None:
            bar.update(job, advance=1, loss=loss)
            if on_step is not None:
                with torch.random.fork_rng():
                    on_step(step, loss, model, tokenizer)

        save = None if state_dir is None else _state_saver(Path(state_dir), cfg, lambda: {"wall": time.perf_counter() - t0,
                                                                                          "cpu": time.process_time() - c0})
        stats, ind = warm_start(model, tokenizer, examples, cfg, on_step=step_done, console=console, resume=resume, checkpoint=save,
                                checkpoint_every=checkpoint_every)
    report = BuildReport(
        n_demos=len(demos), n_params=n_params, vocab_size=len(tokenizer), sft_steps=cfg.sft.steps,
        first_loss=stats.losses[0], last_loss=stats.losses[-1], sft_tokens=stats.tokens, sft_seconds=stats.seconds,
        sft_cpu_seconds=stats.cpu_seconds, total_seconds=time.perf_counter() - t0, total_cpu_seconds=time.process_time() - c0,
        dropped=dropped,
        mean_length=sum(lengths) / len(lengths), max_length=max(lengths), resumed_from=resume["step"] if resume is not None else 0,
    )
    info = {"fingerprint": fingerprint(cfg), "config": cfg.to_dict(),
            "data": {"sample": data_digest(cfg), "demonstrations": demonstrations_digest(demos)},
            "report": report.__dict__, "losses": stats.losses, "induction_losses": ind}
    _save(out, model, tokenizer, info)
    if state_dir is not None:
        shutil.rmtree(state_dir, ignore_errors=True)
    console.log(f"built in {report.total_seconds:.0f}s wall, {report.total_cpu_seconds:.0f}s CPU (SFT {report.sft_seconds:.0f}s), saved to {out}")
    return report


def _save(out: Path, model, tokenizer, info: dict) -> None:
    """``save_pretrained`` model and tokenizer with ``info`` as ``slca_build.json`` into ``out``, atomically.

    Written to a temporary sibling folder and renamed into place, so an interrupted
    build never leaves a half-written cache entry.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(out.name + ".tmp-", out.parent)  # the mode mkdir gives, not mkdtemp's 0700
    model.save_pretrained(tmp)
    add_response_template(tokenizer).save_pretrained(tmp)
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=1))
    umask_modes(tmp)  # safetensors writes 0600
    if (out / INFO_FILE).exists():
        shutil.rmtree(tmp)  # another process finished the same build first
    else:
        problem = replaceable_model_folder(out, partial=True)
        if problem is not None:  # never delete what a build did not write
            shutil.rmtree(tmp)
            raise ValueError(f"model folder {problem}")
        shutil.rmtree(out, ignore_errors=True)  # a half-written entry from an older layout (model files only)
        os.replace(tmp, out)
