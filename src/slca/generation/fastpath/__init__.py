"""Fast paths for the two hot loops of a step: rollout decoding and the training pass's log-probabilities.

Both compute what the plain transformers forward computes, in fewer and
larger kernels; each is checked against the plain forward in
``tests/test_fastpath_decode.py`` and ``tests/test_fastpath_logprobs.py`` (tolerances in the module docstrings) and falls back
to the plain forward for models it does not support.
"""

from slca.generation.fastpath.decode import FastBatch, FastDecoder, make_batch, unsupported_reason

__all__ = ["FastBatch", "FastDecoder", "make_batch", "unsupported_reason"]
