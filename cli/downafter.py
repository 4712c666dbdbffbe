"""How `up` ends: its exit status however its phases ended, what `--down-after` does then, the
phase table and the verdict.

`--down-after` destroys the cluster, unless a run may still be going on its nodes
(docs/ARCHITECTURE.md, "A run lives on its nodes"): it goes once every node of the run has
recorded its exit, or when the user asks for a stop (a Ctrl-C typed at the terminal, a
termination under `--on-signal stop`). A reason that lies on this machine (a follow that gave up
on a node out of reach, a termination that let go of the run, the launch breaking off here)
leaves it up, and `up` ends on one line naming it and how to reattach and to destroy it.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from fatpipe.infra.defaults import UP_REPORT_FILE
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_json_atomic
from fatpipe.ops.run.detach import DETACHED
from fatpipe.ops.run.follow import still_going
from fatpipe.stacks.engine import destroy_cluster

from .deploying import terraform_log
from .ending import HEARD, interrupted_status, interrupted_word, silence_output
from .render import escape
from .signals import TeardownAbandoned, guarded_teardown

USER_ASKED = (129, 130, 143)  # SIGHUP, SIGINT, SIGTERM: a stop, when the user asked for one (HEARD.stop)


class DownAfter:
    """How an `Up` ends: its status, its teardown, its verdict; it reads the up's spec, flags,
    phases, report, and the run it launched."""

    launched = None  # the training run's nodes, once its launch began (ops NodeRun)
    result = None  # how the launch ended, once it returned (ops LaunchResult)
    left_up = ""  # the last line when --down-after leaves the cluster up

    def run_to_the_end(self, train, script: list[str]) -> int:
        """Every phase, then (with --down-after) the teardown however the phases ended; the exit status."""
        code = 1
        try:
            code = self.run(train, script)
        except KeyboardInterrupt:
            code = interrupted_status()
            self.say(f"[yellow]{escape(interrupted_word())}[/]")
        except FatpipeError as e:
            self.say(f"[red]error[/]: {escape(str(e))}")
            code = e.exit_code
        except BrokenPipeError:  # the reader of our output went away: finish quietly
            silence_output()
            code = 141
        finally:
            if code == 130 and HEARD.signum:  # a termination the launch took as its own stop
                code = interrupted_status()
            if self.flags.down_after:
                code = self.down_after(code)
            self.finish(code)
        return code

    def say(self, text: str) -> None:
        try:
            self.out.print(text, highlight=False, soft_wrap=True)  # one line, whole, for copying
        except BrokenPipeError:
            silence_output()

    def down_after(self, code: int) -> int:
        """Destroy, or leave the cluster up while its run may still be going; the exit status."""
        live = [] if HEARD.stop and code in USER_ASKED else self.live_nodes()
        if not live:
            return self.down(code)
        name = self.spec.name
        self.phases.skip("down", f"run still going on {', '.join(live)}")
        self.left_up = (f"[yellow]{name} stays up, and bills[/]: its run may still be going on {', '.join(live)}; "
                        f"`fatpipe logs {name} -f` reattaches, `fatpipe down {name}` destroys it")
        return code

    def live_nodes(self) -> list[str]:
        """Nodes on which this up's run may still be going: those the follow gave up on, or, when
        the launch broke off on this machine, those that say so or cannot be reached."""
        if self.result is not None:
            return list(self.result.unknown)
        if self.launched is None:
            return []
        return still_going(self.launched)

    def down(self, code: int) -> int:
        """Destroy the cluster, Ctrl-C guarded; says what went. A failed or abandoned destroy is
        reported with the command that finishes it, and makes the exit status nonzero."""
        name = self.spec.name
        try:
            with guarded_teardown(self.out, f"the teardown of {name}"):
                result = self.phases.run("down", f"destroy {name} (--down-after)", lambda: destroy_cluster(
                    self.project, self.spec, engine=self.flags.engine, log=terraform_log(self.flags.verbose)),
                    spinner=False)
        except BrokenPipeError:
            silence_output()
            return self.down(code)  # destroying again is safe: what is gone stays gone
        except TeardownAbandoned:
            self.say(f"[red]teardown of {name} abandoned[/]: resources may be left; "
                     f"`fatpipe down {name}` removes them")
            return code or 130
        except Exception as e:  # noqa: BLE001 - whatever broke, the user must hear the cluster may be up
            self.say(f"[red]destroy of {name} failed[/]: {escape(str(e))}\n"
                     f"resources may be left: run `fatpipe down {name}`")
            return code or 1
        self.phases.get("down").note = result.summary()
        self.report["teardown"] = asdict(result)
        self.say(f"{name}: {result.summary()}")
        return code

    def finish(self, code: int) -> None:
        """The phase table and the verdict, then the cluster left up; the report as up.json in the run folder."""
        run_dir = self.report.get("run_dir")
        if run_dir is not None and Path(run_dir).exists():
            doc = {**self.report, "run_dir": str(run_dir), "exit_code": code,
                   "phases": [asdict(p) for p in self.phases.phases]}
            write_json_atomic(Path(run_dir) / UP_REPORT_FILE, doc)
        try:
            self.out.print(self.phases.table())
        except BrokenPipeError:
            silence_output()
        detached = f"[yellow]up detached[/] (exit {code}): the run goes on on its nodes"
        self.say("[green]up finished[/]" if code == 0 else detached if code == DETACHED else
                 f"[red]up failed[/] (exit {code})")
        if self.left_up:
            self.say(self.left_up)
