"""One rank of a training job as a sans-I/O state table (h11 style), like the ring's `RingRank`.

A rank walks its steps: wait for the step's input data, compute, run the step's collective, and
every K steps checkpoint. It never reads a clock or touches a socket: the driver (simulated in
transport/sim/trainsim.py, real in transport/io/training.py) calls ``start``, ``receive(src, msg,
now)`` and ``advance(now)`` and sends what they return, a list of (node name, message), and asks
``wake_time()`` when the clock alone next has something for it (the end of a compute, a collective's
timeout).

Data ingest, checkpoint writes and restores are transfers of N bytes to or from a storage host: the
rank asks for one (`Transfer`, also kept in ``transfers``), the messages that carry it go out with the
rest, and the storage host's answer completes it (a WRITTEN for a write, the last DATA byte for a
read). Storage hosts are transport/training/storage.py, which also holds the job's coordinator.

The table, phase x event -> next phase (anything else raises TrainingStateError):

    SETUP       START -> RENDEZVOUS
    RENDEZVOUS  GO -> WAIT_DATA
    WAIT_DATA   DATA_READY -> COMPUTE
    COMPUTE     COMPUTE_DONE -> COLLECTIVE
    COLLECTIVE  STEP_DONE -> WAIT_DATA | CHECKPOINT_DUE -> CHECKPOINT | LAST_STEP -> FINISHED
                TIMEOUT -> FAILED | BAD_PIECE -> FAILED
    CHECKPOINT  STALL_OVER -> WAIT_DATA | LAST_STALL_OVER -> FINISHED
    FAILED      (waits for RESTART)
    RESTORE     RESTORED -> RENDEZVOUS
    FINISHED    END -> EXITED
    any phase but SETUP and EXITED: RESTART -> RESTORE;
    any phase: COLL_MESSAGE and TRANSFER_DONE keep the phase (background work: a prefetch, an
    asynchronous checkpoint, a peer already in the next step, or started before this rank).

RENDEZVOUS waits until every rank has joined the epoch (the coordinator's GO), at the start and
after a restore. CHECKPOINT is the step's checkpoint stall: a synchronous write in progress, or an asynchronous one
waiting for the previous write to finish (and, after the last step, the last write to finish).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from transport.collective.base import PieceError, RingProtocolError
from transport.training.collective import StepCollective, make_collective
from transport.training.messages import CHUNK_BYTES, Kind, MessageError, decode, encode
from transport.training.spec import JobSpec, RankHosts, rank_name

logger = logging.getLogger(__name__)

Sends = list[tuple[str, bytes]]  # (node name, message)


class Phase(enum.StrEnum):
    SETUP = "setup"
    RENDEZVOUS = "rendezvous"  # joined the epoch; waiting for every rank to
    WAIT_DATA = "wait_data"
    COMPUTE = "compute"
    COLLECTIVE = "collective"
    CHECKPOINT = "checkpoint"
    FAILED = "failed"  # the collective timed out; waiting for the coordinator's restart
    RESTORE = "restore"  # reading the checkpoint back
    FINISHED = "finished"  # every step done; waiting for the coordinator's end
    EXITED = "exited"


class Event(enum.Enum):
    START = "start"
    GO = "go"
    DATA_READY = "data ready"
    COMPUTE_DONE = "compute done"
    STEP_DONE = "step done"
    CHECKPOINT_DUE = "checkpoint due"
    LAST_STEP = "last step done"
    TIMEOUT = "collective timeout"
    BAD_PIECE = "bad collective piece"  # a peer's piece of this step cannot be right (wrong size or values)
    STALL_OVER = "checkpoint stall over"
    LAST_STALL_OVER = "last checkpoint stall over"
    RESTART = "restart"
    RESTORED = "restored"
    END = "end"
    COLL_MESSAGE = "collective message"
    TRANSFER_DONE = "transfer done"


_BACKGROUND = {Event.COLL_MESSAGE: None, Event.TRANSFER_DONE: None}  # None: the phase stays


def _table() -> dict[Phase, dict[Event, Phase | None]]:
    t: dict[Phase, dict[Event, Phase | None]] = {
        Phase.SETUP: {Event.START: Phase.RENDEZVOUS},
        Phase.RENDEZVOUS: {Event.GO: Phase.WAIT_DATA},
        Phase.WAIT_DATA: {Event.DATA_READY: Phase.COMPUTE},
        Phase.COMPUTE: {Event.COMPUTE_DONE: Phase.COLLECTIVE},
        Phase.COLLECTIVE: {Event.STEP_DONE: Phase.WAIT_DATA, Event.CHECKPOINT_DUE: Phase.CHECKPOINT,
                           Event.LAST_STEP: Phase.FINISHED, Event.TIMEOUT: Phase.FAILED,
                           Event.BAD_PIECE: Phase.FAILED},
        Phase.CHECKPOINT: {Event.STALL_OVER: Phase.WAIT_DATA, Event.LAST_STALL_OVER: Phase.FINISHED},
        Phase.FAILED: {},
        Phase.RESTORE: {Event.RESTORED: Phase.RENDEZVOUS},
        Phase.FINISHED: {Event.END: Phase.EXITED},
        Phase.EXITED: {},
    }
    for phase, row in t.items():
        row.update(_BACKGROUND)
        if phase not in (Phase.SETUP, Phase.EXITED):
            row[Event.RESTART] = Phase.RESTORE
    return t


TRANSITIONS = _table()


class TrainingStateError(RuntimeError):
    """An event the rank's phase does not allow."""


@dataclass
class Transfer:
    """N bytes to (write) or from (read) a storage host, for the step's data, a checkpoint or a restore."""

    tid: int
    host: str
    nbytes: int
    write: bool
    purpose: str  # "data" | "checkpoint" | "restore"
    step: int
    epoch: int
    requested_at: float
    done_at: float | None = None
    received: int = 0  # bytes of a read so far

    @property
    def seconds(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.requested_at


@dataclass
class StepRecord:
    """One attempt at one step, with where its time went."""

    step: int
    epoch: int
    start: float
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    checkpoint_stall_s: float = 0.0
    # After the last step of an asynchronous job: waiting for the writes still in the background. Not a
    # step's stall (a long job pays it once), so apart; the job's wall time includes it.
    final_flush_s: float = 0.0
    end: float | None = None
    outcome: str = "running"  # "done" | "failed" (a timeout or a refused piece) | "aborted" (a peer's restart)
    error: str | None = None  # why it failed, when a piece was refused
    lost: bool = False  # it was done, then rolled back
    correct: bool | None = None

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass
class Rollback:
    epoch: int  # the epoch it starts
    failed_step: int
    restart_from: int  # the checkpoint's step
    steps_lost: int
    at: float
    restored_at: float | None = None  # the checkpoint is read back
    resumed_at: float | None = None  # every rank has restored: the epoch starts


@dataclass(eq=False)
class TrainingRank:
    """One rank's whole job, sans-I/O. See the module's table."""

    spec: JobSpec
    rank: int
    n_ranks: int
    hosts: RankHosts
    phase: Phase = field(default=Phase.SETUP, init=False)
    epoch: int = field(default=0, init=False)
    step: int = field(default=1, init=False)  # the step in progress (or next)
    completed_step: int = field(default=0, init=False)  # the model's state: steps done since the checkpoint
    last_checkpoint: int = field(default=0, init=False)  # step of the last checkpoint written (0: the initial state)
    records: list[StepRecord] = field(default_factory=list, init=False)
    transfers: list[Transfer] = field(default_factory=list, init=False)
    rollbacks: list[Rollback] = field(default_factory=list, init=False)
    started_at: float | None = field(default=None, init=False)  # the first epoch's GO: training starts
    finished_at: float | None = field(default=None, init=False)  # the last step (and checkpoint) done
    stale_messages: int = field(default=0, init=False)
    refused_messages: int = field(default=0, init=False)  # collective messages that could not be ours
    mismatches: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.spec.validate()
        if not 0 <= self.rank < self.n_ranks:
            raise ValueError(f"rank {self.rank} is outside 0..{self.n_ranks - 1}")
        self.name = rank_name(self.rank)
        self._tid = 0
        self._open: dict[int, Transfer] = {}  # transfers of this epoch not yet done
        self._data: dict[int, Transfer] = {}  # step -> its data read, this epoch
        self._ckpt: Transfer | None = None  # the checkpoint write in progress
        self._restore: Transfer | None = None
        self._coll: StepCollective | None = None
        self._coll_key: tuple[int, int] | None = None
        self._old: dict[tuple[int, int], StepCollective] = {}  # recent steps' collectives, for late messages
        self._pending: dict[tuple[int, int], list[tuple[int, bytes]]] = {}  # early messages by (epoch, step)
        self._compute_end: float | None = None
        self._deadline: float | None = None
        self._phase_since = 0.0
        self._record: StepRecord | None = None

    # -- the table ------------------------------------------------------------------------------------

    def _fire(self, event: Event, now: float) -> None:
        try:
            nxt = TRANSITIONS[self.phase][event]
        except KeyError:
            raise TrainingStateError(f"{self.name}: {event.value} is not allowed in phase {self.phase.value}") from None
        if nxt is not None and nxt is not self.phase:
            self._account(now)
            self.phase = nxt
            self._phase_since = now

    def _account(self, now: float) -> None:
        """Charge the time spent in the phase being left to the step in progress."""
        rec = self._record
        if rec is None:
            return
        spent = now - self._phase_since
        if self.phase is Phase.WAIT_DATA:
            rec.data_wait_s += spent
        elif self.phase is Phase.COMPUTE:
            rec.compute_s += spent
        elif self.phase is Phase.COLLECTIVE:
            rec.comm_s += spent
        elif self.phase is Phase.CHECKPOINT:
            if self.spec.checkpoint_mode == "async" and self.step >= self.spec.steps:
                rec.final_flush_s += spent
            else:
                rec.checkpoint_stall_s += spent

    # -- API ------------------------------------------------------------------------------------------

    def start(self, now: float) -> Sends:
        self._fire(Event.START, now)
        return [self._join()]

    def _join(self) -> tuple[str, bytes]:
        return self.hosts.coordinator, encode(Kind.JOIN, self.rank, self.epoch)

    def _on_go(self, epoch: int, now: float, out: Sends) -> None:
        if epoch != self.epoch or self.phase is not Phase.RENDEZVOUS:
            self.stale_messages += 1
            return
        self._fire(Event.GO, now)
        if self.started_at is None:
            self.started_at = now
        if self.rollbacks:
            self.rollbacks[-1].resumed_at = now
        self._begin_step(now, out)

    def wake_time(self) -> float | None:
        times = []
        if self.phase is Phase.COMPUTE and self._compute_end is not None:
            times.append(self._compute_end)
        if self.phase is Phase.COLLECTIVE:
            if self._deadline is not None:
                times.append(self._deadline)
            if self._coll is not None and (w := self._coll.wake_time()) is not None:
                times.append(w)
        return min(times) if times else None

    def advance(self, now: float) -> Sends:
        out: Sends = []
        if self.phase is Phase.COMPUTE and self._compute_end is not None and now >= self._compute_end:
            self._fire(Event.COMPUTE_DONE, now)
            self._start_collective(now, out)
        if self.phase is Phase.COLLECTIVE and self._coll is not None:
            coll = self._coll
            self._coll_call(lambda: coll.advance(now), None, now, out)
            self._check_collective(now, out)
        if self.phase is Phase.COLLECTIVE and self._deadline is not None and now >= self._deadline:
            self._fail(now, out)
        return out

    def receive(self, src: str, data: bytes, now: float) -> Sends:
        """Handle one message from node ``src``; MessageError if it is not the job's."""
        msg = decode(data)
        out: Sends = []
        if msg.kind is Kind.COLL:
            self._on_coll(src, msg.fields[0], msg.fields[1], msg.payload, now, out)
        elif msg.kind is Kind.WRITTEN:
            self._on_transfer_bytes(msg.fields[0], None, now, out)
        elif msg.kind is Kind.DATA:
            self._on_transfer_bytes(msg.fields[0], len(msg.payload), now, out)
        elif msg.kind is Kind.GO:
            self._on_go(msg.fields[0], now, out)
        elif msg.kind is Kind.RESTART:
            self._on_restart(msg.fields[0], msg.fields[1], now, out)
        elif msg.kind is Kind.END:
            if self.phase is Phase.FINISHED:
                self._fire(Event.END, now)
        else:
            raise MessageError(f"{self.name}: a {msg.kind.name} message is not for a rank")
        return out

    @property
    def done(self) -> bool:
        return self.phase is Phase.EXITED

    # -- steps ----------------------------------------------------------------------------------------

    def _begin_step(self, now: float, out: Sends) -> None:
        self._record = StepRecord(self.step, self.epoch, now)
        self.records.append(self._record)
        self._request_data(self.step, now, out)
        self._check_data(now, out)

    def _request_data(self, step: int, now: float, out: Sends) -> None:
        if step > self.spec.steps or step in self._data:
            return
        self._data[step] = self._transfer(self.hosts.data, self.spec.data_bytes, False, "data", step, now, out)

    def _check_data(self, now: float, out: Sends) -> None:
        if self.phase is not Phase.WAIT_DATA:
            return
        t = self._data.get(self.step)
        if t is None or t.done_at is None:
            return
        del self._data[self.step]
        self._fire(Event.DATA_READY, now)
        self._compute_end = now + self.spec.compute_s
        if self.spec.prefetch:
            self._request_data(self.step + 1, now, out)
        if self.spec.compute_s <= 0:
            out.extend(self.advance(now))

    def _start_collective(self, now: float, out: Sends) -> None:
        self._coll = make_collective(self.spec.collective, self.rank, self.n_ranks)
        self._coll_key = (self.epoch, self.step)
        self._deadline = now + self.spec.collective_timeout_s
        coll = self._coll
        self._coll_call(lambda: coll.start(now), None, now, out)
        for src, payload in self._pending.pop(self._coll_key, []):
            if self.phase is not Phase.COLLECTIVE:
                break  # a piece failed the step
            self._coll_call(lambda s=src, p=payload: coll.receive(s, p, now), src, now, out)
        self._check_collective(now, out)

    def _coll_sends(self, msgs: list[tuple[int, bytes]], out: Sends) -> None:
        epoch, step = self._coll_key  # type: ignore[misc]
        out.extend((rank_name(dst), encode(Kind.COLL, epoch, step, payload=m)) for dst, m in msgs)

    def _on_coll(self, src: str, epoch: int, step: int, payload: bytes, now: float, out: Sends) -> None:
        self._fire(Event.COLL_MESSAGE, now)
        src_rank = int(src.removeprefix("rank"))
        key = (epoch, step)
        if key == self._coll_key and self._coll is not None:
            if self.phase is Phase.COLLECTIVE:
                coll = self._coll
                self._coll_call(lambda: coll.receive(src_rank, payload, now), src_rank, now, out)
                self._check_collective(now, out)
            else:
                self._late_receive(self._coll, src_rank, payload, now)  # a late echo: the collective is done here
        elif key in self._old:
            self._late_receive(self._old[key], src_rank, payload, now)
        elif epoch > self.epoch or (epoch == self.epoch and step >= self.step):
            self._pending.setdefault(key, []).append((src_rank, payload))
        else:
            self.stale_messages += 1

    def _coll_call(self, call: Callable[[], list[tuple[int, bytes]]], src_rank: int | None, now: float,
                   out: Sends) -> None:
        """Send what ``call`` on the step's collective, in progress, returns (its start, a peer's message
        or the clock). A message it cannot take is dropped; a piece that cannot be right (PieceError)
        fails the step, as a timeout does: its result cannot be trusted, and the coordinator's restart
        rolls every rank back to the last checkpoint."""
        try:
            self._coll_sends(call(), out)
        except PieceError as exc:
            self.refused_messages += 1
            self._fail(now, out, f"{self.name}: step {self.step}: {exc}")
        except RingProtocolError as exc:
            self.refused_messages += 1
            logger.warning("%s: dropped a collective message%s: %s", self.name,
                           "" if src_rank is None else f" from rank{src_rank}", exc)

    def _late_receive(self, coll: StepCollective, src_rank: int, payload: bytes, now: float) -> None:
        """A message for a collective this rank is done with: it only acknowledges, so it is dropped if wrong."""
        try:
            coll.receive(src_rank, payload, now)
        except RingProtocolError as exc:
            self.refused_messages += 1
            logger.warning("%s: dropped a message of a finished collective from rank%d: %s", self.name, src_rank,
                           exc)

    def _check_collective(self, now: float, out: Sends) -> None:
        coll = self._coll
        if self.phase is not Phase.COLLECTIVE or coll is None or not coll.done:
            return
        rec = self._record
        assert rec is not None
        rec.correct = coll.correct
        if coll.correct is False:
            self.mismatches += 1
        self._old[self._coll_key] = coll  # type: ignore[index]
        for key in [k for k in self._old if k[0] < self.epoch or k[1] < self.step - 1]:
            del self._old[key]
        self._deadline = None
        self.completed_step = self.step
        rec.outcome = "done"
        last = self.step >= self.spec.steps
        if self.spec.checkpoint_due(self.step) or (last and self._ckpt is not None):
            self._fire(Event.CHECKPOINT_DUE, now)
            if self.spec.checkpoint_mode == "sync" and self.spec.checkpoint_due(self.step):
                self._start_checkpoint(now, out)
            self._check_stall(now, out)
        elif last:
            self._fire(Event.LAST_STEP, now)
            self._finish(now, out)
        else:
            self._fire(Event.STEP_DONE, now)
            self._next_step(now, out)

    def _start_checkpoint(self, now: float, out: Sends) -> None:
        self._ckpt = self._transfer(self.hosts.checkpoint, self.spec.checkpoint_bytes, True, "checkpoint",
                                    self.step, now, out)

    def _check_stall(self, now: float, out: Sends) -> None:
        """In CHECKPOINT: the stall is over when the write that holds the step up is in."""
        if self.phase is not Phase.CHECKPOINT or (self._ckpt is not None and self._ckpt.done_at is None):
            return
        self._ckpt = None
        last = self.step >= self.spec.steps
        if self.spec.checkpoint_mode == "async" and self.spec.checkpoint_due(self.step) \
                and self.last_checkpoint < self.step:
            self._start_checkpoint(now, out)  # the previous write is in: this one goes in the background
            if last:
                return  # and the job ends when it is in
        if last:
            self._fire(Event.LAST_STALL_OVER, now)
            self._finish(now, out)
        else:
            self._fire(Event.STALL_OVER, now)
            self._next_step(now, out)

    def _next_step(self, now: float, out: Sends) -> None:
        if self._record is not None:
            self._record.end = now
        self.step += 1
        self._begin_step(now, out)

    def _finish(self, now: float, out: Sends) -> None:
        if self._record is not None:
            self._record.end = now
        self.finished_at = now
        out.append((self.hosts.coordinator, encode(Kind.FINISHED, self.rank, self.epoch)))

    def _fail(self, now: float, out: Sends, error: str | None = None) -> None:
        """The step's collective failed (timed out, or refused a piece: ``error``): ask for a restart."""
        if error is None:
            logger.info("%s: step %d's collective timed out after %.3f s", self.name, self.step,
                        self.spec.collective_timeout_s)
        else:
            logger.warning("%s", error)
        self._fire(Event.TIMEOUT if error is None else Event.BAD_PIECE, now)
        if self._record is not None:
            self._record.outcome = "failed"
            self._record.error = error
            self._record.end = now
        self._deadline = None
        out.append((self.hosts.coordinator, encode(Kind.FAILED, self.rank, self.epoch)))

    # -- restarts -------------------------------------------------------------------------------------

    def _on_restart(self, epoch: int, from_step: int, now: float, out: Sends) -> None:
        if epoch <= self.epoch:
            self.stale_messages += 1  # a restart this rank already made
            return
        self._fire(Event.RESTART, now)
        rec = self._record
        if rec is not None and rec.end is None:
            rec.outcome = "aborted"
            rec.end = now
        lost = max(0, self.completed_step - from_step)
        for r in self.records:
            if r.outcome == "done" and r.epoch == self.epoch and r.step > from_step:
                r.lost = True
        self.rollbacks.append(Rollback(epoch, self.step, from_step, lost, now))
        self.epoch = epoch
        self.step = from_step + 1
        self.completed_step = from_step
        self.last_checkpoint = from_step
        self.finished_at = None
        # Everything of the old epoch is forgotten: its transfers' answers and its peers' messages.
        self._open.clear()
        self._data.clear()
        self._ckpt = None
        self._coll = None
        self._coll_key = None
        self._old.clear()
        self._deadline = None
        self._compute_end = None
        self._record = None
        self._pending = {k: v for k, v in self._pending.items() if k[0] >= epoch}
        self._restore = self._transfer(self.hosts.checkpoint, self.spec.checkpoint_bytes, False, "restore",
                                       from_step, now, out)
        self._check_restored(now, out)

    def _check_restored(self, now: float, out: Sends) -> None:
        if self.phase is not Phase.RESTORE or self._restore is None or self._restore.done_at is None:
            return
        self._restore = None
        self.rollbacks[-1].restored_at = now
        self._fire(Event.RESTORED, now)
        out.append(self._join())

    # -- transfers ------------------------------------------------------------------------------------

    def _transfer(self, host: str, nbytes: int, write: bool, purpose: str, step: int, now: float,
                  out: Sends) -> Transfer:
        self._tid += 1
        t = Transfer(self._tid, host, nbytes, write, purpose, step, self.epoch, now)
        self.transfers.append(t)
        if nbytes <= 0:
            t.done_at = now
            return t
        self._open[t.tid] = t
        if write:
            for off in range(0, nbytes, CHUNK_BYTES):
                n = min(CHUNK_BYTES, nbytes - off)
                out.append((host, encode(Kind.WRITE, t.tid, nbytes, payload=bytes(n))))
        else:
            out.append((host, encode(Kind.READ, t.tid, nbytes)))
        return t

    def _on_transfer_bytes(self, tid: int, nbytes: int | None, now: float, out: Sends) -> None:
        self._fire(Event.TRANSFER_DONE, now)
        t = self._open.get(tid)
        if t is None:
            return  # a transfer of an epoch rolled back
        if nbytes is not None:
            t.received += nbytes
            if t.received < t.nbytes:
                return
        del self._open[tid]
        t.done_at = now
        if t.purpose == "checkpoint":
            self.last_checkpoint = max(self.last_checkpoint, t.step)
            out.append((self.hosts.coordinator, encode(Kind.COMMIT, self.rank, t.step)))
            self._check_stall(now, out)
        elif t.purpose == "data":
            self._check_data(now, out)
        else:
            self._check_restored(now, out)
