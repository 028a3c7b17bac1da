"""Set-up for the whole suite."""

import signal


def pytest_configure(config):
    """Launchers the tests interrupt take SIGINT as a terminal's Ctrl-C. A suite started as a
    background job of a script (`make test &`) inherits SIGINT ignored, and every process it
    starts would ignore it too (Python keeps an inherited SIG_IGN): the launcher would train
    on and the interrupt tests fail for how the suite was started. Python's own handler is
    reset to the default in the processes the tests start."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
