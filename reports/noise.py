"""The one rule that calls a change between two measurements of a series: same, faster,
slower or ambiguous, judged against each side's own noise and the SM clocks it ran at.

Each side's noise is the half-width of the 95% confidence interval of its median, relative
to the median: the recorded `spread` (suite.timing: the interval's relative width) halved;
for records without one, estimated from the p10..p90 band and the sample count (normal
jitter assumed: sigma = (p90 - p10) / 2.563, standard error of the median
1.2533 sigma / sqrt(n)); without a count, half the band; without a band, zero.

With r = head / base - 1 (median times), u = sqrt(u_base^2 + u_head^2) the noise of the
difference and t the threshold (the smallest change worth calling):

  slower / faster  |r| > t and |r| > u, and both sides ran at SM clocks within
                   CLOCK_TOLERANCE of each other (else: ambiguous, clocks differ)
  same             |r| + u <= t: the whole interval of the change lies within +-t
  ambiguous        anything else: the change might or might not exceed t

The interval of one run does not see drift between runs (another day, temperature, a
neighbour on the bus); the threshold is the floor for that, so keep it above the drift
two runs of one commit show (`foscar-bench compare` of those two runs measures it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

SLOWER, FASTER, SAME, AMBIGUOUS = "slower", "faster", "same", "ambiguous"
CALLED = (SLOWER, FASTER)
CLOCK_TOLERANCE = 0.03  # SM clocks further apart than this make a called change ambiguous
_P10_P90_SIGMAS = 2 * 1.2816
_MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)  # 1.2533: SE(median) / (sigma / sqrt(n))
_Z95 = 1.96


@dataclass(frozen=True)
class Sample:
    """One side of a comparison: a median with whatever says how well it is known."""

    median: float
    p10: float | None = None
    p90: float | None = None
    n: float | None = None
    spread: float | None = None  # recorded relative width of the median's 95% CI
    sm_clock_mhz: float | None = None

    @property
    def low(self) -> float:
        return self.median if _missing(self.p10) else float(self.p10)

    @property
    def high(self) -> float:
        return self.median if _missing(self.p90) else float(self.p90)

    @property
    def noise(self) -> float:
        """Relative half-width of the 95% CI of the median (module docstring)."""
        if not _missing(self.spread):
            return float(self.spread) / 2
        if not self.median or self.median <= 0:
            return 0.0
        band = (self.high - self.low) / self.median
        if _missing(self.n) or self.n < 2:
            return band / 2
        sigma = band / _P10_P90_SIGMAS
        return _Z95 * _MEDIAN_SE_FACTOR * sigma / math.sqrt(float(self.n))


@dataclass(frozen=True)
class Judgement:
    verdict: str
    change: float  # head / base - 1 of the median
    noise: float  # u: the change's own 95% half-width, relative
    reason: str = ""


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def relative_change(base: Sample, head: Sample) -> float:
    return head.median / base.median - 1.0


def clocks_differ(base: Sample, head: Sample, tolerance: float = CLOCK_TOLERANCE) -> str:
    """A sentence when both sides' SM clocks are known and differ by more than tolerance."""
    if _missing(base.sm_clock_mhz) or _missing(head.sm_clock_mhz) or not base.sm_clock_mhz:
        return ""
    if abs(head.sm_clock_mhz / base.sm_clock_mhz - 1) <= tolerance:
        return ""
    return f"SM clocks differ: {base.sm_clock_mhz:.0f} vs {head.sm_clock_mhz:.0f} MHz"


def judge(base: Sample, head: Sample, threshold: float, smaller_is_better: bool = True,
          clock_tolerance: float = CLOCK_TOLERANCE) -> Judgement:
    """Same, faster, slower or ambiguous, with the numbers behind it (module docstring)."""
    r = relative_change(base, head)
    u = math.hypot(base.noise, head.noise)
    if abs(r) > threshold and abs(r) > u:
        clocks = clocks_differ(base, head, clock_tolerance)
        if clocks:
            return Judgement(AMBIGUOUS, r, u, clocks)
        worse = r > 0 if smaller_is_better else r < 0
        return Judgement(SLOWER if worse else FASTER, r, u)
    if abs(r) + u <= threshold:
        return Judgement(SAME, r, u)
    why = ("beyond the threshold but within the noise" if abs(r) > threshold
           else "within the threshold, but the noise reaches past it")
    return Judgement(AMBIGUOUS, r, u, why)


def classify(base: Sample, head: Sample, threshold: float, smaller_is_better: bool = True) -> str:
    return judge(base, head, threshold, smaller_is_better).verdict


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
