"""Core math: pure functions on tensors (segment masks, advantage estimators and their registry, losses, diagnostics).

Imports only ``slca.types`` and the private helpers; every other layer builds on it.
"""
