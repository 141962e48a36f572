"""``probmoe-analyze``: the paper's routing analyses of one or more checkpoints, side by side.

    probmoe-analyze --checkpoint runs/conventional --checkpoint runs/probmoe \\
        --data ../shared/data/gsm8k/test.jsonl --limit 64 --output analysis/

Per MoE layer: the mean over tokens of the fewest experts whose routing probability (softmax of
the router logits; normalised sigmoid scores for DeepSeek-V3) reaches α (Fig. 3); the fraction of
the layer's expert assignments taken by its 4 most used experts and the normalised entropy of its
assignment distribution (Fig. 4; the per-token top-4 mass and entropy of softmax(r) in the JSON and
CSV as ``token_*``); mean experts per token (Fig. 5); tokens by frequency against active experts,
with the frequency histogram and the uniform expectation (Fig. 6); expert-load CV and MaxVio.
``--data`` may be repeated (``NAME=FILE``): every checkpoint is then analysed on every data set,
one run each ("checkpoint on data"), as Fig. 5 compares data sets. Writes ``analysis.json``,
``analysis.csv`` and PNG figures, and
``tokens.csv``: every token id seen ``--token-min-count`` times or more, ranked by the mean experts
it activates over layers and occurrences, the top and bottom 20% marked (the paper's
``tab:dynamic_expert_number``). The work is ``probmoe.experiments.capture.analyze`` and
``probmoe.analysis.report``.
"""

from __future__ import annotations

import argparse
import sys

from probmoe.experiments import config_parser, interrupts, options
from probmoe.experiments.run_config import AnalyzeConfig

from . import common


def parser() -> argparse.ArgumentParser:
    return config_parser.parser(
        AnalyzeConfig,
        "probmoe-analyze",
        "Routing analyses per layer (the ProbMoE paper's "
        "Figs. 3-6, load balance) of checkpoints, side by side: JSON, CSV, PNG.",
    )


def main(argv=None) -> int:
    # from the first line: a signal while the libraries load is one line too
    return interrupts.run_or_end(lambda: _main(argv), "starting", lambda: "nothing was written")


def _main(argv) -> int:
    p = parser()
    cfg = config_parser.parse(AnalyzeConfig, p, argv)
    common.require_extras(p)
    common.quiet_progress(not cfg.progress)
    # a signal before report.write, which runs deferred, ends it with nothing written
    return interrupts.run_or_end(
        lambda: _analyze(p, cfg), "analysing the routing", lambda: f"nothing was written to {cfg.output}"
    )


def _analyze(p: argparse.ArgumentParser, cfg: AnalyzeConfig) -> int:
    def body():
        import torch

        from probmoe.analysis import report
        from probmoe.experiments import checkpoints, formats

        runs = options.named(cfg.checkpoint)
        for path in runs.values():
            checkpoints.check(path)
        files = options.data_sets(cfg.data)
        records = {name: formats.read(path, cfg.data_format).head(cfg.limit) for name, path in files.items()}
        options.check_output_folder(cfg.output, report.FILES, cfg.overwrite)
        return runs, files, records, options.device(cfg.device), getattr(torch, cfg.dtype)

    runs, files, data_records, device, dtype = options.run_or_exit(p, body)
    from probmoe.analysis import report
    from probmoe.experiments import capture, checkpoints

    def load(path):
        return checkpoints.load(
            path,
            routing=cfg.routing,
            device=device,
            dtype=dtype,
        )

    results, described, tokens = options.run_or_exit(
        p, lambda: capture.analyze(runs, data_records, cfg, load, common.progress_bar(cfg.progress))
    )
    with interrupts.deferred():  # the output folder only once every model has loaded and routed, written whole
        figures = report.write(
            cfg.output,
            results,
            tokens,
            {
                "data": files,
                "records": {name: len(r) for name, r in data_records.items()},
                "format": {name: r.format for name, r in data_records.items()},
                "routing": described,
            },
        )
    for line in report.summary_lines(results, tokens, described):
        print(line)
    print(f"{len(figures)} figures, analysis.json, analysis.csv and tokens.csv in {cfg.output}", file=sys.stderr)
    return interrupts.after_writing("the analysis", cfg.output)


if __name__ == "__main__":
    sys.exit(main())
