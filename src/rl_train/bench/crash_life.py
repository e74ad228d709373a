"""One launch of a crash-tested run: start the command, watch its stderr, SIGKILL it on cue.

The kill takes the run's whole session at once, as a machine that loses power would: the
driver's process group (the driver, Ray's gcs and raylet) and the Ray workers, which raylet
puts in process groups of their own (a group kill alone misses them; they would then linger
until they noticed raylet was gone). Afterwards every process of the session is accounted for
(``crash_sweep``), and so is the shared memory its processes were seen to use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rl_train.bench.crash_sweep import (
    ProcessInfo,
    kill_session,
    live_processes,
    read_process,
    reap_run,
    run_processes,
    shm_files,
    shm_in_use,
)
from rl_train.bench.crash_trigger import MARKER, PROGRESS, RESUME, Cue, KillTrigger
from rl_train.storage.checkpoint_manifest import MANIFEST_NAME

SCAN_SECONDS = 2.0
"""How often the run's processes are listed (a scan of /proc costs a tenth of a second or more
on a busy machine: more often would slow the run it watches)."""
POLL_SECONDS = 0.002
"""How often a checkpoint folder is looked at while a kill waits for it to be part-written."""


@dataclass
class Life:
    """What one run of the command did, as seen from outside."""

    index: int
    kind: str | None
    """The kill's aim; None: the run was left to finish."""
    expected_resume_step: int
    """The newest checkpoint that verified before launch (0: none); what the run must load."""
    expected_problems: list[str] = field(default_factory=list)
    """``CheckpointStore.verify`` of that checkpoint just before launch: [] when it is whole."""
    lines: list[tuple[float, str]] = field(default_factory=list)
    """(seconds since launch, stderr line), every line the run wrote before it died."""
    killed_at: float | None = None
    exit_code: int | None = None
    seconds: float = 0.0
    survivors: list[ProcessInfo] = field(default_factory=list)
    """Processes of the run alive after the kill (killed then, by pid)."""
    outside_group: list[ProcessInfo] = field(default_factory=list)
    """Processes of the run seen outside its process group, which a group kill misses."""
    shm_seen: set[str] = field(default_factory=set)
    launched_at: float = 0.0
    """Wall-clock time of the launch (``time.time()``)."""
    committed_after: list[int] = field(default_factory=list)
    torn_after: dict[int, float] = field(default_factory=dict)
    """Step folders without a manifest once the run was dead -> the newest mtime in each."""
    shm_unattributed: set[str] = field(default_factory=set)
    """/dev/shm files that appeared during the launch and that no process holds once it is dead,
    but that no process of the run was seen to use: maybe the run's, maybe another test's."""

    def markers(self, what: str, edge: str) -> list[int]:
        return [
            int(m[3]) for _, line in self.lines if (m := MARKER.match(line)) and m[1] == what and m[2] == edge
        ]

    def resumed_from(self) -> int | None:
        """The checkpoint step the run announced it loaded; None when it printed no resume line."""
        found = [int(m[3]) - 1 for _, line in self.lines if (m := RESUME.match(line))]
        return found[0] if found else None

    def progress_steps(self) -> list[int]:
        return [int(m[1]) for _, line in self.lines if (m := PROGRESS.match(line))]

    def open_syncs(self) -> list[int]:
        """Pushes begun and never seen to end: the kill landed while the weights were moving."""
        ended = set(self.markers("sync", "end"))
        return [v for v in self.markers("sync", "begin") if v not in ended]

    def torn_writes(self) -> list[int]:
        """Checkpoints this launch began and never committed, left as a folder without a
        manifest that this launch wrote into (a torn folder of an earlier launch does not count)."""
        committed = set(self.markers("ckpt", "end"))
        return [
            s
            for s in self.markers("ckpt", "begin")
            if s not in committed and self.torn_after.get(s, 0.0) >= self.launched_at
        ]

    def outcome(self) -> str:
        if self.killed_at is None:
            return f"exit {self.exit_code} after {self.seconds:.1f} s"
        return f"killed at {self.killed_at:.1f} s"

    def phase(self) -> str:
        """Where the kill landed, in words, from the last lines before it."""
        if self.killed_at is None:
            return "not killed"
        parts = []
        if self.torn_writes():
            parts.append(f"checkpoint write of step {self.torn_writes()[-1]}")
        if self.open_syncs():
            parts.append(f"weight sync of version {self.open_syncs()[-1]}")
        begun, ended = self.markers("restore", "begin"), self.markers("restore", "end")
        if begun and not ended:
            parts.append(f"restore of checkpoint {begun[-1]}")
        steps = self.progress_steps()
        if not parts:
            parts.append(f"after step {steps[-1]}" if steps else "start-up, before the first step")
        return "; ".join(parts)


class LifeRunner:
    """Runs the command once under a trigger, kills it on cue, accounts for what it left."""

    def __init__(self, command: list[str], env: dict[str, str], marker: str, log_dir: Path) -> None:
        self.command = command
        self.env = env
        self.marker = marker
        """A string only this run's processes carry in their command line (its Ray temp dir)."""
        self.log_dir = log_dir
        self.timeout_seconds = 900.0

    def remove_ray_dir(self) -> None:
        """Ray's session logs of every launch; removed once no process of the run is left."""
        if not run_processes(-1, self.marker):  # session -1: none; only those naming the dir
            shutil.rmtree(self.marker, ignore_errors=True)

    def run(self, life: Life, trigger: KillTrigger | None) -> Life:
        shm_before = shm_files()
        with open(self.log_dir / f"life-{life.index:02d}.out", "wb") as stdout:
            life.launched_at = time.time()
            proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.PIPE,
                env=self.env,
                start_new_session=True,
            )
            killer = _Killer(proc, life)
            reader = threading.Thread(target=self._read, args=(proc, life, trigger, killer), daemon=True)
            reader.start()
            if trigger is not None and (cue := trigger.at_launch()) is not None:
                killer.on_cue(cue)
            try:
                self._watch(proc, life, killer)
            finally:
                killer.finish()
                life.exit_code = proc.wait()
                life.seconds = time.monotonic() - killer.started
        if life.killed_at is not None:
            kill_session(proc.pid, self.marker)  # the rest of the crash: workers, whoever started late
        life.survivors = reap_run(proc.pid, self.marker)
        reader.join(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()
        new = shm_files() - shm_before - life.shm_seen
        if new:
            life.shm_unattributed = new - shm_in_use([p.pid for p in live_processes()])
        text = "".join(f"{t:9.3f} {line}\n" for t, line in life.lines)
        (self.log_dir / f"life-{life.index:02d}.err").write_text(text)
        return life

    @staticmethod
    def _read(
        proc: subprocess.Popen[bytes], life: Life, trigger: KillTrigger | None, killer: _Killer
    ) -> None:
        """Record every stderr line and hand it to the trigger; a kill at once happens here,
        in the reading thread, so that it lands within the window it was aimed at."""
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            life.lines.append((time.monotonic() - killer.started, line))
            if trigger is not None and life.killed_at is None:
                cue = trigger.on_line(line)
                if cue is not None:
                    killer.on_cue(cue)

    def _watch(self, proc: subprocess.Popen[bytes], life: Life, killer: _Killer) -> None:
        """Until the run ends, list its processes (the kill needs the workers' pids) and note
        the shared memory they use."""
        outside: dict[int, ProcessInfo] = {}
        while not killer.exited():
            if time.monotonic() - killer.started > self.timeout_seconds:
                raise TimeoutError(f"launch {life.index} ran past {self.timeout_seconds:.0f} s")
            processes = run_processes(proc.pid, self.marker)
            outside.update({p.pid: p for p in processes if p.group != proc.pid})
            killer.workers = {p.pid for p in processes if p.group != proc.pid and p.session == proc.pid}
            life.shm_seen |= shm_in_use([p.pid for p in processes])
            time.sleep(SCAN_SECONDS)
        life.outside_group = list(outside.values())


class _Killer:
    """SIGKILL to the run, once: its process group and its workers' pids (each checked to be
    of the run's session still). Never after the driver has been reaped: its pid, the group's
    id, could then belong to another process."""

    def __init__(self, proc: subprocess.Popen[bytes], life: Life) -> None:
        self.proc = proc
        self.life = life
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.done = False
        self.workers: set[int] = set()
        """Pids of the run outside the driver's group, from the last scan."""
        self.timers: list[threading.Thread] = []

    def now(self) -> None:
        with self.lock:
            if self.done or self.life.killed_at is not None:
                return
            self.life.killed_at = time.monotonic() - self.started
            os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in self.workers:
                process = read_process(pid)
                if process is not None and process.session == self.proc.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    def on_cue(self, cue: Cue) -> None:
        if cue.folder is not None:
            self._start(threading.Thread(target=self._kill_mid_write, args=(cue,), daemon=True))
        elif cue.delay_seconds <= 0:
            self.now()
        else:
            self._start(threading.Timer(cue.delay_seconds, self.now))

    def _start(self, thread: threading.Thread) -> None:
        thread.daemon = True
        self.timers.append(thread)
        thread.start()

    def _kill_mid_write(self, cue: Cue) -> None:
        """Kill once ``cue.folder`` holds ``cue.min_parts`` files and no manifest; give up when
        the manifest comes first (the write was too quick to catch) or the run ends."""
        assert cue.folder is not None
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and not self.done and self.life.killed_at is None:
            if (cue.folder / MANIFEST_NAME).exists():
                return
            with contextlib.suppress(OSError):  # a file renamed while we look
                parts = [p for p in cue.folder.rglob("*") if p.is_file() and not p.name.startswith(".")]
                if len(parts) >= cue.min_parts:
                    self.now()
                    return
            time.sleep(POLL_SECONDS)

    def exited(self) -> bool:
        with self.lock:
            self.done = self.proc.poll() is not None
            return self.done

    def finish(self) -> None:
        """Kill whatever still runs (a timeout, an error in the harness), then stop the timers."""
        for thread in self.timers:
            if isinstance(thread, threading.Timer):
                thread.cancel()
        if not self.exited():
            self.now()
