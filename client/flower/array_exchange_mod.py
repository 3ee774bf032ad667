"""The ClientApp's edge of the simulation engine's array exchange (``common/array_exchange.py``).

A Flower ClientApp mod: a message naming an exchange folder has its references replaced by the
arrays' bytes (read from the coordinator's files) before the ClientApp sees it, and the large arrays
of the reply are written into the same folder and replaced by references. A message without the
folder (every deployment message) passes through untouched.
"""

from __future__ import annotations

from flwr.common import Context, Message

from common.array_exchange import ArrayFiles, from_refs, pop_folder, to_refs


def array_exchange_mod(message: Message, context: Context, call_next) -> Message:
    folder = pop_folder(message.content) if message.has_content() else None
    if folder is None:
        return call_next(message, context)
    files = ArrayFiles(folder)
    from_refs(message.content, files.read)
    reply = call_next(message, context)
    if reply.has_content():
        to_refs(reply.content, lambda data: files.write(data, "reply"))
    return reply
