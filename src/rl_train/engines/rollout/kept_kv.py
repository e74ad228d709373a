"""Keys and values kept between the turns of a trajectory, so that its next turn prefills only
what is new (the tool's answer), not its whole context again.

Why. A multi-turn trajectory comes back to the engine after each tool call with its whole
context: the prompt, its turns so far and the tool's answer. Prefilling all of it again is the
bulk of a turn's cost on a small model (a forward is compute-bound from a few thousand
tokens), while the turn itself generates a few dozen tokens.

What is kept. When a batch ends, each request that asked for it (``GenerationRequest.keep_kv``)
leaves the keys and values of the tokens the model was fed: its context and every token it
generated except the last (which was sampled, never fed). They are copied out of the batch's
cache into one compact tensor per layer for the batch's kept rows, so the batch's cache is
freed as usual. An entry is found by the request id, and used only when the new context
starts with exactly the kept tokens and the weights are the same version: the keys and values
are then those of the same tokens at the same positions under the same weights, whichever
trajectory left them. An entry is used once (the turn that continues from it keeps a new one).

Bounds. Entries are dropped when the weights change (``clear``, called on every weight load,
sleep and KV release), and, oldest first, past ``max_bytes``: the bytes of the batches' compact
tensors that entries still hold (one counts whole while any of its entries is kept). A group
bigger than ``max_bytes`` on its own is not kept. ``max_bytes`` 0 keeps nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

DEFAULT_MAX_MIB = 512


@dataclass(eq=False)
class KeptGroup:
    """The kept rows of one batch: per layer [rows, T, KV heads, head dim] keys and values.
    Its memory lives as long as any of its entries does, so the budget counts it whole."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    live: int = 0
    """Entries of the store that hold this group."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class KeptEntry:
    version: int
    tokens: list[int]
    """The ids whose keys and values are kept, in order from position 0."""
    group: KeptGroup
    row: int
    """This entry's row of ``group``; its first ``len(tokens)`` positions are the tokens'."""


class KeptKV:
    def __init__(self, max_bytes: int = DEFAULT_MAX_MIB << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, KeptEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused_tokens = 0
        """Context tokens whose prefill a kept entry saved, since the engine started."""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the groups the entries hold (a group counts whole while any entry holds it)."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            while self._entries:
                self._release(self._entries.popitem()[1])

    def _release(self, entry: KeptEntry) -> None:
        entry.group.live -= 1
        if entry.group.live == 0:
            self._bytes -= entry.group.nbytes

    def take(self, request_id: str, context: list[int], version: int) -> KeptEntry | None:
        """The entry of ``request_id`` when ``context`` continues its tokens under ``version``
        (removed either way). At least the context's last token is left to prefill: an entry
        as long as the context is cut by one position."""
        with self._lock:
            entry = self._entries.pop(request_id, None)
            if entry is not None:
                self._release(entry)
        if entry is None or entry.version != version:
            return None
        usable = min(len(entry.tokens), len(context) - 1)
        if usable < 1 or context[:usable] != entry.tokens[:usable]:
            return None
        if usable < len(entry.tokens):
            entry = KeptEntry(version, entry.tokens[:usable], entry.group, entry.row)
        return entry

    def put(self, request_id: str, entry: KeptEntry) -> None:
        if self.max_bytes <= 0:
            return
        with self._lock:
            old = self._entries.pop(request_id, None)
            if old is not None:
                self._release(old)
            if entry.group.live == 0:
                self._bytes += entry.group.nbytes
            entry.group.live += 1
            self._entries[request_id] = entry
            while self._bytes > self.max_bytes and self._entries:
                self._release(self._entries.popitem(last=False)[1])


def spans_index(spans: list[tuple[int, int, int, int]], device: torch.device) -> torch.Tensor:
    """[R, T] positions of R rows, each the two ranges [a, b) then [c, d) of its tuple (an
    empty range where a == b), padded to the longest with position 0."""
    table = torch.tensor(spans, dtype=torch.long)
    first, second = table[:, 1] - table[:, 0], table[:, 3] - table[:, 2]
    longest = int((first + second).max())
    at = torch.arange(longest)[None, :]
    index = table[:, :1] + at + (at >= first[:, None]) * (table[:, 2:3] - table[:, 1:2])
    index = torch.where(at < (first + second)[:, None], index, 0)
    return index.to(device)


def gather_group(
    cache_keys: list[torch.Tensor],
    cache_values: list[torch.Tensor],
    rows: list[int],
    spans: list[tuple[int, int, int, int]],
) -> KeptGroup:
    """Rows ``rows`` of a batch's cache (per layer [B, KV heads, positions, D]), each at the
    positions of its ``spans`` (``spans_index``), as a compact group."""
    index = spans_index(spans, cache_keys[0].device)
    row_index = torch.tensor(rows, dtype=torch.long, device=index.device)[:, None]
    # advanced indices on dims 0 and 2 around a slice come first: [R, T, KV heads, D]
    return KeptGroup([k[row_index, :, index] for k in cache_keys], [v[row_index, :, index] for v in cache_values])


def assemble(entries: list[KeptEntry | None], capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer cache buffers [B, KV heads, capacity, D] whose first W positions hold each
    row's kept keys and values right-aligned, W the longest row's. Before a shorter row's
    tokens are copies of its first (finite, and masked out); a row without an entry holds
    zeros there. Positions from W on are left for the batch's forwards to write."""
    width = max(len(e.tokens) for e in entries if e is not None)
    first = next(e for e in entries if e is not None).group
    device = first.keys[0].device
    rows_of: dict[int, list[tuple[int, KeptEntry]]] = {}
    for batch_row, entry in enumerate(entries):
        if entry is not None:
            rows_of.setdefault(id(entry.group), []).append((batch_row, entry))
    # per group, built once for every layer: (group, its rows' positions, its rows, their rows here)
    plans = []
    for members in rows_of.values():
        starts = torch.tensor([width - len(e.tokens) for _, e in members])[:, None]
        plans.append((
            members[0][1].group,
            (torch.arange(width)[None, :] - starts).clamp(min=0).to(device),
            torch.tensor([e.row for _, e in members], dtype=torch.long, device=device)[:, None],
            torch.tensor([i for i, _ in members], dtype=torch.long, device=device),
        ))  # fmt: skip
    missing = torch.tensor([i for i, e in enumerate(entries) if e is None], dtype=torch.long, device=device)
    out: dict[str, list[torch.Tensor]] = {"keys": [], "values": []}
    for name, buffers in out.items():
        for layer, like in enumerate(getattr(first, name)):
            buffer = like.new_empty((len(entries), like.shape[2], max(capacity, width), like.shape[3]))
            for group, index, source, target in plans:
                buffer[target, :, :width] = getattr(group, name)[layer][source, index].transpose(1, 2)
            if len(missing):
                buffer[missing, :, :width] = 0
            buffers.append(buffer)
    return out["keys"], out["values"]
