"""Checkpoints load weights-only: a file planted in a run's checkpoint folder cannot run code when the run resumes.

Jobs share one file system, and unpickling calls whatever a pickle names (a `__reduce__` returning `os.system`, say),
so `load_weights_only` refuses a checkpoint whose files name anything but tensors, plain containers and the few
classes its writer is known to put there (the training state's `safe_globals`):

- before the load, every torch.save file of the folder (a zip archive: torch's default format) is checked for
  globals outside torch's weights-only set and those classes (`torch.serialization.get_unsafe_globals_in_checkpoint`,
  torch/serialization.py:343), so a refusal names its file. That includes the RNG states that Accelerate skips
  without a word when they do not load (accelerate/checkpointing.py:293-318);
- DCP's metadata (`.metadata` in an FSDP checkpoint's folders) is a plain pickle that DCP reads with `pickle.load`
  (torch/distributed/checkpoint/filesystem.py:930) whatever torch's options say: it is unpickled here first, with only
  DCP's own metadata classes resolvable (`_DcpMetadataUnpickler`), and refused otherwise;
- during the load TORCH_FORCE_WEIGHTS_ONLY_LOAD=1, which makes every torch.load weights-only even where its caller
  passed weights_only=False (torch/serialization.py:1481-1494): Accelerate's registered objects
  (accelerate/checkpointing.py:340, our learning-rate schedule), DeepSpeed's checkpoint engine
  (deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py:37), its universal conversion
  (deepspeed/checkpoint/ds_to_universal.py:186, 270, 713, 827) and universal load
  (deepspeed/checkpoint/universal_checkpoint.py:251), and DCP's non-tensor items
  (torch/distributed/checkpoint/default_planner.py:387-391). Torch reads the variable at every call, so setting it for
  the load's duration is enough; the check above is what names a file, this is what holds when a file changes after it.

What stays a plain pickle, and why: docs/security.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import pickle
import re
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy
import torch
from torch.distributed.checkpoint import CheckpointException

from .failure import NoRetry

FORCE_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
UNFORCE_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
DCP_METADATA_SUFFIX = ".metadata"
"""DCP's metadata file, `.metadata` or `__<rank>.metadata` (torch/distributed/checkpoint/filesystem.py:69, 922)."""
NOT_WHOLE_PICKLES = (".distcp", ".safetensors")
"""Files no loader unpickles whole: DCP's data, torch.save records read at the offsets its metadata gives
(filesystem.py:97, 861-914: tensors weights-only, other items under the forced load), and safetensors (no pickle)."""
NUMPY_RNG_STATE = (numpy.ndarray, numpy._core.multiarray._reconstruct, numpy.dtype, numpy.dtypes.UInt32DType)
"""What numpy's RNG state (`numpy.random.get_state()`: a name, a uint32 array, ints, a float) needs to unpickle: the
array's class; numpy's rebuild function, which makes an empty array of a class that must itself be allowed; its
element type, built from a type code; and that type's class, whose state the unpickler sets (it builds only objects
of allowed classes, torch/_weights_only_unpickler.py:419-451). Nothing else is imported or called. Accelerate
allow-lists the same for its own RNG files (accelerate/utils/other.py:447-457); torch leaves numpy out by default only
because numpy's functions are not torch's to vouch for (torch/_weights_only_unpickler.py:162-164)."""
WEIGHTS_ONLY_FAILED = "Weights only load failed"
"""How torch's weights-only refusals begin (torch/serialization.py:1609, 1633)."""
REFUSED_GLOBAL = re.compile(r"GLOBAL (\S+)")
"""The global a weights-only refusal names (torch/_weights_only_unpickler.py:336, 379)."""
UNPICKLER_ERROR = re.compile(r"WeightsUnpickler error:\s*(\S.*)")


class RefusedCheckpoint(Exception):
    """A checkpoint file would run code when loaded, or holds what a weights-only load does not build."""


class ForcedUnsafeLoads(NoRetry):
    """The job's environment asks torch to unpickle anything (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)."""


def load_weights_only(checkpoint: Path, load: Callable[[Path], None], allowed: Sequence[Callable] = ()) -> None:
    """`load(checkpoint)` with nothing unpickled but tensors, plain data and `allowed`: RefusedCheckpoint otherwise."""
    refuse_unsafe_files(checkpoint, allowed)
    with weights_only_loads(allowed):
        load(checkpoint)


def refuse_unsafe_files(folder: Path, allowed: Sequence[Callable] = ()) -> None:
    """Raise RefusedCheckpoint, naming the file, when a torch.save file under `folder` names a global outside torch's
    weights-only set and `allowed`, or a DCP metadata file names anything but DCP's metadata classes."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder)
        if path.name.endswith(DCP_METADATA_SUFFIX):
            _check_dcp_metadata(path, name)
        elif path.suffix not in NOT_WHOLE_PICKLES and zipfile.is_zipfile(path):
            try:
                with torch.serialization.safe_globals(list(allowed)):
                    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            except (ValueError, RuntimeError) as error:  # a TorchScript archive, or a zip that torch.save never wrote
                raise RefusedCheckpoint(f"{name} is not a torch.save file of tensors and plain data: {error}") from None
            if unsafe:
                raise RefusedCheckpoint(_would_import(name, sorted(unsafe)))


@contextlib.contextmanager
def weights_only_loads(allowed: Sequence[Callable] = ()) -> Iterator[None]:
    """Every torch.load inside is weights-only, whatever its caller asked for, with `allowed` added to torch's set;
    a weights-only refusal comes out as RefusedCheckpoint."""
    if os.environ.get(UNFORCE_ENV, "0").lower() in ("1", "y", "yes", "true"):
        raise ForcedUnsafeLoads(
            f"{UNFORCE_ENV} is set in the job's environment: trainkit loads checkpoints weights-only only; unset it"
        )
    before = os.environ.get(FORCE_ENV)
    os.environ[FORCE_ENV] = "1"
    try:
        with torch.serialization.safe_globals(list(allowed)):
            yield
    except (pickle.UnpicklingError, CheckpointException) as error:
        refusal = _weights_only_refusal(error)
        if refusal is None:
            raise  # damaged bytes, not a refusal
        named = REFUSED_GLOBAL.search(refusal)
        if named:
            raise RefusedCheckpoint(_would_import("a file", [named[1]])) from None
        detail = UNPICKLER_ERROR.search(refusal)
        raise RefusedCheckpoint(f"a file does not load weights-only: {detail[1] if detail else refusal}") from None
    finally:
        if before is None:
            os.environ.pop(FORCE_ENV, None)
        else:
            os.environ[FORCE_ENV] = before


def _weights_only_refusal(error: BaseException) -> str | None:
    """The text of torch's weights-only refusal in `error`: itself, or what a rank raised inside a DCP load, which DCP
    gathers into a CheckpointException, a BaseException (torch/distributed/checkpoint/api.py:29-39)."""
    causes = [error]
    if isinstance(error, CheckpointException):
        causes = [failure[0] for failure in error.failures.values()]
    for cause in causes:
        if isinstance(cause, pickle.UnpicklingError) and str(cause).startswith(WEIGHTS_ONLY_FAILED):
            return str(cause)
    return None


def _would_import(name: Path | str, globals_: list[str]) -> str:
    shown = ", ".join(globals_[:2]) + (f" and {len(globals_) - 2} more" if len(globals_) > 2 else "")
    return f"{name} would import {shown} when unpickled (checkpoints load tensors and plain data only)"


def _dcp_metadata_globals() -> dict[tuple[str, str], object]:
    """What DCP's Metadata pickles (torch/distributed/checkpoint/metadata.py: dataclasses of sizes, offsets, dtypes
    and names, and one Enum; filesystem.py:74-84 `_StorageInfo`: a file name, an offset, a length), by the
    (module, name) a pickle gives: constructors of data, none of which opens, imports or runs anything."""
    from torch.distributed.checkpoint import filesystem, metadata

    classes = [
        metadata.Metadata,
        metadata.MetadataIndex,
        metadata.StorageMeta,
        metadata.TensorStorageMetadata,
        metadata.BytesStorageMetadata,
        metadata.ChunkStorageMetadata,
        metadata.TensorProperties,
        metadata._MEM_FORMAT_ENCODING,  # TensorProperties' memory format, an Enum (metadata.py:34-77)
        filesystem._StorageInfo,
        torch.Size,
        torch.serialization._get_layout,  # torch.layout's pickled form: a lookup by name (serialization.py)
        pathlib.PosixPath,  # StorageMeta.checkpoint_id, the folder it was saved to
    ]
    found: dict[tuple[str, str], object] = {(c.__module__, c.__qualname__): c for c in classes}
    found |= {("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
    found[("builtins", "getattr")] = _enum_member
    return found


def _enum_member(cls, name: str):
    """What `getattr` may do in a DCP metadata pickle: name a member of the one Enum it holds. Python 3.11.0-3.11.4
    and 3.12+ pickle an Enum member as `getattr(cls, name)` (enum.py's Enum.__reduce_ex__; Debian bookworm's 3.11.2
    and Ubuntu 24.04's 3.12, the images' Pythons, do), which a general getattr would turn into a way to any attribute
    of any class the pickle may name."""
    from torch.distributed.checkpoint import metadata

    if cls is not metadata._MEM_FORMAT_ENCODING or name not in cls.__members__:
        raise RefusedCheckpoint(
            f"getattr({getattr(cls, '__qualname__', cls)!r}, {name!r}) is not a member of DCP's enum"
        )
    return cls[name]


class _DcpMetadataUnpickler(pickle.Unpickler):
    """Resolves only DCP's metadata classes. Every global a pickle uses goes through find_class (the GLOBAL and
    STACK_GLOBAL opcodes and the copyreg extension codes alike), and with no persistent_load a persistent id is refused
    (Python's pickle documentation, "Restricting Globals")."""

    def __init__(self, file, name: Path):
        super().__init__(file)
        self.name, self.allowed = name, _dcp_metadata_globals()

    def find_class(self, module: str, name: str):
        found = self.allowed.get((module, name))
        if found is None:
            raise RefusedCheckpoint(_would_import(self.name, [f"{module}.{name}"]))
        return found


def _check_dcp_metadata(path: Path, name: Path) -> None:
    _DcpMetadataUnpickler(io.BytesIO(path.read_bytes()), name).load()
