"""The ring's release in PTX: every consumer warp's arrive on a stage's `empty` mbarrier follows a
`fence.acq_rel.cta` (v31). ptxas issues the arrive without waiting for the warp's loads of the
stage still in flight; without the fence the producer's next bulk copy into the slot overwrote
data they had not read, and the K token-wise / V channel-wise kernels returned a wrong output in
0.03-8 % of launches (scripts/probe_race.py, docs/PERFORMANCE.md twelfth session). Built like the
library (foscar.build's flags, sm_90a), the kernel that raced and the default mode's."""
from __future__ import annotations

import re

import pytest

ARRIVE = "mbarrier.arrive.shared::cta.b64"  # the plain arrive: the consumers' release (the producer's carries expect_tx)
FENCE = "fence.acq_rel.cta"


@pytest.mark.parametrize("instance", ["2, 128, false, true, false, 2", "4, 128, true, false, false, 2"])
def test_every_release_follows_a_fence(library_ptx, instance):
    text = library_ptx('#include "foscar_decode.cuh"\n'
                       f"void* keep() {{ return (void*)&foscar::foscar_decode_kernel<{instance}>; }}\n")
    lines = [line.strip() for line in text.splitlines()]
    arrives = [i for i, line in enumerate(lines) if line.startswith(ARRIVE)]
    assert arrives, f"no {ARRIVE} in the PTX of foscar_decode_kernel<{instance}>"
    for i in arrives:
        # back from the arrive to the previous fence, past the release's other arrives (one per
        # KV head of the item): a fence must come first, and no load, CTA barrier or wait between
        # (the warp's own __syncwarp, bar.warp.sync, belongs there)
        j = i - 1
        while j >= 0 and not lines[j].startswith(FENCE):
            j -= 1
        assert j >= 0, f"foscar_decode_kernel<{instance}>: no {FENCE} before the arrive at PTX line {i + 1}"
        between = "\n".join(lines[j + 1:i])
        assert not re.search(r"^ld\.|\bbar\.(sync|arrive|red)|\bbarrier\.|mbarrier\.try_wait", between, re.M), (
            f"foscar_decode_kernel<{instance}>: the arrive at PTX line {i + 1} is not the fence's next access: "
            + " / ".join(lines[j:i + 1]))
