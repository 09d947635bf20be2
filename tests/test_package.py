import subprocess
import sys

import slca


def test_public_api_importable_without_extras():
    # `import slca` must not pull trl / verl / bfcl / tau2
    code = "import sys, slca; bad = [m for m in ('trl', 'verl', 'bfcl_eval', 'tau2') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_all_names_exist():
    for name in slca.__all__:
        assert hasattr(slca, name), name
