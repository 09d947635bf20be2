"""Parsing time of hostile model output as it grows: linear means the time per KB stays flat.

Cases from issue 16: many unclosed ``<tool_call>`` tags (hermes, json_list), many
``;``-separated llama3 calls, one call nested deep. Prints one row per case and
size: size in KB, best-of-``--repeats`` CPU seconds (``time.process_time``: a shared machine does not
skew it), microseconds per KB.

    PYTHONPATH=src python benchmarks/bench_hostile_parse.py [--tiny] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from slca.chat import get_format

CASES = {
    "unclosed_tags/hermes": ("hermes", lambda n: "<tool_call>" * n),
    "unclosed_tags/json_list": ("json_list", lambda n: "<tool_call>" * n),
    "semicolon_calls/llama3_json": ("llama3_json", lambda n: '{"name": "f", "parameters": {}}; ' * n),
    "deep_args/hermes": ("hermes", lambda n: '<tool_call>{"name": "f", "arguments": {"x": ' + "[" * n + "]" * n + "}}</tool_call>"),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    sizes = [500, 1000, 2000] if args.tiny else [8000, 16000, 32000, 64000]
    print(f"{'case':30s} {'n':>7s} {'KB':>8s} {'cpu_s':>9s} {'us/KB':>8s}")
    for case, (fmt_name, make) in CASES.items():
        fmt = get_format(fmt_name)
        for n in sizes:
            text = make(n)
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.process_time()
                fmt.parse(text)
                best = min(best, time.process_time() - t0)
            kb = len(text) / 1000
            print(f"{case:30s} {n:7d} {kb:8.1f} {best:9.4f} {best / kb * 1e6:8.1f}")


if __name__ == "__main__":
    main()
