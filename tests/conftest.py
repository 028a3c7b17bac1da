"""Set-up for the whole suite."""

import signal
import subprocess

import pytest
import torch


def pytest_configure(config):
    """Launchers the tests interrupt take SIGINT as a terminal's Ctrl-C. A suite started as a
    background job of a script (`make test &`) inherits SIGINT ignored, and every process it
    starts would ignore it too (Python keeps an inherited SIG_IGN): the launcher would train
    on and the interrupt tests fail for how the suite was started. Python's own handler is
    reset to the default in the processes the tests start."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def torch_threads_unchanged():
    """A test that changes torch's thread count in this process must put it back: the
    exact comparisons of later tests (a reference trained here against a run) would
    otherwise depend on which tests ran before them (helpers.torch_threads restores it)."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    torch.set_num_threads(before)  # the tests after it run as they would have
    assert after == before, (f"the test left torch's thread count at {after} (it was "
                             f"{before}): set it with helpers.torch_threads")



@pytest.fixture
def advise(capfd):
    """`advise(*args)`: `polyrhythm advise ARGS...` (the command's main, in this process) as a
    finished process: its exit code, stdout and stderr (test_advise, test_sim_compression)."""
    from polyrhythm.cli import main

    def run(*args: str) -> subprocess.CompletedProcess:
        capfd.readouterr()  # what came before is not the command's
        try:
            code = main(["advise", *args])
        except SystemExit as exc:  # argparse's usage errors exit as `python -m` would
            code = exc.code
        captured = capfd.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)
    return run
