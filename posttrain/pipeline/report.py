"""The run's report: ``report.md`` and one self-contained ``report.html`` (figures embedded as base64 PNG).

The report is a list of blocks (heading, paragraph, table, image) rendered twice, so the two files always
hold the same content. Every stage gets a section built from its declared schema
(:class:`~posttrain.pipeline.stages.Metric`): a skipped stage's section says why, and a stage that ran without
producing a declared metric shows "missing" (a test checks none does). :func:`compare_runs` is
``posttrain report RUN_A RUN_B``: two runs' summaries side by side.
"""

from __future__ import annotations

import base64
import html
import json
import time
from pathlib import Path

from posttrain.data.io import atomic_write_text
from posttrain.errors import UserError
from posttrain.pipeline import plots
from posttrain.pipeline.base import LABELS, get, heldout_table


def fmt(v, f: str = "{}") -> str:
    if v is None:
        return "missing"
    if isinstance(v, float) and f == "{}":
        f = "{:.4g}"
    try:
        return f.format(v)
    except (ValueError, TypeError):
        return str(v)


def render_md(blocks) -> str:
    out = []
    for b in blocks:
        if b[0] == "h":
            out.append("#" * b[1] + " " + b[2])
        elif b[0] == "p":
            out.append(b[1])
        elif b[0] == "table":
            out.append("| " + " | ".join(b[1]) + " |")
            out.append("|" + "|".join("---" for _ in b[1]) + "|")
            out += ["| " + " | ".join(str(c) for c in row) + " |" for row in b[2]]
        elif b[0] == "img":
            out.append(f"![{b[2]}]({b[1].name})")
        out.append("")
    return "\n".join(out)


def render_html(blocks, title: str) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
        "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:90%}"
        "th{background:#f3f3f3}img{max-width:100%}code{background:#f6f6f6}</style></head><body>"
    ]
    for b in blocks:
        if b[0] == "h":
            parts.append(f"<h{b[1]}>{html.escape(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            parts.append(f"<p>{html.escape(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{html.escape(str(c))}</th>" for c in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in b[2])
            parts.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif b[0] == "img":
            data = base64.b64encode(b[1].read_bytes()).decode()
            parts.append(f"<p><img alt='{html.escape(b[2])}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>")
    return "".join(parts)


def _mb(x) -> str:
    return f"{x:.0f} MiB" if isinstance(x, (int, float)) else "-"


def stage_table(ctx) -> list[list]:
    rows = []
    for s in ctx.stages:
        done = ctx.done.get(s.name)
        status = ctx.statuses.get(s.name, "running" if s.name == "report" else "skipped")
        if done is None:
            rows.append([s.name, status, "-", "-", "-"])
            continue
        key = "; ".join(f"{m.label} {fmt(get(done['summary'], m.key), m.fmt)}" for m in s.schema[:3])
        rows.append([s.name, status, f"{done['wall_s']:.1f} s", _mb(done.get("peak_rss_mb")), key])
    return rows


def write_report(ctx, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    h = ctx.header
    elapsed = time.perf_counter() - ctx.started
    table = heldout_table(ctx)
    blocks: list[tuple] = [
        ("h", 1, f"posttrain pipeline: {ctx.run_dir.name}"),
        (
            "p",
            f"commit {h['commit']} · {h['machine']} · python {h['python']} · torch {h['torch']} · "
            f"posttrain {h['posttrain']} · preset {h['preset']} · seed {h['seed']} · "
            f"total {sum(d['wall_s'] for d in ctx.done.values()):.1f} s of stage wall time (as each stage ran; "
            f"{elapsed:.1f} s in this invocation before the report)",
        ),
        ("p", "One seed: outcomes vary from seed to seed (benchmarks/bench_pipeline.py for mean ± sd over seeds)."),
    ]
    ev = ctx.summary("eval") or {}
    n, k = ev.get("n"), ev.get("samples")
    blocks += [
        ("h", 2, "Held-out accuracy"),
        (
            "p",
            f"{n} held-out prompts; greedy decoding, and {k} samples per prompt at temperature "
            f"{ev.get('temperature')} (pass@1 = their mean accuracy, pass@{k} = any of them correct).",
        ),
        (
            "table",
            ["model", "greedy", "pass@1", f"pass@{k}"],
            [
                [
                    LABELS.get(m, m),
                    fmt(r["greedy"], "{:.3f}"),
                    fmt(r["pass@1"], "{:.3f}") if r["pass@1"] is not None else "-",
                    fmt(r["pass@k"], "{:.3f}") if r["pass@k"] is not None else "-",
                ]
                for m, r in table.items()
            ],
        ),
    ]
    blocks += layout_blocks(ev.get("heldout_all"))
    figs = out
    img = plots.accuracy_bars(table, LABELS, figs)
    if img:
        blocks.append(("img", img, "held-out accuracy"))
    blocks += [
        ("h", 2, "Stages"),
        ("table", ["stage", "status", "wall time", "peak RSS", "key metrics"], stage_table(ctx)),
    ]
    sections = []
    for s in ctx.stages:
        if s.name == "report":
            continue
        sections.append(s.name)
        blocks.append(("h", 2, f"Stage {s.name}: {s.title}"))
        done = ctx.done.get(s.name)
        if done is None:
            blocks.append(("p", f"Skipped: {ctx.notes.get(s.name, 'not run in this invocation')}."))
            continue
        blocks.append(
            ("table", ["metric", "value"], [[m.label, fmt(get(done["summary"], m.key), m.fmt)] for m in s.schema])
        )
        blocks += _extra(ctx, s.name, done["summary"], figs)
    if ctx.done.get("sft") or ctx.done.get("dpo"):
        img = plots.training_loss(
            ctx.run_dir, [x for x in ("sft", "sft_raw", "rm", "dpo", "grpo", "ppo") if x in ctx.done], figs
        )
        if img:
            blocks += [("h", 2, "Training loss"), ("img", img, "training loss per stage")]
    atomic_write_text(out / "report.md", render_md(blocks))
    atomic_write_text(out / "report.html", render_html(blocks, f"posttrain pipeline {ctx.run_dir.name}"))
    return {
        "sections": sections,
        "figures": sorted(p.name for p in out.glob("*.png")),
        "md": str(out / "report.md"),
        "html": str(out / "report.html"),
    }


def layout_blocks(heldout_all: dict | None) -> list[tuple]:
    """The eval stage's greedy accuracy on the whole held-out split, overall and per operand layout (most common
    layout first); [] when it was not measured (a user eval_file, or eval.heldout_all off)."""
    if not heldout_all:
        return []
    first = next(iter(heldout_all.values()))
    keys = sorted(first["by_layout"], key=lambda k: (-first["by_layout"][k]["n"], k))
    head = ["model", f"all {first['n']}"] + [f"{k} (n={first['by_layout'][k]['n']})" for k in keys]
    rows = [
        [LABELS.get(m, m), f"{r['greedy_accuracy']:.3f}"]
        + [f"{r['by_layout'][k]['accuracy']:.3f}" if k in r["by_layout"] else "-" for k in keys]
        for m, r in heldout_all.items()
    ]
    return [
        (
            "p",
            f"Greedy accuracy on all {first['n']} problems of the held-out split, and per operand layout (the "
            "operands' digit counts: where each digit sits in the sequence). With learned absolute positions "
            "the one-digit layouts generalise least (docs/outcomes.md).",
        ),
        ("table", head, rows),
    ]


def _extra(ctx, name: str, s: dict, figs: Path) -> list[tuple]:
    """Per-stage text and figures beyond the schema table."""
    b: list[tuple] = []
    if name == "dedup":
        if "injected" in s:
            inj, rem, ok = s["injected"], s["removed"], s["counts_match"]
            b.append(
                (
                    "table",
                    ["kind", "injected", "removed", "expected (method)", "match"],
                    [
                        ["exact duplicates", inj["exact"], rem["exact"], inj["exact"], "yes" if ok["exact"] else "NO"],
                        [
                            "near duplicates",
                            inj["near"],
                            rem["near"],
                            f"{s['expected_near_found']} ± {3 * s['expected_near_sd']:.1f} (3 s.d.; {s['injected_near_above_threshold']} "
                            f"of {inj['near']} at Jaccard >= threshold)",
                            "yes" if ok["near"] else "NO",
                        ],
                        [
                            "leaked eval items",
                            inj["leak"],
                            rem["contamination"],
                            inj["leak"],
                            "yes" if ok["contamination"] else "NO",
                        ],
                    ],
                )
            )
        img = plots.lsh_curve(s, figs)
        if img:
            b.append(("img", img, "LSH S-curve"))
    elif name == "tokenizer" and s.get("example"):
        if s.get("note"):
            b.append(("p", s["note"]))
        b.append(
            (
                "p",
                f"'{s['example']['text']}' -> {' '.join(s['example']['tokens'])}  ({s['tokens']} tokens for "
                f"{s['words']} words, {s['bytes']} bytes)",
            )
        )
        img = plots.tokens_per_word(s, figs)
        if img:
            b.append(("img", img, "tokens per word"))
    elif name == "sft" and ctx.cfg.hf_model:
        b.append(
            (
                "p",
                f"Started from the Hugging Face model {ctx.cfg.hf_model} (model_path; its own tokenizer, "
                f"[sft.model] ignored); rm, dpo, grpo and ppo start from this SFT checkpoint.",
            )
        )
    elif name == "sft_raw":
        c = (ctx.summary("eval") or {}).get("contamination")
        if c:
            b.append(
                (
                    "p",
                    "What contamination costs: greedy accuracy on the held-out items that were leaked into the raw "
                    "corpus, and on the rest. Training on the raw corpus inflates the leaked items' number; the "
                    "clean SFT never saw them.",
                )
            )
            b.append(
                (
                    "table",
                    [
                        "model",
                        f"leaked items (n={next(iter(c.values()))['n_leaked']})",
                        f"other items (n={next(iter(c.values()))['n_clean']})",
                    ],
                    [[LABELS.get(m, m), f"{r['leaked']:.3f}", f"{r['clean']:.3f}"] for m, r in c.items()],
                )
            )
    elif name == "rm":
        img = plots.rm_plot(ctx.run_dir, ctx.summary("eval"), figs)
        if img:
            b.append(("img", img, "reward model"))
    elif name == "dpo":
        img = plots.dpo_logps(ctx.run_dir, figs)
        if img:
            b.append(("img", img, "DPO log-probs"))
    elif name == "grpo" or (name == "ppo" and "grpo" not in ctx.done):
        img = plots.rl_curves(ctx.run_dir, [m for m in ("grpo", "ppo") if m in ctx.done], figs)
        if img:
            b.append(("img", img, "RL curves"))
    return b


# ---------------------------------------------------------------------------------------------
# posttrain report RUN_A RUN_B


def load_run_summary(run: str | Path) -> dict:
    """A pipeline run's ``summary.json``, checked to have the shape :func:`compare_runs` reads: an object whose
    ``stages`` and ``heldout`` (when present) map names to objects, a stage's ``metrics`` an object too. Anything
    else (``{"stages": 5}``, a list, garbage) is a one-line UserError naming the file."""
    from posttrain.checkpoints.layout import read_json_file

    p = Path(run) / "summary.json"
    if not p.is_file():
        raise UserError(f"{p}: no run summary (is {run} a `posttrain pipeline` output directory?)")
    obj = read_json_file(p, "run summary")
    for key in ("stages", "heldout"):
        part = obj.setdefault(key, {})
        if not isinstance(part, dict):
            raise UserError(f"{p}: corrupt run summary ({key!r} is {_kind(part)}, expected an object)")
        for name, entry in part.items():
            if not isinstance(entry, dict):
                raise UserError(f"{p}: corrupt run summary ({key}.{name} is {_kind(entry)}, expected an object)")
            metrics = entry.get("metrics")
            if key == "stages" and metrics is not None and not isinstance(metrics, dict):
                raise UserError(
                    f"{p}: corrupt run summary ({key}.{name}.metrics is {_kind(metrics)}, expected an object)"
                )
    return obj


def _kind(v) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def compare_runs(a: str | Path, b: str | Path, stages) -> str:
    """A markdown side-by-side of two runs: header, held-out accuracy, per-stage wall time and metrics."""
    sa, sb = load_run_summary(a), load_run_summary(b)
    blocks: list[tuple] = [
        ("h", 1, f"{Path(a).name} vs {Path(b).name}"),
        (
            "table",
            ["", str(a), str(b)],
            [[k, sa.get(k), sb.get(k)] for k in ("commit", "preset", "seed", "torch", "total_seconds")],
        ),
    ]
    names = list(dict.fromkeys(list(sa.get("heldout", {})) + list(sb.get("heldout", {}))))
    rows = []
    for m in names:
        ra, rb = sa["heldout"].get(m, {}), sb["heldout"].get(m, {})
        ga, gb = ra.get("greedy"), rb.get("greedy")
        delta = f"{gb - ga:+.3f}" if isinstance(ga, float) and isinstance(gb, float) else "-"
        rows.append([LABELS.get(m, m), fmt(ga, "{:.3f}"), fmt(gb, "{:.3f}"), delta])
    blocks += [("h", 2, "Held-out greedy accuracy"), ("table", ["model", str(a), str(b), "b - a"], rows)]
    rows = []
    for st in stages:
        ea, eb = sa["stages"].get(st.name, {}), sb["stages"].get(st.name, {})
        for m in st.schema:
            va, vb = (ea.get("metrics") or {}).get(m.key), (eb.get("metrics") or {}).get(m.key)
            if va is not None or vb is not None:
                rows.append([st.name, m.label, fmt(va, m.fmt), fmt(vb, m.fmt)])
        rows.append([st.name, "wall time (s)", fmt(ea.get("wall_s")), fmt(eb.get("wall_s"))])
    blocks += [("h", 2, "Stages"), ("table", ["stage", "metric", str(a), str(b)], rows)]
    return render_md(blocks)
