"""The training job's messages: one kind byte, then fixed fields, then (for some kinds) a payload.

Ranks talk to each other only through a step's collective (``COLL``, tagged with the job's epoch and
the step so that a message of a rolled-back attempt or of a step not yet started is never mistaken for
the current one). Ranks talk to storage hosts through transfers: a write is ``WRITE`` chunks answered by
one ``WRITTEN`` once the last byte is in; a read is a ``READ`` request answered by ``DATA`` chunks.
The job's coordinator (on one storage host, as a rendezvous store would be) hears ``JOIN``,
``COMMIT``, ``FAILED`` and ``FINISHED`` from ranks and answers with ``GO``, ``RESTART`` and ``END``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

# Bytes of payload per transfer message: large enough that a message costs few loop turns, small
# enough that a lost datagram costs one message's reassembly, not a whole checkpoint's.
CHUNK_BYTES = 64 * 1024


class Kind(enum.IntEnum):
    COLL = 1  # epoch, step, collective message
    WRITE = 2  # transfer id, total bytes, filler payload
    WRITTEN = 3  # transfer id: the storage host holds every byte of the write
    READ = 4  # transfer id, bytes wanted
    DATA = 5  # transfer id, payload of a read
    COMMIT = 6  # rank, step: the rank's checkpoint of that step is written
    FAILED = 7  # rank, epoch: the rank's collective timed out in that epoch
    RESTART = 8  # epoch, step: every rank restarts from the checkpoint of that step
    FINISHED = 9  # rank, epoch: the rank has done every step
    END = 10  # the job is over
    JOIN = 11  # rank, epoch: the rank is ready to run the epoch (started, or restored)
    GO = 12  # epoch: every rank has joined the epoch


class MessageError(ValueError):
    """A message that is not one of the training job's."""


_HEAD = struct.Struct("!B")
_FIELDS: dict[Kind, struct.Struct] = {
    Kind.COLL: struct.Struct("!II"),
    Kind.WRITE: struct.Struct("!IQ"),
    Kind.WRITTEN: struct.Struct("!I"),
    Kind.READ: struct.Struct("!IQ"),
    Kind.DATA: struct.Struct("!I"),
    Kind.COMMIT: struct.Struct("!II"),
    Kind.FAILED: struct.Struct("!II"),
    Kind.RESTART: struct.Struct("!II"),
    Kind.FINISHED: struct.Struct("!II"),
    Kind.END: struct.Struct("!"),
    Kind.JOIN: struct.Struct("!II"),
    Kind.GO: struct.Struct("!I"),
}


@dataclass(frozen=True)
class Message:
    kind: Kind
    fields: tuple[int, ...]
    payload: bytes = b""


def encode(kind: Kind, *fields: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(kind) + _FIELDS[kind].pack(*fields) + payload


def decode(data: bytes) -> Message:
    if not data:
        raise MessageError("empty message")
    try:
        kind = Kind(data[0])
    except ValueError:
        raise MessageError(f"unknown message kind {data[0]}") from None
    st = _FIELDS[kind]
    end = _HEAD.size + st.size
    if len(data) < end:
        raise MessageError(f"{kind.name} message of {len(data)} bytes is shorter than its {end}-byte header")
    return Message(kind, st.unpack_from(data, _HEAD.size), data[end:])
