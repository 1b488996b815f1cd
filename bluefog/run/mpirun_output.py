"""Whole lines from ``mpirun --tag-output``.

Open MPI tags each chunk a rank writes, not each line: a rank that writes ``"    "``, then
``"import keras"``, then ``"\\n"`` (as Python prints a traceback) comes out as
``[1,0]<stderr>:    [1,0]<stderr>:import keras[1,0]<stderr>:`` and a newline, and two ranks'
chunks interleave mid-line. Open MPI does keep two rules that make the lines recoverable: every
chunk starts with its tag, and a newline inside a chunk is followed by the tag again. So the
text after a tag, up to the next tag or newline, continues that rank's current line, and text
after a newline that no tag follows is mpirun's own. ``WholeLines`` keeps each rank's partial
line until its newline comes, and writes every line once, whole, after its tag.

One case the tags cannot settle: mpirun's own message right after a rank's line that has no
newline yet (a rank that failed mid-line) reads as the rest of that line. Its messages open
with a rule of exactly 74 dashes, so such a rule (not at the start of a chunk) ends the rank's
text there: the rank's line stays partial and the message is printed as mpirun's.
"""

from __future__ import annotations

import re
from typing import BinaryIO, Dict, Optional

_TAG = re.compile(rb"\[\d+,\d+\]<std(?:out|err|diag)>:")
# A tag is at most this long; a shorter tail that may be one's start waits for more input.
_MAX_TAG = 48
_RULE = b"-" * 74  # the line that opens and closes each of mpirun's own messages


class WholeLines:
    """Feed it one of mpirun's streams (its stdout or its stderr) in any pieces; it writes the
    same text to ``sink`` with every rank's line whole and tagged once."""

    def __init__(self, sink: BinaryIO):
        self.sink = sink
        self.partial: Dict[bytes, bytes] = {}  # tag -> the rank's line so far
        self.current: Optional[bytes] = None  # the tag whose chunk is being read
        self.held = b""  # input not parsed yet: it may end in the start of a tag
        self.chunk_start = 0  # where the current chunk began in the rank's partial line

    def feed(self, data: bytes) -> None:
        self.held += data
        text, self.held = self.held, b""
        pos = 0
        while pos < len(text):
            tag = _TAG.search(text, pos)
            end = len(text) if tag is None else tag.start()
            newline = text.find(b"\n", pos, end)
            if self.current is not None and newline >= 0:  # the rank's line is complete
                line = self.partial.pop(self.current, b"") + text[pos:newline]
                rule = len(line) - len(_RULE)
                if (line.endswith(_RULE) and line[rule - 1:rule] != b"-"
                        and rule > self.chunk_start):  # mpirun's message after a partial line
                    self.partial[self.current] = line[:rule]
                    self.sink.write(_RULE + b"\n")
                else:
                    self.sink.write(self.current + line + b"\n")
                self.current, pos = None, newline + 1
                continue
            if tag is None:  # keep back what may be the start of a tag cut by the read
                start = text.rfind(b"[", max(pos, len(text) - _MAX_TAG))
                if start >= 0 and b"\n" not in text[start:]:
                    self.held, end = text[start:], start
            if self.current is not None:
                self.partial[self.current] = self.partial.get(self.current, b"") + text[pos:end]
            else:
                self.sink.write(text[pos:end])  # mpirun's own output, as it is
            if tag is None:
                break
            self.current, pos = tag.group(0), tag.end()
            self.chunk_start = len(self.partial.get(self.current, b""))
        self.sink.flush()

    def close(self) -> None:
        """At the end of the stream: the lines still partial, each ended with a newline."""
        rest, self.held = self.held, b""
        if rest:
            if self.current is not None:
                self.partial[self.current] = self.partial.get(self.current, b"") + rest
            else:
                self.sink.write(rest)
        for tag, line in self.partial.items():
            self.sink.write(tag + line + b"\n")
        self.partial.clear()
        self.current = None
        self.sink.flush()


def pump(stream: BinaryIO, sink: BinaryIO) -> None:
    """Copies one of mpirun's streams to ``sink`` through ``WholeLines`` until it closes."""
    lines = WholeLines(sink)
    while True:
        data = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not data:
            break
        lines.feed(data)
    lines.close()
