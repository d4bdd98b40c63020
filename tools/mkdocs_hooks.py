"""mkdocs hooks: links from docs/ to the repository's source files (``../posttrain/x.py``) become code spans.

The site holds docs/ only, so such a link has no page to point at; the markdown keeps it (it works on a forge and in
an editor, and tests/test_docs_links.py checks the file exists), and the site shows the path. Links between pages
are left to mkdocs, whose ``--strict`` build fails on a broken one.
"""

from __future__ import annotations

import posixpath
import re

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
    src_dir = posixpath.dirname(page.file.src_uri)

    def outside(match):
        text, target = match.group(1), match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            return match.group(0)
        resolved = posixpath.normpath(posixpath.join(src_dir, target))
        if not resolved.startswith("../"):
            return match.group(0)
        path = resolved.lstrip("./")
        plain = text.strip("`")
        return f"`{path}`" if plain in (path, posixpath.basename(path)) else f"{text} (`{path}`)"

    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(outside, line))
    return "\n".join(out)


ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):(?=<code>)")
CODE = re.compile(r"<code>.*?</code>", re.S)


def on_page_content(html, page, config, files):
    """Docstrings cross-reference in Sphinx's roles (``:func:`x```); the site shows the code span without the role.
    A pipe in a table's code span is written ``\\|`` (as GitHub wants); the site shows it as ``|``."""
    html = ROLE.sub("", html)
    return CODE.sub(lambda m: m.group(0).replace("\\|", "|"), html)
