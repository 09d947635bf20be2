"""Generation: token batches, the batched multi-turn rollout engine, its shared KV cache and the fused fast paths.

Imports the core math, the chat formats and the types; never the training loop.
"""
