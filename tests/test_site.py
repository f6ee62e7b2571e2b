"""The course site (make site) in a real browser: every page opens in headless Chromium with no
console error, every image loads, and every internal link resolves.

The site is built once per session with ``mkdocs build --strict`` (which fails on a link to a
page or anchor the site lacks), served by ``http.server`` on a free port on 127.0.0.1, and every
built page is opened in one browser session: Debian's ``chromium`` driven through selenium and
Debian's ``chromium-driver``. ``make test`` installs both where it runs as root with apt-get;
elsewhere this file is skipped, saying why (in CI, with ``CI`` set, a missing browser fails).
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def _missing() -> str | None:
    for module, extra in (("mkdocs", "site"), ("mkdocs_jupyter", "site"), ("mkdocstrings", "site"), ("selenium", "site")):
        try:
            __import__(module)
        except ImportError:
            return f"needs the {extra} extra ({module} is not installed): pip install -e \".[{extra}]\""
    if not (CHROMIUM and CHROMEDRIVER):
        return ("needs Debian's chromium and chromium-driver (`apt-get install -y chromium chromium-driver`; "
                "make test installs them when run as root)")
    return None


MISSING = _missing()
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built from this tree with --strict into a temporary folder. Without the site
    extra or the browser: skipped, saying what is missing, or failed in CI (``CI`` set), where
    ``make test`` has installed both."""
    if MISSING:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(MISSING)
    out = tmp_path_factory.mktemp("site") / "site"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1200,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


class Served:
    """``directory`` on http://127.0.0.1:PORT/ (a free port), in a thread, for a ``with`` block."""

    def __init__(self, directory):
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


# every image of the page, lazy ones made eager, decoded: the ones that fail (none loaded, or naturalWidth 0)
_BROKEN_IMAGES = """
const done = arguments[arguments.length - 1];
Promise.all([...document.images].map(img => { img.loading = "eager";
    return img.decode().then(() => img.naturalWidth === 0 ? img.src : null, () => img.currentSrc || img.src); }))
  .then(bad => done(bad.filter(x => x)));
"""
_LINKS = "return [...document.querySelectorAll('a[href]')].map(a => a.href)"
_IDS = "return [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.getAttribute('name'))"


def pages(site_dir) -> list[str]:
    """Every built HTML page, relative to the site's folder."""
    return sorted(p.relative_to(site_dir).as_posix() for p in pathlib.Path(site_dir).rglob("*.html"))


def audit(driver, site_dir, only=None) -> list[str]:
    """Open every page of ``site_dir`` (or the pages in ``only``) in ``driver``; the problems:
    a console error (level SEVERE), an image that does not load, an internal link (any href on
    this server) whose target is not served, or whose #anchor the target page lacks."""
    problems, links, ids = [], {}, {}
    with Served(site_dir) as served:
        driver.get_log("browser")  # start from an empty log
        for page in only or pages(site_dir):
            driver.get(served.url + page)
            for img in driver.execute_async_script(_BROKEN_IMAGES):
                problems.append(f"{page}: image does not load: {img}")
            for entry in driver.get_log("browser"):
                if entry["level"] == "SEVERE":
                    problems.append(f"{page}: console error: {entry['message']}")
            ids[served.url + page] = set(driver.execute_script(_IDS))
            for href in driver.execute_script(_LINKS):
                if href.startswith(served.url):
                    links.setdefault(href, page)
        for href, page in sorted(links.items()):
            target, _, anchor = href.partition("#")
            problem = _fetch_problem(target)
            if problem:
                problems.append(f"{page}: broken link {href[len(served.url):]}: {problem}")
            elif anchor and target in ids and urllib.parse.unquote(anchor) not in ids[target]:
                problems.append(f"{page}: broken link {href[len(served.url):]}: no #{anchor} on that page")
    return problems


@functools.lru_cache(maxsize=None)
def _fetch(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _fetch_problem(url: str) -> str | None:
    status = _fetch(url)
    return None if status == 200 else f"HTTP {status}"


@pytest.mark.slow
def test_every_page_renders_with_its_images_and_links(site, browser):
    built = pages(site)
    # the layout the hook promises: home, each lesson's notebook, lab and page, the reference
    from minipar.course import LESSONS

    expected = {"index.html", "reference/minipar.comm.base.html", "reference/minipar.trace.html",
                "reference/minipar.launcher.html"}
    for ls in LESSONS:
        expected |= {f"lessons/{ls.key}_{ls.name}.html", ls.notebook.replace(".ipynb", ".html"), f"{ls.lab}/index.html"}
        expected |= {f"reference/{pkg}.html" for pkg in ls.packages}
    assert expected <= set(built), f"pages missing from the site: {sorted(expected - set(built))}"
    _fetch.cache_clear()
    assert audit(browser, site) == []


def test_the_reference_renders_the_docstrings(site):
    # the communicator's page shows sendrecv with its docstring's words, read from the code
    from minipar.comm.base import Comm

    html = (site / "reference" / "minipar.comm.base.html").read_text()
    first_words = " ".join(Comm.sendrecv.__doc__.split()[:4])
    assert "sendrecv" in html and first_words in " ".join(html.split()), "the reference lacks Comm.sendrecv's docstring"


@pytest.mark.slow
def test_each_check_fails_on_a_planted_fault(site, browser, tmp_path):
    # a copy of the site with one fault per check: a figure deleted, a page a link points to
    # deleted, a script that raises, a link to an anchor its page lacks; each is reported, on the page where it shows
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    image_page = "lessons/01_collectives.html"
    (copy / "figures" / "collectives_busbw.png").unlink()
    link_page = "docs/communicator.html"
    (copy / "docs" / "developing.html").unlink()
    js_page = "docs/sources.html"
    html = (copy / js_page).read_text()
    (copy / js_page).write_text(html.replace("</body>", "<script>minipar_no_such_function()</script>"
                                             '<a href="communicator.html#no-such-anchor">x</a></body>'))
    clean = "reference/index.html"
    _fetch.cache_clear()
    problems = audit(browser, copy, only=[image_page, link_page, js_page, clean])
    assert any(p.startswith(f"{image_page}: image does not load") and "collectives_busbw.png" in p for p in problems), problems
    assert any(p.startswith(f"{link_page}: broken link docs/developing.html") for p in problems), problems
    assert any(p.startswith(f"{js_page}: console error") and "minipar_no_such_function" in p for p in problems), problems
    assert any(p.startswith(f"{js_page}: broken link docs/communicator.html#no-such-anchor: no #no-such-anchor")
               for p in problems), problems
    assert not [p for p in problems if p.startswith(clean)], problems


def test_a_notebook_with_widget_state_is_shown_without_it(tmp_path):
    # stored widget state would make the page fetch the widget manager from a CDN: the site reads
    # a copy without it, and the notebook itself as it is when there is none
    from minipar.cli import website

    nb = {"cells": [], "metadata": {"kernelspec": {"name": "python3"}, "widgets": {"state": {}}},
          "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "w.ipynb").write_text(json.dumps(nb))
    (tmp_path / "notebooks" / "plain.ipynb").write_text(json.dumps({**nb, "metadata": {}}))
    try:
        shown = pathlib.Path(website._source_dir("notebooks/w.ipynb", root=tmp_path)) / "notebooks" / "w.ipynb"
        assert shown.parent.parent != tmp_path
        assert json.loads(shown.read_text())["metadata"] == {"kernelspec": {"name": "python3"}}
        assert website._source_dir("notebooks/plain.ipynb", root=tmp_path) == str(tmp_path)
        assert website._source_dir("docs/x.md", root=tmp_path) == str(tmp_path)
    finally:
        website.on_post_build(None)
    assert not shown.exists(), "the copy outlives the build"
