"""Run a sweep: expand cases, pair them with backends, skip what the run already holds,
and farm the rest out to one worker process per device. The parent alone writes the
store, one committed record at a time; a worker that dies or hangs is replaced and its
case recorded `crashed` or `timeout`."""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from baselines.base import Backend
from core.case import Case
from core.record import GpuFields, Record
from core.store import NOT_ATTEMPTED, ResultStore, record_key
from suite.runner import new_record

CASE_TIMEOUT_S = 900.0  # a case's own work: prepare, check, timing (its kernels are built before)
BUILD_TIMEOUT_S = 1800.0  # building or loading a backend's kernels (a FlashInfer JIT compile)
START_TIMEOUT_S = 600.0  # a worker's start: CUDA init plus the read-ceiling kernel
MAX_START_FAILURES = 3


@dataclass
class Item:
    item_id: int
    case: Case
    backend: Backend

    @property
    def key(self) -> str:
        return record_key(self.case.key, self.backend.name)


@dataclass
class Slot:
    index: int
    device: str  # 'cpu' or a torch CUDA index
    proc: Any = None
    task_q: Any = None
    item: Item | None = None
    building_since: float | None = None  # its worker is building the item's kernels
    started_at: float | None = None  # the item's own timer (after the build)
    hello: dict | None = None
    start_failures: int = 0
    disabled: str | None = None
    last_shape: str | None = None
    restarts: int = 0
    log_path: str | None = None
    last_error: str | None = None
    retiring: bool = False  # its worker said it will exit (fatal error): send it nothing
    spawned_at: float = 0.0


@dataclass
class SweepOptions:
    devices: list[str]
    case_timeout_s: float = CASE_TIMEOUT_S
    build_timeout_s: float = BUILD_TIMEOUT_S
    read_ceiling: bool = True
    ceiling: dict | None = None  # a read ceiling measured before (`foscar-bench ceiling --json`)
    log_dir: str | None = None


@dataclass
class SweepOutcome:
    run_id: str
    written: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, dict] = field(default_factory=dict)
    interrupted: bool = False


def _log_tail(path: str | None, n_chars: int = 1500) -> str:
    """What the worker printed since it began its last case (its last words)."""
    if not path or not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 64_000))
        text = f.read().decode(errors="replace")
    marker = text.rfind("[worker ")
    if marker >= 0:
        nl = text.find("\n", marker)
        text = text[nl + 1 :] if nl >= 0 else ""
    text = " ".join(text.split())
    return text[-n_chars:]


class Sweep:
    def __init__(self, store: ResultStore, run_id: str, items: list[Item], options: SweepOptions,
                 on_record: Callable[[Record], None] | None = None,
                 on_status: Callable[[str], None] | None = None):
        self.store, self.run_id, self.options = store, run_id, options
        self.pending: deque[Item] = deque(items)
        self.on_record = on_record or (lambda rec: None)
        self.on_status = on_status or (lambda msg: None)
        self.ctx = mp.get_context("spawn")
        self.results = self.ctx.Queue()
        self.slots = [Slot(i, d) for i, d in enumerate(options.devices)]
        self.outcome = SweepOutcome(run_id)
        self.known_ceilings: dict[str, dict] = {d: options.ceiling for d in options.devices if options.ceiling}
        self.requeued: set[int] = set()

    # --- workers ------------------------------------------------------------------------
    def _start(self, slot: Slot) -> None:
        from suite.worker import worker_main

        if self.options.log_dir:
            slot.log_path = str(Path(self.options.log_dir) / f"worker{slot.index}-{slot.device}.log")
        opts = {
            "log_path": slot.log_path,
            "read_ceiling": self.options.read_ceiling,
            "known_ceilings": self.known_ceilings,
        }
        slot.task_q = self.ctx.Queue()
        slot.proc = self.ctx.Process(
            target=worker_main, args=(slot.index, slot.device, slot.task_q, self.results, opts),
            daemon=True, name=f"foscar-worker-{slot.index}",
        )
        slot.proc.start()
        slot.spawned_at = time.time()
        slot.hello = None
        slot.retiring = False

    def _stop(self, slot: Slot, kill: bool = False) -> None:
        if slot.proc is None:
            return
        if kill and slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(timeout=10)
        if slot.proc.is_alive():
            slot.proc.kill()
            slot.proc.join(timeout=5)
        slot.proc = None

    def _restart(self, slot: Slot) -> None:
        self._stop(slot, kill=True)
        slot.restarts += 1
        if slot.start_failures >= MAX_START_FAILURES:
            slot.disabled = (
                f"worker on device {slot.device} failed to start {slot.start_failures} times: "
                f"{slot.last_error or _log_tail(slot.log_path)}"
            )
            self.on_status(slot.disabled)
            return
        self._start(slot)

    # --- records ------------------------------------------------------------------------
    def _write(self, item: Item, record: Record, slot: Slot | None) -> None:
        self.store.add_record(self.run_id, record)
        self.outcome.written += 1
        self.outcome.counts[record.status] = self.outcome.counts.get(record.status, 0) + 1
        self.on_record(record)

    def _lost(self, item: Item, status: str, reason: str, slot: Slot | None) -> Record:
        """The record of an item whose worker could not give one (died, hung, never started)."""
        gpu = GpuFields()
        if slot is not None and slot.hello:
            gpu = GpuFields(gpu_index=slot.hello.get("gpu_index"), gpu_name=slot.hello.get("gpu_name"),
                            gpu_uuid=slot.hello.get("gpu_uuid"))
        elif slot is not None and slot.device.isdigit():
            # its worker never said hello: the device it was given, so the reproducer names it
            gpu = GpuFields(gpu_index=int(slot.device))
        record = new_record(item.case, item.backend, gpu)
        record.status, record.reason = status, reason
        return record

    def _next_item(self, slot: Slot) -> Item | None:
        """Prefer the shape this worker holds (its source K/V is reused), then a shape no
        other worker is on."""
        if not self.pending:
            return None
        busy = {s.last_shape for s in self.slots if s is not slot and s.item is not None}
        pick = None
        for it in self.pending:
            if it.case.shape_key == slot.last_shape:
                pick = it
                break
        if pick is None:
            pick = next((it for it in self.pending if it.case.shape_key not in busy), self.pending[0])
        self.pending.remove(pick)
        return pick

    def _dispatch(self, slot: Slot) -> None:
        if slot.disabled or slot.item is not None or slot.proc is None or slot.retiring:
            return
        item = self._next_item(slot)
        if item is None:
            return
        slot.item, slot.started_at, slot.building_since = item, None, None
        slot.last_shape = item.case.shape_key
        slot.task_q.put((item.item_id, item.case, item.backend))

    # --- main loop ------------------------------------------------------------------------
    def run(self) -> SweepOutcome:
        for slot in self.slots:
            self._start(slot)
        try:
            while self.pending or any(s.item is not None for s in self.slots):
                if all(s.disabled for s in self.slots):
                    self._fail_remaining()
                    break
                for slot in self.slots:
                    self._dispatch(slot)
                self._drain(timeout=0.5)
                self._watch()
        except KeyboardInterrupt:
            self.outcome.interrupted = True
            for slot in self.slots:
                self._stop(slot, kill=True)
            raise
        finally:
            self._shutdown()
        return self.outcome

    def _drain(self, timeout: float) -> None:
        try:
            msg = self.results.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self.results.get_nowait()
            except queue.Empty:
                return

    def _handle(self, msg: tuple) -> None:
        kind, slot_index = msg[0], msg[1]
        slot = self.slots[slot_index]
        if kind == "hello":
            slot.hello = msg[2]
            slot.start_failures = 0
            env = msg[2].get("gpu_env") or {}
            if env.get("read_ceiling"):
                self.known_ceilings[slot.device] = env["read_ceiling"]
            self.outcome.gpus[slot.device] = msg[2]
        elif kind == "start_failed":
            slot.last_error = msg[2]
            self.on_status(f"worker on device {slot.device} could not start: {msg[2]}")
        elif kind == "building":
            if slot.item is not None and slot.item.item_id == msg[2]:
                slot.building_since = time.time()
        elif kind == "start":
            if slot.item is not None and slot.item.item_id == msg[2]:
                slot.started_at, slot.building_since = time.time(), None
        elif kind == "record":
            item = slot.item
            # Only the record of the item this slot's worker holds counts: a late record from
            # a worker already killed on timeout must not retire its fresh replacement.
            if item is not None and item.item_id == msg[2]:
                if len(msg) > 4 and msg[4]:
                    slot.retiring = True
                self._write(item, msg[3], slot)
                slot.item, slot.started_at, slot.building_since = None, None, None

    def _watch(self) -> None:
        now = time.time()
        for slot in self.slots:
            if slot.disabled or slot.proc is None:
                continue
            if not slot.proc.is_alive():
                self._drain(timeout=0.2)  # a record sent just before exiting
                code = slot.proc.exitcode
                item = slot.item
                if slot.hello is None:
                    # died while starting, before taking any case: give the case back
                    slot.start_failures += 1
                    if item is not None:
                        self.pending.appendleft(item)
                        slot.item = None
                elif item is not None and slot.started_at is None and item.item_id not in self.requeued:
                    # died before it began this case: the case is not to blame; once more
                    self.requeued.add(item.item_id)
                    self.pending.appendleft(item)
                    slot.item = None
                elif item is not None:
                    tail = _log_tail(slot.log_path)
                    reason = (f"worker process died (exit code {code}) while running this case"
                              + (f"; its last output: {tail}" if tail else ""))
                    self._write(item, self._lost(item, "crashed", reason, slot), slot)
                    slot.item = None
                self._stop(slot)
                if self.pending or any(s.item for s in self.slots):
                    self._restart(slot)
                continue
            if slot.hello is None and now - slot.spawned_at > START_TIMEOUT_S:
                self.on_status(f"worker on device {slot.device} did not start in {START_TIMEOUT_S:.0f} s; replacing it")
                slot.start_failures += 1
                slot.last_error = f"no answer {START_TIMEOUT_S:.0f} s after starting"
                if slot.item is not None:
                    self.pending.appendleft(slot.item)
                    slot.item = None
                self._restart(slot)
                continue
            if slot.item is not None and slot.building_since is not None:
                if now - slot.building_since > self.options.build_timeout_s:
                    item = slot.item
                    self._stop(slot, kill=True)
                    reason = (f"its kernels were still building after {self.options.build_timeout_s:.0f} s "
                              "(before the case's own timer); the worker was killed and replaced")
                    self._write(item, self._lost(item, "timeout", reason, slot), slot)
                    slot.item, slot.building_since = None, None
                    self._restart(slot)
                continue
            if slot.item is not None and slot.started_at is not None:
                if now - slot.started_at > self.options.case_timeout_s:
                    item = slot.item
                    self._stop(slot, kill=True)
                    reason = f"no result after {self.options.case_timeout_s:.0f} s; the worker was killed and replaced"
                    self._write(item, self._lost(item, "timeout", reason, slot), slot)
                    slot.item = None
                    self._restart(slot)

    def _fail_remaining(self) -> None:
        """Every worker failed to start: each item left is recorded `crashed`, and those no
        worker began are marked NOT_ATTEMPTED, so that --resume runs them again."""
        reasons = "; ".join(s.disabled or "" for s in self.slots)
        reason = f"no worker could run it: {reasons}"
        while self.pending:
            # the first device of the sweep: its reproducer runs it there, as the sweep would have
            self._write_unrun(self.pending.popleft(), reason, attempted=False, slot=self.slots[0])
        for slot in self.slots:
            if slot.item is not None:
                self._write_unrun(slot.item, reason, attempted=slot.started_at is not None, slot=slot)
                slot.item = None

    def _write_unrun(self, item: Item, reason: str, attempted: bool, slot: Slot) -> None:
        record = self._lost(item, "crashed", reason, slot)
        if not attempted:
            record.reason += "; never attempted: --resume runs it again"
            record.extra[NOT_ATTEMPTED] = True
        self._write(item, record, None)

    def _shutdown(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.is_alive():
                try:
                    slot.task_q.put(None)
                except Exception:  # noqa: BLE001
                    pass
        for slot in self.slots:
            self._stop(slot)


# --- the whole sweep, as the CLI runs it --------------------------------------------------
def plan_items(cases: list[Case], backends: list[Backend]) -> list[Item]:
    from suite.cases import pair

    return [Item(i, c, b) for i, (c, b) in enumerate(pair(cases, backends))]


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'2/8' -> (2, 8): shard 2 of 8, counted from 0 (a Slurm array --array=0-7)."""
    if text is None:
        return None
    try:
        index, count = (int(p) for p in str(text).split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r} is not I/N; write e.g. 0/4 for the first of four shards.") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard {text}: I must be in 0..N-1 (N >= 1); got I={index}, N={count}.")
    return index, count


def _shard_rank(key: str) -> tuple[str, str]:
    return hashlib.sha256(key.encode()).hexdigest(), key


def shard_keys(keys: list[str], index: int, count: int) -> set[str]:
    """Shard `index` of `count` of the item keys ('case key|backend'): ranked by their
    SHA-256 and dealt round-robin, so every host computes the same split from the same grid
    whatever the order of axes and --backends (and whatever Python's hash seed), the shards
    differ in size by at most one item and each gets a mix of shapes and backends."""
    return set(sorted(keys, key=_shard_rank)[index::count])


def shard_items(items: list[Item], index: int, count: int) -> list[Item]:
    """The items of one shard (shard_keys), in plan order."""
    mine = shard_keys([it.key for it in items], index, count)
    return [it for it in items if it.key in mine]


def run_sweep(
    *,
    store: ResultStore,
    run_id: str,
    items: list[Item],
    options: SweepOptions,
    console: Any = None,
    progress: bool = True,
) -> SweepOutcome:
    """Skip the run's finished items, run the rest with a progress bar, return counts."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    done = store.finished_keys(run_id)
    todo = [it for it in items if it.key not in done]
    if console is not None and len(todo) < len(items):
        console.print(f"resuming run {run_id}: {len(items) - len(todo)} of {len(items)} already recorded")
    if not todo:
        return SweepOutcome(run_id)
    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"), console=console, disable=not progress, transient=False,
    )

    with bar:
        task = bar.add_task("sweep", total=len(todo), last="")

        def on_record(rec: Record) -> None:
            what = f"{rec.backend} b{rec.case.batch} kv{rec.case.kv_len}: {rec.status}"
            if rec.timing.median_us:
                what += f" {rec.timing.median_us:.1f} us"
            bar.update(task, advance=1, last=what)

        def on_status(msg: str) -> None:
            bar.console.print(f"[yellow]{msg}")

        sweep = Sweep(store, run_id, todo, options, on_record=on_record, on_status=on_status)
        outcome = sweep.run()
    if outcome.gpus:
        store.update_run_env(run_id, {"workers": outcome.gpus})
    return outcome
