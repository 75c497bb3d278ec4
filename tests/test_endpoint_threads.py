"""An endpoint process (`python -m cli.endpoint`) loads numpy with a single BLAS thread: OpenBLAS would
otherwise start one per core, and they spin after each call, inside the traffic window."""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = """
import os
import cli.endpoint  # noqa: F401  (what `python -m cli.endpoint` runs first)
from transport.core.metrics import preload
preload()
print(os.environ["OPENBLAS_NUM_THREADS"], len(os.listdir("/proc/self/task")))
"""


def test_an_endpoint_runs_numpy_on_one_thread():
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"], out.stdout


def test_a_thread_limit_the_user_set_is_kept():
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", "import os, cli.endpoint; print(os.environ['OPENBLAS_NUM_THREADS'])"],
                         env=env, capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stdout + out.stderr
