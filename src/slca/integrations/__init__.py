"""Drop-ins for the frameworks people scale out with.

* :mod:`slca.integrations.trl` -- :class:`SLCAGRPOTrainer`, a TRL ``GRPOTrainer``
  subclass (extra ``slca[trl]``).
* :mod:`slca.integrations.verl` -- the ``slca`` advantage estimator in verl's
  registry, the token-position reward contract, and a verl reward function
  (extra ``slca[verl]``); :mod:`slca.integrations.verl_agent_loop` -- the agent
  loop that writes both rewards at their token positions;
  :mod:`slca.integrations.verl_tools` -- a verl tool backed by slca's simulators;
  :mod:`slca.integrations.verl_cpu` (with :mod:`slca.integrations.verl_cpu_rollout`)
  -- a CPU backend for verl's real trainer, a test and development aid.

Neither framework is imported by ``import slca``; each module imports its own.
Both compute advantages with slca's own functions (:func:`slca.segment_masks`
and the estimator registry), never a copy.
"""
