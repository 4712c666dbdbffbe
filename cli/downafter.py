"""What `up --down-after` does once up ends: destroy the cluster, unless a run may still be going
on nodes fatpipe could not follow to their end (docs/ARCHITECTURE.md, "A run lives on its nodes").

The cluster goes once every node of the run has recorded its exit, or when the user asks
(Ctrl-C, SIGTERM); a reason that lies on this machine (a follow that gave up on a node out of
reach, the launch breaking off here) leaves it up, with how to reattach and how to destroy it.
"""

from __future__ import annotations

from dataclasses import asdict

from .options import silence_output
from .render import escape
from .signals import TeardownAbandoned, guarded_teardown
from .steps import terraform_log

USER_ASKED = (130, 143)  # Ctrl-C, SIGTERM


class DownAfter:
    """`Up`'s teardown; it reads the up's spec, flags, phases, report, and the run it launched."""

    launched = None  # the training run's nodes, once its launch began (ops NodeRun)
    result = None  # how the launch ended, once it returned (ops LaunchResult)

    def down_after(self, code: int) -> int:
        """Destroy, or leave the cluster up while its run may still be going; the exit status."""
        live = [] if code in USER_ASKED else self.live_nodes()
        if not live:
            return self.down(code)
        name = self.spec.name
        self.phases.skip("down", f"run still going on {', '.join(live)}")
        self.say(f"[yellow]{name} stays up[/]: its run may still be going on {', '.join(live)}; "
                 f"`fatpipe logs {name} -f` reattaches, `fatpipe down {name}` destroys it")
        return code

    def live_nodes(self) -> list[str]:
        """Nodes on which this up's run may still be going: those the follow gave up on, or, when
        the launch broke off on this machine, those that say so or cannot be reached."""
        if self.result is not None:
            return list(self.result.unknown)
        if self.launched is None:
            return []
        from fatpipe.ops.run.follow import still_going

        return still_going(self.launched)

    def down(self, code: int) -> int:
        """Destroy the cluster, Ctrl-C guarded; says what went. A failed or abandoned destroy is
        reported with the command that finishes it, and makes the exit status nonzero."""
        name = self.spec.name
        try:
            with guarded_teardown(self.out, f"the teardown of {name}"):
                from fatpipe.stacks.engine import destroy_cluster

                result = self.phases.run("down", f"destroy {name} (--down-after)", lambda: destroy_cluster(
                    self.project, name, engine=self.flags.engine, log=terraform_log(self.flags.verbose)),
                    spinner=False)
        except BrokenPipeError:
            silence_output()
            return self.down(code)  # destroying again is safe: what is gone stays gone
        except TeardownAbandoned:
            self.say(f"[red]teardown of {name} abandoned[/]: resources may be left; "
                     f"`fatpipe down {name}` removes them")
            return code or 130
        except Exception as e:  # noqa: BLE001 - whatever broke, the user must hear the cluster may be up
            self.say(f"[red]destroy of {name} failed[/]: {escape(str(e))}\nresources may be left: run `fatpipe down {name}`")
            return code or 1
        self.phases.get("down").note = result.summary()
        self.report["teardown"] = asdict(result)
        self.say(f"{name}: {result.summary()}")
        return code
