"""Crash isolation, simulated on the CPU: a worker that dies, hangs or raises costs one
record; the sweep replaces the worker and the remaining cases still run."""
import json

import harness_doubles
from baselines.base import Unsupported
from core.case import Case
from core.store import ResultStore
from suite.runner import classify
from suite.sweep import Item, SweepOptions, run_sweep

DOUBLES = {cls.name: cls() for cls in harness_doubles.DOUBLES}


def _items(names, case=Case(batch=2, kv_len=128, num_q_heads=4, num_kv_heads=2, head_dim=64)):
    # The stand-ins are handed to the sweep as objects; the workers need no registry entry.
    return [Item(i, DOUBLES[n].case_for(case), DOUBLES[n]) for i, n in enumerate(names)]


def _sweep(tmp_path, names, timeout=60.0):
    store = ResultStore(tmp_path / "c.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    opts = SweepOptions(devices=["cpu"], case_timeout_s=timeout, read_ceiling=False,
                        log_dir=str(tmp_path / "logs"))
    run_sweep(store=store, run_id=run, items=_items(names), options=opts, progress=False)
    df = store.records(run)
    return store, run, dict(zip(df.backend, df.status)), df


def test_dead_and_hung_workers_are_replaced(tmp_path):
    names = ["test-stub", "test-exit", "test-raise", "test-hang", "test-wrong", "test-unwritten"]
    store, run, status, df = _sweep(tmp_path, names, timeout=4.0)
    assert status == {
        "test-stub": "passed", "test-exit": "crashed", "test-raise": "crashed",
        "test-hang": "timeout", "test-wrong": "incorrect", "test-unwritten": "incorrect",
    }
    reasons = dict(zip(df.backend, df.reason))
    assert "exit code 17" in reasons["test-exit"]
    assert "planted failure" in reasons["test-raise"]
    assert "killed and replaced" in reasons["test-hang"]
    # the worker logs of every process were kept
    assert any(p.name.endswith(".log") for p in (tmp_path / "logs").iterdir())
    # each item recorded exactly once
    assert len(df) == len(names) and store.finished_keys(run) == {i.key for i in _items(names)}


def test_classify():
    assert classify(RuntimeError("CUDA error: an illegal memory access was encountered"))[::2] == ("crashed", True)
    assert classify(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))[::2] == ("crashed", True)
    assert classify(Unsupported("no"))[0] == "unsupported"
    assert classify(ImportError("no module"))[0] == "unsupported"
    assert classify(RuntimeError("ninja: build stopped: subcommand failed"))[0] == "compile_error"
    assert classify(ValueError("bad shape"))[::2] == ("crashed", False)


def test_resume_skips_finished_items(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    items = _items(["test-stub", "test-wrong", "test-unsupported"])
    # a sweep killed half-way: the first item made it to the store
    store.add_record(run, {"case_key": items[0].case.key, "backend": "test-stub", "status": "passed", "median_us": 1.0})
    opts = SweepOptions(devices=["cpu"], read_ceiling=False)
    outcome = run_sweep(store=store, run_id=run, items=items, options=opts, progress=False)
    assert outcome.written == 2
    df = store.records(run)
    assert sorted(df.backend) == ["test-stub", "test-unsupported", "test-wrong"]
    assert df[df.backend == "test-stub"].median_us.tolist() == [1.0]  # not redone
    assert run_sweep(store=store, run_id=run, items=items, options=opts, progress=False).written == 0


def test_items_no_worker_took_are_run_again_on_resume(tmp_path):
    # Every worker fails to start (a CUDA index no box has): the items are recorded crashed but
    # marked never attempted, and a resume on a working device runs them (/tmp/rev_suite/resume_poison.py).
    from core.store import NOT_ATTEMPTED

    store = ResultStore(tmp_path / "p.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    items = _items(["test-stub", "test-wrong"])
    lost = run_sweep(store=store, run_id=run, items=items, options=SweepOptions(devices=["99"], read_ceiling=False),
                     progress=False)
    assert lost.counts == {"crashed": 2}
    df = store.records(run)
    assert all("never attempted" in r for r in df.reason)
    assert all(json.loads(e)[NOT_ATTEMPTED] is True for e in df.extra_json)
    assert store.finished_keys(run) == set()
    again = run_sweep(store=store, run_id=run, items=items, options=SweepOptions(devices=["cpu"], read_ceiling=False),
                      progress=False)
    assert again.counts == {"passed": 1, "incorrect": 1}
    assert store.finished_keys(run) == {i.key for i in items}


def test_items_no_worker_took_name_their_gpu_in_the_reproducer(tmp_path):
    # /tmp/rev_cli: these records said --cpu for a sweep on --gpus 99
    store = ResultStore(tmp_path / "g.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    run_sweep(store=store, run_id=run, items=_items(["test-stub"]),
              options=SweepOptions(devices=["99"], read_ceiling=False), progress=False)
    [rec] = store.records(run).to_dict(orient="records")
    assert rec["gpu_index"] == 99
    assert rec["reproducer"].endswith("--gpus 99 --db results/repro.sqlite") and "--cpu" not in rec["reproducer"]
