"""Recipes: scripts and their components that build the project's artefacts (not part of the installed ``slca`` package).

``warmstart``: the embedded default model's build (docs/warmstart.md). ``smollm2_toolworld``: the LoRA
adapter that makes SmolLM2-135M-Instruct a toolworld tool caller (``model=smollm2-toolworld``, issue 42;
docs/training.md). The library (``src/slca``) ships the results and loads them; a recipe is needed only to
build one again.
"""
