"""Recipes: scripts and their components that build the project's artefacts (not part of the installed ``slca`` package).

``warmstart``: the embedded default model's build (docs/warmstart.md). The library
(``src/slca``) ships the result and loads it; the recipe is needed only to build it again.
"""
