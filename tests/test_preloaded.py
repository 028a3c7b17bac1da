"""A script's rank forked with torch loaded (launch/rank/preloaded.py) runs the script as
`python script.py args` would: argv, folder, environment, `__main__`, output, exit status,
tracebacks, threads and atexit, and a fresh state where the fork copied one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from helpers import HANG_GUARD_S
from polyrhythm.launch.process import forkserver
from polyrhythm.launch.rank.preloaded import ScriptRank

SCRIPT = """\
import atexit, multiprocessing, os, sys, threading
import numpy, torch

def late():
    print("thread done", flush=True)

atexit.register(lambda: print("atexit ran", flush=True))
print("name", __name__)
print("argv", sys.argv[1:])
print("cwd", os.getcwd())
print("env", os.environ["SEEN"], "LEAKED" in os.environ)
print("threads", torch.get_num_threads())
print("start method", multiprocessing.get_start_method(allow_none=True))
print("numpy", numpy.random.bytes(16).hex())  # 128 bits: draws never meet by chance
print("stdin", repr(sys.stdin.read()))
print("to stderr", file=sys.stderr)
os.write(1, b"from the descriptor\\n")
if sys.argv[1] == "raise":
    raise ValueError("the script's own error")
threading.Timer(0.01, late).start()  # a non-daemon thread: the interpreter waits for it
sys.exit(int(sys.argv[1]))
"""


@contextlib.contextmanager
def started(script: Path, args: list[str], cwd: Path, env: dict[str, str]
            ) -> Iterator[ScriptRank]:
    """Rank 3 of `script`, bound to a launcher's pipe that this block holds."""
    alive, alive_w = forkserver.context().Pipe(duplex=False)
    try:
        yield ScriptRank(str(script), args, str(cwd), env, 3, alive)
    finally:
        alive.close()
        alive_w.close()


def run(tmp_path: Path, argument: str) -> tuple[int, str]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    folder = tmp_path / "folder"
    folder.mkdir(exist_ok=True)
    with started(script, [argument], folder, {"SEEN": "yes", "OMP_NUM_THREADS": "1"}) as rank:
        output = rank.stdout.read().decode()
        return rank.wait(HANG_GUARD_S), output


def test_a_preloaded_rank_runs_the_script_as_the_interpreter_would(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAKED", "the launcher's own")  # not in the rank's environment
    code, output = run(tmp_path, "3")
    assert code == 3
    lines = output.splitlines()
    assert lines[:6] == ["name __main__", "argv ['3']", f"cwd {tmp_path / 'folder'}",
                         "env yes False", "threads 1", "start method None"]
    assert lines[7:] == ["stdin ''", "to stderr", "from the descriptor", "thread done",
                         "atexit ran"]
    # numpy's global generator is reseeded as at import, not copied from the forkserver.
    draws = {run(tmp_path, "0")[1].splitlines()[6] for _ in range(3)}
    assert len(draws) == 3


def test_an_uncaught_error_prints_the_scripts_traceback_and_exits_1(tmp_path):
    code, output = run(tmp_path, "raise")
    assert code == 1
    trace = output[output.index("Traceback"):]
    assert trace.splitlines()[1] == f'  File "{tmp_path / "script.py"}", line 19, in <module>'
    # Only the script's frame, then the error; atexit functions run after, as Python's do.
    assert trace.splitlines()[2:] == ['    raise ValueError("the script\'s own error")',
                                      "ValueError: the script's own error", "atexit ran"]


def test_a_killed_rank_reads_as_its_signal(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    with started(script, [], tmp_path, {}) as rank:
        assert rank.wait(HANG_GUARD_S) == -9 and rank.poll() == -9
