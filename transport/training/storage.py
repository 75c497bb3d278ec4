"""A storage host of the training job, sans-I/O, and the job's coordinator that one of them runs.

A storage host takes writes (it answers WRITTEN once it holds every byte of one) and serves reads (it
answers a READ of N bytes with DATA chunks of N bytes in all). It keeps no bytes: what the model needs
is the transfers' time over the network, not their contents.

The coordinator is what a job's rendezvous store and launcher do together (torchrun's elastic agent,
say): it lets an epoch start once every rank has joined it (a rendezvous, so that no rank's
collective waits on a peer still starting or restoring), it hears each rank's committed checkpoints,
and on the first failure of an epoch it orders every rank to restart, in a new epoch, from the last
checkpoint that every rank has written. When every rank has finished the same epoch it ends the job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from transport.training.messages import CHUNK_BYTES, Kind, MessageError, decode, encode
from transport.training.spec import rank_name

logger = logging.getLogger(__name__)

Sends = list[tuple[str, bytes]]


@dataclass
class Coordinator:
    n_ranks: int
    epoch: int = 0
    committed: dict[int, int] = field(default_factory=dict)  # rank -> step of its last checkpoint
    finished: set[int] = field(default_factory=set)
    joined: set[int] = field(default_factory=set)
    restarts: list[dict] = field(default_factory=list)  # {"epoch", "from_step", "failed_rank"}
    ended: bool = False

    def receive(self, kind: Kind, fields: tuple[int, ...], now: float) -> Sends:
        if kind is Kind.JOIN:
            rank, epoch = fields
            if epoch != self.epoch or rank in self.joined:
                return []
            self.joined.add(rank)
            return self._all(encode(Kind.GO, epoch)) if len(self.joined) == self.n_ranks else []
        if kind is Kind.COMMIT:
            rank, step = fields
            self.committed[rank] = max(self.committed.get(rank, 0), step)
            return []
        if kind is Kind.FAILED:
            rank, epoch = fields
            if epoch != self.epoch or self.ended:
                return []  # this epoch's restart is already ordered
            self.epoch += 1
            step = min(self.committed.get(r, 0) for r in range(self.n_ranks))
            self.finished.clear()
            self.joined.clear()
            self.restarts.append({"epoch": self.epoch, "from_step": step, "failed_rank": rank, "at": now})
            logger.info("rank %d failed in epoch %d: every rank restarts from step %d", rank, epoch, step)
            return self._all(encode(Kind.RESTART, self.epoch, step))
        if kind is Kind.FINISHED:
            rank, epoch = fields
            if epoch == self.epoch:
                self.finished.add(rank)
            if len(self.finished) == self.n_ranks and not self.ended:
                self.ended = True
                return self._all(encode(Kind.END))
            return []
        raise MessageError(f"a {kind.name} message is not for the coordinator")

    def _all(self, msg: bytes) -> Sends:
        return [(rank_name(r), msg) for r in range(self.n_ranks)]


@dataclass(eq=False)
class StorageHost:
    name: str
    coordinator: Coordinator | None = None
    bytes_written: int = 0
    bytes_read: int = 0
    writes_done: int = 0
    _partial: dict[tuple[str, int], int] = field(default_factory=dict)

    def receive(self, src: str, data: bytes, now: float) -> Sends:
        msg = decode(data)
        if msg.kind is Kind.WRITE:
            tid, total = msg.fields
            key = (src, tid)
            got = self._partial.get(key, 0) + len(msg.payload)
            self.bytes_written += len(msg.payload)
            if got < total:
                self._partial[key] = got
                return []
            self._partial.pop(key, None)
            self.writes_done += 1
            return [(src, encode(Kind.WRITTEN, tid))]
        if msg.kind is Kind.READ:
            tid, total = msg.fields
            self.bytes_read += total
            return [(src, encode(Kind.DATA, tid, payload=bytes(min(CHUNK_BYTES, total - off))))
                    for off in range(0, total, CHUNK_BYTES)]
        if msg.kind in (Kind.JOIN, Kind.COMMIT, Kind.FAILED, Kind.FINISHED) and self.coordinator is not None:
            return self.coordinator.receive(msg.kind, msg.fields, now)
        raise MessageError(f"{self.name}: a {msg.kind.name} message is not for a storage host")

    def stats(self) -> dict:
        return {"bytes_written": self.bytes_written, "bytes_read": self.bytes_read, "writes_done": self.writes_done}
