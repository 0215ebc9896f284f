"""Reference figures from reports/data/paper.csv: the paper's, our earlier H200 measurements and probes, and
our targets, each row naming its source; reports cite this file and nothing outside the repository."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pandas as pd

PAPER_CSV = Path(__file__).parent / "data" / "paper.csv"


@lru_cache(maxsize=1)
def load() -> pd.DataFrame:
    df = pd.read_csv(PAPER_CSV, keep_default_na=False, na_values=[""],
                     dtype={"qualifier": str, "note": str, "backend": str, "over_backend": str})
    for col in ("qualifier", "note", "backend", "over_backend", "over_kernel"):
        df[col] = df[col].fillna("")
    return df


def lookup(source_id: str, table: str, metric: str, backend: str, gpu: str | None = None,
           over_backend: str | None = None, batch: int | None = None,
           kv_len: int | None = None) -> tuple[float | None, str]:
    """(value, qualifier) of one figure, or (None, '') when the source has none. `batch` and
    `kv_len` pick the row of one case where a source holds the same figure at several (our
    bandwidth targets at batch 128, KV 32K and at batch 1, KV 128K); left out, the first row
    matching the rest must then be the only figure (ambiguous lookups are refused)."""
    df = load()
    hit = df[(df["source_id"] == source_id) & (df["table"] == table) & (df["metric"] == metric)
             & (df["backend"] == backend)]
    if gpu is not None:
        hit = hit[hit["gpu"] == gpu]
    if over_backend is not None:
        hit = hit[hit["over_backend"] == over_backend]
    if batch is not None:
        hit = hit[hit["batch"] == batch]
    if kv_len is not None:
        hit = hit[hit["kv_len"] == kv_len]
    if hit.empty:
        return None, ""
    if len(hit) > 1 and hit[["value", "qualifier"]].drop_duplicates().shape[0] > 1:
        raise ValueError(f"reports/data/paper.csv holds {len(hit)} different {source_id}/{table}/{metric} figures for "
                         f"{backend} (gpu {gpu}, over {over_backend}, batch {batch}, KV {kv_len}): name the case")
    row = hit.iloc[0]
    value = None if pd.isna(row["value"]) else float(row["value"])
    return value, row["qualifier"]


def targets() -> pd.DataFrame:
    """Our targets (source `targets`), one row per goal, in the file's order."""
    df = load()
    return df[df["source_id"] == "targets"].reset_index(drop=True)


def sources_text() -> str:
    df = load()
    return "; ".join(f"{sid}: {text}" for sid, text in
                     df.drop_duplicates("source_id")[["source_id", "source"]].itertuples(index=False))
