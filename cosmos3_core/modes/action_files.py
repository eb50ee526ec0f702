"""Action files: reading actions ``[T, D]`` for forward dynamics and writing the predicted ones.

Formats (what ``save_actions`` writes and what users bring): ``.json`` — a list of rows, or an object
``{"actions": rows, "domain_name": ..., "mode": ...}`` (the object's ``domain_name`` names the embodiment the
actions were recorded for); ``.npy`` — a numeric NumPy array (``np.save``); ``.safetensors`` — one tensor, or the
one named ``actions``.

The reader is the one place a file's contents are checked; each problem is one ``ValueError`` that names the file,
says what is wrong in terms of the format (a row number, a dtype, a count) and how to fix it. It never quotes the
file's contents (the file may be anything a path points at), never loads pickled objects (a ``.npy`` of Python
objects is refused from its header, before any data is read) and survives hostile files: truncated, nested too
deeply for a parser, complex numbers, NaN/inf, no rows. Writing goes through ``media.write_file``: a full disk is one
message and leaves no file behind.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np

SUFFIXES = (".npy", ".json", ".safetensors")
_FORMATS = "a .npy, .json or .safetensors file"


def _refuse(path: Path, problem: str) -> ValueError:
    return ValueError(f"actions file {path}: {problem}")


def load_actions(path: str | Path) -> np.ndarray:
    """Actions ``[T, D]`` float32 (see the module docstring for the formats)."""
    return load_actions_with_metadata(path)[0]


def load_actions_with_metadata(path: str | Path) -> tuple[np.ndarray, dict]:
    """``load_actions`` plus the JSON object's ``domain_name`` / ``mode`` (what ``save_actions`` writes), if any."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"actions file {p} is a folder, not a file; pass {_FORMATS}.")
    if not p.is_file():
        raise ValueError(f"actions file {p} does not exist; pass {_FORMATS}.")
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise _refuse(p, f"the extension {suffix or '(none)'!r} is not an actions format; pass {_FORMATS}.")
    meta: dict = {}
    if suffix == ".npy":
        arr = _read_npy(p)
    elif suffix == ".safetensors":
        arr = _read_safetensors(p)
    else:
        arr, meta = _read_json(p)
    if arr.ndim != 2:
        raise _refuse(p, f"its array has shape {tuple(arr.shape)}; actions are a table [num_actions, action_dim] "
                         "(one row per transition).")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise _refuse(p, f"it holds no actions (shape {tuple(arr.shape)}); forward dynamics needs one row of the "
                         "embodiment's width per transition.")
    out = arr.astype(np.float32)
    if not np.isfinite(out).all():
        bad = int((~np.isfinite(out)).sum())
        raise _refuse(p, f"{bad} of its values are NaN or infinite (or too large for float32); actions must be "
                         "finite numbers.")
    return out, meta


def _check_dtype(p: Path, dtype: np.dtype) -> None:
    if dtype.hasobject:
        raise _refuse(p, "it holds Python objects (a pickled array), which are never loaded (unsafe); save the "
                         "actions as a numeric array (np.save of a float array), .json or .safetensors.")
    if dtype.kind == "c":
        raise _refuse(p, f"it holds complex numbers ({dtype}); actions are real numbers — save the real values.")
    if dtype.kind not in "fiub":
        raise _refuse(p, f"it holds {dtype} values, not numbers; save the actions as a float array.")


def _read_npy(p: Path) -> np.ndarray:
    fmt = np.lib.format
    try:
        with p.open("rb") as f:
            try:
                version = fmt.read_magic(f)
            except ValueError:
                raise _refuse(p, "it is not a NumPy .npy file (it does not start with the .npy header); save the "
                                 "actions with np.save, or as .json / .safetensors.") from None
            read_header = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
            if read_header is None:
                raise _refuse(p, f".npy format version {version[0]}.{version[1]} is not read here; save the actions "
                                 "with np.save of a float array.")
            try:
                shape, _, dtype = read_header(f)
            except ValueError:
                raise _refuse(p, "its .npy header is damaged; save the actions again.") from None
            _check_dtype(p, dtype)
            f.seek(0)
            try:
                arr = fmt.read_array(f, allow_pickle=False)
            except (ValueError, EOFError):
                raise _refuse(p, f"its data is shorter than its header says ({tuple(shape)} {dtype}): the file is "
                                 "truncated or damaged — save or copy it again.") from None
    except OSError as exc:
        raise _refuse(p, f"it cannot be read ({exc.strerror or type(exc).__name__}).") from None
    return arr


def _read_safetensors(p: Path) -> np.ndarray:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(p))
    except (SafetensorError, OSError, ValueError, RuntimeError):
        raise _refuse(p, "it is not a readable .safetensors file (damaged or truncated); save or copy it "
                         "again.") from None
    if "actions" in tensors:
        t = tensors["actions"]
    elif len(tensors) == 1:
        (t,) = tensors.values()
    else:
        raise _refuse(p, f"it holds {len(tensors)} tensors and none is named 'actions'; name the action tensor "
                         "'actions' (or save it alone).")
    if t.is_complex():
        raise _refuse(p, f"it holds complex numbers ({t.dtype}); actions are real numbers — save the real values.")
    return t.double().numpy() if t.dtype.is_floating_point else t.numpy()


def _read_json(p: Path) -> tuple[np.ndarray, dict]:
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(p, f"it is not UTF-8 text (byte {exc.start}); save the actions as JSON text.") from None
    except OSError as exc:
        raise _refuse(p, f"it cannot be read ({exc.strerror or type(exc).__name__}).") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise _refuse(p, "it is nested too deeply to be a list of action rows; write a list of rows "
                         "[[a, b, ...], ...] or {\"actions\": rows}.") from None
    except json.JSONDecodeError as exc:
        raise _refuse(p, f"it is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); the file is "
                         "truncated or damaged — save it again.") from None
    meta: dict = {}
    if isinstance(data, dict):
        if "actions" not in data:
            raise _refuse(p, "it is a JSON object without an \"actions\" list; write {\"actions\": [[a, b, ...], "
                             "...]} (as Cosmos3 Save Actions does) or a plain list of rows.")
        for key in ("domain_name", "mode"):
            if key in data and not isinstance(data[key], str):
                raise _refuse(p, f"its {key!r} is a {_kind(data[key])}, not a string; fix it or remove it.")
            if isinstance(data.get(key), str):
                meta[key] = data[key]
        data = data["actions"]
    return _rows(p, data), meta


def _kind(value) -> str:
    return {bool: "true/false", str: "string", list: "list", dict: "object", type(None): "null"}.get(
        type(value), type(value).__name__)


def _rows(p: Path, data) -> np.ndarray:
    """A JSON list of equally long rows of numbers as a float64 array (positions in messages count from 1)."""
    if not isinstance(data, list):
        raise _refuse(p, f"the actions are a {_kind(data)}, not a list of rows [[a, b, ...], ...].")
    if not data:
        raise _refuse(p, "it holds no actions (an empty list); forward dynamics needs one row of the embodiment's "
                         "width per transition.")
    width = None
    for i, row in enumerate(data, 1):
        if not isinstance(row, list):
            raise _refuse(p, f"row {i} is a {_kind(row)}, not a list of numbers; write one list per action.")
        for j, value in enumerate(row, 1):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _refuse(p, f"row {i}, value {j} is a {_kind(value)}, not a number.")
            if isinstance(value, int) and abs(value) > 3e38:
                raise _refuse(p, f"row {i}, value {j} is an integer too large for an action value (float32).")
            if isinstance(value, float) and not math.isfinite(value):
                raise _refuse(p, f"row {i}, value {j} is NaN or infinite; actions must be finite numbers.")
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise _refuse(p, f"row {i} has {len(row)} values but row 1 has {width}; every row is one action of the "
                             "embodiment's width.")
    return np.asarray(data, dtype=np.float64)


def save_actions(path: str | Path, actions, *, domain_name: str | None = None, mode: str | None = None) -> Path:
    """Write actions ``[T, D]`` as ``.npy`` or ``.json`` (``{"actions": rows, "domain_name", "mode"}``); a failed
    write (a full disk) raises ``media.OutputError`` and leaves no file."""
    from .. import media

    p = Path(path)
    arr = np.asarray(actions.detach().cpu() if hasattr(actions, "detach") else actions, dtype=np.float32)
    if p.suffix.lower() == ".npy":
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        data = buf.getvalue()
    elif p.suffix.lower() == ".json":
        meta = {k: v for k, v in (("domain_name", domain_name), ("mode", mode)) if v is not None}
        data = (json.dumps({**meta, "actions": arr.tolist()}) + "\n").encode()
    else:
        raise ValueError(f"actions output {p}: use a .npy or .json file name.")
    return media.write_file(p, data)
