"""What several commands share: output paths checked before any work, errors as one line, and
JSON written whole."""
from __future__ import annotations

import json
import os
from pathlib import Path

import typer


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, then exit with `code`."""
    typer.echo(message, err=True)
    raise typer.Exit(code)


def output_dir(option: str, path: Path) -> Path:
    """The folder a command writes into, created now: one line and exit 2 when it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"{option} {path}: cannot create that folder ({exc.strerror or exc}); pick a writable folder.")
    if not os.access(path, os.W_OK):
        fail(f"{option} {path}: this folder is not writable here; pick a writable folder.")
    return path


def output_file(option: str, path: Path | None) -> None:
    """Exit 2 with one line when `path` (a file to write) cannot be: its folder is missing
    or not writable, or a folder stands in its place."""
    if path is None:
        return
    folder = path.parent
    if not folder.is_dir():
        fail(f"{option} {path}: the folder {folder} does not exist; create it (mkdir -p {folder}) or write elsewhere.")
    if path.is_dir():
        fail(f"{option} {path} is a folder; expected a file name, e.g. {path / 'records.csv'}.")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        fail(f"{option} {path}: cannot write there; pick a writable path.")


def write_json(path: Path, payload: dict) -> None:
    """Write under a name of this process's own beside `path`, then move it into place (atomic): a
    run killed mid-write, or a reader meanwhile, sees the previous whole file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=1, default=str))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
