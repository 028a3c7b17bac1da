"""A rank of a user's script, forked from the forkserver that has torch and polyrhythm loaded
(launch/process/forkserver.py) instead of started as `python script.py args`: the same script run
the same way, without importing torch again (1.5-2 s of CPU a rank on a 2-core machine, all
ranks at once: seconds of every script run's start).

The child makes itself what a fresh interpreter would be for the script: its own argv,
folder, environment (torch's thread count from its OMP_NUM_THREADS, read by OpenMP only when
the forkserver loaded it), stdin from /dev/null, stdout and stderr unbuffered into the
launcher's pipe, the script as `__main__`, a fresh start method for multiprocessing and
fresh seeds where the fork copied a state (numpy's global generator; Python's own reseeds
itself). It ends as the interpreter would: an uncaught exception through sys.excepthook
(the script's frames only) and exit status 1, SystemExit's status, non-daemon threads
joined, atexit functions run. It dies with its launcher, as a built-in job's ranks do.
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
import runpy
import signal
import sys
import threading
from multiprocessing.connection import Connection

from polyrhythm.launch.process import forkserver
from polyrhythm.launch.process.supervisor import Forked
from polyrhythm.launch.rank.forked import bind_to_launcher, process_name
from polyrhythm.launch.rank.life import flush_output, leave_now


class ScriptRank(Forked):
    """A script's rank, forked with torch loaded, held as the supervisor holds any rank's
    process (launch/process/supervisor.py: `pid`, `poll`, `wait`, `terminate`, `kill`), and
    `stdout`, its output and errors as bytes."""

    def __init__(self, script: str, args: list[str], cwd: str, env: dict[str, str],
                 rank: int, alive: Connection) -> None:
        """Start rank `rank` of `script`; it ends the moment the launcher is gone (`alive`:
        the read end of a pipe only the launcher holds the other end of)."""
        read, write = os.pipe()
        # A Connection is how multiprocessing hands a file descriptor to a forked child.
        out = Connection(write, readable=False)
        process = forkserver.context().Process(
            target=_run_script, name=process_name(rank),
            args=(script, list(args), cwd, dict(env), out, rank, alive))
        try:
            with forkserver.child_environment():
                process.start()
        except BaseException:
            os.close(read)
            raise
        finally:
            out.close()  # the child holds its own copy; end-of-file once it is gone
        self.stdout = open(read, "rb")  # noqa: SIM115 (read until the rank ends)
        super().__init__(process, (rank,))


def _run_script(script: str, args: list[str], cwd: str, env: dict[str, str],
                out: Connection, rank: int, alive: Connection) -> None:
    """The child: become the script's interpreter, run it, end as the interpreter would."""
    gc.freeze()  # keep the pages shared with the forkserver shared (launch/launchers/local.py)
    bind_to_launcher(rank, alive)
    _stdio(out)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)
    _fresh_state(env)
    _join_before_stepping()
    code = _main(script)
    if (joined := sys.modules.get("polyrhythm.launch.rank.script_rank")) is not None:
        joined.EXIT_STATUS.append(code)  # a job its script forgot to finish: finished if 0
    for thread in threading.enumerate():  # the interpreter waits for non-daemon threads
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    leave_now(code, exit_handlers=True)


def _stdio(out: Connection) -> None:
    """stdin from /dev/null; stdout and stderr into the launcher's pipe, unbuffered (as
    PYTHONUNBUFFERED makes them), also at the file-descriptor level for what the script
    starts."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    out.close()
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = _unbuffered(1)
    sys.stderr = sys.__stderr__ = _unbuffered(2, errors="backslashreplace")


def _unbuffered(fd: int, errors: str = "strict") -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, line_buffering=True,
                            write_through=True)


def _fresh_state(env: dict[str, str]) -> None:
    """What a fresh interpreter would have and the fork copied from the forkserver."""
    import torch

    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    multiprocessing.set_start_method(None, force=True)  # the script may set its own
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # as seeded at import, from the OS


def _join_before_stepping() -> None:
    """A script that steps an optimizer without having joined its job (no
    polyrhythm.init()) stops there, rather than train all of itself in every rank; the
    launcher says so in one line (failures.py never_joined). (torch runs the global hooks
    while iterating over them, so the hook cannot remove itself once the script joined: it
    stays, a dictionary look-up a step.)"""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def check(optimizer, args, kwargs) -> None:
        joined = sys.modules.get("polyrhythm.launch.rank.script_rank")
        if joined is not None and joined.joined():
            return
        from pathlib import Path

        from polyrhythm.launch.process.failures import mark_joined
        from polyrhythm.launch.rank.script_rank import ENV_CONFIG

        # The config file lies in the run's folder, where the launcher looks for marks; it
        # says the one line (no traceback: nothing failed in the script itself).
        mark_joined(Path(os.environ[ENV_CONFIG]).parent, int(os.environ["RANK"]), False)
        raise SystemExit(1)
    register_optimizer_step_pre_hook(check)


def _main(script: str) -> int:
    """Run the script as `__main__`; its exit status."""
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 (what the interpreter does with any)
        trace = exc.__traceback__
        while trace is not None and trace.tb_frame.f_code.co_filename != script:
            trace = trace.tb_next  # runpy's and this module's frames are not the script's
        sys.excepthook(type(exc), exc.with_traceback(trace), trace)
        if isinstance(exc, KeyboardInterrupt):  # the interpreter ends by the signal
            flush_output()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        return 1

