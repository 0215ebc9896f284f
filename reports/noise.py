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
                   CLOCK_TOLERANCE of each other (else: ambiguous, clocks differ), and,
                   where both sides name their physical GPU (gpu_uuid) and the two
                   differ, |r| > max(t, CROSS_GPU_THRESHOLD) (else: ambiguous, different GPUs)
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
# Between two physical GPUs of one model a change is called only beyond this. Measured
# 2026-12-03: the same kernels on four H200s of one device pool (a different machine per
# call) differed by 2-3.5 % at small shapes (INT4 batch 8 / KV 4K: 26.6 us on GPU-f20d61eb,
# 27.3 us on GPU-e1f4468f), while an A/B of the two kernel variants in one process on one
# GPU read them level. The bundled grids show it at large shapes too: the baselines
# (flashinfer 0.7.2.post1 in both, SM clocks 1980 MHz in both) read 2.0-3.1 % faster at
# batch 32 and 128 (within 1.9 % at batch 1 and 8) from grid-h200-d5d7c07 (GPU-8ac03fbc, read
# ceiling 4.61 TB/s) to grid-h200-f058eef (GPU-f20d61eb, 4.71 TB/s). Neither side's own
# interval sees that machine-to-machine offset, so
# it is a floor under the threshold, like run-to-run drift (module docstring), only larger.
CROSS_GPU_THRESHOLD = 0.05
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
    gpu_uuid: str | None = None  # the physical GPU it ran on (record's gpu_uuid), if known

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


def _uuid(value) -> str | None:
    return None if _missing(value) or not str(value).strip() else str(value).strip()


def short_uuids(a: str, b: str) -> tuple[str, str]:
    """'GPU-f20d61eb-6190-...' -> 'GPU-f20d61eb', unless that would make two different ids read alike."""
    def short(u: str) -> str:
        return "-".join(u.split("-")[:2])
    sa, sb = short(a), short(b)
    return (a, b) if sa == sb and a != b else (sa, sb)


def different_gpus(base_uuid, head_uuid) -> str:
    """A sentence when both sides name their physical GPU and the two differ; '' otherwise
    (also when either is unknown: old records and CPU runs are judged as before)."""
    a, b = _uuid(base_uuid), _uuid(head_uuid)
    if a is None or b is None or a == b:
        return ""
    sa, sb = short_uuids(a, b)
    return f"different GPUs: {sa} vs {sb}"


def judge(base: Sample, head: Sample, threshold: float, smaller_is_better: bool = True,
          clock_tolerance: float = CLOCK_TOLERANCE, gpu_threshold: float = CROSS_GPU_THRESHOLD) -> Judgement:
    """Same, faster, slower or ambiguous, with the numbers behind it (module docstring).
    Across two physical GPUs a change is called only beyond max(threshold, gpu_threshold),
    and a called change keeps the GPUs as its reason; 'same' stays same."""
    r = relative_change(base, head)
    u = math.hypot(base.noise, head.noise)
    if abs(r) > threshold and abs(r) > u:
        gpus = different_gpus(base.gpu_uuid, head.gpu_uuid)
        doubts = [gpus] if gpus and abs(r) <= max(threshold, gpu_threshold) else []
        clocks = clocks_differ(base, head, clock_tolerance)
        if clocks:
            doubts.append(clocks)
        if doubts:
            return Judgement(AMBIGUOUS, r, u, "; ".join(doubts))
        worse = r > 0 if smaller_is_better else r < 0
        return Judgement(SLOWER if worse else FASTER, r, u, gpus)
    if abs(r) + u <= threshold:
        return Judgement(SAME, r, u)
    why = ("beyond the threshold but within the noise" if abs(r) > threshold
           else "within the threshold, but the noise reaches past it")
    return Judgement(AMBIGUOUS, r, u, why)


def classify(base: Sample, head: Sample, threshold: float, smaller_is_better: bool = True) -> str:
    return judge(base, head, threshold, smaller_is_better).verdict


def parse_fraction(text: str | float | None) -> float | None:
    """'5%' -> 0.05, '0.05' -> 0.05, '5' -> 0.05 (a bare number above 1 is a percentage);
    a bare 1, 1 % or 100 %, is refused."""
    if text is None or text == "":
        return None
    raw = str(text).strip()
    try:
        value = float(raw.rstrip("%"))
    except ValueError:
        raise ValueError(f"threshold {raw!r} is not a number; write it as 5% or 0.05.") from None
    if value == 1 and not raw.endswith("%"):
        raise ValueError(f"threshold {raw!r} is ambiguous (1 % or 100 %?); write 1% or 0.01.")
    if raw.endswith("%") or value > 1:
        value /= 100
    if value < 0:
        raise ValueError(f"threshold {raw!r} is negative; give a size of change such as 5%.")
    return value
