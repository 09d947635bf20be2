"""Your own reward for slca train: `--set reward=examples/python_tools/rewards.py:reward`.

slca calls it once per rollout with the finished trajectory and trains each tier on what it returns:
the execution tier routes to the tool-calling tokens, the summary tier to the final answer.
Return None for a tier you cannot score on a rollout (its advantage is then 0, and the reason is printed).
"""


def reward(trajectory):
    """Execution: the share of the gold calls (name and arguments) the rollout made and that ran.
    Summary: 1 when every answer fact of the task appears in the final answer, else 0
    (None when the task lists no facts)."""
    made = {(c.name, repr(sorted(c.arguments.items())))
            for turn in trajectory.turns
            for c, result in zip(turn.parsed.calls, turn.results) if result.ok}
    gold = [(c.name, repr(sorted(c.arguments.items()))) for step in trajectory.task.gold for c in step]
    execution = sum(g in made for g in gold) / len(gold) if gold else float(not made)
    facts = trajectory.task.answer_facts
    answer = trajectory.final_text.lower()
    summary = float(all(f.lower() in answer for f in facts)) if facts else None
    return execution, summary
