"""The fixtures several test modules share (tests/conftest.py registers them).

``tiny_checkpoint`` (session): a factory of tiny random checkpoints, one folder per distinct set of arguments for
the whole session::

    @pytest.fixture(scope="module")
    def checkpoint(tiny_checkpoint):
        return tiny_checkpoint("nano", sound=True, seed=7)   # cosmos3_core.testing.tiny.build_tiny_checkpoint

    tiny_checkpoint("edge", seed=0, reasoner=True)  # cosmos3_core.testing.tiny_reasoner.build_tiny_reasoner_checkpoint
    tiny_checkpoint("nano", seed=1, copy=True)       # a private copy that this test may change

Every call with the same arguments gets the same folder, built at the first call. "The same" means equal
``(variant, sound, seed, distilled, action, reasoner)`` as passed, an omitted argument counting as its default shown
here: ``sound=None`` (the builder picks) and ``sound=True`` are different requests even where they build the same
thing. The builder is deterministic (same arguments, byte-identical files; it forks the global RNG), so sharing a
folder changes no test's input.

A shared folder is read-only by contract. A test that damages, removes or adds files asks for ``copy=True`` (a fresh
copy in a folder of its own) or copies the folder itself before touching it. The contract is checked: the folder's
listing (every entry's name, size and mtime) is recorded after the build and compared at every later hand-out and
at the end of the session; a change fails, naming the folder and the modules that were handed it.

``host`` (module): the in-process ComfyUI host with this pack loaded, the tiny checkpoints in its models folder and
the test inputs in its input folder (``test_workflows.prepared_executor``). A module that hooks more into the host
(test_nodes, test_long_video_nodes) defines its own ``host``, which takes precedence.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every entry under ``root``: what a write, a removal or an addition changes."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


class TinyCheckpoints:
    """The factory behind the ``tiny_checkpoint`` fixture (see the module docstring)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self._tmp = tmp_path_factory
        self._built: dict[tuple, Path] = {}
        self._listings: dict[tuple, dict] = {}
        self._users: dict[tuple, list[str]] = {}

    def __call__(self, variant: str = "nano", *, sound: bool | None = None, seed: int = 0, distilled: bool = False,
                 action: bool = True, reasoner: bool = False, copy: bool = False) -> Path:
        if reasoner and (sound is not None or distilled or not action):
            raise TypeError("tiny_checkpoint(reasoner=True) takes only variant and seed "
                            "(build_tiny_reasoner_checkpoint has no other options)")
        key = (variant, sound, seed, distilled, action, reasoner)
        name = "-".join([variant] + (["vlm"] if reasoner else []) + ([] if sound is None else [f"sound{int(sound)}"])
                        + (["distilled"] if distilled else []) + ([] if action else ["noaction"]) + [f"seed{seed}"])
        user = sys._getframe(1).f_globals.get("__name__", "?")  # the asking test module, for the error below
        if key not in self._built:
            root = self._tmp.mktemp(f"tiny-{name}") / variant
            if reasoner:
                from cosmos3_core.testing.tiny_reasoner import build_tiny_reasoner_checkpoint

                build_tiny_reasoner_checkpoint(root, variant=variant, seed=seed)
            else:
                from cosmos3_core.testing.tiny import build_tiny_checkpoint

                build_tiny_checkpoint(root, variant=variant, sound=sound, seed=seed, distilled=distilled,
                                      action=action)
            self._built[key], self._listings[key], self._users[key] = root, _listing(root), []
        else:
            self._check(key)
        if user not in self._users[key]:
            self._users[key].append(user)
        if not copy:
            return self._built[key]
        dst = self._tmp.mktemp(f"tiny-{name}-copy") / variant
        shutil.copytree(self._built[key], dst, symlinks=True)
        return dst

    def _check(self, key: tuple) -> None:
        root, before = self._built[key], self._listings[key]
        now = _listing(root)
        if now != before:
            changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
            pytest.fail(f"the shared tiny checkpoint {root} was changed ({', '.join(changed[:5])}); it was handed to "
                        f"{', '.join(self._users[key])}. A test that writes into its checkpoint asks "
                        "tiny_checkpoint(..., copy=True) for a copy of its own.", pytrace=False)

    def check_all(self) -> None:
        for key in self._built:
            self._check(key)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    factory = TinyCheckpoints(tmp_path_factory)
    yield factory
    factory.check_all()


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    from test_workflows import prepared_executor

    return prepared_executor(tiny_checkpoint)
