"""The documentation site (build/docs, `make docs`) in a real browser: Debian's chromium, headless,
driven by Playwright's Python package (never a browser Playwright downloads).

Served over HTTP from the built folder, every page loads with no console error, no failed
request and no broken image (an <img> that did not load, or loaded with no pixels); the figures
drawn from docs/data/ render at a real size; the site's search finds `neighbor_allreduce`; the
API page lists every name of `bluefog.tensorflow.__all__`; and the 404 page, opened from
file://, shows its message with its stylesheet and no broken image.

`make test` installs chromium (`make browser-deps`) and builds the site (`make docs`) first. Where
chromium cannot be installed the test is skipped, saying so; with CI or BLUEFOG_REQUIRE_BROWSER
set (.ci/run sets it) it fails instead. Without build/docs it builds the site itself.
"""

from __future__ import annotations

import ast
import functools
import glob
import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.path.join(ROOT, "build", "docs")
FIGURES = ("allreduce_latency", "allreduce_busbw", "gloo_one_host", "training_step",
           "tta_hosts", "elastic_recovery", "timeline")

pytestmark = pytest.mark.timeout(300)


def _unavailable(why: str):
    if os.environ.get("CI") or os.environ.get("BLUEFOG_REQUIRE_BROWSER"):
        pytest.fail(f"{why} (CI / BLUEFOG_REQUIRE_BROWSER set: the browser test must run)")
    pytest.skip(why)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    _unavailable("chromium not found on PATH: `make test` installs Debian's chromium "
                 "(make browser-deps: apt-get install chromium), which failed or did not run")
    return ""


def _site() -> str:
    if not os.path.exists(os.path.join(SITE, "index.html")):
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"],
                       cwd=ROOT, check=True, timeout=300,
                       env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    return SITE


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is missing: `make deps` installs requirements.txt")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True,
                              args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def server():
    site = _site()
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=site)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class Page:
    """A browser page that records console errors, uncaught exceptions and failed requests."""

    def __init__(self, browser):
        self.page = browser.new_page()
        self.errors = []
        self.page.on("console",
                     lambda m: self.errors.append(f"console: {m.text}") if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"exception: {e}"))
        # ERR_ABORTED: a request the next navigation cut (the search worker's, mostly).
        self.page.on("requestfailed",
                     lambda r: self.errors.append(f"request failed: {r.url} ({r.failure})")
                     if "ERR_ABORTED" not in (r.failure or "") else None)
        self.page.on("response",
                     lambda r: self.errors.append(f"HTTP {r.status}: {r.url}")
                     if r.status >= 400 else None)

    def goto(self, url: str) -> None:
        self.errors.clear()
        self.page.goto(url, wait_until="load")

    def broken_images(self) -> list:
        return self.page.evaluate(
            "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
            ".map(i => i.getAttribute('src'))")

    def close(self) -> None:
        self.page.close()


def _pages() -> list:
    return sorted(os.path.relpath(p, SITE) for p in glob.glob(os.path.join(_site(), "**",
                                                                           "*.html"),
                                                                  recursive=True)
                  if os.path.basename(p) != "404.html")


def test_every_page_loads_cleanly(browser, server):
    pages = _pages()
    assert len(pages) > 20, pages
    page = Page(browser)
    bad = {}
    try:
        for rel in pages:
            page.goto(f"{server}/{rel}")
            problems = page.errors + [f"broken image: {s}" for s in page.broken_images()]
            if not page.page.title():
                problems.append("no title")
            if problems:
                bad[rel] = problems
    finally:
        page.close()
    assert not bad, bad


def test_figures_render(browser, server):
    page = Page(browser)
    try:
        shown = {}
        for rel in ("benchmarks.html", "performance.html", "elastic.html"):
            page.goto(f"{server}/{rel}")
            assert not page.errors, page.errors
            for img in page.page.evaluate(
                    "Array.from(document.images).filter(i => i.src.includes('figures/'))"
                    ".map(i => ({src: i.getAttribute('src'), w: i.naturalWidth, "
                    "h: i.naturalHeight, shown: i.getBoundingClientRect().width}))"):
                name = os.path.splitext(os.path.basename(img["src"]))[0]
                shown[name] = img
        assert set(shown) == set(FIGURES), sorted(shown)
        for name, img in shown.items():
            # Drawn at 100 dpi from figures several inches wide: hundreds of pixels each way.
            assert img["w"] >= 500 and img["h"] >= 200 and img["shown"] > 100, (name, img)
    finally:
        page.close()


def test_search_finds_neighbor_allreduce(browser, server):
    page = Page(browser)
    try:
        page.goto(f"{server}/index.html")
        page.page.fill("input.md-search__input", "neighbor_allreduce")
        results = page.page.locator(".md-search-result__item")
        results.first.wait_for(timeout=30_000)
        text = page.page.inner_text(".md-search-result")
        assert "neighbor_allreduce" in text, text[:2000]
        links = page.page.eval_on_selector_all(".md-search-result__item a",
                                               "els => els.map(e => e.getAttribute('href'))")
        assert any("api/tensorflow.html" in h for h in links), links
        assert not page.errors, page.errors
    finally:
        page.close()


def _all_names() -> list:
    """`bluefog.tensorflow.__all__`, read from the source (no TensorFlow import)."""
    path = os.path.join(ROOT, "bluefog", "tensorflow", "__init__.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"no __all__ in {path}")


def test_api_page_lists_all(browser, server):
    """Every name of `__all__` has an entry (a heading whose id is its dotted path) on the
    reference page of bluefog.tensorflow, or on the page its own module's entries are on
    (topology_util's graphs, keras's layers), linked from there."""
    names = _all_names()
    assert len(names) > 50, names
    page = Page(browser)
    entries = {}
    try:
        for rel in sorted(os.path.relpath(p, SITE)
                          for p in glob.glob(os.path.join(SITE, "api", "*.html"))):
            page.goto(f"{server}/{rel}")
            assert not page.errors, (rel, page.errors)
            for i in page.page.eval_on_selector_all(".doc-heading[id], h2[id], h3[id]",
                                                    "els => els.map(e => e.id)"):
                entries.setdefault(i.rsplit(".", 1)[-1], []).append(f"{rel}#{i}")
        page.goto(f"{server}/api/tensorflow.html")
        ids = set(page.page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
    finally:
        page.close()
    missing = [n for n in names if n not in entries]
    assert not missing, missing
    on_page = [n for n in names if f"bluefog.tensorflow.{n}" in ids]
    assert len(on_page) > len(names) // 2, on_page


def test_404_page_from_file_url(browser):
    path = os.path.join(_site(), "404.html")
    page = Page(browser)
    try:
        page.goto("file://" + path)
        assert "404" in page.page.inner_text("body")
        assert page.broken_images() == []
        # The theme's stylesheet loaded: Material's header is laid out as a bar, not as text.
        height = page.page.evaluate(
            "document.querySelector('header.md-header').getBoundingClientRect().height")
        assert 30 < height < 120, height
        # Its links lead into the site, as files.
        links = page.page.eval_on_selector_all("nav a[href]", "els => els.map(e => e.href)")
        files = [u[len("file://"):].split("#")[0] for u in links if u.startswith("file://")]
        assert len(files) > 20 and all(os.path.exists(f) for f in files), links
        assert not [e for e in page.errors if "console" in e or "exception" in e], page.errors
    finally:
        page.close()
