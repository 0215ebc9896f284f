"""The short terminal table a sweep ends with (and `results` prints by default)."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if _known(value) else "-"


def _pct(value: Any) -> str:
    return f"{100 * value:.1f}%" if _known(value) else "-"


def latest_per_item(df: pd.DataFrame) -> pd.DataFrame:
    """The last record of each (run, case, backend): a resumed or retried item counts once."""
    if df.empty:
        return df
    return df.sort_values("id").groupby(["run_id", "case_key", "backend"], as_index=False).tail(1)


def _case_label(r: Any, vary: set[str]) -> str:
    """Short case name; heads, group size and modes only where they vary in the table."""
    case = f"b{r.batch} kv{kv_text(r.kv_len)}"
    if "heads" in vary:
        case += f" h{r.num_q_heads}/{r.num_kv_heads}d{r.head_dim}"
    if r.k_mode not in (None, "none"):
        case += f" i{r.bits}"
        if "group_size" in vary:
            case += f"g{r.group_size}"
        if "modes" in vary:
            case += f" k{str(r.k_mode)[0]}v{str(r.v_mode)[0]}"
    return case


def _varying(df: pd.DataFrame) -> set[str]:
    vary = set()
    if df[["num_q_heads", "num_kv_heads", "head_dim"]].drop_duplicates().shape[0] > 1:
        vary.add("heads")
    quant = df[df["k_mode"].fillna("none") != "none"]
    if quant["group_size"].nunique() > 1:
        vary.add("group_size")
    if quant[["k_mode", "v_mode"]].drop_duplicates().shape[0] > 1:
        vary.add("modes")
    return vary


def throttle_note(r: Any) -> str:
    """'SwPowerCap in 40% of the timed batches, SM clock 1755-1980 MHz': the reasons, how much
    of the run they touched and what the clock did under load, as far as the record knows."""
    text = str(getattr(r, "throttle_reasons", "") or "a slowdown")
    frac = getattr(r, "throttled_frac", None)
    if _known(frac):
        text += f" in {frac:.0%} of the timed batches"
    lo, hi = getattr(r, "sm_clock_mhz_min", None), getattr(r, "sm_clock_mhz_before", None)
    if _known(lo):
        text += f", SM clock {lo:.0f}-{hi:.0f} MHz" if _known(hi) and hi > lo else f", SM clock down to {lo:.0f} MHz"
    return text


# A clock under load this far below the run's median is worth a note even where NVML gave no
# slowdown reason (reports/noise.py calls changes ambiguous at the same 3 %).
CLOCK_DIP = 0.03


def clock_dip_note(r: Any) -> str | None:
    """'SM clock 1830-1980 MHz under load, no slowdown reason reported' for an unthrottled record
    whose lowest SM clock in its timed batches lies more than CLOCK_DIP below their median (a
    time that may hold slower batches than its flag says); None otherwise."""
    lo, med = getattr(r, "sm_clock_mhz_min", None), getattr(r, "sm_clock_mhz_median", None)
    if getattr(r, "throttled", 0) or not (_known(lo) and _known(med)) or lo >= (1 - CLOCK_DIP) * med:
        return None
    return f"SM clock {lo:.0f}-{med:.0f} MHz under load, no slowdown reason reported"


def summary_table(df: pd.DataFrame, title: str | None = None):
    """A rich renderable: a table (backend, case, status, median us, TB/s, % of the
    bus-derived peak, relative error) that fits 80 columns, then one line per record that
    did not pass, with its reason."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, pad_edge=False, box=None, header_style="bold", padding=(0, 1))
    for name, justify in (
        ("backend", "left"), ("case", "left"), ("status", "left"), ("median us", "right"),
        ("TB/s", "right"), ("%bus", "right"), ("rel err", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)
    df = latest_per_item(df)
    if df.empty:
        return table
    df = df.sort_values(["batch", "kv_len", "num_q_heads", "bits", "backend"], kind="stable")
    vary = _varying(df)
    colors = {"passed": "green", "inaccurate": "yellow", "incorrect": "red", "crashed": "red", "timeout": "red",
              "compile_error": "red", "unsupported": "yellow", "skipped": "yellow"}
    notes = []
    for r in df.itertuples(index=False):
        case = _case_label(r, vary)
        status = r.status
        if r.status == "passed" and getattr(r, "throttled", 0):
            status += "*"
            notes.append(f"* {r.backend} {case}: ran throttled ({throttle_note(r)})")
        elif r.status == "passed" and (dip := clock_dip_note(r)):
            status += "~"
            notes.append(f"~ {r.backend} {case}: {dip} (lowest / median of its timed batches)")
        elif r.status != "passed":
            reason = str(r.reason or "").replace("\n", " ")
            notes.append(f"{r.backend} {case}: {r.status}: {reason[:200]}")
        table.add_row(
            r.backend, case, f"[{colors.get(r.status, 'white')}]{status}[/]",
            _num(r.median_us, ".1f"), _num(r.eff_bandwidth_tbps, ".2f"), _pct(r.frac_peak_bus),
            _num(r.rel_error, ".1e"),
        )
    if not notes:
        return table
    return Group(table, Text(""), *[Text(n, overflow="fold") for n in notes])


def kv_text(n: Any) -> str:
    """32768 -> '32K' (K = 1024 tokens)."""
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)
