"""Small writers of self-contained static HTML (no scripts, no network) for the report and dashboard."""
from __future__ import annotations

import re
from html import escape

import pandas as pd

# A cell that holds a number (with unit, bound or range) is right-aligned.
NUMBER = re.compile(r"[<>=±\s]*[-+]?\d[\d.,]*(e[-+]?\d+)?\s*(%|x)?( to \d[\d.]*x)?( \[[\d., ]+\])?")

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, .caption { font-size: 0.9em; color: #444; margin: 0.4em 0; }
table { border-collapse: collapse; font-size: 0.82em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: left; }
th { background: #f4f4f4; } td.n { text-align: right; white-space: nowrap; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.5em 0.8em; }
.regression { background: #fde0dc; } .improvement { background: #e0f2e9; }
.meta { font-size: 0.85em; color: #555; }
"""


def page(title: str, body: list[str]) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
        f"<h1>{escape(title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def heading(text: str, anchor: str = "") -> str:
    ident = f' id="{escape(anchor)}"' if anchor else ""
    return f"<h2{ident}>{escape(text)}</h2>"


def para(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{escape(text)}</p>' if cls else f"<p>{escape(text)}</p>"


def note(text: str) -> str:
    return para(text, "note")


def figure(files: dict[str, str], caption: str, alt: str) -> str:
    links = " ".join(f'<a href="{escape(f)}">{fmt.upper()}</a>' for fmt, f in files.items())
    return (
        f'<figure><img src="{escape(files["png"])}" alt="{escape(alt)}">'
        f"<figcaption>{escape(caption)} [{links}]</figcaption></figure>"
    )


def table(display: pd.DataFrame, caption: str = "", csv_name: str = "", row_classes: list[str] | None = None) -> str:
    """An HTML table; row_classes (one per row) lets pages colour regressions."""
    head = "".join(f"<th>{escape(str(c))}</th>" for c in display.columns)
    rows = []
    for i, values in enumerate(display.itertuples(index=False)):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(_td(_cell(v)) for v in values)
        rows.append(f"<tr{cls}>{cells}</tr>")
    link = f' [<a href="{escape(csv_name)}">CSV</a>]' if csv_name else ""
    cap = f'<p class="caption">{escape(caption)}{link}</p>' if caption or link else ""
    return f"{cap}<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _td(text: str) -> str:
    numeric = NUMBER.fullmatch(text) is not None
    return f'<td class="n">{escape(text)}</td>' if numeric else f"<td>{escape(text)}</td>"


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
