"""What `rlfleet up` and `rlfleet resume` are asked to start: `LaunchOptions`, one typed
object that the command line builds from its parsed options, the Python API (`rlfleet.up`)
from its keyword arguments and `rlfleet slurm submit` for the run directory it writes. The
plan (`plan.py`) and the launcher (`launcher.py`) read nothing else, so a launch from Python
and one from a shell are the same launch."""

from __future__ import annotations

from pydantic import Field, model_validator

from rlfleet.command import CommandOptions

DEFAULT_COLLECTORS = 2  # a new run's, and a resumed run's that left no record of its own


class LaunchOptions(CommandOptions):
    """One launch of a local cluster: a new run (`config` given) or, with `resume`, the run
    in `run_dir` continued. A field left None takes the config's value (a new run) or the
    run's last one (a resume)."""

    config: str | None = Field(None, description="a new run's config: a YAML path or the "
                               "name of a packaged config; a resume reads its run directory's")
    overrides: tuple[str, ...] = Field((), description="`KEY=VALUE` items for the config, "
                                       "written with it into the run directory's config.yaml")
    collectors: int | None = Field(None, description="None: 2 for a new run, the run's last "
                                   "count for a resume")
    learners: int | None = Field(None, description="the learner group's size; None: the "
                                 "config's learner.count (a resume: the run's last count)")
    storage: str | None = Field(None, description="a directory or redis://host:port/db; None: "
                                "the config's, else <run_dir>/storage")
    run_dir: str | None = Field(None, description="where the run is kept; None for a new run: "
                                "runs/<name>-<time>")
    seed: int | None = None
    max_wall_s: float | None = Field(None, description="a budget in place of the config's")
    max_env_steps: int | None = Field(None, description="a budget in place of the config's")
    quiet: bool = Field(False, description="no live progress line")
    port: int | None = Field(None, description="the coordinator's on 127.0.0.1; None: a free "
                             "one")
    collector_nice: int = Field(5, description="collectors' scheduling niceness: they yield "
                                "the CPU to the learner")
    max_restarts: int = Field(10, ge=0, description="restarts of one child before the run "
                              "ends as crashed")
    resume: bool = Field(False, description="continue the run in `run_dir`")
    local_devices: bool = Field(True, description="this machine's CUDA devices are the run's "
                                "(not so for a submission to a cluster)")

    @model_validator(mode="after")
    def _new_or_resumed(self) -> LaunchOptions:
        if not self.resume:
            if self.config is None:
                raise ValueError("config: a new run needs a config (a YAML path or a "
                                 "packaged config's name)")
            return self
        if self.run_dir is None:
            raise ValueError("run_dir: a resume needs the run directory to continue")
        kept = {"config": self.config, "storage": self.storage, "seed": self.seed}
        for field, value in kept.items():
            if value is not None:
                raise ValueError(f"{field}: a resume keeps the run's own (its run directory's "
                                 "config.yaml); give changes as overrides")
        return self
