"""The network image: a compiled network as ``npu run`` and ``Device.load_image`` take it.

The file is an ``.npz`` read without pickle. Its schema is versioned here, once; the
compiler writes it (``host.compiler.image``) and the runtime reads it. Version 2 adds the
job signature (input vectors per job) and room for what later stages record (I/O
shapes, calibration, quantization overrides, reports); version 1 files still load, with
no job signature (``inputs`` is ``None``, and inputs of any size are taken as before).
Version 3 adds runs per job (a long sequence run in chunks of steps, the state kept on
the device between runs); it is written only for images of more than one run per job,
so that an image of one run stays version 2, which older readers take.

``docs/protocol.md`` section 10 describes the file field by field.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field

import numpy as np

from host.spec.isa import Space

__all__ = ["NetworkImage", "ImageError", "IMAGE_FORMAT", "IMAGE_VERSION", "IMAGE_VERSION_RUNS",
           "IMAGE_VERSIONS", "KEEP", "RESULT_NEUTRAL"]

IMAGE_FORMAT = "bfp-npu-image"
#: The version :meth:`NetworkImage.save` writes for an image of one run per job.
IMAGE_VERSION = 2
#: The version it writes for an image of several runs per job (``runs`` > 1).
IMAGE_VERSION_RUNS = 3
#: The versions :meth:`NetworkImage.load` reads.
IMAGE_VERSIONS = (1, 2, 3)
#: What a job of several runs returns: every run's outputs, or the last run's.
KEEP = ("all", "last")
#: Build parameters that change no result, which :meth:`NetworkImage.check_config` does
#: not compare: an image compiled for one value runs on a device of another. An image still
#: records them (``NpuConfig.to_dict``). ``tiles`` (T) changes no result either, but an
#: image's MRF words are laid out for its T until the runtime lays them out for the
#: device's (the layout issue), which then adds it here.
RESULT_NEUTRAL = ("lanes",)


class ImageError(ValueError):
    """A file that is not a readable network image; the message names the file and what
    is wrong with it."""


@dataclass
class NetworkImage:
    """A compiled network: program, memory contents, and the shape of one job.

    Attributes
    ----------
    program : numpy.ndarray of uint64
        Instruction words.
    memories : list of (Space, int, data)
        ``(space, addr, data)`` written once before the program is loaded: uint16
        ``(count, n)`` for vector spaces, a list of ints (MRF words) for the MRF.
    job_memories : list of (Space, int, data)
        Written again before every job (``Device.stream``'s ``prologue``): the state each
        job starts from, such as an LSTM's ``h0`` and ``c0``.
    outputs : int
        Output vectors each run of the program produces (each job, with one run).
    inputs : int or None
        Native input vectors each job takes (``None`` in version 1 images: unknown),
        split equally over its runs. ``npu run`` and ``Device.stream`` refuse jobs of
        another size.
    runs : int
        Runs of the program per job (1 in version 1 and 2 images). A job writes
        ``job_memories`` once, then for each run pushes its share of the inputs
        (``inputs / runs`` vectors), runs the program and pops ``outputs`` vectors; the
        device keeps everything else (a recurrent layer's state) between the runs.
    keep : str
        ``"all"``: a job's result is every run's outputs in order (``runs * outputs``
        vectors, e.g. every step of a sequence); ``"last"``: the last run's only (a
        result taken after the last step; the earlier runs' outputs are popped and
        dropped).
    config : dict or None
        Build parameters the program was compiled for (``NpuConfig`` fields; ``unary_ops``
        as a list of names); :meth:`check_config` compares them with a device's.
    extra : dict
        JSON-serialisable records of later stages, kept as they are: ``"signature"`` (the
        model's logical input and output shapes), ``"calibration"``, ``"quantization"``,
        ``"report"``. Unknown keys are kept too.
    """
    program: np.ndarray
    memories: list = field(default_factory=list)
    job_memories: list = field(default_factory=list)
    outputs: int = 1
    inputs: int | None = None
    config: dict | None = None
    extra: dict = field(default_factory=dict)
    runs: int = 1
    keep: str = "all"

    def __post_init__(self):
        if isinstance(self.runs, bool) or not isinstance(self.runs, (int, np.integer)) \
                or self.runs < 1:
            raise ValueError(f"runs must be a positive integer, not {self.runs!r}")
        self.runs = int(self.runs)
        if self.keep not in KEEP:
            raise ValueError(f"keep must be one of {KEEP}, not {self.keep!r}")
        if self.inputs is not None and self.inputs % self.runs:
            raise ValueError(f"inputs ({self.inputs} vectors per job) must split equally "
                             f"over the {self.runs} runs")

    @property
    def run_inputs(self) -> int | None:
        """Input vectors each run takes (``inputs / runs``; None when unknown)."""
        return None if self.inputs is None else self.inputs // self.runs

    @property
    def job_outputs(self) -> int:
        """Output vectors a job's result has: ``runs * outputs`` (``keep = "all"``) or
        ``outputs`` (``"last"``)."""
        return self.outputs * self.runs if self.keep == "all" else self.outputs

    def build(self):
        """The build the image was compiled for, as an ``NpuConfig`` (the default build
        when the image does not say)."""
        from host.spec.config import NpuConfig
        return NpuConfig(**self.config) if self.config else NpuConfig()

    def check_config(self, config) -> None:
        """Raise ValueError naming the first build parameter that differs from
        ``config`` (an ``NpuConfig``), with both values; the parameters of
        :data:`RESULT_NEUTRAL` are not compared."""
        if self.config is None:
            return
        have_all = config.to_dict()
        built_for = dict(self.config)
        # An image without unit_sets was built for every unit in every MFU.
        built_for.setdefault("unit_sets", None)
        for name, want in built_for.items():
            if name in RESULT_NEUTRAL:
                continue
            have = have_all.get(name, getattr(config, name, None))
            if have != want:
                raise ValueError(f"the image was built for {name}={want!r}, the device has "
                                 f"{name}={have!r}")

    def check_job(self, vectors: int, what: str = "a job") -> None:
        """Raise ValueError when ``vectors`` native input vectors are not what one job of
        this image takes (nothing is checked when the image does not say)."""
        if self.inputs is not None and vectors != self.inputs:
            raise ValueError(f"{what} has {vectors} input vectors; the image takes "
                             f"{self.inputs} per job")

    def save(self, path) -> None:
        """Write the ``.npz`` file: ``program`` (uint64), ``mem0``, ``mem1``, ... (uint16
        ``(count, n)``, or for the MRF uint8 ``(count, k)``: each word's bytes,
        little-endian) and ``meta``, a JSON string: ``{"format": "bfp-npu-image",
        "version": 2, "outputs": K, "inputs": J or null, "config": {...} or null,
        "memories": [{"space": "IVRF", "addr": 0, "every_job": false}, ...], "extra":
        {...}}``, one ``memories`` entry per ``mem<i>``: first ``memories``, then
        ``job_memories``. With ``runs`` > 1, ``"version": 3`` and ``"runs": {"count": R,
        "keep": "all" or "last"}``.

        Raises
        ------
        OSError
            when the file cannot be written.
        """
        arrays, entries = {}, []
        tagged = [(m, False) for m in self.memories] + [(m, True) for m in self.job_memories]
        for i, ((space, addr, data), every_job) in enumerate(tagged):
            space = Space(space)
            if space is Space.MRF:
                words = [int(w) for w in data]
                width = max(1, max(w.bit_length() for w in words) + 7 >> 3) if words else 1
                arrays[f"mem{i}"] = np.array(
                    [list(w.to_bytes(width, "little")) for w in words], np.uint8)
            else:
                arrays[f"mem{i}"] = np.asarray(data, dtype=np.uint16)
            entries.append({"space": space.name, "addr": int(addr), "every_job": every_job})
        meta = {"format": IMAGE_FORMAT, "version": IMAGE_VERSION, "outputs": int(self.outputs),
                "inputs": None if self.inputs is None else int(self.inputs),
                "config": self.config, "memories": entries, "extra": self.extra}
        if self.runs > 1:
            meta["version"] = IMAGE_VERSION_RUNS
            meta["runs"] = {"count": self.runs, "keep": self.keep}
        np.savez(path, program=np.asarray(self.program, dtype=np.uint64),
                 meta=np.array(json.dumps(meta)), **arrays)

    @classmethod
    def load(cls, path) -> "NetworkImage":
        """Read an image file of any version in :data:`IMAGE_VERSIONS`.

        Raises
        ------
        ImageError
            naming the file and what is missing, malformed, truncated or of another kind.
        OSError
            when the file cannot be opened (missing, a directory, no permission).
        """
        try:
            f = np.load(path, allow_pickle=False)
        except (ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ImageError(f"{path}: not a network image (damaged, truncated or not an "
                             f".npz file: {exc})") from None
        if not isinstance(f, np.lib.npyio.NpzFile):
            raise ImageError(f"{path}: not a network image (an .npy array, not an .npz file)")
        try:
            with f:
                return cls._read(path, f)
        except (zipfile.BadZipFile, EOFError, OSError, KeyError) as exc:
            raise ImageError(f"{path}: damaged or truncated image: {exc}") from None

    @classmethod
    def _read(cls, path, f) -> "NetworkImage":
        if "meta" not in f or "program" not in f:
            raise ImageError(f"{path}: not a network image (needs 'program' and 'meta')")
        try:
            meta = json.loads(str(f["meta"][()]))
        except ValueError as exc:
            raise ImageError(f"{path}: 'meta' is not JSON: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != IMAGE_FORMAT \
                or meta.get("version") not in IMAGE_VERSIONS:
            raise ImageError(f"{path}: not a {IMAGE_FORMAT!r} image of version "
                             f"{', '.join(map(str, IMAGE_VERSIONS[:-1]))} or "
                             f"{IMAGE_VERSIONS[-1]}")
        program = f["program"]
        if program.dtype != np.uint64 or program.ndim != 1:
            raise ImageError(f"{path}: 'program' must be 1-D uint64, not "
                             f"{program.dtype} {program.shape}")
        once, every = [], []
        for i, entry in enumerate(meta.get("memories", [])):
            try:
                space = Space[entry["space"]]
                addr = int(entry["addr"])
                data = f[f"mem{i}"]
                every_job = bool(entry.get("every_job", False))
            except (KeyError, TypeError, ValueError) as exc:
                raise ImageError(f"{path}: memory entry {i} is malformed: {exc!r}") from None
            if space is Space.MRF:
                data = [int.from_bytes(row.tobytes(), "little") for row in data]
            (every if every_job else once).append((space, addr, data))
        outputs = meta.get("outputs", 1)
        if isinstance(outputs, bool) or not isinstance(outputs, int) or outputs < 1:
            raise ImageError(f"{path}: 'outputs' must be a positive integer, not {outputs!r}")
        inputs = meta.get("inputs")
        if inputs is not None and (isinstance(inputs, bool) or not isinstance(inputs, int)
                                   or inputs < 0):
            raise ImageError(f"{path}: 'inputs' must be a non-negative integer or null, not "
                             f"{inputs!r}")
        extra = meta.get("extra", {})
        if not isinstance(extra, dict):
            raise ImageError(f"{path}: 'extra' must be a JSON object, not {extra!r}")
        runs, keep = 1, "all"
        if meta["version"] >= IMAGE_VERSION_RUNS:
            spec = meta.get("runs")
            if not isinstance(spec, dict):
                raise ImageError(f"{path}: a version {meta['version']} image must record "
                                 f"'runs' (runs per job: {{\"count\": R, \"keep\": ...}}); "
                                 f"version 1 or 2 images run once per job")
            runs, keep = spec.get("count"), spec.get("keep")
        try:
            return cls(program=program, memories=once, job_memories=every, outputs=outputs,
                       inputs=inputs, config=meta.get("config"), extra=extra, runs=runs,
                       keep=keep)
        except ValueError as exc:
            raise ImageError(f"{path}: 'runs' is malformed: {exc}") from None
