"""The device check: every part that needs a GPU, in one process tree, within a time budget.

    python tools/gpu/check.py OUT_DIR [--budget-s 420] [--rehearse] [--install-log FILE]

Run through ``bash tools/gpu/check.sh`` (which installs the carried wheels first). On a CUDA
machine it runs, each part in its share of the budget (tools/gpu/parts.py): the device tests on
cuda and the Triton checks compiled (pass/fail per test), ``tools/bench_router.py`` at T = 65,536,
``tools/bench_step.py`` at OLMoE-1B-7B widths in bf16, and probmoe-train → -eval → -analyze on
a tiny model in bf16. A part that the budget cannot hold is skipped with the reason, and a step
that runs past its time is stopped (its process group killed) and reported as cut short, with
what it had measured. ``--rehearse`` runs the same parts on the CPU at tiny sizes (Triton
interpreted; what needs CUDA reported as skipped with the reason), with the packages the device
image lacks hidden (tools/gpu/image/sitecustomize.py).

Writes OUT_DIR/gpu.json (everything), OUT_DIR/gpu.md (the tables) and one log per part: at most
8 files, none in a subfolder (what comes back from a device machine).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import environment  # noqa: E402
import parts  # noqa: E402
import report  # noqa: E402

RESERVE_S = 10.0  # kept back for the report


def run_step(argv: list[str], env: dict, timeout: float, log) -> dict:
    """Run ``argv`` in the repository root, its output appended to ``log``, in a process group of
    its own that is killed when ``timeout`` seconds pass. Returns status, seconds, return code."""
    t0 = time.monotonic()
    log.write(f"\n$ {' '.join(argv)}\n")
    log.flush()
    start = log.tell()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout=max(1.0, timeout))
        status = "passed" if rc == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc, status = None, "cut short"
    seconds = time.monotonic() - t0
    log.flush()
    entry = dict(status=status, seconds=round(seconds, 1), returncode=rc)
    if status == "failed":  # the step's last lines, for the report
        with open(log.name, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            entry["tail"] = [line.rstrip()[:300] for line in f.read().splitlines()[-12:]]
    log.write(f"[{status} after {seconds:.0f} s, return code {rc}]\n")
    log.flush()
    return entry


def run_parts(plan: list, budget_s: float, started: float, out: Path, env: dict) -> list[dict]:
    """Each part in turn: its share of the budget plus what earlier parts left unused, never past
    the whole budget; skipped with the reason when less than it needs is left."""
    results, carried = [], 0.0
    for part in plan:
        left = budget_s - (time.monotonic() - started) - RESERVE_S
        allowed = min(left, part.share * budget_s + carried)
        entry = dict(part=part.name, steps=[], files={k: str(v) for k, v in part.files.items()})
        if part.skip:
            entry.update(status="skipped", reason=part.skip)
        elif allowed < part.least_s:
            entry.update(
                status="skipped",
                reason=f"the budget: {max(left, 0):.0f} s left of {budget_s:.0f} s, "
                f"{max(allowed, 0):.0f} s for this part, which needs {part.least_s:.0f} s",
            )
        else:
            t0 = time.monotonic()
            with open(out / f"{part.name}.log", "a", encoding="utf-8") as log:
                for label, argv, extra in part.steps:
                    remaining = allowed - (time.monotonic() - t0)
                    if remaining < 5:
                        entry["steps"].append(dict(step=label, status="skipped", reason="the part's time ran out"))
                        continue
                    print(f"[check] {part.name}: {label} (up to {remaining:.0f} s)", flush=True)
                    entry["steps"].append(dict(step=label, **run_step(argv, {**env, **extra}, remaining, log)))
            used = time.monotonic() - t0
            carried = max(0.0, allowed - used)
            states = {s["status"] for s in entry["steps"]}
            entry.update(
                status="passed"
                if states == {"passed"}
                else "failed"
                if "failed" in states
                else "cut short"
                if "cut short" in states
                else "incomplete",
                seconds=round(used, 1),
            )
        print(f"[check] {part.name}: {entry['status']}", flush=True)
        results.append(entry)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder for gpu.json, gpu.md and the logs")
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds for the whole check (default 420)")
    ap.add_argument("--rehearse", action="store_true", help="run on the CPU at tiny sizes (no GPU needed)")
    ap.add_argument("--install-log", type=Path, help="the wheel installation's log (check.sh writes it)")
    args = ap.parse_args()
    if args.budget_s < 60:
        ap.error(f"--budget-s must be at least 60, got {args.budget_s:g}")
    started = time.monotonic() - float(os.environ.get("PROBMOE_CHECK_ELAPSED", "0"))
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    cuda = torch.cuda.is_available() and not args.rehearse
    about = environment.describe(args.install_log)
    work = Path(tempfile.mkdtemp(prefix="probmoe-gpu-check-"))
    env = {
        **os.environ,
        "PROBMOE_CACHE": str(work / "cache"),
        "MPLCONFIGDIR": str(work / "matplotlib"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("TRITON_INTERPRET", None)
    if args.rehearse:  # the packages the device image lacks (and the wheels do not bring) are absent here too
        env["PYTHONPATH"] = os.pathsep.join([str(HERE / "image"), env["PYTHONPATH"]])
        env["PROBMOE_CHECK_HIDE"] = ",".join(parts.IMAGE_LACKS)
    layers = parts.olmoe_layers(torch.cuda.mem_get_info()[0]) if cuda else 1
    plan = parts.plan(cuda, work, layers)
    if not cuda and not args.rehearse:
        for part in plan:
            part.skip = "no CUDA device (torch.cuda.is_available() is False); --rehearse runs the parts on the CPU"
    results = run_parts(plan, args.budget_s, started, args.out, env)
    summary = dict(
        mode="rehearsal on the CPU" if args.rehearse else "cuda" if cuda else "no device",
        budget_s=args.budget_s,
        seconds=round(time.monotonic() - started, 1),
        about=about,
        olmoe_layers=layers if cuda else None,
        parts=results,
        results=report.collect(results),
    )
    report.write(args.out, summary)
    print(f"[check] {summary['seconds']:.0f} s; {args.out / 'gpu.md'} and gpu.json written", flush=True)
    failed = [p["part"] for p in results if p["status"] == "failed"]  # a part cut short by the budget is not
    tests = summary["results"].get("tests", [])
    failed += [t["test"] for t in tests if t["outcome"] in ("failed", "error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
