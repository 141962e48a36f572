"""The device check's report: ``collect`` reads what each part wrote (never trusting a file a part
cut short may have left half written), ``write`` puts everything into gpu.json and the tables
into gpu.md, with the goals of issue 45 beside the measured ratios."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

# routing fwd+bwd on CUDA at T = 65,536 as a ratio to softmax + top-k, and the training step and its peak
# memory as ratios to conventional: the goals the GPU figures are read against
ROUTING_GOALS = {
    "exactly 8 of 64": 0.25,
    "range 4..8 of 64": 0.25,
    "exactly 8 of 128": 0.25,
    "exactly 16 of 256": 0.5,
    "8 of 256 in <= 4 of 8 groups": 0.5,
}
STEP_GOAL = 1.02  # the step's time and its peak memory, each
GROUPED_STEP_GOAL = 1.05  # the same for the 256-expert, top-8 grouped step (DeepSeek-V3's gate)


def _read(path: str | None):
    """A part's JSON (or JSON-lines) file, or None where it is missing or unreadable."""
    if not path or not Path(path).is_file():
        return None
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        if path.endswith(".jsonl"):
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def collect(parts: list[dict]) -> dict:
    """tests (one entry per test), bench_router and bench_step rows, the commands' results."""
    files = {k: v for p in parts for k, v in p["files"].items()}
    out = {
        "tests": _read(files.get("tests")) or [],
        "bench_router": (_read(files.get("bench_router")) or []) + (_read(files.get("bench_router_grouped")) or []),
        "bench_step": (_read(files.get("bench_step")) or {}).get("rows", []),
        "bench_step_grouped": (_read(files.get("bench_step_grouped")) or {}).get("rows", []),
        "profile_route": _read(files.get("profile_route")) or [],
    }
    summary = _read(files.get("eval"))
    if isinstance(summary, dict):
        keep = ("routing", "answer_loss", "experts_per_token", "exact_match_flexible", "exact_match_strict")
        out["eval"] = {k: summary[k] for k in keep if k in summary}
    analysis = _read(files.get("analysis"))
    if isinstance(analysis, dict):
        out["analysis"] = {"runs": len(analysis.get("runs", [])), "keys": sorted(analysis)[:12]}
    return out


def _table(header: list[str], rows: list[list]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(str(c) for c in row) + " |" for row in rows],
    ]


def _about(about: dict) -> list[str]:
    gpus = about.get("nvidia_smi", {}).get("gpus", [])
    device = "; ".join(f"{g.get('name')} (driver {g.get('driver')}, {g.get('memory')})" for g in gpus) or "no GPU"
    c = about.get("cpu", {})
    lines = [
        f"- device: {device}",
        f"- torch {about.get('torch')}, CUDA {about.get('cuda')}, triton {about.get('triton')}, transformers "
        f"{about.get('transformers')}, Python {about.get('python')}",
        f"- CPU: {c.get('name')}, {c.get('cores')} cores, {' '.join(c.get('vector_extensions', [])) or 'no AVX'}",
    ]
    if about.get("unmet_requirements"):
        lines.append(f"- requirements not met: {'; '.join(about['unmet_requirements'])}")
    return lines


def _tests(tests: list[dict]) -> list[str]:
    counts = Counter((t["suite"], t["outcome"]) for t in tests)
    suites = sorted({t["suite"] for t in tests})
    lines = _table(
        ["suite", "passed", "failed", "error", "skipped"],
        [[s, *(counts[(s, o)] for o in ("passed", "failed", "error", "skipped"))] for s in suites],
    )
    bad = [t for t in tests if t["outcome"] in ("failed", "error")]
    if bad:
        lines += ["", "Failed:", *[f"- `{t['test']}`: {t['message']}" for t in bad]]
    reasons = Counter(t["message"].removeprefix("Skipped: ") for t in tests if t["outcome"] == "skipped")
    if reasons:
        lines += ["", "Skipped:", *[f"- {n} × {reason}" for reason, n in reasons.most_common()]]
    return lines


def _router(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        goal = (
            ROUTING_GOALS.get(r["constraint"]) if r["routine"].startswith("route") and r["device"] == "cuda" else None
        )
        verdict = "" if goal is None else ("met" if r["ratio"] <= goal else "missed") + f" (≤ {goal}×)"
        out.append(
            [
                r["device"],
                r["dtype"],
                r["tokens"],
                r["constraint"],
                r["routine"],
                f"{r['seconds'] * 1e3:.2f}",
                f"{r['ratio']:.2f}×",
                f"{r['saved_mib']:.1f}",
                verdict,
            ]
        )
    return _table(
        [
            "device",
            "logits",
            "T",
            "constraint",
            "routine",
            "fwd+bwd (ms)",
            "ratio to softmax + top-k",
            "saved (MiB)",
            "goal",
        ],
        out,
    )


def profile_table(results: list[dict]) -> list[str]:
    """tools/profile_route.py's results as markdown lines (the tool prints them too): per constraint
    and routine, ms per call and the ratio to softmax + top-k."""
    cols = ("wall_one", "wall_queued", "host", "kernels", "graph")
    out = []
    for res in results:
        base = res["routines"]["softmax + topk"]
        for name, m in res["routines"].items():
            cells = [
                "—" if m[c] is None else f"{m[c] * 1e3:.3f}" + (f" ({m[c] / base[c]:.2f}×)" if base[c] else "")
                for c in cols
            ]
            out.append([res["dtype"], res["tokens"], res["constraint"], name, *cells])
    return _table(
        ["logits", "T", "constraint", "routine", "wall, one call", "wall, queued", "host", "kernels", "CUDA graph"],
        out,
    )


def _step(rows: list[dict], goal: float = STEP_GOAL) -> list[str]:
    def memory(r):
        if r["memory_ratio"] is None:
            return "not measured"
        return "met" if r["memory_ratio"] <= goal else "missed"

    out = [
        [
            r["method"],
            f"{r['seconds'] * 1e3:.0f}",
            f"{r['step_ratio']:.3f}×",
            f"{r['tokens_per_s']:,.0f}",
            "—" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}",
            "—" if r["memory_ratio"] is None else f"{r['memory_ratio']:.3f}×",
            f"{r['experts_per_token']:.2f}",
            ""
            if r["method"] == "conventional"
            else f"time {'met' if r['step_ratio'] <= goal else 'missed'}, memory {memory(r)}",
        ]
        for r in rows
    ]
    return _table(
        [
            "method",
            "step (ms)",
            "step / conventional",
            "tokens/s",
            "peak (MiB)",
            "memory / conventional",
            "experts per token",
            f"goals (time and memory ≤ {goal}×)",
        ],
        out,
    )


def markdown(summary: dict) -> str:
    res = summary["results"]
    lines = [
        f"# probmoe device check: {summary['mode']}",
        "",
        *_about(summary["about"]),
        f"- {summary['seconds']:.0f} s of a {summary['budget_s']:.0f} s budget"
        + (
            f"; bench_step at OLMoE-1B-7B widths with {summary['olmoe_layers']} layers"
            if summary.get("olmoe_layers")
            else ""
        ),
        "",
        "## Parts",
        "",
    ]
    rows = []
    for p in summary["parts"]:
        steps = "; ".join(
            f"{s['step']}: {s['status']}"
            + (f" ({s['reason']})" if s.get("reason") else f" in {s.get('seconds', 0):.0f} s")
            for s in p["steps"]
        )
        rows.append([p["part"], p["status"], p.get("reason", "") or steps])
    lines += _table(["part", "status", "steps or reason"], rows)
    for p in summary["parts"]:
        for step in p["steps"]:
            if step.get("tail"):
                lines += [
                    "",
                    f"{p['part']}, {step['step']}: failed (return code {step['returncode']}); its last lines:",
                    "",
                    "```",
                    *step["tail"],
                    "```",
                ]
    if res.get("tests"):
        lines += ["", "## Tests", "", *_tests(res["tests"])]
    if res.get("bench_router"):
        lines += ["", "## Routing, forward + backward (tools/bench_router.py)", "", *_router(res["bench_router"])]
    if res.get("profile_route"):
        lines += [
            "",
            "## Where a route's time goes, ms per forward + backward (tools/profile_route.py)",
            "",
            *profile_table(res["profile_route"]),
        ]
    if res.get("bench_step"):
        lines += [
            "",
            "## A training step per method (tools/bench_step.py; the paper's Fig. 7)",
            "",
            *_step(res["bench_step"]),
        ]
    if res.get("bench_step_grouped"):
        lines += [
            "",
            "## A 256-expert grouped step: DeepSeek-V3's gate against ProbMoE grouped (tools/bench_step.py)",
            "",
            *_step(res["bench_step_grouped"], GROUPED_STEP_GOAL),
        ]
    if res.get("eval") or res.get("analysis"):
        lines += ["", "## probmoe-train → probmoe-eval → probmoe-analyze", ""]
        if res.get("eval"):
            lines.append(
                "- eval: "
                + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in res["eval"].items())
            )
        if res.get("analysis"):
            lines.append(f"- analysis: {res['analysis']['runs']} run(s) analysed")
    return "\n".join(lines) + "\n"


def write(out: Path, summary: dict) -> None:
    (out / "gpu.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    (out / "gpu.md").write_text(markdown(summary), encoding="utf-8")
