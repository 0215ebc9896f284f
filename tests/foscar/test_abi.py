"""The ctypes mirror of FoscarDecodeArgs (foscar/kernels.py) must match the C header field for
field: compile a tiny C program that prints each field's offset and compare."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from foscar.build import CSRC
from foscar.kernels import _Args


def test_ctypes_struct_matches_the_c_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    names = [name for name, _ in _Args._fields_]
    prints = "\n".join(f'  printf("{n} %zu\\n", offsetof(FoscarDecodeArgs, {n}));' for n in names)
    src = tmp_path / "abi.c"
    src.write_text(f"""#include <stddef.h>
#include <stdio.h>
#include "foscar_api.h"
int main(void) {{
{prints}
  printf("sizeof %zu\\n", sizeof(FoscarDecodeArgs));
  return 0;
}}
""")
    exe = tmp_path / "abi"
    subprocess.run([cc, f"-I{CSRC}", str(src), "-o", str(exe)], check=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                         check=True).stdout.splitlines())
    for name in names:
        assert int(got[name]) == getattr(_Args, name).offset, name
    assert int(got["sizeof"]) == ctypes.sizeof(_Args)
