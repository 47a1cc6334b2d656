"""benchmarks/million.py and million_data.py: what the GPU steps compute, checked on the CPU at tiny
sizes (the memory step's smoke run is in test_smoke.py): the whole-record commands, the context step
on a small data file, the targets' verdicts, the scaling table, the paired bootstrap and the plots."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from benchmarks import million, million_data
from benchmarks.common import read_result


def _case(
    name: str, context: int, bytes_per_token: float | None, layout: str = "window_global", status: str = "ok"
) -> dict:
    record = {
        "name": name,
        "arch": name.split("-")[0],
        "layout": layout,
        "context": context,
        "batch": 1,
        "series": name.rsplit("-", 1)[0],
        "status": status,
        "kind": "genoformer",
    }
    if status == "ok":
        record.update(step_ms=1000.0, tokens_per_s=context / 1.0, peak_gib=10.0, tokens=context)
        if bytes_per_token is not None:
            record["step_bytes_per_token"] = bytes_per_token
    return record


def test_memory_targets_read_the_cases():
    lengths = {"128k": 1 << 17, "256k": 1 << 18, "512k": 1 << 19, "1M": 1 << 20}
    flat = [_case(f"flagship-window_global-{tag}", n, 16_000 + i * 500) for i, (tag, n) in enumerate(lengths.items())]
    growing = [
        _case(f"reference-window_global-{tag}", n, 40_000 * 1.5**i) for i, (tag, n) in enumerate(lengths.items())
    ]
    dense = [_case("flagship-dense-256k", 1 << 18, 30_000, layout="dense")]
    rows = {row["target"]: row for row in million.memory_targets(flat + growing + dense)}
    assert rows["a 1M-token training step, flagship (window + global)"]["status"] == "MET"
    assert rows["step memory per token from 128k to 1M within 1.2x, flagship"]["status"] == "MET"
    assert rows["step memory per token from 128k to 1M within 1.2x, reference"]["status"] == "NOT MET"  # 3.4x
    assert rows["dense causal trains at 256k or more"]["status"] == "MET"
    out_of_memory = [_case("flagship-window_global-1M", 1 << 20, None, status="OOM")]
    rows = {row["target"]: row for row in million.memory_targets(out_of_memory)}
    assert rows["a 1M-token training step, flagship (window + global)"]["status"] == "NOT MET"
    assert rows["a 1M-token training step, reference (window + global)"]["status"] == "NOT MEASURED"
    assert rows["dense causal trains at 256k or more"]["status"] == "NOT MEASURED"


def test_case_rows_name_the_runtime_of_each_kind():
    genoformer = {**_case("genoformer-graphs-8k", 8192, None), "runtime": "graphs"}
    plain = {**_case("plain-sdpa-compiled-8k", 8192, None), "kind": "sdpa", "runtime": "long", "compiled": True}
    eager = {**plain, "name": "sdpa-flagship-dense-8k", "compiled": False}
    assert [row["runtime"] for row in million.case_rows([genoformer, plain, eager])] == ["graphs", "compiled", "eager"]


def test_scaling_table_has_a_row_per_series_and_a_column_per_context():
    cases = [
        _case("genoformer-flagship-window_global-8k", 8192, 1.0),
        _case("genoformer-flagship-window_global-1M", 1 << 20, 1.0),
        _case("sdpa-flagship-dense-8k", 8192, 1.0, layout="dense"),
        _case("sdpa-flagship-dense-1M", 1 << 20, None, layout="dense", status="OOM"),
    ]
    result = million.scaling_table(cases)
    assert result["columns"] == ["series", "8k", "1M"]
    rows = {row["series"]: row for row in result["rows"]}
    assert (
        rows["sdpa-flagship-dense"]["1M"] == "OOM"
        and "tok/s, 10.0 GiB" in rows["genoformer-flagship-window_global"]["1M"]
    )


def test_a_longer_context_that_predicts_better_shows_a_positive_gain_with_its_interval():
    rng = np.random.default_rng(0)
    base = -2.0 + 0.1 * rng.standard_normal(50_000)
    better = base + 0.05 + 0.01 * rng.standard_normal(50_000)
    better[:100] = np.nan  # unscored bases are left out of both
    gain, low, high = million.paired_gain(better, base, block=1000)
    assert 0.049 < low < gain < high < 0.051
    gain, low, high = million.paired_gain(base, base, block=1000)
    assert gain == low == high == 0.0


@pytest.mark.slow
def test_the_chromosome_step_runs_the_commands_on_one_window(tmp_path, monkeypatch):
    """The whole pipeline of the chromosome step (a checkpoint trained a step, three commands): ~15 s.
    Without pyBigWig (as on the GPU image) score writes the text track."""
    real_find_spec = million.importlib.util.find_spec
    monkeypatch.setattr(
        million.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "pyBigWig" else real_find_spec(name, *args),
    )
    result = million.main(
        ["--step", "chromosome", "--smoke", "--out", str(tmp_path), "--scratch", str(tmp_path / "scratch")]
    )
    runs = {run["command"]: run for run in result["data"]["runs"]}
    assert set(runs) == {"evaluate", "score", "embed"} and all(run["status"] == "ok" for run in runs.values())
    assert runs["evaluate"]["context"] == result["data"]["record_bases"] == 3000
    assert runs["embed"]["embedding_shape"] == [1, 32] and (tmp_path / "scratch" / "ecoli.bedgraph").is_file()
    # a stand-in record is not the chromosome: the target stays unmeasured
    assert result["summary"]["targets"][0]["status"] == "NOT MEASURED"


def _write_fasta(path, records):
    with gzip.open(path, "wt") as handle:
        for name, codes in records:
            handle.write(f">{name}\n" + "".join("ACGT"[c] for c in codes) + "\n")
    return path


def test_context_data_holds_trained_and_held_out_parts(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    extra = tmp_path / "extra"
    extra.mkdir()
    _write_fasta(
        extra / "ustilago_maydis.fasta.gz", [("chr1", rng.integers(0, 4, 3000)), ("chr2", rng.integers(0, 4, 900))]
    )
    _write_fasta(extra / "celegans_ce2_chrX.fasta.gz", [("chrX", rng.integers(0, 4, 5000))])
    monkeypatch.setattr(million_data, "BACTERIA", ("lambda_phage.fasta.gz",))
    path = million_data.main(
        [
            "--out",
            str(tmp_path / "data"),
            "--extra",
            str(extra),
            "--celegans_offset",
            "1000",
            "--celegans_bases",
            "2000",
        ]
    )
    train, heldout = million._read_context_data(path)
    ((name, (lambda_codes, start)),) = [(k, v) for k, v in heldout.items() if k.startswith("bacterial/")]
    assert start == round(lambda_codes.size * 0.95)  # the last 5%, never trained on, the whole record before it
    assert np.array_equal(train[name], lambda_codes[:start])
    assert train["eukaryotic/chr1"].size == round(3000 * 0.95) and train["eukaryotic/chr2"].size == round(900 * 0.95)
    celegans, offset = heldout["eukaryotic/celegans_chrX"]
    assert offset == 1000 and celegans.size == 3000
    # a small file to carry: eukaryotes only, capped, each held-out part with the context it needs
    small = million_data.main(
        [
            "--out",
            str(tmp_path / "small"),
            "--extra",
            str(extra),
            "--no_bacteria",
            "--eukaryote_bases",
            "2900",
            "--celegans_offset",
            "1000",
            "--celegans_bases",
            "2000",
            "--context_before",
            "600",
        ]
    )
    train_small, heldout_small = million._read_context_data(small)
    assert set(train_small) == {"eukaryotic/chr1", "eukaryotic/chr2"} and set(heldout_small) == {
        "eukaryotic/celegans_chrX"
    }
    assert train_small["eukaryotic/chr1"].size + train_small["eukaryotic/chr2"].size == 2900
    trimmed, offset = heldout_small["eukaryotic/celegans_chrX"]
    assert offset == 600 and np.array_equal(trimmed, celegans[400:])
    # the context step reads both files together
    train_both, heldout_both = million._read_context_data(path, small)
    assert set(heldout_both) == set(heldout) and train_both["eukaryotic/chr1"].size == 2850
    bacteria = million_data.main(["--out", str(tmp_path / "bacteria"), "--extra", "none", "--context_before", "100"])
    _, (trimmed_lambda, start) = next(iter(million._read_context_data(bacteria)[1].items()))
    assert start == 100 and np.array_equal(trimmed_lambda, lambda_codes[round(lambda_codes.size * 0.95) - 100 :])
    with pytest.raises(SystemExit, match="nothing held out"):
        million_data.main(["--out", str(tmp_path / "none"), "--extra", "none", "--no_bacteria"])


@pytest.mark.slow
def test_the_context_step_trains_scores_and_draws_its_curve(tmp_path):
    """The whole pipeline of step D (training, two models scored at two contexts, the plot): ~15 s."""
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 4, 3000).astype(np.uint8)
    np.savez_compressed(
        tmp_path / "context_data.npz",
        **{
            "train/bacterial/a": codes[:2500],
            "heldout/bacterial/a@2500": codes,
            "heldout/eukaryotic/b@1500": codes[:2000],
        },
    )
    result = million.main(
        ["--step", "context", "--smoke", "--data", str(tmp_path), "--out", str(tmp_path), "--plots", str(tmp_path)]
    )
    data = read_result(tmp_path / "million_context.json")["data"]
    assert data["train_steps"] >= 1 and set(data["models"]) == {
        "flagship (window + global, not continued)",
        "continued",
    }
    longer = data["models"]["continued"]["512"]
    assert {"bacterial", "eukaryotic"} <= set(longer) and "gain_over_shortest" in longer["bacterial"]
    assert (tmp_path / "million_context.png").stat().st_size > 1000
    assert result["summary"]["tables"][0]["rows"]
    assert [t["status"] for t in result["summary"]["targets"]] == ["MET"]  # both kinds scored at 512 with intervals


@pytest.mark.parametrize("step", ["speed", "scaling"])
def test_the_gpu_steps_run_their_cases_in_order_within_the_budget(step, tmp_path, monkeypatch):
    measured = []

    def fake(case, device, steps, smoke):
        measured.append(case.name)
        ok = case.context < 1000 or case.kind != "sdpa"
        return {
            **million.dataclasses.asdict(case),
            "status": "ok" if ok else "OOM",
            "step_ms": 10.0 * case.context,
            "tokens": case.tokens,
            "tokens_per_s": 100.0,
            "seconds": 0.0,
            "loss": 1.0 + 0.001 * case.batch,
        }

    monkeypatch.setattr(million, "measure_case", fake)
    monkeypatch.setattr(
        million,
        "loader_rate",
        lambda smoke: {"batches_per_s": 1.0, "tokens_per_s": 1.0, "window": 8, "batch": 1, "workers": 0},
    )
    result = million.main(["--step", step, "--smoke", "--out", str(tmp_path)])
    cases = result["data"]["cases"]
    assert measured and measured == [c["name"] for c in cases if "step_ms" in c]
    if step == "scaling":  # plain SDPA stops at its first out-of-memory context, the rest of its series skipped
        sdpa = [c for c in cases if c["series"] == "sdpa-flagship-dense"]
        first_oom = next(i for i, c in enumerate(sdpa) if c["status"] == "OOM")
        assert all(c["status"].startswith("skipped") for c in sdpa[first_oom + 1 :])
        assert million.plots(result["data"], tmp_path) == [tmp_path / "million_scaling.png"]
    else:
        # every case at 100 tokens/s; the same loss at the same batch
        assert [t["status"] for t in result["summary"]["targets"]] == ["NOT MET", "NOT MET", "MET"]
