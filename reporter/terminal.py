"""What the commands print for a person, without terminal control sequences, whoever wrote it.

Much of what `kubectl gpu-topology`, `doctor` and the CLI print was written by others: a Node's
labels and annotations, an Event's message, the API server's error text. Printed raw, a control
sequence in it is obeyed by the terminal: `ESC ] 0 ;` retitles the window, `ESC [ 2 J` clears the
screen, `ESC ] 52 ;` writes the user's clipboard, and a carriage return overwrites a line with a
forged one. So every command writes through `write` (and the console log through
`TerminalStream`): one function strips every such sequence from the whole output, however it was
assembled, rather than each field being cleaned where it is read and one forgotten.

Removed: ESC sequences whole (CSI, the string commands OSC, DCS, SOS, PM and APC up to their
terminator or the end of the line, the short escapes such as `ESC c`), their 8-bit C1 forms, every
other C0 control but the newline and the tab that layouts use, and DEL. JSON output is unchanged:
`json.dumps` already writes control characters as `\\u001b`.
"""

from __future__ import annotations

import re
from typing import TextIO

_SEQUENCES = re.compile(
    # CSI: ESC [ (or 8-bit CSI), parameters, intermediates, a final byte (cut short: what is there).
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    # OSC, DCS, SOS, PM, APC (7- and 8-bit): the payload up to BEL or ST; unterminated, to the end
    # of the line, so that a forged payload cannot swallow the rest of the output.
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    # The other escapes: ESC, intermediates, a final byte (ESC c resets the terminal, ESC ( 0
    # switches to line drawing).
    r"|\x1b[ -/]*[0-~]?"
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 but TAB and LF, DEL, C1: what is left once the sequences are gone (a lone ESC, a CR)."""


def terminal_text(text: str) -> str:
    """`text` without terminal control sequences and control characters (newline and tab kept)."""
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))


def write(stream: TextIO, text: str) -> None:
    """Write `text` to `stream` as a terminal may show it: see the module docstring."""
    stream.write(terminal_text(text))


class TerminalStream:
    """A text stream for a logger: every write goes through `terminal_text`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(terminal_text(text))

    def flush(self) -> None:
        self._stream.flush()
