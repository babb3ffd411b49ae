"""Replacing a user's files without ever losing one: stores, indexes and model files.

Three rules, one module:

* ``--overwrite`` replaces only what is ours: a store (a directory whose ``meta.json`` or
  ``data.h5`` names the store format), an empty directory, or a model file of ours. Anything
  else, and any output that holds one of the command's sources, is refused before work starts
  (:func:`check_store_target`, :func:`check_file_target`).
* A finished directory takes its final name in one atomic step (:func:`replace_dir`): where
  Linux's ``renameat2(RENAME_EXCHANGE)`` is available the new and the old directory swap names,
  so the final name holds the old store or the new one at every instant; elsewhere the old one
  is renamed aside (``.NAME.ooc-tmp-PID-old``) and the new one renamed in, and a kill between
  the two renames is undone by :func:`recover` (the next run, or the next open, renames the old
  store back). Everything is fsynced before the swap and the directory after it.
* A file is written under a temporary sibling name, fsynced and renamed over the target
  (:func:`atomic_file`): a kill or a full disk leaves the previous file whole.

Temporary names are ``.NAME.ooc-tmp-PID-...`` beside their target; a later run removes those
whose process is gone (:func:`remove_stale`), after :func:`recover` has put back any old
store a killed replace had set aside.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

from .errors import ParameterError, StoreExistsError
from .format import DATA_FILE, FORMAT_NAME, META_FILE, TMP_MARKER
from .resources import process_gone, remove_dead_owned

__all__ = ["check_store_target", "check_file_target", "check_folder_writable",
           "folder_write_error", "replace_dir", "recover", "atomic_file", "remove_stale",
           "temp_sibling", "is_store_dir", "fsync_tree", "fsync_dir"]

_ASIDE = "-old"
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def temp_sibling(final: Path, tag: str = "") -> Path:
    """A fresh temporary name beside ``final`` that :func:`remove_stale` recognises."""
    final = Path(final)
    tag = tag or secrets.token_hex(4)
    return final.parent / f".{final.name}{TMP_MARKER}{os.getpid()}-{tag}"


# -- what may be replaced ------------------------------------------------------------------
def is_store_dir(path: Path) -> bool:
    """Whether ``path`` is a directory that an ooc-learn store (or sharded store) was
    written into.

    ``meta.json`` (written last) names the format; a store whose ``meta.json`` is damaged is
    recognised by the format attribute of its ``data.h5``.
    """
    path = Path(path)
    if not path.is_dir():
        return False
    from .sharded import is_sharded_store

    if is_sharded_store(path):  # shards.json, written last, names the sharded format
        return True
    try:
        with open(path / META_FILE) as fh:
            if json.load(fh).get("format") == FORMAT_NAME:
                return True
    except (OSError, ValueError, AttributeError):
        pass
    data = path / DATA_FILE
    if not data.is_file():
        return False
    try:  # only the superblock and the root attributes are read
        import h5py

        with h5py.File(data, "r") as f:
            return f.attrs.get("format") == FORMAT_NAME
    except Exception:
        return False


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except (ValueError, OSError):
        return False


def folder_write_error(folder) -> str | None:
    """Why no file can be made in ``folder`` ("does not exist", or the system's reason), or
    None where one can: a file is made there and removed (``os.access`` says yes to root for
    /proc and a read-only mount; a run then failed after the work, naming its temporary
    file)."""
    import tempfile

    folder = Path(folder).resolve()
    if not folder.is_dir():
        return "does not exist"
    try:
        fd, probe = tempfile.mkstemp(prefix=".ooc-probe-", dir=folder)
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


def check_folder_writable(path: Path, flag: str = "-o") -> None:
    """Refuse, before the work, an output ``path`` whose folder does not exist or cannot be
    written (:func:`folder_write_error`)."""
    why = folder_write_error(path.parent)
    if why is not None:
        raise ParameterError(f"The output {path}: the folder {path.parent} {why}.",
                             f"Create it first, or choose another {flag} path."
                             if why == "does not exist" else f"Choose another {flag} path.")


def check_store_target(out, *, overwrite: bool, sources=(), what: str = "output") -> None:
    """Refuse an output directory that may not be replaced (exit 2, nothing touched).

    A missing ``out`` is fine where its folder can be written. An existing one needs
    ``overwrite`` and must be a store or an empty directory, and must not hold (or be) any
    of ``sources``.
    """
    out = Path(out)
    check_folder_writable(out)
    for s in sources:
        if _inside(Path(s), out):
            raise StoreExistsError(
                f"The {what} {out} holds the source {s}: writing the store there would delete it.",
                "Choose an -o path outside the source's folder.")
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise StoreExistsError(f"The {what} {out} already exists.",
                               "Pass --overwrite (in Python: overwrite=True) to replace it, "
                               "or choose another -o path.")
    if out.is_symlink() or not out.is_dir():
        raise StoreExistsError(
            f"The {what} {out} is a file (or a link), not an ooc-learn store: --overwrite "
            "replaces stores only.", "Choose another -o path, or remove it yourself.")
    if any(out.iterdir()) and not is_store_dir(out):
        raise StoreExistsError(
            f"The {what} {out} is a folder that is not an ooc-learn store (no {META_FILE} naming "
            f"{FORMAT_NAME}): --overwrite replaces stores only.",
            "Choose another -o path, or empty or remove that folder yourself.")


def check_file_target(path, *, is_ours, kind: str = "model", flag: str = "-o") -> None:
    """Refuse to write over an existing file that ``is_ours(path)`` does not recognise, or
    into a folder that does not exist or cannot be written (before the work, not after).
    A path that ends in a separator names a folder, not a file (``-o out/`` had written a
    file named ``out``)."""
    if str(path).endswith(os.sep) or (os.altsep and str(path).endswith(os.altsep)):
        raise ParameterError(f"The output {path} names a folder; {flag} takes the {kind} file's "
                             "path.", f"Name the file, e.g. {flag} "
                             f"{Path(path) / _default_name(kind)}.")
    path = Path(path)
    check_folder_writable(path, flag)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise StoreExistsError(f"The output {path} exists and is not a {kind} file.",
                               f"Choose another {flag} path.")
    if path.exists() and not is_ours(path):
        raise StoreExistsError(
            f"The output {path} exists and is not an ooc-learn {kind} file: it is left as it is.",
            f"Choose another {flag} path, or remove that file yourself.")


def _default_name(kind: str) -> str:
    return {"model": "model.npz", "predictions": "predictions.csv",
            "plot": "plot.png"}.get(kind, kind)


# -- durable, atomic steps -----------------------------------------------------------------
def fsync_dir(path: Path) -> None:
    """fsync a directory (its entries: the names a rename changed)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def fsync_file(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file below ``path``, then the directories (bottom up)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            fsync_file(os.path.join(root, name))
        fsync_dir(Path(root))


_renameat2 = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one step (``renameat2(RENAME_EXCHANGE)``).

    False where the platform or the file system has no such call; then nothing happened.
    """
    global _renameat2
    if os.environ.get("OOC_NO_EXCHANGE"):  # the fallback's tests
        return False
    if _renameat2 is None:
        fn = False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = False
        _renameat2 = fn
    if not _renameat2:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(tmp, final) -> None:
    """Give the finished directory ``tmp`` the name ``final``, replacing what is there.

    The caller has checked that ``final`` may be replaced. ``tmp`` is fsynced first. With an
    exchange the old directory ends at ``tmp``'s name and is removed; a kill at any point
    leaves ``final`` naming the old or the new directory. Without one, see :func:`recover`.
    """
    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    if not (final.exists() or final.is_symlink()):
        os.rename(tmp, final)
        fsync_dir(final.parent)
        return
    if _exchange(tmp, final):
        fsync_dir(final.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    aside = temp_sibling(final, _ASIDE.lstrip("-"))
    if aside.exists():
        shutil.rmtree(aside)
    os.rename(final, aside)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def recover(final) -> bool:
    """Undo a replace that was killed between its two renames (the rename fallback).

    Where ``final`` is missing and an old directory set aside by a process that is gone
    remains, it is renamed back: the old store is whole (the new one was not in place yet).
    Returns whether something was put back.
    """
    final = Path(final)
    if final.exists() or final.is_symlink() or not final.parent.is_dir():
        return False
    prefix = f".{final.name}{TMP_MARKER}"
    for p in sorted(final.parent.iterdir()):
        name = p.name
        if name.startswith(prefix) and name.endswith(_ASIDE):
            pid = name[len(prefix):].split("-")[0]
            if process_gone(pid) and p.is_dir():
                os.rename(p, final)
                fsync_dir(final.parent)
                return True
    return False


def remove_stale(final) -> None:
    """Remove the temporary siblings of ``final`` whose process is gone (after
    :func:`recover`, so an old store set aside is put back rather than removed)."""
    final = Path(final)
    recover(final)
    remove_dead_owned(final.parent, f".{final.name}{TMP_MARKER}")


@contextmanager
def atomic_file(path):
    """Write ``path`` through a temporary sibling: ``with atomic_file(p) as tmp: write(tmp)``.

    On success the temporary file is fsynced and renamed over ``path`` (and the directory
    fsynced); on any error, or a kill, ``path`` keeps what it held and the temporary file is
    removed (by this call, or by a later :func:`remove_stale`).
    """
    path = Path(path)
    remove_stale(path)
    tmp = temp_sibling(path)
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
