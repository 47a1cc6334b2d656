"""MkDocs hooks that build the guides in docs/ into one site with the repository's front pages.

README.md becomes the site's home page and BENCHMARKS.md its benchmarks page, read from the
repository root at build time, so that each is written once. Every page's relative links are
written for the file as it lies in the repository (README's `docs/install.md`, a guide's
`../BENCHMARKS.md`) so that they work when browsing the repository; `on_page_markdown` rewrites
them for the site. An image of the repository outside docs/ (a benchmark's plot) is copied into
the site under repository/; a link to another repository file that is no page of the site (a
config, a script) keeps its text without the link; a link to nothing at all is left for MkDocs to
report, which `mkdocs build --strict` makes an error. The design notes of docs/design/ join the
navigation in name order, and a guide of docs/ that mkdocs.yml's nav does not list joins it under
"More guides", so that a new page is never left out of the site's navigation.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
FRONT_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks.md"}
"""Repository-root files that become pages: file name -> the page's path in the site."""
IMAGES = (".png", ".svg", ".jpg", ".jpeg", ".gif")
COPIED = "repository"
"""The site's folder for the repository's images outside docs/, under their repository paths."""

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"(?P<text>!?\[[^\]\n]*\])\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")


def _nav_files(nav) -> set[str]:
    """The page paths that a navigation (lists of titles and paths) names."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_nav_files(value) for value in nav.values()))
    return set().union(*(_nav_files(item) for item in nav)) if nav else set()


def on_config(config):
    docs_dir = Path(config["docs_dir"])
    listed = _nav_files(config["nav"])
    unlisted = [path.name for path in sorted(docs_dir.glob("*.md")) if path.name not in listed]
    if unlisted:  # a guide added without a place in mkdocs.yml's nav still gets one
        config["nav"].append({"More guides": unlisted})
    design = sorted((docs_dir / "design").glob("*.md"))
    if design:
        config["nav"].append({"Design notes": [f"design/{path.name}" for path in design]})
    return config


def _outside_images(markdown: str, source_dir: Path, docs_dir: Path) -> set[Path]:
    """The repository's image files outside docs/ that `markdown` links to."""
    found = set()
    for match in LINK.finditer(FENCE.sub("", markdown)):
        path = match["target"].partition("#")[0]
        if path and not re.match(r"^[a-z][a-z0-9+.-]*:", path) and not path.startswith("/"):
            real = (source_dir / path).resolve()
            if (
                real.suffix.lower() in IMAGES
                and real.is_file()
                and real.is_relative_to(ROOT)
                and not real.is_relative_to(docs_dir)
            ):
                found.add(real)
    return found


def on_files(files, config):
    docs_dir = Path(config["docs_dir"]).resolve()
    for name, page in FRONT_PAGES.items():
        files.append(File.generated(config, page, abs_src_path=str(ROOT / name)))
    sources = [(ROOT / name, ROOT) for name in FRONT_PAGES]
    sources += [
        (Path(file.abs_src_path), Path(file.abs_src_path).parent)
        for file in files.documentation_pages()
        if file.src_uri not in FRONT_PAGES.values()
    ]
    images = set().union(*(_outside_images(path.read_text(), folder.resolve(), docs_dir) for path, folder in sources))
    for image in sorted(images):
        files.append(File.generated(config, f"{COPIED}/{image.relative_to(ROOT).as_posix()}", abs_src_path=str(image)))
    return files


def _source_dir(page, config) -> Path:
    """The folder in the repository that the page's relative links start from."""
    if page.file.src_uri in FRONT_PAGES.values():
        return ROOT
    return (Path(config["docs_dir"]) / page.file.src_uri).parent


def _site_target(target: str, source_dir: Path, page_dir: Path, docs_dir: Path) -> str | None:
    """The link target for the site, or None when the target is a repository file outside it."""
    path, hash_mark, anchor = target.partition("#")
    if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
        return target  # an anchor in the page, a URL, or an absolute path: as written
    real = (source_dir / path).resolve()
    if real.is_relative_to(ROOT) and str(real.relative_to(ROOT)) in FRONT_PAGES:
        real = docs_dir / FRONT_PAGES[str(real.relative_to(ROOT))]
    elif real.is_relative_to(docs_dir) or not real.exists():
        pass  # a page or file of the site, or nothing at all (MkDocs says so)
    elif real.is_relative_to(ROOT) and real.suffix.lower() in IMAGES:
        real = docs_dir / COPIED / real.relative_to(ROOT)
    else:
        return None
    return os.path.relpath(real, page_dir).replace(os.sep, "/") + hash_mark + anchor


def on_page_markdown(markdown, page, config, files):
    docs_dir = Path(config["docs_dir"]).resolve()
    source_dir = _source_dir(page, config).resolve()
    page_dir = (docs_dir / page.file.src_uri).parent

    def rewrite(match: re.Match) -> str:
        target = _site_target(match["target"], source_dir, page_dir, docs_dir)
        if target is None:
            return match["text"][1:-1] if not match["text"].startswith("!") else match["text"][2:-1]
        return f"{match['text']}({target}{match['title'] or ''})"

    pieces, end = [], 0
    for fence in FENCE.finditer(markdown):
        pieces += [LINK.sub(rewrite, markdown[end : fence.start()]), fence.group(0)]
        end = fence.end()
    pieces.append(LINK.sub(rewrite, markdown[end:]))
    return "".join(pieces)
