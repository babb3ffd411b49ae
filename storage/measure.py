"""Measuring memory from outside a process: a command run in a wrapper, in a memory cgroup.

:func:`measure_command` runs a command as the only child of a fresh wrapper process and reads
its peak RSS there. :func:`run_in_memory_cgroup` runs it inside a fresh child memory cgroup with
a limit (the page cache dropped first), and reports the cgroup's own figures too;
:func:`run_measured` is the same without a cgroup, where none can be made
(:func:`memory_cgroup_available` tells). :func:`memory_headroom_bytes` is the memory another
process could take now, this process's cgroup limit included. Benchmarks and the memory-promise
tests use these; :mod:`ooc_learn._jit` uses the headroom before it starts a compiling helper.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["measure_command", "CgroupUnavailableError", "memory_headroom_bytes",
           "memory_cgroup_available", "run_in_memory_cgroup", "run_measured"]


_WRAP = ("import resource, subprocess, sys, time\n"
         "t = time.perf_counter()\n"
         "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
         "dt = time.perf_counter() - t\n"
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, dt, r)")


def measure_command(cmd, *, timeout: float | None = None) -> tuple[int, float, int, str]:
    """Run ``cmd`` as the only child of a fresh wrapper process and read its peak RSS there.

    Returns ``(peak_rss_bytes, wall_seconds, returncode, stderr)``. Measuring from a separate
    wrapper keeps the caller's own memory and other children out of the figure (benchmarks
    and the memory-promise tests use it).
    """
    import subprocess

    out = subprocess.run([sys.executable, "-c", _WRAP, *map(str, cmd)], capture_output=True,
                         text=True, timeout=timeout)
    rss, dt, rc = out.stdout.split()
    scale = 1 if sys.platform == "darwin" else 1024
    return int(rss) * scale, float(dt), int(rc), out.stderr


class CgroupUnavailableError(OSError):
    """A memory cgroup cannot be made here (not root, no memory controller, read-only
    cgroupfs, controller not delegated). ``hint`` says what to do; callers fall back to
    :func:`run_measured`, which needs no cgroup."""

    def __init__(self, message: str, hint: str = ""):
        self.message = message
        self.hint = hint or ("Run as root on Linux with the memory controller mounted, or use "
                             "run_measured (peak RSS only, no enforced limit).")
        super().__init__(f"{message} {self.hint}")


# The wrapper joins the cgroup (argv[2], empty: none) before it spawns the command, so the
# command is born inside it; it reads the command's own figures from RUSAGE_CHILDREN (its only
# child), so its own memory never enters them. It shields itself from the OOM killer after the
# spawn (the child keeps the score it was born with) and kills the child's process group on
# timeout (argv[3] seconds, 0: none) or SIGTERM. stdout / stderr are the child's, inherited.
_CG_WRAP = r"""
import json, os, resource, signal, sys, time
result, procs, timeout, cmd = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
if procs:
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
t0 = time.perf_counter()
try:
    pid = os.posix_spawnp(cmd[0], cmd, dict(os.environ), setpgroup=0)
except OSError as e:
    with open(result, "w") as f:
        json.dump({"spawn_error": f"{cmd[0]}: {e}"}, f)
    sys.exit(0)
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
except OSError:
    pass
killed = []
def stop(signum, frame):
    killed.append(signum)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGALRM, stop)
if timeout > 0:
    signal.setitimer(signal.ITIMER_REAL, timeout)
status = os.waitpid(pid, 0)[1]
wall = time.perf_counter() - t0
signal.setitimer(signal.ITIMER_REAL, 0)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(result, "w") as f:
    json.dump({"rc": os.waitstatus_to_exitcode(status), "wall_s": wall,
               "maxrss": ru.ru_maxrss, "inblock": ru.ru_inblock, "oublock": ru.ru_oublock,
               "timed_out": signal.SIGALRM in killed}, f)
"""


def memory_headroom_bytes() -> int | None:
    """Memory another process could take now: ``MemAvailable``, and no more than this
    process's memory cgroup has left under its limit; ``None`` where neither can be read."""
    room = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    room = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    try:
        version, cg = _own_memory_cgroup()
        names = (("memory.limit_in_bytes", "memory.usage_in_bytes") if version == "v1"
                 else ("memory.max", "memory.current"))
        limit = (cg / names[0]).read_text().strip()
        if limit != "max" and int(limit) < 2**60:
            left = int(limit) - int((cg / names[1]).read_text().strip())
            room = left if room is None else min(room, left)
    except (CgroupUnavailableError, OSError, ValueError):
        pass
    return room


def _own_memory_cgroup() -> tuple[str, "Path"]:
    """``("v1" | "v2", directory)`` of this process's memory cgroup; raises
    :class:`CgroupUnavailableError` when there is none to use."""
    from pathlib import Path

    if not sys.platform.startswith("linux"):
        raise CgroupUnavailableError(f"memory cgroups need Linux (this is {sys.platform}).")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as e:
        raise CgroupUnavailableError(f"cannot read /proc/self/cgroup ({e}).") from None
    entries = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    for _, controllers, path in entries:
        if "memory" in controllers.split(","):
            return "v1", _v1_memory_mount(path)
    v2 = [path for hid, controllers, path in entries if hid == "0" and controllers == ""]
    if v2 and len(entries) == 1 and Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "v2", Path("/sys/fs/cgroup") / v2[0].lstrip("/")
    raise CgroupUnavailableError("this process is in no memory cgroup (no 'memory' line in "
                                 "/proc/self/cgroup and no unified cgroup v2 hierarchy).")


def _v1_memory_mount(own: str) -> "Path":
    """Where the v1 memory hierarchy is mounted (mountinfo), joined with ``own`` made relative
    to the mount's root (a container may see a sub-tree mounted at its root)."""
    from pathlib import Path

    mount, root = Path("/sys/fs/cgroup/memory"), "/"
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            pre, _, post = line.partition(" - ")
            fields, tail = pre.split(), post.split()
            if len(tail) >= 3 and tail[0] == "cgroup" and "memory" in tail[2].split(","):
                root, mount = fields[3], Path(fields[4])
                break
    except OSError:
        pass
    if root != "/" and (own == root or own.startswith(root.rstrip("/") + "/")):
        own = own[len(root.rstrip("/")):]
    return mount / own.lstrip("/")


def _write(path, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _make_memory_cgroup(limit_bytes: int, name: str | None) -> tuple[str, "Path"]:
    """Create the child cgroup with its limit set; ``(version, directory)``."""
    import secrets

    version, parent = _own_memory_cgroup()
    if not parent.is_dir():
        raise CgroupUnavailableError(f"the memory cgroup {parent} is not visible here (is the "
                                     "cgroup filesystem mounted in this container?).")
    if version == "v2":
        ctl = parent / "cgroup.subtree_control"
        try:
            if "memory" not in ctl.read_text().split():
                _write(ctl, "+memory")
        except OSError as e:
            raise CgroupUnavailableError(
                f"cannot enable the memory controller below {parent} ({e}); cgroup v2 allows "
                "it only where the parent has no processes of its own.") from None
    cg = parent / (name or f"ooc-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        cg.mkdir()
    except OSError as e:
        raise CgroupUnavailableError(f"cannot create the cgroup {cg} ({e.strerror}).") from None
    try:
        if version == "v1":
            _write(cg / "memory.limit_in_bytes", int(limit_bytes))
            if (cg / "memory.memsw.limit_in_bytes").exists():
                try:                        # swap accounting may be off: the limit is enough
                    _write(cg / "memory.memsw.limit_in_bytes", int(limit_bytes))
                except OSError:
                    pass
        else:
            _write(cg / "memory.max", int(limit_bytes))
            if (cg / "memory.swap.max").exists():
                _write(cg / "memory.swap.max", 0)
    except OSError as e:
        _remove_cgroup(cg)
        raise CgroupUnavailableError(f"cannot set the memory limit of {cg} ({e}).") from None
    return version, cg


def _remove_cgroup(cg) -> bool:
    """rmdir ``cg``, retrying while the kernel finishes tearing its last tasks down; a process
    the command left behind (a daemonised grandchild) is killed. True when it is gone."""
    import signal
    import time

    for attempt in range(50):
        try:
            os.rmdir(cg)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if attempt == 25:
                try:
                    for pid in (cg / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            time.sleep(0.1)
    return False


def _read_int(path) -> int | None:
    try:
        return int(open(path).read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_keyed(path, key: str) -> int | None:
    """The value of ``key N`` lines (memory.oom_control, memory.events)."""
    try:
        for line in open(path):
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return None


def _drop_page_cache() -> tuple[bool, str]:
    """``sync`` and write 3 to /proc/sys/vm/drop_caches: (done, why not)."""
    try:
        os.sync()
        _write("/proc/sys/vm/drop_caches", 3)
        return True, ""
    except OSError as e:
        return False, f"cannot drop the page cache ({e.strerror or e}); caches start warm"


def _run_wrapped(cmd, procs: str, timeout: float | None, env) -> dict:
    """Run ``cmd`` under the wrapper; the child's figures, its stdout and stderr."""
    import json
    import signal
    import subprocess
    import tempfile

    scale = 1 if sys.platform == "darwin" else 1024
    with tempfile.TemporaryDirectory(prefix="ooc-run-") as tmp:
        result = os.path.join(tmp, "result.json")
        wrapper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CG_WRAP, result, procs, str(timeout or 0),
             *map(str, cmd)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env)
        try:                                # the wrapper enforces the timeout; this is a net
            out, err = wrapper.communicate(timeout=None if timeout is None else timeout + 60)
        except BaseException:
            wrapper.send_signal(signal.SIGTERM)
            try:
                wrapper.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                wrapper.kill()
            raise
        try:
            with open(result) as f:
                r = json.load(f)
        except (OSError, ValueError):
            r = {"rc": wrapper.returncode}  # the wrapper itself died
    if "spawn_error" in r:
        raise FileNotFoundError(r["spawn_error"])
    return {"rc": r["rc"], "wall_s": r.get("wall_s"),
            "peak_rss_bytes": None if "maxrss" not in r else r["maxrss"] * scale,
            "read_bytes": None if "inblock" not in r else r["inblock"] * 512,
            "written_bytes": None if "oublock" not in r else r["oublock"] * 512,
            "timed_out": bool(r.get("timed_out", False)),
            "stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace")}


def memory_cgroup_available() -> tuple[bool, str]:
    """Whether :func:`run_in_memory_cgroup` can work here, and why (or why not).

    It makes and removes a probe cgroup, so the answer is the kernel's, not a guess.

    Examples
    --------
    >>> ok, why = memory_cgroup_available()          # doctest: +SKIP
    >>> ok, why                                      # doctest: +SKIP
    (True, 'cgroup v1 memory controller below /sys/fs/cgroup/memory/...')
    """
    try:
        version, cg = _make_memory_cgroup(64 << 20, None)
    except CgroupUnavailableError as e:
        return False, e.message
    _remove_cgroup(cg)
    return True, f"cgroup {version} memory controller below {cg.parent}"


def run_in_memory_cgroup(cmd, limit_bytes: int, *, drop_caches: bool = True,
                         timeout: float | None = None, env=None, name: str | None = None) -> dict:
    """Run ``cmd`` inside a fresh child memory cgroup limited to ``limit_bytes``.

    The cgroup is a child of this process's own memory cgroup (v1: ``memory.limit_in_bytes``,
    and ``memory.memsw.limit_in_bytes`` where swap is accounted; v2: ``memory.max`` and
    ``memory.swap.max`` = 0). The page cache is dropped first when ``drop_caches`` (root only;
    a failure is recorded, not raised). A small wrapper joins the cgroup and runs ``cmd`` as
    its child; the figures are the child's (``RUSAGE_CHILDREN``). The cgroup is removed
    afterwards, also on errors.

    Returns a dict: ``rc`` (negative signal number when killed, -9 for the OOM killer),
    ``wall_s``, ``peak_rss_bytes``, ``cgroup_peak_bytes`` (v1 ``memory.max_usage_in_bytes``,
    page cache included; v2 ``memory.peak`` or None), ``failcnt`` (v1 ``memory.failcnt``, v2
    the ``max`` events), ``oom_kills``, ``read_bytes`` / ``written_bytes`` (block I/O of the
    child), ``stdout``, ``stderr``, ``dropped_caches``, ``drop_caches_error``, ``timed_out``,
    ``limit_bytes``, ``cgroup`` (the removed directory) and ``cgroup_removed``. The peak RSS
    has a floor of the wrapper's own size (~10 MiB): Linux carries the spawning process's
    high-water mark over ``exec``.

    Raises :class:`CgroupUnavailableError` (an ``OSError``) when no cgroup can be made; see
    :func:`memory_cgroup_available` to test first and :func:`run_measured` to fall back.

    Examples
    --------
    >>> r = run_in_memory_cgroup(["python", "-c", "print(1)"], 256 << 20)  # doctest: +SKIP
    >>> r["rc"], r["stdout"], r["oom_kills"]                              # doctest: +SKIP
    (0, '1\\n', 0)
    """
    version, cg = _make_memory_cgroup(limit_bytes, name)
    try:
        dropped, why = _drop_page_cache() if drop_caches else (False, "not asked")
        r = _run_wrapped(cmd, str(cg / "cgroup.procs"), timeout, env)
        if version == "v1":
            peak = _read_int(cg / "memory.max_usage_in_bytes")
            failcnt = _read_int(cg / "memory.failcnt")
            ooms = _read_keyed(cg / "memory.oom_control", "oom_kill")
            if ooms is None:                # kernels before 4.13 do not count them
                ooms = 1 if r["rc"] == -9 and not r["timed_out"] else 0
        else:
            peak = _read_int(cg / "memory.peak")
            failcnt = _read_keyed(cg / "memory.events", "max")
            ooms = _read_keyed(cg / "memory.events", "oom_kill") or 0
    finally:
        removed = _remove_cgroup(cg)
    r.update(cgroup_peak_bytes=peak, failcnt=failcnt, oom_kills=ooms, dropped_caches=dropped,
             drop_caches_error=why if drop_caches and not dropped else None,
             limit_bytes=int(limit_bytes), cgroup=str(cg), cgroup_removed=removed)
    return r


def run_measured(cmd, *, drop_caches: bool = False, timeout: float | None = None,
                 env=None) -> dict:
    """:func:`run_in_memory_cgroup` without a cgroup (no limit is enforced): the same dict,
    with ``cgroup_peak_bytes``, ``failcnt`` and ``limit_bytes`` None and ``oom_kills`` 1 only
    when the command died of SIGKILL without a timeout (the likeliest cause: the system OOM
    killer)."""
    dropped, why = _drop_page_cache() if drop_caches else (False, "not asked")
    r = _run_wrapped(cmd, "", timeout, env)
    r.update(cgroup_peak_bytes=None, failcnt=None,
             oom_kills=1 if r["rc"] == -9 and not r["timed_out"] else 0,
             dropped_caches=dropped, drop_caches_error=why if drop_caches and not dropped
             else None, limit_bytes=None, cgroup=None, cgroup_removed=None)
    return r
