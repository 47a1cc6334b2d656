"""CPU smoke test of the attention benchmark harness (benchmarks/attention.py and benchmarks/common.py).

The harness is run end to end at tiny shapes on the CPU, with `attention(backend="torch")`
standing in for the Triton kernels (`--ours torch`): every pattern, the correctness check,
the JSON, the plot and the BENCHMARKS.md section writer. The GPU-only parts (do_bench,
compiled Flex, Flex FLASH, flash-attn-4, peak memory) run on the GPU box; here they are
recorded as not measured and their columns are absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

OLD_FILE = """# Benchmarks

Hand-written introduction.

<!-- attention:start -->
stale attention numbers
<!-- attention:end -->

<!-- data:start -->
data loader numbers stay
<!-- data:end -->
"""


@pytest.fixture(scope="module")
def bench():
    """The benchmark modules, imported as `python -m` would from the repository root."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO))
        import benchmarks.attention as attention_bench
        import benchmarks.common as common

        yield attention_bench, common


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One CPU run of the script at tiny shapes, as a user would start it."""
    tmp = tmp_path_factory.mktemp("bench")
    markdown = tmp / "BENCHMARKS.md"
    markdown.write_text(OLD_FILE)
    out = tmp / "out"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = "--device cpu --tiny --ours torch --head-dims 16 --warmup-ms 0 --rep-ms 1".split()
    command = [sys.executable, "-m", "benchmarks.attention", *args, "--out", str(out), "--markdown", str(markdown)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, out, markdown


# ----------------------------------------------------------------------------- common.py
def test_markdown_table_escapes_and_orders(bench):
    _, common = bench
    table = common.markdown_table([{"a": 1, "b": "x|y"}, {"b": None, "c": 0.123456}], align={"a": "right"})
    assert table.splitlines() == [
        "| a | b | c |",
        "| ---: | --- | --- |",
        "| 1 | x\\|y |  |",
        "|  |  | 0.1235 |",
    ]
    assert common.markdown_table([]) == ""


def test_replace_markdown_section_creates_appends_and_replaces(bench, tmp_path):
    _, common = bench
    path = tmp_path / "sub" / "B.md"
    common.replace_markdown_section(path, "attention", "first")
    assert path.read_text() == "# Benchmarks\n\n<!-- attention:start -->\nfirst\n<!-- attention:end -->\n"

    common.replace_markdown_section(path, "data", "rows\n")
    common.replace_markdown_section(path, "attention", "second")
    text = path.read_text()
    assert "first" not in text and "second" in text and "rows" in text
    assert text.index("<!-- attention:start -->") < text.index("<!-- data:start -->")

    path.write_text(text + "<!-- attention:end -->\n")
    with pytest.raises(ValueError, match="expected exactly one"):
        common.replace_markdown_section(path, "attention", "third")
    with pytest.raises(ValueError, match="section name"):
        common.replace_markdown_section(path, "two words", "x")


def test_describe_environment_on_cpu(bench):
    _, common = bench
    env = common.describe_environment("cpu")
    assert env["device_type"] == "cpu" and env["device"] == env["cpu"]
    assert env["torch"] == torch.__version__ and env["date_utc"].endswith("UTC")
    header = common.environment_markdown(env, "python -m benchmarks.x --flag")
    assert env["device"] in header and "`python -m benchmarks.x --flag`" in header


# -------------------------------------------------------------------- attention.py pieces
@pytest.mark.parametrize("seq_len", [256, 200])
def test_allowed_pairs_counts_the_token_mask(bench, seq_len):
    attention_bench, _ = bench
    from genoformer.kernels.layout import BlockLayout

    heads = 4
    layouts = [
        BlockLayout.sliding_window(seq_len, 32, 32).with_causal(),
        BlockLayout.bigbird(seq_len, 32, 1, 1, 32, num_heads=heads),
        BlockLayout.dense(seq_len, block_size=32),
    ]
    for layout in layouts:
        for causal in (False, True):
            expected = int(layout.token_mask(causal).sum()) * (heads // layout.num_heads)
            assert attention_bench.allowed_pairs(layout, causal, seq_len, heads) == expected
    dense = BlockLayout.dense(seq_len, block_size=32)
    for causal in (False, True):
        assert (
            attention_bench.allowed_pairs(None, causal, seq_len, heads) == int(dense.token_mask(causal).sum()) * heads
        )


@pytest.mark.parametrize("causal", [False, True])
def test_flex_block_mask_is_the_layout(bench, causal):
    """The BlockMask built from block lists equals create_block_mask's, and the layout itself."""
    attention_bench, _ = bench
    from genoformer.kernels.layout import BlockLayout
    from torch.nn.attention.flex_attention import create_block_mask

    seq_len, heads, bs = 256, 2, 32
    layout = BlockLayout.bigbird(seq_len, 32, 1, 1, bs, seed=3)
    block_mask = attention_bench.flex_block_mask(layout, causal, heads, torch.device("cpu"))
    reference = create_block_mask(block_mask.mask_mod, 1, heads, seq_len, seq_len, device="cpu", BLOCK_SIZE=bs)
    dense = block_mask.to_dense()  # (1, H_l, Mb, Nb): allowed blocks, full or partial
    assert torch.equal(dense.expand_as(reference.to_dense()).bool(), reference.to_dense().bool())
    expected = (layout.with_causal() if causal else layout).mask
    assert torch.equal(dense[0].bool(), expected)
    # Only the causal diagonal needs the mask_mod; everything else is a full block.
    assert int(block_mask.kv_num_blocks.sum()) == (int(layout.mask.diagonal(dim1=1, dim2=2).sum()) if causal else 0)
    # The mask_mod alone states the layout (Flex's FLASH backend drops the block lists when the
    # mask_mod is trivial, and uncompiled Flex reads only the mask_mod), in every block.
    q_idx, kv_idx = torch.meshgrid(torch.arange(seq_len), torch.arange(seq_len), indexing="ij")
    for h in range(heads):
        assert torch.equal(block_mask.mask_mod(0, h, q_idx, kv_idx), layout.token_mask(causal)[0])
    # Flex's Triton backend's mask: the same block lists, a mask_mod without the layout lookup that
    # agrees with the exact one on every partial block.
    index_only = attention_bench.flex_block_mask(layout, causal, heads, torch.device("cpu"), index_only=True)
    assert torch.equal(index_only.to_dense(), dense)
    assert torch.equal(index_only.kv_num_blocks, block_mask.kv_num_blocks)
    assert torch.equal(index_only.full_kv_num_blocks, block_mask.full_kv_num_blocks)
    if causal:
        diagonal = q_idx // bs == kv_idx // bs
        allowed = layout.mask[0, q_idx // bs, kv_idx // bs] & diagonal
        exact = block_mask.mask_mod(0, 0, q_idx, kv_idx)
        assert torch.equal(index_only.mask_mod(0, 0, q_idx, kv_idx)[allowed], exact[allowed])


def test_failing_kernel_is_recorded_and_the_run_goes_on(bench, tmp_path, monkeypatch):
    attention_bench, _ = bench

    def broken(q, k, v):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(attention_bench.Bench, "ours", lambda self, *a: attention_bench.Impl(broken))
    md = tmp_path / "B.md"
    argv = "--device cpu --tiny --head-dims 16 --patterns causal custom --warmup-ms 0 --rep-ms 1".split()
    results = attention_bench.main(argv + ["--markdown", str(md)])
    for case in results["cases"]:
        assert case["ours"]["error"] == "fwd: RuntimeError: kernel exploded"
        assert case["flex"]["fwd_ms"] > 0  # the others still ran
        assert case["check"]["error"] == "ours: RuntimeError: kernel exploded"
    assert results["cases"][0]["fa2"]["fwd_ms"] > 0 and results["cases"][0]["fa2"]["bwd_ms"] > 0
    assert results["cases"][1]["fa2"] is None  # FA2 computes dense causal only
    text = md.read_text()
    assert "ours: fwd: RuntimeError: kernel exploded" in text
    floor = next(t for t in attention_bench.evaluate_targets(results) if t["target"] == "floor")
    assert floor["status"] == "NOT MET" and floor["measured"].startswith("no valid measurement")


def test_rounds_time_every_implementation_in_turn_and_keep_the_median(bench, monkeypatch):
    attention_bench, _ = bench
    order = []
    real = attention_bench.Bench.time_impl

    def recording(self, what, impl, q, k, v, dout):
        order.append(what.rsplit(" ", 1)[-1])
        return real(self, what, impl, q, k, v, dout)

    monkeypatch.setattr(attention_bench.Bench, "time_impl", recording)
    argv = "--device cpu --tiny --ours torch --head-dims 16 --lengths 256 --patterns custom --warmup-ms 0 --rep-ms 1"
    results = attention_bench.main([*argv.split(), "--rounds", "3"])
    # in turn, not one implementation three times; each round starts one implementation later
    assert order == ["ours", "Flex", "FLASH", "Flex", "FLASH", "ours", "FLASH", "ours", "Flex"]
    ours = results["cases"][0]["ours"]
    assert len(ours["fwd_ms_rounds"]) == 3 and ours["fwd_ms"] == sorted(ours["fwd_ms_rounds"])[1]
    assert results["settings"]["rounds"] == 3
    assert "median over 3 rounds" in attention_bench.render_markdown(results, None)
    assert "each round starting one implementation later" in attention_bench.render_markdown(results, None)
    del results["settings"]["rounds_rotate"]  # a run from before the rotation says nothing of it
    assert "each round starting" not in attention_bench.render_markdown(results, None)
    merged = attention_bench.median_of_rounds([
        {"fwd_ms": 1.0, "bwd_ms": None, "error": None},
        {"fwd_ms": 3.0, "bwd_ms": 2.0, "error": "bwd: slow"},
    ])
    assert merged["fwd_ms"] == 2.0 and merged["bwd_ms"] == 2.0 and merged["error"] == "bwd: slow"
    with pytest.raises(SystemExit):
        attention_bench.parse_args(["--rounds", "0"])


def test_time_budget_skips_and_records(bench):
    attention_bench, _ = bench
    results = attention_bench.main(["--device", "cpu", "--tiny", "--ours", "torch", "--budget-s", "0"])
    assert results["cases"] and all(case["skipped"].startswith("time budget") for case in results["cases"])
    assert all(row["notes"].startswith("skipped") for row in attention_bench.results_rows(results))


# ------------------------------------------------------------------------------ end to end
def test_end_to_end_tiny_cpu_run(tiny_run):
    proc, out, markdown = tiny_run
    results = json.loads((out / "attention.json").read_text())
    assert [c["pattern"] for c in results["cases"]] == ["causal", "sliding_window", "bigbird", "custom"]
    for case in results["cases"]:
        assert case["skipped"] is None
        assert case["ours"]["fwd_ms"] > 0 and case["ours"]["bwd_ms"] > 0, case
        assert case["check"]["ok"] is True, case["check"]
        assert 0 < case["density"] <= 1 and case["fwd_flops"] > 0
        assert case["flex"]["fwd_ms"] > 0 and "no CPU backward" in case["flex"]["error"]
        assert case["flex_flash"]["fwd_ms"] is None and "CUDA only" in case["flex_flash"]["error"]
        if case["pattern"] == "causal":
            assert case["fa2"]["fwd_ms"] > 0 and case["fa2"]["bwd_ms"] > 0, case
            assert case["fa4"]["fwd_ms"] is None and "CUDA only" in case["fa4"]["error"]
            assert case["flex"]["check"]["ok"] is True  # the others are checked against the reference too
        else:
            assert case["fa2"] is None and case["fa4"] is None
    # ours and Flex against float64 at 16 blocks, every pattern; Flex FLASH needs CUDA
    assert [c["pattern"] for c in results["float64_check"]] == [c["pattern"] for c in results["cases"]]
    for check in results["float64_check"]:
        assert check["seq_len"] == 16 * 32 and check["ours"]["ok"] is True and check["flex"]["ok"] is True, check
        assert check["ours"]["reference"] == "float64" and check["ours"]["bwd_rel_err"] < 0.06
        assert check["flex_flash"]["ok"] is None and "FLASH backend runs on CUDA only" in check["flex_flash"]["error"]
    assert results["cases"][0]["check"]["reference"] == "FA2"
    assert results["cases"][2]["check"]["reference"] == "Flex"
    assert results["matmul"]["tflops"] > 0
    assert results["memory"]["error"] == "peak memory is measured on CUDA only"
    assert results["command"].startswith("python -m benchmarks.attention --device cpu --tiny")

    assert (out / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "attention.md").read_text().startswith("## Attention kernels")

    text = markdown.read_text()
    assert "stale attention numbers" not in text
    assert "Hand-written introduction." in text and "data loader numbers stay" in text
    section = text[text.index("<!-- attention:start -->") : text.index("<!-- attention:end -->")]
    for needle in (
        "## Attention kernels",
        "| sliding_window |",
        "| custom |",
        "### Targets",
        "| floor |",
        "| goal |",
        "| moonshot |",
        "| memory |",
        "NOT MEASURED",
        "Columns absent from this run: FA4 (flash-attn-4 runs on CUDA only); Flex FLASH",
        "Against float64 at L = 512, 4 heads, every pattern of the run at D 16 (worst row error, output / "
        "gradients): ours worst ",
        "Flex FLASH: not checked (Flex FLASH unavailable: Flex's FLASH backend runs on CUDA only)",
        results["environment"]["date_utc"],
    ):
        assert needle in section, needle
    assert "FA4 ms" not in section and "Flex FLASH ms" not in section and "Flex ms" in section
    link = section.split("](")[-1].split(")")[0]
    assert (markdown.parent / link).resolve() == (out / "attention.png").resolve()

    assert "| target" in proc.stdout and "matmul ceiling" in proc.stdout  # the closing summary


def test_render_from_json_rewrites_outputs(bench, tiny_run, tmp_path):
    attention_bench, _ = bench
    _, out, markdown = tiny_run
    md = tmp_path / "BENCHMARKS.md"
    attention_bench.main(
        ["--render-from", str(out / "attention.json"), "--out", str(tmp_path / "fig"), "--markdown", str(md)]
    )
    assert (tmp_path / "fig" / "attention.png").is_file()
    rendered, original = md.read_text(), markdown.read_text()
    section = lambda text: text[text.index("| D |") : text.index("### Targets")]  # noqa: E731
    assert section(rendered) == section(original)
    assert "](fig/attention.png)" in rendered


def test_merged_runs_replace_cases_of_earlier_runs(bench):
    """--render-from A B: B's measured cases replace A's, a case B skipped keeps A's numbers, and the
    header names both commands."""
    attention_bench, _ = bench
    case = lambda length, ms, skipped=None: {"head_dim": 64, "seq_len": length, "pattern": "causal",  # noqa: E731
                                             "ours": {"fwd_ms": ms}, "skipped": skipped}
    first = {"command": "python -m benchmarks.attention", "environment": {"date_utc": "12:00"}, "wall_s": 10.0,
             "cases": [case(8192, 1.0), case(16384, 2.0)], "tracebacks": []}
    second = {"command": "python -m benchmarks.attention --lengths 16384 8192", "environment": {"date_utc": "13:00"},
              "wall_s": 5.0, "cases": [case(16384, 3.0), case(8192, None, skipped="time budget")], "tracebacks": []}
    merged = attention_bench.merge_results([first, second])
    times = {r["seq_len"]: r["ours"]["fwd_ms"] for r in merged["cases"]}
    assert times == {8192: 1.0, 16384: 3.0}
    assert merged["command"].startswith("python -m benchmarks.attention (12:00); then python -m") and "(13:00)" in merged["command"]
    assert merged["wall_s"] == 15.0 and len(merged["merged_from"]) == 2
    assert attention_bench.merge_results([first]) is first


def _record(pattern, head_dim, ours, ok=True, **others):
    timing = lambda pair: None if pair is None else {"fwd_ms": pair[0], "bwd_ms": pair[1], "error": None}  # noqa: E731
    record = {
        "pattern": pattern,
        "head_dim": head_dim,
        "seq_len": 16384,
        "batch": 1,
        "heads": 16,
        "density": 0.5,
        "fwd_flops": 10**12,
        "ours": timing(ours),
        "check": {"ok": ok},
    }
    for key in ("fa2", "fa4", "flex", "flex_flash"):
        record[key] = timing(others.get(key))
    return record


MEMORY = {"batch": 1, "heads": 16, "seq_len": 65536, "head_dim": 128, "ours": {"peak_mib": 1500.0},
          "fa2": {"peak_mib": 1000.0}}


def _status(attention_bench, cases, memory=MEMORY):
    targets = attention_bench.evaluate_targets({"cases": cases, "memory": memory})
    return {t["target"]: t["status"] for t in targets}, {t["target"]: t["measured"] for t in targets}


def test_targets_floor_goal_moonshot(bench):
    attention_bench, _ = bench
    cases = [
        _record("causal", 128, (10, 20), fa2=(15, 30), fa4=(9.5, 19), flex=(12, 25), flex_flash=(9, 18)),
        _record("causal", 64, (10, 20), fa2=(15, 30), fa4=(5, 5), flex=(12, 25), flex_flash=(9, 18)),  # D64: no goal
        _record("sliding_window", 128, (1.0, 2.0), flex=(1.2, 2.5), flex_flash=(0.9, 1.8)),  # 1.11x FLASH
    ]
    status, measured = _status(attention_bench, cases)
    assert status == {"floor": "MET", "goal": "MET", "moonshot": "NOT MET", "memory": "MET"}
    assert "worst 1.11x (sliding_window D=128 L=16k" in measured["moonshot"]

    cases[2]["ours"]["bwd_ms"] = 2.6  # slower than Flex (Triton) and 1.44x FLASH
    status, _ = _status(attention_bench, cases)
    assert status["floor"] == status["goal"] == "NOT MET"

    cases[2]["ours"]["bwd_ms"] = 1.7
    cases[0]["check"]["ok"] = False  # fast but wrong: meets nothing
    status, measured = _status(attention_bench, cases)
    assert status["floor"] == status["goal"] == status["moonshot"] == "NOT MET"
    assert "2 failed, wrong or missing" in measured["goal"]  # the wrong causal case, fwd and bwd

    cases[0]["check"]["ok"] = True
    cases[2]["flex_flash"]["check"] = {"ok": False}  # a wrong yardstick is no yardstick
    status, measured = _status(attention_bench, cases)
    assert status["goal"] == "MET" and "2 not compared" in measured["goal"]
    assert attention_bench._time_ratio(cases[2], "flex_flash", "fwd") is None  # and its table cells show no ratio
    assert attention_bench._time_ratio(cases[2], "flex", "fwd") == pytest.approx(1.0 / 1.2)

    status, _ = _status(attention_bench, cases, dict(MEMORY, ours={"peak_mib": 2500.0}))
    assert status["memory"] == "NOT MET"


def test_a_missing_library_leaves_its_column_out(bench, tmp_path):
    """No flash-attn-4: no FA4 or Flex FLASH column, the goal NOT MEASURED with the reason, the rest intact."""
    attention_bench, _ = bench
    missing = {"fwd_ms": None, "bwd_ms": None, "error": "flash-attn-4 not importable (ModuleNotFoundError)"}
    cases = [
        _record("causal", 128, (10, 20), fa2=(15, 30), flex=(12, 25)),
        _record("bigbird", 128, (1.0, 2.0), flex=(1.2, 2.5)),
    ]
    for case in cases:
        case["flex_flash"] = dict(missing)
    cases[0]["fa4"] = dict(missing)
    assert attention_bench.present_columns({"cases": cases}) == ["fa2", "flex"]
    assert set(attention_bench.absent_columns({"cases": cases})) == {"FA4", "Flex FLASH"}
    status, measured = _status(attention_bench, cases)
    assert status == {"floor": "MET", "goal": "NOT MEASURED", "moonshot": "NOT MEASURED", "memory": "MET"}
    assert "FA4 absent: flash-attn-4 not importable" in measured["goal"]
    rows = attention_bench.results_rows({"cases": cases})
    assert "ours÷Flex" in rows[0] and not any(key.startswith("ours÷FA4") for key in rows[0])
    tables = "\n".join(attention_bench.issue_tables({"cases": cases, "settings": {"width": 2048, "block_size": 128}}))
    assert "| ours ÷ FA2 | 0.667 / 0.667 |" in tables and "FA4" not in tables
    assert "| bigbird | 0.500 | 0.833 / 0.8 |" in tables


def test_the_header_says_how_flex_was_compiled(bench, tiny_run):
    """A GPU run's header names Flex's compile: one per shape, or (older JSONs, without the setting)
    the automatic dynamic shapes, whose later lengths met symbolic-length kernels."""
    attention_bench, _ = bench
    _, out, _ = tiny_run
    results = json.loads((out / "attention.json").read_text())
    assert results["settings"]["flex_static"] is True
    results["environment"]["device_type"] = "cuda"
    assert "`torch.compile(flex_attention, dynamic=False)` (compiled for each shape)" in \
        attention_bench.render_markdown(results, None)
    del results["settings"]["flex_static"]
    assert "automatic dynamic shapes" in attention_bench.render_markdown(results, None)


def test_ours_records_the_configurations_its_tuner_chose(bench, monkeypatch):
    """Each case records the launch configurations ours ran with (Triton's interpreter here; the
    timings are stubbed, the correctness check's one call is what chooses)."""
    pytest.importorskip("triton", reason="triton is not installed: pip install triton")
    attention_bench, _ = bench
    monkeypatch.setattr(attention_bench.Bench, "time_impl",
                        lambda self, what, impl, q, k, v, dout: {"fwd_ms": 1.0, "bwd_ms": 1.0, "error": None})
    argv = "--device cpu --tiny --ours triton --head-dims 16 --lengths 64 --patterns causal --warmup-ms 0 --rep-ms 1"
    results = attention_bench.main(argv.split())
    (case,) = [c for c in results["cases"] if not c.get("skipped")]
    configs = case["ours"]["configs"]
    assert [c.split()[0] for c in configs] == ["fwd", "bwd"], configs
    assert configs[0].startswith("fwd FwdConfig(") and configs[1].startswith("bwd BwdConfig(")
    torch_run = attention_bench.main(argv.replace("--ours triton", "--ours torch").split())
    assert torch_run["cases"][0]["ours"]["configs"] == []
