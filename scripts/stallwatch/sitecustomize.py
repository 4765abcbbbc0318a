"""Stall watch: finds what holds a Python process's main thread (issue 23).

Put this directory first on ``PYTHONPATH`` and set ``STALLWATCH_DIR``: every
Python process started with that environment (a standalone, the bookies it
spawns, the perf client) imports this file at start-up (``sitecustomize``) and
appends to ``$STALLWATCH_DIR/stall.<pid>``:

* ``PROC <pid> <argv>`` once;
* ``STALL <unix time s> ms=<held> <stack>``: the main thread stayed on the same
  bytecode of a frame for more than ``STALLWATCH_MS`` (default 80) ms, outside
  the event loop's own wait (``select``/``run_forever``/...): a blocking call on
  the loop -- a commit waiting for fsync, a long computation. The stack (8
  frames, innermost first) says where;
* ``OVERSLEEP <unix time s> ms=<late>``: the watch thread itself woke that late
  (the process got no CPU, or a C call held the GIL);
* ``GC <unix time s> gen=<n> ms=<pause>``: a garbage collection longer than 20 ms.

A daemon thread samples ``sys._current_frames()`` every 5 ms: a few percent of
one core. Without ``STALLWATCH_DIR`` this file does nothing.
``scripts/stallwatch/report.py`` (or ``scripts/soak.py --stall-watch``)
summarizes the files.
"""
import os

_DIR = os.environ.get("STALLWATCH_DIR")
if _DIR:
    import gc
    import sys
    import threading
    import time
    import traceback

    _LIMIT_S = float(os.environ.get("STALLWATCH_MS", "80")) / 1000.0
    _IDLE = {"run_forever", "run_until_complete", "run", "select", "poll", "_run_once", "wait", "communicate",
             "sleep", "_wait_for_tstate_lock", "join", "readline", "read", "main"}
    _out = open(os.path.join(_DIR, f"stall.{os.getpid()}"), "a", buffering=1)
    _out.write(f"PROC {os.getpid()} {' '.join(sys.argv)[:300]}\n")
    _gc_start = [0.0]

    def _on_gc(phase, info):
        if phase == "start":
            _gc_start[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - _gc_start[0]) * 1000
        if ms > 20:
            _out.write(f"GC {time.time():.3f} gen={info['generation']} ms={ms:.1f}\n")

    gc.callbacks.append(_on_gc)

    def _where(frame) -> str:
        return " <- ".join(f"{os.path.basename(f.f_code.co_filename)}:{line}:{f.f_code.co_name}"
                           for f, line in list(traceback.walk_stack(frame))[:8])

    def _watch() -> None:
        main_id = threading.main_thread().ident
        last_key, since, last_wake, where = None, time.perf_counter(), time.perf_counter(), ""
        while True:
            time.sleep(0.005)
            now = time.perf_counter()
            if now - last_wake > _LIMIT_S:
                _out.write(f"OVERSLEEP {time.time():.3f} ms={(now - last_wake) * 1000:.0f}\n")
            last_wake = now
            frame = sys._current_frames().get(main_id)
            if frame is None:
                continue
            key = (id(frame), frame.f_lasti, frame.f_code)
            if key != last_key:
                held = now - since
                if held > _LIMIT_S and last_key is not None and last_key[2].co_name not in _IDLE:
                    _out.write(f"STALL {time.time():.3f} ms={held * 1000:.0f} {where}\n")
                last_key, since, where = key, now, _where(frame)

    threading.Thread(target=_watch, daemon=True, name="stallwatch").start()
