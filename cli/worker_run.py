"""The run of one transport worker process to its end, shared by `fabriclab allreduce` and `train-node`.

Both run an opened event loop until it is done, then keep the same promise: SIGTERM/SIGINT end the run
cleanly, the JSON result is written in every case, and the exit status says how the run ended (0 done,
1 a result differed from the reference, 2 bad input, a timeout or (`allreduce`) a peer's piece that
cannot be right, 143 stopped by a signal).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import Any, Protocol

from transport.io.allreduce import EXIT_MISMATCH, EXIT_OK, EXIT_SIGNAL, EXIT_USAGE
from transport.io.endpoint import write_json


class Worker(Protocol):
    """What a worker's event loop offers once opened (transport/io: the ring, collective and training ones)."""

    error: str | None
    stop_reason: str

    def run(self) -> None: ...

    def stop(self, reason: str = ...) -> None: ...

    def results(self) -> Any: ...

    def close(self) -> None: ...


def run_to_end(worker: Worker, args: argparse.Namespace, errors: tuple[type[Exception], ...],
               mismatched: Callable[[], bool], *, note_signal: bool = True) -> tuple[int, Any]:
    """Run the opened `worker` to its end, close it, write its results to ``args.json_out`` (if given)
    and print its error, if any, as one line on stderr. Returns the exit status and the results.

    `errors` are the worker's own failures (bad input, a timeout, a bad piece): they end the run with status 2.
    `mismatched` is asked after a run not stopped by a signal. With `note_signal` false a stop by signal
    is not recorded as the worker's error (a storage host is always ended so: for it, that is its end).
    """

    def on_signal(signum: int, _frame: object) -> None:
        worker.stop(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = EXIT_OK
    try:
        worker.run()
        if worker.stop_reason.startswith("signal"):
            code = EXIT_SIGNAL
            if note_signal:
                worker.error = f"stopped by {worker.stop_reason.removeprefix('signal ')}"
        elif mismatched():
            code = EXIT_MISMATCH
    except errors as exc:
        worker.error = str(exc)
        code = EXIT_USAGE
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        results = worker.results()
        worker.close()
        if args.json_out:
            try:
                write_json(results, args.json_out)
            except OSError as exc:
                print(f"{args.prog}: error: cannot write {args.json_out}: {exc.strerror}", file=sys.stderr)
                code = code or EXIT_USAGE
    if worker.error:
        print(f"{args.prog}: error: {worker.error}", file=sys.stderr)
    return code, results
