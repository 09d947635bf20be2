"""Does the warm start copy? Teacher-forced loss on the assistant tokens that copy the request.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/warmstart_probe.py [--model-dir DIR] [--n 60] [--synthetic 1.0]

Fresh flawless demonstrations (a data seed the build did not use) are encoded with the
copy mask of :func:`recipes.warmstart.sft.copy_mask` (assistant tokens whose id occurs in the
request and not in the system turn: entity, number and date pieces); the script prints
the mean next-token NLL and top-1 accuracy of the model on those tokens and on the other
assistant tokens, the copied ones split into the first piece of a copied run (finding the value
in the request) and later pieces (continuing a copy, what an induction head does). A model that copies has a copy-token NLL near the other tokens'; one
that guesses values from their marginal distribution sits near log(number of values).
"""

from __future__ import annotations

import argparse
import collections

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=None, help="a saved model + tokenizer (default: load_default())")
    ap.add_argument("--n", type=int, default=60, help="demonstrations")
    ap.add_argument("--synthetic", type=float, default=1.0, help="fraction with synthetic entities")
    ap.add_argument("--seed", type=int, default=123, help="data seed (the build uses 0)")
    ap.add_argument("--split", default="train", help="toolworld split of the demonstrated tasks (train, test)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slca.models import import_recipe, load_default

    warmstart = import_recipe()  # recipes/warmstart of this checkout
    DemoMix, make_demonstrations, encode_examples = warmstart.DemoMix, warmstart.make_demonstrations, warmstart.encode_examples

    if args.model_dir:
        tok = AutoTokenizer.from_pretrained(args.model_dir)
        model = AutoModelForCausalLM.from_pretrained(args.model_dir).eval()
    else:
        model, tok = load_default()
    clean = DemoMix(sequential=0, redundant=0, wrong_argument=0, unfaithful=0, incomplete=0, verbose=0)
    demos = make_demonstrations(args.n, clean, seed=args.seed, split=args.split, synthetic=args.synthetic)
    examples, _ = encode_examples(tok, [(d.messages, d.tools) for d in demos], 512, with_copy_mask=True)
    agg: dict[str, list[tuple[float, int]]] = collections.defaultdict(list)
    with torch.no_grad():
        for e in examples:
            ids = torch.tensor([e.input_ids])
            lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            tgt = ids[0, 1:]
            nll = -lp.gather(1, tgt[:, None])[:, 0]
            top = lp.argmax(-1) == tgt
            for t in range(len(tgt)):
                if e.model_mask[t + 1]:
                    kind = "other"
                    if e.copy_mask[t + 1]:
                        kind = "copy, later piece" if e.copy_mask[t] else "copy, first piece"
                    agg[kind].append((float(nll[t]), int(top[t])))
    for k in ("copy, first piece", "copy, later piece", "other"):
        v = agg[k]
        print(f"{k:18s} tokens {len(v):5d}  NLL {sum(a for a, _ in v) / len(v):.3f}  top-1 {sum(b for _, b in v) / len(v):.3f}")


if __name__ == "__main__":
    main()
