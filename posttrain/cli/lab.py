"""``posttrain lab``: run the notes' experiments on posttrain's own code and check their claims.

    posttrain lab --list
    posttrain lab minhash-variance --out runs/lab/minhash [--quick] [--seed 0]
    posttrain lab all --out runs/labs [--quick]              # + runs/labs/labs.html
    posttrain lab entropy-collapse --device cuda --dtype bf16  # the trainers a lab runs, on a GPU in bf16

Each lab prints its claim, what it measured and whether that agrees within a stated statistical
tolerance, and writes result.json and PNG figures. Exit status 0 when every lab run agrees, 1 when one
disagrees (the implementation or the claim is wrong: read result.json), 2 on a usage error.
"""

from __future__ import annotations

NAME = "lab"
HELP = "run the study notes' experiments (MinHash, LSH, BPE, attention, RL, DPO) on posttrain's code and check them"


def add_arguments(p) -> None:
    p.add_argument("name", nargs="?", metavar="NAME", help="a lab from --list, or 'all'")
    p.add_argument("--list", action="store_true", help="list the labs and exit")
    p.add_argument("--out", metavar="DIR", help="output directory (default runs/lab/NAME; 'all': runs/labs)")
    p.add_argument("--quick", action="store_true", help="small sizes: seconds per lab, weaker but honest checks (CI)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    from posttrain import config as C
    from posttrain.trainers.device_config import DeviceConfig  # no torch: `lab --list` stays light

    C.add_config_flags(p, DeviceConfig, title="device and precision of every trainer a lab runs (DeviceConfig)")


def run(args) -> int:
    from pathlib import Path

    from posttrain.errors import UserError
    from posttrain.labs import LABS

    if args.list:
        width = max(map(len, LABS))
        for name, (_, summary) in LABS.items():
            print(f"{name:<{width}}  {summary}")
        return 0
    if not args.name:
        raise UserError("name a lab (see `posttrain lab --list`) or 'all'")
    if args.name != "all" and args.name not in LABS:
        raise UserError(f"unknown lab {args.name!r}; choose one of: all, {', '.join(LABS)}")
    if not 0 <= args.seed < 2**32:
        raise UserError(f"--seed={args.seed} must be in [0, 2^32)")
    from posttrain import config as C
    from posttrain.trainers.device_config import DeviceConfig

    flags = C.overrides_from_args(args)  # --device / --dtype, checked before any lab runs (no CUDA: exit 2)
    device = C.build_config(DeviceConfig, None, None, flags) if flags else None

    from posttrain.labs import lab_module
    from posttrain.labs._common import pyplot, run_lab

    pyplot()  # the Agg backend before any lab draws
    if args.name != "all":
        out = Path(args.out or f"runs/lab/{args.name}")
        r = run_lab(lab_module(args.name), out, quick=args.quick, seed=args.seed, device=device)
        return 0 if r["agrees"] else 1

    from posttrain.labs.report import write_index

    out = Path(args.out or "runs/labs")
    results = []
    for name in LABS:
        results.append(run_lab(lab_module(name), out / name, quick=args.quick, seed=args.seed, device=device))
        print()
    page = write_index(out, results)
    bad = [r["lab"] for r in results if not r["agrees"]]
    print(
        f"{len(results) - len(bad)}/{len(results)} labs agree ({sum(r['seconds'] for r in results):.1f} s); "
        f"index: {page}"
    )
    if bad:
        print(f"disagree: {', '.join(bad)}")
    return 1 if bad else 0
