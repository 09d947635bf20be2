"""The estimator registry: estimators by name, their inputs and options, and the plugin loader.

An estimator is registered as a complete :class:`EstimatorSpec` (its function, the
optional inputs it reads, its options object); the trainer and every integration
dispatch through :func:`compute_advantages` / :func:`get_estimator`. User estimators
are found by import path (``"package.module:function"``) or by a ``slca.estimators``
entry point (:func:`resolve_estimator`). The built-in ``grpo``, ``slca`` and ``gdpo``
are registered here, on the math of :mod:`slca.core.advantages`.

Shapes: ``B`` rollouts (prompts x G samples), ``T`` response tokens.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass, replace
from importlib.metadata import entry_points
from typing import Annotated, Any, Literal, Protocol

import torch

from slca._checks import as_1d, as_2d
from slca._fields import check_value, coerce, did_you_mean, ge, gt, hints, within
from slca.core.advantages import (
    EMPTY_SUMMARY_DEFAULT,
    EMPTY_SUMMARY_MODES,
    EMPTY_TOOL_DEFAULT,
    EMPTY_TOOL_MODES,
    EPS,
    SCALES,
    gdpo_advantages,
    grpo_advantages,
    slca_advantages,
)

__all__ = [
    "AdvantageInputs",
    "Estimator",
    "EstimatorSpec",
    "InputSpec",
    "GroupOptions",
    "SLCAOptions",
    "option",
    "option_values",
    "ge",
    "gt",
    "within",
    "register_estimator",
    "register_input",
    "get_estimator",
    "get_input",
    "list_estimators",
    "resolve_estimator",
    "ENTRY_POINT_GROUP",
    "compute_advantages",
    "fill_inputs",
]



@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may read, for one batch.

    Attributes:
        tool_rewards: (B,) execution-tier rewards.
        summary_rewards: (B,) summary-tier rewards.
        group_ids: (B,) group ids (tensor or sequence of hashables).
        model_mask: (B, T) 0/1 policy tokens.
        tool_mask: (B, T) 0/1 execution segment.
        summary_mask: (B, T) 0/1 summary segment.
        reward_weights: weights of (tool, summary) in the single scalar reward
            that trajectory-level estimators (``grpo``) use.
        tool_signatures: length-B sequence of hashables (or None), the tool
            outcome of each rollout (``slca_cond``; see
            :func:`slca.rewards.turns.tool_signature`).
        turn_rewards: (B, K) per-tool-turn rewards, NaN for a missing turn
            (``slca_turn``; see :func:`slca.rewards.turns.turn_scores`).
        turn_index: (B, T) long tool-turn index of each tool token, -1 elsewhere
            (``slca_turn``); None: derived from ``model_mask`` and ``tool_mask``.
        span_labels: (B, T) integer span label of each response token
            (:data:`slca.core.segments.SPAN_TEXT` / ``SPAN_THINK`` / ``SPAN_CALL``, 0 off
            policy tokens; ``slca_think``), computed by the host from the token ids
            (:func:`slca.chat.spans.span_labels`); None when not computed.
        extra: inputs beyond these fields, by name (a new estimator's new
            input, see :class:`InputSpec`).

    An estimator lists the optional inputs it reads in its spec's ``needs``
    (:class:`EstimatorSpec`), so callers fill them only when needed
    (:func:`fill_inputs`).

    One input contract for every estimator: rewards and masks may be given as
    tensors, numpy arrays or (nested) lists; they are converted here, once, so
    every estimator reads tensors (rewards: 1-D float; masks, ``turn_rewards``,
    ``turn_index``, ``span_labels``: 2-D). ``B = 0`` and ``T = 0`` are valid shapes.
    """

    tool_rewards: torch.Tensor
    summary_rewards: torch.Tensor
    group_ids: Any
    model_mask: torch.Tensor
    tool_mask: torch.Tensor
    summary_mask: torch.Tensor
    reward_weights: tuple[float, float] = (1.0, 1.0)
    tool_signatures: Sequence[Hashable] | None = None
    turn_rewards: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None
    span_labels: torch.Tensor | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tool_rewards", "summary_rewards"):
            object.__setattr__(self, name, as_1d(name, getattr(self, name)))
        for name in ("model_mask", "tool_mask", "summary_mask", "turn_rewards", "turn_index", "span_labels"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_2d(name, value))

    @property
    def total_rewards(self) -> torch.Tensor:
        """(B,) ``w_tool * r_tool + w_sum * r_sum`` (NaN if either is NaN)."""
        wt, ws = self.reward_weights
        return wt * self.tool_rewards.float() + ws * self.summary_rewards.float()

    def get(self, name: str) -> Any:
        """The input called ``name``: a field, else an entry of :attr:`extra` (None when absent)."""
        if name in _FIELDS:
            return getattr(self, name)
        return self.extra.get(name)

    def with_inputs(self, values: Mapping[str, Any]) -> "AdvantageInputs":
        """A copy with these inputs set: fields by name, any other name into :attr:`extra`."""
        fields_ = {k: v for k, v in values.items() if k in _FIELDS and k != "extra"}
        extra = {k: v for k, v in values.items() if k not in _FIELDS}
        return replace(self, **fields_, extra={**self.extra, **extra}) if (fields_ or extra) else self


_FIELDS = frozenset(f.name for f in fields(AdvantageInputs))


def option(default: Any, help: str) -> Any:
    """A field of an estimator's options object: its default and one line of help (docs, errors, ``--help-config``)."""
    return field(default=default, metadata={"help": help})


Scale = Literal[SCALES]
Eps = Annotated[float, ge(0)]
EmptyTool = Literal[EMPTY_TOOL_MODES]
EmptySummary = Literal[EMPTY_SUMMARY_MODES]
NonNegative = Annotated[float, ge(0)]


@dataclass(frozen=True)
class GroupOptions:
    """Options of the group normalisation every built-in estimator shares (:func:`group_normalize`)."""

    scale: Scale = option("group", "Advantage normalisation: 'group' (GRPO), 'batch' (TRL scale_rewards='batch'), "
                          "'none' (Dr. GRPO: centre only).")
    eps: Eps = option(EPS, "Added to the std in the normalisation.")


@dataclass(frozen=True)
class SLCAOptions(GroupOptions):
    """Options of :func:`slca_advantages`: the normalisation, and rollouts that lack a segment."""

    empty_tool: EmptyTool = option(EMPTY_TOOL_DEFAULT, "SLCA: rollouts with no tool segment ('response', 'include', "
                                   "'exclude', 'both'; see slca_advantages and docs/beyond.md, \"Segments that are missing\").")
    empty_summary: EmptySummary = option(EMPTY_SUMMARY_DEFAULT, "SLCA: rollouts with no summary segment, i.e. no final "
                                         "answer ('drop': the summary advantage is dropped; 'last_turn': added to the last "
                                         "tool turn's tokens; see slca_advantages and docs/beyond.md, \"Segments that are missing\").")


def option_values(options: Any) -> dict[str, Any]:
    """An options object as keyword arguments (shallow: values as they are)."""
    return {f.name: getattr(options, f.name) for f in fields(options)}


def unknown_option(estimator: str, name: str, declared: Iterable[str], host: Mapping[str, str] | None = None) -> str:
    """The one-line refusal of an option ``estimator`` does not take: the closest name the caller may set, then all of them.

    ``declared``: the estimator's options; ``host``: option -> the host setting it comes from
    (:meth:`EstimatorSpec.host_options`), left out of the names offered and named after them.
    """
    host = host or {}
    accepted = sorted(set(declared) - set(host))
    msg = f"estimator {estimator!r} has no option {name!r}{did_you_mean(name, accepted)}; its options: {accepted}"
    elsewhere = [host[k] for k in sorted(set(declared) & set(host))]
    return msg + (f"; the others come from {', '.join(elsewhere)}" if elsewhere else "")


def check_options(cls: type, estimator: str, given: Mapping[str, Any]) -> Any:
    """``cls(**given)`` (an estimator's options object), every value checked against its field.

    Raises:
        ValueError: naming the estimator and the option: an option ``cls`` does not
            declare (with the closest one it does), a value of the wrong type, outside its range or its choices.
    """
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(unknown_option(estimator, unknown[0], known))
    types_ = hints(cls)
    out = {}
    for k, v in given.items():
        out[k], problem = check_value(v, types_[k])
        if problem:
            raise ValueError(f"estimator {estimator!r}: option {k!r} {problem}")
    return cls(**out)


def parse_options(cls: type, estimator: str, raw: Mapping[str, str], host: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"turn_lambda": "0.5"}`` (strings from the command line or the environment) as typed values.

    Raises ValueError naming the estimator and the option (an unknown option, a value that does not parse);
    the options it offers leave out ``host``'s, those the host sets from its own settings (:func:`unknown_option`).
    """
    known = hints(cls)
    out = {}
    for k, v in raw.items():
        if k not in known:
            raise ValueError(unknown_option(estimator, k, known, host))
        try:
            out[k] = coerce(v, known[k]) if isinstance(v, str) else v
        except ValueError as e:
            raise ValueError(f"estimator {estimator!r}: option {k!r} {e}") from None
    return out


def with_deprecated(spec: EstimatorSpec, given: Mapping[str, Any], old: Mapping[str, Any], where: Mapping[str, str],
                    new: str) -> dict[str, Any]:
    """``given`` (the estimator options) plus ``old``: options a host still reads from a deprecated setting of its own.

    ``old``: option -> value (``empty_tool``, ``empty_summary``: options of :class:`SLCAOptions`); ``where[option]``
    names the deprecated setting and ``new`` the setting the options travel in now (the host's estimator options),
    for the errors. A value is checked as :class:`SLCAOptions` checks it whatever the estimator, and added only
    where ``spec`` declares the option: the deprecated settings were refused when wrong and ignored by ``grpo``,
    and still are.

    Raises:
        ValueError: one line, for a bad value, or an option given both ways with different values.
    """
    out = dict(given)
    for k, v in old.items():
        try:
            check_options(SLCAOptions, "slca", {k: v})
        except ValueError as e:
            raise ValueError(f"{where[k]}={v!r}: {e}") from None
        if k in out and out[k] != v:
            raise ValueError(f"{where[k]}={v!r} and {new} {k}={out[k]!r} disagree: set {k} in {new} only "
                             f"({where[k]} is deprecated)")
        if k in spec.option_names:
            out[k] = v
    return out


def split_assignments(items: Sequence[str], what: str) -> dict[str, str]:
    """``["name=value", ...]`` (``--set estimator_options=a=1,b=x``, ``SLCA_ESTIMATOR_OPTIONS``) as a mapping."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not name:
            raise ValueError(f"{what}: {item!r} must look like option=value")
        if name in out:
            raise ValueError(f"{what}: option {name!r} is given twice")
        out[name] = value
    return out


@dataclass(frozen=True)
class InputSpec:
    """An optional estimator input: its name, what it is, how to compute it from rollouts.

    Attributes:
        name: an :class:`AdvantageInputs` field, or any other name (then it
            travels in :attr:`AdvantageInputs.extra`).
        doc: what it holds (shape, meaning); quoted when it is missing.
        compute: ``compute(trajectories) -> value`` for the B rollouts of a
            batch, or a ``"module:function"`` path imported on first use (so this
            module need not import the reward code). None: callers must pass it.
    """

    name: str
    doc: str
    compute: Callable[[Sequence[Any]], Any] | str | None = None

    def from_trajectories(self, trajectories: Sequence[Any]) -> Any:
        f = self.compute
        if f is None:
            raise ValueError(f"input {self.name!r} has no compute function: pass it in AdvantageInputs")
        if isinstance(f, str):
            mod, _, attr = f.partition(":")
            f = getattr(importlib.import_module(mod), attr)
        return f(trajectories)


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator, complete: its function, the inputs it needs, its options object.

    ``options`` is a frozen dataclass (e.g. :class:`SLCAOptions`): each field one
    option with its type (checks and choices on it, see :mod:`slca._fields`),
    default and help. ``fn(inputs, **options) -> (B, T)`` is called with every
    option, the defaults filled in; an option it does not declare, or a bad
    value, is refused with an error naming the estimator and the option.
    ``needs`` are names of optional inputs (:class:`InputSpec`) that must not be
    None. ``reference`` marks the estimators every run records on its sample
    groups and ``slca compare`` runs by default. ``trajectory`` marks an
    estimator that reads one scalar per rollout (``AdvantageInputs.total_rewards``)
    instead of the two tiers, as ``grpo`` does (the TRL trainer then sums the
    tiers as TRL does).
    """

    name: str
    fn: Callable[..., torch.Tensor]
    needs: tuple[str, ...] = ()
    options: type = field(default_factory=lambda: _NO_OPTIONS)
    doc: str = ""
    reference: bool = False
    trajectory: bool = False

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.options))

    def defaults(self) -> dict[str, Any]:
        return option_values(self.options())

    def make_options(self, given: Mapping[str, Any] | None = None) -> Any:
        """The options object: ``given`` (checked) over the defaults. Unknown names or bad values raise ValueError."""
        return check_options(self.options, self.name, given or {})

    def pick(self, source: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of ``source`` (e.g. a host's settings) that are options of this estimator."""
        names = set(self.option_names)
        return {k: v for k, v in source.items() if k in names}

    def host_options(self, host: Mapping[str, Any], given: Mapping[str, Any] | None, where: Mapping[str, str]) -> Any:
        """The options object a host (the trainer, TRL, verl) runs this estimator with, validated.

        ``host``: the values the host's own settings give (``scale``, ``eps``, ...); those
        this estimator does not declare are left out. ``given``: the user's estimator
        options, which may not set an option the host gives (``where[name]`` names the
        setting that does, for the error).
        """
        given = dict(given or {})
        clash = sorted(set(given) & set(where))
        if clash:
            raise ValueError(f"estimator_options may not set {clash[0]!r}: it comes from {where[clash[0]]}")
        unknown = sorted(set(given) - set(self.option_names))
        if unknown:  # listing only what the user may set here
            raise ValueError(unknown_option(self.name, unknown[0], self.option_names, where))
        return self.make_options({**self.pick(host), **given})

    def check_inputs(self, inputs: AdvantageInputs) -> None:
        for n in self.needs:
            if inputs.get(n) is None:
                where = f"AdvantageInputs.{n}" if n in _FIELDS else f"AdvantageInputs.extra[{n!r}]"
                hint = _INPUTS[n].doc if n in _INPUTS else "no InputSpec registered"
                raise ValueError(f"estimator {self.name!r} needs {where} ({hint}); it is None")

    def run(self, inputs: AdvantageInputs, options: Any) -> torch.Tensor:
        """(B, T) advantages with an options object from :meth:`make_options` / :meth:`host_options`."""
        self.check_inputs(inputs)
        return self.fn(inputs, **option_values(options))

    def __call__(self, inputs: AdvantageInputs, **options: Any) -> torch.Tensor:
        return self.run(inputs, self.make_options(options))


@dataclass(frozen=True)
class _NoOptions:
    """An estimator without options."""


_NO_OPTIONS = _NoOptions


class Estimator(Protocol):
    """What :attr:`EstimatorSpec.fn` is: (B, T) advantages from the batch's inputs and the options."""

    def __call__(self, inputs: AdvantageInputs, **options: Any) -> torch.Tensor: ...


_REGISTRY: dict[str, EstimatorSpec] = {}
_INPUTS: dict[str, InputSpec] = {}


def _options_of(name: str, fn: Callable[..., Any]) -> type:
    """An options object built from ``fn``'s keyword-only parameters with defaults (each typed as its default)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return _NO_OPTIONS
    opts = [(p.name, Any if p.default is None else type(p.default), field(default=p.default))
            for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty]
    return make_dataclass(f"{name}_options", opts, frozen=True) if opts else _NO_OPTIONS


def register_input(spec: InputSpec) -> InputSpec:
    """Register an optional estimator input (a different spec under a taken name raises ValueError)."""
    old = _INPUTS.get(spec.name)
    same = old is not None and old.doc == spec.doc and (
        old.compute == spec.compute or (callable(old.compute) and callable(spec.compute) and _same_fn(old.compute, spec.compute)))
    if old is not None and not same:
        raise ValueError(f"an estimator input named {spec.name!r} is already registered ({old.doc})")
    _INPUTS[spec.name] = spec
    return spec


def get_input(name: str) -> InputSpec:
    try:
        return _INPUTS[name]
    except KeyError:
        raise ValueError(f"cannot compute AdvantageInputs field {name!r}: no InputSpec registered; known: {sorted(_INPUTS)}") from None


def _same_fn(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    # the same function, or the same definition re-imported (module reload)
    return a is b or (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (getattr(b, "__module__", 0), getattr(b, "__qualname__", 0))


def register_estimator(
    name: str,
    fn: Callable[..., torch.Tensor] | EstimatorSpec | None = None,
    *,
    needs: Sequence[str | InputSpec] = (),
    options: type | None = None,
    doc: str | None = None,
    reference: bool = False,
    trajectory: bool = False,
):
    """Register an advantage estimator under ``name``, as a complete spec (usable as a decorator).

    Args:
        fn: ``fn(inputs: AdvantageInputs, **options) -> (B, T)``, or an
            :class:`EstimatorSpec` (as :func:`get_estimator` returns).
        needs: optional inputs it reads: names of registered inputs, or
            :class:`InputSpec` objects, registered here too (a new input and its
            estimator in one registration).
        options: its options object, a frozen dataclass (see :class:`SLCAOptions`);
            None reads them from ``fn``'s keyword-only parameters with defaults
            (each typed as its default). A ``**kwargs`` parameter adds none: an
            option that is not declared is refused.
        doc: one line (default: the first line of ``fn``'s docstring).
        reference: one of the estimators recorded on sample groups and compared by default.
        trajectory: it reads one scalar per rollout (``total_rewards``), not the two tiers.

    Re-registering the same function under the same name is a no-op; a
    different function under a taken name raises ValueError (as verl's
    ``register_adv_est``). Returns ``fn``.
    """

    def deco(f: Callable[..., torch.Tensor] | EstimatorSpec) -> Callable[..., torch.Tensor] | EstimatorSpec:
        if not isinstance(name, str) or not name:
            raise ValueError(f"estimator name must be a non-empty string, got {name!r}")
        spec = f if isinstance(f, EstimatorSpec) else _make_spec(name, f, needs, options, doc, reference, trajectory)
        old = _REGISTRY.get(name)
        if old is not None and not _same_fn(old.fn, spec.fn):
            raise ValueError(f"an estimator named {name!r} is already registered ({old.fn.__module__}.{old.fn.__qualname__})")
        for n in needs:
            if isinstance(n, InputSpec):
                register_input(n)
        _REGISTRY[name] = spec
        if not isinstance(f, EstimatorSpec):
            try:  # lets resolve_estimator("module:function") find the spec from the function itself
                f.__slca_estimator__ = spec  # type: ignore[union-attr]
            except (AttributeError, TypeError):
                pass
        return f

    return deco(fn) if fn is not None else deco


def _make_spec(name, f, needs, options, doc, reference, trajectory) -> EstimatorSpec:
    if options is None:
        options = _options_of(name, f)
    elif not (isinstance(options, type) and is_dataclass(options) and options.__dataclass_params__.frozen):
        raise ValueError(f"estimator {name!r}: options must be a frozen dataclass (its fields the options), got {options!r}")
    first_line = ((f.__doc__ or "").strip().splitlines() or [""])[0]
    return EstimatorSpec(name, f, tuple(n.name if isinstance(n, InputSpec) else n for n in needs), options,
                         doc if doc is not None else first_line, reference, trajectory=trajectory)


def get_estimator(name: str) -> EstimatorSpec:
    """The estimator spec ``name`` refers to (callable: ``spec(inputs, **options)``).

    ``name`` is a registered name, an import path ``"package.module:function"`` or
    the name of a ``slca.estimators`` entry point (see :func:`resolve_estimator`);
    ValueError, one line, saying what is wrong otherwise (listing the known ones).
    """
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    return spec if spec is not None else resolve_estimator(name)


ENTRY_POINT_GROUP = "slca.estimators"
"""Entry-point group an installed package declares its estimators in (``[project.entry-points."slca.estimators"]``)."""

_ALIASES: dict[str, EstimatorSpec] = {}  # an import path or entry-point name already resolved -> its spec


def resolve_estimator(ref: str) -> EstimatorSpec:
    """The estimator ``ref`` refers to, importing the user code that registers it; works in any process.

    ``ref`` is one of:

    * a registered name (``"slca"``, or one registered in this process);
    * an import path ``"package.module:function"``: the module is imported (which
      runs its ``@register_estimator(...)``) and ``function`` is a function it
      registered (or an :class:`EstimatorSpec`, or the registered *name* of an
      estimator the module registered). A process that never saw the
      registration (``slca train``, ``slca compare``'s runs, a TRL or verl worker)
      resolves the same path to the same function;
    * the name of an entry point in the group :data:`ENTRY_POINT_GROUP`
      (``slca.estimators``) of an installed package, e.g.
      ``[project.entry-points."slca.estimators"] my_est = "my_pkg.module:fn"``;
      its value is resolved as an import path.

    A resolved reference is remembered (the module is imported once).

    Raises:
        ValueError: one line naming the reference and what is wrong: unknown
            name, module not found, the module failed to import (e.g. it
            registers a name another estimator holds), attribute missing, not a
            registered estimator, an entry-point name two packages declare.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError(f"estimator must be a non-empty string (a registered name or 'package.module:function'), got {ref!r}")
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    known = _ALIASES.get(ref)
    if known is not None and _REGISTRY.get(known.name) is known:
        return known
    if ":" in ref:
        spec = _from_import_path(ref, ref)
    else:
        eps = _entry_points()
        if ref not in eps:
            installed = f"; installed ({ENTRY_POINT_GROUP} entry points): {sorted(eps)}" if eps else ""
            raise ValueError(f"unknown estimator {ref!r}{did_you_mean(ref, [*_REGISTRY, *eps])}; registered: {sorted(_REGISTRY)}{installed}; "
                             "user code: give its import path 'package.module:function'")
        spec = _from_entry_point(ref, eps[ref])
    _ALIASES[ref] = spec
    return spec


def _entry_points() -> dict[str, Any]:
    """The ``slca.estimators`` entry points by name; ValueError if two packages declare one name differently."""
    out: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        old = out.get(ep.name)
        if old is not None and old.value != ep.value:
            raise ValueError(f"estimator entry point {ep.name!r} ({ENTRY_POINT_GROUP}) is declared twice: "
                             f"{_dist_name(old)} -> {old.value!r}, {_dist_name(ep)} -> {ep.value!r}; uninstall one or "
                             "give the import path instead")
        out.setdefault(ep.name, ep)
    return out


def _dist_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "a package"


def _from_entry_point(name: str, ep: Any) -> EstimatorSpec:
    where = f"estimator {name!r} (entry point {ep.value!r} of {_dist_name(ep)})"
    if ":" in ep.value:
        return _from_import_path(ep.value, where)
    _import(ep.value.strip(), where)  # a module: importing it registers `name`
    if name not in _REGISTRY:
        raise ValueError(f"{where}: importing {ep.value!r} registered no estimator named {name!r}; "
                         f"it registered: {_registered_by(ep.value.strip())}")
    return _REGISTRY[name]


def _import(module: str, where: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise ValueError(f"{where}: no module named {e.name!r} (install its package, or put the folder that "
                             "holds it on PYTHONPATH)") from None
        raise ValueError(f"{where}: importing module {module!r} failed: {e}") from None
    except Exception as e:  # the module's own error (a duplicate name, a syntax error, ...), reported in one line
        raise ValueError(f"{where}: importing module {module!r} failed: {type(e).__name__}: {e}") from None


def _registered_by(module: str) -> list[str]:
    return sorted(n for n, s in _REGISTRY.items() if getattr(s.fn, "__module__", None) == module)


def _from_import_path(path: str, where: str) -> EstimatorSpec:
    """The estimator at ``"package.module:attr"``; ``where`` starts every error message."""
    if where == path:
        where = f"estimator {path!r}"
    module, _, attr = (x.strip() for x in path.partition(":"))
    if not module or not attr or not all(p.isidentifier() for p in (*module.split("."), *attr.split("."))):
        raise ValueError(f"{where}: an import path must look like 'package.module:function'")
    obj: Any = _import(module, where)
    for part in attr.split("."):
        if not hasattr(obj, part):
            if attr in _REGISTRY and getattr(_REGISTRY[attr].fn, "__module__", None) == module:
                return _REGISTRY[attr]  # "module:NAME", NAME the name the module registered
            raise ValueError(f"{where}: module {module!r} has no attribute {attr!r}; "
                             f"estimators it registered: {_registered_by(module)}")
        obj = getattr(obj, part)
    return _spec_of(obj, f"{where}: {module}.{attr}")


def _spec_of(obj: Any, where: str) -> EstimatorSpec:
    """The registered spec of ``obj`` (an EstimatorSpec, or a function registered as an estimator)."""
    if isinstance(obj, EstimatorSpec):
        try:
            register_estimator(obj.name, obj)  # a no-op if it is there; ValueError if another function holds the name
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return _REGISTRY[obj.name]
    if callable(obj):
        for spec in _REGISTRY.values():
            if spec.fn is obj:
                return spec
        own = getattr(obj, "__slca_estimator__", None)
        if isinstance(own, EstimatorSpec) and own.fn is obj:  # registered at import, since dropped from the registry
            register_estimator(own.name, own)
            return own
        raise ValueError(f"{where} is not a registered estimator: decorate it with @slca.register_estimator(\"NAME\") "
                         "in its module (the import path then finds it)")
    raise ValueError(f"{where} is a {type(obj).__name__}, not an estimator function")


def list_estimators(*, reference: bool | None = None) -> list[str]:
    """Registered names, sorted; ``reference=True``: only the reference estimators, in registration order."""
    if reference is None:
        return sorted(_REGISTRY)
    return [n for n, s in _REGISTRY.items() if s.reference == reference]


def compute_advantages(name: str, inputs: AdvantageInputs, **options: Any) -> torch.Tensor:
    """Dispatch to the estimator registered under ``name``; returns (B, T).

    Options the estimator does not declare raise ValueError naming it and the option.
    """
    return get_estimator(name)(inputs, **options)


def fill_inputs(inputs: AdvantageInputs, name: str, trajectories: Sequence[Any]) -> AdvantageInputs:
    """``inputs`` with every input estimator ``name`` needs computed from the batch's trajectories
    (an input the caller already set, such as ``span_labels``, is kept)."""
    spec = get_estimator(name)
    return inputs.with_inputs({n: get_input(n).from_trajectories(trajectories) for n in spec.needs if inputs.get(n) is None})


@register_estimator("grpo", options=GroupOptions, reference=True, trajectory=True)
def _grpo(inputs: AdvantageInputs, *, scale: str, eps: float) -> torch.Tensor:
    """One scalar (weighted sum of both tiers) per rollout, on every policy token."""
    return grpo_advantages(inputs.total_rewards, inputs.group_ids, inputs.model_mask, scale=scale, eps=eps)


@register_estimator("slca", options=SLCAOptions, reference=True)
def _slca(inputs: AdvantageInputs, *, scale: str, eps: float, empty_tool: str, empty_summary: str) -> torch.Tensor:
    """Each tier normalised on its own and locked to its segment."""
    return slca_advantages(
        inputs.tool_rewards, inputs.summary_rewards, inputs.group_ids, inputs.tool_mask, inputs.summary_mask,
        scale=scale, eps=eps, empty_tool=empty_tool, empty_summary=empty_summary,
    )


@register_estimator("gdpo", options=GroupOptions, reference=True)
def _gdpo(inputs: AdvantageInputs, *, scale: str, eps: float) -> torch.Tensor:
    """Each tier normalised on its own, summed, on every policy token (no locking)."""
    return gdpo_advantages(
        inputs.tool_rewards, inputs.summary_rewards, inputs.group_ids, inputs.model_mask, scale=scale, eps=eps
    )
