"""verl on CPU: a test and development backend for verl's real trainer (written against verl 0.9.1).

verl's ``python -m verl.trainer.main_ppo`` needs GPUs and vLLM, SGLang or
TensorRT-LLM out of the box. This module lets the same command run on a CPU
machine, unchanged except for a few overrides, so that slca's estimator, agent
loop, tool and reward function can be run end to end by verl's own trainer in a
test. It is a test and development aid: on GPUs use verl's own vLLM / SGLang
rollouts (``actor_rollout_ref.rollout.name=vllm``), not this.

Use (no file of verl changes; verl imports the module in every process)::

    VERL_USE_EXTERNAL_MODULES=slca.integrations.verl_cpu VERL_PLATFORM=cpu \\
    RAY_enable_worker_prestart=0 RAY_prestart_worker_first_driver=0 \\
    python -m verl.trainer.main_ppo ... \\
      trainer.device=cpu trainer.n_gpus_per_node=1 trainer.nnodes=1 \\
      +ray_kwargs.ray_init.num_gpus=1 ray_kwargs.ray_init.num_cpus=16 \\
      +ray_kwargs.ray_init.include_dashboard=False \\
      transfer_queue.backend.SimpleStorage.num_data_storage_units=1 \\
      actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 \\
      +actor_rollout_ref.model.override_config.attn_implementation=sdpa \\
      actor_rollout_ref.model.use_remove_padding=False \\
      actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.tensor_model_parallel_size=1

(:func:`cpu_env` and :func:`cpu_overrides` return them; docs/integrations.md has the
whole command, through ``examples/verl/run_slca.sh``.)

What each piece is, in the order a run meets it:

* **Ray resources.** verl asks Ray for one GPU per training process
  (``ResourcePoolManager._check_resource_available``, the placement-group
  bundles). ``+ray_kwargs.ray_init.num_gpus=N`` declares N *logical* GPUs: Ray's
  name for the slot verl schedules each training process on; nothing runs on a
  GPU. The transfer queue starts ``num_data_storage_units`` actors (default 8) of
  one logical CPU each: fewer units, or more logical CPUs
  (``ray_init.num_cpus``), or Ray waits forever.
* **Platform** (:class:`PlatformCPU`, selected by ``VERL_PLATFORM=cpu``): verl's
  platform registry has no CPU entry and falls back to ``nvidia``, and
  ``auto_set_device`` then resets ``trainer.device=cpu`` to ``cuda``. The CPU
  platform's device module is ``torch.cpu`` plus CPU versions of the
  ``torch.cuda`` calls verl makes (``empty_cache``, ``mem_get_info``, RNG state,
  ``get_device_name`` for the FLOPs counter, ...).
* **Process group.** verl builds ``cpu:gloo,<device>:<backend>``, which on CPU
  reads ``cpu:gloo,cpu:gloo`` and torch rejects; on the CPU platform
  ``verl.utils.distributed.initialize_global_process_group_ray`` asks for gloo
  alone (one of the two names this module replaces at run time, both only
  acting on the CPU platform; :func:`check_verl_contract` checks that verl still
  builds the string that way).
* **Training engine.** verl registers its FSDP engines for ``cuda`` and ``npu``;
  this module registers the same classes for ``cpu`` with the ``fsdp2`` strategy
  (FSDP2 runs on CPU with gloo; FSDP1 does not) when ``verl.workers.engine`` is
  first imported, and the offload policy verl gives forward-only engines (the
  reference model) pins no memory there (pinning needs an accelerator: the other
  name replaced, ``CPUOffloadPolicy`` in verl's FSDP engine module). Attention
  must be ``sdpa`` (the default is flash_attention_2).
* **Rollout** (``actor_rollout_ref.rollout.name=hf``): verl's trainer rolls out
  only through a server ``RolloutReplica`` (vLLM, SGLang, TensorRT-LLM).
  :mod:`slca.integrations.verl_cpu_rollout` is a small one over
  ``transformers``' ``generate``: a Ray actor that answers verl's token-in,
  token-out requests, a replica that starts it, and a rollout adapter in the
  training process through which verl's weight sync reaches it. Registered here
  in verl's two rollout registries; loaded lazily.

:func:`check_verl_contract` raises a RuntimeError naming each verl internal
these pieces rely on that moved.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import inspect
import os
import re
import sys
import types
from collections.abc import Callable
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = [
    "PLATFORM",
    "ROLLOUT",
    "TESTED_VERL",
    "PlatformCPU",
    "check_verl_contract",
    "cpu_device_module",
    "cpu_env",
    "cpu_overrides",
    "register_cpu_engines",
]

TESTED_VERL = "0.9.1"
PLATFORM = "cpu"
"""``VERL_PLATFORM`` value that selects :class:`PlatformCPU`."""
ROLLOUT = "hf"
"""``actor_rollout_ref.rollout.name`` of the ``transformers.generate`` rollout."""
ENGINE_STRATEGIES = ("fsdp2",)
"""verl training-engine strategies registered for ``cpu`` (FSDP1 does not run on CPU)."""
_ROLLOUT_ADAPTER = "slca.integrations.verl_cpu_rollout.HFServerAdapter"


def cpu_env() -> dict[str, str]:
    """Environment for a verl command on this backend: verl loads this module in every process and selects
    the CPU platform; Ray starts no idle workers ahead of need (by default it starts one per logical CPU,
    each importing Python, when the driver connects); tokenizers and torch use one thread per process."""
    return {
        "VERL_USE_EXTERNAL_MODULES": __name__,
        "VERL_PLATFORM": PLATFORM,
        "RAY_enable_worker_prestart": "0",
        "RAY_prestart_worker_first_driver": "0",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }


def cpu_overrides(n_procs: int = 1, logical_cpus: int = 16) -> list[str]:
    """The ``main_ppo`` overrides that run a verl command on this backend (with :func:`cpu_env`'s environment).

    Args:
        n_procs: training processes (one per logical Ray GPU).
        logical_cpus: Ray's logical CPUs (scheduling slots, not cores: verl starts more actors than a
            small machine has cores).
    """
    return [
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={n_procs}",
        "trainer.nnodes=1",
        f"+ray_kwargs.ray_init.num_gpus={n_procs}",
        f"ray_kwargs.ray_init.num_cpus={logical_cpus}",
        "+ray_kwargs.ray_init.include_dashboard=False",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        f"actor_rollout_ref.rollout.name={ROLLOUT}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    ]


# --------------------------------------------------------------------------------------------------
# Platform
# --------------------------------------------------------------------------------------------------


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory (``torch.cuda.mem_get_info``'s shape)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError):
        avail = total
    return avail, total


def cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes through ``get_torch_device()``.

    Memory calls report 0 (allocated / reserved) or the host's memory (``mem_get_info``), cache and
    IPC calls do nothing, the RNG calls use torch's CPU generator, and ``get_device_name`` says
    ``"CPU"`` (verl's FLOPs counter reads it). ``current_device`` is ``"cpu"``, as ``torch.cpu``'s:
    verl passes ``get_device_id()`` to ``tensor.to(...)``, where an integer would mean a CUDA device.
    """
    m = types.ModuleType("slca_cpu_device", cpu_device_module.__doc__)
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(m, name, getattr(torch.cpu, name))
    zero = lambda device=None: 0  # noqa: E731
    m.current_device = lambda: "cpu"
    m.set_device = lambda device=None: None
    m.empty_cache = lambda: None
    m.ipc_collect = lambda: None
    m.get_device_name = lambda device=None: "CPU"
    m.mem_get_info = lambda device=None: _host_memory()
    m.memory_allocated = m.memory_reserved = m.max_memory_allocated = m.max_memory_reserved = zero
    m.reset_peak_memory_stats = lambda device=None: None
    m.set_per_process_memory_fraction = lambda fraction, device=None: None
    m.manual_seed = m.manual_seed_all = lambda seed: torch.manual_seed(seed)
    m.get_rng_state = lambda device=None: torch.get_rng_state()
    m.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    return m


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl platform for the host CPU (select with ``VERL_PLATFORM=cpu``); see the module docstring."""

    _device = cpu_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: only VERL_PLATFORM=cpu selects it

    def current_device(self) -> str:  # type: ignore[override]  # see cpu_device_module
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for a logical GPU; nothing reads it on CPU

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical Ray GPUs (ray_init.num_gpus): verl schedules one training process on each

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _on_cpu() -> bool:
    from verl.utils.device import get_device_name

    return get_device_name() == PLATFORM


# --------------------------------------------------------------------------------------------------
# Process group: gloo alone on the CPU platform
# --------------------------------------------------------------------------------------------------


def _gloo_on_cpu(original):
    """``initialize_global_process_group_ray`` asking for gloo alone on the CPU platform (verl's default
    ``cpu:gloo,{device}:{backend}`` reads ``cpu:gloo,cpu:gloo`` there, which torch rejects); unchanged on
    any other platform or when the caller names a backend."""

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and _on_cpu():
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray.__slca_cpu_original__ = original
    return initialize_global_process_group_ray


def _install_gloo_process_group() -> None:
    import verl.utils.distributed as dist

    fn = dist.initialize_global_process_group_ray
    if getattr(fn, "__slca_cpu_original__", None) is not None:
        return
    wrapped = _gloo_on_cpu(fn)
    dist.initialize_global_process_group_ray = wrapped
    # modules that imported the name before this ran (verl imports this module first, so normally none)
    for mod in list(sys.modules.values()):
        if isinstance(mod, types.ModuleType) and mod.__name__.startswith("verl.") and getattr(mod, "initialize_global_process_group_ray", None) is fn:
            mod.initialize_global_process_group_ray = wrapped


# --------------------------------------------------------------------------------------------------
# Training engine: verl's FSDP engines registered for cpu
# --------------------------------------------------------------------------------------------------


def _unpinned_on_cpu(policy_cls):
    """FSDP2's ``CPUOffloadPolicy`` that pins no memory on the CPU platform (pinning needs an accelerator; verl
    gives every forward-only engine, e.g. the reference model, ``CPUOffloadPolicy(pin_memory=True)``)."""

    class CPUOffloadPolicy(policy_cls):
        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=pin_memory and not _on_cpu())

    CPUOffloadPolicy.__slca_cpu_original__ = policy_cls
    CPUOffloadPolicy.__doc__ = _unpinned_on_cpu.__doc__
    return CPUOffloadPolicy


def register_cpu_engines() -> None:
    """Register verl's FSDP engines (language model, value model) for ``cpu`` under :data:`ENGINE_STRATEGIES`, and
    make their forward-only engines' offload policy pin no memory there (:func:`_unpinned_on_cpu`).

    Idempotent. Runs by itself when ``verl.workers.engine`` is first imported (:class:`_AfterImport`).
    """
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        for strategy in ENGINE_STRATEGIES:
            if EngineRegistry._engines.get(model_type, {}).get(strategy, {}).get(PLATFORM) is None:
                EngineRegistry.register(model_type=model_type, backend=strategy, device=PLATFORM)(cls)
    policy = getattr(transformer_impl, "CPUOffloadPolicy", None)
    if policy is not None and getattr(policy, "__slca_cpu_original__", None) is None:
        transformer_impl.CPUOffloadPolicy = _unpinned_on_cpu(policy)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hook()`` once, right after module ``name`` has been imported (wherever that happens)."""

    def __init__(self, name: str, hook) -> None:
        self.name, self.hook = name, hook

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, hook = spec.loader.exec_module, self.hook

        def exec_then_hook(module):
            exec_module(module)
            hook()

        spec.loader.exec_module = exec_then_hook
        return spec


def _install_engine_hook() -> None:
    if "verl.workers.engine" in sys.modules:
        register_cpu_engines()
    elif not any(isinstance(f, _AfterImport) and f.name == "verl.workers.engine" for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport("verl.workers.engine", register_cpu_engines))


# --------------------------------------------------------------------------------------------------
# Rollout: the transformers.generate replica (slca.integrations.verl_cpu_rollout), registered lazily
# --------------------------------------------------------------------------------------------------


def _load_replica():
    from slca.integrations.verl_cpu_rollout import HFReplica

    return HFReplica


def _install_rollout() -> None:
    from verl.workers.rollout import base, replica

    base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = _ROLLOUT_ADAPTER
    replica.RolloutReplicaRegistry.register(ROLLOUT, _load_replica)


def install() -> None:
    """Register the platform (done by the class statement), the gloo process group, the CPU engines and
    the ``hf`` rollout. Idempotent; runs on import. Nothing changes unless ``VERL_PLATFORM=cpu`` selects
    the platform (and ``rollout.name=hf`` the rollout)."""
    _install_gloo_process_group()
    _install_engine_hook()
    _install_rollout()


# --------------------------------------------------------------------------------------------------
# Contract with verl's internals
# --------------------------------------------------------------------------------------------------


def _src(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _contract_platform(need: Callable[[bool, str], None], problems: list[str]) -> None:
    """Platform: part of :func:`check_verl_contract`."""
    from verl.plugin.platform import platform_manager

    missing = sorted(getattr(PlatformBase, "__abstractmethods__", set()) - {
        n for n, v in vars(PlatformCPU).items() if not getattr(v, "__isabstractmethod__", False)
    })
    need(not missing, f"verl.plugin.platform.PlatformBase has abstract methods PlatformCPU lacks: {missing}")
    need("VERL_PLATFORM" in _src(platform_manager._detect_platform_name),
         "platform_manager._detect_platform_name no longer reads VERL_PLATFORM")
    need(PlatformRegistry.get(PLATFORM) is PlatformCPU, "PlatformRegistry.get('cpu') is not PlatformCPU")
    from verl.utils import device as vdevice

    need('detected != "cpu"' in _src(vdevice.auto_set_device),
         "verl.utils.device.auto_set_device no longer leaves a cpu platform's trainer.device alone")
    need("get_platform().device_module" in _src(vdevice.get_torch_device),
         "verl.utils.device.get_torch_device no longer returns the platform's device_module")


def _contract_process_group(need: Callable[[bool, str], None], problems: list[str]) -> None:
    """Process group: part of :func:`check_verl_contract`."""
    import verl.utils.distributed as vdist

    fn = vdist.initialize_global_process_group_ray
    original = getattr(fn, "__slca_cpu_original__", fn)
    need(list(inspect.signature(original).parameters) == ["timeout_second", "backend"],
         f"initialize_global_process_group_ray signature changed: {list(inspect.signature(original).parameters)}")
    need('backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' in _src(original),
         "initialize_global_process_group_ray no longer builds 'cpu:gloo,{device}:{backend}' from a None backend")
    need(getattr(fn, "__slca_cpu_original__", None) is not None,
         "verl.utils.distributed.initialize_global_process_group_ray is not the gloo wrapper (install() not run?)")
    try:
        from verl.workers import engine_workers
    except ImportError as e:  # pragma: no cover - verl-core missing
        engine_workers = None
        problems.append(f"verl.workers.engine_workers does not import: {e}")
    if engine_workers is not None:
        need("initialize_global_process_group_ray(timeout_second=None)" in _src(engine_workers.TrainingWorker.__init__),
             "TrainingWorker.__init__ no longer calls initialize_global_process_group_ray(timeout_second=None)")
        need(getattr(engine_workers, "initialize_global_process_group_ray", None) is fn,
             "verl.workers.engine_workers holds its own initialize_global_process_group_ray (imported before the wrapper)")
        upd = _src(engine_workers.ActorRolloutRefWorker.update_weights)
        for needle in ("await self.rollout.update_weights(", "await self.rollout.resume(tags=", "get_per_tensor_param("):
            need(needle in upd, f"ActorRolloutRefWorker.update_weights no longer contains {needle!r}")
        need("get_rollout_class(rollout_config.name, rollout_config.mode)" in _src(engine_workers.ActorRolloutRefWorker.init_model),
             "ActorRolloutRefWorker.init_model no longer builds the rollout with get_rollout_class(name, mode)")


def _contract_engines(need: Callable[[bool, str], None], problems: list[str]) -> None:
    """Engines: part of :func:`check_verl_contract`."""
    try:
        from verl.workers.engine import EngineRegistry
        from verl.workers.engine.fsdp import transformer_impl

        register_cpu_engines()
        params = list(inspect.signature(EngineRegistry.register).parameters)
        need(params[:4] == ["model_type", "backend", "device", "vendor"], f"EngineRegistry.register signature changed: {params}")
        for model_type, cls in (("language_model", "FSDPEngineWithLMHead"), ("value_model", "FSDPEngineWithValueHead")):
            reg = EngineRegistry._engines.get(model_type, {})
            need(reg.get("fsdp2", {}).get("cuda") is getattr(transformer_impl, cls, None),
                 f"verl's {cls} is no longer the ({model_type}, fsdp2, cuda) engine")
            need(reg.get("fsdp2", {}).get(PLATFORM) is getattr(transformer_impl, cls, None),
                 f"({model_type}, fsdp2, cpu) is not registered")
        need("get_device_name()" in _src(EngineRegistry.get_engine_cls),
             "EngineRegistry.get_engine_cls no longer looks engines up by get_device_name()")
        need("offload_policy = CPUOffloadPolicy(pin_memory=True)" in _src(transformer_impl.FSDPEngine._build_fsdp_module),
             "FSDPEngine._build_fsdp_module no longer builds CPUOffloadPolicy(pin_memory=True) by that module-level name")
        need(getattr(transformer_impl.CPUOffloadPolicy, "__slca_cpu_original__", None) is not None,
             "verl's fsdp transformer_impl.CPUOffloadPolicy is not the unpinned-on-cpu policy (register_cpu_engines not run?)")
    except (ImportError, AttributeError) as e:
        problems.append(f"verl's engine registry moved: {e!r}")


def _contract_rollout(need: Callable[[bool, str], None], problems: list[str]) -> None:
    """Rollout registries and interfaces: part of :func:`check_verl_contract`."""
    from verl.workers.rollout import base, replica
    from verl.workers.rollout.replica import RolloutReplica, TokenOutput

    need(isinstance(getattr(base, "_ROLLOUT_REGISTRY", None), dict),
         "verl.workers.rollout.base._ROLLOUT_REGISTRY is no longer a dict")
    need("_ROLLOUT_REGISTRY[(rollout_name, mode)]" in _src(base.get_rollout_class),
         "get_rollout_class no longer reads _ROLLOUT_REGISTRY[(name, mode)]")
    need(callable(getattr(replica.RolloutReplicaRegistry, "register", None)),
         "RolloutReplicaRegistry.register is missing")
    need(set(getattr(base.BaseRollout, "__abstractmethods__", ())) == {"resume", "update_weights", "release"},
         f"BaseRollout's abstract methods changed: {sorted(getattr(base.BaseRollout, '__abstractmethods__', ()))}")
    need(set(getattr(RolloutReplica, "__abstractmethods__", ())) == {"launch_servers"},
         f"RolloutReplica's abstract methods changed: {sorted(getattr(RolloutReplica, '__abstractmethods__', ()))}")
    need({"token_ids", "log_probs", "stop_reason", "extra_fields"} <= set(TokenOutput.model_fields),
         f"TokenOutput fields changed: {sorted(TokenOutput.model_fields)}")
    from verl.workers.rollout import llm_server, router

    need('output.extra_fields.get("global_steps")' in _src(llm_server.LLMServerClient.generate),
         "LLMServerClient.generate no longer reads extra_fields['global_steps']")
    from slca.integrations.verl_cpu_rollout import HFRolloutServer

    called = set()
    for mod in (replica, llm_server, router):
        called |= set(re.findall(r"server(?:_handle)?\.(\w+)\.remote\(", _src(mod)))
    absent = sorted(n for n in called if not callable(getattr(HFRolloutServer, n, None)))
    need(not absent, f"verl calls rollout-server methods HFRolloutServer lacks: {absent}")
    need("get_rollout_replica_class(" in _src(llm_server.LLMServerManager.__init__),
         "LLMServerManager no longer picks the replica class with get_rollout_replica_class")


def _contract_flops(need: Callable[[bool, str], None], problems: list[str]) -> None:
    """FLOPs counter and config keys: part of :func:`check_verl_contract`."""
    from verl.utils import flops_counter

    need("get_torch_device()" in _src(flops_counter.get_device_flops) and "get_device_name()" in _src(flops_counter.get_device_flops),
         "verl.utils.flops_counter.get_device_flops no longer asks get_torch_device() for the device name")


def check_verl_contract() -> None:
    """Raise RuntimeError naming each verl internal this backend relies on that changed.

    Checked (verl 0.9.1): the platform interface (every abstract method of ``PlatformBase`` is
    implemented here; ``VERL_PLATFORM`` selects a registered platform; ``auto_set_device`` leaves a
    ``cpu`` platform alone); the process-group string and the call that builds it in the training
    worker; the engine registry (``EngineRegistry.register`` / ``_engines``, the FSDP engine classes
    registered for ``cuda`` under ``fsdp2``, the lookup by ``get_device_name()``); the two rollout
    registries; the abstract methods of ``BaseRollout`` and ``RolloutReplica``; every method verl calls
    on a rollout server handle (``server.<name>.remote`` in verl's replica, LLM client and load
    balancer) exists on :class:`~slca.integrations.verl_cpu_rollout.HFRolloutServer`; the ``TokenOutput``
    fields and ``extra_fields["global_steps"]``; the weight-sync call from the training worker to the
    rollout adapter; and the FLOPs counter's device lookup. (The config keys :func:`cpu_overrides` sets are
    checked against verl's config schema by the tests.)
    """
    import verl

    problems: list[str] = []

    def need(cond: bool, what: str) -> None:
        if not cond:
            problems.append(what)

    _contract_platform(need, problems)
    _contract_process_group(need, problems)
    _contract_engines(need, problems)
    _contract_rollout(need, problems)
    _contract_flops(need, problems)
    if problems:
        raise RuntimeError(
            f"verl {verl.__version__} changed internals slca's CPU backend relies on "
            f"(tested: verl=={TESTED_VERL}): " + "; ".join(problems)
        )


install()
