"""The launchers a run can start on, by name, each behind the same doors: what it needs
checked before a run is recorded, a built-in job trained (or resumed), a user's script run
(or resumed). The API asks `launcher_of(config)` and calls it, with no branch on launchers
of its own. A new launcher is its module (starting the ranks, supervised by
launch/process/supervisor.py) and a class here (which configs it `claims`) with a line in
LAUNCHERS.

torchrun is no launcher of this kind: torchrun starts the ranks itself, each running
polyrhythm.node (launch/rank/torchrun.py), or a script calling polyrhythm.init().
"""

from __future__ import annotations

from polyrhythm.config.spark import on_spark
from polyrhythm.errors import ConfigError
from polyrhythm.launch.cluster.hosts import can_emulate
from polyrhythm.launch.launchers.emulated import launch_emulated
from polyrhythm.launch.launchers.local import launch_local
from polyrhythm.launch.launchers.progress import ProgressBoard
from polyrhythm.launch.launchers.script_launcher import ScriptCall, launch_script, script_on_cluster
from polyrhythm.launch.launchers.spark import launch_spark, spark_check
from polyrhythm.metrics.records import RunRecord
from polyrhythm.runtime.checkpoint import Resume


class Launcher:
    """Where a run's ranks start. `title`: its name in a sentence; `resumes`: whether a
    failed run of it can go on from its checkpoint."""

    name = title = ""
    resumes = True

    def claims(self, config) -> bool:
        """Whether `config` runs on this launcher (asked in LAUNCHERS' order: the first that
        claims it takes it)."""
        return True

    def check(self, config, source=None, script: bool = False) -> None:
        """One line for what it cannot run, before a run is recorded: a built-in job of
        `config` on data `source`, or with `script` a user's script."""

    def train(self, config, record: RunRecord, show_progress: bool = False,
              resume: Resume | None = None) -> dict:
        """The built-in job, from `resume` if given: its summary, or RunFailed."""
        raise NotImplementedError

    def script(self, config, record: RunRecord, call: ScriptCall,
               resume: Resume | None = None) -> dict:
        """`call`'s script as every rank, from `resume` if given: its summary, or
        RunFailed. Worker 0's output is shown."""
        raise NotImplementedError


class Local(Launcher):
    """This machine's processes on loopback (launchers/local.py, launchers/script_launcher.py)."""

    name, title = "local", "this machine"

    def train(self, config, record, show_progress=False, resume=None) -> dict:
        board = ProgressBoard(config.workers, enabled=True) if show_progress else None
        return launch_local(config, record, board, resume=resume)

    def script(self, config, record, call, resume=None) -> dict:
        return launch_script(config, record, call, resume=resume)


class Emulated(Launcher):
    """An emulated cluster of this machine's network namespaces, torchrun in each host
    (launch/launchers/emulated.py): needs root, ip and tc."""

    name, title = "emulated", "an emulated cluster"

    def claims(self, config) -> bool:
        return bool(config.cluster.hosts)

    def check(self, config, source=None, script=False) -> None:
        can_emulate()

    def train(self, config, record, show_progress=False, resume=None) -> dict:
        return launch_emulated(config, record, show_progress, resume=resume)

    def script(self, config, record, call, resume=None) -> dict:
        return launch_emulated(config, record, show_progress=True,
                               program=script_on_cluster(config, record, call, resume=resume))


class Spark(Launcher):
    """A Spark cluster's executors (launch/launchers/spark.py): the built-in job only, started
    afresh."""

    name, title = "spark", "Spark"
    resumes = False

    def claims(self, config) -> bool:
        return on_spark(config)  # --launcher spark, or the mapreduce strategy

    def check(self, config, source=None, script=False) -> None:
        if script:
            raise ConfigError("a script runs on this machine, an emulated cluster or "
                              "torchrun, not on Spark (mapreduce and --launcher spark train "
                              "polyrhythm train's job)")
        spark_check(config, source)

    def train(self, config, record, show_progress=False, resume=None) -> dict:
        return launch_spark(config, record, show_progress)


# In the order they are asked whether a config is theirs: this machine last, as the default.
LAUNCHERS: dict[str, Launcher] = {launcher.name: launcher
                                  for launcher in (Spark(), Emulated(), Local())}


def launcher_of(config) -> Launcher:
    """The launcher `config` runs on: the first that claims it (Spark where it says so,
    an emulated cluster where it has hosts, else this machine)."""
    return next(launcher for launcher in LAUNCHERS.values() if launcher.claims(config))
