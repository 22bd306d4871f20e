"""What `--model` (and `Engine(path)`) names: a checkpoint folder, a .gguf file, or a folder that
holds one GGUF model, as a GGUF repository downloaded with its quant picked leaves it
(`Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf`, or a split set in a `Q4_K_M/` subfolder).

Also the names of GGUF files: is_gguf, split_parts (a split set's files from its first part,
llama.cpp's NAME-0000K-of-0000N.gguf), model_name.

resolve_model_path(path) -> the folder or file to load.  A folder without config.json whose
GGUF models (in it or one folder down) come to exactly one becomes that file (a split set's
first part); several are refused with their names, since which quant to serve is the user's
choice; none leaves the path as it was, for the caller's own "nothing to load" error.  A
split set counts once, and vision projectors (mmproj*.gguf, which GGUF repositories ship beside
the language model) are not models we serve."""
from __future__ import annotations

import os
import re
from pathlib import Path

SHOWN = 8  # candidates named in the error

_SPLIT_PART = re.compile(r"^(?P<base>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})$")


def split_parts(path: str | os.PathLike[str]) -> list[Path]:
    """The files of a model given by its first part NAME-00001-of-0000N.gguf (llama.cpp's split
    naming), or [path] for a single file.  The tokenizer metadata is in the first part."""
    p = Path(path)
    m = _SPLIT_PART.match(p.stem)
    if not m or int(m["no"]) != 1:
        return [p]
    return [p.with_name(f"{m['base']}-{k:05d}-of-{m['count']}{p.suffix}") for k in range(1, int(m["count"]) + 1)]


def model_name(path: str | os.PathLike[str]) -> str:
    """The file name without .gguf and without a split set's -00001-of-0000N."""
    stem = Path(path).stem
    m = _SPLIT_PART.match(stem)
    return m["base"] if m else stem


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """A model given as one .gguf file (rather than a checkpoint folder)."""
    p = Path(path)
    return p.suffix.lower() == ".gguf" and not p.is_dir()



class ModelPathError(ValueError):
    """A folder that holds several GGUF models: --model has to name one."""


def _is_model_file(p: Path) -> bool:
    if p.suffix.lower() != ".gguf" or not p.is_file() or p.name.lower().startswith("mmproj"):
        return False
    m = _SPLIT_PART.match(p.stem)
    return m is None or int(m["no"]) == 1


def gguf_models_in(folder: Path) -> list[Path]:
    """The GGUF models of a folder and its direct subfolders, one path each (a split set's first
    part), sorted.  Hidden entries (.cache of a download tool) are skipped."""
    found: list[Path] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            found += [p for p in sorted(entry.iterdir()) if not p.name.startswith(".") and _is_model_file(p)]
        elif _is_model_file(entry):
            found.append(entry)
    return found


def resolve_model_path(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir() or (p / "config.json").exists():
        return p
    try:
        models = gguf_models_in(p)
    except OSError:
        return p  # unreadable: the caller's open reports it
    if len(models) == 1:
        return models[0]
    if len(models) > 1:
        names = [str(m.relative_to(p)) for m in models[:SHOWN]] + (["..."] if len(models) > SHOWN else [])
        raise ModelPathError(f"{p}: holds {len(models)} GGUF models, so --model has to name one of them: "
                             + ", ".join(names))
    return p
