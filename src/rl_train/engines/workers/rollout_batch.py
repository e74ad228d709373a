"""One batch of a rollout replica's generation: its prompt groups and what became of them (R-2.5).

``RolloutWorker._generate`` runs a batch; this is its state, kept in one typed object rather
than in closures, and the bookkeeping that needs no queue: which trajectories each group still
generates (a partial group continues its aborted ones, its finished ones are kept), when a
group has ended and may be written at once, and, at the end, how each group is tagged. The
worker does the queue's reads and writes around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_train.engines.agent.chat import generation_spans
from rl_train.engines.agent.loop import AgentTrajectory
from rl_train.engines.agent.registry import FAILED, Start

Record = dict[str, Any]
FINISHED = {"status": "finished", "partial": False}
FAILURE = {"status": "failure"}
SINGLE_TURN = "single_turn"
"""The one agent loop that continues a partial trajectory from its tokens (the others start afresh)."""


def agent_fields(trajectory: AgentTrajectory) -> dict[str, Any]:
    """What a multi-turn trajectory adds to its record (R-5.6): which tokens the model generated
    (the mask, and its turns as ``[start, end)`` spans of the response), its turn count and its
    tool calls as ``[name, error, seconds]``."""
    return {
        "response_mask": list(trajectory.response_mask),
        "generation_spans": generation_spans(list(trajectory.response_mask)),
        "agent_turns": trajectory.turns,
        "tool_calls": [[call.name, call.error, call.seconds] for call in trajectory.tool_calls],
    }


def group_of(request_id: str) -> str:
    """The prompt key of a trajectory key (``<prompt key>/<j>``)."""
    return request_id.rsplit("/", 1)[0]


@dataclass
class PromptGroup:
    """One prompt of the batch and its trajectories."""

    prompt: Record
    """The prompt record (``prompt``, ``data_source``, ``ground_truth``)."""
    loop: str
    """The agent loop that answers it."""
    expected: int = 0
    """Trajectories this batch generates for it (its others ended before: kept as stored)."""
    ended: list[AgentTrajectory] = field(default_factory=list)
    """Those that ended so far, in the order they ended."""
    written: bool = False
    """Written (and tagged finished) as soon as its last trajectory ended."""

    @property
    def complete(self) -> bool:
        """Every trajectory it expects has ended, none aborted or failed."""
        return len(self.ended) >= self.expected and all(t.stop_reason not in ("aborted", FAILED) for t in self.ended)

    @property
    def unfinished(self) -> bool:
        return not self.written and len(self.ended) < self.expected


@dataclass
class RolloutBatch:
    partition: str
    n: int
    """Trajectories per prompt."""
    with_tools: bool
    """A tool call follows each train trajectory: groups are finished when their calls return."""
    taken: list[str] = field(default_factory=list)
    """Every prompt tagged ``running`` for this batch, those taken in as it ran included, in
    order (one whose group could not be built too: it is tagged ``failure`` with the rest)."""
    groups: dict[str, PromptGroup] = field(default_factory=dict)
    """The group of each prompt taken in, in the order taken."""
    earlier: dict[str, Record] = field(default_factory=dict)
    """Stored trajectories of the prompts an abort left partial, by trajectory key."""
    pending: dict[str, list[Start]] = field(default_factory=dict)
    """Starts not handed to their agent loop yet, by loop."""
    written_early: list[str] = field(default_factory=list)
    """Groups written as they finished, in that order."""
    writes: list[Any] = field(default_factory=list)
    """Queue writes submitted and not awaited yet (one caller's calls reach the queue in order)."""
    results: list[AgentTrajectory] = field(default_factory=list)
    """Every trajectory the loops returned."""

    def add_groups(
        self, keys: list[str], prompts: list[Record], loops: list[str], prompt_ids: list[list[int]]
    ) -> dict[str, list[Start]]:
        """Take prompts in (``earlier`` holds their partial trajectories already): the starts of
        the trajectories to generate, by agent loop. A single turn continues its aborted
        trajectory from its tokens; a tool loop starts it afresh."""
        starts: dict[str, list[Start]] = {}
        for key, prompt, loop, ids in zip(keys, prompts, loops, prompt_ids, strict=True):
            group = self.groups[key] = PromptGroup(prompt, loop)
            for j in range(self.n):
                old = self.earlier.get(f"{key}/{j}")
                if old is None or old["stop_reason"] == "aborted":
                    prefix = list(old["response_ids"]) if old and loop == SINGLE_TURN else []
                    starts.setdefault(loop, []).append((f"{key}/{j}", ids, prefix))
                    group.expected += 1
        return starts

    def end(self, trajectory: AgentTrajectory) -> PromptGroup | None:
        """Note an ended trajectory; its group when that completes it and it may be written at
        once (without tools: a group with tools waits for its calls)."""
        group = self.groups[group_of(trajectory.request_id)]
        group.ended.append(trajectory)
        return group if not self.with_tools and group.complete else None

    def unfinished_groups(self) -> int:
        """Groups still generating (how much room the batch has for more)."""
        return sum(1 for group in self.groups.values() if group.unfinished)

    def failed_keys(self, prompt_keys: list[str]) -> list[str]:
        """The prompts to tag ``failure`` when the batch fails: all but those already written."""
        return [k for k in dict.fromkeys([*prompt_keys, *self.taken]) if not (k in self.groups and self.groups[k].written)]

    def failed_groups(self) -> set[str]:
        """The groups one of whose agents failed (``FAILED``): tagged ``failure``, nothing written."""
        return {group_of(r.request_id) for r in self.results if r.stop_reason == FAILED}

    def unwritten_results(self) -> list[AgentTrajectory]:
        """The trajectories to write now: not written early, and not of a failed group."""
        failed = self.failed_groups()
        return [r for r in self.results if not self.groups[group_of(r.request_id)].written and group_of(r.request_id) not in failed]

    def early_keys(self) -> list[str]:
        """The trajectory keys of the groups written as they finished."""
        return [t.request_id for key in self.written_early for t in self.groups[key].ended]

    def final_tags(
        self, records: dict[str, Record], tags: dict[str, Record]
    ) -> tuple[list[str], dict[str, float], dict[str, Record]]:
        """Once the loops returned, with the ``records`` and ``tags`` of the trajectories not
        written yet: (the prompts an abort left unfinished, the tool deadline of each group
        whose calls are still running, the tags of every group not written early).

        An unfinished prompt goes back to ``pending`` and ``partial``, with the oldest version
        among its tokens; a group with a failed agent is ``failure`` (the replay buffer retries
        or refills it, the others keep theirs); a group with tools stays ``running`` until its
        deadline; every other one is ``finished``."""
        failed = self.failed_groups()
        unfinished = sorted({group_of(k) for k, t in tags.items() if t["status"] == "aborted"})
        done = [k for k, group in self.groups.items() if k not in unfinished and k not in failed and not group.written]
        deadlines = (
            {k: max(float(r.get("tool_done_at", 0.0)) for r in self._stored(k, records)) for k in done}
            if self.with_tools
            else {}
        )
        status: dict[str, Record] = {k: dict(FINISHED) for k in done if k not in deadlines}
        status.update({k: dict(FAILURE) for k in failed})
        for key in unfinished:
            oldest = min((v for r in self._stored(key, records) for v in r["token_versions"]), default=None)
            status[key] = {"status": "pending", "partial": True}
            if oldest is not None:
                status[key]["version"] = oldest
        return unfinished, deadlines, status

    def _stored(self, key: str, records: dict[str, Record]) -> list[Record]:
        """The group's trajectories: this batch's records, else the stored ones."""
        return [records.get(f"{key}/{j}") or self.earlier[f"{key}/{j}"] for j in range(self.n)]
