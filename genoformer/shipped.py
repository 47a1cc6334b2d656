"""What ships with genoformer: the recipes (configs/), the example data (examples/) and the names
of the pretrained models.

The same files serve a git clone and an installed wheel. In a clone they are the top-level
folders configs/ and examples/; a wheel installs them as the package data `genoformer.configs`
and `genoformer.examples` (pyproject.toml maps the folders, as it maps kernels/ and data/), the
example data without the models (.ckpt files stay out of the wheel):

    configs_dir()           the recipes and the fragments they include (base/, models/, strategies/)
    recipe_path("quickstart")   a recipe by name (or a path as it is): what `--config quickstart` reads
    shipped_recipes()       every recipe with its one-line summary
    compose_config(path)    a config file with the fragments it includes merged in
    examples_dir()          the example data (FASTA, TSV, CSV)
    PRETRAINED              the pretrained models by name (`--checkpoint genoformer-dna`); where they
                            are found: `genoformer.core.checkpoints.resolve_checkpoint`

and the two commands that hand them to a user: `genoformer recipes` (lists the recipes; --copy
writes the configs/ folder to edit) and `genoformer examples` (writes the example data).

This module imports no torch (the CLI's usage and `--help` read it).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import get_loader

import genoformer

PACKAGE = Path(genoformer.__file__).resolve().parent
"""The genoformer package folder: in a wheel, site-packages/genoformer with configs/ and examples/ inside."""

EXAMPLE_SUFFIXES = (".fasta.gz", ".fa.gz", ".tsv", ".csv")
"""The example data files (the wheel's package data); the models (.ckpt) are not among them."""


def checkout_root() -> Optional[Path]:
    """The root of the git clone this genoformer runs from (an editable install or `python cli.py`),
    or None for an installed wheel."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "kernels" / "__init__.py").is_file() else None


def _shipped_folder(name: str) -> Path:
    root = checkout_root()
    return (root if root is not None else PACKAGE) / name


def configs_dir() -> Path:
    """The shipped configs/ folder: the clone's, or the installed package's copy."""
    return _shipped_folder("configs")


def examples_dir() -> Path:
    """The shipped examples/ folder: the clone's (with the pretrained models), or the installed
    package's copy (the example data only)."""
    return _shipped_folder("examples")


# ----------------------------------------------------------------------- recipes
@dataclasses.dataclass(frozen=True)
class Recipe:
    """A shipped recipe: a top-level YAML file of configs/ (the folders below hold fragments)."""

    name: str
    """Its file name without .yaml: what `--config NAME` takes."""
    path: Path
    summary: str
    """The first sentence of its leading comment."""


def shipped_recipes() -> list[Recipe]:
    """Every shipped recipe, by name."""
    return [Recipe(path.stem, path, _summary(path)) for path in sorted(configs_dir().glob("*.yaml"))]


SUMMARY_WIDTH = 90
_SENTENCE_END = re.compile(r"(?<!\b[A-Z])\.(?=\s+[A-Z(]|$)")
"""A period that ends a sentence: before a capital or the end, and not after an initial (E. coli)."""


def _summary(path: Path) -> str:
    """One line from the comment a recipe starts with: its first sentence, up to its first colon
    where what comes before it is long enough to say something, shortened to SUMMARY_WIDTH."""
    prose = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text or text.startswith(("genoformer ", "include:")):
            break  # the comment's prose ends at a blank line or a command
        prose.append(text)
    words = " ".join(prose)
    end = _SENTENCE_END.search(words)
    sentence = words[: end.start()] if end else words
    colon = sentence.find(": ")
    if colon >= 30:
        sentence = sentence[:colon]
    if len(sentence) > SUMMARY_WIDTH:
        sentence = sentence[: SUMMARY_WIDTH - 3].rsplit(" ", 1)[0].rstrip(",;:(") + "..."
    return sentence


def recipe_path(name_or_path: str | os.PathLike) -> Path:
    """The config file `--config` reads: a path that exists as it is; otherwise a shipped recipe
    named by its name (`quickstart`, or `quickstart.yaml`). FileNotFoundError naming the shipped
    recipes when it is neither."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = {recipe.name: recipe.path for recipe in shipped_recipes()}
    name = path.name[: -len(".yaml")] if path.name.endswith(".yaml") else path.name
    if name in shipped and (len(path.parts) == 1 or path.parent.name == "configs"):
        return shipped[name]
    near = difflib.get_close_matches(name, shipped, n=1)
    guess = f" (did you mean {near[0]}?)" if near else ""
    raise FileNotFoundError(
        f"no config file {path} here, nor a shipped recipe of that name{guess}; give a YAML file's path or one of "
        f"the shipped recipes by name: {', '.join(shipped)} (`genoformer recipes` lists them)"
    )


def is_recipe_name(text: str) -> bool:
    """Whether `text` names a shipped recipe rather than a file that exists."""
    if Path(text).exists():
        return False
    try:
        recipe_path(text)
    except FileNotFoundError:
        return False
    return True


# ----------------------------------------------------------------------- composed config files
class QuotedStrings(yaml.SafeDumper):
    """Writes every string quoted, so that it reads back as a string (`"1e-3"`, `"00:15:00"`)."""


QuotedStrings.add_representer(
    str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style='"')
)


INCLUDE_KEY = "include"
"""The top-level key of a config file that names the fragments it builds on."""


def compose_config(path: str | os.PathLike, _included_by: tuple[Path, ...] = ()) -> Any:
    """The YAML content of config file `path` with the fragments it includes merged in, read as
    jsonargparse reads YAML; a file without `include:` is returned as it is.

    An include is relative to the file that names it or, when it is not there, to the shipped
    configs/ folder (`configs_dir()`: the clone's, or the installed package's), so that a copy of
    a shipped recipe still finds its fragments."""
    path = Path(path)
    if path.resolve() in _included_by:
        chain = " -> ".join(str(p) for p in (*_included_by, path.resolve()))
        raise ValueError(f"config fragments include each other in a circle: {chain}; remove one of the includes")
    try:
        content = get_loader("yaml")(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {error}") from error
    if not isinstance(content, dict) or INCLUDE_KEY not in content:
        return content
    names = content.pop(INCLUDE_KEY)
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"{path}: `{INCLUDE_KEY}:` takes a fragment's path or a list of paths, not {names!r}")
    composed: dict[str, Any] = {}
    for name in names:
        fragment = path.parent / name
        if not fragment.is_file():
            fragment = configs_dir() / name
        if not fragment.is_file():
            raise FileNotFoundError(
                f"{path} includes {name}, but there is no {path.parent / name} (an include is relative to the "
                f"file that names it) nor a shipped {fragment}: put the fragment there, or give its path"
            )
        composed = _merged(composed, compose_config(fragment, (*_included_by, path.resolve())))
    return _merged(composed, content)


def _merged(base: Any, override: Any) -> Any:
    """`override` over `base`: mappings key by key, anything else replaced; a mapping that names
    another class_path replaces the other whole (its arguments are another class's)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    if "class_path" in base and "class_path" in override and base["class_path"] != override["class_path"]:
        return override
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _merged(base[key], value) if key in base else value
    return merged


# ----------------------------------------------------------------------- example data
def example_files() -> list[Path]:
    """The shipped example data files (not the models)."""
    return sorted(path for path in examples_dir().iterdir() if path.name.endswith(EXAMPLE_SUFFIXES))


def examples(*, out: Path = Path("examples"), overwrite: bool = False) -> Path:
    """Write the example data (genomes, variants, labels, an ECG series) into a folder, examples/ by default.

    The files the quick start, the recipes and the documentation's commands read as examples/...:
    run it where you run them, and they work as written. The pretrained models are not files to
    copy: name them (--checkpoint genoformer-dna, genoformer-gene-annotator, genoformer-forecaster).

    Args:
        out: The folder to write into (created).
        overwrite: A flag: replace files of the same names there.
    """
    out = Path(out)
    files = example_files()
    clashes = [out / path.name for path in files if (out / path.name).exists()]
    if clashes and not overwrite:
        raise FileExistsError(f"{', '.join(map(str, clashes))} exist already; pass --overwrite to replace them")
    out.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copyfile(path, out / path.name)
    size = sum(path.stat().st_size for path in files) / 2**20
    print(f"wrote {len(files)} example files ({size:.1f} MiB) to {out}: {', '.join(path.name for path in files)}")
    print(f"pretrained models, by name: {', '.join(PRETRAINED)} (e.g. --checkpoint genoformer-dna)")
    return out


def recipes(*, copy: Optional[Path] = None, overwrite: bool = False) -> None:
    """List the shipped recipes (configs), one line each; --copy DIR writes them into a folder to edit.

    Train with one by its name: `genoformer fit --config quickstart` (or by its path, as a copy you
    edited: --config configs/quickstart.yaml). A recipe includes fragments (configs/base/,
    models/); a copy finds them beside itself, else in the shipped folder.

    Args:
        copy: Write the configs folder (recipes and fragments) into this folder (created).
        overwrite: A flag: with --copy, replace files of the same names there.
    """
    listed = shipped_recipes()
    width = max(len(recipe.name) for recipe in listed) + 2
    for recipe in listed:
        print(f"{recipe.name:<{width}}{recipe.summary}")
    print(f"\n{len(listed)} recipes in {configs_dir()}; train with one: genoformer fit --config NAME")
    if copy is None:
        return
    source, out = configs_dir(), Path(copy)
    files = sorted(path for path in source.rglob("*.yaml"))
    clashes = [out / path.relative_to(source) for path in files if (out / path.relative_to(source)).exists()]
    if clashes and not overwrite:
        raise FileExistsError(
            f"{', '.join(map(str, clashes[:3]))}{' ...' if len(clashes) > 3 else ''} exist "
            "already; pass --overwrite to replace them"
        )
    for path in files:
        (out / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / path.relative_to(source))
    print(f"wrote {len(files)} config files to {out}: edit one, then genoformer fit --config {out / 'quickstart.yaml'}")


# ----------------------------------------------------------------------- pretrained models
@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A pretrained model genoformer names: `--checkpoint NAME` reads it wherever it is found
    (`genoformer.core.checkpoints.resolve_checkpoint`)."""

    name: str
    file: str
    """Its file in a clone's examples/ and in the local model cache (`model_cache()`)."""
    hub_id: str
    """Its Hugging Face Hub repository (a directory of `genoformer export --format hf`)."""
    description: str


PRETRAINED = {
    model.name: model
    for model in (
        Pretrained(
            "genoformer-dna",
            "genoformer_dna.ckpt",
            "genoformer/genoformer-dna",
            "causal DNA language model, 8,192 to 32,768 bases of context",
        ),
        Pretrained(
            "genoformer-gene-annotator",
            "genoformer_gene_annotator.ckpt",
            "genoformer/genoformer-gene-annotator",
            "bacterial gene annotator (per-base coding classes), fine-tuned from genoformer-dna",
        ),
        Pretrained(
            "genoformer-forecaster",
            "genoformer_forecaster.ckpt",
            "genoformer/genoformer-forecaster",
            "general time-series forecaster (zero-shot on new series)",
        ),
    )
}


def model_cache() -> Path:
    """Where pretrained models are looked for after a clone's examples/: $GENOFORMER_HOME, else
    $XDG_CACHE_HOME/genoformer, else ~/.cache/genoformer."""
    home = os.environ.get("GENOFORMER_HOME")
    if home:
        return Path(home).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "genoformer"
