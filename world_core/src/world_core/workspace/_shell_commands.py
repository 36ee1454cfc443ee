"""Commands that stand before bashkit's own in :class:`~world_core.workspace.BashkitShell`.

bashkit runs a live command registered on an interpreter (``Bash.add_command``) before its
own builtin of the same name. These replace three whose output bashkit cuts short without a
word the shell can see (see :mod:`world_core.workspace._shell_bashkit`), and record such a
cut in a list the shell reads after the run, out of the script's reach:

- ``yes`` streams until its reader is done, as the real one does.
- ``head`` is GNU's, streaming, and reads ``/dev/zero``, ``/dev/urandom`` and ``/dev/random``
  as the endless devices they are (bashkit's end after 1 MiB and 8 KiB).
- ``seq`` counts integers itself, past bashkit's 100,000 lines; anything else it hands to
  bashkit's own, run apart, where its cap line is seen.

Where they differ from GNU's (coreutils 9.1, which the tests compare them with):

- ``--version`` names the shell, not GNU coreutils.
- A command cannot leave input unread for the next one: GNU's ``head`` reading a file on
  its stdin puts the file offset back just after the lines it printed, so
  ``{ head -n1; cat; } < f`` and ``head -n1 - - < f`` go on where it stopped; here the next
  command or operand does not (bashkit gives each command of a group the whole redirected
  file, and ``head`` cannot give back what it read).
- Bytes past ASCII in an argument (``yes $'\\xff'``) reach a command as UTF-8 text, as for
  every command of bashkit's; bytes in files and pipes are kept as they are.

A command gets a context with ``argv``, ``cwd``, ``fs`` (the interpreter's filesystem),
``stdin`` (chunks of bytes) and ``stdout``/``stderr`` (``await write(bytes)``, which raises
``BrokenPipeError`` once the reader is gone).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from world_core.workspace._shell import Limit

__all__ = [
    "STREAM_MAX_BYTES",
    "YES_MAX_BYTES",
    "Cut",
    "head_command",
    "seq_command",
    "yes_command",
]

YES_MAX_BYTES = 4 << 20
"""The most of ``yes``'s output (2 million lines of ``y``) its reader may take: one that takes
a chunk more is a cut; a reader that stops at or before it (``head -c 4M``) ends it with no
cut. Kept small because many of bashkit's commands read all their input before they write
(``yes | sed s/y/n/ | head -2`` runs ``yes`` to this cap: about 2 s through ``sed``, and a
cut)."""

STREAM_MAX_BYTES = 16 << 20
"""The most ``head`` reads from an endless device (``/dev/zero``, ``/dev/urandom``), and
the most of the integers ``seq`` counts (about 2 million) its reader may take, before the
output counts as cut short (``head -c 20M /dev/zero``, ``seq 1 10000000 | tail -1``)."""

_CHUNK = 1 << 16
"""Bytes per write of ``yes`` (a pipe's buffer): a reader that stops early is seen after at
most this much more."""

_SIGPIPE_STATUS = 141
"""The status of a writer whose reader went away (killed by ``SIGPIPE`` in bash)."""

Cut = tuple[Limit, str]
"""A cut a command recorded: its limit (``engine``) and the line that says what was cut."""

_Command = Callable[[Any], Awaitable[int]]


_PIPE_BYTES = 1 << 16
"""What a pipe holds: a real writer of no more than this puts it all there and ends well,
however early its reader stops (``seq 10000 | head -n 1``, 48,894 bytes, ends with 0)."""


class _Stdout:
    """A command's stdout, written as a real writer's into a pipe."""

    def __init__(self, ctx: Any, name: str) -> None:
        self._ctx, self._name, self._sent = ctx, name, 0

    async def write(self, data: bytes) -> int | None:
        """Write ``data``: None once written, else the command's status (its reader went away
        past what the pipe would have held: ``SIGPIPE``; or the write failed)."""
        self._sent += len(data)
        try:
            await self._ctx.stdout.write(data)
        except BrokenPipeError:
            # ours are handed on write by write: a real one would have had them in the pipe
            return None if self._sent <= _PIPE_BYTES else _SIGPIPE_STATUS
        except RuntimeError as exc:  # "file too large" (EFBIG), a full filesystem
            await _say(self._ctx, f"{self._name}: write error: {exc}\n")
            return 1
        return None


async def _say(ctx: Any, text: str) -> None:
    with contextlib.suppress(BrokenPipeError, RuntimeError):  # stderr gone: the status tells
        await ctx.stderr.write(text.encode("utf-8", "surrogateescape"))


_YES_USAGE = "Try 'yes --help' for more information.\n"

_YES_HELP = """Usage: yes [STRING]...
  or:  yes OPTION
Repeatedly output a line with all specified STRING(s), or 'y'.

      --help        display this help and exit
      --version     output version information and exit
"""


def _yes_words(argv: list[str]) -> list[str] | str:
    """GNU ``yes``'s arguments: the words to repeat (options anywhere before ``--``), or
    ``help``, ``version``, or the error to print."""
    words: list[str] = []
    for index, arg in enumerate(argv):
        if arg == "--":
            return words + argv[index + 1 :]
        if arg.startswith("--"):
            name = _long_name(arg, ("help", "version"), "yes", _YES_USAGE)
            if name not in ("help", "version"):
                return name
            if "=" in arg:
                return f"yes: option '--{name}' doesn't allow an argument\n{_YES_USAGE}"
            return name
        if arg.startswith("-") and arg != "-":
            return f"yes: invalid option -- '{arg[1]}'\n{_YES_USAGE}"
        words.append(arg)
    return words


def yes_command(cuts: list[Cut]) -> _Command:
    """``yes``, streaming until its reader is done; past :data:`YES_MAX_BYTES`, a cut."""

    async def yes(ctx: Any) -> int:
        out = _Stdout(ctx, "yes")
        words = _yes_words(list(ctx.argv))
        if isinstance(words, str):  # --help, --version, or an error
            if words in ("help", "version"):
                text = _YES_HELP if words == "help" else "yes (world) 1.0\n"
                return await out.write(text.encode()) or 0
            await _say(ctx, words)
            return 1
        line = (" ".join(words) if words else "y").encode("utf-8", "surrogateescape") + b"\n"
        chunk = line * max(1, _CHUNK // len(line))
        written = 0
        while True:
            status = await out.write(chunk)
            if status is not None:
                return status
            if written >= YES_MAX_BYTES:  # its reader took more than the cap: not done early
                break
            written += len(chunk)
        detail = f"yes: output limit ({YES_MAX_BYTES} bytes) exceeded; output truncated"
        cuts.append(("engine", detail))
        await _say(ctx, detail + "\n")
        return 1

    return yes


_DEVICE_CHUNK = bytes(_CHUNK)

_DEVICES: Mapping[str, Callable[[], bytes]] = {
    "/dev/zero": lambda: _DEVICE_CHUNK,
    "/dev/urandom": lambda: os.urandom(_CHUNK),
    "/dev/random": lambda: os.urandom(_CHUNK),
}
"""The endless devices ``head`` reads itself: bashkit's own end after 1 MiB (``/dev/zero``)
and 8 KiB (the random ones), with no message."""

_UINTMAX = (1 << 64) - 1
"""The largest count GNU's ``head`` takes; past it, ``Value too large for defined data type``."""

_SIZE_POWERS: Mapping[str, int] = {
    **{letter: power for power, letter in enumerate("KMGTPEZY", 1)},
    "k": 1,
    "m": 2,
}
"""The suffixes GNU's ``head`` (coreutils 9.1) reads after a count, as powers of 1024 (of 1000
with ``B`` or ``D`` after: ``1kB``; ``1KiB`` is 1024 again); ``b`` is 512. ``k`` and ``m``
are lower case too, no other (``1g`` and ``1e`` are refused)."""

_SPACE = " \t\n\v\f\r"
_HEAD_USAGE = "Try 'head --help' for more information.\n"

_HEAD_HELP = """Usage: head [OPTION]... [FILE]...
Print the first 10 lines of each FILE to standard output.
With more than one FILE, precede each with a header giving the file name.

With no FILE, or when FILE is -, read standard input.

  -c, --bytes=[-]NUM       print the first NUM bytes of each file;
                             with the leading '-', print all but the last
                             NUM bytes of each file
  -n, --lines=[-]NUM       print the first NUM lines instead of the first 10;
                             with the leading '-', print all but the last
                             NUM lines of each file
  -q, --quiet, --silent    never print headers giving file names
  -v, --verbose            always print headers giving file names
  -z, --zero-terminated    line delimiter is NUL, not newline
      --help        display this help and exit
      --version     output version information and exit
"""


@dataclass
class _HeadArgs:
    in_bytes: bool = False
    count: int = 10
    all_but: bool = False
    headers: bool | None = None
    delimiter: bytes = b"\n"
    files: list[str] = field(default_factory=list)


def _gnu_count(text: str) -> int | None:
    """``text`` read as GNU's ``xstrtoumax`` does for ``head`` (spaces first, ``+``, a bare
    suffix for 1: ``k`` is 1024): the count, past :data:`_UINTMAX` when too large; None when
    it is not a number."""
    rest = text.lstrip(_SPACE)
    number = re.match(r"\+?([0-9]+)", rest)
    if number is not None:
        value, suffix = int(number.group(1)), rest[number.end() :]
    elif text[:1] in ("b", *_SIZE_POWERS):
        value, suffix = 1, text
    else:
        return None
    if suffix:
        letter, used, base = suffix[0], 1, 1024
        if letter in _SIZE_POWERS:
            if suffix[1:3] == "iB":
                used = 3
            elif suffix[1:2] in ("B", "D"):
                used, base = 2, 1000
            value *= base ** _SIZE_POWERS[letter]
        elif letter == "b":
            value *= 512
        else:
            return None
        if suffix[used:]:
            return None
    return value


def _head_count(args: _HeadArgs, value: str, in_bytes: bool, all_but: bool = False) -> str | None:
    """Set the count from ``value`` (``5``, ``2K``; ``-5`` from an option: all but); an
    error message, or None."""
    if all_but and value.startswith("-"):
        value = value[1:]
    else:
        all_but = False
    count = _gnu_count(value)
    if count is None or count > _UINTMAX:
        what = "bytes" if in_bytes else "lines"
        too_large = "" if count is None else ": Value too large for defined data type"
        return f"head: invalid number of {what}: '{value}'{too_large}\n"
    args.in_bytes, args.all_but, args.count = in_bytes, all_but, count
    return None


def _obsolete(args: _HeadArgs, arg: str) -> str | None:
    """GNU's obsolete first option: ``-N`` then letters (``-5``, ``-2c``, ``-1v``, ``-3k``
    for 3 KiB); an error message, or None."""
    digits = re.match(r"-([0-9]+)", arg)
    assert digits is not None
    in_bytes, multiplier = False, ""
    for letter in arg[digits.end() :]:
        if letter in "cbkm":
            in_bytes, multiplier = True, "" if letter == "c" else letter
        elif letter == "l":
            in_bytes = False
        elif letter in "qv":
            args.headers = letter == "v"
        elif letter == "z":
            args.delimiter = b"\0"
        else:
            return f"head: invalid trailing option -- {letter}\n{_HEAD_USAGE}"
    return _head_count(args, digits.group(1) + multiplier, in_bytes)


_HEAD_LONG = ("bytes", "lines", "quiet", "silent", "verbose", "zero-terminated", "help", "version")


def _long_name(arg: str, names: tuple[str, ...], program: str, usage: str) -> str:
    """The long option ``arg`` (``--lin=5``) names, as getopt_long reads it (any unambiguous
    start of a name); else the error to print, which starts with the program's name."""
    given = arg[2:].partition("=")[0]
    if given in names:
        return given
    found = [name for name in names if name.startswith(given)]
    if len(found) == 1:
        return found[0]
    if found:
        choices = "".join(f" '--{name}'" for name in found)
        return f"{program}: option '{arg}' is ambiguous; possibilities:{choices}\n{usage}"
    return f"{program}: unrecognized option '{arg}'\n{usage}"


def _head_parse(argv: list[str]) -> _HeadArgs | str:
    """GNU ``head``'s arguments (options anywhere, ``-5`` first), or the error to print."""
    args = _HeadArgs()
    if argv and re.match(r"-[0-9]", argv[0]):
        error = _obsolete(args, argv[0])
        if error:
            return error
        argv = argv[1:]
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if arg == "--":
            args.files.extend(argv[index:])
            break
        if arg == "-" or not arg.startswith("-"):
            args.files.append(arg)
            continue
        count: tuple[str | None, bool, str] | None = None  # value, in bytes, if missing
        if arg.startswith("--"):
            name = _long_name(arg, _HEAD_LONG, "head", _HEAD_USAGE)
            if name not in _HEAD_LONG:
                return name
            _, has_value, value = arg.partition("=")
            if name in ("lines", "bytes"):
                missing = f"option '--{name}' requires an argument"
                count = (value if has_value else None, name == "bytes", missing)
            elif has_value:
                return f"head: option '--{name}' doesn't allow an argument\n{_HEAD_USAGE}"
            elif name in ("quiet", "silent", "verbose"):
                args.headers = name == "verbose"
            elif name == "zero-terminated":
                args.delimiter = b"\0"
            else:
                return name
        else:
            for at, flag in enumerate(arg[1:], 1):
                if flag in "nc":
                    missing = f"option requires an argument -- '{flag}'"
                    count = (arg[at + 1 :] or None, flag == "c", missing)
                    break
                if flag in "qv":
                    args.headers = flag == "v"
                elif flag == "z":
                    args.delimiter = b"\0"
                elif flag in "0123456789":
                    return f"head: invalid trailing option -- {flag}\n{_HEAD_USAGE}"
                else:
                    return f"head: invalid option -- '{flag}'\n{_HEAD_USAGE}"
        if count is not None:
            given, in_bytes, missing = count
            if given is None:
                if index == len(argv):
                    return f"head: {missing}\n{_HEAD_USAGE}"
                given, index = argv[index], index + 1
            error = _head_count(args, given, in_bytes, all_but=True)
            if error:
                return error
    if not args.files:
        args.files = ["-"]
    return args


class _ReadLimit(Exception):
    """A device read past :data:`STREAM_MAX_BYTES`."""


def _source(ctx: Any, name: str) -> AsyncIterator[bytes]:
    """The bytes of one operand of ``head``, in chunks (a device: endless, up to the cap; a
    directory: :class:`IsADirectoryError` on the first read, after its header, as in GNU's).

    Raises:
        FileNotFoundError: no such file.
        NotADirectoryError: a file named as a directory (``f/``, ``f/x``).
        RuntimeError: another file the filesystem cannot read.
    """
    if not name:
        raise FileNotFoundError(name)
    path = posixpath.normpath(posixpath.join(str(ctx.cwd), name))
    if name == "-" or path == "/dev/stdin":
        return _stdin(ctx)
    device = _DEVICES.get(path)
    if device is not None:
        return _device(path, device)
    try:
        data = bytes(ctx.fs.read_file(path))
    except RuntimeError as exc:
        if "not a directory" in str(exc):
            raise NotADirectoryError(path) from exc
        if "is a directory" in str(exc):
            return _Directory()
        if "not found" in str(exc):
            raise FileNotFoundError(path) from exc
        raise
    if name.endswith("/"):  # a file named as a directory (normpath dropped the slash)
        raise NotADirectoryError(path)
    return _once(data)


async def _stdin(ctx: Any) -> AsyncIterator[bytes]:
    async for chunk in ctx.stdin:
        yield bytes(chunk)


async def _device(path: str, device: Callable[[], bytes]) -> AsyncIterator[bytes]:
    read = 0
    while read < STREAM_MAX_BYTES:
        chunk = device()
        read += len(chunk)
        yield chunk
    raise _ReadLimit(path)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


class _Directory:
    """A directory as an operand: its first read raises (after its header, as in GNU's)."""

    def __aiter__(self) -> _Directory:
        return self

    async def __anext__(self) -> bytes:
        raise IsADirectoryError


def head_command(cuts: list[Cut]) -> _Command:
    """GNU ``head``, streaming, that reads the endless devices as endless (up to
    :data:`STREAM_MAX_BYTES`, then a cut); bashkit's own read at most 1 MiB of ``/dev/zero``
    and 8 KiB of ``/dev/urandom`` and said nothing (``head -c 2000000 /dev/zero | wc -c``
    printed 1048576)."""

    async def head(ctx: Any) -> int:
        out = _Stdout(ctx, "head")
        args = _head_parse(list(ctx.argv))
        if args == "help":
            return await out.write(_HEAD_HELP.encode()) or 0
        if args == "version":
            return await out.write(b"head (world) 1.0\n") or 0
        if isinstance(args, str):
            await _say(ctx, args)
            return 1
        headers = len(args.files) > 1 if args.headers is None else args.headers
        status, titled = 0, False
        for name in args.files:
            try:
                source = _source(ctx, name)
            except FileNotFoundError:
                reason = "No such file or directory"
            except NotADirectoryError:
                reason = "Not a directory"
            except RuntimeError as exc:
                reason = str(exc)
            else:
                reason = ""
            if reason:
                await _say(ctx, f"head: cannot open '{name}' for reading: {reason}\n")
                status = 1
                continue
            if headers:
                shown = "standard input" if name == "-" else name
                title = f"{chr(10) if titled else ''}==> {shown} <==\n"
                titled = True
                failed = await out.write(title.encode("utf-8", "surrogateescape"))
                if failed is not None:
                    return failed
            try:
                failed = await _head_one(out, args, source)
            except IsADirectoryError:
                await _say(ctx, f"head: error reading '{name}': Is a directory\n")
                status = 1
                continue
            except _ReadLimit as cut:
                detail = (
                    f"head: read limit ({STREAM_MAX_BYTES} bytes) of {cut} exceeded; "
                    "output truncated"
                )
                cuts.append(("engine", detail))
                await _say(ctx, detail + "\n")
                return 1
            if failed is not None:
                return failed
        return status

    return head


async def _head_one(out: _Stdout, args: _HeadArgs, chunks: AsyncIterator[bytes]) -> int | None:
    """Write the head of one operand; None, or the status to end with."""
    if args.all_but:
        data = b"".join([chunk async for chunk in chunks])
        if args.in_bytes:
            kept = data[: max(0, len(data) - args.count)]
        else:
            cut = len(data)
            ends = 0 if data.endswith(args.delimiter) or not data else 1
            for _ in range(args.count + 1 - ends):
                cut = data.rfind(args.delimiter, 0, cut)
                if cut < 0:
                    break
            kept = data[: cut + 1] if cut >= 0 else b""
            if args.count == 0:
                kept = data
        return await out.write(kept) if kept else None
    left = args.count
    if left == 0:
        return None
    async for chunk in chunks:
        if args.in_bytes:
            part = chunk[:left]
            left -= len(part)
        else:
            end = 0
            while left and end < len(chunk):
                found = chunk.find(args.delimiter, end)
                if found < 0:
                    end = len(chunk)
                    break
                end = found + 1
                left -= 1
            part = chunk[:end]
        if part:
            failed = await out.write(part)
            if failed is not None:
                return failed
        if left == 0:
            return None
    return None


_INTEGER = re.compile(r"[+-]?\d+")

_SEQ_BATCH = 8192
"""Numbers per write of ``seq`` counting itself."""


_SEQ_USAGE = "Try 'seq --help' for more information.\n"

_SEQ_ERRORS = re.compile(
    r"^seq: (zero increment|missing operand|extra operand .*|option requires an argument .*"
    r"|invalid option .*|unrecognized option .*)\n(?!Try )",
    re.MULTILINE,
)
"""An error of bashkit's ``seq`` that GNU's words otherwise, or follows with its usage line."""


def _seq_error(found: re.Match[str], argv: list[str]) -> str:
    if found.group(1) == "zero increment":  # the increment is the second of three operands
        step = argv[-2] if len(argv) >= 2 else "0"
        return f"seq: invalid Zero increment value: '{step}'\n{_SEQ_USAGE}"
    return found.group(0) + _SEQ_USAGE


def seq_command(
    cuts: list[Cut],
    run: Callable[[list[str]], Awaitable[tuple[bytes, str, int]]],
    cap_of: Callable[[str], Cut | None],
) -> _Command:
    """``seq``, streamed. Integers only (``seq 5``, ``seq 2 9``, ``seq 10 -2 1``) it counts
    itself, until its reader is done or past :data:`STREAM_MAX_BYTES` (a cut). Anything else
    (options, decimals) goes to ``run`` (bashkit's own, apart), whose cap of 100,000 lines is a
    line ``cap_of`` finds in its stderr: a cut, unless its reader went away before the end."""

    async def seq(ctx: Any) -> int:
        out = _Stdout(ctx, "seq")
        argv = list(ctx.argv)
        if 1 <= len(argv) <= 3 and all(_INTEGER.fullmatch(arg) for arg in argv):
            numbers = [int(arg) for arg in argv]
            first = numbers[0] if len(numbers) > 1 else 1
            step = numbers[1] if len(numbers) == 3 else 1
            if step == 0:
                await _say(ctx, f"seq: invalid Zero increment value: '{argv[1]}'\n{_SEQ_USAGE}")
                return 1
            last = numbers[-1]
            counted = range(first, last + (1 if step > 0 else -1), step)
            if counted and len(argv) > 1 and first == 0 and argv[0].startswith("-"):
                # GNU's prints a first "-0" as given (a float's negative zero), then 1, 2...
                failed = await out.write(b"-0\n")
                if failed is not None:
                    return failed
                counted = counted[1:]
            return await _count(ctx, out, cuts, counted)
        stdout, stderr, status = await run(argv)
        stderr = _SEQ_ERRORS.sub(lambda found: _seq_error(found, argv), stderr)
        for start in range(0, len(stdout), _CHUNK):
            failed = await out.write(stdout[start : start + _CHUNK])
            if failed is not None:
                return failed
        cap = cap_of(stderr)
        if cap is not None:
            cuts.append(cap)
        if stderr:
            await _say(ctx, stderr)
        return status

    return seq


async def _count(ctx: Any, out: _Stdout, cuts: list[Cut], numbers: range) -> int:
    written = 0
    for start in range(0, len(numbers), _SEQ_BATCH):
        batch = "".join(f"{number}\n" for number in numbers[start : start + _SEQ_BATCH])
        failed = await out.write(batch.encode())
        if failed is not None:
            return failed
        if written >= STREAM_MAX_BYTES:  # its reader took more than the cap: not done early
            detail = f"seq: output limit ({STREAM_MAX_BYTES} bytes) exceeded; output truncated"
            cuts.append(("engine", detail))
            await _say(ctx, detail + "\n")
            return 1
        written += len(batch)
    return 0
