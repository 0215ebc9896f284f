"""Instruction analysis: ALU (and all) instructions per KV element, statically from SASS
(suite.alu.sass, no GPU) and from Nsight Compute counters (suite.alu.ncu), with the one
opcode -> class/pipe table in suite.alu.isa. `foscar-bench alu` is the command."""
from suite.alu.isa import CLASSES, OpInfo, classify
from suite.alu.sass import SassError, StaticCounts, static_alu


def profile_case(backend, case, **kwargs):
    """ncu figures of one case (suite.alu.ncu.profile_case); what `sweep --alu` calls."""
    from suite.alu.ncu import profile_case as _profile

    return _profile(backend, case, **kwargs)


__all__ = ["CLASSES", "OpInfo", "SassError", "StaticCounts", "classify", "profile_case", "static_alu"]
