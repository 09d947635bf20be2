"""Core math: pure functions on tensors (segment masks, advantage estimators and their registry, losses, diagnostics).

Imports only ``slca.types`` and the private helpers; every other layer builds on it.
"""

from slca.core import beyond as _beyond  # noqa: E402,F401  registers slca_cond, slca_turn (beyond the paper)
from slca.core import paper as _paper  # noqa: E402,F401  registers slca_paper, toolpo_grpo, rltr_planner (the released estimators)
