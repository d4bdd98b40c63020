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
import sys

from posttrain.data.io import load_records
from posttrain.errors import DataError


def completion(rec: dict) -> tuple[tuple | None, str | None]:
    """A dev completion record -> ((n, answer, completion, correct), None), or (None, why it is not one)."""
    prompt, answer = rec.get("prompt"), rec.get("answer")
    if not (isinstance(prompt, str) and prompt.endswith("=") and prompt[:-1].isdigit()):
        return None, f"prompt {prompt!r} is not a Collatz prompt like '27='"
    if not (isinstance(answer, str) and answer.isdigit()):
        return None, f"answer {answer!r} is not a number"
    if not isinstance(rec.get("completion"), str) or not isinstance(rec.get("correct"), bool):
        return None, "completion must be a string and correct true or false"
    return (int(prompt[:-1]), answer, rec["completion"].strip(), rec["correct"]), None


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: collatz_error_positions.py COMPLETIONS.jsonl [...]", file=sys.stderr)
        return 2
    total, wrong = collections.Counter(), collections.Counter()
    where = collections.Counter()
    for path in paths:
        try:  # FILE:LINE on a malformed or foreign line, an empty file refused: nothing silently left out
            records, _ = load_records(path, completion, required=("prompt", "answer", "completion", "correct"))
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for n, a, c, correct in records:
            kind = (len(str(n)), "odd" if n % 2 else "even", len(a))
            total[kind] += 1
            if correct:
                continue
            wrong[kind] += 1
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
