"""The import graph runs one way: every import of a project module, at module level or
inside a function, goes to the importer's own layer or to one listed below it (README.md,
"Layout")."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("core", "foscar", "baselines", "suite", "reports")

# Each layer and the layers it may import (its own is always allowed).
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "foscar": {"core"},
    "baselines": {"core", "foscar"},
    "harness": {"core", "foscar", "baselines"},
    "reports": {"core"},
    "cli": {"core", "foscar", "baselines", "harness", "reports"},
    "scripts": {"core", "foscar", "baselines", "harness", "reports"},
}
CLI_MODULES = ("suite.cli", "suite.commands", "suite.__main__")


def layer(module: str) -> str | None:
    """The layer of a dotted module name (None: not ours)."""
    top = module.split(".")[0]
    if top not in PROJECT:
        return None
    if top == "suite":
        return "cli" if module.startswith(CLI_MODULES) else "harness"
    return top


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every import in the file; relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def project_files(root: Path = ROOT) -> list[tuple[Path, str]]:
    files = [(p, layer(module_name(p, root))) for top in PROJECT for p in sorted((root / top).rglob("*.py"))]
    files += [(p, "scripts") for p in sorted((root / "scripts").glob("*.py"))]
    return files


def upward_arrows(root: Path = ROOT) -> list[str]:
    bad = []
    for path, own in project_files(root):
        for line, target in imports(path, root):
            theirs = layer(target)
            if theirs is not None and theirs != own and theirs not in ALLOWED[own]:
                bad.append(f"{path.relative_to(root)}:{line} ({own}) imports {target} ({theirs})")
    return bad


def test_no_import_runs_up_a_layer():
    bad = upward_arrows()
    assert not bad, "imports against the layering (README.md, Layout):\n" + "\n".join(bad)


def test_every_package_has_a_layer():
    assert {own for _, own in project_files()} == set(ALLOWED)


def test_the_checker_sees_an_upward_arrow(tmp_path):
    # Planted: the ground floor reaching into the harness, and reports into the baselines.
    for top in (*PROJECT, "scripts"):
        (tmp_path / top).mkdir()
    (tmp_path / "core" / "bad.py").write_text("def f():\n    from suite.runner import measure\n")
    (tmp_path / "reports" / "bad.py").write_text("import baselines.base\nfrom . import tables\n")
    assert upward_arrows(tmp_path) == [
        "core/bad.py:2 (core) imports suite.runner (harness)",
        "reports/bad.py:1 (reports) imports baselines.base (baselines)",
    ]
