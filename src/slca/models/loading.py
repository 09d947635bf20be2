"""Loading the policy: a model folder, a Hugging Face hub id or the embedded default,
in a chosen dtype, on a checked device, optionally with LoRA adapters (peft).

Every failure a user can cause (a path that is not there, a hub id while offline,
a device this machine lacks, a missing chat template) is a one-line ``ValueError``
naming what was wrong, raised before any training work.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from safetensors import SafetensorError

from slca._fields import ConfigError, check_value
from slca._fs import check_weights
from slca.models.named import NAMED_MODELS, load_named, named_model_problem

__all__ = ["DTYPES", "DTYPE_NAMES", "DTYPE_FIELD", "DEVICE_FIELD", "CHAT_TEMPLATE_FIELD", "device_problem", "chat_template_problem", "looks_like_path", "hub_model_problem", "lora_base", "check_device", "check_dtype", "resolve_chat_template", "load_pretrained", "apply_lora", "prepare_policy", "load_policy", "policy_options"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = tuple(DTYPES)


def device_problem(v: str) -> str | None:
    """What is wrong with the torch device ``v`` on this machine (None: nothing); the ``device`` field's check."""
    try:
        d = torch.device(v)
    except (RuntimeError, ValueError):
        return f"{v!r} is not a torch device (cpu, cuda, cuda:N, mps)"
    if d.type == "cpu":
        return None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            return f"{v!r}: CUDA is not available on this machine"
        if d.index is not None and d.index >= torch.cuda.device_count():
            return f"{v!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        return None
    if d.type == "mps":
        return None if torch.backends.mps.is_available() else f"{v!r}: MPS is not available on this machine"
    return f"{v!r}: device type {d.type!r} is not supported (cpu, cuda, cuda:N, mps)"


def chat_template_problem(v: str) -> str | None:
    """What is wrong with ``v`` as a ``chat_template`` value (None: nothing): '', a .jinja file or inline Jinja."""
    if not v or "{{" in v or "{%" in v:  # the tokenizer's own, or an inline template
        return None
    return None if Path(v).expanduser().is_file() else f"{v!r} is neither a file nor an inline Jinja template"


DTYPE_FIELD = Literal[DTYPE_NAMES]
DEVICE_FIELD = Annotated[str, device_problem]
CHAT_TEMPLATE_FIELD = Annotated[str, chat_template_problem]
_HINTS: dict[str, Any] = {"dtype": DTYPE_FIELD, "device": DEVICE_FIELD, "chat_template": CHAT_TEMPLATE_FIELD}
"""The config fields this module refuses values of, by the annotations ``TrainConfig`` declares them with (one rule, one place)."""


def _checked(field: str, value: Any) -> None:
    """Refuse ``value`` as ``slca.training.config.check_field`` does for ``field`` (the same annotation, the same check)."""
    problem = check_value(value, _HINTS[field])[1]
    if problem:
        raise ConfigError(field, problem)


def check_dtype(dtype: str) -> torch.dtype:
    """The torch dtype named ``dtype`` ('float32', 'bfloat16', 'float16')."""
    _checked("dtype", dtype)
    return DTYPES[dtype]


def check_device(device: str) -> torch.device:
    """``torch.device(device)`` if this machine has it; a one-line ValueError otherwise."""
    _checked("device", device)
    return torch.device(device)


def resolve_chat_template(value: str) -> str | None:
    """``chat_template``: '' -> None (the tokenizer's own); a path to a file -> its text;
    text with Jinja markup (``{{`` or ``{%``) -> that text."""
    _checked("chat_template", value)
    if not value or "{{" in value or "{%" in value:
        return value or None
    return Path(value).expanduser().read_text()


def _one_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def looks_like_path(spec: str) -> bool:
    """Whether a ``model`` value that is not an existing folder was meant as a path, not a hub id:
    it starts with ``.``, ``/`` or ``~``, has more than one ``/``, ends in ``/``, is no valid hub id
    (``name`` or ``org/name``), or its first part is a local folder (``models/nonexist`` next to a
    ``models/`` folder)."""
    s = spec.strip()
    if not s or s.startswith((".", "/", "~")) or s.endswith("/") or s.count("/") > 1 or not _HUB_ID.match(s):
        return True
    return "/" in s and Path(s.split("/", 1)[0]).is_dir()


def hub_model_problem(repo_id: str) -> str | None:
    """None if the hub id ``repo_id`` can load: it is in the local Hugging Face cache, or (online) the hub
    has it; otherwise what is wrong, in one line starting with the id. Online, one request, no retries
    (``from_pretrained`` would retry for about a minute before failing)."""
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return None
    except ValueError:  # not a valid repo id (HFValidationError)
        return f"{repo_id!r}: no such folder, and not a valid Hugging Face hub id"
    if constants.HF_HUB_OFFLINE:
        return (f"{repo_id!r}: not a local folder, and the Hugging Face hub id could not be loaded (not in the Hugging Face cache "
                "and HF_HUB_OFFLINE=1); download it once where there is network, or pass a save_pretrained folder")
    return _ask_hub(repo_id)


@functools.lru_cache(maxsize=64)
def _ask_hub(repo_id: str) -> str | None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=10)
    except GatedRepoError:
        return None  # it exists; from_pretrained says what access it needs
    except RepositoryNotFoundError:
        return (f"{repo_id!r}: no such folder, and no such model on the Hugging Face hub (a private one needs "
                "`hf auth login`); pass a save_pretrained folder or a hub id")
    except Exception as e:  # no network, a proxy, a timeout: the load would fail the same way, after retries
        return (f"{repo_id!r}: no such folder, not in the Hugging Face cache, and the hub could not be reached ({_one_line(e)}); "
                "download it once where there is network, or pass a save_pretrained folder")
    return None


def load_pretrained(spec: str, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` from a ``save_pretrained`` folder or a Hugging Face hub id.

    A hub id goes through ``from_pretrained`` as transformers resolves it (the local
    Hugging Face cache first; with ``HF_HUB_OFFLINE=1`` only the cache). A LoRA
    checkpoint folder (``adapter_config.json``, as ``slca train`` saves with
    ``lora_r > 0``) loads its base model with the adapters applied (peft).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(spec).expanduser()
    local = p.exists()
    if local:
        if not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
            raise ValueError(f"model {spec!r}: not a Hugging Face model folder (no config.json or adapter_config.json)")
        _check_weights(p, spec)  # a weights file cut short (an interrupted copy or download): one line naming it
        if (p / "adapter_config.json").is_file() and not (p / "config.json").is_file():
            return _load_lora_checkpoint(p, spec, dtype)
        src = str(p.resolve())  # absolute: a LoRA checkpoint of this model records where its base is, from any folder
    elif looks_like_path(spec):
        raise ValueError(f"model {spec!r}: no such folder")
    else:
        problem = hub_model_problem(spec)
        if problem is not None:
            raise ValueError(f"model {problem}")
        src = spec
    try:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    except (OSError, ValueError, SafetensorError) as e:  # huggingface_hub's offline / not-found errors are OSError subclasses
        if local:
            raise ValueError(f"model {spec!r}: could not load the folder ({_one_line(e)})") from None
        from huggingface_hub import constants

        why = "not in the Hugging Face cache and HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else _one_line(e)
        raise ValueError(f"model {spec!r}: not a local folder, and the Hugging Face hub id could not be loaded ({why}); "
                         "download it once where there is network, or pass a save_pretrained folder") from None
    return model, tok


def lora_base(ckpt: str | Path) -> str:
    """Where the base model of the LoRA checkpoint folder ``ckpt`` is (``base_model_name_or_path`` of its
    ``adapter_config.json``): an absolute folder as recorded; a relative one (checkpoints written before
    slca recorded absolute paths) in the working folder or in a folder above the checkpoint (the folder
    its run was started from, usually); else a hub id the cache or the hub has. A base that is found
    nowhere is a one-line ValueError naming it and where it was looked for. A named model
    (:data:`slca.models.named.NAMED_MODELS`) is returned as its name: recorded as the base, or as the
    ``model`` of the run the checkpoint belongs to (checkpoints written before slca recorded the name).
    """
    ckpt = Path(ckpt)
    try:
        base = json.loads((ckpt / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"model {str(ckpt)!r}: unreadable adapter_config.json ({_one_line(e)})") from None
    if not isinstance(base, str) or not base.strip():
        raise ValueError(f"model {str(ckpt)!r}: its adapter_config.json names no base model (base_model_name_or_path)")
    if base in NAMED_MODELS:
        return base  # a named model (:func:`load_policy` records the name): loaded as that name loads
    trained_on = _run_model(ckpt)
    if trained_on in NAMED_MODELS:
        # a checkpoint of a run of a named model, written before the name was recorded: the adapter names the
        # folder under the name (for smollm2-toolworld, plain SmolLM2 without the stage-1 adapter), the run's
        # config.json the model it trained on
        return trained_on
    b = Path(base).expanduser()
    if b.is_absolute():
        where = [b]
    else:
        where = [Path.cwd() / b, *(d / b for d in ckpt.resolve().parents)]
    for cand in where:
        if (cand / "config.json").is_file():
            return str(cand.resolve())
    if not b.is_absolute() and not looks_like_path(base) and hub_model_problem(base) is None:
        return base  # a hub id
    looked = "" if b.is_absolute() else " (looked in the working folder and in each folder above the checkpoint)"
    raise ValueError(f"model {str(ckpt)!r}: a LoRA checkpoint of the base model {base!r}, which is not there{looked}; "
                     f"put the base model back, or set base_model_name_or_path in {str(ckpt / 'adapter_config.json')!r} to where it is now")


def _run_model(ckpt: Path) -> str | None:
    """The ``model`` of the run whose checkpoint ``ckpt`` is (``<run>/checkpoints/step-N``, ``<run>/config.json``), or None."""
    if ckpt.resolve().parent.name != "checkpoints":
        return None
    try:
        model = json.loads((ckpt.resolve().parent.parent / "config.json").read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None


def _check_weights(folder: Path, spec: str) -> None:
    """:func:`slca._fs.check_weights` of a model folder, its error prefixed with the model."""
    try:
        check_weights(folder)
    except ValueError as e:
        raise ValueError(f"model {spec!r}: {e}") from None


def _load_lora_checkpoint(p: Path, spec: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """A LoRA checkpoint folder: its base model (:func:`lora_base`) with the adapters loaded onto it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = lora_base(p)
    if base in NAMED_MODELS:
        problem = named_model_problem(base)
        if problem is not None:
            raise ValueError(f"model {spec!r}: a LoRA checkpoint of the named model {problem}")
    elif Path(base).is_dir():
        _check_weights(Path(base), spec)
    try:
        import peft  # noqa: F401
    except ImportError:
        raise ValueError(f"model {spec!r}: a LoRA checkpoint; loading it needs peft, which is not installed (pip install \"slca[peft]\")") from None
    has_tok = any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    try:
        if base in NAMED_MODELS:
            model, named_tok = load_named(base)
            model = model.to(dtype)
            tok = AutoTokenizer.from_pretrained(str(p)) if has_tok else named_tok
        else:
            tok = AutoTokenizer.from_pretrained(str(p) if has_tok else base)
            model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
        with _peft_quiet():
            model.load_adapter(str(p))
    except (OSError, ValueError, SafetensorError) as e:
        raise ValueError(f"model {spec!r}: could not load the LoRA checkpoint on its base model {base!r} ({_one_line(e)})") from None
    except RuntimeError:  # peft: the adapter's tensors do not fit the base's layers
        raise ValueError(f"model {spec!r}: could not load the LoRA checkpoint on its base model {base!r} (the adapter's shapes do not "
                         "fit the base model's layers: it was trained on another model)") from None
    return model, tok


@contextlib.contextmanager
def _peft_quiet() -> Iterator[None]:
    """peft reads transformers' deprecated ``is_gradient_checkpointing``: a FutureWarning in every LoRA
    run that is neither slca's nor the user's to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def apply_lora(model: torch.nn.Module, r: int, alpha: float, dropout: float = 0.0, target_modules: list[str] | None = None) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (peft): only the adapters train, the base is frozen.

    ``target_modules`` None or empty: peft's default for the architecture (for
    Qwen2 / Llama: ``q_proj``, ``v_proj``). LoRA: Hu et al. 2021, arXiv 2106.09685.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ValueError("lora_r: > 0 needs peft, which is not installed (pip install \"slca[peft]\")") from None
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules or []) or None, task_type="CAUSAL_LM")
    try:
        with _peft_quiet():
            return get_peft_model(model, cfg)
    except ValueError as e:
        raise ValueError(f"lora_target_modules: {list(target_modules or [])}: {_one_line(e)}") from None


def prepare_policy(
    model: torch.nn.Module,
    tok: Any,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    chat_template: str = "",
    lora_r: int = 0,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    lora_target_modules: list[str] | None = None,
    what: str = "model",
    template_fix: str = "set chat_template (a .jinja file or inline)",
) -> tuple[torch.nn.Module, Any]:
    """Make a loaded ``(model, tokenizer)`` ready to train: ``chat_template`` (a path or
    inline Jinja) replaces the tokenizer's; the model is cast to ``dtype``, wrapped with
    LoRA adapters when ``lora_r > 0`` (in place: peft injects the adapter layers into
    ``model``) and moved to ``device``. A tokenizer left without a chat template is
    refused: ``what`` names the model in the message, ``template_fix`` (when not empty)
    says how to give it one."""
    dev, dt = check_device(device), check_dtype(dtype)
    template = resolve_chat_template(chat_template)
    if template is not None:
        tok.chat_template = template
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{what}: its tokenizer has no chat template" + (f"; {template_fix}" if template_fix else ""))
    model = model.to(dt)
    if lora_r > 0 and not hasattr(model, "peft_config"):
        model = apply_lora(model, lora_r, lora_alpha, lora_dropout, lora_target_modules)
    return model.to(dev), tok


def load_policy(spec: str, **options: Any) -> tuple[torch.nn.Module, Any]:
    """The policy and its tokenizer: ``spec`` is a named model (``'default'``, the embedded tiny
    model; ``'smollm2'``, SmolLM2-135M-Instruct: :data:`slca.models.named.NAMED_MODELS`),
    a model folder or a hub id; ``options`` as for :func:`prepare_policy` (checked
    before anything is loaded)."""
    check_device(options.get("device", "cpu"))
    dt = check_dtype(options.get("dtype", "float32"))
    resolve_chat_template(options.get("chat_template", ""))
    if spec in NAMED_MODELS:
        problem = named_model_problem(spec)
        if problem is not None:
            raise ValueError(f"model {problem}")
        model, tok = load_named(spec)
    else:
        model, tok = load_pretrained(spec, dt)
    model, tok = prepare_policy(model, tok, what=f"model {spec!r}", **options)
    if spec in NAMED_MODELS:
        # a LoRA checkpoint records the name as its base, so it loads on this very model anywhere: peft would record
        # the folder the weights came from (for smollm2-toolworld, plain SmolLM2: the stage-1 adapter is merged in memory)
        for lora in getattr(model, "peft_config", {}).values():
            lora.base_model_name_or_path = spec
    return model, tok


def policy_options(cfg: Any) -> dict[str, Any]:
    """The :func:`prepare_policy` options a :class:`~slca.training.config.TrainConfig` sets."""
    return {k: getattr(cfg, k) for k in ("device", "dtype", "chat_template", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")}
