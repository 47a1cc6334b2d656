"""How `benchmarks/train.py` reports: the Markdown table, the targets, the profile breakdown and
the long-context configs' figures, all from a run's summary (train.json)."""

from __future__ import annotations

from typing import Optional

from benchmarks.common import environment_markdown, markdown_table


def merge_runs(summaries: list[dict]) -> dict:
    """One summary from several runs (a one-GPU and a two-GPU call, say): the first run's header,
    every run's cases tagged with the run's index (`run`), each command kept. Where two runs
    measured the same case the later one shows in the table (a failed or unrun case of an earlier
    run is dropped); ratios pair cases of one run. A summary merged before (its cases tagged with
    their run) comes back as it is."""
    if len(summaries) == 1 and all("run" in record for record in summaries[0]["records"]):
        return summaries[0]
    merged = dict(summaries[0])
    records = [{**record, "run": i} for i, summary in enumerate(summaries) for record in summary["records"]]
    # a case that failed or was not run in one run and ran in a later one: only the later shows
    last_run = {record["name"]: record["run"] for record in records}
    merged["records"] = [r for r in records if r.get("status") == "ok" or r["run"] == last_run[r["name"]]]
    measured = {record["name"] for record in merged["records"]}
    skipped = {entry["name"]: entry for summary in summaries for entry in summary["skipped"]}
    merged["skipped"] = [entry for name, entry in skipped.items() if name not in measured]
    merged["command"] = "; then ".join(summary["command"] for summary in summaries)
    merged["wall_s"] = sum(summary["wall_s"] for summary in summaries)
    return merged


def _partner(summary: dict, record: Optional[dict], name: str) -> Optional[dict]:
    """The case `name` measured in the same run as `record` (merged runs), else the last one."""
    same_run = [r for r in summary["records"] if r["name"] == name and r.get("run") == (record or {}).get("run")]
    return same_run[-1] if same_run else _by_name(summary).get(name)


def _by_name(summary: dict) -> dict[str, dict]:
    return {r["name"]: r for r in summary["records"]}


def _ok(record: Optional[dict]) -> bool:
    return record is not None and record.get("status") == "ok"


def _gib(record: dict, template: str) -> str:
    """template filled with the record's peak memory in GiB; "" where none was measured (CPU)."""
    return template.format(record["peak_gib"]) if record.get("peak_gib") is not None else ""


def _ceiling(summary: dict) -> Optional[float]:
    record = _by_name(summary).get("ceiling")
    return record["matmul_tflops"] if _ok(record) else None


def step_rows(summary: dict) -> list[dict]:
    ceiling = _ceiling(summary)
    rows = []
    for r in summary["records"]:
        if r["kind"] != "step":
            continue
        ok = _ok(r)
        rows.append({
            "case": r["name"],
            "tokens": f"{r['context']:,} x {r['batch']}",
            "step (ms)": f"{r['step_ms']:.1f}" if ok else "",
            "tokens/s": f"{r['tokens_per_s']:,.0f}" if ok else r.get("status", "")[:60],
            "MFU (989)": f"{100 * r['mfu']:.1f}%" if ok else "",
            "MFU (matmul)": f"{100 * r['model_tflops'] / ceiling:.1f}%" if ok and ceiling else "",
            "peak GiB": _gib(r, "{:.1f}") if ok else "",
            "warm-up s": f"{r['warmup_s']:.0f}" if ok else "",
            "graph breaks": str(r["graph_breaks"]) if ok and r["mode"] == "compiled" else "",
            "loss": f"{r['first_loss']:.3f}" if ok else "",
        })
    return rows


def targets(summary: dict) -> list[dict]:
    """The training-speed targets, each with what this run measured."""
    by = _by_name(summary)

    def tps(name):
        return by[name]["tokens_per_s"] if _ok(by.get(name)) else None

    def mfu(name):
        return by[name]["mfu"] if _ok(by.get(name)) else None

    rows = []

    def target(what, needed, measured, met):
        rows.append({"target": what, "needed": needed, "measured": measured,
                     "status": "not measured" if met is None else ("MET" if met else "NOT MET")})

    m = mfu("genoformer-causal-8k-compiled")
    target("8k compiled MFU", ">= 45%", f"{100 * m:.1f}%" if m else "", None if m is None else m >= 0.45)
    ours, flex = tps("genoformer-causal-8k-compiled"), tps("flex-causal-8k-compiled")
    ratio = ours / flex if ours and flex else None
    target("8k compiled vs plain PyTorch + compiled Flex", ">= 1.30x tokens/s",
           f"{ratio:.2f}x ({ours:,.0f} vs {flex:,.0f})" if ratio else "", None if ratio is None else ratio >= 1.3)
    m = mfu("genoformer-causal-8k-eager")
    target("8k eager MFU", ">= 35%", f"{100 * m:.1f}%" if m else "", None if m is None else m >= 0.35)
    ours, sdpa = tps("genoformer-causal-8k-eager"), tps("sdpa-causal-8k-eager")
    ratio = ours / sdpa if ours and sdpa else None
    target("8k eager vs plain PyTorch + SDPA eager", "> 1.00x tokens/s",
           f"{ratio:.2f}x ({ours:,.0f} vs {sdpa:,.0f})" if ratio else "", None if ratio is None else ratio > 1.0)
    for tag in ("32k", "64k"):
        m = mfu(f"genoformer-causal-{tag}-compiled")
        target(f"{tag} compiled MFU", ">= 40%", f"{100 * m:.1f}%" if m else "", None if m is None else m >= 0.40)
    tried = [n for n in by if n.startswith("genoformer-") and "-128k-" in n]  # -ckpt: the retry
    trains = [n for n in tried if _ok(by[n])]
    target("128k trains on one GPU (batch 1)", "a step runs",
           ", ".join(f"{n}{_gib(by[n], ': {:.0f} GiB')}" for n in trains) if trains
           else "; ".join(f"{n}: {by[n]['status']}" for n in tried),
           bool(trains) if tried else None)
    ddp = by.get("ddp-synthetic-8k-x2")
    single = _partner(summary, ddp, "fit-synthetic-8k")
    one, two = (single["tokens_per_s"] if _ok(single) else None), tps("ddp-synthetic-8k-x2")
    ratio = two / one if one and two else None
    target("2 GPUs (DDP) vs 1 GPU, 8k, Trainer.fit", ">= 1.85x tokens/s",
           f"{ratio:.2f}x ({two:,.0f} vs {one:,.0f})" if ratio else "", None if ratio is None else ratio >= 1.85)
    real = by.get("fit-real-8k")
    synthetic = _partner(summary, real, "fit-synthetic-8k")
    if _ok(real) and _ok(synthetic):
        excess = real["step_ms"] / synthetic["step_ms"] - 1
        target("real data module vs batch on the GPU, step time", "within 3%",
               f"{100 * excess:+.1f}% ({real['step_ms']:.1f} vs {synthetic['step_ms']:.1f} ms)", excess <= 0.03)
    else:
        target("real data module vs batch on the GPU, step time", "within 3%", "", None)
    return rows


def profile_sections(summary: dict) -> list[str]:
    sections = []
    for r in summary["records"]:
        if r["kind"] != "profile" or not _ok(r):
            continue
        total = r["total_ms"] or 1.0
        rows = [{"part": part, "ms per step": f"{ms:.2f}", "share": f"{100 * ms / total:.1f}%"}
                for part, ms in r["parts"].items()]
        top = [{"kernel": name, "part": part, "ms per step": f"{ms:.2f}"} for name, part, ms in r["top_kernels"][:12]]
        unit = "device (kernel) time" if summary["environment"]["device_type"] == "cuda" else "CPU operator self time"
        sections.append(
            f"### Where the time goes: {r['name']}\n\n{unit}, summed per part, per step: {total:.1f} ms busy "
            f"of {r['wall_ms']:.1f} ms of wall time under the profiler (the rest: the device waits for the host)."
            "\n\n"
            + markdown_table(rows) + "\n\nLargest kernels:\n\n" + markdown_table(top)
        )
    return sections


def config_lines(summary: dict) -> list[str]:
    """What the long-context configs' model (window pattern, compiled) measured, for a config's
    comment to quote by hand, and where dense (math) attention runs out of memory."""
    by = _by_name(summary)
    lines = []
    for tag in ("32k", "64k", "128k"):
        name = f"genoformer-window-{tag}-compiled"
        needs_checkpointing = not _ok(by.get(name)) and _ok(by.get(name + "-ckpt"))
        r = by.get(name + "-ckpt") if needs_checkpointing else by.get(name)
        if _ok(r):
            lines.append(
                f"- `configs/genome_{tag}_gpu.yaml` (`{r['name']}`): {r['tokens_per_s']:,.0f} tokens/s, "
                f"{r['step_ms'] / 1e3:.2f} s per step{_gib(r, ', peak {:.1f} GiB')}, MFU {100 * r['mfu']:.1f}% "
                "(allowed pairs)"
                + ("; out of memory without activation checkpointing" if needs_checkpointing else ""))
    math_oom = [r for r in summary["records"] if r["impl"] == "math" and r.get("status") == "OOM"]
    math_ok = [r for r in summary["records"] if r["impl"] == "math" and _ok(r)]
    if math_oom or math_ok:
        fits = ", ".join(f"{r['context']:,}{_gib(r, ' ({:.0f} GiB)')}" for r in math_ok) or "none tried"
        oom = f"runs out of memory at {min(r['context'] for r in math_oom):,} tokens" if math_oom else "did not run out of memory"
        lines.append(f"- Dense PyTorch (SDPA math) attention, same model, batch 1: {oom}; fits at {fits}.")
    return lines


def render_markdown(summary: dict) -> str:
    env = summary["environment"]
    ceiling = _ceiling(summary)
    head = [
        "## End-to-end training speed (85M reference model)",
        environment_markdown(env, summary["command"]),
        f"Reference model: 12 layers, width 768, 12 heads of 64, SwiGLU, RoPE, DNA vocabulary"
        f"{' (smoke run: 2 layers, width 64, contexts / 32)' if summary['smoke'] else ''}; bf16 autocast, fused "
        "AdamW, one optimizer step per row, median of the timed steps after the warm-up (whose time, compile "
        "included, is `warm-up s`); real E. coli windows, already on the GPU. MFU = model FLOPs / time / "
        f"{summary['peak_tflops']:.0f} TFLOP/s, with model FLOPs per token = 6 x parameters + 12 x width x (mean keys "
        "per query) per layer: the usual 6 N + 6 n_layers width L for causal dense attention, the allowed "
        "pairs for the window pattern. MFU (matmul): the same against the bf16 8192^3 matmul rate measured "
        f"in this run ({f'{ceiling:.0f} TFLOP/s' if ceiling else 'not measured'}). Wall time of the run: "
        f"{summary['wall_s']:.0f} s.",
        "Cases: `genoformer` = our model (`eager` with fused elementwise regions, `plain` with the reference "
        "ops, `compiled` = `model.runtime.compile: true`); `sdpa` = plain PyTorch + SDPA FlashAttention-2 (causal "
        "dense even for the window pattern); `flex` = plain PyTorch + FlexAttention with our block masks; "
        "`math` = plain PyTorch + SDPA math (memory probe).",
        markdown_table(step_rows(summary)),
        "### Targets",
        markdown_table(targets(summary)),
    ]
    fit = [r for r in summary["records"] if r["kind"] == "fit" and _ok(r)]
    if fit:
        rows = [{"case": r["name"], "step (ms)": f"{r['step_ms']:.1f}", "tokens/s": f"{r['tokens_per_s']:,.0f}",
                 "strategy": r["strategy"], "data workers": r["num_workers"]} for r in fit]
        head += ["### Inside Trainer.fit (compiled, causal 8k x 4 per GPU)",
                 "Mean step time over the timed steps of `Trainer.fit` (the config's trainer: bf16-mixed, "
                 "gradient clipping, LR schedule, CSV logger; no checkpoints or validation). `real`: the "
                 "config's GenomeDataModule (worker processes reading the E. coli store, pinned batches); `synthetic`: one "
                 "batch already on the GPU.", markdown_table(rows)]
    head += profile_sections(summary)
    lines = config_lines(summary)
    if lines:
        head += ["### For the long-context configs", "\n".join(lines)]
    failed = [r for r in summary["records"] if r.get("status") not in ("ok", None)] + summary["skipped"]
    if failed:
        head += ["### Not measured", "\n".join(f"- `{r['name']}`: {r['status']}" for r in failed)]
    return "\n\n".join(head)


def short_table(summary: dict) -> str:
    rows = [{k: row[k] for k in ("case", "tokens", "tokens/s", "MFU (989)", "peak GiB")} for row in step_rows(summary)]
    return "\n".join([markdown_table(rows), "", markdown_table(targets(summary))])


