"""The one rule that calls a change a regression or improvement: beyond a threshold and the noise of both sides."""
from __future__ import annotations

import math
from dataclasses import dataclass

REGRESSION, IMPROVEMENT, SAME = "regression", "improvement", "within noise"


@dataclass(frozen=True)
class Sample:
    """A median with its p10..p90 band (a missing band collapses to the median)."""

    median: float
    p10: float | None = None
    p90: float | None = None

    @property
    def low(self) -> float:
        return self.median if _missing(self.p10) else float(self.p10)

    @property
    def high(self) -> float:
        return self.median if _missing(self.p90) else float(self.p90)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def relative_change(base: Sample, head: Sample) -> float:
    return head.median / base.median - 1.0


def classify(base: Sample, head: Sample, min_change: float, smaller_is_better: bool = True) -> str:
    """'regression', 'improvement' or 'within noise'.

    With r = head.median / base.median - 1, for a smaller-is-better metric (time):
      regression   iff r > +min_change and head.p10 > base.p90
      improvement  iff r < -min_change and head.p90 < base.p10
    i.e. HEAD's p10..p90 band lies wholly beyond BASE's band (they do not overlap), so the
    median moved by more than HEAD's lower spread plus BASE's upper spread: the noise of
    both sides. For a bigger-is-better metric (bandwidth) the two verdicts swap.
    """
    r = relative_change(base, head)
    went_up = r > min_change and head.low > base.high
    went_down = r < -min_change and head.high < base.low
    if not (went_up or went_down):
        return SAME
    worse = went_up if smaller_is_better else went_down
    return REGRESSION if worse else IMPROVEMENT


def parse_fraction(text: str | float | None) -> float | None:
    """'5%' -> 0.05, '0.05' -> 0.05, '5' -> 0.05 (a bare number above 1 is a percentage)."""
    if text is None or text == "":
        return None
    raw = str(text).strip()
    try:
        value = float(raw.rstrip("%"))
    except ValueError:
        raise ValueError(f"threshold {raw!r} is not a number; write it as 5% or 0.05.") from None
    if raw.endswith("%") or value > 1:
        value /= 100
    if value < 0:
        raise ValueError(f"threshold {raw!r} is negative; give a size of change such as 5%.")
    return value
