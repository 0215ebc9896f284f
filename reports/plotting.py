"""Matplotlib on the Agg backend, one house style, and saving a figure as PNG plus SVG."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "font.size": 9,
        "axes.titlesize": 10,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "legend.fontsize": 8,
        "svg.fonttype": "none",  # text stays text in the SVG
        "svg.hashsalt": "foscar-bench",  # stable ids: same data, same file
    }
)


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 7.5, height: float = 4.6, **kw):
    return plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kw)


def save(fig, out_dir: Path, stem: str, formats: tuple[str, ...] = ("png", "svg"),
         tight: bool = True, dpi: int | None = None) -> dict[str, str]:
    """Write `stem.png` (and `.svg`) under out_dir; returns format -> file name. tight=False
    keeps the figure's own layout and draws it once (twice as fast, for many figures)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for fmt in formats:
        name = f"{stem}.{fmt}"
        fig.savefig(out_dir / name, format=fmt, bbox_inches="tight" if tight else None, dpi=dpi or "figure",
                    metadata={"Date": None} if fmt == "svg" else None)
        files[fmt] = name
    plt.close(fig)
    return files


def kv_label(kv_len: float) -> str:
    """32768 -> '32K' (K = 1024 tokens)."""
    kv = int(kv_len)
    return f"{kv // 1024}K" if kv % 1024 == 0 and kv >= 1024 else str(kv)


def plain_log_ticks(ax, axis: str = "y") -> None:
    """Log-axis tick labels as plain numbers (600, 1000, 2000), not 6x10^2."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def place_labels(wanted: list[float], gap: float) -> list[float]:
    """Positions for labels wanted at `wanted` (ascending, any unit) such that neighbours
    are at least `gap` apart: each label moves up only as far as the one below pushes it."""
    placed: list[float] = []
    for w in wanted:
        placed.append(w if not placed else max(w, placed[-1] + gap))
    return placed
