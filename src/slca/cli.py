"""The `slca` command line."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Segment-Locked Credit Assignment for tool-calling RL.")


@app.callback()
def _root() -> None:
    """Segment-Locked Credit Assignment for tool-calling RL."""


@app.command()
def demo() -> None:
    """Show GRPO and SLCA advantages on the paper's diagnostic group."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from slca import grpo_advantages, segment_masks, slca_advantages

    # Four rollouts of one task: tool tokens, an environment token, summary tokens.
    # Rollout 0 makes redundant sequential calls but writes the best summary.
    model_mask = torch.tensor([[1, 1, 1, 0, 1, 1]] * 4)
    tool_r = torch.tensor([0.2, 1.0, 1.0, 0.6])
    sum_r = torch.tensor([1.0, 0.3, 0.5, 0.4])
    tool_m, sum_m = segment_masks(model_mask)
    g = grpo_advantages(tool_r + sum_r, [0] * 4, model_mask)
    s = slca_advantages(tool_r, sum_r, [0] * 4, tool_m, sum_m)
    t = Table(title="diagnostic group: advantage on tool tokens / summary tokens")
    for c in ("rollout", "tool reward", "summary reward", "GRPO tool", "SLCA tool", "GRPO summary", "SLCA summary"):
        t.add_column(c)
    for i in range(4):
        t.add_row(str(i), f"{tool_r[i]:.2f}", f"{sum_r[i]:.2f}", f"{g[i, 0]:+.3f}", f"{s[i, 0]:+.3f}", f"{g[i, -1]:+.3f}", f"{s[i, -1]:+.3f}")
    Console().print(t)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
