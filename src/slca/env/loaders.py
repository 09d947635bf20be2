"""Dataset loaders: Toucan rows, the paper's verl rows and slca's own rows -> :class:`Task`.

Sources: a ``.jsonl``, ``.json`` (a list of rows) or ``.parquet`` file, a folder
written by ``datasets.Dataset.save_to_disk``, a ``datasets.Dataset`` object, or
a list of row dicts. JSON-encoded string columns are decoded.

Row formats:

* ``toucan`` -- Toucan-1.5M as published (Kimi-K2, OSS and Qwen3 configs; every
  column a string): ``uuid``, ``subset_name`` (``single-turn-original``,
  ``single-turn-diversify``, ``irrelevant``, ``multi-turn``), ``messages``
  (roles system / user / assistant / function; a call is an assistant message
  with ``function_call: {name, arguments: "<json>"}``, parallel calls are calls
  with no function result between them; assistant messages may carry
  ``reasoning_content``; results are ``role: "function"`` messages with a
  ``name``), ``available_tools`` (OpenAI tool schemas, often server-prefixed
  names such as ``exa-search-web_search_exa``), ``target_tools`` (a
  comma-separated string of bare tool names), ``question``, the two quality
  assessments and ``metadata`` (``mcp_servers[].remote_server_response.tools[]``
  with ``input_schema``). The prompt is the system (prose only; a
  ``<|im_system|>tool_declare<|im_middle|>...`` declaration is dropped, the chat
  template declares the tools) and user messages before the first assistant
  message; the gold is the calls made for that first request; later user turns
  of a multi-turn row are kept, checked, in ``meta["followups"]``.
* ``verl`` -- the paper's verl-native rows: ``prompt`` (chat list), ``tools``
  (OpenAI tool schemas), ``reward_model.ground_truth.gold_tool_calls`` (a list
  of steps, each a list of ``{name, arguments}``), optional ``answer_facts``
  there and ``extra_info`` (``uuid``/``index``, ``kind``).
* ``paper`` -- the paper's released ``rl`` / ``eval`` rows
  (``AnonymousRepository/toucan-toolcall-slca``; ``format="auto"`` picks it by
  ``data_source`` in :data:`PAPER_SOURCES`): verl rows whose
  ``reward_model.ground_truth`` holds ``question_content``, ``allowed_tools``
  (each an offered tool; every gold call must be one), ``tool_schemas``
  (used when the ``tools`` column is absent; both: the same tool names) and
  ``gold_tool_calls`` (a JSON string of per-step lists of parallel calls), and
  whose ``extra_info`` holds ``original_idx``, ``source``, ``parallel_type``,
  ``has_history`` and, for decomposed multi-turn rows, ``turn_index`` /
  ``split_position`` (all kept, typed, in ``meta``; ``source`` also as
  ``meta["subset"]``). The id is ``<data_source>-<original_idx>`` (plus
  ``-t<turn_index>`` / ``-s<split_position>``).

  The rows the authors' converters write (``data/convert_toucan_to_verl.py``
  and ``_v2.py`` of ``SLCA-GRPO/SLCA-GRPO``; ``data_source`` in
  :data:`CONVERTER_SOURCES`, e.g. their ``data/samples`` RL preview) are
  ``paper`` rows too: ``ground_truth.subset_name`` (``tool_call`` /
  ``irrelevant``) is kept as ``meta["subset_name"]`` (and as ``meta["subset"]``
  when ``extra_info.source`` is absent), ``extra_info.original_turn_index`` as
  ``meta["original_turn_index"]``. A system message that is only the
  converter's tool declaration (v1: ``You have access to the following
  tools: ... <tools>...</tools> ...``, exactly as it writes it for the row's
  tools) is dropped, and a trailing ``# Tool Definitions <tools>...</tools>``
  (v2) is cut from the system text (``meta["tool_declare_dropped"]``): the chat
  template declares the tools, and would otherwise declare them twice.

  Gold, as the authors' reward reads it (``rl/slca_grpo/reward_fn.py``,
  ``_normalize_gold_tool_calls_nested``): a list whose first item is a list is
  a list of steps; any other list is ONE step of parallel calls (v1 wrote a
  flat list of bare tool names: ``["a", "b"]`` is one step of two calls). An
  item is a ``{name, arguments}`` object or a bare tool name. (Their reward
  drops an item or step of another type, and an empty step; slca refuses the row,
  naming it.)

* ``slca`` -- :func:`save_tasks` output: ``id``, ``messages``, ``tools``, ``gold``
  and optional ``kind``, ``answer_facts``, ``meta``.

In ``slca`` rows and in a verl row's ``extra_info.meta`` the meta object also
holds the task's ``reference_answer`` and ``refusal`` flag (where files have
always kept them): loading lifts them into the :class:`Task` fields of those
names, writing (:func:`row_meta`) puts them back.

Name-only gold calls. A bare tool name is a call whose arguments the row does
not give. It becomes ``ToolCall(name, {})``, its name is checked (an offered
tool; for ``paper`` rows one of ``allowed_tools``) but not its arguments against
the schema (they are unknown, not empty), and its ``[step, call]`` index is
listed in ``meta["name_only_gold"]``. Scoring: the authors' reward
(``reward="paper"``, :mod:`slca.rewards.paper`) scores such a call by name only
(tool-name F1 and the first step's size; its key / value match skips gold calls
without arguments, their ``gold_with_args`` filter), exactly as theirs does.
slca's own tiers (:mod:`slca.rewards.execution`) cannot tell unknown arguments
from none: the execution tier's ``arg_match`` and the in-domain ``arg_match``,
``process`` and ``success`` compare the rollout's call with ``{}``, so a call
that passes any argument loses there (its name still counts in ``name_f1``);
score name-only tasks with ``reward="paper"``.
:func:`task_to_row` writes such a call back as its bare name. In ``verl`` and
``slca`` rows a bare name is read inside a step list (``[["a", "b"]]``); a bare
name where a step is expected is refused (a flat list of names is one step to
the authors' reward, a chain to slca's bare-call rule: the row must say which).

Every row is checked at load time; a bad row raises :class:`RowError` (a
``ValueError``) naming the source, the row, the field and the problem. Nothing
is fetched and no file is read for a schema's ``$ref`` (:mod:`slca.env.schema`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from slca.chat.encoding import ChatRenderer
from slca.env.rows.fields import BadValue, RowError, json_value, parse_target_tools
from slca.env.rows.paper import CONVERTER_SOURCES, PAPER_SOURCES, from_paper
from slca.env.rows.slca import from_slca
from slca.env.rows.toucan import TOUCAN_SUBSETS, from_toucan
from slca.env.rows.verl import from_verl
from slca.env.schema import MAX_DEPTH
from slca.types import Task

__all__ = [
    "CONVERTER_SOURCES",
    "FORMATS",
    "PAPER_SOURCES",
    "RowError",
    "TOUCAN_SUBSETS",
    "detect_format",
    "fit_prompts",
    "prompt_lengths",
    "load_tasks",
    "read_rows",
    "parse_target_tools",
    "row_meta",
    "save_tasks",
    "split_tasks",
    "task_from_row",
    "task_to_row",
]

log = logging.getLogger("slca.env")
T = TypeVar("T")

FORMATS = ("toucan", "verl", "paper", "slca")


def row_meta(task: Task) -> dict[str, Any]:
    """The meta object a task file stores for ``task``: ``task.meta`` with its reference answer (when it has one)
    and refusal flag, as files have always held them (``task_from_row`` lifts them back into the fields)."""
    out = dict(task.meta)
    if task.reference_answer is not None:
        out["reference_answer"] = task.reference_answer
    out["refusal"] = task.refusal
    return out


_BUILDERS = {"toucan": from_toucan, "verl": from_verl, "paper": from_paper, "slca": from_slca}


def detect_format(row: dict[str, Any]) -> str:
    """Which of :data:`FORMATS` a row is, from its keys."""
    if "reward_model" in row and "prompt" in row:
        return "paper" if row.get("data_source") in PAPER_SOURCES + CONVERTER_SOURCES else "verl"
    if "gold" in row and "messages" in row:
        return "slca"
    if "messages" in row and any(k in row for k in ("available_tools", "target_tools", "subset_name")):
        return "toucan"
    raise ValueError(f"cannot tell the row's format from its keys {sorted(row)}: a slca row has 'messages' and 'gold', a verl row "
                     "'prompt' and 'reward_model', a Toucan row 'messages' and one of 'available_tools', 'target_tools', 'subset_name' "
                     "(docs/environment.md, Loaders)")


def checked_row_id(row: Any, where: str, index: int) -> str | None:
    """The row's ``uuid`` or ``id`` for error messages (first 60 characters; None without one); RowError unless
    ``row`` is an object. Shared by the task and SFT readers."""
    if not isinstance(row, dict):
        raise RowError(where, index, "", f"a row must be an object, got {type(row).__name__}")
    rid = row.get("uuid") or row.get("id")
    return str(rid)[:60] if isinstance(rid, (str, int)) else None


def task_from_row(row: dict[str, Any], format: str = "auto", *, where: str = "input", index: int = 0) -> Task:
    """One dataset row as a checked :class:`Task` (tool schemas valid, gold calls valid against them).

    Raises:
        RowError: naming ``where`` (the source), row ``index``, the field and the problem.
    """
    if format != "auto" and format not in _BUILDERS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    rid = checked_row_id(row, where, index)
    try:
        fmt = detect_format(row) if format == "auto" else format
    except ValueError as e:
        raise RowError(where, index, "", str(e), rid) from None
    try:
        return _BUILDERS[fmt](row, index)
    except BadValue as e:
        raise RowError(where, index, e.field, e.problem, rid) from None
    except RecursionError:  # belt and braces: depth is checked, but a builder must never leak this
        raise RowError(where, index, "", f"nested deeper than {MAX_DEPTH} levels", rid) from None


# ---------------------------------------------------------------- sources


def _is_dataset(obj: Any) -> bool:
    return type(obj).__module__.startswith("datasets.")


def _dataset_rows(ds: Any, name: str, split: str | None) -> tuple[str, Iterator[Any]]:
    """Rows of a ``datasets.Dataset`` (a ``DatasetDict`` needs ``split`` unless it has one split)."""
    if hasattr(ds, "keys") and not hasattr(ds, "features"):  # a DatasetDict
        splits = list(ds.keys())
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in splits:
            raise ValueError(f"{name}: a dataset with splits {splits}; pass split= one of them")
        ds, name = ds[split], f"{name}[{split}]"
    elif split is not None:
        raise ValueError(f"{name}: split={split!r} given, but this dataset has no splits")
    return name, iter(ds)


def _disk_dataset(path: Path, split: str | None) -> tuple[str, Iterator[Any]]:
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{path} is a Hugging Face datasets folder; reading it needs the 'datasets' package "
                         "(pip install 'slca[trl]' or pip install datasets)") from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - any failure to open the folder is the user's data problem, named here
        raise ValueError(f"{path}: cannot open it with datasets.load_from_disk: {type(e).__name__}: {e}") from None
    return _dataset_rows(ds, path.name, split)


def _file_rows(path: Path) -> Iterator[Any]:
    """Rows of a file; a line that is not JSON yields a RowError in its place (so errors='skip' can skip it)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise ValueError(f"{path}: not a readable parquet file: {e}") from None
        for batch in pf.iter_batches(batch_size=512):  # Toucan's shards are GBs: never the whole table at once
            yield from batch.to_pylist()
    elif suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            i = 0
            for n, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    yield json_value(line)
                except ValueError as e:
                    yield RowError(path.name, i, "", f"line {n + 1} is {e}")
                i += 1
    elif suffix == ".json":
        try:
            data = json_value(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of rows, got {type(data).__name__}")
        yield from data
    else:
        raise ValueError(f"{path}: a dataset file must end in .jsonl, .json or .parquet (or be a datasets save_to_disk folder)")


def _rows(source: Any, split: str | None) -> tuple[str, Iterable[Any]]:
    if _is_dataset(source):
        return _dataset_rows(source, getattr(getattr(source, "info", None), "dataset_name", None) or "dataset", split)
    if isinstance(source, (list, tuple)):
        return "rows", source
    if not isinstance(source, (str, Path)):
        raise ValueError(f"load_tasks: give a file, a datasets folder, a datasets.Dataset or a list of rows, got {type(source).__name__}")
    path = Path(source)
    if path.is_dir():
        if any((path / f).exists() for f in ("dataset_dict.json", "state.json", "dataset_info.json")):
            return _disk_dataset(path, split)
        raise ValueError(f"{path} is a folder but not a datasets save_to_disk folder (no state.json / dataset_dict.json)")
    if not path.is_file():
        raise ValueError(f"no dataset file at {path}")
    return path.name, _file_rows(path)


def load_tasks(source: Any, format: str = "auto", *, split: str | None = None, errors: str = "raise") -> list[Task]:
    """Load tasks from a file, a ``save_to_disk`` folder, a ``datasets.Dataset`` or a list of rows.

    Args:
        source: a ``.jsonl`` / ``.json`` / ``.parquet`` file, a folder written by
            ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a
            ``datasets.Dataset`` / ``DatasetDict``, or a list of row dicts.
        format: ``"auto"`` (detected per row from its keys) or one of :data:`FORMATS`.
        split: the split of a ``DatasetDict`` (not needed when it has one).
        errors: ``"raise"`` (the first bad row raises) or ``"skip"`` (each bad
            row is logged as a warning on the ``slca.env`` logger, with the same
            message, and left out; the count is logged at the end).

    Raises:
        RowError: naming the source, row and field, for a row that cannot become a valid Task.
        ValueError: for a source that cannot be read, or one that holds no (valid) rows.
    """
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    return read_rows(source, lambda row, where, i: task_from_row(row, format, where=where, index=i), split=split, errors=errors)


def read_rows(source: Any, build: Callable[[Any, str, int], T], *, split: str | None = None, errors: str = "raise") -> list[T]:
    """``build(row, source_name, index)`` over every row of ``source`` (as :func:`load_tasks` reads sources).

    ``build`` raises :class:`RowError` for a bad row: ``errors="raise"`` lets the
    first one through, ``"skip"`` logs each (warning, ``slca.env``) and the count.
    Raises ValueError for a source that holds no rows, or no valid row.
    """
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    name, rows = _rows(source, split)
    out, skipped, n = [], 0, 0
    for i, row in enumerate(rows):
        n += 1
        try:
            if isinstance(row, RowError):
                raise row
            out.append(build(row, name, i))
        except RowError as e:
            if errors == "raise":
                raise
            skipped += 1
            log.warning("skipping %s", e)
    if skipped:
        log.warning("%s: skipped %d of %d rows (errors='skip')", name, skipped, n)
    if not out:
        raise ValueError(f"{name}: holds no rows" if not n else f"{name}: none of its {n} rows is valid")
    return out


# ---------------------------------------------------------------- held-out split, prompt budget


def split_tasks(tasks: list[Task], eval_fraction: float, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """``(train, eval)``: a held-out share of ``tasks`` for evaluation during training.

    Each task's place is a hash of ``(seed, task id, its position)``, so the split
    is the same on every run and machine; the ``round(eval_fraction * n)``
    tasks with the smallest hashes (at least one) are held out, the rest keep
    their order. Both sides must be non-empty.
    """
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    if len(tasks) < 2:
        raise ValueError(f"cannot hold out a share of {len(tasks)} task(s): need at least 2")
    k = min(len(tasks) - 1, max(1, round(eval_fraction * len(tasks))))
    key = [hashlib.sha256(f"{seed}\x00{t.id}\x00{i}".encode()).hexdigest() for i, t in enumerate(tasks)]
    held = set(sorted(range(len(tasks)), key=lambda i: key[i])[:k])
    return [t for i, t in enumerate(tasks) if i not in held], [t for i, t in enumerate(tasks) if i in held]


def prompt_lengths(tasks: list[Task], tokenizer: Any, *, chat_template: str | None = None) -> list[int]:
    """Tokens of each task's prompt as a rollout renders it (chat template, tools, generation prompt)."""
    texts = [ChatRenderer(tokenizer, t.tools or None, chat_template=chat_template).render(t.messages, add_generation_prompt=True)
             for t in tasks]
    out: list[int] = []
    for i in range(0, len(texts), 256):  # one batched call per chunk: a fast tokenizer encodes a batch in parallel
        out += [len(ids) for ids in tokenizer(texts[i:i + 256], add_special_tokens=False)["input_ids"]]
    return out


def fit_prompts(tasks: list[Task], tokenizer: Any, max_total_tokens: int, *, chat_template: str | None = None,
                what: str = "tasks") -> list[Task]:
    """The tasks whose prompt leaves room to generate under ``max_total_tokens``.

    A longer prompt would end its rollout before a single token is generated
    (an empty rollout that trains on nothing), so such tasks are left out with a
    warning on the ``slca.env`` logger naming how many, the longest and a few
    ids. Raises ValueError when none fits.
    """
    lengths = prompt_lengths(tasks, tokenizer, chat_template=chat_template)
    keep = [t for t, n in zip(tasks, lengths) if n < max_total_tokens]
    long = [(t.id, n) for t, n in zip(tasks, lengths) if n >= max_total_tokens]
    if long:
        msg = (f"{len(long)} of {len(tasks)} {what} have a prompt of max_total_tokens={max_total_tokens} tokens or more "
               f"(longest {max(n for _, n in long)}; e.g. {', '.join(i for i, _ in long[:5])})")
        if not keep:
            raise ValueError(f"{msg}: none is left; raise max_total_tokens")
        log.warning("%s: left out (raise max_total_tokens to keep them)", msg)
    return keep


# ---------------------------------------------------------------- writing


def task_to_row(task: Task, format: str = "slca") -> dict[str, Any]:
    """A Task as a row of ``format`` (``slca`` or ``verl``); nested values are JSON strings (Parquet-friendly).

    A name-only gold call (``meta["name_only_gold"]``, its arguments ``{}``) is written as its bare name, so that
    reading the row back does not check unknown arguments against the schema."""
    name_only = {tuple(p) for p in task.meta.get("name_only_gold") or () if isinstance(p, (list, tuple))}
    gold = [[c.name if (s, i) in name_only and not c.arguments else {"name": c.name, "arguments": c.arguments}
             for i, c in enumerate(step)] for s, step in enumerate(task.gold)]
    if format == "slca":
        return {"id": task.id, "messages": json.dumps(task.messages), "tools": json.dumps(task.tools), "gold": json.dumps(gold),
                "kind": task.kind, "answer_facts": json.dumps(task.answer_facts), "meta": json.dumps(row_meta(task), default=str)}
    if format == "verl":
        return {
            "data_source": task.meta.get("suite", "slca"),
            "prompt": task.messages,
            "tools": json.dumps(task.tools),
            "reward_model": {"style": "rule", "ground_truth": json.dumps({"gold_tool_calls": gold, "answer_facts": task.answer_facts})},
            "extra_info": {"uuid": task.id, "kind": task.kind},
        }
    raise ValueError(f"format must be 'slca' or 'verl', got {format!r}")


def save_tasks(tasks: Iterable[Task], path: str | Path, format: str = "slca") -> Path:
    """Write tasks as .jsonl or .parquet rows of ``format`` (readable by :func:`load_tasks`)."""
    path = Path(path)
    rows = [task_to_row(t, format) for t in tasks]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        raise ValueError(f"path must end in .jsonl or .parquet, got {path.name!r}")
    return path
