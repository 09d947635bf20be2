"""A verl rollout over ``transformers``' ``generate``, for the CPU backend (:mod:`slca.integrations.verl_cpu`).

verl's trainer rolls out through a server replica (``RolloutReplica``): agent
loops send token-in, token-out requests to a server actor, and the trainer pushes
its weights to the server after each update through a rollout adapter that lives
in the training process. vLLM, SGLang and TensorRT-LLM provide the three verl
ships; this module provides the same three parts in a few lines each, small
enough to read and slow enough to be a test aid only:

* :class:`HFRolloutServer`: a Ray actor holding a ``transformers`` causal LM. It
  answers ``generate`` one request at a time, with the sampling parameters verl
  sends (temperature, top-p, top-k, stop tokens, ``max_tokens``, log-probs) and
  the version of its weights (``extra_fields["global_steps"]``), and loads the
  weights the trainer sends. With ``rollout.load_format=dummy`` (verl's default)
  it starts from random weights, as vLLM does, so nothing sensible comes out
  until the trainer's weights arrive.
* :class:`HFReplica`: starts one server per replica (one process: rollout tensor
  parallelism 1) on the node of its training worker.
* :class:`HFServerAdapter`: verl's ``BaseRollout`` in the training process; its
  ``update_weights`` sends the trainer's full tensors to the server.

Each weight load prints one line, ``[slca-cpu-rollout] replica R loaded N
tensors from the trainer (step S): max |w - w_prev| = D``, ``w_prev`` being the
weights the rollout held before (its starting weights for the first load): how
a test sees, from a run's own output, that each update reached the rollout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any, Generator, Optional

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.utils import normalize_token_ids
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

__all__ = ["HFReplica", "HFRolloutServer", "HFServerAdapter", "LOG_PREFIX", "server_name"]

logger = logging.getLogger(__name__)
LOG_PREFIX = "[slca-cpu-rollout]"


def server_name(replica_rank: int, prefix: str = "") -> str:
    """The Ray actor name of a replica's server (the adapter in the training process finds it by name)."""
    return f"{prefix}hf_server_{replica_rank}"


class HFRolloutServer:
    """One replica's rollout server (a Ray actor): token-in, token-out ``generate`` with a ``transformers`` model.

    The methods besides ``generate`` and ``update_weights`` are the control calls verl makes on every
    rollout server (sleep / wake up around weight syncs, cache resets, request aborts, profiling);
    weights stay in host memory, so they only keep verl's bookkeeping.
    """

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, replica_rank: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        torch.manual_seed(self.config.seed + replica_rank)
        hf_config = self.model_config.hf_config
        kwargs = {"attn_implementation": "sdpa", "dtype": torch.float32}
        if str(self.config.load_format).startswith("dummy"):  # as vLLM: random weights until the trainer's arrive
            self.model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(self.model_config.local_path, **kwargs)
        self.model.eval()
        self.tensors = {**dict(self.model.named_parameters(remove_duplicate=False)), **dict(self.model.named_buffers())}
        self.eos_token_ids = self._eos_token_ids()
        self.global_steps: Optional[int] = None
        self.max_model_len = int(self.config.max_model_len or (self.config.prompt_length + self.config.response_length))
        self._lock = asyncio.Lock()

    def _eos_token_ids(self) -> list[int]:
        ids = getattr(self.model.generation_config, "eos_token_id", None)
        if ids is None:
            ids = self.model.config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        tok = self.model_config.tokenizer
        if tok is not None and tok.eos_token_id is not None and tok.eos_token_id not in ids:
            ids.append(tok.eos_token_id)
        return ids

    # ---- generation --------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        audio_data: Optional[list[Any]] = None,
        **_: Any,
    ) -> TokenOutput:
        """verl's token-in, token-out request (the vLLM server's ``generate``, text only).

        ``max_tokens`` (or ``max_new_tokens``) defaults to what is left of ``response_length`` within
        ``prompt_length + response_length`` and is capped by ``max_model_len``, as vLLM's server does.
        Log-probs (``logprobs=True``) are those of the sampled tokens under the model's logits divided by
        the temperature (the distribution verl's actor scores the same tokens with).
        """
        if image_data or video_data or audio_data:
            raise NotImplementedError("the CPU rollout is text-only")
        prompt_ids = normalize_token_ids(prompt_ids)
        params = dict(sampling_params)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room within max_model_len={self.max_model_len}")
        max_tokens = params.pop("max_tokens", None) or params.pop("max_new_tokens", None)
        if max_tokens is None:
            max_tokens = min(self.config.response_length, self.config.prompt_length + self.config.response_length - len(prompt_ids))
        max_tokens = max(1, min(int(max_tokens), room))
        async with self._lock:  # one request at a time; the event loop stays free for control calls
            token_ids, log_probs = await asyncio.to_thread(self._sample, prompt_ids, params, max_tokens)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], params: dict[str, Any], max_tokens: int) -> tuple[list[int], Optional[list[float]]]:
        temperature = float(params.get("temperature", 1.0))
        greedy = temperature <= 0
        top_k = int(params.get("top_k", -1) or -1)
        stop = list(dict.fromkeys([*self.eos_token_ids, *(params.get("stop_token_ids") or [])]))
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "do_sample": not greedy,
            "repetition_penalty": float(params.get("repetition_penalty", 1.0)),
            "eos_token_id": stop,
            "pad_token_id": stop[0] if stop else 0,
        }
        if not greedy:
            kwargs.update(temperature=temperature, top_p=float(params.get("top_p", 1.0)), top_k=top_k if top_k > 0 else 0)
        if params.get("ignore_eos", False):  # vLLM samples past EOS; here EOS is not sampled (the length is the same)
            kwargs["min_new_tokens"] = max_tokens
        want_logprobs = bool(params.get("logprobs", False))
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            return_dict_in_generate=True,
            output_logits=want_logprobs,
            **kwargs,
        )
        token_ids = out.sequences[0, len(prompt_ids):].tolist()
        log_probs = None
        if want_logprobs:
            logits = torch.stack(out.logits, dim=1)[0].float()  # (T, V) raw logits per generated token
            if not greedy:
                logits = logits / temperature
            log_probs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(token_ids).unsqueeze(1)).squeeze(1).tolist()
        return token_ids, log_probs

    # ---- weights ---------------------------------------------------------------------------------

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], global_steps: Optional[int] = None) -> dict[str, Any]:
        """Load the trainer's full tensors (HF names); every name must be one of the model's."""
        unknown = [n for n, _ in named_tensors if n not in self.tensors]
        if unknown:
            raise KeyError(f"the trainer sent tensors the rollout model does not have: {unknown[:5]} ({len(unknown)} in all)")
        delta = 0.0
        with torch.no_grad():
            for name, value in named_tensors:
                target = self.tensors[name]
                if tuple(value.shape) != tuple(target.shape):
                    raise ValueError(f"{name}: the trainer sent shape {tuple(value.shape)}, the rollout model has {tuple(target.shape)}")
                value = value.to(target.dtype)
                if target.is_floating_point():
                    delta = max(delta, float((value - target).abs().max()))
                target.copy_(value)
        if global_steps is not None:
            self.global_steps = global_steps
        print(
            f"{LOG_PREFIX} replica {self.replica_rank} loaded {len(named_tensors)} tensors from the trainer "
            f"(step {global_steps}): max |w - w_prev| = {delta:.3e}",
            flush=True,
        )
        return {"tensors": len(named_tensors), "max_abs_change": delta}

    # ---- control calls verl makes on every rollout server ---------------------------------------

    def ready(self) -> bool:
        return True

    def get_server_address(self) -> tuple[str, int]:
        return socket.gethostname(), 0

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None  # generate() keeps no cache between requests

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        async with self._lock:
            return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}  # requests run to completion (sync training only)

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict[str, Any]:
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        return None

    async def resume_engine_generation(self) -> None:
        return None

    async def open_submission_gate(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):
    """verl ``RolloutReplica`` whose server is an :class:`HFRolloutServer` (one process per replica)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.world_size != 1:
            raise ValueError(
                f"the CPU rollout runs one process per replica; set rollout.tensor_model_parallel_size, "
                f"data_parallel_size and pipeline_model_parallel_size to 1 (their product is {self.world_size})"
            )

    def _prefix(self) -> str:
        return "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""

    async def launch_servers(self) -> None:
        options: dict[str, Any] = {
            "name": server_name(self.replica_rank, self._prefix()) + self.name_suffix,
            "max_concurrency": self.max_concurrency,
        }
        if self.workers:  # on the node of the training worker whose weights it receives
            node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        server = ray.remote(HFRolloutServer).options(**options).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
        )
        await server.ready.remote()
        host, _ = await server.get_server_address.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{host}/{options['name']}"  # a key for verl's load balancer; no HTTP server


class HFServerAdapter(BaseRollout):
    """verl ``BaseRollout`` in the training process: forwards weight syncs to the replica's server."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, device_mesh: Any = None,
                 replica_rank: int = -1, **_: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = int(os.environ.get("RANK", 0)) if replica_rank == -1 else replica_rank  # tp = 1
        self.is_leader_rank = True
        self.server_handle = None

    def _server(self):
        if self.server_handle is None:  # the server starts after the training engine: look it up on first use
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        await self._server().wake_up.remote(tags=tags)

    async def release(self) -> None:
        await self._server().sleep.remote()

    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        wire_format: str = "named_tensors",
        global_steps: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the CPU rollout takes full tensors (wire_format='named_tensors'), not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the CPU rollout takes merged weights (model.lora.merge=True), not LoRA adapters")
        named = [(name, t.detach().to("cpu", copy=True).contiguous()) async for name, t in ensure_async_iterator(weights)]
        await self._server().update_weights.remote(named, global_steps)
