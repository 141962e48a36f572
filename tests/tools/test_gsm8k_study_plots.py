"""tools/gsm8k_study.py's figures from a made-up summary: the ablation as the paper's box plot
(fig:ablation_study), the loss figure one line per method (not per run), no bar from a cut axis."""

import json

import pytest

pytest.importorskip("matplotlib")

from tool_modules import load_tool

study = load_tool("gsm8k_study")

EM = {
    "probmoe": [0.50, 0.52, 0.49],
    "densemixer": [0.44, 0.47, 0.40],
    "sample-dense-ste": [0.40, 0.50, 0.46],
    "topk-marginal": [0.45, 0.45, 0.48],
    "conventional": [0.43, 0.44, 0.42],
}


def _results() -> dict:
    return {
        m: [
            {
                "exact_match_flexible": em,
                "answer_loss": 2.0 + i / 10 + s / 100,
                "experts_per_token": 2.0,
                "train_loss": [3.0 - step / 100 + s / 50 for step in range(40)],
                "train_s": 1.0,
            }
            for s, em in enumerate(ems)
        ]
        for i, (m, ems) in enumerate(EM.items())
    }


@pytest.fixture
def figures(monkeypatch):
    """Every figure the tool saves, kept for inspection (and written)."""
    from matplotlib.figure import Figure

    kept, save = [], Figure.savefig

    def keep(fig, path, **kwargs):
        kept.append(fig)
        return save(fig, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return kept


def test_ablation_box_plot(tmp_path, figures):
    assert study.plot_ablation(_results(), tmp_path / "ablation.png")
    em_ax, loss_ax = figures[-1].axes
    labels = [t.get_text() for t in em_ax.get_xticklabels()]
    assert labels == list(study.ABLATION.values()) and len(labels) == 4  # the four forward x backward pairs
    medians = [
        list(line.get_ydata())
        for line in em_ax.get_lines()
        if len(set(line.get_xdata())) == 2 and len(set(line.get_ydata())) == 1
    ]  # horizontal segments: caps, whiskers' ends and medians
    for i, method in enumerate(study.ABLATION):
        median = sorted(EM[method])[1] * 100
        assert [median, median] in medians, (method, median)
        dots = em_ax.collections[i].get_offsets()
        assert sorted(dots[:, 1].tolist()) == pytest.approx(sorted(100 * e for e in EM[method]))  # every seed shown
    assert (tmp_path / "ablation.png").stat().st_size > 10_000
    assert not study.plot_ablation({m: r for m, r in _results().items() if m != "topk-marginal"}, tmp_path / "x.png")


def test_loss_figure_one_line_per_method_and_points_not_bars(tmp_path, figures):
    results = _results()
    study.plot(results, tmp_path / "loss.png")
    curves, points = figures[-1].axes
    assert len(curves.get_lines()) == len(results)  # one line per method, the seeds' range shaded
    assert not points.patches  # no bars (whose height would mean nothing on an axis not from 0)
    assert len(points.collections) >= len(results)


def test_finished_summarises_the_runs_on_disk(tmp_path, figures, capsys):
    """--finished: the runs with an evaluation are summarised and drawn, the others left out."""
    for (method, seed), _runs in {("probmoe", 0): 1, ("probmoe", 2): 1, ("densemixer", 1): 1}.items():
        out = tmp_path / "runs" / f"{method}-seed{seed}"
        (out / "eval-saved").mkdir(parents=True)
        (out / "eval-saved" / "summary.json").write_text(
            json.dumps(
                {"answer_loss": 2 + seed / 10, "exact_match_flexible": 0.0, "experts_per_token": 2.0, "train_s": 3.0}
            )
        )
        (out / "train_log.jsonl").write_text(
            "".join(json.dumps({"step": i, "loss": 3 - i / 10}) + "\n" for i in range(5)) + '{"final": true}\n'
        )
    (tmp_path / "runs" / "topk-marginal-seed0").mkdir()  # started, never evaluated: left out
    args = [
        "--output",
        str(tmp_path),
        "--finished",
        "--methods",
        "probmoe",
        "densemixer",
        "topk-marginal",
        "--seeds",
        "0",
        "1",
        "2",
    ]
    assert study.main(args) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary) == ["probmoe", "densemixer"]
    assert [r["seed"] for r in summary["probmoe"]] == [0, 2] and summary["densemixer"][0]["seed"] == 1
    assert summary["probmoe"][1]["train_loss"] == [3 - i / 10 for i in range(5)]
    assert "| probmoe | 0, 2 | 2.1000 ± 0.1414 |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "loss.png").is_file() and not (tmp_path / "ablation.png").exists()  # two of the four
    with pytest.raises(SystemExit):
        study.main(["--output", str(tmp_path / "none"), "--finished"])
    assert "no finished run" in capsys.readouterr().err


@pytest.mark.parametrize("no_analysis", [False, True])
def test_no_analysis_runs_no_probmoe_analyze(tmp_path, figures, monkeypatch, no_analysis):
    """A study over finished runs (nothing to train or evaluate) ends with probmoe-analyze over
    each method's first seed, unless --no-analysis."""
    for method in ("probmoe", "densemixer"):
        out = tmp_path / "runs" / f"{method}-seed0"
        (out / "eval-saved").mkdir(parents=True)
        (out / "eval-saved" / "summary.json").write_text(
            json.dumps({"answer_loss": 2.0, "exact_match_flexible": 0.0, "experts_per_token": 2.0, "train_s": 3.0})
        )
        (out / "train_log.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    ran = []
    monkeypatch.setattr(study, "sh", lambda cmd, log: ran.append(cmd))
    data = tmp_path / "data.jsonl"  # never read here (nothing to train; probmoe-analyze is not run): only checked
    data.write_text("")
    args = [
        "--output",
        str(tmp_path),
        "--methods",
        "probmoe",
        "densemixer",
        "--seeds",
        "0",
        "--train",
        str(data),
        "--test",
        str(data),
    ]
    assert study.main(args + ["--no-analysis"] * no_analysis) == 0
    assert [cmd[0] for cmd in ran] == ([] if no_analysis else ["probmoe-analyze"])
    assert (tmp_path / "summary.md").is_file()
