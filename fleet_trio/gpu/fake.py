"""A fake GPU driven by real processes (no driver needed).

The GPU is a directory:

* ``device.json`` (optional): ``{"name": "Fake H200", "total_gib": 80, "base_used_gib": 0.5,
  "per_process": true, "uuid": "GPU-…"}``; every member is optional (defaults: ``"Fake GPU"``,
  80, 0, true, and a UUID derived from the directory's path).
  ``per_process: false`` makes :meth:`FakeGpu.process_used_bytes` answer ``None``, like NVML
  under WDDM or MIG, so the global-delta fallback can be exercised.
* one file per holding process, named after its pid, holding a size: ``2.5G``, ``512M``,
  ``64K``, ``1T`` (binary units; ``GiB``/``MiB`` spellings too) or plain bytes.
* ``fail`` (optional): while it exists every snapshot fails with its text (fault injection).
* ``hang`` (optional): while it exists every query (snapshot, per-process) blocks in its
  worker thread, as a driver call that does not return (fault injection: a hung sample).
  Like NVML's, the calls are abandonable on cancel (the thread is left behind).

A multi-device fake (``--fake-gpus N``) is a directory of device directories ``gpu0`` …
``gpu{N-1}``, each one a device as above with its own UUID, total and holdings. Inside a
job, the helper picks the device the job was pinned to: the first entry of
``$CUDA_VISIBLE_DEVICES`` (a UUID or an index), else ``gpu0``.

Only files of **live** (non-zombie) pids count; a file left by a dead pid is removed on the
next read. So a process that escaped its job and still "holds" memory stays visible in both
the global used value and per-process attribution, which is what the fake is for.

Job scripts use the helper command::

    python -m fleet_trio.gpu.fake hold 2.5G [--dir D] [--for SECONDS] [--pid PID | --parent]
    python -m fleet_trio.gpu.fake alloc SIZE --pid PID [--dir D]
    python -m fleet_trio.gpu.fake free --pid PID [--dir D]
    python -m fleet_trio.gpu.fake init [--dir D] [--name NAME] [--total-gib N]
    python -m fleet_trio.gpu.fake fail [MESSAGE] [--dir D]   /   recover [--dir D]

``--dir`` defaults to ``$FLEET_TRIO_FAKE_GPU_DIR``. ``hold`` writes its own pid's file (or
``--pid``'s, or with ``--parent`` its parent's), holds until killed or ``--for`` runs out, and
removes the file on a normal exit or SIGTERM/SIGINT/SIGHUP (a SIGKILL leaves it; the reader
then ignores it once the pid is gone).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
import uuid as uuid_mod
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import attrs
import trio

from fleet_trio.gpu.source import GIB, DeviceSet, GpuDevice, GpuError, VramSnapshot, check_memory
from fleet_trio.proc.procfs import pid_alive

ENV_DIR = "FLEET_TRIO_FAKE_GPU_DIR"
DEVICE_FILE = "device.json"
FAIL_FILE = "fail"
HANG_FILE = "hang"
HANG_POLL = 0.05
DEFAULT_NAME = "Fake GPU"
DEFAULT_TOTAL_GIB = 80.0
DEVICE_DIR_PREFIX = "gpu"
MAX_FAKE_GPUS = 64

_UUID_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
"""What a device id may look like (it goes into a job's ``CUDA_VISIBLE_DEVICES``)."""
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``2.5G`` / ``512M`` / ``512MiB`` / ``1024``; ValueError when malformed."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"bad size {text!r} (want e.g. 2.5G, 512M or a byte count)")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not math.isfinite(value):
        raise ValueError(f"bad size {text!r}")
    return int(value)


def default_fake_dir() -> str:
    return os.environ.get(ENV_DIR, "")


def fake_uuid(directory: str) -> str:
    """A stable UUID for a device directory (``GPU-`` + a UUID5 of its real path)."""
    real = os.path.realpath(directory)
    return f"GPU-{uuid_mod.uuid5(uuid_mod.NAMESPACE_URL, 'fleet-trio-fake-gpu:' + real)}"


@attrs.frozen
class FakeDevice:
    name: str = DEFAULT_NAME
    total_gib: float = DEFAULT_TOTAL_GIB
    base_used_gib: float = 0.0
    per_process: bool = True
    uuid: str = ""
    """``""``: derived from the directory (:func:`fake_uuid`)."""


def _num(obj: dict[str, Any], key: str, default: float) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GpuError(f"fake gpu: {DEVICE_FILE}: {key} must be a number")
    return float(value)


def read_device(directory: str) -> FakeDevice:
    """``device.json`` with defaults for what is missing (blocking)."""
    path = os.path.join(directory, DEVICE_FILE)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read() or b"{}")
    except FileNotFoundError:
        if not os.path.isdir(directory):
            raise GpuError(f"fake gpu: no such directory {directory}") from None
        return FakeDevice()
    except (OSError, ValueError) as exc:
        raise GpuError(f"fake gpu: {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise GpuError(f"fake gpu: {path}: want a JSON object")
    name = data.get("name", DEFAULT_NAME)
    uuid = data.get("uuid", "")
    return FakeDevice(
        name=name if isinstance(name, str) else DEFAULT_NAME,
        total_gib=_num(data, "total_gib", DEFAULT_TOTAL_GIB),
        base_used_gib=_num(data, "base_used_gib", 0.0),
        per_process=bool(data.get("per_process", True)),
        uuid=uuid if isinstance(uuid, str) else "",
    )


def read_holdings(directory: str) -> dict[int, int]:
    """pid → bytes for every live holder; removes the files of dead pids (blocking)."""
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise GpuError(f"fake gpu: {directory}: {exc.strerror or exc}") from exc
    out: dict[int, int] = {}
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        path = os.path.join(directory, name)
        if pid <= 0 or not pid_alive(pid):
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        try:
            with open(path, encoding="utf-8") as f:
                nbytes = parse_size(f.read())
        except (OSError, ValueError):
            continue  # vanished or being rewritten: the next read sees it
        if nbytes > 0:
            out[pid] = nbytes
    return out


def write_holding(directory: str, pid: int, nbytes: int) -> None:
    """Atomically set ``pid``'s holding to ``nbytes`` (blocking)."""
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".hold-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(str(nbytes))
        os.rename(tmp, os.path.join(directory, str(pid)))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_holding(directory: str, pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, str(pid)))


def _read_fail(directory: str) -> str | None:
    try:
        with open(os.path.join(directory, FAIL_FILE), encoding="utf-8") as f:
            return f.read().strip() or "fake gpu: scripted failure"
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"fake gpu: {exc}"


def _hang_while_scripted(directory: str) -> None:
    """Block (this worker thread) while the ``hang`` file exists: a driver call that hangs."""
    path = os.path.join(directory, HANG_FILE)
    while os.path.exists(path):
        time.sleep(HANG_POLL)


def _snapshot_sync(directory: str) -> tuple[float, float]:
    _hang_while_scripted(directory)
    failure = _read_fail(directory)
    if failure is not None:
        raise GpuError(failure)
    dev = read_device(directory)
    used = dev.base_used_gib + sum(read_holdings(directory).values()) / GIB
    return check_memory(dev.total_gib, used)


def _processes_sync(directory: str) -> dict[int, int] | None:
    _hang_while_scripted(directory)
    if not read_device(directory).per_process:
        return None
    return read_holdings(directory)


class FakeGpu:
    """A :class:`~fleet_trio.gpu.source.GpuSource` over a fake-GPU directory."""

    name = "fake"

    def __init__(self, directory: str, *, limiter: trio.CapacityLimiter | None = None) -> None:
        self.directory = directory
        self.limiter = limiter if limiter is not None else trio.CapacityLimiter(1)

    async def snapshot(self) -> VramSnapshot:
        total, used = await trio.to_thread.run_sync(
            _snapshot_sync, self.directory, limiter=self.limiter, abandon_on_cancel=True
        )
        return VramSnapshot.now(total, used)

    async def process_used_bytes(self) -> dict[int, int] | None:
        try:
            return await trio.to_thread.run_sync(
                _processes_sync, self.directory, limiter=self.limiter, abandon_on_cancel=True
            )
        except GpuError:
            return None

    async def device_name(self) -> str:
        try:
            dev = await trio.to_thread.run_sync(read_device, self.directory, limiter=self.limiter)
        except GpuError:
            return ""
        return dev.name

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def init_device(
    directory: str, name: str = DEFAULT_NAME, total_gib: float = 80.0, uuid: str = ""
) -> None:
    """Create the directory and its ``device.json`` (blocking). ``uuid`` is written only when
    given (else readers derive it from the path, :func:`fake_uuid`)."""
    os.makedirs(directory, exist_ok=True)
    data: dict[str, Any] = {"name": name, "total_gib": total_gib}
    if uuid:
        data["uuid"] = uuid
    with open(os.path.join(directory, DEVICE_FILE), "w", encoding="utf-8") as f:
        json.dump(data, f)


def device_dirs(root: str, count: int) -> list[str]:
    """``root/gpu0`` … ``root/gpu{count-1}``."""
    return [os.path.join(root, f"{DEVICE_DIR_PREFIX}{i}") for i in range(count)]


def _is_multi_root(directory: str) -> bool:
    return not os.path.exists(os.path.join(directory, DEVICE_FILE)) and os.path.isdir(
        os.path.join(directory, f"{DEVICE_DIR_PREFIX}0")
    )


def resolve_device_dir(directory: str, visible: str | None) -> str:
    """The device directory a job's helper acts on: ``directory`` itself for a single-device
    fake; for a multi-device root, the device named by the first entry of ``visible`` (the
    job's ``CUDA_VISIBLE_DEVICES``: a UUID or an index), else ``gpu0``. Blocking."""
    if not _is_multi_root(directory):
        return directory
    first = (visible or "").split(",")[0].strip()
    if not first:
        return os.path.join(directory, f"{DEVICE_DIR_PREFIX}0")
    if first.isdigit():
        return os.path.join(directory, f"{DEVICE_DIR_PREFIX}{int(first)}")
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(DEVICE_DIR_PREFIX) and os.path.isdir(path):
            with contextlib.suppress(GpuError):
                if (read_device(path).uuid or fake_uuid(path)) == first:
                    return path
    raise GpuError(f"fake gpu: no device {first!r} under {directory}")


def open_fake_devices(directory: str, count: int = 1) -> DeviceSet:
    """The fake GPU's devices (blocking). ``count == 1``: ``directory`` is the device (as
    always); more: ``directory/gpu0`` … ``gpu{count-1}``, made (80 GiB, ``Fake GPU``) when
    missing. Each device's UUID is its ``device.json``'s, else :func:`fake_uuid`."""
    if not 1 <= count <= MAX_FAKE_GPUS:
        raise GpuError(f"fake gpu: --fake-gpus must be 1 to {MAX_FAKE_GPUS}, got {count}")
    dirs = [directory] if count == 1 else device_dirs(directory, count)
    devices = []
    for index, path in enumerate(dirs):
        if count > 1 and not os.path.exists(os.path.join(path, DEVICE_FILE)):
            try:
                init_device(path, DEFAULT_NAME, DEFAULT_TOTAL_GIB)
            except OSError as exc:
                raise GpuError(f"fake gpu: {path}: {exc.strerror or exc}") from exc
        dev = read_device(path)
        uuid = dev.uuid or fake_uuid(path)
        if not _UUID_OK.match(uuid):
            raise GpuError(f"fake gpu: {path}: uuid {uuid!r} is not a device id (GPU-…)")
        devices.append(GpuDevice(index=index, uuid=uuid, name=dev.name, source=FakeGpu(path)))
    seen = [d.uuid for d in devices]
    if len(set(seen)) != len(seen):
        raise GpuError(f"fake gpu: two devices share a uuid ({', '.join(seen)})")
    return DeviceSet("fake", tuple(devices))


# ----------------------------------------------------------------------------------------------
# the helper command (a plain blocking program: it runs inside job scripts, not in trio)


def _exit_on_signal(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


class _HoldOver(Exception):
    """The ``--seconds`` alarm went off."""


def _hold_over(signum: int, frame: object) -> NoReturn:
    raise _HoldOver


def _hold(directory: str, pid: int, nbytes: int, seconds: float | None) -> int:
    """Hold until a signal (exit 128+N) or, with ``seconds``, until an interval timer fires
    (exit 0); the holding file is removed either way."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    signal.signal(signal.SIGALRM, _hold_over)
    try:
        write_holding(directory, pid, nbytes)
        if seconds is not None:
            if seconds <= 0:
                return 0
            signal.setitimer(signal.ITIMER_REAL, seconds)
        while True:
            signal.pause()
    except _HoldOver:
        return 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        remove_holding(directory, pid)


def _positive(unit: str) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 of ``unit``."""

    def parse(text: str) -> float:
        value = _finite_float(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0 {unit}, got {text}")
        return value

    return parse


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def build_parser(prog: str = "python -m fleet_trio.gpu.fake") -> argparse.ArgumentParser:
    """The fake GPU's command line (``fleet-trio fake-gpu VERB …``)."""
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    with_dir = argparse.ArgumentParser(add_help=False)  # every verb takes --dir
    with_dir.add_argument(
        "--dir",
        default=default_fake_dir(),
        help=f"the fake GPU's directory (default: ${ENV_DIR}, else the state directory's)",
    )
    size = "a size: bytes, or a number with K, M, G or T (powers of 1024), e.g. 2.5G"
    hold = sub.add_parser(
        "hold", parents=[with_dir], help="hold SIZE until killed (or --for SECONDS)"
    )
    hold.add_argument("size", help=f"how much VRAM to hold: {size}")
    hold.add_argument(
        "--for",
        dest="seconds",
        metavar="SECONDS",
        type=_positive("seconds"),
        default=None,
        help="release it after this many seconds (default: hold until killed)",
    )
    who = hold.add_mutually_exclusive_group()
    who.add_argument(
        "--pid",
        type=int,
        default=None,
        help="the process the holding is counted for (default: this one)",
    )
    who.add_argument(
        "--parent",
        action="store_true",
        help="count the holding for the calling process (a job script's shell)",
    )
    alloc = sub.add_parser("alloc", parents=[with_dir], help="set PID's holding to SIZE and return")
    alloc.add_argument("size", help=f"PID's holding: {size}")
    alloc.add_argument("--pid", type=int, required=True, help="the process that holds it")
    free = sub.add_parser("free", parents=[with_dir], help="drop PID's holding")
    free.add_argument("--pid", type=int, required=True, help="the process whose holding goes")
    init = sub.add_parser("init", parents=[with_dir], help="create the directory and device.json")
    init.add_argument(
        "--name", default=DEFAULT_NAME, help=f"the device's name (default {DEFAULT_NAME!r})"
    )
    init.add_argument(
        "--total-gib",
        type=_positive("GiB"),
        default=DEFAULT_TOTAL_GIB,
        help=f"the device's VRAM in GiB (default {DEFAULT_TOTAL_GIB:g})",
    )
    fail = sub.add_parser("fail", parents=[with_dir], help="make every snapshot fail")
    fail.add_argument(
        "message", nargs="?", default="", help="the error every snapshot reports (default none)"
    )
    sub.add_parser("recover", parents=[with_dir], help="undo fail")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m fleet_trio.gpu.fake") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    directory: str = args.dir
    if not directory:
        parser.error(f"no fake GPU directory: pass --dir or set ${ENV_DIR}")
    if args.verb in ("hold", "alloc", "free", "fail", "recover"):
        try:
            directory = resolve_device_dir(directory, os.environ.get("CUDA_VISIBLE_DEVICES"))
        except (GpuError, OSError) as exc:
            print(str(exc), file=sys.stderr)
            return 1
    try:
        if args.verb == "hold":
            pid = os.getppid() if args.parent else (args.pid or os.getpid())
            return _hold(directory, pid, parse_size(args.size), args.seconds)
        if args.verb == "alloc":
            write_holding(directory, args.pid, parse_size(args.size))
        elif args.verb == "free":
            remove_holding(directory, args.pid)
        elif args.verb == "init":
            init_device(directory, args.name, args.total_gib)
        elif args.verb == "fail":
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, FAIL_FILE), "w", encoding="utf-8") as f:
                f.write(args.message)
        elif args.verb == "recover":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, FAIL_FILE))
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:
        print(f"fake gpu: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ENV_DIR",
    "FakeDevice",
    "FakeGpu",
    "build_parser",
    "default_fake_dir",
    "device_dirs",
    "fake_uuid",
    "init_device",
    "main",
    "open_fake_devices",
    "parse_size",
    "read_device",
    "read_holdings",
    "remove_holding",
    "resolve_device_dir",
    "write_holding",
]
