"""What ships with genoformer, as a user types it: recipes by name (`--config quickstart`,
`genoformer recipes`), the example data (`genoformer examples`), and the fragments a recipe
includes found in an installed package as in a clone."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import fails

from genoformer import shipped
from genoformer.cli import main
from genoformer.shipped import compose_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_recipes_lists_every_recipe_with_a_line_from_its_comment(capsys):
    main(["recipes"])
    lines = capsys.readouterr().out.splitlines()
    listed = {
        line.split()[0]: line.split(None, 1)[1]
        for line in lines
        if line and not line[0].isspace() and len(line.split()) > 1 and (CONFIGS / f"{line.split()[0]}.yaml").is_file()
    }
    assert set(listed) == {path.stem for path in CONFIGS.glob("*.yaml")}
    assert listed["quickstart"].startswith("Quick start: a small causal DNA language model on the E. coli K-12 genome")
    assert listed["genome_8k_gpu"] == "A causal DNA language model at an 8,192-token context on one CUDA GPU (bf16)"
    assert all(len(summary) <= shipped.SUMMARY_WIDTH for summary in listed.values())


def test_recipes_copy_writes_the_folder_to_edit_and_keeps_earlier_edits(tmp_path, capsys):
    main(["recipes", "--copy", str(tmp_path / "configs")])
    copy = tmp_path / "configs"
    assert (copy / "base" / "trainer_cpu.yaml").is_file() and (copy / "models" / "reference_85m.yaml").is_file()
    assert compose_config(copy / "genome_32k_gpu.yaml") == compose_config(CONFIGS / "genome_32k_gpu.yaml")
    (copy / "quickstart.yaml").write_text("# mine\n")
    err = fails(capsys, ["recipes", "--copy", str(copy)])
    assert "exist already; pass --overwrite" in err
    assert (copy / "quickstart.yaml").read_text() == "# mine\n"
    main(["recipes", "--copy", str(copy), "--overwrite"])
    assert (copy / "quickstart.yaml").read_text() == (CONFIGS / "quickstart.yaml").read_text()


def test_examples_writes_the_example_data_without_the_models(tmp_path, capsys):
    main(["examples", "--out", str(tmp_path / "examples")])
    written = sorted(path.name for path in (tmp_path / "examples").iterdir())
    assert "ecoli_k12_mg1655.fasta.gz" in written and "lambda_variants.tsv" in written
    assert not [name for name in written if name.endswith(".ckpt")]
    assert "genoformer-dna" in capsys.readouterr().out  # the models are named, not copied
    err = fails(capsys, ["examples", "--out", str(tmp_path / "examples")])
    assert "pass --overwrite" in err


def test_fit_takes_a_recipe_by_name_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["fit", "--config", "quickstart", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["init_args"]["transformer"]["d_model"] == 128
    assert printed["trainer"]["accelerator"] == "cpu"  # from the fragment it includes


def test_an_unknown_recipe_lists_the_shipped_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "quikstart"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2  # an option's error, as the parser's own
    assert (
        "--config: no config file quikstart here, nor a shipped recipe of that name (did you mean quickstart?)" in err
    )
    assert "quickstart" in err.split("recipe of that name")[1] and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_a_gpu_recipe_by_name_names_its_cpu_version_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = fails(capsys, ["fit", "--config", "genome_8k_gpu"])
    twin = [shlex.split(line.strip()) for line in err.splitlines() if line.strip().startswith("genoformer fit ")][0]
    assert twin == ["genoformer", "fit", "--config", "genome_8k_cpu"]


def test_an_installed_package_finds_the_fragments_of_a_copied_recipe(tmp_path, monkeypatch):
    """In a wheel, configs/ lies inside the package: a recipe copied elsewhere finds its include there."""
    package = tmp_path / "site-packages" / "genoformer"
    shutil.copytree(CONFIGS, package / "configs")
    monkeypatch.setattr(shipped, "checkout_root", lambda: None)
    monkeypatch.setattr(shipped, "PACKAGE", package)
    assert shipped.configs_dir() == package / "configs"
    mine = tmp_path / "mine" / "my_quickstart.yaml"
    mine.parent.mkdir()
    mine.write_text((CONFIGS / "quickstart.yaml").read_text())
    assert compose_config(mine) == compose_config(CONFIGS / "quickstart.yaml")
    assert shipped.recipe_path("quickstart") == package / "configs" / "quickstart.yaml"
