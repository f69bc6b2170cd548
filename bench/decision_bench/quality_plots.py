"""The PNG plots of a `decision-quality` report (docs/quality.md): reliability diagrams per mode (every set's reads
pooled, and one small panel per set and mode) and the flip rates over all orders against the repeat-noise floor.
matplotlib (the bench's `plots` extra), with the Agg backend: no display needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODE_LABELS = {"plain": "plain", "rotate": "rotate", "prior": "rotate + prior", "calibrated": "calibrated"}
MODE_COLOURS = {"plain": "#7f7f7f", "rotate": "#1f77b4", "prior": "#2ca02c", "calibrated": "#d62728"}


def modes_of(report: dict[str, Any]) -> list[str]:
    """The modes that have results in the report, in the report's order."""
    seen: list[str] = []
    for entry in report["sets"]:
        for mode, summary in entry["modes"].items():
            if mode not in seen and "reliability" in summary:
                seen.append(mode)
    return seen


def pooled_reliability(report: dict[str, Any], mode: str, kinds: tuple[str, ...]) -> tuple[list[dict[str, Any]], float]:
    """One mode's reliability bins summed over the sets of these kinds, and the pooled ECE they give."""
    bins: dict[float, dict[str, float]] = {}
    for entry in report["sets"]:
        summary = entry["modes"].get(mode, {})
        if entry["type"] not in kinds or "reliability" not in summary:
            continue
        for row in summary["reliability"]:
            acc = bins.setdefault(row["lo"], {"lo": row["lo"], "hi": row["hi"], "n": 0, "conf": 0.0, "hits": 0.0})
            acc["n"] += row["n"]
            acc["conf"] += row["confidence"] * row["n"]
            acc["hits"] += row["accuracy"] * row["n"]
    rows = [
        {"lo": b["lo"], "hi": b["hi"], "n": b["n"], "confidence": b["conf"] / b["n"], "accuracy": b["hits"] / b["n"]}
        for b in sorted(bins.values(), key=lambda b: b["lo"])
    ]
    total = sum(r["n"] for r in rows)
    pooled_ece = sum(r["n"] / total * abs(r["accuracy"] - r["confidence"]) for r in rows) if total else 0.0
    return rows, pooled_ece


def _diagram(ax: Any, rows: list[dict[str, Any]], colour: str, title: str, small: bool = False) -> None:
    ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="black")
    if rows:
        total = sum(r["n"] for r in rows)
        ax.bar(
            [r["lo"] for r in rows],
            [r["accuracy"] for r in rows],
            width=0.1,
            align="edge",
            color=colour,
            edgecolor="white",
            alpha=0.85,
            label="accuracy",
        )
        ax.plot(
            [r["confidence"] for r in rows],
            [r["accuracy"] for r in rows],
            "o",
            ms=2 if small else 4,
            color="black",
            label="mean confidence",
        )
        if not small:
            for r in rows:
                ax.text(r["lo"] + 0.05, 0.02, f"{r['n'] / total:.0%}", ha="center", fontsize=6, rotation=90)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=7 if small else 9)
    if small:
        ax.set_xticks([])
        ax.set_yticks([])


def plot_all(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = modes_of(report)
    written: list[Path] = []
    model = (report.get("model") or "model").rstrip("/").split("/")[-1]

    # Pooled reliability per mode: one row for the choice sets, one for yes/no and score.
    groups = [("choice", ("choice",)), ("yes/no + score", ("noul", "score"))]
    groups = [g for g in groups if any(e["type"] in g[1] for e in report["sets"])]
    if modes and groups:
        fig, axes = plt.subplots(len(groups), len(modes), figsize=(2.6 * len(modes), 2.7 * len(groups)), squeeze=False)
        for r, (label, kinds) in enumerate(groups):
            for c, mode in enumerate(modes):
                rows, pooled = pooled_reliability(report, mode, kinds)
                _diagram(
                    axes[r][c],
                    rows,
                    MODE_COLOURS.get(mode, "C0"),
                    f"{MODE_LABELS.get(mode, mode)}: {label}\nECE {pooled:.3f}, {sum(x['n'] for x in rows)} reads",
                )
                if c == 0:
                    axes[r][c].set_ylabel("accuracy")
                if r == len(groups) - 1:
                    axes[r][c].set_xlabel("confidence of the chosen answer")
        fig.suptitle(
            f"Reliability per mode, {model} (bars: accuracy per confidence bin; % of reads per bin)", fontsize=9
        )
        fig.tight_layout()
        path = out / "reliability.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    # One small diagram per set and mode.
    sets = report["sets"]
    if modes and sets:
        fig, axes = plt.subplots(
            len(sets), len(modes), figsize=(1.7 * len(modes) + 0.8, 1.55 * len(sets)), squeeze=False
        )
        for r, entry in enumerate(sets):
            for c, mode in enumerate(modes):
                summary = entry["modes"].get(mode, {})
                rows = summary.get("reliability", [])
                title = f"{entry['name']}, {MODE_LABELS.get(mode, mode)}"
                if "ece" in summary:
                    title += f"\nECE {summary['ece']:.2f} acc {summary['accuracy']:.2f}"
                _diagram(axes[r][c], rows, MODE_COLOURS.get(mode, "C0"), title, small=True)
        fig.tight_layout()
        path = out / "reliability-per-set.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    # Flip rates of the choice sets per mode, with the repeat-noise floor; reads off each item's majority.
    choice = [e for e in sets if e["type"] == "choice"]
    flip_modes = [m for m in modes if any("flip_rate" in e["modes"].get(m, {}) for e in choice)]
    if choice and flip_modes:
        fig, panels = plt.subplots(1, 2, figsize=(max(9.0, 2.2 * len(choice) + 2), 3.8))
        width = 0.8 / len(flip_modes)
        measures = (
            ("flip_rate", "items whose answer changes\nover all orders of their options", "Flip rate over all orders"),
            (
                "disagreement",
                "reads whose answer differs from\ntheir item's most frequent one",
                "Reads off the majority",
            ),
        )
        for ax, (key, ylabel, title) in zip(panels, measures, strict=True):
            for k, mode in enumerate(flip_modes):
                xs = [i + (k - (len(flip_modes) - 1) / 2) * width for i in range(len(choice))]
                ys = [e["modes"].get(mode, {}).get(key, 0.0) for e in choice]
                ax.bar(xs, ys, width=width, color=MODE_COLOURS.get(mode, "C0"), label=MODE_LABELS.get(mode, mode))
            if key == "flip_rate":
                for i, entry in enumerate(choice):
                    floor = entry.get("repeat_noise", {}).get("flip_rate")
                    if floor is not None:
                        ax.hlines(
                            floor,
                            i - 0.45,
                            i + 0.45,
                            colors="black",
                            linestyles=":",
                            lw=1.5,
                            label="repeat-noise floor" if i == 0 else "_nolegend_",
                        )
                        ax.text(i, floor + 0.015, f"floor {floor:.2f}", ha="center", va="bottom", fontsize=6)
            ax.set_xticks(range(len(choice)))
            ax.set_xticklabels([f"{e['name']}\n({e['eval_items']} items)" for e in choice], fontsize=7)
            ax.set_ylim(0, 1.05)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.set_title(f"{title}, {model}", fontsize=9)
        handles, labels = panels[0].get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=7, ncol=len(labels), loc="lower center")
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        path = out / "flip-rates.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
