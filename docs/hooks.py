"""MkDocs hooks for the bluefog site (mkdocs.yml `hooks:`).

`<!-- bfrun-help -->` in a page becomes the output of `bfrun --help`, and `<!-- ibfrun-help -->`
that of `ibfrun --help`, `ibfrun start --help` and `ibfrun stop --help`, each run from this
checkout's source at build time, so the command-line reference is never a stale copy.

The figures (`figures/NAME.png`, one per entry of docs/figures.py's FIGURES) are drawn from the
results files in docs/data/ and added to the site as generated files, never written into docs/;
`<!-- bench-table: NAME -->` becomes the table NAME of docs/figures.py, from the same files.
Drawn figures are kept in build/figures-cache under a hash of docs/figures.py and docs/data/, so
a rebuild with neither changed draws nothing.

404.html links to the site from "/" (MkDocs without `site_url`), which opened as a file, or from
a server under a sub-path, finds no stylesheet; its links are made relative to the site's root,
where it lies, and a server (not file://) gets `<base href="/">` for a missing page deeper down.
The search index is also written as search/search_index.js, which the theme loads from file://.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

from mkdocs.structure.files import File

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MARKS = {
    "<!-- bfrun-help -->": [["bluefog.run", "--help"]],
    "<!-- ibfrun-help -->": [["bluefog.run.ibfrun", "--help"],
                             ["bluefog.run.ibfrun", "start", "--help"],
                             ["bluefog.run.ibfrun", "stop", "--help"]],
}


def _help(args: list) -> str:
    env = dict(os.environ, PYTHONPATH=_ROOT, COLUMNS="100")
    out = subprocess.run([sys.executable, "-m"] + args, cwd=_ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({out.returncode}): {out.stderr}")
    return out.stdout


_TABLE = re.compile(r"^<!-- bench-table: ([\w-]+) -->$", re.M)  # a line of its own


def _figures():
    sys.path.insert(0, os.path.join(_ROOT, "docs"))
    try:
        import figures  # docs/figures.py: matplotlib, imported only when the site is built
    finally:
        sys.path.pop(0)
    return figures


def _data_hash() -> str:
    h = hashlib.sha256()
    docs = os.path.join(_ROOT, "docs")
    paths = [os.path.join(docs, "figures.py")] + sorted(
        os.path.join(docs, "data", n) for n in os.listdir(os.path.join(docs, "data")))
    for path in paths:
        h.update(os.path.relpath(path, _ROOT).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def on_files(files, config):
    figures = _figures()
    cache = os.path.join(_ROOT, "build", "figures-cache")
    os.makedirs(cache, exist_ok=True)
    key = _data_hash()
    for name in figures.FIGURES:
        path = os.path.join(cache, f"{name}.{key}.png")
        if not os.path.exists(path):
            png = figures.render(name)
            with open(path + ".tmp", "wb") as f:
                f.write(png)
            os.replace(path + ".tmp", path)
        with open(path, "rb") as f:
            files.append(File.generated(config, f"figures/{name}.png", content=f.read()))
    return files


def on_post_template(output: str, template_name: str, config) -> str:  # noqa: ARG001
    if template_name != "404.html":
        return output
    output = re.sub(r'\b(href|src)="/(?!/)', r'\1="./', output)
    output = output.replace('"base": "/"', '"base": "."').replace('"search": "/', '"search": "./')
    base = ("<script>if (location.protocol !== \"file:\") "
            "document.write('<base href=\"/\">')</script>")
    return output.replace("<head>", "<head>" + base, 1)


def on_post_build(config) -> None:
    """The search index as a script too: opened as a file, the theme loads the index through
    search/search_index.js (a page cannot fetch a file), as Material's offline plugin writes it."""
    path = os.path.join(config["site_dir"], "search", "search_index.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            data = f.read()
        with open(path[:-len("json")] + "js", "w", encoding="utf-8") as f:
            f.write(f"var __index = {data}")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' API)
    if "<!-- bench-table:" in markdown:
        figures = _figures()
        markdown = _TABLE.sub(lambda m: figures.table(m.group(1)), markdown)
    for mark, commands in _MARKS.items():
        if mark in markdown:
            text = "\n".join(_help(c).rstrip() + "\n" for c in commands)
            markdown = markdown.replace(mark, "```text\n" + text.rstrip() + "\n```")
    return markdown
