"""Markdown tables and PNG plots of a benchmark run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Table:
    """One markdown table with a title and notes on how it was measured."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join(" --- " for _ in self.columns) + "|")
        for row in self.rows:
            cells = [str(cell).replace("|", "\\|").replace("\n", " ") for cell in row]
            cells += [""] * (len(self.columns) - len(cells))
            lines.append("| " + " | ".join(cells) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"* {note}" for note in self.notes)
        return "\n".join(lines) + "\n"


def fmt(value: float | None, digits: int = 0) -> str:
    """A number with thousands separators; ``n/a`` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float, base: float | None) -> str:
    """``value / base`` as a percentage; ``n/a`` without a baseline."""
    if base is None or not base or math.isnan(base) or math.isnan(value):
        return "n/a"
    return f"{value / base:.0%}"


def plot_series(
    series: dict[str, list[tuple[int, float]]],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logy: bool = False,
) -> Path | None:
    """A line per target (log x axis); None when matplotlib is missing or nothing to plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    points = {
        name: [(x, y) for x, y in values if not math.isnan(y)] for name, values in series.items()
    }
    points = {name: values for name, values in points.items() if values}
    if not points:
        return None
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for name, values in points.items():
        xs, ys = zip(*values, strict=True)
        axes.plot(xs, ys, marker="o", label=name)
    axes.set_xscale("log")
    if logy:
        axes.set_yscale("log")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(visible=True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
