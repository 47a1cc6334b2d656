"""The guides build into a site (`mkdocs build --strict`, as mkdocs.yml configures it), every link
inside the built site leads to a file of it, and the home page and a guide render in headless
Chromium without a failed request, a request off the machine, a script error or a console error.

The browser check needs Playwright and a Chromium binary (Debian's `chromium` package, or one that
`playwright install chromium` fetched); it skips with the reason where either is missing.
Its screenshots go to $GENOFORMER_SITE_SCREENSHOTS when set (`make docs` sets it), else to the
test's temporary folder.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GUIDE = "training/"
"""The guide the browser opens besides the home page: a long page with tables and code."""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built from the working tree by `mkdocs build --strict`, in a temporary folder."""
    pytest.importorskip("mkdocs", reason="mkdocs-material is in the test extras: pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("site")
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # the theme's notice of its successor
    seconds = time.perf_counter() - start
    assert result.returncode == 0, f"mkdocs build --strict failed after {seconds:.1f} s:\n{result.stderr}"
    return out


def test_the_site_has_the_home_page_the_guides_and_the_benchmarks(site):
    home = (site / "index.html").read_text()
    assert "make quickstart" in home and 'href="training/"' in home  # README, its links rewritten
    assert (site / "benchmarks" / "index.html").is_file()
    for guide in ("install", "quickstart", "training", "embed", "scoring", "finetune", "timeseries", "sharing"):
        assert (site / guide / "index.html").is_file(), guide
    assert (site / "quickstart_loss.png").is_file()


def test_a_guide_missing_from_the_nav_still_gets_a_place(tmp_path):
    """The hook puts every guide of docs/ that mkdocs.yml's nav leaves out under "More guides", and
    the design notes under "Design notes"."""
    pytest.importorskip("mkdocs", reason="mkdocs-material is in the test extras: pip install -e '.[dev]'")
    spec = importlib.util.spec_from_file_location("site_hooks", REPO_ROOT / "docs" / "hooks" / "site.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "design").mkdir()
    for name in ("index.md", "listed.md", "new.md", "design/why.md"):
        (tmp_path / name).write_text("# A page\n")
    config = hooks.on_config(
        {"docs_dir": str(tmp_path), "nav": [{"Home": "index.md"}, {"Guides": [{"A": "listed.md"}]}]}
    )
    assert config["nav"][2:] == [{"More guides": ["new.md"]}, {"Design notes": ["design/why.md"]}]


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.targets.append(value)


def _site_file(site: Path, page: Path, target: str) -> Path | None:
    """The file of the site that `target`, linked from `page`, names; None for a link elsewhere."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path:
        return None  # another site, mailto:, or an anchor in the same page
    base = site if parts.path.startswith("/") else page.parent  # 404.html links from the site's root
    path = (base / unquote(parts.path).lstrip("/")).resolve()
    return path / "index.html" if path.is_dir() or target.endswith("/") else path


def test_every_link_inside_the_site_leads_to_a_file_of_it(site):
    broken = []
    for page in sorted(site.rglob("*.html")):
        links = _Links()
        links.feed(page.read_text())
        for target in links.targets:
            path = _site_file(site, page, target)
            if path is not None and not path.is_file():
                broken.append(f"{page.relative_to(site)} -> {target}")
    assert not broken, "links to nothing inside the site:\n" + "\n".join(broken)


def _chromium() -> str | None:
    """A Chromium binary: $CHROMIUM, Debian's, or Playwright's own download."""
    for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        bundled = playwright.chromium.executable_path
    return bundled if Path(bundled).is_file() else None


@pytest.fixture(scope="module")
def served(site):
    """The built site on a local HTTP server: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: pip install playwright")
    executable = _chromium()
    if executable is None:
        pytest.skip("no Chromium binary: apt-get install chromium (or playwright install chromium), or set $CHROMIUM")
    with sync_api.sync_playwright() as playwright:
        # as root, without a sandbox; no background traffic to Google's hosts on a closed network
        chromium = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()


@pytest.mark.parametrize("path, heading", [("", "genoformer"), (GUIDE, "Train a model")], ids=["home", "guide"])
def test_the_page_renders_in_chromium(browser, served, path, heading, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda message: message.type == "error" and problems.append(f"console: {message.text}"))
    page.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    page.on("requestfailed", lambda request: problems.append(f"failed: {request.url} ({request.failure})"))
    page.on(
        "response",
        lambda response: response.status >= 400 and problems.append(f"HTTP {response.status}: {response.url}"),
    )
    page.on(
        "request",
        lambda request: (
            not request.url.startswith((served, "data:")) and problems.append(f"off the machine: {request.url}")
        ),
    )
    page.goto(served + path, wait_until="networkidle")
    assert not problems, "\n".join(problems)
    assert page.locator("article h1").first.inner_text().startswith(heading)
    assert page.locator("nav.md-nav--primary").count() > 0, "the theme's navigation is missing"
    assert page.evaluate("getComputedStyle(document.querySelector('header')).position") == "sticky", (
        "the theme's stylesheet did not apply"
    )
    broken_images = page.evaluate(
        "[...document.images].filter(image => !image.complete || image.naturalWidth === 0).map(image => image.src)"
    )
    assert not broken_images, broken_images
    out = Path(os.environ.get("GENOFORMER_SITE_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / f"{re.sub(r'[^a-z]+', '', path) or 'home'}.png"), full_page=False)
    page.close()
