"""Training: the config, the policy loader, the loop, its step statistics, recorded sample groups, run folders and trackers.

Imports the core math, generation, the environment and the rewards; never the reports or the command.
"""
