"""Examples in docstrings and in README.md run and print what they say."""

import doctest
import re
from pathlib import Path

import pytest

import slca.advantages
import slca.segments

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", [slca.segments, slca.advantages])
def test_docstring_examples(module):
    res = doctest.testmod(module, verbose=False)
    assert res.attempted > 0 and res.failed == 0


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    for code in blocks:
        ns: dict = {}
        exec(compile(code, "README.md", "exec"), ns)
    adv = ns["adv"]
    assert adv.shape == (2, 7) and adv[0, 0] < 0 < adv[0, -1]  # locked: bad calls punished, good summary rewarded
