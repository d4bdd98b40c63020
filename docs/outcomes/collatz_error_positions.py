"""Where a Collatz policy's wrong answers are wrong: accuracy by layout (the number's digits, its parity and the
answer's digits: 1234 -> 617 and 3456 -> 1728 are two layouts of even 4-digit numbers), and which answer digit differs, over the dev-split completions that `benchmarks/bench_outcomes.py` writes.

    .venv/bin/python benchmarks/bench_outcomes.py --task collatz --seeds 0 1 2 3 4 --stages sft grpo --jobs 2 --work W
    .venv/bin/python docs/outcomes/collatz_error_positions.py W/seed*/grpo_dev/completions.jsonl
    .venv/bin/python docs/outcomes/collatz_error_positions.py W/seed*/sft_dev/completions.jsonl   # the SFT start

Each input line is {prompt: "27=", answer: "82", completion, correct}. A wrong answer of the right length is
classed by the positions (from the left, 0 = the leading digit) where it differs from the answer; one of another
length is counted as such.
"""

import collections
import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit("usage: collatz_error_positions.py COMPLETIONS.jsonl [...]")
    total, wrong = collections.Counter(), collections.Counter()
    where = collections.Counter()
    for path in paths:
        for line in Path(path).open():
            r = json.loads(line)
            n = int(r["prompt"].removesuffix("="))
            kind = (len(str(n)), "odd" if n % 2 else "even", len(r["answer"]))
            total[kind] += 1
            if r["correct"]:
                continue
            wrong[kind] += 1
            a, c = r["answer"], r["completion"].strip()
            if len(c) != len(a):
                where["another length"] += 1
                continue
            diff = [i for i in range(len(a)) if a[i] != c[i]]
            where[
                f"{len(a)}-digit answer, digit {diff[0]} only" if len(diff) == 1 else f"{len(a)}-digit answer, several"
            ] += 1
    n_wrong = sum(wrong.values())
    print(f"{len(paths)} file(s), {sum(total.values())} problems, {n_wrong} wrong")
    print("\n| number | answer | problems | accuracy |\n|---|---|---|---|")
    for kind in sorted(total):
        print(
            f"| {kind[0]} digits, {kind[1]} | {kind[2]} digits | {total[kind]} | {1 - wrong[kind] / total[kind]:.3f} |"
        )
    print("\n| wrong answers | count | share |\n|---|---|---|")
    for name, k in where.most_common():
        print(f"| {name} | {k} | {k / n_wrong:.1%} |")


if __name__ == "__main__":
    main(sys.argv[1:])
