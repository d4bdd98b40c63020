"""``labs.html``: one self-contained page for ``posttrain lab all``: a summary table (lab, agrees, seconds,
claim) and, per lab, its claim, formula, checks and figures embedded as base64 PNGs (no external files)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from posttrain.data.io import atomic_write_text
from posttrain.labs._common import png_data_uri

_STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}
.ok{color:#070}.fail{color:#b00;font-weight:bold}img{max-width:100%;border:1px solid #eee}
code{background:#f4f4f4}"""


def write_index(out: Path, results: list[dict]) -> Path:
    """OUT/labs.html from the labs' result dicts (figures read from OUT/<lab>/)."""
    esc = html.escape
    rows, sections = [], []
    for r in results:
        verdict = '<span class="ok">agrees</span>' if r["agrees"] else '<span class="fail">DISAGREES</span>'
        rows.append(
            f'<tr><td><a href="#{esc(r["lab"])}">{esc(r["lab"])}</a></td><td>{verdict}</td>'
            f"<td>{r['seconds']:.1f}</td><td>{esc(r['claim'])}</td></tr>"
        )
        checks = "".join(
            f'<tr><td>{esc(c["name"])}</td><td class="{"ok" if c["ok"] else "fail"}">{"ok" if c["ok"] else "FAIL"}</td>'
            f"<td>{esc(json.dumps(c['measured']))}</td><td>{esc(json.dumps(c['expected']))}</td>"
            f"<td>{esc(c['tolerance'])}</td></tr>"
            for c in r["checks"]
        )
        imgs = "".join(
            f'<p><img alt="{esc(r["lab"])}: {esc(f)}" src="{png_data_uri(out / r["lab"] / f)}"></p>'
            for f in r["figures"]
        )
        sections.append(
            f'<h2 id="{esc(r["lab"])}">{esc(r["lab"])} &mdash; {verdict}</h2>'
            f"<p><b>Claim.</b> {esc(r['claim'])}</p><p><b>Formula.</b> <code>{esc(r['formula'])}</code></p>"
            f"<p><b>Notes.</b> {esc(r['notes'])}</p>"
            f"<table><tr><th>check</th><th></th><th>measured</th><th>expected</th><th>tolerance</th></tr>{checks}</table>"
            f"{imgs}"
        )
    n_ok = sum(r["agrees"] for r in results)
    quick = " (--quick)" if results and results[0].get("quick") else ""
    page = (
        f'<!doctype html><html><head><meta charset="utf-8"><title>posttrain labs</title><style>{_STYLE}</style>'
        f"</head><body><h1>posttrain labs{quick}: {n_ok}/{len(results)} agree</h1>"
        f"<table><tr><th>lab</th><th>verdict</th><th>seconds</th><th>claim</th></tr>{''.join(rows)}</table>"
        f"{''.join(sections)}</body></html>\n"
    )
    path = Path(out) / "labs.html"
    atomic_write_text(path, page)
    return path
